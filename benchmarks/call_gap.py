"""What a Ray actor call costs after the caller and the callee sat idle, against back to back

Every Ray figure the models read (``benchmarks/stock_primitives.py``: ``rpc_round_trip_s``, ``rpc_driver_cpu_s``,
``rpc_callee_cpu_s``; ``conduit calibrate``: ``plane_actor_call``, ``plane_actor_callee``, ``plane_replay_draw``,
``plane_replay_priorities``) is timed over calls issued back to back. A training loop does not call that way:
DQN calls its EnvRunner, then the plane, once per update (every 15-25 ms on the 2-core VM), PPO once per
fragment. Between two such calls Ray's threads on both ends go to sleep, and the next call pays for waking them
and for cold caches. This prints, per gap between calls (the caller sleeping that long before each call), an
empty actor call's round trip (median, wall), the calling process's CPU per call and the called actor's (every
thread, ``/proc/<pid>/task/<tid>/schedstat``, less each process's idle burn over the same wall time:
:func:`conduit.runtime.proccpu.callee_cpu_per_call`), and each against the back-to-back figure.

2026-12-07 on the 2-core VM (otherwise idle), two runs: back to back 0.62-0.70 ms round trip, 0.35-0.39 ms
caller CPU, 0.31-0.36 ms callee CPU. Where the cost steps up moves between runs (after a 2-5 ms gap in one, a
5-10 ms gap in the other); from 10 ms on both read a plateau of 1.5-1.85 ms / 0.85-1.18 ms / 0.59-0.80 ms:
**about 2-3x** the back-to-back figures. A prioritized Replay draw of 32 rows spaced 10 ms apart (the same
method on ``PlaneCluster.next_batch``): 3.67 ms round trip, 1.15 ms caller and 2.39 ms plane-actor CPU, against
2.09 / 0.67 / 1.56 ms back to back; priorities 2.46 / 1.26 / 1.18 against 1.19 / 0.53 / 0.71 ms.

The windows (``--windows``, the default) place the cost, which is what the simulator's cold-call law
(:mod:`conduit.sim.raycalls`) rests on. 2026-12-07, two runs each (round trip; back to back / 10 ms apart):

* every core kept busy by a nice-19 spinner: 0.54-0.68 / 1.69-1.78 ms, against 0.73-0.87 / 1.82-2.07 idle (these
  two runs by the probes the windows were then made from): the
  cost is the two **processes'** (Ray's threads asleep, caches cold), not an idle CPU's wake-up;
* the caller computing for 10 ms instead of sleeping: 1.72-1.78 ms against 1.86-1.88 sleeping: computing does
  not keep Ray warm;
* right after a call that computed 10 ms on the callee: 1.47-1.57 ms: the interval counts from a call's
  **start**, not its end;
* back to back round robin over 8 actors (each callee idle about 7 calls' time, the caller never): 1.12-1.16 ms
  against 0.76-0.80 back to back and 1.86 spaced: the callee's part alone, about the callee's CPU surcharge (the
  law adds the two sides' parts).

The script's own run after them (``results/bench/call_gap-2026-12-07.txt``, an hour later) found the step later
and smaller (1.11 ms at 10 ms, 1.23 ms at 20 ms, against 0.71 back to back) and the same placement: 10 ms apart
with every core busy 1.04 ms against 0.98 idle; after computing 1.36 ms; right after a 10 ms call 0.92 ms (0.85
of the way); round robin 0.83 ms (0.61 of the way). The host moves these figures by the hour: the calibration
times them next to the runs it predicts.

The simulator reads the law's figures from ``stock_primitives.py``'s section ``gap`` (the same series on RLlib's
``apply`` call) and ``conduit calibrate``'s ``plane_*_cold``; this script prints them from its own rows too.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/call_gap.py [--gaps 0 1 2 5 10 20 50] [--calls 100] [--no-windows]  # ~1.5 min
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conduit.runtime.callgap import cold_figures, cold_ramp, gap_costs

CALL_TIMEOUT_S = 60.0


def report(rows: Sequence[dict[str, float]]) -> str:
    """A table of the figures and each against the first row's (the back-to-back one, when gap 0 is first)."""
    base = rows[0]
    head = (f"{'gap':>8}  {'interval':>11}  {'round trip':>12}  {'caller CPU':>12}  {'callee CPU':>12}   "
            f"(x the {base['sleep_s'] * 1e3:g} ms gap)")
    lines = [head]
    for r in rows:
        ratios = "  ".join(f"{r[k] / base[k]:.2f}x" if base[k] > 0 else "-"
                           for k in ("wall_s", "caller_cpu_s", "callee_cpu_s"))
        lines.append(f"{r['sleep_s'] * 1e3:6.1f} ms  {r['interval_s'] * 1e3:8.3f} ms  {r['wall_s'] * 1e3:9.3f} ms  "
                     f"{r['caller_cpu_s'] * 1e3:9.3f} ms  "
                     f"{r['callee_cpu_s'] * 1e3:9.3f} ms   {ratios}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gaps", type=float, nargs="+", default=[0, 1, 2, 5, 10, 20, 50],
                   help="milliseconds the caller sleeps before each call (the first is the baseline)")
    p.add_argument("--calls", type=int, default=100, help="calls per gap and per block")
    p.add_argument("--blocks", type=int, default=3, help="CPU blocks per gap and process")
    p.add_argument("--windows", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the windows that place the law (busy cores, a computing caller, after a long "
                        "call, round robin; about 30 s)")
    a = p.parse_args(argv)
    if a.calls < 1 or a.blocks < 1:
        p.error("--calls and --blocks must be at least 1")
    if bad := [g for g in a.gaps if not 0 <= g <= 1000]:
        p.error(f"--gaps: each must be within [0, 1000] ms, got {bad[0]:g}")
    if not Path("/proc/self/task").exists():
        p.error("needs /proc/<pid>/task (Linux)")
    import ray
    from _ray_echo import echo_actor

    Echo = echo_actor(ray)

    ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="call_gap_"))
    try:
        echo = Echo.remote()
        pid = ray.get(echo.pid.remote(), timeout=CALL_TIMEOUT_S)
        rows = gap_costs(lambda: ray.get(echo.f.remote(), timeout=CALL_TIMEOUT_S), os.getpid(), pid,
                         [g / 1e3 for g in a.gaps], a.calls, a.blocks)
        print(f"an empty actor call, {len(os.sched_getaffinity(0))} cores; medians")
        print(report(rows))
        warm, cold = cold_ramp(rows)
        extra = cold_figures(rows)
        print(f"the cold-call law from these rows (conduit.runtime.callgap): warm within {warm * 1e3:.2f} ms, cold "
              f"from {cold * 1e3:.2f} ms; a cold call adds {extra['wall_s'] * 1e3:.3f} ms round trip, "
              f"{extra['caller_cpu_s'] * 1e3:.3f} ms caller CPU, {extra['callee_cpu_s'] * 1e3:.3f} ms callee CPU")
        if a.windows:
            print(windows_report(law_windows(ray, Echo, echo, a.calls)))
    finally:
        ray.shutdown()
    return 0


#: the sleep (seconds) of the law's windows: on the plateau of every run so far
WINDOW_GAP_S = 0.010


def law_windows(ray, Echo, echo, calls: int) -> dict[str, float]:
    """The round trip (median, wall) of an empty call in the windows that place the law
    (:mod:`conduit.sim.raycalls`): back to back and 10 ms apart, with the cores idle and with every core kept
    busy by a nice-19 spinner (per core or per process?); after the caller computed for 10 ms instead of
    sleeping (does computing keep Ray warm?); right after a 10 ms call returned (does the interval count from a
    call's start or its end?); and back to back round robin over 8 actors (the callee's part alone)."""
    import signal
    import subprocess
    import time

    from _ray_echo import spin

    def timed(before, target=echo) -> float:
        walls = []
        for _ in range(calls):
            before()
            t = time.perf_counter()
            ray.get(target.f.remote(), timeout=CALL_TIMEOUT_S)
            walls.append(time.perf_counter() - t)
        return statistics.median(walls)

    out = {"back to back": timed(lambda: None), "10 ms apart": timed(lambda: time.sleep(WINDOW_GAP_S))}
    spinners = [subprocess.Popen([sys.executable, "-c", "import os\nos.nice(19)\nwhile True: pass\n"],
                                 start_new_session=True) for _ in os.sched_getaffinity(0)]
    try:
        time.sleep(0.5)
        out["back to back, every core busy"] = timed(lambda: None)
        out["10 ms apart, every core busy"] = timed(lambda: time.sleep(WINDOW_GAP_S))
    finally:
        for proc in spinners:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out["after the caller computed 10 ms"] = timed(lambda: spin(WINDOW_GAP_S))
    out["right after a 10 ms call"] = timed(lambda: ray.get(echo.work.remote(WINDOW_GAP_S), timeout=CALL_TIMEOUT_S))
    actors = [echo, *(Echo.remote() for _ in range(7))]
    ray.get([x.pid.remote() for x in actors], timeout=CALL_TIMEOUT_S)
    walls = []
    for i in range(calls * 2):
        target = actors[i % len(actors)]
        t = time.perf_counter()
        ray.get(target.f.remote(), timeout=CALL_TIMEOUT_S)
        walls.append(time.perf_counter() - t)
    out["back to back, round robin over 8 actors"] = statistics.median(walls)
    return out


def windows_report(windows: dict[str, float]) -> str:
    """One line per window: its round trip and its share of the way from back to back to 10 ms apart."""
    base, spaced = windows["back to back"], windows["10 ms apart"]
    lines = ["the law's windows (round trip, median; share of the way from back to back to 10 ms apart):"]
    for name, wall in windows.items():
        share = (wall - base) / (spaced - base) if spaced != base else float("nan")
        lines.append(f"  {name:<42} {wall * 1e3:7.3f} ms   {share:5.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
