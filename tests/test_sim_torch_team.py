"""A local learner's extra torch threads on its node's cores (:mod:`conduit.sim.torchteam`, :mod:`conduit.sim.cores`).

Properties, over random update sequences:

* with a free core per thread the team's CPU between two region starts is its work and spin, cut
  short by the next region: ``min(share * d + spin, gap)`` per thread, the last region's in full;
* on a shared core the team's work delays other work by at most what it ran, and busy time is
  conserved (the pool's busy core-seconds are the team's CPU plus the other work);
* the crowded-node count includes the extra threads, and a workload refuses extra threads for a
  remote learner, naming the field.
"""

from __future__ import annotations

import math

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim import tiny_topology_dict

from conduit.sim.resources import CpuPool
from conduit.sim.torchteam import TorchTeam
from conduit.sim.workload import Workload, WorkloadError

QUANTUM = 5e-3
regions = st.lists(st.tuples(st.floats(1e-4, 0.05), st.floats(1e-4, 0.05)), min_size=1, max_size=12)


def _team_run(cores: int, workers: int, share: float, spin: float, seq: list[tuple[float, float]],
              other: float = 0.0) -> tuple[TorchTeam, CpuPool, float]:
    """Regions of ``(duration, gap to the next start)``; ``other``: one job of that many core-seconds
    arriving with the first region. Returns the team, the pool and the other job's end time."""
    env = simpy.Environment()
    pool = CpuPool(env, "n0", cores)
    team = TorchTeam(env, pool, workers, share, spin, QUANTUM)
    end = [math.nan]

    def driver():
        for d, gap in seq:
            team.region(d)
            yield env.timeout(gap)

    def job():
        yield from pool.work(other)
        end[0] = env.now

    env.process(driver())
    if other > 0:
        env.process(job())
    env.run()
    return team, pool, end[0]


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(1, 3), share=st.floats(0.0, 1.0), spin=st.floats(0.0, 0.03), seq=regions)
def test_a_free_core_per_thread_runs_work_and_spin_cut_by_the_next_region(workers, share, spin, seq):
    team, pool, _ = _team_run(workers, workers, share, spin, seq)
    wants = [share * d + spin for d, _ in seq]
    # never more than asked, never less than the last region's (nothing cuts it)
    assert team.cpu_seconds <= workers * sum(wants) + 1e-12
    assert team.cpu_seconds >= workers * wants[-1] - 1e-12
    assert pool.busy_core_seconds == pytest.approx(team.cpu_seconds, rel=1e-9, abs=1e-12)
    assert team.regions == len(seq)
    # a region that ends its spin before the next one starts is not cut: all of it runs
    spaced = [(d, max(gap, want + 1e-6)) for (d, gap), want in zip(seq, wants, strict=True)]
    team, _, _ = _team_run(workers, workers, share, spin, spaced)
    assert team.cpu_seconds == pytest.approx(workers * sum(wants), rel=1e-9, abs=1e-12)
    # back-to-back regions: each cuts the previous one's spin after the quantum that is running
    tight = [(d, QUANTUM / 2) for d, _ in seq]
    team, _, _ = _team_run(workers, workers, share, spin, tight)
    assert team.cpu_seconds <= workers * (sum(min(w, QUANTUM) for w in wants[:-1]) + wants[-1]) + 1e-12


@settings(max_examples=60, deadline=None)
@given(share=st.floats(0.0, 1.0), spin=st.floats(0.0, 0.03), seq=regions, other=st.floats(1e-3, 0.1))
def test_on_a_shared_core_the_team_delays_other_work_by_at_most_what_it_ran(share, spin, seq, other):
    team, pool, end = _team_run(1, 1, share, spin, seq, other=other)
    assert pool.busy_core_seconds == pytest.approx(team.cpu_seconds + other, rel=1e-9)
    assert other - 1e-12 <= end <= other + team.cpu_seconds + 1e-9


def test_no_spin_and_no_share_costs_nothing():
    team, pool, _ = _team_run(1, 1, 0.0, 0.0, [(0.01, 0.02)] * 5)
    assert team.cpu_seconds == 0.0 and pool.busy_core_seconds == 0.0


def test_a_team_refuses_impossible_settings():
    env = simpy.Environment()
    pool = CpuPool(env, "n0", 1)
    with pytest.raises(ValueError, match="at least one"):
        TorchTeam(env, pool, 0, 0.5, 0.01, QUANTUM)
    with pytest.raises(ValueError, match="share"):
        TorchTeam(env, pool, 1, 1.5, 0.01, QUANTUM)


def test_extra_torch_threads_need_a_local_learner():
    with pytest.raises(WorkloadError, match="learner_threads"):
        Workload(name="w", algorithm="dqn", learner_threads=2).validate("w.yaml")
    with pytest.raises(WorkloadError, match="learner_thread_share"):
        Workload(name="w", algorithm="dqn", local_learner=True, learner_thread_share=1.2).validate("w.yaml")
    Workload(name="w", algorithm="dqn", local_learner=True, learner_threads=2, learner_spin_s=0.01,
             learner_thread_share=0.9).validate("w.yaml")


def _validation_like(threads: int, cores: int, sync_spin: float = 0.0, policy: str = "rllib-stock"):
    """A DQN local learner and one EnvRunner on one node of ``cores`` cores."""
    from conduit.registry import create_policy
    from conduit.sim.engine import Simulation
    from conduit.topology import topology_from_dict

    topo = topology_from_dict(tiny_topology_dict(gpus=0, cores=cores))
    wl = Workload(name="dqn-local", algorithm="dqn", local_learner=True, env_runners=1, envs_per_runner=1,
                  fragment_length=1, env_step_time=1.5e-3, inference_time=0.0, replay_capacity=50_000,
                  replay_ratio=32.0, min_size=250, batch_size=32, update_overhead=5e-3,
                  update_time_per_sample=1.4e-5, learner_threads=threads, learner_spin_s=0.0097,
                  learner_thread_share=0.88, weight_set_time=0.5e-3, sync_spin_s=sync_spin).validate("test")
    return Simulation(topo, wl, create_policy(policy), iterations=60, seed=0)


@pytest.mark.parametrize("threads, cores, crowded", [(1, 2, False), (2, 2, True), (2, 3, False)])
def test_the_crowded_count_includes_a_local_learners_extra_threads(threads, cores, crowded):
    sim = _validation_like(threads, cores)
    assert sim.crowded[sim.layout.driver_node] is crowded
    assert (sim.team is not None) is (crowded and threads > 1)


def test_the_team_runs_once_per_update_on_a_crowded_node():
    sim = _validation_like(2, 2)
    result = sim.run()
    assert sim.team.regions == result.metrics["updates"]  # one region per Learner.update
    assert sim.team.cpu_seconds > 0


@settings(max_examples=8, deadline=None)
@given(sync_spin=st.floats(0.0097, 0.03), policy=st.sampled_from(["rllib-stock", "conduit"]))
def test_each_weight_sync_is_a_region_of_the_team_too(sync_spin, policy):
    """DQN's weight sync sets the driver's local EnvRunner's weights (a parallel copy): with
    ``sync_spin_s`` each round's sync starts one more region of the team, on both sides alike. A region
    replaces what is left of the previous one's spin (a spinning thread takes the new region's work), and
    what is left of an update's spin at the sync is at most the spin itself: with a sync spin at least
    the update's (0.0097 s here) the team burns more CPU than without it."""
    base = _validation_like(2, 2, policy=policy)
    base.run()
    sim = _validation_like(2, 2, sync_spin=sync_spin, policy=policy)
    result = sim.run()
    assert result.audit.violations == 0
    rounds = sim.stock_calls["round"]
    assert sim.team.regions == result.metrics["updates"] + rounds  # one per update, one per round's sync
    assert sim.team.cpu_seconds > base.team.cpu_seconds


def test_a_region_refuses_a_negative_spin():
    env = simpy.Environment()
    team = TorchTeam(env, CpuPool(env, "n0", 1), 1, 0.5, 0.01, QUANTUM)
    with pytest.raises(ValueError, match="spin"):
        team.region(0.01, spin_s=-1.0)
