"""What a Ray call and an EnvRunner's step cost when every core is busy (issue 13: why iterations are predicted short).

The simulator's primitives are timed on a quiet machine, one at a time; a real study run keeps both cores of the
2-core VM busy (two EnvRunners, APPO's never-sleeping driver loop, a local learner's spinning torch team, the plane
actor). This script measures, side by side in one run, how two primitives change with the number of other
processes that keep a core busy (pure-Python spinners, ``k = 0 .. cores``):

* **a Ray actor call's round trip** (``ray.get(actor.f.remote())``), with the callee doing no work and with it
  doing ``--callee-ms`` of CPU work (thread CPU time), the caller doing about a millisecond of its own work between
  calls as RLlib's driver does; printed: median and mean, and the mean less the callee's work;
* **an EnvRunner-like step's CPU** (``time.process_time`` per step of CartPole with a 256x256 MLP forward pass,
  one torch thread, the calibration's kind of work): does the step itself get dearer beside busy neighbours?

Read the rows against ``k = 0``. The simulator's CPU model shares a node's cores fairly (FIFO quanta,
:class:`conduit.sim.resources.CpuPool`) and charges a Ray call's latency as a fixed delay: it predicts no change
until ``k`` reaches the core count, and then only the fair share (2 ms of work at two thirds of a core: about
3 ms). 2026-12-06 on the 2-core VM (three runs, 00:00-01:12 UTC): a round trip 0.8-1.4 ms alone and beside one
spinner, 6.7-13.5 ms beside two; a call with 2 ms of callee work 2.9-3.7 ms alone and beside one spinner, 78-83 ms
beside two (22x). The step's own CPU moved 0.91-1.30x beside neighbours, within this host's minute-to-minute noise.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/saturated_calls.py [--calls 200] [--callee-ms 2]
        [--step-s 4] [--no-ray]                                                          # ~1-2 min
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from typing import Self

#: seconds one Ray call of the measurement may take before the run is called stuck
CALL_TIMEOUT_S = 60.0


def _spin(stop) -> None:
    """A neighbour that keeps one core busy until told to stop."""
    x = 0
    while not stop.is_set():
        for _ in range(10_000):
            x += 1


def _caller_work(iterations: int = 20_000) -> int:
    """About a millisecond of the caller's own Python work between calls."""
    s = 0
    for j in range(iterations):
        s += j
    return s


class _Neighbours:
    """``k`` spinning processes for the duration of a ``with`` block."""

    def __init__(self, k: int):
        self.k = k
        self.stop = mp.Event()
        self.procs = [mp.Process(target=_spin, args=(self.stop,), daemon=True) for _ in range(k)]

    def __enter__(self) -> Self:
        for p in self.procs:
            p.start()
        time.sleep(0.3)  # up to speed
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()


def _step_cpu(seconds: float, out) -> None:
    """CPU seconds per step of an EnvRunner-like loop (CartPole, an MLP forward pass, one torch thread)."""
    import gymnasium as gym
    import torch

    torch.set_num_threads(1)
    net = torch.nn.Sequential(torch.nn.Linear(4, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 2))
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    n, c0, w0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - w0 < seconds:
        with torch.no_grad():
            action = int(net(torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0)).argmax())
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
        n += 1
    out.put((time.process_time() - c0) / n)


def measure_step(k: int, seconds: float) -> float:
    """Median-free single figure: CPU seconds per step over ``seconds`` of stepping beside ``k`` spinners."""
    out: mp.Queue = mp.Queue()
    with _Neighbours(k):
        proc = mp.Process(target=_step_cpu, args=(seconds, out), daemon=True)
        proc.start()
        got = out.get(timeout=seconds + 120)
        proc.join(timeout=10)
    return got


def measure_calls(ray, actor, k: int, calls: int, work_s: float) -> tuple[float, float]:
    """(median, mean) seconds of a call's round trip beside ``k`` spinners, the callee working ``work_s``."""
    times = []
    with _Neighbours(k):
        for _ in range(calls):
            t = time.perf_counter()
            ray.get(actor.work.remote(work_s), timeout=CALL_TIMEOUT_S)
            times.append(time.perf_counter() - t)
            _caller_work()
    return statistics.median(times), statistics.fmean(times)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200, help="calls per row (default 200)")
    p.add_argument("--callee-ms", type=float, default=2.0, help="CPU milliseconds the callee works in the second set")
    p.add_argument("--step-s", type=float, default=4.0, help="seconds of stepping per row of the step's CPU")
    p.add_argument("--max-k", type=int, default=None, help="most spinning neighbours (default: the core count)")
    p.add_argument("--no-ray", action="store_true", help="only the step's CPU (no Ray calls)")
    args = p.parse_args(argv)
    if args.calls < 1:
        p.error("--calls must be at least 1")
    if not args.callee_ms >= 0:
        p.error("--callee-ms must be >= 0")
    if not args.step_s > 0:
        p.error("--step-s must be positive")
    if args.max_k is not None and args.max_k < 0:
        p.error("--max-k must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mp.set_start_method("spawn", force=True)
    cores = os.cpu_count() or 1
    ks = list(range((cores if args.max_k is None else args.max_k) + 1))
    print(f"{cores} cores; neighbours: k processes that each keep a core busy (load average "
          f"{os.getloadavg()[0]:.2f} before)")
    if not args.no_ray:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        import ray

        @ray.remote(num_cpus=0)
        class Callee:
            def work(self, seconds: float) -> int:
                t, s = time.thread_time(), 0
                while time.thread_time() - t < seconds:
                    s += 1
                return s

        tmp = tempfile.mkdtemp(prefix="cdsat")
        ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, _temp_dir=tmp)
        try:
            actor = Callee.remote()
            ray.get(actor.work.remote(0.0), timeout=CALL_TIMEOUT_S)
            work = args.callee_ms / 1e3
            print(f"\nRay actor call round trip, {args.calls} calls per row (ms)")
            print(f"{'k':>3} {'no work: median':>16} {'mean':>8} {'x k=0':>7} | {f'{args.callee_ms:g} ms work: median':>22} "
                  f"{'mean':>8} {'mean - work':>12} {'x k=0':>7}")
            base = None
            for k in ks:
                med0, mean0 = measure_calls(ray, actor, k, args.calls, 0.0)
                med1, mean1 = measure_calls(ray, actor, k, args.calls, work)
                base = base or (mean0, mean1)
                print(f"{k:>3} {1e3 * med0:>16.3f} {1e3 * mean0:>8.3f} {mean0 / base[0]:>6.2f}x | {1e3 * med1:>22.3f} "
                      f"{1e3 * mean1:>8.3f} {1e3 * (mean1 - work):>12.3f} {mean1 / base[1]:>6.2f}x", flush=True)
        finally:
            ray.shutdown()
    print(f"\nEnvRunner-like step (CartPole + MLP forward, one torch thread), {args.step_s:g} s per row")
    print(f"{'k':>3} {'CPU us/step':>12} {'x k=0':>7}")
    base_step = None
    for k in ks:
        per = measure_step(k, args.step_s)
        base_step = base_step or per
        print(f"{k:>3} {1e6 * per:>12.1f} {per / base_step:>6.2f}x", flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}. A fair-share model predicts x1.00 for k < {cores}; "
          "compare the rows, and rerun before trusting a difference (the host's speed moves between minutes).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
