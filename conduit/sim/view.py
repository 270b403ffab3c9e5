"""The simulator's :class:`~conduit.view.ClusterView`, and the gate through which the scheduling
policy releases moves.

Tier occupancy comes live from the :class:`~conduit.sim.resources.TierLedger`, path load from the
flow network (the share a new flow would get on the route's bottleneck), learner need times from an
online model (EWMA) of how long each learner takes between asking for batches.

Scheduling: a chunk that is placed off its learner's device waits at a *gate*. Whenever something
changes (a chunk is enqueued, a move ends, a learner starts waiting), the policy's ``plan`` is called
with the pending chunks per learner; the moves it returns open their gates, earliest first. A move to
anywhere but the learner's device tier is rejected (counted) and opened towards the device anyway, so
an invalid plan costs time, never data.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

import simpy

from conduit.policy import InvalidDecision
from conduit.topology.model import DEFAULT_COPY_LAUNCH_OVERHEAD
from conduit.view import ClusterView, LearnerState, PathState, TierState

if TYPE_CHECKING:
    from conduit.sim.cluster import LearnerRole
    from conduit.sim.engine import Simulation

EWMA = 0.3


class _Tiers(Mapping):
    """Live TierState objects built on access (no copying of the whole cluster per decision)."""

    def __init__(self, sim: Simulation):
        self._sim = sim
        self._static = {t.id: t for t in sim.topology.tiers}

    def __getitem__(self, key: str) -> TierState:
        t = self._static[key]
        return TierState(t.id, t.kind, t.node, t.device, t.capacity, self._sim.ledger.used[key],
                         t.read_bandwidth, t.write_bandwidth)

    def __iter__(self):
        return iter(self._static)

    def __len__(self) -> int:
        return len(self._static)


class _Learners(Mapping):
    """Live LearnerState objects built on access."""

    def __init__(self, view: SimClusterView):
        self._view = view
        self._roles = {lr.id: lr for lr in view._sim.layout.learners}

    def __getitem__(self, key: str) -> LearnerState:
        v, lr = self._view, self._roles[key]
        w = v._sim.workload
        need = None if v._waiting[key] else v._need_at[key]
        return LearnerState(lr.id, lr.device, lr.node, need, v._interval[key] or w.update_time_per_sample,
                            v._sim.version, w.train_batch_per_learner * w.bytes_per_step)

    def __iter__(self):
        return iter(self._roles)

    def __len__(self) -> int:
        return len(self._roles)


class SimClusterView(ClusterView):
    backend = "sim"

    def __init__(self, sim: Simulation):
        self._sim = sim
        self._tiers = _Tiers(sim)
        self._by_node: dict[tuple, list[str]] = {}
        self._waiting: dict[str, bool] = {lr.id: False for lr in sim.layout.learners}
        self._need_at: dict[str, float] = {lr.id: 0.0 for lr in sim.layout.learners}
        self._interval: dict[str, float] = {lr.id: 0.0 for lr in sim.layout.learners}
        self._last_need: dict[str, float | None] = {lr.id: None for lr in sim.layout.learners}
        self._pending: dict[str, dict[Hashable, tuple[float, simpy.Event]]] = {lr.id: {} for lr in sim.layout.learners}
        self._roles = {lr.id: lr for lr in sim.layout.learners}
        self._paths: dict[tuple[str, str], tuple[float, list[int]]] = {}
        self._learners = _Learners(self)
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
        capacity, or a fair split with the flows already there, whichever is larger."""
        key = (src_device, dst_device)
        net = self._sim.network
        if key not in self._paths:
            route = net.route(src_device, dst_device)
            links = list(route.links)
            self._paths[key] = (float(net.latency[links].sum()) if links else 0.0, links)
        latency, links = self._paths[key]
        if not links:
            return PathState(float("inf"), float("inf"), 0.0, 0)
        caps = net.bandwidth[links]
        used = net.link_rates()[links]
        share = [max(c - u, c / 2) if u > 0 else c for c, u in zip(caps, used, strict=True)]
        return PathState(float(min(share)), float(caps.min()), latency, len(links))

    def tiers_on(self, node, kind=None) -> list[TierState]:
        """Indexed by (node, kind): placement asks this per chunk, so no scan of every tier."""
        key = (node, kind.value if hasattr(kind, "value") else kind)
        ids = self._by_node.get(key)
        if ids is None:
            ids = [t.id for t in self._sim.topology.tiers
                   if t.node == node and (kind is None or t.kind.value == key[1])]
            self._by_node[key] = ids
        return [self._tiers[i] for i in ids]

    def hbm_of(self, device: str) -> str | None:
        tier = f"{device}:hbm"
        return tier if tier in self._tiers._static else None

    def location(self, chunk_id: Hashable) -> str | None:
        return self._sim._location.get(chunk_id)

    def residents(self, tier: str) -> Sequence[tuple[Hashable, float]]:
        chunks = self._sim._chunks
        return [(cid, chunks[cid].nbytes) for cid, t in self._sim._location.items() if t == tier]

    def copy_launch_overhead(self, device: str) -> float:
        dev = self._sim.topology.devices.get(device)
        return dev.get("copy_launch_overhead", DEFAULT_COPY_LAUNCH_OVERHEAD) if dev is not None else DEFAULT_COPY_LAUNCH_OVERHEAD

    # -- learner need model ------------------------------------------------------------------
    def learner_waiting(self, lr: LearnerRole) -> None:
        now = self.now
        last = self._last_need[lr.id]
        if last is not None:
            gap = now - last
            self._interval[lr.id] = gap if not self._interval[lr.id] else (1 - EWMA) * self._interval[lr.id] + EWMA * gap
        self._last_need[lr.id] = now
        self._waiting[lr.id] = True
        self._plan()

    def learner_busy(self, lr: LearnerRole) -> None:
        self._waiting[lr.id] = False
        self._need_at[lr.id] = self.now + self._interval[lr.id]

    # -- the scheduling gate -------------------------------------------------------------------
    def enqueue(self, lr: LearnerRole, cids: list[Hashable], nbytes: float) -> simpy.Event:
        gate = self._sim.env.event()
        self._pending[lr.id][cids[0]] = (nbytes, gate)
        self._has_pending.add(lr.id)
        self._plan()
        return gate

    def moved(self, lr: LearnerRole, cids: list[Hashable]) -> None:
        self._plan()

    def _plan(self) -> None:
        if not self._has_pending:
            return
        pending = {lid: [(cid, size) for cid, (size, _) in self._pending[lid].items()]
                   for lid in sorted(self._has_pending)}
        policy = self._sim.policy.scheduling
        try:
            moves = policy.plan(pending, self)
        except InvalidDecision as exc:
            self._sim.rec.reject(str(exc))
            moves = []
        for move in moves:
            for lid in pending:
                p = self._pending[lid]
                if move.chunk_id in p:
                    lr = self._roles[lid]
                    if move.dst_tier != lr.device_tier:
                        self._sim.rec.reject(str(InvalidDecision(
                            policy.name, move, f"moves must target the learner's device tier {lr.device_tier!r}")))
                    _, gate = p.pop(move.chunk_id)
                    if not p:
                        self._has_pending.discard(lid)
                    gate.succeed()
                    break

