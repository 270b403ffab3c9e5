"""Conduit's own policy and the plane's safety net around every policy.

* invalid placement, scheduling and spill decisions are rejected (named, counted) and fall back to a
  safe default, so a buggy policy costs time but never samples;
* the greedy placement against the exact min-cost assignment (MILP) it approximates: a bound on
  the gap, an instance close to it, and the exact assignment's own capacity check;
* ``conduit`` beats the baselines on the quickstart cluster, with zero violations;
* policies import nothing from a backend.
"""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import dataclass

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from conduit.policies import all_gpu
from conduit.policies.conduit_policy import BandwidthAwarePlacement, assign_optimal, conduit, greedy_gap
from conduit.policy import ChunkInfo, InvalidDecision, Move, Placement
from conduit.sim.run import simulate
from conduit.topology import load_topology
from conduit.view import LearnerState, StaticClusterView, TierState, static_view_of

TOPOLOGY = "dgx-h100-x2"


@dataclass
class UnknownTier:
    name: str = "unknown-tier"
    codes = ("unknown-tier", "not-resident")  # place, spill

    def place(self, chunk, view):
        return Placement("no-such-tier:hbm")

    def spill(self, tier, nbytes, view):
        return [Move("no-such-chunk", "nowhere")]


@dataclass
class Raises:
    name: str = "raises"
    codes = ("refused-by-policy",)

    def place(self, chunk, view):
        raise InvalidDecision(self.name, chunk, "refuses on purpose")

    def spill(self, tier, nbytes, view):
        return []


@dataclass
class OverCapacity:
    """Always the first HBM of the consumer's node, however full it is."""

    name: str = "over-capacity"

    def place(self, chunk, view):
        node = view.learners[chunk.consumer].node
        return Placement(min(t.id for t in view.tiers_on(node, "hbm")))

    def spill(self, tier, nbytes, view):
        return []


@dataclass
class WrongTarget:
    """A scheduler that moves every pending chunk into a tier that is not the learner's device."""

    name: str = "wrong-target"

    def plan(self, pending, view):
        return [Move(cid, "n0.dram0:pageable", view.now) for chunks in pending.values() for cid, _ in chunks]


def _policy_with(placement=None, scheduling=None, **path):
    policy = all_gpu()
    if placement is not None:
        policy.placement = placement
    if scheduling is not None:
        policy.scheduling = scheduling
    return policy.with_path(**path) if path else policy


@pytest.mark.parametrize("workload", ["ppo", "appo", "dqn"])
@pytest.mark.parametrize("placement", [UnknownTier(), Raises()], ids=lambda p: p.name)
def test_invalid_placements_are_rejected_and_fall_back(workload, placement):
    iterations = {"ppo": 3, "appo": 20, "dqn": 60}[workload]
    result = simulate(TOPOLOGY, workload, _policy_with(placement), iterations=iterations)
    assert result.audit.violations == 0, result.audit.by_kind
    assert result.metrics["rejected_decisions"] > 0
    assert any(placement.name in r for r in result.rejections["messages"])
    assert placement.codes[0] in result.rejections["by_reason"]
    assert set(result.rejections["by_reason"]) <= set(placement.codes)
    assert sum(result.rejections["by_reason"].values()) == result.metrics["rejected_decisions"]
    assert result.metrics["updates"] == iterations


def test_over_capacity_placement_is_rejected():
    # 2,048-step chunks of 20 MB steps: ~41 GB each; one fits an 80 GiB HBM, two do not
    huge = {"base": "ppo", "bytes_per_step": 20e6, "train_batch_per_learner": 2048, "fragment_length": 256}
    result = simulate(TOPOLOGY, huge, _policy_with(OverCapacity()), iterations=2)
    assert result.audit.violations == 0
    assert result.metrics["rejected_decisions"] > 0
    assert any("over capacity" in r for r in result.rejections["messages"])
    assert set(result.rejections["by_reason"]) == {"over-capacity"}


def test_a_wrong_move_from_the_scheduler_is_rejected_and_still_delivered():
    from conduit.policies.components import TierPreference
    from conduit.topology import TierKind

    host_first = TierPreference((TierKind.PINNED,), name="pinned-only")
    result = simulate(TOPOLOGY, "ppo", _policy_with(host_first, WrongTarget()), iterations=2)
    assert result.audit.violations == 0
    assert any("wrong-target" in r for r in result.rejections["messages"])
    assert set(result.rejections["by_reason"]) == {"wrong-destination"}


def test_conduit_against_the_baseline_on_the_quickstart_cluster():
    """The design target (``conduit-target``) beats stock everywhere. Conduit as deployed (``conduit``)
    cuts the exposed path everywhere and the iteration for PPO and DQN; APPO is sampling-bound on both
    sides, so its iteration stays within the issue's bound (conduit/stock >= 0.85: no routing artifact
    gain) -- today it is a few percent slower (the plane's copies), which the quickstart reports."""
    for workload, iterations in (("ppo", 4), ("appo", 40), ("dqn", 150)):
        stock = simulate(TOPOLOGY, workload, "rllib-stock", iterations=iterations).metrics
        for policy in ("conduit-target", "conduit"):
            ours = simulate(TOPOLOGY, workload, policy, iterations=iterations)
            assert ours.audit.violations == 0
            m = ours.metrics
            assert m["exposed_experience_path_s"] < stock["exposed_experience_path_s"], (workload, policy)
            if policy == "conduit-target" or workload != "appo":
                assert m["iteration_time_s"] <= stock["iteration_time_s"] * 1.0001, (workload, policy)
            else:
                assert m["iteration_time_s"] >= 0.85 * stock["iteration_time_s"], (workload, policy)


def _view(capacities: list[float]) -> StaticClusterView:
    tiers = {}
    for i, cap in enumerate(capacities):
        kind = ("hbm", "pinned", "pageable", "nvme")[i % 4]
        from conduit.topology import TierKind

        tiers[f"t{i}"] = TierState(f"t{i}", TierKind(kind), "n0", f"dev{i}", cap, 0.0, 10e9 / (1 + i), 10e9 / (1 + i))
    learner = LearnerState("L", "dev0", "n0", None, 0.1, 0)
    return StaticClusterView(tier_states=tiers, learner_states={"L": learner})


#: greedy total <= GREEDY_GAP_BOUND x the exact (MILP) total, on every instance ``_view`` generates
#: (see test_greedy_placement_gap_to_the_optimum_is_bounded for where the figure comes from)
GREEDY_GAP_BOUND = 6.0


def _chunks(sizes: list[float]) -> list[ChunkInfo]:
    return [ChunkInfo(i, "n0", "dev0", s, 0, consumer="L") for i, s in enumerate(sizes)]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.floats(1e6, 50e6), min_size=1, max_size=6),
    capacities=st.lists(st.floats(20e6, 200e6), min_size=4, max_size=8),
)
def test_greedy_placement_gap_to_the_optimum_is_bounded(sizes, capacities):
    """Chunks of 1-50 MB placed in order into 4-8 tiers of 20-200 MB (tier i: HBM, pinned, pageable,
    NVMe in turn, bandwidth 10 GB/s / (1 + i); t0 is the consumer's HBM):

    * the exact assignment is never worse than the greedy one (it is the optimum);
    * greedy <= 6 x optimum. Measured on this family: 5,000 random examples: mean ratio 1.05, worst
      3.8; 5,000 examples steered by ``hypothesis.target`` towards a large ratio: 5.64; the adversarial
      instance of test_greedy_placement_can_be_far_from_the_optimum: 5.78, and the largest found by
      hand (the same construction at its limits: 1 MB, the smallest chunk, after 19 MB + epsilon in
      a 20 MB HBM) 5.82 - about as far as one chunk pushed to the slowest tier (8x the cost of
      HBM) can go when the chunks that push it must fill a 20 MB tier first. 6 leaves 3% over that.
    * when every chunk fits the consumer's HBM together (capacities do not couple), the greedy
      answer is the optimum (relative 1e-6: the solver resolves costs no finer, so it may ignore
      ``cost``'s one-in-a-million tie-break towards HBM and return an optimum ~3e-7 above greedy).

    Instances with no feasible assignment are skipped (``assume``); so are those, ~3%, where the
    greedy pass strands a chunk that the exact assignment can place (first-fit packing; the plane
    then falls back to its safe default), counted in the statistics as an ``event``.
    """
    view = _view(capacities)
    placement = BandwidthAwarePlacement(headroom=0.0)
    chunks = _chunks(sizes)
    try:
        assign_optimal(chunks, view, placement)
    except InvalidDecision:
        assume(False)  # no assignment exists: nothing to compare
    try:
        greedy, optimum = greedy_gap(chunks, view, placement)
    except InvalidDecision:
        event("greedy strands a chunk the exact assignment places")
        assume(False)
    ratio = greedy / optimum
    event("greedy is optimal" if ratio <= 1 + 1e-6 else f"greedy/optimum in ({math.floor(ratio)}, {math.floor(ratio) + 1}]")
    assert optimum <= greedy * (1 + 1e-6) + 1e-12
    assert greedy <= GREEDY_GAP_BOUND * optimum, (ratio, sizes, capacities)
    if sum(sizes) <= capacities[0]:
        assert ratio <= 1 + 1e-6, (ratio, sizes, capacities)


def test_greedy_placement_can_be_far_from_the_optimum():
    """The gap bound above is close to tight. The greedy pass puts a 19.5 MB chunk in the 20 MB HBM,
    so the next 1 MB chunk goes to pinned memory (50 MB); the 50 MB chunk then fits neither and goes
    to the slowest tier that holds it (8x HBM's cost). The optimum puts the 1 MB chunk in pageable
    memory and the 50 MB one in pinned: 5.78x cheaper."""
    view = _view([20e6, 50e6, 20e6, 20e6, 20e6, 20e6, 20e6, 50e6])
    placement = BandwidthAwarePlacement(headroom=0.0)
    chunks = _chunks([19.5e6, 1e6, 50e6])
    chosen, cost = assign_optimal(chunks, view, placement)
    assert chosen == ["t0", "t2", "t1"]
    greedy, optimum = greedy_gap(chunks, view, placement)
    assert optimum == pytest.approx(cost, rel=1e-12)
    assert 5.7 < greedy / optimum < GREEDY_GAP_BOUND


def test_milp_assignment_never_overfills_a_tier():
    """The solver meets capacity rows only within its feasibility tolerance; the assignment it
    returns is checked in exact bytes (this instance once overfilled t0 by 5 B)."""
    view = _view([20e6, 50e6, 20e6, 20e6, 20e6, 20e6, 20e6, 50e6])
    placement = BandwidthAwarePlacement(headroom=0.0)
    sizes = [19_000_005.0, 1_000_000.0, 50_000_000.0]
    chosen, _ = assign_optimal(_chunks(sizes), view, placement)
    used: dict[str, float] = {}
    for tier, size in zip(chosen, sizes, strict=True):
        used[tier] = used.get(tier, 0.0) + size
    assert all(used[t] <= view.tiers[t].capacity for t in used), (chosen, used)


def test_milp_assignment_respects_coupled_capacities():
    topo = load_topology("dgx-h100")
    view = static_view_of(topo, learner_states={"L": LearnerState("L", "gpu0", "node0", None, 0.1, 0)})
    placement = BandwidthAwarePlacement(headroom=0.0)
    hbm = view.tiers["gpu0:hbm"]
    # three chunks that each fit the consumer's HBM, but only two together
    size = hbm.capacity * 0.45
    chunks = [ChunkInfo(i, "node0", "gpu0", size, 0, consumer="L") for i in range(3)]
    chosen, cost = assign_optimal(chunks, view, placement)
    assert chosen.count("gpu0:hbm") == 2 and cost > 0


def test_conduit_declares_a_tunable_space_and_valid_defaults():
    policy = conduit()
    names = {p.name for p in policy.space}
    assert {"target_chunk_bytes", "depth", "granularity", "headroom"} <= names
    assert policy.path.route == "direct" and policy.path.batch_build == "per-chunk"
    assert policy.path.pieces(57.8e6) == 8 and policy.path.pieces(1e6) == 1


def test_policies_import_no_backend():
    code = ("import sys, conduit.policies, conduit.policies.conduit_policy, conduit.policies.janus; "
            "bad = [m for m in sys.modules if m.startswith(('conduit.sim', 'conduit.runtime'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
