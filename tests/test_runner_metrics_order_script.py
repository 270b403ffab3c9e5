"""``benchmarks/runner_metrics_order.py``: its argument is checked by name before anything starts (the run itself
is a real RLlib PPO run of ~30 s: run by hand, its figures are in the script's docstring and
results/validation/NOTES.md)."""

from __future__ import annotations

import pytest
from _scripts import BENCH, load_script

rmo = load_script(BENCH / "runner_metrics_order.py", "_runner_metrics_order")


@pytest.mark.parametrize("rounds", ["0", "2", "-3"])
def test_too_few_rounds_are_refused_by_name(rounds, capsys):
    with pytest.raises(SystemExit) as exc:
        rmo.main(["--rounds", rounds])
    assert exc.value.code == 2 and "--rounds" in capsys.readouterr().err
