"""The plane's counters through ``ray.util.metrics`` (conduit/runtime/export.py).

* :func:`export_values` maps a real plane's metrics and audit to the exported series, with the values
  the plane reports, names Ray accepts and the documented tags.
* Inside a real plane actor the exporter publishes on its cadence (not per chunk) into Ray's own
  ``Counter``/``Gauge`` objects, which Ray accepted (a discarded metric records nothing), and what it
  published equals the plane's counters.

Reading the values back from Prometheus needs Ray's metrics agent, which comes with ``ray[default]``
(the dashboard); this project installs ``ray[rllib]`` only, so the test reads what was handed to the
metric objects in the actor.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"  # before any Ray process starts

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'conduit-rl[rllib]')")

from conduit.contracts import Replay
from conduit.runtime.export import COUNTERS, GAUGES, export_values
from conduit.runtime.plane import ExperiencePlane
from conduit.runtime.ray_plane import PlaneCluster

SCHEMA = {"obs": ((4,), "float32"), "act": "int64"}
CAPS = {"pageable": "4 MiB", "nvme": "4 MiB", "pinned": 0}
CONTRACT = Replay(capacity=256, replay_ratio=1.0, min_size=16, error_buffer=1e9)  # no throttling here


def _chunk(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {"obs": rng.standard_normal((16, 4)).astype(np.float32), "act": rng.integers(0, 3, 16)}


def test_export_values_are_the_planes_figures():
    from ray.util.metrics import _is_invalid_metric_name  # Ray's own rule: an invalid name is discarded

    with ExperiencePlane(SCHEMA, CONTRACT, batch_steps=8, capacities=CAPS) as plane:
        for i in range(4):
            plane.ingest(_chunk(i), policy_version=0)
        for _ in range(3):
            plane.next_batch(timeout=5).release()
        metrics, audit = plane.metrics(), plane.audit().to_dict()
    counters, gauges = export_values(metrics, audit, node_id="n1", contract="replay")
    tags = (("contract", "replay"), ("node_id", "n1"))
    assert counters[("conduit_plane_ingested_chunks_total", tags)] == 4 == metrics["ingested_chunks"]
    assert counters[("conduit_plane_delivered_samples_total", tags)] == 24
    assert gauges[("conduit_plane_updates", tags)] == metrics["updates"] == 3
    assert gauges[("conduit_audit_violations", (*tags[:1], ("kind", "all"), tags[1]))] == 0
    assert gauges[("conduit_audit_samples", (*tags, ("what", "ingested")))] == 64
    used = {dict(t)["tier"]: v for (n, t), v in gauges.items() if n == "conduit_tier_used_bytes"}
    assert used == {tid: d["used"] for tid, d in metrics["tiers"].items()}
    names = {n for n, _ in [*counters, *gauges]}
    assert not [n for n in names if _is_invalid_metric_name(n)]
    assert {f"conduit_plane_{k}_total" for k in COUNTERS} & names and {f"conduit_plane_{k}" for k in GAUGES} & names


def test_the_plane_actor_publishes_on_a_cadence_into_ray_metrics(local_ray):
    cluster = PlaneCluster.start(SCHEMA, CONTRACT, batch_steps=8, learners={"l": "local"}, capacities=CAPS,
                                 export_interval_s=0.2)
    try:
        actor = cluster.actor(cluster.nodes[0])
        for i in range(6):
            cluster.ingest(_chunk(i), policy_version=0)
        for _ in range(4):
            cluster.next_batch(timeout=5)
        start = ray.get(actor.exported.remote())["publications"]
        deadline = time.monotonic() + 30
        while ray.get(actor.exported.remote())["publications"] < start + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        got = ray.get(actor.exported.remote())
        assert got["publications"] >= start + 2  # it publishes by itself, on its cadence
        plane = cluster.metrics()[cluster.nodes[0]]
        node = cluster.nodes[0]
        key = f"contract=replay,node_id={node}"
        assert got["series"]["conduit_plane_ingested_chunks_total"][key] == plane["ingested_chunks"] == 6
        assert got["series"]["conduit_plane_delivered_samples_total"][key] == plane["delivered_samples"] == 32
        assert got["series"]["conduit_audit_violations"][f"contract=replay,kind=all,node_id={node}"] == 0
        meta = got["metrics"]
        assert meta["conduit_plane_ingested_chunks_total"]["type"] == "Counter"
        assert meta["conduit_tier_used_bytes"] == {"type": "Gauge", "tag_keys": ["node_id", "contract", "tier"],
                                                  "recording": True}
        assert all(m["recording"] for m in meta.values())  # Ray accepted every metric (none discarded)
        # a counter is published as what it grew by: more ingests, same running total as the plane's
        cluster.ingest(_chunk(99), policy_version=0)
        got = ray.get(actor.exported.remote(True))
        assert got["series"]["conduit_plane_ingested_chunks_total"][key] == 7
    finally:
        assert cluster.shutdown()["violations"] == 0


def test_export_can_be_turned_off(local_ray):
    cluster = PlaneCluster.start(SCHEMA, CONTRACT, batch_steps=8, learners={"l": "local"}, capacities=CAPS,
                                 export_interval_s=0)
    try:
        assert ray.get(cluster.actor(cluster.nodes[0]).exported.remote()) is None
    finally:
        cluster.shutdown()
