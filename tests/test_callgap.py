"""The cold-call law's measurement (:mod:`conduit.runtime.callgap`): the series per sleep, and its reduction to the
ramp and the surcharges the simulator reads (:mod:`conduit.sim.raycalls`)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.runtime.callgap import COLD_SHARE, cold_figures, cold_ramp, gap_costs, ramp_figure


def _work() -> None:
    end = time.process_time() + 2e-4  # 0.2 ms of this process's CPU per call
    while time.process_time() < end:
        pass


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc/<pid>/task (Linux)")
def test_each_sleep_gets_its_interval_wall_time_and_both_processes_cpu():
    rows = gap_costs(_work, os.getpid(), os.getpid(), [0.0, 0.002], calls=5, blocks=1, idle_s=0.05)
    assert [r["sleep_s"] for r in rows] == [0.0, 0.002]
    for r in rows:
        assert 1.5e-4 <= r["wall_s"] < 0.05  # the call, not the sleep before it
        assert r["interval_s"] >= r["wall_s"] + r["sleep_s"] * 0.9  # start to start: the sleep and the call
        assert r["caller_cpu_s"] > 1e-4 and r["callee_cpu_s"] > 1e-4


def test_without_pids_only_the_wall_and_the_interval_are_timed():
    rows = gap_costs(_work, None, None, [0.0], calls=3)
    assert set(rows[0]) == {"sleep_s", "interval_s", "wall_s"}


def test_bad_series_are_refused():
    with pytest.raises(ValueError, match="sleep"):
        gap_costs(_work, None, None, [-1e-3], calls=1)
    with pytest.raises(ValueError, match="calls"):
        gap_costs(_work, None, None, [0.0], calls=0)


rows_strategy = st.lists(
    st.tuples(st.floats(1e-5, 0.05), st.floats(1e-5, 0.01), st.floats(0.0, 0.01), st.floats(0.0, 0.01)),
    min_size=2, max_size=7).map(
    lambda rs: [{"sleep_s": i * 1e-3, "interval_s": sum(r[0] for r in rs[:i + 1]), "wall_s": w, "caller_cpu_s": c,
                 "callee_cpu_s": e} for i, (_, w, c, e) in enumerate(rs)])


@settings(max_examples=80, deadline=None)
@given(rows=rows_strategy, cpu=st.booleans())
def test_the_ramp_runs_from_the_back_to_back_interval_to_the_first_near_the_plateau(rows, cpu):
    if not cpu:  # no /proc: the round trip is all there is
        rows = [{k: v for k, v in r.items() if not k.endswith("cpu_s")} for r in rows]
    key = (lambda r: r["caller_cpu_s"] + r["callee_cpu_s"]) if cpu else (lambda r: r["wall_s"])
    assert all(ramp_figure(r) == key(r) for r in rows)
    warm, cold = cold_ramp(rows)
    growth = key(rows[-1]) - key(rows[0])
    if growth <= 0:
        assert (warm, cold) == (0.0, 0.0)  # no surcharge measured: no law
        return
    assert warm == rows[0]["interval_s"] <= cold <= rows[-1]["interval_s"]
    first = next(r for r in rows[1:] if key(r) - key(rows[0]) >= COLD_SHARE * growth)
    assert cold == max(warm, first["interval_s"])


@settings(max_examples=80, deadline=None)
@given(rows=rows_strategy)
def test_the_surcharges_are_the_longest_sleeps_figures_less_back_to_back_never_negative(rows):
    extra = cold_figures(rows)
    for key in ("wall_s", "caller_cpu_s", "callee_cpu_s"):
        assert extra[key] == max(0.0, rows[-1][key] - rows[0][key])
