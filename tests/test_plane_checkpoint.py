"""Plane checkpoints (conduit/runtime/checkpoint.py): a snapshot carries the Replay table and the audit.

* With the table: a fresh plane restored from a snapshot holds the same chunks (same ids, same bytes),
  the same rate-limiter counts and the same audit counts; training goes on without a new warm-up,
  samples drawn from restored chunks are live (no false violation), and the audit stays at 0.
* Without the table: the restored plane's table is empty, its samples are counted as dropped at the
  checkpoint, and it warms up again (no sample before ``min_size`` new steps), still with 0 violations.
* OnPolicy / BoundedStaleness data in flight is dropped at the checkpoint and counted, never lost silently.
* A registered table part's ``state_dict`` travels with the snapshot.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.contracts import BoundedStaleness, OnPolicy, Prioritized, Replay
from conduit.errors import ConduitError, PlaneFullError
from conduit.runtime.checkpoint import DROP_REASON
from conduit.runtime.plane import DeliveryTimeout, ExperiencePlane
from conduit.runtime.schema import Schema

SMALL = {"pageable": "8 MiB", "nvme": "8 MiB", "pinned": 0}
SCHEMA = Schema.of({"obs": ((3,), "float32"), "act": "int64"})
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def chunk(steps: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((steps, 3)).astype(np.float32), "act": rng.integers(0, 9, steps)}


def table_rows(plane: ExperiencePlane) -> dict:
    return {cid: {k: np.array(v[:c.meta.steps]) for k, v in c.columns().items()} for cid, c in plane._table.items()}


def run(plane: ExperiencePlane, sources: dict, rounds: int, seed: int, samples: int = 2) -> int:
    """Ingest and sample as a DQN loop would; every row checked against its source. Returns batches."""
    got = 0
    for i in range(rounds):
        payload = chunk(8, seed + i)
        try:
            sources[plane.ingest(payload, policy_version=i, timeout=0.01)] = payload
        except PlaneFullError:
            pass  # the limiter wants samples first
        for _ in range(samples):
            try:
                b = plane.next_batch(timeout=0.01)
            except DeliveryTimeout:
                break
            row = 0
            for cid, idx in b.selections:
                assert cid in plane._table  # only live samples
                for k, col in b.columns.items():
                    np.testing.assert_array_equal(np.asarray(col[row:row + len(idx)]), sources[cid][k][idx])
                row += len(idx)
            b.release()
            got += 1
    return got


CONTRACT = Replay(capacity=96, replay_ratio=1.0, min_size=32, error_buffer=64)


@SETTINGS
@given(rounds=st.integers(5, 25), later=st.integers(1, 15), table=st.booleans(), seed=st.integers(0, 99))
def test_replay_snapshot_restores_table_limiter_and_audit(rounds, later, table, seed):
    sources: dict = {}
    with ExperiencePlane(SCHEMA, CONTRACT, batch_steps=8, capacities=SMALL, seed=seed) as a:
        run(a, sources, rounds, seed)
        snap = pickle.loads(pickle.dumps(a.snapshot(table=table)))  # a checkpoint is plain data
        before = a.audit()
        rows = table_rows(a)
        limiter = (a._inserted, a._delivered)
        live = a._table_steps
    with ExperiencePlane(SCHEMA, CONTRACT, batch_steps=8, capacities=SMALL, seed=seed + 1) as b:
        got = b.restore(snap)
        after = b.audit()
        # every count carried over; nothing ingested or delivered twice
        for k in ("ingested_chunks", "ingested_samples", "ingested_bytes", "deliveries", "delivered_samples"):
            assert getattr(after, k) == getattr(before, k), k
        assert after.violations == before.violations == 0
        if table:
            assert table_rows(b).keys() == rows.keys() and list(b._table) == list(rows)  # same ids, FIFO order
            for cid, cols in table_rows(b).items():
                for k in cols:
                    np.testing.assert_array_equal(cols[k], rows[cid][k])
            assert (b._inserted, b._delivered) == limiter and got["samples"] == live
            assert after.dropped_samples.get(DROP_REASON, 0) == before.dropped_samples.get(DROP_REASON, 0)
            if b._inserted >= CONTRACT.min_size and CONTRACT.can_sample(8, b._inserted, b._delivered):
                b.next_batch(timeout=1).release()  # no new warm-up: the restored table serves at once
        else:
            assert not b._table and b._inserted == 0 and got == {"chunks": 0, "samples": 0, "dropped": live}
            assert after.dropped_samples.get(DROP_REASON, 0) == live
            with pytest.raises(DeliveryTimeout, match="rate limiter"):
                b.next_batch(timeout=0.01)  # warming up again: min_size new steps first
        run(b, {**sources}, later, seed + 1000)
        final = b.close()
        assert final.violations == 0, final.examples
        assert final.ingested_samples >= before.ingested_samples


def test_replay_restore_warms_up_again_without_the_table_then_samples():
    sources: dict = {}
    with ExperiencePlane(SCHEMA, CONTRACT, batch_steps=8, capacities=SMALL, seed=3) as a:
        run(a, sources, 12, 0)
        snap = a.snapshot(table=False)
    with ExperiencePlane(SCHEMA, CONTRACT, batch_steps=8, capacities=SMALL, seed=4) as b:
        b.restore(snap)
        for i in range(CONTRACT.min_size // 8):
            with pytest.raises(DeliveryTimeout):
                b.next_batch(timeout=0.01)
            b.ingest(chunk(8, 100 + i), policy_version=0)
        b.next_batch(timeout=1).release()  # warmed up again
        assert b.close().violations == 0


def test_restored_chunk_ids_are_reserved():
    with ExperiencePlane(SCHEMA, CONTRACT, batch_steps=8, capacities=SMALL) as a:
        a.ingest(chunk(8, 0), policy_version=0, chunk_id="r1-0")
        snap = a.snapshot()
    with ExperiencePlane(SCHEMA, CONTRACT, batch_steps=8, capacities=SMALL) as b:
        b.restore(snap)
        with pytest.raises(ConduitError, match="already in the plane"):
            b.ingest(chunk(8, 1), policy_version=0, chunk_id="r1-0")
        auto = b.ingest(chunk(8, 2), policy_version=0)
        assert auto not in {m["id"] for m in snap["table"]["chunks"]}


@pytest.mark.parametrize("contract", [OnPolicy(), BoundedStaleness(max_lag=2, max_reuse=1)])
def test_in_flight_on_policy_data_is_dropped_at_the_checkpoint_and_counted(contract):
    with ExperiencePlane(SCHEMA, contract, batch_steps=16, capacities=SMALL) as a:
        for i in range(2):
            a.ingest(chunk(8, i), policy_version=0)
        a.next_batch(timeout=1).release()  # batch 0 delivered
        a.set_policy_version(1)
        a.ingest(chunk(8, 5), policy_version=1)  # in flight: half of batch 1
        snap = a.snapshot()
        assert snap["table"] is None
    with ExperiencePlane(SCHEMA, contract, batch_steps=16, capacities=SMALL) as b:
        got = b.restore(snap)
        assert got == {"chunks": 0, "samples": 0, "dropped": 8}
        assert b.policy_version == 1
        for i in range(2):
            b.ingest(chunk(8, 10 + i), policy_version=1)
        batch = b.next_batch(update=1 if isinstance(contract, OnPolicy) else None, timeout=2)
        batch.release()
        final = b.close()
    assert final.violations == 0, final.examples
    assert final.dropped_samples[DROP_REASON] == 8
    assert final.ingested_samples == 40 and final.delivered_samples == 32


class _Visits:
    """A table part with its own state (what a sampler registers)."""

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state) -> None:
        self.n = int(state["n"])


def test_a_registered_part_travels_with_the_snapshot():
    with ExperiencePlane(SCHEMA, CONTRACT, batch_steps=8, capacities=SMALL) as a:
        part = _Visits()
        a.register_part("visits", part)
        part.n = 7
        with pytest.raises(ConduitError, match="registered already"):
            a.register_part("visits", _Visits())
        snap = a.snapshot()
    with ExperiencePlane(SCHEMA, CONTRACT, batch_steps=8, capacities=SMALL) as b:
        other = _Visits()
        b.register_part("visits", other)
        b.restore(snap)
        assert other.n == 7


def test_restore_refuses_a_used_plane_or_another_contract():
    with ExperiencePlane(SCHEMA, CONTRACT, batch_steps=8, capacities=SMALL) as a:
        a.ingest(chunk(8, 0), policy_version=0)
        snap = a.snapshot()
        with pytest.raises(ConduitError, match="not fresh"):
            a.restore(snap)
    other = Replay(capacity=64, replay_ratio=1.0, min_size=32, error_buffer=64)
    with ExperiencePlane(SCHEMA, other, batch_steps=8, capacities=SMALL) as b:
        with pytest.raises(ConduitError, match="contract"):
            b.restore(snap)
        with pytest.raises(ConduitError, match="format"):
            b.restore({"format": "x"})


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=st.integers(6, 30), seed=st.integers(0, 2**16), boost=st.floats(0.01, 50.0))
def test_prioritized_sampler_state_travels_with_the_table(rounds, seed, boost):
    """The sampler's priorities name the same samples after a restore: same ids, same tree values,
    same maximum; draws name live restored samples; new samples get ids never used before."""
    contract = Replay(capacity=96, replay_ratio=1.0, min_size=16, error_buffer=1e6,
                      sampler=Prioritized(alpha=0.6, beta=0.4))
    plane = ExperiencePlane(SCHEMA, contract, batch_steps=8, capacities=SMALL, seed=seed)
    sources: dict = {}
    for i in range(rounds):
        payload = chunk(8, seed + i)
        try:
            sources[plane.ingest(payload, policy_version=i, timeout=0.01)] = payload
        except PlaneFullError:
            pass
        try:
            b = plane.next_batch(timeout=0.01)
        except DeliveryTimeout:
            continue
        plane.update_priorities(b.replay_ids, np.full(len(b.replay_ids), boost * (1 + i % 3)))
        b.release()
    snap = pickle.loads(pickle.dumps(plane.snapshot(table=True)))
    before = plane.replay_sampler.state_dict()
    top = plane._next_sample_id
    plane.close()

    fresh = ExperiencePlane(SCHEMA, contract, batch_steps=8, capacities=SMALL, seed=seed + 1)
    fresh.restore(snap)
    after = fresh.replay_sampler.state_dict()
    order_b, order_a = np.argsort(before["ids"]), np.argsort(after["ids"])
    np.testing.assert_array_equal(before["ids"][order_b], after["ids"][order_a])
    np.testing.assert_allclose(before["values"][order_b], after["values"][order_a])
    assert after["max_priority"] == before["max_priority"]
    ranges = {cid: (c.first_id, c.meta.steps) for cid, c in fresh._table.items()}
    assert ranges == {cid: (c["first_id"], c["steps"]) for cid, c in
                      ((m["id"], m) for m in snap["table"]["chunks"])}
    if len(fresh.replay_sampler) >= 16:
        b = fresh.next_batch(timeout=5)
        assert set(b.replay_ids.tolist()) <= set(before["ids"].tolist())
        b.release()
    new = fresh.ingest(chunk(8, 999), policy_version=rounds, timeout=1)
    assert fresh._table[new].first_id >= top  # ids are never reused
    assert fresh.close().violations == 0
