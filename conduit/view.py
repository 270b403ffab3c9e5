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

    ``device`` is its compute device (a GPU, or the CPU device for a CPU learner) and ``tier`` the
    memory tier its batches must end in (the GPU's HBM, or host memory for a CPU learner): the same
    facts in both backends. ``next_need_at`` is the predicted time it will ask for its next batch
    (:class:`~conduit.plane.cadence.LearnerCadence`), ``None`` when it is waiting now.
    ``update_time`` is that model's current estimate of the time between asks (``0.0`` before there
    is history, when ``next_need_at`` is then: the learner needs data now).
    """

    id: str
    device: str
    node: str | None
    next_need_at: float | None
    update_time: float
    version: int
    batch_bytes: float = 0.0
    tier: str | None = None


class ClusterView(ABC):
    """Read-only view of tiers, paths, chunks and learners at time :attr:`now`.

    Every fact means the same in both backends. :attr:`now` is simulated seconds in the simulator
    and the wall clock in the runtime: only differences between times (``next_need_at - now``, a
    deadline) are meaningful. ``ChunkInfo.node`` is the producer's node and ``nbytes`` the payload's
    size; tiers are looked up by node, kind and device (:meth:`tiers_on`, :meth:`hbm_of`,
    :meth:`learner_tier`), never built from name strings.
    """

    #: where a backend runs its decisions; policies may ignore it
    backend: str = "abstract"

    #: the topology the tiers come from (device attributes such as ``copy_launch_overhead``), if any
    topology = None

    @property
    @abstractmethod
    def now(self) -> float:
        """The backend's clock (simulated or wall); meaningful only as a difference."""

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
    def residents(self, tier: str) -> Sequence[tuple[Hashable, float]]:
        """Chunks held in a tier as ``(chunk_id, nbytes)``, oldest first (spill candidates)."""

    def copy_launch_overhead(self, device: str) -> float:
        """Fixed cost of one copy that involves ``device`` (a host<->device launch): the
        topology's ``copy_launch_overhead`` of that device, else the default."""
        topology = self.topology
        dev = topology.devices.get(device) if topology is not None else None
        return dev.get("copy_launch_overhead", DEFAULT_COPY_LAUNCH_OVERHEAD) if dev is not None \
            else DEFAULT_COPY_LAUNCH_OVERHEAD

    # -- tier lookup, by node/kind/device (the set of tiers never changes for a view) -------
    #: the tier set is fixed for the view's life, so the lookup index is built once
    fixed_tiers: bool = True

    def _tier_index(self) -> tuple[dict[tuple, list[str]], dict[str, str]]:
        index = self.__dict__.get("_conduit_tier_index") if self.fixed_tiers else None
        if index is None:
            by_node: dict[tuple, list[str]] = {}
            hbm: dict[str, str] = {}
            for t in self.tiers.values():
                by_node.setdefault((t.node, None), []).append(t.id)
                by_node.setdefault((t.node, t.kind), []).append(t.id)
                if t.kind is TierKind.HBM:
                    hbm.setdefault(t.device, t.id)
            index = (by_node, hbm)
            if self.fixed_tiers:
                self.__dict__["_conduit_tier_index"] = index
        return index

    def tiers_on(self, node: str | None, kind: TierKind | str | None = None) -> list[TierState]:
        """Tiers on ``node`` (optionally of one kind), in the backend's tier order."""
        kind = TierKind(kind) if kind is not None else None
        tiers = self.tiers
        return [tiers[i] for i in self._tier_index()[0].get((node, kind), ())]

    def hbm_of(self, device: str) -> str | None:
        """The HBM tier of a device (``None`` for a CPU or memory device)."""
        return self._tier_index()[1].get(device)

    def learner_tier(self, learner: str) -> str | None:
        """The tier a learner's data must end in: its device's HBM, or host memory for a CPU
        learner."""
        state = self.learners[learner]
        return state.tier if state.tier is not None else self.hbm_of(state.device)

    # -- derived estimates, identical in every backend -------------------------------------

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
        """Predicted seconds from placing data in ``tier`` to having it in the learner's HBM (zero
        for a CPU learner, whose device memory is host memory)."""
        target = self.hbm_of(self.learners[learner].device)
        return 0.0 if target is None or target == tier else self.transfer_time(tier, target, nbytes)


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
    fixed_tiers: bool = False  # tests edit tier_states in place

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
