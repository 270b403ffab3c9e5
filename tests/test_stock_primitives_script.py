"""``benchmarks/stock_primitives.py``'s own logic: the section choice, and ``--merge`` keeping a primitives
file's other fields (the callee's CPU per call is ``conduit.runtime.proccpu``'s, tested in test_proccpu.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
spec = importlib.util.spec_from_file_location("_stock_primitives", BENCH / "stock_primitives.py")
sp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sp)

@given(st.sets(st.sampled_from(sp.SECTIONS), min_size=1))
def test_sections_parse_any_subset(chosen):
    assert sp.parse_sections(" , ".join(sorted(chosen))) == chosen


@pytest.mark.parametrize("text", ["", "rpc", "ray,bogus", ","])
def test_unknown_or_no_sections_are_refused_by_name(text):
    with pytest.raises(Exception, match="known: pickle, buffer, connector, ray, callee"):
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


def test_merge_into_a_broken_file_names_it(tmp_path, capsys):
    out = tmp_path / "broken.json"
    out.write_text("{not json")
    with pytest.raises(SystemExit) as exc:
        sp.main(["--sections", "pickle", "--merge", "--out", str(out)])
    assert exc.value.code == 2
    assert str(out) in capsys.readouterr().err
    assert out.read_text() == "{not json"  # nothing lost
