"""The paper table (``studies/paper_table.py``) and the sensitivity study (``studies/sensitivity.py``).

Cheap ``--quick`` runs (8 GPUs) check what the studies write: the schema of every output, zero
audit violations, every run's steady-state window long enough, the summary recomputable from the
per-run rows, the published figures next to the table, the provenance. The helpers (confidence
intervals, the warm-up rule, the scaled stock costs) are checked as properties.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import statistics
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.registry import create_policy
from conduit.sim.engine import Simulation
from conduit.sim.params import StockCosts
from conduit.sim.provenance import MIN_ROUNDS
from conduit.sim.workload import load_workload
from conduit.topology import load_topology

STUDIES = Path(__file__).resolve().parents[1] / "studies"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"study_{name}", STUDIES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


paper = _load("paper_table")
sensitivity = _load("sensitivity")


def _rows(path: Path) -> list[dict]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def paper_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("paper_table")
    assert paper.main(["--quick", "--out", str(out)]) == 0
    return out


def test_paper_table_quick_writes_its_schema_with_zero_violations(paper_out):
    runs = _rows(paper_out / "runs.csv")
    policies = [paper.BASELINE, paper.HEADLINE, *paper.design_targets()]
    assert len(runs) == len(paper.ALGORITHMS) * len(paper.QUICK_SEEDS) * len(policies)
    assert {r["algorithm"] for r in runs} == set(paper.ALGORITHMS)
    assert {int(r["gpus"]) for r in runs} == {8}
    for r in runs:
        assert int(r["violations"]) == 0
        assert "short window" not in r["warnings"]  # every window holds MIN_ROUNDS rounds
        # a run still trending was extended as far as allowed, and is flagged
        assert r["not_steady"] == str(any(w.startswith("not steady") for w in r["warnings"].split(" | ")))
        assert r["not_steady"] == "False" or int(r["extended"]) == paper.MAX_EXTEND
        assert float(r["rounds_measured"]) >= MIN_ROUNDS
        assert float(r["iteration_time_s"]) > 0 and float(r["exposed_experience_path_s"]) >= 0
    table = _rows(paper_out / "paper_table.csv")
    assert list(table[0]) == ["algorithm", "gpus", "topology", "workload", "policy", "label", "seeds",
                              "stock_iteration_s", "policy_iteration_s", "stock_exposed_s", "policy_exposed_s",
                              "stock_share", "policy_share", "iteration_reduction", "iteration_reduction_ci95",
                              "exposed_reduction", "exposed_reduction_ci95", "violations", "warnings",
                              "beyond_deployed", "not_steady"]
    assert len(table) == len(paper.ALGORITHMS) * (len(policies) - 1)
    assert all(int(r["violations"]) == 0 and int(r["seeds"]) == len(paper.QUICK_SEEDS) for r in table)
    assert [r["label"] for r in table if r["policy"] == paper.HEADLINE] == ["headline"] * len(paper.ALGORITHMS)


def test_paper_table_reductions_are_the_paired_means_of_the_runs(paper_out):
    runs = _rows(paper_out / "runs.csv")
    by = {(r["algorithm"], r["policy"], r["seed"]): r for r in runs}
    for row in _rows(paper_out / "paper_table.csv"):
        seeds = sorted({r["seed"] for r in runs if r["algorithm"] == row["algorithm"]})
        for metric, column in (("iteration_time_s", "iteration_reduction"),
                               ("exposed_experience_path_s", "exposed_reduction")):
            per_seed = []
            for s in seeds:
                ours = float(by[(row["algorithm"], row["policy"], s)][metric])
                stock = float(by[(row["algorithm"], paper.BASELINE, s)][metric])
                per_seed.append(1 - ours / stock if stock > 0 else (0.0 if ours == stock else -math.inf))
            assert float(row[column]) == pytest.approx(statistics.fmean(per_seed), rel=1e-9, abs=1e-12)
            half = float(row[column + "_ci95"])
            assert half >= 0 or math.isnan(half)


def test_paper_table_report_stands_next_to_the_published_figures_with_provenance(paper_out):
    text = (paper_out / "paper_table.md").read_text()
    assert "-97.0%" in text and "-38.0%" in text
    assert "Where Conduit does not help" in text and "Provenance" in text
    table = _rows(paper_out / "paper_table.csv")
    head, rest = text.split("## Design target", 1) if "## Design target" in text else (text, "")
    for row in table:
        beyond = row["beyond_deployed"] == "True"
        line = f"| {row['algorithm']} | 8{' †' if beyond else ''} | {row['policy']} |"
        # the headline and the design target never share a table
        assert line in (head if row["label"] == "headline" else rest)
        runs_of_row = [r for r in _rows(paper_out / "runs.csv")
                       if r["algorithm"] == row["algorithm"] and r["policy"] == row["policy"]]
        assert beyond == any(paper.beyond_deployed(r) for r in runs_of_row)
        if beyond:  # the caveat names the row
            assert f"{row['algorithm']} at 8 GPUs" in text.split("## Read before citing", 1)[1]
    prov = json.loads((paper_out / "provenance.json").read_text())
    assert set(prov["topologies"]) == {"dgx-h100"} and len(prov["topologies"]["dgx-h100"]) == 64
    assert set(prov["stock_costs"]["values"]) == {f.name for f in fields(StockCosts)}
    assert len(prov["runs"]) == len(_rows(paper_out / "runs.csv"))
    for run in prov["runs"]:
        assert run["provenance"]["seed"] == run["seed"]
        assert run["provenance"]["policy"]["name"] == run["policy"]
        assert run["steady_state"]["rounds_measured"] >= MIN_ROUNDS
    if pytest.importorskip is not None and importlib.util.find_spec("matplotlib") is not None:
        assert (paper_out / "paper_table.png").stat().st_size > 0


def test_paper_table_merge_rebuilds_the_same_table_from_its_runs(paper_out, tmp_path):
    assert paper.main(["--merge", str(paper_out), "--out", str(tmp_path), "--no-plot"]) == 0
    assert _rows(tmp_path / "paper_table.csv") == _rows(paper_out / "paper_table.csv")
    assert _rows(tmp_path / "runs.csv") == _rows(paper_out / "runs.csv")
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["merged_from"] == [str(paper_out)]


def test_sensitivity_quick_writes_heatmap_cells_with_zero_violations(tmp_path):
    algorithms = ["appo", "grpo"]
    assert sensitivity.main(["--quick", "--algorithms", *algorithms, "--out", str(tmp_path)]) == 0
    rows = _rows(tmp_path / "sensitivity.csv")
    for algorithm in algorithms:
        mine = [r for r in rows if r["algorithm"] == algorithm]
        plane = {p: [r for r in mine if r["plane"] == p] for p in sensitivity.PLANES}
        assert len(plane["ratio_x_bytes"]) == (len(sensitivity.QUICK_RATIOS[algorithm])
                                               * len(sensitivity.QUICK_BYTES_SCALES))
        for kind in ("scale_x_rpc", "scale_x_serialisation"):
            assert len(plane[kind]) == len(sensitivity.QUICK_COST_SCALES)  # x 1 scale (8 GPUs)
    for r in rows:
        assert int(r["violations"]) == 0
        assert float(r["iteration_ratio"]) == pytest.approx(float(r["conduit_iteration_s"])
                                                            / float(r["stock_iteration_s"]))
    # the cost variants are files `conduit sim --stock-costs` reads back as the same costs
    from conduit.sim.cost_file import load_stock_costs

    for kind in ("rpc", "serialisation"):
        for scale in sensitivity.QUICK_COST_SCALES:
            assert load_stock_costs(tmp_path / "costs" / f"{kind}-x{scale:g}.yaml") == sensitivity.scaled_costs(
                kind, scale)
    text = (tmp_path / "sensitivity.md").read_text()
    section = text.split("## Where Conduit does not help", 1)[1]
    for algorithm in algorithms:
        weak = [r for r in rows if r["algorithm"] == algorithm
                and float(r["iteration_ratio"]) > 1 - sensitivity.NO_HELP]
        assert algorithm in section
        if len(weak) == len([r for r in rows if r["algorithm"] == algorithm]):
            assert f"**{algorithm}: nowhere in this sweep.**" in section
        elif not weak:
            assert f"- {algorithm}: at least" in section
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "sensitivity.png").stat().st_size > 0
    # --merge rebuilds the same cells (e.g. from algorithms run in separate processes)
    merged = tmp_path / "merged"
    assert sensitivity.main(["--merge", str(tmp_path), "--out", str(merged), "--no-plot"]) == 0
    assert _rows(merged / "sensitivity.csv") == rows


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=12), st.floats(0.01, 100))
def test_mean_ci_is_a_scaled_interval_around_the_mean(values, scale):
    mean, half = paper.mean_ci(values)
    assert mean == pytest.approx(statistics.fmean(values), abs=1e-9)
    assert half >= 0
    scaled_mean, scaled_half = paper.mean_ci([scale * v for v in values])
    assert scaled_mean == pytest.approx(scale * mean, rel=1e-9, abs=1e-6)
    assert scaled_half == pytest.approx(scale * half, rel=1e-6, abs=1e-6)
    assert paper.mean_ci([values[0]] * len(values))[1] == pytest.approx(0.0, abs=1e-9)


def test_mean_ci_of_one_seed_has_no_interval():
    assert paper.mean_ci([0.5]) == (0.5, pytest.approx(math.nan, nan_ok=True))
    assert math.isnan(paper.mean_ci([])[0])


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["ppo", "appo", "dqn"]), st.integers(1, 5000))
def test_warmup_rule_is_the_engines(algorithm, iterations):
    sim = Simulation(load_topology("dgx-h100"), load_workload(algorithm), create_policy("rllib-stock"),
                     iterations=iterations)
    assert paper.warmup_updates(algorithm, iterations) == sim._warmup()


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["rpc", "serialisation"]), st.floats(0.01, 100))
def test_scaled_costs_scale_only_their_fields(kind, scale):
    base = StockCosts()
    costs = sensitivity.scaled_costs(kind, scale)
    names = sensitivity.RPC_FIELDS if kind == "rpc" else sensitivity.SERIALISATION_FIELDS
    for f in fields(StockCosts):
        value, ref = getattr(costs, f.name), getattr(base, f.name)
        if f.name not in names:
            assert value == ref
        elif f.name.endswith("bandwidth"):
            assert value == pytest.approx(ref / scale)
        else:
            assert value == pytest.approx(ref * scale)
