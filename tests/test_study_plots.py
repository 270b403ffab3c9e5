"""The studies' figures, drawn from synthetic data (no simulation, no RLlib run).

* ``studies/rllib_convergence.py``: one colour per side, one line style per seed (the same style for a
  seed on both sides), a labelled threshold line per panel, a legend naming sides, seeds and the
  threshold; ``--replot`` redraws from a saved ``summary.json`` without Ray.
* ``studies/quickstart.py``: three panels with units on their axes, every bar labelled with its value,
  a zero latency labelled "0" on a symlog axis (a log axis would drop the bar).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgba

STUDIES = Path(__file__).resolve().parents[1] / "studies"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"study_{name}", STUDIES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def _synthetic_runs() -> list[dict]:
    """Curves that rise towards 500 at a seed- and side-dependent rate; every run reaches its threshold."""
    runs = []
    for algo, threshold, step in (("ppo", 450.0, 4000), ("dqn", 400.0, 1000)):
        for seed in (0, 1, 2):
            for side in ("stock", "conduit"):
                rate = 1.0 + 0.3 * seed + (0.1 if side == "conduit" else 0.0)
                curve = [{"steps": step * i, "return_mean": 500 * (1 - math.exp(-rate * i / 10)), "wall_s": i}
                         for i in range(1, 30)]
                reached = next(p["steps"] for p in curve if p["return_mean"] >= threshold)
                runs.append({"algo": algo, "side": side, "seed": seed, "threshold": threshold, "budget": 100_000,
                             "reached_at": reached, "reached": True, "wall_s": 1.0, "violations": 0,
                             "curve": curve})
    return runs


def test_convergence_plot_colours_sides_styles_seeds_and_labels_the_threshold():
    study = _load("rllib_convergence")
    fig = study.draw(_synthetic_runs())
    try:
        assert len(fig.axes) == 2
        for ax in fig.axes:
            curves = [line for line in ax.get_lines() if (line.get_gid() or "").count("/seed")]
            assert len(curves) == 6
            by_side: dict[str, set] = {}
            by_seed: dict[str, set] = {}
            for line in curves:
                side, seed = line.get_gid().split("/")
                by_side.setdefault(side, set()).add(to_rgba(line.get_color()))
                by_seed.setdefault(seed, set()).add(str(line.get_linestyle()))
            assert all(len(colours) == 1 for colours in by_side.values())  # one colour per side
            assert by_side["stock"] != by_side["conduit"]
            assert all(len(styles) == 1 for styles in by_seed.values())  # a seed looks the same on both sides
            assert len({next(iter(s)) for s in by_seed.values()}) == 3  # and differs from the other seeds
            threshold = [line for line in ax.get_lines() if line.get_gid() == "threshold"]
            assert len(threshold) == 1
            labels = [t.get_text() for t in ax.get_legend().get_texts()]
            assert {"stock", "conduit", "seed 0", "seed 1", "seed 2"} <= set(labels)
            assert any(label.startswith("threshold (") for label in labels)
            assert any(t.get_text().startswith("threshold ") for t in ax.texts)  # on the line itself
            assert ax.get_xlabel() and ax.get_ylabel()
    finally:
        plt.close(fig)


def test_convergence_replot_from_a_saved_summary(tmp_path):
    study = _load("rllib_convergence")
    (tmp_path / "summary.json").write_text(json.dumps({"runs": _synthetic_runs(), "wall_s": 1.0}))
    assert study.main(["--out", str(tmp_path), "--replot"]) == 0
    assert (tmp_path / "learning_curves.png").stat().st_size > 10_000
    assert study.main(["--out", str(tmp_path / "missing"), "--replot"]) == 2


def test_quickstart_chart_labels_every_bar_and_shows_zero_latency(tmp_path):
    study = _load("quickstart")
    rows = []
    for workload, stock in (("ppo", (0.52, 2.16, 0.24)), ("dqn", (0.0486, 0.0534, 0.91))):
        for policy, factor in (("rllib-stock", 1.0), ("conduit", 0.0)):
            exposed, iteration, share = stock
            rows.append({"workload": workload, "policy": policy, "exposed_experience_path_s": exposed * factor,
                         "iteration_time_s": iteration if factor else iteration / 10,
                         "experience_share": share * factor})
    captured = {}
    real_close = plt.close
    plt.close = lambda fig=None: captured.setdefault("fig", fig)  # keep the figure to inspect it
    try:
        path = study._chart(rows, tmp_path / "quickstart.png", "synthetic")
    finally:
        plt.close = real_close
    fig = captured["fig"]
    try:
        assert path.exists()
        assert len(fig.axes) == 3
        latency, iteration, share = fig.axes
        assert latency.get_yscale() == "symlog" and iteration.get_yscale() == "log"
        for ax in fig.axes:
            assert ax.get_ylabel() and ax.get_xlabel()
            assert len(ax.texts) == len(rows)  # one value label per bar
        assert "ms" in latency.get_ylabel() and "ms" in iteration.get_ylabel() and "%" in share.get_ylabel()
        assert [t.get_text() for t in latency.texts].count("0") == 2  # conduit's zero latency, both workloads
    finally:
        real_close(fig)
