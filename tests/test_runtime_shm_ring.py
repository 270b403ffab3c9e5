"""Shared-memory SPSC rings (conduit.runtime.shm_ring): cross-process round trips, producer death,
backpressure, schema/capacity refusals, and a hypothesis model of the ring mechanics."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conduit.chunk import checksum_bytes
from conduit.errors import CapacityError, ConduitError, PlaneFullError, SchemaError
from conduit.runtime.schema import Column, Schema
from conduit.runtime.shm_ring import RingProducer, RingRecord, ShmRing

SCHEMA = Schema.of({"obs": ((8,), np.float32), "act": np.int64, "rew": np.float32, "done": np.bool_})
SPAWN = mp.get_context("spawn")


def _shm_path(name: str) -> str:
    return f"/dev/shm/{name.lstrip('/')}"


@pytest.fixture
def rings():
    """Factory of rings; every ring is closed afterwards and its segment must be gone."""
    made: list[ShmRing] = []

    def make(*args, **kwargs) -> ShmRing:
        ring = ShmRing(*args, **kwargs)
        made.append(ring)
        return ring

    yield make
    for ring in made:
        ring.close()
        ring.close()  # idempotent
        if os.path.isdir("/dev/shm"):
            assert not os.path.exists(_shm_path(ring.name)), f"{ring.name} leaked"


def payload_for(schema: Schema, seed: int, index: int, steps: int | None = None) -> dict[str, np.ndarray]:
    """Deterministic random columns (random bytes, so every dtype and bit pattern shows up)."""
    rng = np.random.default_rng([seed, index])
    if steps is None:
        steps = int(rng.integers(1, 65))
    out = {}
    for col in schema.columns:
        raw = np.frombuffer(rng.bytes(steps * col.step_bytes), dtype=np.uint8).copy()
        if col.dtype == np.bool_:
            raw &= 1
        out[col.name] = raw.view(col.dtype).reshape((steps, *col.shape))
    return out


def same_bytes(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a)


# -- producer processes (module level: spawned children import them by name) -------------------------
def _producer_main(spec, seed: int, count: int) -> None:
    with RingProducer(spec) as producer:
        for i in range(count):
            producer.write(payload_for(producer.schema, seed, i), chunk_id=(seed, i), policy_version=i,
                           timeout=60)


def _dying_producer(spec, seed: int, hold) -> None:
    producer = RingProducer(spec)
    for i in range(2):
        producer.write(payload_for(producer.schema, seed, i), chunk_id=(seed, i), policy_version=i)
    slot = producer.reserve(40)
    data = payload_for(producer.schema, seed, 2, steps=40)
    for name in list(slot.columns)[: len(slot.columns) // 2]:
        slot.columns[name][...] = data[name]
    if hold is None:
        os._exit(1)
    hold.set()  # the test kills us now
    time.sleep(60)


# -- cross-process -----------------------------------------------------------------------------------
def test_round_trip_three_spawned_producers(rings):
    count = 40
    plane = [rings(SCHEMA, 32 * 1024, f"actor-{k}") for k in range(3)]
    procs = [SPAWN.Process(target=_producer_main, args=(ring.spec(), k, count)) for k, ring in enumerate(plane)]
    for proc, ring in zip(procs, plane, strict=True):
        proc.start()
        ring.producer_started()
    rng = np.random.default_rng(0)
    seen: set = set()
    held: list[tuple[ShmRing, RingRecord]] = []  # released one round late, in random order
    max_used = 0
    deadline = time.monotonic() + 30
    try:
        while len(seen) < 3 * count and time.monotonic() < deadline:
            fresh = []
            for k, ring in enumerate(plane):
                for rec in ring.poll(timeout=0.005):
                    seed, i = rec.chunk_id
                    assert seed == k and rec.producer == f"actor-{k}"
                    assert rec.chunk_id not in seen, f"duplicate {rec.chunk_id}"
                    seen.add(rec.chunk_id)
                    expected = payload_for(SCHEMA, seed, i)
                    assert rec.policy_version == i and rec.steps == len(expected["act"])
                    assert rec.nbytes == SCHEMA.payload_bytes(rec.steps)
                    assert rec.checksum == checksum_bytes(rec.columns) == checksum_bytes(expected)
                    assert same_bytes(rec.columns, expected)
                    assert not rec.columns["obs"].flags.writeable
                    fresh.append((ring, rec))
                max_used = max(max_used, ring.used)
                assert ring.used <= ring.capacity
            for j in rng.permutation(len(held)):
                ring, rec = held[j]
                ring.release(rec)
            held = fresh
    finally:
        for ring, rec in held:
            ring.release(rec)
        for proc in procs:
            proc.join(timeout=30)
    assert seen == {(k, i) for k in range(3) for i in range(count)}
    assert all(proc.exitcode == 0 for proc in procs)
    assert max_used > 0
    for ring in plane:
        assert ring.used == 0
        assert ring.poll() == []
        assert not ring.producer_alive
        assert ring.check_producer() == 0 and ring.discarded_partial == 0


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_producer_killed_mid_chunk(rings, how):
    ring = rings(SCHEMA, 64 * 1024, "doomed")
    hold = SPAWN.Event() if how == "sigkill" else None
    proc = SPAWN.Process(target=_dying_producer, args=(ring.spec(), 7, hold))
    proc.start()  # no producer_started(): the plane drops its pipe end on the producer's attach message
    try:
        if hold is not None:
            assert hold.wait(30)
            proc.kill()
        proc.join(30)
        got: list[RingRecord] = []
        deadline = time.monotonic() + 30
        while ring.producer_alive and time.monotonic() < deadline:
            got += ring.poll(timeout=0.05)
        got += ring.poll()
        assert not ring.producer_alive
        assert [r.chunk_id for r in got] == [(7, 0), (7, 1)]
        for rec in got:
            expected = payload_for(SCHEMA, 7, rec.chunk_id[1])
            assert same_bytes(rec.columns, expected) and rec.checksum == checksum_bytes(expected)
        assert ring.check_producer() == 1
        assert ring.check_producer() == 0  # reported once
        assert ring.discarded_partial == 1
        assert ring.used > 0  # the two records are still held
        for rec in reversed(got):
            ring.release(rec)
        assert ring.used == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)


# -- single process ----------------------------------------------------------------------------------
@pytest.fixture
def pair(rings):
    ring = rings(SCHEMA, 16 * 1024, "local")
    producer = RingProducer(ring.spec())
    yield ring, producer
    producer.close()


def test_schema_mismatch_writes_nothing(pair):
    ring, producer = pair
    good = payload_for(SCHEMA, 1, 0, steps=5)
    bad = [
        {**good, "obs": good["obs"].astype(np.float64)},  # dtype
        {**good, "obs": good["obs"][:, :4]},  # per-step shape
        {k: v for k, v in good.items() if k != "rew"},  # missing column
        {**good, "extra": good["rew"]},  # unknown column
        {**good, "act": good["act"][:3]},  # steps differ
    ]
    for payload in bad:
        with pytest.raises(SchemaError):
            producer.write(payload, chunk_id="bad", policy_version=0)
        assert ring.used == 0 and ring.poll() == []
    producer.write(good, chunk_id="good", policy_version=0)  # the producer is still usable
    (rec,) = ring.poll()
    assert rec.chunk_id == "good"
    ring.release(rec)


def test_too_large_chunk_is_refused_at_once(pair):
    ring, producer = pair
    steps = ring.capacity // SCHEMA.step_bytes + 1
    t0 = time.monotonic()
    with pytest.raises(CapacityError, match=f"capacity is {ring.capacity} bytes") as err:
        producer.write(payload_for(SCHEMA, 1, 0, steps=steps), chunk_id=0, policy_version=0, timeout=5)
    assert time.monotonic() - t0 < 1
    assert str(producer.record_bytes(steps)) in str(err.value)
    with pytest.raises(CapacityError):
        producer.reserve(steps)
    assert ring.used == 0


def test_backpressure_times_out_then_succeeds(pair):
    ring, producer = pair
    chunk = payload_for(SCHEMA, 3, 0, steps=50)
    written = 0
    with pytest.raises(PlaneFullError):
        for written in range(1000):
            producer.write(chunk, chunk_id=written, policy_version=0, timeout=0)
    assert 0 < written < 1000
    assert ring.used <= ring.capacity
    t0 = time.monotonic()
    with pytest.raises(PlaneFullError, match=r"'local'.*bytes asked.*ring capacity") as err:
        producer.write(chunk, chunk_id="late", policy_version=0, timeout=0.2)
    elapsed = time.monotonic() - t0
    assert 0.19 <= elapsed < 1.5, elapsed
    assert str(producer.record_bytes(50)) in str(err.value)
    records = ring.poll()
    assert [r.chunk_id for r in records] == list(range(written))

    # a blocked writer proceeds as soon as the reader releases
    def release_soon() -> None:
        time.sleep(0.1)
        for rec in records:
            ring.release(rec)

    releaser = threading.Thread(target=release_soon)
    releaser.start()
    t0 = time.monotonic()
    producer.write(chunk, chunk_id="late", policy_version=0, timeout=10)
    releaser.join()
    assert time.monotonic() - t0 >= 0.09
    (rec,) = ring.poll()
    assert rec.chunk_id == "late" and same_bytes(rec.columns, chunk)
    ring.release(rec)
    assert ring.used == 0


def test_unread_notifications_are_bounded(rings):
    """A plane that never polls stops the producer (PlaneFullError) instead of blocking it or growing."""
    schema = Schema.of({"x": np.uint8})
    ring = rings(schema, 4 * 1024 * 1024, "chatty", meta_bytes=64)
    with RingProducer(ring.spec()) as producer:
        one = {"x": np.ones(1, np.uint8)}
        n = 0
        with pytest.raises(PlaneFullError):
            while True:
                producer.write(one, chunk_id=n, policy_version=0, checksum=False, timeout=0)
                n += 1
        assert n <= ring.capacity // producer.record_bytes(1)
        records = ring.poll()
        assert [r.chunk_id for r in records] == list(range(n))
        for rec in records:
            ring.release(rec)
        producer.write(one, chunk_id="after", policy_version=0, timeout=0)
        (rec,) = ring.poll()
        ring.release(rec)
    assert ring.used == 0


def test_annotation_travels_with_the_record_and_into_the_plane(pair):
    """A producer's annotation comes back with its record (write and slot commit), and the plane's ring
    thread ingests it, so batches carry it as for an in-process ingest; a too-large one is refused."""
    ring, producer = pair
    chunk = payload_for(SCHEMA, 3, 0, steps=4)
    producer.write(chunk, chunk_id="a", policy_version=0, annotation={"shape": (2, 2)})
    slot = producer.reserve(4)
    for name, dst in slot.columns.items():
        dst[...] = chunk[name]
    slot.commit(chunk_id="b", policy_version=0, annotation=(2, 2))
    producer.write(chunk, chunk_id="c", policy_version=0)
    records = ring.poll()
    assert [(r.chunk_id, r.annotation) for r in records] == [("a", {"shape": (2, 2)}), ("b", (2, 2)), ("c", None)]
    for rec in records:
        ring.release(rec)
    with pytest.raises(ConduitError, match="with its annotation pickles to"):
        producer.write(chunk, chunk_id="d", policy_version=0, annotation="x" * 500)
    assert ring.poll() == [] and ring.used == 0


def test_plane_batches_carry_ring_annotations():
    from conduit.contracts import OnPolicy
    from conduit.runtime.plane import ExperiencePlane

    with ExperiencePlane(SCHEMA, OnPolicy(), batch_steps=8, prefetch_depth=1) as plane:
        spec = plane.attach_producer("p", ring_bytes=64 << 10)
        with RingProducer(spec) as producer:
            for i in range(2):
                producer.write(payload_for(SCHEMA, i, 0, steps=4), chunk_id=i, policy_version=0, annotation=("env", i))
            batch = plane.next_batch(timeout=30)
        assert batch.annotations == {0: ("env", 0), 1: ("env", 1)}
        batch.release()
        assert plane.audit().violations == 0


def test_out_of_order_release_moves_head_only_past_contiguous(pair):
    ring, producer = pair
    for i in range(3):
        producer.write(payload_for(SCHEMA, 4, i, steps=10), chunk_id=i, policy_version=i, t_created=100.0 + i)
    recs = ring.poll()
    assert [r.t_created for r in recs] == [100.0, 101.0, 102.0]
    full = ring.used
    assert full == sum(r.size for r in recs)
    ring.release(recs[1])
    ring.release(recs[2])
    assert ring.used == full
    ring.release(recs[0])
    assert ring.used == 0
    with pytest.raises(ConduitError, match="not outstanding"):
        ring.release(recs[0])


def test_zero_copy_slot_commit_and_abort(pair):
    ring, producer = pair
    slot = producer.reserve(6)
    data = payload_for(SCHEMA, 5, 0, steps=6)
    for name, col in slot.columns.items():
        assert col.flags.writeable and col.ctypes.data % 64 == 0
        col[...] = data[name]
    with pytest.raises(ConduitError, match="already reserved"):
        producer.reserve(1)
    slot.commit(chunk_id=("tuple", 1), policy_version=3, checksum=False)
    with pytest.raises(ConduitError):
        slot.commit(chunk_id="again", policy_version=3)
    producer.reserve(4).abort()  # skipped by the plane
    (rec,) = ring.poll()
    assert rec.chunk_id == ("tuple", 1) and rec.checksum is None and rec.policy_version == 3
    assert same_bytes(rec.columns, data)
    ring.release(rec)
    assert ring.used == 0


def test_committed_but_unannounced_record_survives_producer_exit(pair, monkeypatch):
    ring, producer = pair
    producer.write(payload_for(SCHEMA, 6, 0, steps=3), chunk_id="announced", policy_version=0)
    monkeypatch.setattr(producer, "_notify", lambda value: None)  # the producer "dies" right after COMMITTED
    producer.write(payload_for(SCHEMA, 6, 1, steps=3), chunk_id="silent", policy_version=0)
    producer.close()
    recs = ring.poll()
    assert [r.chunk_id for r in recs] == ["announced", "silent"]
    assert same_bytes(recs[1].columns, payload_for(SCHEMA, 6, 1, steps=3))
    assert not ring.producer_alive and ring.check_producer() == 0 and ring.discarded_partial == 0
    for rec in recs:
        ring.release(rec)
    assert ring.used == 0


def test_in_process_partial_discarded_and_ring_refuses_more(rings):
    ring = rings(SCHEMA, 16 * 1024, "quitter")
    spec = ring.spec()
    producer = RingProducer(spec)
    with pytest.raises(ConduitError, match="already has a producer"):
        RingProducer(spec)
    producer.write(payload_for(SCHEMA, 8, 0, steps=2), chunk_id=0, policy_version=0)
    producer.reserve(9)
    producer.close()
    (rec,) = ring.poll()
    assert ring.check_producer() == 1 and ring.discarded_partial == 1
    ring.release(rec)
    assert ring.used == 0


def test_closed_ring_refuses_the_producer(rings):
    ring = rings(SCHEMA, 16 * 1024, "orphan")
    producer = RingProducer(ring.spec())
    ring.close()
    assert not os.path.exists(_shm_path(ring.name))
    with pytest.raises(ConduitError, match="closed"):
        producer.write(payload_for(SCHEMA, 9, 0, steps=2), chunk_id=0, policy_version=0)
    producer.close()
    assert ring.poll() == [] and ring.used == 0


def test_bad_arguments(rings):
    with pytest.raises(ConduitError):
        rings(SCHEMA, 0, "zero")
    ring = rings(SCHEMA, 1000, "odd")
    assert ring.capacity == 1024
    with RingProducer(ring.spec()) as producer:
        with pytest.raises(ConduitError, match="pickles to"):
            producer.write(payload_for(SCHEMA, 1, 0, steps=1), chunk_id="x" * 500, policy_version=0)
        with pytest.raises(ConduitError, match="not hashable"):
            producer.write(payload_for(SCHEMA, 1, 0, steps=1), chunk_id=["list"], policy_version=0)
        with pytest.raises(ConduitError, match="steps"):
            producer.reserve(0)
        assert ring.used == 0


# -- hypothesis model of the ring mechanics -------------------------------------------------------------
DTYPES = [np.int8, np.uint16, np.int32, np.int64, np.float32, np.float64, np.complex64, np.bool_]

schemas = st.lists(
    st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 4), max_size=2)), min_size=1, max_size=3,
).map(lambda cols: Schema(tuple(Column(f"c{i}", np.dtype(dt), tuple(shape)) for i, (dt, shape) in enumerate(cols))))

ops = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(1, 16), st.booleans()),
        st.tuples(st.just("write"), st.integers(1, 4), st.booleans()),
        st.tuples(st.just("abort"), st.integers(1, 8), st.just(False)),
        st.tuples(st.just("poll"), st.just(0), st.just(False)),
        st.tuples(st.just("release"), st.integers(0, 1000), st.just(False)),
    ),
    min_size=10,
    max_size=80,
)

META = 64


class RingModel:
    """The ring's placement rule with virtual counters: what fits where, and where head stands."""

    def __init__(self, capacity: int):
        self.cap = capacity
        self.head = self.tail = self.read = 0
        self.unpolled: deque = deque()  # (start, end, chunk_id or None when aborted)
        self.entries: deque = deque()  # [start, end, released]
        self.by_id: dict = {}

    def place(self, size: int) -> int | None:
        pos = self.tail % self.cap
        if pos + size <= self.cap:
            start = self.tail
        elif self.head == self.tail:  # empty ring: start over at offset 0
            event("wrap of an empty ring")
            start = self.tail + self.cap - pos
            self.head = start
            self.tail = start + size
            return start
        else:
            start = self.tail + self.cap - pos
        if start + size - self.head > self.cap:
            return None
        if start != self.tail:
            event("wrap with padding")
        self.tail = start + size
        return start

    def polled(self) -> list:
        out = []
        while self.unpolled:
            start, end, cid = self.unpolled.popleft()
            if start > self.read:
                self.entries.append([self.read, start, True])
            entry = [start, end, cid is None]
            self.entries.append(entry)
            self.read = end
            if cid is not None:
                self.by_id[cid] = entry
                out.append((cid, start, end))
        self._advance()
        return out

    def release(self, cid) -> None:
        self.by_id.pop(cid)[2] = True
        self._advance()

    def _advance(self) -> None:
        while self.entries and self.entries[0][2]:
            self.entries.popleft()
        self.head = self.entries[0][0] if self.entries else self.read


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, cap_lines=st.integers(3, 40), plan=ops, seed=st.integers(0, 2**16))
def test_ring_mechanics_property(schema, cap_lines, plan, seed):
    capacity = cap_lines * 64
    ring = ShmRing(schema, capacity, "hyp", meta_bytes=META)
    producer = RingProducer(ring.spec())
    model = RingModel(capacity)
    expected: dict[int, dict[str, np.ndarray]] = {}
    checksums: dict[int, int | None] = {}
    outstanding: dict[int, RingRecord] = {}
    seen: set[int] = set()
    next_id = 0
    try:
        for kind, arg, zero_copy in plan:
            if kind in ("write", "abort"):
                size = 64 + META + schema.extent_bytes(arg)
                if size > capacity:
                    event("too large")
                    with pytest.raises(CapacityError):
                        producer.reserve(arg, timeout=0)
                    continue
                tail_before = model.tail
                head_before = model.head
                start = model.place(size)
                if start is None:
                    event("full")
                    with pytest.raises(PlaneFullError):
                        producer.reserve(arg, timeout=0)
                    assert (model.tail, model.head) == (tail_before, head_before)
                    continue
                if kind == "abort":
                    producer.reserve(arg, timeout=0).abort()
                    model.unpolled.append((start, start + size, None))
                    continue
                cid = next_id
                next_id += 1
                data = payload_for(schema, seed, cid, steps=arg)
                if zero_copy:
                    slot = producer.reserve(arg, timeout=0)
                    for name, col in slot.columns.items():
                        col[...] = data[name]
                    slot.commit(chunk_id=cid, policy_version=cid, checksum=cid % 2 == 0)
                else:
                    producer.write(data, chunk_id=cid, policy_version=cid, timeout=0)
                expected[cid] = data
                checksums[cid] = checksum_bytes(data) if not zero_copy or cid % 2 == 0 else None
                model.unpolled.append((start, start + size, cid))
            elif kind == "poll":
                want = model.polled()
                got = ring.poll()
                assert [(r.chunk_id, r.offset, r.size) for r in got] == [
                    (cid, start % capacity, end - start) for cid, start, end in want]
                for rec in got:
                    assert rec.chunk_id not in seen
                    seen.add(rec.chunk_id)
                    outstanding[rec.chunk_id] = rec
                    assert rec.checksum == checksums[rec.chunk_id]
                    offsets, extent = schema.layout(rec.steps)  # columns sit where Schema.layout says
                    assert rec.size == 64 + META + extent
                    placed = [(c.ctypes.data, off) for c, off in zip(rec.columns.values(), offsets, strict=True) if c.size]
                    if placed:
                        base = placed[0][0] - placed[0][1]
                        assert base % 64 == 0 and all(addr - base == off for addr, off in placed)
                    assert rec.policy_version == rec.chunk_id and rec.nbytes == schema.payload_bytes(rec.steps)
            elif kind == "release" and outstanding:
                cid = sorted(outstanding)[arg % len(outstanding)]
                if cid != min(outstanding):
                    event("out-of-order release")
                ring.release(outstanding.pop(cid))
                model.release(cid)
            assert ring.used == model.tail - model.head <= capacity
            for cid, rec in outstanding.items():  # nothing live was overwritten
                assert same_bytes(rec.columns, expected[cid])
        # drain: everything written arrives exactly once, and the ring empties
        want = model.polled()
        got = ring.poll()
        assert [r.chunk_id for r in got] == [cid for cid, _, _ in want]
        for rec in got:
            assert same_bytes(rec.columns, expected[rec.chunk_id])
            outstanding[rec.chunk_id] = rec
            seen.add(rec.chunk_id)
        assert seen == set(expected)
        for rec in outstanding.values():
            ring.release(rec)
        outstanding.clear()
        assert ring.used == 0
    finally:
        outstanding.clear()
        producer.close()
        ring.close()
    assert not os.path.exists(_shm_path(ring.name))
