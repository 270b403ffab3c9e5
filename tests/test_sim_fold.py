"""Folding identical nodes (:mod:`conduit.sim.fold`): the approximation stays close to the exact run.

The exactness that folding keeps is checked where it is exact -- a flow standing for ``m`` copies on a
link ``m`` times as wide finishes with its copies, whatever else shares the fabric -- and the
approximation where it is not: a folded PPO iteration on a 16-node cluster stays within a percent of
the exact one, for the stock route and for Conduit as deployed. Bad folds are refused, naming ``fold``.
No test here measures time: ``benchmarks/sim_speed.py --fold K`` prints the speed-up and the error.
"""

from __future__ import annotations

import math
import subprocess
import sys

import networkx as nx
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.errors import ConduitError
from conduit.registry import create_policy
from conduit.sim.engine import Simulation
from conduit.sim.fold import fold_topology
from conduit.sim.network import Network
from conduit.sim.workload import load_workload
from conduit.topology import load_topology

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GB = 1e9


def _star(sources: int, source_bw: float, shared_bw: float) -> nx.Graph:
    """``sources`` nodes, each a device ``s{i}`` behind its own link to a switch, and a sink ``d`` behind
    the shared link; ``e`` sits beside the sink, on the shared link's far side."""
    g = nx.Graph()
    for i in range(sources):
        g.add_edge(f"s{i}", "sw", bandwidth=source_bw, latency=0.0)
    g.add_edge("sw", "d", bandwidth=shared_bw, latency=0.0)
    g.add_edge("e", "sw", bandwidth=shared_bw * 4, latency=0.0)
    return g


def _finishes(graph: nx.Graph, flows: list[tuple[str, float, float]], multiplicity=None) -> list[float]:
    """Completion times of ``(source, nbytes, start)`` flows to ``d``."""
    env = simpy.Environment()
    net = Network(env, graph, multiplicity=multiplicity)
    done: list[float] = [math.nan] * len(flows)

    def one(i: int, src: str, nbytes: float, start: float):
        yield env.timeout(start)
        done[i] = yield net.transfer(src, "d", nbytes)

    for i, (src, nbytes, start) in enumerate(flows):
        env.process(one(i, src, nbytes, start))
    env.run()
    return done


@SETTINGS
@given(copies=st.integers(2, 12), source_gbs=st.floats(0.5, 50), shared_gbs=st.floats(0.5, 50),
       nbytes=st.floats(1e6, 1e9), other=st.lists(st.tuples(st.floats(1e5, 1e9), st.floats(0, 0.5)), max_size=4))
def test_a_weighted_flow_finishes_with_its_copies(copies, source_gbs, shared_gbs, nbytes, other):
    """``m`` identical flows from ``m`` nodes, against one flow of weight ``m`` from one node whose own link is
    ``m`` times as wide: the same finish, with other flows (from beside the sink) sharing the sink's link."""
    exact_flows = [(f"s{i}", nbytes, 0.0) for i in range(copies)] + [("e", b, t) for b, t in other]
    exact = _finishes(_star(copies, source_gbs * GB, shared_gbs * GB), exact_flows)
    folded_graph = _star(1, source_gbs * GB * copies, shared_gbs * GB)
    folded = _finishes(folded_graph, [("s0", nbytes, 0.0)] + [("e", b, t) for b, t in other], {"s0": copies})
    assert all(f == pytest.approx(exact[0], rel=1e-7) for f in exact[:copies])
    assert folded[0] == pytest.approx(exact[0], rel=1e-7)
    assert folded[1:] == pytest.approx(exact[copies:], rel=1e-7)


@settings(max_examples=30, deadline=None)
@given(factor=st.integers(1, 40))
def test_representatives_stand_for_every_node_once(factor):
    """The driver's node stands for itself; the others' multiplicities add up to the rest of the cluster,
    differ by at most one, and their private links are widened by exactly that much."""
    topology = load_topology("dgx-h100-x16")
    folded, fold = fold_topology(topology, "n0", factor)
    nodes = topology.nodes
    assert fold.multiplicity.get("n0") == 1
    others = [m for n, m in fold.multiplicity.items() if n != "n0"]
    assert sum(others) == len(nodes) - 1
    assert len(others) == math.ceil((len(nodes) - 1) / factor) if factor > 1 else len(others) == len(nodes) - 1
    assert max(others) - min(others) <= 1
    assert folded.nodes == sorted(fold.multiplicity, key=nodes.index)
    width = {(ln.src, ln.dst): ln.bandwidth for ln in topology.links}
    for link in folded.links:
        node = folded.devices[link.src].node or folded.devices[link.dst].node
        shared = folded.devices[link.src].node is None and folded.devices[link.dst].node is None
        expected = width[(link.src, link.dst)] * (1 if shared else fold.of_node(node))
        assert link.bandwidth == expected


def _sim(policy: str, fold: int, seed: int = 0, topology: str = "dgx-h100-x16", iterations: int = 3):
    return Simulation(load_topology(topology), load_workload("ppo"), create_policy(policy), iterations=iterations,
                      seed=seed, fold=fold).run()


@pytest.mark.parametrize("policy", ["rllib-stock", "conduit", "conduit-target"])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fold=st.sampled_from([2, 3, 4, 8]), seed=st.integers(0, 3))
def test_a_folded_iteration_stays_within_a_percent_of_the_exact_one(policy, fold, seed):
    """PPO on 16 nodes, folded: iteration time within 1%, exposed latency within 3% (a straggler among
    fewer runners), no audit violation either way."""
    exact, folded = _sim(policy, 1, seed), _sim(policy, fold, seed)
    for metric, tolerance in (("iteration_time_s", 0.01), ("exposed_experience_path_s", 0.03)):
        assert folded.metrics[metric] == pytest.approx(exact.metrics[metric], rel=tolerance), metric
    assert folded.audit.violations == exact.audit.violations == 0


def test_a_folded_result_says_so_and_keeps_the_clusters_identity():
    exact, folded = _sim("rllib-stock", 1, iterations=2), _sim("rllib-stock", 4, iterations=2)
    assert "fold" not in exact.provenance
    block = folded.provenance["fold"]
    assert block["factor"] == 4 and block["nodes"] == 16
    assert sum(block["multiplicity"].values()) == 16
    assert folded.provenance["topology"] == exact.provenance["topology"]  # the cluster's name, hash, GPUs
    assert folded.validity["run"] == exact.validity["run"]  # the cluster's runners, not the representatives'
    assert any(w.startswith("folded:") for w in folded.warnings)
    assert not any(w.startswith("folded:") for w in exact.warnings)


@pytest.mark.parametrize("fold", [0, -3, True, 2.5, "2"])
def test_a_fold_that_is_not_a_positive_integer_is_refused(fold):
    with pytest.raises(ConduitError, match="fold"):
        _sim("rllib-stock", fold)


@pytest.mark.parametrize("workload", ["appo", "dqn"])
def test_folding_an_algorithm_whose_driver_is_not_charged_per_role_is_refused(workload):
    with pytest.raises(ConduitError, match=f"fold.*{workload}"):
        Simulation(load_topology("dgx-h100-x16"), load_workload(workload), create_policy("rllib-stock"), fold=2)


def test_nodes_that_differ_are_not_folded():
    with pytest.raises(ConduitError, match="fold: node .* differs"):
        Simulation(load_topology("hetero-mix"), load_workload("ppo"), create_policy("rllib-stock"), fold=2)


def test_the_cli_refuses_a_bad_fold_naming_it():
    run = subprocess.run([sys.executable, "-m", "conduit", "sim", "--fold", "0"], check=False, capture_output=True,
                         text=True)
    assert run.returncode == 2 and "--fold" in run.stderr and "Traceback" not in run.stderr


def test_a_cluster_with_nothing_to_fold_runs_exact():
    """Two nodes: the other node would stand for itself, so ``fold=16`` is the exact run, bit for bit."""
    exact, asked = _sim("conduit", 1, topology="dgx-h100-x2", iterations=2), _sim("conduit", 16, topology="dgx-h100-x2",
                                                                               iterations=2)
    assert "fold" not in asked.provenance
    assert asked.outcome() == exact.outcome()


def test_a_tuning_search_can_fold_every_candidate_and_says_so(tmp_path):
    """``tune(fold=K)`` simulates every candidate folded; the result and the tuned file record the fold, and an
    algorithm that cannot be folded is refused before any simulation."""
    import json

    from conduit.sim.tune import tune, write_result

    result = tune("dgx-h100-x16", "ppo", "conduit", budget=2, iterations=3, fold=4)
    assert result.fold == 4 and result.simulations == 2
    written = json.loads(write_result(result, tmp_path / "tuned.json").read_text())
    assert written["fold"] == 4
    calls: list[int] = []
    with pytest.raises(ConduitError, match="fold.*dqn"):
        tune("dgx-h100-x16", "dqn", "conduit", budget=2, iterations=3, fold=4, progress=lambda d, t: calls.append(d))
    assert calls == []


def test_a_driver_node_unlike_the_others_is_simulated_as_it_is():
    """A head node of another type runs the driver; the identical nodes behind it fold, and the folded run stays
    within a percent of the exact one."""
    from conduit.topology import topology_from_dict

    spec = {"name": "head-and-workers", "cluster": {
        "nodes": [{"type": "dgx-a100", "count": 1, "prefix": "h"}, {"type": "dgx-h100", "count": 6, "prefix": "w"}],
        "fabric": {"kind": "fat-tree", "rail_optimized": False, "leaves": 2, "spines": 2,
                   "host_link": {"latency": "0.5 us"}, "uplink": {"bandwidth": "1.6 Tb/s", "latency": "0.3 us"}}}}
    topology = topology_from_dict(spec)
    runs = {fold: Simulation(topology, load_workload("ppo"), create_policy("rllib-stock"), iterations=3,
                             fold=fold).run() for fold in (1, 3)}
    assert runs[3].provenance["fold"]["simulated_nodes"] == 3  # the head node and two workers standing for 3 each
    assert runs[3].metrics["iteration_time_s"] == pytest.approx(runs[1].metrics["iteration_time_s"], rel=0.01)
