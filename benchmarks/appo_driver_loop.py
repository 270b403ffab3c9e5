"""The cores RLlib's APPO driver loop wants (issue 13: ``StockCosts.driver_poll_cores``).

``Algorithm._run_one_training_iteration`` calls ``IMPALA.training_step`` in a loop until
``min_time_s_per_iteration``; each pass fetches ready sample results (``ray.wait`` with
``timeout_s_sampler_manager=0.0``), hands references to the learner group (``async_update=True``),
reduces metrics and returns at once when nothing is ready: the loop never sleeps. How much of a core
that takes is a property of the driver's code, not of the workload's cores, so it is timed here on
the workload's own APPO config (CartPole, 2 EnvRunners, 1 remote learner, the study's
``appo-cartpole-2r-1l``) with an environment that *sleeps* in ``step`` (``--step-sleep``): the
EnvRunners and the learner then hardly use the CPU, the driver's thread runs uncontended, and its
demand reads directly.

Measured from ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds on a CPU and waiting on the run
queue; other load on the machine only moves time from the first to the second): per thread,
``demand = (run + wait) / wall`` -- the cores the thread wants. The driver's main thread is the loop.
Printed: its demand and run cores, the training_step passes per second and CPU per pass, and, for
context, the other Ray processes' cores. ``StockCosts.driver_poll_cores`` is the main thread's demand.

Not the figure the validation reports (iteration time): a per-process CPU demand, measured with
sleeping environments so that the workload's own contention is not in it.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/appo_driver_loop.py [--seconds 5] [--step-sleep 0.005]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym


class SleepyCartPole(gym.Wrapper):
    """CartPole whose ``step`` sleeps ``sleep_s`` first: an environment that costs wall time, not CPU."""

    def __init__(self, config: dict | None = None):
        super().__init__(gym.make("CartPole-v1"))
        self.sleep_s = float((config or {}).get("sleep_s", 0.005))

    def step(self, action):
        time.sleep(self.sleep_s)
        return self.env.step(action)


def _schedstat(pid: int, tid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
        run, wait, _ = f.read().split()
    return int(run) / 1e9, int(wait) / 1e9


def _threads(pids: list[int]) -> dict[tuple[int, int], tuple[float, float]]:
    out = {}
    for pid in pids:
        for d in glob.glob(f"/proc/{pid}/task/*"):
            tid = int(d.rsplit("/", 1)[1])
            try:
                out[(pid, tid)] = _schedstat(pid, tid)
            except OSError:
                pass
    return out


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="min_time_s_per_iteration of the timed iteration")
    p.add_argument("--step-sleep", type=float, default=0.005, help="seconds each env step sleeps (no CPU)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.rllib.algorithms.appo import APPOConfig

    tmp = tempfile.mkdtemp(prefix="appodriver")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
    algo = None
    try:
        cfg = (APPOConfig().environment(SleepyCartPole, env_config={"sleep_s": args.step_sleep})
               .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5)
               .learners(num_learners=1).reporting(min_time_s_per_iteration=args.seconds))
        algo = cfg.build_algo()
        passes = [0]
        step = algo.training_step

        def counted():
            passes[0] += 1
            return step()

        algo.training_step = counted
        algo.train()  # warm-up: actors started, first weights out
        me = os.getpid()
        pids = [me] + [int(d.split("/")[2]) for d in glob.glob("/proc/[0-9]*")
                       if tmp in _cmd(int(d.split("/")[2])) or "ray::" in _cmd(int(d.split("/")[2]))]
        pids = sorted(set(pids))
        load = os.getloadavg()[0]
        passes[0] = 0
        s0, c0, t0 = _threads(pids), time.process_time(), time.perf_counter()
        result = algo.train()
        s1, c1, wall = _threads(pids), time.process_time(), time.perf_counter() - t0
        run, wait = (s1[(me, me)][0] - s0[(me, me)][0]) / wall, (s1[(me, me)][1] - s0[(me, me)][1]) / wall
        others: dict[str, float] = {}
        for key, (r1, _) in s1.items():
            if key[0] != me and key in s0:
                name = _cmd(key[0]).split(" --")[0].split("/")[-1][:40]
                others[name] = others.get(name, 0.0) + (r1 - s0[key][0]) / wall
        steps = result.get("env_runners", {}).get("num_env_steps_sampled", 0)
        figures = {
            "driver_main_thread_demand_cores": run + wait, "driver_main_thread_run_cores": run,
            "driver_main_thread_wait_cores": wait, "driver_process_cpu_cores": (c1 - c0) / wall,
            "training_step_passes_per_s": passes[0] / wall,
            "cpu_per_pass_ms": 1e3 * run * wall / max(1, passes[0]),
            "env_steps_per_s": steps / wall, "step_sleep_s": args.step_sleep, "wall_s": wall,
            "load_average_before": load, "cores": os.cpu_count(), "other_processes_cores": others,
        }
    finally:
        if algo is not None:
            algo.stop()
        ray.shutdown()
    print(f"load average {figures['load_average_before']:.2f} on {figures['cores']} cores; one APPO iteration of "
          f"{wall:.1f} s, env steps sleep {args.step_sleep * 1e3:.1f} ms ({figures['env_steps_per_s']:.0f} steps/s)")
    print(f"driver main thread (the training_step loop): demand {figures['driver_main_thread_demand_cores']:.2f} cores "
          f"= on a CPU {run:.2f} + waiting for one {wait:.2f}; {figures['training_step_passes_per_s']:.0f} passes/s, "
          f"{figures['cpu_per_pass_ms']:.3f} ms CPU per pass; whole driver process {figures['driver_process_cpu_cores']:.2f}")
    print("other processes, cores on a CPU: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                          sorted(others.items(), key=lambda kv: -kv[1]) if v >= 0.01))
    print(f"StockCosts.driver_poll_cores = {figures['driver_main_thread_demand_cores']:.2f} "
          f"(was 0.22: benchmarks/driver_wait_loop.py, the ray.wait call alone)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
