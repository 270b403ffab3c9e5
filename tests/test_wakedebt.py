"""The warm-up debt's timing and reduction (:mod:`conduit.runtime.wakedebt`) and ``benchmarks/wake_debt.py``'s
arguments. The reduction is checked on synthetic curves whose debt is known; the timing on a tiny unit of work
(its figures are the machine's, so only their shape is asserted)."""

from __future__ import annotations

import itertools
import math

import pytest
from _scripts import BENCH, load_script
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.runtime.wakedebt import PLATEAU_SHARE, debt_curve, debt_figures, half_paid_work

wd = load_script(BENCH / "wake_debt.py", "_wake_debt")

seconds = st.floats(1e-5, 5e-3, allow_nan=False)


def _row(sleep: float, warm: list[float], extra_per_unit: list[float]) -> dict:
    cold = [w + e for w, e in zip(warm, extra_per_unit, strict=True)]
    extra, total = [], 0.0
    for e in extra_per_unit:
        total += e
        extra.append(total)
    return {"sleep_s": sleep, "warm_s": warm, "cold_s": cold, "extra_s": extra}


@settings(max_examples=80, deadline=None)
@given(unit=seconds, debt=st.floats(1e-5, 5e-3), work=st.floats(1e-4, 5e-3), units=st.integers(2, 10))
def test_half_paid_work_finds_the_half_of_a_debt_paid_off_exponentially(unit, debt, work, units):
    """A debt paid as ``debt * (1 - exp(-w / work))`` over the thread's work ``w``: half of what the block paid is
    reached within the unit the curve says, and never past the block's work."""
    warm = [unit] * units
    paid = [debt * (1 - math.exp(-unit * (i + 1) / work)) for i in range(units)]
    per_unit = [paid[0]] + [b - a for a, b in itertools.pairwise(paid)]
    row = _row(0.02, warm, per_unit)
    half = half_paid_work(row)
    total = paid[-1]
    assert 0.0 <= half <= unit * units + 1e-12
    i = next(k for k, p in enumerate(paid) if p >= total / 2 - 1e-15)
    assert unit * i - 1e-12 <= half <= unit * (i + 1) + 1e-12


def test_no_extra_is_no_debt():
    row = _row(0.02, [1e-3] * 4, [0.0] * 4)
    assert half_paid_work(row) == 0.0
    figures = debt_figures([row])
    assert figures["debt_s"] == 0.0 and figures["plateau_after_s"] == 0.0


@settings(max_examples=60, deadline=None)
@given(unit=seconds, debts=st.lists(st.floats(0.0, 5e-3), min_size=1, max_size=6))
def test_debt_figures_read_the_plateau_and_where_it_starts(unit, debts):
    """One row per sleep, its whole extra paid in the first unit: the debt per sleep is that extra (floored at
    0), the plateau is the longest sleep's and it starts at the first sleep reaching PLATEAU_SHARE of it."""
    sleeps = [0.001 * (k + 1) for k in range(len(debts))]
    rows = [_row(s, [unit] * 3, [d, 0.0, 0.0]) for s, d in zip(sleeps, debts, strict=True)]
    figures = debt_figures(rows)
    assert [r["debt_s"] for r in figures["debt_by_sleep"]] == debts
    assert figures["debt_s"] == debts[-1]
    assert figures["unit_s"] == unit
    if debts[-1] > 0:
        first = next(s for s, d in zip(sleeps, debts, strict=True) if d >= PLATEAU_SHARE * debts[-1])
        assert figures["plateau_after_s"] == first
        assert figures["half_paid_work_s"] <= unit


def test_a_negative_reading_is_no_debt():
    """Noise can leave a cold block cheaper than the warm one: that is no debt, not a credit."""
    figures = debt_figures([_row(0.01, [1e-3] * 2, [-2e-4, -1e-4])])
    assert figures["debt_s"] == 0.0


def test_debt_curve_times_each_position_of_both_blocks():
    calls = []

    def unit():
        calls.append(1)
        return sum(range(200))

    rows = debt_curve(unit, [0.0005, 0.001], units=3, trials=4, warmup=2)
    assert [r["sleep_s"] for r in rows] == [0.0005, 0.001]
    for r in rows:
        assert len(r["warm_s"]) == len(r["cold_s"]) == len(r["extra_s"]) == 3
        assert all(x >= 0 for x in r["warm_s"] + r["cold_s"])
        assert r["extra_s"][-1] == pytest.approx(sum(c - w for c, w in zip(r["cold_s"], r["warm_s"], strict=True)))
    # warm-up, then per sleep and trial: one untimed unit and two blocks of 3
    assert len(calls) == 2 + 2 * 4 * (1 + 3 + 3)


@pytest.mark.parametrize("kwargs, message", [
    ({"sleeps_s": [0.0]}, "sleep"), ({"units": 0}, "units"), ({"trials": 0}, "trials"), ({"warmup": -1}, "warmup")])
def test_debt_curve_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        debt_curve(lambda: None, **kwargs)


@pytest.mark.parametrize("argv, message", [
    (["--units", "0"], "--units"), (["--trials", "0"], "--trials"), (["--sleeps-ms", "0"], "--sleeps-ms"),
    (["--work", "nonsense"], "--work")])
def test_the_script_refuses_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        wd.main(argv)
    assert exc.value.code != 0
    assert message in capsys.readouterr().err


def test_the_script_reports_a_kind_of_work(tmp_path, capsys):
    out = tmp_path / "debt.json"
    assert wd.main(["--work", "python-dict", "--sleeps-ms", "0.5", "1", "--units", "2", "--trials", "3",
                    "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "python-dict: one unit back to back" in text and "plateau" in text
    import json

    data = json.loads(out.read_text())["python-dict"]
    assert len(data["curve"]) == 2 and data["debt_s"] >= 0.0
