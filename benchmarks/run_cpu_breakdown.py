"""Where a real study run's CPU goes, and how far its figures move from one run to the next (issue 13).

Runs one workload and side of ``studies/rllib_experience_path.py`` (a fresh interpreter and Ray instance per
run, as the validation measures) ``--repeat`` times back to back. Over a window from the run's second
iteration to its second-to-last, it reads every thread of the run's process tree (the study's driver, Ray's
raylet and GCS, the EnvRunners, the learner, the plane actor) from ``/proc/<pid>/task/<tid>/schedstat``: the
seconds each spent on a CPU and waiting for one, as cores. Printed per run: those cores by role, the run's
medians (``iteration_ms``, env steps per iteration), and the EnvRunners' CPU per env step (their cores times
the iteration's wall time over its env steps), to set beside the calibration's ``env_runner`` sweep, which
times the same sampling alone. Then the spread of ``iteration_ms`` over the runs (median, min, max, max/min):
a validation that compares one real run with a prediction is no more precise than that spread.

On the 2-core VM (2026-12-05, 18:19-18:45 UTC, back to back; results/validation/NOTES.md has the table)
``appo-cartpole-2r-1l`` stock read 303, 327 and 355 ms per update (the validation's run 25 minutes earlier: 620
ms) with its EnvRunners on a CPU 0.99-1.02 cores together in every run: what moved was their CPU per env step,
1.26-1.66 ms, the slower runs the dearer ones. ``dqn-cartpole-1r`` is steady (30 / 31 ms) and its EnvRunner
spends 7.0-7.2 ms of CPU per one-step round, where the calibration's primitives add up to about 1.5 ms.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/run_cpu_breakdown.py                      # ~4 min
    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/run_cpu_breakdown.py --workload appo-largeobs-2r-1l \
        --side conduit --repeat 2
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from conduit.runtime.proccpu import read_proc, thread_times, threads_cpu

ROOT = Path(__file__).resolve().parents[1]

#: a process's role, from its command line (Ray renames its workers ``ray::<Class>``)
ROLES = (("state server", ("EnvRunnerStateServer",)), ("EnvRunner", ("SingleAgentEnvRunner", "MultiAgentEnvRunner")),
         ("learner", ("ray::_WrappedExecutable",)), ("plane actor", ("ray::_PlaneActor",)),
         ("raylet", ("raylet/raylet",)), ("gcs", ("gcs_server",)), ("driver", ("rllib_experience_path.py",)))


def role_of(cmdline: str) -> str:
    """The role of a process of the run, from its command line; ``other`` for Ray's helpers."""
    for role, marks in ROLES:
        if any(m in cmdline for m in marks):
            return role
    return "other"


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (Ray's raylet and GCS are children of the driver, the workers
    children of the raylet)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        stat = read_proc(f"/proc/{d}/stat")
        if stat is None:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def snapshot(root: int) -> dict[int, dict]:
    """Per process of ``root``'s tree: its command line and the seconds its threads spent on a CPU and
    waiting for one (``schedstat``'s first two fields, summed over ``/proc/<pid>/task``)."""
    out = {}
    for pid in descendants(root):
        cmd = read_proc(f"/proc/{pid}/cmdline")
        times = thread_times(pid)
        if cmd is None or times is None:
            continue
        out[pid] = {"cmd": cmd.replace("\0", " ").strip(), "run_s": times[0], "wait_s": times[1],
                    "threads": threads_cpu(pid)}
    return out


def cores_between(a: dict[int, dict], b: dict[int, dict], seconds: float) -> list[dict]:
    """Per process alive at both snapshots: its role and the cores it held and waited for in between."""
    rows = []
    for pid, end in b.items():
        start = a.get(pid)
        if start is None:
            continue
        rows.append({"pid": pid, "role": role_of(end["cmd"]), "on_cpu": (end["run_s"] - start["run_s"]) / seconds,
                     "waiting": (end["wait_s"] - start["wait_s"]) / seconds,
                     "threads": busiest_threads(start.get("threads", {}), end.get("threads", {}), seconds)})
    return sorted(rows, key=lambda r: -r["on_cpu"])


def busiest_threads(a: dict[int, tuple[str, float]], b: dict[int, tuple[str, float]], seconds: float,
                    least: float = 0.01) -> list[dict]:
    """The threads alive at both snapshots that held at least ``least`` cores in between: tid, name, cores."""
    rows = [{"tid": tid, "name": name, "on_cpu": (run - a[tid][1]) / seconds}
            for tid, (name, run) in b.items() if tid in a and (run - a[tid][1]) / seconds >= least]
    return sorted(rows, key=lambda r: -r["on_cpu"])


def one_run(workload: str, side: str, iters: int, out: Path, timeout_s: float = 900.0,
            env_extra: dict[str, str] | None = None) -> dict:
    """One study run of ``workload``/``side``, its CPU window and medians; stopped (its whole process group)
    after ``timeout_s``. ``env_extra``: environment variables set for the run (``OMP_NUM_THREADS``)."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "studies" / "rllib_experience_path.py"), "--workloads", workload,
           "--sides", side, "--iters", str(iters), "--warmup", "1", "--out", str(out)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled"),
               **(env_extra or {}))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: a run past its deadline ends whole
    marks: dict[str, tuple[float, dict]] = {}
    first, last = re.compile(r"\biter 2/"), re.compile(rf"\biter {iters - 1}/")
    log = []

    def follow() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            for name, pat in (("start", first), ("end", last)):
                if name not in marks and pat.search(line):
                    marks[name] = (time.monotonic(), snapshot(proc.pid))

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise SystemExit(f"run_cpu_breakdown: the study run took longer than {timeout_s:.0f} s and was stopped; "
                         f"its log so far: {''.join(log[-5:])}") from None
    reader.join(timeout=10)
    (out / "study.log").write_text("".join(log))
    if rc != 0 or "start" not in marks or "end" not in marks:
        raise SystemExit(f"run_cpu_breakdown: the study run failed (exit {rc}) or printed too few iterations; "
                         f"its log is {out / 'study.log'}")
    (t0, a), (t1, b) = marks["start"], marks["end"]
    with open(out / "medians.csv") as f:
        med = next(r for r in csv.DictReader(f) if r["side"] == side)
    procs = cores_between(a, b, t1 - t0)
    runner_cores = sum(r["on_cpu"] for r in procs if r["role"] == "EnvRunner")
    steps = float(med["env_steps_sampled"])
    train_s = float(med["train_iteration_ms"]) / 1e3
    return {"window_s": t1 - t0, "processes": procs, "iteration_ms": float(med["iteration_ms"]),
            "train_iteration_ms": float(med["train_iteration_ms"]), "env_steps_per_iteration": steps,
            "runner_cores": runner_cores,
            "runner_cpu_ms_per_step": runner_cores * train_s / steps * 1e3 if steps else float("nan")}


def add_run_arguments(p: argparse.ArgumentParser, workload: str, iters: int, out: str) -> None:
    """The arguments of a script built on :func:`one_run`: which study run, how long, where, its deadline."""
    p.add_argument("--workload", default=workload, help="a workload of studies/rllib_experience_path.py")
    p.add_argument("--side", default="stock", choices=("stock", "conduit"))
    p.add_argument("--iters", type=int, default=iters, help="training iterations per run (at least 4)")
    p.add_argument("--out", type=Path, default=Path(out))
    p.add_argument("--timeout-s", type=float, default=900.0, help="seconds one run may take before it is stopped")


def check_run_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (exit status 2, the argument named) what :func:`add_run_arguments` added and :func:`one_run` cannot take."""
    if args.iters < 4:
        p.error("--iters must be at least 4 (the window runs from iteration 2 to iteration iters-1)")
    if not args.timeout_s > 0:
        p.error("--timeout-s must be positive")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(p, "appo-cartpole-2r-1l", 16, "/tmp/run_cpu_breakdown")
    p.add_argument("--repeat", type=int, default=3, help="runs, back to back")
    p.add_argument("--threads", action="store_true", help="also each process's busiest threads (>= 0.01 cores)")
    args = p.parse_args(argv)
    check_run_arguments(p, args)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    runs = []
    for k in range(args.repeat):
        r = one_run(args.workload, args.side, args.iters, args.out / f"run{k}", args.timeout_s)
        runs.append(r)
        print(f"run {k}: iteration {r['iteration_ms']:.0f} ms, {r['env_steps_per_iteration']:.0f} env steps per "
              f"{r['train_iteration_ms']:.0f} ms iteration; EnvRunners {r['runner_cores']:.2f} cores on a CPU, "
              f"{r['runner_cpu_ms_per_step']:.2f} ms CPU per env step (window {r['window_s']:.0f} s, "
              f"load average {os.getloadavg()[0]:.2f})")
        for q in r["processes"]:
            if q["on_cpu"] + q["waiting"] >= 0.005:
                print(f"    {q['role']:<12} pid {q['pid']:<7} {q['on_cpu']:.3f} cores on a CPU, {q['waiting']:.3f} waiting")
                if args.threads:
                    for t in q["threads"]:
                        print(f"        thread {t['tid']:<7} {t['name']:<16} {t['on_cpu']:.3f} cores")
    its = [r["iteration_ms"] for r in runs]
    print(f"{args.workload} [{args.side}] iteration_ms over {len(its)} runs: median {statistics.median(its):.0f}, "
          f"min {min(its):.0f}, max {max(its):.0f}, max/min {max(its) / min(its):.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "breakdown.json").write_text(json.dumps({"workload": args.workload, "side": args.side, "runs": runs},
                                                        indent=1))
    print(f"written {args.out / 'breakdown.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
