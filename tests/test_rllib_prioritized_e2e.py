"""DQN converges on CartPole-v1 with RLlib's default (prioritized) replay buffer through the plane.

``make test-e2e`` (minutes). The config is the convergence study's DQN
(``studies/rllib_convergence.py``: two envs per EnvRunner, fragments of 4, training intensity 32,
n-step 3, dueling double Q) with DQN's **default** ``replay_buffer_config``
(``PrioritizedEpisodeReplayBuffer``, capacity 50,000, ``alpha=0.6``, ``beta=0.4``): the plane samples by
priority, the loss gets the importance weights, the learner's TD errors update the priorities. It
must reach a mean episode return of 400 within the study's 100k env-step budget with the live audit
at 0 violations on every iteration and priorities updated.

Run alone: ``.venv/bin/python -m pytest -m e2e tests/test_rllib_prioritized_e2e.py -s`` prints the
iterations, env steps and wall time it took.
"""

from __future__ import annotations

import math
import os
import time

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"  # before any Ray process starts

ray = pytest.importorskip("ray")
pytest.importorskip("ray.rllib")

pytestmark = pytest.mark.e2e

THRESHOLD = 400.0
BUDGET = 100_000  # env steps, as the convergence study's DQN
TMP = "/tmp/cdprio"  # short: Ray's socket paths under it must stay within 107 bytes


def _config(seed: int):
    from ray.rllib.algorithms.dqn import DQNConfig

    cfg = (DQNConfig().environment("CartPole-v1").debugging(seed=seed)
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5, num_envs_per_env_runner=2,
                        rollout_fragment_length=4)
           .reporting(min_sample_timesteps_per_iteration=1000)
           .rl_module(model_config={"fcnet_hiddens": [256], "fcnet_activation": "tanh",
                                    "epsilon": [(0, 1.0), (10_000, 0.02)]})
           .training(lr=5e-4, train_batch_size_per_learner=64, n_step=3, double_q=True, dueling=True,
                     training_intensity=32, num_steps_sampled_before_learning_starts=1000,
                     target_network_update_freq=500))
    assert cfg.replay_buffer_config["type"] == "PrioritizedEpisodeReplayBuffer"  # RLlib's default, untouched
    return cfg


def test_dqn_reaches_400_on_cartpole_with_the_default_prioritized_buffer(no_ray):
    from conduit.runtime.rllib import enable, shutdown

    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=TMP, log_to_driver=False,
             object_store_memory=256 << 20)
    t0 = time.time()
    algo = None
    try:
        algo = enable(_config(seed=0)).build_algo()
        best, steps, it, result = 0.0, 0, 0, {}
        while steps < BUDGET and best < THRESHOLD:
            result = algo.train()
            it += 1
            cd = result["conduit"]
            assert cd["violations"] == 0, cd["audit"]["examples"]
            steps = result["env_runners"]["num_env_steps_sampled_lifetime"]
            ret = result["env_runners"].get("episode_return_mean")
            best = max(best, 0.0 if ret is None or math.isnan(ret) else float(ret))
        metrics = result["conduit"]["metrics"]
        print(f"\nDQN (prioritized, through the plane): mean return {best:.0f} after {it} iterations, "
              f"{steps} env steps, {time.time() - t0:.0f} s; priority updates {metrics['priority_updates']}, "
              f"dropped {metrics['priority_updates_dropped']}")
        assert best >= THRESHOLD, f"mean return {best:.0f} after {steps} env steps (budget {BUDGET})"
        assert result["conduit"]["contract"]["sampler"] == {"kind": "prioritized", "alpha": 0.6, "beta": 0.4}
        assert metrics["priority_updates"] > 0
        algo.stop()
        final = shutdown(algo)
        algo = None
        assert final["violations"] == 0 and final["drawn_samples"] == final["delivered_samples"]
    finally:
        if algo is not None:
            algo.stop()
            shutdown(algo)
        ray.shutdown()
