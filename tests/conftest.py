"""Fixtures shared by the test modules: one local Ray for the session's Ray tests.

Starting and stopping Ray costs 5-15 s on a loaded 2-core machine; the RLlib and runtime modules used
to start one each. ``local_ray`` starts one the first time a test asks for it and keeps it for the
tests after (it is shut down at the end of the session). It stays only while it is clean: after each
test every CPU must be free again (no leaked actor or EnvRunner holding one), or it is shut down and
the next test gets a fresh one.

Tests that start a Ray of their own (a ``ray.cluster_utils.Cluster``, a metrics export port, a
calibration that starts and stops its own) or that need no Ray in this process ask for ``no_ray``;
tests that kill Ray processes ask for ``fresh_ray``, a Ray of their module's own.

Every stop of the shared Ray costs a start (5-15 s) to the next ``local_ray`` test, so the session runs
its modules in this order (each module's tests stay together; the rest keeps its order): the modules
without Ray; those whose Ray tests all share ``local_ray``; those that mix it with a Ray of their own
(their ``local_ray`` tests first); then those that only start their own (``no_ray``/``fresh_ray``).
Alphabetical order stopped and restarted the shared Ray three times more.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # before any Ray process starts

#: The one local Ray: 2 CPUs (the machine's), no dashboard, a short temp dir of its own.
RAY_TMP = "/tmp/cdtshared"
RAY_OPTIONS = {"num_cpus": 2, "include_dashboard": False, "object_store_memory": 256 << 20,
               "log_to_driver": False, "_temp_dir": RAY_TMP}


def _ray():
    return pytest.importorskip("ray", reason="Ray is not installed (pip install 'conduit-rl[rllib]')")


def _shut_down() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def _cpus_free(ray, wait_s: float = 10.0) -> bool:
    """Whether every CPU of the cluster is free again (resource reports lag: waits up to ``wait_s``)."""
    total = ray.cluster_resources().get("CPU", 0)
    deadline = time.monotonic() + wait_s
    while True:
        if ray.available_resources().get("CPU", 0) >= total:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


@pytest.fixture(scope="session")
def _ray_session_end():
    yield
    _shut_down()


@pytest.fixture
def local_ray(_ray_session_end):
    """A local Ray shared with the session's other Ray tests (started if not running); yields ``ray``."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(**RAY_OPTIONS)
    yield ray
    if ray.is_initialized() and not _cpus_free(ray):
        ray.shutdown()  # something still holds a CPU: the next test starts a clean Ray


@pytest.fixture
def no_ray():
    """No Ray initialised in this process (the shared one is shut down; the next ``local_ray`` restarts it)."""
    _shut_down()
    yield
    _shut_down()


@pytest.fixture(scope="module")
def fresh_ray(_ray_session_end):
    """A Ray of the module's own, for tests that kill Ray processes: started fresh, shut down after the module."""
    ray = _ray()
    _shut_down()
    ray.init(**RAY_OPTIONS)
    try:
        yield ray
    finally:
        ray.shutdown()


_OWN_RAY = {"no_ray", "fresh_ray"}


def _ray_group(names: set[str]) -> int:
    """Where a module runs: 0 no Ray, 1 only the shared Ray, 2 shared and its own, 3 only its own."""
    shared, own = "local_ray" in names, bool(names & _OWN_RAY)
    return 0 if not (shared or own) else 1 if not own else 2 if shared else 3


def pytest_collection_modifyitems(config, items):
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    group = {m: _ray_group({n for i in its for n in i.fixturenames}) for m, its in modules.items()}
    ordered = []
    for m in sorted(modules, key=lambda m: group[m]):  # stable: the collection order within a group
        its = modules[m]
        if group[m] == 2:  # its shared-Ray tests first, before one of its own stops the shared Ray
            its = sorted(its, key=lambda i: "local_ray" not in i.fixturenames)
        ordered.extend(its)
    items[:] = ordered
