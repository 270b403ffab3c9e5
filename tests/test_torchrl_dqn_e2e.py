"""End-to-end convergence of TorchRL DQN with TorchRL's replay buffer and with Conduit's (``make test-e2e``;
minutes). Runs ``studies/torchrl_dqn.py`` for both sides with seeds 0 and 1: the same loop, networks, seeds
and env-step budget (RLlib's tuned CartPole DQN recipe in TorchRL's pieces, see the study's doc); each run
must reach a greedy-evaluation return of 400 on CartPole-v1 (the RLlib tests' DQN threshold) within the
budget, and the Conduit side's live audit must count 0 violations all along."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchrl")
pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 1)


def test_torchrl_dqn_converges_with_and_without_conduit(tmp_path):
    out = tmp_path / "dqn"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "studies" / "torchrl_dqn.py"), "--seeds", ",".join(map(str, SEEDS)),
         "--sides", "stock,conduit", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=7200,
        check=False)
    summary = json.loads((out / "summary.json").read_text())
    runs = {(r["side"], r["seed"]): r for r in summary["runs"]}
    assert set(runs) == {(side, seed) for side in ("stock", "conduit") for seed in SEEDS}, proc.stderr[-3000:]
    for seed in SEEDS:
        stock, conduit = runs["stock", seed], runs["conduit", seed]
        assert stock["budget"] == conduit["budget"]
        assert conduit["violations"] == 0
        assert all(p["violations"] == 0 for p in conduit["curve"])
        for run in (stock, conduit):
            last = run["curve"][-1]
            assert run["reached"], (f"{run['side']} seed {seed}: greedy return {last['return_mean']:.0f} after "
                                    f"{last['steps']} env steps, threshold {run['threshold']} within {run['budget']}")
            assert last["return_mean"] >= run["threshold"]
    assert (out / "learning_curves.png").exists()
    assert proc.returncode == 0, proc.stderr[-3000:]
