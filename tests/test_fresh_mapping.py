"""A fresh mapping's first touch (:mod:`conduit.fresh_mapping`): the ramp, its fit from measured rounds, the
measurement itself (:mod:`conduit.runtime.freshmap`), the cost as :class:`StockCosts` charges it, and the
simulation charging it on a learner's batch above glibc's mmap ceiling -- and nowhere else."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sim import tiny_topology_dict

from conduit.errors import ConduitError
from conduit.fresh_mapping import MMAP_CEILING_BYTES, RAMP_GRID_S, RAMP_REACH, fit_ramp
from conduit.ramp import linear_ramp
from conduit.registry import create_policy
from conduit.runtime import freshmap
from conduit.sim.cost_file import CostFileError, stock_costs_from_mapping
from conduit.sim.engine import Simulation
from conduit.sim.params import StockCosts
from conduit.sim.workload import load_workload
from conduit.topology import topology_from_dict

SIM = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ON = replace(StockCosts(), fresh_map_per_byte=40e-12, reported_map_per_byte=1.2e-9, reported_ramp_from=0.8,
             reported_ramp_to=2.5)


@settings(max_examples=200, deadline=None)
@given(lo=st.floats(0, 5), span=st.floats(0, 5), a=st.floats(-1, 12), b=st.floats(-1, 12))
def test_the_ramp_rises_from_0_at_lo_to_1_at_hi_and_never_falls(lo, span, a, b):
    hi = lo + span
    x, y = sorted((a, b))
    assert 0.0 <= linear_ramp(x, lo, hi) <= linear_ramp(y, lo, hi) <= 1.0
    if x <= lo:
        assert linear_ramp(x, lo, hi) == 0.0
    if y >= hi and y > lo:
        assert linear_ramp(y, lo, hi) == 1.0


@settings(max_examples=200, deadline=None)
@given(nbytes=st.floats(0, 4e9), idle=st.floats(0, 10))
def test_the_built_in_costs_charge_nothing(nbytes, idle):
    assert StockCosts().fresh_map(nbytes, idle) == 0.0


@settings(max_examples=200, deadline=None)
@given(nbytes=st.floats(1, 4e9), idle=st.floats(0, 10), later=st.floats(0, 10))
def test_only_a_block_above_the_ceiling_pays_and_more_after_a_longer_idle(nbytes, idle, later):
    cost = ON.fresh_map(nbytes, idle)
    if nbytes <= MMAP_CEILING_BYTES:
        assert cost == 0.0  # the allocator reuses what was freed
        return
    fresh, everything = nbytes * ON.fresh_map_per_byte, nbytes * (ON.fresh_map_per_byte + ON.reported_map_per_byte)
    assert fresh * (1 - 1e-12) <= cost <= everything * (1 + 1e-12)
    assert ON.fresh_map(nbytes, max(idle, later)) >= cost  # never cheaper after a longer idle
    if idle <= ON.reported_ramp_from:
        assert cost == pytest.approx(fresh)
    if idle >= ON.reported_ramp_to:
        assert cost == pytest.approx(everything)


def test_a_ramp_that_ends_before_it_starts_is_refused_in_code_and_in_a_cost_file():
    with pytest.raises(ConduitError, match="reported_ramp_from"):
        replace(StockCosts(), reported_ramp_from=2.0, reported_ramp_to=1.0)
    with pytest.raises(CostFileError, match="reported_ramp_from"):
        stock_costs_from_mapping({"reported_ramp_from": "2 s", "reported_ramp_to": "1 s"}, "costs.yaml")
    costs = stock_costs_from_mapping({"reported_ramp_from": "850 ms", "reported_ramp_to": "2.5 s",
                                      "reported_map_per_byte": 1.2e-9, "fresh_map_per_byte": 4e-11}, "costs.yaml")
    assert (costs.reported_ramp_from, costs.reported_ramp_to) == (0.85, 2.5)
    with pytest.raises(CostFileError, match="reported_map_per_byte"):
        stock_costs_from_mapping({"reported_map_per_byte": -1.0}, "costs.yaml")


grid = st.integers(0, 60).map(lambda i: i * RAMP_GRID_S)


@settings(max_examples=30, deadline=None)
@given(lo=grid, span=grid, rounds=st.integers(1, 6),
       gaps=st.lists(st.floats(0.05, 3.0), min_size=2, max_size=8, unique=True),
       base=st.floats(1e-4, 5e-3), extra=st.floats(1e-2, 0.2))
def test_the_fit_reads_the_base_and_reproduces_a_ramp_its_rounds_came_from(lo, span, rounds, gaps, base, extra):
    """Rounds whose extra is exactly ``base + extra x ramp(gap)`` (the shortest gap before the ramp starts): the
    fit reads the base from the shortest gap, and its amplitude times its ramp gives back every gap's mean -- it
    fits no worse than the ramp the rounds came from, which is exact and on the search's grid."""
    gaps = sorted(gaps)
    lo = max(lo, math.ceil(gaps[0] / RAMP_GRID_S) * RAMP_GRID_S)  # on the grid, no earlier than the shortest gap
    hi = lo + span
    nbytes = 64 << 20
    rows = [[base + extra * linear_ramp(g, lo, hi)] * rounds for g in gaps]
    fit = fit_ramp(gaps, rows, nbytes)
    assert fit["fresh_map_per_byte"] == pytest.approx(base / nbytes)
    assert 0 <= fit["reported_ramp_from"] <= fit["reported_ramp_to"]
    if hi > RAMP_REACH * max(gaps):  # the true ramp is past the searched grid
        return
    amplitude = fit["reported_map_per_byte"] * nbytes
    for g, row in zip(gaps, rows, strict=True):
        modelled = amplitude * linear_ramp(g, fit["reported_ramp_from"], fit["reported_ramp_to"])
        assert modelled == pytest.approx(row[0] - base, abs=1e-9 + 1e-6 * extra)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.floats(0.0, 0.2), min_size=1, max_size=6), min_size=2, max_size=6))
def test_the_fitted_model_is_never_negative_and_its_share_is_a_share(rows):
    gaps = [0.5 * (k + 1) for k in range(len(rows))]
    fit = fit_ramp(gaps, rows, 1 << 20)
    assert fit["fresh_map_per_byte"] >= 0 and fit["reported_map_per_byte"] >= 0
    assert 0 <= fit["reported_ramp_from"] <= fit["reported_ramp_to"] <= RAMP_REACH * max(gaps) + RAMP_GRID_S
    assert all(0 <= s <= 1 for s in fit["slow_share"]) and len(fit["slow_share"]) == len(gaps)


def test_without_reporting_there_is_no_ramp():
    fit = fit_ramp([0.25, 1.0, 4.0], [[2e-3, 2e-3], [2e-3, 2e-3], [1.9e-3, 2e-3]], 64 << 20)
    assert fit["reported_map_per_byte"] == 0.0 and fit["reported_ramp_from"] == fit["reported_ramp_to"] == 0.0
    assert fit["fresh_map_per_byte"] == pytest.approx(2e-3 / (64 << 20))
    assert fit["slow_share"] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(("gaps", "rounds", "nbytes", "what"), [
    ([0.5, 1.0], [[1.0]], 1, "one non-empty list"),
    ([0.5, 1.0], [[1.0], []], 1, "one non-empty list"),
    ([1.0, 0.5], [[1.0], [1.0]], 1, "increase strictly"),
    ([0.5, 0.5], [[1.0], [1.0]], 1, "increase strictly"),
    ([0.5, 1.0], [[1.0], [1.0]], 0, "nbytes"),
])
def test_the_fit_refuses_rounds_it_cannot_read(gaps, rounds, nbytes, what):
    with pytest.raises(ValueError, match=what):
        fit_ramp(gaps, rounds, nbytes)


def test_the_measurement_times_every_gap_every_round_and_fits_them():
    slept: list[float] = []
    out = freshmap.measure(gaps=(0.3, 0.1), rounds=2, nbytes=1 << 20, sleep=slept.append)
    assert sorted(slept) == [0.1, 0.1, 0.3, 0.3]  # each gap once per round, in a shuffled order
    assert out["gaps_s"] == [0.1, 0.3] and [len(r) for r in out["extra_s"]] == [2, 2]
    assert all(x >= 0 for r in out["extra_s"] for x in r) and out["warm_copy_s"] > 0
    assert out["block_bytes"] == 1 << 20 and out["rounds"] == 2 and "fresh array" in out["note"]
    refit = fit_ramp(out["gaps_s"], out["extra_s"], out["block_bytes"])
    assert {k: out[k] for k in refit} == refit
    with pytest.raises(ValueError, match="rounds"):
        freshmap.measure(gaps=(0.1,), rounds=0, sleep=slept.append)


# ------------------------------------------------------------------ the simulation


def _run(workload, policy: str, stock: StockCosts, **kw) -> tuple[Simulation, object]:
    topo = topology_from_dict(tiny_topology_dict(gpus=1, cores=16))
    sim = Simulation(topo, workload, create_policy(policy), iterations=3, seed=0, stock=stock, **kw)
    return sim, sim.run()


@SIM
@given(per_byte=st.floats(1e-12, 2e-10), reported=st.floats(0, 2e-9))
def test_stock_ppo_pays_the_fresh_batch_in_its_connector(per_byte, reported):
    """The stock learner's connector (segment *c*) over a 113 MB batch (the ``ppo`` preset: 4,000 steps of four
    stacked 7 KB frames) pays the fresh mapping, and the reported share in full once the learner idled past the
    ramp (here a step at 0: every iteration's learner idled)."""
    w = replace(load_workload("ppo"), learners=1)
    off = _run(w, "rllib-stock", StockCosts())[1]
    costs = replace(StockCosts(), fresh_map_per_byte=per_byte, reported_map_per_byte=reported)
    sim, on = _run(w, "rllib-stock", costs)
    built = w.train_batch_per_learner * w.bytes_per_step * w.frame_stack
    assert built > MMAP_CEILING_BYTES
    assert on.segments["c"] - off.segments["c"] == pytest.approx(built * (per_byte + reported), rel=1e-6)
    assert on.audit.violations == 0 and on.sim_time > off.sim_time
    assert set(sim.learner_idle_since) == {lr.id for lr in sim.layout.learners}  # each update's end, kept


@SIM
@given(start=st.floats(0.0, 3.0))
def test_a_later_ramp_never_makes_a_run_slower(start):
    w = replace(load_workload("ppo"), learners=1)
    early = replace(ON, reported_ramp_from=0.0, reported_ramp_to=0.0)
    late = replace(ON, reported_ramp_from=start, reported_ramp_to=start + 1.0)
    assert _run(w, "rllib-stock", late)[1].segments["c"] <= _run(w, "rllib-stock", early)[1].segments["c"] + 1e-12


def test_conduit_as_deployed_pays_it_at_update_start_too():
    w = replace(load_workload("ppo"), learners=1)
    everything = replace(ON, reported_ramp_from=0.0, reported_ramp_to=0.0)
    off, on = (_run(w, "conduit", costs)[1] for costs in (StockCosts(), everything))
    assert on.audit.violations == 0
    assert on.metrics["exposed_experience_path_s"] > off.metrics["exposed_experience_path_s"]


@pytest.mark.parametrize("policy", ["rllib-stock", "conduit"])
def test_a_batch_below_the_ceiling_is_charged_nothing(policy):
    """CartPole-sized rows: the same run (all but the cost parameters it echoes)."""
    w = replace(load_workload("ppo"), learners=1, bytes_per_step=17.0, frame_stack=1)
    assert w.train_batch_per_learner * w.bytes_per_step < MMAP_CEILING_BYTES
    everything = replace(ON, reported_ramp_from=0.0, reported_ramp_to=0.0)
    charged, plain = (_run(w, policy, costs)[1].outcome() for costs in (everything, StockCosts()))
    assert charged.pop("provenance")["cost_parameters"] != plain.pop("provenance")["cost_parameters"]
    assert charged == plain


def test_the_rounds_of_the_development_vm_give_a_two_second_ramp():
    """The rounds of 2026-12-07 19:58 (64 MiB, five rounds per gap; ms over a pre-faulted copy) fit as the model's
    docstrings say: nothing reported after 0.7 s idle, everything from 2.7 s, 1.33 ms per MiB on reported memory."""
    gaps = [0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0]
    ms = [[2.3, 2.3, 2.3, 2.3, 2.2], [4.2, 2.4, 2.3, 1.8, 2.2], [2.6, 35.2, 2.4, 2.4, 2.2],
          [77.2, 2.5, 5.0, 94.1, 71.6], [2.3, 67.5, 3.0, 102.8, 67.6], [69.0, 85.1, 89.3, 84.5, 70.7],
          [83.9, 89.3, 90.3, 70.9, 128.8], [69.8, 104.1, 67.2, 89.7, 85.2]]
    fit = fit_ramp(gaps, [[x / 1e3 for x in r] for r in ms], 64 << 20)
    assert (fit["reported_ramp_from"], fit["reported_ramp_to"]) == (0.7, 2.7)
    assert fit["reported_map_per_byte"] * 2**20 * 1e3 == pytest.approx(1.332, abs=5e-3)
    assert fit["fresh_map_per_byte"] * 2**20 * 1e3 == pytest.approx(statistics.median(ms[0]) / 64)
