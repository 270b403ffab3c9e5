"""A process's CPU time as Linux accounts it, and what one call costs the process that serves it.

A Ray call costs its callee CPU that no timer in the caller sees: the task's dispatch, the
arguments' deserialisation, the result's serialisation, on the callee's own threads. The simulator
charges that work to the callee's core (``StockCosts.rpc_callee_cpu`` for an EnvRunner,
``PlaneCosts.actor_callee_cpu`` for a plane actor), so it is measured here from outside: the
callee's CPU seconds, summed over every thread from ``/proc/<pid>/task/<tid>/schedstat``
(nanoseconds on a CPU, and waiting for one), over a block of calls, less what the same process
burns idle over the same wall time (Ray's workers poll and heartbeat whether called or not).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def read_proc(path: str) -> str | None:
    """A ``/proc`` file's text, or None once what it describes is gone."""
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def thread_times(pid: int) -> tuple[float, float] | None:
    """Seconds the threads of ``pid`` have spent on a CPU and waiting for one, summed (``schedstat``'s
    first two fields, nanoseconds, per ``/proc/<pid>/task/<tid>``); None once the process is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    run = wait = 0
    for tid in tids:
        ss = read_proc(f"/proc/{pid}/task/{tid}/schedstat")
        if ss:
            fields = ss.split()
            run, wait = run + int(fields[0]), wait + int(fields[1])
    return run / 1e9, wait / 1e9


def threads_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Per thread of ``pid``: its name (``comm``: Python threads keep the process's name unless the
    library names them, torch's OpenMP team and Ray's C++ threads have their own) and the seconds it has
    spent on a CPU (``schedstat``); empty once the process is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    out = {}
    for tid in tids:
        ss, name = read_proc(f"/proc/{pid}/task/{tid}/schedstat"), read_proc(f"/proc/{pid}/task/{tid}/comm")
        if ss and name is not None:
            out[int(tid)] = (name.strip(), int(ss.split()[0]) / 1e9)
    return out


def process_cpu_s(pid: int) -> float:
    """Seconds every thread of ``pid`` has spent on a CPU (:func:`thread_times`); an error naming the pid once
    the process is gone (a difference against a gone process would measure nothing)."""
    times = thread_times(pid)
    if times is None:
        raise RuntimeError(f"process {pid} is gone: its CPU time cannot be read")
    return times[0]


def callee_cpu_per_call(call: Callable[[], Any], pid: int, calls: int = 200, blocks: int = 5,
                        idle_s: float = 0.5) -> float:
    """The callee process ``pid``'s CPU seconds per ``call()`` (one synchronous call it serves).

    Per block: the process's CPU (every thread) over ``idle_s`` of nothing, then over ``calls`` back-to-back
    calls; the block's figure is the calls' CPU less the idle rate times their wall time, per call. The
    median over ``blocks``."""
    if calls < 1 or blocks < 1:
        raise ValueError(f"callee_cpu_per_call: calls and blocks must be >= 1, got {calls} and {blocks}")
    per_block = []
    for _ in range(blocks):
        c0, t0 = process_cpu_s(pid), time.perf_counter()
        time.sleep(idle_s)
        c1, t1 = process_cpu_s(pid), time.perf_counter()
        idle_rate = (c1 - c0) / (t1 - t0)
        for _ in range(calls):
            call()
        c2, t2 = process_cpu_s(pid), time.perf_counter()
        per_block.append(max(0.0, (c2 - c1) - idle_rate * (t2 - t1)) / calls)
    return statistics.median(per_block)


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine from ``/proc/stat``'s ``cpu`` line (idle and iowait are
    not busy), or None where there is no such file."""
    text = read_proc("/proc/stat")
    if not text or not text.startswith("cpu "):
        return None
    ticks = [int(x) for x in text.split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return sum(ticks) - idle, sum(ticks)


def busy_cores(seconds: float = 1.0) -> float | None:
    """How many cores the machine kept busy over the next ``seconds`` (every process: call it while this one
    waits), from two reads of ``/proc/stat``; None where Linux's accounting is not there.

    The 1-min load average answers a different question: it decays over minutes, so it still counts a run that
    ended seconds ago (2.4-3.6 on the 2-core VM just after a validation run, with both cores idle)."""
    first = _cpu_jiffies()
    time.sleep(seconds)
    second = _cpu_jiffies()
    if first is None or second is None or second[1] <= first[1]:
        return None
    return (second[0] - first[0]) / (second[1] - first[1]) * (os.cpu_count() or 1)
