"""What an idle APPO learner thread costs a crowded node: the microbenchmark behind two ``StockCosts`` fields.

RLlib 2.60's APPO learner trains on its own thread (``algorithms/impala/impala_learner.py: _LearnerThread.step``),
which takes its batches from a ``CircularBuffer`` (``algorithms/appo/appo_learner.py: APPOLearner.build``, with
``use_circular_buffer=True``, the default). While that buffer is empty its ``get`` polls
(``algorithms/appo/utils.py: CircularBuffer.get``)::

    while len(self) == 0:
        time.sleep(0.0001)

A sampling-bound APPO learner idles most of the run, so its thread wakes thousands of times a second for as long
as it waits. On a node with a core per thread that costs nobody anything. On a node with fewer cores than threads
it costs twice, and both are measured here, with nothing of Conduit and no end-to-end loop in them:

* **its own CPU** (``StockCosts.learner_poll_cores``): a real APPO learner (RLlib's default ``APPOConfig`` on
  CartPole, ``config.build_learner``, which starts the thread) left idle; the cores its ``_learner_thread`` wants,
  on a CPU plus waiting for one, per wall second, from ``/proc/self/task/<tid>/schedstat``
  (:func:`measure_learner_poll`);
* **its neighbours' CPU** (``StockCosts.poll_neighbour_cost``): each wake takes a core from whatever runs there,
  and the thread it preempts pays for the switch and for refilling its caches. Timed as
  :mod:`conduit.runtime.contention` times over-subscription, in paired windows: an RLlib EnvRunner's sampling
  (CPU per env step) beside as many busy learner-like neighbours as there are cores, so that the node is
  over-subscribed with the poller off too, with a process running the same loop over a real ``CircularBuffer``
  switched on and off (:func:`measure_poll_neighbour_cost`). The figure is the median ratio on / off of the CPU
  per env step (never below 1): the poller's cost on top of over-subscription's (``oversubscribed_cpu_cost``),
  which the simulator already charges there. (Beside ``cores - 1`` neighbours, where the poller is the only
  thread too many, the ratio reads 1.5-1.8: it then adds every switch, not just its own.)

The simulator charges both on a crowded node while an APPO learner's thread is not training
(:meth:`conduit.sim.appo.AppoLoop.appo_learner_poll`).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from typing import Any, Self

from conduit.runtime.contention import Neighbours, paired_ratios, quartiles
from conduit.runtime.proccpu import process_cpu_s, read_proc

#: ``CircularBuffer.get``'s sleep between two looks at an empty buffer (``algorithms/appo/utils.py``)
POLL_SLEEP_S = 0.0001
#: seconds a poller process may take to import RLlib and build its buffer before the measurement gives up
POLLER_START_TIMEOUT_S = 120.0


def thread_schedstat(tid: int, pid: int | None = None) -> tuple[float, float, int]:
    """``(seconds on a CPU, seconds waiting for one, time slices)`` of thread ``tid`` of ``pid`` (this
    process by default), from ``/proc/<pid>/task/<tid>/schedstat``; raises ``OSError`` where it cannot be read."""
    text = read_proc(f"/proc/{pid or os.getpid()}/task/{tid}/schedstat")
    if not text:
        raise OSError(f"/proc/{pid or os.getpid()}/task/{tid}/schedstat: not readable (no /proc, or the thread ended)")
    run, wait, slices = text.split()[:3]
    return int(run) / 1e9, int(wait) / 1e9, int(slices)


def thread_demand(tid: int, seconds: float, windows: int) -> list[dict[str, float]]:
    """Per window of ``seconds`` (the calling thread sleeps meanwhile): the cores thread ``tid`` of this process
    was on a CPU and waited for one, and its time slices per second."""
    out = []
    for _ in range(windows):
        r0, w0, n0 = thread_schedstat(tid)
        t0 = time.perf_counter()
        time.sleep(seconds)
        r1, w1, n1 = thread_schedstat(tid)
        wall = time.perf_counter() - t0
        out.append({"run_cores": (r1 - r0) / wall, "wait_cores": (w1 - w0) / wall, "slices_per_s": (n1 - n0) / wall})
    return out


def measure_learner_poll(config: Any = None, seconds: float = 1.0, windows: int = 3) -> dict[str, Any]:
    """The cores an idle APPO learner's thread wants (module doc): a real learner of ``config`` (default:
    RLlib's ``APPOConfig`` on CartPole-v1, a local learner) built, left idle for ``windows`` windows of
    ``seconds``, then shut down. Returns ``{"cores", "windows", "buffer", "note"}``; ``cores`` is the median
    over the windows of on-a-CPU plus waiting (the thread's demand, as ``driver_poll_cores`` is read)."""
    if seconds <= 0 or windows < 1:
        raise ValueError(f"seconds must be positive and windows at least 1, got {seconds!r}, {windows!r}")
    from ray.rllib.algorithms.appo import APPOConfig

    from conduit.runtime.calibrate import _local_env_runner

    cfg = (config or APPOConfig().environment("CartPole-v1")).copy(copy_frozen=False).learners(num_learners=0)
    cfg = cfg.env_runners(num_env_runners=0)
    runner = _local_env_runner(cfg)
    learner = None
    try:
        learner = cfg.build_learner(env=runner.env)
        thread = getattr(learner, "_learner_thread", None)
        if thread is None or thread.native_id is None:
            raise RuntimeError(f"{type(learner).__name__} started no learner thread: nothing polls")
        buffer = type(getattr(learner, "_learner_thread_in_queue", None)).__name__
        time.sleep(min(0.5, seconds))  # the thread is in its first get by now
        got = thread_demand(thread.native_id, seconds, windows)
    finally:
        if learner is not None:
            learner.shutdown()
        runner.stop()
    demand = [w["run_cores"] + w["wait_cores"] for w in got]
    return {"cores": statistics.median(demand), "windows": got, "buffer": buffer,
            "note": f"{type(learner).__name__}'s idle _learner_thread ({buffer}.get on an empty buffer), median of "
                    f"{windows} windows of {seconds:g} s, on a CPU + waiting, /proc/self/task/<tid>/schedstat"}


def _poll_loop(go: Any, stop: Any, ready: Any) -> None:
    """A poller process: ``CircularBuffer.get``'s loop on a real, empty ``CircularBuffer`` while ``go`` is set
    (``ready`` is set once the buffer exists)."""
    from ray.rllib.algorithms.appo.utils import CircularBuffer

    buffer = CircularBuffer(num_batches=8, iterations_per_batch=2)  # APPOConfig's defaults
    ready.set()
    while not stop.is_set():
        if not go.wait(0.05):
            continue
        while go.is_set() and len(buffer) == 0:
            time.sleep(POLL_SLEEP_S)


class PollerBeside:
    """``k`` busy learner-like neighbours (:class:`conduit.runtime.contention.Neighbours`), kept busy, and one
    poller process (:func:`_poll_loop`) that :meth:`busy` switches on and off: what :func:`paired_ratios`
    times a work beside. :meth:`cpu_s` is the poller's CPU (the neighbours' stays out of the comparison)."""

    def __init__(self, k: int):
        self.neighbours = Neighbours(k)
        ctx = mp.get_context("spawn")
        self.go, self.stop, self.ready = ctx.Event(), ctx.Event(), ctx.Event()
        self.proc = ctx.Process(target=_poll_loop, args=(self.go, self.stop, self.ready), daemon=True)

    def __enter__(self) -> Self:
        self.neighbours.__enter__()
        self.proc.start()
        if not self.ready.wait(POLLER_START_TIMEOUT_S):
            self.__exit__(None, None, None)
            raise RuntimeError(f"the poller process did not start within {POLLER_START_TIMEOUT_S:g} s "
                               f"(exit code {self.proc.exitcode})")
        return self

    def cpu_s(self) -> float:
        try:
            return process_cpu_s(self.proc.pid)
        except (OSError, RuntimeError, ValueError):
            return math.nan

    def busy(self, on: bool) -> None:
        """Switch the poller on or off; raises when it (or a neighbour) has died, as ``Neighbours.busy`` does."""
        (self.go.set if on else self.go.clear)()
        self.neighbours.busy(True)  # (settles, and checks the neighbours)
        if not self.proc.is_alive():
            raise RuntimeError(f"the poller process died (exit code {self.proc.exitcode})")

    def __exit__(self, *exc: object) -> None:
        self.go.clear()  # ends the inner poll loop; the outer one then sees ``stop`` within 50 ms
        self.stop.set()
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
        self.neighbours.__exit__(*exc)


def measure_poll_neighbour_cost(env_runner: Callable[[str], Any], name: str = "appo-cartpole", steps: int = 50,
                                pairs: int = 8, window: float = 0.4, neighbours: int | None = None) -> dict[str, Any]:
    """What a poller costs the compute beside it (module doc): ``pairs`` paired windows of ``window`` seconds of
    ``env_runner(name)`` sampling ``steps`` env steps per call (APPO's default fragment: 50), beside ``neighbours``
    busy learner-like neighbours (default: as many as there are cores, so that one thread more than there are cores
    wants one with the poller off, as on the crowded nodes where the simulator charges the cost: the ratio is then
    the poller's cost on top of over-subscription's, ``oversubscribed_cpu_cost``), the poller off then on (order
    alternating). Returns ``{"cost", "cpu_ratios",
    "cpu_ratio_quartiles", "wall_ratio_quartiles", "poller_cores", "note"}``: ``cost`` is the median ratio on / off
    of the CPU per env step, never below 1; ``poller_cores`` the poller's own CPU per wall second while on."""
    if pairs < 1 or window <= 0:
        raise ValueError(f"pairs must be at least 1 and window positive, got {pairs!r}, {window!r}")
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    k = cores if neighbours is None else neighbours
    if k < 0:
        raise ValueError(f"neighbours: must not be negative, got {k}")
    runner = env_runner(name)
    try:
        def item() -> int:
            return sum(len(e) for e in runner.sample(num_timesteps=steps, random_actions=False))

        for _ in range(4):
            item()
        with PollerBeside(k) as beside:
            cpu, wall, _idle, held = paired_ratios(item, beside, pairs, window)
    finally:
        runner.stop()
        torch.set_num_threads(threads)
    poller = [p for _, p in held if math.isfinite(p)]
    return {"cost": max(1.0, statistics.median(cpu)), "cpu_ratios": cpu, "cpu_ratio_quartiles": quartiles(cpu),
            "wall_ratio_quartiles": quartiles(wall),
            "poller_cores": statistics.median(poller) if poller else None, "cores": cores, "neighbours": k, "pairs": pairs,
            "window_s": window,
            "note": f"EnvRunner {name} sampling ({steps} steps per call), CPU per env step with a CircularBuffer poller "
                    f"process on / off, beside {k} busy learner-like neighbour(s) on {cores} cores; median of "
                    f"{pairs} pairs of {window:g} s"}
