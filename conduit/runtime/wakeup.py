"""How the kernel serves a thread that wakes on a crowded node: the microbenchmark behind ``wake_latency`` and
``wake_slice_time``.

The data path's short pieces of work (a Ray call's sender side, the plane actor's handling of a call, a learner's
connector on a batch that just arrived) run on threads that slept until their input came. The simulator has to
say when such a piece gets a core while every core runs CPU-bound work (EnvRunners sampling, a learner training).
Queued first in, first out behind the running threads' time slices, it would wait a whole slice per hop; a
fair-share kernel instead lets a thread that slept run at once, because it has used less than its share. How
soon it runs and for how long before it shares its core again is the kernel's policy (EEVDF since Linux 6.6: a
woken task keeps its lag, and with an earlier virtual deadline preempts the running one once that has used its
own slice). :func:`measure` times both on the machine it runs on, with nothing of Conduit in it:

* **neighbours**: as many learner-like processes as the node has cores (:class:`conduit.runtime.contention.
  Neighbours`: a CNN's update in a loop, one torch thread), so every core runs CPU-bound work;
* **the sleeper**: a thread of this process sleeps a random 5-20 ms, then runs ``run_s`` of pure-Python work
  reading ``time.perf_counter`` in a tight loop. A gap between two readings longer than ``GAP_S`` is a time the
  thread was off its core. Per wake: the **wake latency** (the first reading after the sleep less the instant
  the sleep ended) and the **first run** (from that reading to the first gap: the core time it got before it
  had to share);
* **paired windows**: the neighbours are switched on and off (order alternating), so the host's own drift
  cancels; the idle windows' latency is the timer's own (the sleep's overshoot) and is subtracted.

The figures: ``wake_latency`` = mean wake latency beside busy neighbours less the mean with them idle (never
below 0), ``wake_slice_time`` = the median first run beside busy neighbours (a run never preempted counts at its
full length). The simulator (:class:`conduit.sim.resources.CpuPool`) gives a woken piece of work a core after
``wake_latency`` for up to ``wake_slice_time``, the rest first in, first out.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from conduit.runtime.contention import Neighbours, quartiles

#: a gap between two clock readings of the spinning thread longer than this is a time it was off its core
GAP_S = 50e-6
#: how long each woken run spins: longer than any slice a kernel gives, so every run shows its first preemption
RUN_S = 8e-3
#: the sleep before each wake, drawn uniformly (seconds)
SLEEP_S = (5e-3, 20e-3)


def wake_once(run_s: float = RUN_S, sleep: float | None = None,
              rng: random.Random | None = None) -> tuple[float, float, bool]:
    """One sleep and wake: ``(wake latency, first run, preempted)``; the first run is ``run_s`` when the thread
    kept its core throughout (``preempted`` False)."""
    if sleep is None:
        sleep = (rng or random).uniform(*SLEEP_S)
    clock = time.perf_counter
    due = clock() + sleep
    time.sleep(sleep)
    start = last = clock()
    first_run = None
    while True:
        now = clock()
        if now - last > GAP_S and first_run is None:
            first_run = last - start
        last = now
        if now - start >= run_s:
            break
    return start - due, (run_s if first_run is None else first_run), first_run is not None


def wake_windows(neighbours: Neighbours, pairs: int, wakes: int,
                 progress: Callable[[str], None] | None = None,
                 seed: int = 0) -> dict[bool, list[tuple[float, float, bool]]]:
    """``{busy: [(latency, first run, preempted), ...]}`` over ``pairs`` idle/busy pairs of ``wakes`` wakes each."""
    rng = random.Random(seed)
    out: dict[bool, list[tuple[float, float, bool]]] = {False: [], True: []}
    for i in range(pairs):
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            neighbours.busy(on)
            out[on].extend(wake_once(rng=rng) for _ in range(wakes))
        if progress:
            progress(f"wake-up: pair {i + 1}/{pairs}")
    return out


def summarise(windows: dict[bool, Sequence[tuple[float, float, bool]]], cores: int, neighbours: int) -> dict[str, Any]:
    """The figures of :func:`wake_windows`' readings (module doc)."""
    busy, idle = windows[True], windows[False]
    if not busy or not idle:
        raise ValueError("wake-up: need readings with the neighbours idle and busy")
    lat_busy = [w[0] for w in busy]
    lat_idle = [w[0] for w in idle]
    first = [w[1] for w in busy]
    latency = max(0.0, statistics.fmean(lat_busy) - statistics.fmean(lat_idle))
    slice_s = statistics.median(first)
    preempted = sum(w[2] for w in busy) / len(busy)
    return {
        "cores": cores, "neighbours": neighbours, "wakes_busy": len(busy), "wakes_idle": len(idle),
        "wake_latency": latency, "wake_slice_time": slice_s,
        "latency_busy_quartiles": quartiles(lat_busy), "latency_busy_mean": statistics.fmean(lat_busy),
        "latency_idle_quartiles": quartiles(lat_idle), "latency_idle_mean": statistics.fmean(lat_idle),
        "first_run_quartiles": quartiles(first), "preempted_share": preempted,
        "note": (f"{len(busy)} wakes beside {neighbours} busy learner-like processes on {cores} cores, "
                 f"{len(idle)} with them idle, paired windows; a woken thread got a core after "
                 f"{latency * 1e3:.3f} ms (mean, less the timer's own) and ran {slice_s * 1e3:.3f} ms (median) "
                 f"before it shared it ({preempted:.0%} of runs of {RUN_S * 1e3:.0f} ms were preempted)"),
    }


def measure(pairs: int = 8, wakes: int = 40, neighbours: int | None = None,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time how the kernel serves a woken thread beside ``neighbours`` (default: the cores) busy processes
    (module doc); returns :func:`summarise`'s figures plus ``when``."""
    if pairs < 1 or wakes < 1:
        raise ValueError(f"wake-up: pairs and wakes must be at least 1, got {pairs} and {wakes}")
    cores = len(os.sched_getaffinity(0))
    k = cores if neighbours is None else neighbours
    with Neighbours(k) as crowd:
        windows = wake_windows(crowd, pairs, wakes, progress)
    out = summarise(windows, cores, k)
    out["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return out
