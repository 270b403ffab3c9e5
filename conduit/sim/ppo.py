"""PPO in the simulator: the synchronous on-policy loop, by the stock route and by the plane's.

Stock RLlib 2.60, step by step (files under ``ray/rllib/``):

1. ``algorithms/ppo/ppo.py: PPO.training_step`` calls ``execution/rollout_ops.py:
   synchronous_parallel_sample``, which calls ``EnvRunnerGroup.foreach_env_runner`` ->
   ``utils/actor_manager.py: FaultTolerantActorManager.foreach_actor``: ``sample.remote()`` on every
   runner, then one wait on all references. Every runner samples one fragment (the ``"auto"``
   fragment, :func:`conduit.sim.engine.auto_fragment`); the round trips overlap (each costs the
   driver only ``rpc_driver_cpu`` of its thread).
2. Each runner's returned episodes are serialised on the runner as one object (Ray's serializer over
   the list) and their arrays copied into its object store (``StockCosts.sample_serialize``).
   ``FaultTolerantActorManager._fetch_result`` waits for every runner's reply (``ray.wait`` with
   ``num_returns`` all and ``fetch_local=True``: each object is pulled to the driver's node as it is
   ready), then ``ray.get``s them one after another on the driver's one thread, reading the arrays
   zero-copy (``StockCosts.sample_deserialize``: each episode's and step's share, no per-byte term;
   :meth:`~conduit.sim.engine.Simulation.read_runner_results`) -- segment *a*; the driver's metrics
   bookkeeping per result is *a2*.
3. ``core/learner/learner_group.py: LearnerGroup.update`` -> ``core/learner/training_data.py:
   TrainingData.shard`` (``ShardEpisodesIterator``: one equal shard per learner) -> ``foreach_actor(
   "update", kwargs=shards)``: the driver pickles each shard as a call argument (its arrays copied
   into the object store) one after another on its thread; the calls' round trips overlap; each
   learner resolves its shard (transfer + zero-copy get) -- segment *b*. A local learner
   (``num_learners=0``, ``LearnerGroup.is_local``) is called in place: ``self._learner.update(...)`` on
   the driver's thread, no pickling, no call, no get.
4. In the learner, ``Learner._make_batch_if_necessary`` runs the learner connector pipeline over the
   whole shard (*c*; with ``frame_stack > 1`` it is ``FrameStackingLearner``, as RLlib's Atari
   recipe ``tuned_examples/ppo/atari_ppo.py`` does: the wire carries one frame per step, the batch
   built on the learner ``frame_stack``), ``NumpyToTensor`` plus a pageable host->device copy of the
   built batch (*d*; RLlib's PPO learner does not pin), and ``GeneralAdvantageEstimation`` runs the
   value function over the whole batch (*gae*). Data-parallel learners each train on their shard.

The plane's route: runners hand their fragments (in ``split`` pieces) straight to the plane
(:class:`~conduit.sim.direct.DirectRoute`); each learner's batch is ready when every chunk it is owed
has arrived, been built and value-passed.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import TYPE_CHECKING

import simpy

from conduit.chunk import Chunk
from conduit.sim.cluster import LearnerRole, RunnerRole
from conduit.sim.metrics import ChunkTrace, UpdateTrace

if TYPE_CHECKING:
    from conduit.sim.engine import Simulation


class PpoLoop:
    """PPO's loop (a mixin of :class:`~conduit.sim.engine.Simulation`)."""

    # ================================================================== PPO (synchronous, on-policy)
    def ppo_loop(self) -> Generator:
        w = self.workload
        learners = self.layout.learners
        per_learner = math.ceil(w.train_batch_per_learner / w.chunk_steps)
        chunks_total = len(learners) * per_learner  # every learner gets the same batch
        runners = self.layout.runners
        per_runner = [chunks_total // len(runners) + (1 if j < chunks_total % len(runners) else 0)
                      for j in range(len(runners))]
        plan = self._ppo_plan(runners, learners, per_runner, per_learner)
        expected = {lr.id: 0 for lr in learners}
        for targets in plan.values():
            for lr in targets:
                expected[lr.id] += 1
        t_free = {lr.id: 0.0 for lr in learners}
        for k in range(self.iterations):
            self.version = k
            t0 = self.env.now
            state = _PpoIteration(self, k, learners, expected)
            runner_loop = self.deployed_ppo_runner if self.deployed else self.ppo_runner
            procs = [self.env.process(runner_loop(r, plan[r.id], state)) for r in runners]
            if self.path.route == "driver":
                self.env.process(self.stock_ppo_driver(state, procs))
            elif self.deployed:
                self.env.process(self.deployed_ppo_driver(state, procs))
            learner_batch = self.deployed_ppo_learner_batch if self.deployed else self.ppo_learner_batch
            batch_ready = [self.env.process(learner_batch(lr, state)) for lr in learners]
            yield simpy.AllOf(self.env, procs)
            self.rec.span(k, "sampling", t0, state.t_sampling_done)
            yield simpy.AllOf(self.env, batch_ready)
            t_update = self.env.now
            updates = []
            for lr in learners:
                ready = state.batch_ready_at[lr.id]
                # through the driver, a learner's shard exists only once the driver holds the whole
                # sample: every learner needs the iteration's last chunk (a conservative reading
                # for the baseline: it never charges stock for other runners' sampling)
                # (Conduit as deployed too: RLlib's driver calls update only after every runner's ticket)
                through_driver = self.path.route == "driver" or self.deployed
                needed = state.t_sampling_done if through_driver else state.last_created[lr.id]
                updates.append(UpdateTrace(k, lr.id, state.samples[lr.id], t_free[lr.id],
                                           needed, ready, t_update, math.nan))
                self.auditor.delivered(k, [(c, range(w.chunk_steps)) for c in state.assigned[lr.id]], ready,
                                       checksums={c: self._checksum(c) for c in state.assigned[lr.id]})
            yield simpy.AllOf(self.env, [self.env.process(self.learner_compute(
                lr, w.update_overhead + w.epochs * state.samples[lr.id] * w.update_time_per_sample)) for lr in learners])
            self.rec.span(k, "update", t_update, self.env.now)
            for u in updates:
                u.t_end = self.env.now
                t_free[u.learner] = self.learner_idle_since[u.learner] = self.env.now
            for lr in learners:
                self.view.learner_busy(lr)
            self.rec.updates.extend(updates)
            self.auditor.consumed(k, self.env.now)
            for cids in state.assigned.values():
                for cid in cids:
                    self.release(cid)
            t_sync = self.env.now
            yield self.env.timeout(w.weight_sync_time)
            self.rec.span(k, "weight_sync", t_sync, self.env.now)
            self._tick(k)

    def _ppo_plan(self, runners: list[RunnerRole], learners: list[LearnerRole], per_runner: list[int],
                  per_learner: int) -> dict[str, list[LearnerRole]]:
        """Which learner each chunk of each runner goes to, fixed up front; every learner gets
        exactly ``per_learner`` chunks.

        The driver shards the gathered episodes evenly, so every shard mixes every runner's early
        and late episodes (chunk i of runner j -> learner (i * runners + j) mod learners). The plane
        keeps data local and spread in time: chunk slots are visited in production order (the i-th
        chunk of every runner, then the next), and each goes to a learner that still needs chunks —
        one the runner feeds, else one on its node, else any — preferring a learner that got nothing
        else in this slot (chunks finished together should not queue for one learner's GPU), then the
        one the runner feeds first."""
        if self.path.route == "driver":
            return {r.id: [learners[(i * len(runners) + j) % len(learners)] for i in range(per_runner[j])]
                    for j, r in enumerate(runners)}
        need = {lr.id: per_learner for lr in learners}
        last_slot = {lr.id: -1 for lr in learners}
        plan: dict[str, list[LearnerRole]] = {r.id: [] for r in runners}
        on_node: dict[str, list[LearnerRole]] = {}
        for i in range(max(per_runner, default=0)):
            for j, runner in enumerate(runners):
                if i >= per_runner[j]:
                    continue
                fed = self.layout.feeds[runner.id]
                choice = None
                for pool in (fed, None, learners):
                    if pool is None:  # the runner's node, looked at only when the learners it feeds are served
                        pool = on_node.get(runner.node)
                        if pool is None:
                            pool = on_node[runner.node] = [lr for lr in learners if lr.node == runner.node]
                    open_ = [lr for lr in pool if need[lr.id] > 0]
                    if open_:
                        choice = min(open_, key=lambda lr: last_slot[lr.id] == i)
                        break
                need[choice.id] -= 1
                last_slot[choice.id] = i
                plan[runner.id].append(choice)
        return plan

    def _learner(self, lid: str) -> LearnerRole:
        return self._learners_by_id[lid]

    @staticmethod
    def _checksum(cid: int) -> int:
        """A chunk's stand-in checksum (the simulator moves no bytes): ingested and delivered
        checksums are computed alike, so the auditor's bytes-changed check runs on every delivery."""
        return (cid * 2654435761) & 0xFFFFFFFF

    def ppo_runner(self, runner: RunnerRole, targets: list[LearnerRole], state: _PpoIteration) -> Generator:
        w = self.workload
        group: list[tuple[Chunk, ChunkTrace]] = []
        n_chunks = len(targets)
        for i, target in enumerate(targets):
            # one sample() call per iteration: its chunks are pieces of one fragment
            yield from self.on_cores(runner.node, self.remote_sample_time(runner, w.fragment_length, call=i == 0),
                                     thread=("runner", runner.id))
            chunk, trace = self.new_chunk(runner, target, state.k)
            state.expect(target, chunk)
            if self.path.route == "direct":
                if group and group[0][1].learner != target.id:
                    self.env.process(self.direct_group(runner, self._learner(group[0][1].learner), group, state))
                    group = []
                group.append((chunk, trace))
                if len(group) >= self.path.granularity or i == n_chunks - 1:
                    self.env.process(self.direct_group(runner, target, group, state))
                    group = []
            else:
                state.runner_chunks[runner.id].append(chunk)
        state.runner_done(runner.id, self.env.now)
        if self.path.route == "driver":  # sample() returns: get_metrics(), then the reply, in the runner's process
            yield from self.runner_metrics(runner)
            state.replies[runner.id] = yield from self.stock_fetch_result(runner, state, self.layout.driver_memory)

    # ---- stock PPO: everything through the driver, after sampling
    def stock_ppo_driver(self, state: _PpoIteration, runner_procs: list) -> Generator:
        """Steps 1-3 of the module docstring: gather every runner's episodes, then shard them to the
        learners, one ``foreach_actor`` call each way."""
        k, w = state.k, self.workload
        # foreach_actor: every sample() call is issued at once (the driver's CPU for issuing them
        # overlaps the sampling itself); each reply is pulled as it comes (:meth:`stock_fetch_result`,
        # the end of each runner's process), and read once the last is in
        yield state.sampling_done
        t_a = self.env.now
        yield simpy.AllOf(self.env, runner_procs)
        runners = self.layout.runners
        bookkeeping = yield from self.read_runner_results([state.replies[r.id] for r in runners],
                                                          [self.weight(r) for r in runners])
        self.rec.span(k, "a", t_a, self.env.now - bookkeeping)
        self.rec.span(k, "a2", 0.0, bookkeeping)  # its own work; queueing is in a
        t_b = self.env.now
        sends = []
        for lr in state.learners:
            cids = state.assigned[lr.id]
            nbytes = len(cids) * w.chunk_bytes
            episodes = len(cids) * w.chunk_episodes
            # the shard becomes a call argument (a local learner: called in place); the driver goes on to
            # the next shard without waiting
            calls = self.weight(lr)  # a folded learner's node stands for this many learners' calls
            yield from self.on_driver(self.update_call_cpu(episodes, len(cids) * w.chunk_rows, nbytes, lr, calls))
            self.stock_calls["update_call"] += calls
            sends.append(self.env.process(self.stock_deliver_shard(lr, cids, nbytes, episodes, state, t_b)))
        yield simpy.AllOf(self.env, sends)

    def stock_fetch_result(self, runner: RunnerRole, state: _PpoIteration, driver_mem: str) -> Generator:
        """Once the runner's sampling is done, EnvRunner.sample() returns: serialise + put on the runner, the reply's round trip (overlapping
        every other runner's), the pull to the driver's node. Returns the reply's ``(episodes, steps,
        bytes)`` for the driver to read once every reply is in (``None``: no episodes)."""
        w, s = self.workload, self.stock
        cids = [c.id for c in state.runner_chunks[runner.id]]
        if not cids:
            return None
        nbytes, episodes, steps = len(cids) * w.chunk_bytes, len(cids) * w.chunk_episodes, len(cids) * w.chunk_rows
        yield from self.cpu(runner.node, s.sample_serialize(episodes, steps, nbytes), thread=("runner", runner.id))
        for cid in cids:
            if not self.place_now(cid, self.host_tier(runner.memory)):
                yield from self.place_in(cid, self.host_tier(runner.memory))
        trip, driver_cpu = self.sample_reply(runner, self.weight(runner))
        yield self.env.timeout(trip)
        yield from self.transfer(runner.memory, driver_mem, nbytes)
        for cid in cids:
            if not self.move_now(cid, self.host_tier(driver_mem)):
                yield from self.move_to(cid, self.host_tier(driver_mem))
        yield from self.on_driver(driver_cpu)  # the reply handled as it comes (a folded runner's: each it stands for)
        return episodes, steps, nbytes

    def stock_deliver_shard(self, lr: LearnerRole, cids: list[int], nbytes: float, episodes: float,
                            state: _PpoIteration, t_b: float) -> Generator:
        """Step 3's learner side and step 4: the call reaches the learner (half a round trip), its
        shard is pulled and read zero-copy, then connector, to-tensor, pageable copy and GAE. A local
        learner's shard is the driver's own episodes: the connector and to-tensor run on the driver's
        thread (as :meth:`~conduit.sim.dqn.DqnLoop._stock_dqn_batch`'s)."""
        s, w, k = self.stock, self.workload, state.k
        if not w.local_learner:
            trip, cold = self.update_call_arrives(lr)
            yield self.env.timeout(trip)
            yield from self.transfer(self.layout.driver_memory, lr.memory, nbytes)
            yield from self.cpu(lr.node, cold + s.shard_deserialize(episodes, len(cids) * w.chunk_rows, nbytes),
                                thread=("learner", lr.id))
        for cid in cids:
            if not self.move_now(cid, lr.pageable):
                yield from self.move_to(cid, lr.pageable)
        observed = lr.index == 0
        if observed:
            self.rec.span(k, "b", t_b, self.env.now)
        t_c = self.env.now
        samples = len(cids) * w.chunk_steps
        built = nbytes * w.frame_stack  # FrameStackingLearner: the built batch holds frame_stack frames
        yield from self.learner_cpu(lr, self.connector_work(lr, samples / w.steps_per_row, len(cids) * w.chunk_episodes,
                                                            built))
        t_d = self.env.now
        yield from self.learner_cpu(lr, s.to_tensor(built))
        yield from self.copy_to_device(lr, built, pinned=False)
        for cid in cids:
            if not self.move_now(cid, lr.device_tier):
                yield from self.move_to(cid, lr.device_tier)
        t_gae = self.env.now
        yield from self.gae_pass(lr, samples)
        if observed:
            self.rec.span(k, "c", t_c, t_d)
            self.rec.span(k, "d", t_d, t_gae)
            self.rec.span(k, "gae", t_gae, self.env.now)
        for cid in cids:
            self.rec.chunks[cid].t_ready = self.env.now
        state.chunks_ready(lr, len(cids))

    def ppo_learner_batch(self, lr: LearnerRole, state: _PpoIteration) -> Generator:
        """Wait for a learner's batch. For per-batch building on the direct path, build it here.

        The learner asks for its batch once every chunk it is owed has been produced; it does not
        wait for other learners' data (that wait is the synchronous update barrier, not its
        experience path)."""
        yield state.all_created[lr.id]
        self.view.learner_waiting(lr)
        if self.path.route == "direct" and self.path.batch_build == "per-batch":
            yield state.all_arrived_host[lr.id]
            cids = state.assigned[lr.id]
            yield from self._build_batch_on_learner(lr, cids)
            yield from self.gae_pass(lr, len(cids) * self.workload.chunk_steps)
            for cid in cids:
                self.rec.chunks[cid].t_ready = self.env.now
            state.chunks_ready(lr, len(cids))
        yield state.all_ready[lr.id]
        # device-side batch assembly: one pass over the batch in HBM
        gpu = self.topology.devices.get(lr.device)
        hbm_bw = gpu.get("memory_bandwidth", 1e12) if gpu is not None and gpu.kind == "gpu" else 10e9
        yield self.env.timeout(len(state.assigned[lr.id]) * self.workload.chunk_bytes / hbm_bw)
        state.batch_ready_at[lr.id] = self.env.now


class _PpoIteration:
    """Book-keeping of one synchronous PPO iteration: which chunks go to which learner (``expected``
    counts are fixed up front), and events that fire when all of a learner's chunks are created,
    have arrived in host memory (per-batch building), and are ready on its device."""

    def __init__(self, sim: Simulation, k: int, learners: list[LearnerRole], expected: dict[str, int]):
        self.k, self.learners = k, learners
        env = sim.env
        self.expected = expected
        self.assigned: dict[str, list[int]] = {lr.id: [] for lr in learners}
        self.last_created = {lr.id: 0.0 for lr in learners}
        self.samples = {lr.id: 0 for lr in learners}
        self.ready_count = {lr.id: 0 for lr in learners}
        self.host_count = {lr.id: 0 for lr in learners}
        self.all_created = {lr.id: env.event() for lr in learners}
        self.all_ready = {lr.id: env.event() for lr in learners}
        self.all_arrived_host = {lr.id: env.event() for lr in learners}
        self.batch_ready_at = {lr.id: math.nan for lr in learners}
        self.sampling_done = env.event()
        self.t_sampling_done = math.nan
        self.runner_chunks = {r.id: [] for r in sim.layout.runners}
        # Conduit as deployed: chunks landed in the plane and not yet streamed, per learner; the
        # driver's update call reaching each learner
        self.env = env
        self.landed: dict[str, list[int]] = {lr.id: [] for lr in learners}
        self._landed_event: dict[str, simpy.Event] = {}
        self.update_call = {lr.id: env.event() for lr in learners}
        #: each runner's reply to ``sample()``: ``(episodes, steps, bytes)``, ``None`` for no episodes
        self.replies: dict[str, tuple[float, float, float] | None] = {}
        self._runners_left = len(sim.layout.runners)
        for lr in learners:
            if expected[lr.id] == 0:
                for event in (self.all_created[lr.id], self.all_ready[lr.id], self.all_arrived_host[lr.id]):
                    event.succeed()

    def expect(self, lr: LearnerRole, chunk: Chunk) -> None:
        self.assigned[lr.id].append(chunk.id)
        self.samples[lr.id] += chunk.steps
        self.last_created[lr.id] = max(self.last_created[lr.id], chunk.t_created)
        if len(self.assigned[lr.id]) == self.expected[lr.id]:
            self.all_created[lr.id].succeed()

    def deployed_landed(self, lr: LearnerRole, cid: int) -> None:
        self.landed[lr.id].append(cid)
        event = self._landed_event.pop(lr.id, None)
        if event is not None:
            event.succeed()

    def landed_event(self, lr: LearnerRole) -> simpy.Event:
        event = self._landed_event.get(lr.id)
        if event is None:
            event = self._landed_event[lr.id] = self.env.event()
        return event

    def runner_done(self, runner_id: str, t: float) -> None:
        self._runners_left -= 1
        if self._runners_left == 0:
            self.t_sampling_done = t
            self.sampling_done.succeed()

    def chunks_ready(self, lr: LearnerRole, n: int) -> None:
        self.ready_count[lr.id] += n
        if self.ready_count[lr.id] >= self.expected[lr.id] and not self.all_ready[lr.id].triggered:
            self.all_ready[lr.id].succeed()

    def host_arrived(self, lr: LearnerRole, n: int) -> None:
        self.host_count[lr.id] += n
        if self.host_count[lr.id] >= self.expected[lr.id] and not self.all_arrived_host[lr.id].triggered:
            self.all_arrived_host[lr.id].succeed()
