"""The example plug-in package (examples/conduit-policy-example) as a user installs and runs it.

``make venv`` installs it (``pip install -e examples/conduit-policy-example``); a venv made another way
may not have it, and then these tests are skipped with the command that fixes it.
"""

import json
import subprocess
import sys

import pytest

from conduit.policy import ChunkInfo, Move, Placement, Policy
from conduit.topology import load_topology
from conduit.view import LearnerState, static_view_of

example = pytest.importorskip(
    "conduit_policy_example",
    reason="the example plug-in is not installed: run `make venv` or "
           "`.venv/bin/python -m pip install -e examples/conduit-policy-example`",
)

NAME = "nvme-hot-set"
ORIGIN = "plugin:conduit-policy-example"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conduit", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_listed_as_a_plugin():
    result = run("policies", "list")
    assert result.returncode == 0, result.stderr
    line = next((ln for ln in result.stdout.splitlines() if ln.split()[:1] == [NAME]), None)
    assert line is not None, result.stdout
    assert ORIGIN in line and "policy" in line.split()
    rows = {r["name"]: r for r in json.loads(run("policies", "list", "--json").stdout)}
    assert rows[NAME]["origin"] == ORIGIN and rows[NAME]["role"] == "policy"


@pytest.mark.parametrize("workload", ["ppo", "appo", "dqn"])
def test_sim_runs_with_zero_violations(workload):
    result = run("sim", "--policy", NAME, "--topology", "dgx-h100-x2", "--workload", workload,
                 "--iterations", "3", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["policy"] == NAME
    assert out["audit"]["violations"] == 0, out["audit"]
    assert out["metrics"]["updates"] == 3
    assert out["metrics"]["iteration_time_s"] > 0


def _view(topo, used=None):
    learner = LearnerState("L0", "n0.gpu0", "n0", None, 0.1, 0, batch_bytes=1e6)
    return static_view_of(topo, used=used, learner_states={"L0": learner})


def test_hot_then_warm_then_cold():
    """Hot set in the consumer's HBM up to its budget, then pinned (within the warm budget), then NVMe."""
    from conduit_policy_example import HotSetPlacement

    topo = load_topology("dgx-h100-x2")
    placement = HotSetPlacement(hot_fraction=0.25, warm_fraction=0.5)
    chunk = ChunkInfo("c", "n0", "n0.gpu3", 1e6, 0, consumer="L0")
    hbm = topo.tier("n0.gpu0:hbm")
    assert placement.place(chunk, _view(topo)) == Placement("n0.gpu0:hbm")
    hot_full = {"n0.gpu0:hbm": 0.25 * hbm.capacity}
    warm = placement.place(chunk, _view(topo, hot_full)).tier
    assert warm.endswith(":pinned") and warm.startswith("n0.")
    pinned_full = {**hot_full, **{t.id: 0.5 * t.capacity for t in topo.tiers if t.id.startswith("n0.")
                                  and t.kind.value == "pinned"}}
    cold = placement.place(chunk, _view(topo, pinned_full)).tier
    assert cold.endswith(":nvme") and cold.startswith("n0.")


def test_spill_demotes_oldest_one_level():
    from conduit_policy_example import HotSetPlacement

    topo = load_topology("dgx-h100-x2")
    view = _view(topo)
    view.locations.update({"old": "n0.gpu0:hbm", "new": "n0.gpu0:hbm"})
    view.sizes.update({"old": 1e6, "new": 1e6})
    moves = HotSetPlacement().spill("n0.gpu0:hbm", 1e6, view)
    assert len(moves) == 1 and isinstance(moves[0], Move) and moves[0].chunk_id == "old"
    assert moves[0].dst_tier.endswith(":pinned")


def test_nvme_only_configuration_keeps_the_contract():
    """With no hot and no warm budget every chunk lives on NVMe, and the contracts still hold."""
    from conduit.registry import create_policy
    from conduit.sim.run import simulate

    policy = create_policy(NAME, hot_fraction=0.0, warm_fraction=0.0, depth=1)
    assert isinstance(policy, Policy) and policy.params["depth"] == 1
    for workload in ("ppo", "dqn"):
        result = simulate("dgx-h100-x2", workload, policy, iterations=3)
        assert result.audit.violations == 0
        assert any(t.endswith(":nvme") for t in result.tier_peak)
