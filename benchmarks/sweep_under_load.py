"""Does this machine time the EnvRunner sweep differently under load? (issue 13: the calibration's drift)

The validation's largest primitive is each workload's EnvRunner sweep (``measure_env_runner``, process CPU
time, one torch thread). Re-timed before each real run it has read 19-37% slower than the calibration
25 minutes earlier, while the host probe did not move. If the sweep's CPU time depended on what else
runs on the machine, a calibration taken on an idle machine would under-predict every real run (which
keeps both cores busy), and the calibration would have to be taken under the same load. This script
times the same sweep (the validation's own re-timing, :func:`studies.validation.recheck_env_runner`)

1. alone;
2. beside a process doing torch matmuls on the other core (an EnvRunner's kind of work);
3. beside a pure-Python busy loop;
4. as two sweeps at once (one per core, like two EnvRunners);
5. right after ``--burn-s`` seconds of a busy loop on both cores, and again ~35 s later;
6. after ``--idle-s`` seconds of idle;

and prints each with its ratio to the first. A ratio near 1 everywhere says the sweep does not depend
on our own load: a drift between the calibration and a run then comes from outside the guest. (2026-12-05:
0.97-1.02 in every case; benchmarks/README.md.)

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/sweep_under_load.py [--workload ppo-largeobs-2r-1l]
        [--burn-s 300] [--idle-s 180]      # ~10 min with the defaults
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from queue import Empty

ROOT = Path(__file__).resolve().parents[1]
#: seconds the concurrent sweep may take (one sweep takes 10-20 s)
SWEEP_TIMEOUT_S = 600.0


def _sweep(workload: str) -> tuple[float, float]:
    """The validation's re-timing of ``workload``'s EnvRunner sweep: (ms per step, host probe s)."""
    for path in (str(ROOT), str(ROOT / "studies")):
        if path not in sys.path:
            sys.path.insert(0, path)
    import validation

    study = validation.experience_path_study()
    configs = validation.study_configs(study, study.parse_args([]), [workload])
    entry = validation.recheck_env_runner(configs, workload, False)
    return entry["per_item"] * 1e3, float(entry["extra"]["speed_probe"]["total_s"])


def _sweep_into(workload: str, out: mp.Queue) -> None:
    out.put(_sweep(workload))


def _torch_burn(seconds: float) -> None:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(50):
            a = torch.tanh(a @ a * 0.01)


def _python_burn(seconds: float) -> None:
    t0, x = time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        for i in range(10_000):
            x += i * i


def _beside(target, seconds: float, workload: str) -> tuple[float, float]:
    proc = mp.Process(target=target, args=(seconds,), daemon=True)
    proc.start()
    try:
        time.sleep(3)  # the burner is up to speed
        return _sweep(workload)
    finally:
        proc.terminate()
        proc.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="ppo-largeobs-2r-1l", help="a studies/rllib_experience_path.py workload")
    ap.add_argument("--burn-s", type=float, default=300.0, help="seconds of two-core busy loop before step 5")
    ap.add_argument("--idle-s", type=float, default=180.0, help="seconds of idle before step 6")
    args = ap.parse_args(argv)
    if args.burn_s < 0 or args.idle_s < 0:
        ap.error("--burn-s and --idle-s: must be >= 0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    mp.set_start_method("spawn", force=True)
    rows: list[tuple[str, float, float]] = []

    def report(label: str, got: tuple[float, float]) -> None:
        rows.append((label, *got))
        base = rows[0][1]
        print(f"{time.strftime('%H:%M:%S')}  {label:36s} {got[0]:7.3f} ms/step  x{got[0] / base:5.3f}  "
              f"host probe {got[1]:.3f} s  (load {os.getloadavg()[0]:.2f})", flush=True)

    print(f"EnvRunner sweep of {args.workload} (the validation's re-timing: process CPU time, one torch thread)")
    report("alone", _sweep(args.workload))
    report("beside a torch matmul loop", _beside(_torch_burn, 120.0, args.workload))
    report("beside a Python busy loop", _beside(_python_burn, 120.0, args.workload))
    queue: mp.Queue = mp.Queue()
    other = mp.Process(target=_sweep_into, args=(args.workload, queue), daemon=True)
    other.start()
    mine = _sweep(args.workload)
    try:
        theirs = queue.get(timeout=SWEEP_TIMEOUT_S)
    except Empty:
        other.terminate()
        print(f"error: the second sweep gave no result within {SWEEP_TIMEOUT_S:.0f} s (exit code {other.exitcode})",
              file=sys.stderr)
        return 1
    finally:
        other.join(timeout=10)
    report("two sweeps at once (this one)", mine)
    report("two sweeps at once (the other)", theirs)
    burners = [mp.Process(target=_python_burn, args=(args.burn_s,), daemon=True) for _ in range(2)]
    for p in burners:
        p.start()
    for p in burners:
        p.join()
    report(f"right after {args.burn_s:.0f} s of 2-core load", _sweep(args.workload))
    report("again", _sweep(args.workload))
    time.sleep(args.idle_s)
    report(f"after {args.idle_s:.0f} s idle", _sweep(args.workload))
    ratios = [r[1] / rows[0][1] for r in rows]
    print(f"ratios to the first: {min(ratios):.3f} .. {max(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
