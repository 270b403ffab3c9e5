"""The warm-up debt (:mod:`conduit.sim.coldwork`): the per-(process, kind) clock and the debt as the simulation
charges it -- off it changes nothing, it is charged only where DQN runs the primitives it was measured on, it never
shortens a round, and with every piece cold it adds its figures to the back-to-back model's. The built-in costs
carry a measured debt (section ``wake`` merged into the shipped file), so the properties start from
:data:`NO_DEBT`, those costs with every figure and the ramp at 0, and set the figures themselves."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sim import tiny_topology_dict

from conduit.errors import ConduitError
from conduit.registry import create_policy
from conduit.sim.coldwork import KINDS
from conduit.sim.engine import Simulation
from conduit.sim.params import STOCK_WAKE_SOURCES, StockCosts
from conduit.sim.run import simulate
from conduit.sim.workload import load_workload
from conduit.topology import topology_from_dict

SIM = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: the built-in costs without the warm-up debt
NO_DEBT = replace(StockCosts(), **{f"wake_{kind}": 0.0 for kind in KINDS}, wake_warm_within=0.0, wake_cold_after=0.0)
debt = st.floats(1e-5, 3e-3)
debts = st.fixed_dictionaries({f"wake_{kind}": debt for kind in KINDS})


def _topology(gpus: int = 1):
    return topology_from_dict(tiny_topology_dict(nodes=1, gpus=gpus))


def _run(algorithm, policy, stock, local=True, iterations=None):
    iterations = iterations or {"ppo": 3, "dqn": 40, "appo": 12}[algorithm]
    return simulate(_topology(), algorithm, policy, iterations=iterations, stock_costs=stock,
                    overrides={"runners_per_gpu": 1, "local_learner": local}).to_dict()["metrics"]


def _on(figures: dict, warm: float = 0.0, cold: float = 1e-9) -> StockCosts:
    return replace(NO_DEBT, **figures, wake_warm_within=warm, wake_cold_after=cold)


def test_the_built_in_costs_carry_the_measured_debt_and_it_lengthens_dqn_rounds():
    """The shipped stock file holds section ``wake``: a default DQN run charges the debt (its primitives run once a
    round, 10 ms or more apart: cold), so it is longer than the same run without it; PPO's is not touched."""
    s = StockCosts()
    assert all(getattr(s, f"wake_{kind}") > 0.0 for kind in KINDS)
    assert 0.0 < s.wake_warm_within < s.wake_cold_after
    for policy in ("rllib-stock", "conduit"):
        assert _run("dqn", policy, s)["iteration_time_s"] > _run("dqn", policy, NO_DEBT)["iteration_time_s"], policy
    assert _run("ppo", "rllib-stock", s) == _run("ppo", "rllib-stock", NO_DEBT)


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["driver", "runner"]), st.sampled_from(KINDS),
                                st.floats(0.0, 0.03), st.floats(0.0, 5e-3)), min_size=1, max_size=20),
       figures=debts, warm=st.floats(0.0, 0.005), span=st.floats(1e-6, 0.02))
def test_a_piece_pays_by_the_time_since_the_same_kind_of_piece_of_its_process_ended(steps, figures, warm, span):
    sim = Simulation(_topology(), load_workload("dqn"), create_policy("rllib-stock"), iterations=1,
                     stock=_on(figures, warm, warm + span))
    sim.env = SimpleNamespace(now=0.0)  # a clock to move by hand: the simulation itself is not run
    ramp, ends = sim.wake_ramp, {}
    for process, kind, step, seconds in steps:
        sim.env.now += step
        now = sim.env.now
        share = 1.0 if (process, kind) not in ends else ramp.share(now - ends[(process, kind)])
        paid = sim.cold_work(process, kind, seconds)
        assert paid == pytest.approx(share * figures[f"wake_{kind}"])
        assert 0.0 <= paid <= figures[f"wake_{kind}"]
        ends[(process, kind)] = now + seconds + paid


@SIM
@given(algorithm=st.sampled_from(["ppo", "dqn", "appo"]), policy=st.sampled_from(["rllib-stock", "conduit"]),
       figures=debts, local=st.booleans())
def test_figures_without_a_ramp_change_nothing(algorithm, policy, figures, local):
    off = replace(NO_DEBT, **figures)  # wake_cold_after 0: no ramp
    assert _run(algorithm, policy, off, local) == _run(algorithm, policy, NO_DEBT, local)


@SIM
@given(algorithm=st.sampled_from(["ppo", "appo"]), policy=st.sampled_from(["rllib-stock", "conduit"]),
       figures=debts, local=st.booleans())
def test_only_dqn_is_charged(algorithm, policy, figures, local):
    """The figures are DQN's primitives; other algorithms run their work in long pieces, back to back."""
    assert _run(algorithm, policy, _on(figures), local) == _run(algorithm, policy, NO_DEBT, local)


@SIM
@given(policy=st.sampled_from(["rllib-stock", "conduit"]), figures=debts, local=st.booleans(),
       scale=st.floats(1.0, 3.0))
def test_the_debt_never_shortens_a_dqn_round_and_more_of_it_never_less(policy, figures, local, scale):
    base = _run("dqn", policy, NO_DEBT, local)["iteration_time_s"]
    some = _run("dqn", policy, _on(figures), local)["iteration_time_s"]
    more = _run("dqn", policy, _on({k: v * scale for k, v in figures.items()}), local)["iteration_time_s"]
    assert base * (1 - 1e-9) <= some <= more * (1 + 1e-9)


@SIM
@given(figures=debts)
def test_every_piece_cold_adds_the_figures_on_a_stock_dqn_rounds_critical_path(figures):
    """Stock DQN with a local learner is one thread after another (the driver waits for the sample call, then
    adds, draws, updates, syncs; the EnvRunner's set_state runs at the next call): with the ramp ending at 1 ns
    every piece pays its whole figure, and every figure lies on the round's path once, set_state twice (the
    EnvRunner's and the driver's local EnvRunner's), the update's not at all (this learner is a GPU's). The
    cold-call law is off here: a longer weight sync spaces the next sample call further from the sync's set_state
    calls, and the law charges that spacing (a second-order effect, tested with the law)."""
    base = _run("dqn", "rllib-stock", NO_DEBT.without_cold_calls())["iteration_time_s"]
    cold = _run("dqn", "rllib-stock", _on(figures).without_cold_calls())["iteration_time_s"]
    want = sum(figures.values()) + figures["wake_set_state"] - figures["wake_update"]
    assert cold - base == pytest.approx(want, rel=1e-6)


def test_a_gpu_learners_update_pays_no_debt():
    """The update's figure is a CPU learner's: a GPU's update is not charged it (only what runs on the CPU is)."""
    topo = _topology(gpus=1)
    stock = _on({"wake_update": 2e-3})
    runs = [simulate(topo, "dqn", "rllib-stock", iterations=40, stock_costs=s,
                     overrides={"runners_per_gpu": 1, "local_learner": False}).to_dict()["metrics"]
            for s in (NO_DEBT, stock)]
    assert runs[0] == runs[1]


def test_a_falling_ramp_is_refused_naming_the_fields(tmp_path):
    with pytest.raises(ConduitError, match="wake_warm_within"):
        replace(StockCosts(), wake_warm_within=0.02, wake_cold_after=0.01)
    from conduit.sim.cost_file import CostFileError, load_stock_costs

    path = tmp_path / "costs.yaml"
    path.write_text("wake_warm_within: 5 ms\nwake_cold_after: 2 ms\n")
    with pytest.raises(CostFileError, match=r"costs\.yaml: wake_warm_within: .*must not exceed wake_cold_after"):
        load_stock_costs(path)
    path.write_text("wake_warm_within: 1 ms\nwake_cold_after: 20 ms\nwake_update: 1.5 ms\n")
    costs = load_stock_costs(path)
    assert (costs.wake_warm_within, costs.wake_cold_after, costs.wake_update) == pytest.approx((1e-3, 20e-3, 1.5e-3))
    assert costs.without_warm_up_debt().wake_cold_after == 0.0


def test_validation_reads_the_debt_from_a_window_that_measured_it_and_says_when_not(tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "studies"))
    import validation as val

    data = json.loads((Path(__file__).parents[1] / val.DEFAULT_PRIMITIVES).read_text())
    fields = {k for k, _ in STOCK_WAKE_SOURCES.values()}
    assert fields <= set(data)  # section wake merged into the built-in file
    data = {k: v for k, v in data.items() if k not in fields}  # a window measured before the section
    (tmp_path / "before.json").write_text(json.dumps(data))
    old = val.stock_costs_from_primitives(tmp_path / "before.json")
    assert StockCosts().wake_cold_after > 0  # the built-in costs carry a debt; the window's file did not measure one
    assert all(getattr(old, name) == 0.0 for name in STOCK_WAKE_SOURCES)
    assert "no section wake" in val.warm_up_debt_summary(old, True)["state"]
    wake = {"wake_runner_call_s": 1.46e-3, "wake_set_state_s": 0.46e-3, "wake_get_state_s": 0.40e-3,
            "wake_replay_add_s": 0.54e-3, "wake_replay_sample_s": 0.77e-3, "wake_update_s": 1.70e-3,
            "wake_warm_within_s": 1e-3, "wake_cold_after_s": 20e-3}
    path = tmp_path / "prims.json"
    path.write_text(json.dumps({**data, **wake}))
    costs = val.stock_costs_from_primitives(path)
    assert all(getattr(costs, name) == wake[key] for name, (key, _) in STOCK_WAKE_SOURCES.items())
    summary = val.warm_up_debt_summary(costs, True)
    assert summary["state"] == "on" and summary["update_s"] == 1.70e-3
    line = val._warm_up_debt_line(summary)
    assert "cold from 20.00 ms" in line and "runner call +1.460" in line
    assert val.warm_up_debt_summary(costs, False)["state"] == "off (--no-warm-up-debt)"
    del wake["wake_update_s"]  # half of the section is refused, naming what is missing
    path.write_text(json.dumps({**data, **wake}))
    with pytest.raises(SystemExit, match="wake_update_s"):
        val.stock_costs_from_primitives(path)
