"""The simulator's :class:`~conduit.view.ClusterView`, and the gate through which the scheduling
policy releases moves.

Tier occupancy comes live from the :class:`~conduit.sim.resources.TierLedger`, residents from the
plane core's :class:`~conduit.plane.ChunkLedger`, path load from the flow network (the share a new
flow would get on the route's bottleneck), learner need times from the plane core's
:class:`~conduit.plane.LearnerCadence`.

Scheduling: a chunk that is placed off its learner's device waits at a *gate*. Whenever something
changes (a chunk is enqueued, a move ends, a learner starts waiting), the plane core's
:meth:`~conduit.plane.Arbiter.plan` asks the policy with the pending chunks per learner and returns
the checked moves; their gates open in that order (a waiting learner's chunks always move: a policy
can cost time, never data).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

import simpy

from conduit.plane import LearnerCadence
from conduit.topology import TierKind
from conduit.view import ClusterView, LearnerState, PathState, TierState

if TYPE_CHECKING:
    from conduit.sim.cluster import LearnerRole
    from conduit.sim.engine import Simulation


class _Tiers(Mapping):
    """Live TierState objects built on access (no copying of the whole cluster per decision).

    A tier's state changes only when the :class:`~conduit.sim.resources.TierLedger` changes its
    bytes used, so the object built for one value of ``used`` is kept and handed out again while
    ``used`` is the same number (``memoize``): the same fields, the same arithmetic for the policy."""

    def __init__(self, sim: Simulation, memoize: bool = True):
        self._sim = sim
        self._used = sim.ledger.used
        self._static = {t.id: t for t in sim.topology.tiers}
        self._memo: dict[str, TierState] | None = {} if memoize else None

    def __getitem__(self, key: str) -> TierState:
        used = self._used[key]
        memo = self._memo
        if memo is not None:
            state = memo.get(key)
            if state is not None and state.used == used:
                return state
        t = self._static[key]
        state = TierState(t.id, t.kind, t.node, t.device, t.capacity, used, t.read_bandwidth, t.write_bandwidth)
        if memo is not None:
            memo[key] = state
        return state

    def __iter__(self):
        return iter(self._static)

    def __len__(self) -> int:
        return len(self._static)


class _Learners(Mapping):
    """Live LearnerState objects built on access, from each learner's cadence model."""

    def __init__(self, view: SimClusterView, memoize: bool = True):
        self._view = view
        self._memo: dict[str, tuple[tuple, LearnerState]] | None = {} if memoize else None

    def __getitem__(self, key: str) -> LearnerState:
        view = self._view
        cadence = view.cadence[key]
        cadence.version = view._sim.version
        now = view._sim.env.now
        memo = self._memo
        if memo is None:
            return cadence.state(now)
        # everything LearnerCadence.state reads: the same inputs give an equal object
        inputs = (now, cadence.version, cadence.waiting, cadence.last_ask, cadence.interval)
        hit = memo.get(key)
        if hit is not None and hit[0] == inputs:
            return hit[1]
        state = cadence.state(now)
        memo[key] = (inputs, state)
        return state

    def __iter__(self):
        return iter(self._view.cadence)

    def __len__(self) -> int:
        return len(self._view.cadence)


class SimClusterView(ClusterView):
    backend = "sim"

    def __init__(self, sim: Simulation, memoize: bool = True):
        self._sim = sim
        self.topology = sim.topology
        self.memoize = memoize
        self._tiers = _Tiers(sim, memoize)
        self._launch: dict[str, float] = {}
        self._pairs: dict[tuple[str, str], tuple] = {}  # (src tier, dst tier) -> what transfer_time needs of them
        self._learner_hbm: dict[str, str | None] = {}
        self._on: dict[tuple, list[str]] = {}  # (node, kind) -> tier ids, for tiers_on
        w = sim.workload
        self.cadence: dict[str, LearnerCadence] = {
            lr.id: LearnerCadence(lr.id, lr.device, lr.node, lr.device_tier,
                                  w.train_batch_per_learner * w.bytes_per_step)
            for lr in sim.layout.learners
        }
        self._pending: dict[str, dict[Hashable, tuple[float, simpy.Event]]] = {lr.id: {} for lr in sim.layout.learners}
        self._paths: dict[tuple[str, str], list] = {}  # route -> [latency, links, caps, rates seen, state, version]
        self._straight: dict[tuple[str, str], tuple[float, list]] = {}  # route -> (latency, links), unmemoized path
        self._learners = _Learners(self, memoize)
        self._has_pending: set[str] = set()

    # -- ClusterView ---------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self._sim.env.now

    @property
    def tiers(self) -> Mapping[str, TierState]:
        return self._tiers

    @property
    def learners(self) -> Mapping[str, LearnerState]:
        return self._learners

    @property
    def policy_version(self) -> int:
        return self._sim.version

    def path(self, src_device: str, dst_device: str) -> PathState:
        """Bottleneck of the route: capacity, and the share a new flow would get now — the unused
        capacity, or a fair split with the flows already there, whichever is larger.

        The route, its latency and its link capacities are fixed; only the rates on its links
        change (at the network's re-solves). With ``memoize`` the answer is kept per route with the
        link rates it was computed from and handed out again while those rates are the same."""
        if not self.memoize:
            return self._path_straight(src_device, dst_device)
        key = (src_device, dst_device)
        entry = self._paths.get(key)
        if entry is None:
            net = self._sim.network
            links = [int(i) for i in net.route(src_device, dst_device).links]
            latency = float(net.latency[links].sum()) if links else 0.0
            caps = [float(net.bandwidth[i]) for i in links]
            entry = self._paths[key] = [latency, links, caps, None, None, -1]
        latency, links, caps, seen, state, version = entry
        if not links:
            return PathState(float("inf"), float("inf"), 0.0, 0)
        net = self._sim.network
        if version == net.rates_version:  # no re-solve since: the same rates
            return state
        rates = net.link_rate_values
        used = tuple([rates.item(i) for i in links])
        entry[5] = net.rates_version
        if used == seen:
            return state
        share = min(max(c - u, c / 2) if u > 0 else c for c, u in zip(caps, used, strict=True))
        state = PathState(share, min(caps), latency, len(links))
        entry[3], entry[4] = used, state
        return state

    def _path_straight(self, src_device: str, dst_device: str) -> PathState:
        """:meth:`path` recomputed from the link rates on every call, as before the memo (the route's
        links and latency kept per route): the reference the memo is tested and benchmarked against."""
        key = (src_device, dst_device)
        net = self._sim.network
        if key not in self._straight:
            links = list(net.route(src_device, dst_device).links)
            self._straight[key] = (float(net.latency[links].sum()) if links else 0.0, links)
        latency, links = self._straight[key]
        if not links:
            return PathState(float("inf"), float("inf"), 0.0, 0)
        caps = net.bandwidth[links]
        used = net.link_rates()[links]
        share = [max(c - u, c / 2) if u > 0 else c for c, u in zip(caps, used, strict=True)]
        return PathState(float(min(share)), float(caps.min()), latency, len(links))

    def tiers_on(self, node, kind=None) -> list[TierState]:
        """:meth:`ClusterView.tiers_on`, with the ids on each (node, kind) looked up once (the set of
        tiers never changes during a run); the states are the live ones."""
        if not self.memoize:
            return super().tiers_on(node, kind)
        ids = self._on.get((node, kind))
        if ids is None:
            ids = self._on[(node, kind)] = [t.id for t in super().tiers_on(node, kind)]
        tiers = self._tiers
        return [tiers[i] for i in ids]

    def transfer_time(self, src_tier: str, dst_tier: str, nbytes: float) -> float:
        """:meth:`ClusterView.transfer_time`, with what never changes during a run looked up once per
        pair of tiers (their kinds, devices and media speeds, the launch overhead): only the route's
        live share is read per call, and the arithmetic is the base class's, in the same order."""
        if not self.memoize:
            return super().transfer_time(src_tier, dst_tier, nbytes)
        if src_tier == dst_tier:
            return 0.0
        pair = self._pairs.get((src_tier, dst_tier))
        if pair is None:
            src, dst = self.tiers[src_tier], self.tiers[dst_tier]
            overhead = 0.0
            if TierKind.HBM in (src.kind, dst.kind):
                overhead = self.copy_launch_overhead(src.device if src.kind is TierKind.HBM else dst.device)
            if src.device == dst.device:
                pair = (overhead, None, min(src.read_bandwidth, dst.write_bandwidth), 0.0)
            else:
                pair = (overhead, (src.device, dst.device), src.read_bandwidth, dst.write_bandwidth)
            self._pairs[(src_tier, dst_tier)] = pair
        overhead, devices, read, write = pair
        if devices is None:
            return overhead + nbytes / read
        p = self.path(*devices)
        rate = min(p.bandwidth, read, write)
        return overhead + p.latency + nbytes / rate

    def time_to_ready(self, tier: str, learner: str, nbytes: float) -> float:
        """:meth:`ClusterView.time_to_ready`, with each learner's HBM tier looked up once."""
        if not self.memoize:
            return super().time_to_ready(tier, learner, nbytes)
        target = self._learner_hbm.get(learner, False)
        if target is False:
            target = self._learner_hbm[learner] = self.hbm_of(self.learners[learner].device)
        return 0.0 if target is None or target == tier else self.transfer_time(tier, target, nbytes)

    def copy_launch_overhead(self, device: str) -> float:
        """The base class's answer, kept per device (the topology never changes during a run)."""
        value = self._launch.get(device)
        if value is None:
            value = self._launch[device] = super().copy_launch_overhead(device)
        return value

    def residents(self, tier: str) -> Sequence[tuple[Hashable, float]]:
        return self._sim.chunk_ledger.residents(tier)

    # -- learner need model ------------------------------------------------------------------
    def learner_waiting(self, lr: LearnerRole) -> None:
        self.cadence[lr.id].asked(self.now)
        self._plan()

    def learner_busy(self, lr: LearnerRole) -> None:
        self.cadence[lr.id].served()

    # -- the scheduling gate -------------------------------------------------------------------
    def enqueue(self, lr: LearnerRole, cids: list[Hashable], nbytes: float) -> simpy.Event:
        gate = self._sim.env.event()
        self._pending[lr.id][cids[0]] = (nbytes, gate)
        self._has_pending.add(lr.id)
        self._plan()
        return gate

    def move_finished(self, lr: LearnerRole, cids: list[Hashable]) -> None:
        self._plan()

    def _plan(self) -> None:
        if not self._has_pending:
            return
        pending = {lid: [(cid, size) for cid, (size, _) in self._pending[lid].items()]
                   for lid in sorted(self._has_pending)}
        asking = [lid for lid in pending if self.cadence[lid].waiting]
        for lid, cid in self._sim.arbiter.plan(pending, self, asking=asking):
            p = self._pending[lid]
            _, gate = p.pop(cid)
            if not p:
                self._has_pending.discard(lid)
            gate.succeed()
