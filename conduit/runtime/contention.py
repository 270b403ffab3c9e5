"""What CPU work costs on an over-subscribed node: the microbenchmark behind ``oversubscribed_cpu_cost``.

The simulator charges a piece of work the CPU seconds its primitive took alone and shares a crowded node's cores
among the threads that want one (:class:`conduit.sim.resources.CpuPool`). On a real node a thread that shares its
core pays more than its share of the time: the thread it alternates with evicts its caches and branch history,
and every switch costs the kernel's own work. Real runs on the 2-core VM show it: ``ppo-largeobs-2r-1l`` with
Conduit (its learner works while the two EnvRunners sample) spent 3.41 ms of EnvRunner CPU per env step against
2.34 ms for stock, whose learner waits for the sampling (``benchmarks/run_cpu_breakdown.py --threads``).

:func:`measure` times that as a microbenchmark, with nothing of Conduit and no end-to-end loop in it:

* the **work**: a local RLlib ``SingleAgentEnvRunner`` sampling (``conduit calibrate``'s default workload configs:
  PPO on CartPole and on the 84x84x4 large-observation env), timed in process CPU time per env step, and a
  learner-like update (the neighbours' own loop), per update: the two kinds of compute the simulator charges it on;
* the **neighbours**: as many processes as the node has cores, each running a learner-like loop (a CNN's forward,
  backward and Adam step on a batch of 84x84x4 observations, one torch thread), so that one thread more than there
  are cores wants a core;
* **paired windows**: the neighbours are started once and switched on and off; each pair times the work with them
  idle and then busy (order alternating), back to back, so that the host's own drift between minutes (up to 2.5x on
  a shared VM) cancels in the pair's ratio.

The figure is the median over all pairs of CPU per item busy / idle (never below 1: a lower median is noise), and
``conduit calibrate --workloads`` writes it to the calibrated topology's CPU as ``oversubscribed_cpu_cost``. The
neighbour count is a parameter: ``cores - 1`` neighbours (every thread still has a core) is the control.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, Self

#: seconds the neighbours get to start (or stop) working before a window is timed
SETTLE_S = 0.15
#: seconds the neighbours get to import torch and run their first updates
WARMUP_S = 3.0
#: the work that is timed: an EnvRunner of a named config (``conduit calibrate``'s default workload configs)
#: with its env steps per ``sample()`` call, or ``("learner-like", 1)``: one update of the neighbours' own loop
WORK = (("ppo-cartpole", 100), ("ppo-largeobs", 50), ("learner-like", 1))


def _learner_like_update() -> Callable[[], int]:
    """One update of a CNN on a batch of 84x84x4 observations (forward, backward, Adam step); returns 1."""
    import torch

    net = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 8, 4), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 4, 2),
                              torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(2592, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 2))
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    x = torch.rand(32, 4, 84, 84)

    def update() -> int:
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()
        return 1

    return update


def _learner_like(go: Any, stop: Any) -> None:
    """A neighbour: learner-like updates (one torch thread) while ``go`` is set."""
    import torch

    torch.set_num_threads(1)
    update = _learner_like_update()
    while not stop.is_set():
        if go.wait(0.05):
            update()


class Neighbours:
    """``k`` learner-like processes for the duration of a ``with`` block, switched on and off by :meth:`busy`."""

    def __init__(self, k: int):
        if k < 0:
            raise ValueError(f"neighbours: must not be negative, got {k}")
        ctx = mp.get_context("spawn")
        self.go, self.stop = ctx.Event(), ctx.Event()
        self.procs = [ctx.Process(target=_learner_like, args=(self.go, self.stop), daemon=True) for _ in range(k)]

    def __enter__(self) -> Self:
        for p in self.procs:
            p.start()
        if self.procs:
            self.busy(True)
            time.sleep(WARMUP_S)
        return self

    def cpu_s(self) -> float:
        """The neighbours' CPU seconds so far, every thread (``/proc``; NaN where it cannot be read)."""
        from conduit.runtime.proccpu import process_cpu_s

        try:
            return sum(process_cpu_s(p.pid) for p in self.procs)
        except (OSError, RuntimeError, ValueError):  # a neighbour gone, or no /proc
            return math.nan

    def busy(self, on: bool) -> None:
        """Switch the neighbours on or off; raises when one has died (a window beside a dead neighbour would
        time the work beside fewer busy threads than asked, and the cost would read low without a word)."""
        (self.go.set if on else self.go.clear)()
        time.sleep(SETTLE_S)
        if dead := [p for p in self.procs if not p.is_alive()]:
            raise RuntimeError(f"{len(dead)} of {len(self.procs)} neighbour process(es) died "
                               f"(exit code {dead[0].exitcode}): the windows would not be over-subscribed")

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.go.set()
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """First quartile, median and third quartile (min and max below four values)."""
    if len(values) < 4:
        return min(values), statistics.median(values), max(values)
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def paired_ratios(work: Callable[[], int], neighbours: Neighbours, pairs: int,
                  window: float) -> tuple[list[float], list[float], list[float], list[tuple[float, float]]]:
    """``(cpu ratios, wall ratios, idle CPU seconds per item, busy cores)`` of ``pairs`` idle/busy pairs of
    windows of ``window`` seconds; ``work()`` does some work and returns how many items it did. ``busy
    cores``: per pair, ``(the work's, all the neighbours')`` cores held in the busy window (CPU seconds over
    its wall time; the neighbours' NaN where ``/proc`` cannot be read)."""

    def timed() -> tuple[float, float, float, float]:
        n0 = neighbours.cpu_s()
        c0, w0, done = time.process_time(), time.perf_counter(), 0
        while time.perf_counter() - w0 < window:
            done += work()
        c, w = time.process_time() - c0, time.perf_counter() - w0
        done = max(1, done)
        return c / done, w / done, c / w, (neighbours.cpu_s() - n0) / w

    cpu, wall, idle, cores = [], [], [], []
    for i in range(pairs):
        got = {}
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            neighbours.busy(on)
            got[on] = timed()
        cpu.append(got[True][0] / got[False][0])
        wall.append(got[True][1] / got[False][1])
        idle.append(got[False][0])
        cores.append((got[True][2], got[True][3]))
    return cpu, wall, idle, cores


def measure(env_runner: Callable[[str], Any] | None = None, pairs: int = 8, window: float = 0.4,
            neighbours: Sequence[int] | None = None, work: Sequence[tuple[str, int]] = WORK,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The paired measurement (module doc) for every neighbour count (default: the node's cores) and every
    kind of work in ``work``; returns ``{"cores", "pairs", "window_s", "rows": [...], "oversubscribed_cpu_cost",
    "note"}``, the cost read from the rows with ``cores`` neighbours, all kinds of work pooled. ``env_runner``
    builds a local EnvRunner of a named config (``conduit calibrate``'s ``_named_env_runner``); needed
    unless every kind of work is ``learner-like``."""
    import torch

    if pairs < 1:
        raise ValueError(f"pairs: must be at least 1, got {pairs}")
    if window <= 0:
        raise ValueError(f"window: must be positive, got {window}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ks = list(neighbours) if neighbours is not None else [cores]
    if env_runner is None and any(name != "learner-like" for name, _ in work):
        raise ValueError("env_runner: needed to time an EnvRunner's sampling")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    try:
        for name, steps in work:
            runner = None
            if name == "learner-like":
                item, what = _learner_like_update(), "learner-like update"
            else:
                runner = env_runner(name)

                def item(runner: Any = runner, steps: int = steps) -> int:
                    return sum(len(e) for e in runner.sample(num_timesteps=steps, random_actions=False))

                what = f"env_runner:{name}"
            try:
                for _ in range(4):
                    item()
                for k in ks:
                    with Neighbours(k) as nb:
                        cpu, wall, idle, held = paired_ratios(item, nb, pairs, window)
                    row = {"work": what, "items_per_call": steps, "neighbours": k,
                           "threads_per_core": (k + 1) / cores, "cpu_ratio_quartiles": quartiles(cpu),
                           "wall_ratio_quartiles": quartiles(wall),
                           # the cores the work held busy, and each neighbour (a fair share: cores / (k + 1))
                           "work_cores_busy": statistics.median(c for c, _ in held),
                           "neighbour_cores_busy": (statistics.median(n for _, n in held) / k if k else None),
                           "idle_cpu_s_per_item": statistics.median(idle), "cpu_ratios": cpu}
                    rows.append(row)
                    if progress is not None:
                        lo, med, hi = row["cpu_ratio_quartiles"]
                        each = row["neighbour_cores_busy"]
                        progress(f"contention: {what}, {k + 1} threads on {cores} cores: CPU per item busy / idle "
                                 f"{med:.3f} [{lo:.3f}, {hi:.3f}], wall {row['wall_ratio_quartiles'][1]:.3f}; cores "
                                 f"held busy: the work {row['work_cores_busy']:.2f}, each neighbour "
                                 f"{'-' if each is None else f'{each:.2f}'} (a fair share: "
                                 f"{min(1.0, cores / (k + 1)):.2f})")
            finally:
                if runner is not None:
                    runner.stop()
    finally:
        torch.set_num_threads(threads)
    pooled = [r for row in rows if row["neighbours"] == cores for r in row["cpu_ratios"]]
    cost = max(1.0, statistics.median(pooled)) if pooled else None
    return {"cores": cores, "pairs": pairs, "window_s": window, "rows": rows, "oversubscribed_cpu_cost": cost,
            "note": (f"median over {len(pooled)} pairs of the CPU per item of {', '.join(n for n, _ in work)} beside "
                     f"{cores} busy learner-like processes / beside them idle"
                     if pooled else f"not measured: no row with {cores} neighbours")}
