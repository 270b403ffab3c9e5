"""A local learner's torch threads on a crowded node: one study run with and without other CPU-bound work.

RLlib's local learner (``num_learners=0``) trains in the driver's process, where Ray does not set
``OMP_NUM_THREADS=1``: torch keeps one intra-op thread per core, and each parallel region ends at a barrier
that waits for every thread of its team. On the 2-core VM a third CPU-bound process (another job, another
tenant) takes a core from one of them, and every region then waits for the thread the scheduler took off
its core. This script measures what that costs: the same ``studies/rllib_experience_path.py`` run (default
``dqn-cartpole-1r``, stock) with torch's default threads and with ``OMP_NUM_THREADS=1``, each quiet and
beside ``--burners`` busy Python loops, and prints the iteration times side by side with their ratios
(each run's own medians over iterations 2 to N; its CPU by role from ``run_cpu_breakdown.one_run``).

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/local_learner_under_load.py [--workload W --side S]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from run_cpu_breakdown import add_run_arguments, check_run_arguments, one_run  # this directory: sys.path[0]

BURN = "while True:\n    pass\n"


def start_burners(n: int) -> list[subprocess.Popen]:
    """``n`` busy Python loops, each in its own session (stopped by :func:`stop_burners`)."""
    return [subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True) for _ in range(n)]


def stop_burners(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


def variants(burners: int) -> list[tuple[str, dict[str, str], int]]:
    """(name, environment, burners) of each run, in the order they run: quiet and loaded per thread setting."""
    out = []
    for threads, env in (("torch default threads", {}), ("OMP_NUM_THREADS=1", {"OMP_NUM_THREADS": "1"})):
        out.append((f"{threads}, quiet", env, 0))
        out.append((f"{threads}, {burners} busy loop(s) beside", env, burners))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(p, "dqn-cartpole-1r", 4, "/tmp/local_learner_under_load")
    p.add_argument("--burners", type=int, default=1, help="busy loops beside the loaded runs")
    args = p.parse_args(argv)
    check_run_arguments(p, args)
    if args.burners < 1:
        p.error("--burners must be at least 1")
    rows = []
    for k, (name, env, burners) in enumerate(variants(args.burners)):
        procs = start_burners(burners)
        try:
            time.sleep(1.0 if burners else 0.0)
            r = one_run(args.workload, args.side, args.iters, args.out / f"run{k}", args.timeout_s, env)
        finally:
            stop_burners(procs)
        driver = next((q for q in r["processes"] if q["role"] == "driver"), {"on_cpu": float("nan"),
                                                                               "waiting": float("nan")})
        rows.append({"variant": name, "burners": burners, "env": env, "iteration_ms": r["iteration_ms"],
                     "driver_on_cpu": driver["on_cpu"], "driver_waiting": driver["waiting"],
                     "load_average": os.getloadavg()[0]})
        print(f"{name:<45} iteration {r['iteration_ms']:9.2f} ms   driver {driver['on_cpu']:.2f} cores on a CPU, "
              f"{driver['waiting']:.2f} waiting", flush=True)
    print(f"\n{args.workload} [{args.side}]: loaded / quiet iteration time")
    for quiet, loaded in (rows[0:2], rows[2:4]):
        print(f"  {quiet['variant'].split(',')[0]:<25} {loaded['iteration_ms'] / quiet['iteration_ms']:6.2f}x "
              f"({quiet['iteration_ms']:.2f} -> {loaded['iteration_ms']:.2f} ms)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "under_load.json").write_text(json.dumps({"workload": args.workload, "side": args.side,
                                                          "rows": rows}, indent=1))
    print(f"written {args.out / 'under_load.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
