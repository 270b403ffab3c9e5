"""DQN's per-update driver work on the learner's result, piece by piece, beside the update it follows.

``DQN._training_step_new_api_stack`` (``algorithms/dqn/dqn.py``, RLlib 2.60), after each
``LearnerGroup.update`` (a local learner: ``[self._learner.update(...)]``, ``learner_group.py``), isolates
the TD errors from the results (``convert_to_numpy(module_results.pop(TD_ERROR_KEY).peek())``, one
``np.concatenate`` per module), aggregates the learner's results into the algorithm's metrics
(``self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)``), and around its steps opens
``metrics.log_time`` timers and reads ``metrics.peek``. The simulator charges this work as
``StockCosts.learner_results`` (per call and per learner result), measured as one primitive by
``conduit.runtime.calibrate.measure_learner_results`` (``benchmarks/stock_primitives.py --sections learner``,
and a calibration's ``learner_results:<workload>``); this script splits it into its pieces, to show where
the time goes.

Timed here in process, on the study's ``dqn-cartpole-1r`` config (CartPole, a local learner, the total
train batch drawn from a filled replay buffer; ``studies/rllib_experience_path.py``), one torch thread: per update, medians
over ``--updates`` after 50 warm-up ones, each piece beside the update (``Learner.update`` with its
connector) it follows, and their sum as a share of it (``results/validation/NOTES.md``).

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/dqn_step_extras.py [--updates 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "studies"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=300)
    args = parser.parse_args(argv)
    if args.updates < 1:
        parser.error("--updates must be >= 1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import numpy as np
    import torch
    import validation
    from ray.rllib.core.learner.training_data import TrainingData
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, LEARNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME, TIMERS
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
    from ray.rllib.utils.numpy import convert_to_numpy

    from conduit.runtime import calibrate

    torch.set_num_threads(1)  # as the calibration's update primitives (and Ray's workers) run: one torch thread
    study = validation.experience_path_study()
    _workload, config = validation.study_configs(study, study.parse_args([]), ["dqn-cartpole-1r"])["dqn-cartpole-1r"]
    cfg = config.copy(copy_frozen=False).learners(num_learners=0)
    runner = calibrate._local_env_runner(cfg)
    learner = cfg.build_learner(env=runner.env)
    buffer = calibrate._replay_buffer(dict(cfg.replay_buffer_config))
    n = int(cfg.total_train_batch_size)
    calibrate._fill_replay(buffer, runner, cfg, [n])
    timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: 10**6}
    metrics = MetricsLogger(root=True)  # the algorithm's own logger is a root logger
    pieces: dict[str, list[float]] = defaultdict(list)
    warmup = 50
    for i in range(warmup + args.updates):
        episodes = calibrate._draw_replay(buffer, cfg, n)
        t0 = time.perf_counter()
        results = [learner.update(training_data=TrainingData(episodes=episodes), timesteps=timesteps)]
        t1 = time.perf_counter()
        td_errors = defaultdict(list)
        for res in results:
            for module_id, module_results in res.items():
                if "td_error" in module_results:
                    td_errors[module_id].extend(convert_to_numpy(module_results.pop("td_error").peek()))
        td_errors = {m: {"td_error": np.concatenate(s, axis=0)} for m, s in td_errors.items()}
        t2 = time.perf_counter()
        metrics.aggregate(results, key=LEARNER_RESULTS)
        t3 = time.perf_counter()
        for timer in ("sampling", "add", "sample", "update", "priorities", "sync"):
            with metrics.log_time((TIMERS, timer)):
                pass
        for _ in range(3):
            metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)
        t4 = time.perf_counter()
        if i >= warmup:
            for name, seconds in (("update (Learner.update with its connector)", t1 - t0),
                                  ("TD errors isolated from the results", t2 - t1),
                                  ("metrics.aggregate of the learner results", t3 - t2),
                                  ("six log_time timers and three peeks", t4 - t3)):
                pieces[name].append(seconds)
    medians = {name: statistics.median(v) * 1e3 for name, v in pieces.items()}
    update = medians.pop("update (Learner.update with its connector)")
    print(f"dqn-cartpole-1r, batch {n}, {args.updates} updates after {warmup} warm-up (medians, ms per update)")
    print(f"  {'update (Learner.update with its connector)':<45} {update:8.3f}   (charged by the simulator)")
    for name, ms in medians.items():
        print(f"  {name:<45} {ms:8.3f}   {100 * ms / update:5.1f}% of the update")
    extra = sum(medians.values())
    print(f"  {'in all (StockCosts.learner_results)':<45} {extra:8.3f}   {100 * extra / update:5.1f}% of the update")
    return 0


if __name__ == "__main__":
    sys.exit(main())
