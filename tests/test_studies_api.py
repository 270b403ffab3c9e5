"""Studies without glue: conduit.simulate / conduit.sweep, --set, conduit sweep, conduit workload, the doc."""

import builtins
import csv
import json
import logging
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

import conduit
from conduit.errors import ConduitError
from conduit.progress_display import resolve_progress
from conduit.results import Table, to_frame
from conduit.sim.workload import PRESETS, Workload, WorkloadError, load_workload
from conduit.sim.workload_bounds import _warned
from conduit.sim.workload_fields import (
    FIELD_INFO,
    apply_overrides,
    coerce_field,
    parse_assignments,
    render_doc,
)
from conduit.studies import MAX_RUNS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "workload-format.md"
SMALL = "reference-2core"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conduit", *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=ROOT)


# -- the doc cannot drift from the code ------------------------------------------------------------------
def test_doc_lists_every_field_and_its_tables_are_current():
    text = DOC.read_text()
    for f in fields(Workload):
        assert f.name in FIELD_INFO, f"FIELD_INFO lacks {f.name}"
        assert f"| `{f.name}` |" in text, f"docs/workload-format.md lacks {f.name}"
    assert render_doc(text) == text, "regenerate: python -m conduit.sim.workload_fields docs/workload-format.md"


def test_readme_points_to_the_doc():
    assert "docs/workload-format.md" in (ROOT / "README.md").read_text()


# -- --set typing and errors ---------------------------------------------------------------------------
def test_coerce_types_by_field():
    assert coerce_field("runners_per_gpu", "4") == 4.0
    assert coerce_field("epochs", "3") == 3 and isinstance(coerce_field("epochs", "3"), int)
    assert coerce_field("replay_capacity", "1e6") == 1_000_000
    assert coerce_field("env_step_time", "2 ms") == pytest.approx(2e-3)
    assert coerce_field("bytes_per_step", "1 KiB") == 1024
    assert coerce_field("local_learner", "yes") is True
    assert coerce_field("env_runners", "null") is None
    assert coerce_field("name", "x") == "x"


@pytest.mark.parametrize("key, value, words", [
    ("epochs", "2.5", "integer"),
    ("epochs", "many", "integer"),
    ("runners_per_gpu", "nan", "finite"),
    ("local_learner", "maybe", "true or false"),
    ("env_step_time", "2 GB", "time"),
])
def test_coerce_refuses_bad_values(key, value, words):
    with pytest.raises(WorkloadError, match=words):
        coerce_field(key, value)


def test_unknown_key_did_you_mean():
    with pytest.raises(WorkloadError, match="did you mean 'runners_per_gpu'"):
        coerce_field("runers_per_gpu", "4")


def test_assignments_syntax():
    assert parse_assignments(["a=1", "b= 2 ms"]) == {"a": "1", "b": " 2 ms"}
    with pytest.raises(ConduitError, match="KEY=VALUE"):
        parse_assignments(["epochs"])
    with pytest.raises(ConduitError, match="twice"):
        parse_assignments(["epochs=1", "epochs=2"])


def test_overrides_are_validated():
    wl = apply_overrides(PRESETS["ppo"], {"runners_per_gpu": "2", "epochs": 2})
    assert wl.runners_per_gpu == 2.0 and wl.epochs == 2 and PRESETS["ppo"].epochs == 10
    with pytest.raises(WorkloadError, match="smaller than one chunk"):
        apply_overrides(PRESETS["ppo"], {"train_batch_per_learner": "100"})


def test_cli_set_unknown_key_exits_2_with_hint():
    result = run("sim", "--topology", SMALL, "--set", "runers_per_gpu=2", "--iterations", "1")
    assert result.returncode == 2 and "did you mean 'runners_per_gpu'" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_set_changes_the_run():
    result = run("sim", "--topology", "dgx-h100", "--workload", "ppo", "--iterations", "1", "--json",
                 "--set", "runners_per_gpu=2", "--set", "fragment_length=64", "--set", "train_batch_per_learner=1024")
    assert result.returncode in (0, 1), result.stderr  # 1 would be an audit violation, not a usage error
    out = json.loads(result.stdout)
    assert out["audit"]["ingested_samples"] % (64 * 8) == 0


# -- bounds ---------------------------------------------------------------------------------------------
def test_runners_per_gpu_1000_refused_100_warned(caplog):
    with pytest.raises(WorkloadError, match="runners_per_gpu: 1,000 is above the limit 256"):
        load_workload({"base": "ppo", "runners_per_gpu": 1000})
    _warned.clear()
    with caplog.at_level(logging.WARNING, logger="conduit"):
        load_workload({"base": "ppo", "runners_per_gpu": 100})
        load_workload({"base": "ppo", "runners_per_gpu": 100})
    hits = [r for r in caplog.records if "runners_per_gpu" in r.getMessage()]
    assert len(hits) == 1 and hits[0].name == "conduit" and "implausible" in hits[0].getMessage()


def test_absurd_bytes_per_step():
    with pytest.raises(WorkloadError, match="bytes_per_step"):
        load_workload({"base": "ppo", "bytes_per_step": "2 TiB"})
    with pytest.raises(WorkloadError, match="chunk_bytes"):  # each field plausible, the chunk not
        load_workload({"base": "ppo", "bytes_per_step": "60 MiB", "fragment_length": 65536, "envs_per_runner": 4096,
                       "train_batch_per_learner": 2**28})


def test_presets_are_plausible(caplog):
    _warned.clear()
    with caplog.at_level(logging.WARNING, logger="conduit"):
        for preset in PRESETS.values():
            preset.validate()
    assert not caplog.records


# -- conduit.simulate -----------------------------------------------------------------------------------
def test_import_conduit_stays_light():
    code = "import sys, conduit; print('conduit.sim' in sys.modules, 'simpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.split() == ["False", "False"]


def test_simulate_api_rows_and_progress():
    calls = []
    result = conduit.simulate(SMALL, "ppo", iterations=2, seed=0, overrides={"epochs": 1},
                              progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (2, 2)
    assert result.workload.epochs == 1
    (row,) = result.to_rows()
    assert row["topology"] == SMALL and row["policy"] == "rllib-stock" and row["seed"] == 0
    assert {"exposed_experience_path_s", "iteration_time_s", "experience_share", "violations"} <= set(row)
    assert all(isinstance(v, str | int | float) for v in row.values())
    assert result.to_rows("updates") and result.to_rows("chunks")
    assert json.dumps(result.to_dict(), default=float)
    with pytest.raises(ConduitError, match="row kind"):
        result.to_rows("nope")


def test_progress_true_draws_a_bar_on_stderr(capsys):
    conduit.simulate(SMALL, "dqn", iterations=1, progress=True)
    assert "1/1" in capsys.readouterr().err
    with pytest.raises(ConduitError, match="progress must be"):
        resolve_progress(3)


def test_to_frame_without_pandas_names_pandas(monkeypatch):
    real_import = builtins.__import__

    def no_pandas(name, *args, **kwargs):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("No module named 'pandas'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(ImportError, match="pip install pandas"):
        to_frame([{"a": 1}])
    with pytest.raises(ImportError, match="pandas"):
        Table([{"a": 1}]).to_frame()


def test_to_frame_with_pandas():
    pd = pytest.importorskip("pandas")
    frame = Table([{"a": 1, "b": 2.0}, {"a": 3, "b": 4.0}]).to_frame()
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == ["a", "b"] and len(frame) == 2


# -- conduit.sweep --------------------------------------------------------------------------------------
def test_sweep_is_resumable(tmp_path):
    out = tmp_path / "results.csv"
    grid = {"workload": ["ppo", "dqn"], "envs_per_runner": ["1", "2"]}
    first = conduit.sweep(SMALL, grid=grid, policies="rllib-stock", seeds=[0], iterations=1, out=out)
    assert len(first) == 4 and isinstance(first, Table)
    assert [r["workload"] for r in first] == ["ppo", "ppo", "dqn", "dqn"]
    with open(out) as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 4 and rows[0]["envs_per_runner"] == "1"

    calls = []
    again = conduit.sweep(SMALL, grid=grid, policies="rllib-stock", seeds=[0], iterations=1, out=out,
                          progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (4, 4)
    assert [r["iteration_time_s"] for r in again] == pytest.approx([r["iteration_time_s"] for r in first],
                                                                  nan_ok=True)
    with open(out) as handle:
        assert len(list(csv.DictReader(handle))) == 4  # nothing ran again

    # extend: a new seed runs only the new cells; an interrupted last row is dropped and rerun
    out.write_text(out.read_text() + "sandbox,ppo,1,rllib")
    more = conduit.sweep(SMALL, grid=grid, policies="rllib-stock", seeds=[0, 1], iterations=1, out=out)
    assert len(more) == 8
    with open(out) as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 8 and sorted({r["seed"] for r in rows}) == ["0", "1"]


def test_sweep_refuses_another_sweeps_file(tmp_path):
    out = tmp_path / "r.csv"
    conduit.sweep(SMALL, "dqn", grid={"envs_per_runner": [1]}, iterations=1, out=out)
    with pytest.raises(ConduitError, match="different sweep"):
        conduit.sweep(SMALL, "dqn", grid={"fragment_length": [1]}, iterations=1, out=out)


@pytest.mark.parametrize("kwargs, words", [
    ({"grid": {"framgent_length": [1, 2]}}, "did you mean 'fragment_length'"),
    ({"grid": {"epochs": ["1", "1"]}}, "more than once"),
    ({"grid": {"epochs": []}}, "no value"),
    ({"grid": {"epochs": ["x"]}}, "integer"),
    ({"grid": {"seed": [1, 2]}}, "--seeds"),
    ({"grid": {"topology": [SMALL]}, "topology": SMALL}, "both a grid key"),
    ({"grid": {"topology": ["nowhere-topology"]}}, "nowhere-topology"),
    ({"grid": {"learners": [1, 9]}, "topology": "dgx-h100"}, "learners=9"),
    ({"grid": {"train_batch_per_learner": [100]}, "topology": "dgx-h100"}, "smaller than one chunk"),
    ({"policies": "no-such-policy"}, "no-such-policy"),
    ({"seeds": "0,x"}, "not an integer"),
    ({"seeds": [-1]}, "negative"),
    ({"iterations": 0}, "iterations"),
    ({"grid": {"epochs": list(range(1, 101))}, "seeds": list(range(MAX_RUNS // 100 + 1))}, "at most"),
    ({"grid": {"epochs": [1]}, "overrides": {"epochs": 2}}, "both a grid key and an override"),
])
def test_sweep_refuses_bad_grids_before_running(kwargs, words, monkeypatch):
    import conduit.sim.run as run_module

    def never(*args, **kw):
        raise AssertionError("a run started before the grid was checked")

    monkeypatch.setattr(run_module, "simulate", never)
    kwargs = {"iterations": 1, **kwargs}
    if "topology" not in kwargs and "topology" not in kwargs.get("grid", {}):
        kwargs["topology"] = "dgx-h100"
    with pytest.raises(ConduitError, match=words):
        conduit.sweep(**kwargs)


def test_sweep_grid_over_topology_and_strings():
    table = conduit.sweep(grid=["topology=reference-2core", "workload=dqn", "fragment_length=1,2"],
                          policies=["rllib-stock", "conduit"], seeds="0", iterations=1)
    assert len(table) == 4 and table.columns[:3] == ["topology", "workload", "fragment_length"]
    assert {r["policy_name"] for r in table} == {"rllib-stock", "conduit"}
    assert table.to_dict()["fragment_length"] == [1, 1, 2, 2]


# -- the commands ---------------------------------------------------------------------------------------
def test_cli_sweep_resumes(tmp_path):
    out = tmp_path / "r.csv"
    args = ("sweep", "--topology", SMALL, "--workload", "dqn", "--grid", "fragment_length=1,2", "--seeds", "0",
            "--iterations", "1", "--out", str(out))
    first = run(*args)
    assert first.returncode == 0, first.stderr
    assert "2 runs, 2 new" in first.stdout
    second = run(*args)
    assert second.returncode == 0 and "2 runs, 0 new, 2 already" in second.stdout
    bad = run("sweep", "--topology", SMALL, "--grid", "fragment_lenght=1,2", "--out", str(out))
    assert bad.returncode == 2 and "did you mean 'fragment_length'" in bad.stderr and "Traceback" not in bad.stderr


def test_cli_workload_list_and_show():
    listed = run("workload", "list")
    assert listed.returncode == 0
    for name in PRESETS:
        assert name in listed.stdout
    data = json.loads(run("workload", "list", "--json").stdout)
    assert data["grpo-llm"]["runners_per_gpu"] == 0.125

    shown = run("workload", "show", "ppo", "--set", "epochs=2")
    assert shown.returncode == 0
    assert "bytes_per_step" in shown.stdout and "B per sample" in shown.stdout and "chunk_bytes" in shown.stdout
    out = json.loads(run("workload", "show", "grpo-llm", "--topology", "dgx-h100-x2", "--json").stdout)
    assert set(out["fields"]) == {f.name for f in fields(Workload)}
    assert out["layout"]["runners"] == 2 and out["layout"]["learners"] == 16

    missing = run("workload", "show", "nope")
    assert missing.returncode == 2 and "unknown workload 'nope'" in missing.stderr


def test_load_script_registers_the_module_once_and_unregisters_a_failed_one(tmp_path, monkeypatch):
    """Studies load each other by path (they are scripts): the module is registered under the file's
    stem before it runs (its dataclasses look it up there), loaded once, and a script that fails to
    run leaves no half-made module behind."""
    import sys

    from conduit.studies import load_script

    good = tmp_path / "study_for_load_script.py"
    good.write_text("from dataclasses import dataclass\nRUNS = []\nRUNS.append(1)\n\n@dataclass\nclass Row:\n    x: int\n")
    bad = tmp_path / "broken_study_for_load_script.py"
    bad.write_text("raise RuntimeError('boom')\n")
    monkeypatch.delitem(sys.modules, good.stem, raising=False)
    try:
        first = load_script(good)
        assert load_script(good) is first and first.RUNS == [1]  # ran once
        assert first.Row(3).x == 3 and sys.modules[good.stem] is first
        with pytest.raises(RuntimeError, match="boom"):
            load_script(bad)
        assert bad.stem not in sys.modules
    finally:
        sys.modules.pop(good.stem, None)
