"""``benchmarks/plane_primitives.py``'s own logic: ``--merge`` replacing only the named measurements, and
``--runs N`` keeping each named measurement's median run (the measurements themselves are
``conduit.runtime.calibrate``'s, tested in test_calibrate*.py; here a stand-in returns chosen figures)."""

from __future__ import annotations

import json
import statistics

import pytest
from _scripts import BENCH, load_script
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.runtime import calibrate
from conduit.runtime.calibrate import Measurement, Measurements

pp = load_script(BENCH / "plane_primitives.py", "_plane_primitives")

NAMES = ("plane_actor_call_cold", "plane_replay_draw_cold")


def _stand_in(monkeypatch, figures: list[dict[str, float]]):
    """``measure_plane`` returning, call after call, measurements with these latencies (and an untouched one)."""
    calls = iter(figures)

    def measure_plane(quick=False, progress=None):
        run = next(calls)
        found = Measurements({n: Measurement(n, 1e18, run[n], 10) for n in run}, host={"hostname": "stand-in"})
        found["memcpy"] = Measurement("memcpy", 5e9, 1e-6, 10)
        return found

    monkeypatch.setattr(calibrate, "measure_plane", measure_plane)


latency = st.floats(1e-6, 5e-3, allow_nan=False)


@settings(max_examples=40, deadline=None)
@given(runs=st.lists(st.fixed_dictionaries({n: latency for n in NAMES}), min_size=1, max_size=5))
def test_each_named_measurement_is_its_median_runs(runs):
    files = [{"host": {"run": i}, "measurements": {n: {"latency": r[n], "run": i} for n in r}}
             for i, r in enumerate(runs)]
    data, how = pp.median_runs(files, list(NAMES))
    assert data["host"] == {"run": 0}
    for name in NAMES:
        figures = [r[name] for r in runs]
        kept = data["measurements"][name]
        assert kept["latency"] == statistics.median_low(figures)
        assert files[kept["run"]]["measurements"][name] is kept  # the whole entry of one run, not a blend
        assert f"{name} from run {kept['run'] + 1} (" in how
    assert f"--runs {len(runs)}" in how


def test_runs_merge_the_median_runs_into_the_file_and_say_so(tmp_path, monkeypatch, capsys):
    out = tmp_path / "plane.json"
    out.write_text(json.dumps({"host": {"hostname": "before"}, "notes": ["older"],
                               "measurements": {"memcpy": {"latency": 7.0}, "plane_actor_call_cold": {"latency": 9.0}}}))
    _stand_in(monkeypatch, [{"plane_actor_call_cold": 3e-3, "plane_replay_draw_cold": 1e-5},
                            {"plane_actor_call_cold": 1e-3, "plane_replay_draw_cold": 9e-4},
                            {"plane_actor_call_cold": 2e-3, "plane_replay_draw_cold": 1.2e-3}])
    assert pp.main(["--out", str(out), "--merge", "--runs", "3", "--only", *NAMES]) == 0
    data = json.loads(out.read_text())
    assert data["host"] == {"hostname": "before"} and data["measurements"]["memcpy"] == {"latency": 7.0}
    assert data["measurements"]["plane_actor_call_cold"]["latency"] == 2e-3
    assert data["measurements"]["plane_replay_draw_cold"]["latency"] == 9e-4
    assert data["notes"][0] == "older"
    assert "--runs 3" in data["notes"][1] and "plane_replay_draw_cold from run 2 (0.010, 0.900, 1.200 ms)" in data["notes"][1]


@pytest.mark.parametrize("argv, words", [(["--runs", "3"], "--runs needs --only"),
                                         (["--runs", "0", "--only", "memcpy"], "--runs must be at least 1")])
def test_runs_without_a_choice_to_make_are_refused(tmp_path, argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        pp.main(["--out", str(tmp_path / "p.json"), *argv])
    assert exc.value.code == 2 and words in capsys.readouterr().err
