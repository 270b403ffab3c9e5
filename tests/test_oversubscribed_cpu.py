"""Work on an over-subscribed node costs more CPU (``oversubscribed_cpu_cost``, issue 13).

The cost is measured by :mod:`conduit.runtime.contention` (``conduit calibrate --workloads``), written to the
calibrated topology's CPU, and charged by :class:`conduit.sim.resources.CpuPool` to the workload's compute
(sampling, a CPU learner's update) that arrives while every core is taken. Properties, over random work:

* a cost of 1 (every built-in topology) changes nothing: the same end times and busy seconds as before;
* the data path's work (``compute=False``) never pays it;
* compute that always finds a core free never pays it;
* on one core, compute that all arrives at once: the first piece runs at its length, every other piece at the
  cost times its length, and the core is never idle while work waits;
* busy core-seconds lie between the work's sum and the cost times that sum, and no piece ends earlier than it
  would at a cost of 1.

Then the topology field (accepted, and refused by name when it is not a number >= 1), the calibrated YAML
(written with its source when measured, absent otherwise) and the measurement's own bookkeeping on a short
run (the validation's ``--contention`` file: ``tests/test_validation_study.py``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.errors import TopologyError
from conduit.sim.resources import CpuPool
from conduit.topology import topology_from_dict

lengths = st.floats(min_value=1e-3, max_value=1.0, allow_nan=False)
costs = st.floats(min_value=1.0, max_value=3.0, allow_nan=False)
jobs_strategy = st.lists(st.tuples(st.floats(0, 2), lengths, st.booleans()), min_size=1, max_size=20)


def _run(cores: int, jobs: list[tuple[float, float, bool]], cost: float | None, poll_cost: float = 1.0,
         pollers: int = 0) -> tuple[list[float], CpuPool]:
    """Run ``(arrival, seconds, compute)`` jobs (with ``pollers`` pollers polling the whole run and ``poll_cost``
    in force); returns each job's end time and the pool."""
    env = simpy.Environment()
    pool = CpuPool(env, "n0", cores) if cost is None else CpuPool(env, "n0", cores, oversubscribed_cost=cost)
    pool.poll_cost = poll_cost
    for _ in range(pollers):
        pool.polling(True)
    ends = [0.0] * len(jobs)

    def job(i: int, at: float, seconds: float, compute: bool):
        yield env.timeout(at)
        yield from pool.work(seconds, compute=compute)
        ends[i] = env.now

    for i, (at, seconds, compute) in enumerate(jobs):
        env.process(job(i, at, seconds, compute))
    env.run()
    return ends, pool


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 4), jobs=jobs_strategy)
def test_a_cost_of_one_changes_nothing(cores, jobs):
    ends, pool = _run(cores, jobs, 1.0)
    before, plain = _run(cores, jobs, None)
    assert ends == before
    assert pool.busy_core_seconds == plain.busy_core_seconds


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 4), jobs=jobs_strategy, cost=costs)
def test_the_data_paths_work_never_pays_it(cores, jobs, cost):
    data_path = [(at, s, False) for at, s, _ in jobs]
    assert _run(cores, data_path, cost)[0] == _run(cores, data_path, None)[0]


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 4), pieces=st.lists(lengths, min_size=1, max_size=12), cost=costs)
def test_compute_that_finds_a_core_free_never_pays_it(cores, pieces, cost):
    jobs, at = [], 0.0
    for s in pieces:  # one after another: never more than one piece at a time
        jobs.append((at, s, True))
        at += s + 0.01
    ends, pool = _run(cores, jobs, cost)
    assert ends == pytest.approx([a + s for a, s, _ in jobs])
    assert pool.busy_core_seconds == pytest.approx(sum(pieces))


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(lengths, min_size=1, max_size=12), cost=costs)
def test_on_one_core_every_piece_but_the_first_pays_it(pieces, cost):
    ends, pool = _run(1, [(0.0, s, True) for s in pieces], cost)
    expected = pieces[0] + cost * sum(pieces[1:])
    assert max(ends) == pytest.approx(expected)
    assert pool.busy_core_seconds == pytest.approx(expected)


@settings(max_examples=80, deadline=None)
@given(cores=st.integers(1, 4), jobs=jobs_strategy, cost=costs)
def test_busy_seconds_are_bounded_and_nothing_ends_earlier(cores, jobs, cost):
    ends, pool = _run(cores, jobs, cost)
    base_ends, base = _run(cores, jobs, None)
    work = sum(s for _, s, _ in jobs)
    compute = sum(s for _, s, c in jobs if c)
    assert work - 1e-9 <= pool.busy_core_seconds <= work + (cost - 1.0) * compute + 1e-9
    assert base.busy_core_seconds == pytest.approx(work)
    assert all(e >= b - 1e-9 for e, b in zip(ends, base_ends, strict=True))


@pytest.mark.parametrize("bad", [0.5, 0, -1, math.nan])
def test_the_pool_refuses_a_cost_below_one(bad):
    with pytest.raises(ValueError, match="oversubscribed_cost"):
        CpuPool(simpy.Environment(), "n0", 2, oversubscribed_cost=bad)


def _topology(cpu: dict) -> dict:
    return {"name": "t", "devices": [{"id": "cpu0", "kind": "cpu", "cores": 2, **cpu},
                                     {"id": "dram0", "kind": "memory", "capacity": "8 GiB", "bandwidth": "10 GB/s"}],
            "links": [{"src": "cpu0", "dst": "dram0", "bandwidth": "10 GB/s", "latency": "1 us"}]}


def test_the_topology_field_is_accepted_and_reaches_the_cpu_pool():
    from conduit.registry import create_policy
    from conduit.sim.engine import Simulation
    from conduit.sim.workload import load_workload

    topo = topology_from_dict(_topology({"oversubscribed_cpu_cost": 1.25}), source="t")
    assert topo.devices["cpu0"].get("oversubscribed_cpu_cost") == 1.25
    sim = Simulation(topo, load_workload("ppo"), create_policy("rllib-stock"), iterations=1, seed=0)
    assert {p.oversubscribed_cost for p in sim.cpus.values()} == {1.25}
    plain = Simulation(topology_from_dict(_topology({}), source="t"), load_workload("ppo"),
                       create_policy("rllib-stock"), iterations=1, seed=0)
    assert {p.oversubscribed_cost for p in plain.cpus.values()} == {1.0}


@pytest.mark.parametrize("bad", [0.9, 0, -2, "two", True, ".nan", [1.5]])
def test_the_topology_field_is_refused_by_name(bad):
    with pytest.raises(TopologyError, match=r"devices\[0\]\.oversubscribed_cpu_cost: must be a number >= 1"):
        topology_from_dict(_topology({"oversubscribed_cpu_cost": float("nan") if bad == ".nan" else bad}),
                           source="t")


def _measurements(contention: dict | None):
    from conduit.runtime.calibrate import Measurement, Measurements

    host = {"hostname": "unit", "cores": 2, "dram_capacity": 8 * 2**30}
    if contention is not None:
        host["contention"] = contention
    ms = Measurements(host=host)
    ms["memcpy"] = Measurement("memcpy", 5e9, 1e-6, 10, "synthetic", [4096], [1e-6])
    return ms


def test_the_calibrated_yaml_carries_the_measured_cost_with_its_source():
    from conduit.runtime.calibrate import topology_yaml
    from conduit.topology.yamlio import parse_yaml

    text = topology_yaml(_measurements({"oversubscribed_cpu_cost": 1.10537, "note": "median over 48 pairs"}))
    assert "[contention]" in text and "median over 48 pairs" in text
    topo = topology_from_dict(parse_yaml(text, "cal"), source="cal")
    assert topo.devices["cpu0"].get("oversubscribed_cpu_cost") == pytest.approx(1.1054)


@pytest.mark.parametrize("contention", [None, {"oversubscribed_cpu_cost": None, "note": "not measured: Boom"}])
def test_the_calibrated_yaml_leaves_the_cost_out_when_not_measured(contention):
    from conduit.runtime.calibrate import topology_yaml
    from conduit.topology.yamlio import parse_yaml

    text = topology_yaml(_measurements(contention))
    topo = topology_from_dict(parse_yaml(text, "cal"), source="cal")
    assert topo.devices["cpu0"].get("oversubscribed_cpu_cost") is None
    assert ("not measured: Boom" in text) == (contention is not None)


def test_paired_ratios_time_idle_and_busy_windows_in_alternating_order():
    from conduit.runtime import contention

    class Recorder:
        def __init__(self):
            self.states: list[bool] = []

        def busy(self, on: bool) -> None:
            self.states.append(on)

        def cpu_s(self) -> float:
            return 0.0

    nb = Recorder()
    cpu, wall, idle, held = contention.paired_ratios(lambda: sum(range(2000)) and 1, nb, pairs=4, window=0.01)
    assert nb.states == [False, True, True, False, False, True, True, False]
    assert len(cpu) == len(wall) == len(idle) == len(held) == 4
    assert all(r > 0 and math.isfinite(r) for r in cpu + wall) and all(s > 0 for s in idle)
    assert all(0 < work <= 1.5 and others == 0.0 for work, others in held)


def test_the_cost_needs_rows_with_as_many_neighbours_as_cores(monkeypatch):
    pytest.importorskip("torch", reason="the learner-like work needs torch")
    from conduit.runtime import contention

    out = contention.measure(pairs=1, window=0.02, neighbours=[0], work=(("learner-like", 1),))
    assert out["oversubscribed_cpu_cost"] is None and "not measured" in out["note"]
    assert [row["neighbours"] for row in out["rows"]] == [0] and out["rows"][0]["work"] == "learner-like update"
    for bad in ({"pairs": 0}, {"window": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            contention.measure(**{"pairs": 1, "window": 0.01, "neighbours": [0], "work": (), **bad})
    with pytest.raises(ValueError, match="env_runner"):
        contention.measure(pairs=1, window=0.01, neighbours=[0], work=(("ppo-cartpole", 10),))


def test_calibrate_records_a_failed_measurement_instead_of_raising(monkeypatch):
    from conduit.runtime import calibrate, contention

    def boom(*args, **kwargs):
        raise RuntimeError("no env for you")

    monkeypatch.setattr(contention, "measure", boom)
    got = calibrate._measure_contention(quick=True, progress=None)
    assert got["oversubscribed_cpu_cost"] is None and "no env for you" in got["note"]


@pytest.mark.parametrize(("argv", "named"), [(["--pairs", "0"], "--pairs"), (["--window", "0"], "--window"),
                                             (["--neighbours", "-1"], "--neighbours")])
def test_the_benchmark_refuses_bad_arguments_by_name(argv, named):
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "contention_cpu.py"
    run = subprocess.run([sys.executable, str(script), *argv], check=False, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and named in run.stderr


def test_the_benchmark_writes_its_rows(tmp_path):
    pytest.importorskip("ray.rllib", reason="the benchmark times an RLlib EnvRunner")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "contention_cpu.py"
    out = tmp_path / "c.json"
    run = subprocess.run([sys.executable, str(script), "--pairs", "1", "--window", "0.05", "--neighbours", "0",
                          "--json", str(out)], check=False, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads(out.read_text())
    assert [r["work"] for r in data["rows"]] == ["env_runner:ppo-cartpole", "env_runner:ppo-largeobs",
                                                "learner-like update"]
    assert all(r["neighbours"] == 0 and len(r["cpu_ratios"]) == 1 for r in data["rows"])
    assert data["oversubscribed_cpu_cost"] is None  # no row beside as many neighbours as cores


def test_calibrate_with_workloads_measures_the_cost_and_writes_it_to_cpu0(monkeypatch):
    """``measure_machine(workloads=...)`` runs the contention measurement (here on the learner-like update
    only, one short pair: the real neighbours, as many as cores) and ``topology_yaml`` carries its cost."""
    pytest.importorskip("torch", reason="the learner-like work needs torch")
    from conduit.runtime import calibrate, contention
    from conduit.topology.yamlio import parse_yaml

    real = contention.measure
    seen = {}

    def short(env_runner, **kw):
        seen.update(kw, env_runner=env_runner)
        return real(env_runner, pairs=1, window=0.05, work=(("learner-like", 1),), progress=kw.get("progress"))

    monkeypatch.setattr(contention, "measure", short)
    monkeypatch.setattr(calibrate, "measure_workload_primitives", lambda configs, quick, progress: {})
    ms = calibrate.measure_machine(quick=True, ray=False, disk=False, workloads={"w": ("ppo", object())})
    assert seen["env_runner"] is calibrate._named_env_runner and seen["pairs"] == 3  # quick: 3 pairs
    cost = ms.host["contention"]["oversubscribed_cpu_cost"]
    assert cost >= 1.0 and ms.host["contention"]["rows"][0]["neighbours"] == ms.host["contention"]["cores"]
    topo = topology_from_dict(parse_yaml(calibrate.topology_yaml(ms), "cal"), source="cal")
    assert topo.devices["cpu0"].get("oversubscribed_cpu_cost") == pytest.approx(cost, abs=1e-4)


def test_a_dead_neighbour_stops_the_measurement():
    """A window beside a neighbour that died would not be over-subscribed: the cost would read low, silently."""
    pytest.importorskip("torch", reason="the neighbours run torch")
    from conduit.runtime import contention

    with contention.Neighbours(1) as nb:
        nb.busy(True)  # alive: no complaint
        nb.procs[0].terminate()
        nb.procs[0].join(timeout=10)
        with pytest.raises(RuntimeError, match="neighbour process"):
            nb.busy(False)


# ---------------------------------------------------------------------------------------------- a poller's cost
@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 4), jobs=jobs_strategy, cost=costs, poll_cost=costs)
def test_a_poll_cost_applies_only_while_a_poller_polls(cores, jobs, cost, poll_cost):
    """No poller: the poll cost changes nothing; the data path's work never pays it either."""
    assert _run(cores, jobs, cost, poll_cost, 0)[0] == _run(cores, jobs, cost)[0]
    data_path = [(at, s, False) for at, s, _ in jobs]
    assert _run(cores, data_path, cost, poll_cost, 2)[0] == _run(cores, data_path, None)[0]


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(lengths, min_size=1, max_size=12), cost=costs, poll_cost=costs)
def test_beside_a_poller_compute_on_a_full_node_pays_both_costs(pieces, cost, poll_cost):
    ends, pool = _run(1, [(0.0, s, True) for s in pieces], cost, poll_cost, 1)
    expected = pieces[0] + cost * poll_cost * sum(pieces[1:])
    assert max(ends) == pytest.approx(expected)
    assert pool.busy_core_seconds == pytest.approx(expected)


def test_a_poller_that_never_started_cannot_stop():
    pool = CpuPool(simpy.Environment(), "n0", 2)
    pool.polling(True)
    pool.polling(False)
    with pytest.raises(RuntimeError, match="had not started"):
        pool.polling(False)
