"""APPO/IMPALA in the simulator: bounded staleness, by the stock route and by the plane's.

Stock RLlib 2.60, step by step (files under ``ray/rllib/``):

1. Runners sample asynchronously; ``SingleAgentEnvRunner.sample`` returns episodes that Ray pickles
   and puts into the runner's object store (``StockCosts.sample_serialize``); the driver only
   receives the **reference** (``algorithms/impala/impala.py: IMPALA._sample_and_get_connector_states``
   via ``foreach_env_runner_async`` / ``fetch_ready_async_reqs``): per result, ``rpc_driver_cpu``
   plus bookkeeping on the driver's thread -- segment *a*.
2. ``IMPALA.training_step`` -> ``_pre_queue_episode_refs(episode_refs, package_size=
   total_train_batch_size)`` groups references into packages of the whole step's batch (every
   learner's share), and ``LearnerGroup.update(training_data=TrainingData(episodes_refs=package),
   async_update=True)`` shards each package across the learners (``core/learner/training_data.py:
   TrainingData.shard`` -> ``ShardObjectRefIterator``: learner *i* gets the *i*-th contiguous slice of
   the package's references). The driver passes references only: one ``rpc_driver_cpu`` per learner
   call, no data -- segment *b*. (Not chunk *i* of every runner to learner ``i % L``: that sent every
   runner's data to the same learner at once.) With ``num_aggregator_actors_per_learner > 0``
   (default 0 in 2.60, ``IMPALAConfig.__init__``) aggregator actors would run the learner connector
   per package instead; the simulator's learner-node CPU pool already runs that work concurrently
   with the update, so the default is modelled.
3. Each ``update`` call runs on the learner actor's main thread, one call after another
   (``algorithms/impala/impala_learner.py: IMPALALearner.update``): it resolves the shard's references in
   one ``ray.get`` (``defer_solve_refs_to_learner=True``: ``TrainingData.solve_refs`` in the learner; the
   bytes move from the runners' nodes, and the arrays are read zero-copy: segment *get*), runs the learner
   connector once over all the shard's episodes (*c*, stacking ``frame_stack`` frames; its last piece,
   ``NumpyToTensor``, makes the tensors) and hands the batch on (*d*): a GPU learner's loader thread
   (``_GPULoaderThread._to_device_safe``: ``batch.to_device(device, pin_memory=True)``) copies it through
   pinned memory (a CPU copy into a pinned buffer, then DMA), a CPU learner enqueues it at once, into the
   learner thread's ``CircularBuffer``, which trains.

What this leaves out (known): RLlib's ``EnvRunner.sample_get_state_and_metrics`` puts the episodes, then runs
``get_state`` and ``get_metrics`` and replies, all on the runner's thread before its next sample. The model
serialises and puts in a process of its own beside the next sample, and charges ``get_state`` + ``get_metrics``
(``Workload.runner_metrics_time``) before the chunk is made, so neither lies on the chunk's experience path as in
the run (PPO's and DQN's runners charge the metrics after the sample-end, as RLlib does).

The plane's route: chunks go to their learner's queue through
:class:`~conduit.sim.direct.DirectRoute`; each update gathers fresh chunks within the lag bound and
reuses buffered ones up to ``max_reuse`` (the contract's rules: :mod:`conduit.plane.rules`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator

import simpy

from conduit.chunk import Chunk
from conduit.sim.cluster import LearnerRole, RunnerRole
from conduit.sim.cores import SAMPLING_QUANTUM
from conduit.sim.metrics import ChunkTrace, UpdateTrace
from conduit.sim.resources import FifoServer

#: the share of a core a runnable nice-15 thread (a Ray worker) keeps beside a nice-0 thread that never yields:
#: their weights, 36 and 1024 (``kernel/sched/core.c: sched_prio_to_weight``)
NICE_15_SHARE = 36 / (1024 + 36)


class AppoLoop:
    """APPO/IMPALA's loop (a mixin of :class:`~conduit.sim.engine.Simulation`)."""

    # ================================================================== APPO / IMPALA (bounded staleness)
    def appo_loop(self) -> Generator:
        w = self.workload
        learners = self.layout.learners
        self._appo_any = _Notifier(self.env)  # any queue changed (stock runners' backpressure)
        queues = {lr.id: _ReadyQueue(self.env, self._appo_any) for lr in learners}
        self._appo_queues = queues
        self._package: list[tuple[RunnerRole, Chunk]] = []  # stock: references waiting for a package
        self._runner_version = {r.id: 0 for r in self.layout.runners}
        self._stop = False
        self._stock_pending = 0  # stock: chunks created, not yet in a learner's queue
        self._appo_main = {lr.id: FifoServer(self.env, 1) for lr in learners}  # stock: each learner actor's calls
        runner_loop = self.deployed_appo_runner if self.deployed else self.appo_runner
        if self.deployed:  # the plane's chunks per learner, and each learner actor's main thread
            self._appo_landed = {lr.id: _ReadyQueue(self.env) for lr in learners}
            for lr in learners:
                self.env.process(self.deployed_appo_learner_main(lr, queues[lr.id]))
        for r in self.layout.runners:
            self.env.process(runner_loop(r, queues))
        self._learner_training = dict.fromkeys((lr.id for lr in learners), False)
        self._polling_node: dict[str, str] = {}  # learner -> the crowded node its idle thread polls on
        for lr in learners:
            node = self.layout.driver_node if w.local_learner else lr.node
            if self.crowded[node] and self.stock.learner_poll_cores > 0:
                self._polling_node[lr.id] = node
        self._background_duty = self.background_duties()
        if self.crowded[self.layout.driver_node]:  # (its pool preempts: CoreUse._setup_cores)
            self.env.process(self.appo_driver_spin())
        for lr in learners:
            node = self._polling_node.get(lr.id)
            if node is None:
                continue
            pool = self.cpus[node]  # crowded: its pool preempts (CoreUse._setup_cores)
            pool.poll_cost = self.stock.poll_neighbour_cost
            pool.polling(True)
            self.env.process(self.appo_learner_poll(lr, node))
        t_free = {lr.id: 0.0 for lr in learners}
        reuse: dict[str, deque] = {lr.id: deque() for lr in learners}
        uses: dict[int, int] = {}
        for k in range(self.iterations):
            self.version = k
            gathers = [self.env.process(self.appo_gather(lr, k, queues[lr.id], reuse[lr.id], uses)) for lr in learners]
            yield simpy.AllOf(self.env, gathers)
            t_start = self.env.now
            updates = []
            finished: list[int] = []
            for lr, g in zip(learners, gathers, strict=True):
                cids, last_created, ready, done = g.value
                finished.extend(done)
                updates.append(UpdateTrace(k, lr.id, len(cids) * w.chunk_steps, t_free[lr.id], last_created,
                                           ready, t_start, math.nan))
                self.auditor.delivered(k, [(c, range(w.chunk_steps)) for c in cids], t_start,
                                       checksums={c: self._checksum(c) for c in cids})
            for cid in finished:  # used max_reuse times: leaves the plane
                self.release(cid)
            self._learner_threads_train(learners, True)
            yield simpy.AllOf(self.env, [self.env.process(self.learner_compute(
                lr, w.update_overhead + u.samples * w.update_time_per_sample)) for lr, u in zip(learners, updates, strict=True)])
            self._learner_threads_train(learners, False)
            for u in updates:
                u.t_end = t_free[u.learner] = self.env.now
            self.rec.updates.extend(updates)
            self.rec.span(k, "update", t_start, self.env.now)
            if (k + 1) % w.broadcast_interval == 0:
                self.env.process(self.broadcast(k + 1))
            self._tick(k)
        self._stop = True
        # retire what is left, wherever the end found it (a learner's queue or circular buffer, on its way
        # there, in the plane, fetched and not yet built): dropped (counted), buffers released
        for cid in list(self._chunks):
            self.auditor.dropped(cid, self.env.now, "end-of-run")
            self.release(cid)

    def appo_driver_spin(self) -> Generator:
        """The driver never sleeps: ``algorithm.py: Algorithm._run_one_training_iteration`` calls
        ``impala.py: IMPALA.training_step`` in a loop until ``min_time_s_per_iteration``, and each step's
        ``EnvRunnerGroup.fetch_ready_async_reqs`` (``timeout_seconds=timeout_s_sampler_manager``, 0.0)
        and ``LearnerGroup.update(async_update=True)`` return at once when nothing is ready. So on a
        crowded node the driver's thread wants ``StockCosts.driver_poll_cores`` of a core whenever it
        is not doing the bookkeeping the loop does anyway (``benchmarks/appo_driver_loop.py``: the real
        loop's main thread, timed with sleeping environments so nothing else wants the cores: 0.85;
        the ``ray.wait`` call alone, ``benchmarks/driver_wait_loop.py``, takes 0.22). The thread blocks
        briefly thousands of times a second (each pass's Ray calls), so the kernel hands it a core back
        at once: its quanta, like its bookkeeping (:meth:`on_driver`), are ``urgent`` work on a
        preemptive pool (:class:`~conduit.sim.resources.CpuPool`), which the CPU-bound EnvRunners and
        the learner thread make room for. While the node's cores are idle the loop takes nothing from
        anyone, so it waits for work to arrive there (:meth:`~conduit.sim.resources.CpuPool.work_arrives`)
        rather than polling the event queue forever: a run that stalls (placements waiting for room
        that never comes) still ends and is reported as stalled."""
        node = self.layout.driver_node
        pool = self.cpus[node]
        duty = self._background_duty["driver"]  # (background_duties: capped at a fair share on a saturated node)
        while not self._stop:
            if not pool.wanted and not self.driver_thread.busy:  # nobody else wants a core: nothing to take from
                yield pool.work_arrives()
            elif self.driver_thread.busy or duty == 0.0:
                yield self.env.timeout(SAMPLING_QUANTUM)
            else:  # the poll takes ``driver_poll_cores`` of a core (StockCosts; benchmarks/appo_driver_loop.py)
                yield from self.cpu(node, duty * SAMPLING_QUANTUM, urgent=True, background=True)
                if duty < 1.0:
                    yield self.env.timeout((1.0 - duty) * SAMPLING_QUANTUM)

    def background_duties(self) -> dict[str, float]:
        """The share of a core each background loop takes (``driver``: the driver's loop on its crowded node;
        a learner's id: its idle thread's poll). As measured (``StockCosts.driver_poll_cores``,
        ``learner_poll_cores``) while a node's loops together want fewer than its cores: then a waking
        thread gets a core at once (wake-up preemption) and the model gives it its quanta first. When they
        would want every core, waking first cannot hold: the kernel's fair scheduler gives each runnable
        thread of the node at most ``cores / threads`` (its threads, plus each polling learner thread), so
        each loop is capped there and the node's other threads keep running (with the urgent rule alone
        their staggered quanta could cover every core, and the run never ended). "Every core" is the kernel's:
        beside a nice-0 thread that never yields, a runnable nice-15 one still gets its weight's share of the core
        (``kernel/sched/core.c: sched_prio_to_weight``, 1024 and 36: 36 / 1060 = 3.4%), so loops that would leave
        the node's other threads less than that (``learner_poll_cores`` 0.999999 on one core) are capped too
        (without it such a run's other threads crawl at a millionth of a core: a fresh clone's hypothesis
        draw hung there)."""
        wants: dict[str, list[tuple[str, float]]] = {}
        if self.crowded[self.layout.driver_node]:
            wants.setdefault(self.layout.driver_node, []).append(
                ("driver", min(1.0, max(0.0, self.stock.driver_poll_cores))))
        for lr_id, node in self._polling_node.items():
            wants.setdefault(node, []).append((lr_id, min(1.0, self.stock.learner_poll_cores)))
        threads = self.threads_per_node()
        duties: dict[str, float] = {}
        for node, loops in wants.items():
            cores = self.cpus[node].cores
            cap = 1.0
            if sum(d for _, d in loops) >= cores - NICE_15_SHARE:
                pollers = sum(1 for key, _ in loops if key != "driver")
                cap = cores / (threads[node] + pollers)
            duties.update({key: min(d, cap) for key, d in loops})
        return duties

    def _learner_threads_train(self, learners: list[LearnerRole], training: bool) -> None:
        """The learners' threads start (stop) training: their buffers' polls stop (start again)."""
        for lr in learners:
            self._learner_training[lr.id] = training
            if lr.id in self._polling_node:
                self.cpus[self._polling_node[lr.id]].polling(not training)

    def appo_learner_poll(self, lr: LearnerRole, node: str) -> Generator:
        """An idle APPO learner thread polls its empty buffer: ``algorithms/appo/utils.py: CircularBuffer.get``
        loops on ``time.sleep(0.0001)`` while the buffer is empty (``_LearnerThread.step`` takes every batch
        through it; ``APPOLearner.build`` makes it the learner thread's queue with ``use_circular_buffer=True``,
        the default), so between two updates the thread wakes thousands of times a second. On a crowded node
        (the learner's, or the driver's for a local learner) that wants ``StockCosts.learner_poll_cores`` of a
        core (``benchmarks/appo_learner_poll.py``: a real idle learner's thread), taken first, as the driver's
        loop takes its share (:meth:`appo_driver_spin`: a waking thread gets a core at once), and every
        neighbour's compute pays ``StockCosts.poll_neighbour_cost`` while it polls
        (:class:`~conduit.sim.resources.CpuPool`; :meth:`_learner_threads_train` switches it). While the
        learner's main thread builds a batch it holds the GIL and the poll mostly waits for it; the model
        does not make that distinction. IMPALA's learner thread blocks on a ``queue.Queue`` instead; the
        simulator's ``appo`` loop is APPO's, with its default circular buffer. Both sides poll alike: under
        ``enable()`` the learner is RLlib's own, its thread fed through the same buffer."""
        pool = self.cpus[node]
        duty = self._background_duty[lr.id]  # (background_duties: capped at a fair share on a saturated node)
        local = self.workload.local_learner
        while not self._stop:
            if self._learner_training[lr.id]:
                yield self.env.timeout(SAMPLING_QUANTUM)
            elif not pool.wanted:  # nobody else wants a core: nothing to take from
                yield pool.work_arrives()
            else:  # a local learner's thread is the driver process's; a remote one's, a woken worker's
                yield from self.cpu(node, duty * SAMPLING_QUANTUM, urgent=local, woken=not local, background=True)
                if duty < 1.0:
                    yield self.env.timeout((1.0 - duty) * SAMPLING_QUANTUM)

    def broadcast(self, version: int) -> Generator:
        yield self.env.timeout(self.workload.weight_sync_time)
        for rid in self._runner_version:
            self._runner_version[rid] = max(self._runner_version[rid], version)

    def appo_runner(self, runner: RunnerRole, queues: dict) -> Generator:
        w = self.workload
        i = 0
        group: list[tuple[Chunk, ChunkTrace]] = []
        while not self._stop:
            # sampling holds a core of the runner's node (in quanta where the node is crowded)
            yield from self.on_cores(runner.node, self.remote_sample_time(runner, w.fragment_length),
                                     thread=("runner", runner.id))
            # sample_get_state_and_metrics' get_state + get_metrics, before the chunk exists here (the module
            # doc: what this leaves out)
            yield from self.runner_metrics(runner)
            if self._stop:
                return
            reply = self.sample_reply(runner)  # this call's, before the runner's next call starts
            if self.path.route == "driver":
                # the learner is decided when the driver shards a package (stock_appo_package)
                chunk, _ = self.new_chunk(runner, self.layout.learners[0], self._runner_version[runner.id])
                self._stock_pending += 1
                self.env.process(self.stock_appo_path(runner, chunk, queues, reply))
                # backpressure: runners do not outrun the learners by more than max_lag batches each
                limit = (w.max_lag + 2) * w.chunks_per_batch * len(queues)
                while self._appo_any.queued + self._stock_pending > limit and not self._stop:
                    yield self._appo_any.changed()
                continue
            target = self.layout.target(runner, i // self.path.granularity)
            i += 1
            chunk, trace = self.new_chunk(runner, target, self._runner_version[runner.id])
            queue = queues[target.id]
            group.append((chunk, trace))
            queue.in_flight += 1  # counted from creation, so backpressure sees coalescing chunks
            if len(group) >= self.path.granularity:
                handoff = self.env.process(self._direct_then_queue(runner, target, group, queue))
                group = []
                if not self.path.overlap_collection:  # the runner waits for its chunks to be collected
                    yield handoff
            # backpressure: a runner does not outrun its learner's queue by more than max_lag batches;
            # one about to wait first hands over what it is coalescing (its learner may need it)
            while len(queue.items) + queue.in_flight > (w.max_lag + 2) * w.chunks_per_batch and not self._stop:
                if group:
                    self.env.process(self._direct_then_queue(runner, target, group, queue))
                    group = []
                yield queue.changed()

    def _direct_then_queue(self, runner: RunnerRole, target: LearnerRole, group: list, queue) -> Generator:
        yield from self.direct_group(runner, target, group, None)
        for chunk, _ in group:
            queue.in_flight -= 1
            queue.put(chunk.id)

    def stock_appo_path(self, runner: RunnerRole, chunk: Chunk, queues: dict, reply: tuple[float, float]) -> Generator:
        """Step 1 of the module docstring: serialise + put on the runner, the driver fetches the
        reference; once a package holds every learner's share, step 2 shards it. ``reply``: the sample
        call's ``(latency, driver's CPU)`` (:meth:`~conduit.sim.raycalls.ColdCallCosts.sample_reply`)."""
        s, w = self.stock, self.workload
        trip, driver_cpu = reply
        t0 = self.env.now
        yield from self.cpu(runner.node, s.sample_serialize(w.chunk_episodes, w.chunk_rows, chunk.nbytes),
                            thread=("runner", runner.id))
        if not self.place_now(chunk.id, self.host_tier(runner.memory)):
            yield from self.place_in(chunk.id, self.host_tier(runner.memory))
        yield self.env.timeout(trip)  # the reply travels
        yield from self.on_driver(driver_cpu + s.driver_bookkeeping)
        self.stock_calls["sample_result"] += 1
        if self.layout.learners[0].index == 0 and not self._package:
            self.rec.span(self.version, "a", t0, self.env.now)
        self._package.append((runner, chunk))
        learners = self.layout.learners
        if len(self._package) >= w.chunks_per_batch * len(learners):
            package, self._package = self._package, []
            self.env.process(self.stock_appo_package(package, queues))

    def stock_appo_package(self, package: list, queues: dict) -> Generator:
        """Step 2: ``ShardObjectRefIterator`` -- learner *i* gets the *i*-th contiguous slice of the
        package; one reference-only ``update`` call per learner."""
        learners = self.layout.learners
        t_b = self.env.now
        self.stock_calls["package"] += 1
        shards = shard_object_refs(package, len(learners))
        self.stock_shards.append([len(shard) for shard in shards])
        for lr, shard in zip(learners, shards, strict=True):
            caller, callee = self.start_call("driver", ("learner", lr.id))
            yield from self.on_driver(self.caller_cpu(caller))
            self.stock_calls["update_call"] += 1
            for _, chunk in shard:
                self.rec.chunks[chunk.id].learner = lr.id
            self.env.process(self.stock_appo_update_call(lr, shard, queues[lr.id], t_b, callee))

    def stock_appo_update_call(self, lr: LearnerRole, shard: list, queue, t_b: float, cold: float) -> Generator:
        """Step 3: one ``update`` call of the learner actor (``algorithms/impala/impala_learner.py:
        IMPALALearner.update``), run on the actor's main thread after the calls before it (a Ray actor runs
        its calls one at a time): ``training_data.solve_refs()`` is one ``ray.get`` of the shard's
        references (the bytes pulled from every runner's node at once, then deserialised in turn),
        ``_make_batch_if_necessary`` runs the learner connector once over all the shard's episodes (its last
        piece, ``NumpyToTensor``, makes the tensors); a GPU learner's ``_GPULoaderThread`` then copies the
        batch through pinned memory (``_to_device_safe``: a CPU copy into a pinned buffer, then DMA) into the
        learner thread's ``CircularBuffer``, a CPU learner enqueues it there at once. ``cold``: the learner's
        share of the cold-call surcharge (:mod:`conduit.sim.raycalls`)."""
        s, w = self.stock, self.workload
        yield self.env.timeout(self.reply_trip(cold) / 2)
        main = self._appo_main[lr.id]
        yield main.acquire()
        try:
            t_get = self.env.now
            yield simpy.AllOf(self.env, [self.env.process(self.transfer(runner.memory, lr.memory, chunk.nbytes))
                                         for runner, chunk in shard])
            yield from self.cpu(lr.node, cold * s.rpc_cold_callee_cpu
                                + sum(s.sample_deserialize(w.chunk_episodes, w.chunk_rows, chunk.nbytes)
                                      for _, chunk in shard), thread=main)
            for _, chunk in shard:
                if not self.move_now(chunk.id, lr.pageable):
                    yield from self.move_to(chunk.id, lr.pageable)
            t_c = self.env.now
            built = sum(chunk.nbytes for _, chunk in shard) * w.frame_stack
            steps = sum(chunk.steps for _, chunk in shard) / w.steps_per_row
            yield from self.cpu(lr.node, self.connector_work(lr, steps, len(shard) * w.chunk_episodes, built), thread=main)
            t_d = self.env.now
            yield from self.cpu(lr.node, s.to_tensor(built), thread=main)
        finally:
            main.release()
        if lr.hbm is not None:  # the GPU loader thread: pinned staging, then DMA
            yield from self.cpu(lr.node, built / self.staging_bandwidth(lr.memory), thread=("loader", lr.id))
            yield from self.copy_to_device(lr, built, pinned=True)
        for _, chunk in shard:
            if not self.move_now(chunk.id, lr.device_tier):
                yield from self.move_to(chunk.id, lr.device_tier)
            self.rec.chunks[chunk.id].t_ready = self.env.now
        if lr.index == 0:
            k = self.version
            self.rec.span(k, "b", t_b, t_get)
            self.rec.span(k, "get", t_get, t_c)
            self.rec.span(k, "c", t_c, t_d)
            self.rec.span(k, "d", t_d, self.env.now)
        self._stock_pending -= len(shard)
        for _, chunk in shard:
            queue.put(chunk.id)

    def drop_if_stale(self, cid: int, k: int) -> bool:
        """Drop (counted, released) a chunk the contract says is too old for update ``k`` when it is taken
        (:meth:`conduit.plane.rules.ContractRules.stale_on_arrival`); returns whether it was dropped. Used where a
        learner takes fresh chunks and, under ``enable()``, where the plane hands a batch over."""
        if not self.rules.stale_on_arrival(self._chunks[cid].policy_version, next_update=k, current=k):
            return False
        self.auditor.dropped(cid, self.env.now, "stale")
        self.release(cid)
        return True

    def appo_gather(self, lr: LearnerRole, k: int, queue, reuse: deque, uses: dict) -> Generator:
        """Assemble update k's batch: fresh chunks within the lag bound first; when none is ready,
        reuse buffered chunks (circular buffer) up to ``max_reuse``; otherwise wait."""
        w = self.workload
        batch: list[int] = []
        waiting = False
        while len(batch) < w.chunks_per_batch:
            while queue.items and len(batch) < w.chunks_per_batch:
                cid = queue.take()
                queue.notify()
                if self.drop_if_stale(cid, k):
                    continue
                batch.append(cid)
            if len(batch) >= w.chunks_per_batch:
                break
            # reuse from the circular buffer only what is still admissible
            while reuse and len(batch) < w.chunks_per_batch:
                cid, _ = reuse.popleft()
                if not self.rules.too_old((self._chunks[cid].policy_version,), k) and uses[cid] < w.max_reuse:
                    batch.append(cid)
                else:
                    self.release(cid)
            if len(batch) < w.chunks_per_batch:
                if not waiting:  # the learner asks once per batch; wake-ups are not new requests
                    self.view.learner_waiting(lr)
                    waiting = True
                yield queue.changed()
        if not self.deployed and self.path.route == "direct" and self.path.batch_build == "per-batch":
            yield from self._build_batch_on_learner(lr, batch)
            for cid in batch:
                if math.isnan(self.rec.chunks[cid].t_ready):
                    self.rec.chunks[cid].t_ready = self.env.now
        self.view.learner_busy(lr)
        fresh = [self._chunks[c].t_created for c in batch if uses.get(c, 0) == 0]
        done = []
        for cid in batch:
            uses[cid] = uses.get(cid, 0) + 1
            if uses[cid] < w.max_reuse:
                reuse.append((cid, uses[cid]))
            else:
                done.append(cid)
        return batch, max(fresh, default=0.0), self.env.now, done


def shard_object_refs(refs: list, num_shards: int) -> list[list]:
    """``ray/rllib/utils/minibatch_utils.py: ShardObjectRefIterator``, restated: ``num_shards``
    contiguous slices of ``refs``, as equal as possible, the first ``len(refs) % num_shards`` one
    longer."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    size, remaining = divmod(len(refs), num_shards)
    out, start = [], 0
    for i in range(num_shards):
        end = start + size + (1 if i < remaining else 0)
        out.append(refs[start:end])
        start = end
    return out


class _Notifier:
    """An event that fires on every change (and is replaced). Shared by queues, it also counts the chunks
    they hold together (``queued``): the stock runners' backpressure reads that total after every
    fragment, and summing ~1,000 learners' queues there cost O(runners x learners) per change."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self._changed = env.event()
        self.queued = 0

    def notify(self) -> None:
        event, self._changed = self._changed, self.env.event()
        event.succeed()

    def changed(self) -> simpy.Event:
        return self._changed


class _ReadyQueue(_Notifier):
    """Chunks ready for a learner (APPO), with an event that fires on every change (and, when given,
    one shared by all queues)."""

    def __init__(self, env: simpy.Environment, shared: _Notifier | None = None):
        super().__init__(env)
        self.items: deque[int] = deque()
        self.in_flight = 0
        self._shared = shared

    def put(self, cid: int) -> None:
        self.items.append(cid)
        if self._shared is not None:
            self._shared.queued += 1
        self.notify()

    def take(self) -> int:
        """The oldest chunk, out of the queue (the caller notifies)."""
        if self._shared is not None:
            self._shared.queued -= 1
        return self.items.popleft()

    def notify(self) -> None:
        super().notify()
        if self._shared is not None:
            self._shared.notify()
