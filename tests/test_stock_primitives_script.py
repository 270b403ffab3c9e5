"""``benchmarks/stock_primitives.py``'s own logic: the callee's CPU per call (against a process whose CPU per
request is known), the section choice, and ``--merge`` keeping a primitives file's other fields."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))  # the script imports its neighbour run_cpu_breakdown, as when run from there
spec = importlib.util.spec_from_file_location("_stock_primitives", BENCH / "stock_primitives.py")
sp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sp)

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")


def _serve(conn, burn_s: float) -> None:
    """A callee that spends ``burn_s`` of its own CPU time on each request, then replies."""
    while True:
        if conn.recv() is None:
            return
        t = time.thread_time()
        while time.thread_time() - t < burn_s:
            pass
        conn.send(b"")


@pytest.mark.parametrize("burn_ms", [0.5, 2.0])
def test_callee_cpu_per_call_recovers_what_the_callee_spends(burn_ms):
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_serve, args=(theirs, burn_ms / 1e3), daemon=True)
    child.start()
    try:
        def call() -> None:
            ours.send(1)
            if not ours.poll(10.0):
                raise TimeoutError("the callee did not reply within 10 s")
            ours.recv()

        call()  # the child is up and serving
        per_call = sp.callee_cpu_per_call(call, child.pid, calls=40, blocks=3, idle_s=0.05)
        # the burn plus a pipe round trip's own CPU on the callee (tens of microseconds)
        assert burn_ms / 1e3 * 0.95 <= per_call <= burn_ms / 1e3 + 0.5e-3
    finally:
        ours.send(None)
        child.join(10)
        if child.is_alive():
            child.kill()


def test_callee_cpu_of_a_gone_process_is_an_error():
    proc = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
    proc.start()
    proc.join(10)
    with pytest.raises(RuntimeError, match=str(proc.pid)):
        sp.callee_cpu_per_call(lambda: None, proc.pid, calls=1, blocks=1, idle_s=0.0)


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
