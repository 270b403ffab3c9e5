"""The runtime's :class:`~conduit.view.ClusterView`: live accounting and measured bandwidths.

Tier capacity and occupancy come straight from the allocators (what the plane really holds), tier
residents from the plane core's :class:`~conduit.plane.ChunkLedger` (as in the simulator), learner need times from the plane core's cadence model
(:class:`~conduit.plane.LearnerCadence`, the same as in the simulator), and path speeds from the
:class:`~conduit.runtime.estimator.BandwidthEstimator`, i.e. from the copies the plane has made so
far, seeded with the topology's numbers. A policy therefore decides here from the same kinds of
facts as in the simulator, only true ones.

The view reads the plane's state without copying it; the plane calls policies while holding its
lock, so what a policy sees is consistent for the length of one decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

import networkx as nx

from conduit.plane.cadence import LearnerCadence
from conduit.plane.ledger import ChunkLedger
from conduit.runtime.estimator import BandwidthEstimator
from conduit.topology.model import Topology
from conduit.view import ClusterView, LearnerState, PathState, TierState

if TYPE_CHECKING:
    from conduit.runtime.tiers import RuntimeTier



class LearnerModel(LearnerCadence):
    """A runtime learner's cadence (the plane core's model) on the wall clock."""

    def __init__(self, id: str, device: str, node: str | None, batch_bytes: float, tier: str | None = None):
        super().__init__(id, device, node, tier, batch_bytes)

    def requested(self, now: float) -> None:
        self.asked(now)

    def state(self, now: float | None = None) -> LearnerState:
        return super().state(time.time() if now is None else now)


class _Tiers(Mapping):
    def __init__(self, view: RuntimeClusterView):
        self._view = view

    def __getitem__(self, key: str) -> TierState:
        t = self._view._tiers[key]
        read, write = self._view.media_speed(t)
        return TierState(t.id, t.kind, t.node, t.device, float(t.capacity), float(t.used), read, write)

    def __iter__(self):
        return iter(self._view._tiers)

    def __len__(self) -> int:
        return len(self._view._tiers)


class _Learners(Mapping):
    def __init__(self, models: Mapping[str, LearnerModel]):
        self._models = models

    def __getitem__(self, key: str) -> LearnerState:
        return self._models[key].state()

    def __iter__(self):
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)


class RuntimeClusterView(ClusterView):
    backend = "runtime"

    def __init__(self, topology: Topology, tiers: Mapping[str, RuntimeTier], learners: Mapping[str, LearnerModel],
                 estimator: BandwidthEstimator, ledger: ChunkLedger, version: Callable[[], int]):
        self.topology = self._topology = topology
        self._tiers = tiers
        self._learner_models = learners
        self._estimator = estimator
        self._ledger = ledger
        self._version = version
        self._tier_states = _Tiers(self)
        self._learner_states = _Learners(learners)
        self._speeds: dict[str, tuple[int, float, float]] = {}
        self._routes: dict[tuple[str, str], tuple[float, float, int]] = {}
        for a in tiers.values():  # priors: the topology's numbers for every tier pair
            for b in tiers.values():
                if a is not b:
                    bw, lat = self._prior(a, b)
                    estimator.prior(a.id, b.id, bw, lat)

    def _prior(self, a: RuntimeTier, b: RuntimeTier) -> tuple[float, float]:
        rate = min(a.read_bandwidth, b.write_bandwidth)
        if a.device == b.device:
            return rate, 1e-6
        try:
            bw, lat, _ = self._topology.widest_shortest_path(a.device, b.device)
        except (nx.NetworkXException, KeyError):
            return rate, 1e-5
        return min(bw, rate), lat

    # -- ClusterView --------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return time.time()

    @property
    def tiers(self) -> Mapping[str, TierState]:
        return self._tier_states

    @property
    def learners(self) -> Mapping[str, LearnerState]:
        return self._learner_states

    @property
    def policy_version(self) -> int:
        return self._version()

    #: observations between two recomputations of a tier's media speeds (they move slowly)
    SPEED_REFRESH = 32

    def media_speed(self, tier: RuntimeTier) -> tuple[float, float]:
        """Read and write speed of a tier: the topology's, unless copies out of / into it were
        measured to be faster (a measured copy bounds the medium's speed from below)."""
        gen = self._estimator.generation
        cached = self._speeds.get(tier.id)
        if cached is not None and gen - cached[0] < self.SPEED_REFRESH:
            return cached[1], cached[2]
        read, write = self._measured_speed(tier)
        self._speeds[tier.id] = (gen, read, write)
        return read, write

    def _measured_speed(self, tier: RuntimeTier) -> tuple[float, float]:
        read, write = tier.read_bandwidth, tier.write_bandwidth
        for other in self._tiers:
            out = self._estimator.get(tier.id, other)
            if out is not None and out.samples:
                read = max(read, out.bandwidth)
            into = self._estimator.get(other, tier.id)
            if into is not None and into.samples:
                write = max(write, into.bandwidth)
        return read, write

    def path(self, src_device: str, dst_device: str) -> PathState:
        """The measured route between two devices: the best estimate among the tier pairs on them."""
        best = None
        for a in self._tiers.values():
            if a.device != src_device:
                continue
            for b in self._tiers.values():
                if b.device == dst_device and a is not b:
                    est = self._estimator.get(a.id, b.id)
                    if est is not None and (best is None or est.bandwidth > best.bandwidth):
                        best = est
        bw, lat, hops = self._route(src_device, dst_device)
        if best is None:
            return PathState(bw, bw, lat, hops)
        return PathState(best.bandwidth, best.bandwidth, best.latency, hops)

    def _route(self, src_device: str, dst_device: str) -> tuple[float, float, int]:
        """The topology's route between two devices (cached: the topology never changes)."""
        key = (src_device, dst_device)
        route = self._routes.get(key)
        if route is None:
            try:
                route = self._topology.widest_shortest_path(src_device, dst_device)
            except (nx.NetworkXException, KeyError):
                route = (10e9, 1e-5, 1)
            self._routes[key] = route
        return route

    def residents(self, tier: str) -> Sequence[tuple[Hashable, float]]:
        return self._ledger.residents(tier)
