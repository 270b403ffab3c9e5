"""Conduit's RLlib measurement side: the large-observation env and the experience-path instrument.

Checked: ``LargeObsEnv`` spaces, dtypes, episode length and reward signal; ``instrument()`` on tiny
PPO and DQN CartPole configs runs and ``segments(result)`` has every key, finite and non-negative,
with the segments adding up as documented; ``instrument()`` leaves the input config alone and
composes with a user's learner connector and callbacks. Ray: the session's shared one
(tests/conftest.py).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from conduit.runtime.rllib.envs import LARGE_OBS_ENV, LargeObsEnv, register_envs

# ------------------------------------------------------------------------------------------------
# The environment (no Ray)
# ------------------------------------------------------------------------------------------------


def test_large_obs_env_spaces_and_dtypes():
    env = LargeObsEnv({"seed": 3})
    assert env.observation_space.shape == (84, 84, 4)
    assert env.observation_space.dtype == np.uint8
    assert env.action_space.n == 4
    obs, info = env.reset(seed=1)
    assert obs.shape == (84, 84, 4) and obs.dtype == np.uint8
    assert env.observation_space.contains(obs)
    assert info == {}
    obs, reward, terminated, truncated, info = env.step(0)
    assert env.observation_space.contains(obs)
    assert reward in (0.0, 1.0) and not terminated and not truncated


def test_large_obs_env_episode_length_and_learnable_reward():
    env = LargeObsEnv({"episode_len": 50, "jitter": False, "cue_size": 8})
    obs, _ = env.reset(seed=0)
    ret, steps = 0.0, 0
    while True:
        # The cue (value 64 * a + 32 in the top-left block) says which action pays.
        action = (int(obs[0, 0, 0]) - 32) // 64
        obs, r, term, trunc, _ = env.step(action)
        ret += r
        steps += 1
        if term or trunc:
            break
    assert steps == 50 and ret == 50.0  # reading the cue earns every step
    lengths = []
    env = LargeObsEnv({"episode_len": 200, "seed": 5})
    for _ in range(5):
        env.reset()
        n = 0
        while not env.step(0)[3]:
            n += 1
        lengths.append(n + 1)
    assert all(180 <= n <= 220 for n in lengths)


def test_large_obs_env_config_and_registration():
    env = LargeObsEnv({"obs_shape": (42, 42, 2), "episode_len": 3})
    assert env.reset()[0].shape == (42, 42, 2)
    with pytest.raises(ValueError):
        LargeObsEnv({"obs_shape": (84, 84)})
    with pytest.raises(ValueError):
        LargeObsEnv({"episode_len": 0})
    assert register_envs() == LARGE_OBS_ENV
    assert register_envs() == LARGE_OBS_ENV  # idempotent
    import gymnasium as gym

    made = gym.make(LARGE_OBS_ENV)
    assert made.observation_space.shape == (84, 84, 4)
    made.close()


# ------------------------------------------------------------------------------------------------
# The instrument (one Ray session for the module)
# ------------------------------------------------------------------------------------------------


def _check_segments(seg: dict, *, expect_update: bool) -> None:
    from conduit.runtime.rllib.instrument import SEGMENT_KEYS

    assert set(SEGMENT_KEYS) <= set(seg)
    for k in SEGMENT_KEYS:
        assert isinstance(seg[k], float), k
        assert math.isfinite(seg[k]) and seg[k] >= 0.0, (k, seg[k])
    assert seg["iteration_ms"] > 0 and seg["train_iteration_ms"] > 0
    assert seg["sampling_ms"] > 0 and seg["num_sample_rounds"] >= 1 and seg["env_steps_sampled"] > 0
    exp = sum(seg[k] for k in ("a_ms", "a2_ms", "b_ms", "get_ms", "c_ms", "d_ms", "buffer_add_ms", "buffer_sample_ms"))
    assert seg["exp_ms"] == pytest.approx(exp)
    assert seg["exp_with_gae_ms"] == pytest.approx(exp + seg["gae_ms"])
    assert seg["exp_share"] == pytest.approx(seg["exp_ms"] / seg["train_iteration_ms"])
    assert 0.0 <= seg["experience_share"] <= 1.0
    if expect_update:
        assert seg["num_updates"] >= 1 and seg["num_batches"] >= 1
        assert seg["c_ms"] > 0 and seg["learner_busy_ms"] > 0 and seg["batch_mb"] > 0
        assert seg["exposed_ms"] > 0


def test_instrument_ppo_cartpole(local_ray):
    from ray.rllib.algorithms.ppo import PPOConfig

    from conduit.runtime.rllib.instrument import KEY, InstrumentCallback, instrument, segments

    cfg = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=1)
        .training(train_batch_size_per_learner=200, minibatch_size=100, num_epochs=1)
    )
    icfg = instrument(cfg)
    assert cfg.callbacks_class is not icfg.callbacks_class  # the input config is left alone
    assert cfg._learner_class is None
    assert InstrumentCallback in (icfg.callbacks_class if isinstance(icfg.callbacks_class, list) else [icfg.callbacks_class])
    algo = icfg.build_algo()
    try:
        results = [algo.train() for _ in range(2)]
    finally:
        algo.stop()
    for r in results:
        seg = segments(r)
        _check_segments(seg, expect_update=True)
        assert r[KEY]["meta"]["mode"] == "sync"
        # PPO: one update per iteration, and the pipeline has the GAE value pass after NumpyToTensor.
        assert seg["num_updates"] == 1 and seg["gae_ms"] > 0 and seg["buffer_add_ms"] == 0
        # Exposed latency of a synchronous update = the whole path from the last chunk's creation.
        assert seg["exposed_ms"] == pytest.approx(seg["exp_with_gae_ms"], rel=0.25, abs=2.0)
        # The instrument's raw records are moved out of RLlib's own result sections.
        assert KEY not in r["learners"].get("__all_modules__", {})
        assert KEY not in r["env_runners"]
    assert results[1][KEY]["meta"]["iteration"] == 2


def test_instrument_dqn_cartpole(local_ray):
    from ray.rllib.algorithms.dqn import DQNConfig

    from conduit.runtime.rllib.instrument import instrument, segments

    cfg = (
        DQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .reporting(min_sample_timesteps_per_iteration=40)
        .training(num_steps_sampled_before_learning_starts=50, train_batch_size=16)
    )
    algo = instrument(cfg).build_algo()
    try:
        first, second = algo.train(), algo.train()
    finally:
        algo.stop()
    s1, s2 = segments(first), segments(second)
    _check_segments(s1, expect_update=False)  # the first iteration only fills the buffer
    _check_segments(s2, expect_update=True)
    assert s1["num_updates"] == 0 and s1["buffer_add_ms"] > 0
    assert s2["num_updates"] >= 20 and s2["buffer_sample_ms"] > 0 and s2["buffer_add_ms"] > 0
    assert s2["num_sample_rounds"] >= 20  # one env step per sample call


def test_instrument_composes_with_user_hooks():
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.callbacks.callbacks import RLlibCallback

    from conduit.runtime.rllib.instrument import (
        InstrumentCallback,
        StampConnector,
        instrument,
        instrumented_learner_class,
    )

    class UserCallback(RLlibCallback):
        pass

    def user_connector(obs_space, act_space):
        return StampConnector(name="user")

    cfg = PPOConfig().callbacks(UserCallback).learners(learner_connector=user_connector)
    icfg = instrument(cfg)
    assert icfg.callbacks_class == [UserCallback, InstrumentCallback]
    pieces = icfg._learner_connector(None, None)
    assert [p.name for p in pieces] == ["entry", "user"]
    assert instrument(icfg).callbacks_class == [UserCallback, InstrumentCallback]  # idempotent
    learner_cls = icfg.learner_class
    assert learner_cls.__name__ == "InstrumentedPPOTorchLearner"
    assert instrumented_learner_class(learner_cls) is learner_cls
    assert instrumented_learner_class(APPOConfig().learner_class).__name__ == "InstrumentedAPPOTorchLearner"
    with pytest.raises(ValueError):
        instrument(PPOConfig().api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False))


def test_segments_without_instrument_is_a_clear_error():
    from conduit.runtime.rllib.instrument import segments

    with pytest.raises(KeyError, match="instrument"):
        segments({"learners": {}})


# ------------------------------------------------------------------------------------------------
# The driver-side arithmetic, on synthetic stamps (no Ray)
# ------------------------------------------------------------------------------------------------


def _batch(call, t_entry, t_exit, *, t_prev_return=None, t_chunk=None, learner=0):
    return {
        "learner": learner,
        "call": call,
        "t_entry": t_entry,
        "t_prev_return": t_prev_return,
        "t_batch": t_entry + 0.001,
        "t_pre": t_entry + 0.007,
        "t_post": t_entry + 0.008,
        "t_exit": t_exit,
        "t_last_chunk": t_chunk,
        "bytes": 2_000_000,
    }


def test_summary_of_a_synchronous_update():
    from conduit.runtime.rllib.instrument import _DriverRecorder

    rec = _DriverRecorder()
    # Iteration 1: sample round 0 -> 1 s (newest chunk created at 0.99), learner called at 1.002.
    rec.sync_round(0.0, 1.0, [("1:1", 0.98, 60), ("2:1", 0.99, 40)])
    call = rec.update_call(1.002, {})
    assert call["t_last_chunk"] == 0.99
    s1 = rec.summarize([_batch(call["id"], 1.003, 1.020)], [{"learner": 0, "t_start": 1.020, "t_end": 1.9}], 2.0)
    seg = s1["segments"]
    assert s1["meta"]["mode"] == "sync"
    assert seg["a_ms"] == pytest.approx(10.0) and seg["a2_ms"] == pytest.approx(2.0)
    assert seg["b_ms"] == pytest.approx(1.0) and seg["learner_queue_ms"] == 0.0
    assert seg["get_ms"] == pytest.approx(1.0) and seg["c_ms"] == pytest.approx(6.0)
    assert seg["d_ms"] == pytest.approx(1.0) and seg["gae_ms"] == pytest.approx(9.0)
    assert seg["exp_ms"] == pytest.approx(21.0) and seg["exp_with_gae_ms"] == pytest.approx(30.0)
    # Exposed = batch ready (1.020) - max(learner free (never busy), last chunk (0.99)) = 30 ms,
    # the whole path from the newest chunk's creation.
    assert seg["exposed_ms"] == pytest.approx(30.0)
    assert seg["iteration_ms"] == pytest.approx(2000.0)  # no previous update yet: the train() time
    assert seg["env_steps_sampled"] == 100 and seg["batch_mb"] == pytest.approx(2.0)
    # Iteration 2: the update starts 2 s after the previous one; the learner was free since 1.9.
    rec.sync_round(2.0, 3.0, [("1:2", 2.99, 100)])
    call = rec.update_call(3.001, {})
    s2 = rec.summarize(
        [_batch(call["id"], 3.0015, 3.02, t_prev_return=1.95)], [{"learner": 0, "t_start": 3.02, "t_end": 4.0}], 2.1
    )["segments"]
    assert s2["iteration_ms"] == pytest.approx(2000.0)
    assert s2["exposed_ms"] == pytest.approx(30.0)
    assert s2["experience_share"] == pytest.approx(30.0 / 2000.0)
    assert s2["learner_queue_ms"] == 0.0 and s2["b_ms"] == pytest.approx(0.5)


def test_summary_of_an_asynchronous_batch_separates_backpressure():
    from types import SimpleNamespace

    from conduit.runtime.rllib.instrument import KEY, _DriverRecorder

    class Ref:
        def __init__(self, h):
            self.h = h

        def hex(self):
            return self.h

    rec = _DriverRecorder()
    ref = Ref("ab")
    metrics = {KEY: {"sample_end": [("1:7", 0.49, 50)]}}
    rec.async_results(0.4, 0.5, [(1, (ref, {}, metrics))])
    call = rec.update_call(0.6, {"training_data": SimpleNamespace(episodes_refs=[ref])})
    assert call["t_last_chunk"] == 0.49
    # The learner was still inside its previous update() until 0.9: 300 ms of queueing, 5 ms transport.
    batches = [_batch(call["id"], 0.905, 0.95, t_prev_return=0.9, t_chunk=0.49)]
    updates = [{"learner": 0, "t_start": 0.2, "t_end": 0.93}, {"learner": 0, "t_start": 0.96, "t_end": 1.5}]
    out = rec.summarize(batches, updates, 5.0)
    seg = out["segments"]
    assert out["meta"]["mode"] == "async"
    assert seg["a_ms"] == pytest.approx(10.0) and seg["a2_ms"] == pytest.approx(100.0)
    assert seg["learner_queue_ms"] == pytest.approx(300.0) and seg["b_ms"] == pytest.approx(5.0)
    # The learner became free at 0.93 and its batch was ready at 0.95: 20 ms exposed, over a 760 ms period.
    assert seg["exposed_ms"] == pytest.approx(20.0)
    assert seg["iteration_ms"] == pytest.approx(760.0)
    assert seg["experience_share"] == pytest.approx(20.0 / 760.0)
    assert seg["num_updates"] == 2 and seg["num_batches"] == 1
