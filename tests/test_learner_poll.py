"""The microbenchmark behind ``StockCosts.learner_poll_cores`` and ``poll_neighbour_cost``
(:mod:`conduit.runtime.learner_poll`): a real idle APPO learner's thread, and a poller beside sampling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conduit.runtime import learner_poll

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "appo_learner_poll.py"
linux_only = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc/<pid>/task/<tid>/schedstat")


@linux_only
def test_a_thread_that_sleeps_wants_no_core_and_one_that_spins_wants_one():
    import threading

    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    def nap():
        stop.wait()

    threads = [threading.Thread(target=f, daemon=True) for f in (spin, nap)]
    for t in threads:
        t.start()
    try:
        busy, idle = (learner_poll.thread_demand(t.native_id, 0.3, 1)[0] for t in threads)
    finally:
        stop.set()
    assert idle["run_cores"] + idle["wait_cores"] < 0.05
    # the spinning thread holds the GIL against this one only at switch intervals: most of a core
    assert busy["run_cores"] + busy["wait_cores"] > 0.5


def test_a_missing_thread_is_an_error_naming_it():
    with pytest.raises(OSError, match="schedstat"):
        learner_poll.thread_schedstat(2**31 - 1)


@pytest.mark.parametrize(("kw", "named"), [({"seconds": 0}, "seconds"), ({"windows": 0}, "windows")])
def test_measure_learner_poll_refuses_bad_arguments(kw, named):
    with pytest.raises(ValueError, match=named):
        learner_poll.measure_learner_poll(**kw)


@pytest.mark.parametrize(("kw", "named"), [({"pairs": 0}, "pairs"), ({"window": 0}, "window"),
                                           ({"neighbours": -1}, "neighbours")])
def test_measure_poll_neighbour_cost_refuses_bad_arguments(kw, named):
    with pytest.raises(ValueError, match=named):
        learner_poll.measure_poll_neighbour_cost(lambda name: None, **kw)


@linux_only
def test_an_idle_appo_learner_thread_polls_its_circular_buffer():
    """RLlib's own APPO learner, built and left idle: its thread polls the empty CircularBuffer thousands of times
    a second, so it wants a measurable share of a core (0.15 on the 2-core VM) yet far from a whole one."""
    pytest.importorskip("ray.rllib", reason="times a real RLlib APPO learner")
    got = learner_poll.measure_learner_poll(seconds=0.3, windows=2)
    assert got["buffer"] == "CircularBuffer"
    assert len(got["windows"]) == 2
    assert 0.01 < got["cores"] < 0.9
    assert all(w["slices_per_s"] > 500 for w in got["windows"])  # it wakes, and often


@pytest.mark.parametrize(("argv", "named"), [(["--pairs", "0"], "--pairs"), (["--window", "0"], "--window"),
                                             (["--windows", "0"], "--windows"), (["--seconds", "-1"], "--seconds"),
                                             (["--neighbours", "-1"], "--neighbours")])
def test_the_benchmark_refuses_bad_arguments_by_name(argv, named):
    run = subprocess.run([sys.executable, str(SCRIPT), *argv], check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and named in run.stderr


@linux_only
def test_the_benchmark_measures_both_figures_and_writes_them(tmp_path):
    pytest.importorskip("ray.rllib", reason="the benchmark times an RLlib learner and EnvRunner")
    out = tmp_path / "poll.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--seconds", "0.2", "--windows", "1", "--pairs", "1",
                          "--window", "0.1", "--neighbours", "0", "--json", str(out)], check=False,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["learner_poll"]["cores"] > 0
    neighbour = data["poll_neighbour"]
    assert neighbour["neighbours"] == 0 and len(neighbour["cpu_ratios"]) == 1 and neighbour["cost"] >= 1.0
    assert neighbour["poller_cores"] is None or neighbour["poller_cores"] > 0  # the poller polled while on
    assert "StockCosts.learner_poll_cores" in run.stdout
