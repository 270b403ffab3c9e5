"""``studies/validation.py`` and ``studies/tune_loop.py`` without real runs: the RLlib-config ->
simulator-workload mapping (field by field, over generated configs), the report's schema and
``rel_error`` arithmetic, and the ``--predict-only`` path (deterministic for a given calibration).
The real runs are e2e (``tests/test_validation_e2e.py`` is not needed: the study itself is the run)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.sim.params import StockCosts
from conduit.sim.workload import WorkloadError

pytest.importorskip("ray.rllib")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

ROOT = Path(__file__).resolve().parents[1]


def _study(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "studies" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


val = _study("validation")
STOCK = val.stock_costs_from_primitives()


def _prims(step=1e-3, call=2e-3, per_sample=50e-6, update_call=3e-3, value=10e-6, weights=1e-3,
           nbytes=150.0, episode=25.0, state=270_000, get_share=0.45):
    """Workload primitives in the calibration JSON's shape (``WorkloadMeasurement.to_dict()``); the weight
    sync's two ends (``get_s``, ``set_s``) split ``weights`` at ``get_share``."""
    def m(per_item, latency, extra=None):
        return {"per_item": per_item, "latency": latency, "samples": 10, "extra": extra or {}}

    return {"env_runner": m(step, call, {"bytes_per_step": nbytes, "episode_length": episode}),
            "learner_update": m(per_sample, update_call), "value_pass": m(value, 0.0),
            "weights": m(weights, weights, {"state_bytes": state, "get_s": get_share * weights,
                                            "set_s": (1 - get_share) * weights})}


times = st.floats(1e-6, 1e-2)


# ---------------------------------------------------------------- the mapping, field by field
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runners=st.integers(1, 4), envs=st.integers(1, 4), learners=st.integers(0, 2),
       per_runner=st.integers(8, 500), minibatch=st.integers(16, 256), epochs=st.integers(1, 30),
       step=times, call=times, per_sample=times, update_call=times, value=times)
def test_ppo_workload_matches_its_config_field_by_field(runners, envs, learners, per_runner, minibatch, epochs,
                                                        step, call, per_sample, update_call, value):
    from ray.rllib.algorithms.ppo import PPOConfig

    batch = per_runner * runners * envs
    cfg = (PPOConfig().environment("CartPole-v1")
           .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs)
           .learners(num_learners=learners)
           .training(train_batch_size_per_learner=batch, minibatch_size=min(minibatch, batch), num_epochs=epochs))
    prims = _prims(step=step, call=call, per_sample=per_sample, update_call=update_call, value=value)
    fragment = cfg.get_rollout_fragment_length(worker_index=1)
    if fragment * envs > batch:  # RLlib shards one runner's episodes across learners; the simulator cannot
        with pytest.raises(Exception, match="train_batch_per_learner"):
            val.sim_workload("w", "ppo", cfg, prims, STOCK)
        return
    wl = val.sim_workload("w", "ppo", cfg, prims, STOCK)
    assert wl.algorithm == "ppo"
    assert wl.env_runners == cfg.num_env_runners
    assert wl.envs_per_runner == cfg.num_envs_per_env_runner
    assert wl.fragment_length == fragment == per_runner * max(1, learners)  # "auto": total batch / runners x envs
    assert wl.chunk_steps * runners == cfg.total_train_batch_size  # one round of sampling fills every batch
    assert wl.learners == max(1, cfg.num_learners)
    assert wl.local_learner == (cfg.num_learners == 0)
    assert wl.train_batch_per_learner == cfg.train_batch_size_per_learner
    assert wl.epochs == cfg.num_epochs
    assert wl.env_step_time == pytest.approx(envs * step)  # a vector step of `envs` env steps
    assert wl.inference_time == 0.0  # inside the EnvRunner's measured step
    assert wl.runner_call_overhead == call
    assert wl.update_time_per_sample == per_sample
    assert wl.update_overhead == pytest.approx(epochs * math.ceil(batch / min(minibatch, batch)) * update_call)
    assert wl.value_pass_per_sample == value
    assert wl.bytes_per_step == prims["env_runner"]["extra"]["bytes_per_step"]
    assert wl.weight_sync_time > prims["weights"]["latency"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runners=st.integers(1, 4), fragment=st.integers(10, 200), batches=st.integers(1, 8),
       buffer=st.integers(1, 8), reuse=st.integers(1, 4), broadcast=st.integers(1, 2))
def test_appo_workload_matches_its_config_field_by_field(runners, fragment, batches, buffer, reuse, broadcast):
    from ray.rllib.algorithms.appo import APPOConfig

    cfg = (APPOConfig().environment("CartPole-v1")
           .env_runners(num_env_runners=runners, rollout_fragment_length=fragment)
           .learners(num_learners=1)
           .training(train_batch_size_per_learner=batches * fragment, circular_buffer_num_batches=buffer,
                     circular_buffer_iterations_per_batch=reuse, broadcast_interval=broadcast))
    if buffer < broadcast - 1:
        return
    wl = val.sim_workload("w", "appo", cfg, _prims(), STOCK)
    assert wl.fragment_length == fragment
    assert wl.env_runners == runners
    assert wl.chunks_per_batch == batches  # batch / fragment
    assert wl.max_reuse == cfg.circular_buffer_iterations_per_batch
    assert wl.max_lag == cfg.circular_buffer_num_batches
    assert wl.broadcast_interval == cfg.broadcast_interval
    assert wl.train_batch_per_learner == cfg.train_batch_size_per_learner


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runners=st.integers(1, 3), batch=st.sampled_from([16, 32, 64]), starts=st.integers(0, 2000),
       capacity=st.integers(5_000, 100_000), intensity=st.one_of(st.none(), st.sampled_from([32.0, 64.0, 256.0])),
       uniform=st.booleans())
def test_dqn_workload_matches_its_config_field_by_field(runners, batch, starts, capacity, intensity, uniform):
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.dqn.dqn import calculate_rr_weights

    buffer = {"capacity": capacity, **({"type": "EpisodeReplayBuffer"} if uniform else {})}
    cfg = (DQNConfig().environment("CartPole-v1").env_runners(num_env_runners=runners)
           .training(train_batch_size=batch, num_steps_sampled_before_learning_starts=starts,
                     replay_buffer_config=buffer, training_intensity=intensity))
    if uniform:  # RLlib's default buffer keeps its alpha/beta keys when the type is changed: as a user would
        cfg.replay_buffer_config = {k: v for k, v in cfg.replay_buffer_config.items() if k not in ("alpha", "beta")}
    try:
        wl = val.sim_workload("w", "dqn", cfg, _prims(), STOCK)
    except WorkloadError as exc:  # a contract the simulator refuses is refused with the field named
        assert "min_size" in str(exc) or "replay" in str(exc)
        return
    store, train = calculate_rr_weights(cfg)
    assert wl.batch_size == cfg.total_train_batch_size == batch
    assert wl.fragment_length == cfg.get_rollout_fragment_length() == 1  # DQN's "auto" is n_step
    assert wl.replay_ratio == pytest.approx(train * batch / (store * runners))  # sampled per inserted step
    assert wl.min_size == starts
    assert wl.replay_capacity == capacity
    assert wl.update_time_per_sample == _prims()["learner_update"]["per_item"]
    # the buffer's kind as enable() reads it: DQN's default is RLlib's PrioritizedEpisodeReplayBuffer
    assert wl.prioritized_replay is (not uniform)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weights=times, get_share=st.floats(0.0, 1.0), state=st.integers(0, 10**8))
def test_dqn_weight_sync_is_the_drivers_work_and_each_runners_set_state(weights, get_share, state):
    """DQN's ``sync_weights`` (conduit.sim.dqn.DqnLoop.dqn_weight_sync): the driver gets the learner's state,
    puts it in the object store and sets the local EnvRunner's; each remote EnvRunner sets it on its own."""
    from ray.rllib.algorithms.dqn import DQNConfig

    cfg = DQNConfig().environment("CartPole-v1").env_runners(num_env_runners=1)
    prims = _prims(weights=weights, get_share=get_share, state=state)
    wl = val.sim_workload("w", "dqn", cfg, prims, STOCK)
    ends = prims["weights"]["extra"]
    assert wl.weight_set_time == ends["set_s"]
    assert wl.weight_sync_time == pytest.approx(ends["get_s"] + ends["set_s"] + STOCK.put_per_call
                                                + state / STOCK.serialize_bandwidth)


def test_a_calibration_without_the_weight_syncs_two_ends_is_refused_with_the_fix():
    from ray.rllib.algorithms.dqn import DQNConfig

    cfg = DQNConfig().environment("CartPole-v1").env_runners(num_env_runners=1)
    prims = _prims()
    prims["weights"]["extra"] = {"state_bytes": 1000}
    with pytest.raises(SystemExit, match="--add-learner-primitives --only weights"):
        val.sim_workload("w", "dqn", cfg, prims, STOCK)


def test_every_default_study_workload_maps_and_keys_one_calibration_entry_per_algo_and_env():
    study = val.experience_path_study()
    configs = val.study_configs(study, study.parse_args([]))
    assert set(configs) == {w.name for w in study.WORKLOADS if w.default}
    keys = val.calibration_configs(configs)
    assert set(keys) == {val.primitive_key(w.algo, w.env) for w, _ in configs.values()}
    for name, (w, cfg) in configs.items():
        wl = val.sim_workload(name, w.algo, cfg, _prims(), STOCK)
        assert wl.algorithm == w.algo and wl.name == name


# ---------------------------------------------------------------- the report's arithmetic and schema
finite = st.floats(1e-6, 1e3)


@given(p=finite, m=finite)
def test_rel_error_is_predicted_over_measured_less_one(p, m):
    assert val.rel_error(p, m) == pytest.approx(p / m - 1.0, rel=1e-9, abs=1e-12)
    assert val.rel_error(m, m) == 0.0


@given(p=st.one_of(st.none(), finite))
def test_rel_error_is_none_without_a_usable_measurement(p):
    assert val.rel_error(p, None) is None
    assert val.rel_error(p, 0.0) is None
    assert val.rel_error(p, math.nan) is None


@given(pred=st.dictionaries(st.sampled_from(["a", "b"]), st.tuples(finite, finite, finite), min_size=1),
       measure=st.booleans())
def test_compare_rows_have_the_schema_and_ratios_divide_conduit_by_stock(pred, measure):
    predicted, measured = {}, {}
    for name, (s, c, e) in pred.items():
        predicted[(name, "stock")] = {"iteration_time_s": s, "exposed_experience_path_s": e, "experience_share": e / s}
        predicted[(name, "conduit")] = {"iteration_time_s": c, "exposed_experience_path_s": e / 2,
                                        "experience_share": e / 2 / c}
        measured[(name, "stock")] = {"iteration_time_s": 2 * s, "exposed_experience_path_s": e,
                                     "experience_share": e / (2 * s)}
        measured[(name, "conduit")] = {"iteration_time_s": c, "exposed_experience_path_s": 0.0,
                                       "experience_share": 0.0}
    rows = val.compare(predicted, measured if measure else None)
    assert len(rows) == 2 * len(pred) * len(val.METRICS)
    for r in rows:
        assert set(r) == {"workload", "side", "metric", "predicted", "measured", "rel_error"}
        if measure and r["measured"]:
            assert r["rel_error"] == pytest.approx(r["predicted"] / r["measured"] - 1.0)
        else:
            assert r["rel_error"] is None
    for r in val.ratios(rows):
        s, c, _ = pred[r["workload"]]
        assert r["predicted_ratio"] == pytest.approx(c / s)
        if measure:
            assert r["measured_ratio"] == pytest.approx(c / (2 * s))
            assert r["difference"] == pytest.approx(c / s - c / (2 * s))
            assert r["within_target"] == (abs(r["difference"]) <= val.TARGETS["ratio"])
        else:
            assert r["measured_ratio"] is None and r["within_target"] is None
    missed = val.misses(rows, val.ratios(rows))
    if measure:  # stock iteration is predicted at half the measured one: -50%, always a miss
        assert sum("stock] iteration_time_s" in m for m in missed) == len(pred)
    else:
        assert missed == []


def test_measured_metrics_take_the_instrument_fields_in_seconds():
    got = val.measured_metrics({"iteration_ms": 1500.0, "exposed_per_update_ms": 30.0, "experience_share": 0.02})
    assert got == {"iteration_time_s": 1.5, "exposed_experience_path_s": 0.03, "experience_share": 0.02}
    none = val.measured_metrics({"iteration_ms": 5000.0, "exposed_per_update_ms": 0.0, "num_updates": 0.0})
    assert all(math.isnan(v) for v in none.values())  # no update in the window: nothing was measured
    rows = val.compare({("w", "stock"): dict(got)}, {("w", "stock"): none})
    assert all(r["measured"] is None and r["rel_error"] is None for r in rows)


def test_stock_costs_come_from_the_primitives_file():
    data = json.loads(val.DEFAULT_PRIMITIVES.read_text())
    assert STOCK.rpc_overhead == data["rpc_round_trip_s"]
    assert STOCK.put_per_call == data["put_latency_s"]
    assert STOCK.buffer_sample_per_call == pytest.approx(data["buffer_sample_s"] - 32 * data["buffer_sample_per_item_s"])


# ---------------------------------------------------------------- --predict-only, deterministic
def _calibration() -> dict:
    """A calibration JSON in ``conduit calibrate``'s shape, with plausible figures for this kind of VM."""
    def machine(name, bw, lat):
        return {"name": name, "bandwidth": bw, "latency": lat, "samples": 10, "note": "test", "sizes": [4096, 1 << 20],
                "medians": [lat + 4096 / bw, lat + (1 << 20) / bw]}

    ms = {"memcpy": machine("memcpy", 10e9, 1e-6), "shm": machine("shm", 4e9, 2e-6),
          "pickle": machine("pickle", 3e9, 30e-6), "object_store_put": machine("object_store_put", 1.5e9, 1e-3),
          "object_store_get": machine("object_store_get", 20e9, 0.25e-3)}
    wl = {}
    for key, step, per_sample, value, nbytes, episode in (
            ("ppo-cartpole", 0.8e-3, 35e-6, 7e-6, 150.0, 23.0), ("ppo-largeobs", 1.4e-3, 0.8e-3, 0.5e-3, 36e3, 200.0),
            ("appo-cartpole", 0.8e-3, 35e-6, 7e-6, 150.0, 23.0), ("appo-largeobs", 1.4e-3, 0.8e-3, 0.5e-3, 36e3, 200.0),
            ("dqn-cartpole", 0.8e-3, 40e-6, 0.0, 130.0, 23.0)):
        p = _prims(step=step, call=1e-3, per_sample=per_sample, value=value, nbytes=nbytes, episode=episode)
        for kind, entry in p.items():
            wl[f"{kind}:{key}"] = {"name": f"{kind}:{key}", **entry}
    return {"host": {"hostname": "test", "cores": 2, "dram_capacity": 24 << 30, "mode": "full"},
            "measurements": ms, "workload": wl}


def test_predict_only_writes_the_report_and_is_deterministic(tmp_path):
    cal = tmp_path / "calibration.json"
    cal.write_text(json.dumps(_calibration()))
    outs = []
    for run in ("a", "b"):
        out = tmp_path / run
        assert val.main(["--predict-only", "--calibration", str(cal), "--out", str(out),
                         "--workloads", "ppo-cartpole-2r-local,dqn-cartpole-1r"]) == 0
        outs.append(json.loads((out / "validation.json").read_text()))
        assert (out / "validation.md").read_text().startswith("# Simulator validation")
        assert (out / "topology.yaml").exists()
    a, b = outs
    assert a["rows"] == b["rows"]  # the prediction is a pure function of the calibration
    assert {(r["workload"], r["side"], r["metric"]) for r in a["rows"]} == {
        (w, s, m) for w in ("ppo-cartpole-2r-local", "dqn-cartpole-1r") for s in ("stock", "conduit")
        for m in val.METRICS}
    assert all(r["measured"] is None and r["rel_error"] is None and r["predicted"] >= 0 for r in a["rows"])
    assert a["misses"] == []
    assert {r["workload"] for r in a["external"]} == {"ppo", "dqn"}
    assert all(r["published_share"] == val.PUBLISHED_SHARES[r["workload"]] for r in a["external"])
    assert a["workloads"]["ppo-cartpole-2r-local"]["local_learner"] is True
    assert "ref-" not in json.dumps(a["workloads"])  # the in-sample presets are not used


def test_plane_primitives_are_read_once_and_a_bad_file_is_named(tmp_path):
    """``--plane-primitives``: the prediction uses that file's PlaneCosts (cheaper plane calls: a faster
    conduit DQN, stock unchanged), and a file that is not a plane-cost file stops the run, naming it."""
    cal = tmp_path / "calibration.json"
    cal.write_text(json.dumps(_calibration()))
    slow, fast = tmp_path / "slow.json", tmp_path / "fast.json"
    for path, callee in ((slow, 5e-3), (fast, 1e-6)):
        path.write_text(json.dumps({"measurements": {
            "plane_actor_callee": {"latency": callee, "bandwidth": 1e18, "samples": 3},
            "plane_replay_draw": {"latency": 10 * callee, "bandwidth": 1e6, "samples": 3}}}))
    rows = {}
    for path in (slow, fast):
        out = tmp_path / path.stem
        assert val.main(["--predict-only", "--calibration", str(cal), "--out", str(out), "--workloads",
                         "dqn-cartpole-1r", "--plane-primitives", str(path), "--no-cold-calls"]) == 0
        report = json.loads((out / "validation.json").read_text())
        assert report["plane_costs_source"] == str(path)
        rows[path.stem] = {(r["side"], r["metric"]): r["predicted"] for r in report["rows"]}
    assert rows["fast"][("conduit", "iteration_time_s")] < rows["slow"][("conduit", "iteration_time_s")]
    assert rows["fast"][("stock", "iteration_time_s")] == rows["slow"][("stock", "iteration_time_s")]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"measurements": {"disk_read": {"latency": 1.0, "bandwidth": 1e9, "samples": 3}}}))
    with pytest.raises(SystemExit, match="--plane-primitives: .*bad.json"):
        val.main(["--predict-only", "--calibration", str(cal), "--out", str(tmp_path / "x"), "--workloads",
                  "dqn-cartpole-1r", "--plane-primitives", str(bad)])


def test_a_plane_file_without_the_laws_plane_side_is_refused_while_the_law_is_on(tmp_path):
    """The built-in stock primitives carry section gap (the law on): a ``--plane-primitives`` file must carry the
    plane's ``*_cold`` figures too, or the run stops before any calibration, naming the file and what is missing;
    ``--no-cold-calls`` needs none; a file with them has its figures reported."""
    cal = tmp_path / "calibration.json"
    cal.write_text(json.dumps(_calibration()))
    measurements = {"plane_actor_callee": {"latency": 5e-4, "bandwidth": 1e18, "samples": 3},
                    "plane_replay_draw_cold": {"latency": 7e-4, "bandwidth": 1e18, "samples": 3}}
    path = tmp_path / "plane.json"
    path.write_text(json.dumps({"measurements": measurements}))
    argv = ["--predict-only", "--calibration", str(cal), "--workloads", "dqn-cartpole-1r", "--plane-primitives",
            str(path)]
    with pytest.raises(SystemExit, match=r"plane\.json: no plane_actor_call_cold, plane_actor_callee_cold, "
                                         r"plane_replay_priorities_cold .*--no-cold-calls"):
        val.main([*argv, "--out", str(tmp_path / "refused")])
    assert not (tmp_path / "refused" / "validation.json").exists()
    assert val.main([*argv, "--out", str(tmp_path / "off"), "--no-cold-calls"]) == 0
    for name, figure in (("plane_actor_call_cold", 1.1e-3), ("plane_actor_callee_cold", 4e-4),
                         ("plane_replay_priorities_cold", 3e-4)):
        measurements[name] = {"latency": figure, "bandwidth": 1e18, "samples": 3}
    path.write_text(json.dumps({"measurements": measurements}))
    assert val.main([*argv, "--out", str(tmp_path / "on")]) == 0
    cold = json.loads((tmp_path / "on" / "validation.json").read_text())["cold_calls"]
    assert cold["state"] == "on" and (cold["plane_round_trip_s"], cold["plane_draw_s"]) == (1.1e-3, 7e-4)


def test_tune_loop_explains_each_changed_parameter():
    tl = _study("tune_loop")
    wl = val.sim_workload("ppo-largeobs", "ppo", _study("validation").study_configs(
        val.experience_path_study(), val.experience_path_study().parse_args([]), ["ppo-largeobs-1r-1l"])[
        "ppo-largeobs-1r-1l"][1], _prims(nbytes=36e3, episode=200.0), STOCK)
    default = {"target_chunk_bytes": 8e6, "depth": 2, "granularity": 1, "headroom": 0.05}
    tuned = {**default, "target_chunk_bytes": 1e6, "depth": 3}
    rows = tl.mechanisms(wl, default, tuned)
    assert [r["parameter"] for r in rows] == ["depth", "target_chunk_bytes"]
    # both are honoured: the runtime and the simulator size sub-chunks and prefetch by conduit.deploy_settings
    assert all(r["honoured_by_runtime"] for r in rows)
    from conduit.deploy_settings import stream_chunk_steps

    frag = wl.fragment_length * wl.envs_per_runner
    tuned_steps = stream_chunk_steps(frag, wl.envs_per_runner, wl.bytes_per_step, 1e6)
    assert f"sub-chunks of {stream_chunk_steps(frag, wl.envs_per_runner)} steps without the parameter, " \
           f"{tuned_steps} tuned" in rows[1]["simulator"]
    text = tl.verdict(1.2, 1.0, rows)
    assert text.startswith("NOT confirmed") and "the model's error" in text
    assert tl.verdict(1.2, 1.2, rows).startswith("confirmed")
    assert "neither confirm nor refute" in tl.verdict(1.01, 1.02, rows)
    ignored = [{**rows[1], "honoured_by_runtime": False}]
    slower = tl.verdict(1.01, 0.8, ignored)
    assert slower.startswith("NOT confirmed") and "SLOWER" in slower and "target_chunk_bytes" in slower
    assert "nothing to confirm" in tl.verdict(1.0, None, [])


# ---------------------------------------------------------------- DQN's own buffer and driver calls
@settings(max_examples=20, deadline=None)
@given(add=times, smp=times, item=times, prio=times, prio_item=times, agg=times, metrics=times, conn=times,
       conn_item=times)
def test_dqn_driver_primitives_replace_the_generic_buffer_costs(add, smp, item, prio, prio_item, agg, metrics, conn,
                                                                conn_item):
    def m(per_item, latency):
        return {"per_item": per_item, "latency": latency, "samples": 10, "extra": {}}

    prims = {"replay_add": m(add, add), "replay_sample": m(item, smp), "replay_priorities": m(prio_item, prio),
             "driver_metrics": m(agg, agg), "runner_metrics": m(metrics, metrics),
             "learner_connector": m(conn_item, conn)}
    s = val.workload_stock(STOCK, "dqn", prims)
    assert s.buffer_add(1) == pytest.approx(add)
    assert s.buffer_sample(32) == pytest.approx(smp + 32 * item)
    assert s.buffer_update_priorities(32) == pytest.approx(prio + 32 * prio_item)
    assert s.driver_bookkeeping == agg and s.connector(32, 32, 1e6) == pytest.approx(conn + 32 * conn_item)
    assert s.rpc_overhead == STOCK.rpc_overhead  # the rest stays the stock primitives file's
    assert val.workload_stock(STOCK, "ppo", prims) is STOCK
    partial = {k: v for k, v in prims.items() if k != "replay_priorities"}
    assert val.workload_stock(STOCK, "dqn", partial) is STOCK  # all or nothing: no half-measured buffer
    # the driver's handling of each update's results: the workload's own where measured, alone or with the rest
    res = {"learner_results": m(prio_item, prio)}
    for given_prims in (res, {**prims, **res}):
        r = val.workload_stock(STOCK, "dqn", given_prims)
        assert r.learner_results(3) == pytest.approx(prio + 3 * prio_item)
    assert val.workload_stock(STOCK, "dqn", prims).learner_results(1) == STOCK.learner_results(1)
    cfg = val.study_configs(val.experience_path_study(), val.experience_path_study().parse_args([]),
                            ["dqn-cartpole-1r"])["dqn-cartpole-1r"][1]
    base = _prims()
    wl = val.sim_workload("d", "dqn", cfg, {**base, **prims}, s)
    # the EnvRunner's get_metrics() rides in the same remote call as its sample(), after it returns
    assert wl.runner_call_overhead == pytest.approx(base["env_runner"]["latency"])
    assert wl.runner_metrics_time == pytest.approx(metrics)


def test_stock_dqn_charges_priority_updates_and_the_per_round_metrics_aggregate():
    from dataclasses import replace

    from test_sim import tiny_topology_dict

    from conduit.registry import create_policy
    from conduit.sim.engine import Simulation
    from conduit.sim.workload import load_workload
    from conduit.topology import topology_from_dict

    topo = topology_from_dict(tiny_topology_dict(nodes=1, gpus=1))
    wl = load_workload({"base": "dqn", "env_runners": 1, "learners": 1, "fragment_length": 4, "envs_per_runner": 1,
                        "min_size": 8, "replay_ratio": 8.0, "batch_size": 32, "prioritized_replay": True})
    cheap = Simulation(topo, wl, create_policy("rllib-stock"), iterations=20, stock=STOCK).run()
    dear_stock = replace(STOCK, buffer_update_priorities_per_call=1e-3, driver_bookkeeping=STOCK.driver_bookkeeping + 1e-3)
    dear = Simulation(topo, wl, create_policy("rllib-stock"), iterations=20, stock=dear_stock).run()
    assert dear.sim_time >= cheap.sim_time + 20 * 1e-3 * 0.99  # one priority update per update, at least
    assert dear.to_dict()["segments_s"]["buffer_update_prios"] == pytest.approx(1e-3)
    # a uniform buffer has no priorities to update: the same costs, none charged
    uniform = Simulation(topo, replace(wl, prioritized_replay=False), create_policy("rllib-stock"), iterations=20,
                         stock=dear_stock).run()
    assert "buffer_update_prios" not in uniform.to_dict()["segments_s"]


def test_a_local_learners_wall_clock_update_is_used_only_when_measured_quietly():
    cores = os.cpu_count() or 1
    quiet = {"per_item": 1e-5, "latency": 1e-3, "samples": 9, "extra": {"load_average": [0.1 * cores, 1, 1]}}
    loaded = {**quiet, "extra": {"load_average": [3.0 * cores, 1, 1]}}
    assert val.local_usable(quiet) and not val.local_usable(loaded) and not val.local_usable(None)
    assert not val.local_usable({**quiet, "extra": {}})  # no load recorded: not trusted
    prims = _prims()
    assert val.local_learner_update(prims) is prims["learner_update"]
    assert val.local_learner_update({**prims, "learner_update_local": quiet}) is quiet


# ---------------------------------------------------------------- PPO: the whole update call
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(learners=st.integers(0, 1), minibatch=st.integers(16, 256), epochs=st.integers(1, 30), per_sample=times,
       per_call=times, local_per_sample=times, local_per_call=times, per_minibatch=times)
def test_ppo_update_is_the_whole_call_when_measured(learners, minibatch, epochs, per_sample, per_call,
                                                    local_per_sample, local_per_call, per_minibatch):
    """``learner_update_call`` (per sample per epoch + the call's fixed cost) replaces the per-minibatch
    sum; a local learner's quiet wall-clock call wins over it; without either the per-minibatch sum stays."""
    from ray.rllib.algorithms.ppo import PPOConfig

    cfg = (PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2).learners(num_learners=learners)
           .training(train_batch_size_per_learner=1000, minibatch_size=minibatch, num_epochs=epochs))
    base = _prims(update_call=per_minibatch)
    call = {"per_item": per_sample, "latency": per_call, "samples": 9, "extra": {"epochs_timed": epochs}}
    local = {"per_item": local_per_sample, "latency": local_per_call, "samples": 9, "extra": {"epochs_timed": epochs}}
    old = val.sim_workload("w", "ppo", cfg, base, STOCK)
    assert old.update_overhead == pytest.approx(epochs * math.ceil(1000 / minibatch) * per_minibatch)
    wl = val.sim_workload("w", "ppo", cfg, {**base, "learner_update_call": call}, STOCK)
    assert (wl.update_time_per_sample, wl.update_overhead) == (per_sample, per_call)
    both = val.sim_workload("w", "ppo", cfg, {**base, "learner_update_call": call,
                                              "learner_update_call_local": local}, STOCK)
    assert (both.update_time_per_sample, both.update_overhead) == (local_per_sample, local_per_call)
    assert wl.epochs == epochs and wl.train_batch_per_learner == 1000


# ---------------------------------------------------------------- PPO: the GAE connector
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(64, 4000), per_sample=times, per_call=times, local_per_sample=times, value=times)
def test_ppo_gae_is_the_connector_piece_at_the_train_batch_when_measured(batch, per_sample, per_call,
                                                                        local_per_sample, value):
    """``gae_connector`` (the GAE piece timed in the learner's pipeline) replaces ``compute_values`` alone,
    its per-call part spread over the train batch; a local learner's admitted wall-clock entry wins."""
    from ray.rllib.algorithms.ppo import PPOConfig

    cfg = (PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2)
           .training(train_batch_size_per_learner=batch, minibatch_size=64))
    base = _prims(value=value)
    gae = {"per_item": per_sample, "latency": per_call, "samples": 9, "extra": {"fit_anchor": "largest"}}
    none = {"per_item": 0.0, "latency": 0.0, "samples": 9}  # (StreamedGAE: test below)
    assert val.sim_workload("w", "ppo", cfg, base, STOCK).value_pass_per_sample == value
    wl = val.sim_workload("w", "ppo", cfg, {**base, "gae_connector": gae, "gae_streamed": none}, STOCK)
    assert wl.value_pass_per_sample * batch == pytest.approx(per_sample * batch + per_call)
    local = {**gae, "per_item": local_per_sample}
    both = val.sim_workload("w", "ppo", cfg, {**base, "gae_connector": gae, "gae_connector_local": local,
                                              "gae_streamed": none}, STOCK)
    assert both.value_pass_per_sample * batch == pytest.approx(local_per_sample * batch + per_call)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(64, 4000), per_sample=times, per_call=times, share=st.floats(0.0, 1.5),
       local_share=st.floats(0.0, 1.0), local=st.booleans())
def test_ppo_streamed_gae_is_its_measured_piece_at_the_train_batch(batch, per_sample, per_call, share,
                                                                  local_share, local):
    """``gae_streamed`` (the runtime's ``StreamedGAE`` timed on the GAE piece's inputs) is the piece's work besides
    the forward pass (``advantage_per_sample``: what the deployed model leaves for update start), per sample at the
    train batch, the local twin where the local GAE piece is read and the twin was admitted, capped at the whole
    piece; the forward pass is the rest of the piece. A calibration that timed the GAE piece without it is refused
    with the command that adds it (no silent fallback to streaming all of GAE)."""
    from ray.rllib.algorithms.ppo import PPOConfig

    cfg = (PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2)
           .training(train_batch_size_per_learner=batch, minibatch_size=64))
    base = _prims()
    gae = {"per_item": per_sample, "latency": per_call, "samples": 9, "extra": {"fit_anchor": "largest"}}
    streamed = {"per_item": share * per_sample, "latency": share * per_call, "samples": 9}
    prims = {**base, "gae_connector": gae, "gae_streamed": streamed}
    if local:
        prims.update(gae_connector_local=gae,
                     gae_streamed_local={**streamed, "per_item": local_share * per_sample, "latency": 0.0})
    wl = val.sim_workload("w", "ppo", cfg, prims, STOCK)
    whole = per_sample * batch + per_call
    want = local_share * per_sample * batch if local else min(share, 1.0) * whole
    assert wl.advantage_per_sample * batch == pytest.approx(want, rel=1e-9, abs=1e-15)
    # the piece split where the runtime splits it: the forward pass and the rest add up to the whole piece
    assert (wl.value_pass_per_sample + wl.advantage_per_sample) * batch == pytest.approx(whole, rel=1e-9, abs=1e-15)
    assert wl.value_pass_per_sample >= 0
    with pytest.raises(SystemExit, match="--add-learner-primitives --only gae_streamed"):
        val.sim_workload("w", "ppo", cfg, {**base, "gae_connector": gae}, STOCK)
    # a calibration from before the GAE piece was timed: its value pass alone, no rest
    assert val.sim_workload("w", "ppo", cfg, base, STOCK).advantage_per_sample == 0.0


@settings(max_examples=20, deadline=None)
@given(runs=st.lists(st.lists(st.floats(0.1, 10.0), min_size=3, max_size=3), min_size=2, max_size=4))
def test_repeated_runs_keep_their_fit_anchor(runs):
    """``_median_of_runs`` refits the per-size medians the way the sweep was fitted: a sweep anchored on
    its largest size (the train batch) still reproduces the median measured there."""
    import statistics

    from conduit.runtime.calibrate import WorkloadMeasurement

    sizes = [500, 1000, 2000]
    ms = [WorkloadMeasurement("gae_connector:x", 1.0, 0.0, 3, "n", sizes, sorted(r), unit="samples",
                              extra={"fit_anchor": "largest", "wall_medians": sorted(r)}) for r in runs]
    from conduit.runtime.calibrate import fit_latency_bandwidth

    m = val._median_of_runs(ms)
    assert m.medians == [pytest.approx(statistics.median(sorted(r)[i] for r in runs)) for i in range(3)]
    lat, rate, how = fit_latency_bandwidth(sizes, m.medians, anchor="largest")
    assert (m.latency, m.bandwidth) == (pytest.approx(lat), pytest.approx(rate))
    if "zero-copy" not in how:  # exact at the largest size's median (the line through the two largest, or the origin)
        assert m.latency + sizes[-1] * m.per_item == pytest.approx(m.medians[-1], rel=1e-6)
    assert m.extra["fit_anchor"] == "largest"


# ---------------------------------------------------------------- the rest of the sample call; the torch team
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(metrics=times, name=st.sampled_from(["ppo-largeobs-1r-1l", "appo-cartpole-2r-1l", "dqn-cartpole-1r"]))
def test_every_algorithms_sample_call_carries_the_rest_of_its_remote_call(metrics, name):
    study = val.experience_path_study()
    w, cfg = val.study_configs(study, study.parse_args([]), [name])[name]
    base = _prims()
    with_calls = val.sim_workload(name, w.algo, cfg, {**base, "runner_metrics": {
        "per_item": metrics, "latency": metrics, "samples": 9, "extra": {}}}, STOCK)
    without = val.sim_workload(name, w.algo, cfg, base, STOCK)
    assert without.runner_call_overhead == pytest.approx(base["env_runner"]["latency"])
    assert without.runner_metrics_time == 0.0
    # after sample() returns (synchronous_parallel_sample's lambda; APPO's sample_get_state_and_metrics)
    assert with_calls.runner_call_overhead == pytest.approx(base["env_runner"]["latency"])
    assert with_calls.runner_metrics_time == pytest.approx(metrics)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spin=times, share=st.floats(0.0, 1.5), threads=st.integers(2, 8), sync=times)
def test_a_local_learners_torch_team_comes_from_its_measurement(spin, share, threads, sync):
    study = val.experience_path_study()
    name = "dqn-cartpole-1r"  # num_learners=0: the learner trains in the driver's process
    w, cfg = val.study_configs(study, study.parse_args([]), [name])[name]
    team = {"per_item": spin, "latency": spin, "samples": 9,
            "extra": {"torch_threads": threads, "update_share": share, "load_average": [0.1, 0.1, 0.1],
                      "sync_spin_s": sync}}
    wl = val.sim_workload(name, w.algo, cfg, {**_prims(), "torch_team": team}, STOCK)
    assert (wl.learner_threads, wl.learner_spin_s, wl.sync_spin_s) == (threads, spin, sync)
    assert wl.learner_thread_share == min(1.0, share)  # a measured share above 1 is clock noise
    plain = val.sim_workload(name, w.algo, cfg, _prims(), STOCK)
    assert (plain.learner_threads, plain.learner_spin_s, plain.sync_spin_s) == (1, 0.0, 0.0)  # not measured: no team


def test_a_dqn_torch_team_without_its_weight_sync_spin_is_refused_with_the_fix():
    study = val.experience_path_study()
    name = "dqn-cartpole-1r"
    w, cfg = val.study_configs(study, study.parse_args([]), [name])[name]
    team = {"per_item": 1e-3, "latency": 1e-3, "samples": 9,
            "extra": {"torch_threads": 2, "update_share": 0.8, "load_average": [0.1, 0.1, 0.1]}}
    with pytest.raises(SystemExit, match="--add-learner-primitives --only torch_team"):
        val.sim_workload(name, w.algo, cfg, {**_prims(), "torch_team": team}, STOCK)


@pytest.mark.parametrize("argv, message", [
    (["--only", "torch_team"], "--only applies to --add-learner-primitives"),
    (["--calibration", "c.json", "--add-learner-primitives", "--only", "torch_team,bogus"], "bogus"),
])
def test_only_is_checked_and_names_what_is_wrong(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        val.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err
    args = val.parse_args(["--calibration", "c.json", "--add-learner-primitives", "--only", "torch_team,runner_metrics"])
    assert args.only == "torch_team,runner_metrics"


# ---------------------------------------------------------------- the EnvRunner sweep re-timed before each run
def _row(name, side, metric, predicted, measured):
    return {"workload": name, "side": side, "metric": metric, "predicted": predicted, "measured": measured,
            "rel_error": val.rel_error(predicted, measured)}


@settings(max_examples=40, deadline=None)
@given(pairs=st.lists(st.tuples(st.sampled_from(list(val.TARGETS)[:2]), st.floats(1e-3, 10.0),
                                st.one_of(st.none(), st.just(0.0), st.floats(1e-3, 10.0))), max_size=12))
def test_target_counts_count_what_the_misses_leave_out(pairs):
    rows = [_row(f"w{i}", "stock", metric, p, m) for i, (metric, p, m) in enumerate(pairs)]
    counts = val.target_counts(rows, [])
    missed = val.misses(rows, [])
    for metric in ("iteration_time_s", "exposed_experience_path_s"):
        met, measured = counts[metric]
        assert measured == sum(1 for r in rows if r["metric"] == metric and r["measured"] is not None)
        assert met == measured - sum(1 for line in missed if f"] {metric}:" in line)
    assert counts["ratio"] == [0, 0]


def _rechecks(cal: dict, names, factor: float, kinds=("env_runner",)) -> list[dict]:
    """Re-timed entries: each workload's calibrated ``kinds`` (a file from before the update was re-timed:
    ``None``, the EnvRunner sweep alone as ``entry``) ``factor`` times slower."""
    out = []
    study = val.experience_path_study()
    configs = val.study_configs(study, study.parse_args([]), names)
    for name in names:
        key = val._recheck_key(configs, name)
        entries = {}
        for kind in kinds or ("env_runner",):
            entry = json.loads(json.dumps(cal["workload"][f"{kind}:{key}"]))
            entry["per_item"] *= factor
            entry["latency"] *= factor
            if "medians" in entry:
                entry["medians"] = [m * factor for m in entry["medians"]]
            entries[kind] = entry
        for side in ("stock", "conduit"):
            out.append({"workload": name, "side": side, "run": 0,
                        **({"entries": entries} if kinds else {"entry": entries["env_runner"]})})
    return out


def _calibrated_prediction(names):
    """(the test calibration, the study's configs of ``names``, its topology, both sides' prediction from it)."""
    cal = _calibration()
    study = val.experience_path_study()
    configs = val.study_configs(study, study.parse_args([]), names)
    topology, _ = val.topology_from_calibration(cal)
    workloads, stocks = val.build_workloads(configs, cal, STOCK)
    return cal, configs, topology, val.predict(workloads, topology, STOCK, ["stock", "conduit"], stocks)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(factor=st.floats(1.05, 1.6))
def test_a_rechecked_prediction_swaps_in_only_the_retimed_sweep(factor):
    names = ["ppo-cartpole-2r-local"]
    cal, configs, topology, base = _calibrated_prediction(names)
    same = val.rechecked_predictions(configs, cal, _rechecks(cal, names, 1.0), topology, STOCK)
    assert same == base  # the calibration's own sweep swapped in: the same prediction
    slower = val.rechecked_predictions(configs, cal, _rechecks(cal, names, factor), topology, STOCK)
    for key, pred in base.items():
        assert slower[key]["iteration_time_s"] > pred["iteration_time_s"]  # a slower sweep, a longer iteration
    drift = val.primitive_drift(cal, configs, _rechecks(cal, names, factor))
    assert [d["drift"] for d in drift] == pytest.approx([factor - 1.0] * 2)
    assert {(d["workload"], d["side"]) for d in drift} == {(n, s) for n in names for s in ("stock", "conduit")}


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(factor=st.floats(1.2, 2.0))
def test_a_re_timed_learner_update_moves_only_what_reads_it(factor):
    """The update re-timed slower: the learner-bound APPO prediction takes longer, by no more than the update
    itself grew; the drift table names the update; the sweep and the update re-timed as calibrated predict as
    the calibration."""
    names = ["appo-largeobs-2r-1l"]
    cal, configs, topology, base = _calibrated_prediction(names)
    assert val.rechecked_predictions(configs, cal, _rechecks(cal, names, 1.0, ("env_runner", "learner_update")),
                                     topology, STOCK) == base
    slower = val.rechecked_predictions(configs, cal, _rechecks(cal, names, factor, ("learner_update",)),
                                       topology, STOCK)
    for key, pred in base.items():
        assert pred["iteration_time_s"] < slower[key]["iteration_time_s"] <= factor * pred["iteration_time_s"] * 1.001
    drift = val.primitive_drift(cal, configs, _rechecks(cal, names, factor, ("learner_update",)))
    assert {d["kind"] for d in drift} == {"learner_update"}
    assert [d["drift"] for d in drift] == pytest.approx([factor - 1.0] * 2)


def _with_local(cal: dict, load: float) -> dict:
    """``cal`` with the local learner's twins of the update primitives, measured at 1-min load ``load``."""
    out = json.loads(json.dumps(cal))
    for key in ("ppo-cartpole", "dqn-cartpole"):
        for kind in ("learner_update", "learner_update_call", "gae_connector") if key.startswith("ppo") else (
                "learner_update",):
            base = out["workload"].get(f"{kind}:{key}") or {"per_item": 1e-5, "latency": 1e-3, "samples": 10,
                                                            "extra": {}}
            if kind != "learner_update":
                out["workload"][f"{kind}:{key}"] = json.loads(json.dumps(base))
            out["workload"][f"{kind}_local:{key}"] = {**json.loads(json.dumps(base)),
                                                      "extra": {"load_average": [load, load, load]}}
    return out


def test_the_re_timed_update_is_the_one_the_prediction_reads():
    study = val.experience_path_study()
    names = ["ppo-cartpole-2r-local", "ppo-largeobs-2r-1l", "appo-cartpole-2r-1l", "dqn-cartpole-1r"]
    configs = val.study_configs(study, study.parse_args([]), names)
    cal = _calibration()
    assert {n: val.update_kinds(cal, configs, n) for n in names} == {n: ["learner_update"] for n in names}
    quiet, busy = _with_local(cal, 0.1), _with_local(cal, 50.0)
    assert val.update_kinds(quiet, configs, "ppo-cartpole-2r-local") == [
        "learner_update_local", "learner_update_call_local", "gae_connector_local"]
    assert val.update_kinds(quiet, configs, "dqn-cartpole-1r") == ["learner_update_local"]
    # a remote learner reads the one-thread update; a local one measured on a busy machine is not read
    assert val.update_kinds(quiet, configs, "appo-cartpole-2r-1l") == ["learner_update"]
    assert val.update_kinds(busy, configs, "ppo-cartpole-2r-local") == [
        "learner_update", "learner_update_call", "gae_connector"]


def test_measured_rechecks_regenerate_the_rechecked_report(tmp_path):
    cal = _calibration()
    (tmp_path / "calibration.json").write_text(json.dumps(cal))
    names = ["ppo-cartpole-2r-local", "dqn-cartpole-1r"]
    medians = [{"workload": n, "side": s, "iteration_ms": 900.0 if s == "stock" else 800.0,
                "exposed_per_update_ms": 100.0, "experience_share": 0.1, "num_updates": 1.0}
               for n in names for s in ("stock", "conduit")]
    (tmp_path / "measured.json").write_text(json.dumps({"load": "test", "medians": medians,
                                                        "env_runner_recheck": _rechecks(cal, names, 1.25)}))
    out = tmp_path / "out"
    assert val.main(["--calibration", str(tmp_path / "calibration.json"), "--measured",
                     str(tmp_path / "measured.json"), "--out", str(out), "--workloads", ",".join(names)]) == 0
    report = json.loads((out / "validation.json").read_text())
    re = report["rechecked"]
    assert [d["drift"] for d in re["drift"]] == pytest.approx([0.25] * 2)  # per workload, both sides pooled
    assert [d["drift"] for d in re["drift_runs"]] == pytest.approx([0.25] * 4)  # every re-timing
    assert {(r["workload"], r["side"], r["metric"]) for r in re["rows"]} == {
        (r["workload"], r["side"], r["metric"]) for r in report["rows"]}
    assert all(r["measured"] is not None for r in re["rows"])
    assert re["counts"] == val.target_counts(re["rows"], re["ratios"])
    assert report["counts"] == val.target_counts(report["rows"], report["ratios"])
    text = (out / "validation.md").read_text()
    assert "## Primitives re-timed just before each run" in text and "+25.0%" in text


def test_without_rechecks_the_report_has_no_rechecked_section(tmp_path):
    (tmp_path / "calibration.json").write_text(json.dumps(_calibration()))
    out = tmp_path / "out"
    assert val.main(["--predict-only", "--calibration", str(tmp_path / "calibration.json"), "--out", str(out),
                     "--workloads", "dqn-cartpole-1r"]) == 0
    assert json.loads((out / "validation.json").read_text())["rechecked"] is None
    assert "re-timed" not in (out / "validation.md").read_text()
    assert val.parse_args(["--no-recheck"]).recheck is False and val.parse_args([]).recheck is True


class _FakeStudy:
    """The experience-path study's interface that :func:`measure` uses, without real runs."""

    def __init__(self, names):
        self.WORKLOADS = [type("W", (), {"name": n})() for n in names]
        self.runs = []

    def parse_args(self, argv):
        return argv

    def run_isolated(self, w, side, args):
        self.runs.append((w.name, side))
        return [{"workload": w.name, "side": side, "iteration_ms": 1.0}]

    def medians(self, rows):
        return rows


def test_a_failed_re_timing_is_reported_and_the_run_still_counts():
    study = _FakeStudy(["a", "b"])

    def recheck(name):
        if name == "b":
            raise RuntimeError("env creator failed")
        return {"env_runner": {"per_item": 1e-3}}

    meds, rechecks = val.measure(study, ["a", "b"], ["stock", "conduit"], 2, 1, log=lambda *_: None,
                                 recheck=recheck)
    assert study.runs == [("a", "stock"), ("a", "conduit"), ("b", "stock"), ("b", "conduit")]
    assert set(meds) == set(study.runs)
    assert [(r["workload"], r["side"], "entries" in r) for r in rechecks] == [
        ("a", "stock", True), ("a", "conduit", True), ("b", "stock", False), ("b", "conduit", False)]
    assert all("RuntimeError: env creator failed" in r["error"] for r in rechecks if r["workload"] == "b")
    failed = {"drift": [], "rows": [], "ratios": [], "counts": {"ratio": [0, 0]},
              "failed": val.failed_rechecks(rechecks)}
    text = "\n".join(val._recheck_section(failed))
    assert text.count("RE-TIMING FAILED: b [") == 2
    assert [(r["workload"], r["side"]) for r in val.failed_rechecks(rechecks)] == [("b", "stock"), ("b", "conduit")]
    assert val.measure(study, ["a"], ["stock"], 2, 1, log=lambda *_: None)[1] == []  # no recheck asked


def test_the_large_obs_sweep_is_re_timed_after_a_ray_session_ended():
    """Tune's env registry goes with the Ray session that held it (the calibration's, a run's): the
    re-timing registers the study's env again instead of falling back to ``gym.make(**env_config)``."""
    import shutil
    import tempfile

    import ray

    study = val.experience_path_study()
    name = "ppo-largeobs-1r-1l"
    configs = val.study_configs(study, study.parse_args([]), [name])
    short = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must fit in 107 bytes
    try:
        ray.init(num_cpus=1, include_dashboard=False, _temp_dir=short, log_to_driver=False)
    finally:
        ray.shutdown()
        shutil.rmtree(short, ignore_errors=True)
    entry = val.recheck_env_runner(configs, name, quick=True)
    assert entry["name"] == "env_runner:ppo-largeobs" and entry["per_item"] > 0
    assert entry["extra"]["bytes_per_step"] > 84 * 84 * 4  # the large observations, not a fallback env
    assert entry["extra"]["speed_probe"]["total_s"] > 0
    assert entry["extra"]["ray_attached"] is True  # timed and stamped with its own Ray up
    assert not ray.is_initialized()


@pytest.mark.parametrize("name", ["appo-cartpole-2r-1l", "dqn-cartpole-1r"])
def test_the_update_is_re_timed_as_the_calibration_timed_it(name):
    """A remote learner's one-thread ``Learner.update`` (APPO's learner-thread call) and a local learner's
    twin (DQN, wall clock with the driver's torch threads), each beside the EnvRunner sweep, with the same
    sweep sizes as the calibration's and the host probe and load stamped on each, timed attached to a
    running Ray as the calibration's are."""
    import ray

    study = val.experience_path_study()
    configs = val.study_configs(study, study.parse_args([]), [name])
    cal = _with_local(_calibration(), 0.0)
    got = val.recheck_primitives(configs, cal, name, quick=True)
    kinds = val.update_kinds(cal, configs, name)
    assert set(got) == {"env_runner", *kinds, *val.driver_kinds(cal, configs, name)}
    assert kinds == (["learner_update"] if name.startswith("appo") else ["learner_update_local"])
    key = val._recheck_key(configs, name)
    for kind, entry in got.items():
        assert entry["name"] == f"{kind}:{key}" and entry["per_item"] > 0 and entry["samples"] > 0
        assert entry["extra"]["speed_probe"]["total_s"] > 0 and len(entry["extra"]["load_average"]) == 3
        assert entry["extra"]["ray_attached"] is True  # timed as the calibration times it, Ray up
    assert not ray.is_initialized()  # the Ray it started for the re-timing is gone
    if name.startswith("appo"):  # whole fragments of the config, as the calibration sweeps them
        _, cfg = configs[name]
        fragment = cfg.get_rollout_fragment_length(worker_index=1)
        assert all(n % fragment == 0 for n in got["learner_update"]["sizes"])
    else:
        assert got["learner_update_local"]["extra"]["torch_threads"] >= 1
        assert 0.0 <= got["learner_update_local"]["extra"]["busy_cores"] <= os.cpu_count() + 0.01


def test_dqns_driver_calls_are_re_timed_beside_its_update():
    """DQN's step is made of its driver's calls as much as of its update: where the calibration measured them,
    each is re-timed before a run with the calibration's own DQN measurement (the workload's config, one torch
    thread), and the re-timed prediction reads them; other algorithms have none."""
    study = val.experience_path_study()
    names = ["dqn-cartpole-1r", "appo-cartpole-2r-1l"]
    configs = val.study_configs(study, study.parse_args([]), names)
    cal = _with_local(_calibration(), 0.0)
    kinds = val.DQN_CALL_PRIMITIVES
    for kind in kinds:
        cal["workload"][f"{kind}:dqn-cartpole"] = {"name": f"{kind}:dqn-cartpole", "per_item": 1e-5, "latency": 1e-4,
                                                   "bandwidth": 1e5, "samples": 10, "sizes": [1, 2], "unit": "calls",
                                                   "medians": [1e-4, 2e-4], "extra": {}}
    assert val.driver_kinds(cal, configs, "dqn-cartpole-1r") == list(kinds)
    assert val.driver_kinds(cal, configs, "appo-cartpole-2r-1l") == []
    got = val.recheck_primitives(configs, cal, "dqn-cartpole-1r", quick=True)
    assert set(got) == {"env_runner", "learner_update_local", *kinds}
    for kind in kinds:  # measured now, not the calibration's placeholder
        assert got[kind]["name"] == f"{kind}:dqn-cartpole" and got[kind]["samples"] > 0
        assert got[kind]["latency"] != 1e-4 and len(got[kind]["extra"]["load_average"]) == 3
    rechecks = [{"workload": "dqn-cartpole-1r", "side": side, "run": 0, "entries": got} for side in ("stock", "conduit")]
    drift = {d["kind"] for d in val.primitive_drift(cal, configs, rechecks) if d["workload"] == "dqn-cartpole-1r"}
    assert set(kinds) <= drift


@given(busy=st.one_of(st.none(), st.floats(0.0, 4.0)), load=st.floats(0.0, 8.0))
def test_a_local_twin_is_quiet_by_the_busy_cores_before_it_else_by_its_load_average(busy, load):
    entry = {"samples": 10, "extra": {"load_average": [load, load, load], **({"busy_cores": busy} if busy is not None
                                                                             else {})}}
    by_load = load < val.QUIET_LOAD_PER_CORE * os.cpu_count()
    assert val.local_usable(entry) == (busy < val.QUIET_BUSY_CORES if busy is not None else by_load)
    assert not val.local_usable({**entry, "samples": 0})


def test_busy_cores_is_a_share_of_the_machines_cores():
    from conduit.runtime.proccpu import busy_cores

    got = busy_cores(0.2)
    assert got is not None and 0.0 <= got <= os.cpu_count() + 0.01


@given(cpu=times, wall=times, get_share=st.floats(0.0, 1.0))
def test_wall_clock_weights_scale_their_two_ends_with_them(cpu, wall, get_share):
    entry = {"latency": cpu, "per_item": cpu, "samples": 10, "sizes": [1, 2],
             "extra": {"wall_medians": [wall, 2 * wall], "get_s": get_share * cpu, "set_s": (1 - get_share) * cpu}}
    got = val._primitive({"workload": {"weights:k": entry}}, "weights", "k", "wall")
    assert got["latency"] == wall
    assert got["extra"]["get_s"] + got["extra"]["set_s"] == pytest.approx(wall)
    assert got["extra"]["get_s"] == pytest.approx(get_share * wall)
    assert entry["extra"]["get_s"] == get_share * cpu  # the calibration itself is not changed


class _DriftingStudy(_FakeStudy):
    """A fake study whose every run of a (workload, side) reads the next of ``values``."""

    def __init__(self, names, values):
        super().__init__(names)
        self.values = list(values)

    def run_isolated(self, w, side, args):
        self.runs.append((w.name, side))
        at = sum(1 for r in self.runs if r == (w.name, side)) - 1
        return [{"workload": w.name, "side": side, "iteration_ms": float(self.values[at]), "iterations": 3}]


@given(values=st.lists(st.floats(1.0, 1e4), min_size=1, max_size=5))
def test_repeated_runs_interleave_and_report_the_median_of_their_medians(values):
    import statistics

    study = _DriftingStudy(["a", "b"], values)
    meds, _ = val.measure(study, ["a", "b"], ["stock", "conduit"], 2, 1, log=lambda *_: None, runs=len(values))
    one_pass = [("a", "stock"), ("a", "conduit"), ("b", "stock"), ("b", "conduit")]
    assert study.runs == one_pass * len(values)  # every row once, then again: interleaved
    for key in one_pass:
        m = meds[key]
        assert m["iteration_ms"] == statistics.median(values)
        assert m["runs"] == len(values) and m["iteration_ms_runs"] == values
        assert m["iterations"] == (3 * len(values) if len(values) > 1 else 3)


def test_zero_runs_are_refused():
    with pytest.raises(ValueError, match="runs must be at least 1"):
        val.measure(_FakeStudy(["a"]), ["a"], ["stock"], 2, 1, log=lambda *_: None, runs=0)
    with pytest.raises(SystemExit):
        val.parse_args(["--runs", "0"])
    with pytest.raises(SystemExit):
        val.parse_args(["--runs", "2", "--predict-only"])
    assert val.parse_args(["--runs", "3"]).runs == 3


@given(costs=st.lists(st.floats(1e-4, 1e-2), min_size=1, max_size=6))
def test_the_re_timed_prediction_uses_the_median_runs_sweep(costs):
    rechecks = [{"workload": "a", "side": "stock", "run": i, "entries": {
        "env_runner": {"per_item": c},
        "learner_update": {"per_item": c / 100, "latency": 1e-3 - c / 10, "sizes": [10, 100]}}}
        for i, c in enumerate(costs)]
    rechecks.append({"workload": "a", "side": "stock", "run": len(costs), "error": "RuntimeError: x"})
    rechecks.append({"workload": "a", "side": "conduit", "run": 0, "entries": {"env_runner": {"per_item": 1.0}}})
    chosen = val.median_rechecks(rechecks + [{"workload": "b", "side": "stock", "run": 0, "error": "x"}])
    assert len(chosen) == 1 and chosen[0]["sides"] == ["stock", "conduit"]  # pooled; b has none
    costs = [*costs, 1.0]  # the conduit side's re-timing joins the stock side's
    ranked = sorted(costs)
    assert chosen[0]["entries"]["env_runner"]["per_item"] == ranked[(len(ranked) - 1) // 2]
    # the update's median by its cost at the largest size (1 ms - c/10 + c: rising with c), picked on its own
    update = chosen[0]["entries"]["learner_update"]  # (only the stock side's runs re-timed it)
    ranked = sorted(costs[:-1])
    # (runs one ulp apart cost the same at the largest size once rounded: either is the median)
    assert update["per_item"] == pytest.approx(ranked[(len(ranked) - 1) // 2] / 100, rel=1e-12)


@given(latency=times, per_item=times, epochs=st.integers(1, 30), top=st.integers(1, 4000))
def test_the_drift_compares_an_update_at_its_largest_size_with_every_epoch(latency, per_item, epochs, top):
    call = {"latency": latency, "per_item": per_item, "sizes": [1, top], "extra": {"epochs_timed": epochs}}
    assert val._cost("learner_update_call", call) == pytest.approx(latency + per_item * top * epochs)
    assert val._cost("learner_update", {**call, "extra": {}}) == pytest.approx(latency + per_item * top)
    assert val._cost("env_runner", call) == per_item  # per env step: the sweep's slope


def test_the_runs_section_lists_each_runs_iteration_and_the_spread():
    rows = [{"workload": "a", "side": "stock", "runs": 3, "iteration_ms_runs": [300.0, 360.0, 330.0]},
            {"workload": "b", "side": "stock", "runs": 1, "iteration_ms_runs": [10.0]}]
    text = "\n".join(val.runs_section(rows))
    assert "| a | stock | 300, 360, 330 | 1.20 |" in text
    assert "| b |" not in text  # one run: nothing to spread
    assert val.runs_section(rows[1:]) == []


def test_the_validations_contention_file_replaces_the_calibrations(tmp_path):
    """``--contention FILE`` swaps the calibration's oversubscribed CPU cost; a bad file exits naming it."""
    path = tmp_path / "contention.json"
    path.write_text(json.dumps({"oversubscribed_cpu_cost": 1.2, "note": "n"}))
    calibration = {"host": {"cores": 2, "contention": {"oversubscribed_cpu_cost": 1.5}}, "measurements": {}}
    out = val.with_contention(calibration, path)
    assert out["host"]["contention"]["oversubscribed_cpu_cost"] == 1.2 and out["host"]["cores"] == 2
    assert calibration["host"]["contention"]["oversubscribed_cpu_cost"] == 1.5  # the input is not changed
    for bad in ({"oversubscribed_cpu_cost": 0.8}, {"note": "no cost"}, [1.2]):
        path.write_text(json.dumps(bad))
        with pytest.raises(SystemExit, match=r"--contention: .*contention\.json"):
            val.with_contention(calibration, path)
    path.write_text("{not json")
    with pytest.raises(SystemExit, match="--contention: cannot read"):
        val.with_contention(calibration, path)


@settings(max_examples=40, deadline=None)
@given(metric=st.sampled_from(list(val.TARGETS)[:2]), predicted=st.one_of(st.just(0.0), st.floats(1e-9, 10.0)))
def test_a_measured_zero_is_met_only_by_a_predicted_zero(metric, predicted):
    """An APPO learner that never waited measures 0 exposed latency; no relative error exists, and
    the prediction meets it by being 0 exactly, never by being small."""
    row = _row("w", "stock", metric, predicted, 0.0)
    assert val.within_target(row) is (predicted == 0.0)
    assert val.target_counts([row], [])[metric] == [int(predicted == 0.0), 1]
    assert (val.misses([row], []) == []) is (predicted == 0.0)
    assert (val._error_cell(row) == "exact (0)") is (predicted == 0.0)


def test_the_cold_call_law_is_read_from_the_primitives_when_measured_and_said_when_not(tmp_path):
    from conduit.sim.params import STOCK_COLD_SOURCES

    data = json.loads((Path(__file__).parents[1] / val.DEFAULT_PRIMITIVES).read_text())
    fields = {k for k, _ in STOCK_COLD_SOURCES.values()}
    assert fields <= set(data) and STOCK.rpc_cold_after == data["rpc_cold_after_s"] > 0  # section gap merged in
    before = {k: v for k, v in data.items() if k not in fields}  # a window measured before the section
    (tmp_path / "before.json").write_text(json.dumps(before))
    old = val.stock_costs_from_primitives(tmp_path / "before.json")
    assert StockCosts().rpc_cold_after > 0  # the built-in costs carry a law; the window's file did not measure one
    assert all(getattr(old, name) == 0.0 for name in STOCK_COLD_SOURCES)
    assert "off" in val.cold_call_summary(old, None, True)["state"]
    data = before
    law = {"rpc_cold_round_trip_s": 1.7e-3, "rpc_cold_caller_cpu_s": 0.98e-3, "rpc_cold_callee_cpu_s": 0.63e-3,
           "rpc_warm_within_s": 1.06e-3, "rpc_cold_after_s": 12.4e-3}
    path = tmp_path / "prims.json"
    path.write_text(json.dumps({**data, **law}))
    costs = val.stock_costs_from_primitives(path)
    assert (costs.rpc_cold_caller_cpu, costs.rpc_cold_callee_cpu, costs.rpc_cold_round_trip, costs.rpc_warm_within,
            costs.rpc_cold_after) == tuple(law[k] for k in ("rpc_cold_caller_cpu_s", "rpc_cold_callee_cpu_s",
                                                           "rpc_cold_round_trip_s", "rpc_warm_within_s",
                                                           "rpc_cold_after_s"))
    summary = val.cold_call_summary(costs, None, True)
    assert summary["state"] == "on" and summary["cold_after_s"] == 12.4e-3
    assert "cold from 12.40 ms" in val._cold_call_line(summary)
    assert val.cold_call_summary(costs, None, False)["state"] == "off (--no-cold-calls)"
    del law["rpc_cold_after_s"]  # half a law is refused, naming what is missing
    path.write_text(json.dumps({**data, **law}))
    with pytest.raises(SystemExit, match="rpc_cold_after_s"):
        val.stock_costs_from_primitives(path)


def _ppo_configs():
    w = type("W", (), {"algo": "ppo", "env": "largeobs", "name": "ppo-largeobs-1r-1l"})()
    d = type("W", (), {"algo": "dqn", "env": "cartpole", "name": "dqn-cartpole-1r"})()
    return {"ppo-largeobs-1r-1l": (w, None), "dqn-cartpole-1r": (d, None)}


def _memory(calls):
    return {"extra": {"memory": {"calls": calls}}}


@given(cal=st.lists(st.tuples(st.floats(0.1, 2.0), st.one_of(st.none(), st.floats(0, 500))), min_size=1, max_size=5),
       rate=st.one_of(st.none(), st.floats(0, 300)))
def test_the_gae_piece_is_reported_with_the_memory_the_vm_handed_back(cal, rate):
    import statistics

    calls = [{"wall_s": w, "system_s": w / 2, "faults": 190e3, "reported_mb_before": r} for w, r in cal]
    calibration = {"workload": {"gae_connector:ppo-largeobs": _memory(calls)}}
    rechecks = [{"workload": "ppo-largeobs-1r-1l", "side": "stock", "run": 0,
                 "entries": {"gae_connector": _memory([{"wall_s": 1.2, "reported_mb_before": 50.0}])}},
                {"workload": "ppo-largeobs-1r-1l", "side": "conduit", "run": 0, "error": "RuntimeError: x"}]
    medians = [{"workload": "ppo-largeobs-1r-1l", "side": "stock", "gae_ms": 1100.0,
                "reported_mb_per_s": math.nan if rate is None else rate},
               {"workload": "ppo-largeobs-1r-1l", "side": "conduit", "gae_ms": 1.0, "reported_mb_per_s": 9.0},
               {"workload": "dqn-cartpole-1r", "side": "stock", "reported_mb_per_s": 9.0}]
    rows = val.gae_piece_memory(_ppo_configs(), calibration, rechecks, medians)
    assert [r["workload"] for r in rows] == ["ppo-largeobs-1r-1l"]  # stock PPO only: conduit's piece is not GAE's
    row = rows[0]
    assert row["calibration"]["calls"] == len(cal)
    assert row["calibration"]["wall_s"] == pytest.approx(statistics.median(w for w, _ in cal))
    known = [r for _, r in cal if r is not None]
    assert row["calibration"]["calls_after_reporting"] == (sum(1 for r in known if r > 0) if known else None)
    assert row["rechecked"] == {"calls": 1, "wall_s": 1.2, "system_s": None, "faults": None,
                                "reported_mb_before": 50.0, "calls_after_reporting": 1}
    assert row["runs_gae_s"] == pytest.approx(1.1)
    assert row["runs_reported_mb_per_s"] == (None if rate is None else pytest.approx(rate))
    section = "\n".join(val._gae_memory_section(rows))
    assert "free page reporting" in section and "1.100 s" in section


def test_without_any_figure_of_the_reporting_there_is_no_memory_section():
    old = {"workload": {"gae_connector:ppo-largeobs": {"extra": {}}}}  # a calibration from before extra.memory
    rows = val.gae_piece_memory(_ppo_configs(), old, [], [{"workload": "ppo-largeobs-1r-1l", "side": "stock",
                                                            "gae_ms": 1000.0}])
    assert rows[0]["calibration"]["calls"] == 0 and rows[0]["runs_reported_mb_per_s"] is None
    assert val._gae_memory_section(rows) == []


def test_each_real_run_records_the_memory_the_vm_reported_meanwhile(monkeypatch, tmp_path):
    from conduit.runtime import pagereport

    counter = tmp_path / "reported_kib"
    counter.write_text("0")
    monkeypatch.setattr(pagereport, "PARAMETERS", tmp_path)

    class Reporting(_FakeStudy):
        def run_isolated(self, w, side, args):
            counter.write_text(str(int(counter.read_text()) + 4096))  # 4 MiB handed back during the run
            return super().run_isolated(w, side, args)

    meds, _ = val.measure(Reporting(["a"]), ["a"], ["stock"], 2, 1, log=lambda *_: None)
    assert meds[("a", "stock")]["reported_mb_per_s"] > 0
    monkeypatch.setattr(pagereport, "PARAMETERS", tmp_path / "absent")
    meds, _ = val.measure(_FakeStudy(["a"]), ["a"], ["stock"], 2, 1, log=lambda *_: None)
    assert math.isnan(meds[("a", "stock")]["reported_mb_per_s"])  # unknown, never 0


def test_a_local_learners_gae_piece_is_read_from_its_local_twin():
    w = type("W", (), {"algo": "ppo", "env": "cartpole"})()
    configs = {"ppo-cartpole-2r-local": (w, type("Cfg", (), {"num_learners": 0})())}
    calibration = {"workload": {"gae_connector:ppo-cartpole": _memory([{"wall_s": 9.0}]),
                                "gae_connector_local:ppo-cartpole": _memory([{"wall_s": 0.01}])}}
    rows = val.gae_piece_memory(configs, calibration, [], [{"workload": "ppo-cartpole-2r-local", "side": "stock"}])
    assert rows[0]["primitive"] == "gae_connector_local" and rows[0]["calibration"]["wall_s"] == 0.01


@given(times=st.lists(st.floats(1e-4, 1.0), min_size=3, max_size=3, unique=True).map(sorted),
       rows=st.integers(1, 4000))
def test_the_streams_value_pass_is_the_sweep_interpolated_at_its_piece(times, rows):
    entry = {"sizes": [64, 256, 1024], "medians": times, "extra": {"wall_medians": [2 * t for t in times]}}
    got = val.stream_value_pass(entry, rows)
    for n, t in zip((64, 256, 1024), times, strict=True):  # exact at the measured sizes
        assert val.stream_value_pass(entry, n) == pytest.approx(t / n)
    xs, ys = [0, 64, 256, 1024], [0.0, *times]
    if rows <= 1024:  # between two measured sizes: on the segment joining them (through the origin below 64)
        k = next(i for i in range(1, 4) if rows <= xs[i])
        expect = ys[k - 1] + (ys[k] - ys[k - 1]) * (rows - xs[k - 1]) / (xs[k] - xs[k - 1])
    else:  # beyond: along the last segment
        expect = ys[3] + (ys[3] - ys[2]) * (rows - 1024) / 768
    assert got == pytest.approx(expect / rows)
    # under --clock wall the sweep's wall-clock medians are read
    assert val.stream_value_pass({**entry, "clock": "wall"}, rows) == pytest.approx(2 * got)


def test_a_ppo_workloads_stream_pieces_are_its_fragment_split_as_the_deployed_policy_splits_it():
    from conduit.registry import create_policy
    from conduit.sim.deployed import deployed_stream_pieces
    from conduit.sim.engine import deployed_pieces
    from conduit.sim.workload import load_workload

    w = load_workload({"base": "ppo", "fragment_length": 2000, "envs_per_runner": 1, "bytes_per_step": 28_000})
    fields = {f: getattr(w, f) for f in ("name", "algorithm", "fragment_length", "envs_per_runner", "bytes_per_step")}
    rows = val.stream_piece_rows(fields)
    pieces = deployed_stream_pieces(w, create_policy("conduit"))
    # the simulator's own split of the fragment (equal pieces), not a re-derivation of it
    assert rows == deployed_pieces(w, pieces).chunk_steps and 1 < pieces < 2000 and 2000 % rows == 0


def test_the_calibrations_fresh_mapping_model_is_charged_and_said_or_its_absence_is_said():
    """``host.fresh_mapping`` (``conduit calibrate``'s :func:`conduit.runtime.freshmap.measure`) sets the four
    :class:`StockCosts` fields; ``--no-fresh-mapping`` or a calibration from before it leaves them off, and the
    report's sentence says which."""
    measured = {"fresh_map_per_byte": 3.5e-11, "reported_map_per_byte": 1.23e-9, "reported_ramp_from": 0.85,
                "reported_ramp_to": 2.5, "block_bytes": 64 << 20, "rounds": 5, "gaps_s": [0.25, 1.5, 4.0],
                "slow_share": [0.0, 0.6, 1.0], "warm_copy_s": 3.5e-3}
    calibration = {"host": {"fresh_mapping": measured}}
    stock, said = val.with_fresh_mapping(STOCK, calibration, True)
    assert said["state"] == "on"
    assert {k: getattr(stock, k) for k in val.FRESH_MAP_FIELDS} == {k: measured[k] for k in val.FRESH_MAP_FIELDS}
    line = val._fresh_mapping_line(said)
    assert "on." in line and "0.85 s" in line and "2.50 s" in line and "1.5 s 60%" in line
    assert val.with_fresh_mapping(STOCK, calibration, False) == (STOCK, {"state": "off (--no-fresh-mapping)"})
    old, said = val.with_fresh_mapping(STOCK, {"host": {}}, True)
    assert old == STOCK and "measured before" in said["state"] and "measured before" in val._fresh_mapping_line(said)
    bad = {"host": {"fresh_mapping": {**measured, "reported_ramp_from": 3.0}}}
    with pytest.raises(SystemExit, match="host.fresh_mapping: reported_ramp_from"):
        val.with_fresh_mapping(STOCK, bad, True)
    with pytest.raises(SystemExit, match="host.fresh_mapping"):
        val.with_fresh_mapping(STOCK, {"host": {"fresh_mapping": {**measured, "fresh_map_per_byte": "fast"}}}, True)
    assert val.parse_args(["--no-fresh-mapping"]).fresh_mapping is False and val.parse_args([]).fresh_mapping
    # a calibration that holds its rounds is read as the model fits rounds now, whatever fields it stored
    from conduit.fresh_mapping import fit_ramp

    rounds = {**measured, "gaps_s": [0.25, 1.5, 4.0], "extra_s": [[2e-3, 2e-3], [2e-3, 0.07], [0.07, 0.08]]}
    refit, said = val.with_fresh_mapping(STOCK, {"host": {"fresh_mapping": rounds}}, True)
    fitted = fit_ramp(rounds["gaps_s"], rounds["extra_s"], rounds["block_bytes"])
    assert {k: getattr(refit, k) for k in val.FRESH_MAP_FIELDS} == {k: fitted[k] for k in val.FRESH_MAP_FIELDS}
    assert said["slow_share"] == fitted["slow_share"]
    with pytest.raises(SystemExit, match="host.fresh_mapping"):
        val.with_fresh_mapping(STOCK, {"host": {"fresh_mapping": {**rounds, "extra_s": [[1e-3]]}}}, True)


def test_the_fresh_batch_is_charged_from_the_calibration_and_checked_against_its_connector_rounds(tmp_path):
    """PPO large-obs' train batch (2,000 steps of 36 KB: above the mmap ceiling) costs more with the calibration's
    fresh-mapping model than without (``--no-fresh-mapping``), on both sides; CartPole's does not. The report's
    connector check puts the calibration's rounds next to the model at the same idle gaps, and the model's
    figure is the connector's fit plus ``StockCosts.fresh_map`` at each round's gap."""
    cal = _calibration()
    fresh = {"fresh_map_per_byte": 4e-11, "reported_map_per_byte": 1.2e-9, "reported_ramp_from": 0.85,
             "reported_ramp_to": 2.5, "block_bytes": 64 << 20, "rounds": 5, "gaps_s": [0.25, 4.0],
             "slow_share": [0.0, 1.0], "warm_copy_s": 3e-3}
    cal["host"]["fresh_mapping"] = fresh
    rounds = [{"cpu_s": 0.05, "wall_s": 0.05, "idle_s": 1.2}, {"cpu_s": 0.09, "wall_s": 0.09, "idle_s": 2.0},
              {"cpu_s": 0.02, "wall_s": 0.02, "idle_s": 0.5}]
    cal["workload"]["batch_connector:ppo-largeobs"] = {
        "name": "batch_connector:ppo-largeobs", "per_item": 2e-5, "latency": 0.0, "samples": 9, "unit": "samples",
        "sizes": [500, 1000, 2000], "medians": [0.002, 0.004, 0.05], "note": "test", "extra": {"rounds": rounds}}
    (tmp_path / "calibration.json").write_text(json.dumps(cal))
    names = ["ppo-largeobs-1r-1l", "ppo-cartpole-2r-local"]
    medians = [{"workload": n, "side": s, "iteration_ms": 3000.0, "exposed_per_update_ms": 100.0,
                "experience_share": 0.03, "num_updates": 1.0, "c_ms": 40.0 if s == "stock" else 30.0}
               for n in names for s in ("stock", "conduit")]
    (tmp_path / "measured.json").write_text(json.dumps({"load": "test", "medians": medians}))
    reports = {}
    for flag in ("--fresh-mapping", "--no-fresh-mapping"):
        out = tmp_path / flag
        assert val.main(["--calibration", str(tmp_path / "calibration.json"), "--measured",
                         str(tmp_path / "measured.json"), "--out", str(out), "--workloads", ",".join(names),
                         flag]) == 0
        reports[flag] = json.loads((out / "validation.json").read_text())
    on, off = reports["--fresh-mapping"], reports["--no-fresh-mapping"]
    assert on["fresh_mapping"]["state"] == "on" and off["fresh_mapping"]["state"] == "off (--no-fresh-mapping)"

    def predicted(report, workload, side):
        return next(r["predicted"] for r in report["rows"] if (r["workload"], r["side"], r["metric"]) ==
                    (workload, side, "exposed_experience_path_s"))
    for side in ("stock", "conduit"):
        assert predicted(on, "ppo-largeobs-1r-1l", side) > predicted(off, "ppo-largeobs-1r-1l", side)
        assert predicted(on, "ppo-cartpole-2r-local", side) == predicted(off, "ppo-cartpole-2r-local", side)
    check = {r["workload"]: r for r in on["connector_check"]}["ppo-largeobs-1r-1l"]
    wl = on["workloads"]["ppo-largeobs-1r-1l"]
    built = wl["train_batch_per_learner"] * wl["bytes_per_step"] * wl["frame_stack"]
    stock, _ = val.with_fresh_mapping(STOCK, cal, True)
    chunk = wl["fragment_length"] * wl["envs_per_runner"]  # a PPO chunk: one sample() call's steps
    warm = stock.connector(2000 / wl["steps_per_row"], math.ceil(2000 / chunk) * max(1.0, chunk / wl["episode_length"]),
                           built)
    assert check["calibration_s"] == pytest.approx(0.05) and check["idle_s"] == pytest.approx(1.2)
    assert check["model_s"] == pytest.approx(warm + stock.fresh_map(built, 1.2))
    assert check["runs_stock_s"] == pytest.approx(0.04) and check["runs_conduit_s"] == pytest.approx(0.03)
    assert check["simulated_stock_s"] > warm  # the simulation's stock c: the fit and the fresh batch
    text = (tmp_path / "--fresh-mapping" / "validation.md").read_text()
    assert "## The learner connector's fresh batch" in text and "Fresh mapping (`conduit.fresh_mapping`): on" in text
    assert "## The learner connector's fresh batch" in (tmp_path / "--no-fresh-mapping" / "validation.md").read_text()
