"""The host-speed probe (:mod:`conduit.runtime.hostspeed`) and how a validation report uses it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.runtime import hostspeed

ROOT = Path(__file__).resolve().parents[1]

parts = st.fixed_dictionaries({"python_s": st.floats(1e-3, 10), "numpy_s": st.floats(1e-3, 10),
                               "torch_s": st.floats(1e-3, 10)})


def test_the_probe_times_each_part_and_sums_them():
    got = hostspeed.probe(reps=1)
    assert {"python_s", "numpy_s", "total_s"} <= set(got)
    assert all(v > 0 for v in got.values())
    assert got["total_s"] == pytest.approx(sum(v for k, v in got.items() if k != "total_s"))
    with pytest.raises(ValueError, match="reps"):
        hostspeed.probe(reps=0)


@settings(max_examples=50, deadline=None)
@given(ref=parts, factor=st.floats(0.2, 5.0))
def test_drift_is_how_much_slower_the_same_work_ran(ref, factor):
    now = {k: v * factor for k, v in ref.items()}
    assert hostspeed.drift(ref, now) == pytest.approx(factor - 1.0)
    assert hostspeed.drift(ref, ref) == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(ref=parts, now=parts)
def test_a_probe_without_torch_compares_on_the_parts_both_have(ref, now):
    no_torch = {k: v for k, v in now.items() if k != "torch_s"}
    expected = (now["python_s"] + now["numpy_s"]) / (ref["python_s"] + ref["numpy_s"]) - 1.0
    assert hostspeed.drift(ref, no_torch) == pytest.approx(expected)
    with pytest.raises(ValueError, match="no part"):
        hostspeed.drift(ref, {"total_s": 1.0})


@settings(max_examples=30, deadline=None)
@given(ref=parts, factor=st.floats(0.5, 2.0), later=st.booleans())
def test_a_validation_report_measures_the_drift_between_calibration_and_runs(ref, factor, later):
    """The calibration's probes (its own, or one recorded with primitives added later) against the real runs'
    probes: the drift is the runs' median over the calibration's, flagged beyond the warning threshold."""
    from conduit.studies import load_script

    val = load_script(ROOT / "studies" / "validation.py")
    slow = {k: v * factor for k, v in ref.items()}
    slow["total_s"] = sum(slow.values())
    base = {**ref, "total_s": sum(ref.values())}
    calibration = ({"host": {}, "workload": {"learner_update_call:x": {"extra": {"speed_probe": base}}}} if later
                   else {"host": {"speed_probe": {"before": base, "after": base}}, "workload": {}})
    got = val.host_speed(calibration, {"before": slow, "after": slow})
    assert got["drift"] == pytest.approx(factor - 1.0)
    assert got["warning"] == (abs(got["drift"]) > hostspeed.DRIFT_WARNING)
    assert ("slower" if got["drift"] > 0 else "faster") in val._host_speed_line(got)
    # primitives added in one go all carry one probe: it counts once against the calibration's own
    many = {"host": {"speed_probe": {"before": base}},
            "workload": {f"k{i}:x": {"extra": {"speed_probe": slow}} for i in range(5)}}
    mixed = val.host_speed(many, {"before": slow})
    assert len(mixed["calibration_s"]) == (1 if factor == 1 else 2)
    assert mixed["drift"] == pytest.approx(1.0 / ((1.0 + factor) / 2 / factor) - 1.0)
    unknown = val.host_speed(calibration, None)
    assert unknown["drift"] is None and "unknown" in val._host_speed_line(unknown)
