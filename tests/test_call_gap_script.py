"""``benchmarks/call_gap.py``'s own logic: its arguments are checked by name, and the costs per gap are measured
as the figures say (the Ray half is ``ray.get`` of an empty actor call around the same function; it is run by
hand, its figures are in the script's docstring and results/validation/NOTES.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path

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


def _work() -> None:
    end = time.process_time() + 2e-4  # 0.2 ms of this process's CPU per call
    while time.process_time() < end:
        pass


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc/<pid>/task (Linux)")
def test_each_gap_gets_its_wall_time_and_both_processes_cpu():
    rows = cg.gap_costs(_work, os.getpid(), os.getpid(), [0.0, 0.002], calls=5, blocks=1, idle_s=0.05)
    assert [r["gap_s"] for r in rows] == [0.0, 0.002]
    for r in rows:
        assert 1.5e-4 <= r["wall_s"] < 0.05  # the call, not the gap before it
        assert r["caller_cpu_s"] > 1e-4 and r["callee_cpu_s"] > 1e-4
    with pytest.raises(ValueError, match="gap"):
        cg.gap_costs(_work, os.getpid(), os.getpid(), [-1e-3], calls=1)
    with pytest.raises(ValueError, match="calls"):
        cg.gap_costs(_work, os.getpid(), os.getpid(), [0.0], calls=0)


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(st.fixed_dictionaries({k: st.floats(1e-6, 1.0) for k in ("gap_s", "wall_s", "caller_cpu_s",
                                                                                 "callee_cpu_s")}),
                     min_size=1, max_size=6))
def test_the_report_compares_every_gap_with_the_first(rows):
    lines = cg.report(rows).splitlines()
    assert len(lines) == len(rows) + 1
    assert lines[1].split()[-3:] == ["1.00x", "1.00x", "1.00x"]
    for r, line in zip(rows, lines[1:], strict=True):
        assert line.split()[-3] == f"{r['wall_s'] / rows[0]['wall_s']:.2f}x"
