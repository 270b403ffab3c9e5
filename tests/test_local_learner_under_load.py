"""``benchmarks/local_learner_under_load.py``'s own logic (no study run): the variants and the busy loops."""

from __future__ import annotations

import sys

import pytest
from _scripts import BENCH, load_script
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(BENCH))  # the script imports its neighbour run_cpu_breakdown, as when run from there
lul = load_script(BENCH / "local_learner_under_load.py", "_local_learner_under_load")


@given(st.integers(1, 8))
def test_each_thread_setting_runs_quiet_then_loaded(burners):
    runs = lul.variants(burners)
    assert [b for _, _, b in runs] == [0, burners, 0, burners]
    assert [env for _, env, _ in runs] == [{}, {}, {"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "1"}]


def test_busy_loops_run_and_are_stopped():
    procs = lul.start_burners(2)
    try:
        assert all(p.poll() is None for p in procs)
    finally:
        lul.stop_burners(procs)
    assert all(p.poll() is not None for p in procs)


@pytest.mark.parametrize("argv", [["--iters", "3"], ["--burners", "0"], ["--timeout-s", "0"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit) as exc:
        lul.main(argv)
    assert exc.value.code == 2
