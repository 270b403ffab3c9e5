"""The plane core (conduit.plane): decisions checked at the boundary, once, for both backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.contracts import BoundedStaleness, OnPolicy, Replay
from conduit.plane import Arbiter, ChunkLedger, LearnerCadence, rules_for
from conduit.policy import ChunkInfo, InvalidDecision, Move, PathSettings, Placement, Policy
from conduit.registry import create_policy, policy_registry
from conduit.topology.model import TierKind
from conduit.view import LearnerState, StaticClusterView, TierState

GIB = 1 << 30


def _view(hbm_used: float = 0.0, pinned_used: float = 0.0, cpu_learner: bool = False) -> StaticClusterView:
    tiers = {
        "gpu0:hbm": TierState("gpu0:hbm", TierKind.HBM, "n0", "gpu0", 1 * GIB, hbm_used, 1e12, 1e12),
        "gpu1:hbm": TierState("gpu1:hbm", TierKind.HBM, "n1", "gpu1", 1 * GIB, 0.0, 1e12, 1e12),
        "dram0:pinned": TierState("dram0:pinned", TierKind.PINNED, "n0", "dram0", 1 * GIB, pinned_used, 1e11, 1e11),
        "dram0:pageable": TierState("dram0:pageable", TierKind.PAGEABLE, "n0", "dram0", 4 * GIB, 0.0, 1e11, 1e11),
        "nvme0:nvme": TierState("nvme0:nvme", TierKind.NVME, "n0", "nvme0", 8 * GIB, 0.0, 3e9, 2e9),
    }
    device, tier = ("cpu0", "dram0:pageable") if cpu_learner else ("gpu0", "gpu0:hbm")
    learners = {"l0": LearnerState("l0", device, "n0", 1.0, 0.5, 0, 1e6, tier)}
    return StaticClusterView(tier_states=tiers, learner_states=learners)


def _policy(place=None, spill=None, plan=None, **path: Any) -> Policy:
    @dataclass
    class Placer:
        name: str = "test-placer"

        def place(self, chunk, view):
            return place(chunk, view)

        def spill(self, tier, nbytes, view):
            return spill(tier, nbytes, view) if spill else []

    @dataclass
    class Planner:
        name: str = "test-planner"

        def plan(self, pending, view):
            return plan(pending, view) if plan else []

    return Policy("test", Placer(), Planner(), PathSettings(**path))


INFO = ChunkInfo("c0", "n0", "gpu0", 1e6, 0, "l0")


BAD_PLACEMENTS = [
    (lambda c, v: None, "wrong-type"),
    (lambda c, v: "gpu0:hbm", "wrong-type"),
    (lambda c, v: Placement("nowhere"), "unknown-tier"),
    (lambda c, v: Placement(["gpu0:hbm"]), "unknown-tier"),
    (lambda c, v: Placement("gpu1:hbm"), "remote-hbm"),
    (lambda c, v: 1 / 0, "raised"),
    (lambda c, v: (_ for _ in ()).throw(InvalidDecision("test-placer", c, "no")), "refused-by-policy"),
]


@pytest.mark.parametrize(("place", "code"), BAD_PLACEMENTS)
def test_an_invalid_placement_is_counted_by_reason_and_replaced_by_the_safe_default(place, code):
    arbiter = Arbiter(_policy(place))
    tier = arbiter.place(INFO, _view(), need=1e6, node="n0")
    assert tier == "dram0:pinned"  # the safe default: pinned host memory on the consumer's node
    assert dict(arbiter.rejections.by_code) == {code: 1}
    message = arbiter.rejections.messages[0]
    assert "test-placer" in message and "place()" in message


def test_an_over_capacity_placement_is_a_rejection_and_falls_to_pageable_when_pinned_is_full():
    arbiter = Arbiter(_policy(lambda c, v: Placement("gpu0:hbm")))
    tier = arbiter.place(INFO, _view(hbm_used=GIB, pinned_used=GIB), need=1e6, node="n0")
    assert tier == "dram0:pageable"
    assert dict(arbiter.rejections.by_code) == {"over-capacity": 1}


def test_a_valid_placement_is_taken_as_is():
    arbiter = Arbiter(_policy(lambda c, v: Placement("nvme0:nvme")))
    assert arbiter.place(INFO, _view(), need=1e6, node="n0") == "nvme0:nvme"
    assert arbiter.rejections.total == 0


def test_spill_returns_only_valid_moves_and_counts_each_refusal():
    residents = {"a": 1e6, "b": 1e6, "busy": 1e6, "big": 2 * GIB}
    moves = [Move("a", "dram0:pinned"), "junk", Move("ghost", "dram0:pinned"), Move("a", "dram0:pageable"),
             Move("busy", "dram0:pinned"), Move("b", "nowhere"), Move("b", "gpu0:hbm"),
             Move("big", "dram0:pinned"), Move("b", "dram0:pageable")]
    arbiter = Arbiter(_policy(spill=lambda tier, need, view: moves))
    out = arbiter.spill("gpu0:hbm", 2e6, _view(), size_in=residents.get, movable=lambda cid: cid != "busy")
    assert out == [Move("a", "dram0:pinned"), Move("b", "dram0:pageable")]
    assert dict(arbiter.rejections.by_code) == {
        "wrong-type": 1, "not-resident": 1, "duplicate-move": 1, "busy": 1, "unknown-tier": 1,
        "same-tier": 1, "over-capacity": 1}


@pytest.mark.parametrize("answer", [None, Move("a", "x"), "moves", {"a": 1}, 3])
def test_a_spill_or_plan_answer_of_the_wrong_type_is_one_rejection(answer):
    arbiter = Arbiter(_policy(spill=lambda *a: answer, plan=lambda *a: answer))
    assert arbiter.spill("gpu0:hbm", 1.0, _view(), size_in=lambda cid: None) == []
    assert arbiter.plan({"l0": [("a", 1.0)]}, _view()) == []
    assert dict(arbiter.rejections.by_code) == {"wrong-type": 2}


def test_a_waiting_learner_gets_its_data_even_from_a_scheduler_that_plans_nothing():
    arbiter = Arbiter(_policy(plan=lambda pending, view: []))
    pending = {"l0": [("a", 1.0), ("b", 1.0)]}
    assert arbiter.plan(pending, _view()) == []  # not waiting: nothing moves
    assert arbiter.plan(pending, _view(), asking={"l0"}) == [("l0", "a"), ("l0", "b")]
    assert arbiter.rejections.forced_moves == 2
    assert arbiter.rejections.total == 0


def test_plan_keeps_the_policy_order_and_redirects_wrong_destinations():
    def plan(pending, view):
        return [Move("b", "gpu0:hbm"), Move("a", "dram0:pinned"), Move("zzz", "gpu0:hbm"), Move("b", "gpu0:hbm")]

    arbiter = Arbiter(_policy(plan=plan))
    out = arbiter.plan({"l0": [("a", 1.0), ("b", 1.0)]}, _view())
    assert out == [("l0", "b"), ("l0", "a")]
    assert dict(arbiter.rejections.by_code) == {"wrong-destination": 1, "unknown-chunk": 1}


@pytest.mark.parametrize("overlap", [True, False])
def test_a_cpu_learner_receives_chunks_as_they_arrive_only_with_overlap_collection(overlap):
    arbiter = Arbiter(_policy(overlap_collection=overlap))
    out = arbiter.plan({"l0": [("a", 1.0)]}, _view(cpu_learner=True))
    assert out == ([("l0", "a")] if overlap else [])
    assert arbiter.rejections.forced_moves == 0


@pytest.mark.parametrize("overlap", [True, False])
def test_without_overlap_collection_planned_moves_wait_for_the_learners_ask(overlap):
    """With ``overlap_collection`` off no data moves while sampling runs: a planned move of a
    learner that has not asked is deferred (not refused, not started), and starts with its ask."""
    def plan(pending, view):
        return [Move(cid, "gpu0:hbm") for cid, _ in pending["l0"]]

    arbiter = Arbiter(_policy(plan=plan, overlap_collection=overlap))
    assert arbiter.plan({"l0": [("a", 1.0)]}, _view()) == ([("l0", "a")] if overlap else [])
    assert arbiter.plan({"l0": [("a", 1.0)]}, _view(), asking=["l0"]) == [("l0", "a")]
    assert arbiter.rejections.total == 0 and arbiter.rejections.forced_moves == 0


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from([n for n in policy_registry().names("policy") if n != "janus-best"]),
       nbytes=st.floats(1.0, 3 * GIB), hbm_used=st.floats(0, GIB), pinned_used=st.floats(0, GIB),
       waiting=st.booleans())
def test_every_registered_policy_yields_a_checked_decision(name, nbytes, hbm_used, pinned_used, waiting):
    """Whatever a registered policy answers, the arbiter's result is a known tier with room (or the
    pageable tier to wait in), and plan only starts pending chunks."""
    view = _view(hbm_used=hbm_used, pinned_used=pinned_used)
    arbiter = Arbiter(create_policy(name))
    info = ChunkInfo("c0", "n0", "gpu0", nbytes, 0, "l0")
    tier = arbiter.place(info, view, need=nbytes, node="n0")
    assert tier in view.tiers
    assert view.tiers[tier].fits(nbytes) or tier == "dram0:pageable"
    pending = {"l0": [("a", nbytes), ("b", nbytes)]}
    started = arbiter.plan(pending, view, asking={"l0"} if waiting else ())
    assert {cid for _, cid in started} <= {"a", "b"}
    assert len(started) == len({cid for _, cid in started})
    if waiting:
        assert {cid for _, cid in started} == {"a", "b"}


def test_the_ledger_reports_what_happened_in_order():
    from conduit.audit import Auditor
    from conduit.chunk import Chunk

    auditor = Auditor(OnPolicy(), {"t0": 100, "t1": 100})
    ledger = ChunkLedger(["t0", "t1"], auditor)
    auditor.ingested(Chunk("a", "p", "n0", 2, 40, 0, 0.0), 0.0)
    ledger.placed("a", "t0", 40, 0.0)
    assert ledger.residents("t0") == [("a", 40)] and auditor.occupancy("t0") == 40
    ledger.moved("a", "t1", 40, 1.0)
    assert ledger.location("a") == "t1" and ledger.residents("t0") == [] and auditor.occupancy("t1") == 40
    ledger.vacated("a", 2.0, carried_to="t0")
    assert ledger.location("a") == "t0" and ledger.residents("t1") == [] and auditor.occupancy("t1") == 0
    ledger.retired("a", 3.0)
    assert "a" not in ledger


def test_cadence_before_history_needs_data_now_and_then_predicts_from_the_interval():
    c = LearnerCadence("l0", "gpu0", "n0", "gpu0:hbm", 1.0)
    assert c.state(5.0).next_need_at == 5.0 and c.state(5.0).update_time == 0.0
    c.asked(10.0)
    assert c.state(11.0).next_need_at is None  # waiting now
    c.served()
    assert c.state(11.0).next_need_at == 10.0  # one ask: no interval yet, needed again at once
    c.asked(12.0)
    c.served()
    assert c.state(12.5).next_need_at == pytest.approx(14.0) and c.interval == pytest.approx(2.0)


@given(version=st.integers(0, 20), update=st.integers(0, 20), current=st.integers(0, 20), lag=st.integers(0, 5))
def test_contract_rules_agree_with_the_contracts(version, update, current, lag):
    on, bs, rp = rules_for(OnPolicy()), rules_for(BoundedStaleness(lag, 2)), rules_for(Replay(100, 1.0, 10))
    assert on.stale_on_arrival(version, next_update=update, current=current) == (version < update)
    assert on.batch_key(version, 7) == version and bs.batch_key(version, 7) == 7
    stale = not BoundedStaleness(lag, 2).admits(version, current)
    assert bs.stale_on_arrival(version, next_update=update, current=current) == stale
    assert bs.too_old([version, current], current) == stale
    assert not rp.stale_on_arrival(version, next_update=update, current=current) and rp.tabled


def test_the_simulator_reports_rejections_by_reason_in_json_and_in_its_summary(capsys):
    """A plug-in that returns None from place() is counted as ``wrong-type`` and named in --json
    and in the CLI's table; the run still completes with a clean audit."""
    from conduit.cli.sim import print_summary
    from conduit.policies import all_gpu
    from conduit.sim.run import simulate

    @dataclass
    class ReturnsNone:
        name: str = "returns-none"

        def place(self, chunk, view):
            return None

        def spill(self, tier, nbytes, view):
            return []

    policy = all_gpu()
    policy.placement = ReturnsNone()
    result = simulate("dgx-h100", "ppo", policy, iterations=2)
    assert result.audit.violations == 0
    out = result.to_dict()["rejections"]
    assert out["total"] == result.metrics["rejected_decisions"] == result.metrics["chunks"]
    assert out["by_reason"] == {"wrong-type": out["total"]}
    assert "returns-none" in out["messages"][0] and "place()" in out["messages"][0]
    print_summary(result)
    assert f"rejected policy decisions                      {out['total']} (wrong-type {out['total']})" \
        in capsys.readouterr().out
