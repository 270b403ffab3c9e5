"""``benchmarks/call_gap.py``'s own logic: its arguments are checked by name and its report compares every gap
with the first (the measurement itself, :func:`conduit.runtime.callgap.gap_costs`, is tested in
tests/test_callgap.py; the Ray half is run by hand, its figures are in the script's docstring and
results/validation/NOTES.md)."""

from __future__ import annotations

import pytest
from _scripts import BENCH, load_script
from hypothesis import given, settings
from hypothesis import strategies as st

cg = load_script(BENCH / "call_gap.py", "_call_gap")


@pytest.mark.parametrize(("argv", "named"), [(["--calls", "0"], "--calls"), (["--blocks", "0"], "--blocks"),
                                             (["--gaps", "-1"], "--gaps"), (["--gaps", "nan"], "--gaps"),
                                             (["--gaps", "0", "5000"], "--gaps")])
def test_bad_arguments_are_refused_by_name(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        cg.main(argv)
    assert exc.value.code == 2 and named in capsys.readouterr().err


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(st.fixed_dictionaries({k: st.floats(1e-6, 1.0) for k in ("sleep_s", "interval_s", "wall_s",
                                                                                 "caller_cpu_s", "callee_cpu_s")}),
                     min_size=1, max_size=6))
def test_the_report_compares_every_gap_with_the_first(rows):
    lines = cg.report(rows).splitlines()
    assert len(lines) == len(rows) + 1
    assert lines[1].split()[-3:] == ["1.00x", "1.00x", "1.00x"]
    for r, line in zip(rows, lines[1:], strict=True):
        assert line.split()[-3] == f"{r['wall_s'] / rows[0]['wall_s']:.2f}x"


@settings(max_examples=30, deadline=None)
@given(walls=st.lists(st.floats(1e-5, 0.01), min_size=2, max_size=8))
def test_each_window_is_placed_between_back_to_back_and_spaced(walls):
    names = ["back to back", "10 ms apart", *(f"window {i}" for i in range(len(walls) - 2))]
    windows = dict(zip(names, walls, strict=True))
    lines = cg.windows_report(windows).splitlines()[1:]
    assert len(lines) == len(walls)
    base, spaced = walls[0], walls[1]
    for wall, line in zip(walls, lines, strict=True):
        share = line.split()[-1]
        if spaced == base:
            assert share == "nan"
        else:
            assert share == f"{(wall - base) / (spaced - base):.2f}"
    assert lines[0].split()[-1] in ("0.00", "-0.00", "nan")
