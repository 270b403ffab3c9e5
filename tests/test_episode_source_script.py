"""``benchmarks/episode_source.py``: the side-by-side summary (hypothesis), alternating sources with the memory
reported before each GAE piece, a real short run on CartPole with its EnvRunner actor, and refused arguments."""

from __future__ import annotations

import math
import statistics

import pytest
from _scripts import BENCH, load_script
from hypothesis import given, settings
from hypothesis import strategies as st

es = load_script(BENCH / "episode_source.py", "_episode_source_script")

times = st.floats(1e-4, 10.0, allow_nan=False)
reported = st.one_of(st.none(), st.floats(0, 1e4, allow_nan=False))


def _row(source: str, piece: str, wall: float, mb: float | None = None) -> dict:
    return {"source": source, "piece": piece, "wall_s": wall, "cpu_s": wall * 0.9, "sys_s": wall * 0.5,
            "faults": 100.0, "reported_mb_before": mb}


@settings(max_examples=60, deadline=None)
@given(own=st.lists(st.tuples(times, reported), min_size=1, max_size=7),
       actor=st.lists(st.tuples(times, reported), min_size=1, max_size=7))
def test_the_summary_is_the_medians_side_by_side_with_the_memory_reported_before(own, actor):
    rows = [_row("own", "gae piece", t, mb) for t, mb in own] + [_row("actor", "gae piece", t, mb) for t, mb in actor]
    got = es.summarise(rows)
    gae = got["gae piece"]
    assert gae["own"]["wall_s"] == pytest.approx(statistics.median(t for t, _ in own))
    assert gae["actor"]["n"] == len(actor)
    assert gae["ratio"]["wall_s"] == pytest.approx(gae["actor"]["wall_s"] / gae["own"]["wall_s"])
    for source, got_rows in (("own", own), ("actor", actor)):
        known = [mb for _, mb in got_rows if mb is not None]
        rep = got["reported_mb_before"][source]
        assert rep["known"] == len(known) and rep["rounds_after_reporting"] == sum(1 for mb in known if mb > 0)
        assert rep["median"] == (pytest.approx(statistics.median(known)) if known else None)
    text = es.format_report(got, "# head")
    assert "| gae piece |" in text
    assert ("does not report free pages" in text) == (not any(mb is not None for _, mb in own + actor))


def test_a_ratio_over_nothing_is_not_a_number_and_a_missing_source_has_none():
    rows = [_row("own", "update call", 0.0), _row("actor", "update call", 1.2), _row("own", "gae piece", 0.5, 3.0)]
    got = es.summarise(rows)
    assert math.isnan(got["update call"]["ratio"]["wall_s"])
    assert "ratio" not in got["gae piece"] and "actor" not in got["gae piece"]
    text = es.format_report(got, "# head")
    assert "| gae piece | 0.500 s (0.450 / 0.250) |  |  | 100 |" in text and "own 3 MB (1 of 1)" in text


def test_rounds_alternate_their_source_and_record_the_memory_reported_before(monkeypatch):
    from conduit.runtime import pagereport

    counter = {"kib": 0}
    monkeypatch.setattr(pagereport, "snapshot", lambda *a: pagereport.Snapshot(counter["kib"], 0.0, {}))
    sampled: list[str] = []

    class Pieces:
        steps = 7

        class runner:  # the attribute PpoPieces has
            @staticmethod
            def sample(num_timesteps, random_actions):
                sampled.append("own")
                return "own episodes"

        @staticmethod
        def round_on(episodes):
            return {"gae piece": dict.fromkeys(es.FIGURES, 1.0), "update call": dict.fromkeys(es.FIGURES, 2.0)}

    def actor_sample(n):
        assert n == 7
        sampled.append("actor")
        counter["kib"] += 2048  # the other process's sampling freed memory the VM reported
        return "actor episodes"

    rows = es.measure(Pieces(), actor_sample, rounds=2, log=lambda *_: None)
    assert sampled == ["own", "actor"] * 2
    assert [r["source"] for r in rows[::2]] == ["own", "actor"] * 2
    assert {r["reported_mb_before"] for r in rows if r["source"] == "actor"} == {2.0}
    assert {r["reported_mb_before"] for r in rows if r["source"] == "own"} == {0.0}


def test_a_short_real_run_samples_in_an_env_runner_actor_and_shuts_its_ray_down(capsys, monkeypatch):
    pytest.importorskip("ray.rllib")
    import ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert es.main(["--workload", "ppo-cartpole-2r-local", "--steps", "64", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "| gae piece |" in out and "| update call |" in out and "x |" in out
    assert not ray.is_initialized()


@pytest.mark.parametrize("argv, field", [(["--rounds", "0"], "--rounds"), (["--steps", "x"], "--steps"),
                                         (["--json", "/nonexistent-dir/out.json"], "--json")])
def test_bad_arguments_are_refused_naming_the_argument(argv, field, capsys):
    with pytest.raises(SystemExit) as exc:
        es.main(argv)
    assert exc.value.code != 0 and field in capsys.readouterr().err
