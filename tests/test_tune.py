"""``conduit tune`` (conduit/sim/tune.py): the space transform, the search, the API and the CLI.

Fast by construction: the search itself is tested on synthetic objectives (no simulation), and the
simulator runs only with small budgets on dgx-h100-x2 with two iterations.
"""

import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from conduit.errors import ConduitError
from conduit.policies.conduit_policy import conduit
from conduit.policy import Param
from conduit.registry import create_policy
from conduit.sim.tune import (
    Trial,
    TuneResult,
    check_policy_space,
    check_space,
    clip,
    contains,
    decode,
    encode,
    from_unit,
    sample_space,
    search_space,
    space_size,
    to_unit,
    tune,
)
from conduit.tuning_file import load_params

TOPOLOGY, WORKLOAD = "dgx-h100-x2", "ppo"
BUDGET, SEED, ITERATIONS = 6, 3, 2

REAL = Param("lr", low=0.0, high=1.0)
REAL_LOG = Param("size", low=1e3, high=1e9, log=True)
INT = Param("depth", low=1, high=4, integer=True)
INT_LOG = Param("group", low=1, high=8, integer=True, log=True)
CHOICE = Param("mode", choices=("a", "b", "c"))
SPACE = (REAL, REAL_LOG, INT, INT_LOG, CHOICE)


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conduit", *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=cwd)


# ------------------------------------------------------------------------------- space transform
def test_samples_respect_every_kind_of_parameter():
    samples = sample_space(SPACE, np.random.default_rng(0), 240)
    assert len(samples) == 240
    for s in samples:
        assert set(s) == {p.name for p in SPACE}
        assert contains(SPACE, s), s
        assert isinstance(s["lr"], float) and isinstance(s["size"], float)
        assert type(s["depth"]) is int and type(s["group"]) is int
        assert s["mode"] in CHOICE.choices
    frac = lambda pred: sum(map(pred, samples)) / len(samples)
    # linear real: half below the midpoint; log real: half below the geometric mean (not the midpoint)
    assert abs(frac(lambda s: s["lr"] < 0.5) - 0.5) < 0.05
    assert abs(frac(lambda s: s["size"] < 1e6) - 0.5) < 0.05
    assert frac(lambda s: s["size"] < 5e8) > 0.9
    # linear integer: every value equally often (Latin hypercube: exactly); log integer: small values favoured
    counts = {v: sum(s["depth"] == v for s in samples) for v in range(1, 5)}
    assert counts == {1: 60, 2: 60, 3: 60, 4: 60}
    groups = [sum(s["group"] == v for s in samples) for v in range(1, 9)]
    assert all(g > 0 for g in groups) and groups[0] > groups[3] > groups[7]
    assert {s["mode"] for s in samples} == {"a", "b", "c"}
    assert sample_space(SPACE, np.random.default_rng(0), 240) == samples  # seeded
    assert sample_space(SPACE, np.random.default_rng(1), 240) != samples


def test_unit_transform_round_trips_and_ends():
    for p, values in ((INT, range(1, 5)), (INT_LOG, range(1, 9)), (CHOICE, CHOICE.choices)):
        for v in values:
            assert from_unit(p, to_unit(p, v)) == v
        assert from_unit(p, 0.0) == (values[0] if p is not CHOICE else "a")
        assert from_unit(p, 1.0) == (max(values) if p is not CHOICE else "c")
    assert from_unit(REAL_LOG, 0.0) == 1e3 and from_unit(REAL_LOG, 1.0) == 1e9
    assert from_unit(REAL_LOG, 0.5) == pytest.approx(1e6, rel=1e-3)
    assert from_unit(REAL, 2.0) == 1.0 and from_unit(REAL, -1.0) == 0.0  # clipped into the cube
    point = {"lr": 0.25, "size": 4.2e5, "depth": 3, "group": 5, "mode": "b"}
    u = encode(SPACE, point)
    assert ((0 <= u) & (u <= 1)).all()
    assert decode(SPACE, u) == point
    assert space_size(SPACE) == math.inf and space_size((INT, CHOICE)) == 12


def test_clip_moves_values_into_the_space():
    out = clip(SPACE, {"lr": 7.0, "size": 1.0, "depth": 2.6, "group": 99, "mode": "b", "other": "kept"})
    assert out == {"lr": 1.0, "size": 1e3, "depth": 3, "group": 8, "mode": "b", "other": "kept"}
    assert type(out["depth"]) is int
    assert clip((Param("g", choices=(1, 2, 4, 8)),), {"g": 5}) == {"g": 4}
    with pytest.raises(ConduitError, match="'mode'"):
        clip(SPACE, {"mode": "z"})
    assert contains(SPACE, out) and not contains(SPACE, {"depth": 2.5}) and not contains(SPACE, {"mode": "z"})


@pytest.mark.parametrize("param, words", [
    (Param("x", low=0.0, high=1.0, log=True), "log scale needs low > 0"),
    (Param("x", low=2.0, high=1.0), "low <= high"),
    (Param("x"), "needs low and high, or choices"),
    (Param("x", choices=()), "choices is empty"),
    (Param("x", low=1.2, high=1.8, integer=True), "no integer"),
])
def test_bad_space_is_named(param, words):
    with pytest.raises(ConduitError, match=words):
        check_space((param,), "policy 'p'")


# ------------------------------------------------------------------------------- search (synthetic)
def _objective(params):
    """Minimum 0 at size=10**6.5, depth=3, mode 'a'; 'lr' does not matter; mode 'c' is faster but
    breaks the contract (infeasible); size above 1e8 fails outright."""
    if params["size"] > 1e8:
        return Trial(dict(params), {"error": "refused"}, False)
    f = (math.log10(params["size"]) - 6.5) ** 2 + 0.1 * (params["depth"] - 3) ** 2 \
        + {"a": 0.0, "b": 0.5, "c": -5.0}[params["mode"]] + 0.05 * abs(params["group"] - 2)
    return Trial(dict(params), {"f": f, "g": 0.0}, params["mode"] != "c")


DEFAULTS = {"lr": 0.3, "size": 1e8, "depth": 1, "group": 1, "mode": "b"}


def test_search_finds_the_feasible_optimum_within_budget():
    calls = []
    best, history = search_space(SPACE, _objective, DEFAULTS, budget=40, seed=0, objective="f",
                                 progress=lambda done, total: calls.append((done, total)))
    assert history[0].params == DEFAULTS  # defaults first
    assert len(history) == 40 and calls[-1] == (40, 40) and [c[0] for c in calls] == list(range(1, 41))
    keys = [json.dumps(t.params, sort_keys=True) for t in history]
    assert len(set(keys)) == len(keys)  # nothing simulated twice
    assert all(contains(SPACE, t.params) for t in history)
    assert any(not t.feasible for t in history)  # it did meet infeasible runs ...
    assert best.feasible and best.params["mode"] != "c"  # ... and never chose one
    assert best.metrics["f"] <= min(t.metrics["f"] for t in history if t.feasible)
    assert best.metrics["f"] < 0.15, best
    assert best.params["lr"] == DEFAULTS["lr"]  # a flat parameter is left at its default
    again, history2 = search_space(SPACE, _objective, DEFAULTS, budget=40, seed=0, objective="f")
    assert again == best and history2 == history
    _other, history3 = search_space(SPACE, _objective, DEFAULTS, budget=40, seed=1, objective="f")
    assert [t.params for t in history3] != [t.params for t in history]


def test_search_never_worse_than_defaults_and_small_discrete_spaces_are_enumerated():
    space = (Param("depth", low=1, high=3, integer=True), Param("mode", choices=("a", "b")))
    best, history = search_space(space, lambda p: Trial(p, {"f": 1.0}, True), {"depth": 2, "mode": "a"},
                                 budget=20, seed=0, objective="f")
    assert len(history) == 6  # all of it, once each
    assert best.params == {"depth": 2, "mode": "a"}  # every tie goes to the defaults
    best, history = search_space(SPACE, _objective, {**DEFAULTS, "size": 2e8}, budget=5, seed=0, objective="f")
    assert len(history) == 1 and best is None  # defaults that cannot even run stop the search
    best, history = search_space(SPACE, _objective, {**DEFAULTS, "mode": "c"}, budget=5, seed=0, objective="f")
    assert not history[0].feasible and best is not None and best.feasible  # infeasible defaults are beaten
    best, history = search_space(SPACE, _objective, DEFAULTS, budget=1, seed=0, objective="f")
    assert history == [best] and best.params == DEFAULTS


# ------------------------------------------------------------------------------- the simulator
@pytest.fixture(scope="module")
def tuned() -> tuple[TuneResult, list]:
    calls = []
    result = tune(TOPOLOGY, WORKLOAD, "conduit", budget=BUDGET, seed=SEED, iterations=ITERATIONS,
                  progress=lambda done, total: calls.append((done, total)))
    return result, calls


def test_tune_conduit_stays_in_its_space_and_never_loses_to_defaults(tuned):
    result, calls = tuned
    space = create_policy("conduit").space
    assert set(result.best_params) == {p.name for p in space}
    assert contains(space, result.best_params)
    assert result.default_params == create_policy("conduit").params
    assert result.history[0].params == result.default_params
    assert 1 < result.simulations <= BUDGET and calls[-1] == (result.simulations, BUDGET)
    assert all(t.feasible for t in result.history if t.params == result.best_params)
    obj = result.objective
    assert obj == "iteration_time_s"
    assert result.best_metrics[obj] <= result.default_metrics[obj]
    assert result.best_metrics["violations"] == 0
    ratio, percent = result.gain(obj)
    assert ratio >= 1.0 and percent >= 0.0


def test_tune_is_deterministic_for_a_seed(tuned):
    result, _ = tuned
    again = tune(TOPOLOGY, WORKLOAD, "conduit", budget=BUDGET, seed=SEED, iterations=ITERATIONS)
    assert again.best_params == result.best_params and again.best_metrics == result.best_metrics
    assert [t.params for t in again.history] == [t.params for t in result.history]


def test_cli_writes_a_file_that_sim_reproduces(tuned, tmp_path):
    result, _ = tuned
    out = tmp_path / "tuned.json"
    proc = run("tune", "--topology", TOPOLOGY, "--workload", WORKLOAD, "--policy", "conduit",
               "--budget", str(BUDGET), "--seed", str(SEED), "--iterations", str(ITERATIONS), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    for words in ("parameter", "target_chunk_bytes", "exposed experience-path latency", "iteration time",
                  "default/best", "reduction", str(out)):
        assert words in proc.stdout, proc.stdout
    assert "simulations" not in proc.stderr  # no progress bar off a terminal
    params = load_params(out, "conduit")
    assert params == result.best_params  # the CLI, another process, made the same choices
    data = json.loads(out.read_text())
    assert data["topology"] == TOPOLOGY and data["workload"] == WORKLOAD and data["seed"] == SEED
    assert data["objective"] == "iteration_time_s" and data["budget"] == BUDGET
    sim = run("sim", "--topology", TOPOLOGY, "--workload", WORKLOAD, "--policy", "conduit", "--params", str(out),
              "--iterations", str(ITERATIONS), "--seed", str(SEED), "--json")
    assert sim.returncode == 0, sim.stderr
    metrics = json.loads(sim.stdout)["metrics"]
    for key in ("iteration_time_s", "exposed_experience_path_s"):
        assert metrics[key] == pytest.approx(data["best_metrics"][key], rel=1e-9)
        assert metrics[key] == pytest.approx(result.best_metrics[key], rel=1e-9)
    # parameters tuned for one policy never configure another
    with pytest.raises(ConduitError, match="tuned for 'conduit', used with 'all-gpu'"):
        load_params(out, "all-gpu")
    other = run("sim", "--policy", "rllib-stock", "--params", str(out), "--iterations", "1")
    assert other.returncode != 0 and "tuned for 'conduit'" in other.stderr and "Traceback" not in other.stderr


def test_cli_default_output_path(tmp_path):
    proc = run("tune", "--topology", TOPOLOGY, "--workload", WORKLOAD, "--policy", "conduit", "--budget", "1",
               "--iterations", "2", "--no-progress", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "results" / f"tuned-conduit-{WORKLOAD}-{TOPOLOGY}.json"
    assert load_params(path, "conduit") == create_policy("conduit").params  # budget 1: the defaults
    assert "not beaten" in proc.stdout


def test_tune_a_policy_factory_with_a_small_discrete_space():
    def factory(**kw):
        policy = conduit(**kw)
        return replace(policy, space=(Param("depth", choices=(1, 2)), Param("granularity", choices=(1, 2))))

    result = tune(TOPOLOGY, WORKLOAD, factory, budget=10, iterations=2)
    assert result.policy == "conduit" and result.simulations == 4  # enumerated, each once
    assert {tuple(sorted(t.params.items())) for t in result.history} == {
        (("depth", d), ("granularity", g)) for d in (1, 2) for g in (1, 2)}


@pytest.mark.parametrize("kwargs, words", [
    ({"policy": "rllib-stock"}, "policy 'rllib-stock' declares no tunable parameters"),
    ({"policy": "all-gpu"}, "declares no search space"),
    ({"policy": "conduit", "budget": 0}, "budget must be an integer >= 1"),
    ({"policy": "conduit", "iterations": 0}, "iterations must be"),
    ({"policy": "conduit", "objective": "experience_share"}, "unknown objective"),
    ({"policy": "conduit", "iterations": 1}, "undefined for ppo with 1 iteration"),
    ({"policy": "no-such-policy"}, "unknown policy 'no-such-policy'"),
])
def test_api_errors(kwargs, words):
    policy = kwargs.pop("policy")
    with pytest.raises(ConduitError, match=words):
        tune(TOPOLOGY, WORKLOAD, policy, **kwargs)


@pytest.mark.parametrize("args, words", [
    (("--policy", "rllib-stock"), "declares no tunable parameters"),
    (("--policy", "conduit", "--budget", "0"), "--budget must be >= 1"),
    (("--policy", "conduit", "--topology", "no-such-topology"), "no-such-topology"),
])
def test_cli_errors_are_one_clear_line(args, words, tmp_path):
    base = {"--topology": TOPOLOGY, "--workload": WORKLOAD}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    proc = run("tune", *[x for kv in base.items() for x in kv], "--out", str(tmp_path / "x.json"))
    assert proc.returncode != 0
    assert words in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "x.json").exists()


# ------------------------------------------------------- spaces the policy cannot be tuned over
def _no_simulation(monkeypatch):
    """Make any simulation fail the test: the refusals below must come before the first one."""
    import conduit.sim.engine

    class NoSimulation:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a simulation ran before the search space was refused")

    monkeypatch.setattr(conduit.sim.engine, "Simulation", NoSimulation)


def _unknown_keyword(depth: int = 2):
    """conduit(depth=...) declaring a parameter its factory does not take."""
    return replace(conduit(depth=depth), space=(Param("depth", low=1, high=4, integer=True),
                                                Param("prefetch", low=0, high=3, integer=True)))


def _default_out_of_range(depth: int = 6):
    """conduit(depth=...) whose default depth lies outside its declared range."""
    return replace(conduit(depth=depth), space=(Param("depth", low=1, high=4, integer=True),))


def _default_not_a_choice(granularity: int = 1):
    """conduit(granularity=...) whose default granularity is not one of its declared choices."""
    return replace(conduit(granularity=granularity), space=(Param("granularity", choices=(2, 4)),))


UNKNOWN_KEYWORD = ("policy 'unknown-keyword': search-space parameter 'prefetch' is not a keyword of the policy's "
                   "factory, which takes: depth")
OUT_OF_RANGE = ("policy 'out-of-range': the default of parameter 'depth', 6, lies outside its declared range: "
                "an integer in [1, 4]")
NOT_A_CHOICE = ("policy 'not-a-choice': the default of parameter 'granularity', 1, lies outside its declared "
                "range: one of [2, 4]")


@pytest.fixture
def bad_policies(monkeypatch):
    """The process-wide registry with the built-ins and three policies whose spaces are refused."""
    import conduit.registry
    from conduit.policies import register_builtins
    from conduit.registration import PolicyEntry, PolicyRegistry

    registry = PolicyRegistry()
    register_builtins(registry)
    for name, factory in (("unknown-keyword", _unknown_keyword), ("out-of-range", _default_out_of_range),
                          ("not-a-choice", _default_not_a_choice)):
        registry.register(PolicyEntry(name, "policy", factory, factory.__doc__))
    monkeypatch.setattr(conduit.registry, "_REGISTRY", registry)
    _no_simulation(monkeypatch)


@pytest.mark.parametrize("name, message", [
    ("unknown-keyword", UNKNOWN_KEYWORD), ("out-of-range", OUT_OF_RANGE), ("not-a-choice", NOT_A_CHOICE),
])
def test_tune_refuses_a_space_the_registered_factory_cannot_take(bad_policies, name, message):
    with pytest.raises(ConduitError) as info:
        tune(TOPOLOGY, WORKLOAD, name, budget=BUDGET, iterations=ITERATIONS)
    assert str(info.value) == message


@pytest.mark.parametrize("name, message", [
    ("unknown-keyword", UNKNOWN_KEYWORD), ("out-of-range", OUT_OF_RANGE), ("not-a-choice", NOT_A_CHOICE),
])
def test_cli_refuses_a_bad_space_with_one_line_and_no_file(bad_policies, name, message, tmp_path, capsys):
    from conduit.cli import main

    out = tmp_path / "x.json"
    code = main(["tune", "--topology", TOPOLOGY, "--workload", WORKLOAD, "--policy", name, "--budget", "3",
                 "--iterations", str(ITERATIONS), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err == f"conduit: error: {message}\n"
    assert captured.out == "" and not out.exists()


def test_tune_refuses_a_factory_without_the_keyword_before_simulating(monkeypatch):
    _no_simulation(monkeypatch)
    with pytest.raises(ConduitError) as info:
        tune(TOPOLOGY, WORKLOAD, _unknown_keyword, budget=BUDGET, iterations=ITERATIONS)
    assert str(info.value) == UNKNOWN_KEYWORD.replace("'unknown-keyword'", "'conduit'")
    with pytest.raises(ConduitError) as info:
        tune(TOPOLOGY, WORKLOAD, _default_out_of_range, budget=BUDGET, iterations=ITERATIONS)
    assert str(info.value) == OUT_OF_RANGE.replace("'out-of-range'", "'conduit'")


def test_a_fixed_janus_configuration_is_refused_naming_its_parameters(tmp_path):
    """``janus-gpu-co-so-g1`` carries the parametric ``janus`` space, but its factory takes no keyword."""
    out = tmp_path / "x.json"
    proc = run("tune", "--topology", TOPOLOGY, "--workload", WORKLOAD, "--policy", "janus-gpu-co-so-g1",
               "--budget", "2", "--iterations", str(ITERATIONS), "--out", str(out))
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr and not out.exists()
    assert proc.stderr == ("conduit: error: policy 'janus-gpu-co-so-g1': search-space parameter 'placement' is not "
                           "a keyword of the policy's factory, which takes: no parameters\n")


def test_check_policy_space_rules():
    depth = Param("depth", low=1, high=4, integer=True)
    headroom = Param("headroom", low=0.0, high=0.3)
    mode = Param("mode", choices=(True, False))
    check_policy_space((depth, headroom, mode), {"depth": 4, "headroom": 0.0, "mode": False},
                       {"depth": 2, "headroom": 0.1, "mode": True}, "p")
    check_policy_space((Param("anything", low=0, high=1),), {}, None, "p")  # **kwargs takes any keyword
    # a default missing from the policy's params is read from the factory's signature
    with pytest.raises(ConduitError, match=r"^p: the default of parameter 'headroom', 0.5, lies outside its "
                                           r"declared range: \[0.0, 0.3\]$"):
        check_policy_space((headroom,), {}, {"headroom": 0.5}, "p")
    for bad in (2.5, 0, 5, True, math.nan, "2"):
        with pytest.raises(ConduitError, match="'depth'"):
            check_policy_space((depth,), {"depth": bad}, None, "p")
    with pytest.raises(ConduitError, match=r"one of \[True, False\]"):
        check_policy_space((mode,), {"mode": 1}, None, "p")


def test_tune_simulates_with_the_stock_costs_it_is_given():
    """The deployed model pays the stock sampler's, RPC and connector costs: a tuning run on a calibrated
    machine must use that machine's stock costs (studies/tune_loop.py passes validation's)."""
    import conduit as conduit_api
    from conduit.sim.params import StockCosts

    dear = replace(StockCosts(), driver_bookkeeping=StockCosts().driver_bookkeeping * 20)
    tuned = tune(TOPOLOGY, WORKLOAD, "conduit", budget=1, seed=SEED, iterations=ITERATIONS, stock_costs=dear)
    direct = conduit_api.simulate(TOPOLOGY, WORKLOAD, "conduit", iterations=ITERATIONS, seed=SEED, stock_costs=dear)
    assert tuned.default_metrics["iteration_time_s"] == pytest.approx(direct.metrics["iteration_time_s"], rel=1e-12)
    plain = tune(TOPOLOGY, WORKLOAD, "conduit", budget=1, seed=SEED, iterations=ITERATIONS)
    assert plain.default_metrics["iteration_time_s"] != tuned.default_metrics["iteration_time_s"]
