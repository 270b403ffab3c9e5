"""Fixtures shared by the test modules: one local Ray for the session's Ray tests.

Starting and stopping Ray costs 5-15 s on a loaded 2-core machine; the RLlib and runtime modules used
to start one each. ``local_ray`` starts one the first time a test asks for it and keeps it for the
tests after (it is shut down at the end of the session). It stays only while it is clean: after each
test every CPU must be free again (no leaked actor or EnvRunner holding one), or it is shut down and
the next test gets a fresh one.

Tests that start a Ray of their own (a ``ray.cluster_utils.Cluster``, a metrics export port, a
calibration that starts and stops its own) or that need no Ray in this process ask for ``no_ray``;
tests that kill Ray processes ask for ``fresh_ray``, a Ray of their module's own.
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
