"""``benchmarks/saturated_calls.py``'s own logic: its arguments are checked by name, and the step's CPU is
measured beside the neighbours it asks for (the Ray half is the same loop around ``ray.get``; it is run by hand,
its figures are in the script's docstring and results/validation/NOTES.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _scripts import BENCH, load_script

sc = load_script(BENCH / "saturated_calls.py", "_saturated_calls")


@pytest.mark.parametrize(("argv", "named"), [(["--calls", "0"], "--calls"), (["--callee-ms", "-1"], "--callee-ms"),
                                             (["--callee-ms", "nan"], "--callee-ms"), (["--step-s", "0"], "--step-s"),
                                             (["--max-k", "-1"], "--max-k")])
def test_bad_arguments_are_refused_by_name(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        sc.parse_args(argv)
    assert exc.value.code == 2 and named in capsys.readouterr().err


def test_the_step_is_measured_alone_and_beside_a_spinner():
    # a fresh interpreter: the measurement's processes are spawned and import the script by its path
    run = subprocess.run([sys.executable, str(BENCH / "saturated_calls.py"), "--no-ray", "--step-s", "0.3",
                          "--max-k", "1"], check=False, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and "x" in line]
    assert [r[0] for r in rows] == ["0", "1"]  # k = 0 and k = 1
    assert all(float(r[1]) > 0 for r in rows) and rows[0][2] == "1.00x"
