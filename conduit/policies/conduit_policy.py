"""Conduit's own policy: bandwidth- and capacity-aware placement, latency-aware scheduling.

**Placement** (:class:`BandwidthAwarePlacement`). For a chunk produced on node *P* for a learner on
device *D* (node *L*), every tier that could hold it is a candidate: *D*'s HBM, the HBM of *D*'s peers
on *L* (reached over NVLink when *D* is full), pinned and pageable host memory on *L*, pinned memory
on *P*, NVMe on *L*. The predicted **time-to-ready** of a candidate is the copy from the producer's
staging slot into it plus the copy from it into *D* (``ClusterView.transfer_time``: path latency,
the share of the path's bottleneck a new flow would get under the current load, tier media speeds,
copy launch overheads). Candidates that do not fit, or would eat into the ``headroom`` kept free on a
tier for the working set, are infeasible; the cheapest feasible one wins. This is the greedy form of
a small min-cost assignment — :func:`assign_optimal` solves the batch version exactly with
``scipy.optimize.milp`` (capacities coupled across chunks), and :func:`greedy_gap` measures how far
the greedy answer is from it.

Under capacity pressure :meth:`BandwidthAwarePlacement.spill` moves the oldest residents of a full
tier one level down (HBM -> pinned -> pageable -> NVMe), so a replay table larger than HBM keeps a hot
set on the GPU; sampling still follows the contract, not the tier (the plane samples across tiers).

**Scheduling** (:class:`DeadlineScheduler`). Each learner's next need time comes from the view (an
online model of its update cadence). Pending moves start now, earliest deadline first, bounded per
learner by ``depth`` batches of bytes and by the destination's free HBM, so prefetch never breaks a
capacity and never runs ahead of the contract (the plane only offers moves the contract admits).

**Path.** Direct from producer to placement, never through a driver; the learner connector's work
(batch building, to-tensor, PPO's value pass) runs per chunk as chunks arrive — the contracts allow
it (PPO's value function of version *k* is fixed while *k* samples) — pinned copies, streaming during
sampling, the next batch prepared during the update, and fragments handed over in pieces of at most
``target_chunk_bytes`` so the last piece of an iteration has little left to do.

**Two names, one policy.** ``conduit`` and ``conduit-target`` make the same decisions; they differ in
how the simulator models the runtime around them (``PathSettings.deployment``). ``conduit`` is Conduit
as ``enable()`` deploys it (:mod:`conduit.sim.deployed`: RLlib's driver loop kept, plane-actor round
trips, copies into and out of host tiers, host batches) and is the headline; ``conduit-target`` is
the design target above (no driver, free plane calls, HBM batches), never the headline.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from conduit.errors import ConduitError, shown
from conduit.policies.components import EarliestDeadlineFirst, spill_down
from conduit.policy import ChunkInfo, InvalidDecision, Move, Param, PathSettings, Placement, Policy
from conduit.topology.model import SPILL_ORDER, TierKind
from conduit.units import Kind, parse_quantity
from conduit.view import ClusterView, TierState


@dataclass
class BandwidthAwarePlacement:
    """Greedy minimum time-to-ready placement under capacity (see the module docstring)."""

    headroom: float = 0.05
    peers: bool = True
    name: str = "bandwidth-aware"

    def __post_init__(self) -> None:
        h = self.headroom
        if isinstance(h, bool) or not isinstance(h, numbers.Real) or not 0 <= h < 1:
            raise ConduitError(f"headroom must be a number in [0, 1) (the fraction of each tier kept free), "
                               f"got {shown(h)}")

    def candidates(self, chunk: ChunkInfo, view: ClusterView, nbytes: float | None = None,
                   complete: bool = False) -> list[TierState]:
        """Tiers worth pricing, nearest first. Peers' HBM only when the consumer's own HBM has no
        room, NVMe only when no memory tier has: a slower tier never wins while a faster one
        fits, so pricing it would only cost decision time. ``complete`` lists every tier a chunk
        could ever use (for the exact assignment, whose capacities are coupled across chunks)."""
        learner = view.learners.get(chunk.consumer) if chunk.consumer is not None else None
        node = learner.node if learner is not None else chunk.node
        need = chunk.nbytes if nbytes is None else nbytes
        own = view.hbm_of(learner.device) if learner is not None else None
        out: list[TierState] = [view.tiers[own]] if own is not None else []
        if self.peers and (complete or not (out and self.feasible(out[0], need))):
            out.extend(t for t in view.tiers_on(node, TierKind.HBM) if t.id != own)
        out.extend(view.tiers_on(node, TierKind.PINNED))
        out.extend(view.tiers_on(node, TierKind.PAGEABLE))
        if chunk.node != node:
            out.extend(view.tiers_on(chunk.node, TierKind.PINNED))
        if complete or not any(self.feasible(t, need) for t in out):
            out.extend(view.tiers_on(node, TierKind.NVME))
        return out

    def cost(self, chunk: ChunkInfo, tier: TierState, view: ClusterView) -> float:
        """Predicted seconds from the producer's staging slot to the consumer's device, via ``tier``.

        Equal times are broken towards the consumer (HBM before host memory before NVMe) by a
        millionth per level: data already on the device needs no later move, and every byte left
        in host memory holds a staging slot that the next ingestion needs."""
        return self._cost(chunk, tier, view, _staging_tier(chunk, view))

    def _cost(self, chunk: ChunkInfo, tier: TierState, view: ClusterView, source: str | None) -> float:
        """:meth:`cost` with the producer's staging tier already looked up (once per placement)."""
        first = view.transfer_time(source, tier.id, chunk.nbytes) if source is not None else 0.0
        second = view.time_to_ready(tier.id, chunk.consumer, chunk.nbytes) if chunk.consumer is not None else 0.0
        return (first + second) * (1.0 + 1e-6 * SPILL_ORDER.index(tier.kind)) + 1e-12 * SPILL_ORDER.index(tier.kind)

    def feasible(self, tier: TierState, nbytes: float) -> bool:
        return tier.used + nbytes <= tier.capacity * (1.0 - self.headroom)

    def place(self, chunk: ChunkInfo, view: ClusterView) -> Placement:
        best, best_cost = None, float("inf")
        source = _staging_tier(chunk, view)
        for tier in self.candidates(chunk, view):
            if not self.feasible(tier, chunk.nbytes):
                continue
            cost = self._cost(chunk, tier, view, source)
            if cost < best_cost:
                best, best_cost = tier, cost
        if best is None:
            raise InvalidDecision(self.name, chunk, "no candidate tier has room")
        return Placement(best.id)

    def spill(self, tier: str, nbytes: float, view: ClusterView) -> Sequence[Move]:
        state = view.tiers[tier]
        lower = SPILL_ORDER[SPILL_ORDER.index(state.kind) + 1:] if state.kind in SPILL_ORDER else ()
        return spill_down(tier, nbytes, view, {t.id: t.free for kind in lower for t in view.tiers_on(state.node, kind)})


@dataclass
class DeadlineScheduler(EarliestDeadlineFirst):
    """Earliest-deadline-first prefetch from the view's need-time predictions."""

    name: str = "deadline"


def _staging_tier(chunk: ChunkInfo, view: ClusterView) -> str | None:
    pinned = view.tiers_on(chunk.node, TierKind.PINNED)
    if pinned:
        return pinned[0].id
    pageable = view.tiers_on(chunk.node, TierKind.PAGEABLE)
    return pageable[0].id if pageable else None


def assign_optimal(chunks: Sequence[ChunkInfo], view: ClusterView, placement: BandwidthAwarePlacement):
    """Exact min-cost placement of a batch of chunks with coupled tier capacities (MILP).

    Variables ``x[c, t]`` in {0, 1}; minimise the summed time-to-ready subject to every chunk placed
    once and, per tier, the placed bytes within its usable room. Returns (tier ids per chunk, total
    cost), or raises :class:`InvalidDecision` when no assignment exists.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp

    tiers: list[TierState] = []
    seen: set[str] = set()
    for chunk in chunks:
        for tier in placement.candidates(chunk, view, complete=True):
            if tier.id not in seen:
                seen.add(tier.id)
                tiers.append(tier)
    n_c, n_t = len(chunks), len(tiers)
    big = 1e9
    cost = np.full((n_c, n_t), big)
    allowed = {(c, t.id) for c, chunk in enumerate(chunks) for t in placement.candidates(chunk, view, complete=True)}
    for c, chunk in enumerate(chunks):
        for t, tier in enumerate(tiers):
            if (c, tier.id) in allowed:
                cost[c, t] = placement.cost(chunk, tier, view)
    one_each = np.zeros((n_c, n_c * n_t))
    for c in range(n_c):
        one_each[c, c * n_t:(c + 1) * n_t] = 1.0
    sizes = np.array([chunk.nbytes for chunk in chunks], dtype=float)
    unit = float(sizes.max()) if sizes.size and sizes.max() > 0 else 1.0  # bytes -> O(1) rows for the solver
    room = np.zeros((n_t, n_c * n_t))
    for t in range(n_t):
        for c in range(n_c):
            room[t, c * n_t + t] = sizes[c] / unit
    room_limit = np.array([max(0.0, t.capacity * (1 - placement.headroom) - t.used) for t in tiers])
    upper = np.array([[0.0 if cost[c, t] >= big else 1.0 for t in range(n_t)] for c in range(n_c)]).ravel()
    finite = cost[cost < big]
    scale = float(finite.max()) if finite.size and finite.max() > 0 else 1.0  # seconds -> O(1) for the solver's gaps
    limit = room_limit.copy()
    for _ in range(8):
        result = milp(
            c=np.where(cost >= big, 0.0, cost / scale).ravel(),
            constraints=[LinearConstraint(one_each, 1, 1), LinearConstraint(room, 0, limit / unit)],
            integrality=np.ones(n_c * n_t),
            bounds=Bounds(0, upper),
            options={"mip_rel_gap": 1e-12},
        )
        if not result.success:
            raise InvalidDecision(placement.name, [c.chunk_id for c in chunks], f"no feasible assignment: {result.message}")
        x = result.x.reshape(n_c, n_t)
        picks = [int(np.argmax(x[c])) for c in range(n_c)]
        # the solver meets the room rows only within its feasibility tolerance: check the rounded
        # assignment in exact bytes, and tighten a tier it overfills by that much before solving again
        placed = np.zeros(n_t)
        for c, t in enumerate(picks):
            placed[t] += sizes[c]
        over = placed - room_limit
        if not (over > 0).any():
            break
        limit = np.where(over > 0, limit - 2 * over, limit)
    else:
        raise InvalidDecision(placement.name, [c.chunk_id for c in chunks],
                              "no assignment within the tiers' room after 8 tightened solves")
    # the cost of the rounded assignment, summed exactly (the solver's objective carries its
    # feasibility tolerance on x)
    return [tiers[t].id for t in picks], float(sum(cost[c, t] for c, t in enumerate(picks)))


def greedy_gap(chunks: Sequence[ChunkInfo], view, placement: BandwidthAwarePlacement) -> tuple[float, float]:
    """(greedy total cost, optimal total cost) for placing ``chunks`` in order against a view whose
    occupancy the greedy pass updates as it goes (``view`` must be a StaticClusterView)."""
    from dataclasses import replace

    total = 0.0
    saved = dict(view.tier_states)
    try:
        for chunk in chunks:
            tier = view.tier_states[placement.place(chunk, view).tier]
            total += placement.cost(chunk, tier, view)
            view.tier_states[tier.id] = replace(tier, used=tier.used + chunk.nbytes)
    finally:
        view.tier_states.clear()
        view.tier_states.update(saved)
    _, optimum = assign_optimal(chunks, view, placement)
    return total, optimum


def _conduit(name: str, deployment: str, target_chunk_bytes: float, depth: int, granularity: int,
             headroom: float, summary: str) -> Policy:
    try:
        size = parse_quantity(target_chunk_bytes, Kind.BYTES)  # a number of bytes, or "8 MB"
    except ConduitError as exc:
        raise ConduitError(f"target_chunk_bytes: {exc}") from None
    if not 0 < size < math.inf:
        raise ConduitError(f"target_chunk_bytes must be > 0, got {shown(target_chunk_bytes)}")
    for pname, value, minimum in (("depth", depth, 0), ("granularity", granularity, 1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
            raise ConduitError(f"{pname} must be an integer >= {minimum}, got {shown(value)}")
    depth, granularity = int(depth), int(granularity)
    return Policy(
        name=name,
        placement=BandwidthAwarePlacement(headroom=headroom),
        scheduling=DeadlineScheduler(depth=depth),
        path=PathSettings(route="direct", batch_build="per-chunk", pinned=True, granularity=granularity,
                          overlap_collection=True, overlap_update=True, prefetch_depth=depth,
                          target_chunk_bytes=size, deployment=deployment),
        params={"target_chunk_bytes": target_chunk_bytes, "depth": depth, "granularity": granularity,
                "headroom": headroom},
        space=(
            Param("target_chunk_bytes", low=1e6, high=64e6, log=True),
            Param("depth", low=1, high=4, integer=True),
            Param("granularity", low=1, high=8, integer=True, log=True),
            Param("headroom", low=0.0, high=0.3),
        ),
        summary=summary,
    )


def conduit(target_chunk_bytes: float = 8e6, depth: int = 2, granularity: int = 1, headroom: float = 0.05) -> Policy:
    """Conduit as enable() deploys it: bandwidth/capacity-aware placement, deadline scheduling, per-chunk
    batch building; the simulator models the deployed runtime (RLlib's driver loop, plane-actor round
    trips, host batches)."""
    return _conduit("conduit", "enable", target_chunk_bytes, depth, granularity, headroom,
                    "Conduit as enable() deploys it (the headline): plane actor, RLlib's driver loop kept, "
                    "host batches")


def conduit_target(target_chunk_bytes: float = 8e6, depth: int = 2, granularity: int = 1,
                   headroom: float = 0.05) -> Policy:
    """Conduit's design target (not deployed): the same policy with no driver loop, no plane-call costs
    and batches placed in HBM; never the headline."""
    return _conduit("conduit-target", "target", target_chunk_bytes, depth, granularity, headroom,
                    "design target, not what enable() deploys: no driver, free plane calls, HBM batches")
