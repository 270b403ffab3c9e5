"""The chunk ledger: where each chunk's bytes are, and the auditor's placement events.

Both backends keep the same books through one :class:`ChunkLedger`: which tier holds each chunk
(``location``), the residents of every tier oldest first (spill candidates, what
:meth:`~conduit.view.ClusterView.residents` returns), and the bytes each resident takes there. The
ledger reports each change to the :class:`~conduit.audit.Auditor` as it is recorded, and a backend
records a change only once it has happened (the bytes were written, the move finished, the memory
freed), so the audit never sees what did not happen and a failed call leaves no trace.

A chunk whose rows were all handed into batches may still be *located* (at the learner's tier,
inside a batch) without being a *resident* of any tier: it then holds no spillable bytes of its own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

from conduit.audit import Auditor


class ChunkLedger:
    """Chunk -> tier, tier -> residents (oldest first) with their bytes; events to the auditor."""

    def __init__(self, tiers: Iterable[str], auditor: Auditor | None = None):
        self.auditor = auditor
        self._residents: dict[str, OrderedDict[Hashable, float]] = {t: OrderedDict() for t in tiers}
        self._location: dict[Hashable, str] = {}

    # ------------------------------------------------------------------ reading
    def location(self, chunk_id: Hashable) -> str | None:
        """The tier holding (or, inside a batch, carrying) the chunk; None when unknown or gone."""
        return self._location.get(chunk_id)

    def __contains__(self, chunk_id: Hashable) -> bool:
        return chunk_id in self._location

    def residents(self, tier: str) -> Sequence[tuple[Hashable, float]]:
        """``(chunk_id, nbytes)`` of the chunks whose own bytes sit in ``tier``, oldest first."""
        return list(self._residents.get(tier, {}).items())

    def size_in(self, chunk_id: Hashable, tier: str) -> float | None:
        """Bytes the chunk holds in ``tier``; None when it is not a resident there."""
        return self._residents.get(tier, {}).get(chunk_id)

    def used(self, tier: str) -> float:
        return float(sum(self._residents.get(tier, {}).values()))

    def _tier(self, tier: str) -> OrderedDict[Hashable, float]:
        """The residents of ``tier`` (an empty book made on first use)."""
        residents = self._residents.get(tier)
        if residents is None:
            residents = self._residents[tier] = OrderedDict()
        return residents

    # ------------------------------------------------------------------ recording (after the fact)
    def placed(self, chunk_id: Hashable, tier: str, nbytes: float, t: float) -> None:
        """The chunk's bytes were written into ``tier``."""
        self._location[chunk_id] = tier
        self._tier(tier)[chunk_id] = nbytes
        if self.auditor is not None:
            self.auditor.placed(chunk_id, tier, int(nbytes), t)

    def restored(self, chunk_id: Hashable, tier: str, nbytes: float) -> None:
        """A restarted plane took the chunk over where a durable tier still holds its bytes (no
        event: the recovered audit still has it placed there)."""
        self._location[chunk_id] = tier
        self._tier(tier)[chunk_id] = nbytes

    def carried(self, chunk_id: Hashable, tier: str) -> None:
        """The chunk's rows were written straight into batches at ``tier`` (the learner's): it is
        located there and resident nowhere (no placement event: the batch's memory is the auditor's
        placement)."""
        self._location[chunk_id] = tier

    def moved(self, chunk_id: Hashable, dst: str, nbytes: float, t: float) -> None:
        """The chunk's bytes moved from its tier to ``dst`` (the source copy is gone)."""
        location = self._location
        src = location.get(chunk_id)
        if src is not None:
            residents = self._residents.get(src)
            if residents is not None:
                residents.pop(chunk_id, None)
        location[chunk_id] = dst
        self._tier(dst)[chunk_id] = nbytes
        if self.auditor is not None:
            self.auditor.moved(chunk_id, src if src is not None else dst, dst, int(nbytes), t)

    def vacated(self, chunk_id: Hashable, t: float, carried_to: str | None = None) -> None:
        """The chunk's own bytes left their tier (freed); its rows live on only in batches, at
        ``carried_to`` (the learner's tier) when given."""
        tier = self._location.get(chunk_id)
        if tier is not None and self._residents.get(tier, {}).pop(chunk_id, None) is not None \
                and self.auditor is not None:
            self.auditor.evicted(chunk_id, t, tier)
        if carried_to is not None:
            self._location[chunk_id] = carried_to

    def retired(self, chunk_id: Hashable, t: float) -> None:
        """The chunk left the plane: no tier holds it and none of its samples can be delivered."""
        tier = self._location.pop(chunk_id, None)
        if tier is not None:
            self._residents.get(tier, {}).pop(chunk_id, None)
        if self.auditor is not None:
            self.auditor.evicted(chunk_id, t)

    def clear(self) -> None:
        """Forget everything without reporting (the plane is closing; the auditor has finished)."""
        for residents in self._residents.values():
            residents.clear()
        self._location.clear()
