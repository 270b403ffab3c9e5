"""The VM's free page reporting, read from sysfs (conduit.runtime.pagereport): unknown stays unknown."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conduit.runtime import pagereport as pr


def _parameters(tmp_path, reported: str | None, **settings: str):
    root = tmp_path / "parameters"
    root.mkdir(parents=True, exist_ok=True)
    if reported is not None:
        (root / "reported_kib").write_text(reported)
    for name, value in settings.items():
        (root / name).write_text(value)
    return root


def test_a_snapshot_reads_the_counter_and_the_settings_the_kernel_has(tmp_path):
    root = _parameters(tmp_path, "32485104\n", min_free_ms="0\n", max_waiting_mib="1024\n", page_reporting_order="9")
    snap = pr.snapshot(root)
    assert snap is not None and snap.reported_kib == 32485104
    assert dict(snap.settings) == {"min_free_ms": 0, "max_waiting_mib": 1024, "page_reporting_order": 9}
    # a kernel with only the counter: the settings it lacks are left out, not invented
    assert dict(pr.snapshot(_parameters(tmp_path / "b", "7")).settings) == {}


@pytest.mark.parametrize("content", [None, "", "many\n", "-5", "1.5"])
def test_no_counter_or_an_unreadable_one_is_unknown_not_zero(tmp_path, content):
    root = _parameters(tmp_path, content)
    assert pr.snapshot(root) is None
    assert pr.snapshot(tmp_path / "no-such-module") is None


@given(kib0=st.integers(0, 2**40), grown=st.integers(0, 2**30), t0=st.floats(0, 1e6), dt=st.floats(0, 1e4))
def test_reported_between_two_snapshots_is_the_counters_growth(kib0, grown, t0, dt):
    before = pr.Snapshot(kib0, t0, {"min_free_ms": 0})
    after = pr.Snapshot(kib0 + grown, t0 + dt, {"min_free_ms": 0})
    got = pr.reported_between(before, after)
    assert got["mb"] == pytest.approx(grown / 1024, abs=1e-3)
    assert got["settings"] == {"min_free_ms": 0}
    elapsed = after.at_s - before.at_s
    if elapsed > 0:
        assert got["mb_per_s"] == pytest.approx(grown / 1024 / elapsed, rel=1e-6, abs=1e-3)
    else:
        assert got["mb_per_s"] is None
    # a counter that went backwards (a reboot between them), time that ran backwards, or a missing end: unknown
    if grown:
        assert pr.reported_between(after, before) is None
    assert pr.reported_between(None, after) is None and pr.reported_between(before, None) is None


def test_watch_measures_what_was_reported_inside_the_block(tmp_path):
    root = _parameters(tmp_path, "1000")
    with pr.Watch(root) as w:
        (root / "reported_kib").write_text("3048")  # 2 MiB handed back meanwhile
    assert w.result["mb"] == pytest.approx(2.0)
    with pr.Watch(tmp_path / "absent") as w:
        pass
    assert w.result is None


def test_call_summary_keeps_every_call_and_takes_medians_of_what_is_known():
    calls = [{"wall_s": 1.0, "faults": 100.0, "system_s": 0.5, "reported_mb_before": 0.0},
             {"wall_s": 2.0, "faults": 300.0, "system_s": None, "reported_mb_before": None},
             {"wall_s": 3.0, "faults": 200.0, "system_s": 0.7, "reported_mb_before": 12.0}]
    got = pr.call_summary(calls, pr.Snapshot(5, 0.0, {"max_waiting_mib": 1024}))
    assert got["calls"] == calls and got["calls"] is not calls
    assert got["faults_median"] == 200.0 and got["system_s_median"] == pytest.approx(0.6)
    assert got["page_reporting"] is True and got["settings"] == {"max_waiting_mib": 1024}
    assert pr.median_known([None, float("nan"), 3.0, 1.0]) == 2.0 and pr.median_known([None]) is None
    none = pr.call_summary([], None)
    assert none["faults_median"] is None and none["page_reporting"] is False and none["settings"] == {}
