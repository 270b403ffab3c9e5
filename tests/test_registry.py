"""Policy registry: built-ins by name, plug-ins through the ``conduit.policies`` entry-point group."""

import inspect
import subprocess
import sys
import textwrap

import pytest

from conduit.errors import ConduitError, UnknownNameError
from conduit.policy import ChunkInfo, Placement, PlacementPolicy, Policy, SchedulingPolicy
from conduit.registry import PolicyEntry, PolicyRegistry, create_policy, policy_registry
from conduit.topology import load_topology
from conduit.view import LearnerState, static_view_of


def test_builtins_are_listed_with_roles():
    rows = {r["name"]: r for r in policy_registry().describe()}
    assert rows["host-only"]["role"] == "policy"
    assert rows["all-gpu"]["origin"] == "built-in"
    assert rows["edf-prefetch"]["role"] == "scheduling"
    assert rows["tier-preference"]["role"] == "placement"


def test_create_by_name_and_object_pass_through():
    policy = create_policy("all-gpu", depth=3)
    assert isinstance(policy, Policy)
    assert isinstance(policy.placement, PlacementPolicy)
    assert isinstance(policy.scheduling, SchedulingPolicy)
    assert policy.params == {"depth": 3}
    assert create_policy(policy) is policy


def test_unknown_name_and_bad_parameters_are_clear():
    with pytest.raises(UnknownNameError, match="unknown policy 'nope'.*known: .*all-gpu"):
        create_policy("nope")
    with pytest.raises(ConduitError, match="policy 'all-gpu': bad parameters"):
        create_policy("all-gpu", dept=3)
    with pytest.raises(ConduitError, match="a complete policy is needed"):
        create_policy("edf-prefetch")


def test_name_clash_is_refused():
    registry = PolicyRegistry()
    registry.register(PolicyEntry("x", "policy", lambda: None))
    with pytest.raises(ConduitError, match="taken"):
        registry.register(PolicyEntry("x", "policy", lambda: 1, origin="plugin:other"))


def test_entry_point_plugins_are_discovered(tmp_path, monkeypatch):
    """A real installed-distribution layout (dist-info + entry_points.txt) on sys.path."""
    pkg = tmp_path / "demo_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        from conduit.policies import host_only

        def make():
            \"\"\"A plug-in policy for the registry test.\"\"\"
            policy = host_only()
            policy.name = "demo-plugin"
            return policy

        def broken():
            raise RuntimeError("boom")
    """))
    dist = tmp_path / "demo_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[conduit.policies]\ndemo-plugin = demo_plugin:make\nbroken-plugin = demo_plugin:broken\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = PolicyRegistry()
    rows = {r["name"]: r for r in registry.describe()}
    assert rows["demo-plugin"]["origin"] == "plugin:demo-plugin"
    assert rows["demo-plugin"]["role"] == "policy"
    assert rows["broken-plugin"]["origin"] == "broken" and "boom" in rows["broken-plugin"]["summary"]
    assert registry.create("demo-plugin").name == "demo-plugin"
    with pytest.raises(ConduitError, match="failed to load"):
        registry.create("broken-plugin")
    sys.modules.pop("demo_plugin", None)


def test_tier_preference_places_on_consumer_gpu_and_falls_back(tmp_path):
    topo = load_topology("dgx-h100")
    gpu3 = "gpu3"
    view = static_view_of(topo, learner_states={"L3": LearnerState("L3", gpu3, "node0", None, 0.1, 0)})
    policy = create_policy("all-gpu")
    chunk = ChunkInfo("c1", "node0", "gpu0", 1e6, 0, consumer="L3")
    assert policy.placement.place(chunk, view) == Placement("gpu3:hbm")
    full = static_view_of(topo, used={t.id: t.capacity for t in topo.tiers_of("hbm")},
                          learner_states=view.learner_states)
    assert full.tiers[policy.placement.place(chunk, full).tier].kind.value == "pinned"


def test_the_registry_machinery_imports_no_policy():
    """``conduit.registration`` (entries, registry, plug-ins) knows no policy; ``conduit.registry``
    adds the built-ins, which ``conduit.policies`` registers without importing ``conduit.registry``."""
    code = ("import sys, conduit.registration; a = sorted(m for m in sys.modules if m.startswith('conduit.polic')); "
            "import conduit.policies; b = 'conduit.registry' in sys.modules; print(a, b)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] False"


def test_entry_keywords_come_from_the_factory_signature():
    from conduit.registration import factory_keywords

    assert policy_registry().entry("all-gpu").keywords() == {"depth": 2}
    assert policy_registry().entry("rllib-stock").keywords() == {}
    assert factory_keywords(lambda **kw: None) is None  # takes any keyword
    assert factory_keywords(lambda a, *, b=1, **kw: None) is None
    assert factory_keywords(lambda a, *args, b=1: None) == {"a": inspect.Parameter.empty, "b": 1}
