"""The auditor: watches a plane's event stream and counts data-contract violations.

Both backends (the SimPy simulator and the real runtime) report what happens to experience as a
stream of events, and one :class:`Auditor` checks that stream against the workload's contract
(:mod:`conduit.contracts`) and the hardware's capacities. It imports neither backend, nor SimPy nor
torch: it sees only chunk metadata, sample selections, tier names, byte counts and checksums.

The event vocabulary (:class:`EventKind`) follows a chunk through the plane:

* ``INGESTED`` — an actor handed a chunk over; its samples now exist.
* ``PLACED`` / ``MOVED`` — bytes of a chunk occupy a tier / moved from one tier to another.
* ``EVICTED`` — with a tier: the chunk's bytes left that tier. Without one: the chunk left the
  plane entirely and may never be delivered again.
* ``DRAWN`` — Replay: the table's sampler drew these samples for a batch (reported when the
  sampler returns, before their bytes are copied). Only live samples may be drawn: each must be
  ingested, not evicted from the plane and not dropped. A draw is not a delivery (the batch's
  ``DELIVERED`` event follows once it is copied) and does not count against the rate band.
* ``DELIVERED`` — samples reached update *k* (one delivery may be one minibatch or epoch).
* ``CONSUMED`` — update *k* finished using its data; for :class:`~conduit.contracts.OnPolicy`
  this is when every version-*k* sample must have been delivered to it or dropped.
* ``DROPPED`` — the plane discarded samples on purpose, with a reason (``"stale"``,
  ``"producer-died"``...). A drop is counted, never a violation; a dropped sample may not be
  delivered afterwards.

* ``lost`` (:meth:`Auditor.lost`) — samples that were still deliverable when the plane holding
  them failed (its process died; the reason is ``"plane restart"``). Counted in
  ``lost_samples`` / ``lost_chunks`` by reason, never a violation: the contract was not broken by
  a decision, the memory holding them is gone. Such samples may not be delivered afterwards.
  :meth:`Auditor.restarted` counts the restarts and forgets what the dead incarnation's memory held.

Hot paths call the direct methods (:meth:`Auditor.ingested`, :meth:`Auditor.delivered`, ...),
which allocate no event objects; :meth:`Auditor.observe` accepts a :class:`PlaneEvent` for
recorded or streamed events.

**What is counted, in which unit** (:class:`ViolationKind`):

* ``stale`` (samples) — delivered to an update the contract does not admit their version to.
* ``duplicated`` (samples) — repeated inside one delivery where the contract forbids it
  (OnPolicy, BoundedStaleness), delivered to a second update under OnPolicy, or ingested under a
  chunk id that already exists.
* ``over_reused`` (samples) — BoundedStaleness: delivered into more than ``max_reuse`` updates.
  A *use* is one update: several deliveries of a sample to the same update (epochs, minibatches)
  are one use, under OnPolicy and BoundedStaleness alike.
* ``lost`` (samples) — OnPolicy and BoundedStaleness: never delivered and never dropped, and no
  longer deliverable. Counted as soon as that is certain: when the chunk leaves the plane, when
  update *k* is consumed (OnPolicy, version-*k* samples), or at :meth:`Auditor.finish` for chunks
  that are no longer resident in any tier, and, under OnPolicy, for chunks whose version belongs
  to an update already consumed (they can never be delivered validly).
* ``evicted_then_sampled`` (samples) — delivered, or drawn by a Replay sampler, after their
  chunk left the plane or after they were dropped.
* ``ratio_out_of_band`` (excursions) — Replay: the cumulative sampled/inserted counts left the
  rate band (or sampling started before warm-up). One violation per excursion: counted when the
  stream leaves the band, not again until it has come back; ``out_of_band_events`` in the report
  counts every ingestion or delivery that ended outside.
* ``capacity_exceeded`` (events) — a placement or move that leaves a tier's occupancy above its
  capacity (evict first, then place); and, for Replay, a delivery made while the buffer holds more
  live steps than the contract's ``capacity``.
* ``bytes_changed`` (chunk deliveries) — a checksum supplied with a delivery differs from the one
  the chunk was ingested with (only when both are known).
* ``unknown_sample`` (samples) — delivery of a chunk never ingested (or retired beyond the
  window, see below), or of an index outside it.

Each delivered sample is checked against every rule, so one bad delivery may count under two
kinds when both are true (an OnPolicy sample delivered to a second, later update is ``duplicated``
and ``stale``).

**Memory: retired chunks are folded into the totals.** A chunk *retires* when it leaves the plane
(``evicted`` without a tier), which also settles its books (its lost samples are counted then, for
the contracts that count them). From then on nothing it could still do changes a count except late
events naming it, so the auditor drops its per-chunk state — the chunk record, its residency map
and its OnPolicy version-list entry — and keeps only the ``RETIRED_WINDOW`` (65,536) most recently
retired chunks' metadata (version, steps, bytes per step, checksum) to classify late events. The
auditor's memory is then O(chunks resident + window), not O(chunks ever ingested), on an unbounded
stream. Exactly:

* Within the window a retired chunk is remembered as before: a delivery of its samples counts
  ``evicted_then_sampled`` (and ``stale``, ``unknown_sample`` for out-of-range indices, checksum
  verification, delivered and Replay-sampled counts), a re-ingestion of its id is ``duplicated``, a
  drop of it is ignored. The report equals the unbounded auditor's (``retire = False``) on every
  stream in which no event names a chunk retired more than ``RETIRED_WINDOW`` retirements ago, and
  every count that does not depend on such an event (occupancy, peaks, Replay's live steps and rate
  band, drops, lost samples) is computed by the same code on the same state.
* Beyond the window the id is unknown, as if never ingested. A selection delivering it counts
  ``max(1, n)`` ``unknown_sample`` samples, ``n`` being the number of indices it spells (an
  open-ended slice, whose size needs the chunk's steps, counts 1), with the message "never
  ingested, or retired more than N chunks ago" (the same text whether or not the auditor folds, so
  that reports compare); it is not counted in ``delivered_samples`` / ``delivered_bytes`` nor,
  under Replay, as sampled steps; ``stale`` is not checked (its version is forgotten) nor its
  checksum. For a selection of in-range indices spelling its size, to an update its version is
  admitted to, with no checksum, the violation total is what the unbounded auditor counts (``n``
  ``evicted_then_sampled`` become ``n`` ``unknown_sample``); under Replay the sampled count, and
  hence the rate band, may differ. A re-ingestion of the id is accepted as a new chunk (counted as
  ingested and audited from then on) instead of ``duplicated``. A drop naming it is counted under
  its reason as for any unknown id (the number of indices it names; 0, but listed, when it names
  none) where a remembered one is ignored. Placements, moves and tier evictions are per id and
  unaffected: a tier still holding bytes of a retired id keeps that residency entry until the id
  is evicted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from operator import attrgetter
from typing import Any

import numpy as np

from conduit.chunk import Chunk, normalize_indices, selection_size
from conduit.contracts import BoundedStaleness, Contract, OnPolicy, Replay, contract_from_dict
from conduit.errors import ConduitError

MAX_EXAMPLES = 5
"""Example messages kept per violation kind."""

_NEVER = np.iinfo(np.int64).min  # "no update yet" in a chunk's last-update array


class EventKind(str, Enum):
    """What happened to experience in the plane."""

    INGESTED = "ingested"
    PLACED = "placed"
    MOVED = "moved"
    DELIVERED = "delivered"
    DRAWN = "drawn"
    CONSUMED = "consumed"
    EVICTED = "evicted"
    DROPPED = "dropped"


class ViolationKind(str, Enum):
    """A way of breaking a data contract or a capacity (see the module doc for units)."""

    LOST = "lost"
    DUPLICATED = "duplicated"
    STALE = "stale"
    OVER_REUSED = "over_reused"
    EVICTED_THEN_SAMPLED = "evicted_then_sampled"
    RATIO_OUT_OF_BAND = "ratio_out_of_band"
    CAPACITY_EXCEEDED = "capacity_exceeded"
    BYTES_CHANGED = "bytes_changed"
    UNKNOWN_SAMPLE = "unknown_sample"


@dataclass(frozen=True, slots=True)
class PlaneEvent:
    """One event of the plane's stream; each kind uses the fields its direct method takes.

    ``INGESTED``: ``chunk``. ``PLACED``: ``chunk_id, tier, nbytes``. ``MOVED``: ``chunk_id,
    src_tier, dst_tier, nbytes``. ``DELIVERED``: ``update, selections`` and optional
    ``checksums``. ``DRAWN``: ``selections``. ``CONSUMED``: ``update``. ``EVICTED``: ``chunk_id`` and optional ``tier``.
    ``DROPPED``: ``chunk_id, reason`` and optional ``indices``.
    """

    kind: EventKind
    t: float
    chunk_id: Hashable | None = None
    chunk: Chunk | None = None
    tier: str | None = None
    src_tier: str | None = None
    dst_tier: str | None = None
    nbytes: int = 0
    update: int | None = None
    selections: Iterable[tuple[Hashable, Any]] | None = None
    checksums: Mapping[Hashable, int] | None = None
    reason: str | None = None
    indices: Any = None


@dataclass(frozen=True)
class AuditReport:
    """What the auditor has seen so far, and what it found.

    ``violations`` is the total over ``by_kind`` (every kind present, zero or not); ``examples``
    holds the first few messages per kind, each naming chunk, indices and update.
    """

    contract: dict[str, Any]
    violations: int
    by_kind: dict[str, int]
    examples: dict[str, list[str]]
    ingested_chunks: int
    ingested_samples: int
    ingested_bytes: int
    deliveries: int
    delivered_samples: int
    delivered_bytes: int
    dropped_samples: dict[str, int]
    updates_consumed: int
    unused_resident_samples: int
    checksums_verified: int
    out_of_band_events: int
    peak_occupancy: dict[str, int]
    finished: bool
    t: float
    drawn_samples: int = 0
    restarts: int = 0
    lost_chunks: dict[str, int] | None = None
    lost_samples: dict[str, int] | None = None

    @property
    def ok(self) -> bool:
        """No violation of any kind."""
        return self.violations == 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (plain dicts, lists, ints and strings)."""
        return {
            "contract": dict(self.contract),
            "violations": self.violations,
            "by_kind": dict(self.by_kind),
            "examples": {k: list(v) for k, v in self.examples.items()},
            "ingested_chunks": self.ingested_chunks,
            "ingested_samples": self.ingested_samples,
            "ingested_bytes": self.ingested_bytes,
            "deliveries": self.deliveries,
            "delivered_samples": self.delivered_samples,
            "delivered_bytes": self.delivered_bytes,
            "dropped_samples": dict(self.dropped_samples),
            "updates_consumed": self.updates_consumed,
            "unused_resident_samples": self.unused_resident_samples,
            "checksums_verified": self.checksums_verified,
            "out_of_band_events": self.out_of_band_events,
            "peak_occupancy": dict(self.peak_occupancy),
            "finished": self.finished,
            "t": self.t,
            "drawn_samples": self.drawn_samples,
            "restarts": self.restarts,
            "lost_chunks": dict(self.lost_chunks or {}),
            "lost_samples": dict(self.lost_samples or {}),
        }

    def summary(self) -> str:
        """One line: total and the non-zero kinds."""
        bad = ", ".join(f"{k}={v}" for k, v in self.by_kind.items() if v)
        return f"{self.violations} violations" + (f" ({bad})" if bad else "")


class _ChunkState:
    """Per-chunk bookkeeping: metadata plus per-sample counters (no payload kept).

    The counters are **lazy**. While every delivery that touched the chunk named all of it, its
    samples share one history, so ``uses`` (updates each sample went into) and ``last_update``
    (the latest of them) are plain ints and ``dense`` is False. The first selection that names
    only part of the chunk expands them, exactly, into per-sample numpy arrays (:meth:`densify`);
    from then on they stay arrays. Drops are lazy the same way and on their own: ``dropped`` is
    None while either no sample or every sample was dropped (``n_dropped`` is 0 or ``steps``),
    and a boolean array once only some were. An LLM chunk of a million tokens delivered whole
    therefore costs O(1) memory and time per event, not O(steps).
    """

    __slots__ = (
        "bytes_per_step",
        "checksum",
        "dense",
        "dropped",
        "id",
        "last_update",
        "n_dropped",
        "removed",
        "settled",
        "steps",
        "uses",
        "version",
    )

    def __init__(self, chunk: Chunk, tracked: bool, lazy: bool = True):
        self.id = chunk.id
        self.version = int(chunk.policy_version)
        self.steps = int(chunk.steps)
        self.checksum = chunk.checksum
        self.bytes_per_step = chunk.nbytes / chunk.steps
        # uses: updates each sample went into; last_update: the latest of them (ints while
        # uniform, per-sample arrays once dense; None for contracts without a reuse limit)
        self.uses: int | np.ndarray | None = 0 if tracked else None
        self.last_update: int | np.ndarray | None = _NEVER if tracked else None
        self.dense = False
        if tracked and not lazy:
            self.densify()
        self.dropped: np.ndarray | None = None  # allocated on the first partial drop
        self.n_dropped = 0
        self.removed = False  # left the plane (evicted without a tier)
        self.settled = False  # lost-sample accounting done

    def densify(self) -> None:
        """Expand the uniform counters into per-sample arrays holding the same values."""
        self.uses = np.full(self.steps, self.uses, np.int32)
        self.last_update = np.full(self.steps, self.last_update, np.int64)
        self.dense = True

    def unused_count(self) -> int:
        """How many samples were never delivered and never dropped."""
        if self.dense:
            return int(np.count_nonzero(self.unused_mask()))
        return self.steps - self.n_dropped if self.uses == 0 else 0

    def unused_mask(self) -> np.ndarray:
        """Samples never delivered and never dropped (allocates ``steps`` booleans)."""
        mask = self.uses == 0 if self.dense else np.full(self.steps, self.uses == 0)
        if self.n_dropped:
            if self.dropped is None:  # every sample was dropped
                mask[:] = False
            else:
                mask &= ~self.dropped
        return mask

    def unused_head(self) -> np.ndarray:
        """The unused samples for an example message: the first 7 at least, in order."""
        if not self.dense and self.dropped is None:
            # uniform: all samples unused (or none); 7 of them spell the same "[0, ..., 5, ...]"
            return np.arange(min(self.steps, 7) if self.uses == 0 and not self.n_dropped else 0)
        return np.flatnonzero(self.unused_mask())


def _whole(idx: slice | np.ndarray, n: int, steps: int) -> bool:
    """Whether the normalised indexer ``idx`` (``n`` samples) names every sample exactly once.

    A normalised slice is in range with step 1, so ``n == steps`` means ``[0:steps]``; an array
    (in range after normalisation) must also be strictly increasing, i.e. ``arange(steps)``.
    """
    if n != steps:
        return False
    if isinstance(idx, slice):
        return True
    return n < 2 or bool((idx[1:] > idx[:-1]).all())


def _describe(idx: slice | np.ndarray) -> str:
    if isinstance(idx, slice):
        return f"[{idx.start}:{idx.stop}]" if idx.step in (None, 1) else f"[{idx}]"
    shown = ", ".join(str(int(i)) for i in idx[:6])
    return f"[{shown}{', ...' if idx.size > 6 else ''}]"


class Auditor:
    """Checks a plane's event stream against a data contract and tier capacities.

    ``contract`` may also be given in its dict form. ``tier_capacities`` maps tier names (as used
    in ``placed``/``moved``/``evicted``) to bytes; tiers not listed are tracked but unbounded.
    :meth:`report` may be read at any time; :meth:`finish` closes out the lost-sample checks and
    freezes the auditor.

    Per-sample state is kept lazily (see :class:`_ChunkState`): a chunk only ever delivered,
    dropped and evicted whole costs O(1) whatever its size. ``lazy = False`` (in a subclass)
    allocates the per-sample arrays at ingestion instead, with the same results; the tests check
    the lazy path against it and the throughput benchmark times it as the baseline.

    Retired chunks are folded into the totals (see the module doc): once a chunk has left the plane
    and its books are settled, its per-chunk state is dropped, except the metadata of the last
    ``RETIRED_WINDOW`` retired chunks, kept to classify late events exactly as before (delivery:
    ``evicted_then_sampled``; re-ingestion: ``duplicated``). An event naming a chunk retired longer
    ago sees an unknown id: a delivery counts ``unknown_sample``, a re-ingestion starts a new
    chunk. Memory is O(chunks not yet retired + ``RETIRED_WINDOW``). ``retire = False`` (in a
    subclass) keeps every chunk's state forever, the behaviour before folding: the tests check the
    folding auditor against it and ``benchmarks/audit_memory.py`` measures both.
    """

    lazy: bool = True
    """Keep a chunk's per-sample facts as scalars until its samples differ (see above)."""

    retire: bool = True
    """Drop the per-chunk state of chunks that left the plane (see above)."""

    RETIRED_WINDOW: int = 65536
    """How many of the most recently retired chunks stay known (and named in the message of an
    ``unknown_sample`` violation). ``Auditor(..., retired_window=N)`` sets one auditor's window: its
    memory then reaches its bound after N retirements (about N x 300 B of chunk records), the
    price being that late events naming older chunks count as ``unknown_sample`` (see the module
    doc)."""

    def __init__(
        self,
        contract: Contract | Mapping[str, Any],
        tier_capacities: Mapping[str, int] | None = None,
        *,
        retired_window: int | None = None,
    ):
        if retired_window is not None:  # this auditor's own window (else the class's RETIRED_WINDOW)
            self.RETIRED_WINDOW = retired_window
        if isinstance(contract, Mapping):
            contract = contract_from_dict(contract)
        if not isinstance(contract, OnPolicy | BoundedStaleness | Replay):
            raise ConduitError(f"auditor: unknown contract {contract!r}")
        self.contract = contract
        self.tier_capacities: dict[str, int] = dict(tier_capacities or {})
        if not isinstance(self.RETIRED_WINDOW, int) or self.RETIRED_WINDOW < 0:
            raise ConduitError(
                f"auditor: retired_window (RETIRED_WINDOW) must be an int >= 0, got {self.RETIRED_WINDOW!r}"
            )
        self._admits = contract.admits
        self._max_uses = contract.max_uses
        self._tracked = contract.max_uses is not None
        self._no_repeats = not contract.repeats_in_delivery
        self._reuse_kind = (
            ViolationKind.DUPLICATED if isinstance(contract, OnPolicy) else ViolationKind.OVER_REUSED
        )
        self._on_policy = isinstance(contract, OnPolicy)
        self._replay = contract if isinstance(contract, Replay) else None

        self._chunks: dict[Hashable, _ChunkState] = {}
        # OnPolicy: not-yet-consumed versions -> their chunks, by id (retired ones are removed)
        self._by_version: dict[int, dict[Hashable, _ChunkState]] = {}
        self._residency: dict[Hashable, dict[str, int]] = {}
        self._occupancy: dict[str, int] = {}
        self._peak: dict[str, int] = {}
        self._retired: deque[Hashable] = deque()  # ids still in _chunks after retiring, oldest first

        self._counts = dict.fromkeys(ViolationKind, 0)
        self._examples: dict[ViolationKind, list[str]] = {k: [] for k in ViolationKind}
        self._ingested_chunks = 0
        self._ingested_samples = 0
        self._ingested_bytes = 0
        self._deliveries = 0
        self._delivered_samples = 0
        self._delivered_bytes = 0.0
        self._drawn_samples = 0
        self._dropped: dict[str, int] = {}
        self._lost_chunks: dict[str, int] = {}  # by reason: chunks the plane's failure took
        self._lost_samples: dict[str, int] = {}  # by reason: their still-deliverable samples
        self._restarts = 0
        self._updates_consumed = 0
        self._max_consumed: int | None = None
        self._checksums_verified = 0
        self._t = 0.0

        # Replay rate limiter state (cumulative steps)
        self._inserted = 0
        self._sampled = 0
        self._live_steps = 0
        self._in_band = True
        self._out_of_band_events = 0

        self._final: AuditReport | None = None

    # --- recording ----------------------------------------------------------------------------

    def _violate(self, kind: ViolationKind, count: int, message: str | None = None) -> None:
        self._counts[kind] += count
        examples = self._examples[kind]
        if message is not None and len(examples) < MAX_EXAMPLES:
            examples.append(message)

    def _wants_example(self, kind: ViolationKind) -> bool:
        return len(self._examples[kind]) < MAX_EXAMPLES

    def _check_open(self) -> None:
        if self._final is not None:
            raise ConduitError("auditor: event after finish()")

    # --- events -------------------------------------------------------------------------------

    def observe(self, event: PlaneEvent) -> None:
        """Apply one recorded event (same effect as the matching direct method)."""
        kind = EventKind(event.kind)
        t = event.t
        if kind is EventKind.INGESTED:
            if event.chunk is None:
                raise ConduitError("auditor: INGESTED event without a chunk")
            self.ingested(event.chunk, t)
        elif kind is EventKind.PLACED:
            self.placed(event.chunk_id, _need(event.tier, "tier"), event.nbytes, t)
        elif kind is EventKind.MOVED:
            self.moved(
                event.chunk_id,
                _need(event.src_tier, "src_tier"),
                _need(event.dst_tier, "dst_tier"),
                event.nbytes,
                t,
            )
        elif kind is EventKind.DELIVERED:
            self.delivered(
                _need(event.update, "update"), event.selections or (), t, event.checksums
            )
        elif kind is EventKind.DRAWN:
            self.drawn(event.selections or (), t)
        elif kind is EventKind.CONSUMED:
            self.consumed(_need(event.update, "update"), t)
        elif kind is EventKind.EVICTED:
            self.evicted(event.chunk_id, t, event.tier)
        else:
            self.dropped(event.chunk_id, t, _need(event.reason, "reason"), event.indices)

    def ingested(self, chunk: Chunk, t: float) -> None:
        """An actor handed ``chunk`` over; its samples now exist."""
        self._check_open()
        self._t = t
        cid = chunk.id
        if cid in self._chunks:
            self._violate(
                ViolationKind.DUPLICATED,
                chunk.steps,
                f"chunk {cid!r} ingested twice (t={t:g}); the second copy's "
                f"{chunk.steps} samples are duplicates",
            )
            return
        state = _ChunkState(chunk, self._tracked, self.lazy)
        self._chunks[cid] = state
        self._ingested_chunks += 1
        self._ingested_samples += state.steps
        self._ingested_bytes += chunk.nbytes
        if self._on_policy:
            self._by_version.setdefault(state.version, {})[cid] = state
        if self._replay is not None:
            self._inserted += state.steps
            self._live_steps += state.steps
            self._check_rate(t, f"ingestion of chunk {cid!r}")

    def knows(self, chunk_id: Hashable) -> bool:
        """Whether ``chunk_id`` names a chunk the auditor still remembers: one not yet retired, or
        one of the last ``RETIRED_WINDOW`` retired (a plane refuses such an id at ingestion)."""
        return chunk_id in self._chunks

    def placed(self, chunk_id: Hashable, tier: str, nbytes: int, t: float) -> None:
        """``nbytes`` of the chunk now occupy ``tier`` (added to what it already holds there)."""
        self._check_open()
        self._t = t
        tiers = self._residency.get(chunk_id)
        if tiers is None:
            tiers = self._residency[chunk_id] = {}
        tiers[tier] = tiers.get(tier, 0) + nbytes
        self._occupy(tier, nbytes, chunk_id, t, "placed")

    def moved(
        self, chunk_id: Hashable, src_tier: str, dst_tier: str, nbytes: int, t: float
    ) -> None:
        """The chunk left ``src_tier`` (all it held there) and ``nbytes`` of it occupy ``dst_tier``."""
        self._check_open()
        self._t = t
        tiers = self._residency.get(chunk_id)
        if tiers is None:
            tiers = self._residency[chunk_id] = {}
        held = tiers.pop(src_tier, None)
        if held is not None:
            self._occupancy[src_tier] -= held
        tiers[dst_tier] = tiers.get(dst_tier, 0) + nbytes
        self._occupy(dst_tier, nbytes, chunk_id, t, f"moved from {src_tier!r}")

    def _occupy(self, tier: str, nbytes: int, chunk_id: Hashable, t: float, how: str) -> None:
        occ = self._occupancy.get(tier, 0) + nbytes
        self._occupancy[tier] = occ
        if occ > self._peak.get(tier, 0):
            self._peak[tier] = occ
        cap = self.tier_capacities.get(tier)
        if cap is not None and occ > cap:
            self._violate(
                ViolationKind.CAPACITY_EXCEEDED,
                1,
                f"tier {tier!r} holds {occ} B > capacity {cap} B after chunk {chunk_id!r} "
                f"({nbytes} B) was {how} at t={t:g}",
            )

    def delivered(
        self,
        update: int,
        selections: Iterable[tuple[Hashable, Any]],
        t: float,
        checksums: Mapping[Hashable, int] | None = None,
    ) -> None:
        """Samples reached update ``update``: ``selections`` are ``(chunk_id, indices)`` pairs.

        ``checksums`` optionally maps chunk ids to the checksum of the bytes as delivered.
        """
        self._check_open()
        self._t = t
        self._deliveries += 1
        chunks = self._chunks
        admits = self._admits
        tracked = self._tracked
        no_repeats = self._no_repeats
        seen: dict[Hashable, list] | None = {} if no_repeats else None
        total = 0
        nbytes = 0.0
        for cid, indices in selections:
            st = chunks.get(cid)
            if st is None:
                self._unknown_chunk(cid, indices, f"delivered to update {update} at t={t:g}")
                continue
            idx, n, bad = normalize_indices(indices, st.steps)
            if bad:
                self._violate(
                    ViolationKind.UNKNOWN_SAMPLE,
                    bad,
                    f"{bad} indices outside chunk {cid!r} (steps={st.steps}) delivered to "
                    f"update {update} at t={t:g}",
                )
            if n == 0:
                continue
            total += n
            nbytes += n * st.bytes_per_step
            if st.removed or st.n_dropped:
                self._deliver_gone(st, idx, n, f"being delivered to update {update} at t={t:g}")
            if not admits(st.version, update):
                self._stale(st, idx, n, update, t)
            if st.removed:
                continue  # its per-sample counters are freed; nothing more to check
            if no_repeats:
                self._repeats(st, idx, n, seen, update, t)
            if tracked:
                self._use(st, idx, n, update, t)
        self._delivered_tail(update, total, nbytes, t, checksums)

    def _delivered_tail(self, update: int, total: int, nbytes: float, t: float,
                        checksums: Mapping[Hashable, int] | None) -> None:
        """What a delivery counts once its selections are checked: totals, checksums, rate, capacity."""
        self._delivered_samples += total
        self._delivered_bytes += nbytes
        if checksums:
            self._verify(checksums, update, t)
        replay = self._replay
        if replay is not None:
            self._sampled += total
            self._check_rate(t, f"delivery to update {update}")
            if self._live_steps > replay.capacity:
                self._violate(
                    ViolationKind.CAPACITY_EXCEEDED,
                    1,
                    f"update {update} sampled at t={t:g} from a buffer holding "
                    f"{self._live_steps} live steps > Replay.capacity {replay.capacity}",
                )

    def drawn(self, selections: Iterable[tuple[Hashable, Any]], t: float) -> None:
        """A Replay sampler drew these ``(chunk_id, indices)`` samples for a batch (see ``DRAWN``).

        Each must be live: a chunk never ingested (or retired beyond the window) or an index
        outside it counts ``unknown_sample``; a sample of a chunk that left the plane, or a
        dropped one, counts ``evicted_then_sampled``. Nothing else changes: the delivery that
        follows is audited as such.
        """
        self._check_open()
        self._t = t
        chunks = self._chunks
        for cid, indices in selections:
            st = chunks.get(cid)
            if st is None:
                self._unknown_chunk(cid, indices, f"drawn by the sampler at t={t:g}")
                continue
            idx, n, bad = normalize_indices(indices, st.steps)
            if bad:
                self._violate(
                    ViolationKind.UNKNOWN_SAMPLE,
                    bad,
                    f"{bad} indices outside chunk {cid!r} (steps={st.steps}) drawn at t={t:g}",
                )
            self._drawn_samples += n
            if n and (st.removed or st.n_dropped):
                self._deliver_gone(st, idx, n, f"the sampler drew them at t={t:g}")

    # --- whole draws at once (Replay batches) --------------------------------------------------

    def _clean_runs(self, chunk_ids: Sequence[Hashable], counts: np.ndarray, rows: np.ndarray) -> bool:
        """Whether the runs (see :meth:`drawn_runs`) name only live samples: every chunk known, not
        removed, none of its samples dropped, every row in range. Then neither a draw nor (under
        Replay) a delivery of them can count a violation, and the totals are all that change. Reads
        every run's chunk state with C-level maps and the rows with numpy reductions: no Python loop
        per run or per sample."""
        sts = list(map(self._chunks.get, chunk_ids))
        if None in sts:
            return False
        if any(map(_REMOVED, sts)) or any(map(_N_DROPPED, sts)):
            return False
        if not rows.size:
            return True
        if int(rows.min()) < 0:
            return False
        steps = np.fromiter(map(_STEPS, sts), np.int64, len(sts))
        return bool((rows < np.repeat(steps, counts)).all())

    def drawn_runs(self, chunk_ids: Sequence[Hashable], counts: Any, rows: Any, t: float) -> None:
        """A Replay draw given as runs: the ``i``-th run is ``counts[i]`` rows of chunk ``chunk_ids[i]``,
        the rows being the next ``counts[i]`` entries of ``rows`` (integers). The same event as
        ``drawn([(chunk_ids[i], rows[run i]) ...], t)``, with the same report, but a draw of live
        samples (the normal case) is checked with a few numpy reductions instead of per-chunk Python:
        anything else (an unknown chunk, a row out of range, a sample gone or dropped) is handed to
        :meth:`drawn`, so every violation is counted and worded exactly as there."""
        self._check_open()
        counts, rows = _runs(chunk_ids, counts, rows)
        if not self._clean_runs(chunk_ids, counts, rows):
            self.drawn(runs_to_selections(chunk_ids, counts, rows), t)
            return
        self._t = t
        self._drawn_samples += int(rows.size)

    def delivered_runs(self, update: int, chunk_ids: Sequence[Hashable], counts: Any, rows: Any, t: float,
                       checksums: Mapping[Hashable, int] | None = None) -> None:
        """A delivery given as runs (see :meth:`drawn_runs`): the same event as :meth:`delivered` with the
        selections the runs spell, and the same report. Under Replay (no per-sample use counts, repeats
        allowed, every version admitted) a delivery of live samples is counted with numpy sums;
        any other contract, or any run that would count a violation, goes through :meth:`delivered`."""
        self._check_open()
        counts, rows = _runs(chunk_ids, counts, rows)
        if self._replay is None or self._tracked or self._no_repeats or not self._clean_runs(chunk_ids, counts, rows):
            self.delivered(update, runs_to_selections(chunk_ids, counts, rows), t, checksums)
            return
        self._t = t
        self._deliveries += 1
        nbytes = 0.0
        if len(counts):  # summed left to right, as delivered() does, so the float total is the same
            per_step = np.fromiter(map(_BYTES_PER_STEP, map(self._chunks.__getitem__, chunk_ids)), np.float64,
                                   len(counts))
            part = counts * per_step
            part[counts == 0] = 0.0  # delivered() skips an empty selection (whatever its bytes per step)
            nbytes = float(np.cumsum(part)[-1])
        self._delivered_tail(update, int(rows.size), nbytes, t, checksums)

    def _unknown_chunk(self, cid: Hashable, indices: Any, when: str) -> None:
        """Samples of a chunk the auditor does not know were used (``when``: drawn, or delivered)."""
        try:
            n = max(1, selection_size(indices))
        except ConduitError:
            n = 1
        message = None
        if self._wants_example(ViolationKind.UNKNOWN_SAMPLE):
            message = (
                f"chunk {cid!r} was never ingested, or retired more than "
                f"{self.RETIRED_WINDOW} chunks ago, but {n} of its samples were {when}"
            )
        self._violate(ViolationKind.UNKNOWN_SAMPLE, n, message)

    def _deliver_gone(self, st: _ChunkState, idx: slice | np.ndarray, n: int, when: str) -> None:
        """Samples that had left the plane, or been dropped, were used (``when``: drawn, or delivered)."""
        if st.removed or st.dropped is None:  # gone whole (a uniform chunk dropped all)
            gone = n
        else:
            gone = int(np.count_nonzero(st.dropped[idx]))
        if gone:
            what = "left the plane" if st.removed else "were dropped"
            self._violate(
                ViolationKind.EVICTED_THEN_SAMPLED,
                gone,
                f"{gone} samples of chunk {st.id!r} {_describe(idx)} {what} before {when}",
            )

    def _stale(
        self, st: _ChunkState, idx: slice | np.ndarray, n: int, update: int, t: float
    ) -> None:
        message = None
        if self._wants_example(ViolationKind.STALE):
            rule = (
                f"only version {update}"
                if self._on_policy
                else f"versions >= {self.contract.min_version(update)}"
            )
            message = (
                f"chunk {st.id!r} {_describe(idx)} (version {st.version}) delivered to "
                f"update {update} at t={t:g}; {self.contract.kind} admits {rule}"
            )
        self._violate(ViolationKind.STALE, n, message)

    def _repeats(
        self,
        st: _ChunkState,
        idx: slice | np.ndarray,
        n: int,
        seen: dict[Hashable, list],
        update: int,
        t: float,
    ) -> None:
        """Samples carried twice by one delivery (across or within its selections)."""
        prior = seen.get(st.id)
        if prior is None:
            seen[st.id] = [idx]
            if isinstance(idx, slice):
                return  # a slice names each sample once
            mask = np.zeros(st.steps, np.bool_)
            mask[idx] = True
            repeated = n - int(np.count_nonzero(mask))
        else:
            mask = np.zeros(st.steps, np.bool_)
            for p in prior:
                mask[p] = True
            already = mask[idx]
            repeated = int(np.count_nonzero(already))
            fresh = idx
            if repeated:
                as_array = np.arange(st.steps)[idx] if isinstance(idx, slice) else idx
                fresh = as_array[~already]
            if not isinstance(fresh, slice):
                before = int(np.count_nonzero(mask))
                mask[fresh] = True
                repeated += fresh.size - (int(np.count_nonzero(mask)) - before)
            prior.append(idx)
        if repeated:
            self._violate(
                ViolationKind.DUPLICATED,
                repeated,
                f"{repeated} samples of chunk {st.id!r} {_describe(idx)} repeated within "
                f"one delivery to update {update} at t={t:g}",
            )

    def _use(self, st: _ChunkState, idx: slice | np.ndarray, n: int, update: int, t: float) -> None:
        """Count a new use for samples not yet delivered to this update; flag excess reuse."""
        limit = self._max_uses
        if not st.dense:
            if st.last_update == update:
                return  # every sample already went into this update
            if _whole(idx, n, st.steps):  # all samples alike before, and after
                st.uses += 1
                st.last_update = update
                self._over_use(st, idx, n if st.uses > limit else 0, update, t)
                return
            st.densify()  # the samples start to differ
        if isinstance(idx, slice):
            last = st.last_update[idx]  # a view
            new = last != update
            k = int(np.count_nonzero(new))
            if not k:
                return
            uses = st.uses[idx]  # a view
            uses += new
            over = uses > limit
            if k != n:
                over &= new
            excess = int(np.count_nonzero(over))
            last[...] = update
        else:
            last = st.last_update[idx]
            new = last != update
            k = int(np.count_nonzero(new))
            if not k:
                return
            uses = st.uses[idx] + new
            st.uses[idx] = uses
            excess = int(np.count_nonzero((uses > limit) & new))
            st.last_update[idx] = update
        self._over_use(st, idx, excess, update, t)

    def _over_use(
        self, st: _ChunkState, idx: slice | np.ndarray, excess: int, update: int, t: float
    ) -> None:
        """Count ``excess`` samples of ``idx`` that went into more updates than allowed."""
        if not excess:
            return
        kind = self._reuse_kind
        message = None
        if self._wants_example(kind):
            message = (
                f"{excess} samples of chunk {st.id!r} {_describe(idx)} delivered to update "
                f"{update} at t={t:g} after being used in {self._max_uses} other update(s)"
            )
        self._violate(kind, excess, message)

    def _verify(self, checksums: Mapping[Hashable, int], update: int, t: float) -> None:
        chunks = self._chunks
        for cid, got in checksums.items():
            st = chunks.get(cid)
            if st is None or st.checksum is None or got is None:
                continue
            self._checksums_verified += 1
            if got != st.checksum:
                self._violate(
                    ViolationKind.BYTES_CHANGED,
                    1,
                    f"chunk {cid!r} delivered to update {update} at t={t:g} with checksum "
                    f"{got:#010x}, ingested with {st.checksum:#010x}",
                )

    def _check_rate(self, t: float, cause: str) -> None:
        replay = self._replay
        ok = replay.in_band(self._inserted, self._sampled)
        if not ok:
            self._out_of_band_events += 1
            if self._in_band:
                if self._inserted < replay.min_size:
                    why = f"sampling before warm-up (min_size {replay.min_size})"
                else:
                    err = replay.rate_error(self._inserted, self._sampled)
                    why = f"rate error {err:+g} steps outside ±{replay.tolerance:g}"
                self._violate(
                    ViolationKind.RATIO_OUT_OF_BAND,
                    1,
                    f"{cause} at t={t:g} left the rate band: inserted={self._inserted}, "
                    f"sampled={self._sampled}, replay_ratio={replay.replay_ratio:g}; {why}",
                )
        self._in_band = ok

    def consumed(self, update: int, t: float) -> None:
        """Update ``update`` finished using its data (OnPolicy: its samples are now settled)."""
        self._check_open()
        self._t = t
        self._updates_consumed += 1
        if self._max_consumed is None or update > self._max_consumed:
            self._max_consumed = update
        if self._on_policy:
            why = f"update {update} was consumed at t={t:g}"
            for st in self._by_version.pop(update, {}).values():
                if not st.settled and not st.removed:
                    self._settle(st, why)

    def evicted(self, chunk_id: Hashable, t: float, tier: str | None = None) -> None:
        """The chunk's bytes left ``tier``; with no tier, the chunk left the plane entirely."""
        self._check_open()
        self._t = t
        if tier is not None:
            tiers = self._residency.get(chunk_id)
            if tiers is not None and tier in tiers:
                self._occupancy[tier] -= tiers.pop(tier)
                if not tiers and self.retire and chunk_id not in self._chunks:
                    self._forget_residency(chunk_id)
            return
        st = self._chunks.get(chunk_id)
        # a known chunk's residency map goes when it retires (or, retired, is evicted again)
        gone = st is not None and self.retire
        tiers = self._residency.pop(chunk_id, None) if gone else self._residency.get(chunk_id)
        if tiers:
            occupancy = self._occupancy
            for name, held in tiers.items():
                occupancy[name] -= held
            if not gone:
                tiers.clear()
        if st is None and self.retire and tiers is not None:
            self._forget_residency(chunk_id)
        if st is None or st.removed:
            return
        if self._tracked and not st.settled:
            self._settle(st, f"it left the plane at t={t:g}")
        self._live_steps -= st.steps - st.n_dropped
        st.removed = True
        st.uses = st.last_update = st.dropped = None  # free the per-sample counters
        if self.retire:
            self._retire(chunk_id, st)

    def _forget_residency(self, chunk_id: Hashable) -> None:
        """An id the auditor does not know (a batch's extent, or a chunk retired beyond the window)
        left every tier. Its empty map records nothing (``placed``/``moved`` recreate one), so the
        folding auditor drops it; otherwise a plane would keep one entry per batch it ever delivered.
        (For a known chunk an empty map means "evicted from every tier", which ``_resident`` reads.)"""
        del self._residency[chunk_id]

    def _retire(self, cid: Hashable, st: _ChunkState) -> None:
        """Fold a chunk that left the plane, books settled (its residency map is gone already):
        drop its version entry now, its record once ``RETIRED_WINDOW`` later chunks retired."""
        if self._on_policy:
            same = self._by_version.get(st.version)
            if same is not None and same.get(cid) is st:
                del same[cid]
                if not same:
                    del self._by_version[st.version]
        retired = self._retired
        retired.append(cid)
        if len(retired) > self.RETIRED_WINDOW:
            old = retired.popleft()
            # each id is in the window at most once: a new chunk may take an id only after this
            del self._chunks[old]
            tiers = self._residency.get(old)
            if tiers is not None and not tiers:
                del self._residency[old]

    def dropped(
        self, chunk_id: Hashable, t: float, reason: str, indices: Any = None
    ) -> None:
        """The plane discarded samples on purpose (all of the chunk when ``indices`` is None)."""
        self._check_open()
        self._t = t
        self._drop(chunk_id, reason, indices, self._dropped)

    def _drop(
        self, chunk_id: Hashable, reason: str, indices: Any, tally: dict[str, int]
    ) -> int:
        """Mark samples gone (never deliverable again), counted in ``tally[reason]``; returns how many."""
        st = self._chunks.get(chunk_id)
        if st is None:
            n = 0
            if indices is not None:
                try:
                    n = selection_size(indices)
                except ConduitError:
                    n = 0
            tally[reason] = tally.get(reason, 0) + n
            return n
        if st.removed:
            return 0  # already gone; nothing left to drop
        steps = st.steps
        if indices is None:
            idx: slice | np.ndarray = slice(0, steps)
            n = steps
        else:
            idx, n, _ = normalize_indices(indices, steps)
        if st.dropped is None and self.lazy and (st.n_dropped or not n or _whole(idx, n, steps)):
            # stays uniform: nothing dropped, or everything (already, or now)
            newly = steps - st.n_dropped if n else 0
            st.n_dropped += newly
        else:
            if st.dropped is None:  # the first partial drop (any first drop when not lazy)
                st.dropped = np.zeros(steps, np.bool_)
            st.dropped[idx] = True
            now = int(np.count_nonzero(st.dropped))
            newly = now - st.n_dropped
            st.n_dropped = now
        tally[reason] = tally.get(reason, 0) + newly
        self._live_steps -= newly
        return newly

    # --- failures ------------------------------------------------------------------------------

    def lost(self, chunk_id: Hashable, t: float, reason: str = "plane restart") -> int:
        """The memory holding the chunk is gone (its plane failed): its still-deliverable samples
        are counted in ``lost_samples[reason]`` (the chunk in ``lost_chunks[reason]`` if it had any),
        never as a violation, and the chunk leaves the plane. Still deliverable means, under OnPolicy
        and BoundedStaleness, never delivered and never dropped; under Replay, not dropped (a replay
        sample can be drawn again). Returns the samples counted; 0 for an unknown or retired chunk."""
        self._check_open()
        self._t = t
        st = self._chunks.get(chunk_id)
        if st is None or st.removed:
            return 0
        if self._tracked:
            mask = st.unused_mask()
            n = int(np.count_nonzero(mask))
            if n:
                indices = None if n == st.steps else np.flatnonzero(mask)
                n = self._drop(chunk_id, reason, indices, self._lost_samples)
        else:
            n = self._drop(chunk_id, reason, None, self._lost_samples)
        if n:
            self._lost_chunks[reason] = self._lost_chunks.get(reason, 0) + 1
        self.evicted(chunk_id, t)
        return n

    def restarted(self, t: float, lost: Iterable[Hashable], keep: Mapping[Hashable, str],
                  reason: str = "plane restart") -> int:
        """The plane's process died and a new one took over: ``lost`` chunks are counted as
        :meth:`lost`; every byte the auditor had in a tier is gone from it, except the chunks of
        ``keep`` (chunk id -> the durable tier whose bytes survived and were taken over again).
        Returns the samples counted lost."""
        self._check_open()
        self._t = t
        self._restarts += 1
        n = sum(self.lost(cid, t, reason) for cid in list(lost))
        for cid, tiers in list(self._residency.items()):
            for tier in list(tiers):
                if keep.get(cid) != tier:
                    self.evicted(cid, t, tier)
        return n

    def live_chunks(self) -> list[tuple[Hashable, int, int, int]]:
        """``(chunk_id, steps, version, still-deliverable samples)`` of every chunk that has not
        left the plane, in ingestion order (what a restarted plane must account for)."""
        out = []
        for cid, st in self._chunks.items():
            if st.removed:
                continue
            n = st.unused_count() if self._tracked else st.steps - st.n_dropped
            out.append((cid, st.steps, st.version, n))
        return out

    @property
    def last_consumed(self) -> int | None:
        """The latest update reported consumed (None before the first)."""
        return self._max_consumed

    @property
    def replay_counts(self) -> tuple[int, int]:
        """Replay: cumulative ``(inserted, sampled)`` steps, the rate limiter's counts."""
        return self._inserted, self._sampled

    # --- lost samples --------------------------------------------------------------------------

    def _settle(self, st: _ChunkState, why: str) -> None:
        """Close the chunk's books: its never-delivered, never-dropped samples are lost."""
        st.settled = True
        lost = st.unused_count()
        if lost:
            message = None
            if self._wants_example(ViolationKind.LOST):
                first = st.unused_head()
                message = (
                    f"{lost} samples of chunk {st.id!r} {_describe(first)} (version "
                    f"{st.version}) were never delivered nor dropped, and {why}"
                )
            self._violate(ViolationKind.LOST, lost, message)

    def _resident(self, cid: Hashable, st: _ChunkState) -> bool:
        if st.removed:
            return False
        tiers = self._residency.get(cid)
        return tiers is None or bool(tiers)  # never placed: still where ingestion put it

    # --- checkpoints ---------------------------------------------------------------------------

    CARRIED_COUNTERS = (
        "_ingested_chunks", "_ingested_samples", "_ingested_bytes", "_deliveries", "_delivered_samples",
        "_delivered_bytes", "_updates_consumed", "_max_consumed", "_checksums_verified", "_t",
        "_inserted", "_sampled", "_in_band", "_out_of_band_events",
    )
    """The scalar counts a checkpoint carries to the restored run's auditor (see :meth:`carry`)."""

    def carry(self, kept: Iterable[Hashable], reason: str, t: float) -> dict[str, Any]:
        """The audit as a checkpoint carries it: every count so far, plus, as drops with ``reason``,
        the live samples of every chunk not in ``kept`` (the chunks the checkpoint does not hold).

        The restored run's story forks here: chunks ``kept`` are re-registered there as live
        (:meth:`resume`); every other sample that was live is, in that story, dropped on purpose at
        the checkpoint, and counted under ``reason`` — never silent, never a violation. This
        auditor itself is not changed (the original run goes on).
        """
        kept = set(kept)
        dropped = dict(self._dropped)
        n = 0
        for cid, st in self._chunks.items():
            if st.removed or cid in kept:
                continue
            n += st.unused_count() if self._tracked else st.steps - st.n_dropped
        if n:
            dropped[reason] = dropped.get(reason, 0) + n
        return {
            "contract": self.contract.to_dict(),
            "counts": {k.value: v for k, v in self._counts.items()},
            "examples": {k.value: list(v) for k, v in self._examples.items()},
            "dropped": dropped,
            "peak": dict(self._peak),
            **{name.lstrip("_"): getattr(self, name) for name in self.CARRIED_COUNTERS},
        }

    def resume(self, state: Mapping[str, Any], chunks: Iterable[Chunk], *, rate: bool = True) -> None:
        """Continue the audit of a checkpoint (:meth:`carry`) in this fresh auditor.

        Every count carries over. ``chunks`` (the chunks the checkpoint held, now back in the
        plane) are live again without being ingested a second time: their samples may be
        delivered, evicted or dropped as before the checkpoint. With ``rate=False`` the Replay rate
        band starts again from zero (the restored table is empty and warms up again, as the
        plane's limiter does). Only a fresh auditor (no event yet) may resume.
        """
        if self._chunks or self._ingested_chunks or self._deliveries or self._final is not None:
            raise ConduitError("auditor: resume() needs a fresh auditor (events were already recorded)")
        contract = contract_from_dict(state["contract"])
        if contract != self.contract:
            raise ConduitError(f"auditor: the checkpoint's contract {contract!r} is not this auditor's "
                               f"{self.contract!r}")
        chunks = list(chunks)
        if chunks and self._tracked:
            raise ConduitError(f"auditor: a {self.contract.kind} checkpoint carries no chunks (in-flight data "
                               "is dropped at the checkpoint)")
        for name in self.CARRIED_COUNTERS:
            setattr(self, name, state[name.lstrip("_")])
        for kind, n in state["counts"].items():
            self._counts[ViolationKind(kind)] = int(n)
        for kind, msgs in state["examples"].items():
            self._examples[ViolationKind(kind)] = list(msgs)[:MAX_EXAMPLES]
        self._dropped = {str(k): int(v) for k, v in state["dropped"].items()}
        self._peak = {str(k): int(v) for k, v in state["peak"].items()}
        if not rate:
            self._inserted = self._sampled = 0
            self._in_band = True
        for chunk in chunks:
            if chunk.id in self._chunks:
                raise ConduitError(f"auditor: chunk {chunk.id!r} resumed twice")
            st = _ChunkState(chunk, self._tracked, self.lazy)
            self._chunks[chunk.id] = st
            if self._on_policy:  # pragma: no cover - tracked contracts carry no chunks (refused above)
                self._by_version.setdefault(st.version, {})[chunk.id] = st
            self._live_steps += st.steps

    # --- results -------------------------------------------------------------------------------

    def report(self) -> AuditReport:
        """The counts so far (lost samples only where already certain; see :meth:`finish`)."""
        if self._final is not None:
            return self._final
        return self._build(finished=False, unused_resident=0)

    def finish(self, t: float) -> AuditReport:
        """Close out the lost-sample checks and return the final report (idempotent)."""
        if self._final is not None:
            return self._final
        self._t = max(self._t, t)
        unused_resident = 0
        if self._tracked:
            cutoff = self._max_consumed if self._on_policy else None
            for cid, st in self._chunks.items():
                if st.settled or st.removed:
                    continue
                if cutoff is not None and st.version <= cutoff:
                    self._settle(st, f"update {st.version} was already consumed at finish")
                elif not self._resident(cid, st):
                    self._settle(st, f"it is resident in no tier at finish (t={t:g})")
                else:
                    unused_resident += st.unused_count()
        self._final = self._build(finished=True, unused_resident=unused_resident)
        return self._final

    def _build(self, finished: bool, unused_resident: int) -> AuditReport:
        by_kind = {k.value: v for k, v in self._counts.items()}
        return AuditReport(
            contract=self.contract.to_dict(),
            violations=sum(by_kind.values()),
            by_kind=by_kind,
            examples={k.value: list(v) for k, v in self._examples.items()},
            ingested_chunks=self._ingested_chunks,
            ingested_samples=self._ingested_samples,
            ingested_bytes=self._ingested_bytes,
            deliveries=self._deliveries,
            delivered_samples=self._delivered_samples,
            delivered_bytes=round(self._delivered_bytes),
            dropped_samples=dict(self._dropped),
            updates_consumed=self._updates_consumed,
            unused_resident_samples=unused_resident,
            checksums_verified=self._checksums_verified,
            out_of_band_events=self._out_of_band_events,
            peak_occupancy=dict(self._peak),
            finished=finished,
            t=self._t,
            drawn_samples=self._drawn_samples,
            restarts=self._restarts,
            lost_chunks=dict(self._lost_chunks),
            lost_samples=dict(self._lost_samples),
        )

    def occupancy(self, tier: str) -> int:
        """Bytes the event stream says ``tier`` holds now."""
        return self._occupancy.get(tier, 0)


_REMOVED = attrgetter("removed")
_N_DROPPED = attrgetter("n_dropped")
_STEPS = attrgetter("steps")
_BYTES_PER_STEP = attrgetter("bytes_per_step")


def _runs(chunk_ids: Sequence[Hashable], counts: Any, rows: Any) -> tuple[np.ndarray, np.ndarray]:
    """Check and normalise a draw's runs: ``counts`` non-negative, one per chunk id, summing to the rows."""
    counts = np.asarray(counts, np.int64).reshape(-1)
    rows = np.asarray(rows)
    if rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iu"):
        raise ConduitError(f"auditor: a draw's rows must be a 1-D integer array, got {rows.dtype} {rows.shape}")
    rows = rows.astype(np.intp, copy=False)
    if len(counts) != len(chunk_ids) or int(counts.sum()) != rows.size or (counts < 0).any():
        raise ConduitError(f"auditor: {len(chunk_ids)} chunk ids, {len(counts)} run counts (sum "
                           f"{int(counts.sum())}) and {rows.size} rows do not spell a draw")
    return counts, rows


def runs_to_selections(chunk_ids: Sequence[Hashable], counts: Any, rows: Any) -> list[tuple[Hashable, np.ndarray]]:
    """The ``(chunk_id, rows)`` selections that runs spell (see :meth:`Auditor.drawn_runs`)."""
    counts = np.asarray(counts, np.int64)
    if not len(counts):
        return []
    return list(zip(chunk_ids, np.split(np.asarray(rows), np.cumsum(counts)[:-1]), strict=True))


def _need(value: Any, name: str) -> Any:
    if value is None:
        raise ConduitError(f"auditor: event is missing its {name!r} field")
    return value
