"""The simulation: RL algorithm loops whose experience path runs through the plane's policies.

One :class:`Simulation` couples a topology, a workload and a :class:`~conduit.policy.Policy`. Env
runners produce chunks; the path each chunk takes to its learner is decided by the policy and
executed here with contended resources — flows on the max-min network (:mod:`conduit.sim.network`),
CPU cores (serialization, batch building), GPU compute (value passes, updates) and tier capacity.

Two families of path exist, chosen by the policy's :class:`~conduit.policy.PathSettings`:

* ``route="driver"`` — stock RLlib 2.60 (new API stack), modelled step by step; each step cites
  the RLlib code it models:

  - PPO (``ppo.py: PPO.training_step``): ``synchronous_parallel_sample`` blocks until every
    EnvRunner's ``sample()`` returns; episodes are serialized on the runner, fetched and deserialized
    in the driver (segment *a*; ``ray.get`` in ``FaultTolerantActorManager.foreach_actor``), driver
    bookkeeping (*a2*), then ``LearnerGroup.update`` shards the episodes and sends one shard per
    learner actor (*b*: serialize in the driver, RPC, deserialize in the learner). In the learner,
    ``Learner._make_batch_if_necessary`` runs the learner connector pipeline over the whole batch
    (*c*), ``NumpyToTensor`` plus a pageable host->device copy (*d*; RLlib does not pin), and
    ``GeneralAdvantageEstimation`` runs the value function over the whole batch (*gae*). All of it
    after sampling, before the update.
  - APPO/IMPALA (``impala.py: IMPALA.training_step``): runners ``ray.put`` their episodes and return
    references; the driver polls them (``foreach_env_runner_async``, *a*) and hands the references to
    the learners (*b*); the learner resolves them with ``ray.get`` (transfer + deserialize), runs its
    connector (*c*), and a GPU loader thread (``_GPULoaderThread``) does to-tensor plus the pageable
    copy (*d*) into the learner thread's circular buffer (``CircularBuffer``), which trains.
  - DQN (``dqn.py: DQN.training_step``): runners sample a few steps per call (*a*); the driver adds
    them to its ``EpisodeReplayBuffer`` (``add`` deep-copies), samples a batch per learner
    (``sample``), sends it to the learner (*b*), whose connector (*c*) and pageable copy (*d*) run
    before each update; weights are synced after the updates.

* ``route="direct"`` — the plane: each chunk (or group of ``granularity`` chunks) is written once
  into a staging slot on the producer's node, placed by the placement policy (validated, with a safe
  fallback), moved towards its consumer in the order the scheduling policy chooses, and, with
  ``batch_build="per-chunk"``, batch-built and value-passed per chunk as it arrives.

Every ingestion, placement, move, delivery, consumption, eviction and drop is reported to the
:class:`~conduit.audit.Auditor`.
"""

from __future__ import annotations

import gc
import math
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from conduit.audit import Auditor, AuditReport
from conduit.chunk import Chunk
from conduit.errors import ConduitError
from conduit.policy import ChunkInfo, InvalidDecision, Policy
from conduit.sim.cluster import ClusterLayout, LearnerRole, RunnerRole, lay_out
from conduit.sim.metrics import ChunkTrace, Recorder, UpdateTrace
from conduit.sim.network import Network
from conduit.sim.params import PlaneCosts, StockCosts
from conduit.sim.resources import ComputeEngine, CpuPool, FifoServer, TierLedger
from conduit.sim.view import SimClusterView
from conduit.sim.workload import Workload
from conduit.topology import TierKind, Topology

DEFAULT_PAGEABLE_COPY_FRACTION = 0.25


@dataclass
class SimResult:
    """Everything one run produced."""

    topology: str
    workload: Workload
    policy: Policy
    seed: int
    iterations: int
    metrics: dict[str, Any]
    segments: dict[str, float]
    audit: AuditReport
    recorder: Recorder
    link_utilization: dict[str, float]
    tier_peak: dict[str, float]
    cpu_busy: dict[str, float]
    gpu_busy: dict[str, float]
    sim_time: float
    events: int
    tier_trace: list = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topology": self.topology,
            "workload": self.workload.name,
            "policy": self.policy.name,
            "seed": self.seed,
            "iterations": self.iterations,
            "metrics": self.metrics,
            "segments_s": self.segments,
            "audit": self.audit.to_dict(),
            "link_utilization": self.link_utilization,
            "tier_peak_bytes": self.tier_peak,
            "cpu_busy_core_s": self.cpu_busy,
            "gpu_busy_s": self.gpu_busy,
            "sim_time_s": self.sim_time,
            "events": self.events,
        }


class Simulation:
    """One simulated training run. ``run()`` returns a :class:`SimResult`."""

    def __init__(
        self,
        topology: Topology,
        workload: Workload,
        policy: Policy,
        *,
        iterations: int = 10,
        seed: int = 0,
        stock: StockCosts | None = None,
        plane: PlaneCosts | None = None,
        progress: Callable[[int, int], None] | None = None,
    ):
        if iterations < 1:
            raise ConduitError(f"iterations must be >= 1, got {iterations}")
        self.path = policy.path
        pieces = self.path.pieces(workload.chunk_bytes)
        if pieces > 1:
            workload = split_fragments(workload, pieces)
        self.topology, self.workload, self.policy = topology, workload, policy
        self.iterations, self.seed = iterations, seed
        self.stock, self.plane = stock or StockCosts(), plane or PlaneCosts()
        self.progress = progress
        self.env = simpy.Environment()
        self.rng = np.random.default_rng(seed)
        self.layout: ClusterLayout = lay_out(topology, workload)
        self.network = Network(self.env, topology.graph)
        self.cpus = {
            node: CpuPool(self.env, node, sum(c.get("cores", 1) for c in topology.devices_of("cpu", node)) or 1,
                          float(next((c.get("cpu_speed", 1.0) for c in topology.devices_of("cpu", node)), 1.0)))
            for node in topology.nodes
        }
        self.compute = {lr.device: ComputeEngine(self.env, lr.device) for lr in self.layout.learners}
        self._learners_by_id = {lr.id: lr for lr in self.layout.learners}
        self.ledger = TierLedger(self.env, topology)
        self.contract = workload.contract(runners=len(self.layout.runners))
        self.auditor = Auditor(self.contract, tier_capacities={k: int(v) for k, v in self.ledger.capacity.items()})
        self.rec = Recorder()
        self.view = SimClusterView(self)
        self.driver_thread = FifoServer(self.env, 1)
        self.version = 0
        self._next_chunk = 0
        self._location: dict[int, str] = {}
        self._chunks: dict[int, Chunk] = {}
        self._check_fits()

    # ------------------------------------------------------------------ helpers
    def _check_fits(self) -> None:
        w = self.workload
        biggest = max(self.ledger.capacity.values())
        if w.chunk_bytes > biggest:
            raise ConduitError(
                f"workload {w.name!r}: a chunk of {w.chunk_bytes:.3g} bytes is larger than every tier of "
                f"topology {self.topology.name!r} (largest {biggest:.3g} bytes)"
            )
        batch = {"ppo": w.train_batch_per_learner * w.bytes_per_step,
                 "appo": w.chunks_per_batch * w.chunk_bytes,
                 "dqn": w.batch_size * w.bytes_per_step}[w.algorithm]
        if w.algorithm == "dqn" and self.path.route == "direct":
            feeders = max(len([r for r in self.layout.runners if lr in self.layout.feeds[r.id]])
                          for lr in self.layout.learners) or 1
            need = (2 * feeders * self.path.granularity + 1) * w.chunk_steps
            share = w.replay_capacity / len(self.layout.learners)
            if share < need:
                raise ConduitError(
                    f"workload {w.name!r}: replay_capacity {w.replay_capacity} gives each of the "
                    f"{len(self.layout.learners)} learners' replay tables {share:.0f} steps, less than the "
                    f"{need} steps its {feeders} runner(s) can have in flight; raise replay_capacity"
                )
        for lr in self.layout.learners:
            room = self.ledger.capacity[lr.device_tier]
            if batch > room:
                raise ConduitError(
                    f"workload {w.name!r}: a learner's batch of {batch:.3g} bytes does not fit the device "
                    f"memory of {lr.id} ({lr.device_tier}, {room:.3g} bytes) on topology {self.topology.name!r}"
                )

    def cpu(self, node: str, seconds: float) -> Generator:
        return self.cpus[node].work(seconds)

    def on_driver(self, seconds: float) -> Generator:
        """Work on the driver's single Python thread (and a core of its node)."""
        yield self.driver_thread.acquire()
        try:
            yield from self.cpu(self.layout.driver_node, seconds)
        finally:
            self.driver_thread.release()

    def transfer(self, src: str, dst: str, nbytes: float) -> Generator:
        if src != dst and nbytes > 0:
            yield self.network.transfer(src, dst, nbytes)

    def staging_bandwidth(self, memory: str) -> float:
        """Speed of the CPU memcpy through a pinned bounce buffer that a pageable copy pays."""
        mem = self.topology.devices[memory]
        return mem.get("pageable_copy_bandwidth") or DEFAULT_PAGEABLE_COPY_FRACTION * mem.get("bandwidth", 40e9)

    def copy_to_device(self, learner: LearnerRole, nbytes: float, pinned: bool, src_device: str | None = None) -> Generator:
        """A copy into the learner's device from host memory (default: its node's), NVMe or a peer
        GPU. A CPU learner's device memory is host memory: nothing to do."""
        if learner.hbm is not None:
            yield from self.copy_into_gpu(learner.device, learner.node, nbytes, pinned, src_device or learner.memory)

    def copy_into_gpu(self, gpu: str, node: str, nbytes: float, pinned: bool, source: str) -> Generator:
        """One copy into a GPU's memory. Pageable host copies are staged through a bounce buffer (a
        CPU memcpy on ``node``) before the DMA; every copy pays the GPU's launch overhead; an NVMe
        source is also held to its media read speed."""
        yield self.env.timeout(self.view.copy_launch_overhead(gpu))
        kind = self.topology.devices[source].kind
        if kind == "memory" and not pinned:
            yield from self.cpu(node, nbytes / self.staging_bandwidth(source))
        start = self.env.now
        yield from self.transfer(source, gpu, nbytes)
        if kind == "nvme":
            media = nbytes / self.topology.devices[source].get("read_bandwidth", 3e9)
            if self.env.now - start < media:
                yield self.env.timeout(media - (self.env.now - start))

    def sample_time(self, vector_steps: int) -> float:
        w = self.workload
        if w.env_step_cv > 0 and w.env_step_time > 0:
            sigma = math.sqrt(math.log1p(w.env_step_cv**2))
            mu = math.log(w.env_step_time) - sigma**2 / 2
            # the sum of many lognormal steps: draw the mean of `vector_steps` draws cheaply
            per_step = float(np.mean(self.rng.lognormal(mu, sigma, size=min(vector_steps, 64))))
        else:
            per_step = w.env_step_time
        return w.runner_call_overhead + vector_steps * (per_step + w.inference_time)

    def new_chunk(self, runner: RunnerRole, learner: LearnerRole, version: int) -> tuple[Chunk, ChunkTrace]:
        w = self.workload
        cid = self._next_chunk
        self._next_chunk += 1
        chunk = Chunk(cid, runner.id, runner.node, w.chunk_steps, int(w.chunk_bytes), version, self.env.now,
                      checksum=self._checksum(cid))
        trace = ChunkTrace(cid, runner.id, learner.id, version, w.chunk_steps, w.chunk_bytes, "", self.env.now)
        self.rec.chunks[cid] = trace
        self._chunks[cid] = chunk
        self.auditor.ingested(chunk, self.env.now)
        return chunk, trace

    # tier accounting, mirrored into the auditor ------------------------------------------------
    def place_in(self, cid: int, tier: str) -> Generator:
        nbytes = self._chunks[cid].nbytes
        yield self.ledger.reserve(tier, nbytes)
        self._location[cid] = tier
        self.rec.chunks[cid].tier = tier
        self.auditor.placed(cid, tier, nbytes, self.env.now)

    def move_to(self, cid: int, tier: str) -> Generator:
        src = self._location[cid]
        if src == tier:
            return
        nbytes = self._chunks[cid].nbytes
        yield self.ledger.reserve(tier, nbytes)
        self.ledger.release(src, nbytes)
        self._location[cid] = tier
        self.rec.chunks[cid].tier = tier
        self.auditor.moved(cid, src, tier, nbytes, self.env.now)

    def release(self, cid: int) -> None:
        tier = self._location.pop(cid, None)
        if tier is not None:
            self.ledger.release(tier, self._chunks[cid].nbytes)
            self.auditor.evicted(cid, self.env.now)
        self._chunks.pop(cid, None)

    # placement through the policy, validated ------------------------------------------------------
    def decide_tier(self, chunk: Chunk, runner: RunnerRole, learner: LearnerRole) -> str:
        """Ask the placement policy; reject invalid decisions (unknown tier, no room, a tier the
        consumer cannot reach) and fall back to pinned, then pageable, host memory on the consumer."""
        info = ChunkInfo(chunk.id, runner.node, runner.device, chunk.nbytes, chunk.policy_version, learner.id)
        try:
            tier = self.policy.placement.place(info, self.view).tier
            if tier not in self.ledger.capacity:
                raise InvalidDecision(self.policy.placement.name, tier, "unknown tier")
            if not self.ledger.fits(tier, chunk.nbytes):
                raise InvalidDecision(self.policy.placement.name, tier,
                                      f"over capacity ({chunk.nbytes} bytes do not fit)")
            kind = self.topology.tier(tier).kind
            if kind is TierKind.HBM and tier != learner.hbm and self.topology.tier(tier).node != learner.node:
                raise InvalidDecision(self.policy.placement.name, tier, "HBM of another node than the consumer's")
            return tier
        except InvalidDecision as exc:
            self.rec.reject(str(exc))
        for fallback in (learner.pinned, learner.pageable):
            if self.ledger.fits(fallback, chunk.nbytes):
                return fallback
        return learner.pageable  # waits for room: capacity is never exceeded

    # ------------------------------------------------------------------ run
    def run(self) -> SimResult:
        algorithm = self.workload.algorithm
        loop = {"ppo": self.ppo_loop, "appo": self.appo_loop, "dqn": self.dqn_loop}[algorithm]
        done = self.env.process(loop())
        # the run allocates millions of small, acyclic objects (events, traces); the cyclic garbage
        # collector would rescan the growing heap over and over (~30% of the run) for nothing
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.env.run(until=done)
        except RuntimeError as exc:
            if "No scheduled events left" not in str(exc):
                raise
            raise ConduitError(self._stall_report()) from None
        finally:
            if collecting:
                gc.enable()
        audit = self.auditor.finish(self.env.now)
        horizon = max(self.env.now, 1e-12)
        link_util = {
            f"{u}->{v}": s.utilization(horizon)
            for (u, v), s in self.network.link_stats().items() if s.bytes > 0
        }
        top = dict(sorted(link_util.items(), key=lambda kv: -kv[1])[:20])
        return SimResult(
            topology=self.topology.name, workload=self.workload, policy=self.policy, seed=self.seed,
            iterations=self.iterations, metrics=self.rec.metrics(self._warmup()), segments=self.rec.segment_means(self._warmup()),
            audit=audit, recorder=self.rec, link_utilization=top,
            tier_peak={k: v for k, v in self.ledger.peak.items() if v > 0},
            cpu_busy={n: c.busy_core_seconds for n, c in self.cpus.items() if c.busy_core_seconds > 0},
            gpu_busy={d: c.busy_seconds for d, c in self.compute.items()},
            sim_time=self.env.now, events=_scheduled_events(self.env), tier_trace=self.ledger.trace,
        )

    def _stall_report(self) -> str:
        """Why a run stopped with work left: which tiers have placements waiting for room."""
        waiting = {tier: len(queue) for tier, queue in getattr(self.ledger, "_waiters", {}).items() if queue}
        where = "; ".join(f"{tier}: {n} placement(s) wait for room, {self.ledger.used[tier]:.3g} of "
                          f"{self.ledger.capacity[tier]:.3g} bytes used" for tier, n in sorted(waiting.items())[:5])
        return (f"simulation stalled at t={self.env.now:.6g} s: workload {self.workload.name!r} under policy "
                f"{self.policy.name!r} does not fit topology {self.topology.name!r} "
                f"({where or 'no placement is waiting; the loop starved'}). Give the tiers more capacity "
                f"or the workload a smaller working set.")

    def _warmup(self) -> int:
        """Updates left out of the means: the first, which fills empty pipelines, and for the
        asynchronous loops a tenth of the run (queues and buffers filling)."""
        if self.workload.algorithm == "ppo":
            return 1 if self.iterations > 1 else 0
        return max(1, self.iterations // 10)

    def _tick(self, k: int) -> None:
        if self.progress is not None:
            self.progress(k + 1, self.iterations)

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
            procs = [self.env.process(self.ppo_runner(r, plan[r.id], state)) for r in runners]
            if self.path.route == "driver":
                self.env.process(self.stock_ppo_driver(state, procs))
            batch_ready = [self.env.process(self.ppo_learner_batch(lr, state)) for lr in learners]
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
                needed = state.t_sampling_done if self.path.route == "driver" else state.last_created[lr.id]
                updates.append(UpdateTrace(k, lr.id, state.samples[lr.id], t_free[lr.id],
                                           needed, ready, t_update, math.nan))
                self.auditor.delivered(k, [(c, range(w.chunk_steps)) for c in state.assigned[lr.id]], ready,
                                       checksums={c: self._checksum(c) for c in state.assigned[lr.id]})
            yield simpy.AllOf(self.env, [self.env.process(self.compute[lr.device].run(
                w.update_overhead + w.epochs * state.samples[lr.id] * w.update_time_per_sample)) for lr in learners])
            self.rec.span(k, "update", t_update, self.env.now)
            for u in updates:
                u.t_end = self.env.now
                t_free[u.learner] = self.env.now
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
        for i in range(max(per_runner, default=0)):
            for j, runner in enumerate(runners):
                if i >= per_runner[j]:
                    continue
                fed = self.layout.feeds[runner.id]
                choice = None
                for pool in (fed, [lr for lr in learners if lr.node == runner.node], learners):
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
            yield self.env.timeout(self.sample_time(w.fragment_length))
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

    # ---- stock PPO: everything through the driver, after sampling
    def stock_ppo_driver(self, state: _PpoIteration, runner_procs: list) -> Generator:
        k, s, w = state.k, self.stock, self.workload
        driver_mem = self.layout.driver_memory
        fetches = [self.env.process(self.stock_fetch_result(r, state, driver_mem))
                   for r in self.layout.runners]
        yield simpy.AllOf(self.env, runner_procs)
        t_a = self.env.now
        yield simpy.AllOf(self.env, fetches)
        self.rec.span(k, "a", t_a, self.env.now - len(self.layout.runners) * s.driver_bookkeeping)
        t_b = self.env.now
        sends = []
        for lr in state.learners:
            cids = state.assigned[lr.id]
            nbytes = len(cids) * w.chunk_bytes
            episodes = len(cids) * w.chunk_episodes
            yield from self.on_driver(s.rpc_overhead + s.shard_serialize(episodes, nbytes))
            sends.append(self.env.process(self.stock_deliver_shard(lr, cids, nbytes, episodes, state, t_b)))
        yield simpy.AllOf(self.env, sends)

    def stock_fetch_result(self, runner: RunnerRole, state: _PpoIteration, driver_mem: str) -> Generator:
        """EnvRunner.sample() returns: serialize on the runner, move, ``ray.get`` in the driver."""
        w, s = self.workload, self.stock
        yield state.runner_done_event[runner.id]
        cids = [c.id for c in state.runner_chunks[runner.id]]
        if not cids:
            return
        nbytes, episodes = len(cids) * w.chunk_bytes, len(cids) * w.chunk_episodes
        yield from self.cpu(runner.node, s.sample_serialize(episodes, nbytes))
        for cid in cids:
            yield from self.place_in(cid, f"{runner.memory}:pageable")
        yield from self.transfer(runner.memory, driver_mem, nbytes)
        for cid in cids:
            yield from self.move_to(cid, f"{driver_mem}:pageable")
        yield from self.on_driver(s.rpc_overhead / 2 + s.sample_deserialize(episodes, nbytes))
        yield from self.on_driver(s.driver_bookkeeping)
        self.rec.span(state.k, "a2", 0.0, s.driver_bookkeeping)  # its own work; queueing is in a

    def stock_deliver_shard(self, lr: LearnerRole, cids: list[int], nbytes: float, episodes: float,
                            state: _PpoIteration, t_b: float) -> Generator:
        s, w, k = self.stock, self.workload, state.k
        yield from self.transfer(self.layout.driver_memory, lr.memory, nbytes)
        yield from self.cpu(lr.node, s.shard_deserialize(episodes, nbytes))
        for cid in cids:
            yield from self.move_to(cid, lr.pageable)
        observed = lr.index == 0
        if observed:
            self.rec.span(k, "b", t_b, self.env.now)
        t_c = self.env.now
        samples = len(cids) * w.chunk_steps
        yield from self.cpu(lr.node, s.connector(samples / w.steps_per_row, nbytes))
        t_d = self.env.now
        yield from self.cpu(lr.node, s.to_tensor(nbytes))
        yield from self.copy_to_device(lr, nbytes, pinned=False)
        for cid in cids:
            yield from self.move_to(cid, lr.device_tier)
        t_gae = self.env.now
        yield from self.compute[lr.device].run(samples * w.value_pass_per_sample)
        if observed:
            self.rec.span(k, "c", t_c, t_d)
            self.rec.span(k, "d", t_d, t_gae)
            self.rec.span(k, "gae", t_gae, self.env.now)
        for cid in cids:
            self.rec.chunks[cid].t_ready = self.env.now
        state.chunks_ready(lr, len(cids))

    # ---- the plane's direct path
    def direct_group(self, runner: RunnerRole, learner: LearnerRole, group: list, state: Any) -> Generator:
        """Ingest a group of chunks on the producer's node, place, move, build and ready them."""
        w, p = self.workload, self.plane
        if not self.path.overlap_collection and state is not None:
            yield state.sampling_done
        nbytes = sum(c.nbytes for c, _ in group)
        samples = sum(c.steps for c, _ in group)
        per_chunk = self.path.batch_build == "per-chunk"
        work = p.ingest_per_call + nbytes / p.ingest_copy_bandwidth
        if per_chunk:
            work += self.stock.connector(samples / w.steps_per_row, nbytes)
        yield from self.cpu(runner.node, work)
        tier = self.decide_tier(group[0][0], runner, learner)
        if not self.ledger.fits(tier, nbytes):
            yield from self.make_room(tier, nbytes)
        for chunk, _ in group:
            yield from self.place_in(chunk.id, tier)
        placed = self.topology.tier(tier)
        if placed.kind is TierKind.HBM:
            yield from self.copy_into_gpu(placed.device, runner.node, nbytes, self.path.pinned, runner.memory)
        else:
            yield from self.transfer(runner.memory, placed.device, nbytes)
        if not per_chunk:  # the learner builds the batch once all of it has arrived
            if state is not None:
                state.host_arrived(learner, len(group))
            return
        if tier != learner.device_tier and self.workload.algorithm != "dqn":  # replay samples in place
            yield from self.scheduled_move(learner, [c.id for c, _ in group], nbytes, state)
        if w.value_pass_per_sample > 0:
            yield from self.compute[learner.device].run(samples * w.value_pass_per_sample)
        for chunk, trace in group:
            trace.t_ready = self.env.now
        if state is not None:
            state.chunks_ready(learner, len(group))

    def make_room(self, tier: str, nbytes: float) -> Generator:
        """Ask the placement policy to spill from a full tier, validate and execute its moves.

        A move of a chunk that is not in the tier, to an unknown tier, or to one without room is
        rejected (counted) and skipped; if the tier is still full the placement then waits for room."""
        need = self.ledger.used[tier] + nbytes - self.ledger.capacity[tier]
        try:
            moves = list(self.policy.placement.spill(tier, need, self.view))
        except InvalidDecision as exc:
            self.rec.reject(str(exc))
            return
        for move in moves:
            cid = move.chunk_id
            if self._location.get(cid) != tier or move.dst_tier not in self.ledger.capacity:
                self.rec.reject(str(InvalidDecision(self.policy.placement.name, move, "not a resident of the tier / unknown tier")))
                continue
            if not self.ledger.fits(move.dst_tier, self._chunks[cid].nbytes):
                self.rec.reject(str(InvalidDecision(self.policy.placement.name, move, "over capacity")))
                continue
            size = self._chunks[cid].nbytes
            yield from self.transfer(self.topology.tier(tier).device, self.topology.tier(move.dst_tier).device, size)
            if self._location.get(cid) == tier:  # still there (not consumed meanwhile)
                yield from self.move_to(cid, move.dst_tier)
                self.rec.spilled += 1

    def scheduled_move(self, learner: LearnerRole, cids: list[int], nbytes: float, state: Any) -> Generator:
        """Wait until the scheduling policy starts the move into the learner's device, then do it."""
        if learner.hbm is None:
            for cid in cids:
                yield from self.move_to(cid, learner.device_tier)
            return
        gate = self.view.enqueue(learner, cids, nbytes)
        yield gate
        source = self.topology.tier(self._location[cids[0]])
        yield from self.copy_to_device(learner, nbytes, pinned=source.kind is not TierKind.PAGEABLE,
                                       src_device=source.device)
        for cid in cids:
            yield from self.move_to(cid, learner.device_tier)
        self.view.moved(learner, cids)

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
            yield from self.compute[lr.device].run(len(cids) * self.workload.chunk_steps * self.workload.value_pass_per_sample)
            for cid in cids:
                self.rec.chunks[cid].t_ready = self.env.now
            state.chunks_ready(lr, len(cids))
        yield state.all_ready[lr.id]
        # device-side batch assembly: one pass over the batch in HBM
        gpu = self.topology.devices.get(lr.device)
        hbm_bw = gpu.get("memory_bandwidth", 1e12) if gpu is not None and gpu.kind == "gpu" else 10e9
        yield self.env.timeout(len(state.assigned[lr.id]) * self.workload.chunk_bytes / hbm_bw)
        state.batch_ready_at[lr.id] = self.env.now

    # ================================================================== APPO / IMPALA (bounded staleness)
    def appo_loop(self) -> Generator:
        w = self.workload
        learners = self.layout.learners
        queues = {lr.id: _ReadyQueue(self.env) for lr in learners}
        self._runner_version = {r.id: 0 for r in self.layout.runners}
        self._stop = False
        for r in self.layout.runners:
            self.env.process(self.appo_runner(r, queues))
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
            yield simpy.AllOf(self.env, [self.env.process(self.compute[lr.device].run(
                w.update_overhead + u.samples * w.update_time_per_sample)) for lr, u in zip(learners, updates, strict=True)])
            for u in updates:
                u.t_end = t_free[u.learner] = self.env.now
            self.rec.updates.extend(updates)
            self.rec.span(k, "update", t_start, self.env.now)
            if (k + 1) % w.broadcast_interval == 0:
                self.env.process(self.broadcast(k + 1))
            self._tick(k)
        self._stop = True
        # retire what is left: still-queued chunks are dropped (counted), buffers released
        for lr in learners:
            for cid in list(queues[lr.id].items) + [c for c, _ in reuse[lr.id]]:
                if cid in self._chunks:
                    self.auditor.dropped(cid, self.env.now, "end-of-run")
                    self.release(cid)

    def _build_batch_on_learner(self, lr: LearnerRole, batch: list[int]) -> Generator:
        """Per-batch building (the framework's connector on the learner's CPU over the whole batch),
        then one copy of whatever the placement left off the device."""
        w, s = self.workload, self.stock
        nbytes = len(batch) * w.chunk_bytes
        yield from self.cpu(lr.node, s.connector(len(batch) * w.chunk_steps / w.steps_per_row, nbytes)
                            + s.to_tensor(nbytes))
        by_tier: dict[str, list[int]] = {}
        for cid in batch:
            tier = self._location.get(cid)
            if tier is not None and tier != lr.device_tier:
                by_tier.setdefault(tier, []).append(cid)
        yield from self._copy_in(lr, {tier: len(cids) * w.chunk_bytes for tier, cids in by_tier.items()})
        for cids in by_tier.values():
            for cid in cids:
                yield from self.move_to(cid, lr.device_tier)

    def _copy_in(self, lr: LearnerRole, bytes_by_tier: dict[str, float]) -> Generator:
        """Copy into the learner's device what lies in other tiers, one copy per source tier
        (pinned DMA unless the source is pageable memory)."""
        for tier, nbytes in sorted(bytes_by_tier.items()):
            source = self.topology.tier(tier)
            yield from self.copy_to_device(lr, nbytes, pinned=source.kind is not TierKind.PAGEABLE,
                                           src_device=source.device)

    def broadcast(self, version: int) -> Generator:
        yield self.env.timeout(self.workload.weight_sync_time)
        for rid in self._runner_version:
            self._runner_version[rid] = max(self._runner_version[rid], version)

    def appo_runner(self, runner: RunnerRole, queues: dict) -> Generator:
        w = self.workload
        i = 0
        group: list[tuple[Chunk, ChunkTrace]] = []
        while not self._stop:
            yield self.env.timeout(self.sample_time(w.fragment_length))
            if self._stop:
                return
            if self.path.route == "driver":
                target = self.layout.learners[i % len(self.layout.learners)]
            else:
                target = self.layout.target(runner, i // self.path.granularity)
            i += 1
            chunk, trace = self.new_chunk(runner, target, self._runner_version[runner.id])
            queue = queues[target.id]
            if self.path.route == "driver":
                self.env.process(self.stock_appo_path(runner, target, chunk, queue))
            else:
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

    def stock_appo_path(self, runner: RunnerRole, lr: LearnerRole, chunk: Chunk, queue) -> Generator:
        """ray.put on the runner; the driver polls the reference; the learner resolves it, builds and
        copies it (GPU loader thread) into the circular buffer."""
        s, w = self.stock, self.workload
        queue.in_flight += 1
        t0 = self.env.now
        yield from self.cpu(runner.node, s.sample_serialize(w.chunk_episodes, chunk.nbytes))
        yield from self.place_in(chunk.id, f"{runner.memory}:pageable")
        yield from self.on_driver(s.rpc_overhead + s.driver_bookkeeping)
        t_b = self.env.now
        yield from self.on_driver(s.rpc_overhead / 4)  # hand the reference list to the learner actor
        t_get = self.env.now
        yield from self.transfer(runner.memory, lr.memory, chunk.nbytes)
        yield from self.cpu(lr.node, s.sample_deserialize(w.chunk_episodes, chunk.nbytes))
        yield from self.move_to(chunk.id, lr.pageable)
        t_c = self.env.now
        yield from self.cpu(lr.node, s.connector(chunk.steps / w.steps_per_row, chunk.nbytes))
        t_d = self.env.now
        yield from self.cpu(lr.node, s.to_tensor(chunk.nbytes))
        yield from self.copy_to_device(lr, chunk.nbytes, pinned=False)
        yield from self.move_to(chunk.id, lr.device_tier)
        self.rec.chunks[chunk.id].t_ready = self.env.now
        if lr.index == 0:
            k = self.version
            self.rec.span(k, "a", t0, t_b)
            self.rec.span(k, "b", t_b, t_get)
            self.rec.span(k, "get", t_get, t_c)
            self.rec.span(k, "c", t_c, t_d)
            self.rec.span(k, "d", t_d, self.env.now)
        queue.in_flight -= 1
        queue.put(chunk.id)

    def appo_gather(self, lr: LearnerRole, k: int, queue, reuse: deque, uses: dict) -> Generator:
        """Assemble update k's batch: fresh chunks within the lag bound first; when none is ready,
        reuse buffered chunks (circular buffer) up to ``max_reuse``; otherwise wait."""
        w = self.workload
        min_version = k - w.max_lag
        batch: list[int] = []
        waiting = False
        while len(batch) < w.chunks_per_batch:
            while queue.items and len(batch) < w.chunks_per_batch:
                cid = queue.items.popleft()
                queue.notify()
                if self._chunks[cid].policy_version < min_version:
                    self.auditor.dropped(cid, self.env.now, "stale")
                    self.release(cid)
                    continue
                batch.append(cid)
            if len(batch) >= w.chunks_per_batch:
                break
            # reuse from the circular buffer only what is still admissible
            while reuse and len(batch) < w.chunks_per_batch:
                cid, _ = reuse.popleft()
                if self._chunks[cid].policy_version >= min_version and uses[cid] < w.max_reuse:
                    batch.append(cid)
                else:
                    self.release(cid)
            if len(batch) < w.chunks_per_batch:
                if not waiting:  # the learner asks once per batch; wake-ups are not new requests
                    self.view.learner_waiting(lr)
                    waiting = True
                yield queue.changed()
        if self.path.route == "direct" and self.path.batch_build == "per-batch":
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

    # ================================================================== DQN (replay)
    def dqn_loop(self) -> Generator:
        if self.path.route == "driver":
            yield from self.stock_dqn()
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
        driver_mem = self.layout.driver_memory
        buffer: deque[int] = deque()
        inserted = sampled = 0
        update = 0
        t_free = {lr.id: 0.0 for lr in learners}
        batch_bytes = w.batch_size * w.bytes_per_step
        while update < self.iterations:
            it = update
            t0 = self.env.now
            sample_procs = [self.env.process(self._dqn_sample(r)) for r in runners]
            results = yield simpy.AllOf(self.env, sample_procs)
            self.rec.span(it, "sampling", t0, self.env.now)
            new = [results[p] for p in sample_procs]
            last_created = max(self._chunks[c].t_created for c in new)
            t_a = self.env.now
            for runner, cid in zip(runners, new, strict=True):
                yield from self.cpu(runner.node, s.sample_serialize(w.chunk_episodes, w.chunk_bytes))
                yield from self.place_in(cid, f"{runner.memory}:pageable")
                yield from self.transfer(runner.memory, driver_mem, w.chunk_bytes)
                yield from self.on_driver(s.rpc_overhead + s.sample_deserialize(w.chunk_episodes, w.chunk_bytes))
                yield from self.move_to(cid, f"{driver_mem}:pageable")
            self.rec.span(it, "a", t_a, self.env.now)
            t_add = self.env.now
            for cid in new:
                yield from self.on_driver(s.buffer_add_per_call + s.buffer_add_per_step * w.chunk_steps)
                self._replay_insert(buffer, cid)
                inserted += w.chunk_steps
            self.rec.span(it, "buffer_add", t_add, self.env.now)
            due = 0
            if inserted >= w.min_size:
                due = int(max(0, w.replay_ratio * (inserted - w.min_size) - sampled) // (w.batch_size * len(learners)))
            for _ in range(min(due, self.iterations - update)):
                t_smp = self.env.now
                selections = {}
                for lr in learners:
                    yield from self.on_driver(s.buffer_sample_per_call)
                    selections[lr.id] = self._replay_sample(buffer, w.batch_size)
                    sampled += w.batch_size
                self.rec.span(update, "buffer_sample", t_smp, self.env.now)
                t_b = self.env.now
                prep = [self.env.process(self._stock_dqn_batch(lr, batch_bytes, update, t_b)) for lr in learners]
                yield simpy.AllOf(self.env, prep)
                ready = self.env.now
                for lr in learners:
                    self.auditor.delivered(update, selections[lr.id], ready)
                    for cid, _ in selections[lr.id]:
                        if math.isnan(self.rec.chunks[cid].t_ready):
                            self.rec.chunks[cid].t_ready = ready
                u_traces = [UpdateTrace(update, lr.id, w.batch_size, t_free[lr.id], last_created, ready, ready, math.nan)
                            for lr in learners]
                yield simpy.AllOf(self.env, [self.env.process(self.compute[lr.device].run(
                    w.update_overhead + w.batch_size * w.update_time_per_sample)) for lr in learners])
                self.rec.span(update, "update", ready, self.env.now)
                for u in u_traces:
                    u.t_end = t_free[u.learner] = self.env.now
                self.rec.updates.extend(u_traces)
                self._tick(update)
                update += 1
            t_sync = self.env.now
            yield self.env.timeout(w.weight_sync_time)
            self.rec.span(max(it, update - 1), "weight_sync", t_sync, self.env.now)
            t_over = self.env.now
            yield from self.on_driver(s.driver_loop_overhead)
            self.rec.span(max(it, update - 1), "overhead", t_over, self.env.now)

    def _dqn_sample(self, runner: RunnerRole) -> Generator:
        yield self.env.timeout(self.sample_time(self.workload.fragment_length))
        chunk, _ = self.new_chunk(runner, self.layout.learner_of_runner[runner.id], self.version)
        return chunk.id

    def _stock_dqn_batch(self, lr: LearnerRole, nbytes: float, update: int, t_b: float) -> Generator:
        """Driver -> learner, connector, to-tensor and pageable copy of one sampled batch. With a
        local learner (RLlib ``num_learners=0``) it all runs on the driver's thread."""
        s, w = self.stock, self.workload
        if w.local_learner:
            yield from self.on_driver(s.local_call_overhead)
            t_c = self.env.now
            yield from self.on_driver(s.connector(w.batch_size / w.steps_per_row, nbytes))
            t_d = self.env.now
            yield from self.on_driver(s.to_tensor(nbytes))
        else:
            yield from self.on_driver(s.rpc_overhead / 4 + s.shard_serialize(1, nbytes))
            yield from self.transfer(self.layout.driver_memory, lr.memory, nbytes)
            yield from self.cpu(lr.node, s.shard_deserialize(1, nbytes))
            t_c = self.env.now
            yield from self.cpu(lr.node, s.connector(w.batch_size / w.steps_per_row, nbytes))
            t_d = self.env.now
            yield from self.cpu(lr.node, s.to_tensor(nbytes))
        yield from self.copy_to_device(lr, nbytes, pinned=False)
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
            tier = self._location.get(cid)
            if tier is not None and tier != lr.device_tier:
                by_tier[tier] = by_tier.get(tier, 0.0) + len(idx) * w.bytes_per_step
        yield from self._copy_in(lr, by_tier)
        if self.path.batch_build == "per-batch":  # the framework's connector over the sampled batch
            s = self.stock
            nbytes = w.batch_size * w.bytes_per_step
            yield from self.cpu(lr.node, s.connector(w.batch_size / w.steps_per_row, nbytes) + s.to_tensor(nbytes))
        for cid, _ in selections:
            trace = self.rec.chunks[cid]
            if math.isnan(trace.t_ready):
                trace.t_ready = self.env.now
        return selections, last_created, self.env.now


def split_fragments(workload: Workload, split: int) -> Workload:
    """The workload as seen by a plane that takes each runner's fragment in ``split`` pieces.

    A runner hands its experience to the plane every ``fragment_length / split`` vector steps from
    inside its sampling loop (no extra framework call: the per-``sample()`` call overhead is spread
    over the pieces), so each chunk is ``split`` times smaller and the last one of an iteration
    reaches its learner sooner. Batches and the data contract are unchanged.
    """
    from dataclasses import replace

    # the smallest divisor of the fragment at or above the request: pieces stay equal, so batches
    # (whole multiples of a chunk) keep exactly the steps the workload asks for
    pieces = next(d for d in range(max(1, min(split, workload.fragment_length)), workload.fragment_length + 1)
                  if workload.fragment_length % d == 0)
    return replace(workload, fragment_length=max(1, workload.fragment_length // pieces),
                   runner_call_overhead=workload.runner_call_overhead / pieces,
                   chunks_per_batch=workload.chunks_per_batch * pieces)  # APPO batches keep their steps


def _scheduled_events(env: simpy.Environment) -> int:
    """SimPy events scheduled so far (read off its event-id counter, ``count(N)``), or -1."""
    text = repr(getattr(env, "_eid", ""))
    return int(text[6:-1]) if text.startswith("count(") else -1


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
        self.runner_done_event = {r.id: env.event() for r in sim.layout.runners}
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

    def runner_done(self, runner_id: str, t: float) -> None:
        self.runner_done_event[runner_id].succeed()
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


class _ReadyQueue:
    """Chunks ready for a learner (APPO), with an event that fires on every change."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.items: deque[int] = deque()
        self.in_flight = 0
        self._changed = env.event()

    def put(self, cid: int) -> None:
        self.items.append(cid)
        self.notify()

    def notify(self) -> None:
        event, self._changed = self._changed, self.env.event()
        event.succeed()

    def changed(self) -> simpy.Event:
        return self._changed
