"""The cold-call law (:mod:`conduit.sim.raycalls`): the ramp, the per-process clock, and the law as the simulation
charges it -- off it changes nothing; with every call cold it is the back-to-back model with the spaced figures,
call for call. The built-in costs carry a measured law (section ``gap`` merged into the shipped files), so the
properties start from :data:`STOCK_NO_LAW` / :data:`PLANE_NO_LAW`, those costs with the law's fields at 0."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sim import tiny_topology_dict

from conduit.registry import create_policy
from conduit.sim.engine import Simulation
from conduit.sim.params import PlaneCosts, StockCosts
from conduit.sim.raycalls import CallClock, ColdRamp
from conduit.sim.run import simulate
from conduit.sim.workload import load_workload
from conduit.topology import topology_from_dict

#: the built-in costs without the cold-call law (every call at its back-to-back figure)
STOCK_NO_LAW = replace(StockCosts(), rpc_cold_round_trip=0.0, rpc_cold_caller_cpu=0.0, rpc_cold_callee_cpu=0.0,
                       rpc_warm_within=0.0, rpc_cold_after=0.0)
PLANE_NO_LAW = replace(PlaneCosts(), cold_call_round_trip=0.0, cold_callee_cpu=0.0, cold_draw=0.0, cold_priorities=0.0)
SIM = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
seconds = st.floats(0.0, 0.05)


@settings(max_examples=200, deadline=None)
@given(warm=seconds, span=st.floats(1e-9, 0.05), a=st.floats(-0.01, 0.2), b=st.floats(-0.01, 0.2))
def test_the_share_ramps_from_0_after_warm_within_to_1_at_cold_after(warm, span, a, b):
    ramp = ColdRamp(warm, warm + span)
    lo, hi = sorted((a, b))
    assert 0.0 <= ramp.share(lo) <= ramp.share(hi) <= 1.0  # never more than the whole surcharge, never falls
    if lo <= warm:
        assert ramp.share(lo) == 0.0
    if hi >= warm + span:
        assert ramp.share(hi) == 1.0


@given(interval=st.floats(-1.0, 1.0))
def test_no_law_no_share(interval):
    assert ColdRamp().share(interval) == 0.0 and not ColdRamp().active


def test_a_ramp_that_falls_is_refused():
    with pytest.raises(ValueError, match="warm_within"):
        ColdRamp(0.02, 0.01)


@settings(max_examples=100, deadline=None)
@given(starts=st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from("abcd"), st.floats(0.0, 0.01))
                       .filter(lambda c: c[0] != c[1]), min_size=1, max_size=20))
def test_a_process_is_cold_by_the_time_since_it_last_started_a_call_as_either_side(starts):
    ramp = ColdRamp(0.001, 0.004)
    clock, last, now = CallClock(ramp), {}, 0.0
    for caller, callee, step in starts:
        now += step
        expected = tuple(1.0 if p not in last else ramp.share(now - last[p]) for p in (caller, callee))
        assert clock.start(caller, callee, now) == pytest.approx(expected)
        last[caller] = last[callee] = now


def _topology():
    return topology_from_dict(tiny_topology_dict(nodes=1, gpus=1))


def _run(algorithm, policy, stock, plane=None, iterations=None, local=False):
    overrides = {"runners_per_gpu": 1, "local_learner": local}
    iterations = iterations or {"ppo": 3, "dqn": 40, "appo": 12}[algorithm]
    return simulate(_topology(), algorithm, policy, iterations=iterations, stock_costs=stock,
                    plane_costs=PLANE_NO_LAW if plane is None else plane,
                    overrides=overrides).to_dict()["metrics"]


surcharge = st.floats(1e-5, 2e-3)


@SIM
@given(algorithm=st.sampled_from(["ppo", "dqn", "appo"]), policy=st.sampled_from(["rllib-stock", "conduit"]),
       warm=st.floats(0.0, 0.01), span=st.floats(1e-6, 0.02))
def test_a_law_of_zero_surcharges_changes_nothing(algorithm, policy, warm, span):
    with_law = replace(STOCK_NO_LAW, rpc_warm_within=warm, rpc_cold_after=warm + span)
    assert _run(algorithm, policy, with_law) == _run(algorithm, policy, STOCK_NO_LAW)


@SIM
@given(algorithm=st.sampled_from(["ppo", "dqn", "appo"]), policy=st.sampled_from(["rllib-stock", "conduit"]),
       caller=surcharge, callee=surcharge, trip=st.floats(0.0, 2e-3))
def test_surcharges_without_a_ramp_change_nothing(algorithm, policy, caller, callee, trip):
    costs = replace(STOCK_NO_LAW, rpc_cold_caller_cpu=caller, rpc_cold_callee_cpu=callee,
                    rpc_cold_round_trip=caller + callee + trip)
    assert _run(algorithm, policy, costs) == _run(algorithm, policy, STOCK_NO_LAW)


@SIM
@given(algorithm=st.sampled_from(["ppo", "dqn"]), local=st.booleans(), caller=surcharge, callee=surcharge,
       trip=st.floats(0.0, 2e-3))
def test_every_call_cold_is_the_back_to_back_model_with_the_spaced_figures(algorithm, local, caller, callee, trip):
    """One runner, one learner: no two calls of a process start in the same instant, so with the ramp ending at
    1 ns every call pays the whole surcharge, and the run must equal the law-free run whose back-to-back figures
    are the spaced ones (the round trip grown by the caller's surcharge and the residual trip). A remote
    learner's Ray side of the ``update`` call has no back-to-back figure in the model (``rpc_callee_cpu`` is the
    EnvRunner's), only the law's surcharge: there the cold run is the longer one."""
    base = STOCK_NO_LAW
    cold = replace(base, rpc_cold_caller_cpu=caller, rpc_cold_callee_cpu=callee,
                   rpc_cold_round_trip=caller + callee + trip, rpc_warm_within=0.0, rpc_cold_after=1e-9)
    spaced = replace(base, rpc_driver_cpu=base.rpc_driver_cpu + caller, rpc_callee_cpu=base.rpc_callee_cpu + callee,
                     rpc_overhead=base.rpc_overhead + caller + trip)
    got, want = _run(algorithm, "rllib-stock", cold, local=local), _run(algorithm, "rllib-stock", spaced, local=local)
    if local:
        assert got == pytest.approx(want, rel=1e-9, nan_ok=True)
    else:
        assert got["iteration_time_s"] >= want["iteration_time_s"] * (1 - 1e-9)
        if algorithm == "ppo":  # the learner's surcharge is on the experience path, once per update
            assert got["iteration_time_s"] == pytest.approx(want["iteration_time_s"] + callee, rel=1e-6)


@SIM
@given(caller=surcharge, callee=surcharge, plane_callee=surcharge, draw=surcharge, priorities=surcharge,
       plane_trip=st.floats(0.0, 2e-3), local=st.booleans())
def test_deployed_dqn_with_every_plane_call_cold_lies_between_the_back_to_back_and_the_spaced_models(
        caller, callee, plane_callee, draw, priorities, plane_trip, local):
    """Under ``enable()`` a process starts calls in the same instant (a local learner's prefetch thread draws as
    the driver calls its EnvRunner): the second is warm by the law, so the run is not the spaced model exactly,
    but no shorter than the back-to-back one and, with a local learner, no longer than the spaced one. (A remote
    learner's thread also serves the law's surcharge on the driver's ``update`` call, which the spaced model has
    no figure for, and that work queues ahead of the learner's plane calls: no upper bound there.)"""
    base, plane = STOCK_NO_LAW, PLANE_NO_LAW
    cold_stock = replace(base, rpc_cold_caller_cpu=caller, rpc_cold_callee_cpu=callee,
                         rpc_cold_round_trip=caller + callee, rpc_warm_within=0.0, rpc_cold_after=1e-9)
    cold_plane = replace(plane, cold_call_round_trip=caller + plane_callee + plane_trip, cold_callee_cpu=plane_callee,
                         cold_draw=draw, cold_priorities=priorities)
    spaced_stock = replace(base, rpc_driver_cpu=base.rpc_driver_cpu + caller,
                           rpc_callee_cpu=base.rpc_callee_cpu + callee, rpc_overhead=base.rpc_overhead + caller)
    spaced_plane = replace(plane, call_round_trip=plane.call_round_trip + caller + plane_trip,
                           actor_callee_cpu=plane.actor_callee_cpu + plane_callee,
                           replay_draw_per_call=plane.replay_draw_per_call + draw,
                           priorities_per_call=plane.priorities_per_call + priorities)
    got = _run("dqn", "conduit", cold_stock, cold_plane, local=local)["iteration_time_s"]
    spaced = _run("dqn", "conduit", spaced_stock, spaced_plane, local=local)["iteration_time_s"]
    warm = _run("dqn", "conduit", base, plane, local=local)["iteration_time_s"]
    assert warm * (1 - 1e-9) <= got
    if local:
        assert got <= spaced * (1 + 1e-9)


def test_cold_calls_lengthen_a_dqn_round():
    base = STOCK_NO_LAW
    cold = replace(base, rpc_cold_caller_cpu=1e-3, rpc_cold_callee_cpu=1e-3, rpc_cold_round_trip=2.5e-3,
                   rpc_warm_within=1e-3, rpc_cold_after=5e-3)
    for policy in ("rllib-stock", "conduit"):
        warm, spaced = _run("dqn", policy, base), _run("dqn", policy, cold)
        assert math.isfinite(spaced["iteration_time_s"])
        assert spaced["iteration_time_s"] > warm["iteration_time_s"], policy


def test_a_cost_file_whose_ramp_falls_is_refused_naming_the_file_and_the_field(tmp_path):
    from conduit.sim.cost_file import CostFileError, load_stock_costs

    path = tmp_path / "costs.yaml"
    path.write_text("rpc_warm_within: 5 ms\nrpc_cold_after: 2 ms\n")
    with pytest.raises(CostFileError, match=r"costs\.yaml: rpc_warm_within: .*must not exceed rpc_cold_after"):
        load_stock_costs(path)
    path.write_text("rpc_warm_within: 1 ms\nrpc_cold_after: 12 ms\nrpc_cold_caller_cpu: 0.9 ms\n")
    costs = load_stock_costs(path)
    assert (costs.rpc_warm_within, costs.rpc_cold_after, costs.rpc_cold_caller_cpu) == pytest.approx((1e-3, 12e-3, 9e-4))


def test_the_built_in_costs_carry_the_measured_law_and_it_lengthens_dqn_rounds():
    """The shipped cost files hold section ``gap`` and the plane's ``*_cold`` figures: a default run charges the
    law (DQN calls its EnvRunner about once per 20 ms: cold), so it is longer than the same run without it."""
    assert 0 < StockCosts().rpc_warm_within < StockCosts().rpc_cold_after
    assert min(PlaneCosts().cold_callee_cpu, PlaneCosts().cold_draw, PlaneCosts().cold_call_round_trip) > 0
    for policy in ("rllib-stock", "conduit"):
        law = _run("dqn", policy, StockCosts(), PlaneCosts())["iteration_time_s"]
        assert law > _run("dqn", policy, STOCK_NO_LAW)["iteration_time_s"], policy


@settings(max_examples=50, deadline=None)
@given(share=st.floats(0.0, 1.0), calls=st.integers(1, 64), spacing=st.floats(0.0, 0.05))
def test_a_folded_call_charges_each_call_it_stands_for_by_their_spacing(share, calls, spacing):
    """A folded role's call stands for ``calls`` the unfolded caller makes ``spacing`` apart (:mod:`conduit.sim.fold`):
    every call's back-to-back CPU, the first one's surcharge by its share, each other one's by the ramp at
    ``spacing``: once in all for calls back to back, every time for calls a cold interval apart."""
    sim = Simulation(_topology(), load_workload("dqn"), create_policy("rllib-stock"), iterations=1)
    s, ramp = sim.stock, sim.calls.ramp
    want = calls * s.rpc_driver_cpu + (share + (calls - 1) * ramp.share(spacing)) * s.rpc_cold_caller_cpu
    assert sim.caller_cpu(share, calls, spacing) == pytest.approx(want)
    assert sim.caller_cpu(share, calls) == pytest.approx(calls * s.rpc_driver_cpu + share * s.rpc_cold_caller_cpu)
    assert sim.caller_cpu(share, calls, s.rpc_cold_after) == pytest.approx(
        calls * s.rpc_driver_cpu + (share + calls - 1) * s.rpc_cold_caller_cpu)
    assert sim.caller_cpu(share, 1, spacing) == sim.caller_cpu(share)
