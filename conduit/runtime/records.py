"""The runtime plane's records: a chunk inside the plane, one ingest's reservations, a learner's
assembly state, one copy segment; and the argument checks every blocking call shares."""

from __future__ import annotations

import math
import numbers
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conduit.chunk import Chunk
from conduit.errors import ConduitError
from conduit.runtime.batch import BatchBuild
from conduit.runtime.tiers import Extent, RuntimeTier
from conduit.runtime.view import LearnerModel


class DeliveryTimeout(ConduitError, TimeoutError):
    """A learner waited longer than its timeout for a batch; names what was missing."""


def _timeout_arg(name: str, value: Any) -> float | None:
    """A timeout argument: ``None`` (wait until close()) or a finite number of seconds >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConduitError(f"{name} must be a number of seconds or None (wait until close()), got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ConduitError(f"{name} must be a finite number of seconds >= 0, or None to wait until close(); "
                           f"got {value!r}")
    return seconds


def _deadline(timeout: float | None) -> float:
    return math.inf if timeout is None else time.monotonic() + timeout


def _secs(timeout: float | None) -> str:
    return "until close()" if timeout is None else f"{timeout:g} s"


@dataclass(eq=False)
class _Chunk:
    """A chunk inside the plane: its metadata, where its bytes are, how much of it is handed out."""

    meta: Chunk
    learner: str | None
    extent: Extent | None
    next_row: int = 0  # rows [0, next_row) have gone into batches (or were dropped)
    busy: int = 0  # copies in flight reading its extent
    builds: int = 0  # batches holding some of its rows, not yet released
    annotation: Any = None  # the producer's small object travelling with the chunk (never in a tier)
    first_id: int = -1  # Replay: the sampler id of its row 0 (row r is first_id + r); -1 outside the table
    _views: tuple[Extent, dict[str, Any]] | None = None  # column views of ``extent``, made on first use

    def columns(self) -> dict[str, Any]:
        """Column views of the chunk's extent (cached until the chunk moves to another extent)."""
        cached = self._views
        if cached is None or cached[0] is not self.extent:
            cached = self._views = (self.extent, self.extent.columns())
        return cached[1]

    @property
    def tier(self) -> str | None:
        return self.extent.tier.id if self.extent is not None else None

    @property
    def remaining(self) -> int:
        return self.meta.steps - self.next_row


@dataclass(eq=False)
class _Segment:
    """Rows ``[first, first + n)`` of a chunk copied into rows ``[start, start + n)`` of a batch."""

    chunk: _Chunk
    build: BatchBuild
    first: int
    start: int
    n: int


@dataclass(eq=False)
class _Admission:
    """What one ingest holds before it commits, so that a failure gives all of it back."""

    chunk: _Chunk
    table_steps: int = 0  # Replay: room reserved in the table (counted in ``_inserting`` too)
    build: BatchBuild | None = None  # the batch its one copy writes into, rows [start, start + steps)
    start: int = 0


@dataclass(eq=False)
class _Learner:
    model: LearnerModel
    device: str  # "cpu" or "cuda:N"
    tier: RuntimeTier  # where its batches are assembled
    rows: int  # batch size in samples
    pending: deque = field(default_factory=deque)  # _Chunk with rows still to hand out
    builds: dict[int, BatchBuild] = field(default_factory=dict)
    ready: deque = field(default_factory=deque)
    next_update: int = 0
    seq: int = 0
    opened: set = field(default_factory=set)  # OnPolicy: versions that already had their batch opened
    peeking: int = 0  # peek() calls blocked now: the learner is waiting for rows, as in next_batch
    peeked: BatchBuild | None = None  # the batch peek() chose: next_batch hands over this one next
    sizes: dict[int, int] = field(default_factory=dict)  # OnPolicy: rows announced by size_batch, per update

    @property
    def asking(self) -> bool:
        """The learner waits for rows now (in next_batch or peek)."""
        return self.model.waiting or self.peeking > 0


def _host(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.cpu().numpy()
