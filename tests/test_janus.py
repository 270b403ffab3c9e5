"""Janus baselines (conduit/policies/janus.py) and the janus-best search (conduit/sim/search.py)."""

import json
import math
import subprocess
import sys

import pytest

from conduit.errors import ConduitError
from conduit.policies.components import EarliestDeadlineFirst, OnDemand, TierPreference
from conduit.policies.janus import (
    FRAGMENT_STEPS,
    GRANULARITIES,
    PLACEMENTS,
    janus,
    janus_configurations,
    janus_name,
    parse_janus_name,
)
from conduit.policy import Policy
from conduit.registry import create_policy, policy_registry
from conduit.sim import search
from conduit.sim.run import simulate
from conduit.topology.model import TierKind

TOPOLOGY = "dgx-h100-x2"
CONFIGS = list(janus_configurations())
#: 8 configurations, spread over every placement, overlap setting and granularity (fixed, not random)
SAMPLE = [CONFIGS[(i * 23) % len(CONFIGS)] for i in range(8)]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conduit", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_sixty_names_resolve_and_build():
    names = [name for name, _ in CONFIGS]
    assert len(names) == len(set(names)) == 60
    registered = set(policy_registry().names("policy"))
    for name, kwargs in CONFIGS:
        assert name in registered
        assert parse_janus_name(name) == kwargs and janus_name(**kwargs) == name
        policy = create_policy(name)
        assert isinstance(policy, Policy) and policy.name == name
        assert policy.params == kwargs


@pytest.mark.parametrize(("name", "kwargs"), CONFIGS, ids=[n for n, _ in CONFIGS])
def test_configuration_matches_its_name(name, kwargs):
    placement, co, so, g = name.removeprefix("janus-").split("-")
    policy = create_policy(name)
    path = policy.path
    assert path.route == "direct" and path.batch_build == "per-batch"
    assert path.pinned is (placement != "pageable")
    assert path.granularity == int(g[1:])
    assert path.overlap_collection is (co == "co")
    assert path.overlap_update is (so == "so")
    assert path.prefetch_depth == (2 if so == "so" else 0)
    assert isinstance(policy.placement, TierPreference)
    assert policy.placement.order == {
        "pageable": (TierKind.PAGEABLE, TierKind.NVME),
        "pinned": (TierKind.PINNED, TierKind.PAGEABLE, TierKind.NVME),
        "gpu": (TierKind.HBM, TierKind.PINNED, TierKind.PAGEABLE, TierKind.NVME),
    }[placement]
    if so == "so":
        assert isinstance(policy.scheduling, EarliestDeadlineFirst) and policy.scheduling.depth == 2
    else:
        assert isinstance(policy.scheduling, OnDemand)
    assert create_policy("janus", **kwargs).describe() == policy.describe()


def test_parametric_entry_declares_its_space_and_checks_values():
    policy = create_policy("janus")
    assert policy.name == "janus-gpu-co-so-g1"
    space = {p.name: p.choices for p in policy.space}
    assert space == {"placement": tuple(PLACEMENTS), "overlap_collection": (True, False),
                     "overlap_selection": (True, False), "granularity": GRANULARITIES,
                     "fragment_steps": FRAGMENT_STEPS, "per_fragment_advantages": (False, True)}
    with pytest.raises(ConduitError, match="placement must be one of"):
        janus(placement="nvme")
    with pytest.raises(ConduitError, match="granularity must be one of"):
        janus(granularity=3)
    with pytest.raises(ConduitError, match="not a Janus configuration name"):
        parse_janus_name("janus-gpu-co-so-g3")


def test_janus_best_by_name_alone_is_a_clear_error():
    with pytest.raises(ConduitError, match="resolved by a backend search"):
        create_policy("janus-best")


def test_policies_do_not_import_the_simulator():
    code = ("import sys, conduit.policies.janus, conduit.registry as r; r.policy_registry(); "
            "print(sorted(m for m in sys.modules if m.startswith(('conduit.sim', 'conduit.runtime'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("workload", ["ppo", "appo", "dqn"])
def test_sample_runs_with_zero_violations(workload):
    for name, _ in SAMPLE:
        result = simulate(TOPOLOGY, workload, name, iterations=3, seed=1)
        assert result.audit.violations == 0, (name, result.audit.by_kind)
        assert result.metrics["updates"] == 3 and result.metrics["iteration_time_s"] > 0


@pytest.fixture(scope="module")
def ppo_search():
    search.clear_cache()
    return search.janus_best(TOPOLOGY, "ppo", iterations=3, seed=0)


def test_janus_best_picks_the_minimum_among_clean_runs(ppo_search):
    policy, rows = ppo_search
    # the 60 configurations, then the fragment-length / per-fragment-advantage variants of their winner
    assert [r["name"] for r in rows[:60]] == [n for n, _ in CONFIGS]
    assert all(r.get("refinement") for r in rows[60:]) and len(rows) > 60
    evaluated = [r for r in rows[:60] if r["evaluated"]]
    # PPO: selection overlap cannot matter; a runner (10 per GPU, RLlib's Atari recipe) makes one
    # chunk per iteration, so every g is g1
    assert len(evaluated) == 3 * 2 * 1
    assert all(r["same_as"] and r["skip_reason"] for r in rows if not r["evaluated"])
    best = [r for r in rows if r["best"]]
    assert len(best) == 1 and best[0]["evaluated"] and best[0]["violations"] == 0
    assert policy.name == f"janus-best={best[0]['name']}"
    assert policy.params["configuration"] == best[0]["name"]
    for r in evaluated:
        if r["violations"] == 0:
            assert best[0]["iteration_time_s"] <= r["iteration_time_s"] * (1 + 1e-9)
    again, rows_again = search.janus_best(TOPOLOGY, "ppo", iterations=3, seed=0)  # served from the cache
    assert again.name == policy.name and rows_again == rows


@pytest.mark.parametrize(("workload", "skipped", "same_as"), [
    ("ppo", "janus-pinned-co-so-g1", "janus-pinned-co-nso-g1"),
    # a runner makes one chunk per PPO iteration (10 runners per GPU), so every g is g1
    ("ppo", "janus-gpu-nco-nso-g16", "janus-gpu-nco-nso-g1"),
    ("appo", "janus-pinned-co-so-g4", "janus-pinned-co-nso-g4"),
    ("appo", "janus-gpu-nco-so-g1", "janus-gpu-nco-nso-g1"),
])
def test_skipped_configurations_really_behave_the_same(workload, skipped, same_as):
    """The search's equivalence rules, checked against the engine (they must not drift from it)."""
    from conduit.sim.workload import load_workload
    from conduit.topology import load_topology

    topo, wl = load_topology(TOPOLOGY), load_workload(workload)
    canon, reason = search.canonical(parse_janus_name(skipped), topo, wl)
    assert janus_name(**canon) == same_as and reason
    a = simulate(topo, wl, skipped, iterations=4, seed=2).metrics
    b = simulate(topo, wl, same_as, iterations=4, seed=2).metrics
    for key in ("iteration_time_s", "exposed_experience_path_s", "experience_path_s"):
        assert math.isclose(a[key], b[key], rel_tol=1e-12), key


def test_simulate_janus_best_names_the_winner(ppo_search):
    policy, _ = ppo_search
    result = simulate(TOPOLOGY, "ppo", "janus-best", iterations=3, seed=0)
    assert result.policy.name == policy.name and result.policy.name.startswith("janus-best=janus-")
    assert result.audit.violations == 0
    with pytest.raises(ConduitError, match="takes no parameters"):
        simulate(TOPOLOGY, "ppo", "janus-best", iterations=3, params={"granularity": 2})


# APPO's search evaluates 30 of the 60 configurations (about 4 s with the CLI's start); DQN's all 60
# (about 25 s on a loaded 2-core machine): the same CLI path, make test-e2e's
@pytest.mark.parametrize("workload", ["appo", pytest.param("dqn", marks=pytest.mark.e2e)])
def test_cli_sim_janus_best(workload):
    result = run("sim", "--policy", "janus-best", "--workload", workload, "--iterations", "3", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["policy"].startswith("janus-best=janus-") and out["audit"]["violations"] == 0


def test_cli_policies_list():
    listing = run("policies", "list").stdout
    assert "janus-<placement>-<co|nco>-<so|nso>-g<g>" in listing and "60 fixed configurations" in listing
    assert "janus-gpu-co-so-g4" not in listing and "janus-best" in listing
    full = run("policies", "list", "--all").stdout
    assert sum(line.startswith("janus-") and "-g" in line.split()[0] for line in full.splitlines()) == 60
