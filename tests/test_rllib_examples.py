"""RLlib's own bundled single-agent example scripts under ``enable()``: they train with 0 violations or
are refused at ``enable()`` with an ``EnableError`` naming the setting.

Each case builds its config the way its script does (``ray/rllib/examples/<script>`` in the ray 2.60
wheel). The scripts build their config under ``if __name__ == "__main__"``, so the config is
reproduced here line by line, with the script's own argument defaults (``module.parser.parse_args([])``)
and the classes, envs and callbacks imported from the example modules. The settings RLlib's
``run_rllib_example_script_experiment`` applies from those arguments (``num_envs_per_env_runner``)
are applied as it does; then the run is made tiny: one EnvRunner with half a CPU, a small train
batch, one epoch, two iterations.

Running cases check, every iteration and at shutdown: 0 violations, every sampled step ingested
and delivered once (nothing dropped), and what the case is about (the example's own ``LRChecker``
callback asserts the scheduled learning rate each iteration; the custom learner class is the one
training; vectorized rounds vary in size and are trained whole).

The fast subset (the vectorization crash of issue 15, a custom loss, a mean-std filter with 20
vectorized envs, and every refusal) runs in ``make test``; the rest is ``@pytest.mark.e2e``. The
table in ``docs/rllib.md`` lists the outcome per script.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"  # before any Ray process starts

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'conduit-rl[rllib]')")

from conduit.runtime.rllib import EnableError, enable, shutdown

pytestmark = pytest.mark.slow


def _example(path: str):
    """An example module of the installed ray wheel, and its script's default arguments."""
    mod = importlib.import_module(f"ray.rllib.examples.{path.removesuffix('.py').replace('/', '.')}")
    return mod, mod.parser.parse_args([])


def _script_args(cfg, args):
    """What ``ray.rllib.examples.utils.run_rllib_example_script_experiment`` applies from the arguments."""
    if args.num_envs_per_env_runner is not None:
        cfg.env_runners(num_envs_per_env_runner=args.num_envs_per_env_runner)
    return cfg


def _tiny(cfg, batch: int = 240):
    return (cfg.env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
            .training(train_batch_size_per_learner=batch, minibatch_size=60, num_epochs=1)
            .debugging(seed=0))


# ------------------------------------------------------------------------ the scripts' configs
def async_gym_env_vectorization(mode: str = "async"):
    """envs/async_gym_env_vectorization.py: PPO on a slow CartPole, 6 vectorized envs (the crash of issue 15)."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.tune import register_env

    mod, args = _example("envs/async_gym_env_vectorization.py")
    import gymnasium as gym

    register_env("slow-env", lambda cfg: mod.SlowEnv(gym.make(args.env, **cfg)))
    cfg = PPOConfig().environment("slow-env").env_runners(gym_env_vectorize_mode=mode)
    assert args.num_envs_per_env_runner == 6
    return _tiny(_script_args(cfg, args))


def custom_gym_env():
    """envs/custom_gym_env.py: a custom gymnasium env class (SimpleCorridor), PPO."""
    from ray.tune.registry import get_trainable_cls

    mod, args = _example("envs/custom_gym_env.py")
    cfg = get_trainable_cls(args.algo).get_default_config().environment(
        mod.SimpleCorridor, env_config={"corridor_length": args.corridor_length})
    return _tiny(_script_args(cfg, args))


def ppo_with_custom_loss_fn():
    """learners/ppo_with_custom_loss_fn.py: a custom Learner class adding a weight regularizer to the loss."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.examples.learners.classes.custom_ppo_loss_fn_learner import (
        PPOTorchLearnerWithWeightRegularizerLoss,
    )

    _, args = _example("learners/ppo_with_custom_loss_fn.py")
    cfg = (PPOConfig().environment("CartPole-v1")
           .training(learner_class=PPOTorchLearnerWithWeightRegularizerLoss,
                     learner_config_dict={"regularizer_coeff": args.regularizer_coeff}, num_epochs=6,
                     vf_loss_coeff=0.01, lr=args.lr)
           .rl_module(model_config=DefaultModelConfig(vf_share_layers=True)))
    return _tiny(_script_args(cfg, args))


def separate_vf_lr_and_optimizer():
    """learners/separate_vf_lr_and_optimizer.py: a custom Learner with its own value-function optimizer."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.examples.learners.classes.separate_vf_lr_and_optimizer_learner import (
        PPOTorchLearnerWithSeparateVfOptimizer,
    )

    _, args = _example("learners/separate_vf_lr_and_optimizer.py")
    cfg = (PPOConfig().environment("CartPole-v1")
           .training(learner_class=PPOTorchLearnerWithSeparateVfOptimizer, learner_config_dict={"lr_vf": args.lr_vf},
                     num_epochs=6, vf_loss_coeff=1.0, lr=args.lr_policy)
           .rl_module(model_config=DefaultModelConfig(vf_share_layers=False)))
    return _tiny(_script_args(cfg, args))


def ppo_with_torch_lr_schedulers():
    """learners/ppo_with_torch_lr_schedulers.py: torch LR schedulers, parallel evaluation, and the
    script's ``LRChecker`` callback, which asserts the scheduled learning rate every iteration."""
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    mod, args = _example("learners/ppo_with_torch_lr_schedulers.py")
    cfg = (PPOConfig().environment("CartPole-v1")
           .training(lr=0.03, num_epochs=6, vf_loss_coeff=0.01)  # the script's num_sgd_iter=6 (its old name)
           .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
                                                      vf_share_layers=True))
           .evaluation(evaluation_num_env_runners=1, evaluation_interval=1, evaluation_parallel_to_training=True,
                       evaluation_config=PPOConfig.overrides(exploration=False))
           .experimental(_torch_lr_scheduler_classes=[
               functools.partial(torch.optim.lr_scheduler.ConstantLR, factor=args.lr_const_factor,
                                 total_iters=args.lr_const_iters),
               functools.partial(torch.optim.lr_scheduler.ExponentialLR, gamma=args.lr_exp_decay)])
           .callbacks(mod.LRChecker))
    return _tiny(_script_args(cfg, args))


def mean_std_filtering():
    """connectors/mean_std_filtering.py: a MeanStdFilter env-to-module connector (it writes the filtered
    observations into the episodes), Pendulum with lopsided observations, 20 vectorized envs."""
    import gymnasium as gym
    import torch
    from ray.rllib.connectors.env_to_module.mean_std_filter import MeanStdFilter
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.tune.registry import get_trainable_cls, register_env

    mod, args = _example("connectors/mean_std_filtering.py")
    register_env("lopsided-pend", lambda _: mod.LopsidedObs(gym.make("Pendulum-v1")))
    cfg = (get_trainable_cls(args.algo).get_default_config().environment("lopsided-pend")
           .env_runners(num_envs_per_env_runner=20,
                        env_to_module_connector=lambda env, spaces, device: MeanStdFilter(multi_agent=False))
           .training(train_batch_size_per_learner=512, gamma=0.95, lr=0.0003, vf_loss_coeff=0.01)
           .rl_module(model_config=DefaultModelConfig(
               fcnet_activation="relu", fcnet_kernel_initializer=torch.nn.init.xavier_uniform_,
               fcnet_bias_initializer=torch.nn.init.constant_, fcnet_bias_initializer_kwargs={"val": 0.0})))
    cfg.training(minibatch_size=64, lambda_=0.1, vf_clip_param=10.0)  # the script's PPO branch
    return _tiny(_script_args(cfg, args), batch=400)


def flatten_observations_dict_space():
    """connectors/flatten_observations_dict_space.py: FlattenObservations over a Dict observation space."""
    from ray.rllib.connectors.env_to_module import FlattenObservations
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.examples.envs.classes.cartpole_with_dict_observation_space import (
        CartPoleWithDictObservationSpace,
    )
    from ray.tune.registry import get_trainable_cls, register_env

    _, args = _example("connectors/flatten_observations_dict_space.py")
    register_env("env", lambda _: CartPoleWithDictObservationSpace())
    cfg = (get_trainable_cls(args.algo).get_default_config().environment("env")
           .env_runners(env_to_module_connector=lambda env, spaces, device: FlattenObservations(multi_agent=False))
           .training(gamma=0.99, lr=0.0003)
           .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
                                                      vf_share_layers=True)))
    return _tiny(_script_args(cfg, args))


# ---------------------------------------------------------------------------------- refused
def frame_stacking():
    """connectors/frame_stacking.py: FrameStackingEnvToModule + FrameStackingLearner (Atari)."""
    from ray.rllib.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
    from ray.rllib.connectors.learner.frame_stacking import FrameStackingLearner
    from ray.tune.registry import get_trainable_cls

    _, args = _example("connectors/frame_stacking.py")
    cfg = (get_trainable_cls(args.algo).get_default_config()
           .environment("atari-env", env_config={"frameskip": 1, "full_action_space": False,
                                                 "repeat_action_probability": 0.0}, clip_rewards=True)
           .env_runners(env_to_module_connector=lambda env, spaces, device: FrameStackingEnvToModule(
               num_frames=args.num_frames, multi_agent=False), num_envs_per_env_runner=2)
           .training(learner_connector=lambda obs, act: FrameStackingLearner(num_frames=args.num_frames,
                                                                             multi_agent=False),
                     entropy_coeff=0.01, lr=0.00015, grad_clip=100.0, grad_clip_by="global_norm"))
    return _script_args(cfg, args)


def prev_actions_prev_rewards():
    """connectors/prev_actions_prev_rewards.py: PrevActionsPrevRewards connectors and an LSTM."""
    from ray.rllib.connectors.env_to_module import FlattenObservations, PrevActionsPrevRewards
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.tune.registry import get_trainable_cls

    _, args = _example("connectors/prev_actions_prev_rewards.py")
    cfg = (get_trainable_cls(args.algo).get_default_config().environment("CartPole-v1")
           .env_runners(env_to_module_connector=lambda env, spaces, device: [
               PrevActionsPrevRewards(n_prev_rewards=args.n_prev_rewards, n_prev_actions=args.n_prev_actions),
               FlattenObservations()])
           .rl_module(model_config=DefaultModelConfig(use_lstm=True, max_seq_len=20, lstm_cell_size=32)))
    return _script_args(cfg, args)


def custom_lstm_rl_module():
    """rl_modules/custom_lstm_rl_module.py: a custom stateful RLModule (LSTMContainingRLModule)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.examples.rl_modules.classes.lstm_containing_rlm import LSTMContainingRLModule
    from ray.tune.registry import get_trainable_cls

    _, args = _example("rl_modules/custom_lstm_rl_module.py")
    cfg = (get_trainable_cls(args.algo).get_default_config().environment("CartPole-v1")
           .rl_module(rl_module_spec=RLModuleSpec(module_class=LSTMContainingRLModule,
                                                  model_config={"lstm_cell_size": 256, "dense_layers": [256, 256],
                                                                "max_seq_len": 20})))
    return _script_args(cfg, args)


def multi_agent_cartpole():
    """multi_agent/multi_agent_cartpole.py: two policies (multi-agent)."""
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole
    from ray.tune.registry import get_trainable_cls, register_env

    _, args = _example("multi_agent/multi_agent_cartpole.py")
    register_env("env", lambda _: MultiAgentCartPole(config={"num_agents": 2}))
    return (get_trainable_cls(args.algo).get_default_config().environment("env")
            .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda aid, *a, **kw: f"p{aid}"))


@dataclass(frozen=True)
class Case:
    script: str
    build: Callable
    refused: str | None = None  # a regex the EnableError must match (it names the setting)
    fast: bool = False


CASES = {
    "async_vectorization": Case("envs/async_gym_env_vectorization.py", async_gym_env_vectorization, fast=True),
    "sync_vectorization": Case("envs/async_gym_env_vectorization.py --vectorize-mode=sync",
                               functools.partial(async_gym_env_vectorization, "sync")),
    "custom_gym_env": Case("envs/custom_gym_env.py", custom_gym_env),
    "custom_loss_fn": Case("learners/ppo_with_custom_loss_fn.py", ppo_with_custom_loss_fn),
    "separate_vf_optimizer": Case("learners/separate_vf_lr_and_optimizer.py", separate_vf_lr_and_optimizer),
    "torch_lr_schedulers": Case("learners/ppo_with_torch_lr_schedulers.py", ppo_with_torch_lr_schedulers),
    "mean_std_filter": Case("connectors/mean_std_filtering.py", mean_std_filtering, fast=True),
    "flatten_dict_obs": Case("connectors/flatten_observations_dict_space.py", flatten_observations_dict_space),
    "frame_stacking": Case("connectors/frame_stacking.py", frame_stacking, refused=r"learner_connector"),
    "prev_actions_prev_rewards": Case("connectors/prev_actions_prev_rewards.py", prev_actions_prev_rewards,
                                      refused=r"use_lstm"),
    "custom_lstm_rl_module": Case("rl_modules/custom_lstm_rl_module.py", custom_lstm_rl_module,
                                  refused=r"LSTMContainingRLModule defines get_initial_state"),
    "multi_agent_cartpole": Case("multi_agent/multi_agent_cartpole.py", multi_agent_cartpole,
                                 refused=r"multi-agent configs are not supported"),
}


def _params(refused: bool):
    out = []
    for name, case in sorted(CASES.items()):
        if (case.refused is not None) != refused:
            continue
        marks = [] if case.fast or refused else [pytest.mark.e2e]
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("name", _params(refused=True))
def test_example_is_refused_naming_the_setting(name):
    case = CASES[name]
    with pytest.raises(EnableError, match=case.refused):
        enable(case.build())


@pytest.mark.parametrize("name", _params(refused=False))
def test_example_trains_with_zero_violations(local_ray, name):
    cfg = CASES[name].build()
    algo = enable(cfg).build_algo()
    results = []
    try:
        learner_cls = type(algo.learner_group._learner) if algo.learner_group.is_local else None
        for _ in range(2):
            results.append(algo.train())
    finally:
        algo.stop()
        final = shutdown(algo)
    for r in results:
        assert r["conduit"]["violations"] == 0, r["conduit"]["audit"]["examples"]
    assert final["violations"] == 0 and final["finished"], final
    sampled = results[-1]["env_runners"]["num_env_steps_sampled_lifetime"]
    # every sampled step reached the plane and was trained on once; nothing dropped
    assert final["ingested_samples"] == final["delivered_samples"] == sampled, final
    assert sum(final["dropped_samples"].values()) == 0
    assert final["updates_consumed"] == 2
    if cfg.learner_class.__name__.startswith("Conduit") and learner_cls is not None:
        assert issubclass(learner_cls, cfg.learner_class)
    if cfg.num_envs_per_env_runner > 1:  # vectorized: a round samples up to num_envs - 1 steps more per call
        assert sampled >= 2 * results[-1]["conduit"]["batch_steps"]
