"""Timing a Ray call back to back and after its caller sat idle: the figures of the simulator's cold-call law.

A Ray call issued right after the previous one is cheap; one issued after the caller (or the callee) has gone
a few milliseconds without a call costs 2-3x as much on the 2-core VM, because both processes' Ray threads go
to sleep in between (:mod:`conduit.sim.raycalls` states the law and where it was measured). These helpers time
one call shape at a series of sleeps between calls and reduce the series to the law's figures:

* :func:`gap_costs`: per sleep, the median start-to-start interval, the round trip (wall) and, where Linux
  ``/proc`` is there, the caller's and the callee's CPU per call (every thread, less each process's idle
  burn: :func:`conduit.runtime.proccpu.callee_cpu_per_call`);
* :func:`cold_ramp`: the interval up to which a call is still warm (the back-to-back one) and the interval from
  which it pays the whole surcharge (the first whose CPU per call, both processes', reached :data:`COLD_SHARE`
  of the longest sleep's growth), the ramp :class:`conduit.sim.raycalls.ColdRamp` interpolates;
* :func:`cold_figures`: the surcharges, each the longest sleep's figure less the back-to-back one.

Used by ``benchmarks/stock_primitives.py`` (section ``gap``: RLlib's ``apply`` call to an actor), by ``conduit
calibrate`` (the plane actor's calls) and by ``benchmarks/call_gap.py``.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence

#: the sleeps between calls the calibration times, seconds: back to back, then up to the plateau the
#: 2-core VM reaches from 5-10 ms on (``benchmarks/call_gap.py``)
DEFAULT_SLEEPS_S = (0.0, 0.001, 0.002, 0.005, 0.010, 0.020)
#: the share of the longest sleep's growth from which an interval counts as cold
COLD_SHARE = 0.9


def gap_costs(call: Callable[[], object], caller_pid: int | None, callee_pid: int | None, sleeps_s: Sequence[float],
              calls: int, blocks: int = 3, idle_s: float = 0.3) -> list[dict[str, float]]:
    """Per sleep: ``{sleep_s, interval_s, wall_s[, caller_cpu_s][, callee_cpu_s]}``, medians, of ``call()``
    issued after the caller slept ``sleep_s`` (wall and interval: ``calls`` timed calls; CPU: ``blocks``
    blocks of ``calls`` calls per process, only for a pid given)."""
    from conduit.runtime.proccpu import callee_cpu_per_call

    if calls < 1 or blocks < 1:
        raise ValueError(f"calls and blocks must be at least 1, got {calls} and {blocks}")
    rows = []
    for sleep in sleeps_s:
        if not sleep >= 0:
            raise ValueError(f"a sleep must be a number of seconds >= 0, got {sleep!r}")

        def spaced(sleep: float = sleep) -> None:
            if sleep:
                time.sleep(sleep)
            call()

        walls, starts = [], []
        for _ in range(calls):
            if sleep:
                time.sleep(sleep)
            t = time.perf_counter()
            call()
            starts.append(t)
            walls.append(time.perf_counter() - t)
        intervals = [b - a for a, b in itertools.pairwise(starts)] or walls
        row = {"sleep_s": sleep, "interval_s": statistics.median(intervals), "wall_s": statistics.median(walls)}
        for key, pid in (("caller_cpu_s", caller_pid), ("callee_cpu_s", callee_pid)):
            if pid is not None:
                row[key] = callee_cpu_per_call(spaced, pid, calls=calls, blocks=blocks, idle_s=idle_s)
        rows.append(row)
    return rows


def ramp_figure(row: dict[str, float]) -> float:
    """What the ramp follows: the two processes' CPU per call where both were measured (the surcharges the
    simulator charges are CPU; on the 2-core VM the round trip keeps creeping up after the CPU has levelled
    off), else the round trip."""
    if "caller_cpu_s" in row and "callee_cpu_s" in row:
        return row["caller_cpu_s"] + row["callee_cpu_s"]
    return row["wall_s"]


def cold_ramp(rows: Sequence[dict[str, float]]) -> tuple[float, float]:
    """``(warm_within, cold_after)`` from :func:`gap_costs` rows, the first back to back and the last the
    plateau, by :func:`ramp_figure`: ``(0, 0)`` (no law) when the last figure is not above the first."""
    base, last = ramp_figure(rows[0]), ramp_figure(rows[-1])
    growth = last - base
    if growth <= 0:
        return 0.0, 0.0
    warm = rows[0]["interval_s"]
    cold = next((r["interval_s"] for r in rows[1:] if ramp_figure(r) - base >= COLD_SHARE * growth),
                rows[-1]["interval_s"])
    return warm, max(warm, cold)


def cold_figures(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each figure's surcharge: the last row's (the longest sleep) less the first's (back to back), floored at
    0 (a noisy reading below the back-to-back one is no surcharge)."""
    base, last = rows[0], rows[-1]
    return {key: max(0.0, last[key] - base[key]) for key in ("wall_s", "caller_cpu_s", "callee_cpu_s")
            if key in base and key in last}
