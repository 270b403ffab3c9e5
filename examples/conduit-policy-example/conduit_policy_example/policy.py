"""``nvme-hot-set``: a bounded hot set in HBM, a warm set in pinned host memory, the rest on NVMe.

The idea: HBM is the fastest place for experience but the learner needs most of it for weights,
activations and optimizer state; a replay table or a deep queue does not fit there. So the policy
keeps a **hot set** — the newest chunks — in the consumer's HBM, capped at ``hot_fraction`` of it,
a **warm set** in pinned host memory on the consumer's node, capped at ``warm_fraction`` of that
tier (pinned pages are a shared, scarce resource), and sends everything else to the node's NVMe
drives, which hold terabytes. Among tiers of one kind it picks the one the learner can read soonest
(``ClusterView.time_to_ready``: path latency, the path's current load, media speeds), so NUMA-local
DRAM beats remote DRAM and a busy drive loses to an idle one.

Under capacity pressure a backend asks :meth:`HotSetPlacement.spill` to free bytes in a tier; the
oldest residents are demoted one level (HBM -> pinned -> NVMe), so the hot set stays the newest.
Scheduling is earliest-deadline-first prefetch (a stock component), so data parked on a lower tier
is pulled into HBM ahead of the learner's predicted need.

Only Conduit's public policy API is used: :mod:`conduit.policy`, :mod:`conduit.view`,
:mod:`conduit.policies.components` and :class:`conduit.topology.model.TierKind`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conduit.policies.components import EarliestDeadlineFirst, spill_down
from conduit.policy import ChunkInfo, InvalidDecision, Move, Param, PathSettings, Placement, Policy
from conduit.topology.model import TierKind
from conduit.view import ClusterView, TierState

LEVELS = (TierKind.HBM, TierKind.PINNED, TierKind.NVME)


@dataclass
class HotSetPlacement:
    """Hot set in HBM, warm set in pinned host memory, the rest on NVMe (see the module docstring)."""

    hot_fraction: float = 0.25
    warm_fraction: float = 0.5
    name: str = "nvme-hot-set"

    def __post_init__(self) -> None:
        for field_name in ("hot_fraction", "warm_fraction"):
            value = getattr(self, field_name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{field_name} must be within [0, 1], got {value!r}")

    # -- budgets ---------------------------------------------------------------------------
    def budget(self, tier: TierState) -> float:
        """Bytes this policy lets a tier hold: a share of HBM and pinned memory, all of NVMe."""
        if tier.kind is TierKind.HBM:
            return self.hot_fraction * tier.capacity
        if tier.kind is TierKind.PINNED:
            return self.warm_fraction * tier.capacity
        return tier.capacity

    def room(self, tier: TierState) -> float:
        return max(0.0, self.budget(tier) - tier.used)

    # -- PlacementPolicy ---------------------------------------------------------------------
    def place(self, chunk: ChunkInfo, view: ClusterView) -> Placement:
        learner = view.learners.get(chunk.consumer) if chunk.consumer is not None else None
        node = learner.node if learner is not None else chunk.node
        if learner is not None:  # hot: the consumer's own HBM, within the hot-set budget
            hbm = view.hbm_of(learner.device)
            if hbm is not None and self.room(view.tiers[hbm]) >= chunk.nbytes:
                return Placement(hbm)
        for kind in (TierKind.PINNED, TierKind.NVME):  # warm, then cold, on the consumer's node
            fits = [t for t in view.tiers_on(node, kind) if self.room(t) >= chunk.nbytes]
            if fits:
                def cost(t: TierState) -> tuple:
                    ready = view.time_to_ready(t.id, learner.id, chunk.nbytes) if learner is not None else 0.0
                    return (ready, -self.room(t), t.id)

                return Placement(min(fits, key=cost).id)
        raise InvalidDecision(self.name, chunk, f"no HBM, pinned or NVMe tier on node {node!r} has room")

    def spill(self, tier: str, nbytes: float, view: ClusterView) -> Sequence[Move]:
        """Demote the oldest residents of ``tier`` one level down (on its node) until ``nbytes``
        are freed or the lower levels are out of budget."""
        state = view.tiers[tier]
        if state.kind not in LEVELS or state.kind is TierKind.NVME:
            return []
        lower = LEVELS[LEVELS.index(state.kind) + 1:]
        room = {t.id: self.room(t) for kind in lower for t in view.tiers_on(state.node, kind)}
        return spill_down(tier, nbytes, view, room)  # oldest residents first


def nvme_hot_set(hot_fraction: float = 0.25, warm_fraction: float = 0.5, depth: int = 2) -> Policy:
    """HBM hot set (newest chunks, a fraction of HBM), pinned warm set, NVMe for the rest; EDF prefetch."""
    return Policy(
        name="nvme-hot-set",
        placement=HotSetPlacement(hot_fraction=hot_fraction, warm_fraction=warm_fraction),
        scheduling=EarliestDeadlineFirst(depth=depth),
        path=PathSettings(route="direct", batch_build="per-chunk", pinned=True, granularity=1,
                          overlap_collection=True, overlap_update=True, prefetch_depth=depth),
        params={"hot_fraction": hot_fraction, "warm_fraction": warm_fraction, "depth": depth},
        space=(
            Param("hot_fraction", low=0.01, high=0.9),
            Param("warm_fraction", low=0.05, high=0.9),
            Param("depth", low=1, high=4, integer=True),
        ),
        summary="newest chunks in an HBM hot set (a fraction of HBM), pinned warm set, NVMe for the rest; EDF prefetch",
    )
