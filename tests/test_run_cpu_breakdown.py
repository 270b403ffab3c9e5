"""``benchmarks/run_cpu_breakdown.py``'s /proc accounting, on this process tree (no Ray, no study run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _scripts import BENCH, load_script
from hypothesis import given
from hypothesis import strategies as st

TOOL = BENCH / "run_cpu_breakdown.py"
rcb = load_script(TOOL, "_run_cpu_breakdown")

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")


@pytest.mark.parametrize(("cmd", "role"), [
    ("ray::SingleAgentEnvRunner.apply", "EnvRunner"), ("ray::ConduitSingleAgentEnvRunner", "EnvRunner"),
    ("ray::EnvRunnerStateServer", "state server"), ("ray::_WrappedExecutable.apply", "learner"),
    ("ray::_PlaneActor", "plane actor"), (".../ray/core/src/ray/raylet/raylet --raylet_socket_name=x", "raylet"),
    (".../gcs/gcs_server --log_dir=x", "gcs"), ("python studies/rllib_experience_path.py --workloads w", "driver"),
    ("ray::DashboardAgent", "other")])
def test_roles_from_command_lines(cmd, role):
    assert rcb.role_of(cmd) == role


def test_a_busy_child_is_counted_on_a_cpu_and_a_sleeping_one_is_not():
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 5: pass"
    busy = subprocess.Popen([sys.executable, "-c", code])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        time.sleep(0.5)
        a, t0 = rcb.snapshot(busy.pid), time.monotonic()
        time.sleep(1.0)
        b, t1 = rcb.snapshot(busy.pid), time.monotonic()
        (row,) = rcb.cores_between(a, b, t1 - t0)
        assert row["pid"] == busy.pid and row["role"] == "other"
        assert 0.3 < row["on_cpu"] + row["waiting"] <= 1.05  # it wants a whole core the whole time
        sa = rcb.snapshot(idle.pid)
        time.sleep(0.5)
        sb = rcb.snapshot(idle.pid)
        (quiet,) = rcb.cores_between(sa, sb, 0.5)
        assert quiet["on_cpu"] < 0.05
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()


def test_descendants_include_grandchildren():
    code = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(5)']); " \
           "print(c.pid, flush=True); time.sleep(5)"
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert set(rcb.descendants(parent.pid)) >= {parent.pid, child}
    finally:
        os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait()


@given(st.dictionaries(st.integers(1, 50), st.tuples(st.floats(0, 1e3), st.floats(0, 1e3)), max_size=8),
       st.dictionaries(st.integers(1, 50), st.tuples(st.floats(0, 1e3), st.floats(0, 1e3)), max_size=8),
       st.floats(0.1, 100))
def test_cores_between_only_processes_alive_at_both_snapshots(before, grow, seconds):
    a = {p: {"cmd": "x", "run_s": r, "wait_s": w} for p, (r, w) in before.items()}
    b = {p: {"cmd": "x", "run_s": a[p]["run_s"] + r if p in a else r, "wait_s": a[p]["wait_s"] + w if p in a else w}
         for p, (r, w) in grow.items()}
    rows = rcb.cores_between(a, b, seconds)
    assert {r["pid"] for r in rows} == set(a) & set(b)
    for r in rows:
        assert r["on_cpu"] == pytest.approx(grow[r["pid"]][0] / seconds, rel=1e-9, abs=1e-9)
    assert [r["on_cpu"] for r in rows] == sorted((r["on_cpu"] for r in rows), reverse=True)


def test_a_run_past_its_deadline_is_stopped_with_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="took longer than"):
        rcb.one_run("appo-cartpole-2r-1l", "stock", 4, tmp_path, timeout_s=0.5)


def test_a_failing_run_names_its_log(tmp_path):
    with pytest.raises(SystemExit, match="study.log"):
        rcb.one_run("no-such-workload", "stock", 4, tmp_path, timeout_s=120)
    assert (tmp_path / "study.log").exists()


def test_busiest_threads_are_the_ones_alive_at_both_snapshots_above_the_floor():
    a = {1: ("main", 1.0), 2: ("omp", 0.5), 3: ("io", 0.0), 4: ("gone", 0.0)}
    b = {1: ("main", 1.5), 2: ("omp", 0.502), 3: ("io", 0.2), 5: ("new", 9.0)}
    rows = rcb.busiest_threads(a, b, 1.0)
    assert [(r["tid"], r["name"]) for r in rows] == [(1, "main"), (3, "io")]  # busiest first, omp below 0.01
    assert rows[0]["on_cpu"] == pytest.approx(0.5)

