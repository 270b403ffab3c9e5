"""The runtime's :class:`~conduit.view.ClusterView`: live accounting and measured bandwidths.

Tier capacity and occupancy come straight from the allocators (what the plane really holds), chunk
locations from the plane's index, learner need times from an online model of each learner's cadence
(an EWMA of the time between its batch requests, as in the simulator), and path speeds from the
:class:`~conduit.runtime.estimator.BandwidthEstimator`, i.e. from the copies the plane has made so
far, seeded with the topology's numbers. A policy therefore decides here from the same kinds of
facts as in the simulator, only true ones.

The view reads the plane's state without copying it; the plane calls policies while holding its
lock, so what a policy sees is consistent for the length of one decision.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

import networkx as nx

from conduit.runtime.estimator import BandwidthEstimator
from conduit.topology.model import DEFAULT_COPY_LAUNCH_OVERHEAD, TierKind, Topology
from conduit.view import ClusterView, LearnerState, PathState, TierState

if TYPE_CHECKING:
    from conduit.runtime.tiers import RuntimeTier

EWMA = 0.3


class LearnerModel:
    """What the scheduler knows about one learner: its device and its update cadence."""

    def __init__(self, id: str, device: str, node: str, batch_bytes: float):
        self.id = id
        self.device = device  # topology device id (gpu0, or the host memory device for a CPU learner)
        self.node = node
        self.batch_bytes = batch_bytes
        self.interval = 0.0
        self.last_request: float | None = None
        self.waiting = False
        self.version = 0

    def requested(self, now: float) -> None:
        if self.last_request is not None:
            gap = now - self.last_request
            self.interval = gap if not self.interval else (1 - EWMA) * self.interval + EWMA * gap
        self.last_request = now
        self.waiting = True

    def served(self) -> None:
        self.waiting = False

    def state(self) -> LearnerState:
        need = None if self.waiting or self.last_request is None else self.last_request + self.interval
        return LearnerState(self.id, self.device, self.node, need, self.interval, self.version, self.batch_bytes)


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
                 estimator: BandwidthEstimator, locations: Mapping[Hashable, str],
                 residents: Mapping[str, Mapping[Hashable, int]], version: callable):
        self._topology = topology
        self._tiers = tiers
        self._learner_models = learners
        self._estimator = estimator
        self._locations = locations
        self._residents = residents
        self._version = version
        self._tier_states = _Tiers(self)
        self._learner_states = _Learners(learners)
        self._hbm = {t.device: t.id for t in tiers.values() if t.kind is TierKind.HBM}
        self._by_node: dict[tuple, list[str]] = {}
        self._speeds: dict[str, tuple[int, float, float]] = {}
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

    def tiers_on(self, node, kind=None) -> list[TierState]:
        """Indexed by (node, kind): placement asks this per chunk."""
        key = (node, kind.value if hasattr(kind, "value") else kind)
        ids = self._by_node.get(key)
        if ids is None:
            ids = [t.id for t in self._tiers.values() if t.node == node and (kind is None or t.kind.value == key[1])]
            self._by_node[key] = ids
        return [self._tier_states[i] for i in ids]

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
        if best is None:
            try:
                bw, lat, hops = self._topology.widest_shortest_path(src_device, dst_device)
                return PathState(bw, bw, lat, hops)
            except (nx.NetworkXException, KeyError):
                return PathState(10e9, 10e9, 1e-5, 1)
        return PathState(best.bandwidth, best.bandwidth, best.latency, 1)

    def location(self, chunk_id: Hashable) -> str | None:
        return self._locations.get(chunk_id)

    def residents(self, tier: str) -> Sequence[tuple[Hashable, float]]:
        return list(self._residents.get(tier, {}).items())

    def hbm_of(self, device: str) -> str | None:
        return self._hbm.get(device)

    def copy_launch_overhead(self, device: str) -> float:
        dev = self._topology.devices.get(device)
        return dev.get("copy_launch_overhead", DEFAULT_COPY_LAUNCH_OVERHEAD) if dev is not None \
            else DEFAULT_COPY_LAUNCH_OVERHEAD
