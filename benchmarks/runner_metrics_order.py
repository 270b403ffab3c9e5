"""Where an EnvRunner's ``get_metrics()`` falls in a remote sample call: after the sample-end stamp (a real run)

``execution/rollout_ops.py: synchronous_parallel_sample`` with ``_return_metrics=True`` (PPO's and DQN's
``training_step``) calls ``lambda w: (w.sample(...), w.get_metrics())`` on every EnvRunner. The experience path
of a chunk starts at its sample-end stamp (``on_sample_end``, inside ``sample()``), so ``get_metrics()`` lies on
it; the simulator charges it there (``Workload.runner_metrics_time``). This builds PPO on CartPole with the
study's ``ppo-cartpole-2r-local`` runners (two remote EnvRunners, RLlib's defaults: 2,000 steps each per round),
stamps ``on_sample_end`` and times ``get_metrics()`` on each EnvRunner, and prints per round: the gap from the
stamp to ``get_metrics()``'s start, its length, and the time from the last runner's stamp to the driver holding
every reply (the study's segment *a*).

2026-12-07 04:41 on the 2-core VM, 10 rounds: ``get_metrics()`` started 0.01 ms after the stamp and took 3.0-5.8
ms (median 3.3; the calibration's ``runner_metrics:ppo-cartpole`` 3.71 ms); the driver held both replies 20.5-32.3
ms (median 21.9) after the last stamp.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/runner_metrics_order.py [--rounds 12]      # ~30 s
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

#: rounds left out at the start (the runners' first episodes, the module's first forward passes)
WARMUP_ROUNDS = 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=12, help=f"sample rounds (the first {WARMUP_ROUNDS} left out)")
    a = p.parse_args(argv)
    if a.rounds <= WARMUP_ROUNDS:
        p.error(f"--rounds must be more than {WARMUP_ROUNDS}, got {a.rounds}")
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.callbacks.callbacks import RLlibCallback
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
    from ray.rllib.execution.rollout_ops import synchronous_parallel_sample

    class StampSampleEnd(RLlibCallback):
        def on_sample_end(self, *, env_runner=None, **kwargs) -> None:
            env_runner.conduit_sample_end = time.time()

    class TimedMetricsRunner(SingleAgentEnvRunner):
        def get_metrics(self):
            start = time.time()
            metrics = super().get_metrics()
            metrics["conduit_order"] = (getattr(self, "conduit_sample_end", float("nan")), start, time.time())
            return metrics

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="runner_metrics_order_"))
    try:
        config = (PPOConfig().environment("CartPole-v1").learners(num_learners=0).callbacks(StampSampleEnd)
                  .env_runners(num_env_runners=2, num_cpus_per_env_runner=1, env_runner_cls=TimedMetricsRunner))
        algo = config.build_algo()
        try:
            rows = []
            for i in range(a.rounds):
                _, metrics = synchronous_parallel_sample(worker_set=algo.env_runner_group,
                                                         max_env_steps=config.total_train_batch_size, concat=True,
                                                         _uses_new_env_runners=True, _return_metrics=True)
                held = time.time()
                order = [m["conduit_order"] for m in metrics if "conduit_order" in m]
                if i >= WARMUP_ROUNDS and order:
                    rows.append((held - max(o[0] for o in order), [o[1] - o[0] for o in order],
                                 [o[2] - o[1] for o in order]))
        finally:
            algo.stop()
    finally:
        ray.shutdown()
    for a_s, gaps, lengths in rows:
        print(f"last sample-end -> driver holds every reply {a_s * 1e3:7.2f} ms;  stamp -> get_metrics() "
              f"{', '.join(f'{g * 1e3:.2f}' for g in gaps)} ms;  get_metrics() {', '.join(f'{x * 1e3:.2f}' for x in lengths)} ms")
    print(f"median: stamp -> get_metrics() {statistics.median(g for r in rows for g in r[1]) * 1e3:.2f} ms, "
          f"get_metrics() {statistics.median(x for r in rows for x in r[2]) * 1e3:.2f} ms, "
          f"last sample-end -> replies {statistics.median(r[0] for r in rows) * 1e3:.2f} ms ({len(rows)} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
