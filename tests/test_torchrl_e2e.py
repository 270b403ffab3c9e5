"""End-to-end convergence of TorchRL PPO with and without Conduit (``make test-e2e``; minutes).

Runs ``studies/torchrl_convergence.py`` for both sides with seed 0: the same collectors, networks, seeds
and env-step budget; each must reach a mean episode return of 450 on CartPole-v1 (the RLlib tests'
threshold), and the Conduit side's live audit must count 0 violations all along.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchrl")
pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]


def test_torchrl_ppo_converges_with_and_without_conduit(tmp_path):
    out = tmp_path / "ppo"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "studies" / "torchrl_convergence.py"), "--algos", "ppo", "--seeds", "0",
         "--sides", "stock,conduit", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False)
    summary = json.loads((out / "summary.json").read_text())
    runs = {r["side"]: r for r in summary["runs"]}
    assert set(runs) == {"stock", "conduit"}, proc.stderr[-3000:]
    for side, run in runs.items():
        last = run["curve"][-1]
        assert run["reached"], (f"{side}: return {last['return_mean']:.0f} after {last['steps']} env steps, threshold "
                                f"{run['threshold']} within {run['budget']}\n{proc.stdout[-2000:]}")
    assert runs["conduit"]["violations"] == 0
    assert all(p["violations"] == 0 for p in runs["conduit"]["curve"])
    assert (out / "learning_curves.png").exists()
    assert proc.returncode == 0, proc.stderr[-3000:]
