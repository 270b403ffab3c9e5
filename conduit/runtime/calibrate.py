"""``conduit calibrate``: measure this machine and write a topology file that the simulator loads.

Every figure comes from a size sweep. For each size the copy (or put, or pickle round trip, ...) is
timed a number of times with :func:`time.perf_counter` and the **median** is kept; latency and
bandwidth then come from fitting ``t = latency + bytes / bandwidth`` to the medians
(:func:`fit_latency_bandwidth`): the bandwidth is the least-squares slope over the large sizes, the
latency what the smallest size's time leaves (clamped at >= 0).

Measured:

* ``memcpy``: ``numpy.copyto`` between two preallocated, pre-faulted buffers (one thread);
* ``shm``: a chunk written into a ``multiprocessing.shared_memory`` segment and read back out of it
  (two copies; bytes delivered end to end per second); ``shm_create``: create + attach a fresh
  segment and fill it (latency = create + attach, bandwidth = first-touch fill rate);
* ``pickle``/``pickle_oob``: protocol-5 ``dumps`` + ``loads`` of a numpy array, in band and with
  out-of-band buffers (zero-copy);
* ``disk_write``/``disk_read``/``disk_read_4k``: a file written through ``numpy.memmap`` (flush +
  ``os.fsync``), dropped from the page cache (``POSIX_FADV_DONTNEED``) and read back; QD1 random
  4 KiB reads;
* ``object_store_put``/``object_store_get``: ``ray.put``/``ray.get`` of numpy arrays on a local,
  one-CPU Ray instance started (and shut down) for the purpose;
* ``h2d_pinned``/``h2d_pageable``/``d2h_pinned``/``d2h_pageable``/``d2d``: torch copies, only where
  ``torch.cuda.is_available()``. Nothing CUDA-related is written where there is no CUDA.
* the plane's own primitives (:func:`measure_plane`, read by the simulator as
  :class:`~conduit.sim.params.PlaneCosts`): ``plane_ingest`` / ``plane_deliver``, an in-process
  :class:`~conduit.runtime.plane.ExperiencePlane`'s ``ingest`` and ``next_batch`` (+ release) of one
  chunk per call, per call and per byte; where Ray is present, ``plane_actor_call``, the round trip of a
  call to a Ray ``PlaneActor`` (``PlaneCluster.set_policy_version``: no payload, no plane work), and
  what calls cost the actor's process in CPU (every thread, less its idle burn:
  :func:`conduit.runtime.proccpu.callee_cpu_per_call`): ``plane_actor_callee`` that control call,
  ``plane_replay_draw`` / ``plane_replay_priorities`` a prioritized Replay table's ``next_batch`` of n
  transition rows and its ``update_priorities`` of n ids, per call and per row, with the recovery
  journal ``enable()`` deploys; ``plane_actor_call_cold``, ``plane_actor_callee_cold``, ``plane_replay_draw_cold``
  and ``plane_replay_priorities_cold``, what those calls add when they come 20 ms apart instead of back to back
  (the simulator's cold-call law, :mod:`conduit.sim.raycalls`); ``plane_rebuild``, the learner's rebuilding of a delivered trajectory
  batch as RLlib episodes (``layout.py: rebuild_trajectories``), per call and per episode run.

:func:`topology_yaml` turns the measurements into an explicit-form topology with a header comment
that states when, where and how each figure was measured.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import itertools
import json
import logging
import math
import os
import pickle
import platform
import re
import resource
import shutil
import socket
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conduit._extras import install_hint, installed
from conduit.errors import ConduitError
from conduit.runtime import pagereport
from conduit.runtime.media import cuda_available
from conduit.units import Kind, format_quantity, parse_quantity

log = logging.getLogger(__name__)  # conduit.runtime.calibrate: what could not be measured

KiB = 1 << 10
MiB = 1 << 20
#: the nominal bandwidth of a figure with no per-byte term (a control call's round trip, CPU per call), and
#: the rate from which :meth:`Measurement.summary` reads a figure as one
NOMINAL_RATE = 1e18
#: the cold-call surcharges (:mod:`conduit.sim.raycalls`): calls this long apart against back to back, and the
#: replay table's rows at which its draw and priority update are timed so (DQN's 32-row batch lies between the
#: sweep's 16 and 64)
SPACED_SLEEP_S = 0.020
COLD_ROWS = 64
NO_PER_BYTE_TERM = NOMINAL_RATE / 10
#: what a note says when a figure's sizes are rows, so its "bandwidth" is rows per second
ROWS_PER_S = "sizes are rows, bandwidth is rows/s"

Progress = Callable[[str], None]


@dataclass
class Measurement:
    """One calibrated figure: ``t(bytes) = latency + bytes / bandwidth``.

    ``bandwidth`` is in bytes/s, ``latency`` in seconds; ``samples`` counts the timed repeats over
    all sizes. ``note`` says how it was measured (and anything odd about it). ``sizes`` and
    ``medians`` keep the raw sweep (bytes, median seconds per size). A measurement that could not be
    taken has ``samples == 0`` and NaN figures, with the reason in ``note``."""

    name: str
    bandwidth: float
    latency: float
    samples: int
    note: str = ""
    sizes: list[int] = field(default_factory=list)
    medians: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.samples > 0 and math.isfinite(self.bandwidth) and math.isfinite(self.latency) and self.bandwidth > 0

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {"name": self.name, "bandwidth": num(self.bandwidth), "latency": num(self.latency),
                "samples": self.samples, "note": self.note, "sizes": list(self.sizes),
                "medians": [num(t) for t in self.medians]}

    def summary(self) -> str:
        if not self.ok:
            return f"{self.name:<18} not measured: {self.note}"
        if self.bandwidth >= NO_PER_BYTE_TERM:  # a call's fixed cost only (a nominal, effectively infinite rate)
            bw = "per call"
        elif ROWS_PER_S in self.note:  # sizes are rows (a replay table's calls)
            bw = f"{self.bandwidth / 1e3:.4g}k rows/s"
        else:
            bw = format_quantity(self.bandwidth, Kind.BANDWIDTH)
        lat = format_quantity(self.latency, Kind.TIME) if self.latency > 0 else "0 s"
        sizes = f"{len(self.sizes)} sizes, " if len(self.sizes) > 1 else ""
        return f"{self.name:<18} {bw:>11}  latency {lat:>9}  ({sizes}{self.samples} samples)"


class Measurements(dict):
    """``dict[str, Measurement]`` that also carries the host facts (``.host``: cores, DRAM, disk, ...)."""

    host: dict[str, Any]
    #: workload primitives (:func:`measure_workload_primitives`), when measured
    workload: dict[str, Any]

    def __init__(self, *args, host: dict[str, Any] | None = None, **kw):
        super().__init__(*args, **kw)
        self.host = dict(host or {})
        self.workload = {}


def _failed(name: str, reason: str) -> Measurement:
    return Measurement(name, math.nan, math.nan, 0, reason)


# --- the fit -------------------------------------------------------------------------------------------


def fit_latency_bandwidth(sizes: Sequence[float], times: Sequence[float],
                          anchor: str = "smallest") -> tuple[float, float, str]:
    """Fit ``t = latency + size / bandwidth`` to per-size median times; return ``(latency, bandwidth, how)``.

    Bandwidth comes from the large copies, latency from the small ones: the slope is a least-squares
    line through the larger half of the sizes (at least two), where caches and fixed costs no longer
    decide the time; the latency is what the smallest size's time leaves once its bytes are paid at
    that bandwidth, clamped at >= 0. On exactly linear timings both are recovered exactly.

    ``anchor="largest"``: the latency is the intercept of that least-squares line instead, for a sweep
    whose largest size is the one the workload runs at (a whole train batch): the fit then reproduces
    the time measured there, where a latency read off the smallest size would not (the slope through
    the large sizes misses a small size's time by whatever is not linear in between). Where that
    intercept is negative (a cost that grows faster than the size: PPO's GAE piece on large observations,
    whose value pass frees its activations back to the kernel only above glibc's mmap threshold), the fit
    is the line through the origin and the largest size's median, still exact there; clamping the
    intercept to 0 and keeping the slope would overstate the largest size by the intercept.

    Where the bytes cost under a tenth of the largest size's time (a zero-copy operation such as
    ``ray.get`` or out-of-band pickling), the sweep cannot resolve a bandwidth: it is then the largest
    size over its time (a lower bound) and the latency is the smallest size's time; ``how`` says so."""
    if anchor not in ("smallest", "largest"):
        raise ValueError(f"anchor must be 'smallest' or 'largest', got {anchor!r}")
    s = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if s.shape != t.shape or s.ndim != 1 or s.size == 0:
        raise ValueError("sizes and times must be non-empty sequences of equal length")
    if np.any(t <= 0) or not np.all(np.isfinite(t)) or np.any(s <= 0):
        raise ValueError(f"sizes and times must be positive and finite, got {s.tolist()}, {t.tolist()}")
    order = np.argsort(s, kind="stable")
    s, t = s[order], t[order]
    if np.unique(s).size == 1:
        return 0.0, float(s[-1] / np.median(t)), "one size: bandwidth = size / time, latency 0"
    k = max(2, math.ceil(s.size / 2))
    scale = float(s[-1])  # fit in units of the largest size: a well-conditioned problem
    big_s, big_t = s[-k:] / scale, t[-k:]
    if np.unique(big_s).size < 2:
        big_s, big_t = s / scale, t
    slope, intercept = np.polyfit(big_s, big_t, 1)
    if not (math.isfinite(slope) and slope > 0 and slope >= 0.1 * t[-1]):
        return float(t[0]), float(s[-1] / t[-1]), (
            "time barely grows with size (zero-copy): bandwidth = largest size / its time (a lower bound), "
            "latency = smallest size's time")
    bandwidth = scale / float(slope)
    if anchor == "largest":
        latency = float(intercept)
        how = f"bandwidth and latency = least-squares line through the {k} largest sizes"
        if latency < 0:  # a cost that grows faster than the size: stay exact at the largest size
            return 0.0, float(s[-1] / t[-1]), (
                how + " had a negative latency (the time grows faster than the size): latency 0 and bandwidth = "
                "largest size / its time, exact there")
    else:
        latency = float(t[0] - s[0] / bandwidth)
        how = (f"bandwidth = least-squares slope over the {k} largest sizes, latency = smallest size's time "
               f"less its bytes")
    if latency < 0:
        latency, how = 0.0, how + " (clamped to 0)"
    return latency, bandwidth, how


def refit(sizes: Sequence[float], times: Sequence[float], extra: Mapping[str, Any] | None) -> tuple[float, float, str]:
    """:func:`fit_latency_bandwidth` of a measurement's sweep refitted to other medians (wall clock, the
    medians of repeated runs), the way the sweep itself was fitted: its ``extra["fit_anchor"]``, and the
    rate per sample per epoch where it timed several epochs a call (``extra["epochs_timed"]``)."""
    extra = extra or {}
    lat, rate, how = fit_latency_bandwidth(sizes, times, extra.get("fit_anchor", "smallest"))
    return lat, rate * extra.get("epochs_timed", 1), how


# --- timing helpers ------------------------------------------------------------------------------------


@dataclass
class _Plan:
    quick: bool
    big: list[int]            # memcpy sweep
    mid: list[int]            # shm, pickle, object store, CUDA
    create: list[int]         # shm create+attach
    disk: list[int]
    budget: float             # seconds of timed repeats per size
    min_rep: int
    max_rep: int
    disk_budget: float
    disk_min_rep: int
    disk_max_rep: int
    random_reads: int
    store_fill: int           # 1 MiB objects put to warm the object store


def _plan(quick: bool) -> _Plan:
    def sweep(lo: int, hi: int, step: int = 4) -> list[int]:
        out, s = [], lo
        while s <= hi:
            out.append(s)
            s *= step
        return out

    if quick:
        small = [4 * KiB, 64 * KiB, 1 * MiB, 4 * MiB]
        return _Plan(True, small, small, small[:3], small, budget=0.01, min_rep=3, max_rep=20, disk_budget=0.02,
                     disk_min_rep=2, disk_max_rep=4, random_reads=24, store_fill=48)
    return _Plan(False, sweep(4 * KiB, 256 * MiB), sweep(4 * KiB, 64 * MiB), sweep(4 * KiB, 16 * MiB),
                 sweep(4 * KiB, 256 * MiB, 16), budget=0.7, min_rep=7, max_rep=400, disk_budget=0.8,
                 disk_min_rep=7, disk_max_rep=30, random_reads=200, store_fill=180)


def _sweep(name: str, timed: Callable[[int], float], sizes: Sequence[int], budget: float, min_rep: int,
           max_rep: int, note: str) -> Measurement:
    """Time ``timed(size)`` (which returns the seconds of one repeat) over ``sizes``; fit the medians."""
    medians, samples = [], 0
    for size in sizes:
        timed(size)  # warm-up: first-touch, lazy imports, caches
        probe = timed(size)
        reps = max(min_rep, min(max_rep, int(budget / max(probe, 1e-7))))
        times = [timed(size) for _ in range(reps)]
        medians.append(statistics.median(times))
        samples += reps
    lat, bw, how = fit_latency_bandwidth(sizes, medians)
    return Measurement(name, bw, lat, samples, f"{note}; {_span(sizes)}; median per size, {how}",
                       list(sizes), medians)


def _span(sizes: Sequence[int]) -> str:
    lo, hi = (format_quantity(x, Kind.BYTES) for x in (min(sizes), max(sizes)))
    return f"sizes {lo}..{hi} ({len(sizes)})"


def _clock(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _filled(nbytes: int) -> np.ndarray:
    """A pre-faulted buffer with non-trivial content."""
    a = np.empty(nbytes, dtype=np.uint8)
    a[:] = np.arange(nbytes, dtype=np.uint64).astype(np.uint8) if nbytes <= 1 * MiB else 7
    return a


def _report(progress: Progress | None, m: Measurement) -> Measurement:
    if progress is not None:
        progress(f"calibrate: {m.summary()}")
    return m


# --- host memory -----------------------------------------------------------------------------------------


def _measure_memcpy(plan: _Plan) -> Measurement:
    n = max(plan.big)
    src, dst = _filled(n), _filled(n)
    return _sweep("memcpy", lambda s: _clock(lambda: np.copyto(dst[:s], src[:s])), plan.big, plan.budget,
                  plan.min_rep, plan.max_rep,
                  "numpy.copyto between two preallocated, pre-faulted pageable buffers, one thread")


def _measure_fresh_mapping(quick: bool, progress: Progress | None) -> dict[str, Any]:
    """A fresh mapping's first touch after an idle gap (:func:`conduit.runtime.freshmap.measure`): what the
    simulator charges a learner's batch above glibc's mmap ceiling (``StockCosts.fresh_map``)."""
    from conduit.runtime import freshmap, pagereport

    if quick:
        out = freshmap.measure(freshmap.QUICK_GAPS_S, 1, freshmap.QUICK_BLOCK_BYTES)
    elif pagereport.snapshot() is None:  # no free page reporting: nothing to wait for, the fresh mapping alone
        out = freshmap.measure(freshmap.QUICK_GAPS_S)
        out["note"] += "; short gaps only: this kernel does not report free memory to a host (no page_reporting)"
    else:
        out = freshmap.measure()
    if progress is not None:
        progress(f"calibrate: fresh_mapping      {out['fresh_map_per_byte'] * 2**20 * 1e3:.3f} ms per MiB fresh, "
                 f"+{out['reported_map_per_byte'] * 2**20 * 1e3:.3f} ms per MiB reported, from "
                 f"{out['reported_ramp_from']:.2f} s idle (none) to {out['reported_ramp_to']:.2f} s (all) "
                 f"({out['elapsed_s']:.0f} s)")
    return out


def _measure_shm(plan: _Plan) -> Measurement:
    from multiprocessing import shared_memory

    n = max(plan.mid)
    seg = shared_memory.SharedMemory(create=True, size=n)
    try:
        view = np.ndarray((n,), dtype=np.uint8, buffer=seg.buf)
        src, dst = _filled(n), _filled(n)
        view[:] = 1  # fault the segment in

        def round_trip(s: int) -> float:
            t0 = time.perf_counter()
            np.copyto(view[:s], src[:s])
            np.copyto(dst[:s], view[:s])
            return time.perf_counter() - t0

        m = _sweep("shm", round_trip, plan.mid, plan.budget, plan.min_rep, plan.max_rep,
                   "write into a multiprocessing.shared_memory segment and read it back out (numpy.copyto "
                   "both ways: two copies); bandwidth = bytes delivered end to end")
        view = None  # release the export of seg.buf, or close() fails
        return m
    finally:
        with contextlib.suppress(BufferError):
            seg.close()
        seg.unlink()


def _measure_shm_create(plan: _Plan) -> Measurement:
    from multiprocessing import shared_memory

    src = _filled(max(plan.create))

    def create_attach(s: int) -> float:
        t0 = time.perf_counter()
        seg = shared_memory.SharedMemory(create=True, size=s)
        att = shared_memory.SharedMemory(name=seg.name)
        view = np.ndarray((s,), dtype=np.uint8, buffer=att.buf)
        np.copyto(view, src[:s])
        elapsed = time.perf_counter() - t0
        del view
        att.close()
        seg.close()
        seg.unlink()
        return elapsed

    return _sweep("shm_create", create_attach, plan.create, plan.budget, plan.min_rep, plan.max_rep,
                  "create a fresh shared_memory segment, attach it by name and fill it (teardown untimed): "
                  "latency = create + attach, bandwidth = first-touch fill rate of fresh pages")


def _measure_pickle(plan: _Plan) -> tuple[Measurement, Measurement]:
    src = _filled(max(plan.mid))

    def in_band(s: int) -> float:
        a = src[:s]
        t0 = time.perf_counter()
        pickle.loads(pickle.dumps(a, protocol=5))
        return time.perf_counter() - t0

    def out_of_band(s: int) -> float:
        a = src[:s]
        t0 = time.perf_counter()
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(a, protocol=5, buffer_callback=buffers.append)
        pickle.loads(data, buffers=buffers)
        return time.perf_counter() - t0

    inband = _sweep("pickle", in_band, plan.mid, plan.budget, plan.min_rep, plan.max_rep,
                    "pickle protocol 5 dumps + loads of a uint8 numpy array, buffers in band (two copies)")
    oob = _sweep("pickle_oob", out_of_band, plan.mid, plan.budget, plan.min_rep, plan.max_rep,
                 "pickle protocol 5 dumps + loads with out-of-band buffers (buffer_callback / buffers=: "
                 "no copy of the array's bytes)")
    return inband, oob


# --- disk -------------------------------------------------------------------------------------------------


def _drop_cache(fd: int) -> bool:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    return False


def _mount_of(path: str) -> tuple[str, str, str]:
    """(device, mount point, fs type) of the file system holding ``path``, from /proc/mounts."""
    best = ("?", "/", "?")
    try:
        real = os.path.realpath(path)
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                dev, mnt, fs = parts[0], parts[1].replace("\\040", " "), parts[2]
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best[1]):
                    best = (dev, mnt, fs)
    except OSError:
        pass
    return best


def _measure_disk(plan: _Plan, tmpdir: str | None, host: dict[str, Any]) -> list[Measurement]:
    base = tempfile.mkdtemp(prefix="conduit-calibrate-", dir=tmpdir)
    try:
        usage = shutil.disk_usage(base)
        dev, mnt, fs = _mount_of(base)
        host["disk"] = {"path": base, "capacity": usage.total, "free": usage.free, "device": dev,
                        "mount": mnt, "fstype": fs}
        where = f"in {base} ({fs} on {dev})"
        if fs in ("tmpfs", "ramfs"):
            where += " - a RAM file system: these are memory figures, not disk"
        n = max(plan.disk)
        src = _filled(n)
        counter = iter(range(1 << 30))

        def write(s: int, path: str | None = None) -> float:
            keep = path is not None
            path = path or os.path.join(base, f"w{next(counter)}.bin")
            t0 = time.perf_counter()
            with open(path, "w+b") as fh:
                mm = np.memmap(fh, dtype=np.uint8, mode="w+", shape=(s,))
                np.copyto(mm, src[:s])
                mm.flush()
                os.fsync(fh.fileno())
                del mm
            elapsed = time.perf_counter() - t0
            if not keep:
                os.unlink(path)
            return elapsed

        w = _sweep("disk_write", write, plan.disk, plan.disk_budget, plan.disk_min_rep, plan.disk_max_rep,
                   f"write a new file through numpy.memmap, flush + os.fsync, {where}")

        target = os.path.join(base, "read.dat")
        write(n, target)
        dst = np.empty(n, dtype=np.uint8)
        dst[:] = 0
        fd = os.open(target, os.O_RDONLY)
        try:
            dropped = _drop_cache(fd)

            def read(s: int) -> float:
                _drop_cache(fd)
                view = memoryview(dst)[:s]
                t0 = time.perf_counter()
                done = 0
                while done < s:
                    got = os.preadv(fd, [view[done:]], done)
                    if got <= 0:
                        raise OSError(f"short read of {target} at {done}")
                    done += got
                return time.perf_counter() - t0

            cache = ("after os.posix_fadvise(POSIX_FADV_DONTNEED)" if dropped
                     else "page cache NOT dropped (no posix_fadvise): may read from RAM")
            r = _sweep("disk_read", read, plan.disk, plan.disk_budget, plan.disk_min_rep, plan.disk_max_rep,
                       f"sequential os.preadv of a fsync'ed file {cache}, {where}")

            # QD1 random 4 KiB reads of cold pages, readahead off
            _drop_cache(fd)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            pages = n // (4 * KiB)
            rng = np.random.default_rng(0)
            offsets = rng.choice(pages, size=min(plan.random_reads, pages), replace=False) * 4 * KiB
            buf = bytearray(4 * KiB)
            times = []
            for off in offsets:
                t0 = time.perf_counter()
                os.preadv(fd, [buf], int(off))
                times.append(time.perf_counter() - t0)
            lat = statistics.median(times)
            r4 = Measurement("disk_read_4k", 4 * KiB / lat, lat, len(times),
                             f"{len(times)} random 4 KiB os.preadv of cold pages at queue depth 1 "
                             f"(POSIX_FADV_RANDOM: no readahead), median; bandwidth = 4 KiB / latency; {where}",
                             [4 * KiB], [lat])
        finally:
            os.close(fd)
        return [w, r, r4]
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- Ray object store ------------------------------------------------------------------------------------


class RayStartError(Exception):
    """Ray could not be started for a measurement (the measurement records why and the run goes on)."""


@contextlib.contextmanager
def _local_ray(ray: Any, prefix: str, store: int | None, progress: Progress | None = None,
               num_cpus: int = 1) -> Iterator[bool]:
    """A Ray for a measurement: the running one if there is one, else a local one (``num_cpus``, token auth
    off, usage stats off, its own temp dir, ``store`` bytes of object store, Ray's default where None) shut
    down on exit. Yields whether it was started here. The environment variables it sets are restored and
    the temp dir removed on exit; a failed start raises :class:`RayStartError`."""
    import logging

    own = not ray.is_initialized()
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp" if os.path.isdir("/tmp") else None)
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        if own:
            if progress is not None:
                size = "Ray's default" if store is None else format_quantity(store, Kind.BYTES)
                progress(f"calibrate: starting Ray (num_cpus={num_cpus}, object store {size}, temp dir {tmp})")
            try:
                ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=tmp, object_store_memory=store,
                         log_to_driver=False, logging_level=logging.WARNING)
            except Exception as exc:  # the caller records it and goes on
                first = str(exc).splitlines()[0] if str(exc) else ""
                raise RayStartError(f"Ray failed to start: {type(exc).__name__}: {first}") from exc
        yield own
    finally:
        if own:
            with contextlib.suppress(Exception):
                ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def attached_ray(progress: Progress | None = None) -> Iterator[bool]:
    """A running Ray for the workload primitives (:func:`measure_workload_primitives`; the validation's
    learner primitives and re-timings): the one already running, else a local one as the study's real runs
    start theirs (every CPU of the machine, Ray's default object store), shut down on exit. Yields whether it
    was started here; a failed start raises :class:`RayStartError`.

    Why: every piece of a real run executes in a process attached to a running Ray (the EnvRunners and
    remote learners are its actors, a local learner is its driver), so its primitives are timed in that
    condition too. What the condition changes on the 2-core VM is not settled. PPO's GAE piece on
    ``ppo-largeobs``'s 2,000 fresh samples (one torch thread, alternating blocks in one process) cost
    0.52-0.61 s detached and 0.71-1.34 s attached on 2026-12-07 15:20-15:30 UTC (three experiments), and
    0.53 s either way at 16:01-16:03 (``benchmarks/ray_attached.py`` and a probe). The real learner actor's
    piece took 0.97-1.27 s in the runs of four validation windows (0.55-1.24 s in a probe at 16:04), the
    extra all system time on the same ~190 thousand page faults. What moves it is the VM handing freed memory
    back to its host (:mod:`conduit.runtime.pagereport`): a call that faults in reported pages pays for them,
    and a real run's other processes free much of that memory while its learner waits, which is why PPO's
    learner rounds take their episodes from an EnvRunner actor (:func:`_episode_source`)
    (``results/validation/NOTES.md``)."""
    import ray

    with _local_ray(ray, "conduit-attached-", None, progress, num_cpus=max(1, int(os.cpu_count() or 1))) as own:
        yield own


def _measure_object_store(plan: _Plan, progress: Progress | None, host: dict[str, Any]) -> list[Measurement]:
    names = ("object_store_put", "object_store_get")
    try:
        import ray
    except Exception as exc:  # noqa: BLE001 - any import failure means "no Ray here"
        return [_failed(n, f"ray is not importable ({type(exc).__name__}: {exc})") for n in names]
    host["ray"] = getattr(ray, "__version__", "?")
    store = max(128 * MiB, 4 * max(plan.mid))
    t0 = time.perf_counter()
    try:
        with _local_ray(ray, "rcal-", store, progress) as own:
            if own:
                host["ray_start_s"] = time.perf_counter() - t0
            return _object_store_sweeps(ray, plan, host, own, store)
    except RayStartError as exc:  # record and go on without the object store
        return [_failed(n, str(exc)) for n in names]


def _object_store_sweeps(ray: Any, plan: _Plan, host: dict[str, Any], own: bool, store: int) -> list[Measurement]:
    """ray.put/get sweeps on the Ray that :func:`_local_ray` gave (``own``: started for the purpose;
    ``store``: its object store's bytes)."""
    where = "local Ray started for the purpose" if own else "the already-running Ray instance"
    big = _filled(max(plan.mid))

    # the first large put lands on pages the store has never touched (tmpfs first touch)
    cold_s = _clock(lambda: ray.put(big))
    host["object_store_cold_put_bandwidth"] = big.nbytes / cold_s
    # warm the store's arena: fill most of it with 1 MiB objects, then free them
    one = _filled(1 * MiB)
    fill = min(plan.store_fill, int(0.7 * store / MiB))
    refs = [ray.put(one) for _ in range(fill)]
    del refs
    time.sleep(0.2)

    def put(s: int) -> float:
        a = big[:s]
        t0 = time.perf_counter()
        ref = ray.put(a)
        elapsed = time.perf_counter() - t0
        del ref
        return elapsed

    refs_by_size = {s: ray.put(big[:s]) for s in plan.mid}

    def get(s: int) -> float:
        t0 = time.perf_counter()
        value = ray.get(refs_by_size[s])
        elapsed = time.perf_counter() - t0
        del value
        return elapsed

    cold = format_quantity(big.nbytes / cold_s, Kind.BANDWIDTH)
    p = _sweep("object_store_put", put, plan.mid, plan.budget, plan.min_rep, plan.max_rep,
               f"ray.put of a uint8 numpy array, {where}, warm store (filled with 1 MiB objects and freed "
               f"first); the first, cold put of {format_quantity(big.nbytes, Kind.BYTES)} ran at {cold} "
               f"(first touch of the store's shared memory)")
    g = _sweep("object_store_get", get, plan.mid, plan.budget, plan.min_rep, plan.max_rep,
               f"ray.get of a stored numpy array, {where} (objects over 100 KiB map the store's memory: "
               f"zero-copy, read-only)")
    refs_by_size.clear()
    return [p, g]


# --- the plane's own primitives (PlaneCosts) ----------------------------------------------------------


def _plane_sizes(quick: bool) -> list[int]:
    return [4 * KiB, 64 * KiB, 1 * MiB] if quick else [4 * KiB, 64 * KiB, 1 * MiB, 4 * MiB, 16 * MiB]


def _measure_plane_inprocess(plan: _Plan) -> list[Measurement]:
    """``ExperiencePlane.ingest`` and ``next_batch`` + ``release`` of one uint8 chunk per call, in
    process (OnPolicy, one learner, a batch of exactly one chunk, pageable host tiers): the work a plane
    actor does per call, without the Ray round trip."""
    from conduit.contracts import OnPolicy
    from conduit.runtime.plane import ExperiencePlane
    from conduit.runtime.schema import Schema

    sizes = _plane_sizes(plan.quick)
    ingest_t: dict[int, list[float]] = {}
    deliver_t: dict[int, list[float]] = {}
    samples = 0
    for size in sizes:
        steps = 64
        width = max(1, size // steps)
        schema = Schema.of({"obs": ((width,), "uint8")})
        payload = {"obs": np.full((steps, width), 7, dtype=np.uint8)}
        caps = {"pageable": max(64 * MiB, 8 * size), "nvme": max(64 * MiB, 8 * size)}
        reps = max(plan.min_rep, min(plan.max_rep // 4, int(plan.budget * 4 / max(size / 2e9, 1e-5))))
        try:
            plane = ExperiencePlane(schema, OnPolicy(), batch_steps=steps, policy="host-only", capacities=caps,
                                    prefetch_depth=0)
        except Exception as exc:  # noqa: BLE001 - record why; the simulator keeps its defaults
            reason = f"could not build an in-process plane: {type(exc).__name__}: {exc}"
            return [_failed("plane_ingest", reason), _failed("plane_deliver", reason)]
        with plane:
            for v in range(reps + 1):
                t0 = time.perf_counter()
                plane.ingest(payload, policy_version=v)
                t1 = time.perf_counter()
                batch = plane.next_batch(update=v, timeout=10)
                batch.release()
                t2 = time.perf_counter()
                plane.set_policy_version(v + 1)
                if v:  # the first call of a size warms its slots
                    ingest_t.setdefault(size, []).append(t1 - t0)
                    deliver_t.setdefault(size, []).append(t2 - t1)
        samples += reps
    out = []
    for name, table, what in (("plane_ingest", ingest_t, "ExperiencePlane.ingest of one chunk (copy into a tier)"),
                              ("plane_deliver", deliver_t,
                               "ExperiencePlane.next_batch + release of a one-chunk batch (copy out)")):
        medians = [statistics.median(table[s]) for s in sizes]
        lat, bw, how = fit_latency_bandwidth(sizes, medians)
        out.append(Measurement(name, bw, lat, samples, f"{what}, in process, host-only policy, OnPolicy; "
                               f"{_span(sizes)}; median per size, {how}", list(sizes), medians))
    return out


#: the episode runs' length in :func:`_measure_rebuild` (CartPole-sized rows: the per-run cost is the episode
#: object's construction; a larger row's observations are copied at ``memcpy``'s bandwidth besides)
REBUILD_RUN_STEPS = 25


def _trajectory_batch(runs: int, steps: int) -> tuple[dict[str, np.ndarray], list, dict]:
    """A delivered trajectory batch of ``runs`` whole episodes of ``steps`` CartPole-sized steps, as
    ``PlaneCluster.next_batch`` hands it to the learner (columns, selections, annotations): numpy-ized
    episodes packed by the EnvRunner's own :func:`~conduit.runtime.rllib.layout.pack_trajectories`, 8 a chunk."""
    import gymnasium as gym
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from conduit.runtime.rllib.layout import pack_trajectories, trajectory_schema

    schema = trajectory_schema(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2), 2)
    rng = np.random.default_rng(0)
    episodes = [SingleAgentEpisode(observations=list(rng.standard_normal((steps + 1, 4)).astype(np.float32)),
                                   actions=[0] * steps, rewards=[1.0] * steps, terminated=True,
                                   extra_model_outputs={"action_logp": [0.0] * steps,
                                                        "action_dist_inputs": [np.zeros(2, np.float32)] * steps},
                                   len_lookback_buffer=0).to_numpy() for _ in range(runs)]
    parts: dict[str, list[np.ndarray]] = {}
    selections, annotations, row = [], {}, 0
    for c, first in enumerate(range(0, runs, 8)):
        payload, annotation = pack_trajectories(episodes[first:first + 8], schema, version=1)
        count = len(payload["obs"])
        for name, column in payload.items():
            parts.setdefault(name, []).append(column)
        selections.append((c, np.arange(row, row + count)))
        annotations[c] = annotation
        row += count
    return {name: np.concatenate(p) for name, p in parts.items()}, selections, annotations


def _measure_rebuild(plan: _Plan) -> Measurement:
    """``layout.py: rebuild_trajectories`` -- what a learner under ``enable()`` does with every delivered
    trajectory batch (PPO at update start, APPO/IMPALA in its prefetch thread) before RLlib's connector:
    one ``SingleAgentEpisode`` per episode run. Process CPU time, n = 8..256 runs of
    :data:`REBUILD_RUN_STEPS` steps: sizes are runs, "bandwidth" is runs per second."""
    try:
        import gymnasium as gym

        from conduit.runtime.rllib.layout import rebuild_trajectories
    except ImportError as exc:
        return _failed("plane_rebuild", f"needs ray[rllib] and gymnasium: {exc}")
    spaces = {"observation_space": gym.spaces.Box(-1.0, 1.0, (4,), np.float32), "action_space": gym.spaces.Discrete(2)}
    sizes = [8, 64] if plan.quick else [8, 32, 128, 256]
    medians, samples = [], 0
    for runs in sizes:
        batch = _trajectory_batch(runs, REBUILD_RUN_STEPS)

        def one(batch: tuple = batch) -> float:
            c0 = time.process_time()
            rebuild_trajectories(*batch, **spaces)
            return time.process_time() - c0

        one()  # warm-up: lazy imports
        times = [one() for _ in range(max(plan.min_rep, 5 if plan.quick else 25))]
        medians.append(statistics.median(times))
        samples += len(times)
    lat, bw, how = fit_latency_bandwidth(sizes, medians)
    return Measurement("plane_rebuild", bw, lat, samples,
                       f"rebuild_trajectories of a trajectory batch of n whole episodes of {REBUILD_RUN_STEPS} "
                       f"CartPole-sized steps (chunks of 8 pieces), process CPU time, one thread; runs "
                       f"{sizes[0]}..{sizes[-1]} ({len(sizes)}): sizes are episode runs, bandwidth is runs/s; "
                       f"median per size, {how}", list(sizes), medians)


#: a DQN transition row as the runtime's transition layout carries it (CartPole-sized: the per-row cost of a
#: draw is its bookkeeping; a larger row's bytes are ``plane_deliver``'s copy bandwidth)
_TRANSITION = {"obs": ((4,), "float32"), "new_obs": ((4,), "float32"), "actions": ((), "int64"),
               "rewards": ((), "float32"), "terminateds": ((), "bool"), "truncateds": ((), "bool")}


def _replay_calls(cluster: Any, rng: np.random.Generator) -> tuple[Callable[[], None], Callable[[], None]]:
    """A learner's two replay calls on ``cluster``: draw a batch, and update the priorities of the last one drawn."""
    last = [cluster.next_batch("l", timeout=60).replay_ids]

    def draw() -> None:
        last[0] = cluster.next_batch("l", timeout=60).replay_ids

    def update() -> None:
        cluster.update_priorities("l", last[0], rng.uniform(0.1, 2.0, len(last[0])), timeout=60)

    return draw, update


def _measure_replay_actor(ray: Any, plan: _Plan) -> list[Measurement]:
    """What a prioritized Replay table's two calls cost the plane actor's process, as ``enable()`` deploys
    DQN's table (its recovery journal on, as with the default ``max_restarts``): ``PlaneCluster.next_batch``
    of n transition rows (the draw, the copy of every column out, the reply: ``plane_replay_draw``) and
    ``update_priorities`` of that batch's n ids (``plane_replay_priorities``), each the actor's CPU per call
    (every thread, less its idle burn: :func:`conduit.runtime.proccpu.callee_cpu_per_call`), n = 16..256
    rows. Sizes are rows, so a figure's "bandwidth" is rows per second."""
    from conduit.contracts import Prioritized, Replay
    from conduit.runtime.callgap import cold_figures, gap_costs
    from conduit.runtime.proccpu import callee_cpu_per_call
    from conduit.runtime.ray_plane import PlaneCluster

    sizes = [16, 64] if plan.quick else [16, 64, 256]
    calls, blocks, idle = (20, 2, 0.1) if plan.quick else (100, 3, 0.5)
    per_chunk = 8
    rows = max(2048, 8 * max(sizes))
    chunk = {k: np.zeros((per_chunk, *shape), dtype=dtype) for k, (shape, dtype) in _TRANSITION.items()}
    rng = np.random.default_rng(0)
    draw, prio = [], []
    cold: dict[str, tuple[list[dict[str, float]], float]] = {}
    for n in sizes:
        cluster = PlaneCluster.start(_TRANSITION, Replay(capacity=rows, replay_ratio=1.0, min_size=1, error_buffer=1e12,
                                                         sampler=Prioritized()),
                                     batch_steps=n, learners={"l": "local"}, capacities={"pageable": 64 * MiB},
                                     actor_options={"num_cpus": 0}, max_restarts=3)
        try:
            for v in range(rows // per_chunk):
                cluster.ingest(chunk, policy_version=v, timeout=60)
            pid = int(ray.get(cluster.actor(cluster.nodes[0]).pid.remote(), timeout=60))
            one_draw, one_update = _replay_calls(cluster, rng)
            draw.append(callee_cpu_per_call(one_draw, pid, calls=calls, blocks=blocks, idle_s=idle))
            prio.append(callee_cpu_per_call(one_update, pid, calls=calls, blocks=blocks, idle_s=idle))
            if n == COLD_ROWS:  # the same calls back to back and spaced, side by side: the cold surcharge
                for name, call in (("plane_replay_draw_cold", one_draw), ("plane_replay_priorities_cold", one_update)):
                    rows_ = gap_costs(call, None, pid, (0.0, SPACED_SLEEP_S), calls=calls, blocks=blocks, idle_s=idle)
                    cold[name] = (rows_, cold_figures(rows_)["callee_cpu_s"])
        finally:
            with contextlib.suppress(Exception):
                cluster.shutdown()
    out = []
    for name, medians, what in (
            ("plane_replay_draw", draw, "PlaneCluster.next_batch of n rows (the draw, the copy out, the reply)"),
            ("plane_replay_priorities", prio, "PlaneCluster.update_priorities of a batch's n ids")):
        lat, bw, how = fit_latency_bandwidth(sizes, medians)
        out.append(Measurement(name, bw, lat, calls * blocks * len(sizes),
                               f"the PlaneActor process's CPU (every thread, schedstat) per {what}, less its idle "
                               f"burn over the same wall time, on a prioritized Replay table of {rows} transition "
                               f"rows in chunks of {per_chunk}, recovery journal on (max_restarts=3, enable()'s "
                               f"default); median of {blocks} blocks of {calls} calls per size; rows "
                               f"{sizes[0]}..{sizes[-1]} ({len(sizes)}): {ROWS_PER_S}; {how}",
                               list(sizes), medians))
    for name, (rows_, extra) in cold.items():
        what = "next_batch" if "draw" in name else "update_priorities"
        out.append(_cold_measurement(name, extra, calls * blocks * 2,
                                     f"what a PlaneCluster.{what} of {COLD_ROWS} rows adds to the PlaneActor "
                                     f"process's CPU (as above) when it comes {SPACED_SLEEP_S * 1e3:g} ms after the "
                                     f"previous call instead of back to back", rows_, "callee_cpu_s"))
    return out


def _cold_measurement(name: str, extra: float, samples: int, what: str, rows: list[dict[str, float]],
                      figure: str) -> Measurement:
    """A cold-call surcharge (:mod:`conduit.sim.raycalls`) as a per-call figure: ``latency`` is ``extra``
    seconds; ``sizes`` the sleeps before the calls (ns) and ``medians`` the figure at each."""
    return Measurement(name, NOMINAL_RATE, extra, samples,
                       f"{what}: the spaced median less the back-to-back one (benchmarks/call_gap.py's method, "
                       f"conduit.runtime.callgap); latency is seconds per call, no per-byte term",
                       [round(r["sleep_s"] * 1e9) for r in rows], [r[figure] for r in rows])


def _measure_plane_actor(plan: _Plan, host: dict[str, Any]) -> list[Measurement]:
    """The round trip of one call to a Ray ``PlaneActor`` that does no plane work
    (``PlaneCluster.set_policy_version``), on a local one-CPU Ray started for the purpose
    (``plane_actor_call``), and what the same call costs the actor's process in CPU, every thread, less
    its idle burn (``plane_actor_callee``; Linux ``/proc``)."""
    name, callee_name = "plane_actor_call", "plane_actor_callee"
    per_call = (callee_name, "plane_replay_draw", "plane_replay_priorities")  # the actor's CPU per call
    try:
        import ray
    except Exception as exc:  # noqa: BLE001 - any import failure means "no Ray here"
        reason = f"ray is not importable ({type(exc).__name__}: {exc})"
        return [_failed(n, reason) for n in (name, *per_call)]
    from conduit.contracts import OnPolicy
    from conduit.runtime.callgap import cold_figures, gap_costs
    from conduit.runtime.proccpu import callee_cpu_per_call
    from conduit.runtime.ray_plane import PlaneCluster

    cpu_figures = [_failed(n, "needs Linux /proc/<pid>/task") for n in per_call]

    try:
        with _local_ray(ray, "rcalp-", 128 * MiB):
            cluster = PlaneCluster.start({"x": "float32"}, OnPolicy(), batch_steps=8, learners={"l": "local"},
                                         capacities={"pageable": 8 * MiB, "nvme": 8 * MiB},
                                         actor_options={"num_cpus": 0})
            try:
                reps = 30 if plan.quick else 300
                times = []
                for v in range(reps + 5):
                    t0 = time.perf_counter()
                    cluster.set_policy_version(v)
                    if v >= 5:
                        times.append(time.perf_counter() - t0)
                if os.path.isdir("/proc/self/task"):
                    pid = int(ray.get(cluster.actor(cluster.nodes[0]).pid.remote(), timeout=60))
                    version = itertools.count(reps + 5)
                    calls, blocks = (40, 3) if plan.quick else (200, 5)
                    cpu = callee_cpu_per_call(lambda: cluster.set_policy_version(next(version), timeout=60), pid,
                                              calls=calls, blocks=blocks, idle_s=0.1 if plan.quick else 0.5)
                    callee = Measurement(callee_name, NOMINAL_RATE, cpu, calls * blocks,
                                         f"the PlaneActor process's CPU (every thread, schedstat) per "
                                         f"PlaneCluster.set_policy_version call it serves, less its idle burn over "
                                         f"the same wall time; median of {blocks} blocks of {calls} calls; latency "
                                         f"is CPU seconds per call, no per-byte term", [0], [cpu])
                    cpu_figures = [callee]
                    rows_ = gap_costs(lambda: cluster.set_policy_version(next(version), timeout=60), None, pid,
                                      (0.0, SPACED_SLEEP_S), calls=calls // 2, blocks=3,
                                      idle_s=0.1 if plan.quick else 0.5)
                    extra = cold_figures(rows_)
                    what = f"PlaneCluster.set_policy_version {SPACED_SLEEP_S * 1e3:g} ms after the previous call"
                    cpu_figures += [_cold_measurement("plane_actor_call_cold", extra["wall_s"], calls // 2 * 2,
                                                      f"what {what} adds to its round trip (wall)", rows_, "wall_s"),
                                    _cold_measurement("plane_actor_callee_cold", extra["callee_cpu_s"],
                                                      calls // 2 * 3 * 2,
                                                      f"what {what} adds to the PlaneActor process's CPU", rows_,
                                                      "callee_cpu_s")]
            finally:  # before the Ray it runs on ends
                with contextlib.suppress(Exception):
                    cluster.shutdown()
            if os.path.isdir("/proc/self/task"):
                cpu_figures.extend(_measure_replay_actor(ray, plan))
    except RayStartError as exc:  # record and go on
        return [_failed(n, str(exc)) for n in (name, *per_call)]
    except Exception as exc:  # noqa: BLE001 - record why
        reason = f"{type(exc).__name__}: {exc}"
        return [_failed(n, reason) for n in (name, *per_call)]
    lat = statistics.median(times)
    # a control call carries no payload: no per-byte term (a nominal, effectively infinite bandwidth)
    return [Measurement(name, NOMINAL_RATE, lat, reps,
                        "PlaneCluster.set_policy_version on a local PlaneActor (a control call: no payload, "
                        "no plane work), wall time, median; latency is the round trip, no per-byte term",
                        [0], [lat]), *cpu_figures]


def measure_plane(quick: bool = False, ray: bool = True, progress: Progress | None = None) -> Measurements:
    """The plane's primitives (see the module docstring), plus ``memcpy`` (an EnvRunner packing
    columns): what :func:`conduit.sim.cost_file.load_plane_costs` turns into
    :class:`~conduit.sim.params.PlaneCosts`. ``ray=False`` skips the actor round trip."""
    plan = _plan(quick)
    out = Measurements(host=host_facts())
    for m in (_measure_memcpy(plan), *_measure_plane_inprocess(plan), _measure_rebuild(plan)):
        out[m.name] = _report(progress, m)
    if ray:
        for m in _measure_plane_actor(plan, out.host):
            out[m.name] = _report(progress, m)
    return out


# --- CUDA ---------------------------------------------------------------------------------------------------


def _measure_cuda(plan: _Plan, host: dict[str, Any]) -> list[Measurement]:
    import torch

    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    host["gpu"] = {"name": props.name, "memory": int(props.total_memory), "count": torch.cuda.device_count()}
    host["torch_cuda"] = torch.version.cuda
    n = max(plan.big)
    pageable = torch.empty(n, dtype=torch.uint8)
    pageable.fill_(3)
    pinned = pageable.pin_memory()  # once: pinning itself is slow and not what we time
    gpu = torch.empty(n, dtype=torch.uint8, device=dev)
    gpu2 = torch.empty(n, dtype=torch.uint8, device=dev)
    gpu.fill_(1)
    gpu2.fill_(2)
    torch.cuda.synchronize(dev)

    def copier(dst: torch.Tensor, src: torch.Tensor) -> Callable[[int], float]:
        def run(s: int) -> float:
            t0 = time.perf_counter()
            dst[:s].copy_(src[:s], non_blocking=True)
            torch.cuda.synchronize(dev)
            return time.perf_counter() - t0

        return run

    how = "torch copy_(non_blocking=True) + torch.cuda.synchronize(), timed on the host"
    out = []
    for name, dst, src, what in (
        ("h2d_pinned", gpu, pinned, "pinned host -> device"),
        ("h2d_pageable", gpu, pageable, "pageable host -> device"),
        ("d2h_pinned", pinned, gpu, "device -> pinned host"),
        ("d2h_pageable", pageable, gpu, "device -> pageable host"),
        ("d2d", gpu2, gpu, "device -> device (reads + writes HBM: memory bandwidth = 2x)"),
    ):
        out.append(_sweep(name, copier(dst, src), plan.big, plan.budget, plan.min_rep, plan.max_rep,
                          f"{what}, {props.name}; {how}"))
    del pageable, pinned, gpu, gpu2
    torch.cuda.empty_cache()
    return out


# --- host facts ------------------------------------------------------------------------------------------


def host_facts() -> dict[str, Any]:
    """Cores, DRAM, CPU model, OS and library versions of this machine (no measurement)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    dram = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    dram = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if dram is None:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            dram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    model = None
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu_model": model or platform.processor() or None,
        "cores": cores,
        "cpu_count": os.cpu_count(),
        "dram_capacity": dram,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        facts["torch"] = torch.__version__
    else:
        from importlib import metadata

        with contextlib.suppress(metadata.PackageNotFoundError):
            facts["torch"] = metadata.version("torch")
    return facts


# --- the whole machine ---------------------------------------------------------------------------------


def measure_machine(quick: bool = False, ray: bool = True, disk: bool = True, progress: Progress | None = None,
                    tmpdir: str | None = None, workloads: dict[str, tuple[str, Any]] | None = None) -> Measurements:
    """Measure this machine; returns :class:`Measurements` (a ``dict[str, Measurement]`` with ``.host``).

    ``quick`` uses small sizes and few repeats (a few seconds); on a VM that reports free memory to its
    host, the full run's fresh-mapping rounds (:mod:`conduit.runtime.freshmap`: idle gaps of up to 4 s) add about
    75 s to the rest. ``ray=False`` skips the object store, ``disk=False`` the disk. ``progress`` receives one
    line per measurement. ``tmpdir`` is where the disk test writes (default: the system temp dir);
    it is cleaned up. ``workloads`` (``{name: (algo, AlgorithmConfig)}``, e.g.
    :func:`default_workload_configs`) adds the workload primitives of those RLlib configs
    (:func:`measure_workload_primitives`) as ``.workload``."""
    plan = _plan(quick)
    facts = host_facts()
    from importlib import metadata

    with contextlib.suppress(metadata.PackageNotFoundError):
        facts.setdefault("ray", metadata.version("ray"))
    facts["mode"] = "quick" if quick else "full"
    out = Measurements(host=facts)
    started = time.perf_counter()
    if progress is not None:
        progress(f"calibrate: measuring {facts['hostname']} ({facts['cores']} cores, "
                 f"{'quick' if quick else 'full'} run)")

    def keep(*ms: Measurement) -> None:
        for m in ms:
            if m.samples == 0:
                log.warning("calibrate: %s not measured: %s", m.name, m.note)
            out[m.name] = _report(progress, m)

    keep(_measure_memcpy(plan))
    out.host["fresh_mapping"] = _measure_fresh_mapping(quick, progress)
    keep(_measure_shm(plan))
    keep(_measure_shm_create(plan))
    keep(*_measure_pickle(plan))
    if disk:
        keep(*_measure_disk(plan, tmpdir, out.host))
    if workloads:  # under their own Ray (attached_ray), shut down before the object store's starts
        out.workload = measure_workload_primitives(workloads, quick=quick, progress=progress)
        out.host["contention"] = _measure_contention(quick, progress)
    if ray:
        keep(*_measure_object_store(plan, progress, out.host))
    if cuda_available():
        keep(*_measure_cuda(plan, out.host))
    else:
        out.host["cuda"] = False
        if progress is not None:
            why = ("torch.cuda.is_available() is False" if installed("torch")
                   else f"torch is not installed: {install_hint('runtime')}")
            progress(f"calibrate: no CUDA ({why}): pinned and host<->device copies not measured")
    out.host["elapsed_s"] = time.perf_counter() - started
    return out


# --- YAML -------------------------------------------------------------------------------------------------


def _bw(x: float) -> str:
    return format_quantity(x, Kind.BANDWIDTH)


def _t(x: float) -> str:
    return format_quantity(x, Kind.TIME) if x > 0 else "0 s"


def _b(x: float) -> str:
    return format_quantity(x, Kind.BYTES)


_QUANTITY_TEXT = re.compile(r"^[0-9][0-9.e+-]* [A-Za-z]+(/s)?$")


def _scalar(value: Any) -> str:
    """A YAML flow scalar: unit quantities and plain words bare, anything else JSON-quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if _QUANTITY_TEXT.match(text):
        return text
    safe = text == text.strip() and text[:1].isalpha() and all(c.isalnum() or c in " ./-_()+" for c in text)
    return text if safe and text.lower() not in ("yes", "no", "true", "false", "null", "on", "off") else json.dumps(text)


def _flow(fields: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {_scalar(v)}" for k, v in fields.items() if v is not None) + "}"


def _comment(text: str, indent: str = "", hang: str = "  ", first: str = "") -> list[str]:
    lines = textwrap.wrap(text, width=110 - len(indent), initial_indent=first, subsequent_indent=hang,
                          break_on_hyphens=False, break_long_words=False)
    return [f"{indent}# {line}".rstrip() for line in lines]


def _measure_contention(quick: bool, progress: Progress | None) -> dict[str, Any]:
    """What CPU work costs while every core is taken (:mod:`conduit.runtime.contention`), for the
    topology's ``oversubscribed_cpu_cost``; a failure is recorded (and the cost left unmeasured)."""
    from conduit.runtime import contention, wakeup

    try:
        out = contention.measure(_named_env_runner, pairs=3 if quick else 8, window=0.15 if quick else 0.4,
                                 progress=progress)
    except Exception as exc:  # noqa: BLE001 - recorded, and the topology says it was not measured
        log.warning("calibrate: contention not measured: %s: %s", type(exc).__name__, exc)
        out = {"oversubscribed_cpu_cost": None, "note": f"not measured: {type(exc).__name__}: {exc}"}
    try:  # how the kernel serves a thread that wakes while every core is taken (topology: wake_*)
        out["wakeup"] = wakeup.measure(pairs=2 if quick else 8, wakes=10 if quick else 40, progress=progress)
    except Exception as exc:  # noqa: BLE001 - recorded, and the topology says it was not measured
        log.warning("calibrate: wake-up not measured: %s: %s", type(exc).__name__, exc)
        out["wakeup"] = {"wake_slice_time": None, "note": f"not measured: {type(exc).__name__}: {exc}"}
    return out


def topology_yaml(measurements: dict[str, Measurement], name: str | None = None) -> str:
    """An explicit-form topology (YAML text) of the measured machine, with a sourced header comment.

    Devices: ``cpu0``, ``dram0`` (memcpy, shm, pickle and object-store figures as attributes), ``nvme0``
    when the disk was measured, ``gpu0`` when CUDA was. Links: ``cpu0``-``dram0`` (memcpy),
    ``cpu0``-``nvme0`` (sequential read bandwidth, 4 KiB read latency), ``gpu0``-``dram0`` (pinned
    host->device)."""
    host = dict(getattr(measurements, "host", None) or host_facts())
    ms = {k: m for k, m in measurements.items() if m.ok}
    if "memcpy" not in ms:
        raise ConduitError("a calibrated topology needs the 'memcpy' measurement (DRAM bandwidth)")
    hostname = host.get("hostname") or socket.gethostname()
    name = name or f"calibrated-{hostname}"
    cores = int(host.get("cores") or os.cpu_count() or 1)
    dram = host.get("dram_capacity")
    if not dram:
        raise ConduitError("cannot tell this machine's DRAM capacity (no /proc/meminfo, no sysconf)")
    memcpy = ms["memcpy"]
    gpu = host.get("gpu") if "h2d_pinned" in ms else None

    versions = ", ".join(f"{k} {host[k]}" for k in ("python", "numpy", "torch", "ray") if host.get(k))
    head = [
        f"# Calibrated topology of {hostname}, written by `conduit calibrate` (explicit form).",
        *_comment(f"Measured {host.get('date', '?')} on {hostname}: {host.get('platform', '?')}; "
                  f"CPU {host.get('cpu_model') or 'unknown'}, {cores} usable cores; {versions}. "
                  f"{host.get('mode', 'full').capitalize()} run"
                  + (f", {host['elapsed_s']:.0f} s." if host.get("elapsed_s") else ".")),
        "#",
        *_comment("Method: each figure is a size sweep; per size the median of N repeats timed with "
                  "time.perf_counter (Python call overhead included: this is what Conduit's Python runtime "
                  "pays). Fit of t = latency + bytes / bandwidth: bandwidth = least-squares slope over the "
                  "larger half of the sizes (large copies), latency = the smallest size's time less its "
                  "bytes at that bandwidth (small copies), clamped at >= 0."
                  + (" Quick run: small sizes that fit in caches, few repeats: rough figures."
                     if host.get("mode") == "quick" else "")),
        "#",
        "# Sources",
    ]
    for m in measurements.values():
        if m.ok:
            head += _comment(f"[{m.name}] {_bw(m.bandwidth)}, latency {_t(m.latency)}, {m.samples} samples: "
                             f"{m.note}.", first="  ", hang="      ")
        else:
            head += _comment(f"[{m.name}] not measured: {m.note}.", first="  ", hang="      ")
    head += _comment(f"[host] os.sched_getaffinity: {cores} cores; /proc/meminfo MemTotal: {_b(dram)}; "
                     f"/proc/cpuinfo model name: {host.get('cpu_model') or 'unreadable'}.", first="  ", hang="      ")
    if host.get("disk"):
        d = host["disk"]
        head += _comment(f"[disk] shutil.disk_usage({d['path']}): {_b(d['capacity'])} total, {_b(d['free'])} free "
                         f"({d['fstype']} on {d['device']}, mounted at {d['mount']}).", first="  ", hang="      ")
    if gpu:
        head += _comment(f"[gpu] torch.cuda.get_device_properties: {gpu['name']}, {_b(gpu['memory'])} "
                         f"(CUDA {host.get('torch_cuda')}); {gpu['count']} device(s), gpu0 is the current one.",
                         first="  ", hang="      ")
    else:
        head += _comment("No CUDA (torch.cuda.is_available() is False): pinned memory and host<->device copies "
                         "were not measured, so this file has no gpu device and no pinned-specific figures.")
    head += _comment("Variance: figures of a shared machine (a VM shares its host's caches, memory bus and "
                     "disk with other guests); expect +-30% between runs. Re-run `conduit calibrate` rather "
                     "than trusting a single run to a few percent.")
    head.append(f"name: {_scalar(name)}")

    body = ["devices:"]
    body += _comment(f"--- CPU: {cores} usable cores [host] ---", indent="  ")
    cpu: dict[str, Any] = {"id": "cpu0", "kind": "cpu", "model": host.get("cpu_model"), "cores": cores}
    contended = host.get("contention") or {}
    if contended.get("oversubscribed_cpu_cost"):
        cpu["oversubscribed_cpu_cost"] = round(float(contended["oversubscribed_cpu_cost"]), 4)
        body += _comment(f"oversubscribed_cpu_cost: {cpu['oversubscribed_cpu_cost']} [contention] "
                         f"({contended.get('note', '')}).", indent="  ")
    elif contended:
        body += _comment(f"oversubscribed_cpu_cost: {contended.get('note', 'not measured')} (default 1: none).",
                         indent="  ")
    woken = contended.get("wakeup") or {}
    if woken.get("wake_slice_time"):
        cpu["wake_latency"] = _t(float(woken["wake_latency"]))
        cpu["wake_slice_time"] = _t(float(woken["wake_slice_time"]))
        body += _comment(f"wake_latency: {cpu['wake_latency']}, wake_slice_time: {cpu['wake_slice_time']} "
                         f"[wakeup] ({woken.get('note', '')}).", indent="  ")
    elif woken:
        body += _comment(f"wake_latency, wake_slice_time: {woken.get('note', 'not measured')} (default: a woken "
                         f"thread queues first in, first out).", indent="  ")
    body.append("  - " + _flow(cpu))
    body.append("")

    # DRAM
    capacity = _b(dram)
    pinned_cap = _b(parse_quantity(capacity, Kind.BYTES) / 2)
    dram_fields: dict[str, Any] = {"id": "dram0", "kind": "memory", "model": "host DRAM", "capacity": capacity,
                                   "bandwidth": _bw(memcpy.bandwidth), "pinned_capacity": pinned_cap,
                                   "pageable_copy_bandwidth": _bw(memcpy.bandwidth)}
    notes = ["--- Host DRAM [host] [memcpy] ---",
             (f"bandwidth: {_bw(memcpy.bandwidth)}, single-thread memcpy [memcpy] (a memcpy-class figure, "
              f"not the DRAM peak).")]
    if gpu and "h2d_pageable" in ms:
        pin, pag = ms["h2d_pinned"].bandwidth, ms["h2d_pageable"].bandwidth
        if pag < pin:
            staging = 1.0 / (1.0 / pag - 1.0 / pin)
            dram_fields["pageable_copy_bandwidth"] = _bw(staging)
            notes.append(f"pageable_copy_bandwidth: {_bw(staging)} = the staging memcpy implied by pageable "
                         f"{_bw(pag)} vs pinned {_bw(pin)} host->device (1/pageable - 1/pinned) "
                         f"[h2d_pageable] [h2d_pinned].")
        else:
            notes.append(f"pageable_copy_bandwidth: {_bw(memcpy.bandwidth)} [memcpy]: pageable host->device was "
                         f"not slower than pinned here ({_bw(pag)} vs {_bw(pin)}).")
        notes.append(f"pinned_capacity: {pinned_cap}, the default half of capacity (not measured).")
    else:
        notes.append(f"pageable_copy_bandwidth: {_bw(memcpy.bandwidth)}: with no CUDA, any staging copy is one "
                     f"memcpy [memcpy].")
        notes.append(f"pinned_capacity: {pinned_cap}, the default half stated explicitly: pinned memory was not "
                     f"measured because there is no CUDA (it only matters for tier capacity accounting).")
    extras = [("shm_bandwidth", "shm", "bandwidth"), ("shm_latency", "shm", "latency"),
              ("shm_create_latency", "shm_create", "latency"), ("pickle_bandwidth", "pickle", "bandwidth"),
              ("pickle_latency", "pickle", "latency"), ("pickle_oob_latency", "pickle_oob", "latency"),
              ("object_store_put_bandwidth", "object_store_put", "bandwidth"),
              ("object_store_get_bandwidth", "object_store_get", "bandwidth"),
              ("object_store_latency", "object_store_put", "latency"),
              ("object_store_get_latency", "object_store_get", "latency")]
    for key, mname, what in extras:
        if mname in ms:
            value = getattr(ms[mname], what)
            dram_fields[key] = _bw(value) if what == "bandwidth" else _t(value)
    if host.get("object_store_cold_put_bandwidth") and "object_store_put" in ms:
        dram_fields["object_store_cold_put_bandwidth"] = _bw(host["object_store_cold_put_bandwidth"])
    notes.append("Extra attributes for the runtime: shm_* [shm] [shm_create] (shm_bandwidth counts bytes "
                 "delivered through a segment: written in and read out), pickle_* [pickle] [pickle_oob] "
                 "(dumps + loads), object_store_* [object_store_put] [object_store_get] "
                 "(object_store_latency is the put latency; the cold put rate is the first put into "
                 "untouched store memory).")
    if "object_store_get" in ms and "zero-copy" in ms["object_store_get"].note.split(";")[-1]:
        notes.append(f"object_store_get_bandwidth: ray.get took about {_t(ms['object_store_get'].latency)} whatever "
                     f"the size (it maps the stored object, zero-copy), so this is only the largest size over its "
                     f"time, a lower bound; reading the array afterwards costs memcpy-class bandwidth.")
    missing = [k for k in ("shm", "pickle", "object_store_put") if k not in ms]
    if "object_store_put" in missing and "object_store_put" in measurements:
        notes.append(f"Object store not measured: {measurements['object_store_put'].note}.")
    elif "object_store_put" in missing:
        notes.append("Object store not measured (--no-ray).")
    for i, line in enumerate(notes):
        body += _comment(line, indent="  ", hang="  " if i == 0 else "    ")
    body.append("  - " + _flow(dram_fields))

    has_disk = "disk_read" in ms and "disk_write" in ms and host.get("disk")
    if has_disk:
        d = host["disk"]
        body.append("")
        body += _comment(f"--- Local disk ({d['device']}, {d['fstype']}), modelled as tier nvme [disk_read] "
                         f"[disk_write] [disk_read_4k] [disk] ---", indent="  ")
        body.append("  - " + _flow({"id": "nvme0", "kind": "nvme", "model": f"{d['device']} ({d['fstype']})",
                                   "capacity": _b(d["capacity"]), "read_bandwidth": _bw(ms["disk_read"].bandwidth),
                                   "write_bandwidth": _bw(ms["disk_write"].bandwidth),
                                   "read_4k_latency": _t(ms["disk_read_4k"].latency) if "disk_read_4k" in ms else None,
                                   "write_latency": _t(ms["disk_write"].latency)}))
    if gpu:
        pin = ms["h2d_pinned"]
        mem_bw = 2 * ms["d2d"].bandwidth if "d2d" in ms else None
        body.append("")
        body += _comment(f"--- GPU: {gpu['name']} [gpu]; copy_launch_overhead = fitted small-copy latency of a "
                         f"pinned host->device copy {_t(pin.latency)} [h2d_pinned]"
                         + ("; memory_bandwidth = 2 x device->device copy rate [d2d]" if mem_bw else "")
                         + " ---", indent="  ", hang="    ")
        body.append("  - " + _flow({"id": "gpu0", "kind": "gpu", "model": gpu["name"], "memory": _b(gpu["memory"]),
                                   "memory_bandwidth": _bw(mem_bw) if mem_bw else None,
                                   "copy_launch_overhead": _t(pin.latency),
                                   "d2h_pinned_bandwidth": _bw(ms["d2h_pinned"].bandwidth) if "d2h_pinned" in ms else None,
                                   "h2d_pageable_bandwidth": _bw(ms["h2d_pageable"].bandwidth)
                                   if "h2d_pageable" in ms else None}))

    body += ["", "links:"]
    body += _comment(f"CPU <-> DRAM: memcpy {_bw(memcpy.bandwidth)}, latency {_t(memcpy.latency)} (fitted "
                     f"small-copy time, Python call included) [memcpy].", indent="  ", hang="    ")
    body.append("  - " + _flow({"src": "cpu0", "dst": "dram0", "bandwidth": _bw(memcpy.bandwidth),
                               "latency": _t(memcpy.latency)}))
    if has_disk:
        lat = ms["disk_read_4k"].latency if "disk_read_4k" in ms else ms["disk_read"].latency
        body += _comment(f"CPU <-> disk: {_bw(ms['disk_read'].bandwidth)} sequential read (the device's "
                         f"write_bandwidth caps writes) [disk_read]; latency {_t(lat)} = QD1 4 KiB cold read "
                         f"[disk_read_4k].", indent="  ", hang="    ")
        body.append("  - " + _flow({"src": "cpu0", "dst": "nvme0", "bandwidth": _bw(ms["disk_read"].bandwidth),
                                   "latency": _t(lat)}))
    if gpu:
        pin = ms["h2d_pinned"]
        body += _comment(f"GPU <-> DRAM: pinned host->device DMA {_bw(pin.bandwidth)} [h2d_pinned]; latency 0 "
                         f"because the whole measured fixed cost ({_t(pin.latency)}) is the GPU's "
                         f"copy_launch_overhead, which the simulator adds to every copy.", indent="  ", hang="    ")
        body.append("  - " + _flow({"src": "gpu0", "dst": "dram0", "bandwidth": _bw(pin.bandwidth), "latency": "0 s"}))
    return "\n".join(head + body) + "\n"


# --- entry points ---------------------------------------------------------------------------------------


def check_out_path(out: str | Path) -> Path:
    """Fail early (before measuring) when ``out`` cannot be written: its directory must exist."""
    path = Path(out)
    if path.is_dir():
        raise ConduitError(f"cannot write {out}: it is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConduitError(f"cannot write {out}: directory {parent} does not exist")
    return path


def to_json(measurements: dict[str, Measurement]) -> str:
    """One JSON object: ``{"host": {...}, "measurements": {name: {...}}}`` (NaN as null), plus
    ``"workload": {name: {...}}`` when workload primitives were measured."""
    host = getattr(measurements, "host", {}) or {}
    data: dict[str, Any] = {"host": host, "measurements": {k: m.to_dict() for k, m in measurements.items()}}
    workload = getattr(measurements, "workload", None)
    if workload:
        data["workload"] = workload_to_json(workload)
    return json.dumps(data, indent=2, default=str)


def calibrate(out: str | Path | None = None, **kw) -> tuple[str, dict[str, Measurement]]:
    """Measure the machine (``**kw`` go to :func:`measure_machine`, plus ``name`` for the topology),
    build the topology YAML, check that it loads, and write it to ``out`` when given.

    Returns ``(yaml_text, measurements)``."""
    from conduit.topology import topology_from_dict
    from conduit.topology.yamlio import parse_yaml

    path = check_out_path(out) if out is not None else None
    name = kw.pop("name", None)
    measurements = measure_machine(**kw)
    text = topology_yaml(measurements, name=name)
    topology_from_dict(parse_yaml(text, str(path or "<calibrated>")), source=str(path or "<calibrated>"))
    if path is not None:
        path.write_text(text)
    return text, measurements


# --- workload primitives (RLlib env runner, RLModule update, value pass, weights) ------------------------
#
# What a training loop spends on its own work, measured one primitive at a time so that the simulator can
# predict a loop it never saw run: never an end-to-end loop timed and fed back. Each is a size sweep fitted
# like the copies above (``t = latency + n / rate``), where ``n`` counts env steps or samples, not bytes:
#
# * ``env_runner``: ``SingleAgentEnvRunner.sample(num_timesteps=n)`` of a local (in-process) EnvRunner built
#   from the workload's own config (``ray/rllib/env/single_agent_env_runner.py: SingleAgentEnvRunner.sample``):
#   env steps, the module's exploration forward pass (batch of ``num_envs_per_env_runner``) and the
#   env-to-module / module-to-env connectors, per step (``1 / rate``), plus the per-call cost (``latency``:
#   episode bookkeeping and numpy-izing the returned episodes). Its ``extra`` also records the returned
#   episodes' pickled bytes per step and their mean length (what the serialisation costs are charged on);
# * ``learner_update``: one gradient step of the workload's RLModule (``forward_train`` + a loss over its
#   outputs + ``backward`` + an Adam step) on a minibatch of ``n`` random observations of the env's space, per
#   sample (``1 / rate``) and per call (``latency``);
# * ``value_pass`` (PPO): ``compute_values`` under ``torch.no_grad`` over ``n`` samples -- the value
#   function forward pass that RLlib's ``GeneralAdvantageEstimation`` learner connector runs
#   (``ray/rllib/connectors/learner/general_advantage_estimation.py``), on a cached random batch; PPO's
#   ``gae_connector`` times that piece itself inside the learner's pipeline on fresh episodes, with the
#   whole update call after it (``learner_update_call``, :func:`_ppo_learner_iteration`);
# * ``weights``: ``get_state(inference_only=True)`` of the module, converted to numpy, and ``set_state`` of
#   a second module: the two ends of a weight sync (``EnvRunnerGroup.sync_weights``), RPC not included.
#
# Compute primitives run with one torch thread (RLlib's learner and EnvRunners run one each here: 2 cores
# shared by every process) and are timed in *process CPU time* (``time.process_time``), like
# ``benchmarks/stock_primitives.py``: other tenants of a shared machine do not inflate them; the wall-clock
# medians are kept in ``extra`` for comparison.


@dataclass
class WorkloadMeasurement(Measurement):
    """A :class:`Measurement` of a workload primitive: ``bandwidth`` is in items (env steps or samples)
    per second, ``latency`` is the per-call cost in seconds; ``extra`` holds what else the sweep saw
    (bytes per step, episode length, wall-clock medians, parameter bytes)."""

    unit: str = "samples"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def per_item(self) -> float:
        """Seconds per env step or sample (``1 / bandwidth``)."""
        return 1.0 / self.bandwidth if self.ok else math.nan

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.update({"unit": self.unit, "per_item": self.per_item if self.ok else None, "extra": dict(self.extra)})
        return out

    def summary(self) -> str:
        if not self.ok:
            return f"{self.name:<34} not measured: {self.note}"
        if self.unit == "calls":
            return f"{self.name:<34} {_t(self.latency):>9} per call  ({self.samples} samples)"
        if self.unit == "regions":
            return (f"{self.name:<34} {_t(self.latency):>9} spin per region end, update share "
                    f"{self.extra.get('update_share', math.nan):.2f}  ({self.samples} samples)")
        return (f"{self.name:<34} {_t(self.per_item):>9} per {self.unit[:-1]}  + {_t(self.latency):>9} per call  "
                f"({self.samples} samples)")


@contextlib.contextmanager
def _torch_threads(n: int):
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _cpu_clock(fn: Callable[[], Any]) -> tuple[float, float]:
    """(process CPU seconds, wall seconds) of one call."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - t0


def _item_sweep(name: str, unit: str, run: Callable[[int], None], sizes: Sequence[int], budget: float,
                min_rep: int, max_rep: int, note: str) -> WorkloadMeasurement:
    """Time ``run(n)`` over ``sizes`` in process CPU time; fit ``t = latency + n / rate`` to the medians."""
    cpu_medians, wall_medians, samples = [], [], 0
    for n in sizes:
        run(n)  # warm-up: lazy imports, allocator, first-call paths
        probe = max(1e-6, _cpu_clock(lambda n=n: run(n))[0])
        reps = max(min_rep, min(max_rep, int(budget / probe)))
        times = [_cpu_clock(lambda n=n: run(n)) for _ in range(reps)]
        cpu_medians.append(statistics.median(t[0] for t in times))
        wall_medians.append(statistics.median(t[1] for t in times))
        samples += reps
    return _from_medians(name, unit, sizes, cpu_medians, wall_medians, samples, note)


def _from_medians(name: str, unit: str, sizes: Sequence[int], cpu_medians: Sequence[float],
                  wall_medians: Sequence[float], samples: int, note: str,
                  anchor: str = "smallest") -> WorkloadMeasurement:
    """A :class:`WorkloadMeasurement` fitted (``t = latency + n / rate``) to per-size CPU medians; a fit
    anchored on the largest size (:func:`fit_latency_bandwidth`) is recorded in ``extra["fit_anchor"]``, so
    every refit of its medians (wall clock, repeated runs) keeps it."""
    cpu_medians = [max(t, 1e-9) for t in cpu_medians]
    lat, rate, how = fit_latency_bandwidth(sizes, cpu_medians, anchor)
    extra: dict[str, Any] = {"wall_medians": list(wall_medians)}
    if anchor != "smallest":
        extra["fit_anchor"] = anchor
    return WorkloadMeasurement(name, rate, lat, samples,
                               f"{note}; {unit} {min(sizes)}..{max(sizes)} ({len(sizes)} sizes); process CPU time, "
                               f"median per size, {how.replace('size', 'count').replace('bandwidth', 'rate')}",
                               list(sizes), cpu_medians, unit=unit, extra=extra)


def _space_batch(space, n: int, rng: np.random.Generator):
    """``n`` random values of a gymnasium space as a torch tensor (uint8 images stay uint8)."""
    import torch

    if hasattr(space, "n"):  # Discrete
        return torch.as_tensor(rng.integers(0, int(space.n), size=n))
    low = np.broadcast_to(space.low, space.shape)
    high = np.broadcast_to(space.high, space.shape)
    if np.issubdtype(space.dtype, np.integer):
        return torch.as_tensor(rng.integers(low.min(), int(high.max()) + 1, size=(n, *space.shape), dtype=space.dtype))
    lo = np.where(np.isfinite(low), low, -1.0)
    hi = np.where(np.isfinite(high), high, 1.0)
    return torch.as_tensor(rng.uniform(lo, hi, size=(n, *space.shape)).astype(space.dtype))


def _local_env_runner(cfg: Any) -> Any:
    """A local ``SingleAgentEnvRunner`` of ``cfg`` (worker 1), the project's envs registered first: Tune's
    env registry goes with the Ray session that held it (a calibration's, a run's), and RLlib then falls
    back to ``gym.make(name, **env_config)``, which the large-obs env does not take."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from conduit.runtime.rllib.envs import register_envs

    register_envs()
    return SingleAgentEnvRunner(config=cfg, worker_index=1)


def _named_env_runner(name: str) -> Any:
    """A local EnvRunner of the :func:`default_workload_configs` config ``name``."""
    return _local_env_runner(default_workload_configs()[name][1].copy(copy_frozen=False))


def _workload_env(config):
    """The config's env, built the way an EnvRunner builds it (a registered name or a class)."""
    import gymnasium as gym
    from ray.rllib.env.env_context import EnvContext

    from conduit.runtime.rllib.envs import register_envs

    register_envs()  # see _local_env_runner
    env = config.env
    ctx = EnvContext(dict(config.env_config or {}), worker_index=1)
    if isinstance(env, str):
        from ray.tune.registry import ENV_CREATOR, _global_registry

        if _global_registry.contains(ENV_CREATOR, env):
            return _global_registry.get(ENV_CREATOR, env)(ctx)
        return gym.make(env)
    return env(ctx)


def _fragment_steps(cfg: Any) -> int:
    """Env steps one ``sample()`` call of the config's EnvRunner returns: its fragment times its envs."""
    return int(cfg.get_rollout_fragment_length(worker_index=1)) * int(cfg.num_envs_per_env_runner)


#: sample() calls per size whose returned episodes :func:`measure_env_runner` pickles for the bytes per step
BYTES_SAMPLES_PER_SIZE = 3


def measure_env_runner(name: str, config, quick: bool = False) -> WorkloadMeasurement:
    """``SingleAgentEnvRunner.sample(num_timesteps=n)`` of ``config`` (an RLlib ``AlgorithmConfig``), local.

    The sweep reaches the config's own fragment (``get_rollout_fragment_length`` x envs; quick: at most
    256 steps) when that is longer than its fixed sizes, so the per-step rate (the slope over the two
    largest counts) includes what a long fragment pays and a short sample does not: the episodes that end
    in it (their data made numpy arrays, the env reset). ``ppo-largeobs``: 1.57 ms per step from 32 and 128
    steps (no 200-step episode ends there), 1.69 ms over a 1,000-step fragment. A fragment shorter than
    the fixed sizes (DQN's one step) becomes the smallest size, where the per-call cost is read.

    ``extra``: the pickled bytes per step of the episodes one call returns at the largest size (what a runner's
    ``sample()`` hands back; ``bytes_per_step_by_size`` for each size), the mean length of the episodes that
    ended during the sweep."""

    cfg = config.copy(copy_frozen=False)
    runner = _local_env_runner(cfg)
    # the returned episodes by sample size, a few calls each, pickled after the sweep (not timed); every call's
    # pieces summed by episode id into the lengths of the episodes that end
    kept: dict[int, list[list]] = {}
    running: dict[Any, int] = {}
    done: list[int] = []

    def run(n: int) -> None:
        episodes = runner.sample(num_timesteps=n, random_actions=False)
        for e in episodes:  # an episode comes back in pieces (one per sample() call it spans)
            running[e.id_] = running.get(e.id_, 0) + len(e)
            if e.is_done:
                done.append(running.pop(e.id_))
        calls = kept.setdefault(n, [])
        if len(calls) < BYTES_SAMPLES_PER_SIZE:
            calls.append(episodes)

    sizes = [4, 16, 64] if quick else [8, 32, 128]
    fragment = _fragment_steps(cfg)
    fragment = min(fragment, 256) if quick else fragment
    if fragment > sizes[-1]:
        sizes.append(fragment)
    elif fragment < sizes[0]:  # a short fragment (DQN: one step): the per-call cost is taken at its size
        sizes.insert(0, fragment)
    budget = 0.1 if quick else 0.4
    try:
        m = _item_sweep(f"env_runner:{name}", "steps", run, sizes, budget, 3, 40,
                        f"SingleAgentEnvRunner.sample(num_timesteps=n) of a local EnvRunner "
                        f"({cfg.num_envs_per_env_runner} env(s)), one torch thread")
        per_size = {n: sum(len(pickle.dumps(eps, protocol=5)) for eps in calls)
                    / max(1, sum(len(e) for eps in calls for e in eps)) for n, calls in sorted(kept.items())}
        m.extra.update({
            # at the largest size (the fragment, where it is longer than the fixed sizes): a short call's episodes
            # carry each piece's final observation and framing over few steps (ppo-largeobs, 2026-12-07: 37.5 KB a
            # step over the sweep's first 64 calls, of 8 and 32 steps, against 28.2 KB observations)
            "bytes_per_step": per_size[max(per_size)],
            "bytes_per_step_by_size": {str(n): round(b, 1) for n, b in per_size.items()},
            "episode_length": statistics.mean(done) if done else math.nan,
            "episodes_done": len(done),
            "envs_per_runner": int(cfg.num_envs_per_env_runner),
        })
        return m
    finally:
        with contextlib.suppress(Exception):
            runner.stop()


def measure_module(name: str, algo: str, config, quick: bool = False) -> list[WorkloadMeasurement]:
    """The learner-side primitives of ``config``'s RLModule: update, value pass (PPO/APPO), weights."""
    import torch
    from ray.rllib.core.columns import Columns
    from ray.rllib.utils.numpy import convert_to_numpy

    env = _workload_env(config)
    try:
        spec = config.get_rl_module_spec(env=env)
        obs_space, act_space = env.observation_space, env.action_space
    finally:
        with contextlib.suppress(Exception):
            env.close()
    torch.manual_seed(0)
    module = spec.build()
    if hasattr(module, "make_target_networks"):  # DQN: the learner builds target networks (TargetNetworkAPI)
        module.make_target_networks()
    module.train()
    opt = torch.optim.Adam(module.parameters(), lr=1e-4)
    rng = np.random.default_rng(0)
    batches: dict[int, dict] = {}

    def batch(n: int) -> dict:
        if n not in batches:
            b = {Columns.OBS: _space_batch(obs_space, n, rng), Columns.ACTIONS: _space_batch(act_space, n, rng)}
            if algo == "dqn":
                b[Columns.NEXT_OBS] = _space_batch(obs_space, n, rng)
            batches[n] = b
        return batches[n]

    def loss_of(out: dict) -> torch.Tensor:
        terms = [v.float().mean() for v in out.values() if isinstance(v, torch.Tensor) and v.requires_grad]
        if not terms:
            raise ConduitError(f"{name}: forward_train returned no differentiable output")
        return torch.stack(terms).sum()

    def update(n: int) -> None:
        out = module.forward_train(batch(n))
        opt.zero_grad()
        loss_of(out).backward()
        opt.step()

    def values(n: int) -> None:
        with torch.no_grad():
            module.compute_values(batch(n))

    sizes = [8, 32, 128] if quick else [16, 64, 256]
    budget = 0.1 if quick else 0.5
    out = [_item_sweep(f"learner_update:{name}", "samples", update, sizes, budget, 3, 40,
                       f"{type(module).__name__}.forward_train + loss over its outputs + backward + Adam step on "
                       f"n random observations, one torch thread")]
    if algo == "ppo" and hasattr(module, "compute_values"):
        out.append(_item_sweep(f"value_pass:{name}", "samples", values, [4 * s for s in sizes], budget, 3, 40,
                               f"{type(module).__name__}.compute_values under torch.no_grad (the GAE connector's "
                               f"value pass), one torch thread"))
    other = spec.build()
    if hasattr(other, "make_target_networks"):
        other.make_target_networks()
    state_bytes = 0
    ends: dict[str, list[float]] = {"get_s": [], "set_s": []}

    def sync(_n: int) -> None:
        nonlocal state_bytes
        c0 = time.process_time()
        state = convert_to_numpy(module.get_state(inference_only=True))
        c1 = time.process_time()
        other.set_state(state)
        ends["get_s"].append(c1 - c0)
        ends["set_s"].append(time.process_time() - c1)
        state_bytes = sum(v.nbytes for v in _leaves(state) if isinstance(v, np.ndarray))

    w = _item_sweep(f"weights:{name}", "calls", sync, [1, 2], budget, 3, 40,
                    "get_state(inference_only=True) -> numpy, then set_state on a second module (a weight sync "
                    "without its RPC); extra get_s / set_s: the two ends apart (medians, CPU time)")
    # one call per sweep point: the fit's 'latency' is the per-call time
    w.latency, w.bandwidth = w.medians[0], 1.0 / w.medians[0]
    w.extra["state_bytes"] = state_bytes
    # the sender's end (the learner's get_state) and the receiver's (an EnvRunner's set_state): DQN's sync
    # runs them on different threads (conduit.sim.dqn.DqnLoop.dqn_weight_sync)
    w.extra.update({k: statistics.median(v) for k, v in ends.items() if v})
    out.append(w)
    return out


def measure_learner(name: str, algo: str, config, quick: bool = False,
                    team: bool = False, update_only: bool = False) -> list[WorkloadMeasurement]:
    """RLlib's own ``Learner.update`` as the real run calls it, and (DQN) the driver's per-step calls.

    ``learner_update:<name>`` replaces :func:`measure_module`'s proxy (``forward_train`` plus a sum of
    its outputs) for PPO and DQN: the algorithm's Learner (``config.build_learner``: ``PPOTorchLearner``,
    ``DQNTorchLearner``, with its loss, gradient step and per-minibatch metrics logging,
    ``core/learner/learner.py: Learner.update``) updates on one minibatch of ``n`` samples built by its
    own learner connector from real episodes (the connector's work is not timed:
    ``Learner._make_batch_if_necessary`` runs once, before the sweep). One call per minibatch, so the
    fit's per-call time is the per-minibatch overhead. APPO: ``IMPALALearner.update`` only builds the
    batch and enqueues it; its learner thread trains (``algorithms/impala/impala_learner.py:
    _LearnerThread.step``: ``Learner.update(self=learner, training_data=TrainingData(batch=...),
    timesteps=..., _no_metrics_reduce=True)``), so that call is timed, on batches of whole rollout
    fragments (v-trace folds the batch into fragments: ``make_time_major``).

    DQN (``algorithms/dqn/dqn.py: DQN._training_step_new_api_stack``), each primitive alone, in the
    config's replay buffer (``PrioritizedEpisodeReplayBuffer`` by default): ``replay_add:<name>``
    (``add`` of one ``sample()`` call's episodes, the sample not timed), ``replay_sample:<name>``
    (``sample(num_items=n, n_step, gamma, beta, sample_episodes=True)`` plus its ``get_metrics``),
    ``replay_priorities:<name>`` (``update_priorities_in_episode_replay_buffer`` with n TD errors);
    ``runner_metrics:<name>`` (the EnvRunner's ``get_metrics()`` after a sample call: the second half
    of ``synchronous_parallel_sample``'s remote call with ``_return_metrics=True``) and
    ``driver_metrics:<name>`` (the driver's ``MetricsLogger.aggregate`` of that result);
    ``learner_connector:<name>`` (the learner's connector pipeline over n sampled episodes, DQN's own
    pieces: n-step next observations, ``NumpyToTensor``),
    ``learner_results:<name>`` (the driver's handling of each update's results: :func:`measure_learner_results`).

    ``team``: also ``torch_team:<name>`` (:func:`measure_torch_team`) on the update closest to the
    config's batch, with the torch threads in force (a local learner's: :func:`measure_local_learner`).

    ``update_only``: the update primitives alone (``learner_update``, and PPO's ``learner_update_call``,
    ``gae_connector`` and ``gae_streamed``, which one timed round measures together), the same sweeps as a full measurement: what a
    validation run re-times just before it starts (``studies/validation.py: recheck_primitives``)."""
    from ray.rllib.core.learner.training_data import TrainingData
    from ray.rllib.policy.sample_batch import MultiAgentBatch
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    if algo not in ("ppo", "dqn", "appo"):
        return []
    cfg = config.copy(copy_frozen=False).learners(num_learners=0)
    runner = _local_env_runner(cfg)
    sizes = [8, 32, 128] if quick else [16, 64, 256]
    if algo == "appo":  # whole fragments, up to the learner's batch
        fragment = _fragment_steps(cfg)
        top = max(1, int(cfg.train_batch_size_per_learner) // fragment)
        sizes = sorted({fragment * k for k in ((1, max(1, top // 2)) if quick else (1, max(1, top // 2), top))})
    budget = 0.1 if quick else 0.5
    out: list[WorkloadMeasurement] = []
    learner = None
    try:
        learner = cfg.build_learner(env=runner.env)
        ts = {NUM_ENV_STEPS_SAMPLED_LIFETIME: 10**6}
        if algo == "appo":
            from ray.rllib.core.learner.learner import Learner

            episodes = runner.sample(num_timesteps=max(sizes), random_actions=False)
            full = learner._make_batch_if_necessary(TrainingData(episodes=episodes))
            batches = {n: MultiAgentBatch({k: v[:n] for k, v in full.policy_batches.items()}, env_steps=n)
                       for n in sizes}

            def update(n: int) -> None:
                Learner.update(learner, training_data=TrainingData(batch=batches[n]), timesteps=ts,
                               _no_metrics_reduce=True)
        elif algo == "ppo":
            episodes = runner.sample(num_timesteps=max(sizes) + 8, random_actions=False)
            full = learner._make_batch_if_necessary(TrainingData(episodes=episodes))
            batches = {n: MultiAgentBatch({k: v[:n] for k, v in full.policy_batches.items()}, env_steps=n)
                       for n in sizes}

            def update(n: int) -> None:
                learner.update(batch=batches[n], minibatch_size=n, num_epochs=1, timesteps=ts)

            out += _ppo_learner_iteration(name, cfg, runner, learner, ts, quick)
        elif update_only:
            buffer = _replay_buffer(dict(cfg.replay_buffer_config))
            _fill_replay(buffer, runner, cfg, sizes)
            drawn = {n: _draw_replay(buffer, cfg, n) for n in sizes}
            batches = {n: learner._make_batch_if_necessary(TrainingData(episodes=drawn[n])) for n in sizes}

            def update(n: int) -> None:
                learner.update(batch=batches[n], timesteps=ts)
        else:
            from ray.rllib.utils.replay_buffers.utils import update_priorities_in_episode_replay_buffer

            buffer = _replay_buffer(dict(cfg.replay_buffer_config))
            steps = _fill_replay(buffer, runner, cfg, sizes)

            def draw(n: int):
                return _draw_replay(buffer, cfg, n)

            drawn = {n: draw(n) for n in sizes}
            batch = int(cfg.total_train_batch_size)
            batches = {n: learner._make_batch_if_necessary(TrainingData(episodes=drawn[n])) for n in sizes}

            def update(n: int) -> None:
                learner.update(batch=batches[n], timesteps=ts)

            out.append(_item_sweep(f"learner_connector:{name}", "samples",
                                   lambda n: learner._make_batch_if_necessary(TrainingData(episodes=drawn[n])), sizes,
                                   budget, 3, 40, "the Learner's learner-connector pipeline (with NumpyToTensor) over n "
                                   "sampled replay episodes (Learner._make_batch_if_necessary)"))
            pending: list = []

            def add(n: int) -> None:
                for _ in range(n):
                    buffer.add(pending.pop())

            def add_sweep() -> WorkloadMeasurement:
                reps = 12 if quick else 40
                pending.extend(runner.sample(num_timesteps=steps, random_actions=True) for _ in range(3 * (reps + 2) + 3))
                pending.reverse()  # add in sampling order: each call continues the previous episode
                return _item_sweep(f"replay_add:{name}", "calls", add, [1, 2], 1e9, reps, reps,
                                   f"{type(buffer).__name__}.add of one sample() call's episodes ({steps} env step(s))")

            out.append(add_sweep())
            out.append(_item_sweep(f"replay_sample:{name}", "items", draw, sizes, budget, 3, 40,
                                   f"{type(buffer).__name__}.sample(num_items=n, n_step, gamma, beta, "
                                   f"sample_episodes=True) + get_metrics()"))
            mid = next(iter(learner.module.keys()))

            # only the update is timed: the sample it follows (as in DQN's loop) is not, so the primitive is not a
            # difference of two noisy sweeps (that left 0.25-15 ms at 16-256 items on a loaded machine)
            spent: dict[int, list[tuple[float, float]]] = {}
            td = {n: {mid: {"td_error": np.abs(np.random.default_rng(n).normal(size=n))}} for n in sizes}

            def priorities(n: int) -> None:
                draw(n)
                c0, w0 = time.process_time(), time.perf_counter()
                update_priorities_in_episode_replay_buffer(replay_buffer=buffer, td_errors=td[n])
                spent.setdefault(n, []).append((time.process_time() - c0, time.perf_counter() - w0))

            both = _item_sweep(f"replay_priorities:{name}", "items", priorities, sizes, budget, 3, 40, "")
            prio = _from_medians(f"replay_priorities:{name}", "items", sizes,
                                 [statistics.median(c for c, _ in spent[n]) for n in sizes],
                                 [statistics.median(w for _, w in spent[n]) for n in sizes], both.samples,
                                 "update_priorities_in_episode_replay_buffer with n TD errors, each after its own "
                                 "sample(n) (the update alone timed)")
            out.append(prio)
            metrics, results = _runner_call_extras(name, algo, runner, steps, quick)
            out.append(metrics)
            logger = MetricsLogger()
            results = results[-64:]

            def aggregate(n: int) -> None:
                for i in range(n):
                    logger.aggregate([results[i % len(results)]], key=ENV_RUNNER_RESULTS)

            out.append(_item_sweep(f"driver_metrics:{name}", "calls", aggregate, [1, 2], budget, 3, 40,
                                   "the driver's MetricsLogger.aggregate of one EnvRunner's metrics"))
            out.append(measure_learner_results(name, learner, lambda: draw(batch), buffer, quick))
        what = (f"Learner.update as {type(learner).__name__}'s learner thread calls it (TrainingData(batch=...), "
                f"_no_metrics_reduce=True)" if algo == "appo" else f"{type(learner).__name__}.update")
        out.append(_item_sweep(f"learner_update:{name}", "samples", update, sizes, budget, 3, 40,
                               f"{what} on one minibatch of n samples its learner connector "
                               f"built from real episodes (RLlib's loss, gradient step and metrics), one torch thread"))
        for m in out:
            if m.unit == "calls":  # n calls per sweep point: the per-call time is the fitted slope
                m.latency = 1.0 / m.bandwidth
        if algo != "dqn" and not update_only:  # (DQN's is measured above, with the metrics its driver aggregates)
            fragment = _fragment_steps(cfg)
            out.append(_runner_call_extras(name, algo, runner, fragment, quick)[0])
        if team:
            batch = int(cfg.total_train_batch_size if algo == "dqn" else (cfg.minibatch_size or cfg.train_batch_size_per_learner))
            n = min(sizes, key=lambda s: abs(s - batch))
            out.append(measure_torch_team(name, lambda: update(n), f"{type(learner).__name__}.update of {n} samples",
                                          quick, sync=_local_set_state(learner)))
        return out
    finally:
        _stop_learner(learner)
        with contextlib.suppress(Exception):
            runner.stop()


#: repetitions per result count of :func:`measure_learner_results` (after 3 warm-up ones)
LEARNER_RESULTS_REPS = 100


def measure_learner_results(name: str, learner: Any, draw: Callable[[], Any], buffer: Any,
                            quick: bool = False) -> WorkloadMeasurement:
    """``learner_results:<name>``: the driver's own work around each DQN update besides the replay calls,
    as ``DQN._training_step_new_api_stack`` (``algorithms/dqn/dqn.py``, RLlib 2.60) does it once
    ``LearnerGroup.update`` has returned one result per learner:

    * the TD errors isolated from the results (``module_results.pop(TD_ERROR_KEY).peek()`` through
      ``convert_to_numpy``, per result; one ``np.concatenate`` per module);
    * ``metrics.aggregate(learner_results, key=LEARNER_RESULTS)`` into the algorithm's root
      ``MetricsLogger`` (per result);
    * ``metrics.aggregate([replay_buffer.get_metrics()], key=REPLAY_BUFFER_RESULTS)`` after the draw (the
      ``get_metrics`` call itself is in ``replay_sample``), the three timers the update passes through
      (sample, update, priorities: ``metrics.log_time``) and the two ``metrics.peek`` reads of the sampled
      lifetime for ``timesteps`` (per call).

    For n = 1 and 2 results (each of its own ``Learner.update`` on a batch ``draw()`` returns; the updates
    are not timed), process CPU time, medians over :data:`LEARNER_RESULTS_REPS` repetitions: fitted as a
    per-call part (``latency``) and a per-result part (``per_item``); each piece's medians (the three above)
    are in ``extra["pieces_s"]``, per result count. The simulator charges it on the
    driver after each update (``StockCosts.learner_results``); under ``enable()`` the same
    ``training_step`` runs, so deployed DQN pays it too."""
    from ray.rllib.algorithms.dqn.dqn import TD_ERROR_KEY
    from ray.rllib.core.learner.training_data import TrainingData
    from ray.rllib.utils.metrics import (
        ENV_RUNNER_RESULTS,
        LEARNER_RESULTS,
        LEARNER_UPDATE_TIMER,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
        REPLAY_BUFFER_RESULTS,
        REPLAY_BUFFER_SAMPLE_TIMER,
        REPLAY_BUFFER_UPDATE_PRIOS_TIMER,
        TIMERS,
    )
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
    from ray.rllib.utils.numpy import convert_to_numpy

    metrics = MetricsLogger(root=True)  # the algorithm's own logger is a root logger
    metrics.log_value((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), 10**6, reduce="sum")
    ts = {NUM_ENV_STEPS_SAMPLED_LIFETIME: 10**6}

    clock = time.process_time

    def handle(results: list, buffer_results: Any) -> tuple[float, float, float]:
        """The training step's work after one update; each piece's CPU seconds."""
        t0 = clock()
        for timer in (REPLAY_BUFFER_SAMPLE_TIMER, LEARNER_UPDATE_TIMER, REPLAY_BUFFER_UPDATE_PRIOS_TIMER):
            with metrics.log_time((TIMERS, timer)):
                pass
        metrics.aggregate([buffer_results], key=REPLAY_BUFFER_RESULTS)
        for _ in range(2):
            metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME))
        t1 = clock()
        td_errors: dict[str, Any] = {}
        for res in results:
            for module_id, module_results in res.items():
                if TD_ERROR_KEY in module_results:
                    td_errors.setdefault(module_id, []).extend(convert_to_numpy(module_results.pop(TD_ERROR_KEY).peek()))
        for module_id, rows in td_errors.items():  # (RLlib: {module_id: {TD_ERROR_KEY: concatenated}})
            td_errors[module_id] = np.concatenate(rows, axis=0)
        t2 = clock()
        metrics.aggregate(results, key=LEARNER_RESULTS)
        return t1 - t0, t2 - t1, clock() - t2

    sizes = [1, 2]
    reps = 12 if quick else LEARNER_RESULTS_REPS
    pieces = ("timers, replay metrics, peeks", "TD errors isolated", "learner results aggregated")
    cpu: dict[int, list[tuple[float, float, float]]] = {n: [] for n in sizes}
    wall: dict[int, list[float]] = {n: [] for n in sizes}
    for rep in range(3 + reps):
        for n in sizes:
            results = [learner.update(training_data=TrainingData(episodes=draw()), timesteps=ts) for _ in range(n)]
            buffer_results = buffer.get_metrics()
            w0 = time.perf_counter()
            spent = handle(results, buffer_results)
            w1 = time.perf_counter()
            if rep >= 3:  # warm-up: the logger's first keys, lazy imports
                cpu[n].append(spent)
                wall[n].append(w1 - w0)
    m = _from_medians(f"learner_results:{name}", "results", sizes, [statistics.median(map(sum, cpu[n])) for n in sizes],
                      [statistics.median(wall[n]) for n in sizes], reps * len(sizes),
                      "the driver's handling of n learners' update results in DQN's training step (TD errors "
                      "isolated, metrics aggregated, the update's timers and peeks), the updates not timed")
    m.extra["pieces_s"] = {piece: [statistics.median(t[i] for t in cpu[n]) for n in sizes]
                           for i, piece in enumerate(pieces)}
    return m


def _fill_replay(buffer: Any, runner: Any, cfg: Any, sizes: Sequence[int]) -> int:
    """Fill a DQN replay buffer with random-action fragments (enough for twice the largest draw, at least 64
    sample calls); the fragment's env steps."""
    steps = max(1, _fragment_steps(cfg))
    for _ in range(max(64, 2 * max(sizes) // steps)):
        buffer.add(runner.sample(num_timesteps=steps, random_actions=True))
    return steps


def _draw_replay(buffer: Any, cfg: Any, n: int) -> Any:
    """One draw of ``n`` items as DQN's training step makes it (``sample_episodes=True`` with the config's
    n-step, gamma and beta), plus the buffer's ``get_metrics``."""
    beta = dict(cfg.replay_buffer_config).get("beta")
    kw = {"beta": beta} if beta is not None else {}
    got = buffer.sample(num_items=n, n_step=cfg.n_step, gamma=cfg.gamma, sample_episodes=True, **kw)
    buffer.get_metrics()
    return got


def _stop_learner(learner: Any) -> None:
    """End what a Learner built for a measurement left running. APPO's (``IMPALALearner``) starts a
    ``_LearnerThread`` whose input queue (``algorithms/appo/utils.py: CircularBuffer.get``) polls with
    ``time.sleep(0.0001)`` while it is empty: left alive, two of them took ~0.045 of a core each and the
    GIL 10,000 times a second in the calibrating process, and every microbenchmark timed after them in
    that process read slower (one such thread alone: the EnvRunner sweep by 6-7%). ``Learner.shutdown``
    stops and joins it."""
    if learner is None:
        return
    with contextlib.suppress(Exception):
        learner.shutdown()


#: CPU seconds :func:`_runner_call_extras` spends sampling fragments before it stops repeating
RUNNER_CALL_BUDGET_S = 6.0


def _runner_call_extras(name: str, algo: str, runner: Any, steps: int, quick: bool) -> tuple[WorkloadMeasurement, list]:
    """``runner_metrics:<name>``: what the algorithm's remote sampling call runs on the EnvRunner besides
    ``sample()``, each timed alone after its own ``sample(num_timesteps=steps)`` of one fragment (the
    episodes it finished are what the metrics summarise). PPO and DQN: ``get_metrics()``
    (``execution/rollout_ops.py: synchronous_parallel_sample`` with ``_return_metrics=True``); APPO
    and IMPALA: ``get_state(not_components=rl_module)`` and ``get_metrics()``
    (``env/env_runner.py: EnvRunner.sample_get_state_and_metrics``; its ``ray.put`` of the episodes is
    the sample's serialization, which the cost model charges apart). Repeated for at most
    :data:`RUNNER_CALL_BUDGET_S` of sampling (a long fragment samples for seconds), at least 4 times (quick: 2).
    Returns the measurement and the metrics the calls returned (DQN's driver aggregates them)."""
    from ray.rllib.core import COMPONENT_RL_MODULE

    def extras():
        if algo == "appo":
            runner.get_state(not_components=COMPONENT_RL_MODULE)
        results.append(runner.get_metrics())

    results: list = []
    cpu, wall = [], []
    runner.sample(num_timesteps=steps)
    runner.get_metrics()
    spent, cap = 0.0, (24 if quick else 80)
    least = 2 if quick else 4
    while len(cpu) < cap and (len(cpu) < least or spent < RUNNER_CALL_BUDGET_S * (0.25 if quick else 1.0)):
        spent += _cpu_clock(lambda: runner.sample(num_timesteps=steps))[0]
        c, t = _cpu_clock(extras)
        cpu.append(c)
        wall.append(t)
    skip = min(4, len(cpu) // 4)
    per_call = max(1e-9, statistics.median(cpu[skip:]))
    what = ("EnvRunner.get_state(not_components=rl_module) + get_metrics()" if algo == "appo"
            else "EnvRunner.get_metrics()")
    return WorkloadMeasurement(f"runner_metrics:{name}", 1.0 / per_call, per_call, len(cpu) - skip,
                               f"{what} after a sample() call of {steps} env steps, each call timed alone "
                               f"(process CPU time, median)", [1], [per_call], unit="calls",
                               extra={"wall_medians": [statistics.median(wall[skip:])], "fragment_steps": steps}), results


def measure_runner_call(name: str, algo: str, config, quick: bool = False) -> list[WorkloadMeasurement]:
    """``runner_metrics:<name>`` alone (:func:`_runner_call_extras`), on a local EnvRunner of ``config``."""

    if algo not in ("ppo", "dqn", "appo"):
        return []
    cfg = config.copy(copy_frozen=False).learners(num_learners=0)
    runner = _local_env_runner(cfg)
    try:
        steps = _fragment_steps(cfg)
        return [_runner_call_extras(name, algo, runner, steps, quick)[0]]
    finally:
        with contextlib.suppress(Exception):
            runner.stop()


def _ppo_learner_iteration(name: str, cfg: Any, runner: Any, learner: Any, timesteps: dict,
                           quick: bool) -> list[WorkloadMeasurement]:
    """PPO's learner side of an iteration, each call on fresh data as the real run makes it:
    ``learner_update_call:<name>``, ``gae_connector:<name>``, ``batch_connector:<name>`` (the learner
    connector's pieces before ``NumpyToTensor``, the instrument's *c*; each round at the train batch also records
    how long the process sat idle before it, ``extra.rounds``: :mod:`conduit.fresh_mapping`) and
    ``gae_streamed:<name>`` (Conduit's
    ``StreamedGAE`` on the same input with that call's values: what ``enable()`` leaves for update start. The
    GAE call less the ``compute_values`` calls inside it is not that figure: on ``ppo-largeobs`` it left 30 ms of
    2,000 samples, the forward pass's large tensors released after it returns, where ``StreamedGAE`` takes
    1.5-1.7 ms).

    ``ppo.py: PPO.training_step`` hands the learner new episodes every iteration; the learner connector
    (``Learner._make_batch_if_necessary``) builds the batch, its last piece ``GeneralAdvantageEstimation``
    (``connectors/learner/general_advantage_estimation.py``) runs the value pass and the advantages, and
    ``Learner.update`` trains on it with the config's ``minibatch_size``, ``num_epochs`` and
    ``shuffle_batch_per_epoch``. Here each timed round samples fresh episodes of ``n`` env steps (not
    timed; in an EnvRunner actor while this process waits, as a real run samples, where Ray is running:
    :func:`_episode_source`, recorded in ``extra.episodes_from``), then times the GAE piece inside the
    learner's own connector pipeline and the whole update call on the batch it built. The GAE piece's calls
    at the largest size also record their page faults, system time and the memory the VM reported to its
    host before them (``extra.memory``: :mod:`conduit.runtime.pagereport`). A call repeated on one cached batch is faster than the real pattern: on
    ``ppo-largeobs`` (2,000 steps of 84x84x4 uint8) the update took 2.25-2.47 s of CPU on a repeated batch
    and 2.46-2.58 s on fresh ones, a third of it system time (the fresh tensors' page faults: 300-380
    thousand per call); the GAE piece 0.71-0.82 s, where ``compute_values`` on a cached random batch
    (``value_pass``) gave 0.49 s for the same size. The real learner actor spent 3.35 s of CPU per
    iteration on the two.

    Sizes: a quarter, a half and all of the train batch (quick: 1 and 2 minibatches), interleaved over
    the rounds so drift hits every size; GAE adds a loss-masked bootstrap row per episode piece and the
    minibatch iterator covers every row, so the call's minibatch count is ceil(rows / minibatch), and only
    the train batch itself is its real size. Both fits are anchored on the largest size (the line through
    the two largest, exact at the train batch). The update's rate is per sample per epoch
    (``extra``: ``epochs_timed``, ``minibatch_size``)."""
    from ray.rllib.connectors.learner import NumpyToTensor
    from ray.rllib.connectors.learner.general_advantage_estimation import GeneralAdvantageEstimation
    from ray.rllib.core.learner.training_data import TrainingData

    batch = int(cfg.train_batch_size_per_learner)
    minibatch = min(batch, int(cfg.minibatch_size or batch))
    per_batch = max(1, batch // minibatch)
    sizes = sorted({minibatch * min(k, per_batch) for k in (1, 2)} if quick
                   else {max(minibatch, batch // 4), max(minibatch, batch // 2), batch})
    epochs = max(1, int(cfg.num_epochs))
    shuffle = bool(getattr(cfg, "shuffle_batch_per_epoch", True))
    from conduit.runtime.rllib.values import StreamedGAE

    gae_clock: list[tuple[float, float, float, float]] = []
    to_tensor_at: list[tuple[float, float]] = []  # (CPU, wall) clocks as NumpyToTensor starts: the end of c
    original = GeneralAdvantageEstimation.__call__
    original_to_tensor = NumpyToTensor.__call__

    def stamped_to_tensor(self, *args: Any, **kwargs: Any) -> Any:
        to_tensor_at.append((time.process_time(), time.perf_counter()))
        return original_to_tensor(self, *args, **kwargs)

    module_types = {type(m) for m in learner.module.values()}
    original_values = {t: t.__dict__.get("compute_values") for t in module_types}
    kept: list[Any] = []  # the value passes' outputs inside the stock GAE call, in the modules' order
    inside = threading.local()
    pieces: dict[int, Any] = {}  # one StreamedGAE per GAE piece, reused as the installed one is

    def timed_gae(self, *, rl_module: Any, episodes: Any, batch: dict, **kwargs: Any) -> Any:
        if getattr(inside, "streamed", False):  # StreamedGAE's own super().__call__
            return original(self, rl_module=rl_module, episodes=episodes, batch=batch, **kwargs)
        kept.clear()
        columns = {mid: dict(cols) for mid, cols in batch.items()}  # the input, before GAE adds its columns
        memory0, r0 = pagereport.snapshot(), resource.getrusage(resource.RUSAGE_THREAD)
        c0, t0 = time.process_time(), time.perf_counter()
        result = original(self, rl_module=rl_module, episodes=episodes, batch=batch, **kwargs)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        gae_calls.append({"faults": float(r1.ru_minflt - r0.ru_minflt), "system_s": r1.ru_stime - r0.ru_stime,
                          "memory": (memory0, pagereport.snapshot())})
        # the runtime's StreamedGAE on the same input, its values given (as the ValueStream hands them over)
        mids = [mid for mid, _module in rl_module.items() if mid in columns]
        streamed = pieces.get(id(self))
        if streamed is None:
            streamed = pieces[id(self)] = StreamedGAE(gamma=self.gamma, lambda_=self.lambda_)
        streamed.pending = {mid: v.detach().cpu().numpy() for mid, v in zip(mids, kept, strict=True)}
        inside.streamed = True
        try:
            c1, t1 = time.process_time(), time.perf_counter()
            streamed(rl_module=rl_module, episodes=episodes, batch=columns, **kwargs)
            gae_clock.append((cpu, wall, time.process_time() - c1, time.perf_counter() - t1))
        finally:
            inside.streamed = False
        if streamed.counters["fallback"]:
            raise ConduitError(f"{name}: StreamedGAE fell back to the value pass on the calibration's batch")
        return result

    def keeping_values(kind: type) -> Any:
        inherited = kind.compute_values

        def compute_values(self, *args: Any, **kwargs: Any) -> Any:
            out = inherited(self, *args, **kwargs)
            if not getattr(inside, "streamed", False):
                kept.append(out)
            return out
        return compute_values

    update_times: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
    gae_times: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
    # per GAE call: its thread's minor faults and system seconds, the VM's reported memory at its start and end
    gae_calls: list[dict[str, Any]] = []
    gae_rounds: list[dict[str, Any]] = []  # per timed call at the largest size: faults, system time, reporting
    streamed_times: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
    connector_times: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
    connector_rounds: list[dict[str, float]] = []  # per timed round at the largest size: c, and how long idle before
    update_end = [time.perf_counter()]  # when the last update call returned (what it allocated is freed by then)

    def one_round(n: int) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float], tuple[float, float]]:
        """(GAE piece, StreamedGAE, update call, the connector's pieces before ``NumpyToTensor``), each (CPU,
        wall) seconds, on fresh episodes of ``n`` steps."""
        start = pagereport.snapshot()
        episodes = sample(n)
        gae_clock.clear()
        gae_calls.clear()
        to_tensor_at.clear()
        c0, t0 = time.process_time(), time.perf_counter()
        built = learner._make_batch_if_necessary(TrainingData(episodes=episodes))
        if len(gae_clock) != 1 or not to_tensor_at:
            raise ConduitError(f"{name}: the learner connector ran GeneralAdvantageEstimation {len(gae_clock)} "
                               f"times and NumpyToTensor {len(to_tensor_at)}, expected GAE once after NumpyToTensor")
        # the pipeline's own NumpyToTensor is the first (GAE converts its outputs with one of its own)
        connector = (to_tensor_at[0][0] - c0, to_tensor_at[0][1] - t0)
        if n == sizes[-1]:
            connector_rounds.append({"cpu_s": round(connector[0], 5), "wall_s": round(connector[1], 5),
                                     "idle_s": round(t0 - update_end[0], 4)})
        cpu, wall, streamed_cpu, streamed_wall = gae_clock[0]
        if n == sizes[-1]:  # the fit's anchor: the train batch itself, but in a quick calibration
            at = gae_calls[0]
            before, during = (pagereport.reported_between(start, at["memory"][0]),
                              pagereport.reported_between(*at["memory"]))
            gae_rounds.append({"wall_s": round(wall, 4), "faults": at["faults"], "system_s": round(at["system_s"], 4),
                               "reported_mb_before": None if before is None else before["mb"],
                               "reported_mb_during": None if during is None else during["mb"]})
        update = _cpu_clock(lambda: learner.update(batch=built, minibatch_size=minibatch, num_epochs=epochs,
                                                   timesteps=timesteps, shuffle_batch_per_epoch=shuffle))
        update_end[0] = time.perf_counter()
        return (cpu, wall), (streamed_cpu, streamed_wall), update, connector

    reps = 2 if quick else 3
    with _episode_source(name, cfg, runner) as (sample, episodes_from):
        GeneralAdvantageEstimation.__call__ = timed_gae
        NumpyToTensor.__call__ = stamped_to_tensor
        for kind in module_types:
            kind.compute_values = keeping_values(kind)
        try:
            one_round(sizes[0])  # warm-up: first-call paths
            gae_rounds.clear()
            connector_rounds.clear()
            for _ in range(reps):
                for n in sizes:
                    gae, streamed, update, connector = one_round(n)
                    gae_times[n].append(gae)
                    streamed_times[n].append(streamed)
                    update_times[n].append(update)
                    connector_times[n].append(connector)
        finally:
            GeneralAdvantageEstimation.__call__ = original
            NumpyToTensor.__call__ = original_to_tensor
            for kind, own in original_values.items():
                if own is None:
                    del kind.compute_values  # it was inherited
                else:
                    kind.compute_values = own

    def medians(times: dict[int, list[tuple[float, float]]], i: int) -> list[float]:
        return [statistics.median(t[i] for t in times[n]) for n in sizes]

    fresh = "each timed round on fresh episodes of n env steps (sampling not timed)"
    call = _from_medians(f"learner_update_call:{name}", "samples", sizes, medians(update_times, 0),
                         medians(update_times, 1), reps * len(sizes),
                         f"{type(learner).__name__}.update of the batch its learner connector built, as "
                         f"PPO.training_step calls it (minibatch_size={minibatch}, num_epochs={epochs}, "
                         f"shuffle_batch_per_epoch={shuffle}), {fresh}, one torch thread", anchor="largest")
    call.bandwidth *= epochs  # per sample per epoch
    call.extra.update(epochs_timed=epochs, minibatch_size=minibatch)
    gae = _from_medians(f"gae_connector:{name}", "samples", sizes, medians(gae_times, 0), medians(gae_times, 1),
                        reps * len(sizes),
                        f"GeneralAdvantageEstimation inside {type(learner).__name__}'s learner connector pipeline "
                        f"(value pass, bootstrap rows, advantages and value targets), {fresh}, one torch thread",
                        anchor="largest")
    gae.extra["memory"] = pagereport.call_summary(gae_rounds, pagereport.snapshot())
    streamed = _from_medians(f"gae_streamed:{name}", "samples", sizes, medians(streamed_times, 0),
                             medians(streamed_times, 1), reps * len(sizes),
                             f"conduit's StreamedGAE (conduit/runtime/rllib/values.py) on the input of each timed "
                             f"GeneralAdvantageEstimation call, given that call's values as the ValueStream hands "
                             f"them over: the bootstrap rows, advantages, value targets and their tensors that "
                             f"enable() still runs at update start, {fresh}, one torch thread",
                             anchor="largest")
    connector = _from_medians(f"batch_connector:{name}", "samples", sizes, medians(connector_times, 0),
                              medians(connector_times, 1), reps * len(sizes),
                              f"{type(learner).__name__}'s learner connector pipeline from its start up to "
                              f"NumpyToTensor (the pieces that build the train batch from the episodes: the "
                              f"instrument's c segment), {fresh}", anchor="largest")
    # each round at the train batch with the seconds since the previous round's update returned: the batch is
    # above glibc's mmap ceiling on large observations, and what its fresh mapping costs depends on that gap
    # (conduit.fresh_mapping)
    connector.extra["rounds"] = connector_rounds
    for entry in (call, gae, streamed, connector):
        entry.extra["episodes_from"] = episodes_from
    return [call, gae, streamed, connector]


#: how long one timed round may wait for its episodes from the EnvRunner actor
EPISODE_TIMEOUT_S = 600.0


class _RemoteEpisodes:
    """An EnvRunner of the workload's config in a Ray actor: the episodes a real learner trains on come from
    another process (:func:`_episode_source`)."""

    def __init__(self, cfg: Any):
        self.runner = _local_env_runner(cfg)

    def sample(self, n: int) -> Any:
        return self.runner.sample(num_timesteps=n, random_actions=False)

    def stop(self) -> None:
        self.runner.stop()


@contextlib.contextmanager
def _episode_source(name: str, cfg: Any, runner: Any) -> Iterator[tuple[Callable[[int], Any], str]]:
    """Where PPO's timed learner rounds get their fresh episodes: ``(sample(n) -> episodes, description)``.

    With Ray running (a calibration's workload primitives run :func:`attached_ray`), an EnvRunner actor samples
    them in another process while this one waits, and they arrive through Ray's object store, as a real run
    delivers them (``ppo.py: PPO.training_step`` samples on the EnvRunner actors, the learner waits). The
    condition matters on a VM whose freed memory is handed back to its host (:mod:`conduit.runtime.pagereport`):
    on the 2-core development VM, 2026-12-07 18:02-18:06, three experiments alternating the two (one torch
    thread, ``ppo-largeobs`` at 2,000 steps): the GAE piece 1.04-1.30 s median on episodes its own process had
    just sampled, 1.25-1.53 s on episodes another process sampled while it waited (with 42-338 MB reported
    before each such call, against mostly none). Without Ray, the calibrating process's own EnvRunner samples,
    and the description says so."""
    try:
        import ray

        running = ray.is_initialized()
    except ImportError:
        running = False
    if not running:
        yield ((lambda n: runner.sample(num_timesteps=n, random_actions=False)),
               "the calibrating process's own EnvRunner (no Ray running; a real run samples in other processes)")
        return
    actor = ray.remote(num_cpus=0)(_RemoteEpisodes).remote(cfg)

    def sample(n: int) -> Any:
        try:
            return ray.get(actor.sample.remote(n), timeout=EPISODE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError as exc:
            raise ConduitError(f"{name}: the EnvRunner actor gave no episodes of {n} steps within "
                               f"{EPISODE_TIMEOUT_S:.0f} s") from exc
    try:
        yield sample, ("an EnvRunner actor in another process, through Ray's object store, while the calibrating "
                       "process waits (as a real run samples)")
    finally:
        with contextlib.suppress(Exception):  # the actor is killed below either way
            ray.get(actor.stop.remote(), timeout=30)
        ray.kill(actor)


#: idle gaps after a parallel region for :func:`measure_torch_team`: one longer than any spin-wait, one short
TEAM_GAPS = (0.05, 0.003)


def _other_threads_cpu() -> dict[int, float] | float:
    """CPU seconds of this process's threads other than the calling one: per thread id on Linux, from each
    thread's own CPU clock (exact for a thread running on another core; the process clock counts such a
    thread only up to its last tick, which biases a spin by up to a tick), else one figure, process less
    calling thread CPU time."""
    try:
        me = threading.get_native_id()
        out = {}
        for entry in os.listdir("/proc/self/task"):
            tid = int(entry)
            if tid != me:
                with contextlib.suppress(OSError):  # the thread ended meanwhile
                    out[tid] = time.clock_gettime((~tid << 3) | 6)  # Linux: MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)
        return out
    except (OSError, ValueError, AttributeError):
        return time.process_time() - time.thread_time()


def _cpu_since(before: dict[int, float] | float, after: dict[int, float] | float) -> float:
    """The other threads' CPU seconds between two :func:`_other_threads_cpu` readings (threads in both)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return sum(after[t] - before[t] for t in after.keys() & before.keys())
    if isinstance(before, dict) or isinstance(after, dict):
        return math.nan
    return after - before


def _local_set_state(learner: Any) -> Callable[[], None]:
    """What a weight sync does on the driver's local EnvRunner: ``set_state`` of the learner's inference-only
    weights (``get_state(inference_only=True)``, as numpy) on a module of the same spec."""
    from ray.rllib.utils.numpy import convert_to_numpy

    state = convert_to_numpy(learner.module.get_state(inference_only=True))
    other = copy.deepcopy(learner.module)  # a second module of the same spec, as the EnvRunner's is

    def sync() -> None:
        other.set_state(state)

    return sync


def measure_torch_team(name: str, update: Callable[[], Any], what: str, quick: bool = False,
                       sync: Callable[[], Any] | None = None) -> WorkloadMeasurement:
    """``torch_team:<name>``: what torch's extra intra-op threads cost the cores around one update.

    A process with torch's default thread count (a local learner, ``num_learners=0``: Ray sets
    ``OMP_NUM_THREADS=1`` only in its workers) runs its parallel regions on an OpenMP team. On Linux
    builds that is libgomp, whose idle workers spin-wait (``GOMP_SPINCOUNT``) before they sleep: after
    a region ends each worker stays on a core for a while, competing with every other process on the
    node (the EnvRunner, the plane actor). Timed here, with nothing else to run:

    - ``latency``: the spin, CPU seconds each extra thread burns in an idle gap of
      :data:`TEAM_GAPS` [0] after an update (the other threads' CPU clocks, :func:`_other_threads_cpu`);
    - ``extra["update_share"]``: the extra threads' CPU time during the update over its wall time, per
      extra thread (parallel work and the short spins between regions);
    - ``extra["short_gap_share"]``: the same over a gap of :data:`TEAM_GAPS` [1] (a spin longer than the
      gap keeps the core for all of it: about 1);
    - ``extra["sync_spin_s"]`` (with ``sync``, a weight sync's ``set_state`` of the module on the driver's
      local EnvRunner): the spin in the same idle gap after it. Its copy of the weights is a parallel region
      too (torch's ``copy_`` of a tensor of at least its grain size), so the team spins after every sync.

    One torch thread (Ray's workers) has no team: not measured, with the reason."""
    import torch

    threads = int(torch.get_num_threads())
    if threads < 2:
        return WorkloadMeasurement(f"torch_team:{name}", math.nan, math.nan, 0,
                                   "one torch thread: no OpenMP team to measure", unit="regions")
    workers = threads - 1
    reps = 12 if quick else 40
    for _ in range(5):
        update()
    spins, shares, short = [], [], []
    for gap, into in ((TEAM_GAPS[0], spins), (TEAM_GAPS[1], short)):
        for _ in range(reps):
            o0, t0 = _other_threads_cpu(), time.perf_counter()
            update()
            o1, t1 = _other_threads_cpu(), time.perf_counter()
            time.sleep(gap)
            o2, t2 = _other_threads_cpu(), time.perf_counter()
            if gap == TEAM_GAPS[0]:
                shares.append(_cpu_since(o0, o1) / max(t1 - t0, 1e-9) / workers)
                into.append(_cpu_since(o1, o2) / workers)
            else:
                into.append(_cpu_since(o1, o2) / max(t2 - t1, 1e-9) / workers)
    spin = max(1e-9, statistics.median(spins))
    extra: dict[str, Any] = {}
    if sync is not None:
        for _ in range(5):
            sync()
        after_sync = []
        for _ in range(reps):
            sync()
            o1 = _other_threads_cpu()
            time.sleep(TEAM_GAPS[0])
            after_sync.append(_cpu_since(o1, _other_threads_cpu()) / workers)
        extra["sync_spin_s"] = statistics.median(after_sync)
    return WorkloadMeasurement(
        f"torch_team:{name}", 1.0 / spin, spin, 2 * reps,
        f"{what} with {threads} torch threads, then an idle gap: the {workers} extra thread(s)' CPU time "
        f"(each thread's CPU clock) in a {TEAM_GAPS[0] * 1e3:.0f} ms gap is the spin per region end; "
        f"medians of {reps}" + ("; extra sync_spin_s: the same after a weight sync's set_state" if sync else ""),
        [1], [spin], unit="regions",
        extra={"torch_threads": threads, "workers": workers, "update_share": statistics.median(shares),
               "short_gap_share": statistics.median(short), "gaps_s": list(TEAM_GAPS),
               "load_average": list(os.getloadavg()), **extra})


def measure_local_learner(name: str, algo: str, config, quick: bool = False,
                          update_only: bool = False) -> list[WorkloadMeasurement]:
    """``learner_update_local:<name>``: :func:`measure_learner`'s ``Learner.update`` with torch's default
    thread count, in **wall-clock** time, as a local learner (``num_learners=0``) runs it: in the driver
    process, where Ray does not set ``OMP_NUM_THREADS=1`` (it does so only in its workers) and torch
    keeps one intra-op thread per core. The CPU time of several threads would overstate the update's
    duration, so the latency and rate are refitted from the wall medians: valid only on a quiet
    machine (the load average is recorded with it). With it, ``torch_team:<name>`` (:func:`measure_torch_team`):
    what those threads cost the node's other processes (not with ``update_only``: the update primitives
    alone, as :func:`measure_learner`'s)."""
    import torch

    threads = max(1, int(os.cpu_count() or 1))
    with _torch_threads(threads):
        ms = [m for m in measure_learner(name, algo, config, quick, team=not update_only, update_only=update_only)
              if m.name.startswith(("learner_update:", "learner_update_call:", "gae_connector:", "gae_streamed:",
                                    "batch_connector:", "torch_team:"))]
    out = [m for m in ms if m.name.startswith("torch_team:")]
    for m in ms:
        if m.name.startswith("torch_team:"):
            continue
        lat, rate, how = refit(m.sizes, m.extra["wall_medians"], m.extra)
        out.append(WorkloadMeasurement(m.name.replace(":", "_local:", 1), rate, lat, m.samples,
                                       f"{m.note.replace('one torch thread', f'{threads} torch threads')}; "
                                       f"refitted from the wall medians ({how})", list(m.sizes),
                                       list(m.extra["wall_medians"]), unit=m.unit,
                                       extra={"torch_threads": threads, "load_average": list(os.getloadavg()),
                                              "default_threads": torch.get_num_threads(),
                                              **{k: m.extra[k] for k in ("epochs_timed", "minibatch_size",
                                                                         "fit_anchor", "episodes_from", "memory",
                                                                         "rounds")
                                                 if k in m.extra}}))
    return out


def _replay_buffer(rb_cfg: dict[str, Any]):
    """The replay buffer a DQN config asks for (RLlib's default: prioritized), built as the algorithm does."""
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer

    kind = rb_cfg.get("type", "PrioritizedEpisodeReplayBuffer")
    kind = getattr(kind, "__name__", kind)
    capacity = int(rb_cfg.get("capacity", 50_000))
    if "Prioritized" in str(kind):
        return PrioritizedEpisodeReplayBuffer(capacity=capacity, alpha=rb_cfg.get("alpha", 1.0))
    return EpisodeReplayBuffer(capacity=capacity)


def _leaves(tree: Any):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _leaves(v)
    elif isinstance(tree, list | tuple):
        for v in tree:
            yield from _leaves(v)
    else:
        yield tree


def measure_workload_primitives(configs: dict[str, tuple[str, Any]], quick: bool = False,
                                progress: Progress | None = None) -> dict[str, WorkloadMeasurement]:
    """Every workload primitive of ``configs`` (``{name: (algo, AlgorithmConfig)}``, algo one of ppo,
    appo, dqn), keyed ``"<primitive>:<name>"``. One torch thread throughout, in a process attached to a
    running Ray (:func:`attached_ray`, as the real run's pieces run; ``extra["ray_attached"]``); a primitive
    that fails is recorded as not measured (with the reason), never skipped silently, and so is every one
    when Ray cannot start."""
    out: dict[str, WorkloadMeasurement] = {}
    try:
        with attached_ray(progress):
            _measure_each_workload(configs, quick, progress, out)
    except RayStartError as exc:
        for name in configs:
            m = WorkloadMeasurement(f"workload:{name}", math.nan, math.nan, 0,
                                    f"{exc} (the workload primitives are timed attached to a running Ray)")
            log.warning("calibrate: %s not measured: %s", m.name, m.note)
            out[m.name] = m
    return out


def _measure_each_workload(configs: dict[str, tuple[str, Any]], quick: bool, progress: Progress | None,
                           out: dict[str, WorkloadMeasurement]) -> None:
    """:func:`measure_workload_primitives`'s loop, with Ray up."""
    with _torch_threads(1):
        for name, (algo, config) in configs.items():
            for what in ("env_runner", "module"):
                try:
                    if what == "env_runner":
                        ms = [measure_env_runner(name, config, quick)]
                    else:  # the proxy, then RLlib's own Learner where it can be timed (replaces the proxy's update)
                        ms = measure_module(name, algo, config, quick) + measure_learner(name, algo, config, quick)
                        if int(config.num_learners or 0) == 0:  # a local learner: the driver's torch threads
                            ms += measure_local_learner(name, algo, config, quick)
                except Exception as exc:  # noqa: BLE001 - recorded, and logged below
                    ms = [WorkloadMeasurement(f"{what}:{name}", math.nan, math.nan, 0,
                                              f"{type(exc).__name__}: {exc}")]
                for m in ms:
                    if m.name in out:  # RLlib's own Learner replaces the proxy; the proxy is kept beside it
                        out[m.name.replace(":", "_proxy:", 1)] = out[m.name]
                    if m.samples == 0:
                        log.warning("calibrate: %s not measured: %s", m.name, m.note)
                    m.extra["ray_attached"] = True
                    out[m.name] = m
                    if progress is not None:
                        progress(f"calibrate: {m.summary()}")


def default_workload_configs() -> dict[str, tuple[str, Any]]:
    """Stock PPO, APPO and DQN configs on CartPole-v1 and on the 84x84x4 uint8 :class:`LargeObsEnv` with
    the reference CNN (``conduit calibrate --workloads``); ``studies/validation.py`` passes the study's
    own configs instead."""
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.ppo import PPOConfig

    from conduit.runtime.rllib.envs import LARGE_OBS_ENV, register_envs, uint8_cnn

    register_envs()
    out = {}
    for algo, make in (("ppo", PPOConfig), ("appo", APPOConfig), ("dqn", DQNConfig)):
        out[f"{algo}-cartpole"] = (algo, make().environment("CartPole-v1"))
        large = make().environment(LARGE_OBS_ENV, env_config={"obs_shape": (84, 84, 4), "episode_len": 200})
        out[f"{algo}-largeobs"] = (algo, uint8_cnn(large))
    return out


def workload_to_json(measurements: dict[str, WorkloadMeasurement]) -> dict[str, Any]:
    """``{name: measurement dict}`` for the calibration JSON's ``"workload"`` entry."""
    return {k: m.to_dict() for k, m in measurements.items()}
