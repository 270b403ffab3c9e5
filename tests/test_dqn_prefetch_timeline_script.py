"""``benchmarks/dqn_prefetch_timeline.py``'s own logic: its arguments are checked by name, its timers go in and
come out again, and the figures it prints follow from the timed calls (the run itself is a real RLlib DQN run
of ~40 s: run by hand, its figures are in the script's docstring and results/validation/NOTES.md)."""

from __future__ import annotations

import pytest
from _scripts import BENCH, load_script
from hypothesis import given, settings
from hypothesis import strategies as st

dpt = load_script(BENCH / "dqn_prefetch_timeline.py", "_dqn_prefetch_timeline")


@pytest.mark.parametrize(("argv", "named"), [(["--iters", "1"], "--iters"), (["--warmup", "5"], "--warmup"),
                                             (["--warmup", "-1"], "--warmup")])
def test_bad_arguments_are_refused_by_name(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        dpt.main(argv)
    assert exc.value.code == 2 and named in capsys.readouterr().err


@settings(max_examples=40, deadline=None)
@given(cycles=st.lists(st.tuples(st.floats(1e-3, 0.03), st.one_of(st.floats(-0.01, -1e-6), st.floats(1e-6, 0.01)),
                                 st.floats(0.0, 0.005)), min_size=3, max_size=30))
def test_a_draw_is_late_when_it_ends_after_its_update_asked(cycles):
    """Per cycle (draw length, draw end minus the update's ask, the update's wait): the k-th draw feeds the k-th
    update; the figures count the cycles after the first third."""
    log, t = [], 0.0
    for length, lead, wait in cycles:
        log.append(("draw", t, t + length))
        ask = t + length - lead
        log.append(("get", ask, ask + wait))
        t += 0.1
    figures = dpt.summarize(log)
    kept = cycles[int(len(cycles) / 3):]
    assert figures["late_share"]["n"] == len(kept)
    assert figures["late_share"]["share"] == pytest.approx(sum(lead > 0 for _, lead, _ in kept) / len(kept))
    assert figures["draw_from_request"]["median_ms"] == pytest.approx(
        1e3 * sorted(c[0] for c in kept)[len(kept) // 2] if len(kept) % 2 else
        1e3 * sum(sorted(c[0] for c in kept)[len(kept) // 2 - 1:len(kept) // 2 + 1]) / 2)
    assert figures["update_wait"]["mean_ms"] == pytest.approx(1e3 * sum(w for *_, w in kept) / len(kept))
    assert "draws" not in figures and dpt.report(figures).startswith("updates late for their batch")


def test_a_log_without_a_drawn_batch_is_refused():
    with pytest.raises(ValueError, match="no update took a drawn batch"):
        dpt.summarize([("sync", 0.0, 1.0)])


def test_the_timers_go_in_and_come_out():
    from conduit.runtime.rllib.delivery import Prefetcher

    before = Prefetcher.get
    log = []
    with dpt.timed_calls(log):
        assert Prefetcher.get is not before
    assert Prefetcher.get is before and log == []
