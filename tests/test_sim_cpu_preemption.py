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
from hypothesis import assume, given, settings
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


# ------------------------------------------------------------ a paused piece moves to a core that frees
def test_a_paused_piece_moves_to_a_core_that_frees_instead_of_waiting_beside_it():
    """Two cores: A (1 s) and B (10 s) run; urgent U (2 s) arrives at 0.5 and preempts B (the longer-running
    piece: A started first, so A is the victim). A's core... here: U pauses A at 0.5; B keeps running. Nothing
    frees until B ends, so A waits for U. Then the mirror: the piece that frees first hands its core to the
    paused one, which resumes at once and gets back the rest of its pause."""
    # A (ordinary, 1 s) and B (ordinary, 1.2 s) start at 0; U (urgent, 2 s) at 0.5 preempts A (the oldest).
    # At 1.2 B ends and frees its core: A, paused since 0.5 with 0.5 s left, moves there and ends at 1.7,
    # not at 2.5 + 0.5 = 3.0 as it would waiting for U; U ends at 2.5 on A's old core.
    ends, pool = _run(2, [(0.0, 1.0, False), (0.0, 1.2, False), (0.5, 2.0, True)])
    assert ends == pytest.approx([1.7, 1.2, 2.5])
    assert pool.busy_core_seconds == pytest.approx(4.2)
    assert pool._server.busy == 0 and not pool._preempted


@settings(max_examples=80, deadline=None)
@given(cores=st.integers(1, 4), jobs=st.lists(st.tuples(st.floats(0, 2), lengths, st.booleans()), min_size=1,
                                              max_size=20))
def test_moves_leave_no_core_taken_and_conserve_the_work(cores, jobs):
    """Whatever moves happen, the pool ends empty (no core counted busy, no paused piece left), busy
    core-seconds are the work, and nothing ends before it could have (its arrival plus its length)."""
    ends, pool = _run(cores, jobs)
    assert pool._server.busy == 0 and not pool._server.queue and not pool._preempted
    assert pool.busy_core_seconds == pytest.approx(sum(s for _, s, _ in jobs))
    assert all(e >= at + s - 1e-9 for e, (at, s, _) in zip(ends, jobs, strict=True))
    assert max(ends) >= sum(s for _, s, _ in jobs) / cores - 1e-9


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 3), pollers=st.integers(1, 4), duty=st.floats(0.05, 0.95),
       ordinary=st.lists(lengths, min_size=1, max_size=6))
def test_background_polls_never_starve_the_other_work(cores, pollers, duty, ordinary):
    """More background polls than cores (as two idle learners' polls and the driver's loop on one core): while
    together they want less than the node's cores, the ordinary work still ends (a background quantum that finds
    no core to take is skipped, not queued ahead of it). Beyond that the model would starve it: staggered urgent
    quanta can cover a core without a gap (a known limit; no workload comes near it)."""
    assume(pollers * duty < cores)
    env = simpy.Environment()
    pool = CpuPool(env, "n0", cores)
    pool.enable_preemption()
    done = []

    def poll():
        while len(done) < len(ordinary):
            if not pool.wanted:
                yield pool.work_arrives()
            else:
                yield from pool.work(duty * 5e-3, urgent=True, background=True)
                yield env.timeout((1 - duty) * 5e-3)

    def job(seconds: float):
        yield from pool.work(seconds)
        done.append(env.now)

    for _ in range(pollers):
        env.process(poll())
    for s in ordinary:
        env.process(job(s))
    env.run(until=100.0)  # (the work is at most 6 s; a starved run stops here and fails)
    assert len(done) == len(ordinary)
    assert not pool.wanted
