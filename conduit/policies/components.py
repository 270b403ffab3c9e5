"""Simple placement and scheduling components that several built-in policies are made of.

* :class:`TierPreference` — place each chunk in the first tier, in a preference order of tier
  kinds, that lives on the chunk's consumer node (or its producer node) and has room; spill the
  oldest residents to the next kind down.
* :class:`OnDemand` — move nothing ahead of time: only a learner that is waiting now gets its
  pending chunks moved. The behaviour of a pipeline with no prefetch.
* :class:`EarliestDeadlineFirst` — start every pending move now, ordered by the owning learner's
  predicted need time (earliest first), limited to ``depth`` batches' worth of bytes per learner.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from conduit.policy import ChunkInfo, InvalidDecision, Move, Placement
from conduit.topology.model import TierKind
from conduit.view import ClusterView


@dataclass
class TierPreference:
    """Placement by a fixed preference of tier kinds, local to the consumer first."""

    order: tuple[TierKind, ...]
    name: str = "tier-preference"

    def _candidate_nodes(self, chunk: ChunkInfo, view: ClusterView) -> list[str | None]:
        nodes: list[str | None] = []
        if chunk.consumer is not None and chunk.consumer in view.learners:
            nodes.append(view.learners[chunk.consumer].node)
        if chunk.node not in nodes:
            nodes.append(chunk.node)
        return nodes

    def place(self, chunk: ChunkInfo, view: ClusterView) -> Placement:
        consumer_device = (
            view.learners[chunk.consumer].device
            if chunk.consumer is not None and chunk.consumer in view.learners
            else chunk.device
        )
        for node in self._candidate_nodes(chunk, view):
            for kind in self.order:
                tiers = view.tiers_on(node, kind)
                if kind is TierKind.HBM:  # the consumer's own GPU first
                    tiers.sort(key=lambda t: t.device != consumer_device)
                for tier in tiers:
                    if tier.fits(chunk.nbytes):
                        return Placement(tier.id)
        raise InvalidDecision(self.name, chunk, "no tier of the preferred kinds has room")

    def spill(self, tier: str, nbytes: float, view: ClusterView) -> Sequence[Move]:
        state = view.tiers[tier]
        lower = self.order[self.order.index(state.kind) + 1 :] if state.kind in self.order else ()
        return spill_down(tier, nbytes, view, {t.id: t.free for kind in lower for t in view.tiers_on(state.node, kind)})


def spill_down(tier: str, nbytes: float, view: ClusterView, room: dict[str, float]) -> list[Move]:
    """Moves that free ``nbytes`` of ``tier``: its oldest residents first, each to the first tier of
    ``room`` (tier id -> bytes it may take, in preference order) that still has space for it.
    Stops when enough is freed or when the oldest resident fits nowhere."""
    moves, freed = [], 0.0
    room = dict(room)
    for chunk_id, size in view.residents(tier):
        if freed >= nbytes:
            break
        dst = next((t for t, free in room.items() if free >= size), None)
        if dst is None:
            break
        room[dst] -= size
        freed += size
        moves.append(Move(chunk_id, dst))
    return moves


@dataclass
class OnDemand:
    """No prefetch: only learners that wait now get their data moved."""

    name: str = "on-demand"

    def plan(self, pending: Mapping[str, Sequence[tuple[Hashable, float]]], view: ClusterView) -> Sequence[Move]:
        moves = []
        for learner, chunks in pending.items():
            state = view.learners[learner]
            if state.next_need_at is None or state.next_need_at <= view.now:
                target = view.hbm_of(state.device)
                if target is not None:
                    moves.extend(Move(c, target, view.now) for c, _ in chunks)
        return moves


@dataclass
class EarliestDeadlineFirst:
    """Prefetch in earliest-deadline order, at most ``depth`` batches ahead per learner."""

    depth: int = 2
    name: str = "edf-prefetch"

    def plan(self, pending: Mapping[str, Sequence[tuple[Hashable, float]]], view: ClusterView) -> Sequence[Move]:
        moves = []
        for learner, chunks in pending.items():
            state = view.learners[learner]
            target = view.hbm_of(state.device)
            if target is None:
                continue
            deadline = view.now if state.next_need_at is None else state.next_need_at
            budget = max(state.batch_bytes, 1.0) * self.depth
            hbm = view.tiers[target]
            budget = min(budget, hbm.free)
            for chunk_id, size in chunks:
                if size > budget:
                    break
                budget -= size
                moves.append(Move(chunk_id, target, deadline))
        moves.sort(key=lambda m: (m.deadline, str(m.dst_tier)))
        return moves
