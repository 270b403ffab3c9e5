"""APPO on a crowded node (:meth:`conduit.sim.cores.CoreUse.on_cores`): fewer cores than processes.

RLlib's APPO driver never sleeps (``Algorithm._run_one_training_iteration`` loops on
``IMPALA.training_step``, whose sampler fetch waits 0 s), so on a node with fewer cores than the
EnvRunners, the learner and the driver its loop wants ``StockCosts.driver_poll_cores`` of a core
(measured: 0.85, ``benchmarks/appo_driver_loop.py``) and gets it first (wake-up preemption), and sampling
and a CPU learner's training share the rest: on both sides (stock and deployed), in the same way. On a node with a
core per process nothing of this applies (nobody waits for a core).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_sim import tiny_topology_dict

from conduit.registry import create_policy
from conduit.sim.engine import Simulation
from conduit.sim.params import StockCosts
from conduit.sim.workload import load_workload
from conduit.topology import topology_from_dict


def _run(cores: int, policy: str, poll: float = 1.0):
    sim = Simulation(topology_from_dict(tiny_topology_dict(gpus=0, cores=cores)), load_workload("appo"),
                     create_policy(policy), iterations=12, stock=replace(StockCosts(), driver_poll_cores=poll))
    return sim, sim.run()


@pytest.mark.parametrize("policy", ["rllib-stock", "conduit"])
def test_a_crowded_node_is_busy_and_slower_on_both_sides(policy):
    crowded_sim, crowded = _run(2, policy)
    roomy_sim, roomy = _run(16, policy)
    node = crowded_sim.layout.driver_node
    assert crowded_sim.crowded[node] and not roomy_sim.crowded[node]
    assert crowded.audit.violations == 0 and roomy.audit.violations == 0
    # the spinning driver, the runner and the learner keep both cores busy nearly the whole run (the
    # driver's loop looks again a quantum after its thread's own work, so a core may idle that long)
    assert crowded.cpu_busy[node] >= 0.95 * 2 * crowded.sim_time
    # the driver's loop gets the cores it wants first (wake-up preemption): its share is its demand
    assert crowded_sim.cpus[node].preemptive and not roomy_sim.cpus[node].preemptive
    # sampling and training wait for cores: the same work takes longer than with a core each
    assert crowded.metrics["iteration_time_s"] > roomy.metrics["iteration_time_s"]
    assert crowded.sim_time > roomy.sim_time


@pytest.mark.parametrize("policy", ["rllib-stock", "conduit"])
def test_a_lighter_poll_leaves_cores_to_sampling_and_training(policy):
    """The measured loop (0.85 of a core) against a whole core and no poll: the lighter the driver's
    loop, the less busy the crowded node and never the slower the run."""
    runs = {poll: _run(2, policy, poll) for poll in (0.0, StockCosts().driver_poll_cores, 1.0)}
    node = runs[1.0][0].layout.driver_node
    busy = [runs[p][1].cpu_busy[node] / runs[p][1].sim_time for p in sorted(runs)]
    assert busy == sorted(busy) and busy[0] < busy[-1]
    times = [runs[p][1].metrics["iteration_time_s"] for p in sorted(runs)]
    assert times[0] <= times[1] * (1 + 1e-9) and times[1] <= times[2] * (1 + 1e-9)
    assert all(r.audit.violations == 0 for _, r in runs.values())


@pytest.mark.parametrize("cores", [1, 2])
def test_a_stalled_run_on_a_crowded_node_ends_as_stalled(cores):
    """The driver's never-ending loop must not keep a stalled run alive: with HBM too small for the
    working set under ``all-gpu``, placements wait for room that never comes, and the run ends with the
    stall report instead of polling forever (found by test_sim_speed's capacity-pressure scenarios)."""
    from conduit.errors import ConduitError

    envs, frag, bps, per = 4, 16, 100_000, 8
    chunk = envs * frag * bps
    wl = load_workload({"base": "appo", "envs_per_runner": envs, "fragment_length": frag, "bytes_per_step": bps,
                        "runners_per_gpu": 3, "env_step_cv": 0.3, "chunks_per_batch": per, "max_lag": 2,
                        "max_reuse": 1, "broadcast_interval": 1})
    topo = topology_from_dict(tiny_topology_dict(2, 2, chunk * per * 1.05, host=1000 * chunk, pinned=300 * chunk,
                                                 cores=cores, pcie="4 GB/s"))
    sim = Simulation(topo, wl, create_policy("all-gpu"), iterations=4, seed=1)
    assert sim._crowded_nodes()[sim.layout.driver_node]
    with pytest.raises(ConduitError, match="stalled"):
        sim.run()
