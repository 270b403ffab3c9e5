"""Conduit as ``enable()`` deploys it: the plane actor, RLlib's driver loop, host batches.

The policy named ``conduit`` (``PathSettings.deployment == "enable"``) is simulated as the RLlib
integration runs today (``conduit/runtime/rllib/``, docs/rllib.md), step by step; the design target
without these costs is the separately named ``conduit-target`` (:mod:`conduit.sim.direct`).

**What stays of RLlib's control path.** RLlib's own ``training_step`` still runs in the driver and
still calls every EnvRunner and learner (``enable()`` replaces no RLlib code):

* every ``sample()`` is still a ``foreach_actor`` round trip; the EnvRunner returns a placeholder
  (PPO: one zero-step *ticket* episode per call; APPO/IMPALA/DQN/SAC: ``[]``), so the driver pays
  ``rpc_driver_cpu`` per result, PPO a get and one episode's unpickling, APPO its bookkeeping
  (``env_runner.py: ConduitEnvRunnerMixin.sample``);
* ``LearnerGroup.update`` is still called per update with the placeholders (PPO: the tickets,
  pickled as the call's argument; APPO: empty references; DQN: the replay ticket returned by the
  control-path buffer ``replay_buffer.py: ConduitEpisodeReplayBuffer``, whose ``add([])`` and
  ``sample()`` are plain calls), so a learner update cannot start before the driver's call arrives;
* DQN keeps its **per-step sample RPC**: one synchronous ``sample()`` round per env step (with
  ``rollout_fragment_length=1``), then ``replay_ratio`` updates, then the weight sync
  (``dqn.py: DQN._training_step_new_api_stack``): the iteration is never shorter than that round.

**The plane actor** (``ray_plane.py: PlaneActor``): one per learner node, a Ray actor whose Python
thread (one GIL) does every ingest and delivery of its node's learners on a core of that node. A
call costs its caller ``rpc_driver_cpu`` of CPU, then ``call_round_trip`` (less that CPU) of latency,
half each way, plus the actor's own work (:class:`~conduit.sim.params.PlaneCosts`, measured by
``conduit calibrate``).

* **Ingest** (``env_runner.py: _Sender._send`` -> ``PlaneCluster.ingest_async`` -> ``PlaneActor.ingest``
  -> ``ExperiencePlane.ingest``): on the EnvRunner's process (its one Python thread, shared with
  sampling), the sender packs the episodes into columns (a copy at ``pack_bandwidth``) and, for a
  chunk of ``inline_bytes`` or more, ``ray.put``\\ s it (``StockCosts.put_per_call`` + bytes at
  ``serialize_bandwidth``); the bytes cross to the learner's node; the actor gets the reference
  (``get_per_object``: zero-copy) and copies the chunk into a host tier (``ingest_per_call`` + bytes at
  ``ingest_copy_bandwidth``). At most ``max_in_flight`` chunks per EnvRunner are unacknowledged;
  beyond that ``sample()`` waits. DQN's sender coalesces sample calls for ``coalesce_s`` (at most
  ``max_coalesced_calls``) into one call.
* **Placement**: ``enable()`` registers the learner as a CPU learner (docs/rllib.md, "GPU learners get
  host batches"), so the plane's tiers are the learner node's host memory: a chunk lands in its pinned
  tier while it has room, else in its pageable tier (a stand-in for the policy's choice among those host
  tiers, which this model does not consult: stated here so a reader can question it). No batch is
  placed in HBM.
* **Delivery** (``PlaneCluster.next_batch`` / ``peek`` -> ``PlaneActor.next_batch``): the actor copies
  the rows out (``deliver_per_call`` + bytes at ``deliver_copy_bandwidth``); a result of
  ``return_inline_bytes`` or more goes back through the object store (the actor's ``ray.put``, the
  learner's zero-copy get).
* **At update start** the learner rebuilds episodes (``layout.py: rebuild_trajectories``,
  ``PlaneCosts.rebuild``: one episode object per episode run, the observations copied once; APPO/IMPALA
  rebuild in the prefetch thread, DQN's transition batches not at all) and RLlib's learner connector runs over the whole
  batch (``StockCosts.connector``; PPO's ``StreamedGAE`` only skips the value forward pass), then
  ``NumpyToTensor`` and a pageable host-to-device copy (``learner.py: ConduitLearnerMixin.update``).
  DQN's transition batches skip the connector (``delivery.py: DirectReplay``), not the to-tensor.

**Per algorithm.** PPO streams each fragment in sub-chunks of the size the runtime computes
(:func:`deployed_stream_pieces`: :func:`conduit.deploy_settings.stream_chunk_steps`, an eighth of a
fragment unless the policy's ``target_chunk_bytes`` was given), each a full stock sampler call
(``runner_call_overhead`` each); the learner's value stream (``values.py: ValueStream``)
peeks what landed and runs the value pass while sampling goes on; at update start it takes delivery
of the rest (a round trip). APPO/IMPALA: one chunk per sample call; the learner's prefetch thread
fetches a whole batch from the plane ahead of the next driver ``update`` call (``delivery.py: Prefetcher``,
``prefetch_depth`` 1 unless the policy's ``depth`` is given); when the call arrives, the learner actor's
main thread runs the connector on that batch and hands it to IMPALA's learner thread, which trains on its
own (:meth:`DeployedRoute.deployed_appo_learner_main`): the build overlaps the gradient updates, as the
real run's 0 ms of exposed latency on large observations shows, instead of waiting for the learner to be
free. DQN: the learner's
prefetch thread keeps :func:`deployed_prefetch_depth` replay batches requested (the runtime's
:func:`conduit.deploy_settings.prefetch_depth`: a given policy ``depth``, else enable()'s default, 2 for
a uniform buffer and 1 for a prioritized one, ``Workload.prioritized_replay``), one more at each update's
end; a draw is the actor's ``PlaneCosts.replay_draw`` of the batch's rows (measured on a prioritized
table, and charged for a uniform one too: an upper bound, by the sampler's sum tree). With a prioritized table each update's end
sends its TD errors to the plane (``update_priorities_async``: its submission on the learner's thread,
the actor's ``PlaneCosts.priorities``), and the next draw waits until they have landed
(``learner.py: _cd_draw``). For a local learner (``num_learners=0``) these calls share the driver's
thread.

**Ray's side of a plane call.** Every call a plane actor serves costs its core Ray's side of the call
(the dispatch, the arguments, the reply) besides the plane's own work, as every stock ``sample()`` call
costs its EnvRunner ``StockCosts.rpc_callee_cpu``; both sides add it on top of the measured round trip
the same way. Ingest and batch deliveries add ``PlaneCosts.actor_callee_cpu`` to the plane's in-process
work; a replay draw and a priority update are measured as whole calls on the actor
(``PlaneCosts.replay_draw``, ``PlaneCosts.priorities``). Each of these figures is timed back to back; a call
whose caller or plane actor has not started one lately pays the cold-call law's surcharges on top
(:mod:`conduit.sim.raycalls`: the caller's CPU, the actor's work per call kind, ``PlaneCosts.cold_*``, and the
trip), as RLlib's own calls do.

**Sampling costs CPU.** A sample call holds its EnvRunner's thread and a core of its node for its
duration, so the sender's packing and puts delay sampling, and the plane actor's copies (and a CPU
learner's value stream, :meth:`~conduit.sim.cores.CoreUse.value_pass`) compete with sampling for the
node's cores: the throughput loss measured for real APPO on two cores can appear.
On a node with fewer cores than the processes that may run there (runners, learners, the plane
actor, the driver), the call is held in quanta of :data:`SAMPLING_QUANTUM` (CPython's GIL switch
interval, ``sys.getswitchinterval()``, 5 ms; the kernel's time slices are of that order), so that a
few milliseconds of plane or learner work interleave with a long sample call as the OS would
interleave them, instead of queueing behind all of it; elsewhere a call is one hold (no one waits).
Both sides count the same threads (:class:`conduit.sim.cores.CoreUse`, which also counts a local
learner's extra torch threads, :mod:`conduit.sim.torchteam`): the stock EnvRunners' sampling, a CPU
learner's update and APPO's never-sleeping driver hold cores of a crowded node the same way.

**Simulation speed.** A Python thread on a node with a core per process never waits for a core, so
it is a FIFO single server computed by arithmetic (:class:`ThreadLane`: start at ``max(arrival, free)``);
a call through such threads is one timeout, and an ingest whose parts are all arithmetic needs no
process (:meth:`DeployedRoute._ingest_now`). A call reserves a thread for the time it will reach it,
so calls are served in the order they were issued (FIFO by issue, not by arrival: the same for calls
of one kind, whose latencies are equal). Threads on an oversubscribed node are simulated as events.

**Learners at scale.** ``enable()`` refuses ``num_learners > 1`` today. With more than one learner the
simulator runs the same mechanisms per learner (one plane actor per learner node, each learner fed by
its own runners, one driver call per learner as ``foreach_actor`` makes it): what the runtime would do
once it hands each learner its own batch. Such a run extrapolates beyond the deployed runtime and its
result says so (``validity`` warning, :mod:`conduit.sim.provenance`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator
from typing import Any

import simpy

from conduit.sim.cluster import LearnerRole, RunnerRole
from conduit.sim.cores import SAMPLING_QUANTUM
from conduit.sim.resources import FifoServer, ThreadLane

#: the warning a deployed run with more than one learner carries
MULTI_LEARNER_WARNING = ("policy models enable() as deployed, which refuses num_learners > 1 today; this run "
                         "applies the deployed mechanisms per learner (one plane actor per learner node): an "
                         "extrapolation beyond the runtime")


def deployed_stream_pieces(workload: Any, policy: Any) -> int:
    """Sub-chunks a PPO fragment is streamed in under ``enable()``: ``ceil(fragment env steps /
    chunk_steps)`` with ``chunk_steps`` from :func:`conduit.deploy_settings.stream_chunk_steps`, the
    function the runtime's EnvRunner calls (the policy's ``target_chunk_bytes`` counts only when given,
    :attr:`conduit.policy.Policy.given`; the simulator's ``bytes_per_step`` stands for the layout's)."""
    from conduit.deploy_settings import stream_chunk_steps, target_chunk_bytes

    envs = max(1, int(workload.envs_per_runner))
    fragment = max(1, int(workload.fragment_length)) * envs
    target = target_chunk_bytes(getattr(policy, "params", {}) or {}, getattr(policy, "given", frozenset()))
    chunk = stream_chunk_steps(fragment, envs, float(workload.bytes_per_step), target)
    return max(1, math.ceil(fragment / chunk))


def deployed_prefetch_depth(policy: Any, workload: Any = None, family: str = "replay") -> int:
    """Batches a deployed learner's prefetch thread keeps requested:
    :func:`conduit.deploy_settings.prefetch_depth` for the algorithm family (``"replay"``: by the
    workload's table, uniform unless ``workload.prioritized_replay``; ``"async"``: APPO/IMPALA), with
    the policy's ``depth`` when given, as the runtime's plan computes it (``plan.py``)."""
    from conduit.deploy_settings import policy_depth, prefetch_depth

    depth = policy_depth(getattr(policy, "params", {}) or {}, getattr(policy, "given", frozenset()))
    return prefetch_depth(family, prioritized=bool(getattr(workload, "prioritized_replay", False)), depth=depth)


class DeployedRoute:
    """The deployed plane's route (a mixin of :class:`~conduit.sim.engine.Simulation`)."""

    # ------------------------------------------------------------------ set-up and primitives
    def _deployed_setup(self) -> None:
        env = self.env

        def lane(node: str, fifo: FifoServer | None = None) -> ThreadLane:
            if fifo is None and self.crowded[node]:  # (CoreUse: the plane actor counted)
                fifo = FifoServer(env, 1)
            return ThreadLane(node, fifo)

        self.plane_actor = {lr.node: lane(lr.node) for lr in self.layout.learners}
        self.runner_thread = {r.id: lane(r.node) for r in self.layout.runners}
        self.runner_slots = {r.id: FifoServer(env, self.plane.max_in_flight) for r in self.layout.runners}
        driver = self.driver_lane
        self.learner_thread = {lr.id: (driver if self.workload.local_learner else lane(lr.node))
                               for lr in self.layout.learners}
        #: plane calls by kind (``ingest``, ``peek``, ``next_batch``), countable by tests and studies
        self.plane_calls: dict[str, int] = {"ingest": 0, "peek": 0, "next_batch": 0, "update_priorities": 0}
        # APPO: sample results the driver handled, update calls that reached each learner (and, per
        # learner, the calls waiting for its main thread), the chunks landed in its plane and not yet
        # fetched
        self._deployed_results = 0
        self._deployed_calls = {lr.id: 0 for lr in self.layout.learners}
        self._appo_calls = {lr.id: simpy.Store(env) for lr in self.layout.learners}
        self._appo_landed: dict[str, Any] = {}
        #: APPO: per learner, the fresh chunks its main thread built into the circular buffer (checkable:
        #: at most ``chunks_per_batch`` per driver ``update`` call)
        self.appo_admitted = {lr.id: 0 for lr in self.layout.learners}
        # DQN: each runner's sample calls (which learner's table); per learner, the prefetch thread's requests
        # (Prefetcher.request: one per update end, ``depth`` at the start) and the priority updates sent
        # that the next draw waits for
        self._deployed_seq: dict[str, int] = {}
        self._deployed_requests = {lr.id: simpy.Store(env) for lr in self.layout.learners}
        self._deployed_priorities: dict[str, list] = {lr.id: [] for lr in self.layout.learners}
        #: per learner, when each replay draw began and when each priority update landed (checkable order)
        self.replay_draw_times: dict[str, list[float]] = {lr.id: [] for lr in self.layout.learners}
        self.priorities_landed: dict[str, list[float]] = {lr.id: [] for lr in self.layout.learners}
        # PPO: each runner's current fragment time, drawn once per fragment and shared by its pieces
        self._fragment_left: dict[str, list] = {}

    def _pipeline(self, stages: list[tuple[ThreadLane | None, float]]) -> Generator:
        """Run ``stages`` in order: ``(lane, seconds)`` is work on a thread (FIFO, a core of its node),
        ``(None, seconds)`` a latency. Lanes on nodes with a core per process are served by arithmetic
        (start at ``max(arrival, free)``: a FIFO single server, exact for calls in issue order; a call
        reserves a lane for the time it will arrive there), so a whole call is one timeout; lanes on an
        oversubscribed node are held as events (FIFO thread + a core of the pool)."""
        env = self.env
        t = env.now
        for lane, seconds in stages:
            if lane is None:
                t += seconds
            elif lane.fifo is None:
                t = lane.serve(t, seconds, self.cpus[lane.node])
            else:
                if t > env.now:
                    yield env.timeout(t - env.now)
                yield from self._hold(lane.fifo, lane.node, seconds)
                t = env.now
        if t > env.now:
            yield env.timeout(t - env.now)

    def _hold(self, thread: FifoServer, node: str, seconds: float, compute: bool = False) -> Generator:
        """Work on one Python thread (a FIFO server: the process's GIL) and a core of ``node`` (``compute``:
        sampling). A process's compute and its calls run on different threads of the kernel's (an EnvRunner's
        sampling thread and its sender), so each continues only its own kind of work
        (:meth:`~conduit.sim.resources.CpuPool.work`'s ``thread``). The driver's process (its own thread, a
        local learner's) runs before Ray's workers on a crowded node (``CpuPool``: who runs first)."""
        urgent = thread is self.driver_thread and self.cpus[node].preemptive
        yield thread.acquire()
        try:
            yield from self.cpu(node, seconds, urgent=urgent, compute=compute, thread=(thread, compute))
        finally:
            thread.release()

    def on_runner(self, runner: RunnerRole, seconds: float) -> Generator:
        return self._pipeline([(self.runner_thread[runner.id], seconds)])

    def on_learner(self, lr: LearnerRole, seconds: float) -> Generator:
        return self._pipeline([(self.learner_thread[lr.id], seconds)])

    def on_plane(self, lr: LearnerRole, seconds: float) -> Generator:
        return self._pipeline([(self.plane_actor[lr.node], seconds)])

    def deployed_sample(self, runner: RunnerRole, vector_steps: int, call: bool = True,
                        cold: bool = False) -> Generator:
        """One stock sampler call: the runner's thread and a core of its node for its duration (in
        quanta on an oversubscribed node). ``call``: the first piece of a ``sample()`` call the driver
        made (:meth:`~conduit.sim.engine.Simulation.remote_sample_time`); ``cold``: the call pays its warm-up
        debt (:mod:`conduit.sim.coldwork`: DQN's one-step calls)."""
        seconds = self.remote_sample_time(runner, vector_steps, call)
        if cold:
            seconds += self.cold_work(("runner", runner.id), "runner_call", seconds)
        yield from self._on_runner_thread(runner, seconds)

    def deployed_runner_metrics(self, runner: RunnerRole) -> Generator:
        """The rest of the remote ``sample()`` call after the sampler returns, before the reply
        (``Workload.runner_metrics_time``: ``get_metrics()``; :meth:`~conduit.sim.engine.Simulation.runner_metrics`),
        on the runner's thread, as its sampling."""
        if self.workload.runner_metrics_time > 0:
            yield from self._on_runner_thread(runner, self.workload.runner_metrics_time)

    def _on_runner_thread(self, runner: RunnerRole, left: float) -> Generator:
        """``left`` seconds of the runner's own work (sampling, RLlib's work around it) on its thread and a core."""
        thread = self.runner_thread[runner.id]
        if thread.fifo is None:  # _pipeline([(thread, left)]), inlined
            env = self.env
            t = thread.serve(env.now, left, self.cpus[thread.node])
            if t > env.now:
                yield env.timeout(t - env.now)
            return
        while left > 0:
            step = min(SAMPLING_QUANTUM, left)
            yield from self._hold(thread.fifo, runner.node, step, compute=True)
            left -= step

    @property
    def _half_trip(self) -> float:
        return max(0.0, self.plane.call_round_trip - self.stock.rpc_driver_cpu) / 2

    def _plane_cold(self, caller: Any, lr: LearnerRole, callee_cold: float) -> tuple[float, float, float]:
        """A call from ``caller`` to ``lr``'s node's plane actor starts now: what the cold-call law adds
        (:mod:`conduit.sim.raycalls`) to the caller's CPU, to the trip (latency) and to the actor's work,
        ``callee_cold`` being that call kind's surcharge on the actor (``PlaneCosts.cold_*``)."""
        caller_share, callee_share = self.start_call(caller, ("plane", lr.node))
        return (caller_share * self.stock.rpc_cold_caller_cpu, callee_share * self.plane_cold_trip,
                callee_share * callee_cold)

    def _host_tier(self, lr: LearnerRole, nbytes: float) -> str:
        """The plane's tier for a chunk: the learner node's pinned memory while it has room, else pageable."""
        return lr.pinned if self.ledger.fits(lr.pinned, nbytes) else lr.pageable

    # ------------------------------------------------------------------ the two plane calls
    def deployed_ingest(self, runner: RunnerRole, lr: LearnerRole, group: list, *, before_place=None) -> Generator:
        """One ingest call of ``group`` (chunks, traces): the sender's packing and put on the runner,
        the round trip, the bytes to the learner's node, the actor's get and copy into a host tier.
        ``before_place`` (a generator function) runs once the call reaches the plane, before the chunks
        are placed (DQN: the rate limiter); without it the chunks' room is reserved when the call is
        issued (its tier counts them from then on: conservative for capacity)."""
        p, s = self.plane, self.stock
        nbytes = sum(c.nbytes for c, _ in group)
        via_store = nbytes >= p.inline_bytes
        cold_caller, cold_trip, cold_actor = self._plane_cold(("runner", runner.id), lr, p.cold_callee_cpu)
        work = nbytes / p.pack_bandwidth + s.rpc_driver_cpu + cold_caller
        if via_store:
            work += s.put_per_call + nbytes / s.serialize_bandwidth
        half = self._half_trip
        sender = [(self.runner_thread[runner.id], work), (None, half + cold_trip)]
        actor = [(self.plane_actor[lr.node], p.actor_callee_cpu + p.ingest_per_call + nbytes / p.ingest_copy_bandwidth
                  + (s.get_per_object if via_store else 0.0) + cold_actor), (None, half)]
        if before_place is None:
            yield from self._place(lr, group, nbytes)
            if runner.memory == lr.memory:
                yield from self._pipeline(sender + actor)
            else:
                yield from self._pipeline(sender)
                yield from self.transfer(runner.memory, lr.memory, nbytes)
                yield from self._pipeline(actor)
        else:
            yield from self._pipeline(sender)
            yield from self.transfer(runner.memory, lr.memory, nbytes)
            yield from before_place()
            yield from self._place(lr, group, nbytes)
            yield from self._pipeline(actor)
        self.plane_calls["ingest"] += 1

    def _place(self, lr: LearnerRole, group: list, nbytes: float) -> Generator:
        tier = self._host_tier(lr, nbytes)
        for chunk, _ in group:
            if not self.place_now(chunk.id, tier):
                yield from self.place_in(chunk.id, tier)

    def _deliver_stages(self, lr: LearnerRole, nbytes: float, draw_rows: int | None = None) -> list:
        """A delivery call (``next_batch`` or ``peek``) returning ``nbytes`` of rows, as pipeline stages.
        ``draw_rows``: a Replay draw of that many rows (``PlaneCosts.replay_draw``) instead of handing out
        an assembled batch (``deliver_per_call``); the rows' bytes are copied out either way."""
        p, s = self.plane, self.stock
        half = self._half_trip
        via_store = nbytes >= p.return_inline_bytes
        # a replay draw is measured as the whole call on the actor (Ray's side included); a batch hand-out
        # in process, so Ray's side is added
        own = p.actor_callee_cpu + p.deliver_per_call if draw_rows is None else p.replay_draw(draw_rows)
        cold_caller, cold_trip, cold_actor = self._plane_cold(self.learner_process(lr), lr,
                                                              p.cold_callee_cpu if draw_rows is None else p.cold_draw)
        work = own + cold_actor + nbytes / p.deliver_copy_bandwidth
        if via_store:
            work += s.put_per_call + nbytes / s.serialize_bandwidth
        learner = self.learner_thread[lr.id]
        stages = [(learner, s.rpc_driver_cpu + cold_caller), (None, half + cold_trip), (self.plane_actor[lr.node], work),
                  (None, half)]
        if via_store:
            stages.append((learner, s.get_per_object))
        return stages

    def deployed_deliver(self, lr: LearnerRole, nbytes: float, kind: str = "next_batch", then: float = 0.0,
                         draw_rows: int | None = None) -> Generator:
        """One delivery call returning ``nbytes`` of rows to the learner (then ``then`` seconds of the
        learner's own work on them); ``draw_rows``: a Replay draw (:meth:`_deliver_stages`)."""
        stages = self._deliver_stages(lr, nbytes, draw_rows)
        if then > 0:
            stages.append((self.learner_thread[lr.id], then))
        yield from self._pipeline(stages)
        self.plane_calls[kind] += 1

    def build_at_update_start(self, lr: LearnerRole, steps: float, nbytes: float, *, rebuild: float,
                              episodes: float, connector: bool = True) -> Generator:
        """The learner's pipeline once its batch is in the process: ``rebuild`` seconds of rebuilding it as
        episodes where that happens here (:meth:`rebuild_time`; PPO's ``ValueStream.episodes_for``), RLlib's
        learner connector over the whole batch (unless the batch is already a train batch),
        ``NumpyToTensor`` and a pageable copy of the built batch to the device (host batches)."""
        s, w = self.stock, self.workload
        built = nbytes * w.frame_stack
        work = rebuild + s.to_tensor(built)
        if connector:
            work += self.connector_work(lr, steps / w.steps_per_row, episodes, built)
        yield from self.on_learner(lr, work)
        yield from self.copy_to_device(lr, built, pinned=False)

    def rebuild_time(self, cids: list[int]) -> float:
        """``layout.py: rebuild_trajectories`` of a delivered trajectory batch (:meth:`PlaneCosts.rebuild`):
        one episode object per episode run. A run is an episode's rows in the batch: the episodes the
        steps hold (``episode_length``) plus one per runner whose pieces are in the batch (its first piece
        continues an episode begun before; consecutive pieces of one episode are joined)."""
        return self.plane.rebuild(self.episode_runs(cids), len(cids) * self.workload.chunk_bytes)

    def episode_runs(self, cids: list[int]) -> float:
        """The episode objects a rebuilt batch of ``cids`` holds (:meth:`rebuild_time`): what RLlib's learner
        connector then visits one by one."""
        runners = len({self.rec.chunks[cid].runner for cid in cids})
        return len(cids) * self.workload.chunk_steps / self.workload.episode_length + runners

    def _retire_to_device(self, lr: LearnerRole, cids: list[int]) -> Generator:
        """The delivered rows now sit in the learner's device memory (the plane released its copies)."""
        for cid in cids:
            if self.chunk_ledger.location(cid) is not None and not self.move_now(cid, lr.device_tier):
                yield from self.move_to(cid, lr.device_tier)

    # ================================================================== PPO
    def deployed_ppo_runner(self, runner: RunnerRole, targets: list[LearnerRole], state: Any) -> Generator:
        """``sample()`` in :func:`deployed_stream_pieces` stock sampler calls; each piece goes to the sender (an
        in-flight slot, then an ingest call), and the value stream evaluates it once it has landed."""
        w = self.workload
        slots = self.runner_slots[runner.id]
        for i, target in enumerate(targets):
            yield from self.deployed_sample(runner, w.fragment_length, call=i == 0)
            chunk, trace = self.new_chunk(runner, target, state.k)
            state.expect(target, chunk)
            yield slots.acquire()
            if not self._ingest_now(runner, target, chunk,
                                    lambda lr=target, cid=chunk.id: state.deployed_landed(lr, cid)):
                self.env.process(self._deployed_ppo_piece(runner, target, chunk, trace, state))
        state.runner_done(runner.id, self.env.now)
        yield from self.deployed_runner_metrics(runner)
        state.replies[runner.id] = yield from self._deployed_ticket(runner, state)

    def _deployed_ppo_piece(self, runner: RunnerRole, lr: LearnerRole, chunk: Any, trace: Any, state: Any) -> Generator:
        try:
            yield from self.deployed_ingest(runner, lr, [(chunk, trace)])
        finally:
            self.runner_slots[runner.id].release()
        state.deployed_landed(lr, chunk.id)

    def _ingest_now(self, runner: RunnerRole, lr: LearnerRole, chunk: Any, landed: Any) -> bool:
        """:meth:`deployed_ingest` of one chunk without a process, when every part of it is arithmetic
        (the runner's and the plane's threads served by arithmetic, the same host memory, room in the
        tier now): the same times, one timeout whose callback lands the chunk and frees the runner's
        in-flight slot. Returns False (nothing done) when a part needs events."""
        sender, actor = self.runner_thread[runner.id], self.plane_actor[lr.node]
        if sender.fifo is not None or actor.fifo is not None or runner.memory != lr.memory:
            return False
        nbytes = chunk.nbytes
        tier = self._host_tier(lr, nbytes)
        if not self.ledger.try_reserve(tier, nbytes):
            return False
        now = self.env.now
        self.chunk_ledger.placed(chunk.id, tier, nbytes, now)
        self.rec.chunks[chunk.id].tier = tier
        work, actor_work, half = self._ingest_costs(nbytes)
        cold_caller, cold_trip, cold_actor = self._plane_cold(("runner", runner.id), lr, self.plane.cold_callee_cpu)
        t = sender.serve(now, work + cold_caller, self.cpus[runner.node]) + half + cold_trip
        t = actor.serve(t, actor_work + cold_actor, self.cpus[lr.node]) + half
        slots = self.runner_slots[runner.id]

        def done(_event: Any) -> None:
            slots.release()
            self.plane_calls["ingest"] += 1
            landed()

        self.env.timeout(t - self.env.now).callbacks.append(done)
        return True

    def _ingest_costs(self, nbytes: float) -> tuple[float, float, float]:
        """(the sender's work, the actor's work, half a round trip) of an ingest of ``nbytes``, as
        :meth:`deployed_ingest` adds them up; kept per size (the costs are fixed for the run)."""
        cache = self.__dict__.setdefault("_ingest_cost_cache", {})
        costs = cache.get(nbytes)
        if costs is None:
            p, s = self.plane, self.stock
            via_store = nbytes >= p.inline_bytes
            work = nbytes / p.pack_bandwidth + s.rpc_driver_cpu
            if via_store:
                work += s.put_per_call + nbytes / s.serialize_bandwidth
            actor_work = p.ingest_per_call + nbytes / p.ingest_copy_bandwidth + (s.get_per_object if via_store else 0.0)
            costs = cache[nbytes] = (work, actor_work, self._half_trip)
        return costs

    def deployed_value_stream(self, lr: LearnerRole, state: Any) -> Generator:
        """``values.py: ValueStream``: peek what has landed (one call for all of it), copy it into the
        learner's batch, run the value forward pass on it (``stream_value_pass_per_sample``, else
        ``value_pass_per_sample``: a piece of a few hundred rows keeps its activations below glibc's mmap
        threshold, so it does not fault them in afresh as the whole batch's pass does; the rest of GAE,
        ``advantage_per_sample``, waits for update start); until every chunk of the learner's batch is done."""
        w = self.workload
        per_sample = w.value_pass_per_sample if w.stream_value_pass_per_sample is None else w.stream_value_pass_per_sample
        done = 0
        expected = state.expected[lr.id]
        while done < expected:
            if not state.landed[lr.id]:
                yield state.landed_event(lr)
                continue
            cids, state.landed[lr.id] = state.landed[lr.id], []
            nbytes = len(cids) * w.chunk_bytes
            # the peek, then the rows copied into the learner's own batch
            yield from self.deployed_deliver(lr, nbytes, kind="peek", then=nbytes / self.plane.pack_bandwidth)
            yield from self.copy_to_device(lr, nbytes, pinned=False)  # compute_values' forward pass input
            # the forward pass only: the rest of GAE runs at update start (deployed_ppo_learner_batch)
            yield from self.value_pass(lr, len(cids) * w.chunk_steps * per_sample)
            done += len(cids)

    def deployed_ppo_learner_batch(self, lr: LearnerRole, state: Any) -> Generator:
        """Update *k* on one learner: the driver's call arrives and the stream has evaluated every
        chunk; ``next_batch(from_row=...)`` (a round trip, no rows left to ship), then the learner
        connector over the whole batch, to-tensor and the pageable copy, then the rest of GAE
        (``Workload.advantage_per_sample``: the stream ran only the forward pass)."""
        w = self.workload
        self.view.learner_waiting(lr)
        stream = self.env.process(self.deployed_value_stream(lr, state))
        yield simpy.AllOf(self.env, [stream, state.update_call[lr.id]])
        yield from self.deployed_deliver(lr, 0.0)
        cids = state.assigned[lr.id]
        yield from self.build_at_update_start(lr, len(cids) * w.chunk_steps, len(cids) * w.chunk_bytes,
                                              rebuild=self.rebuild_time(cids), episodes=self.episode_runs(cids))
        yield from self._retire_to_device(lr, cids)
        # StreamedGAE (values.py), after NumpyToTensor as RLlib's GAE piece: the bootstrap rows, advantages and
        # value targets over the whole batch (numpy on the learner's thread), the streamed values in place of
        # the forward pass
        if w.advantage_per_sample > 0:
            yield from self.on_learner(lr, len(cids) * w.chunk_steps * w.advantage_per_sample)
        for cid in cids:
            self.rec.chunks[cid].t_ready = self.env.now
        state.batch_ready_at[lr.id] = self.env.now

    def deployed_ppo_driver(self, state: Any, runner_procs: list) -> Generator:
        """``PPO.training_step`` with placeholders: every runner's ticket comes back through the
        overlapping ``sample()`` round trips, then one ``update`` call per learner (the tickets as its
        argument; RLlib shards zero-length tickets all onto learner 0: the call's size is negligible). A local
        learner (``num_learners=0``) is called in place (``learner_group.py: LearnerGroup.update``, ``is_local``)."""
        yield simpy.AllOf(self.env, runner_procs)  # every ticket in (the end of each runner's process)
        runners = self.layout.runners
        yield from self.read_runner_results([state.replies[r.id] for r in runners], [self.weight(r) for r in runners])
        tickets = self.logical_runners
        for lr in state.learners:
            calls = self.weight(lr)  # a folded learner's node stands for this many learners' calls
            yield from self.on_driver(self.update_call_cpu(tickets / self.logical_learners, 0.0, 0.0, lr, calls))
            if self.workload.local_learner:
                state.update_call[lr.id].succeed()
            else:
                self.env.process(self._deployed_call_arrives(lr, state.update_call[lr.id]))
            self.stock_calls["update_call"] += calls

    def _deployed_ticket(self, runner: RunnerRole, state: Any) -> Generator:
        """A runner's reply under ``enable()``, once its sampling is done: one placeholder episode of no
        steps (the ticket), read by the driver once every reply is in
        (:meth:`~conduit.sim.engine.Simulation.read_runner_results`)."""
        trip, driver_cpu = self.sample_reply(runner, self.weight(runner))
        yield self.env.timeout(trip)
        yield from self.on_driver(driver_cpu)  # the reply handled as it comes (a folded runner's: each it stands for)
        return 1, 0, 0.0

    def _deployed_call_arrives(self, lr: LearnerRole, event: simpy.Event) -> Generator:
        """The driver's ``update`` call reaches the learner actor (a cold learner's Ray side on its thread)."""
        trip, cold = self.update_call_arrives(lr)
        yield self.env.timeout(trip)
        if cold > 0:
            yield from self.on_learner(lr, cold)
        event.succeed()

    # ================================================================== APPO / IMPALA
    def deployed_appo_runner(self, runner: RunnerRole, queues: dict) -> Generator:
        """One chunk per ``sample()`` call (one fragment), sent to the plane of its learner's node;
        the call returns ``[]`` and the driver handles the empty result (:meth:`_deployed_appo_result`).
        A chunk counts in its learner's queue as in flight from its creation until the learner's
        ``update`` has built it into the circular buffer (:meth:`deployed_appo_learner_main`), so the
        runner's backpressure sees the chunks waiting in the plane too."""
        w = self.workload
        slots = self.runner_slots[runner.id]
        i = 0
        while not self._stop:
            yield from self.deployed_sample(runner, w.fragment_length)
            yield from self.deployed_runner_metrics(runner)  # as stock's (AppoLoop.appo_runner): before the chunk
            reply = self.sample_reply(runner)  # this call's, before the runner's next call starts
            if self._stop:
                return
            target = self.layout.target(runner, i)
            i += 1
            chunk, trace = self.new_chunk(runner, target, self._runner_version[runner.id])
            queue, landed = queues[target.id], self._appo_landed[target.id]
            queue.in_flight += 1
            yield slots.acquire()
            if not self._ingest_now(runner, target, chunk, lambda q=landed, cid=chunk.id: q.put(cid)):
                self.env.process(self._deployed_appo_chunk(runner, target, chunk, trace, landed))
            self.env.process(self._deployed_appo_result(reply))
            while len(queue.items) + queue.in_flight > (w.max_lag + 2) * w.chunks_per_batch and not self._stop:
                yield queue.changed()

    def _deployed_appo_chunk(self, runner: RunnerRole, lr: LearnerRole, chunk: Any, trace: Any, landed: Any) -> Generator:
        try:
            yield from self.deployed_ingest(runner, lr, [(chunk, trace)])
        finally:
            self.runner_slots[runner.id].release()
        landed.put(chunk.id)

    def _deployed_appo_result(self, reply: tuple[float, float]) -> Generator:
        """The driver's side of one ``sample()`` result (an empty list): the reply and its bookkeeping;
        every ``chunks_per_batch x learners`` results make a package, and one ``update`` call per
        learner (references only) follows. ``reply``: the sample call's ``(latency, driver's CPU)``."""
        s, w = self.stock, self.workload
        trip, driver_cpu = reply
        yield self.env.timeout(trip)
        yield from self.on_driver(driver_cpu + s.driver_bookkeeping)
        self.stock_calls["sample_result"] += 1
        self._deployed_results += 1
        learners = self.layout.learners
        if self._deployed_results % (w.chunks_per_batch * len(learners)) == 0:
            self.stock_calls["package"] += 1
            for lr in learners:
                caller, callee = self.start_call("driver", ("learner", lr.id))
                yield from self.on_driver(self.caller_cpu(caller))
                self.stock_calls["update_call"] += 1
                self.env.process(self._deployed_appo_call(lr, callee))

    def _deployed_appo_call(self, lr: LearnerRole, cold: float) -> Generator:
        yield self.env.timeout(self.reply_trip(cold) / 2)
        if cold > 0:  # the learner actor's main thread serves the call's Ray side
            yield from self.on_learner(lr, cold * self.stock.rpc_cold_callee_cpu)
        self._deployed_calls[lr.id] += 1
        self._appo_calls[lr.id].put(True)

    def deployed_appo_learner_main(self, lr: LearnerRole, queue: Any) -> Generator:
        """The learner actor's main thread under ``enable()`` (``learner.py: ConduitLearnerMixin.update``),
        one driver ``update`` call after another, in arrival order (a Ray actor runs its calls one at a
        time): take the batch the prefetch thread fetched (``Prefetcher.get``, waiting while it is not
        there; with ``prefetch_depth`` 0 no thread: ``fetch_now`` on this thread), run RLlib's learner
        connector on it and hand it to the learner thread's circular buffer (IMPALA's ``update`` with
        ``async_update``: the learner thread trains on its own, so this work overlaps the gradient
        updates and competes with them only for the node's cores), then ask for one more batch
        (``Prefetcher.request``)."""
        w = self.workload
        calls = self._appo_calls[lr.id]
        depth = deployed_prefetch_depth(self.policy, family="async")
        if depth > 0:
            wanted, ready = simpy.Store(self.env), simpy.Store(self.env, capacity=depth)
            self.env.process(self._deployed_appo_prefetcher(lr, queue, wanted, ready))
            for _ in range(depth):  # Prefetcher.__init__ requests ``depth`` batches
                wanted.put(True)
        while True:
            yield calls.get()
            if depth > 0:
                batch = yield ready.get()
            else:
                batch = yield from self._deployed_appo_fetch(lr, queue)
            steps, nbytes = len(batch) * w.chunk_steps, len(batch) * w.chunk_bytes
            # the prefetch thread rebuilt the episodes (:meth:`_deployed_appo_fetch`)
            yield from self.build_at_update_start(lr, steps, nbytes, rebuild=0.0, episodes=self.episode_runs(batch))
            yield from self._retire_to_device(lr, batch)
            for cid in batch:
                if math.isnan(self.rec.chunks[cid].t_ready):
                    self.rec.chunks[cid].t_ready = self.env.now
                queue.in_flight -= 1
                queue.put(cid)
            self.appo_admitted[lr.id] += len(batch)
            if depth > 0:
                wanted.put(True)

    def _deployed_appo_prefetcher(self, lr: LearnerRole, queue: Any, wanted: simpy.Store,
                                  ready: simpy.Store) -> Generator:
        """The prefetch thread (``delivery.py: Prefetcher._run``): one fetch per request, in order,
        each batch kept until the main thread takes it (at most ``depth`` waiting)."""
        while True:
            yield wanted.get()
            batch = yield from self._deployed_appo_fetch(lr, queue)
            yield ready.put(batch)

    def _deployed_appo_fetch(self, lr: LearnerRole, queue: Any) -> Generator:
        """The prefetch thread's ``next_batch`` (``delivery.py: fetch_now``): it waits until the plane
        holds a whole batch of chunks that landed for this learner, drops on the way the ones the
        contract says are too old for the plane's policy version (the plane's assembly rules,
        :mod:`conduit.plane.rules`), and takes delivery (the actor's copy out and the reply)."""
        w = self.workload
        landed = self._appo_landed[lr.id]
        batch: list[int] = []
        while len(batch) < w.chunks_per_batch:
            while landed.items and len(batch) < w.chunks_per_batch:
                cid = landed.take()
                if self.drop_if_stale(cid, self.version):
                    queue.in_flight -= 1
                    queue.notify()
                    continue
                batch.append(cid)
            if len(batch) < w.chunks_per_batch:
                yield landed.changed()
        # fetch_now: the call, then rebuild() on the fetching thread
        yield from self.deployed_deliver(lr, len(batch) * w.chunk_bytes, then=self.rebuild_time(batch))
        return batch

    # ================================================================== DQN
    def deployed_dqn(self) -> Generator:
        """``DQN.training_step`` with Conduit: a synchronous ``sample()`` round (runners hand their
        steps to the sender), ``add([])``, then the replay-ratio many updates, each on a batch the
        learner's prefetch thread drew from the plane, then the weight sync."""
        from conduit.sim.dqn import _RateLimiter

        w, s = self.workload, self.stock
        learners, runners = self.layout.learners, self.layout.runners
        self._replay = {lr.id: deque() for lr in learners}
        self._limiter = _RateLimiter(self.env, self.contract)
        self._replay_inflight = {lr.id: 0 for lr in learners}
        self._table_changed = {lr.id: self.env.event() for lr in learners}
        self._stop = False
        outbox = {r.id: simpy.Store(self.env, capacity=self.plane.max_coalesced_calls) for r in runners}
        for r in runners:
            self.env.process(self._deployed_dqn_sender(r, outbox[r.id]))
        fetched = {lr.id: simpy.Store(self.env) for lr in learners}
        for lr in learners:
            self.env.process(self._deployed_dqn_prefetcher(lr, fetched[lr.id]))
        inserted = sampled = update = 0
        t_free = {lr.id: 0.0 for lr in learners}
        while update < self.iterations:
            it = update
            t0 = self.env.now
            procs = [self.env.process(self._deployed_dqn_sample(r, outbox[r.id])) for r in runners]
            yield simpy.AllOf(self.env, procs)
            self.rec.span(it, "sampling", t0, self.env.now)
            new = [proc.value for proc in procs]  # (ConditionValue[p] is a linear search)
            last_created = max(self._chunks[c].t_created if c in self._chunks else t0 for c in new)
            t_a = self.env.now
            replies = [self.env.process(self._deployed_dqn_result(r)) for r in runners]
            yield simpy.AllOf(self.env, replies)
            yield from self.read_runner_results([reply.value for reply in replies])
            self.rec.span(it, "a", t_a, self.env.now)
            yield from self.on_driver(s.local_call_overhead)  # ConduitEpisodeReplayBuffer.add([])
            self.stock_calls["round"] += 1
            inserted += len(runners) * w.chunk_steps
            due = 0
            if inserted >= w.min_size:
                due = int(max(0, w.replay_ratio * (inserted - w.min_size) - sampled) // (w.batch_size * len(learners)))
            for _ in range(min(due, self.iterations - update)):
                yield from self.on_driver(s.local_call_overhead)  # sample(): one ticket
                sampled += w.batch_size * len(learners)
                t_b = self.env.now
                calls = []
                for lr in learners:
                    yield from self.on_driver(self.update_call_cpu(1, 0, 0.0, lr))
                    self.stock_calls["update_call"] += 1
                    calls.append(self.env.process(self._deployed_dqn_batch(lr, fetched[lr.id], update)))
                yield simpy.AllOf(self.env, calls)
                ready = self.env.now
                self.rec.span(update, "b", t_b, ready)
                yield from self.dqn_update(update, learners, t_free, last_created, ready)
                yield simpy.AllOf(self.env, [self.env.process(self._deployed_dqn_update_end(lr)) for lr in learners])
                update += 1
            yield from self.dqn_weight_sync(it, update)
        self._stop = True

    def _deployed_dqn_update_end(self, lr: LearnerRole) -> Generator:
        """The end of the learner's ``update()`` (``learner.py: ConduitLearnerMixin.update``): with a
        prioritized table, the update's TD errors go to the plane (``update_priorities_async``: the call's
        submission on the learner's thread, then the call runs on its own); then the prefetch thread is asked
        for one more batch (``Prefetcher.request``)."""
        if self.workload.prioritized_replay:
            cold_caller, cold_trip, cold_actor = self._plane_cold(self.learner_process(lr), lr, self.plane.cold_priorities)
            yield from self.on_learner(lr, self.stock.rpc_driver_cpu + cold_caller)
            self._deployed_priorities[lr.id].append(self.env.process(self._deployed_priority_call(lr, cold_trip,
                                                                                                  cold_actor)))
        yield self._deployed_requests[lr.id].put(True)

    def _deployed_priority_call(self, lr: LearnerRole, cold_trip: float, cold_actor: float) -> Generator:
        """``PlaneActor.update_priorities`` of one batch's ids: the trip there, the actor's work, the reply
        (``cold_*``: what the cold-call law adds, :meth:`_plane_cold`)."""
        p, half = self.plane, self._half_trip
        rows = self.workload.batch_size
        yield from self._pipeline([(None, half + cold_trip), (self.plane_actor[lr.node], p.priorities(rows) + cold_actor),
                                   (None, half)])
        self.plane_calls["update_priorities"] += 1
        self.priorities_landed[lr.id].append(self.env.now)

    def _deployed_dqn_sample(self, runner: RunnerRole, outbox: simpy.Store) -> Generator:
        """One ``sample()``: the stock sampler, then the steps go into the sender's queue (full: wait)."""
        yield from self.deployed_sample(runner, self.workload.fragment_length, cold=True)
        lr = self.layout.target(runner, self._deployed_seq.get(runner.id, 0))
        self._deployed_seq[runner.id] = self._deployed_seq.get(runner.id, 0) + 1
        pair = self.new_chunk(runner, lr, self.version)
        yield outbox.put((lr, pair))
        yield from self.deployed_runner_metrics(runner)  # get_metrics() in the same call, then the reply
        return pair[0].id

    def _deployed_dqn_result(self, runner: RunnerRole) -> Generator:
        """A runner's reply under ``enable()``: an empty list (its transitions went to the plane), handled
        as it comes and read, with its metrics, once every reply is in, as stock's are
        (:meth:`~conduit.sim.engine.Simulation.read_runner_results`: a get and the metrics' bookkeeping)."""
        trip, driver_cpu = self.sample_reply(runner)
        yield self.env.timeout(trip)
        yield from self.on_driver(driver_cpu)
        return 0, 0, 0.0

    def _deployed_dqn_sender(self, runner: RunnerRole, outbox: simpy.Store) -> Generator:
        """``_Sender._gather``: the first sample call, then whatever arrives within ``coalesce_s`` (at
        most ``max_coalesced_calls``), sent as one ingest call per learner."""
        p = self.plane
        slots = self.runner_slots[runner.id]
        while not self._stop:
            items = [(yield outbox.get())]
            deadline = self.env.now + p.coalesce_s
            while len(items) < p.max_coalesced_calls and self.env.now < deadline:
                get = outbox.get()
                wait = self.env.timeout(deadline - self.env.now)
                yield get | wait
                if get.triggered:
                    items.append(get.value)
                else:
                    get.cancel()
                    break
            by_learner: dict[str, list] = {}
            for lr, pair in items:
                by_learner.setdefault(lr.id, []).append(pair)
                self._replay_make_room(lr.id)  # evict before ingesting: live + in flight <= capacity
                self._replay_inflight[lr.id] += 1
            for lid, group in by_learner.items():
                yield slots.acquire()
                self.env.process(self._deployed_dqn_ingest(runner, self._learner(lid), group))

    def _deployed_dqn_ingest(self, runner: RunnerRole, lr: LearnerRole, group: list) -> Generator:
        steps = len(group) * self.workload.chunk_steps

        def admit() -> Generator:  # the plane's rate limiter, insert side (the ingest call blocks)
            yield from self._limiter.insert(steps)

        try:
            yield from self.deployed_ingest(runner, lr, group, before_place=admit)
        finally:
            self.runner_slots[runner.id].release()
        for chunk, _ in group:
            self._replay_inflight[lr.id] -= 1
            self._replay[lr.id].append(chunk.id)
        self._replay_notify(lr.id)

    def _deployed_dqn_prefetcher(self, lr: LearnerRole, fetched: simpy.Store) -> Generator:
        """``delivery.py: Prefetcher``: ``depth`` fetches requested at the start, one more at each update's
        end. A fetch (``learner.py: _cd_draw``) first waits until every priority update sent so far has
        landed (a prioritized table), then draws from the plane (``PlaneActor.next_batch``)."""
        w = self.workload
        depth = max(1, deployed_prefetch_depth(self.policy, w))
        requests = self._deployed_requests[lr.id]
        for _ in range(depth):
            requests.put(True)
        for k in range(self.iterations):
            yield requests.get()
            sent, self._deployed_priorities[lr.id] = self._deployed_priorities[lr.id], []
            if sent:
                yield simpy.AllOf(self.env, sent)
            while not self._replay[lr.id]:
                yield self._table_changed[lr.id]
            yield from self._limiter.sample(w.batch_size)
            newest = self._chunks[self._replay[lr.id][-1]].t_created
            selections = self._replay_sample(self._replay[lr.id], w.batch_size)
            self.auditor.delivered(k, selections, self.env.now)
            self.replay_draw_times[lr.id].append(self.env.now)
            yield from self.deployed_deliver(lr, w.batch_size * w.bytes_per_step, draw_rows=w.batch_size)
            yield fetched.put((selections, newest))

    def _deployed_dqn_batch(self, lr: LearnerRole, fetched: simpy.Store, update: int) -> Generator:
        """The learner's ``update()``: take the prefetched batch (waiting if it is not there yet), then
        to-tensor and the pageable copy (no connector pass: ``DirectReplay``)."""
        w = self.workload
        if not w.local_learner:
            trip, cold = self.update_call_arrives(lr)
            yield self.env.timeout(trip)
            if cold > 0:
                yield from self.on_learner(lr, cold)
        selections, newest = yield fetched.get()
        # DirectReplay: the transition rows are the train batch, no episodes rebuilt
        yield from self.build_at_update_start(lr, w.batch_size, w.batch_size * w.bytes_per_step, rebuild=0.0,
                                              episodes=w.batch_size, connector=False)
        for cid, _ in selections:
            trace = self.rec.chunks[cid]
            if math.isnan(trace.t_ready):
                trace.t_ready = self.env.now
        return newest
