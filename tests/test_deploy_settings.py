"""What ``enable()`` takes from a policy's parameters, and that the runtime and the simulator agree.

:mod:`conduit.deploy_settings` is the one place PPO's stream chunk size and the prefetch depth are
computed: the runtime's plan/EnvRunner and the simulator's deployed model both call it. These tests
check the function's properties, that a given ``target_chunk_bytes``/``depth`` (``params`` or a
``params_file``) changes both sides the same way, and that a policy's defaults leave enable()'s own
defaults in force on both.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim import tiny_topology_dict

from conduit.deploy_settings import DEFAULT_STREAM_PIECES, prefetch_depth, stream_chunk_steps
from conduit.registry import create_policy
from conduit.sim.deployed import deployed_prefetch_depth, deployed_stream_pieces
from conduit.sim.engine import Simulation
from conduit.sim.workload import load_workload
from conduit.topology import topology_from_dict


# ------------------------------------------------------------------ the shared function
@settings(max_examples=200, deadline=None)
@given(fragment=st.integers(1, 20_000), envs=st.integers(1, 16), step=st.floats(1.0, 1e6),
       target=st.one_of(st.none(), st.floats(1e3, 1e9)))
def test_stream_chunk_steps_is_a_whole_vector_step_within_the_fragment(fragment, envs, step, target):
    fragment *= envs  # a sample call returns whole vector steps
    chunk = stream_chunk_steps(fragment, envs, step, target)
    assert 1 <= chunk <= fragment
    assert chunk % envs == 0 or chunk == fragment
    pieces = math.ceil(fragment / chunk)
    if target is None:  # enable()'s default: about an eighth of the fragment
        assert pieces <= DEFAULT_STREAM_PIECES
    elif chunk > envs:  # each sub-chunk within the target unless a vector step alone is larger
        assert (chunk - envs) * step < target


@given(fragment=st.integers(1, 5000), explicit=st.integers(1, 5000))
def test_an_explicit_chunk_steps_wins(fragment, explicit):
    assert stream_chunk_steps(fragment, 1, 100.0, 1e6, chunk_steps=explicit) == explicit


def test_prefetch_depth_option_then_given_depth_then_the_family_default():
    assert prefetch_depth("replay", prioritized=True) == 1
    assert prefetch_depth("replay", prioritized=False) == 2
    assert prefetch_depth("on_policy") == prefetch_depth("async") == 1
    assert prefetch_depth("replay", True, depth=3) == 3
    assert prefetch_depth("replay", True, option=0, depth=3) == 0


def test_create_policy_records_the_given_parameters():
    assert create_policy("conduit").given == frozenset()
    assert create_policy("conduit", depth=3, target_chunk_bytes="2 MB").given == {"depth", "target_chunk_bytes"}


# ------------------------------------------------------------------ the simulator's deployed model
def _ppo(**fields):
    return load_workload({"base": "ppo", **fields})


def test_the_simulator_streams_what_the_runtime_computes():
    wl = _ppo(fragment_length=1000, envs_per_runner=1, bytes_per_step=28_224)
    default = create_policy("conduit")  # defaults: enable()'s eighth of a fragment
    assert deployed_stream_pieces(wl, default) == DEFAULT_STREAM_PIECES
    tuned = create_policy("conduit", target_chunk_bytes=2e6)
    chunk = stream_chunk_steps(1000, 1, 28_224, 2e6)
    assert deployed_stream_pieces(wl, tuned) == math.ceil(1000 / chunk) == 15
    # the same default value, given: it counts (28 MB fragments in 8 MB sub-chunks: 4)
    assert deployed_stream_pieces(wl, create_policy("conduit", target_chunk_bytes=8e6)) == 4


def test_a_simulation_uses_the_given_chunk_size():
    topo = topology_from_dict(tiny_topology_dict(nodes=1, gpus=1))
    wl = _ppo(fragment_length=64, envs_per_runner=1, bytes_per_step=1000, train_batch_per_learner=128,
              env_runners=2, learners=1)
    default = Simulation(topo, wl, create_policy("conduit"), iterations=1)
    tuned = Simulation(topo, wl, create_policy("conduit", target_chunk_bytes=16_000), iterations=1)
    fragment = default.workload.fragment_length * DEFAULT_STREAM_PIECES  # the fragment before it was cut
    assert default.workload.fragment_length == fragment // DEFAULT_STREAM_PIECES
    assert tuned.workload.fragment_length == stream_chunk_steps(fragment, 1, 1000, 16_000)


def test_the_simulators_prefetch_depth_follows_a_given_depth():
    assert deployed_prefetch_depth(create_policy("conduit")) == prefetch_depth("replay")
    assert deployed_prefetch_depth(create_policy("conduit", depth=4)) == 4
    assert deployed_prefetch_depth(create_policy("conduit"), family="async") == prefetch_depth("async") == 1
    assert deployed_prefetch_depth(create_policy("conduit", depth=0), family="async") == 0


# ------------------------------------------------------------------ the runtime (plan + EnvRunner's size)
def _tuned_file(tmp_path, **params):
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"policy": "conduit", "params": params}))
    return str(path)


@pytest.mark.parametrize("given_by", ["params", "params_file"])
def test_enable_honours_a_given_target_chunk_bytes_and_depth(tmp_path, given_by):
    pytest.importorskip("ray.rllib")
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.ppo import PPOConfig

    from conduit.runtime.rllib import enable

    params = {"target_chunk_bytes": 2e6, "depth": 3}
    opts = {"params": params} if given_by == "params" else {"params_file": _tuned_file(tmp_path, **params)}
    ppo = PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2).training(train_batch_size=2000)
    plan = enable(ppo, **opts).learner_class.conduit_plan
    # the EnvRunner's size for its fragment at its layout's bytes per step: the shared function's
    assert plan.stream_chunk_steps(1000, 1, 28_224) == stream_chunk_steps(1000, 1, 28_224, 2e6) == 67
    assert plan.options["prefetch_depth"] == 3
    # the policy's defaults: enable()'s own (an eighth of the fragment, one batch ahead)
    default = enable(ppo).learner_class.conduit_plan
    assert default.stream_chunk_steps(1000, 1, 28_224) == default.chunk_steps == stream_chunk_steps(1000, 1) == 125
    assert default.options["prefetch_depth"] == 1
    # an explicit chunk_steps / prefetch_depth wins over the policy's
    mine = enable(ppo, chunk_steps=50, prefetch_depth=0, **opts).learner_class.conduit_plan
    assert mine.stream_chunk_steps(1000, 1, 28_224) == 50 and mine.options["prefetch_depth"] == 0
    dqn = enable(DQNConfig().environment("CartPole-v1"), **opts).learner_class.conduit_plan
    assert dqn.options["prefetch_depth"] == 3
    assert enable(DQNConfig().environment("CartPole-v1")).learner_class.conduit_plan.options["prefetch_depth"] == 1


def test_tunes_defaults_are_the_policy_with_nothing_given():
    """``conduit tune`` predicts its defaults as enable() deploys them without params (nothing given), so its
    predicted gain compares the same two deployments the tuning loop runs for real."""
    from conduit.sim.tune import tune

    topo = topology_from_dict(tiny_topology_dict(nodes=1, gpus=1))
    # a 1 MB fragment: the default 8 MB target, if given, would stream it whole instead of in eighths
    wl = _ppo(fragment_length=64, envs_per_runner=1, bytes_per_step=16_000, train_batch_per_learner=128,
              env_runners=2, learners=1)
    result = tune(topo, wl, "conduit", budget=1, iterations=2, seed=0)
    plain = Simulation(topo, wl, create_policy("conduit"), iterations=2, seed=0).run()
    given = Simulation(topo, wl, create_policy("conduit", **result.default_params), iterations=2, seed=0).run()
    assert result.default_metrics["iteration_time_s"] == pytest.approx(plain.metrics["iteration_time_s"])
    assert given.metrics["iteration_time_s"] != pytest.approx(plain.metrics["iteration_time_s"])
