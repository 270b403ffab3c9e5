"""Who runs first on a crowded node (:class:`conduit.sim.resources.CpuPool`: priorities and the wake rule).

Ray starts its workers at nice 15 and leaves the driver at 0, so the driver's process (its thread, a local
learner's update and torch team) runs before any worker; among workers, a thread that wakes while every core is
busy gets a core after ``wake_latency`` for up to ``wake_slice`` (measured: :mod:`conduit.runtime.wakeup`), and
the rest of its work queues. Properties, over random work:

* driver work never waits behind a worker's: with fewer driver pieces than cores it ends exactly its length
  after it arrives, whatever the workers run (woken or not); a driver thread that holds a core in back-to-back
  quanta keeps it, even when a worker's piece was queued for the core its last quantum frees;
* a woken worker's piece never preempts the driver's, and preempts an ordinary one: beside ordinary compute on
  every core it ends ``wake_latency`` plus its length after it arrives when it fits its slice;
* a piece that continues its thread's compute at the same instant has no credit and queues;
* without wake settings, ``thread`` changes nothing; work is conserved on any number of cores.
"""

from __future__ import annotations

import pytest
import simpy
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_sim import tiny_topology_dict

from conduit.registry import create_policy
from conduit.sim.engine import Simulation
from conduit.sim.resources import CpuPool
from conduit.sim.workload import load_workload
from conduit.topology import topology_from_dict

lengths = st.floats(min_value=1e-3, max_value=1.0, allow_nan=False)
#: a job: (arrival, seconds, kind, thread); kind: "driver" (urgent), "woken" (a poll-like woken piece),
#: "compute" (a worker's compute), "call" (a worker's ordinary piece, which the wake rule may serve)
KINDS = ("driver", "woken", "compute", "call")


def _run(cores: int, jobs: list[tuple[float, float, str, object]], latency: float = 0.0, slice_s: float = 0.0,
         preemptive: bool = True) -> tuple[list[float], CpuPool]:
    env = simpy.Environment()
    pool = CpuPool(env, "n0", cores, wake_latency=latency, wake_slice=slice_s)
    if preemptive:
        pool.enable_preemption()
    ends = [0.0] * len(jobs)

    def job(i: int, at: float, seconds: float, kind: str, thread: object):
        yield env.timeout(at)
        yield from pool.work(seconds, urgent=kind == "driver", woken=kind == "woken", compute=kind == "compute",
                             thread=thread)
        ends[i] = env.now

    for i, (at, seconds, kind, thread) in enumerate(jobs):
        env.process(job(i, at, seconds, kind, thread))
    env.run()
    return ends, pool


def _busy(cores: int, kind: str, extra: list[float] = ()) -> list[tuple[float, float, str, object]]:
    """Every core busy from 0 until at least 10 s with ``kind`` work."""
    return [(0.0, 10.0, kind, ("busy", i)) for i in range(cores)] + [(0.0, 10.0 + s, kind, None) for s in extra]


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 4), kind=st.sampled_from(("compute", "call", "woken")),
       driver=st.lists(st.tuples(st.floats(0, 1), lengths), min_size=1, max_size=4),
       slice_s=st.sampled_from((0.0, 3.5e-3, 0.5)))
def test_driver_work_never_waits_behind_a_workers(cores, kind, driver, slice_s):
    driver = driver[:cores]  # fewer driver pieces than cores could ever queue among themselves
    jobs = _busy(cores, kind) + [(at, s, "driver", None) for at, s in driver]
    ends, _ = _run(cores, jobs, slice_s=slice_s)
    for (at, s, _, _), end in zip(jobs[cores:], ends[cores:], strict=True):
        assert end == pytest.approx(at + s, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 3), quanta=st.integers(2, 6), quantum=st.floats(1e-3, 5e-3),
       workers=st.lists(st.tuples(st.floats(0, 0.03), lengths, st.sampled_from(("woken", "compute", "call"))),
                        min_size=1, max_size=6),
       slice_s=st.sampled_from((0.0, 3.5e-3)))
@example(cores=1, quanta=3, quantum=5e-3, workers=[(1e-3, 0.5, "call")], slice_s=3.5e-3)  # queued at a boundary
def test_a_driver_thread_in_back_to_back_quanta_keeps_its_core(cores, quanta, quantum, workers, slice_s):
    """The driver's thread (a torch team's spin, a long update held in quanta) asks for its next quantum at the
    instant its last one ends. A worker's piece queued meanwhile is handed the core at that instant, and the driver's
    quantum that comes in the same instant preempts it like any running piece: the driver's loop never waits."""
    env = simpy.Environment()
    pool = CpuPool(env, "n0", cores, wake_latency=5e-5 if slice_s else 0.0, wake_slice=slice_s)
    pool.enable_preemption()
    ends: list[float] = []

    def driver_loop():
        for _ in range(quanta):
            yield from pool.work(quantum, urgent=True, thread="team")
        ends.append(env.now)

    def worker(at, seconds, kind):
        yield env.timeout(at)
        yield from pool.work(seconds, woken=kind == "woken", compute=kind == "compute", thread=("w", at))

    for _ in range(cores):
        env.process(driver_loop())
    for at, seconds, kind in workers:
        env.process(worker(at, seconds, kind))
    env.run()
    assert ends == [pytest.approx(quanta * quantum, abs=1e-12)] * cores


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 3), woken=st.lists(st.tuples(st.floats(0, 1), lengths), min_size=1, max_size=4))
def test_woken_work_waits_for_the_drivers_and_preempts_ordinary_work(cores, woken):
    jobs = [(at, s, "woken", None) for at, s in woken]
    ends, _ = _run(cores, _busy(cores, "driver") + jobs)
    assert all(end >= 10.0 + s - 1e-12 for (_, s, _, _), end in zip(jobs, ends[cores:], strict=True))
    woken = woken[:cores]
    jobs = [(at, s, "woken", None) for at, s in woken]
    ends, _ = _run(cores, _busy(cores, "compute") + jobs)
    assert ends[cores:] == pytest.approx([at + s for at, s in woken], abs=1e-12)


@settings(max_examples=80, deadline=None)
@given(cores=st.integers(1, 3), at=st.floats(0, 5), seconds=lengths, latency=st.floats(0, 1e-3),
       slice_s=st.floats(1e-3, 0.5))
@example(cores=2, at=0.5, seconds=0.2, latency=5e-5, slice_s=3.5e-3)  # longer than its slice: the rest queues
@example(cores=2, at=0.5, seconds=2e-3, latency=5e-5, slice_s=3.5e-3)  # within its slice
def test_a_woken_call_runs_after_the_wake_latency_for_its_slice_then_queues(cores, at, seconds, latency, slice_s):
    ends, pool = _run(cores, _busy(cores, "compute") + [(at, seconds, "call", None)], latency, slice_s)
    if seconds <= slice_s:
        assert ends[-1] == pytest.approx(at + latency + seconds, abs=1e-9)
    elif cores > 1:  # its slice at once, then the rest waits for the first core that frees (at 10 s)
        assert ends[-1] == pytest.approx(10.0 + seconds - slice_s, abs=1e-9)
    else:  # the one core's busy piece was paused for the slice: it frees the core that much later
        assert ends[-1] == pytest.approx(10.0 + seconds, abs=1e-9)
    assert pool.busy_core_seconds == pytest.approx(10.0 * cores + seconds, rel=1e-12)


def _after_compute(cores: int, compute: float, after: float, thread: str, latency: float = 0.0,
                   quantum: float = 0.0) -> float:
    """Busy compute on every core but one, a worker's ``compute`` there (thread ``runner``), another busy piece
    queued for that core; at the instant the worker's compute ends, ``after`` seconds of ordinary work on
    ``thread``. Returns when that work ends."""
    env = simpy.Environment()
    pool = CpuPool(env, "n0", cores, wake_latency=latency, wake_slice=0.5)
    pool.enable_preemption()
    pool.quantum = quantum
    end = []

    def busy(i):
        yield from pool.work(10.0, compute=True, thread=("busy", i))

    def worker():
        yield from pool.work(compute, compute=True, thread="runner")
        yield from pool.work(after, thread=thread)
        end.append(env.now)

    for i in range(cores - 1):
        env.process(busy(i))
    env.process(worker())
    env.process(busy(cores - 1))
    env.run()
    return end[0]


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(2, 3), seconds=lengths, after=st.floats(1e-3, 0.4))
def test_a_piece_that_continues_its_threads_compute_has_no_credit(cores, seconds, after):
    """Without a turn left (the pool's quantum 0), a piece of the same thread right after its compute continues
    its run (no wake): it queues and ends ``after`` past 10 s, when the first busy core frees. Of another thread
    (the process's sender) it is a wake, within its 0.5 s slice: it ends ``after`` past the compute."""
    assert _after_compute(cores, seconds, after, "runner") == pytest.approx(10.0 + after, abs=1e-9)
    assert _after_compute(cores, seconds, after, "sender") == pytest.approx(seconds + after, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(2, 3), last=st.floats(1e-4, 5e-3), after=st.floats(1e-4, 5e-3))
def test_a_piece_that_follows_its_threads_compute_runs_on_for_the_rest_of_the_turn(cores, last, after):
    """Compute runs in turns of the pool's quantum (5 ms here). A thread whose last piece of compute took
    ``last`` seconds keeps ``5 ms - last`` of its turn: the serialisation that follows it at once runs on for that
    long (it does not queue behind the node's other work), and only what exceeds the turn queues."""
    quantum = 5e-3
    end = _after_compute(cores, last, after, "runner", latency=1e-3, quantum=quantum)
    left = quantum - last
    if after <= left:  # within its turn: no wake latency (it never slept), no queueing
        assert end == pytest.approx(last + after, abs=1e-12)
    else:  # the turn (on the core of the oldest busy piece, which ends that much later), then the rest waits
        # for the first core that frees: another busy piece's at 10 s, or with two cores the paused piece's
        # (10 s + the turn) or the queued piece's (10 s + ``last``), whichever first
        first_free = 10.0 if cores > 2 else 10.0 + min(left, last)
        assert end == pytest.approx(first_free + after - left, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 4), jobs=st.lists(st.tuples(st.floats(0, 2), lengths, st.sampled_from(("compute", "call")),
                                                         st.sampled_from((None, "a", "b"))), min_size=1, max_size=16))
def test_without_wake_settings_threads_change_nothing(cores, jobs):
    plain = [(at, s, kind, None) for at, s, kind, _ in jobs]
    assert _run(cores, jobs)[0] == _run(cores, plain)[0] == _run(cores, plain, preemptive=False)[0]


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 4), latency=st.floats(0, 1e-3), slice_s=st.sampled_from((0.0, 1e-3, 3.5e-3, 0.2)),
       jobs=st.lists(st.tuples(st.floats(0, 2), lengths, st.sampled_from(KINDS), st.sampled_from((None, "a", "b"))),
                     min_size=1, max_size=20))
def test_work_is_conserved_whoever_runs_first(cores, latency, slice_s, jobs):
    ends, pool = _run(cores, jobs, latency, slice_s)
    total = sum(s for _, s, _, _ in jobs)
    assert pool.busy_core_seconds == pytest.approx(total, rel=1e-9)
    assert all(end >= at + s - 1e-12 for (at, s, _, _), end in zip(jobs, ends, strict=True))
    assert max(ends) >= min(at for at, _, _, _ in jobs) + total / cores - 1e-9
    assert pool._server.busy == 0 and not pool._preempted and not pool._running


def test_a_woken_background_poll_is_skipped_where_only_the_drivers_work_runs():
    env = simpy.Environment()
    pool = CpuPool(env, "n0", 1)
    pool.enable_preemption()
    ran = []

    def poll():
        yield env.timeout(0.1)
        pool_busy = pool.busy_core_seconds
        yield from pool.work(0.01, woken=True, background=True)
        ran.append(pool.busy_core_seconds - pool_busy)

    env.process(pool.work(1.0, urgent=True))
    env.process(poll())
    env.run()
    assert ran == [0.0] and env.now == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [-1e-3, float("nan"), float("inf")])
def test_wake_settings_are_checked(bad):
    with pytest.raises(ValueError, match="wake_latency"):
        CpuPool(simpy.Environment(), "n0", 2, wake_latency=bad)
    with pytest.raises(ValueError, match="wake_slice"):
        CpuPool(simpy.Environment(), "n0", 2, wake_slice=bad)


def test_woken_work_needs_a_preemptive_pool():
    with pytest.raises(RuntimeError, match="woken work on a pool without preemption"):
        next(CpuPool(simpy.Environment(), "n0", 1).work(1.0, woken=True))


# ------------------------------------------------------------ in the simulation
def _sim(cores: int, algorithm: str = "dqn", **cpu) -> Simulation:
    topo = tiny_topology_dict(gpus=0, cores=cores)
    topo["devices"][0].update(cpu)
    return Simulation(topology_from_dict(topo), load_workload(algorithm), create_policy("rllib-stock"), iterations=4)


@pytest.mark.parametrize("algorithm", ["dqn", "ppo", "appo"])
def test_a_crowded_node_runs_the_drivers_process_first_and_reads_the_topologys_wake_settings(algorithm):
    sim = _sim(1, algorithm, wake_latency="50 us", wake_slice_time="3.5 ms")
    node = sim.layout.driver_node
    pool = sim.cpus[node]
    assert sim.crowded[node] and pool.preemptive
    assert (pool.wake_latency, pool.wake_slice) == pytest.approx((50e-6, 3.5e-3))
    roomy = _sim(64, algorithm)
    assert not roomy.crowded[node] and not roomy.cpus[node].preemptive and roomy.cpus[node].wake_slice == 0.0
    # the driver's work on a crowded node does not wait for a runner's compute
    env, ends = sim.env, []

    def runner():
        yield from sim.on_cores(node, 1.0, thread=("runner", "r"))

    def driver():
        yield env.timeout(0.25)
        yield from sim.on_driver(0.01)
        ends.append(env.now)

    env.process(runner())
    env.process(driver())
    env.run(until=2.0)
    assert ends == [pytest.approx(0.26)]


@pytest.mark.parametrize("field,value", [("wake_latency", "-1 ms"), ("wake_slice_time", "-3 ms")])
def test_a_bad_wake_setting_in_a_topology_names_its_field(field, value):
    from conduit.errors import ConduitError

    topo = tiny_topology_dict(gpus=0, cores=2)
    topo["devices"][0][field] = value
    with pytest.raises(ConduitError, match=field):
        topology_from_dict(topo)
