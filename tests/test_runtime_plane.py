"""The in-process experience plane: real bytes through real tiers, contracts enforced and audited.

Property tests drive schemas (dtypes, per-step shapes), chunk sizes, versions and interleavings;
every test checks the same invariants: each sample delivered as the contract says (exactly once
under OnPolicy), the bytes delivered equal the bytes ingested, tier occupancy equals what the view
reports, and the auditor counts zero violations.
"""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spawn_producers import make_chunk, ring_producer

from conduit.chunk import checksum_bytes
from conduit.contracts import BoundedStaleness, OnPolicy, Replay
from conduit.errors import CapacityError, ConduitError, PlaneFullError, SchemaError, UnknownNameError
from conduit.registry import create_policy, policy_registry
from conduit.runtime.machine import LEFT_OUT
from conduit.runtime.plane import DeliveryTimeout, ExperiencePlane
from conduit.runtime.schema import Schema
from conduit.tuning_file import save_params

SMALL = {"pageable": "8 MiB", "nvme": "8 MiB", "pinned": 0}
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = ["uint8", "int16", "int32", "int64", "float16", "float32", "float64", "bool"]




schemas = st.lists(
    st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(1, 5), max_size=2)),
    min_size=1, max_size=4,
).map(lambda cols: Schema.of({f"c{i}": (tuple(shape), dt) for i, (dt, shape) in enumerate(cols)}))


def check_rows(batch, sources) -> None:
    """Every row of the batch equals the sample its selection names."""
    row = 0
    for cid, idx in batch.selections:
        idx = np.asarray(list(idx) if isinstance(idx, range) else idx)
        for name, col in batch.columns.items():
            np.testing.assert_array_equal(col[row : row + len(idx)], sources[cid][name][idx])
        row += len(idx)
    assert row == batch.steps


def assert_accounting(plane: ExperiencePlane) -> None:
    """The view reports what the allocators hold."""
    for tid, tier in plane.tiers.items():
        state = plane.view.tiers[tid]
        assert state.used == tier.used == tier.allocator.used
        assert state.capacity == tier.capacity
        assert 0 <= tier.used <= tier.capacity


# --------------------------------------------------------------------------------------- OnPolicy


@SETTINGS
@given(schema=schemas, data=st.data())
def test_on_policy_round_trip_exactly_once_bytes_identical(schema, data):
    batch = data.draw(st.integers(4, 40), label="batch_steps")
    versions = data.draw(st.integers(1, 3), label="versions")
    depth = data.draw(st.integers(0, 3), label="prefetch_depth")
    policy = data.draw(st.sampled_from(["conduit", "host-only", "all-gpu"]), label="policy")
    seen: dict = {}
    sources: dict = {}
    with ExperiencePlane(schema, OnPolicy(), batch_steps=batch, policy=policy, capacities=SMALL,
                         prefetch_depth=depth, verify_checksums=True) as plane:
        for v in range(versions):
            sizes = []
            while sum(sizes) < batch:  # whole chunks; the last may overshoot (surplus is dropped, counted)
                sizes.append(data.draw(st.integers(1, batch), label="chunk_steps"))
            for i, n in enumerate(sizes):
                payload = make_chunk(schema, n, seed=v * 1000 + i)
                cid = plane.ingest(payload, policy_version=v, chunk_id=(v, i))
                sources[cid] = payload
            b = plane.next_batch(timeout=10)
            assert b.update == v and b.steps == batch
            assert set(b.versions) == {v}
            check_rows(b, sources)
            for s in b.sample_ids():
                assert s not in seen, f"sample {s} delivered twice"
                seen[s] = v
            assert_accounting(plane)
            b.release()
            plane.set_policy_version(v + 1)
        report = plane.audit()
        assert report.violations == 0, report.examples
        m = plane.metrics()
        assert m["delivered_samples"] == batch * versions
        assert m.get("dropped_surplus_samples", 0) == report.ingested_samples - batch * versions
    final = plane.auditor.report()
    assert final.violations == 0, final.examples
    assert final.delivered_samples + sum(final.dropped_samples.values()) == final.ingested_samples


def test_on_policy_checksums_verified_and_tensors_zero_copy():
    schema = Schema.of({"obs": ((8, 8), "uint8"), "reward": "float32"})
    with ExperiencePlane(schema, OnPolicy(), batch_steps=32, capacities=SMALL, verify_checksums=True) as plane:
        for i in range(4):
            plane.ingest(make_chunk(schema, 8, i), policy_version=0)
        with plane.next_batch(timeout=5) as b:
            t = b.tensors()
            assert isinstance(t["obs"], torch.Tensor) and t["obs"].shape == (32, 8, 8)
            assert t["obs"].data_ptr() == b.columns["obs"].ctypes.data  # a view, not a copy
        report = plane.audit()
        assert report.checksums_verified == 4 and report.violations == 0


def test_on_policy_stale_chunks_dropped_and_counted():
    schema = Schema.of({"x": "float32"})
    with ExperiencePlane(schema, OnPolicy(), batch_steps=10, capacities=SMALL) as plane:
        plane.ingest(make_chunk(schema, 10, 0), policy_version=0)
        with plane.next_batch(timeout=5) as b:
            assert b.update == 0
        plane.set_policy_version(1)
        plane.ingest(make_chunk(schema, 10, 1), policy_version=0)  # a straggler of version 0
        plane.ingest(make_chunk(schema, 10, 2), policy_version=1)
        with plane.next_batch(timeout=5) as b:
            assert b.update == 1 and set(b.versions) == {1}
        report = plane.audit()
        assert report.violations == 0 and report.dropped_samples == {"stale": 10}


def test_multiple_learners_share_chunks_round_robin():
    schema = Schema.of({"x": ((3,), "int32")})
    sources = {}
    with ExperiencePlane(schema, OnPolicy(), batch_steps=20, learners=["a", "b"], capacities=SMALL) as plane:
        for i in range(8):
            payload = make_chunk(schema, 5, i)
            sources[plane.ingest(payload, policy_version=0, timeout=5)] = payload
        got = []
        for lid in ("a", "b"):
            with plane.next_batch(lid, timeout=5) as b:
                check_rows(b, sources)
                got += b.sample_ids()
        assert len(got) == len(set(got)) == 40
        assert plane.audit().violations == 0


def test_prefetched_batch_is_ready_before_the_learner_asks():
    schema = Schema.of({"x": ((1024,), "float32")})
    with ExperiencePlane(schema, OnPolicy(), batch_steps=64, capacities=SMALL, prefetch_depth=2) as plane:
        for v in range(2):
            for i in range(4):
                plane.ingest(make_chunk(schema, 16, v * 10 + i), policy_version=v)
        deadline = time.time() + 5  # both batches assembled ahead of need (in place, or by moves)
        while len(plane._learners["learner0"].ready) < 2 and time.time() < deadline:
            time.sleep(0.01)
        assert len(plane._learners["learner0"].ready) == 2
        for v in range(2):
            with plane.next_batch(timeout=5) as b:
                assert b.update == v
            plane.set_policy_version(v + 1)
        assert plane.last_exposed < 0.05  # handed over at once: it was assembled while we slept
        assert plane.audit().violations == 0


# ------------------------------------------------------------------------------- BoundedStaleness


@SETTINGS
@given(data=st.data())
def test_bounded_staleness_never_delivers_too_old_and_counts_drops(data):
    """Takes wait until the batch can be assembled (the test knows when 8 fresh rows are pending), so
    batches are really delivered; the final round always delivers. Staleness drops are counted the
    same in the audit and the metrics, and every ingested sample is delivered, dropped or pending."""
    max_lag = data.draw(st.integers(0, 2), label="max_lag")
    schema = Schema.of({"x": ((2,), "float32"), "v": "int64"})
    contract = BoundedStaleness(max_lag=max_lag, max_reuse=1)
    with ExperiencePlane(schema, contract, batch_steps=8, capacities=SMALL, prefetch_depth=1) as plane:
        delivered = []

        def take(timeout: float) -> bool:
            try:
                b = plane.next_batch(timeout=timeout)
            except DeliveryTimeout:
                return False
            assert b.steps == 8
            assert (b.columns["v"] >= b.update - max_lag).all()
            delivered.extend(b.sample_ids())
            b.release()
            return True

        for step in range(data.draw(st.integers(1, 12), label="steps")):
            action = data.draw(st.sampled_from(["ingest", "ingest", "bump", "take"]), label="action")
            if action == "ingest":
                n = data.draw(st.integers(1, 8), label="n")
                lag = data.draw(st.integers(0, 3), label="lag")
                v = max(0, plane.policy_version - lag)
                payload = make_chunk(schema, n, step)
                payload["v"][:] = v
                plane.ingest(payload, policy_version=v)
            elif action == "bump":
                plane.set_policy_version(plane.policy_version + 1)
            else:
                take(0.05)
        # 16 fresh rows: whatever the batch in the making holds, one whole batch of them is delivered
        for i in range(2):
            payload = make_chunk(schema, 8, 1000 + i)
            payload["v"][:] = plane.policy_version
            plane.ingest(payload, policy_version=plane.policy_version)
        assert take(5.0), "16 fresh rows pending, yet no batch within 5 s"
        assert len(delivered) >= 8
        assert len(delivered) == len(set(delivered))
        report = plane.audit()
        assert report.violations == 0, report.examples
        assert report.deliveries == len(delivered) // 8
        stale = report.dropped_samples.get("stale", 0)
        assert plane.metrics().get("dropped_stale_samples", 0) == stale
        assert plane.engine.wait_idle(5)
        pending = sum(c.remaining for q in plane._learners.values() for c in q.pending)
        in_batches = sum(len(idx) for q in plane._learners.values() for b in [*q.builds.values(), *q.ready]
                         for _, idx in b.selections)
        assert report.ingested_samples == len(delivered) + stale + pending + in_batches


# ------------------------------------------------------------------------------------------ Replay


@SETTINGS
@given(data=st.data())
def test_replay_samples_only_live_samples_within_the_rate_band(data):
    capacity = data.draw(st.integers(50, 200), label="capacity")
    ratio = data.draw(st.sampled_from([0.5, 1.0, 4.0]), label="ratio")
    contract = Replay(capacity=capacity, replay_ratio=ratio, min_size=32)
    schema = Schema.of({"obs": ((4,), "float32")})
    with ExperiencePlane(schema, contract, batch_steps=16, capacities=SMALL, seed=1) as plane:
        sources = {}
        for i in range(data.draw(st.integers(5, 30), label="rounds")):
            payload = make_chunk(schema, 8, i)
            try:
                sources[plane.ingest(payload, policy_version=i, timeout=0.01)] = payload
            except PlaneFullError:
                pass  # the rate limiter wants samples first
            for _ in range(data.draw(st.integers(0, 3), label="samples")):
                try:
                    b = plane.next_batch(timeout=0.01)
                except DeliveryTimeout:
                    break
                check_rows(b, sources)
                live = set(plane._table)
                assert {cid for cid, _ in b.selections} <= live
                b.release()
            assert plane._table_steps <= capacity  # exactly: nothing in flight between calls
            assert plane._inserted == plane.audit().ingested_samples
            assert_accounting(plane)
        report = plane.audit()
        assert report.violations == 0, report.examples


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(1, 40), min_size=2, max_size=30), seed=st.integers(0, 2**16))
def test_replay_samples_every_live_step_uniformly(sizes, seed):
    """Chunk sizes vary, yet every step in the table is drawn with the same probability (chi-square)."""
    from scipy.stats import chisquare

    schema = Schema.of({"obs": ((2,), "float32")})
    total = sum(sizes)
    contract = Replay(capacity=total, replay_ratio=1.0, min_size=1, error_buffer=1e12)  # no rate limiting
    counts: dict[tuple, int] = {}
    with ExperiencePlane(schema, contract, batch_steps=16, capacities=SMALL, seed=seed) as plane:
        sources = {}
        for i, n in enumerate(sizes):
            payload = make_chunk(schema, n, i)
            sources[plane.ingest(payload, policy_version=0, timeout=5)] = payload
        draws = max(2000, 20 * total)
        for _ in range(draws // 16):
            b = plane.next_batch(timeout=1)
            check_rows(b, sources)
            for cid, idx in b.selections:
                for r in np.asarray(idx):
                    counts[(cid, int(r))] = counts.get((cid, int(r)), 0) + 1
            b.release()
        assert plane.audit().violations == 0
    observed = [counts.get((cid, r), 0) for cid, payload in sources.items() for r in range(len(payload["obs"]))]
    assert sum(observed) == (draws // 16) * 16  # no draw outside the table
    assert chisquare(observed).pvalue > 1e-6


# ------------------------------------------------------------------------------------------ Spill


def test_capacity_pressure_spills_to_disk_and_back_nothing_lost():
    schema = Schema.of({"obs": ((64, 64), "uint8")})  # 4 KiB per step
    sources = {}
    caps = {"pageable": 600 << 10, "nvme": "16 MiB", "pinned": 0}  # room for the batch and a few chunks only
    with ExperiencePlane(schema, OnPolicy(), batch_steps=64, capacities=caps, policy="conduit",
                         prefetch_depth=1, verify_checksums=True) as plane:
        for v in range(3):
            for i in range(8):
                payload = make_chunk(schema, 8, v * 100 + i)
                sources[plane.ingest(payload, policy_version=v, timeout=5)] = payload
        assert plane.tiers["nvme0:nvme"].used > 0  # versions 1 and 2 wait on disk
        got = []
        for v in range(3):
            with plane.next_batch(timeout=10) as b:
                check_rows(b, sources)
                got += b.sample_ids()
            plane.set_policy_version(v + 1)
            assert_accounting(plane)
        m = plane.metrics()
        assert m["spilled_chunks"] + m.get("fallback_placements", 0) > 0
        assert len(got) == len(set(got)) == 3 * 64
        report = plane.audit()
        assert report.violations == 0 and report.checksums_verified == 24
        assert all(t.used == 0 for t in plane.tiers.values())


# ------------------------------------------------------------------------------- bad input, faults


def test_schema_mismatch_is_refused_whole():
    schema = Schema.of({"obs": ((4,), "float32"), "act": "int64"})
    with ExperiencePlane(schema, OnPolicy(), batch_steps=8, capacities=SMALL) as plane:
        good = make_chunk(schema, 4, 0)
        cases = [
            ({"obs": good["obs"]}, "missing column"),
            ({**good, "extra": good["act"]}, "unknown column"),
            ({**good, "obs": good["obs"].astype(np.float64)}, "column 'obs': dtype float64"),
            ({**good, "obs": good["obs"][:, :3]}, "column 'obs': shape"),
            ({**good, "act": good["act"][:3]}, "has 3 steps"),
        ]
        for payload, message in cases:
            with pytest.raises(SchemaError, match=message):
                plane.ingest(payload, policy_version=0, chunk_id="bad")
        assert all(t.used == 0 for t in plane.tiers.values())
        assert plane.audit().ingested_chunks == 0


def test_chunk_larger_than_any_tier_is_refused_at_once():
    schema = Schema.of({"x": ((1024,), "uint8")})
    with ExperiencePlane(schema, OnPolicy(), batch_steps=8, capacities={"pageable": "1 MiB", "nvme": "1 MiB", "pinned": 0}) as plane:
        with pytest.raises(CapacityError, match="more than any tier"):
            plane.ingest(make_chunk(schema, 2048, 0), policy_version=0, chunk_id="huge")
        assert plane.audit().ingested_chunks == 0


def test_full_plane_applies_backpressure_with_a_timeout():
    schema = Schema.of({"x": ((1024,), "uint8")})
    caps = {"pageable": 64 << 10, "nvme": 64 << 10, "pinned": 0}
    with ExperiencePlane(schema, OnPolicy(), batch_steps=32, capacities=caps, prefetch_depth=1) as plane:
        for i in range(200):  # versions the learner is not at yet: nothing can drain
            try:
                plane.ingest(make_chunk(schema, 16, i), policy_version=5, timeout=0.2)
            except PlaneFullError as exc:
                assert "not ingested" in str(exc)
                break
        else:
            pytest.fail("the plane never pushed back")
        report = plane.audit()
        assert report.ingested_chunks == i and not report.dropped_samples  # the refused one left no trace
        assert report.violations == 0
        assert plane.metrics()["refused_full"] == 1
        assert all(t.used <= t.capacity for t in plane.tiers.values())


@given(nvme_key=st.sampled_from(["nvme", "nvme0:nvme"]), chunk_steps=st.integers(4, 24))
@settings(max_examples=10, deadline=None)
def test_a_zero_nvme_capacity_leaves_the_spill_tier_out_and_pushes_back_instead(nvme_key, chunk_steps):
    """``{"nvme": 0}``: no spill file; a full host tier refuses (nothing spilled, nothing lost), and the
    tier is reported as left out, not silently missing."""
    schema = Schema.of({"x": ((1024,), "uint8")})
    with ExperiencePlane(schema, OnPolicy(), batch_steps=32, capacities={"pageable": 64 << 10, nvme_key: 0, "pinned": 0},
                         prefetch_depth=1) as plane:
        assert not any(t.endswith(":nvme") for t in plane.tiers)
        assert plane.metrics()["unavailable_tiers"]["nvme0:nvme"] == LEFT_OUT
        accepted = 0
        with pytest.raises(PlaneFullError):
            for i in range(1000):  # a version the learner is not at yet: nothing drains
                plane.ingest(make_chunk(schema, chunk_steps, i), policy_version=5, timeout=0.05)
                accepted += 1
        report = plane.audit()
        assert accepted > 0 and report.ingested_chunks == accepted and not report.dropped_samples
        assert report.violations == 0 and plane.metrics().get("spilled_chunks", 0) == 0


def test_a_zero_pinned_capacity_leaves_the_staging_ring_out():
    with ExperiencePlane({"x": "float32"}, OnPolicy(), batch_steps=8, capacities={"pinned": 0, "pageable": "8 MiB"}) as plane:
        assert "dram0:pinned" not in plane.tiers
        why = plane.metrics()["unavailable_tiers"]["dram0:pinned"]
        assert why == LEFT_OUT if torch.cuda.is_available() else "CUDA" in why


@pytest.mark.parametrize("caps, match", [
    ({"pageable": 0}, r"capacities\['pageable'\]: must be > 0 bytes"),
    ({"dram0:pageable": "0 B"}, r"capacities\['dram0:pageable'\]: must be > 0 bytes"),
    ({"hbm": 0}, r"capacities\['hbm'\]: must be > 0 bytes"),
    ({"nvme": -1}, r"capacities\['nvme'\]: must be >= 0 bytes \(0 leaves the tier out\)"),
    ({"pinned": "-4 MiB"}, r"capacities\['pinned'\]"),
])
def test_a_capacity_that_cannot_be_is_refused_naming_its_key(caps, match):
    with pytest.raises(ConduitError, match=match):
        ExperiencePlane({"x": "float32"}, OnPolicy(), batch_steps=8, capacities=caps, learners={"l": "cpu"})


def test_recovery_without_the_nvme_tier_is_refused(tmp_path):
    """A restart takes chunks back from the NVMe spill file; leaving it out with recovery asked for
    would silently keep nothing, so it is refused, and nothing is left open."""
    with pytest.raises(ConduitError, match=r"recovery_dir=.*leaves nvme0:nvme out"):
        ExperiencePlane({"x": "float32"}, OnPolicy(), batch_steps=8, capacities={"nvme": 0}, recovery_dir=tmp_path)


def test_unknown_names_are_clear_errors():
    schema = {"x": "float32"}
    with pytest.raises(UnknownNameError, match="unknown tier 'gpu7:hbm'"):
        ExperiencePlane(schema, OnPolicy(), batch_steps=8, capacities={"gpu7:hbm": 1 << 20})
    with pytest.raises(UnknownNameError, match="unknown policy 'no-such-policy'"):
        ExperiencePlane(schema, OnPolicy(), batch_steps=8, policy="no-such-policy")
    with ExperiencePlane(schema, OnPolicy(), batch_steps=8, capacities=SMALL) as plane:
        with pytest.raises(UnknownNameError, match="unknown learner 'nobody'"):
            plane.next_batch("nobody")
        plane.ingest({"x": np.zeros(4, np.float32)}, policy_version=0, chunk_id="a")
        with pytest.raises(ConduitError, match="already in the plane"):
            plane.ingest({"x": np.zeros(4, np.float32)}, policy_version=0, chunk_id="a")
    with pytest.raises(ConduitError, match="learner device 'tpu'"):
        ExperiencePlane(schema, OnPolicy(), batch_steps=8, learners={"l": "tpu"}, capacities=SMALL)


def test_delivery_timeout_names_what_is_missing():
    with ExperiencePlane({"x": "float32"}, OnPolicy(), batch_steps=8, capacities=SMALL) as plane:
        plane.ingest({"x": np.zeros(3, np.float32)}, policy_version=0)
        with pytest.raises(DeliveryTimeout, match=r"update 0: 3 of 8 rows assembled"):
            plane.next_batch(timeout=0.1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA report; CUDA present")
def test_pinned_memory_is_reported_unavailable_without_cuda():
    with ExperiencePlane({"x": "float32"}, OnPolicy(), batch_steps=8, capacities=SMALL) as plane:
        assert not any(t.endswith(":pinned") for t in plane.tiers)
        assert "CUDA" in plane.metrics()["unavailable_tiers"]["dram0:pinned"]
    with pytest.raises(ConduitError, match="cuda:0"):
        ExperiencePlane({"x": "float32"}, OnPolicy(), batch_steps=8, learners={"l": "cuda:0"}, capacities=SMALL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: device batches, pinned staging ring")
def test_cuda_learner_gets_device_batches_through_the_pinned_ring():
    schema = Schema.of({"obs": ((16, 16), "uint8"), "r": "float32"})
    sources = {}
    caps = {"pageable": "8 MiB", "nvme": "8 MiB", "hbm": "8 MiB", "pinned": "4 MiB"}
    with ExperiencePlane(schema, OnPolicy(), batch_steps=32, learners={"l": "cuda:0"}, capacities=caps,
                         verify_checksums=True) as plane:
        for i in range(4):
            payload = make_chunk(schema, 8, i)
            sources[plane.ingest(payload, policy_version=0, timeout=5)] = payload
        with plane.next_batch(timeout=10) as b:
            assert b.columns["obs"].is_cuda
            host = {k: v.cpu().numpy() for k, v in b.columns.items()}
            row = 0
            for cid, idx in b.selections:
                for k in host:
                    np.testing.assert_array_equal(host[k][row : row + len(idx)], sources[cid][k][np.asarray(idx)])
                row += len(idx)
        assert plane.audit().violations == 0


# ---------------------------------------------------------------- same policies as the simulator


def test_every_registered_policy_runs_on_the_runtime():
    schema = Schema.of({"x": ((16,), "float32")})
    names = [n for n in policy_registry().names("policy") if not n.startswith("janus-")]
    assert {"conduit", "rllib-stock", "host-only", "all-gpu", "janus", "nvme-hot-set"} <= set(names)
    for name in names:
        if create_policy(name).path.route == "driver":
            continue  # refused: see test_a_driver_route_policy_is_refused_naming_the_field
        with ExperiencePlane(schema, OnPolicy(), batch_steps=16, policy=name, capacities=SMALL) as plane:
            for i in range(4):
                plane.ingest(make_chunk(schema, 4, i), policy_version=0)
            with plane.next_batch(timeout=5) as b:
                assert b.steps == 16
            assert plane.audit().violations == 0, name


def test_a_driver_route_policy_is_refused_naming_the_field():
    """The runtime plane is the direct route; stock RLlib's driver route is only modelled by the
    simulator, so a policy asking for it is refused at construction, naming the path setting."""
    with pytest.raises(ConduitError, match=r"'rllib-stock': path setting route='driver'"):
        ExperiencePlane({"x": "float32"}, OnPolicy(), batch_steps=8, policy="rllib-stock", capacities=SMALL)


def test_tuned_parameter_files_load_as_in_the_simulator(tmp_path):
    path = save_params(tmp_path / "conduit.json", "conduit", {"headroom": 0.2, "target_chunk_bytes": 4e6})
    with ExperiencePlane({"x": "float32"}, OnPolicy(), batch_steps=8, policy="conduit", params_file=path,
                         capacities=SMALL) as plane:
        assert plane.policy.params["headroom"] == 0.2
        assert plane.policy.placement.headroom == 0.2
    other = save_params(tmp_path / "janus.json", "janus", {})
    with pytest.raises(ConduitError, match="tuned for 'janus', used with 'conduit'"):
        ExperiencePlane({"x": "float32"}, OnPolicy(), batch_steps=8, policy="conduit", params_file=other)


def test_view_carries_live_bandwidth_estimates():
    schema = Schema.of({"x": ((4096,), "uint8")})
    with ExperiencePlane(schema, OnPolicy(), batch_steps=64, capacities=SMALL) as plane:
        for i in range(8):
            plane.ingest(make_chunk(schema, 8, i), policy_version=0)
        with plane.next_batch(timeout=5):
            pass
        est = plane.metrics()["bandwidth"]
        assert any(v["samples"] > 0 for v in est.values())
        assert plane.view.path("dram0", "dram0").bandwidth > 0


def test_checksum_helper_matches_plane_layout():
    schema = Schema.of({"b": ((3,), "int16"), "a": "float64"})
    payload = make_chunk(schema, 5, 0)
    buf = np.zeros(schema.extent_bytes(5), np.uint8)
    views = schema.views(buf, 5)
    for k, v in payload.items():
        views[k][:] = v
    assert checksum_bytes(views) == checksum_bytes(payload)


# ------------------------------------------------------------------ producers in other processes

# the children run spawn_producers.ring_producer: a module they import in about 1 s (this one takes ~15 s)
SPAWN = __import__("multiprocessing").get_context("spawn")


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, data=st.data())
def test_producer_processes_round_trip_exactly_once(schema, data):
    producers = 3
    sizes = [data.draw(st.lists(st.integers(1, 24), min_size=2, max_size=8), label=f"sizes{p}")
             for p in range(producers)]
    total = sum(map(sum, sizes))
    with ExperiencePlane(schema, OnPolicy(), batch_steps=total, capacities=SMALL, verify_checksums=True) as plane:
        procs = []
        for p in range(producers):
            spec = plane.attach_producer(f"p{p}", ring_bytes=64 << 10)
            proc = SPAWN.Process(target=ring_producer, args=(spec, schema.to_dict(), p, sizes[p], 0, None))
            proc.start()
            procs.append(proc)
        with plane.next_batch(timeout=60) as b:
            assert b.steps == total
            sources = {(p, i): make_chunk(schema, n, p * 1000 + i) for p in range(producers)
                       for i, n in enumerate(sizes[p])}
            check_rows(b, sources)
            ids = b.sample_ids()
            assert len(ids) == len(set(ids)) == total
        for proc in procs:
            proc.join(timeout=30)
            assert proc.exitcode == 0
        report = plane.audit()
        assert report.violations == 0, report.examples
        assert report.checksums_verified == sum(len(s) for s in sizes)


def test_producer_dying_mid_chunk_loses_nothing_committed():
    schema = Schema.of({"obs": ((16,), "float32"), "act": "int64"})
    with ExperiencePlane(schema, OnPolicy(), batch_steps=40, capacities=SMALL, verify_checksums=True) as plane:
        healthy = plane.attach_producer("healthy", ring_bytes=64 << 10)
        doomed = plane.attach_producer("doomed", ring_bytes=64 << 10)
        procs = [SPAWN.Process(target=ring_producer, args=(healthy, schema.to_dict(), 1, [10, 10], 0, None)),
                 SPAWN.Process(target=ring_producer, args=(doomed, schema.to_dict(), 2, [10, 10, 10], 0, 2))]
        for proc in procs:
            proc.start()
        with plane.next_batch(timeout=60) as b:  # 2 healthy + 2 committed by the doomed one
            sources = {(p, i): make_chunk(schema, 10, p * 1000 + i) for p in (1, 2) for i in range(3)}
            check_rows(b, sources)
        for proc in procs:
            proc.join(timeout=30)
        assert procs[1].exitcode == 1
        deadline = time.time() + 10
        while plane.metrics().get("partial_chunks_discarded", 0) < 1 and time.time() < deadline:
            time.sleep(0.02)
        m = plane.metrics()
        assert m["partial_chunks_discarded"] == 1
        assert m["rings"]["doomed"]["discarded_partial"] == 1
        report = plane.audit()
        assert report.violations == 0 and report.ingested_chunks == 4 and report.checksums_verified == 4


# ------------------------------------------------------------------ the audit must be the truth (issue 12)
#
# Deterministic regressions: copies are held at a gate (the transfer engine's methods, wrapped) so a
# race happens in a known order, then the test asserts the exact counters, the audit, the bytes, and
# that no memory leaked.

SLOTS_SCHEMA = Schema.of({"obs": ((4,), "float32"), "act": "int64"})  # 1-4 steps: one 128 B extent


def rows(n: int, value: float, schema: Schema = SLOTS_SCHEMA) -> dict[str, np.ndarray]:
    out = {}
    for c in schema.columns:
        out[c.name] = np.full((n, *c.shape), value, c.dtype)
    return out


class Gate:
    """Holds matching copies of a plane's transfer engine until :meth:`open` (``fail``: then raise)."""

    def __init__(self, plane: ExperiencePlane, *, producer: bool = False, moves: int = 0, samples: bool = False,
                 fail: BaseException | None = None):
        self.opened, self.entered, self.finished = threading.Event(), threading.Event(), threading.Event()
        self.fail = fail
        engine = plane.engine
        run_now, submit = engine.run_now, engine.submit
        held_moves = []

        def hold(work):
            def held():
                self.entered.set()
                assert self.opened.wait(10), "gate never opened"
                if self.fail is not None:
                    raise self.fail
                return work()
            return held

        def gated_run_now(route, work, cuda=False):
            if (producer and route[0] == "producer") or (samples and route[0] != "producer"):
                try:
                    return run_now(route, hold(work), cuda)
                finally:
                    self.finished.set()
            return run_now(route, work, cuda)

        def gated_submit(job):
            if len(held_moves) < moves:
                held_moves.append(job)
                done = job.done

                def finished(err):
                    try:
                        done(err)
                    finally:
                        self.finished.set()

                job.work, job.done = hold(job.work), finished
            submit(job)

        engine.run_now, engine.submit = gated_run_now, gated_submit

    def open(self) -> None:
        self.opened.set()


def start(fn, *args, **kwargs) -> tuple[threading.Thread, list]:
    """Run ``fn`` in a thread; the list gets ``("ok", value)`` or ``("raised", exc)``."""
    out: list = []

    def run():
        try:
            out.append(("ok", fn(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(("raised", exc))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def no_violations(report) -> None:
    assert report.violations == 0 and not any(report.by_kind.values()), report.examples


def all_free(plane: ExperiencePlane) -> bool:
    return all(t.used == 0 for t in plane.tiers.values())


# 1. events reach the auditor when they happen; a refused ingest leaves no trace

REFUSAL_COUNTERS = {"refused_full", "rejected_decisions", "batch_alloc_waits", "backpressure_waits"}


def test_refused_ingest_leaves_no_trace_and_the_retry_with_its_id_is_clean():
    tiny = {"pageable": 4 * 128, "nvme": 64, "pinned": 0}  # four extents: a batch and three chunks
    with ExperiencePlane(SLOTS_SCHEMA, OnPolicy(), batch_steps=4, policy="host-only", capacities=tiny,
                         prefetch_depth=1) as plane:
        plane.ingest(rows(4, 0), policy_version=0, chunk_id="a")  # batch 0, written in place
        for i in range(3):
            plane.ingest(rows(4, 1), policy_version=1, chunk_id=f"b{i}")  # wait for update 1
        assert plane.engine.wait_idle(5)
        before, counters, used = plane.audit(), dict(plane.metrics_.counters), plane.tiers["dram0:pageable"].used
        for _ in range(3):  # refused, three times, with the same id
            with pytest.raises(PlaneFullError, match="not ingested"):
                plane.ingest(rows(2, 7), policy_version=1, chunk_id="late", timeout=0)
        after = plane.audit()
        assert after == before  # not one auditor event
        changed = {k for k, v in plane.metrics_.counters.items() if counters.get(k) != v}
        assert changed <= REFUSAL_COUNTERS and plane.metrics_.counters["refused_full"] == 3
        assert plane.tiers["dram0:pageable"].used == used and "late" not in plane.ledger
        with plane.next_batch(timeout=5) as b:
            assert b.sample_ids() == [("a", i) for i in range(4)]
        plane.set_policy_version(1)
        assert plane.engine.wait_idle(5)  # batch 1 took "b0": its extent is free
        plane.ingest(rows(2, 7), policy_version=1, chunk_id="late", timeout=0)  # the retry is a first ingest
        report = plane.audit()
        no_violations(report)
        assert report.ingested_chunks == 5 and report.ingested_samples == 18
        with plane.next_batch(timeout=5) as b:
            assert b.update == 1
    final = plane.close()
    no_violations(final)
    assert all_free(plane)


def test_on_policy_chunk_arriving_after_its_update_was_consumed_is_dropped_stale_not_lost():
    """Its copy runs while the learner releases update 0: the plane drops it as stale, and so must the
    audit say (it used to hear of the chunk at admission and count it lost when update 0 closed)."""
    with ExperiencePlane(SLOTS_SCHEMA, OnPolicy(), batch_steps=4, capacities=SMALL, prefetch_depth=1) as plane:
        plane.ingest(rows(4, 0), policy_version=0, chunk_id="a")
        b = plane.next_batch(timeout=5)
        gate = Gate(plane, producer=True)
        t, out = start(plane.ingest, rows(4, 9), policy_version=0, chunk_id="late", timeout=5)
        assert gate.entered.wait(5)
        b.release()  # update 0 is consumed while "late" is still being copied
        gate.open()
        t.join(5)
        assert out == [("ok", "late")]
        assert plane.engine.wait_idle(5)
        report = plane.audit()
        no_violations(report)
        assert report.dropped_samples == {"stale": 4} and report.ingested_chunks == 2
        assert plane.metrics()["dropped_stale_samples"] == 4
    final = plane.close()
    no_violations(final)
    assert final.dropped_samples == {"stale": 4}


def test_two_producers_with_one_chunk_id_at_once_only_one_gets_in():
    with ExperiencePlane(SLOTS_SCHEMA, OnPolicy(), batch_steps=4, capacities=SMALL) as plane:
        gate = Gate(plane, producer=True)
        t, out = start(plane.ingest, rows(4, 1), policy_version=0, chunk_id="x", timeout=5)
        assert gate.entered.wait(5)  # the first is copying: the id is taken already
        with pytest.raises(ConduitError, match="already in the plane"):
            plane.ingest(rows(4, 2), policy_version=0, chunk_id="x", timeout=0)
        gate.open()
        t.join(5)
        assert out == [("ok", "x")]
        with plane.next_batch(timeout=5) as b:
            assert b.columns["obs"].tobytes() == rows(4, 1)["obs"].tobytes()
        report = plane.audit()
        no_violations(report)
        assert report.ingested_chunks == 1 and report.delivered_samples == 4


def test_a_failed_ingestion_copy_gives_its_rows_back_and_the_retry_fills_them():
    """The failing copy reserved rows 2-4 of the open batch, and another chunk rows 4-6 after it:
    the rows come back as a hole, the retry fills them, the batch is in row order."""
    with ExperiencePlane(SLOTS_SCHEMA, OnPolicy(), batch_steps=6, capacities=SMALL, prefetch_depth=1) as plane:
        plane.ingest(rows(2, 0), policy_version=0, chunk_id="a")
        gate = Gate(plane, producer=True, fail=OSError("copy failed"))
        t, out = start(plane.ingest, rows(2, 1), policy_version=0, chunk_id="b", timeout=5)
        assert gate.entered.wait(5)
        with pytest.raises(ConduitError, match="already in the plane"):  # its id is still reserved
            plane.ingest(rows(2, 5), policy_version=0, chunk_id="b", timeout=0)
        gate.fail = None
        plane.engine.run_now = type(plane.engine).run_now.__get__(plane.engine)  # later copies run normally
        plane.ingest(rows(2, 2), policy_version=0, chunk_id="c")  # rows 4-6, behind the copy in flight
        gate.fail = OSError("copy failed")
        gate.open()
        t.join(5)
        assert out[0][0] == "raised" and isinstance(out[0][1], OSError)
        report = plane.audit()
        no_violations(report)
        assert report.ingested_chunks == 2 and not report.dropped_samples  # "b" left no trace
        m = plane.metrics()
        assert m["failed_ingests"] == 1 and "copy failed" in m["last_ingest_error"]
        build = next(iter(plane._learners["learner0"].builds.values()))
        assert build.holes == [(2, 2)] and build.free_rows == 2
        plane.ingest(rows(2, 1), policy_version=0, chunk_id="b")  # the retry fills the hole
        with plane.next_batch(timeout=5) as b:
            assert [cid for cid, _ in b.selections] == ["a", "b", "c"]
            assert b.columns["obs"][:, 0].tolist() == [0, 0, 1, 1, 2, 2]
        no_violations(plane.audit())
    assert all_free(plane)


@pytest.mark.parametrize("kind", ["on_policy", "replay"])
def test_a_failed_ingestion_copy_leaves_no_trace(kind, monkeypatch):
    contract = OnPolicy() if kind == "on_policy" else Replay(capacity=64, replay_ratio=1.0, min_size=4,
                                                           error_buffer=1e9)
    with ExperiencePlane(SLOTS_SCHEMA, contract, batch_steps=4, capacities=SMALL, prefetch_depth=0,
                         policy="host-only") as plane:
        plane.ingest(rows(2, 0), policy_version=0, chunk_id="a")
        before, used = plane.audit(), {t.id: t.used for t in plane.tiers.values()}
        counters = (plane._inserted, plane._inserting, plane._table_steps)
        run_now = plane.engine.run_now

        def broken(route, work, cuda=False):
            if route[0] == "producer":
                raise RuntimeError("DMA engine on fire")
            return run_now(route, work, cuda)

        monkeypatch.setattr(plane.engine, "run_now", broken)
        with pytest.raises(RuntimeError, match="on fire"):
            plane.ingest(rows(2, 1), policy_version=0, chunk_id="b")
        assert plane.audit() == before and {t.id: t.used for t in plane.tiers.values()} == used
        assert (plane._inserted, plane._inserting, plane._table_steps) == counters
        assert plane.metrics()["failed_ingests"] == 1 and "b" not in plane.ledger
        monkeypatch.setattr(plane.engine, "run_now", run_now)
        plane.ingest(rows(2, 1), policy_version=0, chunk_id="b")
        with plane.next_batch(timeout=5) as b:
            assert {cid for cid, _ in b.selections} <= {"a", "b"}
        report = plane.audit()
        no_violations(report)
        assert report.ingested_chunks == 2
    assert all_free(plane)


def test_ring_producer_held_back_by_a_full_plane_gets_no_false_violations():
    """The ring thread retries a chunk the full plane refused every second, with the same id: each
    retry is a first ingest (no ``duplicated``, no ``evicted_then_sampled``)."""
    from conduit.runtime.shm_ring import RingProducer

    tiny = {"pageable": 4 * 128, "nvme": 64, "pinned": 0}
    with ExperiencePlane(SLOTS_SCHEMA, OnPolicy(), batch_steps=4, policy="host-only", capacities=tiny,
                         prefetch_depth=1) as plane:
        spec = plane.attach_producer("p", ring_bytes=64 << 10)
        with RingProducer(spec) as producer:
            for i in range(5):  # batch 0 takes one, the plane holds three more; the fifth waits in the ring
                producer.write(rows(4, i), chunk_id=("p", i), policy_version=0)
            deadline = time.time() + 10
            while plane.metrics().get("refused_full", 0) < 2 and time.time() < deadline:
                time.sleep(0.05)
            assert plane.metrics()["refused_full"] >= 2  # refused, retried, refused
            no_violations(plane.audit())
            assert plane.audit().ingested_chunks == 4
            with plane.next_batch(timeout=5) as b:
                assert b.sample_ids() == [(("p", 0), i) for i in range(4)]
            deadline = time.time() + 10
            while plane.audit().ingested_chunks < 5 and time.time() < deadline:
                time.sleep(0.05)
        report = plane.audit()
        no_violations(report)
        # released update 0 drops the three waiting as surplus; the fifth gets in after: stale
        assert report.ingested_chunks == 5 and report.dropped_samples == {"surplus": 12, "stale": 4}
        assert "ring_rejected_chunks" not in plane.metrics()


# 4. Replay counters are rolled back on every failure path

def test_replay_refused_inserts_reserve_no_room_in_the_table():
    """A tier with room for three chunks, a table for sixteen: every later insert is refused for room,
    and the refusals never pile up as reserved table room (which used to evict the live chunks)."""
    contract = Replay(capacity=16, replay_ratio=1.0, min_size=4, error_buffer=1e9)
    with ExperiencePlane(SLOTS_SCHEMA, contract, batch_steps=4, policy="host-only",
                         capacities={"pageable": 3 * 128, "nvme": 64, "pinned": 0}) as plane:
        for i in range(3):
            plane.ingest(rows(4, i), policy_version=0, chunk_id=f"c{i}")
        for i in range(10):
            with pytest.raises(PlaneFullError, match="had no room within"):
                plane.ingest(rows(4, 9), policy_version=0, chunk_id=f"r{i}", timeout=0)
        assert (plane._inserted, plane._inserting, plane._table_steps) == (12, 0, 12)
        assert list(plane._table) == ["c0", "c1", "c2"] and "evicted_chunks" not in plane.metrics()
        report = plane.audit()
        no_violations(report)
        assert report.ingested_samples == 12
        # no room for a batch either: the sample waits its timeout, then says why (it used to hang)
        t0 = time.monotonic()
        with pytest.raises(DeliveryTimeout, match="no room for a batch"):
            plane.next_batch(timeout=0.2)
        assert time.monotonic() - t0 < 2
        assert plane._sampled == 0 and not plane._learners["learner0"].model.waiting
    assert all_free(plane)


def test_replay_insert_interrupted_by_close_gives_its_reservation_back():
    contract = Replay(capacity=16, replay_ratio=1.0, min_size=4, error_buffer=1e9)
    plane = ExperiencePlane(SLOTS_SCHEMA, contract, batch_steps=4, capacities=SMALL)
    plane.ingest(rows(4, 0), policy_version=0, chunk_id="a")
    gate = Gate(plane, producer=True)
    t, out = start(plane.ingest, rows(4, 1), policy_version=0, chunk_id="b", timeout=5)
    assert gate.entered.wait(5)
    assert (plane._inserting, plane._table_steps) == (4, 8)
    closer, closed = start(plane.close)
    time.sleep(0.2)
    assert closer.is_alive()  # close() waits for the copy before it frees any memory
    gate.open()
    closer.join(5)
    t.join(5)
    assert out[0][0] == "raised" and "closed" in str(out[0][1])
    final = closed[0][1]
    no_violations(final)
    assert final.ingested_chunks == 1 and (plane._inserting, plane._table_steps) == (0, 4)
    assert all_free(plane)


# 5. every blocking call honours its timeout and close(); bad timeouts are clear errors

@pytest.mark.parametrize("bad", [float("nan"), -1, float("inf"), "1s", True])
def test_bad_timeouts_are_refused_at_once_naming_the_argument(bad):
    with pytest.raises(ConduitError, match="ingest_timeout"):
        ExperiencePlane(SLOTS_SCHEMA, OnPolicy(), batch_steps=4, capacities=SMALL, ingest_timeout=bad)
    for contract in (OnPolicy(), Replay(capacity=16, replay_ratio=1.0, min_size=4)):
        with ExperiencePlane(SLOTS_SCHEMA, contract, batch_steps=4, capacities=SMALL) as plane:
            calls = [lambda: plane.ingest(rows(2, 0), policy_version=0, chunk_id="x", timeout=bad),
                     lambda: plane.next_batch(timeout=bad),
                     lambda: next(plane.batches(timeout=bad))]
            if isinstance(contract, OnPolicy):
                calls.append(lambda: plane.peek(timeout=bad))
            for call in calls:
                t, out = start(call)
                t.join(5)
                assert not t.is_alive(), "a bad timeout blocked"
                assert out[0][0] == "raised" and isinstance(out[0][1], ConduitError), out
                assert "timeout" in str(out[0][1])
            assert plane.audit().ingested_chunks == 0
            plane.ingest(rows(2, 0), policy_version=0, chunk_id="x", timeout=0)  # the id was never taken


@pytest.mark.parametrize("call", ["next_batch", "peek", "replay", "replay-room", "ingest", "replay-ingest"])
def test_close_wakes_every_blocked_call(call):
    replay = Replay(capacity=16, replay_ratio=1.0, min_size=8)
    contract = replay if call.startswith("replay") else OnPolicy()
    caps = {"pageable": 3 * 128, "nvme": 64, "pinned": 0} if call in ("ingest", "replay-room") else SMALL
    plane = ExperiencePlane(SLOTS_SCHEMA, contract, batch_steps=4, capacities=caps, policy="host-only",
                            prefetch_depth=1)
    if call == "next_batch":
        fn = lambda: plane.next_batch(timeout=None)
    elif call == "peek":
        fn = lambda: plane.peek(start=0, timeout=None)
    elif call == "replay":  # the rate limiter: nothing inserted yet
        fn = lambda: plane.next_batch(timeout=None)
    elif call == "replay-room":  # the rate limiter allows it, the tier has no room for the batch
        for i in range(3):
            plane.ingest(rows(4, i), policy_version=0, chunk_id=i)
        fn = lambda: plane.next_batch(timeout=None)
    else:  # "ingest": a version the learner is not at, nothing drains; "replay-ingest": the limiter
        for i in range(10):  # wants samples before more inserts
            try:
                plane.ingest(rows(4, i), policy_version=3, chunk_id=i, timeout=0)
            except PlaneFullError:
                break
        else:
            pytest.fail("the plane never filled")
        fn = lambda: plane.ingest(rows(4, 9), policy_version=3, chunk_id="w", timeout=None)
    t, out = start(fn)
    time.sleep(0.3)
    assert t.is_alive(), out
    final = plane.close()
    t.join(5)
    assert not t.is_alive(), "close() did not wake the blocked call"
    assert out[0][0] == "raised" and isinstance(out[0][1], ConduitError) and "closed" in str(out[0][1]), out
    no_violations(final)
    assert all_free(plane)


# 6. memory is freed only when nothing copies into or out of it

def test_skip_ahead_never_frees_a_batch_a_copy_still_writes_into():
    """Update 0's batch is discarded (the learner skips to 1) while its copy is held; batch 1 would
    reuse its memory. The late copy must land nowhere: batch 1 keeps its bytes, the audit knows."""
    schema = Schema.of({"x": ((256,), "float32")})
    ones, zeros = {"x": np.ones((8, 256), np.float32)}, {"x": np.zeros((8, 256), np.float32)}
    with ExperiencePlane(schema, OnPolicy(), batch_steps=8, policy="host-only", capacities=SMALL,
                         prefetch_depth=0) as plane:
        gate = Gate(plane, moves=1)
        plane.ingest(zeros, policy_version=0, chunk_id="old")
        with pytest.raises(DeliveryTimeout):  # opens batch 0 and starts the move, held at the gate
            plane.next_batch(update=0, timeout=0.2)
        assert gate.entered.wait(5)
        build0 = plane._learners["learner0"].builds[0]
        plane.ingest(ones, policy_version=1, chunk_id="new")
        b = plane.next_batch(update=1, timeout=5)  # skips update 0
        assert build0.dead == "stale" and not build0.freed  # discarded, its memory still held
        assert b._build.extent.offset != build0.extent.offset
        delivered = b.columns["x"].tobytes()
        assert delivered == ones["x"].tobytes()
        gate.open()
        assert gate.finished.wait(5)
        assert plane.engine.wait_idle(5)
        assert b.columns["x"].tobytes() == delivered  # the stale copy did not land in batch 1
        assert build0.freed and not plane._learners["learner0"].ready  # released, never made ready
        b.release()
        report = plane.audit()
        no_violations(report)
        assert report.dropped_samples == {"stale": 8} and report.delivered_samples == 8
        assert plane.metrics()["dropped_stale_samples"] == 8
    assert all_free(plane)


def test_skip_ahead_while_an_ingest_writes_into_the_discarded_batch():
    """The chunk's one copy goes straight into batch 0, which the learner discards meanwhile: the
    chunk is ingested and dropped stale with its batch, when its copy lands."""
    with ExperiencePlane(SLOTS_SCHEMA, OnPolicy(), batch_steps=4, capacities=SMALL, prefetch_depth=1) as plane:
        plane.ingest(rows(2, 0), policy_version=0, chunk_id="a")  # opens batch 0
        gate = Gate(plane, producer=True)
        t, out = start(plane.ingest, rows(2, 1), policy_version=0, chunk_id="b", timeout=5)
        assert gate.entered.wait(5)
        gate_free = plane.engine.run_now
        plane.engine.run_now = type(plane.engine).run_now.__get__(plane.engine)
        plane.ingest(rows(4, 2), policy_version=1, chunk_id="c")
        b = plane.next_batch(update=1, timeout=5)
        plane.engine.run_now = gate_free
        gate.open()
        t.join(5)
        assert out == [("ok", "b")]
        assert b.columns["obs"][:, 0].tolist() == [2, 2, 2, 2]
        b.release()
        assert plane.engine.wait_idle(5)
        report = plane.audit()
        no_violations(report)
        assert report.dropped_samples == {"stale": 4} and report.ingested_chunks == 3
    final = plane.close()
    no_violations(final)
    assert all_free(plane)


def test_a_table_chunk_is_not_evicted_while_a_sample_copy_reads_it():
    contract = Replay(capacity=4, replay_ratio=1.0, min_size=4, error_buffer=1e9)
    with ExperiencePlane(SLOTS_SCHEMA, contract, batch_steps=4, capacities=SMALL, seed=0) as plane:
        plane.ingest(rows(4, 1), policy_version=0, chunk_id="a")
        gate = Gate(plane, samples=True)
        t, out = start(plane.next_batch, timeout=5)
        assert gate.entered.wait(5)
        with pytest.raises(PlaneFullError, match="oldest chunk may be in use"):  # "a" is being read
            plane.ingest(rows(4, 2), policy_version=0, chunk_id="b", timeout=0.2)
        assert list(plane._table) == ["a"] and plane._table_steps == 4
        gate.open()
        t.join(5)
        batch = out[0][1]
        assert batch.columns["obs"].tobytes() == rows(4, 1)["obs"].tobytes()
        plane.ingest(rows(4, 2), policy_version=0, chunk_id="b", timeout=1)  # now "a" goes
        assert list(plane._table) == ["b"]
        assert batch.columns["obs"].tobytes() == rows(4, 1)["obs"].tobytes()
        batch.release()
        no_violations(plane.audit())
    assert all_free(plane)


def test_close_waits_for_copies_in_flight_before_freeing_memory():
    with ExperiencePlane(SLOTS_SCHEMA, OnPolicy(), batch_steps=4, policy="all-gpu", capacities=SMALL,
                         prefetch_depth=0) as plane:
        gate = Gate(plane, moves=1)
        plane.ingest(rows(3, 0), policy_version=0, chunk_id="a")  # no batch until the learner asks
        with pytest.raises(DeliveryTimeout):  # opens batch 0 and starts the move, held at the gate
            plane.next_batch(timeout=0.2)
        assert gate.entered.wait(5)
        closer, closed = start(plane.close)
        time.sleep(0.3)
        assert closer.is_alive() and not all_free(plane)  # nothing freed under the copy
        gate.open()
        closer.join(10)
        assert not closer.is_alive()
        final = closed[0][1]
    no_violations(final)
    assert final.dropped_samples == {"shutdown": 3}
    assert all_free(plane)


# staleness while waiting, counted

def test_bounded_staleness_batch_that_went_stale_while_waiting_is_dropped_and_counted():
    with ExperiencePlane(SLOTS_SCHEMA, BoundedStaleness(max_lag=0), batch_steps=4, capacities=SMALL,
                         prefetch_depth=1) as plane:
        plane.ingest(rows(4, 0), policy_version=0, chunk_id="a")  # batch assembled ahead of need
        assert plane.engine.wait_idle(5)
        assert len(plane._learners["learner0"].ready) == 1
        plane.set_policy_version(1)  # the learner moved on before taking it
        with pytest.raises(DeliveryTimeout):
            plane.next_batch(timeout=0.2)
        report = plane.audit()
        no_violations(report)
        assert report.dropped_samples == {"stale": 4} and report.deliveries == 0
        assert plane.metrics()["dropped_stale_samples"] == 4
        plane.ingest(rows(4, 1), policy_version=1, chunk_id="b")
        with plane.next_batch(timeout=5) as b:
            assert b.sample_ids() == [("b", i) for i in range(4)]
        no_violations(plane.audit())


# failure paths at runtime

class _Wrapped:
    """A placement or scheduling policy that returns what ``decide`` says for one call."""

    def __init__(self, inner, **overrides):
        self._inner, self._overrides = inner, overrides
        self.name = f"broken-{inner.name}"

    def __getattr__(self, name):
        return self._overrides.get(name) or getattr(self._inner, name)


def _broken_policy(**placement_overrides):
    from conduit.policy import Policy
    from conduit.registry import create_policy

    base = create_policy("host-only")
    return Policy("broken", _Wrapped(base.placement, **placement_overrides), base.scheduling,
                  base.path)


def test_invalid_placement_decisions_are_rejected_counted_and_replaced():
    from conduit.policy import Move, Placement

    policy = _broken_policy(place=lambda chunk, view: Placement("nowhere:hbm"),
                            spill=lambda tier, nbytes, view: [Move("never-ingested", "nvme0:nvme"),
                                                              Move("c1", "nowhere:nvme")])
    caps = {"pageable": 4 * 128, "nvme": "1 MiB", "pinned": 0}
    with ExperiencePlane(SLOTS_SCHEMA, OnPolicy(), batch_steps=4, policy=policy, capacities=caps,
                         prefetch_depth=1) as plane:
        for i in range(4):  # version 1: batch 1 takes c0 in place, c1-c3 wait in the learner's tier
            plane.ingest(rows(4, i), policy_version=1, chunk_id=f"c{i}", timeout=0)
        for i in (4, 5):  # the tier is full: the policy's spills are refused, so the producer is held back
            with pytest.raises(PlaneFullError, match="not ingested"):
                plane.ingest(rows(4, i), policy_version=1, chunk_id=f"c{i}", timeout=0)
        m = plane.metrics()
        # the core's safe default (pinned, then pageable memory; here the learner's own tier) for every
        # placement; both moves of each spill refused; never a fallback the policy did not ask for
        assert m["rejections"]["by_reason"] == {"unknown-tier": 6 + 2, "not-resident": 2}
        assert m["rejected_decisions"] == 10 and "unknown destination" in m["last_rejection"]
        assert m.get("spilled_chunks", 0) == 0 and m["refused_full"] == 2
        assert plane.tiers["nvme0:nvme"].used == 0
        plane.set_policy_version(1)
        with plane.next_batch(update=1, timeout=5) as b:  # the safe defaults keep it working
            assert b.update == 1
        no_violations(plane.audit())
    assert all_free(plane)


def test_scheduling_policy_raising_an_invalid_decision_costs_time_not_data():
    from conduit.policies.components import TierPreference
    from conduit.policy import InvalidDecision, Policy
    from conduit.registry import create_policy
    from conduit.topology.model import TierKind

    base = create_policy("conduit")

    def plan(pending, view):
        raise InvalidDecision("broken", pending, "refuses to plan")

    # chunks on NVMe: off the learner's tier, so every move into a batch is the scheduler's to plan
    on_disk = TierPreference((TierKind.NVME,), name="nvme-first")
    policy = Policy("broken", on_disk, _Wrapped(base.scheduling, plan=plan), base.path)
    with ExperiencePlane(SLOTS_SCHEMA, OnPolicy(), batch_steps=4, policy=policy, capacities=SMALL,
                         prefetch_depth=0) as plane:
        plane.ingest(rows(2, 0), policy_version=0, chunk_id="a")
        plane.ingest(rows(2, 1), policy_version=0, chunk_id="b")
        with plane.next_batch(timeout=5) as b:  # a waiting learner gets its rows whatever the plan says
            assert sorted(b.sample_ids()) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
        m = plane.metrics()
        assert m["rejections"]["by_reason"] == {"refused-by-policy": m["rejected_decisions"]}
        assert m["rejected_decisions"] >= 1 and "refuses to plan" in m["last_rejection"]
        assert m["forced_moves"] == 2  # both chunks, moved because the learner was waiting
        no_violations(plane.audit())


def test_background_copy_failure_stops_the_plane_with_a_clear_error_and_leaks_nothing(monkeypatch):
    with ExperiencePlane(SLOTS_SCHEMA, OnPolicy(), batch_steps=4, policy="host-only", capacities=SMALL,
                         prefetch_depth=0) as plane:
        plane.ingest(rows(4, 0), policy_version=0, chunk_id="a")  # no batch yet: a move later
        gate = Gate(plane, moves=1, fail=OSError("bad page"))
        gate.open()
        with pytest.raises(ConduitError, match="stopped after a copy failed"):
            plane.next_batch(timeout=5)
        assert plane.metrics()["failed_copies"] == 1
        with pytest.raises(ConduitError, match="stopped after a copy failed"):
            plane.ingest(rows(1, 0), policy_version=0, chunk_id="b")
    final = plane.close()
    no_violations(final)
    assert final.dropped_samples == {"shutdown": 4}
    assert all_free(plane)


def test_a_broken_ring_and_a_refused_record_are_counted_and_the_plane_keeps_going():
    from conduit.runtime.shm_ring import RingProducer

    with ExperiencePlane(SLOTS_SCHEMA, OnPolicy(), batch_steps=4, capacities=SMALL) as plane:
        spec = plane.attach_producer("p", ring_bytes=64 << 10)
        ring = plane._rings[0]
        poll = ring.poll
        broken = [True]

        def flaky(timeout=0.0):
            if broken and broken.pop():
                raise OSError("ring header torn")
            return poll(timeout)

        ring.poll = flaky
        with RingProducer(spec) as producer:
            producer.write(rows(2, 0), chunk_id="a", policy_version=0)
            producer.write(rows(2, 1), chunk_id="a", policy_version=0)  # the same id again: refused
            producer.write(rows(2, 2), chunk_id="b", policy_version=0)
            with plane.next_batch(timeout=10) as b:
                assert b.sample_ids() == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
                assert b.columns["obs"][:, 0].tolist() == [0, 0, 2, 2]
        m = plane.metrics()
        assert m["ring_errors"] == 1 and m["ring_rejected_chunks"] == 1
        assert "already in the plane" in m["last_ring_error"]
        report = plane.audit()
        no_violations(report)
        assert report.ingested_chunks == 2
    assert all_free(plane)


# Replay: eviction under capacity, spills, determinism

RUNTIME_POLICIES = ["conduit", "all-gpu", "host-only", "janus", "janus-pageable-co-so-g1", "janus-gpu-nco-nso-g4"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_replay_evicts_to_capacity_exactly_and_spills_under_pressure(data):
    """Capacity smaller than what is inserted, the learner's tier about one batch: the table never holds
    more than ``capacity`` steps, samples come only from it, bytes are intact, a batch that finds the
    learner's tier full gets room by spilling (moves, counted), the audit is clean."""
    policy = data.draw(st.sampled_from(RUNTIME_POLICIES), label="policy")
    capacity = data.draw(st.integers(32, 96), label="capacity")
    schema = Schema.of({"obs": ((64,), "float32")})  # 256 B a step
    contract = Replay(capacity=capacity, replay_ratio=1.0, min_size=8, error_buffer=1e9)
    caps = {"pageable": data.draw(st.sampled_from([2 << 10, 3 << 10, 4 << 10]), label="pageable"),  # a batch: 2 KiB
            "nvme": "4 MiB", "pinned": 0}
    inserted, sources, target = 0, {}, capacity + data.draw(st.integers(1, 96), label="beyond capacity")
    with ExperiencePlane(schema, contract, batch_steps=8, policy=policy, capacities=caps, seed=1) as plane:
        for i in itertools.count():
            if inserted >= target:
                break
            n = data.draw(st.integers(1, 8), label="steps")
            payload = make_chunk(schema, n, i)
            sources[plane.ingest(payload, policy_version=0, timeout=5)] = payload
            inserted += n
            assert plane._table_steps <= capacity
            assert sum(c.meta.steps for c in plane._table.values()) == plane._table_steps
            if inserted >= contract.min_size and data.draw(st.booleans(), label="sample") or inserted >= target:
                learner_tier = plane._learners["learner0"].tier
                full = not learner_tier.fits(plane.batch_steps)
                spilled = plane.metrics().get("spilled_chunks", 0)
                with plane.next_batch(timeout=5) as b:
                    check_rows(b, sources)
                    assert {cid for cid, _ in b.selections} <= set(plane._table)
                if full:  # no room for the batch: table chunks were spilled to make it
                    assert plane.metrics()["spilled_chunks"] > spilled
            assert_accounting(plane)
        assert inserted > capacity
        m = plane.metrics()
        assert m["evicted_chunks"] > 0
        report = plane.audit()
        no_violations(report)
        assert report.ingested_samples == inserted
    assert all_free(plane)


def test_replay_spills_table_chunks_to_make_room_for_a_batch():
    """The table fills the learner's tier; a sample asks the placement policy to spill, as any batch does."""
    schema = Schema.of({"obs": ((64,), "float32")})
    contract = Replay(capacity=64, replay_ratio=1.0, min_size=8, error_buffer=1e9)
    with ExperiencePlane(schema, contract, batch_steps=8, policy="host-only", seed=0,
                         capacities={"pageable": 8 << 10, "nvme": "4 MiB", "pinned": 0}) as plane:
        for i in range(8):  # four fill the learner's tier, four go to disk
            plane.ingest(make_chunk(schema, 8, i), policy_version=0, timeout=1)
        with plane.next_batch(timeout=5):
            pass
        assert plane.metrics()["spilled_chunks"] > 0
        no_violations(plane.audit())


def test_replay_sampling_is_deterministic_for_a_seed():
    schema = Schema.of({"obs": ((2,), "float32")})
    contract = Replay(capacity=64, replay_ratio=1.0, min_size=8, error_buffer=1e9)

    def draws(seed: int) -> list[tuple]:
        out = []
        with ExperiencePlane(schema, contract, batch_steps=8, capacities=SMALL, seed=seed) as plane:
            for i, n in enumerate([3, 8, 5, 2, 7]):
                plane.ingest(make_chunk(schema, n, i), policy_version=0, chunk_id=i)
            for _ in range(6):
                with plane.next_batch(timeout=5) as b:
                    out += b.sample_ids()
        return out

    first = draws(7)
    assert draws(7) == first
    assert draws(8) != first


# ---------------------------------------------------------------- path settings, executed as in the simulator

STEP_SCHEMA = Schema.of({"x": ((128,), "uint8")})  # 128 B a step


def _path_policy(**path):
    """Chunks placed on NVMe (off a CPU learner's tier, so every move into a batch is a real move),
    deadline prefetch, and the given path settings."""
    from conduit.policies.components import EarliestDeadlineFirst, TierPreference
    from conduit.policy import PathSettings, Policy
    from conduit.topology.model import TierKind

    return Policy("path-probe", TierPreference((TierKind.NVME,), name="nvme-first"),
                  EarliestDeadlineFirst(depth=2), PathSettings(**path))


def _moved(plane: ExperiencePlane) -> tuple[int, int]:
    assert plane.engine.wait_idle(5)
    with plane._lock:
        return plane.metrics_.counters.get("moves", 0), plane.metrics_.counters.get("copy_jobs", 0)


@pytest.mark.parametrize("batch_build", ["per-chunk", "per-batch"])
def test_batch_build_per_batch_moves_a_batch_only_once_all_its_rows_arrived(batch_build):
    policy = _path_policy(batch_build=batch_build, prefetch_depth=1)
    with ExperiencePlane(STEP_SCHEMA, OnPolicy(), batch_steps=8, policy=policy, capacities=SMALL) as plane:
        for i in range(2):
            plane.ingest(make_chunk(STEP_SCHEMA, 2, i), policy_version=0, chunk_id=f"a{i}")
        # per-chunk: a CPU learner's chunks stream into its batch as they arrive (overlap_collection);
        # per-batch: nothing moves until the whole batch is there (the learner builds it at once)
        assert _moved(plane)[0] == (2 if batch_build == "per-chunk" else 0)
        for i in range(2, 4):
            plane.ingest(make_chunk(STEP_SCHEMA, 2, i), policy_version=0, chunk_id=f"a{i}")
        assert _moved(plane)[0] == 4
        with plane.next_batch(timeout=5) as b:
            assert sorted(cid for cid, _ in b.sample_ids()) == sorted(f"a{i}" for i in range(4) for _ in range(2))
        assert plane.metrics()["forced_moves"] == 0
        no_violations(plane.audit())


@pytest.mark.parametrize("overlap_update", [True, False])
def test_overlap_update_off_prepares_nothing_while_the_learner_holds_a_batch(overlap_update):
    policy = _path_policy(overlap_update=overlap_update, prefetch_depth=2)
    with ExperiencePlane(STEP_SCHEMA, OnPolicy(), batch_steps=4, policy=policy, capacities=SMALL) as plane:
        plane.ingest(make_chunk(STEP_SCHEMA, 4, 0), policy_version=0, chunk_id="v0")
        batch = plane.next_batch(timeout=5)  # update 0 runs
        before = _moved(plane)[0]
        plane.ingest(make_chunk(STEP_SCHEMA, 4, 1), policy_version=1, chunk_id="v1")
        during = _moved(plane)[0] - before
        assert during == (1 if overlap_update else 0)  # batch 1 prepared during update 0, or not
        batch.release()
        assert _moved(plane)[0] - before == 1  # after the update, always
        with plane.next_batch(update=1, timeout=5) as b:
            assert b.sample_ids() == [("v1", i) for i in range(4)]
        no_violations(plane.audit())


@pytest.mark.parametrize("granularity", [1, 3])
def test_granularity_coalesces_chunks_moved_together_into_one_copy_job(granularity):
    policy = _path_policy(granularity=granularity, prefetch_depth=0)  # nothing moves before the ask
    sources = {f"c{i}": make_chunk(STEP_SCHEMA, 1, i) for i in range(6)}
    with ExperiencePlane(STEP_SCHEMA, OnPolicy(), batch_steps=6, policy=policy, capacities=SMALL) as plane:
        for cid, payload in sources.items():
            plane.ingest(payload, policy_version=0, chunk_id=cid)
        assert _moved(plane) == (0, 0)
        with plane.next_batch(timeout=5) as b:  # the ask: all six move at once
            host = b.columns["x"]
            for row, (cid, idx) in enumerate(b.sample_ids()):
                assert np.asarray(host[row]).tobytes() == sources[cid]["x"][idx].tobytes()
        assert _moved(plane) == (6, 6 // granularity)
        no_violations(plane.audit())


@pytest.mark.parametrize(("path", "pieces"), [({}, 1), ({"split": 2}, 2), ({"target_chunk_bytes": 256.0}, 4)])
def test_split_moves_a_chunk_in_pieces_with_identical_bytes(path, pieces):
    policy = _path_policy(prefetch_depth=0, **path)
    payload = make_chunk(STEP_SCHEMA, 8, 7)  # 1 KiB
    with ExperiencePlane(STEP_SCHEMA, OnPolicy(), batch_steps=8, policy=policy, capacities=SMALL) as plane:
        plane.ingest(payload, policy_version=0, chunk_id="big")
        with plane.next_batch(timeout=5) as b:
            assert b.sample_ids() == [("big", i) for i in range(8)]
            assert np.asarray(b.columns["x"]).tobytes() == payload["x"].tobytes()
        assert _moved(plane) == (pieces, pieces)  # one copy per piece
        no_violations(plane.audit())


def test_chunk_info_carries_the_producers_node_and_payload_bytes():
    seen = []
    base = _path_policy()

    class Spy:
        name = "spy"

        def place(self, chunk, view):
            seen.append(chunk)
            return base.placement.place(chunk, view)

        def spill(self, tier, nbytes, view):
            return base.placement.spill(tier, nbytes, view)

    from conduit.policy import Policy

    with ExperiencePlane(STEP_SCHEMA, OnPolicy(), batch_steps=4, capacities=SMALL,
                         policy=Policy("spy", Spy(), base.scheduling, base.path)) as plane:
        plane.ingest(make_chunk(STEP_SCHEMA, 3, 0), policy_version=0, chunk_id="a")
        with pytest.raises(UnknownNameError, match="node"):
            plane.ingest(make_chunk(STEP_SCHEMA, 1, 0), policy_version=0, chunk_id="b", node="elsewhere")
        state = plane.view.learners["learner0"]
    assert [(c.chunk_id, c.node, c.device, c.nbytes, c.consumer) for c in seen] == [
        ("a", plane.node, "cpu0", 3 * 128, "learner0")]
    assert (state.device, state.tier) == ("cpu0", "dram0:pageable")  # the learner's compute device and tier


def test_chunk_ids_are_unique_while_the_auditor_remembers_them_and_stale_drops_are_folded():
    """A retired id is refused while the auditor still remembers it (rather than audited as a
    duplicate), accepted as a new chunk once both have forgotten it; chunks dropped stale on
    arrival retire at once, so neither the plane nor the auditor keeps them forever."""
    with ExperiencePlane(SLOTS_SCHEMA, OnPolicy(), batch_steps=4, policy="all-gpu", capacities=SMALL) as plane:
        plane.auditor.RETIRED_WINDOW = 3
        plane.ingest(rows(4, 0), policy_version=0, chunk_id="a")
        with plane.next_batch(timeout=5):
            pass  # update 0 trained: "a" leaves the plane
        with pytest.raises(ConduitError, match="'a': a chunk with this id is already in the plane"):
            plane.ingest(rows(4, 1), policy_version=1, chunk_id="a")
        for i in range(6):  # version 0 is trained: each is dropped stale on arrival, and retires
            plane.ingest(rows(2, 2), policy_version=0, chunk_id=f"late{i}")
        assert len(plane.auditor._chunks) <= 3 + 1  # the window, not every id ever seen
        plane.ingest(rows(4, 1), policy_version=1, chunk_id="a")  # forgotten by both: a new chunk
        with plane.next_batch(update=1, timeout=5) as b:
            assert b.sample_ids() == [("a", i) for i in range(4)]
        report = plane.audit()
        no_violations(report)
        assert report.dropped_samples == {"stale": 12} and report.ingested_chunks == 8
