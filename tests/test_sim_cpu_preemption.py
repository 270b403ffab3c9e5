"""Wake-up preemption on a node's cores (:class:`conduit.sim.resources.CpuPool`, ``urgent`` work).

APPO's driver loop blocks briefly thousands of times a second and the kernel hands it a core back at
once; the simulator models that as urgent work that runs at once on the core of the longest-running
ordinary work, which ends that much later. Properties, over random work:

* a preemptive pool given only ordinary work is the FIFO pool it was (same completion times);
* urgent work that arrives while every core runs ordinary work ends exactly its length later;
* no core does two things at once and none idles while work waits: on one core, with every urgent
  piece arriving before the ordinary work is done, the last piece ends at the sum of all the work;
* on any number of cores the work is conserved: busy core-seconds are the sum of the work, and the
  run is never shorter than that sum over the cores.
"""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.sim.resources import CpuPool

lengths = st.floats(min_value=1e-3, max_value=1.0, allow_nan=False)


def _run(cores: int, jobs: list[tuple[float, float, bool]], preemptive: bool = True) -> tuple[list[float], CpuPool]:
    """Run ``(arrival, seconds, urgent)`` jobs on a pool; returns each job's end time."""
    env = simpy.Environment()
    pool = CpuPool(env, "n0", cores)
    if preemptive:
        pool.enable_preemption()
    ends = [0.0] * len(jobs)

    def job(i: int, at: float, seconds: float, urgent: bool):
        yield env.timeout(at)
        yield from pool.work(seconds, urgent)
        ends[i] = env.now

    for i, (at, seconds, urgent) in enumerate(jobs):
        env.process(job(i, at, seconds, urgent))
    env.run()
    return ends, pool


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 4), jobs=st.lists(st.tuples(st.floats(0, 2), lengths), min_size=1, max_size=20))
def test_ordinary_work_on_a_preemptive_pool_is_fifo_as_before(cores, jobs):
    plain = [(at, s, False) for at, s in jobs]
    assert _run(cores, plain, preemptive=True)[0] == _run(cores, plain, preemptive=False)[0]


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 4), ordinary=st.lists(lengths, min_size=1, max_size=8),
       urgent=st.lists(st.tuples(st.floats(0, 1), lengths), min_size=1, max_size=8))
def test_urgent_work_never_waits_behind_ordinary_work(cores, ordinary, urgent):
    long = [(0.0, 10.0 + s, False) for s in ordinary] + [(0.0, 10.0, False)] * cores  # every core busy until >= 10
    jobs = long + [(at, s, True) for at, s in urgent]
    ends, _ = _run(cores, jobs)
    n_urgent_at_once = 0
    for (at, s, _), end in zip(jobs[len(long):], ends[len(long):], strict=True):
        # urgent pieces preempt ordinary ones while any runs; with every core running urgent work they queue
        assert end >= at + s - 1e-12
        n_urgent_at_once += end > at + s + 1e-12
    if len(urgent) <= cores:  # fewer urgent pieces than cores: none ever waits
        assert n_urgent_at_once == 0


@settings(max_examples=80, deadline=None)
@given(ordinary=st.lists(lengths, min_size=1, max_size=10), urgent=st.lists(st.tuples(st.floats(0, 1), lengths),
                                                                                max_size=10))
def test_one_core_is_never_shared_and_never_idle_while_work_waits(ordinary, urgent):
    total_ordinary = sum(ordinary)
    jobs = [(0.0, s, False) for s in ordinary] + [(at * total_ordinary * 0.999, s, True) for at, s in urgent]
    ends, pool = _run(1, jobs)
    total = total_ordinary + sum(s for _, s in urgent)
    assert max(ends) == pytest.approx(total, rel=1e-9)
    assert pool.busy_core_seconds == pytest.approx(total, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 4), jobs=st.lists(st.tuples(st.floats(0, 2), lengths, st.booleans()), min_size=1,
                                               max_size=20))
def test_work_is_conserved_on_any_number_of_cores(cores, jobs):
    ends, pool = _run(cores, jobs)
    total = sum(s for _, s, _ in jobs)
    assert pool.busy_core_seconds == pytest.approx(total, rel=1e-9)
    assert max(ends) >= min(at for at, _, _ in jobs) + total / cores - 1e-9
    assert all(end >= at + s - 1e-12 for (at, s, _), end in zip(jobs, ends, strict=True))


def test_urgent_work_needs_a_preemptive_pool():
    env = simpy.Environment()
    pool = CpuPool(env, "n0", 1)
    with pytest.raises(RuntimeError, match="without preemption"):
        next(pool.work(1.0, urgent=True))


def test_preemption_is_enabled_before_work_starts():
    env = simpy.Environment()
    pool = CpuPool(env, "n0", 1)
    env.process(pool.work(1.0))
    env.run(until=0.5)
    with pytest.raises(RuntimeError, match="before work starts"):
        pool.enable_preemption()
