"""``conduit calibrate``'s workload primitives (:func:`conduit.runtime.calibrate.measure_workload_primitives`):
the per-item sweep and its fit, the JSON they are written as, and one real (quick) measurement of a
CartPole PPO config's EnvRunner and RLModule."""

from __future__ import annotations

import json
import math
import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.runtime import calibrate as cal
from conduit.runtime.calibrate import TEAM_GAPS


@settings(max_examples=5, deadline=None)
@given(per_item=st.integers(1, 8), fixed=st.integers(0, 64))
def test_item_sweep_fits_per_call_and_per_item_cost_of_work(per_item, fixed):
    """Work whose CPU cost is ``fixed + n * per_item`` units: the fit's rate and latency keep that ratio."""
    def spin(units: int) -> None:
        x = 0
        for i in range(units * 500):
            x += i

    m = cal._item_sweep("spin", "steps", lambda n: spin(fixed + n * per_item), [4, 16, 64], 0.0, 3, 3, "test")
    assert m.ok and m.unit == "steps" and m.samples == 9
    assert len(m.medians) == 3 and len(m.extra["wall_medians"]) == 3
    unit_s = m.per_item / per_item  # seconds per unit of work, from the slope
    assert unit_s > 0
    # the intercept is the fixed work (noisy on a shared machine: within half the largest point's time)
    assert m.latency == pytest.approx(fixed * unit_s, abs=0.5 * m.medians[-1])


def test_workload_measurement_json_round_trips_and_says_when_not_measured():
    ok = cal.WorkloadMeasurement("env_runner:x", 1000.0, 2e-3, 9, "note", [4, 16], [0.006, 0.018],
                                 unit="steps", extra={"bytes_per_step": 150.0})
    d = json.loads(json.dumps(ok.to_dict()))
    assert d["per_item"] == pytest.approx(1e-3) and d["latency"] == 2e-3 and d["unit"] == "steps"
    assert d["extra"]["bytes_per_step"] == 150.0
    bad = cal.WorkloadMeasurement("learner_update:x", math.nan, math.nan, 0, "TypeError: no")
    assert not bad.ok and "not measured" in bad.summary()
    assert json.loads(json.dumps(bad.to_dict()))["per_item"] is None


def test_to_json_carries_the_workload_primitives_next_to_the_machine():
    ms = cal.Measurements(host={"cores": 2})
    ms["memcpy"] = cal.Measurement("memcpy", 1e10, 1e-6, 3)
    ms.workload = {"weights:x": cal.WorkloadMeasurement("weights:x", 1000.0, 1e-3, 3, unit="calls")}
    data = json.loads(cal.to_json(ms))
    assert set(data) == {"host", "measurements", "workload"}
    assert data["workload"]["weights:x"]["latency"] == 1e-3
    assert "workload" not in json.loads(cal.to_json(cal.Measurements(host={})))


def test_cartpole_ppo_primitives_are_measured_with_one_torch_thread():
    pytest.importorskip("ray.rllib")
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig

    threads = torch.get_num_threads()
    out = cal.measure_workload_primitives({"ppo-cartpole": ("ppo", PPOConfig().environment("CartPole-v1"))},
                                          quick=True)
    assert torch.get_num_threads() == threads  # restored
    assert all(m.extra.get("ray_attached") is True for m in out.values())  # timed with Ray up, as a run's pieces
    assert set(out) == {"env_runner:ppo-cartpole", "learner_update:ppo-cartpole", "value_pass:ppo-cartpole",
                        "weights:ppo-cartpole", "learner_update_proxy:ppo-cartpole",
                        "learner_update_call:ppo-cartpole",
                        "gae_connector:ppo-cartpole",  # the GAE piece inside the learner's own pipeline
                        "gae_streamed:ppo-cartpole",  # Conduit's StreamedGAE on that piece's input and values
                        "batch_connector:ppo-cartpole",  # the connector's pieces before NumpyToTensor (c)
                        "learner_update_local:ppo-cartpole",  # num_learners=0: also with the driver's threads
                        "learner_update_call_local:ppo-cartpole", "gae_connector_local:ppo-cartpole",
                        "gae_streamed_local:ppo-cartpole", "batch_connector_local:ppo-cartpole",
                        "torch_team:ppo-cartpole",  # what the driver's extra torch threads cost the node
                        "runner_metrics:ppo-cartpole"}  # the rest of the remote sample call: get_metrics()
    assert "get_metrics" in out["runner_metrics:ppo-cartpole"].note and out["runner_metrics:ppo-cartpole"].latency > 0
    team = out.pop("torch_team:ppo-cartpole")
    if (os.cpu_count() or 1) < 2:  # one core: one torch thread, no team, and the reason says so
        assert not team.ok and "one torch thread" in team.note
    else:
        assert team.ok and team.unit == "regions" and team.extra["workers"] == team.extra["torch_threads"] - 1
        assert 0 < team.latency < TEAM_GAPS[0]  # a spin, shorter than the idle gap it was timed in
        assert 0 <= team.extra["update_share"] <= 1.05 and 0 <= team.extra["short_gap_share"] <= 1.05
        # a weight sync's set_state on the driver's local EnvRunner: a parallel copy, then the same spin
        assert 0 < team.extra["sync_spin_s"] < TEAM_GAPS[0]
    # the whole call as PPO.training_step makes it: the config's minibatch size and all its epochs
    call = out["learner_update_call:ppo-cartpole"]
    assert call.extra["epochs_timed"] == 30 and call.extra["minibatch_size"] == 128
    assert set(call.sizes) == {128, 256} and call.per_item > 0  # quick: 1 and 2 minibatches
    # each timed on fresh episodes, fitted through the largest size (the train batch, where the workload runs)
    gae = out["gae_connector:ppo-cartpole"]
    assert "GeneralAdvantageEstimation" in gae.note and "fresh episodes" in call.note
    assert gae.sizes == call.sizes and gae.per_item > 0 and gae.samples == call.samples == 4
    assert call.extra["fit_anchor"] == gae.extra["fit_anchor"] == "largest"
    # the episodes come from an EnvRunner actor while this process waits, as a real run's learner gets them
    assert all("EnvRunner actor" in m.extra["episodes_from"] for m in (call, gae))
    # each call at the anchor: its page faults and system time, and the memory the VM reported before it
    # (None where this kernel does not say: conduit.runtime.pagereport)
    memory = gae.extra["memory"]
    assert len(memory["calls"]) == 2 and all(c["faults"] >= 0 and c["system_s"] >= 0 for c in memory["calls"])
    assert all((c["reported_mb_before"] is None) == (not memory["page_reporting"]) for c in memory["calls"])
    # what enable() leaves for update start: the runtime's StreamedGAE given the values, timed on the same
    # inputs; less than the whole piece (its value pass is what the stream does ahead of time)
    streamed = out["gae_streamed:ppo-cartpole"]
    assert "StreamedGAE" in streamed.note and streamed.sizes == gae.sizes and streamed.samples == gae.samples
    top = max(gae.sizes)
    assert 0 < streamed.latency + top * streamed.per_item < gae.latency + top * gae.per_item
    # the connector up to NumpyToTensor in the same rounds: each round at the train batch with the seconds the
    # process sat idle since the previous round's update returned (the episodes sampled meanwhile in the actor)
    connector = out["batch_connector:ppo-cartpole"]
    assert "NumpyToTensor" in connector.note and connector.sizes == gae.sizes and connector.samples == gae.samples
    assert connector.per_item > 0 and connector.extra["fit_anchor"] == "largest"
    rounds = connector.extra["rounds"]
    assert len(rounds) == 2 and all(r["wall_s"] > 0 and r["cpu_s"] >= 0 and r["idle_s"] > 0 for r in rounds)
    assert len(out["batch_connector_local:ppo-cartpole"].extra["rounds"]) == 2  # the local twin keeps its rounds
    assert out["gae_streamed_local:ppo-cartpole"].extra["fit_anchor"] == "largest"
    assert out["gae_connector_local:ppo-cartpole"].extra["fit_anchor"] == "largest"
    assert "EnvRunner actor" in out["gae_connector_local:ppo-cartpole"].extra["episodes_from"]
    assert len(out["gae_connector_local:ppo-cartpole"].extra["memory"]["calls"]) == 2
    assert out["learner_update_call_local:ppo-cartpole"].extra["epochs_timed"] == 30
    assert out["learner_update_local:ppo-cartpole"].extra["load_average"]  # wall clock: the load is recorded
    # RLlib's own PPOTorchLearner.update replaces the proxy (forward_train + a sum of its outputs)
    assert "PPOTorchLearner.update" in out["learner_update:ppo-cartpole"].note
    assert "forward_train" in out["learner_update_proxy:ppo-cartpole"].note
    assert all(m.ok for m in out.values()), {k: m.note for k, m in out.items()}
    runner = out["env_runner:ppo-cartpole"]
    assert runner.unit == "steps" and runner.per_item > 0
    # CartPole: 4 float32 observations and a few scalars per step; a random policy's episodes are short
    assert 16 < runner.extra["bytes_per_step"] < 4096
    # read at the largest size (the sample() a runner makes), and less than at the smallest, whose few steps
    # carry each episode piece's final observation and framing
    by_size = runner.extra["bytes_per_step_by_size"]
    assert set(by_size) == {str(n) for n in runner.sizes}
    assert runner.extra["bytes_per_step"] == pytest.approx(by_size[str(max(runner.sizes))], rel=1e-3)
    assert by_size[str(max(runner.sizes))] < by_size[str(min(runner.sizes))]
    assert runner.extra["episodes_done"] == 0 or 8 <= runner.extra["episode_length"] <= 500
    weights = out["weights:ppo-cartpole"]
    assert weights.extra["state_bytes"] > 0
    # the sync's two ends apart (the learner's get_state, an EnvRunner's set_state): medians of the same calls
    assert weights.extra["get_s"] > 0 and weights.extra["set_s"] > 0
    assert weights.extra["get_s"] + weights.extra["set_s"] <= 3 * max(weights.medians)


@pytest.mark.e2e
def test_dqn_learner_and_driver_primitives_are_measured_on_the_configs_own_buffer():
    pytest.importorskip("ray.rllib")
    from ray.rllib.algorithms.dqn import DQNConfig

    out = {m.name: m for m in cal.measure_learner("d", "dqn", DQNConfig().environment("CartPole-v1"), quick=True)}
    assert set(out) == {f"{k}:d" for k in ("learner_update", "learner_connector", "replay_add", "replay_sample",
                                            "replay_priorities", "runner_metrics", "driver_metrics",
                                            "learner_results")}
    assert all(m.ok and m.latency > 0 for m in out.values()), {k: m.note for k, m in out.items()}
    assert "PrioritizedEpisodeReplayBuffer" in out["replay_sample:d"].note  # DQN's default buffer
    # the priorities' update is timed alone (not a sweep of sample + update less a fitted sample): every size's
    # median is positive, and 16x the items cost more than the fewest
    prio = out["replay_priorities:d"]
    assert "alone timed" in prio.note
    assert all(t > 0 for t in prio.medians) and prio.medians[-1] > prio.medians[0]
    results = out["learner_results:d"]  # the driver's handling of 1 and 2 learners' results, per call and per result
    assert results.unit == "results" and results.sizes == [1, 2] and results.per_item > 0


@pytest.mark.e2e
def test_appo_update_is_the_learner_threads_own_call_on_whole_fragments():
    """APPO: ``IMPALALearner.update`` only enqueues; the learner thread's ``Learner.update`` trains, on
    batches of whole rollout fragments."""
    pytest.importorskip("ray.rllib")
    from ray.rllib.algorithms.appo import APPOConfig

    cfg = APPOConfig().environment("CartPole-v1")
    out = {m.name: m for m in cal.measure_learner("a", "appo", cfg, quick=True)}
    assert set(out) == {"learner_update:a", "runner_metrics:a"}
    # the rest of IMPALA's remote sample call (EnvRunner.sample_get_state_and_metrics), after a whole fragment
    calls = out["runner_metrics:a"]
    assert calls.ok and calls.latency > 0 and "get_state" in calls.note and "get_metrics" in calls.note
    assert calls.extra["fragment_steps"] == cfg.get_rollout_fragment_length(worker_index=1) * cfg.num_envs_per_env_runner
    m = out["learner_update:a"]
    assert m.ok and m.per_item > 0, m.note
    assert "learner thread" in m.note
    fragment = cfg.get_rollout_fragment_length(worker_index=1) * cfg.num_envs_per_env_runner
    assert all(n % fragment == 0 for n in m.sizes)
    # the learner it built is shut down: its polling learner thread would slow every later measurement
    assert not [t for t in threading.enumerate() if t.name == "_LearnerThread" and t.is_alive()]


def test_a_measurements_appo_learner_thread_is_stopped():
    """APPO's Learner starts a ``_LearnerThread`` whose empty input queue polls every 0.1 ms. One left alive
    in the calibrating process slowed the microbenchmarks timed after it (the EnvRunner sweep by 6-7% per
    thread), so a measurement shuts down the learner it built."""
    pytest.importorskip("ray.rllib")
    from ray.rllib.algorithms.appo import APPOConfig

    cfg = APPOConfig().environment("CartPole-v1").learners(num_learners=0)
    runner = cal._local_env_runner(cfg)
    try:
        learner = cfg.build_learner(env=runner.env)
        thread = learner._learner_thread
        assert thread.is_alive()
        cal._stop_learner(learner)
        assert not thread.is_alive()
        cal._stop_learner(learner)  # twice, or None (nothing was built): no error
        cal._stop_learner(None)
    finally:
        runner.stop()


@pytest.mark.parametrize("algo, fragment", [("dqn", 1), ("ppo", 200)])
def test_the_env_runner_sweep_reaches_the_configs_own_fragment(algo, fragment):
    """A long fragment's per-step rate includes the episodes ending in it; a one-step fragment's
    (DQN's) per-call cost is read at its own size."""
    pytest.importorskip("ray.rllib")
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.ppo import PPOConfig

    cfg = (DQNConfig() if algo == "dqn" else PPOConfig()).environment("CartPole-v1")
    cfg = cfg.env_runners(num_env_runners=1, rollout_fragment_length=fragment)
    if algo == "ppo":
        cfg = cfg.training(train_batch_size_per_learner=fragment)
    m = cal.measure_env_runner("r", cfg, quick=True)
    assert m.ok, m.note
    assert (m.sizes[0] if algo == "dqn" else m.sizes[-1]) == fragment
    assert m.sizes == sorted(m.sizes) and len(m.sizes) == len(set(m.sizes)) == 4


# --- timed attached to a running Ray, as the real run's pieces run ----------------------------------------------
def _recording(seen: list, name: str):
    import ray

    def measure(*args, **kwargs):
        seen.append(ray.is_initialized())
        return [cal.WorkloadMeasurement(f"{name}:{args[0]}", 1000.0, 1e-3, 3, "fake", [1, 2], [1e-3, 2e-3])]
    return measure


def _fake_measurements(monkeypatch, seen: list) -> None:
    monkeypatch.setattr(cal, "measure_env_runner", lambda *a, **k: _recording(seen, "env_runner")(*a, **k)[0])
    monkeypatch.setattr(cal, "measure_module", _recording(seen, "weights"))
    monkeypatch.setattr(cal, "measure_learner", _recording(seen, "learner_update"))
    monkeypatch.setattr(cal, "measure_local_learner", _recording(seen, "learner_update_local"))


def test_workload_primitives_are_timed_with_a_ray_running_and_it_is_shut_down_after(monkeypatch):
    """Every workload primitive is timed in a process attached to a running Ray (:func:`cal.attached_ray`), as
    a real run's pieces execute, each says so, and the Ray started for it is gone afterwards."""
    pytest.importorskip("ray")
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    seen: list[bool] = []
    _fake_measurements(monkeypatch, seen)
    assert not ray.is_initialized()
    out = cal.measure_workload_primitives({"x": ("ppo", PPOConfig().learners(num_learners=0))}, quick=True)
    assert seen and all(seen)  # every measurement ran with Ray up
    assert set(out) == {"env_runner:x", "weights:x", "learner_update:x", "learner_update_local:x"}
    assert all(m.extra["ray_attached"] is True for m in out.values())
    assert not ray.is_initialized()


def test_a_running_ray_is_used_as_it_is_and_left_running(monkeypatch):
    pytest.importorskip("ray")
    import shutil
    import tempfile

    import ray
    from ray.rllib.algorithms.ppo import PPOConfig

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    short = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must fit in 107 bytes
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=short, log_to_driver=False)
    try:
        seen: list[bool] = []
        _fake_measurements(monkeypatch, seen)
        with cal.attached_ray() as own:
            assert own is False
        cal.measure_workload_primitives({"x": ("ppo", PPOConfig())}, quick=True)
        assert seen and all(seen) and ray.is_initialized()
    finally:
        ray.shutdown()
        shutil.rmtree(short, ignore_errors=True)


def test_when_ray_cannot_start_every_workload_says_why_and_none_is_timed_detached(monkeypatch):
    """No silent downgrade: a failed start leaves each workload recorded as not measured, with the reason."""
    pytest.importorskip("ray")
    import ray

    def refuse(*args, **kwargs):
        raise RuntimeError("no room for a raylet")

    seen: list[bool] = []
    _fake_measurements(monkeypatch, seen)
    monkeypatch.setattr(ray, "init", refuse)
    out = cal.measure_workload_primitives({"a": ("ppo", object()), "b": ("dqn", object())}, quick=True)
    assert seen == []
    assert set(out) == {"workload:a", "workload:b"}
    for m in out.values():
        assert not m.ok and "Ray failed to start" in m.note and "no room for a raylet" in m.note
        assert "attached to a running Ray" in m.note


def test_without_a_running_ray_the_episodes_are_the_calibrating_processs_own_and_it_says_so(monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    class Runner:
        def sample(self, num_timesteps, random_actions):
            assert random_actions is False
            return ["step"] * num_timesteps

    with cal._episode_source("ppo-x", None, Runner()) as (sample, where):
        assert sample(3) == ["step"] * 3
    assert "own EnvRunner" in where and "no Ray running" in where
