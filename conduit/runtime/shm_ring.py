"""Cross-process ingestion: one single-producer/single-consumer ring in shared memory per producer.

Producers (actors, env runners) are separate OS processes on the plane's node. Each one gets its own
ring in :mod:`multiprocessing.shared_memory`: the plane process creates it (:class:`ShmRing`) and
hands the producer a picklable :class:`RingSpec`; the producer attaches by name
(:class:`RingProducer`). With exactly one writer and one reader per ring, no cross-process lock is
ever taken.

Layout of the segment::

    [ring header, 192 B][data area, ``capacity`` bytes]

The ring header holds int64 fields, ``head`` and ``tail`` on cache lines of their own. ``head`` and
``tail`` are *virtual* byte counters that only grow; a byte's place in the data area is the counter
modulo ``capacity``, and ``tail - head`` is the space in use. The plane writes ``head`` (it releases
space); the producer writes ``tail`` (it reserves space). The one exception: a producer that finds
the ring empty (``head == tail``, so the plane holds nothing and will not write ``head`` before the
next record is announced) may move both to the next wrap, so an empty ring takes any record that
fits its capacity.

A record is contiguous and starts on a 64-byte boundary::

    [record header, 64 B][metadata area, meta_bytes][columns at Schema.layout(steps) offsets]

The record header is eight 8-byte fields: magic, state (WRITING / COMMITTED / ABORTED), record size,
steps, policy version, ``t_created`` (float64), checksum (-1 for none) and the length of the pickled
metadata: the chunk id (any picklable hashable) and the chunk's *annotation* (any small picklable
object, ``None`` by default), which the plane hands to :meth:`ExperiencePlane.ingest` so that it comes
back with the batches and peeks carrying the chunk's rows, as for a chunk ingested in-process (a
framework's producer uses it for what the columns do not say, e.g. TorchRL's ``[envs, time]`` batch
shape of a collector's rollout). When a record does not fit before the end of the
data area, the producer writes a PAD marker there and wraps to offset 0, so columns are always plain
zero-copy views.

Protocol. :meth:`RingProducer.reserve` waits until the record fits (backpressure: short sleeps on
``head``, :class:`~conduit.errors.PlaneFullError` after the timeout; it also waits while the pipe is
full of notifications the plane has not read, so a producer never blocks outside its timeout and
nothing grows without bound), writes the record header with
state WRITING, then advances ``tail``; the caller fills the slot's column views in place;
:meth:`RingSlot.commit` stores the metadata, sets COMMITTED and sends the record's virtual offset
through a :func:`multiprocessing.Pipe` (8 raw bytes). The pipe write is a system call, hence a
memory barrier, and it lets the plane block in :meth:`ShmRing.poll` instead of spinning. The plane
reads records in ring order as announced, hands them out as zero-copy :class:`RingRecord`\\ s and
frees their space on :meth:`ShmRing.release`, which may come in any order: ``head`` advances past
every contiguous released record.

Producer death. When the producer process goes away, the plane sees EOF on the pipe (it must not
hold a copy of the producer's pipe end itself: it drops it when the producer's attach message
arrives, or at once on :meth:`ShmRing.producer_started`). It then inspects the reservation between
what was announced and ``tail``: a record that was committed but not yet announced is still handed
out (nothing committed is lost); one still WRITING is discarded and counted in
:attr:`ShmRing.discarded_partial`. The ring then accepts nothing more.

Start producers with the ``spawn`` or ``forkserver`` start method: a ``fork``\\ ed process inherits
every pipe end open in the plane, which can hide another producer's death. Producers attach without
registering the segment with :mod:`multiprocessing.resource_tracker` (``track=False`` on Python >=
3.13, the same effect on older ones): only the creating plane unlinks it.
"""

from __future__ import annotations

import os
import pickle
import secrets
import select
import struct
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from multiprocessing import Pipe, shared_memory
from multiprocessing.connection import Connection
from typing import Any, Self

import numpy as np

from conduit.chunk import checksum_bytes
from conduit.errors import CapacityError, ConduitError, PlaneFullError
from conduit.runtime.schema import ALIGN, Schema, align_up

# -- segment layout ------------------------------------------------------------------------------
RING_MAGIC = 0x434F4E4455495452  # "CONDUITR"
RING_VERSION = 2  # 2: the metadata area holds (chunk id, annotation)
HEADER_BYTES = 192
"""Bytes before the data area: three cache lines of int64 fields."""

# int64 indices into the ring header
_H_MAGIC, _H_VERSION, _H_CAPACITY, _H_META, _H_STATE, _H_PRODUCER_PID = 0, 1, 2, 3, 4, 5
_H_HEAD = 8  # cache line 1: written by the plane
_H_TAIL, _H_RESV = 16, 17  # cache line 2: written by the producer (RESV: start of the newest reservation)

# ring states (written by the plane)
OPEN, DEAD, CLOSED = 0, 1, 2

# records
REC_MAGIC = 0x5245434F5244  # "RECORD"
PAD_MAGIC = 0x504144504144  # "PADPAD"
WRITING, COMMITTED, ABORTED = 1, 2, 3
RECORD_HEADER_BYTES = 64
_REC = struct.Struct("=qqqqqdqq")  # magic, state, size, steps, policy_version, t_created, checksum, meta_len
_STATE_OFFSET = 8
_I64 = struct.Struct("=q")
_NO_CHECKSUM = -1
DEFAULT_META_BYTES = 128

_NOTE = struct.Struct("=q")  # a notification: a record's virtual offset (>= 0) or -pid (attach)


# -- shared memory helpers -----------------------------------------------------------------------
class _Shm(shared_memory.SharedMemory):
    """SharedMemory whose finalizer stays quiet while numpy views of it are still alive."""

    def __del__(self) -> None:
        try:
            self.close()
        except (OSError, BufferError):
            pass


class _NoTracker:
    """Stands in for resource_tracker while attaching, so the attach registers nothing."""

    @staticmethod
    def register(name: str, rtype: str) -> None:
        pass

    @staticmethod
    def unregister(name: str, rtype: str) -> None:
        pass


_attach_lock = threading.Lock()


def _attach(name: str) -> _Shm:
    """Attach to an existing segment without resource tracking.

    A process started by ``spawn``/``forkserver`` shares the plane's resource tracker, so the usual
    "register then ``resource_tracker.unregister``" would drop the *plane's* registration too (and the
    tracker complains when the plane unlinks). Not registering at all is what ``track=False`` does.
    """
    if sys.version_info >= (3, 13):
        return _Shm(name=name, track=False)  # type: ignore[call-arg]
    with _attach_lock:
        tracker = shared_memory.resource_tracker  # type: ignore[attr-defined]
        shared_memory.resource_tracker = _NoTracker  # type: ignore[attr-defined]
        try:
            return _Shm(name=name)
        finally:
            shared_memory.resource_tracker = tracker  # type: ignore[attr-defined]


def _close_shm(shm: shared_memory.SharedMemory) -> None:
    try:
        shm.close()
    except BufferError:  # record views still alive; the mapping goes when they do
        pass


def _finalize_ring(shm: shared_memory.SharedMemory, conns: tuple[Connection, ...], creator: int) -> None:
    for conn in conns:
        conn.close()
    if os.getpid() == creator:  # never from a forked child that inherited the ring object
        try:
            shm.unlink()
        except FileNotFoundError:
            pass
    _close_shm(shm)


def _check_steps(steps: Any) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps <= 0:
        raise ConduitError(f"steps must be a positive int, got {steps!r}")
    return int(steps)


def _pack_meta(chunk_id: Hashable, meta_bytes: int, producer: str, annotation: Any = None) -> bytes:
    try:
        hash(chunk_id)
    except TypeError as exc:
        raise ConduitError(f"producer {producer!r}: chunk id {chunk_id!r} is not hashable") from exc
    try:
        blob = pickle.dumps((chunk_id, annotation), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise ConduitError(f"producer {producer!r}: chunk {chunk_id!r}: the annotation {annotation!r} cannot be "
                           f"pickled: {exc}") from exc
    if len(blob) > meta_bytes:
        what = "" if annotation is None else " with its annotation"
        raise ConduitError(f"producer {producer!r}: chunk id {chunk_id!r}{what} pickles to {len(blob)} bytes; the "
                           f"ring's metadata area holds {meta_bytes} (ShmRing(meta_bytes=...))")
    return blob


class _Layout:
    """:meth:`Schema.layout` / :meth:`Schema.views` with the per-column sizes worked out once (hot path)."""

    def __init__(self, schema: Schema):
        self.columns = [(c.name, c.dtype, c.shape, c.step_bytes) for c in schema.columns]

    def extent(self, steps: int) -> int:
        pos = 0
        for _, _, _, step_bytes in self.columns:
            pos = align_up(pos + steps * step_bytes)
        return max(pos, ALIGN)

    def views(self, buffer: np.ndarray, steps: int) -> dict[str, np.ndarray]:
        out, pos = {}, 0
        for name, dtype, shape, step_bytes in self.columns:
            n = steps * step_bytes
            out[name] = buffer[pos:pos + n].view(dtype).reshape((steps, *shape))
            pos = align_up(pos + n)
        return out


# -- public types --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RingSpec:
    """What a producer process needs to attach to its ring; picklable.

    ``conn`` is the producer's (send) end of the ring's :func:`multiprocessing.Pipe`; pass the spec to
    the producer as an argument of :class:`multiprocessing.Process` so the pipe end travels with it.
    """

    name: str
    capacity: int
    schema_dict: dict
    producer: str
    conn: Any


@dataclass(eq=False)
class RingRecord:
    """One committed chunk as the plane sees it, zero-copy.

    ``columns`` are read-only views into the shared segment, laid out as :meth:`Schema.views`; they
    are valid until the record is released (:meth:`ShmRing.release`), after which the producer may
    overwrite the bytes. ``offset`` and ``size`` say where the record sits in the data area.
    """

    chunk_id: Hashable
    producer: str
    policy_version: int
    t_created: float
    steps: int
    checksum: int | None
    columns: dict[str, np.ndarray] = field(repr=False)
    offset: int
    size: int
    _vstart: int = field(default=-1, repr=False)
    annotation: Any = field(default=None, repr=False)  # the producer's annotation (see the module doc)

    @property
    def nbytes(self) -> int:
        """Payload bytes (``schema.payload_bytes(steps)``; no padding, no header)."""
        return int(sum(col.nbytes for col in self.columns.values()))


class ShmRing:
    """The plane's side of one producer's ring: creates and owns the shared segment and the pipe.

    ``capacity`` is the size of the data area in bytes (rounded up to 64). ``meta_bytes`` is the room
    each record keeps for its pickled chunk id. :meth:`poll` should be called from one thread;
    :meth:`release` may be called from any.
    """

    def __init__(self, schema: Schema | Mapping[str, Any], capacity: int, producer: str, *,
                 meta_bytes: int = DEFAULT_META_BYTES):
        self.schema = Schema.of(schema)
        self._layout = _Layout(self.schema)
        if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer) or capacity <= 0:
            raise ConduitError(f"ring for {producer!r}: capacity must be a positive int of bytes, got {capacity!r}")
        if meta_bytes < 0:
            raise ConduitError(f"ring for {producer!r}: meta_bytes must be >= 0, got {meta_bytes}")
        self.producer = str(producer)
        self._capacity = align_up(int(capacity), ALIGN)
        self._meta_bytes = align_up(int(meta_bytes), ALIGN)
        name = f"conduit_{os.getpid()}_{secrets.token_hex(6)}"
        self._shm = _Shm(name=name, create=True, size=HEADER_BYTES + self._capacity)
        self.name = self._shm.name
        self._recv, self._send = Pipe(duplex=False)
        self._finalizer = weakref.finalize(self, _finalize_ring, self._shm, (self._recv, self._send),
                                          os.getpid())
        self._buf: memoryview = self._shm.buf
        self._hdr = self._buf[:HEADER_BYTES].cast("q")
        data = np.frombuffer(self._buf, dtype=np.uint8, count=self._capacity, offset=HEADER_BYTES)
        data.flags.writeable = False
        self._data = data
        self._hdr[_H_CAPACITY] = self._capacity
        self._hdr[_H_META] = self._meta_bytes
        self._hdr[_H_STATE] = OPEN
        self._hdr[_H_VERSION] = RING_VERSION
        self._hdr[_H_MAGIC] = RING_MAGIC

        self._fd = self._recv.fileno()
        os.set_blocking(self._fd, False)
        self._poller = select.poll()
        self._poller.register(self._fd, select.POLLIN)
        self._pending = b""
        self._lock = threading.Lock()
        self._read = 0  # virtual end of the last record read
        self._head = 0  # the head we last published
        self._entries: deque[list] = deque()  # [vstart, vend, released] in ring order
        self._live: dict[int, tuple[list, RingRecord]] = {}
        self._ready: list[RingRecord] = []
        self._alive = True
        self._closed = False
        self.discarded_partial = 0
        self._unreported_partial = 0

    # -- handing the ring to a producer -----------------------------------------------------------
    def spec(self) -> RingSpec:
        """The picklable spec a producer attaches with (:class:`RingProducer`)."""
        if self._closed:
            raise ConduitError(f"ring for {self.producer!r} is closed")
        return RingSpec(self.name, self._capacity, self.schema.to_dict(), self.producer, self._send)

    def producer_started(self) -> None:
        """Drop the plane's copy of the producer's pipe end once the producer process holds its own.

        Call it right after ``Process.start()``; without it the plane drops the copy when the producer's
        attach message arrives, so a producer that dies before attaching would never be noticed. Do not
        call it for a producer in this same process (it shares the plane's copy).
        """
        self._send.close()

    # -- reading -----------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def meta_bytes(self) -> int:
        return self._meta_bytes

    @property
    def used(self) -> int:
        """Bytes of the data area in use: records not yet released, their padding, reservations."""
        if self._closed:
            return 0
        head = self._hdr[_H_HEAD]  # head before tail: the producer moves head (on an empty ring) before tail
        tail = self._hdr[_H_TAIL]
        return max(0, min(self._capacity, tail - head))

    @property
    def producer_alive(self) -> bool:
        """False once the producer has gone away (its pipe end closed, the process dead)."""
        if self._alive and not self._closed:
            with self._lock:
                self._drain()
        return self._alive

    def fileno(self) -> int:
        """The notification pipe's descriptor: readable when records (or the producer's EOF) wait;
        a plane serving many rings ``select``s on these instead of polling each."""
        return self._fd

    def poll(self, timeout: float = 0.0) -> list[RingRecord]:
        """Committed records not returned before, oldest first; waits up to ``timeout`` s for the first."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            with self._lock:
                if self._closed:
                    return []
                self._drain()
                if self._ready or not self._alive:
                    out, self._ready = self._ready, []
                    return out
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            self._poller.poll(max(1, int(left * 1000 + 0.999)))

    def release(self, record: RingRecord) -> None:
        """The plane is done with ``record``'s bytes; its space returns to the producer.

        Releases may come in any order; ``head`` advances past every contiguous released record.
        """
        with self._lock:
            if self._closed:
                return
            got = self._live.get(record._vstart)
            if got is None or got[1] is not record:
                raise ConduitError(f"ring for {self.producer!r}: record {record.chunk_id!r} is not outstanding here "
                                   "(released twice, or from another ring)")
            del self._live[record._vstart]
            got[0][2] = True
            self._advance_head()

    def check_producer(self) -> int:
        """Whether the producer went away, as the number of partial chunks discarded (0 or 1).

        A chunk the producer had begun (reserved) but not committed when it died is discarded, counted
        in :attr:`discarded_partial` and reported here once; records committed before stay readable.
        """
        with self._lock:
            if not self._closed:
                self._drain()
            n, self._unreported_partial = self._unreported_partial, 0
            return n

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the pipe and unlink the segment (idempotent). Records become invalid."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._hdr[_H_STATE] = CLOSED
            self._ready = []
            self._live.clear()
            self._entries.clear()
            self._hdr.release()
            self._data = None  # type: ignore[assignment]
            self._buf = None  # type: ignore[assignment]
            self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._alive else "producer gone")
        return f"ShmRing({self.producer!r}, name={self.name!r}, capacity={self._capacity}, {state})"

    # -- internals (called with the lock held) -----------------------------------------------------
    def _drain(self) -> None:
        """Read every notification waiting in the pipe; on EOF, handle the producer's departure."""
        again = self._alive
        while again:
            again = eof = False
            chunks = [self._pending] if self._pending else []
            while True:
                try:
                    got = os.read(self._fd, 1 << 16)
                except BlockingIOError:
                    break
                if not got:
                    eof = True
                    break
                chunks.append(got)
            raw = b"".join(chunks)
            whole = len(raw) - len(raw) % _NOTE.size
            self._pending = raw[whole:]
            for (value,) in _NOTE.iter_unpack(raw[:whole]):
                if value >= 0:
                    self._read_record(value)
                elif -value != os.getpid() and not self._send.closed:
                    # a producer in another process attached: drop our copy of its pipe end so that its
                    # departure shows as EOF, and look again (it may already have gone)
                    self._send.close()
                    again = not eof
            if eof:
                self._producer_gone()

    def _read_record(self, vstart: int) -> None:
        cap = self._capacity
        if vstart < self._read or vstart - self._read >= cap:
            raise ConduitError(f"ring for {self.producer!r}: corrupt notification {vstart} (read up to {self._read})")
        if vstart > self._read:  # padding at the end of the data area (or a rebase of an empty ring)
            if vstart % cap:
                raise ConduitError(f"ring for {self.producer!r}: record at {vstart} leaves a gap but does not wrap")
            self._entries.append([self._read, vstart, True])
        pos = vstart % cap
        magic, state, size, steps, version, t_created, checksum, meta_len = _REC.unpack_from(
            self._buf, HEADER_BYTES + pos)
        if magic != REC_MAGIC or size <= 0 or pos + size > cap or state not in (COMMITTED, ABORTED):
            raise ConduitError(f"ring for {self.producer!r}: corrupt record at offset {pos} "
                               f"(magic {magic:#x}, state {state}, size {size})")
        entry = [vstart, vstart + size, False]
        self._entries.append(entry)
        self._read = vstart + size
        if state == ABORTED:
            entry[2] = True
            self._advance_head()
            return
        self._ready.append(self._make_record(entry, pos, size, steps, version, t_created, checksum, meta_len))
        self._advance_head()

    def _make_record(self, entry: list, pos: int, size: int, steps: int, version: int, t_created: float,
                     checksum: int, meta_len: int) -> RingRecord:
        meta_at = pos + RECORD_HEADER_BYTES
        chunk_id, annotation = pickle.loads(self._data[meta_at:meta_at + meta_len])
        cols_at = meta_at + self._meta_bytes
        columns = self._layout.views(self._data[cols_at:pos + size], steps)
        record = RingRecord(chunk_id=chunk_id, producer=self.producer, policy_version=version,
                            t_created=t_created, steps=steps,
                            checksum=None if checksum == _NO_CHECKSUM else checksum,
                            columns=columns, offset=pos, size=size, _vstart=entry[0], annotation=annotation)
        self._live[entry[0]] = (entry, record)
        return record

    def _advance_head(self) -> None:
        entries = self._entries
        while entries and entries[0][2]:
            entries.popleft()
        head = entries[0][0] if entries else self._read
        if head != self._head:
            self._head = head
            self._hdr[_H_HEAD] = head

    def _producer_gone(self) -> None:
        """Pipe EOF: keep what was committed, discard a reservation still being written."""
        self._alive = False
        self._hdr[_H_STATE] = DEAD
        tail = self._hdr[_H_TAIL]
        if tail <= self._read:
            return
        vstart = self._hdr[_H_RESV]
        pos = vstart % self._capacity
        magic, state = _REC.unpack_from(self._buf, HEADER_BYTES + pos)[:2]
        if vstart >= self._read and magic == REC_MAGIC and state in (COMMITTED, ABORTED):
            self._read_record(vstart)  # committed, but the producer died before announcing it
            return
        self._entries.append([self._read, tail, True])
        self._read = tail
        self.discarded_partial += 1
        self._unreported_partial += 1
        self._advance_head()


class RingSlot:
    """A reserved record in the ring: fill :attr:`columns` in place, then :meth:`commit` (or :meth:`abort`)."""

    def __init__(self, producer: RingProducer, vstart: int, pos: int, steps: int, columns: dict[str, np.ndarray]):
        self._producer = producer
        self._vstart = vstart
        self._pos = pos
        self.steps = steps
        self.columns = columns
        self.done = False

    def commit(self, *, chunk_id: Hashable, policy_version: int, t_created: float | None = None,
               checksum: bool = True, annotation: Any = None) -> None:
        """Publish the record: metadata, then state COMMITTED, then a notification to the plane.

        With ``checksum`` the CRC-32 of the columns (:func:`conduit.chunk.checksum_bytes`, sorted column
        order) is computed over the bytes in the ring and stored with the record. ``annotation`` travels
        with the chunk id in the metadata area (see the module doc).
        """
        if self.done:
            raise ConduitError(f"producer {self._producer.producer!r}: slot already committed or aborted")
        blob = _pack_meta(chunk_id, self._producer.meta_bytes, self._producer.producer, annotation)
        self._producer._commit(self, chunk_id, policy_version, t_created, checksum, blob)

    def abort(self) -> None:
        """Give the slot back unpublished; the plane skips it."""
        if self.done:
            raise ConduitError(f"producer {self._producer.producer!r}: slot already committed or aborted")
        self._producer._finish(self, ABORTED)


class RingProducer:
    """The producer's side of a ring, in the producer's process: attaches to the segment by name.

    One slot may be outstanding at a time (records are published in ring order).
    """

    def __init__(self, spec: RingSpec):
        self.producer = spec.producer
        self.schema = Schema.from_dict(spec.schema_dict)
        self._layout = _Layout(self.schema)
        self._conn: Connection = spec.conn
        self._shm = _attach(spec.name)
        self._buf: memoryview = self._shm.buf
        self._hdr = self._buf[:HEADER_BYTES].cast("q")
        try:
            if self._hdr[_H_MAGIC] != RING_MAGIC or self._hdr[_H_VERSION] != RING_VERSION:
                raise ConduitError(f"producer {self.producer!r}: segment {spec.name!r} is not a Conduit ring")
            self.capacity = int(self._hdr[_H_CAPACITY])
            if self.capacity != spec.capacity:
                raise ConduitError(f"producer {self.producer!r}: ring capacity {self.capacity}, spec says "
                                   f"{spec.capacity}")
            if self._hdr[_H_STATE] != OPEN:
                raise ConduitError(f"producer {self.producer!r}: the ring is closed")
            other = self._hdr[_H_PRODUCER_PID]
            if other:
                raise ConduitError(f"producer {self.producer!r}: the ring already has a producer (pid {other})")
        except BaseException:
            self._hdr.release()
            _close_shm(self._shm)
            raise
        self._hdr[_H_PRODUCER_PID] = os.getpid()
        self.meta_bytes = int(self._hdr[_H_META])
        self._data = np.frombuffer(self._buf, dtype=np.uint8, count=self.capacity, offset=HEADER_BYTES)
        self._tail = int(self._hdr[_H_TAIL])
        self._resv = self._tail  # start of the newest reservation
        self._slot: RingSlot | None = None
        self._closed = False
        self._fd = self._conn.fileno()
        self._poller = select.poll()
        self._poller.register(self._fd, select.POLLOUT)
        self._notify(-os.getpid())  # lets a plane in another process drop its copy of our pipe end

    def record_bytes(self, steps: int) -> int:
        """Ring bytes one record of ``steps`` samples takes (header, metadata area, columns)."""
        return RECORD_HEADER_BYTES + self.meta_bytes + self._layout.extent(steps)

    @property
    def free(self) -> int:
        """Bytes not in use (not necessarily contiguous)."""
        return self.capacity - (self._tail - int(self._hdr[_H_HEAD]))

    def reserve(self, steps: int, timeout: float | None = 10.0) -> RingSlot:
        """Reserve a record of ``steps`` samples and return its writable column views.

        Waits while the ring is full; raises :class:`PlaneFullError` after ``timeout`` seconds (``0``:
        do not wait, ``None``: wait for ever) and :class:`CapacityError` at once when the record is
        larger than the whole ring.
        """
        self._check_usable()
        steps = _check_steps(steps)
        size = self.record_bytes(steps)
        if size > self.capacity:
            raise CapacityError(f"producer {self.producer!r}: a chunk of {steps} steps "
                                f"({self.schema.payload_bytes(steps)} payload bytes) needs a ring record of "
                                f"{size} bytes; the ring capacity is {self.capacity} bytes")
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        nap = 20e-6
        while True:
            if self._try_place(size):
                break
            self._check_usable()
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise PlaneFullError(f"producer {self.producer!r}: ring full: {size} bytes asked, {max(0, self.free)} "
                                     f"free of ring capacity {self.capacity} bytes after waiting {timeout}s "
                                     "(the plane releases too slowly, or does not poll)")
            time.sleep(nap if deadline is None else min(nap, deadline - now))
            nap = min(nap * 2, 1e-3)
        vstart = self._resv
        pos = vstart % self.capacity
        cols_at = pos + RECORD_HEADER_BYTES + self.meta_bytes
        columns = self._layout.views(self._data[cols_at:pos + size], steps)
        self._slot = RingSlot(self, vstart, pos, steps, columns)
        return self._slot

    def write(self, payload: Mapping[str, Any], *, chunk_id: Hashable, policy_version: int,
              t_created: float | None = None, checksum: bool = True, timeout: float | None = 10.0,
              annotation: Any = None) -> None:
        """Validate ``payload`` against the schema, reserve, copy it into the ring and commit.

        A payload that does not match (or an id and annotation too large for the metadata area) raises
        before anything is reserved or written.
        """
        self._check_usable()
        steps = self.schema.validate(payload, where=f"producer {self.producer!r}: chunk {chunk_id!r}")
        blob = _pack_meta(chunk_id, self.meta_bytes, self.producer, annotation)
        slot = self.reserve(steps, timeout)
        try:
            for name, dst in slot.columns.items():
                np.copyto(dst, np.asarray(payload[name]), casting="no")
        except BaseException:
            slot.abort()
            raise
        self._commit(slot, chunk_id, policy_version, t_created, checksum, blob)

    def close(self) -> None:
        """Detach (idempotent). A slot still reserved is left unpublished; the plane discards it."""
        if self._closed:
            return
        self._closed = True
        self._slot = None
        self._conn.close()
        self._hdr.release()
        self._data = None  # type: ignore[assignment]
        self._buf = None  # type: ignore[assignment]
        _close_shm(self._shm)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._closed:
            raise ConduitError(f"producer {self.producer!r}: the producer is closed")
        if self._slot is not None:
            raise ConduitError(f"producer {self.producer!r}: a slot is already reserved; commit or abort it first")
        if self._hdr[_H_STATE] != OPEN:
            raise ConduitError(f"producer {self.producer!r}: the plane has closed the ring")

    def _try_place(self, size: int) -> bool:
        """Claim ``size`` contiguous bytes if they are free now (and the pipe has room for the notification)."""
        cap = self.capacity
        head = int(self._hdr[_H_HEAD])
        tail = self._tail
        pos = tail % cap
        rebase = False
        if pos + size <= cap:
            start = tail
        else:
            start = tail + cap - pos
            rebase = head == tail  # empty ring: move head along; the plane holds nothing and waits for a notice
        if not rebase and start + size - head > cap:
            return False
        if self._poller.poll(0) == []:  # the pipe is full: the plane is not reading notifications
            return False
        if start != tail:
            _REC.pack_into(self._buf, HEADER_BYTES + pos, PAD_MAGIC, 0, cap - pos, 0, 0, 0.0, 0, 0)
            if rebase:
                self._hdr[_H_HEAD] = start
        # WRITING before the data, and before tail: a record the producer dies in is recognisable
        _REC.pack_into(self._buf, HEADER_BYTES + start % cap, REC_MAGIC, WRITING, size, 0, 0, 0.0, _NO_CHECKSUM, 0)
        self._hdr[_H_RESV] = start
        self._hdr[_H_TAIL] = start + size
        self._tail = start + size
        self._resv = start
        return True

    def _commit(self, slot: RingSlot, chunk_id: Hashable, policy_version: int, t_created: float | None,
                checksum: bool, blob: bytes | None = None) -> None:
        if isinstance(policy_version, bool) or not isinstance(policy_version, int | np.integer):
            raise ConduitError(f"producer {self.producer!r}: policy_version must be an int, got {policy_version!r}")
        if blob is None:
            blob = _pack_meta(chunk_id, self.meta_bytes, self.producer)
        crc = checksum_bytes(slot.columns) if checksum else _NO_CHECKSUM
        t = time.time() if t_created is None else float(t_created)
        pos = slot._pos
        at = HEADER_BYTES + pos
        meta_at = at + RECORD_HEADER_BYTES
        self._buf[meta_at:meta_at + len(blob)] = blob
        size = self.record_bytes(slot.steps)
        _REC.pack_into(self._buf, at, REC_MAGIC, WRITING, size, slot.steps, int(policy_version), t, crc, len(blob))
        self._finish(slot, COMMITTED)

    def _finish(self, slot: RingSlot, state: int) -> None:
        _I64.pack_into(self._buf, HEADER_BYTES + slot._pos + _STATE_OFFSET, state)
        slot.done = True
        slot.columns = {}
        self._slot = None
        self._notify(slot._vstart)

    def _notify(self, value: int) -> None:
        try:
            os.write(self._fd, _NOTE.pack(value))
        except OSError as exc:
            raise ConduitError(f"producer {self.producer!r}: the plane has closed the ring") from exc
