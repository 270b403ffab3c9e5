"""``benchmarks/dqn_round_timeline.py``'s own logic: the round's timeline from the driver's and the EnvRunner's
stamps, its report beside a simulated round, and refused arguments (the real run itself is the benchmark's, not
a test's: it needs a minute of Ray)."""

from __future__ import annotations

import pytest
from _scripts import BENCH, load_script
from hypothesis import given, settings
from hypothesis import strategies as st

tl = load_script(BENCH / "dqn_round_timeline.py", "_dqn_round_timeline")

ms = st.floats(0.1, 5.0, allow_nan=False)


def _rounds(n: int, offsets: dict[str, tuple[float, float, float]], round_s: float, t0: float = 100.0) -> list:
    """``n`` rounds of ``round_s``; per round each label at ``(start, duration, cpu)`` from the round's start."""
    stamps = []
    for i in range(n):
        start = t0 + i * round_s
        stamps.append(("sample call", start, start + offsets["sample call"][1], offsets["sample call"][2]))
        for label, (at, duration, cpu) in offsets.items():
            if label != "sample call":
                stamps.append((label, start + at, start + at + duration, cpu))
    return stamps


@settings(max_examples=60, deadline=None)
@given(call=ms, sample_at=ms, sample=ms, update=ms, rounds=st.integers(3, 12))
def test_each_part_is_placed_within_its_round(call, sample_at, sample, update, rounds):
    sample_at = min(sample_at, call) * 1e-3 / 2
    sample = min(sample * 1e-3, call * 1e-3 - sample_at)
    offsets = {"sample call": (0.0, call * 1e-3, 1e-4), "runner sample()": (sample_at, sample, sample * 0.9),
               "learner update": (call * 1e-3 + 1e-4, update * 1e-3, update * 1e-3)}
    round_s = call * 1e-3 + update * 1e-3 + 1e-3
    out = tl.timeline(_rounds(rounds, offsets, round_s), since=0.0)
    assert out["round_s"] == pytest.approx(round_s)
    parts = out["parts"]
    assert parts["runner sample()"]["start_s"] == pytest.approx(sample_at)
    assert parts["learner update"]["wall_s"] == pytest.approx(update * 1e-3)
    # the last sample call opens a round that never closes: its parts are left out
    assert parts["sample call"]["count"] == rounds - 1
    split = out["sample_call_split"]
    assert sum(split.values()) == pytest.approx(call * 1e-3)


def test_rounds_before_the_warm_up_ends_are_left_out():
    offsets = {"sample call": (0.0, 0.008, 0.001), "weight sync": (0.02, 0.003, 0.002)}
    stamps = _rounds(10, offsets, 0.025)
    out = tl.timeline(stamps, since=100.0 + 5 * 0.025)
    assert out["parts"]["weight sync"]["count"] == 4


def test_too_few_rounds_is_a_clear_error():
    with pytest.raises(ValueError, match="more iterations"):
        tl.timeline([("sample call", 1.0, 1.01, 0.0)], since=0.0)


def test_report_sets_the_simulated_spans_beside_the_parts():
    offsets = {"sample call": (0.0, 0.009, 0.001), "runner sample()": (0.003, 0.0024, 0.0022),
               "learner update": (0.015, 0.0075, 0.0074)}
    measured = tl.timeline(_rounds(5, offsets, 0.028), since=0.0)
    simulated = {"iteration_s": 0.0133, "spans": {"sampling": 0.0027, "a": 0.0016, "b": 0.0001, "c": 0.0007,
                                                  "d": 0.0001, "update": 0.003}}
    text = tl.format_report(measured, simulated)
    assert "28.00 ms measured, 13.30 ms simulated" in text
    assert "4.30 (sampling + a)" in text
    assert "3.90 (b + c + d + update)" in text
    assert "submission to sample() start" in text


@pytest.mark.parametrize("argv, message", [
    (["--iters", "2", "--warmup", "2"], "--iters"), (["--dqn-steps", "1"], "--dqn-steps"),
    (["--window", "/nonexistent-window"], "--window"), (["--contention", "/nonexistent.json"], "--contention")])
def test_the_script_refuses_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        tl.main(argv)
    assert exc.value.code != 0
    assert message in capsys.readouterr().err
