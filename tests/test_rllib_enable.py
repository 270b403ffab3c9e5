"""Conduit's RLlib integration without a running Ray cluster: ``enable()``, the chunk layouts, StreamedGAE.

Checked:

* ``enable()`` refuses what it cannot run with an :class:`EnableError` naming the setting or option
  (old API stack, other algorithms, unknown/misplaced options, bad policy settings, batch modes and
  learner/aggregator counts it does not drive, tuple ``n_step``, bad timeouts and depths);
* ``enable()`` on PPO, APPO, IMPALA, DQN and SAC returns a *copy* whose EnvRunner and Learner classes
  carry the plan (family, contract, batch size as RLlib samples it), keeps user callbacks and
  classes, swaps the replay buffer for Conduit's import path (SAC's config still validates), and can
  be applied again without wrapping twice;
* the trajectory layout (PPO/APPO/IMPALA) round-trips episode pieces, cut as a streaming EnvRunner
  cuts them and packed in several chunks, back into one joined episode per original episode
  (hypothesis), and refuses a batch holding part of a chunk;
* the transition layout (DQN/SAC) computes the n-step rows exactly (hypothesis) and rebuilds the
  one-step episodes RLlib's buffer returns;
* :class:`StreamedGAE` with streamed values gives RLlib's own GAE advantages and value targets on a
  standalone PPO learner, falls back to the real pass on a batch of the wrong length, and is not
  installed over a custom learner connector.

No ``ray.init``: configs are only built and checked; the learner is built in-process.
"""

from __future__ import annotations

import copy
import itertools
import os
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

pytest.importorskip("ray.rllib")
gym = pytest.importorskip("gymnasium")

import torch
from ray.rllib.algorithms.appo import APPOConfig
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.algorithms.impala import IMPALAConfig
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.algorithms.sac import SACConfig
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.evaluation.postprocessing import Postprocessing

from conduit.contracts import BoundedStaleness, OnPolicy, Prioritized, Replay
from conduit.errors import ConduitError
from conduit.runtime.rllib import EnableError, enable
from conduit.runtime.rllib.callbacks import ConduitCallback
from conduit.runtime.rllib.env_runner import ConduitEnvRunnerMixin
from conduit.runtime.rllib.layout import (
    TRAJECTORY,
    TRANSITION,
    pack_trajectories,
    pack_transitions,
    rebuild_trajectories,
    rebuild_transitions,
    run_rows,
    trajectory_schema,
    transition_schema,
)
from conduit.runtime.rllib.learner import ConduitLearnerMixin
from conduit.runtime.rllib.plan import ASYNC, ON_POLICY, REPLAY
from conduit.runtime.rllib.replay_buffer import IMPORT_PATH
from conduit.runtime.rllib.values import StreamedGAE, install_streamed_gae

HYPO = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _ppo(**training):
    return PPOConfig().environment("CartPole-v1").training(**training)


def _plan(cfg):
    return cfg.env_runner_cls.conduit_plan


class UserCallback(RLlibCallback):
    """A user's callback that enable() must keep."""


# ------------------------------------------------------------------------------------------------
# 1. enable(): what it refuses
# ------------------------------------------------------------------------------------------------


def _marwil():
    from ray.rllib.algorithms.marwil import MARWILConfig

    return MARWILConfig().environment("CartPole-v1")


def _bc():
    from ray.rllib.algorithms.bc import BCConfig

    return BCConfig().environment("CartPole-v1")


def _cql():
    from ray.rllib.algorithms.cql import CQLConfig

    return CQLConfig().environment("Pendulum-v1")


def _stateful_module():
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.examples.rl_modules.classes.lstm_containing_rlm import LSTMContainingRLModule

    return _ppo().rl_module(rl_module_spec=RLModuleSpec(module_class=LSTMContainingRLModule))


BAD_CONFIGS = {
    "old_api_stack": (
        lambda: _ppo().api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False),
        "old API stack.*enable_rl_module_and_learner",
    ),
    "marwil": (_marwil, "algorithm MARWIL is not supported"),
    "bc": (_bc, "algorithm BC is not supported"),
    "cql_derived_from_sac": (_cql, "algorithm CQL is not supported"),
    "ppo_complete_episodes": (
        lambda: _ppo().env_runners(batch_mode="complete_episodes"),
        "batch_mode='complete_episodes'",
    ),
    "two_learners": (lambda: _ppo().learners(num_learners=2), "num_learners=2"),
    "appo_aggregators": (
        lambda: APPOConfig().environment("CartPole-v1").learners(num_aggregator_actors_per_learner=1),
        "num_aggregator_actors_per_learner",
    ),
    "appo_vectorized": (
        lambda: APPOConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=2),
        "APPO with num_envs_per_env_runner=2",
    ),
    "impala_vectorized": (
        lambda: IMPALAConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=4),
        "IMPALA with num_envs_per_env_runner=4",
    ),
    "custom_learner_connector": (
        lambda: _ppo().training(learner_connector=lambda obs_space, act_space: []),
        r"training\(learner_connector=...\)",
    ),
    "stateful_custom_module": (_stateful_module, "module_class=LSTMContainingRLModule defines get_initial_state"),
    "dqn_tuple_n_step": (
        lambda: DQNConfig().environment("CartPole-v1").training(n_step=(2, 5)),
        r"n_step=\(2, 5\)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_enable_refuses_configs_it_cannot_run(case):
    make, match = BAD_CONFIGS[case]
    with pytest.raises(EnableError, match=match) as info:
        enable(make())
    assert isinstance(info.value, ConduitError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("not_a_config", [{"env": "CartPole-v1"}, "PPO", PPOConfig])
def test_enable_refuses_non_configs(not_a_config):
    with pytest.raises(EnableError, match="expected an RLlib AlgorithmConfig"):
        enable(not_a_config)


def _policy_object():
    from conduit.registry import create_policy

    return create_policy("conduit")


BAD_OPTIONS = {
    "unknown_option": (_ppo, lambda: {"chunk_size": 10}, r"unknown option.*chunk_size"),
    "chunk_steps_on_dqn": (
        lambda: DQNConfig().environment("CartPole-v1"),
        lambda: {"chunk_steps": 8},
        "chunk_steps= applies to PPO, not DQN",
    ),
    "max_lag_on_ppo": (_ppo, lambda: {"max_lag": 3}, "max_lag= applies to APPO/IMPALA, not PPO"),
    "bad_max_lag": (
        lambda: APPOConfig().environment("CartPole-v1"),
        lambda: {"max_lag": -1},
        "max_lag must be a non-negative integer",
    ),
    "bad_chunk_steps": (_ppo, lambda: {"chunk_steps": 0}, "chunk_steps must be a positive multiple"),
    "value_pass": (_ppo, lambda: {"value_pass": "x"}, "value_pass must be 'per_chunk' or 'batch', got 'x'"),
    "params_with_policy_object": (
        _ppo,
        lambda: {"policy": _policy_object(), "params": {"x": 1}},
        "params/params_file configure a policy given by name",
    ),
    "params_file_with_policy_object": (
        _ppo,
        lambda: {"policy": _policy_object(), "params_file": "/tmp/tre_any.json"},
        "params/params_file configure a policy given by name",
    ),
    "not_a_policy": (_ppo, lambda: {"policy": object()}, "policy must be a registered name or a conduit Policy"),
    "unknown_policy": (_ppo, lambda: {"policy": "tre-no-such-policy"}, "policy='tre-no-such-policy'"),
    "bad_policy_params": (_ppo, lambda: {"params": {"tre_bogus": 1}}, "tre_bogus"),
    "negative_prefetch_depth": (_ppo, lambda: {"prefetch_depth": -1}, "prefetch_depth must be a non-negative"),
    "zero_delivery_timeout": (_ppo, lambda: {"delivery_timeout": 0}, "delivery_timeout must be a positive"),
    "negative_delivery_timeout": (_ppo, lambda: {"delivery_timeout": -2.5}, "delivery_timeout must be a positive"),
    "bool_delivery_timeout": (_ppo, lambda: {"delivery_timeout": True}, "delivery_timeout must be a positive"),
    "zero_ingest_timeout": (_ppo, lambda: {"ingest_timeout": 0.0}, "ingest_timeout must be a positive"),
    "bad_max_restarts": (_ppo, lambda: {"max_restarts": -2}, "max_restarts must be an integer >= -1"),
    "bool_max_restarts": (_ppo, lambda: {"max_restarts": True}, "max_restarts must be an integer >= -1"),
    "zero_restart_timeout": (_ppo, lambda: {"restart_timeout": 0}, "restart_timeout must be a positive"),
    "zero_call_timeout": (_ppo, lambda: {"call_timeout": 0}, "call_timeout must be a positive"),
    "text_call_timeout": (_ppo, lambda: {"call_timeout": "2 min"}, "call_timeout must be a positive"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_enable_refuses_bad_options(case):
    make, options, match = BAD_OPTIONS[case]
    with pytest.raises(EnableError, match=match):
        enable(make(), **options())


@pytest.mark.parametrize("option", [{"inline_bytes": "x"}, {"inline_bytes": -5}, {"capacities": "lots"},
                                    {"capacities": {"pageable": "-1 GiB"}}, {"capacities": {"pageable": 0}},
                                    {"capacities": {"nvme0:nvme": -1}}, {"coalesce_s": -1}, {"metrics_export_s": -1}, {"metrics_export_s": float("nan")},
                                    {"metrics_export_s": True},
                                    {"topology": "/tmp/tre_no_such_topology.yaml"}])
def test_enable_refuses_bad_plane_options_up_front(option):
    """plan.py: "All refusals happen here, so a bad combination fails at enable() time"."""
    with pytest.raises(EnableError, match=next(iter(option))):
        enable(_ppo(), **option)


def test_enable_refuses_missing_params_file(tmp_path):
    missing = tmp_path / "tre_missing_params.json"
    with pytest.raises(EnableError, match="no such file") as info:
        enable(_ppo(), params_file=str(missing))
    assert str(missing) in str(info.value)


def test_enable_refuses_a_runner_class_that_is_not_single_agent():
    class NotARunner:
        pass

    with pytest.raises(EnableError, match="env_runner_cls=NotARunner"):
        enable(_ppo().env_runners(env_runner_cls=NotARunner))


def test_enable_accepts_a_policy_object_and_a_tuned_params_file(tmp_path):
    from conduit.tuning_file import save_params

    cfg = enable(_ppo(), policy=_policy_object())
    assert _plan(cfg).family == ON_POLICY
    path = save_params(tmp_path / "tre_tuned.json", "conduit", {})
    assert _plan(enable(_ppo(), params_file=str(path))).options["params_file"] == str(path)


# ------------------------------------------------------------------------------------------------
# 2. enable(): the plan and the returned config
# ------------------------------------------------------------------------------------------------


def _snapshot(cfg):
    return {
        "env_runner_cls": cfg.env_runner_cls,
        "learner_class": cfg.learner_class,
        "callbacks": cfg.callbacks_class,
        "buffer": copy.deepcopy(getattr(cfg, "replay_buffer_config", None)),
        "type": type(cfg),
    }


def _check_wrapping(cfg, original):
    plan = _plan(cfg)
    assert cfg is not original
    assert cfg.learner_class.conduit_plan is plan
    runner_mro, learner_mro = cfg.env_runner_cls.__mro__, cfg.learner_class.__mro__
    assert runner_mro.count(ConduitEnvRunnerMixin) == 1 and issubclass(cfg.env_runner_cls, SingleAgentEnvRunner)
    assert learner_mro.count(ConduitLearnerMixin) == 1
    assert issubclass(cfg.learner_class, original.learner_class)
    assert cfg.callbacks_class is ConduitCallback
    cfg.validate()
    return plan


def test_enable_ppo_plan_and_copy():
    original = _ppo(train_batch_size_per_learner=1000).env_runners(num_env_runners=2)
    before = _snapshot(original)
    cfg = enable(original)
    assert _snapshot(original) == before  # the input config is left alone
    assert original.env_runner_cls is None and original._learner_class is None
    plan = _check_wrapping(cfg, original)
    assert plan.algorithm == "PPO" and plan.family == ON_POLICY and plan.layout == TRAJECTORY
    assert isinstance(plan.contract, OnPolicy)
    assert plan.batch_steps == 1000
    assert 1 <= plan.chunk_steps <= 500  # a sub-chunk never exceeds one runner's fragment (500 steps)
    assert plan.returns_ticket


@pytest.mark.parametrize(
    ("runners", "envs", "fragment", "batch", "expected"),
    [
        (2, 1, "auto", 1000, 1000),
        (3, 1, "auto", 1000, 1000),  # fragments 334 + 333 + 333
        (4, 3, "auto", 2500, 2502),  # fragments 209, 209, 208, 208 x 3 envs: RLlib's round samples 2502
        (2, 1, 100, 1000, 1000),  # five rounds of 200
        (2, 1, 300, 1000, 1200),  # two rounds of 600: RLlib samples until it has reached 1000
        (0, 2, "auto", 400, 400),  # the local runner samples
    ],
)
def test_enable_ppo_batch_is_what_rllib_samples(runners, envs, fragment, batch, expected):
    original = _ppo(train_batch_size_per_learner=batch).env_runners(
        num_env_runners=runners, num_envs_per_env_runner=envs, rollout_fragment_length=fragment)
    plan = _plan(enable(original))
    indices = range(1, runners + 1) if runners else [0]
    per_round = sum(original.get_rollout_fragment_length(i) * envs for i in indices)
    assert plan.batch_steps == expected
    assert plan.batch_steps >= batch and plan.batch_steps % per_round == 0
    assert plan.chunk_steps % envs == 0
    # vectorized sample calls return up to envs - 1 steps more each (gymnasium's NEXT_STEP autoreset):
    # the plane's batches can hold that much more, and the learner sizes each one from the tickets
    rounds = plan.batch_steps // per_round
    assert plan.batch_slack == rounds * max(1, runners) * (envs - 1)
    assert plan.plane_batch_steps == plan.batch_steps + plan.batch_slack


def test_enable_ppo_chunk_steps_and_value_pass_options():
    cfg = enable(_ppo(train_batch_size_per_learner=400).env_runners(num_env_runners=2), chunk_steps=50,
                 value_pass="batch")
    plan = _plan(cfg)
    assert plan.chunk_steps == 50 and plan.options["value_pass"] == "batch"
    big = _plan(enable(_ppo(train_batch_size_per_learner=400).env_runners(num_env_runners=2), chunk_steps=10_000))
    assert big.chunk_steps == 200  # capped at one runner's fragment
    with pytest.raises(EnableError, match="multiple of num_envs_per_env_runner"):
        enable(_ppo().env_runners(num_envs_per_env_runner=2), chunk_steps=3)


@pytest.mark.parametrize(
    ("make", "name", "reuse"),
    [
        (lambda: APPOConfig().environment("CartPole-v1"), "APPO", None),
        (lambda: IMPALAConfig().environment("CartPole-v1"), "IMPALA", 1),
    ],
)
def test_enable_async_plans(make, name, reuse):
    original = make().env_runners(num_env_runners=2, rollout_fragment_length=64).training(
        train_batch_size_per_learner=500)
    before = _snapshot(original)
    cfg = enable(original)
    assert _snapshot(original) == before
    plan = _check_wrapping(cfg, original)
    assert plan.algorithm == name and plan.family == ASYNC and plan.layout == TRAJECTORY
    assert isinstance(plan.contract, BoundedStaleness)
    assert plan.batch_steps == 512  # whole sample calls of 64 covering 500
    assert plan.chunk_steps is None and not plan.returns_ticket
    expected_reuse = original.circular_buffer_iterations_per_batch if reuse is None else reuse
    assert plan.contract.max_reuse == expected_reuse
    assert plan.contract.max_lag >= 1
    assert _plan(enable(original, max_lag=5)).contract.max_lag == 5
    exact = make().env_runners(num_env_runners=2).training(train_batch_size_per_learner=500)
    frag = exact.get_rollout_fragment_length(1)
    assert _plan(enable(exact)).batch_steps == -(-500 // frag) * frag


def test_enable_appo_refuses_uneven_fragments():
    cfg = APPOConfig().environment("CartPole-v1").env_runners(num_env_runners=3, rollout_fragment_length="auto")
    cfg.training(train_batch_size_per_learner=1000)  # fragments 334, 333, 333
    with pytest.raises(EnableError, match="same rollout_fragment_length"):
        enable(cfg)


def test_enable_dqn_plan_and_buffer():
    original = DQNConfig().environment("CartPole-v1").training(
        replay_buffer_config={"capacity": 12_345}, num_steps_sampled_before_learning_starts=500,
        train_batch_size_per_learner=64, n_step=3, gamma=0.95)
    before = _snapshot(original)
    cfg = enable(original)
    assert _snapshot(original) == before
    assert original.replay_buffer_config["type"] == "PrioritizedEpisodeReplayBuffer"
    plan = _check_wrapping(cfg, original)
    assert plan.algorithm == "DQN" and plan.family == REPLAY and plan.layout == TRANSITION
    assert isinstance(plan.contract, Replay)
    # warm-up: RLlib's 500 sampled steps, less the (n_step - 1) x envs x runners steps an EnvRunner may still
    # hold for their n-step windows when RLlib starts learning
    assert plan.contract.capacity == 12_345 and plan.contract.min_size == 500 - 2
    assert plan.contract.replay_ratio > 0
    assert plan.batch_steps == 64 and plan.n_step == 3 and plan.gamma == pytest.approx(0.95)
    # DQN's default buffer is prioritized: the contract samples with its alpha and beta
    assert plan.contract.sampler == Prioritized(alpha=0.6, beta=0.4)
    assert cfg.replay_buffer_config["type"] == IMPORT_PATH
    assert cfg.replay_buffer_config["capacity"] == 12_345
    # a prioritized draw waits for the previous update's priorities: one batch fetched ahead
    assert plan.options["prefetch_depth"] == 1 and plan.options["coalesce_s"] == 0.1
    mine = enable(original, prefetch_depth=2, coalesce_s=0.0).learner_class.conduit_plan
    assert mine.options["prefetch_depth"] == 2 and mine.options["coalesce_s"] == 0.0
    # enabling again reads the original buffer type, kept beside Conduit's import path
    assert _plan(enable(cfg)).contract.sampler == Prioritized(alpha=0.6, beta=0.4)
    uniform = enable(DQNConfig().environment("CartPole-v1").training(
        replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 1000}))
    plan = _plan(uniform)
    assert plan.contract.sampler == "uniform" and plan.options["prefetch_depth"] == 2
    assert _plan(enable(uniform)).contract.sampler == "uniform"


@pytest.mark.parametrize("buf, setting", [
    ({"type": "MultiAgentPrioritizedReplayBuffer"}, "MultiAgentPrioritizedReplayBuffer"),
    ({"type": "ReplayBuffer"}, "'ReplayBuffer'"),
    ({"type": "PrioritizedEpisodeReplayBuffer", "alpha": 0.6, "beta": 0.4, "storage_unit": "timesteps"},
     "storage_unit"),
    ({"type": "PrioritizedEpisodeReplayBuffer", "alpha": 0.6, "beta": 0.4, "prioritized_replay_eps": 1e-6},
     "prioritized_replay_eps"),
    ({"type": "EpisodeReplayBuffer", "alpha": 0.6}, "'alpha'"),
    ({"type": "PrioritizedEpisodeReplayBuffer", "alpha": 0.6}, "'beta'"),
    ({"type": "PrioritizedEpisodeReplayBuffer", "alpha": -1.0, "beta": 0.4}, "alpha"),
])
def test_enable_refuses_replay_settings_it_does_not_implement(buf, setting):
    cfg = DQNConfig().environment("CartPole-v1")
    cfg.replay_buffer_config = dict(buf)  # replace, not merge: RLlib's training() merges into its default
    with pytest.raises(EnableError, match=setting):
        enable(cfg)


def test_enable_sac_default_buffer_is_prioritized_with_rllib_defaults():
    plan = _plan(enable(SACConfig().environment("Pendulum-v1")))
    assert plan.contract.sampler == Prioritized(alpha=0.6, beta=0.4)
    cfg = SACConfig().environment("Pendulum-v1").training(
        replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "alpha": 1.0, "beta": 0.0})
    assert _plan(enable(cfg)).contract.sampler == Prioritized(alpha=1.0, beta=0.0)


def test_enabled_replay_buffer_builds_the_way_rllib_builds_it():
    from ray.rllib.utils.from_config import from_config
    from ray.rllib.utils.replay_buffers.replay_buffer import ReplayBuffer

    from conduit.runtime.rllib.replay_buffer import TICKET_KEY, ConduitEpisodeReplayBuffer

    cfg = enable(DQNConfig().environment("CartPole-v1").training(replay_buffer_config={"capacity": 777}))
    # Algorithm._create_local_replay_buffer_if_necessary: the config's dict plus the smoothing window
    buf = from_config(ReplayBuffer, {**cfg.replay_buffer_config, "metrics_num_episodes_for_smoothing": 100})
    assert isinstance(buf, ConduitEpisodeReplayBuffer) and buf.capacity == 777
    buf.add([])
    with pytest.raises(ConduitError, match="got 1 episodes"):
        buf.add([SingleAgentEpisode()])
    first = buf.sample(num_items=32, n_step=1, beta=0.4, gamma=0.99)
    assert len(first) == 1 and len(first[0]) == 0
    assert first[0].custom_data[TICKET_KEY] == {"steps": 32, "seq": 1}
    state = buf.get_state()
    fresh = from_config(ReplayBuffer, {**cfg.replay_buffer_config, "metrics_num_episodes_for_smoothing": 100})
    fresh.set_state(state)
    assert fresh.sample(num_items=8)[0].custom_data[TICKET_KEY] == {"steps": 8, "seq": 2}


def test_enable_dqn_min_size_is_capped_at_capacity():
    cfg = DQNConfig().environment("CartPole-v1").training(
        replay_buffer_config={"capacity": 100}, num_steps_sampled_before_learning_starts=1000)
    assert _plan(enable(cfg)).contract.min_size == 100


def test_enable_sac_plan_buffer_and_validation():
    original = SACConfig().environment("Pendulum-v1").training(
        replay_buffer_config={"capacity": 20_000}, num_steps_sampled_before_learning_starts=300,
        train_batch_size_per_learner=128)
    before = _snapshot(original)
    cfg = enable(original)
    assert _snapshot(original) == before and type(original) is SACConfig
    assert isinstance(cfg, SACConfig) and type(cfg) is not SACConfig
    plan = _check_wrapping(cfg, original)  # includes cfg.validate()
    assert plan.algorithm == "SAC" and plan.family == REPLAY and plan.layout == TRANSITION
    assert isinstance(plan.contract, Replay)
    assert plan.contract.capacity == 20_000 and plan.contract.min_size == 300 and plan.batch_steps == 128
    assert cfg.replay_buffer_config["type"] == IMPORT_PATH
    cfg.validate()
    assert cfg.replay_buffer_config["type"] == IMPORT_PATH  # validate() puts the import path back
    stock = SACConfig().environment("Pendulum-v1").training(replay_buffer_config={"type": IMPORT_PATH})
    with pytest.raises(ValueError, match="EpisodeReplayBuffer"):
        stock.validate()
    again = enable(cfg)
    assert type(again) is type(cfg)
    again.validate()


def test_enable_keeps_user_callbacks_and_classes_and_is_idempotent():
    class UserRunner(SingleAgentEnvRunner):
        pass

    original = _ppo(train_batch_size_per_learner=400).env_runners(num_env_runners=2, env_runner_cls=UserRunner)
    original.callbacks(UserCallback)
    cfg = enable(original)
    assert original.callbacks_class is UserCallback and original.env_runner_cls is UserRunner
    assert cfg.callbacks_class == [UserCallback, ConduitCallback]
    assert issubclass(cfg.env_runner_cls, UserRunner)
    first = _plan(cfg)

    twice = enable(cfg, chunk_steps=20)
    assert twice.callbacks_class == [UserCallback, ConduitCallback]
    assert twice.env_runner_cls.__mro__.count(ConduitEnvRunnerMixin) == 1
    assert twice.learner_class.__mro__.count(ConduitLearnerMixin) == 1
    assert twice.env_runner_cls.__bases__[1] is UserRunner
    assert twice.learner_class.__bases__[1] is original.learner_class
    assert _plan(twice).chunk_steps == 20
    assert twice.learner_class.conduit_plan is _plan(twice)
    assert _plan(cfg) is first  # the first result keeps its own plan
    twice.validate()

    for make in (lambda: DQNConfig().environment("CartPole-v1"), lambda: SACConfig().environment("Pendulum-v1"),
                 lambda: APPOConfig().environment("CartPole-v1"), lambda: IMPALAConfig().environment("CartPole-v1")):
        base = make()
        base.callbacks([UserCallback])
        once = enable(base)
        again = enable(once)
        assert again.callbacks_class == [UserCallback, ConduitCallback]
        assert again.env_runner_cls.__mro__.count(ConduitEnvRunnerMixin) == 1
        assert again.learner_class.__mro__.count(ConduitLearnerMixin) == 1
        assert _plan(again).algorithm == _plan(once).algorithm


# ------------------------------------------------------------------------------------------------
# 3. The trajectory layout (PPO/APPO/IMPALA)
# ------------------------------------------------------------------------------------------------

N_ACTIONS = 3
IMAGE_SHAPE = (3, 4, 2)
VECTOR_SHAPE = (3,)
ENDS = ("terminated", "truncated", "cut")


def _spaces(image):
    if image:
        obs_space = gym.spaces.Box(0, 255, IMAGE_SHAPE, np.uint8)
    else:
        obs_space = gym.spaces.Box(-np.inf, np.inf, VECTOR_SHAPE, np.float32)
    return obs_space, gym.spaces.Discrete(N_ACTIONS)


def _episode(rng, eid, n, end, *, image, t_started=0, spaces=None):
    obs_space, act_space = spaces or _spaces(image)
    if image:
        obs = rng.integers(0, 256, size=(n + 1, *IMAGE_SHAPE), dtype=np.uint8)
    else:
        obs = rng.normal(size=(n + 1, *VECTOR_SHAPE)).astype(np.float32)
    return SingleAgentEpisode(
        id_=eid,
        observations=obs,
        actions=rng.integers(0, N_ACTIONS, size=n),
        rewards=rng.normal(size=n).astype(np.float32),
        infos=[{} for _ in range(n + 1)],
        extra_model_outputs={
            "action_logp": rng.normal(size=n).astype(np.float32),
            "action_dist_inputs": rng.normal(size=(n, N_ACTIONS)).astype(np.float32),
            "weights_seq_no": np.zeros(n, np.int64),
        },
        terminated=end == "terminated",
        truncated=end == "truncated",
        t_started=t_started,
        len_lookback_buffer=0,
        observation_space=obs_space,
        action_space=act_space,
    )


def _pieces(episode, cuts, lookback):
    """The consecutive pieces a streaming EnvRunner returns for one episode (continuations carry a
    lookback of ``lookback`` steps, as ``episode.cut(len_lookback_buffer=...)`` makes them)."""
    bounds = [0, *cuts, len(episode)]
    out = []
    for a, b in itertools.pairwise(bounds):
        piece = episode.slice(slice(a, b), len_lookback_buffer=lookback if a > 0 else 0)
        assert piece.id_ == episode.id_ and piece.t_started == episode.t_started + a and len(piece) == b - a
        out.append(piece)
    return out


def _pack_batch(chunks, schema, versions):
    """Pack each chunk; concatenate the payloads in chunk order as one batch."""
    payloads, selections, annotations = [], [], {}
    for i, (pieces, version) in enumerate(zip(chunks, versions, strict=True)):
        payload, ann = pack_trajectories(pieces, schema, version)
        rows = schema.validate(payload)
        assert rows == sum(len(p) for p in pieces)
        assert len(ann["pieces"]) == len(pieces) and len(ann["final_obs"]) == len(pieces)
        ends = np.cumsum([len(p) for p in pieces]) - 1  # the done flags sit on each piece's last row only
        for flag, attr in (("terminateds", "is_terminated"), ("truncateds", "is_truncated")):
            want = np.zeros(rows, np.bool_)
            want[ends] = [getattr(p, attr) for p in pieces]
            np.testing.assert_array_equal(payload[flag], want)
        for p, piece in zip(ann["pieces"], pieces, strict=True):
            assert (p.episode_id, p.t_started, p.length, p.version) == (piece.id_, piece.t_started, len(piece),
                                                                        version)
        cid = f"r1-{i}"
        payloads.append(payload)
        selections.append((cid, range(rows)))
        annotations[cid] = ann
    columns = {name: np.concatenate([p[name] for p in payloads]) for name in schema.names}
    return columns, selections, annotations


def _check_joined(rebuilt, originals, first_version):
    assert [e.id_ for e in rebuilt] == [e.id_ for e in originals]
    for got, want in zip(rebuilt, originals, strict=True):
        n = len(want)
        assert len(got) == n
        assert got.t_started == want.t_started
        assert got.is_terminated == want.is_terminated and got.is_truncated == want.is_truncated
        obs = got.get_observations(slice(0, n + 1))
        np.testing.assert_array_equal(obs, want.get_observations(slice(0, n + 1)))  # incl. the final one
        assert obs.dtype == want.get_observations(0).dtype
        np.testing.assert_array_equal(got.get_actions(slice(0, n)), want.get_actions(slice(0, n)))
        np.testing.assert_array_equal(got.get_rewards(slice(0, n)), want.get_rewards(slice(0, n)))
        for key in ("action_logp", "action_dist_inputs"):
            np.testing.assert_array_equal(got.get_extra_model_outputs(key, slice(0, n)),
                                          want.get_extra_model_outputs(key, slice(0, n)))
        np.testing.assert_array_equal(got.get_extra_model_outputs("weights_seq_no", slice(0, n)),
                                      np.full(n, first_version[want.id_]))


@HYPO
@given(data=st.data())
def test_trajectory_layout_round_trip(data):
    image = data.draw(st.booleans(), label="image")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    spaces = _spaces(image)
    originals, queues = [], []
    for i in range(data.draw(st.integers(1, 4), label="episodes")):
        n = data.draw(st.integers(1, 30), label="length")
        end = data.draw(st.sampled_from(ENDS), label="end")
        t0 = data.draw(st.sampled_from([0, 0, 13]), label="t_started")
        ep = _episode(rng, f"ep{i}", n, end, image=image, t_started=t0, spaces=spaces)
        cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=min(4, n - 1)), label="cuts")) if n > 1 else []
        lookback = data.draw(st.sampled_from([0, 1]), label="lookback")
        originals.append(ep)
        queues.append(_pieces(ep, cuts, lookback))
    # interleave the episodes' pieces (each episode's pieces stay in time order) and cut into chunks
    order = []
    while any(queues):
        which = data.draw(st.sampled_from([i for i, q in enumerate(queues) if q]), label="next piece")
        order.append(queues[which].pop(0))
    bounds = sorted(data.draw(st.sets(st.integers(1, len(order) - 1), max_size=len(order) - 1), label="chunks")) \
        if len(order) > 1 else []
    chunks = [order[a:b] for a, b in zip([0, *bounds], [*bounds, len(order)], strict=True)]
    versions = [data.draw(st.integers(0, 5), label="version") for _ in chunks]

    first_seen = []
    first_version = {}
    for chunk, version in zip(chunks, versions, strict=True):
        for piece in chunk:
            if piece.id_ not in first_version:
                first_seen.append(piece.id_)
                first_version[piece.id_] = version
    by_id = {e.id_: e for e in originals}
    schema = trajectory_schema(*spaces, N_ACTIONS)
    columns, selections, annotations = _pack_batch(chunks, schema, versions)
    rebuilt, runs = rebuild_trajectories(columns, selections, annotations, observation_space=spaces[0],
                                         action_space=spaces[1])
    _check_joined(rebuilt, [by_id[i] for i in first_seen], first_version)
    for run, ep in zip(runs, rebuilt, strict=True):
        np.testing.assert_array_equal(columns["obs"][run_rows(run)], ep.get_observations(slice(0, len(ep))))

    # a batch that carries only part of a chunk is refused
    cut_at = data.draw(st.integers(0, len(selections) - 1), label="partial chunk")
    cid, rows = selections[cut_at]
    partial = [*selections[:cut_at], (cid, rows[:-1]), *selections[cut_at + 1:]]
    with pytest.raises(ConduitError, match="split across batches"):
        rebuild_trajectories(columns, partial, annotations)


def test_trajectory_layout_joins_pieces_alternating_across_chunks():
    """Three envs of one runner streaming four sub-chunks: every chunk holds one piece of each episode."""
    rng = np.random.default_rng(7)
    spaces = _spaces(False)
    originals = [_episode(rng, "a", 12, "terminated", image=False, spaces=spaces),
                 _episode(rng, "b", 12, "cut", image=False, t_started=40, spaces=spaces),
                 _episode(rng, "c", 12, "truncated", image=False, spaces=spaces)]
    per_episode = [_pieces(e, [3, 6, 9], lookback=1) for e in originals]
    chunks = [[per_episode[(j + k) % 3][k] for j in range(3)] for k in range(4)]  # rotate who comes first
    schema = trajectory_schema(*spaces, N_ACTIONS)
    columns, selections, annotations = _pack_batch(chunks, schema, [2, 2, 2, 2])
    rebuilt, runs = rebuild_trajectories(columns, selections, annotations)
    assert all(len(run.rows) == 4 for run in runs)  # each episode joined from four pieces
    _check_joined(rebuilt, originals, {"a": 2, "b": 2, "c": 2})

    # chunks delivered out of time order: pieces that do not continue a run are not joined into it
    rows = 9  # three pieces of three steps per chunk
    order = [1, 0, 2, 3]
    swapped = {k: np.concatenate([v[c * rows:(c + 1) * rows] for c in order]) for k, v in columns.items()}
    rebuilt2, _ = rebuild_trajectories(swapped, [selections[c] for c in order], annotations)
    by_id = {e.id_: e for e in originals}
    assert sorted((e.id_, e.t_started, len(e)) for e in rebuilt2) == sorted(
        (e.id_, e.t_started + t, n) for e in originals for t, n in ((0, 3), (3, 3), (6, 6)))
    for ep in rebuilt2:
        start = ep.t_started - by_id[ep.id_].t_started
        np.testing.assert_array_equal(ep.get_observations(slice(0, len(ep) + 1)),
                                      by_id[ep.id_].get_observations(slice(start, start + len(ep) + 1)))


def test_trajectory_layout_edge_cases():
    rng = np.random.default_rng(3)
    spaces = _spaces(True)
    schema = trajectory_schema(*spaces, N_ACTIONS)
    ongoing = _episode(rng, "x", 4, "cut", image=True, spaces=spaces)
    empty = ongoing.cut()  # the zero-step successor a runner keeps for the next sample call
    assert len(empty) == 0
    assert pack_trajectories([empty], schema, 0) == ({}, {})
    payload, ann = pack_trajectories([empty, ongoing, empty], schema, 1)
    assert schema.validate(payload) == 4 and [p.episode_id for p in ann["pieces"]] == ["x"]
    np.testing.assert_array_equal(ann["final_obs"][0], ongoing.get_observations(-1))
    assert not payload["terminateds"].any() and not payload["truncateds"].any()
    with pytest.raises(ConduitError, match="without its piece table"):
        rebuild_trajectories(payload, [("missing", range(4))], {})
    extra = _episode(rng, "y", 3, "terminated", image=True, spaces=spaces)
    extra.extra_model_outputs["vf_preds"] = extra.extra_model_outputs["action_logp"]
    with pytest.raises(ConduitError, match="vf_preds"):
        pack_trajectories([extra], schema, 0)
    with pytest.raises(ConduitError, match="no fixed shape"):
        trajectory_schema(gym.spaces.Dict({"a": spaces[0]}), spaces[1], N_ACTIONS)


# ------------------------------------------------------------------------------------------------
# 4. The transition layout (DQN/SAC)
# ------------------------------------------------------------------------------------------------


@HYPO
@given(data=st.data())
def test_transition_layout_n_step_rows(data):
    image = data.draw(st.booleans(), label="image")
    n_step = data.draw(st.integers(1, 4), label="n_step")
    gamma = data.draw(st.sampled_from([0.5, 0.9, 0.99, 1.0]), label="gamma")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    spaces = _spaces(image)
    pieces = []
    for i in range(data.draw(st.integers(1, 4), label="pieces")):
        n = data.draw(st.integers(1, 30), label="length")
        end = data.draw(st.sampled_from(ENDS), label="end")
        ep = _episode(rng, f"t{i}", n + 2, end, image=image, spaces=spaces)
        # a continuation piece (with a lookback step) or a whole episode
        pieces.append(ep.slice(slice(2, n + 2), len_lookback_buffer=1) if data.draw(st.booleans()) else ep[2:])
    schema = transition_schema(*spaces)
    payload = pack_transitions(pieces, schema, n_step, gamma)
    assert schema.validate(payload) == sum(len(p) for p in pieces)

    expected = []
    for p in pieces:
        n = len(p)
        obs, rew = p.get_observations(slice(0, n + 1)), p.get_rewards(slice(0, n)).astype(np.float64)
        act = p.get_actions(slice(0, n))
        for t in range(n):
            k = min(n_step, n - t)
            reaches_end = t + k == n
            expected.append({
                "obs": obs[t], "next_obs": obs[t + k], "actions": act[t],
                "rewards": sum(gamma**j * rew[t + j] for j in range(k)), "n_step": k,
                "terminateds": reaches_end and p.is_terminated, "truncateds": reaches_end and p.is_truncated,
            })
    assert len(expected) == len(payload["obs"])
    for row, want in enumerate(expected):
        np.testing.assert_array_equal(payload["obs"][row], want["obs"])
        np.testing.assert_array_equal(payload["next_obs"][row], want["next_obs"])
        assert payload["actions"][row] == want["actions"]
        assert payload["n_step"][row] == want["n_step"]
        assert bool(payload["terminateds"][row]) == want["terminateds"]
        assert bool(payload["truncateds"][row]) == want["truncateds"]
        assert payload["rewards"][row] == pytest.approx(want["rewards"], rel=1e-5, abs=1e-5)

    rebuilt = rebuild_transitions(payload, observation_space=spaces[0], action_space=spaces[1])
    assert len(rebuilt) == len(expected)
    for ep, want, row in zip(rebuilt, expected, range(len(expected)), strict=True):
        assert len(ep) == 1
        obs = ep.get_observations(slice(0, 2))
        np.testing.assert_array_equal(obs[0], want["obs"])
        np.testing.assert_array_equal(obs[1], want["next_obs"])
        assert ep.get_actions(0) == want["actions"]
        assert ep.get_rewards(0) == pytest.approx(float(payload["rewards"][row]))
        assert ep.is_terminated == want["terminateds"] and ep.is_truncated == want["truncateds"]
        assert list(ep.get_extra_model_outputs("n_step", slice(0, 1))) == [want["n_step"]]
        assert list(ep.get_extra_model_outputs("weights", slice(0, 1))) == [1.0]


@HYPO
@given(data=st.data())
def test_transition_packer_gives_full_windows_across_sample_calls(data):
    """An episode cut into pieces over several sample calls gives the transitions of the whole episode:
    every step exactly once, k = min(n_step, steps to the episode's end) - as RLlib's episode buffer,
    which joins pieces by id before it samples windows."""
    from conduit.runtime.rllib.layout import TransitionPacker

    n_step = data.draw(st.integers(1, 4), label="n_step")
    gamma = data.draw(st.sampled_from([0.5, 0.99]), label="gamma")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    spaces = _spaces(False)
    schema = transition_schema(*spaces)
    episodes, calls = [], []
    for i in range(data.draw(st.integers(1, 3), label="episodes")):
        n = data.draw(st.integers(1, 25), label="length")
        ep = _episode(rng, f"p{i}", n, data.draw(st.sampled_from(["terminated", "truncated"])), image=False,
                      spaces=spaces)
        cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=4), label="cuts"))) if n > 1 else []
        episodes.append(ep)
        calls.append(_pieces(ep, cuts, lookback=1))
    packer = TransitionPacker(schema, n_step, gamma)
    rounds = max(len(c) for c in calls)  # sample call j returns every episode's j-th piece
    out = [packer.pack([c[j] for c in calls if j < len(c)]) for j in range(rounds)]
    assert packer.flush() == {} and not packer.carries  # done episodes leave nothing behind
    got = {k: np.concatenate([o[k] for o in out if o]) for k in schema.names}
    expected = pack_transitions(episodes, schema, n_step, gamma)  # the whole episodes at once
    order = lambda cols: np.lexsort((cols["rewards"], cols["obs"][:, 0]))  # row order may differ
    a, b = order(got), order(expected)
    for k in schema.names:
        np.testing.assert_allclose(got[k][a], expected[k][b], rtol=1e-6, atol=1e-6)


def test_transition_layout_skips_empty_pieces():
    rng = np.random.default_rng(0)
    spaces = _spaces(False)
    schema = transition_schema(*spaces)
    ongoing = _episode(rng, "z", 2, "cut", image=False, spaces=spaces)
    assert pack_transitions([ongoing.cut()], schema, 3, 0.9) == {}
    payload = pack_transitions([ongoing.cut(), ongoing], schema, 3, 0.9)
    assert list(payload["n_step"]) == [2, 1]


# ------------------------------------------------------------------------------------------------
# The EnvRunner side, over a scripted sampler and a recording plane (no Ray)
# ------------------------------------------------------------------------------------------------


class _RecordingCluster:
    def __init__(self):
        self.chunks = []

    def ingest_async(self, payload, *, policy_version, chunk_id, producer, learner, t_created, annotation):
        self.chunks.append({"id": chunk_id, "payload": payload, "annotation": annotation,
                            "version": policy_version, "producer": producer, "learner": learner})
        return chunk_id


class _ScriptedSampler:
    """Stands in for SingleAgentEnvRunner: one env whose long ongoing episode each sample() continues."""

    def __init__(self, episode, fragment, *, in_evaluation=False):
        self.episode, self.pos, self.calls = episode, 0, []
        self.config = type("Cfg", (), {"in_evaluation": in_evaluation,
                                       "get_rollout_fragment_length": staticmethod(lambda i: fragment)})()
        self.worker_index, self.num_envs, self._weights_seq_no = 1, 1, 4

    def sample(self, *, num_timesteps=None, num_episodes=None, explore=None, random_actions=False,
               force_reset=False):
        n = num_timesteps or self.config.get_rollout_fragment_length(self.worker_index)
        self.calls.append(n)
        piece = self.episode.slice(slice(self.pos, self.pos + n), len_lookback_buffer=1 if self.pos else 0)
        self.pos += n
        return [piece]


def _runner(plan, sampler_episode, fragment, **kw):
    from conduit.runtime.rllib.env_runner import conduit_env_runner_class

    return conduit_env_runner_class(_ScriptedSampler, plan)(sampler_episode, fragment, **kw)


def test_env_runner_streams_ppo_sub_chunks_and_returns_a_ticket():
    from conduit.runtime.rllib.env_runner import TICKET_KEY

    plan = _plan(enable(_ppo(train_batch_size_per_learner=200).env_runners(num_env_runners=2), chunk_steps=30))
    rng = np.random.default_rng(5)
    spaces = _spaces(False)
    episode = _episode(rng, "long", 300, "cut", image=False, spaces=spaces)
    runner = _runner(plan, episode, 100)
    with pytest.raises(ConduitError, match="never attached"):
        runner.sample()
    cluster = _RecordingCluster()
    schema = trajectory_schema(*spaces, N_ACTIONS)
    runner.conduit_attach(cluster, schema, "learner0")
    out = runner.sample()
    assert runner.conduit_flush() == 100  # the sender thread has handed every chunk to the plane
    assert runner.calls == [30, 30, 30, 10]
    ids = [c["id"] for c in cluster.chunks]
    assert ids == ["r1-0", "r1-1", "r1-2", "r1-3"]
    assert all(c["version"] == 4 and c["learner"] == "learner0" and c["producer"] == "env_runner1"
               for c in cluster.chunks)
    assert len(out) == 1 and len(out[0]) == 0
    assert out[0].custom_data[TICKET_KEY] == {"runner": 1, "steps": 100, "chunks": ids, "version": 4}
    columns = {k: np.concatenate([c["payload"][k] for c in cluster.chunks]) for k in schema.names}
    rebuilt, _ = rebuild_trajectories(columns, [(c["id"], range(len(c["payload"]["obs"]))) for c in cluster.chunks],
                                      {c["id"]: c["annotation"] for c in cluster.chunks})
    assert len(rebuilt) == 1 and len(rebuilt[0]) == 100 and rebuilt[0].t_started == 0
    np.testing.assert_array_equal(rebuilt[0].get_observations(slice(0, 101)), episode.get_observations(slice(0, 101)))
    assert runner.conduit_flush() == 100


class _StuckCluster(_RecordingCluster):
    """A plane that does not answer until ``release`` is set."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def ingest_async(self, payload, **kw):
        self.release.wait(30)
        return super().ingest_async(payload, **kw)


def test_env_runner_flush_honours_its_deadline_and_loses_nothing():
    """A checkpoint's flush (``conduit_flush``) past its deadline raises FlushTimeout; the chunks stay
    with the sender, and once the plane answers a second flush finds every one of them delivered."""
    from conduit.errors import FlushTimeout

    plan = _plan(enable(_ppo(train_batch_size_per_learner=200).env_runners(num_env_runners=2), chunk_steps=30))
    spaces = _spaces(False)
    runner = _runner(plan, _episode(np.random.default_rng(8), "long", 300, "cut", image=False, spaces=spaces), 100)
    cluster = _StuckCluster()
    runner.conduit_attach(cluster, trajectory_schema(*spaces, N_ACTIONS), "learner0")
    runner.sample()
    t0 = time.monotonic()
    with pytest.raises(FlushTimeout, match="not yet sent"):
        runner.conduit_flush(timeout=0.2)
    assert time.monotonic() - t0 < 5 and cluster.chunks == []
    cluster.release.set()
    assert runner.conduit_flush(timeout=30) == 100
    assert [c["id"] for c in cluster.chunks] == ["r1-0", "r1-1", "r1-2", "r1-3"]


def test_env_runner_streams_sub_chunks_of_a_given_target_chunk_bytes():
    """enable(params={"target_chunk_bytes": ...}): the EnvRunner sizes its sub-chunks by the shared function
    (conduit.deploy_settings.stream_chunk_steps) at its layout's bytes per step, as the simulator does."""
    from conduit.deploy_settings import stream_chunk_steps

    spaces = _spaces(False)
    schema = trajectory_schema(*spaces, N_ACTIONS)
    target = 27 * schema.step_bytes  # 100 steps in sub-chunks of at most 27 steps' bytes: 4 of 25
    plan = _plan(enable(_ppo(train_batch_size_per_learner=200).env_runners(num_env_runners=2),
                        params={"target_chunk_bytes": target}))
    size = stream_chunk_steps(100, 1, schema.step_bytes, target)
    runner = _runner(plan, _episode(np.random.default_rng(7), "long", 300, "cut", image=False, spaces=spaces), 100)
    runner.conduit_attach(_RecordingCluster(), schema, "learner0")
    runner.sample()
    assert runner.conduit_flush() == 100
    assert size == 25 and runner.calls == [25, 25, 25, 25]


def test_env_runner_replay_sends_transitions_and_returns_nothing():
    plan = _plan(enable(DQNConfig().environment("CartPole-v1").training(n_step=3)))
    rng = np.random.default_rng(6)
    spaces = _spaces(False)
    runner = _runner(plan, _episode(rng, "long", 50, "cut", image=False, spaces=spaces), 3)
    cluster = _RecordingCluster()
    runner.conduit_attach(cluster, transition_schema(*spaces), "learner0")
    assert runner.sample() == [] and runner.sample() == []
    runner.conduit_flush()
    assert runner.calls == [3, 3]  # DQN's "auto" fragment is n_step env steps per call
    assert all(c["annotation"] is None for c in cluster.chunks)
    # the last n_step - 1 steps of a cut piece wait for the episode's next piece (as RLlib's episode buffer
    # joins pieces by id): every emitted transition has a full 3-step window
    assert np.concatenate([c["payload"]["n_step"] for c in cluster.chunks]).tolist() == [3, 3, 3, 3]


def test_env_runner_leaves_evaluation_alone():
    plan = _plan(enable(_ppo()))
    rng = np.random.default_rng(8)
    runner = _runner(plan, _episode(rng, "e", 20, "cut", image=False), 5, in_evaluation=True)
    out = runner.sample(num_timesteps=5)  # no plane attached: evaluation never needs one
    assert len(out) == 1 and len(out[0]) == 5


# ------------------------------------------------------------------------------------------------
# 5. StreamedGAE = RLlib's GAE
# ------------------------------------------------------------------------------------------------


def _ppo_learner(**learners):
    cfg = PPOConfig().environment("CartPole-v1").training(gamma=0.97, lambda_=0.9)
    if learners:
        cfg = cfg.learners(**learners)
    return cfg.build_learner(env=gym.make("CartPole-v1"))


def _gae_episodes():
    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    rng = np.random.default_rng(11)

    def make(eid, n, end, t0=0):
        return SingleAgentEpisode(
            id_=eid,
            observations=rng.normal(size=(n + 1, 4)).astype(np.float32),
            actions=rng.integers(0, 2, size=n),
            rewards=rng.random(n).astype(np.float32),
            infos=[{} for _ in range(n + 1)],
            extra_model_outputs={
                "action_logp": np.full(n, np.log(0.5), np.float32),
                "action_dist_inputs": rng.normal(size=(n, 2)).astype(np.float32),
                "weights_seq_no": np.zeros(n, np.int64),
            },
            terminated=end == "terminated",
            truncated=end == "truncated",
            t_started=t0,
            len_lookback_buffer=0,
            observation_space=spaces[0],
            action_space=spaces[1],
        )

    return [make("g0", 7, "terminated"), make("g1", 12, "truncated"), make("g2", 5, "cut"),
            make("g3", 9, "cut", t0=20), make("g4", 1, "terminated"), make("g5", 16, "cut", t0=3)]


def _run_pipeline(learner, episodes):
    out = learner._learner_connector(rl_module=learner.module, batch={}, episodes=copy.deepcopy(episodes),
                                     shared_data={}, metrics=None)
    batch = out[DEFAULT_MODULE_ID]
    return (np.asarray(batch[Postprocessing.ADVANTAGES].cpu().numpy()),
            np.asarray(batch[Postprocessing.VALUE_TARGETS].cpu().numpy()))


def _stream_values(learner, episodes):
    """What the ValueStream computes: each episode's o_0..o_n, concatenated in episode order."""
    module = learner.module[DEFAULT_MODULE_ID]
    with torch.no_grad():
        parts = [module.compute_values({Columns.OBS: torch.from_numpy(
            np.asarray(e.get_observations(slice(0, len(e) + 1)), np.float32))}).cpu().numpy() for e in episodes]
    return np.concatenate(parts).astype(np.float32)


def test_streamed_gae_matches_rllib_gae():
    learner = _ppo_learner()
    episodes = _gae_episodes()
    stock_adv, stock_vt = _run_pipeline(learner, episodes)
    assert len(stock_adv) == sum(len(e) + 1 for e in episodes)  # AddOneTsToEpisodesAndTruncate's extra step

    assert install_streamed_gae(learner) is True
    names = [type(p).__name__ for p in learner._learner_connector.connectors]
    assert names[-1] == "StreamedGAE" and "GeneralAdvantageEstimation" not in names
    gae = learner._cd_gae
    assert isinstance(gae, StreamedGAE) and gae.gamma == pytest.approx(0.97) and gae.lambda_ == pytest.approx(0.9)

    values = _stream_values(learner, episodes)
    gae.pending = {DEFAULT_MODULE_ID: values}
    adv, vt = _run_pipeline(learner, episodes)
    assert gae.counters == {"streamed": 1, "fallback": 0} and gae.pending is None
    np.testing.assert_allclose(adv, stock_adv, atol=1e-5)
    np.testing.assert_allclose(vt, stock_vt, atol=1e-5)

    # without pending values it is the stock pass
    adv, vt = _run_pipeline(learner, episodes)
    assert gae.counters == {"streamed": 1, "fallback": 0}
    np.testing.assert_allclose(adv, stock_adv, atol=1e-5)

    # the streamed values are the ones used (shifted values change the value targets)
    gae.pending = {DEFAULT_MODULE_ID: values + 1.0}
    _, shifted_vt = _run_pipeline(learner, episodes)
    assert gae.counters["streamed"] == 2
    assert not np.allclose(shifted_vt, stock_vt, atol=1e-3)


def test_streamed_gae_falls_back_on_a_batch_of_the_wrong_length():
    learner = _ppo_learner()
    episodes = _gae_episodes()
    stock_adv, stock_vt = _run_pipeline(learner, episodes)
    assert install_streamed_gae(learner)
    values = _stream_values(learner, episodes)
    learner._cd_gae.pending = {DEFAULT_MODULE_ID: values[:-1]}
    adv, vt = _run_pipeline(learner, episodes)
    assert learner._cd_gae.counters == {"streamed": 0, "fallback": 1}
    np.testing.assert_allclose(adv, stock_adv, atol=1e-5)
    np.testing.assert_allclose(vt, stock_vt, atol=1e-5)


class PassThrough(ConnectorV2):
    """A user's learner connector piece that changes nothing."""

    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        return batch


def test_streamed_gae_is_not_installed_over_a_custom_learner_connector():
    learner = _ppo_learner(learner_connector=lambda obs_space, act_space: PassThrough())
    before = [type(p).__name__ for p in learner._learner_connector.connectors]
    assert "PassThrough" in before and "GeneralAdvantageEstimation" in before
    assert install_streamed_gae(learner) is False
    assert [type(p).__name__ for p in learner._learner_connector.connectors] == before
    assert not hasattr(learner, "_cd_gae")

    class NoPipeline:
        _learner_connector = None

    assert install_streamed_gae(NoPipeline()) is False


# ------------------------------------------------------------------------------------------------
# 6. Importance weights reach DQN's loss as RLlib's connector would put them there
# ------------------------------------------------------------------------------------------------


def test_replay_importance_weights_reach_the_train_batch_as_rllib_builds_it():
    """A DQN learner's stock connector, fed the one-step episodes rebuilt with per-row weights (as
    RLlib's prioritized buffer returns them), builds the same ``weights`` column as DirectReplay; the
    weights in the train batch are the plane's, not 1; with other weights the batches differ."""
    from conduit.runtime.rllib.delivery import DirectReplay

    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    learner = DQNConfig().environment("CartPole-v1").build_learner(env=env)
    rng = np.random.default_rng(5)
    ep = SingleAgentEpisode(id_="w", observations=rng.normal(size=(13, 4)).astype(np.float32),
                            actions=rng.integers(0, 2, size=12), rewards=np.ones(12, np.float32),
                            infos=[{} for _ in range(13)], terminated=True, len_lookback_buffer=0,
                            observation_space=spaces[0], action_space=spaces[1])
    payload = pack_transitions([ep], transition_schema(*spaces), 1, 0.99)
    weights = rng.uniform(0.1, 1.0, len(payload["obs"]))
    episodes = rebuild_transitions(payload, weights=weights, observation_space=spaces[0], action_space=spaces[1])
    assert [e.get_extra_model_outputs("weights", slice(0, 1))[0] for e in episodes] == pytest.approx(weights)
    direct = DirectReplay()
    assert direct.verify(learner, payload, weights, episodes), direct.reason
    batch = direct.train_data(payload, weights).batch.policy_batches[DEFAULT_MODULE_ID]
    np.testing.assert_allclose(np.asarray(batch["weights"], np.float64), weights, rtol=1e-6)
    other = DirectReplay()
    assert not other.verify(learner, payload, np.ones_like(weights), episodes)
    assert "weights" in other.reason


def test_enable_keeps_rllibs_recording_runner_for_offline_output(tmp_path):
    """``offline_data(output=...)`` makes RLlib sample with its recording ``OfflineSingleAgentEnvRunner``
    (when ``env_runner_cls`` is unset); the Conduit runner must extend that one, or the recording would
    silently stop. PPO then streams one chunk per sample call, so the recorded episodes are cut as in
    stock RLlib; a smaller ``chunk_steps`` is refused."""
    from ray.rllib.offline.offline_env_runner import OfflineSingleAgentEnvRunner

    original = _ppo(train_batch_size_per_learner=400).env_runners(num_env_runners=2).offline_data(
        output=f"local://{tmp_path}", output_write_episodes=True)
    cfg = enable(original)
    assert issubclass(cfg.env_runner_cls, OfflineSingleAgentEnvRunner)
    assert _plan(cfg).chunk_steps == 200  # a whole fragment per chunk
    assert not issubclass(enable(_ppo()).env_runner_cls, OfflineSingleAgentEnvRunner)
    dqn = enable(DQNConfig().environment("CartPole-v1").offline_data(output=f"local://{tmp_path}"))
    assert issubclass(dqn.env_runner_cls, OfflineSingleAgentEnvRunner)
    with pytest.raises(EnableError, match="chunk_steps=50 with offline_data"):
        enable(original, chunk_steps=50)
