"""Batches: what a learner receives from the plane, assembled in its device memory.

A batch is built in one extent of the learner's device tier (CUDA memory, or host memory for a CPU
learner), in the columnar layout the update consumes: chunks are copied into row ranges of it as
they arrive (or, when placement puts a chunk on the learner's device and a batch is open, written
there at ingestion, with no other copy). When its rows are all filled it becomes **ready**; the
learner gets it from :meth:`~conduit.runtime.plane.ExperiencePlane.next_batch` and gives it back with
:meth:`Batch.release`, which returns the extent to the tier and, under ``OnPolicy``, closes update
*k*'s books.

``selections`` names every sample a batch carries as ``(chunk_id, indices)``, in row order, so
sample identity survives the trip: row ``r`` of every column is sample ``selections``' r-th entry.
``annotations`` carries, per chunk with rows in the batch, the small object its producer attached at
ingestion (:meth:`~conduit.runtime.plane.ExperiencePlane.ingest`'s ``annotation``; chunks without one
are left out).

**Streaming.** Copies into a batch finish out of order; a build tracks its **filled prefix**, the
largest ``prefix`` with rows ``[0, prefix)`` all written. A learner may read that prefix while the
rest is still arriving (:meth:`~conduit.runtime.plane.ExperiencePlane.peek`, which returns a
:class:`Peek`); a ready batch has ``prefix == rows``.

**Copies in flight.** A build counts the copies still writing into its extent (``inflight``). A build
that is released or discarded while some run is marked ``dead`` and its memory goes back to the tier
only when the last of them ends, so a late copy can never land in a batch that reuses the memory.
A copy that fails before it lands gives its rows back (:meth:`BatchBuild.give_back`): they become a
**hole** that the next reservation fills first, so one failed ingest does not strand a batch.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from conduit._extras import require
from conduit.audit import runs_to_selections

if TYPE_CHECKING:
    from conduit.runtime.plane import ExperiencePlane
    from conduit.runtime.tiers import Extent

_ids = itertools.count()


@dataclass(eq=False)
class BatchBuild:
    """A batch being assembled: rows reserved by copies in flight, rows filled by finished ones."""

    learner: str
    key: int  # OnPolicy: the policy version (= update) it serves; otherwise an arrival sequence
    extent: Extent
    rows: int
    reserved: int = 0  # rows [0, reserved) are reserved, except the holes
    filled: int = 0
    prefix: int = 0  # rows [0, prefix) are all filled
    landed: dict[int, int] = field(default_factory=dict)  # finished copies beyond the prefix: start -> rows
    selections: list[tuple[Hashable, range | np.ndarray]] = field(default_factory=list)
    created: list[float] = field(default_factory=list)  # t_created of every chunk it holds
    versions: list[int] = field(default_factory=list)
    whole: set[Hashable] = field(default_factory=set)  # chunks carried whole, in one range
    annotations: dict[Hashable, Any] = field(default_factory=dict)  # chunk id -> its producer's annotation
    t_ready: float | None = None
    replay_ids: np.ndarray | None = None  # Replay: the sampler id of every row (for priority updates)
    weights: np.ndarray | None = None  # Replay: every row's importance weight (1 when uniform)
    # Replay: the draw as runs (chunk ids, rows per run, all rows, t_created and version per run) instead
    # of ``selections``/``created``/``versions``, which a Batch spells out only if they are read
    runs: tuple[list[Hashable], np.ndarray, np.ndarray, list[float], list[int]] | None = None
    id: tuple[str, str, int] = field(default_factory=lambda: ("batch", "", next(_ids)))
    starts: list[int] = field(default_factory=list)  # first row of each selection (ascending, parallel to it)
    holes: list[tuple[int, int]] = field(default_factory=list)  # (start, rows) given back below ``reserved``
    inflight: int = 0  # copies still writing into ``extent``
    dead: str | None = None  # why it left (released, discarded as stale...); its copies only let go
    freed: bool = False  # its extent went back to the tier

    def reserve(self, n: int) -> int:
        """Reserve up to ``n`` rows at the end; returns the first row reserved (the caller copies
        into ``[start, start + granted)``, granted = min(n, rows left at the end))."""
        start = self.reserved
        self.reserved += min(n, self.rows - self.reserved)
        return start

    def take(self, n: int, whole: bool = False) -> tuple[int, int]:
        """Reserve up to ``n`` contiguous rows (exactly ``n`` with ``whole``), a hole first, else at
        the end. Returns ``(start, granted)``; ``granted`` is 0 when nothing fits."""
        for i, (start, size) in enumerate(self.holes):
            if size >= n or (size and not whole):
                granted = min(n, size)
                if granted == size:
                    del self.holes[i]
                else:
                    self.holes[i] = (start + granted, size - granted)
                return start, granted
        tail = self.rows - self.reserved
        if whole and tail < n:
            return self.reserved, 0
        return self.reserve(n), min(n, tail)

    def can_take(self, n: int) -> bool:
        """Whether ``n`` contiguous rows are free (a hole or the end)."""
        return self.rows - self.reserved >= n or any(size >= n for _, size in self.holes)

    def give_back(self, start: int, n: int) -> None:
        """Rows ``[start, start + n)`` were reserved but their copy never landed: free them again."""
        if start + n == self.reserved:
            self.reserved = start
            while self.holes and sum(self.holes[-1]) == self.reserved:
                self.reserved = self.holes.pop()[0]
        else:
            bisect.insort(self.holes, (start, n))

    def add(self, start: int, chunk_id: Hashable, indices: range | np.ndarray, t_created: float,
            version: int) -> None:
        """Record that rows from ``start`` carry ``indices`` of the chunk (kept in row order)."""
        i = bisect.bisect(self.starts, start)
        self.starts.insert(i, start)
        self.selections.insert(i, (chunk_id, indices))
        self.created.insert(i, t_created)
        self.versions.insert(i, version)

    def add_in_order(self, starts: list[int], selections: list[tuple[Hashable, range | np.ndarray]],
                     created: list[float], versions: list[int]) -> None:
        """Record many selections at once, ``starts`` ascending and after every row recorded so far
        (a replay batch's draws, grouped by chunk in row order): :meth:`add` without the searches."""
        if self.starts and starts and starts[0] <= self.starts[-1]:
            raise ValueError("add_in_order: selections must come after the ones recorded")
        self.starts.extend(starts)
        self.selections.extend(selections)
        self.created.extend(created)
        self.versions.extend(versions)

    def withdraw(self, start: int) -> tuple[Hashable, range | np.ndarray]:
        """Forget the selection recorded at ``start`` (its copy failed); returns it."""
        i = self.starts.index(start)
        del self.starts[i], self.created[i], self.versions[i]
        return self.selections.pop(i)

    def fill(self, start: int, n: int) -> None:
        """The copy into rows ``[start, start + n)`` finished: count it and advance the filled prefix."""
        self.filled += n
        if n <= 0:
            return
        if start != self.prefix:
            self.landed[start] = n
            return
        self.prefix += n
        while self.prefix in self.landed:
            self.prefix += self.landed.pop(self.prefix)

    @property
    def free_rows(self) -> int:
        return self.rows - self.reserved + sum(size for _, size in self.holes)

    @property
    def complete(self) -> bool:
        return self.filled >= self.rows


class Batch:
    """A ready batch handed to a learner. Use as a context manager or call :meth:`release`."""

    def __init__(self, plane: ExperiencePlane, build: BatchBuild, update: int, columns: dict[str, Any]):
        self._plane = plane
        self._build = build
        self.learner = build.learner
        self.update = update
        self.steps = build.filled
        self.columns = columns
        self._runs = build.runs
        if build.runs is None:
            self._selections: list[tuple[Hashable, range | np.ndarray]] | None = list(build.selections)
            self.versions = list(build.versions)
            self.created = list(build.created)  # t_created of every chunk the batch carries
        else:  # a replay draw: its selections are spelled out from the runs when first read
            self._selections = None
            self.versions = list(build.runs[4])
            self.created = list(build.runs[3])
        self.annotations = dict(build.annotations)  # chunk id -> annotation, for chunks that have one
        self.t_ready = build.t_ready
        #: Replay: each row's sampler id (hand it back with priorities to
        #: :meth:`~conduit.runtime.plane.ExperiencePlane.update_priorities`); None otherwise
        self.replay_ids = build.replay_ids
        #: Replay: each row's importance weight (all 1 for a uniform sampler); None otherwise
        self.weights = build.weights
        self.released = False

    @property
    def selections(self) -> list[tuple[Hashable, range | np.ndarray]]:
        """Every sample the batch carries as ``(chunk_id, indices)``, in row order (see the module doc)."""
        if self._selections is None:
            cids, counts, rows = self._runs[:3]
            self._selections = runs_to_selections(cids, counts, rows)
        return self._selections

    def tensors(self) -> dict[str, Any]:
        """The columns as torch tensors (zero copy: numpy host arrays are wrapped, not copied)."""
        torch = require("torch", "Batch.tensors()")

        return {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in self.columns.items()}

    def sample_ids(self) -> list[tuple[Hashable, int]]:
        """Every sample of the batch, in row order (tests and small tools)."""
        return [(cid, int(i)) for cid, idx in self.selections for i in idx]

    def release(self) -> None:
        """The learner is done with the batch: its memory goes back to the tier."""
        if not self.released:
            self.released = True
            first = next(iter(self.columns.values()), None)
            if first is not None and not isinstance(first, np.ndarray) and first.is_cuda:
                import torch

                # the learner's kernels may still read the batch: its memory is reused only after
                torch.cuda.current_stream(first.device).synchronize()
            self._plane._release(self._build, self.update)
            self.columns = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Batch(learner={self.learner!r}, update={self.update}, steps={self.steps})"


@dataclass
class Peek:
    """Rows ``[start, stop)`` of a learner's next batch, read while the batch may still be assembling.

    ``columns`` hold exactly those rows (in-process: views into the batch under assembly, valid until
    the batch is released; through a plane actor: host copies). ``selections`` name the same rows in
    row order (a selection cut by ``start`` or ``stop`` is split), and ``annotations`` the chunks they
    come from that carry one. ``rows`` is the batch size and ``complete`` says whether the batch has
    all its rows, so a reader is done once ``complete and stop == rows``. ``update`` is the batch's
    update under ``OnPolicy`` and the plane's policy version at the time of the peek otherwise. An
    empty peek (``stop == start``) means nothing new arrived within the timeout.
    """

    update: int
    start: int
    stop: int
    columns: dict[str, Any]
    selections: list[tuple[Hashable, range | np.ndarray]]
    annotations: dict[Hashable, Any]
    complete: bool
    rows: int
    incarnation: int = 0  # through a plane actor: which incarnation of the plane answered

    @property
    def steps(self) -> int:
        """Rows in this peek."""
        return self.stop - self.start

    @property
    def done(self) -> bool:
        """Every row of the batch has been read (this peek reaches its end)."""
        return self.complete and self.stop >= self.rows

    def sample_ids(self) -> list[tuple[Hashable, int]]:
        """The samples of rows ``[start, stop)``, in row order."""
        return [(cid, int(i)) for cid, idx in self.selections for i in idx]


def slice_selections(selections: list[tuple[Hashable, range | np.ndarray]], start: int,
                     stop: int) -> list[tuple[Hashable, range | np.ndarray]]:
    """The part of ``selections`` (in row order, from row 0) that covers rows ``[start, stop)``."""
    out = []
    row = 0
    for cid, idx in selections:
        n = len(idx)
        lo, hi = max(start, row), min(stop, row + n)
        if lo < hi:
            out.append((cid, idx if (lo, hi) == (row, row + n) else idx[lo - row : hi - row]))
        row += n
        if row >= stop:
            break
    return out
