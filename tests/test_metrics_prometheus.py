"""The plane's counters, read back from Prometheus as Ray's stack serves them.

``tests/test_metrics_export.py`` checks what the plane actor hands to ``ray.util.metrics``. Whether
those series reach Prometheus is Ray's metrics agent's job, and the agent comes with ``ray[default]``
(the dashboard's dependencies: ``aiohttp``, ``opencensus``, ``prometheus_client``, ...), which this
project does not install. Where those are importable, this test starts a Ray instance with a known
``metrics_export_port``, runs a plane actor that publishes every 0.2 s, and scrapes the agent's
``/metrics`` endpoint until the plane's counters appear with the plane's own values. Elsewhere it is
skipped, saying so. (It is ``e2e``: the agent takes tens of seconds to start on a small machine.)

    pip install 'ray[default]==2.60.0' && pytest -m e2e tests/test_metrics_prometheus.py
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import tempfile
import time
import urllib.request

import numpy as np
import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"  # before any Ray process starts

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'conduit-rl[rllib]')")

AGENT_DEPS = ("aiohttp", "opencensus", "prometheus_client", "grpc")
MISSING = [m for m in AGENT_DEPS if importlib.util.find_spec(m) is None]

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(bool(MISSING), reason=f"Ray's metrics agent needs ray[default] (missing: {', '.join(MISSING)})"),
]

from conduit.contracts import Replay
from conduit.runtime.ray_plane import PlaneCluster

SCHEMA = {"obs": ((4,), "float32"), "act": "int64"}
CONTRACT = Replay(capacity=256, replay_ratio=1.0, min_size=16, error_buffer=1e9)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def _value(text: str, name: str, **tags: str) -> float | None:
    """The sample of series ``name`` (Ray may prefix ``ray_``) whose labels include ``tags``."""
    for line in text.splitlines():
        m = re.match(r"^(?:ray_)?(\w+)\{(.*)\}\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if all(labels.get(k) == v for k, v in tags.items()):
            return float(m.group(3))
    return None


def test_prometheus_serves_the_planes_counters(no_ray):  # its own Ray: a metrics export port
    port = _free_port()
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="cdtprom"),
             object_store_memory=128 << 20, log_to_driver=False, _metrics_export_port=port)
    try:
        cluster = PlaneCluster.start(SCHEMA, CONTRACT, batch_steps=8, learners={"l": "local"},
                                     capacities={"pageable": "4 MiB", "nvme": "4 MiB", "pinned": 0}, export_interval_s=0.2)
        try:
            rng = np.random.default_rng(0)
            for _ in range(6):
                cluster.ingest({"obs": rng.standard_normal((16, 4)).astype(np.float32),
                                "act": rng.integers(0, 3, 16)}, policy_version=0)
            for _ in range(4):
                cluster.next_batch(timeout=30)
            node = cluster.nodes[0]
            plane = cluster.metrics()[node]
            deadline, text, got = time.monotonic() + 180, "", None
            while time.monotonic() < deadline:
                try:
                    text = _scrape(port)
                except OSError:
                    text = ""
                got = _value(text, "conduit_plane_ingested_chunks_total", node_id=node, contract="replay")
                if got == plane["ingested_chunks"]:
                    break
                time.sleep(1.0)
            assert got == plane["ingested_chunks"] == 6, text[-2000:]
            assert _value(text, "conduit_plane_delivered_samples_total", node_id=node) == plane["delivered_samples"] == 32
            assert _value(text, "conduit_audit_violations", node_id=node, kind="all") == 0
        finally:
            assert cluster.shutdown()["violations"] == 0
    finally:
        ray.shutdown()
