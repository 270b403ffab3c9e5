"""Recovery after the plane's process dies: what survives, what is taken over again, what is lost.

A plane keeps its chunks in memory tiers; most are volatile (pageable, pinned, device memory) and
die with the process. Two things must outlive it for a restart to be truthful:

* **the audit's record** - every event the auditor heard, so that the new incarnation continues the
  same audit (what was ingested, delivered, dropped, consumed; the Replay rate limiter's counts;
  the violations so far) rather than starting a new one that forgets what happened;
* **the durable tier's index** - which chunk's bytes sit where in the spill file (NVMe tier), so
  that those chunks can be taken over again instead of being lost.

Both go to one :class:`RecoveryLog`: an append-only file of records in a directory on the plane's
node, written (one ``write`` call per record, under the plane's lock) *before* the event takes
effect in memory, plus a periodic snapshot that bounds its size. A record reaches the kernel
before the call that caused it returns, so it survives the death of the process (what this
module recovers from); it is not ``fsync``'ed per record, so a machine crash may lose the tail,
but a machine crash also takes the node and the plane with it. Snapshots are ``fsync``'ed and
renamed into place, and name the journal generation they cover, so a death at any point of a
compaction leaves one consistent state (snapshot + the journal after it).

:class:`JournaledAuditor` is an :class:`~conduit.audit.Auditor` whose every event is recorded
first. :func:`plan_recovery` is the decision: given the chunks the recovered audit says are still
in the plane and the chunks the durable index lists, which are taken over again, which are lost
(counted by the auditor with the reason ``"plane restart"``, never a violation), which durable
entries are stale and discarded, and, for OnPolicy, how many samples of each not-yet-trained
version can no longer arrive (the batch of that version is assembled short by that many).
Backends call these; neither backend is imported here.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conduit.audit import Auditor
from conduit.errors import ConduitError

REASON = "plane restart"
"""The reason under which a restart's losses are counted (``lost_samples`` / ``lost_chunks``)."""

_SNAPSHOT = "snapshot.pkl"


class RecoveryLog:
    """An append-only record log with snapshots, in ``directory`` (created if missing).

    :meth:`load` returns what a previous incarnation left: the latest snapshot's state (or None)
    and the records appended after it, in order (a record torn by the death of the writer ends
    the list). :meth:`append` adds a record; :meth:`compact` replaces snapshot + journal by one
    snapshot of the given state. Records and states are pickled: only the plane's own process
    writes them, on its own node.
    """

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None
        self._gen = 0
        self.records_since_snapshot = 0

    def _journal(self, gen: int) -> Path:
        return self.dir / f"journal.{gen}"

    def load(self) -> tuple[Any, list[Any]]:
        """``(state of the latest snapshot or None, records appended after it)``; opens the log for appending."""
        state, gen = None, 0
        snap = self.dir / _SNAPSHOT
        if snap.exists():
            with snap.open("rb") as f:
                gen, state = pickle.load(f)
        records: list[Any] = []
        path = self._journal(gen)
        if path.exists():
            with path.open("rb") as f:
                while True:
                    try:
                        records.append(pickle.load(f))
                    except EOFError:
                        break
                    except Exception:  # noqa: BLE001 - a record torn by the writer's death: the end
                        break
        self._gen = gen
        self._open(gen, truncate=False)
        self.records_since_snapshot = len(records)
        return state, records

    def _open(self, gen: int, truncate: bool) -> None:
        if self._fd is not None:
            os.close(self._fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
        self._fd = os.open(self._journal(gen), flags, 0o600)

    def append(self, record: Any) -> None:
        """Record one event (one ``write``: it reaches the kernel before this returns)."""
        if self._fd is None:
            self._open(self._gen, truncate=False)
        os.write(self._fd, pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))
        self.records_since_snapshot += 1

    def compact(self, state: Any) -> None:
        """Snapshot ``state`` (everything the records so far built) and start an empty journal."""
        gen = self._gen + 1
        tmp = self.dir / (_SNAPSHOT + ".tmp")
        with tmp.open("wb") as f:
            pickle.dump((gen, state), f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        self._open(gen, truncate=True)  # the new generation's journal exists (empty) before the snapshot names it
        os.replace(tmp, self.dir / _SNAPSHOT)
        with contextlib.suppress(OSError):
            dfd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        with contextlib.suppress(FileNotFoundError):
            self._journal(self._gen).unlink()
        self._gen = gen
        self.records_since_snapshot = 0

    def close(self, remove: bool = False) -> None:
        """Stop appending; with ``remove``, delete the directory's log files (a clean shutdown)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if remove:
            for p in [*self.dir.glob("journal.*"), self.dir / _SNAPSHOT, self.dir / (_SNAPSHOT + ".tmp")]:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()


_EVENTS = ("ingested", "placed", "moved", "drawn", "delivered", "drawn_runs", "delivered_runs", "consumed", "evicted",
           "dropped", "lost", "restarted")
#: the events whose selections are packed into one record, and the position of the selections argument
_SELECTIONS_ARG = {"delivered": 1, "drawn": 0}


class JournaledAuditor(Auditor):
    """An :class:`~conduit.audit.Auditor` whose events are recorded in a log before they apply.

    ``sink(record)`` receives ``("audit", method, args)`` for every event; :func:`replay_audit`
    applies such records to an auditor restored from a snapshot (:meth:`state` /
    :meth:`from_state`), giving the auditor the dead incarnation had. Each event is recorded once
    (an event method called by another one, like :meth:`lost` calling :meth:`evicted`, records only
    the outer call, whose replay repeats the inner one)."""

    def __init__(self, contract: Any, tier_capacities: Mapping[str, int] | None = None,
                 sink: Callable[[Any], None] | None = None, *, retired_window: int | None = None):
        super().__init__(contract, tier_capacities, retired_window=retired_window)
        self._sink = sink
        self._depth = 0

    def attach(self, sink: Callable[[Any], None] | None) -> None:
        self._sink = sink

    def state(self) -> dict[str, Any]:
        """The auditor's state, picklable (without its sink)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_sink", "_depth")}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], sink: Callable[[Any], None] | None = None) -> JournaledAuditor:
        aud = cls.__new__(cls)
        aud.__dict__.update(state)
        aud._sink, aud._depth = sink, 0
        return aud


def _pack_selections(selections: Iterable[tuple[Hashable, Any]]) -> tuple:
    """A delivery's selections in a compact record: ids, and index arrays as one concatenated array
    (pickling a replay batch's dozens of small arrays one by one costs several times more)."""
    ids, kinds, arrays = [], [], []
    for cid, idx in selections:
        ids.append(cid)
        if isinstance(idx, range):
            kinds.append((idx.start, idx.stop, idx.step))
        elif isinstance(idx, np.ndarray) and idx.ndim == 1 and idx.dtype.kind in "iu":
            kinds.append(len(idx))
            arrays.append(idx)
        else:
            kinds.append(("raw", idx))
    flat = np.concatenate(arrays).astype(np.int64, copy=False) if arrays else np.empty(0, np.int64)
    return ("packed", ids, kinds, flat)


def _unpack_selections(packed: tuple) -> list[tuple[Hashable, Any]]:
    _, ids, kinds, flat = packed
    out, pos = [], 0
    for cid, kind in zip(ids, kinds, strict=True):
        if isinstance(kind, int):
            out.append((cid, flat[pos:pos + kind]))
            pos += kind
        elif kind[0] == "raw":
            out.append((cid, kind[1]))
        else:
            out.append((cid, range(*kind)))
    return out


def _journaled(name: str) -> Callable:
    base = getattr(Auditor, name)

    def method(self: JournaledAuditor, *args: Any, **kwargs: Any) -> Any:
        if self._depth == 0 and self._sink is not None and self._final is None:
            rec = args
            at = _SELECTIONS_ARG.get(name)
            if at is not None and len(args) > at and not kwargs:
                rec = (*args[:at], _pack_selections(args[at]), *args[at + 1:])
            self._sink(("audit", name, rec, kwargs))  # recorded before it applies
        self._depth += 1
        try:
            return base(self, *args, **kwargs)
        finally:
            self._depth -= 1

    method.__name__ = name
    method.__doc__ = base.__doc__
    return method


for _name in _EVENTS:
    setattr(JournaledAuditor, _name, _journaled(_name))


def replay_audit(auditor: Auditor, records: Iterable[Any]) -> int:
    """Apply the ``("audit", ...)`` records (others are skipped) to ``auditor``; returns how many."""
    n = 0
    sink = getattr(auditor, "_sink", None)
    if isinstance(auditor, JournaledAuditor):
        auditor._sink = None  # replayed events are in the log already
    try:
        for rec in records:
            if not (isinstance(rec, tuple) and rec and rec[0] == "audit"):
                continue
            _, name, args, kwargs = rec
            if name not in _EVENTS:
                raise ConduitError(f"recovery log: unknown audit event {name!r}")
            at = _SELECTIONS_ARG.get(name)
            if at is not None and len(args) > at and isinstance(args[at], tuple) and args[at][:1] == ("packed",):
                args = (*args[:at], _unpack_selections(args[at]), *args[at + 1:])
            getattr(Auditor, name)(auditor, *args, **kwargs)
            n += 1
    finally:
        if isinstance(auditor, JournaledAuditor):
            auditor._sink = sink
    return n


# ------------------------------------------------------------------------------------------- the decision
@dataclass(frozen=True)
class DurableChunk:
    """A durable tier's index entry: the chunk's bytes are at ``offset`` of ``tier`` (``steps`` rows)."""

    chunk_id: Hashable
    tier: str
    offset: int
    steps: int
    extra: Any = None  # what the backend needs to take it over (metadata, annotation, ...)


@dataclass
class RecoveryPlan:
    """What a restarted plane does with what it finds (see :func:`plan_recovery`)."""

    restore: list[DurableChunk] = field(default_factory=list)  # taken over again, in ingestion order
    lost: list[Hashable] = field(default_factory=list)  # counted lost by the auditor
    discard: list[DurableChunk] = field(default_factory=list)  # durable bytes no live chunk needs
    lost_samples: int = 0
    shortfall: dict[int, int] = field(default_factory=dict)  # OnPolicy: version -> samples that cannot arrive


def plan_recovery(live: Iterable[tuple[Hashable, int, int, int]], durable: Mapping[Hashable, DurableChunk], *,
                  whole_only: bool, by_version: bool, next_update: int = 0) -> RecoveryPlan:
    """Decide, after a restart, the fate of every chunk the recovered audit says is in the plane.

    ``live`` is :meth:`Auditor.live_chunks <conduit.audit.Auditor.live_chunks>`: ``(chunk_id,
    steps, version, still-deliverable samples)``. ``durable`` maps chunk ids to their entries in a
    durable tier's index. A live chunk is **restored** when its bytes are in a durable tier (same
    number of rows) and, with ``whole_only`` (OnPolicy, BoundedStaleness: each sample is delivered
    once, and a restored chunk starts again from its first row), none of its samples was delivered
    or dropped yet; under Replay any live chunk in a durable tier is restored (samples are drawn
    with replacement). Every other live chunk is **lost**: the memory holding it (or the batch it
    was being assembled into) died with the process. A durable entry for a chunk that is not
    restored is **discarded** (its bytes are garbage: the chunk left the plane before the death,
    or cannot be taken over). With ``by_version`` (OnPolicy), ``shortfall[k]`` is how many samples of
    version ``k >= next_update`` were lost: batch *k* can never have them.
    """
    plan = RecoveryPlan()
    restored: set[Hashable] = set()
    for cid, steps, version, deliverable in live:
        entry = durable.get(cid)
        if entry is not None and entry.steps == steps and (not whole_only or deliverable == steps):
            plan.restore.append(entry)
            restored.add(cid)
            continue
        plan.lost.append(cid)
        plan.lost_samples += deliverable
        if by_version and version >= next_update and deliverable:
            plan.shortfall[version] = plan.shortfall.get(version, 0) + deliverable
    plan.discard = [e for cid, e in durable.items() if cid not in restored]
    return plan


__all__ = ["REASON", "DurableChunk", "JournaledAuditor", "RecoveryLog", "RecoveryPlan", "plan_recovery",
           "replay_audit"]
