"""The simulation: one training run whose experience path runs through the plane's policies.

One :class:`Simulation` couples a topology, a workload and a :class:`~conduit.policy.Policy`. Env
runners produce chunks; the path each chunk takes to its learner is decided by the plane core
(:mod:`conduit.plane`: the policy's decisions, checked) and executed here with contended resources —
flows on the max-min network (:mod:`conduit.sim.network`), CPU cores (serialization, batch
building), GPU compute (value passes, updates) and tier capacity. The simulator moves only time.

The algorithm loops live one per module, each with its stock route and its plane route:
:mod:`conduit.sim.ppo` (synchronous, OnPolicy), :mod:`conduit.sim.appo` (APPO/IMPALA,
BoundedStaleness), :mod:`conduit.sim.dqn` (Replay). ``route="driver"`` is stock RLlib 2.60 (new API
stack), modelled step by step, each step citing the RLlib code it models; ``route="direct"`` is the
plane (:mod:`conduit.sim.direct`). This module holds what they share: set-up, resources, the tier
accounting that feeds the plane core's :class:`~conduit.plane.ChunkLedger` and the auditor, and the
run itself.

Every ingestion, placement, move, delivery, consumption, eviction and drop is reported to the
:class:`~conduit.audit.Auditor`.
"""

from __future__ import annotations

import gc
import math
from collections import Counter
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from conduit.audit import Auditor, AuditReport
from conduit.chunk import Chunk
from conduit.errors import ConduitError
from conduit.plane import Arbiter, ChunkLedger, Rejections, rules_for
from conduit.policy import ChunkInfo, Policy
from conduit.sim.appo import AppoLoop
from conduit.sim.cluster import ClusterLayout, LearnerRole, RunnerRole, lay_out
from conduit.sim.coldwork import ColdWorkCosts
from conduit.sim.cores import CoreUse
from conduit.sim.deployed import MULTI_LEARNER_WARNING, DeployedRoute
from conduit.sim.direct import DirectRoute
from conduit.sim.dqn import DqnLoop
from conduit.sim.fold import check_fold, fold_topology
from conduit.sim.metrics import ChunkTrace, Recorder
from conduit.sim.network import Network
from conduit.sim.params import PlaneCosts, StockCosts
from conduit.sim.ppo import PpoLoop
from conduit.sim.provenance import provenance, steady_state, validity
from conduit.sim.raycalls import ColdCallCosts
from conduit.sim.resources import ComputeEngine, CpuPool, FifoServer, ThreadLane, TierLedger
from conduit.sim.view import SimClusterView
from conduit.sim.workload import Workload
from conduit.topology import TierKind, Topology

DEFAULT_PAGEABLE_COPY_FRACTION = 0.25
#: env-step draws taken from the generator at a time (:meth:`Simulation._draws`)
DRAW_BLOCK = 8192


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
    rejections: dict[str, Any] = field(default_factory=dict)
    #: what produced the result (:func:`conduit.sim.provenance.provenance`)
    provenance: dict[str, Any] = field(default_factory=dict, repr=False)
    #: distance from the calibrated points (:func:`conduit.sim.provenance.validity`)
    validity: dict[str, Any] = field(default_factory=dict, repr=False)
    #: warm-up, measured window, rounds, trend (:func:`conduit.sim.provenance.steady_state`)
    steady_state: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def warnings(self) -> list[str]:
        """Everything a reader should know before citing the figures: extrapolation, a short or
        trending window."""
        return [*self.validity.get("warnings", []), *self.steady_state.get("warnings", [])]

    def outcome(self) -> dict[str, Any]:
        """:meth:`to_dict` without ``events``, the count of SimPy events the engine scheduled: what the
        run computed, which exact fast paths must reproduce (they exist to schedule fewer events)."""
        out = self.to_dict()
        del out["events"]
        return out

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
            "rejections": self.rejections,
            "warnings": self.warnings,
            "steady_state": self.steady_state,
            "validity": self.validity,
            "provenance": self.provenance,
        }

    def to_rows(self, kind: str = "summary") -> list[dict[str, Any]]:
        """Plain rows: ``summary`` (one row: what ran and every metric), ``updates`` (one per learner
        update) or ``chunks`` (one per chunk); see :func:`conduit.results.result_rows`."""
        from conduit.results import result_rows

        return result_rows(self, kind)

    def to_frame(self, kind: str = "summary"):
        """:meth:`to_rows` as a pandas DataFrame; pandas is optional (an ImportError names it)."""
        from conduit.results import to_frame

        return to_frame(self.to_rows(kind))


class Simulation(PpoLoop, AppoLoop, DqnLoop, DirectRoute, DeployedRoute, CoreUse, ColdCallCosts, ColdWorkCosts):
    """One simulated training run. ``run()`` returns a :class:`SimResult`.

    ``memoize_view=False`` makes the policy's :class:`~conduit.sim.view.SimClusterView` recompute
    every fact on every access: the straightforward reference that the memoized view (the default,
    several times faster at scale) must match exactly (``tests/test_sim_speed.py``).

    ``fast=False`` turns off the engine's other exact fast paths, for the same comparison: env-step
    times drawn a block ahead (:meth:`_draws`), moves and placements that fit done without a
    process step (:meth:`move_now`, :meth:`place_now`), the network re-solving only the
    components an instant's flow starts and ends touch (``Network(component_solve=...)``) and
    keeping its flows' finishes in a heap per route class (``Network(class_heaps=...)``), and the driver's
    thread on a node with a core per thread served by arithmetic (:meth:`on_driver`).

    ``fold=K`` (> 1) simulates the driver's node and one representative node for every ``K`` of the
    others (:mod:`conduit.sim.fold`): an approximation, never the default, whose error against the
    exact simulation ``benchmarks/sim_speed.py --fold K`` prints. The result says so (``fold`` in its
    provenance, a validity warning)."""

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
        memoize_view: bool = True,
        fast: bool = True,
        stock_source: str | None = None,
        plane_source: str | None = None,
        fold: int = 1,
    ):
        if iterations < 1:
            raise ConduitError(f"iterations must be >= 1, got {iterations}")
        self.path = policy.path
        self.layout: ClusterLayout = lay_out(topology, workload)
        #: the cluster's runners and learners, folded or not (the workload's and the contract's counts)
        self.logical_runners, self.logical_learners = len(self.layout.runners), len(self.layout.learners)
        workload = auto_fragment(workload, self.logical_runners, self.logical_learners)
        self.unfolded_topology = topology
        topology, self.fold = fold_topology(topology, self.layout.driver_node, check_fold(fold, workload))
        if self.fold.factor > 1:
            self.layout = lay_out(topology, workload)
        if plane is None:
            from conduit.sim.cost_file import default_plane_costs

            plane, taken = default_plane_costs()
            files = sorted({v.split(": ")[0] for v in taken.values()})
            plane_source = plane_source or (f"built-in: measured in {files[0]}" if files else None)
        self.stock, self.plane = stock or StockCosts(), plane
        self.plane_source = plane_source
        self.start_cold_law()
        self.start_cold_work()
        #: Conduit as enable() deploys it (:mod:`conduit.sim.deployed`), not the design target
        self.deployed = self.path.route == "direct" and self.path.deployment == "enable"
        if self.deployed:
            if workload.algorithm == "ppo":  # enable()'s chunk_steps (conduit.deploy_settings, shared with the runtime)
                from conduit.sim.deployed import deployed_stream_pieces

                workload = deployed_pieces(workload, deployed_stream_pieces(workload, policy))
        else:
            pieces = self.path.pieces(workload.chunk_bytes, workload.fragment_length)
            if pieces > 1:
                workload = split_fragments(workload, pieces)
        self.topology, self.workload, self.policy = topology, workload, policy
        self.iterations, self.seed = iterations, seed
        self.stock_source = stock_source  # where ``stock`` came from (a --stock-costs file), for the provenance
        self.progress = progress
        self.env = simpy.Environment()
        self.rng = np.random.default_rng(seed)
        #: env-step times drawn a block ahead (:meth:`_draws`); ``fast=False`` draws per call
        self.fast = fast
        self.batch_draws = fast and workload.algorithm != "dqn"
        self._draw_block, self._draw_at = np.zeros(0), 0
        self.network = Network(self.env, topology.graph, component_solve=fast, class_heaps=fast,
                               multiplicity=self._device_multiplicity(topology))
        self.cpus = {node: self._cpu_pool(topology, node) for node in topology.nodes}
        self.compute = {lr.device: ComputeEngine(self.env, lr.device) for lr in self.layout.learners}
        self._learners_by_id = {lr.id: lr for lr in self.layout.learners}
        # the device a producer runs on, as a placement policy sees it (ChunkInfo.device): its GPU,
        # else its node's CPU device -- what the runtime reports for a producer on a CPU-only node
        self._producer_device = {
            r.id: r.device or next((c.id for c in topology.devices_of("cpu", r.node)), None)
            for r in self.layout.runners
        }
        self.ledger = TierLedger(self.env, topology)
        self.contract = workload.contract(runners=self.logical_runners)
        if self.deployed and workload.algorithm == "dqn":
            self.contract = deployed_replay_contract(self.contract, workload, self.logical_runners)
        self.auditor = Auditor(self.contract, tier_capacities={k: int(v) for k, v in self.ledger.capacity.items()})
        self.rules = rules_for(self.contract)
        self.rejections = Rejections()
        self.arbiter = Arbiter(policy, self.rejections)
        self.chunk_ledger = ChunkLedger(self.ledger.capacity, self.auditor)
        self.rec = Recorder()
        self.view = SimClusterView(self, memoize=memoize_view)
        self.driver_thread = FifoServer(self.env, 1)
        self._setup_cores()
        # the driver's thread: served by arithmetic (one timeout per piece of work, no hand-over event)
        # where that is exact: a core per thread on its node, and only the driver's own work on it, issued
        # as it arrives (a local learner's plane calls under enable() reserve it for a later arrival);
        # else held through events (and with the fast paths off)
        driver_node = self.layout.driver_node
        # APPO's driver handles each runner's result and each learner's call as they come, interleaved with
        # the runners' and learners' own work at the same instants (with deterministic env steps, exactly the
        # same): served by arithmetic, its work would be ordered among theirs by the time it is issued rather
        # than as SimPy orders the hand-over events, and a tie could go the other way (found by
        # tests/test_sim_speed.py: a different experience path for one chunk); held through events it is exact
        by_events = (self.crowded[driver_node] or not fast or (self.deployed and workload.local_learner)
                     or workload.algorithm == "appo")
        self.driver_lane = ThreadLane(driver_node, self.driver_thread if by_events else None)
        if self.deployed:
            self._deployed_setup()
        #: the stock route's driver-side calls by kind (``sample_result``, ``update_call``,
        #: ``buffer_add``, ``buffer_sample``, ``round``, ``package``): what its loops did, countable
        self.stock_calls: Counter[str] = Counter()
        #: APPO's stock route: the shard sizes (chunks per learner) of every package the driver split
        self.stock_shards: list[list[int]] = []
        self.version = 0
        #: runner id -> seconds of calls queued on its actor since its last sample (:meth:`remote_sample_time`)
        self._runner_queued: dict[str, float] = {}
        self._next_chunk = 0
        self._chunks: dict[int, Chunk] = {}
        #: learner id -> when its last update ended, where its loop idles between updates (PPO's): how long
        #: ago it freed its last batch when it builds the next (:meth:`connector_work`)
        self.learner_idle_since: dict[str, float] = {}
        self._check_fits()

    # ------------------------------------------------------------------ helpers
    def _device_multiplicity(self, topology: Topology) -> dict[str, int]:
        """Device id -> how many devices it stands for, where folding made it more than one."""
        if self.fold.factor == 1:
            return {}
        return {d.id: self.fold.of_node(d.node) for d in topology.devices.values() if self.fold.of_node(d.node) > 1}

    def weight(self, role: RunnerRole | LearnerRole) -> int:
        """How many runners or learners ``role`` stands for: its node's multiplicity when folded, else 1.
        The driver's per-runner and per-learner work is charged this many times."""
        return self.fold.of_node(role.node)

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

    def _cpu_pool(self, topology: Topology, node: str) -> CpuPool:
        """``node``'s cores as its CPU devices describe them (``docs/topology-format.md``): their cores, speed,
        ``oversubscribed_cpu_cost`` and the kernel's ``wake_latency`` / ``wake_slice_time``."""
        cpus = topology.devices_of("cpu", node)
        return CpuPool(self.env, node, sum(c.get("cores", 1) for c in cpus) or 1,
                       float(next((c.get("cpu_speed", 1.0) for c in cpus), 1.0)),
                       max((float(c.get("oversubscribed_cpu_cost", 1.0)) for c in cpus), default=1.0),
                       wake_latency=max((float(c.get("wake_latency", 0.0)) for c in cpus), default=0.0),
                       wake_slice=max((float(c.get("wake_slice_time", 0.0)) for c in cpus), default=0.0))

    def cpu(self, node: str, seconds: float, urgent: bool = False, compute: bool = False,
            background: bool = False, woken: bool = False, thread: Hashable | None = None) -> Generator:
        """``seconds`` of work on a core of ``node`` (:meth:`~conduit.sim.resources.CpuPool.work`)."""
        return self.cpus[node].work(seconds, urgent, compute, background, woken, thread)

    def update_call_cpu(self, episodes: float, steps: float, nbytes: float, lr: LearnerRole, calls: int = 1) -> float:
        """The driver's own CPU for one ``LearnerGroup.update`` call to one learner (``learner_group.py``): a
        local learner (``num_learners=0``, ``is_local``) is called in place, ``self._learner.update(...)``
        (``local_call_overhead``); a remote one's argument is pickled, its arrays put into the object store,
        and the call submitted (``rpc_driver_cpu`` + ``shard_serialize``), its round trip overlapping. The call
        to ``lr`` starts now (:mod:`conduit.sim.raycalls`; the learner's share is kept for its side,
        :meth:`update_call_arrives`). ``calls``: the learners a folded one stands for, each with its own shard,
        issued one after another, each after the previous one's submission and shard (:meth:`caller_cpu`)."""
        s = self.stock
        if self.workload.local_learner:
            return s.local_call_overhead * calls
        caller, self.update_call_shares[lr.id] = self.start_call("driver", ("learner", lr.id))
        serialize = s.shard_serialize(episodes, steps, nbytes)  # one learner's shard: the spacing of the calls
        return self.caller_cpu(caller, calls, s.rpc_driver_cpu + serialize) + serialize * calls

    def update_call_arrives(self, lr: LearnerRole) -> tuple[float, float]:
        """``(latency, learner's extra CPU)`` of the ``LearnerGroup.update`` call to ``lr`` in flight: half the
        round trip less the driver's CPU, and what the law adds for a cold learner."""
        share = self.update_call_shares.pop(lr.id, 0.0)
        return self.reply_trip(share) / 2, share * self.stock.rpc_cold_callee_cpu

    def read_runner_results(self, results: Sequence[tuple[float, float, float] | None],
                            weights: Sequence[int] | None = None) -> Generator:
        """The driver's side of a ``foreach_env_runner`` sample round once every reply is in.

        ``utils/actor_manager.py: FaultTolerantActorManager._fetch_result`` waits for *every* call's
        result (``ray.wait(num_returns=len(calls), fetch_local=True)``: the objects are pulled to the
        driver's node in parallel meanwhile), then ``ray.get``s each ready result in turn on the
        driver's thread. An early result is therefore read only after the last one arrives. Then the
        algorithm aggregates the runners' metrics in one ``MetricsLogger.aggregate`` call
        (``StockCosts.driver_bookkeeping`` per result). ``results`` holds each reply's ``(episodes,
        steps, bytes)`` (``None``: a runner that returned nothing); returns the bookkeeping's seconds.
        The loop of gets is one stretch of the driver's one thread: no other driver work runs between two
        gets, so it is held once, for all of them. ``weights[i]``: how many runners reply ``i`` stands
        for in a folded simulation (:meth:`weight`); each is read that many times."""
        s = self.stock
        if weights is None:
            weights = [1] * len(results)
        read = [(r, n) for r, n in zip(results, weights, strict=True) if r is not None]
        gets = 0.0
        for (episodes, steps, nbytes), n in read:
            gets += s.sample_deserialize(episodes, steps, nbytes) * n
        if read:
            yield from self.on_driver(gets)
        replies = sum(n for _r, n in read)
        self.stock_calls["sample_result"] += replies
        bookkeeping = replies * s.driver_bookkeeping
        if bookkeeping > 0:
            yield from self.on_driver(bookkeeping)
        return bookkeeping

    def on_driver(self, seconds: float) -> Generator:
        """Work on the driver's single Python thread (and a core of its node). On a crowded node (a
        preemptive pool) it is urgent: the driver runs at nice 0 beside Ray's workers at 15
        (:class:`~conduit.sim.resources.CpuPool`: who runs first)."""
        lane = self.driver_lane
        if lane.fifo is None:  # a core per thread on the driver's node: FIFO by arithmetic
            env, pool = self.env, self.cpus[lane.node]
            busy = seconds / pool.speed if seconds > 0 else 0.0
            end = lane.reserve(env.now, busy)
            if end > env.now:
                yield env.timeout(end - env.now)
            pool.busy_core_seconds += busy  # once done, as CpuPool.work counts it
            return
        yield self.driver_thread.acquire()
        try:
            pool = self.cpus[self.layout.driver_node]
            yield from pool.work(seconds, pool.preemptive)
        finally:
            self.driver_thread.release()

    def transfer(self, src: str, dst: str, nbytes: float) -> Generator:
        if src != dst and nbytes > 0:
            yield self.network.transfer(src, dst, nbytes)

    def staging_bandwidth(self, memory: str) -> float:
        """Speed of the CPU memcpy through a pinned bounce buffer that a pageable copy pays."""
        mem = self.topology.devices[memory]
        return mem.get("pageable_copy_bandwidth") or DEFAULT_PAGEABLE_COPY_FRACTION * mem.get("bandwidth", 40e9)

    def connector_work(self, lr: LearnerRole, samples: float, episodes: float, built: float) -> float:
        """Seconds of RLlib's learner connector building learner ``lr``'s batch of ``samples`` rows in
        ``episodes`` episode objects and ``built`` bytes (:meth:`StockCosts.connector`), with the fresh
        mapping of the built batch (:meth:`StockCosts.fresh_map`) after the learner's idle time since its last
        update ended (:attr:`learner_idle_since`; none where the loop does not idle between updates: APPO's
        learner thread and DQN's learners train back to back)."""
        idle = self.env.now - self.learner_idle_since.get(lr.id, self.env.now)
        return self.stock.connector(samples, episodes, built) + self.stock.fresh_map(built, idle)

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

    def remote_sample_time(self, runner: RunnerRole, vector_steps: int, call: bool = True) -> float:
        """Sampling on a remote EnvRunner's thread. ``call``: this starts a ``sample()`` call the driver made,
        so the runner first serves the calls queued on its actor since its last sample (DQN: the weight
        sync's ``set_state``, :meth:`~conduit.sim.dqn.DqnLoop.dqn_weight_sync`; Ray runs an actor's calls in
        order), then this call's own dispatch (``StockCosts.rpc_callee_cpu``: every ``foreach_actor`` call is
        ``actor.apply.remote(func=...)``; cold by the law of :mod:`conduit.sim.raycalls`, the call's shares kept
        for its reply); a later piece of the same call (``call=False``: a fragment the
        model splits into chunks) pays neither. Then the sampling itself (:meth:`sample_time`)."""
        if not call:
            return self.sample_time(vector_steps)
        queued = self._runner_queued.pop(runner.id, 0.0)
        return queued + self.start_sample_call(runner) + self.sample_time(vector_steps)

    def runner_metrics(self, runner: RunnerRole) -> Generator:
        """What the remote ``sample()`` call runs on the EnvRunner after ``sample()`` returns and before it
        replies (``Workload.runner_metrics_time``: RLlib's ``get_metrics()``, APPO's ``get_state`` too), on the
        runner's thread: after the sample-end stamp, so on the experience path."""
        seconds = self.workload.runner_metrics_time
        if seconds > 0:
            yield from self.on_cores(runner.node, seconds, thread=("runner", runner.id))

    def queue_on_runner(self, runner: RunnerRole, seconds: float) -> None:
        """A call issued to ``runner``'s actor without waiting for it: it runs before the runner's next sample."""
        self._runner_queued[runner.id] = self._runner_queued.get(runner.id, 0.0) + seconds

    def sample_time(self, vector_steps: int) -> float:
        w = self.workload
        if w.env_step_cv > 0 and w.env_step_time > 0:
            params = self.__dict__.get("_lognormal")
            if params is None:  # the workload is fixed for the run: its lognormal parameters too
                sigma = math.sqrt(math.log1p(w.env_step_cv**2))
                params = self._lognormal = (math.log(w.env_step_time) - sigma**2 / 2, sigma)
            # the sum of many lognormal steps: draw the mean of `vector_steps` draws cheaply
            n = min(vector_steps, 64)
            if self.batch_draws:
                draws = self._draws(params, n)
            else:
                draws = self.rng.lognormal(params[0], params[1], size=n)
            # ndarray.mean, as numpy computes it for a 1-d float64 array: the pairwise sum over n
            per_step = float(np.add.reduce(draws)) / n
        else:
            per_step = w.env_step_time
        return w.runner_call_overhead + vector_steps * (per_step + w.inference_time)

    def _draws(self, params: tuple[float, float], n: int) -> np.ndarray:
        """The next ``n`` env-step draws from a block drawn ahead (:data:`DRAW_BLOCK` at a time).

        NumPy's ``Generator.lognormal`` consumes its bit stream value by value, so a block of
        draws split into pieces gives exactly the values that one call per piece would: exact
        wherever nothing else draws from ``self.rng`` in between (``batch_draws``: every algorithm
        but DQN, whose replay sampler shares the generator)."""
        block, at = self._draw_block, self._draw_at
        if at + n > block.size:
            block = self._draw_block = np.concatenate(
                [block[at:], self.rng.lognormal(params[0], params[1], size=max(DRAW_BLOCK, n))])
            at = 0
        self._draw_at = at + n
        return block[at:at + n]

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

    # tier accounting (time: the capacity resource; books and audit: the plane core's ledger) ----
    def place_in(self, cid: int, tier: str) -> Generator:
        nbytes = self._chunks[cid].nbytes
        yield self.ledger.reserve(tier, nbytes)
        self.chunk_ledger.placed(cid, tier, nbytes, self.env.now)
        self.rec.chunks[cid].tier = tier

    def move_to(self, cid: int, tier: str) -> Generator:
        src = self.chunk_ledger.location(cid)
        if src == tier:
            return
        nbytes = self._chunks[cid].nbytes
        yield self.ledger.reserve(tier, nbytes)
        self.ledger.release(src, nbytes)
        self.chunk_ledger.moved(cid, tier, nbytes, self.env.now)
        self.rec.chunks[cid].tier = tier

    def place_now(self, cid: int, tier: str) -> bool:
        """:meth:`place_in` without a process step when the bytes fit at once (the ledger's
        reservation is then granted on the spot, so :meth:`place_in` would not wait either):
        True when done, False (nothing done) when the caller must ``yield from place_in``."""
        if not self.fast:
            return False
        chunk = self._chunks[cid]
        if not self.ledger.try_reserve(tier, chunk.nbytes):
            return False
        self.chunk_ledger.placed(cid, tier, chunk.nbytes, self.env.now)
        self.rec.chunks[cid].tier = tier
        return True

    def move_now(self, cid: int, tier: str) -> bool:
        """:meth:`move_to` without a process step when it would not wait (already there, or the
        bytes fit ``tier`` at once): True when done, False (nothing done) when the caller must
        ``yield from move_to``."""
        if not self.fast:
            return False
        src = self.chunk_ledger.location(cid)
        if src == tier:
            return True
        nbytes = self._chunks[cid].nbytes
        if not self.ledger.try_reserve(tier, nbytes):
            return False
        self.ledger.release(src, nbytes)
        self.chunk_ledger.moved(cid, tier, nbytes, self.env.now)
        self.rec.chunks[cid].tier = tier
        return True

    def release(self, cid: int) -> None:
        tier = self.chunk_ledger.location(cid)
        if tier is not None:
            self.ledger.release(tier, self._chunks[cid].nbytes)
            self.chunk_ledger.retired(cid, self.env.now)
        self._chunks.pop(cid, None)

    def host_tier(self, memory: str) -> str:
        """The pageable tier of a host memory device (where stock RLlib's objects live)."""
        return self.topology.tier_of(memory, TierKind.PAGEABLE)

    # placement through the policy, checked by the plane core ---------------------------------------
    def decide_tier(self, chunk: Chunk, runner: RunnerRole, learner: LearnerRole) -> str:
        """The placement policy's tier, checked by the :class:`~conduit.plane.Arbiter` (which falls
        back to pinned, then pageable, host memory on the consumer's node)."""
        info = ChunkInfo(chunk.id, runner.node, self._producer_device.get(runner.id, runner.device), chunk.nbytes,
                         chunk.policy_version, learner.id)
        return self.arbiter.place(info, self.view, need=chunk.nbytes, node=learner.node)

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
        metrics = self.rec.metrics(self._warmup())
        metrics["rejected_decisions"] = self.rejections.total
        metrics["forced_moves"] = self.rejections.forced_moves
        horizon = max(self.env.now, 1e-12)
        link_util = {
            f"{u}->{v}": s.utilization(horizon)
            for (u, v), s in self.network.link_stats().items() if s.bytes > 0
        }
        top = dict(sorted(link_util.items(), key=lambda kv: -kv[1])[:20])
        valid = validity(self)
        if self.deployed and len(self.layout.learners) > 1:
            valid.setdefault("warnings", []).append(MULTI_LEARNER_WARNING)
        return SimResult(
            topology=self.topology.name, workload=self.workload, policy=self.policy, seed=self.seed,
            iterations=self.iterations, metrics=metrics, segments=self.rec.segment_means(self._warmup()),
            audit=audit, recorder=self.rec, link_utilization=top,
            tier_peak={k: v for k, v in self.ledger.peak.items() if v > 0},
            cpu_busy={n: c.busy_core_seconds for n, c in self.cpus.items() if c.busy_core_seconds > 0},
            gpu_busy={d: c.busy_seconds for d, c in self.compute.items()},
            sim_time=self.env.now, events=_scheduled_events(self.env), tier_trace=self.ledger.trace,
            rejections=self.rejections.to_dict(),
            provenance=provenance(self, self.stock_source), validity=valid,
            steady_state=steady_state(self, self._warmup()),
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



































def auto_fragment(workload: Workload, runners: int, learners: int) -> Workload:
    """PPO's fragment as RLlib sizes it when every runner's fragment would overshoot the batch.

    ``PPOConfig`` defaults to ``rollout_fragment_length="auto"``, and
    ``AlgorithmConfig.get_rollout_fragment_length`` (``ray/rllib/algorithms/algorithm_config.py``)
    makes it ``total_train_batch_size / (num_envs_per_env_runner * num_env_runners)``, so that one
    round of ``synchronous_parallel_sample`` (every runner samples once) fills the batch. A workload
    whose runners together would sample more than its learners train on (``runners * chunk_steps >
    learners * train_batch_per_learner``) gets that fragment, rounded down to the longest fragment
    whose chunk divides ``train_batch_per_learner`` (where the division is not exact RLlib gives some
    runners one more step; here chunks stay equal, so the few chunks that remain go to some runners as
    a second fragment and every learner's batch keeps exactly its steps: with a fragment that did not
    divide it, the last chunk would overshoot the batch, and a tier sized for the batch would not
    hold it). Every runner then samples, under every policy alike: the plane's pieces split
    this fragment, not a fragment that only some runners would sample.
    Other workloads (and other algorithms) are returned unchanged.
    """
    from dataclasses import replace

    total = learners * workload.train_batch_per_learner
    if workload.algorithm != "ppo" or runners * workload.chunk_steps <= total:
        return workload
    even = max(1, total // (runners * workload.envs_per_runner))
    # the longest fragment at most that whose chunk divides a learner's batch, so every learner trains on
    # exactly train_batch_per_learner steps (RLlib's batch is exact too); one step always divides it when
    # a runner has one env
    fragment = next((f for f in range(even, 0, -1)
                     if workload.train_batch_per_learner % (f * workload.envs_per_runner) == 0), even)
    if fragment >= workload.fragment_length:
        return workload
    return replace(workload, fragment_length=fragment)


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


def deployed_replay_contract(contract, workload: Workload, runners: int):
    """The Replay contract ``enable()`` declares (``conduit/runtime/rllib/plan.py``): the same capacity,
    ratio and warm-up, with the rate band's half-width ``max(1, ratio) * max(min_size, batch, 4 x the
    steps one sampling round brings)`` -- wider than the simulator's default band, so a learner may
    draw ahead of inserts still sitting in an EnvRunner's coalescing window."""
    from dataclasses import replace

    steps = runners * workload.fragment_length * workload.envs_per_runner
    band = max(1.0, workload.replay_ratio) * max(workload.min_size, workload.batch_size, steps * 4)
    return replace(contract, error_buffer=band)


def deployed_pieces(workload: Workload, pieces: int) -> Workload:
    """PPO under ``enable()``: each fragment is sampled as about ``pieces`` stock sampler calls of
    ``chunk_steps`` (:func:`conduit.sim.deployed.deployed_stream_pieces`, from the function the runtime
    uses: :func:`conduit.deploy_settings.stream_chunk_steps`), each a full call that pays
    ``runner_call_overhead`` (``env_runner.py: sample`` calls the stock sampler once per sub-chunk);
    pieces stay equal (the smallest divisor at or above the request)."""
    from dataclasses import replace

    split = split_fragments(workload, pieces)
    return replace(split, runner_call_overhead=workload.runner_call_overhead)


def _scheduled_events(env: simpy.Environment) -> int:
    """SimPy events scheduled so far (read off its event-id counter, ``count(N)``), or -1."""
    text = repr(getattr(env, "_eid", ""))
    return int(text[6:-1]) if text.startswith("count(") else -1






