"""How the kernel serves a woken thread on a crowded node (:mod:`conduit.runtime.wakeup`), and where its figures go:
``benchmarks/wake_latency.py``, ``conduit calibrate``'s topology (``wake_latency``, ``wake_slice_time``), the
validation's ``--contention`` file."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_oversubscribed_cpu import _measurements

from conduit.runtime import wakeup
from conduit.topology import topology_from_dict

ROOT = Path(__file__).resolve().parents[1]
readings = st.lists(st.tuples(st.floats(0, 5e-3), st.floats(1e-5, 8e-3), st.booleans()), min_size=1, max_size=40)


@settings(max_examples=80, deadline=None)
@given(busy=readings, idle=readings)
def test_the_figures_are_the_busy_latency_less_the_timers_and_the_median_first_run(busy, idle):
    out = wakeup.summarise({True: busy, False: idle}, cores=2, neighbours=2)
    expected = statistics.fmean(b[0] for b in busy) - statistics.fmean(i[0] for i in idle)
    assert out["wake_latency"] == pytest.approx(max(0.0, expected), abs=1e-15)
    assert out["wake_latency"] >= 0.0
    assert out["wake_slice_time"] == pytest.approx(statistics.median(b[1] for b in busy))
    assert out["preempted_share"] == pytest.approx(sum(b[2] for b in busy) / len(busy))
    assert (out["wakes_busy"], out["wakes_idle"]) == (len(busy), len(idle))


def test_the_figures_need_both_kinds_of_window():
    with pytest.raises(ValueError, match="idle and busy"):
        wakeup.summarise({True: [(1e-4, 3e-3, True)], False: []}, cores=2, neighbours=2)


def test_one_wake_reads_its_latency_and_first_run():
    latency, first, preempted = wakeup.wake_once(run_s=2e-3, sleep=1e-3)
    assert -1e-3 < latency < 0.5  # the sleep may end a little late, never much early
    assert 0.0 <= first <= 2e-3 + 1e-9
    assert preempted == (first < 2e-3)


def test_measure_beside_a_real_busy_neighbour():
    pytest.importorskip("torch", reason="the neighbours run torch")
    out = wakeup.measure(pairs=1, wakes=3, neighbours=1)
    assert out["neighbours"] == 1 and out["wakes_busy"] == out["wakes_idle"] == 3
    assert out["wake_latency"] >= 0.0 and 0.0 < out["wake_slice_time"] <= wakeup.RUN_S + 1e-9
    assert "when" in out and "wakes beside 1 busy" in out["note"]


@pytest.mark.parametrize("pairs,wakes", [(0, 3), (2, 0)])
def test_measure_refuses_an_empty_run(pairs, wakes):
    with pytest.raises(ValueError, match="at least 1"):
        wakeup.measure(pairs=pairs, wakes=wakes)


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "wake_latency.py"), *args], check=False,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "RAY_AUTH_MODE": "disabled"})


@pytest.mark.parametrize("content", [None, "{not json", "[1, 2]"])
def test_the_script_refuses_a_bad_contention_file_before_measuring(tmp_path, content):
    target = tmp_path / "contention.json"
    if content is not None:
        target.write_text(content)
    run = _script("--into", str(target))
    assert run.returncode == 2
    assert str(target) in run.stderr and "Traceback" not in run.stderr
    assert "wakes" not in run.stdout  # nothing was measured
    assert (target.read_text() if content is not None else None) == content  # and nothing lost


@pytest.mark.parametrize("args,field", [(["--pairs", "0"], "--pairs"), (["--wakes", "-1"], "--wakes"),
                                        (["--neighbours", "0"], "--neighbours")])
def test_the_script_names_a_bad_argument(args, field):
    run = _script(*args)
    assert run.returncode == 2 and field in run.stderr and "Traceback" not in run.stderr


def test_the_calibrated_yaml_carries_the_wake_figures_with_their_source():
    from conduit.runtime.calibrate import topology_yaml
    from conduit.topology.yamlio import parse_yaml

    block = {"oversubscribed_cpu_cost": 1.1, "note": "pairs",
             "wakeup": {"wake_latency": 6.1e-5, "wake_slice_time": 3.55e-3, "note": "640 wakes beside 2"}}
    text = topology_yaml(_measurements(block))
    assert "[wakeup]" in text and "640 wakes beside 2" in text
    cpu = topology_from_dict(parse_yaml(text, "cal"), source="cal").devices["cpu0"]
    assert cpu.get("wake_latency") == pytest.approx(6.1e-5, rel=0.01)
    assert cpu.get("wake_slice_time") == pytest.approx(3.55e-3, rel=0.01)


@pytest.mark.parametrize("wake", [None, {"wake_slice_time": None, "note": "not measured: Boom"}])
def test_the_calibrated_yaml_leaves_the_wake_figures_out_when_not_measured(wake):
    from conduit.runtime.calibrate import topology_yaml
    from conduit.topology.yamlio import parse_yaml

    block = {"oversubscribed_cpu_cost": 1.1, "note": "pairs", **({"wakeup": wake} if wake else {})}
    text = topology_yaml(_measurements(block))
    cpu = topology_from_dict(parse_yaml(text, "cal"), source="cal").devices["cpu0"]
    assert cpu.get("wake_latency") is None and cpu.get("wake_slice_time") is None
    assert ("not measured: Boom" in text) == (wake is not None)


def test_calibrate_measures_the_wake_figures_beside_the_contention(monkeypatch):
    from conduit.runtime import calibrate, contention

    monkeypatch.setattr(contention, "measure", lambda env_runner, **kw: {"oversubscribed_cpu_cost": 1.2, "note": "n"})
    seen = {}

    def short(**kw):
        seen.update(kw)
        return {"wake_latency": 1e-4, "wake_slice_time": 3e-3, "note": "w"}

    monkeypatch.setattr(wakeup, "measure", short)
    out = calibrate._measure_contention(quick=True, progress=None)
    assert out["wakeup"]["wake_slice_time"] == 3e-3 and seen["pairs"] == 2 and seen["wakes"] == 10

    def boom(**kw):
        raise OSError("no clock")

    monkeypatch.setattr(wakeup, "measure", boom)
    out = calibrate._measure_contention(quick=True, progress=None)
    assert out["oversubscribed_cpu_cost"] == 1.2  # the cost stays
    assert out["wakeup"]["wake_slice_time"] is None and "OSError: no clock" in out["wakeup"]["note"]


def test_the_validation_reads_the_wake_figures_from_its_contention_file(tmp_path):
    """``studies/validation.py --contention`` passes the ``wakeup`` block through to the topology it builds."""
    sys.path.insert(0, str(ROOT / "studies"))
    import validation as V

    cal = json.loads((ROOT / "results" / "validation" / "calibration.json").read_text())
    block = {"oversubscribed_cpu_cost": 1.08, "note": "n",
             "wakeup": {"wake_latency": 5e-5, "wake_slice_time": 3.5e-3, "note": "w"}}
    path = tmp_path / "contention.json"
    path.write_text(json.dumps(block))
    topo, _ = V.topology_from_calibration(V.with_contention(cal, path))
    cpu = topo.devices["cpu0"]
    assert cpu.get("wake_slice_time") == pytest.approx(3.5e-3, rel=0.01)
    assert cpu.get("wake_latency") == pytest.approx(5e-5, rel=0.01)
