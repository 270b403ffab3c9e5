"""DQN in the simulator: replay, by the stock route and by the plane's.

Stock RLlib 2.60 (``ray/rllib/algorithms/dqn/dqn.py: DQN._training_step_new_api_stack``), one round:

1. ``synchronous_parallel_sample`` (``execution/rollout_ops.py``): every runner samples one fragment;
   the ``foreach_actor`` round trips overlap; each result is pickled + put on its runner and read
   zero-copy by the driver's ``ray.get`` (segment *a*).
   The driver aggregates each runner's metrics (``MetricsLogger.aggregate``, ``StockCosts.driver_bookkeeping``).
2. **One** ``local_replay_buffer.add(episodes)`` of the whole round (``EpisodeReplayBuffer.add``).
3. Once ``num_steps_sampled_before_learning_starts`` is reached, ``sample_and_train_weight`` times
   (``utils/replay_buffers/utils.py: calculate_rr_weights``, the replay ratio): **one**
   ``local_replay_buffer.sample(num_items=total_train_batch_size)`` for all learners (one episode
   per sampled item), then ``LearnerGroup.update(episodes=...)``, which shards the items across the
   learners (``TrainingData.shard`` -> ``ShardEpisodesIterator``) and sends each shard as an actor
   call argument (pickled in the driver, round trips overlapping; *b*); the learner's connector
   (*c*, stacking ``frame_stack`` frames) and a pageable copy (*d*) run before each update.
   After each update the driver isolates the TD errors from the learners' results and aggregates the
   results into the algorithm's metrics (``StockCosts.learner_results``); then, with a prioritized buffer
   (``Workload.prioritized_replay``; RLlib's ``PrioritizedEpisodeReplayBuffer`` is DQN's default),
   ``update_priorities_in_episode_replay_buffer`` (``StockCosts.buffer_update_priorities``).
4. Weights are synced to the runners after the round's updates (``EnvRunnerGroup.sync_weights``): the
   driver's work, and one ``set_state`` call per EnvRunner that it does not wait for; each runner serves
   it before its next ``sample()`` (:meth:`DqnLoop.dqn_weight_sync`).

Every ``sample()`` call also costs the EnvRunner the callee's side of a Ray call (``StockCosts.rpc_callee_cpu``,
:meth:`~conduit.sim.engine.Simulation.remote_sample_time`). DQN calls each EnvRunner once per env step and the
learner once per update, tens of milliseconds apart: where the costs carry the cold-call law
(:mod:`conduit.sim.raycalls`), such a call pays its surcharges, the weight sync's ``set_state`` first and the
``sample()`` right after it warm.

With a local learner (``num_learners=0``) steps 3's call and serialization are a function call.

The plane's route: runners stream chunks into per-learner replay tables placed by the policy (HBM
first, spilling down); the contract's own rate limiter (``can_insert``/``can_sample``) holds the
replay-ratio band; learners sample on device, prefetching the next batch while the current update
runs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

from conduit.chunk import Chunk
from conduit.sim.cluster import LearnerRole, RunnerRole
from conduit.sim.metrics import ChunkTrace, UpdateTrace


class DqnLoop:
    """DQN's loop (a mixin of :class:`~conduit.sim.engine.Simulation`)."""

    # ================================================================== DQN (replay)
    def dqn_loop(self) -> Generator:
        if self.path.route == "driver":
            yield from self.stock_dqn()
        elif self.deployed:
            yield from self.deployed_dqn()
        else:
            yield from self.plane_dqn()

    def _replay_sample(self, buffer: deque, n: int) -> list[tuple[int, np.ndarray]]:
        """Uniform sampling over resident steps, grouped into per-chunk selections."""
        steps = self.workload.chunk_steps
        picks = self.rng.integers(0, len(buffer) * steps, size=n)
        chunk_pos, idx = np.divmod(picks, steps)
        out = []
        for pos in np.unique(chunk_pos):
            out.append((buffer[int(pos)], idx[chunk_pos == pos]))
        return out

    def _replay_insert(self, buffer: deque, cid: int) -> None:
        """The driver's FIFO replay buffer: add, then evict the oldest beyond ``replay_capacity``."""
        buffer.append(cid)
        while len(buffer) * self.workload.chunk_steps > self.workload.replay_capacity:
            self.release(buffer.popleft())

    def stock_dqn(self) -> Generator:
        """``DQN.training_step``: sample, add, then replay-ratio many updates, then sync weights."""
        w, s = self.workload, self.stock
        learners, runners = self.layout.learners, self.layout.runners
        buffer: deque[int] = deque()
        inserted = sampled = 0
        update = 0
        t_free = {lr.id: 0.0 for lr in learners}
        batch_bytes = w.batch_size * w.bytes_per_step
        while update < self.iterations:
            it = update
            t0 = self.env.now
            sample_procs = [self.env.process(self._dqn_sample(r)) for r in runners]
            yield simpy.AllOf(self.env, sample_procs)
            self.rec.span(it, "sampling", t0, self.env.now)
            new = [proc.value for proc in sample_procs]  # (ConditionValue[p] is a linear search)
            last_created = max(self._chunks[c].t_created for c in new)
            t_a = self.env.now
            fetches = [self.env.process(self._stock_dqn_fetch(runner, cid))
                       for runner, cid in zip(runners, new, strict=True)]
            yield simpy.AllOf(self.env, fetches)  # (ConditionValue[f] is a linear search: read each value)
            yield from self.read_runner_results([f.value for f in fetches])
            self.rec.span(it, "a", t_a, self.env.now)
            t_add = self.env.now
            # one add() of the whole round's episodes
            add = s.buffer_add(len(new) * w.chunk_steps)
            yield from self.on_driver(add + self.cold_work("driver", "replay_add", add))
            self.stock_calls["buffer_add"] += 1
            self.stock_calls["round"] += 1
            for cid in new:
                self._replay_insert(buffer, cid)
                inserted += w.chunk_steps
            self.rec.span(it, "buffer_add", t_add, self.env.now)
            due = 0
            if inserted >= w.min_size:
                due = int(max(0, w.replay_ratio * (inserted - w.min_size) - sampled) // (w.batch_size * len(learners)))
            for _ in range(min(due, self.iterations - update)):
                t_smp = self.env.now
                # one sample() of the total train batch, then sharded: batch_size items per learner
                draw = s.buffer_sample(w.batch_size * len(learners))
                yield from self.on_driver(draw + self.cold_work("driver", "replay_sample", draw))
                self.stock_calls["buffer_sample"] += 1
                selections = {}
                for lr in learners:
                    selections[lr.id] = self._replay_sample(buffer, w.batch_size)
                    sampled += w.batch_size
                self.rec.span(update, "buffer_sample", t_smp, self.env.now)
                t_b = self.env.now
                prep = []
                for lr in learners:
                    if not w.local_learner:  # the shard as a call argument, pickled in the driver
                        yield from self.on_driver(self.update_call_cpu(w.batch_size, w.batch_size, batch_bytes, lr))
                    self.stock_calls["update_call"] += 1
                    prep.append(self.env.process(self._stock_dqn_batch(lr, batch_bytes, update, t_b)))
                yield simpy.AllOf(self.env, prep)
                ready = self.env.now
                for lr in learners:
                    self.auditor.delivered(update, selections[lr.id], ready)
                    for cid, _ in selections[lr.id]:
                        if math.isnan(self.rec.chunks[cid].t_ready):
                            self.rec.chunks[cid].t_ready = ready
                yield from self.dqn_update(update, learners, t_free, last_created, ready)
                if w.prioritized_replay:  # update_priorities_in_episode_replay_buffer (dqn.py, after update)
                    t_prio = self.env.now
                    yield from self.on_driver(s.buffer_update_priorities(w.batch_size * len(learners)))
                    self.rec.span(update, "buffer_update_prios", t_prio, self.env.now)
                update += 1
            yield from self.dqn_weight_sync(it, update)

    def dqn_update(self, update: int, learners: list[LearnerRole], t_free: dict[str, float], last_created: float,
                   ready: float) -> Generator:
        """Every learner trains on its batch, ready at ``ready`` (``Learner.update``: one call's overhead plus
        the per-sample cost on the learner's device), traced; then the driver's handling of the learners'
        results (``StockCosts.learner_results``: the TD errors isolated, the results aggregated into the
        algorithm's metrics) and the loop's tick. Stock and deployed DQN share it: they differ in how the batch
        reaches the learner, not in the update or in what ``training_step`` does with its results."""
        w = self.workload
        traces = [UpdateTrace(update, lr.id, w.batch_size, t_free[lr.id], last_created, ready, ready, math.nan)
                  for lr in learners]
        work = w.update_overhead + w.batch_size * w.update_time_per_sample
        yield simpy.AllOf(self.env, [self.env.process(self.learner_compute(
            lr, work + (self.cold_work(self.learner_process(lr), "update", work) if lr.hbm is None else 0.0)))
            for lr in learners])
        self.rec.span(update, "update", ready, self.env.now)
        for u in traces:
            u.t_end = t_free[u.learner] = self.env.now
        self.rec.updates.extend(traces)
        t_res = self.env.now  # the driver isolates the TD errors and aggregates the learners' results
        yield from self.on_driver(self.stock.learner_results(len(learners)))
        self.rec.span(update, "learner_results", t_res, self.env.now)
        self._tick(update)

    def dqn_weight_sync(self, it: int, update: int) -> Generator:
        """The round's weight sync: ``EnvRunnerGroup.sync_weights(from_worker_or_learner_group=learner_group,
        inference_only=True)`` after the round's updates (``algorithms/dqn/dqn.py``; ``env/env_runner_group.py:
        sync_weights``), on the driver's thread:

        - the learner group's ``get_state``: a local learner's (``num_learners=0``) is a call in the driver,
          remote learners' a round trip to the first one;
        - ``ray.put`` of the state, then one ``set_state`` call per EnvRunner through
          ``foreach_env_runner_async_fetch_ready`` with ``timeout_seconds=0``: issued, not waited for
          (``rpc_driver_cpu`` each);
        - the local EnvRunner's ``set_state`` (``create_local_env_runner``, True by default); in a driver with a
          torch team (a local learner's default threads) its copy of the weights is a parallel region, after
          which the team spins (``Workload.sync_spin_s``, :mod:`conduit.sim.torchteam`).

        ``weight_sync_time`` is that work but for the per-runner calls. Each EnvRunner serves its call
        before its next ``sample()`` (:meth:`queue_on_runner`): the dispatch (``rpc_callee_cpu``), the
        state's ``ray.get`` (``get_per_object``) and its ``set_state`` (``weight_set_time``)."""
        w, s = self.workload, self.stock
        runners = self.layout.runners
        t_sync = self.env.now
        get_state = 0.0
        if not w.local_learner:  # LearnerGroup.get_state: a call to the first remote learner
            caller, callee = self.start_call("driver", ("learner", self.layout.learners[0].id))
            yield self.env.timeout(self.reply_trip(callee))
            get_state = self.caller_cpu(caller)
        if self.team is not None and w.sync_spin_s > 0:  # the local EnvRunner's set_state: a region of the team
            self.team.region(w.weight_set_time, spin_s=w.sync_spin_s)
        set_state = [self.start_call("driver", ("runner", runner.id)) for runner in runners]
        cold = sum(caller for caller, _ in set_state)  # the set_state calls' shares of the caller's surcharge
        # the warm-up debt (conduit.sim.coldwork) of the learner's get_state and the local EnvRunner's set_state
        debt = (self.cold_work("driver", "get_state", w.weight_sync_time)
                + self.cold_work("driver", "set_state", w.weight_set_time))
        yield from self.on_driver(w.weight_sync_time + get_state + debt
                                  + (len(runners) * s.rpc_driver_cpu + cold * s.rpc_cold_caller_cpu))
        for runner, (_, callee) in zip(runners, set_state, strict=True):
            self.queue_on_runner(runner, self.callee_cpu(callee) + s.get_per_object + w.weight_set_time
                                 + self.cold_work(("runner", runner.id), "set_state", w.weight_set_time))
        self.rec.span(max(it, update - 1), "weight_sync", t_sync, self.env.now)

    def _stock_dqn_fetch(self, runner: RunnerRole, cid: int) -> Generator:
        """One runner's result: serialise + put on the runner, the overlapping round trip, the pull to
        the driver's node. Returns ``(episodes, steps, bytes)``: the driver reads it once every reply is in
        (:meth:`~conduit.sim.engine.Simulation.read_runner_results`, which also charges
        ``DQN._training_step_new_api_stack``'s ``self.metrics.aggregate(env_runner_results)``)."""
        w, s = self.workload, self.stock
        yield from self.cpu(runner.node, s.sample_serialize(w.chunk_episodes, w.chunk_rows, w.chunk_bytes),
                            thread=("runner", runner.id))
        if not self.place_now(cid, self.host_tier(runner.memory)):
            yield from self.place_in(cid, self.host_tier(runner.memory))
        trip, driver_cpu = self.sample_reply(runner)
        yield self.env.timeout(trip)
        yield from self.transfer(runner.memory, self.layout.driver_memory, w.chunk_bytes)
        yield from self.on_driver(driver_cpu)  # the reply handled as it comes
        if not self.move_now(cid, self.host_tier(self.layout.driver_memory)):
            yield from self.move_to(cid, self.host_tier(self.layout.driver_memory))
        return w.chunk_episodes, w.chunk_rows, w.chunk_bytes

    def _dqn_sample(self, runner: RunnerRole) -> Generator:
        """One ``sample()`` call: the runner's thread on a core of its node (in quanta where crowded)."""
        seconds = self.remote_sample_time(runner, self.workload.fragment_length)
        seconds += self.cold_work(("runner", runner.id), "runner_call", seconds)  # (conduit.sim.coldwork)
        yield from self.on_cores(runner.node, seconds, thread=("runner", runner.id))
        chunk, _ = self.new_chunk(runner, self.layout.learner_of_runner[runner.id], self.version)
        yield from self.runner_metrics(runner)  # get_metrics() in the same call, after the step's sample-end
        return chunk.id

    def _stock_dqn_batch(self, lr: LearnerRole, nbytes: float, update: int, t_b: float) -> Generator:
        """Driver -> learner (the driver already pickled the shard), connector, to-tensor and pageable
        copy of one sampled batch. With a local learner (RLlib ``num_learners=0``) it all runs on
        the driver's thread."""
        s, w = self.stock, self.workload
        built = nbytes * w.frame_stack
        if w.local_learner:
            yield from self.on_driver(s.local_call_overhead)
            t_c = self.env.now
            yield from self.on_driver(self.connector_work(lr, w.batch_size / w.steps_per_row, w.batch_size, built))
            t_d = self.env.now
            yield from self.on_driver(s.to_tensor(built))
        else:
            trip, cold = self.update_call_arrives(lr)
            yield self.env.timeout(trip)
            yield from self.transfer(self.layout.driver_memory, lr.memory, nbytes)
            thread = ("learner", lr.id)
            yield from self.cpu(lr.node, cold + s.shard_deserialize(w.batch_size, w.batch_size, nbytes), thread=thread)
            t_c = self.env.now
            yield from self.cpu(lr.node, self.connector_work(lr, w.batch_size / w.steps_per_row, w.batch_size, built),
                                thread=thread)
            t_d = self.env.now
            yield from self.cpu(lr.node, s.to_tensor(built), thread=thread)
        yield from self.copy_to_device(lr, built, pinned=False)
        if lr.index == 0:
            self.rec.span(update, "b", t_b, t_c)
            self.rec.span(update, "c", t_c, t_d)
            self.rec.span(update, "d", t_d, self.env.now)

    def plane_dqn(self) -> Generator:
        """The plane's replay: runners stream chunks into a replay table placed by the policy (HBM
        first, spilling down); the contract's own rate limiter (``can_insert``/``can_sample``) holds
        the replay-ratio band; learners sample on device, prefetching the next batch while the
        current update runs."""
        learners = self.layout.learners
        self.rec.synchronous = False  # each learner samples its own table at its own pace
        self._replay = {lr.id: deque() for lr in learners}
        self._limiter = _RateLimiter(self.env, self.contract)
        self._replay_inflight = {lr.id: 0 for lr in learners}
        self._table_changed = {lr.id: self.env.event() for lr in learners}
        self._stop = False
        for r in self.layout.runners:
            self.env.process(self.plane_dqn_runner(r))
        procs = [self.env.process(self.plane_dqn_learner(lr)) for lr in learners]
        yield simpy.AllOf(self.env, procs)
        self._stop = True

    def _replay_notify(self, lid: str) -> None:
        event, self._table_changed[lid] = self._table_changed[lid], self.env.event()
        event.succeed()

    def plane_dqn_runner(self, runner: RunnerRole) -> Generator:
        w = self.workload
        i = 0
        group: list[tuple[Chunk, ChunkTrace]] = []
        while not self._stop:
            yield self.env.timeout(self.sample_time(w.fragment_length))
            lr = self.layout.target(runner, i // self.path.granularity)
            i += 1
            # rate limiter, insert side: the runner blocks (backpressure) rather than run ahead; a
            # runner about to block first hands over what it is coalescing, or learners could
            # starve on chunks the limiter has already counted as inserted
            if group and self._limiter.would_block_insert(w.chunk_steps):
                self.env.process(self._replay_ingest(runner, self._learner(group[0][1].learner), group))
                group = []
            yield from self._limiter.insert(w.chunk_steps)
            if self._stop:
                return
            self._replay_make_room(lr.id)  # evict before ingesting: live + in flight <= capacity
            self._replay_inflight[lr.id] += 1
            group.append(self.new_chunk(runner, lr, self.version))
            if len(group) >= self.path.granularity:
                insert = self.env.process(self._replay_ingest(runner, lr, group))
                group = []
                if not self.path.overlap_collection:  # the runner waits for its chunks to be collected
                    yield insert

    def _replay_ingest(self, runner: RunnerRole, lr: LearnerRole, group: list) -> Generator:
        yield from self.direct_group(runner, lr, group, None)
        for chunk, _ in group:
            self._replay_inflight[lr.id] -= 1
            self._replay[lr.id].append(chunk.id)
        self._replay_notify(lr.id)

    def _replay_make_room(self, lid: str) -> None:
        """Evict the oldest resident chunks of a table until one more chunk fits its share of the
        contract's capacity, counting chunks still in flight to it (they are live once ingested)."""
        table, steps = self._replay[lid], self.workload.chunk_steps
        share = self.workload.replay_capacity / len(self._replay)
        while table and (len(table) + self._replay_inflight[lid] + 1) * steps > share:
            self.release(table.popleft())

    def plane_dqn_learner(self, lr: LearnerRole) -> Generator:
        w = self.workload
        t_free = 0.0
        prefetched: tuple | None = None
        for update in range(self.iterations):
            if prefetched is None:
                prefetched = yield from self._plane_dqn_fetch(lr, update)
            _, last_created, ready = prefetched  # delivered (audited) when it was sampled
            prefetched = None
            t_start = max(self.env.now, ready)
            trace = UpdateTrace(update, lr.id, w.batch_size, t_free, last_created, ready, t_start, math.nan)
            run = self.env.process(self.compute[lr.device].run(w.update_overhead + w.batch_size * w.update_time_per_sample))
            if self.path.overlap_update and update + 1 < self.iterations:
                fetch = self.env.process(self._plane_dqn_fetch(lr, update + 1))
                yield run
                trace.t_end = t_free = self.env.now
                prefetched = yield fetch
            else:
                yield run
                trace.t_end = t_free = self.env.now
            self.rec.updates.append(trace)
            self.rec.span(update, "update", t_start, trace.t_end)
            if lr.index == 0:
                self._tick(update)
            if (update + 1) % w.broadcast_interval == 0:
                yield self.env.timeout(w.weight_sync_time)  # the learner's own broadcast step

    def _plane_dqn_fetch(self, lr: LearnerRole, update: int) -> Generator:
        """Sample a batch for ``update`` (delivered to the learner now, as the limiter counts it)."""
        w = self.workload
        while not self._replay[lr.id]:
            yield self._table_changed[lr.id]
        yield from self._limiter.sample(w.batch_size)
        last_created = self._chunks[self._replay[lr.id][-1]].t_created
        selections = self._replay_sample(self._replay[lr.id], w.batch_size)
        self.auditor.delivered(update, selections, self.env.now)
        # gather: samples living off-device are copied in; on-device ones are an index gather
        yield self.env.timeout(self.plane.device_sample_per_call)
        by_tier: dict[str, float] = {}
        for cid, idx in selections:
            tier = self.chunk_ledger.location(cid)
            if tier is not None and tier != lr.device_tier:
                by_tier[tier] = by_tier.get(tier, 0.0) + len(idx) * w.bytes_per_step
        yield from self._copy_in(lr, by_tier)
        if self.path.batch_build == "per-batch":  # the framework's connector over the sampled batch
            s = self.stock
            built = w.batch_size * w.bytes_per_step * w.frame_stack
            yield from self.cpu(lr.node, self.connector_work(lr, w.batch_size / w.steps_per_row, w.batch_size, built)
                                + s.to_tensor(built))
        for cid, _ in selections:
            trace = self.rec.chunks[cid]
            if math.isnan(trace.t_ready):
                trace.t_ready = self.env.now
        return selections, last_created, self.env.now


class _RateLimiter:
    """The Replay contract's rate limiter, shared by all runners and learners of a run.

    ``insert(n)``/``sample(n)`` return at once when the contract allows the step, and otherwise
    queue the caller (FIFO per side). Every admitted step wakes at most the queued callers the new
    counts admit, one at a time, so a thousand blocked learners cost nothing until they can go —
    no thundering herd. Counts are taken when a step is admitted, exactly as the auditor sees them.
    """

    def __init__(self, env: simpy.Environment, contract: Any):
        self.env, self.contract = env, contract
        self.inserted = 0
        self.sampled = 0
        self._inserters: deque[tuple[int, simpy.Event]] = deque()
        self._samplers: deque[tuple[int, simpy.Event]] = deque()

    def would_block_insert(self, n: int) -> bool:
        return bool(self._inserters) or not self.contract.can_insert(n, self.inserted, self.sampled)

    def insert(self, n: int) -> Generator:
        if self._inserters or not self.contract.can_insert(n, self.inserted, self.sampled):
            gate = self.env.event()
            self._inserters.append((n, gate))
            self._wake()
            yield gate
        else:
            self.inserted += n
            self._wake()

    def sample(self, n: int) -> Generator:
        if self._samplers or not self.contract.can_sample(n, self.inserted, self.sampled):
            gate = self.env.event()
            self._samplers.append((n, gate))
            self._wake()
            yield gate
        else:
            self.sampled += n
            self._wake()

    def _wake(self) -> None:
        progress = True
        while progress:
            progress = False
            if self._samplers and self.contract.can_sample(self._samplers[0][0], self.inserted, self.sampled):
                n, gate = self._samplers.popleft()
                self.sampled += n
                gate.succeed()
                progress = True
            if self._inserters and self.contract.can_insert(self._inserters[0][0], self.inserted, self.sampled):
                n, gate = self._inserters.popleft()
                self.inserted += n
                gate.succeed()
                progress = True
