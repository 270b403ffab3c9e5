"""DQN's per-step sample round on a remote EnvRunner, as ``DQN._training_step_new_api_stack`` makes it,
against its parts (issue 13: ~5 ms per env step unattributed in the real dqn-cartpole-1r run).

``synchronous_parallel_sample(..., _return_metrics=True)`` (``execution/rollout_ops.py``) calls
``EnvRunnerGroup.foreach_env_runner(lambda w: (w.sample(), w.get_metrics()))`` ->
``FaultTolerantActorManager.foreach_actor`` (the lambda pickled per call, ``actor.apply.remote``,
``ray.get``). Timed here: a trivial ``foreach_env_runner`` round trip, the round with ``sample()``,
with ``sample()`` + ``get_metrics()``, DQN's own call, the weight sync that follows each DQN round
(``EnvRunnerGroup.sync_weights``), the time the sample + metrics take inside the actor, and the same
in-process. Wall-clock medians; beside them the driver's process CPU time and the EnvRunner process's CPU
(every thread's ``/proc/<pid>/task/<tid>/schedstat``: the Ray task loop, the argument's unpickling and the
result's pickling included, which timing inside the actor leaves out).

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/dqn_sample_round.py [calls]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

from conduit.runtime.proccpu import process_cpu_s


def main(calls: int = 300) -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.env.env_runner_group import EnvRunnerGroup
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
    from ray.rllib.execution.rollout_ops import synchronous_parallel_sample

    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="dqnround"), log_to_driver=False)
    try:
        cfg = DQNConfig().env_runners(num_env_runners=1, num_cpus_per_env_runner=1).environment("CartPole-v1")
        group = EnvRunnerGroup(config=cfg)
        # the weights' source of DQN's sync: an EnvRunner in this process (DQN syncs from its learner group;
        # the RLModule's state is the same size)
        local_weights_source = SingleAgentEnvRunner(config=cfg, worker_index=1)

        actor_pid = group.foreach_env_runner(lambda w: os.getpid(), local_env_runner=False)[0]

        def median(fn, n=calls):
            for _ in range(20):
                fn()
            wall, cpu, actor = [], [], []
            for _ in range(n):
                a0, t0, c0 = process_cpu_s(actor_pid), time.perf_counter(), time.process_time()
                fn()
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                actor.append(process_cpu_s(actor_pid) - a0)
            return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3, statistics.median(actor) * 1e3

        def inside(w):
            t0 = time.perf_counter()
            w.sample()
            w.get_metrics()
            return time.perf_counter() - t0

        res = {
            "foreach_env_runner(None)": median(lambda: group.foreach_env_runner(lambda w: None, local_env_runner=False)),
            "foreach_env_runner(sample)": median(
                lambda: group.foreach_env_runner(lambda w: w.sample(), local_env_runner=False)),
            "foreach_env_runner(sample, get_metrics)": median(
                lambda: group.foreach_env_runner(lambda w: (w.sample(), w.get_metrics()), local_env_runner=False)),
            "synchronous_parallel_sample (DQN's call)": median(lambda: synchronous_parallel_sample(
                worker_set=group, concat=True, sample_timeout_s=cfg.sample_timeout_s, _uses_new_env_runners=True,
                _return_metrics=True)),
            "sync_weights (after each DQN round)": median(lambda: group.sync_weights(
                from_worker_or_learner_group=local_weights_source, inference_only=True, timeout_seconds=10.0)),
        }
        ins = [group.foreach_env_runner(inside, local_env_runner=False)[0] for _ in range(calls)]
        res["inside the actor: sample + get_metrics"] = (statistics.median(ins) * 1e3, float("nan"), float("nan"))
        res["in-process: sample + get_metrics"] = median(lambda: (local_weights_source.sample(),
                                                                   local_weights_source.get_metrics()))[:2] \
            + (float("nan"),)
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        for name, (wall, cpu, actor) in res.items():
            print(f"{name:42s} wall {wall:7.3f} ms   driver CPU {cpu:7.3f} ms   EnvRunner process CPU {actor:7.3f} ms")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
