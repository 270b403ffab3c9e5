"""The transfer engine: background copy workers that move rows between tiers and time every copy.

A copy moves some rows of a chunk's columns (a range, or an index array for replay sampling) into a
row range of a destination extent: usually a batch being assembled in the learner's device memory.
:func:`copy_rows` does one such copy with whatever the two sides are: numpy ``copyto``/``take``
between host media (both release the GIL, so worker threads copy in parallel with the learner's
Python code), ``Tensor.copy_`` to or from CUDA memory.

With CUDA, each worker owns a side **stream**: a host->device copy from pinned memory is an async
DMA on it, the worker waits on an **event** for its completion, and the learner's kernels on the
default stream keep running meanwhile, which is what lets delivery hide behind compute. Pageable
sources are first staged through the pinned ring when the path settings ask for pinned copies
(the plane arranges that; see :class:`~conduit.runtime.plane.ExperiencePlane`).

Every copy, synchronous or not, is reported to the :class:`~conduit.runtime.estimator.BandwidthEstimator`
as ``(route, bytes, seconds)``, so the :class:`~conduit.view.ClusterView` the policies read carries
live bandwidths.

A background job counts as in flight from :meth:`TransferEngine.submit` until its ``done`` callback
has returned (:attr:`TransferEngine.in_flight`, :meth:`TransferEngine.wait_idle`), so whoever owns
the memory a job touches knows when nothing of it is left running.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from conduit.runtime.estimator import BandwidthEstimator

log = logging.getLogger(__name__)  # conduit.runtime.transfer


def _is_tensor(x: Any) -> bool:
    return not isinstance(x, np.ndarray)


def copy_rows(src: dict[str, Any], index: slice | np.ndarray, dst: dict[str, Any], start: int,
              non_blocking: bool = False) -> int:
    """Copy rows ``index`` of every column of ``src`` into rows ``start:start+n`` of ``dst``.

    Returns the number of rows. Numpy on both sides copies without temporaries (``take`` with
    ``out=`` for index arrays); a torch side goes through ``Tensor.copy_`` (async from pinned memory
    when ``non_blocking``).
    """
    n = None
    for name, s in src.items():
        d = dst[name]
        if isinstance(index, slice):
            rows = s[index]
            n = rows.shape[0]
            target = d[start : start + n]
            if not _is_tensor(rows) and not _is_tensor(target):
                np.copyto(target, rows, casting="no")
            else:
                _torch_copy(target, rows, non_blocking)
        else:
            n = len(index)
            target = d[start : start + n]
            if not _is_tensor(s) and not _is_tensor(target):
                np.take(s, index, axis=0, out=target)
            else:
                import torch

                if _is_tensor(s):
                    rows = s.index_select(0, torch.as_tensor(index, device=s.device))
                else:
                    rows = np.take(s, index, axis=0)
                _torch_copy(target, rows, non_blocking)
    return int(n or 0)


GATHER_SMALL_ROW = 4096
"""Columns with at most this many bytes per step are gathered across chunks in one numpy call
(:func:`gather_runs`); larger rows are copied chunk by chunk (the copy, not the call, dominates)."""


def gather_runs(buffer: np.ndarray, schema: Any, offsets: np.ndarray, steps: np.ndarray, counts: np.ndarray,
                rows: np.ndarray, starts: np.ndarray, dst: dict[str, np.ndarray]) -> int:
    """Copy scattered rows of many chunks that live in one host buffer into a batch, column by column.

    ``buffer`` is a tier's host memory (uint8). Run ``i`` is ``counts[i]`` rows of the chunk whose
    extent starts at byte ``offsets[i]`` with the schema's layout for ``steps[i]`` steps; its rows are
    the next ``counts[i]`` entries of ``rows`` and land in the batch from row ``starts[i]`` on. A column
    of small rows is gathered for every run in one fancy-indexing call over a one-byte-stride window
    of the buffer (a replay batch draws from hundreds of chunks, and a call per chunk and column would
    cost more than the bytes); the byte offsets are computed with numpy for all runs at once. A column
    of large rows is copied run by run with ``np.take`` from the chunk's own contiguous column.
    Returns the rows copied."""
    from numpy.lib.stride_tricks import as_strided

    total = int(rows.size)
    if total == 0:
        return 0
    offsets = np.asarray(offsets, np.int64)
    counts = np.asarray(counts, np.int64)
    starts = np.asarray(starts, np.int64)
    contiguous = bool((starts[1:] == starts[:-1] + counts[:-1]).all())
    kinds, which = np.unique(np.asarray(steps, np.int64), return_inverse=True)  # a few chunk sizes at most
    layouts = np.array([schema.layout(int(k))[0] for k in kinds], np.int64)[which]  # runs x columns
    dst_rows = None
    if not contiguous:
        dst_rows = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total)
    rows64 = rows.astype(np.int64, copy=False)
    for j, col in enumerate(schema.columns):
        size = col.step_bytes
        if size == 0:
            continue
        out = dst[col.name]
        out_bytes = out.reshape(out.shape[0], -1).view(np.uint8)
        if size <= GATHER_SMALL_ROW:
            at = np.repeat(offsets + layouts[:, j], counts) + rows64 * size
            window = as_strided(buffer, shape=(buffer.shape[0] - size + 1, size), strides=(1, 1), writeable=False)
            if dst_rows is None:
                out_bytes[starts[0]:starts[0] + total] = window[at]
            else:
                out_bytes[dst_rows] = window[at]
            continue
        pos = 0
        for off, n_steps, n, start, lay in zip(offsets.tolist(), np.asarray(steps).tolist(), counts.tolist(),
                                               starts.tolist(), layouts[:, j].tolist(), strict=True):
            src = buffer[off + lay:off + lay + n_steps * size].reshape(n_steps, size)
            np.take(src, rows[pos:pos + n], axis=0, out=out_bytes[start:start + n])
            pos += n
    return total


def _torch_copy(target: Any, rows: Any, non_blocking: bool) -> None:
    import torch

    if isinstance(target, np.ndarray):
        target = torch.from_numpy(target)
    if isinstance(rows, np.ndarray):
        rows = torch.from_numpy(rows)
    target.copy_(rows, non_blocking=non_blocking)


@dataclass
class CopyJob:
    """One copy to run in the background: ``work()`` does it and returns the bytes moved."""

    route: tuple[str, str]
    work: Callable[[], int]
    done: Callable[[BaseException | None], None]
    cuda: bool = False


class TransferEngine:
    """A small pool of copy workers (threads) with per-worker CUDA streams where CUDA exists."""

    def __init__(self, estimator: BandwidthEstimator, workers: int = 2, name: str = "conduit-copy"):
        self.estimator = estimator
        self._jobs: queue.SimpleQueue[CopyJob | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
                         for i in range(max(1, workers))]
        self._closed = False
        self._local = threading.local()
        self.copies = 0
        self.bytes = 0
        self.busy_s = 0.0
        self.errors = 0
        self._stat_lock = threading.Lock()
        self._idle = threading.Condition(threading.Lock())
        self._in_flight = 0  # submitted jobs whose done callback has not returned yet
        for t in self._threads:
            t.start()

    def submit(self, job: CopyJob) -> None:
        if self._closed:
            raise RuntimeError("transfer engine is closed")
        with self._idle:
            self._in_flight += 1
        self._jobs.put(job)

    @property
    def in_flight(self) -> int:
        """Background jobs submitted and not finished (their ``done`` callback included)."""
        with self._idle:
            return self._in_flight

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no background job is in flight (jobs that callbacks submit included);
        False if some still are after ``timeout`` seconds."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def run_now(self, route: tuple[str, str], work: Callable[[], int], cuda: bool = False) -> int:
        """Run a copy in the calling thread (ingestion copies), timed like a background one.

        With ``cuda`` the copy is issued on a side stream of the calling thread and waited for there,
        so it never queues behind the learner's kernels on the default stream."""
        t0 = time.perf_counter()
        if cuda:
            import torch

            stream = getattr(self._local, "stream", None)
            if stream is None:
                stream = self._local.stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                nbytes = work()
            stream.synchronize()
        else:
            nbytes = work()
        self._account(route, nbytes, time.perf_counter() - t0)
        return nbytes

    def _account(self, route: tuple[str, str], nbytes: int, seconds: float) -> None:
        self.estimator.observe(route[0], route[1], nbytes, seconds)
        with self._stat_lock:
            self.copies += 1
            self.bytes += nbytes
            self.busy_s += seconds

    def _run(self) -> None:
        stream = None
        while True:
            job = self._jobs.get()
            if job is None:
                return
            err: BaseException | None = None
            try:
                t0 = time.perf_counter()
                if job.cuda:
                    import torch

                    if stream is None:
                        stream = torch.cuda.Stream()
                    with torch.cuda.stream(stream):
                        nbytes = job.work()
                        event = torch.cuda.Event()
                        event.record(stream)
                    event.synchronize()
                else:
                    nbytes = job.work()
                self._account(job.route, nbytes, time.perf_counter() - t0)
            except BaseException as exc:  # noqa: BLE001 - handed to the job's owner, never swallowed
                err = exc
                with self._stat_lock:
                    self.errors += 1
            try:
                job.done(err)
            except Exception:  # a callback bug must not kill the worker; logged
                log.exception("transfer on route %s: the completion callback raised (the worker goes on)",
                              job.route)
            finally:
                with self._idle:
                    self._in_flight -= 1
                    if not self._in_flight:
                        self._idle.notify_all()

    def close(self, timeout: float = 5.0) -> bool:
        """Run the jobs already queued, stop the workers; True when all of them stopped within
        ``timeout`` seconds each (False: a copy is still running and its memory must stay)."""
        if not self._closed:
            self._closed = True
            for _ in self._threads:
                self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=timeout)
        return not any(t.is_alive() for t in self._threads)

    def stats(self) -> dict[str, float]:
        with self._stat_lock:
            return {"copies": self.copies, "bytes": self.bytes, "busy_s": self.busy_s, "errors": self.errors}
