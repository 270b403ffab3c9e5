"""``benchmarks/stock_primitives.py``'s own logic: the section choice, and ``--merge`` keeping a primitives
file's other fields (the callee's CPU per call is ``conduit.runtime.proccpu``'s, tested in test_proccpu.py)."""

from __future__ import annotations

import json

import pytest
from _scripts import BENCH, load_script
from hypothesis import given, settings
from hypothesis import strategies as st

sp = load_script(BENCH / "stock_primitives.py", "_stock_primitives")

@given(st.sets(st.sampled_from(sp.SECTIONS), min_size=1))
def test_sections_parse_any_subset(chosen):
    assert sp.parse_sections(" , ".join(sorted(chosen))) == chosen


@pytest.mark.parametrize("text", ["", "rpc", "ray,bogus", ","])
def test_unknown_or_no_sections_are_refused_by_name(text):
    with pytest.raises(Exception, match="known: pickle, serializer, buffer, connector, ray, callee"):
        sp.parse_sections(text)


def test_all_is_every_section():
    assert sp.parse_sections("all") == set(sp.SECTIONS)


def test_merge_keeps_the_files_other_fields_and_stamps_the_section(tmp_path, capsys):
    out = tmp_path / "prims.json"
    out.write_text(json.dumps({"rpc_round_trip_s": 1e-3, "episode_pickle_s": 9.0, "when": "earlier"}))
    assert sp.main(["--sections", "pickle", "--merge", "--out", str(out), "--repeats", "4"]) == 0
    data = json.loads(out.read_text())
    assert data["rpc_round_trip_s"] == 1e-3 and data["when"] == "earlier"  # kept
    assert 0 < data["episode_pickle_s"] < 9.0 and data["episode_unpickle_s"] > 0  # measured now
    assert data["pickle_when"].endswith("Z")


def test_keep_holds_the_files_value_and_records_the_new_reading(tmp_path):
    """``--keep``: a field the section measures keeps the file's value; the new reading is recorded beside it."""
    out = tmp_path / "prims.json"
    out.write_text(json.dumps({"episode_pickle_s": 9.0, "when": "earlier"}))
    assert sp.main(["--sections", "pickle", "--merge", "--keep", "episode_pickle_s", "--out", str(out),
                    "--repeats", "4"]) == 0
    data = json.loads(out.read_text())
    assert data["episode_pickle_s"] == 9.0 and 0 < data["pickle_kept"]["episode_pickle_s"] < 9.0
    assert data["episode_unpickle_s"] > 0  # the section's other fields: measured now


@pytest.mark.parametrize(("argv", "message"), [
    (["--keep", "x"], "--keep applies to --merge"),
    (["--merge", "--keep", "absent_s"], "has no field absent_s"),
    (["--sections", "pickle", "--merge", "--keep", "rpc_round_trip_s"], "do not measure rpc_round_trip_s"),
])
def test_keep_errors_name_the_field(tmp_path, capsys, argv, message):
    out = tmp_path / "prims.json"
    original = json.dumps({"rpc_round_trip_s": 1e-3})
    out.write_text(original)
    with pytest.raises(SystemExit) as exc:
        sp.main([*argv, "--out", str(out), "--repeats", "4"])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert out.read_text() == original  # nothing lost


def test_merge_into_a_broken_file_names_it(tmp_path, capsys):
    out = tmp_path / "broken.json"
    out.write_text("{not json")
    with pytest.raises(SystemExit) as exc:
        sp.main(["--sections", "pickle", "--merge", "--out", str(out)])
    assert exc.value.code == 2
    assert str(out) in capsys.readouterr().err
    assert out.read_text() == "{not json"  # nothing lost


@settings(max_examples=60, deadline=None)
@given(lengths=st.tuples(st.integers(1, 100), st.integers(101, 1000)),
       fixed=st.floats(0.0, 1e-3), per_step=st.floats(0.0, 1e-6))
def test_the_per_step_split_recovers_a_line_and_never_goes_negative(lengths, fixed, per_step):
    """One episode's cost at two lengths splits into (per episode, per step); a decreasing pair (noise)
    clips the per-step part at 0 and leaves the per-episode part non-negative."""
    costs = tuple(fixed + per_step * n for n in lengths)
    got_fixed, got_step = sp.fit_per_step(lengths, costs)
    assert got_step == pytest.approx(per_step, rel=1e-6, abs=1e-15)
    assert got_fixed == pytest.approx(fixed, rel=1e-6, abs=1e-12)
    down_fixed, down_step = sp.fit_per_step(lengths, (costs[1], costs[0]))
    assert down_step == 0.0 and down_fixed >= 0.0


def test_the_serializer_section_times_real_sampled_episodes(tmp_path, monkeypatch):
    """The section samples whole episodes of each chosen length with a real EnvRunner and writes the
    per-episode and per-step figures the simulator reads (``StockCosts.*_per_episode``, ``*_per_step``)."""
    episodes = sp.sampled_episodes(7, 3)
    assert [len(e) for e in episodes] == [7, 7, 7]
    assert all(e.is_numpy and e.is_done for e in episodes)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setattr(sp, "SERIALIZER_LENGTHS", (5, 40))
    monkeypatch.setattr(sp, "SERIALIZER_LISTS", (2, 12))
    out = tmp_path / "prims.json"
    assert sp.main(["--sections", "serializer", "--out", str(out), "--repeats", "4"]) == 0
    data = json.loads(out.read_text())
    for kind in ("put", "get"):
        assert data[f"episode_{kind}_s"] >= 0.0 and data[f"episode_{kind}_per_step_s"] >= 0.0
        assert data[f"episode_{kind}_s"] + 40 * data[f"episode_{kind}_per_step_s"] > 0.0
    assert set(data["serializer_sizes"]) == {"5", "40"}


def test_the_learner_section_times_dqns_handling_of_each_updates_results():
    """``--sections learner``: DQN's driver after ``LearnerGroup.update`` on real results of a real DQN learner,
    fitted over 1 and 2 results into a per-call and a per-result part (both positive: every result is isolated
    and aggregated), the figures ``StockCosts.learner_results_*`` are read from."""
    pytest.importorskip("ray.rllib")
    out = sp._learner_primitives()
    assert out["learner_results_per_call_s"] > 0 and out["learner_results_per_result_s"] > 0
    assert "results 1..2" in out["learner_results_note"]
    pieces = out["learner_results_pieces_s"]  # the three pieces of the training step's work, at 1 and 2 results
    assert len(pieces) == 3 and all(len(v) == 2 and min(v) > 0 for v in pieces.values())


def test_the_gap_section_writes_the_curve_and_the_law_derived_from_it(monkeypatch):
    """Section ``gap`` on a stand-in for Ray whose actor call is a function call in this process: the series per
    sleep, and the ramp and surcharges :mod:`conduit.runtime.callgap` derives from it, under the names
    ``conduit.sim.params.STOCK_COLD_SOURCES`` reads."""
    import os
    import time

    from conduit.runtime import callgap
    from conduit.sim.params import STOCK_COLD_SOURCES

    monkeypatch.setattr(callgap, "DEFAULT_SLEEPS_S", (0.0, 0.002))

    class Remote:
        def __init__(self, fn):
            self.remote = fn

    class FakeActor:
        pid = Remote(lambda: os.getpid())

        def __init__(self):
            def apply(func):
                end = time.process_time() + 1e-4
                while time.process_time() < end:
                    pass
                return func(self)
            self.apply = Remote(apply)

    class FakeRay:
        @staticmethod
        def get(value, timeout=None):
            return value

    out = sp._gap_primitives(FakeRay, FakeActor(), repeats=4)
    assert [r["sleep_s"] for r in out["rpc_gap_curve"]] == [0.0, 0.002]
    assert set(out) == {"rpc_gap_curve"} | {key for key, _ in STOCK_COLD_SOURCES.values()}
    warm, cold = callgap.cold_ramp(out["rpc_gap_curve"])
    assert (out["rpc_warm_within_s"], out["rpc_cold_after_s"]) == (warm, cold)
    extra = callgap.cold_figures(out["rpc_gap_curve"])
    assert out["rpc_cold_caller_cpu_s"] == extra["caller_cpu_s"] and out["rpc_cold_round_trip_s"] == extra["wall_s"]


def test_the_wake_section_writes_each_primitives_debt_under_the_names_the_simulator_reads():
    """Section ``wake``: each of DQN's per-round primitives timed right after a sleep and back to back on a real
    RLlib EnvRunner, buffer and learner (a few trials: the figures are noise here, their names and signs are the
    contract), and the ramp through the EnvRunner's call, under the names ``STOCK_WAKE_SOURCES`` reads."""
    pytest.importorskip("ray.rllib")
    from conduit.sim.params import STOCK_WAKE_SOURCES

    out = sp._wake_primitives(4, trials=3)
    assert {key for key, _ in STOCK_WAKE_SOURCES.values()} <= set(out)
    assert all(out[key] >= 0.0 for key, _ in STOCK_WAKE_SOURCES.values())
    assert 0.0 <= out["wake_warm_within_s"] <= out["wake_cold_after_s"] <= sp.WAKE_SLEEP_S
    assert set(out["wake_units_s"]) == {"runner_call", "set_state", "get_state", "replay_add", "replay_sample",
                                        "update"}
    assert [r["sleep_s"] for r in out["wake_curve"]] == list(sp.WAKE_RAMP_SLEEPS_S)
    assert "wake" in sp.parse_sections("wake,gap")
