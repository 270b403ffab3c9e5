"""Results a researcher can trust: provenance, validity, steady state, seeds, ``--sim-time``,
``--stock-costs``, and a clear error for every bad argument.

What is checked:

1. provenance: the resolved workload (overrides included), a topology hash that ignores the file's
   name but not a changed link, the cost parameters in force and their source, version and seed;
2. validity: the calibrated runs are inside the calibrated range; a GPU cluster extrapolates and
   says so; the extrapolation flag agrees with the range on drawn workloads (hypothesis);
3. steady state: a short window and a trending window are warned about, a long steady one is not;
4. seeds: the 95% t interval (hypothesis over drawn samples) and ``simulate_seeds``' means;
5. ``sim_time``: the window covers the asked time, deterministically;
6. ``--stock-costs``: the file's values reach the run and are echoed; each kind of bad file is an
   error naming the argument, the file and the field;
7. the CLI: bad ``--seeds``, ``--sim-time``, their conflicts, exit 2 with the argument named and no
   traceback.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sim import tiny_topology_dict

from conduit import __version__
from conduit.cli import main
from conduit.errors import ConduitError
from conduit.sim.cost_file import CostFileError, load_stock_costs, stock_costs_from_mapping
from conduit.sim.params import StockCosts
from conduit.sim.provenance import (
    MIN_ROUNDS,
    TREND_MIN_UPDATES,
    TREND_TOLERANCE,
    calibrated_points,
    topology_hash,
    window_trend,
)
from conduit.sim.run import simulate
from conduit.sim.seeds import interval, simulate_seeds
from conduit.sim.workload import load_workload
from conduit.topology import load_topology, topology_from_dict

TINY = tiny_topology_dict(nodes=1, gpus=2)


def tiny():
    return topology_from_dict(TINY)


# ------------------------------------------------------------------ 1. provenance
def test_provenance_names_what_produced_the_result():
    result = simulate(tiny(), "ppo", "conduit", iterations=2, seed=7, overrides={"runners_per_gpu": 2})
    prov = result.to_dict()["provenance"]
    assert prov["seed"] == 7 and prov["iterations"] == 2 and prov["project_version"] == __version__
    assert prov["workload"]["runners_per_gpu"] == 2  # the override, resolved
    assert prov["workload"] == json.loads(json.dumps(prov["workload"]))  # plain JSON
    expected = {k: v for k, v in asdict(result.workload).items()}
    assert prov["workload"]["fragment_length"] == expected["fragment_length"]  # the workload as run (split)
    assert prov["policy"]["name"] == "conduit" and prov["policy"]["params"]["depth"] == 2
    assert prov["topology"]["sha256"] == topology_hash(result_topology := tiny()) and len(prov["topology"]["sha256"]) == 64
    assert result_topology.name == prov["topology"]["name"]
    stock = prov["cost_parameters"]["stock"]
    assert "built-in" in stock["source"] and stock["values"] == asdict(StockCosts())


def test_topology_hash_follows_the_hardware_not_the_name():
    a = topology_hash(topology_from_dict(TINY))
    renamed = dict(TINY, name="other")
    assert topology_hash(topology_from_dict(renamed)) == a
    faster = json.loads(json.dumps(TINY))
    faster["links"][0]["bandwidth"] = "60 GB/s"
    assert topology_hash(topology_from_dict(faster)) != a
    assert topology_hash(load_topology("dgx-h100-x2")) == topology_hash(load_topology("dgx-h100-x2"))


# ------------------------------------------------------------------ 2. validity
def test_calibrated_points_are_the_calibration_reference():
    from conduit.sim.calibration import REFERENCE, REFERENCE_SOURCE
    from conduit.sim.provenance import CALIBRATED_RUNS, CALIBRATION_SOURCE

    assert {w for _, w in CALIBRATED_RUNS} == set(REFERENCE) and CALIBRATION_SOURCE == REFERENCE_SOURCE
    assert [p["workload"] for p in calibrated_points()] == [w for _, w in CALIBRATED_RUNS]


def test_calibrated_runs_do_not_extrapolate():
    for point in calibrated_points():
        result = simulate("reference-2core", point["workload"], "rllib-stock", iterations=2)
        assert result.validity["extrapolating"] is False
        assert all(d["factor_from_nearest"] == 1.0 for d in result.validity["dimensions"].values())


def test_a_gpu_cluster_extrapolates_and_says_so():
    result = simulate("dgx-h100-x2", "ppo", "rllib-stock", iterations=2)
    v = result.validity
    assert v["extrapolating"] is True
    assert v["dimensions"]["gpus"]["extrapolating"] and v["dimensions"]["gpus"]["factor_from_nearest"] is None
    assert any(w.startswith("extrapolating in gpus") for w in result.warnings)
    runners = v["dimensions"]["runners"]
    # the ppo preset's runners (10 per GPU, RLlib's Atari recipe) against the nearest calibrated run's
    assert runners["value"] == 10 * 16
    assert runners["factor_from_nearest"] == runners["value"] / runners["nearest"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bytes_per_step=st.sampled_from([64, 2800, 10_000, 28241, 100_000]), runners=st.integers(1, 3))
def test_extrapolation_flag_agrees_with_the_calibrated_range(bytes_per_step, runners):
    result = simulate("reference-2core", "ref-ppo-atari", "rllib-stock", iterations=1,
                      overrides={"bytes_per_step": bytes_per_step, "env_runners": runners})
    for dim, d in result.validity["dimensions"].items():
        low, high = d["calibrated_range"]
        assert d["extrapolating"] == (not low <= d["value"] <= high), dim
        if d["factor_from_nearest"] is not None:
            assert d["factor_from_nearest"] >= 1.0
    assert result.validity["extrapolating"] == any(d["extrapolating"] for d in result.validity["dimensions"].values())


# ------------------------------------------------------------------ 3. steady state
def test_short_window_is_warned_about():
    # the dqn preset (one EnvRunner): one update a round, so 3 measured updates are fewer than MIN_ROUNDS rounds
    result = simulate(tiny(), "dqn", "rllib-stock", iterations=4)
    ss = result.steady_state
    assert ss["round_updates"] >= 1 and ss["measured_updates"] < MIN_ROUNDS * ss["round_updates"]
    assert any(w.startswith("short window") for w in result.warnings)


def test_long_steady_ppo_window_is_not_warned_about():
    result = simulate(tiny(), "ppo", "rllib-stock", iterations=12, overrides={"env_step_cv": 0.0})
    ss = result.steady_state
    assert ss["warmup_updates"] == 1 and ss["measured_updates"] == 11
    assert ss["trend"] is not None and abs(ss["trend"]) <= TREND_TOLERANCE
    assert not [w for w in result.warnings if not w.startswith("extrapolating")]


@settings(max_examples=50, deadline=None)
@given(base=st.floats(0.01, 10.0), slowdown=st.floats(0.5, 2.0), n=st.integers(TREND_MIN_UPDATES, 60))
def test_a_trending_window_is_warned_about(base, slowdown, n):
    """The faithful stock models reach steady state at once (no workload here trends), so the trend
    check is exercised on windows whose second half runs ``slowdown`` times the first's."""
    series = np.full(n, base)
    series[n - n // 2:] *= slowdown
    trend, warning = window_trend(series)
    assert trend == pytest.approx(slowdown - 1.0, rel=1e-9, abs=1e-12)
    assert (warning is not None) == (abs(trend) > TREND_TOLERANCE)
    if warning is not None:
        assert warning.startswith("not steady")
    assert window_trend(series[: TREND_MIN_UPDATES - 1]) == (None, None)


def test_a_real_window_reports_its_trend():
    result = simulate("dgx-h100-x2", "dqn", "rllib-stock", iterations=12)
    ss = result.steady_state
    assert ss["trend"] is not None and abs(ss["trend"]) <= TREND_TOLERANCE
    assert not any(w.startswith("not steady") for w in result.warnings)


# ------------------------------------------------------------------ 4. seeds
@settings(deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=30))
def test_interval_contains_the_mean_and_follows_t(values):
    from scipy.stats import t

    c = interval(values)
    n = len(values)
    assert c["n"] == n
    assert c["ci95"][0] <= c["mean"] <= c["ci95"][1] or math.isclose(c["ci95"][0], c["ci95"][1])
    assert math.isclose(c["half_width"], t.ppf(0.975, n - 1) * c["std"] / math.sqrt(n), rel_tol=1e-9, abs_tol=1e-9)


def test_interval_ignores_nan_and_needs_two_values():
    assert interval([1.0, math.nan, 3.0])["n"] == 2
    assert math.isnan(interval([1.0])["half_width"])
    assert interval([])["n"] == 0


def test_simulate_seeds_reports_means_and_intervals():
    summary = simulate_seeds(tiny(), "ppo", "conduit", seeds=3, seed=5, iterations=3)
    assert summary.seeds == [5, 6, 7]
    assert [r.seed for r in summary.results] == [5, 6, 7]
    its = [r.metrics["iteration_time_s"] for r in summary.results]
    assert len(set(its)) > 1  # the seeds differ (env-step times are drawn)
    conf = summary.confidence["iteration_time_s"]
    assert math.isclose(conf["mean"], sum(its) / 3)
    assert conf["ci95"][0] < conf["mean"] < conf["ci95"][1]
    d = summary.to_dict()
    assert d["metrics"]["iteration_time_s"] == conf["mean"] and d["audit"]["violations"] == 0
    assert d["provenance"]["seed"] == [5, 6, 7] and len(d["runs"]) == 3
    for name in ("exposed_experience_path_s", "experience_path_s", "iteration_time_s", "experience_share"):
        assert name in d["metrics"] and name in d["confidence"]


# ------------------------------------------------------------------ 5. sim_time
def test_sim_time_covers_the_asked_window_deterministically():
    a = simulate(tiny(), "ppo", "rllib-stock", sim_time=12.0)
    b = simulate(tiny(), "ppo", "rllib-stock", sim_time=12.0)
    assert a.steady_state["window_s"] >= 12.0
    assert a.steady_state["sim_time_target_s"] == 12.0 and a.iterations == b.iterations
    assert a.metrics == b.metrics
    with pytest.raises(ConduitError, match="sim_time"):
        simulate(tiny(), "ppo", "rllib-stock", sim_time=0)


# ------------------------------------------------------------------ 6. --stock-costs
def test_stock_costs_file_reaches_the_run_and_is_echoed(tmp_path):
    path = tmp_path / "costs.yaml"
    path.write_text("rpc_overhead: 50 ms\nserialize_bandwidth: '1 GB/s'\n")
    assert load_stock_costs(path).rpc_overhead == 0.05
    base = simulate(tiny(), "ppo", "rllib-stock", iterations=3)
    slow = simulate(tiny(), "ppo", "rllib-stock", iterations=3, stock_costs=str(path))
    assert slow.metrics["iteration_time_s"] > base.metrics["iteration_time_s"]
    stock = slow.provenance["cost_parameters"]["stock"]
    assert stock["source"] == str(path.resolve())
    assert stock["values"]["rpc_overhead"] == 0.05 and stock["values"]["serialize_bandwidth"] == 1e9
    assert stock["values"]["connector_per_call"] == StockCosts().connector_per_call  # the rest kept


def test_stock_costs_under_a_top_level_key():
    assert stock_costs_from_mapping({"stock_costs": {"driver_bookkeeping": 0.001}}).driver_bookkeeping == 0.001


BAD_COST_FILES = [
    ("rpc_overhed: 1 ms\n", "rpc_overhed", "did you mean 'rpc_overhead'"),
    ("rpc_overhead: fast\n", "rpc_overhead", "cannot parse"),
    ("rpc_overhead: -1\n", "rpc_overhead", ">= 0"),
    ("serialize_bandwidth: 0\n", "serialize_bandwidth", "> 0"),
    ("rpc_overhead: .nan\n", "rpc_overhead", "finite"),
    ("connector_per_byte: '1 ms'\n", "connector_per_byte", "expected a number"),
    ("rpc_overhead: true\n", "rpc_overhead", "boolean"),
    ("learner_poll_cores: 1.5\n", "learner_poll_cores", "at most 1 core"),
    ("poll_neighbour_cost: 0.9\n", "poll_neighbour_cost", ">= 1"),
    ("poll_neighbour_cost: '2 ms'\n", "poll_neighbour_cost", "expected a number"),
    ("- 1\n- 2\n", None, "expected a mapping"),
    ("{}\n", None, "empty"),
    ("rpc_overhead: [1\n", None, "not valid YAML"),
]


@pytest.mark.parametrize(("text", "field", "message"), BAD_COST_FILES)
def test_bad_stock_cost_file_is_refused_naming_file_and_field(tmp_path, capsys, text, field, message):
    path = tmp_path / "costs.yaml"
    path.write_text(text)
    with pytest.raises(CostFileError) as info:
        load_stock_costs(path)
    assert str(path) in str(info.value) and message in str(info.value)
    if field is not None:
        assert info.value.field == field
    code = main(["sim", "--topology", "reference-2core", "--workload", "ref-ppo-atari", "--iterations", "1",
                 "--stock-costs", str(path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "--stock-costs" in err and str(path) in err and message in err


def test_missing_stock_cost_file(tmp_path, capsys):
    code = main(["sim", "--iterations", "1", "--stock-costs", str(tmp_path / "nope.yaml"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "--stock-costs" in err and "no such file" in err


# ------------------------------------------------------------------ 7. CLI
@pytest.mark.parametrize(("args", "named"), [
    (["--seeds", "0"], "--seeds"),
    (["--seeds", "many"], "--seeds"),
    (["--seeds", "1001"], "--seeds"),
    (["--sim-time", "0"], "--sim-time"),
    (["--sim-time", "-3"], "--sim-time"),
    (["--sim-time", "soon"], "--sim-time"),
    (["--sim-time", "2 GB"], "--sim-time"),
])
def test_bad_run_length_arguments_are_usage_errors(capsys, args, named):
    with pytest.raises(SystemExit) as info:
        main(["sim", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


def test_sim_time_and_iterations_are_alternatives(capsys):
    assert main(["sim", "--sim-time", "5", "--iterations", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--sim-time" in err and "--iterations" in err


def test_seeds_with_trace_is_refused(tmp_path, capsys):
    assert main(["sim", "--seeds", "2", "--trace", str(tmp_path / "t.csv"), "--no-progress"]) == 2
    assert "--seeds" in capsys.readouterr().err


def test_cli_json_with_seeds_and_stock_costs(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"rpc_overhead": 0.002}))
    out = subprocess.run([sys.executable, "-m", "conduit", "sim", "--topology", "reference-2core", "--workload",
                          "ref-ppo-atari", "--iterations", "2", "--seeds", "2", "--stock-costs", str(path), "--json",
                          "--no-progress"], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["seeds"] == [0, 1] and d["audit"]["violations"] == 0
    assert isinstance(d["audit"]["violations"], int)
    assert d["provenance"]["cost_parameters"]["stock"]["values"]["rpc_overhead"] == 0.002
    assert set(d["confidence"]["iteration_time_s"]) >= {"mean", "ci95", "std", "n"}
    assert "Traceback" not in out.stderr


def test_cli_json_single_run_has_the_blocks():
    out = subprocess.run([sys.executable, "-m", "conduit", "sim", "--topology", "reference-2core", "--workload",
                          "ref-dqn-cartpole", "--sim-time", "1", "--json", "--no-progress"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    for key in ("exposed_experience_path_s", "experience_path_s", "iteration_time_s", "experience_share"):
        assert key in d["metrics"]
    assert d["steady_state"]["window_s"] >= 1.0 and d["steady_state"]["sim_time_target_s"] == 1.0
    assert d["validity"]["extrapolating"] is False
    assert d["provenance"]["workload"]["name"] == load_workload("ref-dqn-cartpole").name
    assert isinstance(d["warnings"], list)


def test_sim_time_follows_one_time_line_with_independent_learners():
    # the design target's DQN learners update each at its own pace: the window is one learner's time, not
    # the sum (Conduit as deployed keeps RLlib's synchronous DQN loop: conduit-target is the free-running one)
    result = simulate(tiny(), "dqn", "conduit-target", sim_time=0.2)
    ss = result.steady_state
    assert result.recorder.synchronous is False
    assert 0.2 <= ss["window_s"] <= result.sim_time
    assert ss["window_s"] == pytest.approx(ss["measured_updates"] * result.metrics["iteration_time_s"], rel=1e-6)
