"""The in-process experience plane: real bytes through real tiers, contracts enforced and audited.

Property tests drive schemas (dtypes, per-step shapes), chunk sizes, versions and interleavings;
every test checks the same invariants: each sample delivered as the contract says (exactly once
under OnPolicy), the bytes delivered equal the bytes ingested, tier occupancy equals what the view
reports, and the auditor counts zero violations.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.chunk import checksum_bytes
from conduit.contracts import BoundedStaleness, OnPolicy, Replay
from conduit.errors import CapacityError, ConduitError, PlaneFullError, SchemaError, UnknownNameError
from conduit.registry import policy_registry
from conduit.runtime.plane import DeliveryTimeout, ExperiencePlane
from conduit.runtime.schema import Schema
from conduit.tuning_file import save_params

SMALL = {"pageable": "8 MiB", "nvme": "8 MiB"}
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = ["uint8", "int16", "int32", "int64", "float16", "float32", "float64", "bool"]


def make_chunk(schema: Schema, steps: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for c in schema.columns:
        raw = rng.integers(0, 256, size=steps * c.step_bytes, dtype=np.uint8)
        out[c.name] = raw.view(c.dtype).reshape((steps, *c.shape)).copy()
    return out


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
    policy = data.draw(st.sampled_from(["conduit", "rllib-stock", "host-only", "all-gpu"]), label="policy")
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
        deadline = time.time() + 5
        while plane.metrics_.counters.get("moves", 0) < 8 and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
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
    max_lag = data.draw(st.integers(0, 2), label="max_lag")
    schema = Schema.of({"x": ((2,), "float32"), "v": "int64"})
    contract = BoundedStaleness(max_lag=max_lag, max_reuse=1)
    with ExperiencePlane(schema, contract, batch_steps=8, capacities=SMALL, prefetch_depth=1) as plane:
        delivered = []
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
                try:
                    b = plane.next_batch(timeout=0.05)
                except DeliveryTimeout:
                    continue
                assert b.steps == 8
                assert (b.columns["v"] >= b.update - max_lag).all()
                delivered += b.sample_ids()
                b.release()
        assert len(delivered) == len(set(delivered))
        report = plane.audit()
        assert report.violations == 0, report.examples


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
            assert plane._table_steps <= capacity + 8
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
    caps = {"pageable": 600 << 10, "nvme": "16 MiB"}  # room for the batch and a few chunks only
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
    with ExperiencePlane(schema, OnPolicy(), batch_steps=8, capacities={"pageable": "1 MiB", "nvme": "1 MiB"}) as plane:
        with pytest.raises(CapacityError, match="more than any tier"):
            plane.ingest(make_chunk(schema, 2048, 0), policy_version=0, chunk_id="huge")
        assert plane.audit().ingested_chunks == 0


def test_full_plane_applies_backpressure_with_a_timeout():
    schema = Schema.of({"x": ((1024,), "uint8")})
    caps = {"pageable": 64 << 10, "nvme": 64 << 10}
    with ExperiencePlane(schema, OnPolicy(), batch_steps=32, capacities=caps, prefetch_depth=1) as plane:
        for i in range(200):  # versions the learner is not at yet: nothing can drain
            try:
                plane.ingest(make_chunk(schema, 16, i), policy_version=5, timeout=0.2)
            except PlaneFullError as exc:
                assert "not ingested" in str(exc)
                break
        else:
            pytest.fail("the plane never pushed back")
        stored = plane.audit().ingested_chunks - sum(plane.audit().dropped_samples.values()) // 16
        assert stored == i  # every accepted chunk is held, the refused one is not
        assert all(t.used <= t.capacity for t in plane.tiers.values())


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
        with ExperiencePlane(schema, OnPolicy(), batch_steps=16, policy=name, capacities=SMALL) as plane:
            for i in range(4):
                plane.ingest(make_chunk(schema, 4, i), policy_version=0)
            with plane.next_batch(timeout=5) as b:
                assert b.steps == 16
            assert plane.audit().violations == 0, name


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

SPAWN = __import__("multiprocessing").get_context("spawn")


def _ring_producer(spec, schema_dict: dict, seed: int, sizes: list[int], version: int, die_after: int | None) -> None:
    """A producer process: writes chunks through its ring; optionally dies in the middle of one."""
    import os as _os
    import random

    from conduit.runtime.shm_ring import RingProducer

    schema = Schema.from_dict(schema_dict)
    rnd = random.Random(seed)
    with RingProducer(spec) as producer:
        for i, n in enumerate(sizes):
            if die_after is not None and i == die_after:
                slot = producer.reserve(n)
                first = next(iter(slot.columns.values()))
                first[: max(1, n // 2)] = 1  # half written, never committed
                _os._exit(1)
            producer.write(make_chunk(schema, n, seed * 1000 + i), chunk_id=(seed, i), policy_version=version)
            time.sleep(rnd.random() * 0.002)  # jitter the interleaving with the other producers


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
            proc = SPAWN.Process(target=_ring_producer, args=(spec, schema.to_dict(), p, sizes[p], 0, None))
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
        procs = [SPAWN.Process(target=_ring_producer, args=(healthy, schema.to_dict(), 1, [10, 10], 0, None)),
                 SPAWN.Process(target=_ring_producer, args=(doomed, schema.to_dict(), 2, [10, 10, 10], 0, 2))]
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
