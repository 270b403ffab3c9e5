"""``benchmarks/ray_attached.py``: the side-by-side summary (hypothesis, on rows whose medians are known), the
alternating detached/attached blocks, a real run of its control with a Ray started and shut down around the
attached block, and refused arguments."""

from __future__ import annotations

import contextlib
import math
import statistics

import pytest
from _scripts import BENCH, load_script
from hypothesis import given, settings
from hypothesis import strategies as st

ra = load_script(BENCH / "ray_attached.py", "_ray_attached")

times = st.floats(1e-4, 10.0, allow_nan=False)
FIGS = ("wall_s", "cpu_s", "sys_s", "faults")


def _row(mode: str, piece: str, wall: float) -> dict:
    return {"mode": mode, "piece": piece, "wall_s": wall, "cpu_s": wall * 0.9, "sys_s": wall * 0.5, "faults": 100.0}


@settings(max_examples=60, deadline=None)
@given(detached=st.lists(times, min_size=1, max_size=7), attached=st.lists(times, min_size=1, max_size=7))
def test_the_summary_is_the_medians_side_by_side_and_their_ratio(detached, attached):
    rows = [_row("detached", "gae piece", t) for t in detached] + [_row("attached", "gae piece", t) for t in attached]
    got = ra.summarise(rows)["gae piece"]
    assert got["detached"]["wall_s"] == pytest.approx(statistics.median(detached))
    assert got["attached"]["wall_s"] == pytest.approx(statistics.median(attached))
    assert got["attached"]["n"] == len(attached) and got["detached"]["n"] == len(detached)
    assert got["ratio"]["wall_s"] == pytest.approx(statistics.median(attached) / statistics.median(detached))
    assert got["ratio"]["sys_s"] == pytest.approx(got["ratio"]["wall_s"])


def test_a_ratio_over_nothing_is_not_a_number_and_a_missing_mode_has_none():
    rows = [{"mode": "detached", "piece": "update call", "wall_s": 1.0, "cpu_s": 1.0, "sys_s": 0.0, "faults": 0.0},
            {"mode": "attached", "piece": "update call", "wall_s": 1.2, "cpu_s": 1.1, "sys_s": 0.1, "faults": 0.0},
            {"mode": "detached", "piece": "gae piece", "wall_s": 0.5, "cpu_s": 0.5, "sys_s": 0.3, "faults": 9.0}]
    got = ra.summarise(rows)
    assert math.isnan(got["update call"]["ratio"]["sys_s"]) and got["update call"]["ratio"]["wall_s"] == 1.2
    assert "ratio" not in got["gae piece"] and "attached" not in got["gae piece"]
    text = ra.format_report(got, "# head")
    assert "| update call | 1.000 s (1.000 / 0.000) | 1.200 s (1.100 / 0.100) | 1.20x |" in text
    assert "| gae piece | 0.500 s (0.500 / 0.300) |  |  | 9 |" in text


def test_blocks_alternate_and_only_the_attached_ones_run_inside_the_ray(monkeypatch):
    inside: list[bool] = []
    state = {"up": False}

    @contextlib.contextmanager
    def attached():
        state["up"] = True
        try:
            yield
        finally:
            state["up"] = False

    def pieces() -> dict:
        inside.append(state["up"])
        return {"gae piece": dict.fromkeys(FIGS, 1.0), "update call": dict.fromkeys(FIGS, 2.0)}

    monkeypatch.setattr(ra.time, "sleep", lambda s: None)
    rows = ra.measure(pieces, cycles=2, rounds=3, touch_mb=1, attached=attached, log=lambda *_: None)
    assert inside == [False] * 3 + [True] * 3 + [False] * 3 + [True] * 3
    assert len(rows) == 2 * 2 * 3 * 3  # cycles x modes x rounds x (two pieces and the control)
    assert [r["mode"] for r in rows[::3]] == (["detached"] * 3 + ["attached"] * 3) * 2
    control = [r for r in rows if r["piece"] == "fresh pages (control)"]
    assert all(r["faults"] >= 0 and r["wall_s"] > 0 for r in control)


def test_the_control_runs_for_real_with_a_ray_started_and_shut_down(capsys, monkeypatch):
    pytest.importorskip("ray")
    import ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert ra.main(["--control-only", "--cycles", "1", "--rounds", "1", "--touch-mb", "16"]) == 0
    out = capsys.readouterr().out
    assert "| fresh pages (control) |" in out and "x |" in out and "control only" in out
    assert not ray.is_initialized()


@pytest.mark.parametrize("argv, field", [(["--cycles", "0"], "--cycles"), (["--rounds", "x"], "--rounds"),
                                         (["--steps", "-5"], "--steps"), (["--touch-mb", "0"], "--touch-mb"),
                                         (["--json", "/nonexistent-dir/out.json"], "--json")])
def test_bad_arguments_are_refused_naming_the_argument(argv, field, capsys):
    with pytest.raises(SystemExit) as exc:
        ra.main(argv)
    assert exc.value.code != 0 and field in capsys.readouterr().err


def test_a_workload_that_is_not_a_study_ppo_workload_is_refused_by_name():
    pytest.importorskip("ray.rllib")
    with pytest.raises(SystemExit, match="--workload: 'dqn-cartpole-1r' is not one of the study's PPO workloads"):
        ra.PpoPieces("dqn-cartpole-1r", None)
