"""Experience chunks, sample identities and selections.

A **chunk** is the unit an actor hands to Conduit: a rollout fragment of ``steps`` consecutive
environment steps, produced by one policy version. A **sample** is one step of a chunk and is named
``(chunk_id, index)`` with ``0 <= index < steps``; that identity must survive every move, copy and
spill, because the data contracts (:mod:`conduit.contracts`) and the auditor
(:mod:`conduit.audit`) reason about samples, not bytes.

A **selection** says which samples of one chunk a delivery carries: ``(chunk_id, indices)``, where
``indices`` is a ``range``, a ``slice`` or an integer numpy array. The simulator delivers on the
order of 100k samples per update, so selections stay ranges or arrays end to end; nothing on the
hot path expands them into Python lists of ``(chunk_id, index)`` tuples.

The chunk records a ``checksum`` of its bytes as ingested; whoever delivers the chunk may compute
the checksum again over the bytes as delivered (:func:`checksum_bytes`) and the auditor compares
the two ("bytes delivered equal bytes ingested").
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, TypeAlias

import numpy as np

from conduit.errors import ConduitError

ChunkId: TypeAlias = Hashable
"""A chunk's identity: an int or a str in practice; anything hashable works."""

SampleId: TypeAlias = tuple[Hashable, int]
"""One sample: ``(chunk_id, index)`` with ``0 <= index < chunk.steps``."""

Indices: TypeAlias = range | slice | np.ndarray
"""Which samples of a chunk: a ``range``, a ``slice`` or an integer (or boolean mask) array."""

_BUFFER_TYPES = (bytes, bytearray, memoryview, np.ndarray)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A rollout fragment as handed over by an actor.

    ``nbytes`` is the chunk's size in the layout Conduit moves (what placement and transfers
    account for); ``t_created`` is when the actor finished producing it (the start of its
    experience path). ``payload``, when present, maps column names to arrays whose first
    dimension is ``steps``; it is carried for the real runtime and ignored by equality and hashing,
    so a chunk is identified by its metadata alone.
    """

    id: ChunkId
    producer: str
    node: str
    steps: int
    nbytes: int
    policy_version: int
    t_created: float
    checksum: int | None = None
    payload: Mapping[str, np.ndarray] | None = field(
        default=None, compare=False, hash=False, repr=False
    )

    def __post_init__(self) -> None:
        if type(self.steps) is int and type(self.nbytes) is int and type(self.policy_version) is int \
                and self.steps > 0 and self.nbytes >= 0:
            return  # plain ints in range (what the simulator makes): every check below passes
        if isinstance(self.steps, bool) or not isinstance(self.steps, int | np.integer):
            raise ConduitError(f"chunk {self.id!r}: steps must be an int, got {self.steps!r}")
        if self.steps <= 0:
            raise ConduitError(f"chunk {self.id!r}: steps must be > 0, got {self.steps}")
        if isinstance(self.nbytes, bool) or not isinstance(self.nbytes, int | np.integer):
            raise ConduitError(f"chunk {self.id!r}: nbytes must be an int, got {self.nbytes!r}")
        if self.nbytes < 0:
            raise ConduitError(f"chunk {self.id!r}: nbytes must be >= 0, got {self.nbytes}")
        if isinstance(self.policy_version, bool) or not isinstance(
            self.policy_version, int | np.integer
        ):
            raise ConduitError(
                f"chunk {self.id!r}: policy_version must be an int, got {self.policy_version!r}"
            )

    @classmethod
    def from_payload(
        cls,
        id: ChunkId,
        producer: str,
        node: str,
        policy_version: int,
        t_created: float,
        payload: Mapping[str, np.ndarray],
    ) -> Chunk:
        """Build a chunk whose steps, size and checksum are read off its columns.

        Every column must have the same first dimension (the number of steps).
        """
        if not payload:
            raise ConduitError(f"chunk {id!r}: payload must have at least one column")
        lengths = {name: len(col) for name, col in payload.items()}
        steps = next(iter(lengths.values()))
        if any(n != steps for n in lengths.values()):
            raise ConduitError(f"chunk {id!r}: payload columns differ in length: {lengths}")
        nbytes = sum(int(np.asarray(col).nbytes) for col in payload.values())
        return cls(
            id=id,
            producer=producer,
            node=node,
            steps=steps,
            nbytes=nbytes,
            policy_version=policy_version,
            t_created=t_created,
            checksum=checksum_bytes(payload),
            payload=payload,
        )

    def sample_ids(self) -> Iterator[SampleId]:
        """The chunk's samples, ``(id, 0) ... (id, steps - 1)``. For tests and small tools only."""
        cid = self.id
        for i in range(self.steps):
            yield (cid, i)

    @property
    def bytes_per_step(self) -> float:
        """Average size of one sample; delivered bytes are counted pro rata."""
        return self.nbytes / self.steps


class Selection(NamedTuple):
    """Which samples of one chunk a delivery carries.

    A plain ``(chunk_id, indices)`` tuple is accepted wherever a selection is; this class adds
    names and two conveniences.
    """

    chunk_id: ChunkId
    indices: Indices

    @classmethod
    def whole(cls, chunk: Chunk) -> Selection:
        """All samples of ``chunk``."""
        return cls(chunk.id, range(chunk.steps))

    def size(self, steps: int | None = None) -> int:
        """How many samples the selection names (a slice needs the chunk's ``steps``)."""
        return selection_size(self.indices, steps)

    def sample_ids(self, steps: int | None = None) -> Iterator[SampleId]:
        """The selected samples one by one. For tests and small tools only."""
        idx = self.indices
        if isinstance(idx, slice):
            if steps is None:
                raise ConduitError("a slice selection needs the chunk's steps to be enumerated")
            idx = range(*idx.indices(steps))
        for i in idx:
            yield (self.chunk_id, int(i))


def selection_size(indices: Indices, steps: int | None = None) -> int:
    """Number of samples ``indices`` names, counting repeats (a boolean mask counts its Trues)."""
    if isinstance(indices, range):
        return len(indices)
    if isinstance(indices, slice):
        step = 1 if indices.step is None else indices.step
        if steps is not None and step < 0:
            return len(range(*indices.indices(steps)))
        if step < 0 or (indices.stop is None and steps is None):
            raise ConduitError("the size of this slice needs the chunk's steps")
        stop = steps if indices.stop is None else indices.stop
        return len(range(indices.start or 0, stop, step))
    arr = np.asarray(indices)
    if arr.dtype == np.bool_:
        return int(np.count_nonzero(arr))
    return int(arr.size)


def normalize_indices(
    indices: Indices, steps: int
) -> tuple[slice | np.ndarray, int, int]:
    """Turn ``indices`` into a numpy indexer over a chunk of ``steps`` samples.

    Returns ``(indexer, count, out_of_range)``: ``indexer`` is a basic slice (so numpy hands back
    views, no copies) for ranges and slices, or an ``intp`` array; ``count`` is how many in-range
    samples it selects; ``out_of_range`` counts entries that name no sample of the chunk. Indices are
    strict: ``-1`` is out of range, not "the last step". A slice reads as the range it spells, with
    ``None`` bounds meaning "from the first step" / "to the end" (a negative step keeps Python's
    slice semantics).
    """
    kind = type(indices)
    if kind is range:
        start, stop, step = indices.start, indices.stop, indices.step
        if step == 1:
            if stop <= start:
                return slice(0, 0), 0, 0
            lo = max(0, start)
            hi = min(steps, stop)
            bad = (stop - start) - (hi - lo if hi > lo else 0)
            if hi <= lo:
                return slice(0, 0), 0, bad
            return slice(lo, hi), hi - lo, bad
        arr = np.arange(start, stop, step, dtype=np.intp)
        return _normalize_array(arr, steps)
    if kind is slice:
        step = 1 if indices.step is None else indices.step
        if step < 0:  # rare; Python's own slice semantics
            return _normalize_array(np.arange(*indices.indices(steps), dtype=np.intp), steps)
        start = 0 if indices.start is None else indices.start
        stop = steps if indices.stop is None else indices.stop
        return normalize_indices(range(start, stop, step), steps)
    return _normalize_array(np.asarray(indices), steps)


def _normalize_array(arr: np.ndarray, steps: int) -> tuple[np.ndarray, int, int]:
    kind = arr.dtype.kind
    if kind == "b":
        if arr.shape != (steps,):
            raise ConduitError(f"a boolean selection must have shape ({steps},), got {arr.shape}")
        idx = np.flatnonzero(arr)
        return idx, int(idx.size), 0
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    size = arr.size
    if size == 0:
        return arr.astype(np.intp), 0, 0
    if kind not in "iu":
        raise ConduitError(f"selection indices must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.intp, copy=False)
    if size <= 16:  # tiny selections (replay batches): Python's min/max beat numpy's overhead
        values = arr.tolist()
        in_range = min(values) >= 0 and max(values) < steps
    else:  # negatives wrap to huge unsigned values, so one reduction checks both ends
        in_range = int(arr.view(np.uintp).max()) < steps
    if in_range:
        return arr, size, 0
    ok = (arr >= 0) & (arr < steps)
    good = arr[ok]
    return good, int(good.size), size - int(good.size)


def checksum_bytes(
    buffers: bytes | bytearray | memoryview | np.ndarray | Iterable | Mapping,
) -> int:
    """CRC-32 over the bytes of one buffer, a sequence of buffers, or a payload mapping.

    The checksum covers raw bytes only (not dtype or shape): it answers "are the bytes delivered the
    bytes ingested". A mapping is read in sorted key order, so the column order of a payload does
    not matter. Non-contiguous arrays are made contiguous first, so a strided view and its copy
    agree.
    """
    if isinstance(buffers, Mapping):
        parts: Iterable = (buffers[k] for k in sorted(buffers))
    elif isinstance(buffers, _BUFFER_TYPES):
        parts = (buffers,)
    else:
        parts = buffers
    crc = 0
    for buf in parts:
        if isinstance(buf, np.ndarray):
            if not buf.flags.c_contiguous:
                buf = np.ascontiguousarray(buf)
            buf = buf.reshape(-1).view(np.uint8) if buf.size else b""
        elif not isinstance(buf, bytes | bytearray | memoryview):
            buf = np.ascontiguousarray(np.asarray(buf)).reshape(-1).view(np.uint8)
        crc = zlib.crc32(buf, crc)
    return crc
