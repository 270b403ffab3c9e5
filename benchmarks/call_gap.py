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
2.09 / 0.67 / 1.56 ms back to back; priorities 2.46 / 1.26 / 1.18 against 1.19 / 0.53 / 0.71 ms. The simulator
charges every call its back-to-back cost (``results/validation/NOTES.md``, 2026-12-07 04:00-: what that leaves
out of DQN's exposed latency).

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/call_gap.py [--gaps 0 1 2 5 10 20 50] [--calls 100]  # ~1 min
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CALL_TIMEOUT_S = 60.0


def gap_costs(call: Callable[[], object], caller_pid: int, callee_pid: int, gaps_s: Sequence[float], calls: int,
              blocks: int = 3, idle_s: float = 0.3) -> list[dict[str, float]]:
    """Per gap: ``{gap_s, wall_s, caller_cpu_s, callee_cpu_s}``, each a median, of ``call()`` issued after the
    caller slept ``gap_s`` (wall: ``calls`` timed calls; CPU: ``blocks`` blocks of ``calls`` calls per process)."""
    from conduit.runtime.proccpu import callee_cpu_per_call

    if calls < 1 or blocks < 1:
        raise ValueError(f"calls and blocks must be at least 1, got {calls} and {blocks}")
    rows = []
    for gap in gaps_s:
        if not gap >= 0:
            raise ValueError(f"a gap must be a number of seconds >= 0, got {gap!r}")

        def spaced(gap: float = gap) -> None:
            if gap:
                time.sleep(gap)
            call()

        walls = []
        for _ in range(calls):
            if gap:
                time.sleep(gap)
            t = time.perf_counter()
            call()
            walls.append(time.perf_counter() - t)
        caller = callee_cpu_per_call(spaced, caller_pid, calls=calls, blocks=blocks, idle_s=idle_s)
        callee = callee_cpu_per_call(spaced, callee_pid, calls=calls, blocks=blocks, idle_s=idle_s)
        rows.append({"gap_s": gap, "wall_s": statistics.median(walls), "caller_cpu_s": caller, "callee_cpu_s": callee})
    return rows


def report(rows: Sequence[dict[str, float]]) -> str:
    """A table of the figures and each against the first row's (the back-to-back one, when gap 0 is first)."""
    base = rows[0]
    lines = [f"{'gap':>8}  {'round trip':>12}  {'caller CPU':>12}  {'callee CPU':>12}   (x the {base['gap_s'] * 1e3:g} ms gap)"]
    for r in rows:
        ratios = "  ".join(f"{r[k] / base[k]:.2f}x" if base[k] > 0 else "-"
                           for k in ("wall_s", "caller_cpu_s", "callee_cpu_s"))
        lines.append(f"{r['gap_s'] * 1e3:6.1f} ms  {r['wall_s'] * 1e3:9.3f} ms  {r['caller_cpu_s'] * 1e3:9.3f} ms  "
                     f"{r['callee_cpu_s'] * 1e3:9.3f} ms   {ratios}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gaps", type=float, nargs="+", default=[0, 1, 2, 5, 10, 20, 50],
                   help="milliseconds the caller sleeps before each call (the first is the baseline)")
    p.add_argument("--calls", type=int, default=100, help="calls per gap and per block")
    p.add_argument("--blocks", type=int, default=3, help="CPU blocks per gap and process")
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
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
