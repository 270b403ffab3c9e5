"""End-to-end convergence under Conduit (``make test-e2e``; minutes, not seconds).

PPO on CartPole-v1 must reach a mean episode return of 450 and DQN 400 within the env-step budget of
``studies/rllib_convergence.py`` (what stock RLlib needs with the same settings and seed), with the
live audit at 0 violations all along. The test runs the study itself, so the study's learning
curves and this check come from the same code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_conduit_converges_within_the_stock_budget(algo, tmp_path):
    out = tmp_path / algo
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "studies" / "rllib_convergence.py"), "--algos", algo, "--seeds", "0",
         "--sides", "conduit", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600, check=False)
    summary = json.loads((out / "summary.json").read_text())
    (run,) = summary["runs"]
    assert run["reached"], (f"{algo}: return {run['curve'][-1]['return_mean']:.0f} after {run['curve'][-1]['steps']} "
                            f"env steps, threshold {run['threshold']} within {run['budget']}\n{proc.stdout[-2000:]}")
    assert run["violations"] == 0
    assert all(p.get("violations", 0) == 0 for p in run["curve"])
    assert proc.returncode == 0, proc.stderr[-3000:]
