"""``ClusterView``: the read-only picture of the cluster that every policy decides from.

Policies never import a backend. Whatever they need to know — how big and how full each memory tier
is, how fast and how loaded each path is, where each chunk sits, when each learner will next need a
batch — they read here, and both the simulator and the runtime provide it: the simulator from its
model state, the runtime from live accounting and its bandwidth estimator.

:class:`ClusterView` is an abstract base: a backend implements the handful of abstract accessors over
its live state (no copying per decision), and the derived estimates (``transfer_time``,
``time_to_ready``) are computed here once, so a policy sees the same arithmetic in both backends.
:class:`StaticClusterView` holds plain data; tests and policy authors use it directly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from conduit.topology.model import DEFAULT_COPY_LAUNCH_OVERHEAD, TierKind


@dataclass(frozen=True)
class TierState:
    """One memory tier as a policy sees it: capacity and live occupancy, in bytes."""

    id: str
    kind: TierKind
    node: str | None
    device: str
    capacity: float
    used: float
    read_bandwidth: float
    write_bandwidth: float

    @property
    def free(self) -> float:
        return self.capacity - self.used

    def fits(self, nbytes: float) -> bool:
        return self.used + nbytes <= self.capacity


@dataclass(frozen=True)
class PathState:
    """The route between two devices: ``bandwidth`` is the share a new transfer would get now
    (bottleneck capacity divided by the load already on it); ``capacity`` the unloaded bottleneck."""

    bandwidth: float
    capacity: float
    latency: float
    hops: int


@dataclass(frozen=True)
class LearnerState:
    """A learner (one per device) and the scheduler-relevant facts about it.

    ``next_need_at`` is the predicted time it will ask for its next batch (from an online model of its
    update time), ``None`` when it is waiting now. ``update_time`` is that model's current estimate.
    """

    id: str
    device: str
    node: str | None
    next_need_at: float | None
    update_time: float
    version: int
    batch_bytes: float = 0.0


class ClusterView(ABC):
    """Read-only view of tiers, paths, chunks and learners at time :attr:`now`."""

    #: where a backend runs its decisions; policies may ignore it
    backend: str = "abstract"

    @property
    @abstractmethod
    def now(self) -> float: ...

    @property
    @abstractmethod
    def tiers(self) -> Mapping[str, TierState]: ...

    @property
    @abstractmethod
    def learners(self) -> Mapping[str, LearnerState]: ...

    @property
    @abstractmethod
    def policy_version(self) -> int: ...

    @abstractmethod
    def path(self, src_device: str, dst_device: str) -> PathState:
        """The route a transfer between two devices would take, with its current load."""

    @abstractmethod
    def location(self, chunk_id: Hashable) -> str | None:
        """The tier that holds a chunk now, ``None`` when it is in flight or gone."""

    @abstractmethod
    def residents(self, tier: str) -> Sequence[tuple[Hashable, float]]:
        """Chunks held in a tier as ``(chunk_id, nbytes)``, oldest first (spill candidates)."""

    def copy_launch_overhead(self, device: str) -> float:
        """Fixed cost of one copy that involves ``device`` (a host<->device launch)."""
        return DEFAULT_COPY_LAUNCH_OVERHEAD

    # -- derived estimates, identical in every backend -------------------------------------
    def tiers_on(self, node: str | None, kind: TierKind | str | None = None) -> list[TierState]:
        kind = TierKind(kind) if kind is not None else None
        return [
            t for t in self.tiers.values()
            if t.node == node and (kind is None or t.kind is kind)
        ]

    def transfer_time(self, src_tier: str, dst_tier: str, nbytes: float) -> float:
        """Predicted seconds to copy ``nbytes`` between two tiers under the current load.

        Path latency, plus bytes over the slowest of: the path's available share, the source tier's
        read speed and the destination tier's write speed, plus a launch overhead when a GPU is an
        end. A tier to itself costs nothing.
        """
        if src_tier == dst_tier:
            return 0.0
        src, dst = self.tiers[src_tier], self.tiers[dst_tier]
        overhead = 0.0
        if TierKind.HBM in (src.kind, dst.kind):
            gpu = src.device if src.kind is TierKind.HBM else dst.device
            overhead = self.copy_launch_overhead(gpu)
        if src.device == dst.device:
            rate = min(src.read_bandwidth, dst.write_bandwidth)
            return overhead + nbytes / rate
        p = self.path(src.device, dst.device)
        rate = min(p.bandwidth, src.read_bandwidth, dst.write_bandwidth)
        return overhead + p.latency + nbytes / rate

    def time_to_ready(self, tier: str, learner: str, nbytes: float) -> float:
        """Predicted seconds from placing data in ``tier`` to having it in the learner's HBM."""
        state = self.learners[learner]
        target = self.hbm_of(state.device)
        return 0.0 if target is None or target == tier else self.transfer_time(tier, target, nbytes)

    def hbm_of(self, device: str) -> str | None:
        """The HBM tier of a device (``None`` for a CPU learner)."""
        for t in self.tiers.values():
            if t.device == device and t.kind is TierKind.HBM:
                return t.id
        return None


@dataclass
class StaticClusterView(ClusterView):
    """A ClusterView over plain data: for tests, examples and offline policy development."""

    time: float = 0.0
    tier_states: dict[str, TierState] = field(default_factory=dict)
    learner_states: dict[str, LearnerState] = field(default_factory=dict)
    paths: dict[tuple[str, str], PathState] = field(default_factory=dict)
    locations: dict[Hashable, str] = field(default_factory=dict)
    sizes: dict[Hashable, float] = field(default_factory=dict)
    version: int = 0
    default_path: PathState = PathState(10e9, 10e9, 5e-6, 2)
    backend: str = "static"

    @property
    def now(self) -> float:
        return self.time

    @property
    def tiers(self) -> Mapping[str, TierState]:
        return self.tier_states

    @property
    def learners(self) -> Mapping[str, LearnerState]:
        return self.learner_states

    @property
    def policy_version(self) -> int:
        return self.version

    def path(self, src_device: str, dst_device: str) -> PathState:
        return self.paths.get((src_device, dst_device)) or self.paths.get(
            (dst_device, src_device), self.default_path
        )

    def location(self, chunk_id: Hashable) -> str | None:
        return self.locations.get(chunk_id)

    def residents(self, tier: str) -> Sequence[tuple[Hashable, float]]:
        return [(c, self.sizes.get(c, 0.0)) for c, t in self.locations.items() if t == tier]


def static_view_of(topology, used: Mapping[str, float] | None = None, **kwargs) -> StaticClusterView:
    """A :class:`StaticClusterView` of a topology's tiers (all empty unless ``used`` says otherwise)."""
    used = used or {}
    tiers = {
        t.id: TierState(t.id, t.kind, t.node, t.device, t.capacity, used.get(t.id, 0.0),
                        t.read_bandwidth, t.write_bandwidth)
        for t in topology.tiers
    }
    return StaticClusterView(tier_states=tiers, **kwargs)
