"""Timing a thread's work right after it slept: the warm-up debt a microbenchmark's tight loop never pays.

Every compute figure the simulator reads (an EnvRunner's sampling per env step, a learner's update, the driver's
buffer calls) is timed in a loop that runs the work back to back, so the thread's caches, TLB and branch
history stay hot. A training loop does not run its threads that way: in DQN's round the EnvRunner sleeps about
16 ms while the driver adds, samples, updates and syncs, and the driver sleeps while it waits for the sample
call. On the 2-core VM (2026-12-07, AMD EPYC host) the same ``sample()`` of an RLlib EnvRunner costs 1.0 ms of
thread CPU back to back and 2.3 ms right after a 16 ms sleep, in one process, with nothing else running; the
work after it stays dearer for a few more milliseconds. The thread pays a debt on waking, and pays it off as it
works. Unlike the cold-call surcharge of :mod:`conduit.runtime.callgap` (an empty Ray call: Ray's own threads),
this is the work's own code and data going cold, so it grows with the work's working set.

These helpers time one unit of work ``units`` times in a row, back to back (``warm``) and right after each
sleep (``cold``), in alternating blocks so that drift hits both, in the calling thread's CPU time
(``time.thread_time``: other processes on the machine do not inflate it):

* :func:`debt_curve`: per sleep, the per-position medians of both blocks and the extra the cold block paid,
  cumulated over the positions;
* :func:`debt_ramp`: the sleep up to which a thread is still warm and the one from which it pays the whole debt,
  the ramp :class:`conduit.sim.raycalls.ColdRamp` interpolates (the simulator's warm-up debt,
  :mod:`conduit.sim.coldwork`);
* :func:`debt_figures`: the debt at each sleep (the whole cold block's extra), the plateau (the longest sleep's),
  the sleep from which a thread pays :data:`PLATEAU_SHARE` of it, and how much of its own work a thread does
  before half of the debt is paid (``half_paid_work_s``: the debt is spread over the first milliseconds of
  work, not charged at the first instruction).

Used by ``benchmarks/wake_debt.py`` and ``benchmarks/stock_primitives.py`` (section ``wake``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

#: the sleeps the benchmark times, seconds: from shorter than a scheduler tick to longer than a DQN round
DEFAULT_SLEEPS_S = (0.001, 0.002, 0.005, 0.010, 0.020, 0.040)
#: the share of the plateau from which a sleep counts as long enough to pay the whole debt
PLATEAU_SHARE = 0.9


def _block(unit: Callable[[], object], units: int) -> list[float]:
    out = []
    for _ in range(units):
        start = time.thread_time()
        unit()
        out.append(time.thread_time() - start)
    return out


def debt_curve(unit: Callable[[], object], sleeps_s: Sequence[float] = DEFAULT_SLEEPS_S, units: int = 8,
               trials: int = 60, warmup: int = 30) -> list[dict]:
    """Per sleep: ``{sleep_s, warm_s, cold_s, extra_s}``, where ``warm_s[i]`` / ``cold_s[i]`` are the medians
    over ``trials`` of the ``i``-th unit's thread CPU in a block run right after one untimed unit (warm) or right
    after sleeping ``sleep_s`` (cold), and ``extra_s[i]`` is what the cold block paid more up to and including
    position ``i``. The two kinds of block alternate, so drift over the run hits both alike."""
    if units < 1 or trials < 1 or warmup < 0:
        raise ValueError(f"units and trials must be at least 1 and warmup at least 0, got {units}, {trials}, {warmup}")
    for sleep in sleeps_s:
        if not sleep > 0:
            raise ValueError(f"a sleep must be a number of seconds > 0, got {sleep!r}")
    for _ in range(warmup):
        unit()
    rows = []
    for sleep in sleeps_s:
        warm: list[list[float]] = [[] for _ in range(units)]
        cold: list[list[float]] = [[] for _ in range(units)]
        for _ in range(trials):
            unit()  # the thread is hot: it just ran the same work
            for i, seconds in enumerate(_block(unit, units)):
                warm[i].append(seconds)
            time.sleep(sleep)
            for i, seconds in enumerate(_block(unit, units)):
                cold[i].append(seconds)
        warm_s = [statistics.median(v) for v in warm]
        cold_s = [statistics.median(v) for v in cold]
        extra, total = [], 0.0
        for w, c in zip(warm_s, cold_s, strict=True):
            total += c - w
            extra.append(total)
        rows.append({"sleep_s": sleep, "warm_s": warm_s, "cold_s": cold_s, "extra_s": extra})
    return rows


def half_paid_work(row: dict) -> float:
    """The thread's own (warm) work after which the cold block had paid half of its whole extra, interpolated
    linearly within the unit it falls in; 0 when the block paid no extra."""
    total = row["extra_s"][-1]
    if total <= 0:
        return 0.0
    done, paid = 0.0, 0.0
    for warm, extra in zip(row["warm_s"], row["extra_s"], strict=True):
        if extra >= total / 2:
            step = extra - paid
            return done + (warm * (total / 2 - paid) / step if step > 0 else 0.0)
        done, paid = done + warm, extra
    return done


def debt_figures(rows: Sequence[dict]) -> dict:
    """The curve reduced: ``unit_s`` (one unit back to back, the median position of the longest sleep's warm
    block), ``debt_by_sleep`` (``{sleep_s, debt_s}``: the whole cold block's extra, floored at 0),
    ``debt_s`` (the longest sleep's: the plateau), ``plateau_after_s`` (the shortest sleep whose debt reached
    :data:`PLATEAU_SHARE` of the plateau; 0 when there is no debt), ``half_paid_work_s``
    (:func:`half_paid_work` at the longest sleep) and ``last_unit_extra_s`` (what the block's last unit still
    paid: near 0 when ``units`` covered the debt)."""
    if not rows:
        raise ValueError("no rows to reduce")
    by_sleep = [{"sleep_s": r["sleep_s"], "debt_s": max(0.0, r["extra_s"][-1])} for r in rows]
    last = rows[-1]
    plateau = by_sleep[-1]["debt_s"]
    after = 0.0
    if plateau > 0:
        after = next(r["sleep_s"] for r in by_sleep if r["debt_s"] >= PLATEAU_SHARE * plateau)
    return {
        "unit_s": statistics.median(last["warm_s"]),
        "debt_by_sleep": by_sleep,
        "debt_s": plateau,
        "plateau_after_s": after,
        "half_paid_work_s": half_paid_work(last),
        "last_unit_extra_s": last["cold_s"][-1] - last["warm_s"][-1],
    }


def debt_ramp(rows: Sequence[dict]) -> tuple[float, float]:
    """``(warm_within, cold_after)`` from :func:`debt_curve` rows (sleeps ascending, the last the plateau): the
    shortest sleep whose debt reached :data:`PLATEAU_SHARE` of the plateau, and the longest sleep before it whose
    debt stayed within ``1 - PLATEAU_SHARE`` of it (0 when none did: the ramp starts at no sleep). ``(0, 0)`` (no
    debt) when the plateau is not above 0."""
    figures = debt_figures(rows)
    plateau = figures["debt_s"]
    if plateau <= 0:
        return 0.0, 0.0
    cold = figures["plateau_after_s"]
    warm = max((r["sleep_s"] for r in figures["debt_by_sleep"]
                if r["sleep_s"] < cold and r["debt_s"] <= (1 - PLATEAU_SHARE) * plateau), default=0.0)
    return warm, cold
