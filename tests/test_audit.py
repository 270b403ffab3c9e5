"""The auditor: valid event streams give zero violations; each injected fault is caught as its kind.

Valid streams come from small plane models written here, one per contract, that obey the contract
by construction (and, for Replay, ask the contract's rate limiter before every insert and sample).
Each fault is then injected into such a stream by editing its event list, and the report must
attribute it to exactly the expected kind.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.audit import (
    MAX_EXAMPLES,
    Auditor,
    AuditReport,
    EventKind,
    PlaneEvent,
    ViolationKind,
)
from conduit.chunk import (
    Chunk,
    Selection,
    checksum_bytes,
    normalize_indices,
    selection_size,
)
from conduit.contracts import BoundedStaleness, OnPolicy, Replay
from conduit.errors import ConduitError

E = EventKind
V = ViolationKind
ALL_KINDS = {k.value for k in ViolationKind}
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(contract, events, caps=None) -> AuditReport:
    auditor = Auditor(contract, caps)
    for ev in events:
        auditor.observe(ev)
    return auditor.finish(events[-1].t + 1 if events else 0.0)


def only(report: AuditReport, kind: ViolationKind) -> int:
    """The count of ``kind``, after asserting every other kind is zero."""
    others = {k: v for k, v in report.by_kind.items() if k != kind.value and v}
    assert not others, (kind, others, report.examples)
    return report.by_kind[kind.value]


def assert_clean(report: AuditReport) -> None:
    assert report.violations == 0, (report.summary(), report.examples)
    assert set(report.by_kind) == ALL_KINDS


def mk(cid, steps=10, version=0, nbytes=None, checksum=None) -> Chunk:
    return Chunk(cid, "actor0", "node0", steps, steps * 8 if nbytes is None else nbytes, version,
                 0.0, checksum=checksum)


def as_array(indices, steps) -> np.ndarray:
    idx, _, _ = normalize_indices(indices, steps)
    return np.arange(steps)[idx] if isinstance(idx, slice) else np.asarray(idx)


# =============================================================================================
# chunks and selections
# =============================================================================================


def test_chunk_validation_names_the_field():
    with pytest.raises(ConduitError, match="steps"):
        mk("a", steps=0)
    with pytest.raises(ConduitError, match="nbytes"):
        mk("a", nbytes=-1)
    with pytest.raises(ConduitError, match="policy_version"):
        Chunk("a", "p", "n", 1, 1, "v1", 0.0)  # type: ignore[arg-type]


def test_chunk_identity_ignores_payload_and_lists_its_samples():
    a = Chunk(7, "p", "n", 3, 24, 1, 0.5, payload={"obs": np.zeros(3)})
    b = Chunk(7, "p", "n", 3, 24, 1, 0.5, payload={"obs": np.ones(3)})
    assert a == b and hash(a) == hash(b)
    assert list(a.sample_ids()) == [(7, 0), (7, 1), (7, 2)]
    assert a.bytes_per_step == 8


def test_chunk_from_payload_reads_steps_bytes_and_checksum():
    cols = {"obs": np.arange(12, dtype=np.float32).reshape(4, 3), "act": np.arange(4)}
    c = Chunk.from_payload("x", "p", "n", 2, 1.0, cols)
    assert c.steps == 4
    assert c.nbytes == 12 * 4 + 4 * 8
    assert c.checksum == checksum_bytes(cols)
    assert c.checksum == checksum_bytes({"act": cols["act"], "obs": cols["obs"]})  # key order
    with pytest.raises(ConduitError, match="length"):
        Chunk.from_payload("y", "p", "n", 0, 0.0, {"a": np.zeros(3), "b": np.zeros(4)})


def test_checksum_sees_every_byte_and_ignores_memory_layout():
    a = np.arange(1000, dtype=np.int32).reshape(10, 100)
    assert checksum_bytes(a) == checksum_bytes(a.tobytes()) == checksum_bytes([a])
    strided = np.asfortranarray(a)
    assert checksum_bytes(strided) == checksum_bytes(a)
    assert checksum_bytes(a[:, ::2]) == checksum_bytes(np.ascontiguousarray(a[:, ::2]))
    b = a.copy()
    b[3, 7] ^= 1
    assert checksum_bytes(b) != checksum_bytes(a)
    assert checksum_bytes([a[:5], a[5:]]) == checksum_bytes(a)  # buffers chain


@given(
    steps=st.integers(1, 50),
    spec=st.one_of(
        st.tuples(st.just("range"), st.integers(-5, 60), st.integers(-5, 60), st.integers(1, 4)),
        st.tuples(st.just("slice"), st.none() | st.integers(0, 60), st.none() | st.integers(0, 60),
                  st.none() | st.integers(1, 4)),
        st.tuples(st.just("array"), st.lists(st.integers(-3, 60), max_size=40)),
    ),
)
def test_normalize_indices_matches_a_reference(steps, spec):
    if spec[0] == "range":
        indices = range(spec[1], spec[2], spec[3])
        wanted = list(indices)
    elif spec[0] == "slice":
        indices = slice(spec[1], spec[2], spec[3])
        start = spec[1] or 0
        stop = steps if spec[2] is None else spec[2]
        wanted = list(range(start, stop, spec[3] or 1))
    else:
        indices = np.array(spec[1], dtype=np.int64)
        wanted = list(spec[1])
    idx, count, bad = normalize_indices(indices, steps)
    good = [i for i in wanted if 0 <= i < steps]
    assert count == len(good)
    assert bad == len(wanted) - len(good)
    assert np.arange(steps)[idx].tolist() == good
    assert selection_size(indices, steps) == len(wanted)


def test_selection_helpers():
    c = mk("c", steps=5)
    sel = Selection.whole(c)
    assert sel == ("c", range(5))
    assert sel.size() == 5
    assert list(Selection("c", slice(1, None)).sample_ids(5)) == [("c", i) for i in range(1, 5)]
    assert Selection("c", np.array([True, False, True, False, False])).size() == 2
    with pytest.raises(ConduitError):
        selection_size(slice(2, None))


# =============================================================================================
# OnPolicy: a PPO-like plane
# =============================================================================================


@st.composite
def on_policy_streams(draw, keep_resident=None, min_updates=1):
    """Ingest → place in host → move to HBM → deliver (epochs × minibatches) → consume → evict.

    Some samples are dropped as "truncated" before delivery (never delivered afterwards). HBM
    capacity is exactly the largest update, so the placement is tight but never over.
    """
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n_updates = draw(st.integers(min_updates, 4))
    keep = draw(st.booleans()) if keep_resident is None else keep_resident
    style = draw(st.sampled_from(["range", "array"]))
    per_update = []
    n = 0
    for k in range(n_updates):
        chunks = []
        for _ in range(draw(st.integers(1, 4))):
            steps = draw(st.integers(1, 40))
            chunks.append(Chunk(f"c{n}", f"actor{n % 3}", f"node{n % 2}", steps, steps * 8, k,
                                float(k), checksum=int(rng.integers(0, 2**32))))
            n += 1
        per_update.append(chunks)
    caps = {
        "hbm": max(sum(c.nbytes for c in cs) for cs in per_update),
        "host": sum(c.nbytes for cs in per_update for c in cs),
    }
    events: list[PlaneEvent] = []
    t = 0.0

    def emit(kind, **kw):
        nonlocal t
        t += 0.25
        events.append(PlaneEvent(kind, t, **kw))

    epochs = draw(st.integers(1, 3))
    minibatches = draw(st.integers(1, 4))
    for k, chunks in enumerate(per_update):
        for c in chunks:
            emit(E.INGESTED, chunk=c)
            emit(E.PLACED, chunk_id=c.id, tier="host", nbytes=c.nbytes)
        keep_idx = {}
        for c in chunks:
            if style == "range":  # drop a tail
                d = int(rng.integers(0, c.steps)) if rng.random() < 0.3 else 0
                dropped = np.arange(c.steps - d, c.steps)
            else:  # drop a random subset (maybe all)
                dropped = np.flatnonzero(rng.random(c.steps) < 0.15)
            if dropped.size:
                emit(E.DROPPED, chunk_id=c.id, reason="truncated", indices=dropped)
            keep_idx[c.id] = np.setdiff1d(np.arange(c.steps), dropped)
        for c in chunks:
            emit(E.MOVED, chunk_id=c.id, src_tier="host", dst_tier="hbm", nbytes=c.nbytes)
        sums = {c.id: c.checksum for c in chunks}
        for _ in range(epochs):
            if style == "range":
                batches = [[] for _ in range(minibatches)]
                for c in chunks:
                    stop = int(keep_idx[c.id].size)  # a prefix survives
                    cuts = np.linspace(0, stop, minibatches + 1).astype(int)
                    for b in range(minibatches):
                        if cuts[b + 1] > cuts[b]:
                            batches[b].append((c.id, range(int(cuts[b]), int(cuts[b + 1]))))
            else:
                pairs = [(c.id, i) for c in chunks for i in keep_idx[c.id]]
                order = rng.permutation(len(pairs))
                batches = []
                for part in np.array_split(order, minibatches):
                    by_chunk: dict = {}
                    for p in part:
                        cid, i = pairs[p]
                        by_chunk.setdefault(cid, []).append(i)
                    batches.append([(cid, np.array(ix)) for cid, ix in by_chunk.items()])
            for batch in batches:
                if batch:
                    emit(E.DELIVERED, update=k, selections=batch,
                         checksums={cid: sums[cid] for cid, _ in batch})
        emit(E.CONSUMED, update=k)
        for c in chunks:
            if keep:
                emit(E.MOVED, chunk_id=c.id, src_tier="hbm", dst_tier="host", nbytes=c.nbytes)
            else:
                emit(E.EVICTED, chunk_id=c.id)
    return events, caps, per_update, keep_idx_all(per_update, events), epochs


def keep_idx_all(per_update, events):
    """Samples that were delivered at least once, per chunk id."""
    got: dict = {c.id: set() for cs in per_update for c in cs}
    for ev in events:
        if ev.kind is E.DELIVERED:
            for cid, ix in ev.selections:
                steps = next(c.steps for cs in per_update for c in cs if c.id == cid)
                got[cid].update(as_array(ix, steps).tolist())
    return got


def deliveries(events):
    return [i for i, ev in enumerate(events) if ev.kind is E.DELIVERED]


@SETTINGS
@given(on_policy_streams())
def test_valid_on_policy_streams_are_clean(stream):
    events, caps, per_update, delivered, epochs = stream
    report = run(OnPolicy(), events, caps)
    assert_clean(report)
    chunks = [c for cs in per_update for c in cs]
    n_ingested = sum(c.steps for c in chunks)
    n_delivered = sum(len(v) for v in delivered.values())
    assert report.ingested_samples == n_ingested
    assert report.ingested_bytes == sum(c.nbytes for c in chunks)
    assert report.delivered_samples == epochs * n_delivered
    assert report.dropped_samples.get("truncated", 0) == n_ingested - n_delivered
    assert report.updates_consumed == len(per_update)
    assert report.peak_occupancy["hbm"] <= caps["hbm"]
    assert report.checksums_verified == sum(len(ev.checksums or ()) for ev in events)
    assert report.finished


@SETTINGS
@given(on_policy_streams(), st.data())
def test_on_policy_lost_sample(stream, data):
    events, caps, per_update, delivered, _ = stream
    candidates = [(cid, i) for cid, ix in delivered.items() for i in sorted(ix)]
    if not candidates:
        return
    cid, i = data.draw(st.sampled_from(candidates))
    steps = {c.id: c.steps for cs in per_update for c in cs}
    edited = []
    for ev in events:
        if ev.kind is E.DELIVERED:
            sels = []
            for c, ix in ev.selections:
                arr = as_array(ix, steps[c])
                if c == cid:
                    arr = arr[arr != i]
                if arr.size:
                    sels.append((c, arr))
            if not sels:
                continue
            ev = replace(ev, selections=sels)
        edited.append(ev)
    assert only(run(OnPolicy(), edited, caps), V.LOST) == 1


@SETTINGS
@given(on_policy_streams(), st.data())
def test_on_policy_sample_repeated_in_one_delivery(stream, data):
    events, caps, *_ = stream
    where = deliveries(events)
    if not where:
        return
    at = data.draw(st.sampled_from(where))
    ev = events[at]
    cid, ix = ev.selections[0]
    first = int(as_array(ix, 10**6)[0])
    events[at] = replace(ev, selections=[*ev.selections, (cid, np.array([first]))])
    report = run(OnPolicy(), events, caps)
    assert only(report, V.DUPLICATED) == 1
    assert str(cid) in report.examples["duplicated"][0]


@SETTINGS
@given(on_policy_streams(keep_resident=True, min_updates=2), st.data())
def test_on_policy_sample_used_by_a_second_update(stream, data):
    """Re-delivering update k's data to update k+1 is a duplicate, and stale too: both are true."""
    events, caps, per_update, delivered, _ = stream
    k = data.draw(st.integers(0, len(per_update) - 2))
    used = [(c.id, sorted(delivered[c.id])) for c in per_update[k] if delivered[c.id]]
    if not used:
        return
    cid, ix = used[0]
    at = max(i for i in deliveries(events) if events[i].update == k + 1) if any(
        events[i].update == k + 1 for i in deliveries(events)) else None
    if at is None:
        return
    ev = events[at]
    events[at] = replace(ev, selections=[*ev.selections, (cid, np.array(ix))])
    report = run(OnPolicy(), events, caps)
    assert report.by_kind["duplicated"] == len(ix)
    assert report.by_kind["stale"] == len(ix)
    assert report.violations == 2 * len(ix)


@SETTINGS
@given(on_policy_streams())
def test_on_policy_stale_chunk(stream):
    """A chunk of another policy version delivered into update k: stale, and only stale."""
    events, caps, per_update, *_ = stream
    k = len(per_update) - 1
    late = mk("late", steps=6, version=k - 1)  # arrives after update k-1 was consumed
    at = next(i for i, ev in enumerate(events) if ev.kind is E.CONSUMED and ev.update == k)
    t = events[at].t
    events[at:at] = [
        PlaneEvent(E.INGESTED, t, chunk=late),
        PlaneEvent(E.DELIVERED, t, update=k, selections=[("late", range(6))]),
    ]
    report = run(OnPolicy(), events, caps)
    assert only(report, V.STALE) == 6
    assert "'late'" in report.examples["stale"][0] and f"update {k}" in report.examples["stale"][0]


@SETTINGS
@given(on_policy_streams(), st.data())
def test_on_policy_corrupted_bytes(stream, data):
    events, caps, *_ = stream
    where = [i for i in deliveries(events) if events[i].checksums]
    if not where:
        return
    at = data.draw(st.sampled_from(where))
    sums = dict(events[at].checksums)
    cid = next(iter(sums))
    sums[cid] ^= 0x40
    events[at] = replace(events[at], checksums=sums)
    report = run(OnPolicy(), events, caps)
    assert only(report, V.BYTES_CHANGED) == 1
    assert repr(cid) in report.examples["bytes_changed"][0]


@SETTINGS
@given(on_policy_streams())
def test_on_policy_tier_overflow(stream):
    events, caps, *_ = stream
    t = events[0].t
    events[1:1] = [
        PlaneEvent(E.PLACED, t, chunk_id="ghost", tier="hbm", nbytes=caps["hbm"] + 1),
        PlaneEvent(E.EVICTED, t, chunk_id="ghost", tier="hbm"),
    ]
    report = run(OnPolicy(), events, caps)
    assert only(report, V.CAPACITY_EXCEEDED) == 1
    assert "'hbm'" in report.examples["capacity_exceeded"][0]


@SETTINGS
@given(on_policy_streams(), st.data())
def test_on_policy_delivery_after_eviction(stream, data):
    """Evict a fully delivered chunk, then deliver it again inside the same update."""
    events, caps, per_update, delivered, _ = stream
    full = [(k, c) for k, cs in enumerate(per_update) for c in cs if delivered[c.id]]
    if not full:
        return
    k, c = data.draw(st.sampled_from(full))
    at = next(i for i, ev in enumerate(events) if ev.kind is E.CONSUMED and ev.update == k)
    t = events[at].t
    idx = np.array(sorted(delivered[c.id]))
    events[at:at] = [
        PlaneEvent(E.EVICTED, t, chunk_id=c.id),
        PlaneEvent(E.DELIVERED, t, update=k, selections=[(c.id, idx)]),
    ]
    assert only(run(OnPolicy(), events, caps), V.EVICTED_THEN_SAMPLED) == idx.size


@SETTINGS
@given(on_policy_streams(), st.data())
def test_on_policy_delivery_of_a_dropped_sample(stream, data):
    events, caps, per_update, delivered, _ = stream
    dropped = [(k, c, i) for k, cs in enumerate(per_update) for c in cs
               for i in range(c.steps) if i not in delivered[c.id]]
    if not dropped:
        return
    k, c, i = data.draw(st.sampled_from(dropped))
    at = next(i for i, ev in enumerate(events) if ev.kind is E.CONSUMED and ev.update == k)
    events.insert(at, PlaneEvent(E.DELIVERED, events[at].t, update=k,
                                 selections=[(c.id, np.array([i]))]))
    assert only(run(OnPolicy(), events, caps), V.EVICTED_THEN_SAMPLED) == 1


@SETTINGS
@given(on_policy_streams())
def test_on_policy_unknown_samples(stream):
    events, caps, per_update, *_ = stream
    c = per_update[0][0]
    t = events[-1].t
    events += [
        PlaneEvent(E.DELIVERED, t, update=0, selections=[("nope", range(3))]),
        PlaneEvent(E.DELIVERED, t, update=0, selections=[(c.id, np.array([c.steps, -1]))]),
    ]
    assert only(run(OnPolicy(), events, caps), V.UNKNOWN_SAMPLE) == 5


# --- OnPolicy: exact semantics -----------------------------------------------------------------


def test_epochs_inside_one_update_are_fine_and_repeats_across_selections_are_not():
    a = Auditor(OnPolicy())
    a.ingested(mk("c", steps=10), 0.0)
    for _ in range(3):  # three epochs
        a.delivered(0, [("c", range(10))], 1.0)
    assert a.report().violations == 0
    # one delivery naming 3..5 twice through overlapping selections
    a.delivered(0, [("c", range(6)), ("c", slice(3, 10))], 2.0)
    a.delivered(0, [("c", np.array([1, 2])), ("c", np.array([2, 2, 9]))], 2.5)
    report = a.finish(3.0)
    assert only(report, V.DUPLICATED) == 3 + 2
    assert report.delivered_samples == 30 + 6 + 7 + 5


def test_lost_is_visible_when_the_update_is_consumed():
    a = Auditor(OnPolicy())
    a.ingested(mk("c", steps=10, version=3), 0.0)
    a.dropped("c", 0.5, "producer-died", indices=range(8, 10))
    a.delivered(3, [("c", range(5))], 1.0)
    assert a.report().by_kind["lost"] == 0
    a.consumed(3, 2.0)
    live = a.report()
    assert only(live, V.LOST) == 3 and not live.finished
    assert "'c'" in live.examples["lost"][0] and "[5, 6, 7]" in live.examples["lost"][0]
    assert live.dropped_samples == {"producer-died": 2}
    assert a.finish(3.0).by_kind["lost"] == 3  # not counted twice


def test_late_chunk_of_a_consumed_version_must_be_dropped():
    a = Auditor(OnPolicy())
    a.consumed(0, 1.0)
    a.ingested(mk("late", steps=4, version=0), 2.0)  # resident, but can never be used
    a.ingested(mk("late2", steps=4, version=0), 2.0)
    a.dropped("late2", 2.5, "stale")
    a.ingested(mk("next", steps=4, version=1), 2.0)  # for an update that has not happened
    report = a.finish(3.0)
    assert only(report, V.LOST) == 4
    assert report.dropped_samples == {"stale": 4}
    assert report.unused_resident_samples == 4  # "next" waits, legitimately


def test_chunk_evicted_before_delivery_is_lost_at_once():
    a = Auditor(OnPolicy())
    a.ingested(mk("c", steps=5, version=1), 0.0)
    a.delivered(1, [("c", range(2))], 0.5)
    a.evicted("c", 1.0)
    assert a.report().by_kind["lost"] == 3
    a.consumed(1, 2.0)
    assert only(a.finish(3.0), V.LOST) == 3


# =============================================================================================
# BoundedStaleness: an IMPALA/APPO-like plane
# =============================================================================================


@st.composite
def staleness_streams(draw):
    """Chunks arrive with lagging versions; too-stale ones are dropped and evicted; the rest are
    delivered, possibly in several deliveries per update, into at most max_reuse updates."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    contract = BoundedStaleness(max_lag=draw(st.integers(0, 3)), max_reuse=draw(st.integers(1, 3)))
    n_updates = draw(st.integers(1, 6))
    events: list[PlaneEvent] = []
    pool: dict = {}  # id -> [chunk, uses, last_update]
    t = 0.0
    n = 0

    def emit(kind, **kw):
        nonlocal t
        t += 0.25
        events.append(PlaneEvent(kind, t, **kw))

    for k in range(n_updates):
        for _ in range(draw(st.integers(0, 3))):
            version = draw(st.integers(k - contract.max_lag - 1, k))
            steps = draw(st.integers(1, 30))
            c = Chunk(n, "actor", "node", steps, steps * 16, version, t,
                      checksum=int(rng.integers(0, 2**32)))
            n += 1
            emit(E.INGESTED, chunk=c)
            emit(E.PLACED, chunk_id=c.id, tier="host", nbytes=c.nbytes)
            pool[c.id] = [c, np.zeros(steps, int), np.full(steps, -(10**9))]
        for cid in list(pool):
            c, uses, _ = pool[cid]
            if not contract.admits(c.policy_version, k):
                emit(E.DROPPED, chunk_id=cid, reason="stale")
                emit(E.EVICTED, chunk_id=cid)
                del pool[cid]
        for _ in range(draw(st.integers(0, 3))):
            sels, sums = [], {}
            for cid, (c, uses, last) in pool.items():
                ok = np.flatnonzero((uses < contract.max_reuse) | (last == k))
                pick = ok[rng.random(ok.size) < 0.6]
                if pick.size:
                    rng.shuffle(pick)
                    sels.append((cid, pick))
                    sums[cid] = c.checksum
                    fresh = pick[last[pick] != k]
                    uses[fresh] += 1
                    last[pick] = k
            if sels:
                emit(E.DELIVERED, update=k, selections=sels, checksums=sums)
        emit(E.CONSUMED, update=k)
        for cid in list(pool):
            if (pool[cid][1] >= contract.max_reuse).all():
                emit(E.EVICTED, chunk_id=cid)
                del pool[cid]
    for cid, (c, uses, _) in pool.items():  # shutdown
        action = rng.integers(0, 3)
        if action == 1:
            emit(E.DROPPED, chunk_id=cid, reason="shutdown")
            emit(E.EVICTED, chunk_id=cid)
        elif action == 2 and (uses > 0).all():
            emit(E.EVICTED, chunk_id=cid)
    caps = {"host": sum(ev.chunk.nbytes for ev in events if ev.kind is E.INGESTED) or 1}
    return contract, events, caps


@SETTINGS
@given(staleness_streams())
def test_valid_bounded_staleness_streams_are_clean(stream):
    contract, events, caps = stream
    report = run(contract, events, caps)
    assert_clean(report)
    dropped = sum(report.dropped_samples.values())
    assert report.ingested_samples >= dropped
    assert set(report.dropped_samples) <= {"stale", "shutdown"}


@SETTINGS
@given(staleness_streams())
def test_bounded_staleness_stale_delivery(stream):
    contract, events, caps = stream
    t = events[-1].t if events else 0.0
    k = 50
    old = mk("old", steps=7, version=k - contract.max_lag - 1)
    events += [
        PlaneEvent(E.INGESTED, t, chunk=old),
        PlaneEvent(E.DELIVERED, t, update=k, selections=[("old", range(7))]),
        PlaneEvent(E.EVICTED, t, chunk_id="old"),
    ]
    report = run(contract, events, caps)
    assert only(report, V.STALE) == 7
    assert f"versions >= {k - contract.max_lag}" in report.examples["stale"][0]


@SETTINGS
@given(staleness_streams(), st.integers(1, 3))
def test_bounded_staleness_over_reuse(stream, epochs):
    contract, events, caps = stream
    t = events[-1].t if events else 0.0
    c = mk("hot", steps=4, version=10**6)  # newer than anything: never stale
    events.append(PlaneEvent(E.INGESTED, t, chunk=c))
    for j in range(contract.max_reuse + 1):  # one update too many
        for _ in range(epochs):  # several deliveries inside one update are one use
            events.append(PlaneEvent(E.DELIVERED, t, update=1000 + j,
                                     selections=[("hot", range(4))]))
    report = run(contract, events, caps)
    assert only(report, V.OVER_REUSED) == 4
    assert "'hot'" in report.examples["over_reused"][0]


@SETTINGS
@given(staleness_streams(), st.booleans())
def test_bounded_staleness_lost_chunk(stream, via_tiers):
    """Never delivered nor dropped, and gone: evicted from the plane, or from its only tier."""
    contract, events, caps = stream
    t = events[-1].t if events else 0.0
    events += [
        PlaneEvent(E.INGESTED, t, chunk=mk("gone", steps=5, version=10**6)),
        PlaneEvent(E.PLACED, t, chunk_id="gone", tier="nvme", nbytes=40),
        PlaneEvent(E.EVICTED, t, chunk_id="gone", tier="nvme" if via_tiers else None),
    ]
    assert only(run(contract, events, caps), V.LOST) == 5


@SETTINGS
@given(staleness_streams())
def test_bounded_staleness_repeat_within_delivery(stream):
    contract, events, caps = stream
    t = events[-1].t if events else 0.0
    events += [
        PlaneEvent(E.INGESTED, t, chunk=mk("r", steps=5, version=10**6)),
        PlaneEvent(E.DELIVERED, t, update=10**6, selections=[("r", np.array([0, 1, 2, 1]))]),
    ]
    assert only(run(contract, events, caps), V.DUPLICATED) == 1


def test_bounded_staleness_counts_uses_per_update_and_keeps_resident_samples():
    a = Auditor(BoundedStaleness(max_lag=1, max_reuse=2), {"host": 1000})
    a.ingested(mk("c", steps=4, version=5), 0.0)
    a.placed("c", "host", 32, 0.0)
    a.delivered(5, [("c", range(2))], 1.0)
    a.delivered(5, [("c", range(2))], 1.1)  # same update: still one use
    a.delivered(6, [("c", np.array([0, 1]))], 2.0)  # second use
    assert a.report().violations == 0
    a.delivered(6, [("c", range(1, 2))], 2.1)  # still update 6
    assert a.report().violations == 0
    a.delivered(7, [("c", range(1))], 3.0)  # a stale third use
    report = a.finish(4.0)
    assert report.by_kind["over_reused"] == 1
    assert report.by_kind["stale"] == 1
    assert report.violations == 2
    assert report.unused_resident_samples == 2  # samples 2 and 3 are still in "host"


# =============================================================================================
# Replay: a DQN-like plane that asks the rate limiter
# =============================================================================================


@st.composite
def replay_streams(draw):
    """FIFO buffer; evict first, then place; insert and sample only when the limiter allows."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    min_size = draw(st.integers(4, 40))
    contract = Replay(
        capacity=draw(st.integers(min_size, 4 * min_size)),
        replay_ratio=draw(st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0])),
        min_size=min_size,
    )
    bytes_per_step = 12
    caps = {"host": contract.capacity * bytes_per_step}
    ops = draw(st.lists(st.tuples(st.booleans(), st.integers(1, min_size)), min_size=1,
                        max_size=60))
    events: list[PlaneEvent] = []
    live: list[Chunk] = []
    inserted = sampled = update = n = 0
    t = 0.0

    def emit(kind, **kw):
        nonlocal t
        t += 0.25
        events.append(PlaneEvent(kind, t, **kw))

    for want_insert, size in ops:
        can_i = contract.can_insert(size, inserted, sampled)
        can_s = contract.can_sample(size, inserted, sampled)
        assert can_i or can_s
        if (want_insert and can_i) or not can_s:
            c = Chunk(n, "actor", "node", size, size * bytes_per_step, 0, t,
                      checksum=int(rng.integers(0, 2**32)))
            n += 1
            while live and sum(x.steps for x in live) + size > contract.capacity:
                emit(E.EVICTED, chunk_id=live.pop(0).id)
            emit(E.INGESTED, chunk=c)
            emit(E.PLACED, chunk_id=c.id, tier="host", nbytes=c.nbytes)
            live.append(c)
            inserted += size
        else:
            flat = np.concatenate([np.full(c.steps, j) for j, c in enumerate(live)])
            offs = np.concatenate([np.arange(c.steps) for c in live])
            picks = rng.integers(0, flat.size, size)  # uniform, with replacement
            by_chunk: dict = {}
            for p in picks:
                by_chunk.setdefault(live[flat[p]].id, []).append(offs[p])
            emit(E.DELIVERED, update=update, selections=[(cid, np.array(ix))
                                                         for cid, ix in by_chunk.items()],
                 checksums={c.id: c.checksum for c in live if c.id in by_chunk})
            emit(E.CONSUMED, update=update)
            update += 1
            sampled += size
    return contract, events, caps, inserted, sampled


@SETTINGS
@given(replay_streams())
def test_valid_replay_streams_are_clean(stream):
    contract, events, caps, inserted, sampled = stream
    report = run(contract, events, caps)
    assert_clean(report)
    assert report.ingested_samples == inserted
    assert report.delivered_samples == sampled
    assert report.peak_occupancy.get("host", 0) <= caps["host"]


@SETTINGS
@given(replay_streams())
def test_replay_sampling_an_evicted_chunk(stream):
    contract, events, caps, *_ = stream
    where = deliveries(events)
    if not where:
        return
    at = where[-1]
    cid, ix = events[at].selections[0]
    events.insert(at, PlaneEvent(E.EVICTED, events[at].t, chunk_id=cid))
    report = run(contract, events, caps)
    assert only(report, V.EVICTED_THEN_SAMPLED) == len(ix)


@SETTINGS
@given(replay_streams())
def test_replay_over_sampling_is_one_excursion(stream):
    contract, events, caps, inserted, sampled = stream
    t = events[-1].t
    last = next(ev.chunk for ev in reversed(events) if ev.kind is E.INGESTED)
    allowed = contract.samples_allowed(inserted, sampled)
    burst = allowed + 1
    events += [
        PlaneEvent(E.DELIVERED, t, update=10**6, selections=[(last.id, np.zeros(burst, int))]),
        PlaneEvent(E.DELIVERED, t, update=10**6, selections=[(last.id, np.zeros(3, int))]),
    ]
    report = run(contract, events, caps)
    assert only(report, V.RATIO_OUT_OF_BAND) == 1  # still out after the second: same excursion
    assert report.out_of_band_events == 2


def test_replay_sampling_before_warm_up_and_separate_excursions():
    rp = Replay(capacity=1000, replay_ratio=1.0, min_size=10, error_buffer=5)
    a = Auditor(rp)
    a.ingested(mk(0, steps=5), 0.0)
    a.delivered(0, [(0, np.array([0, 1]))], 1.0)  # before warm-up
    report = a.report()
    assert only(report, V.RATIO_OUT_OF_BAND) == 1
    assert "warm-up" in report.examples["ratio_out_of_band"][0]
    a.ingested(mk(1, steps=5), 2.0)  # warmed up: error = 0 - 2, back in band
    assert a.report().out_of_band_events == 1
    a.delivered(1, [(1, np.arange(4))], 3.0)  # error -6: out again
    a.ingested(mk(2, steps=5), 4.0)  # error -1: back in
    a.ingested(mk(3, steps=7), 5.0)  # error +6: under-sampled, out
    report = a.finish(6.0)
    assert only(report, V.RATIO_OUT_OF_BAND) == 3
    assert report.out_of_band_events == 3


@SETTINGS
@given(replay_streams())
def test_replay_buffer_kept_past_its_capacity(stream):
    """The plane skips the evictions that made room for an insert: the tier overflows."""
    contract, events, caps, *_ = stream
    first = next((i for i, ev in enumerate(events) if ev.kind is E.EVICTED), None)
    if first is None:
        return
    end = first
    while events[end].kind is E.EVICTED:
        end += 1
    del events[first:end]
    report = run(contract, events, caps)
    assert only(report, V.CAPACITY_EXCEEDED) >= 1
    assert "'host'" in report.examples["capacity_exceeded"][0]


def test_replay_sampling_from_an_overfull_buffer():
    """Replay.capacity bounds what may be sampled from, even with no tier capacities declared."""
    a = Auditor(Replay(capacity=10, replay_ratio=1.0, min_size=5))
    a.ingested(mk(0, steps=5), 0.0)
    a.ingested(mk(1, steps=5), 1.0)
    a.delivered(0, [(0, np.arange(5))], 2.0)
    a.ingested(mk(2, steps=5), 3.0)  # 15 live steps, nothing evicted
    a.delivered(1, [(2, range(5))], 4.0)
    assert only(a.report(), V.CAPACITY_EXCEEDED) == 1
    assert "Replay.capacity 10" in a.report().examples["capacity_exceeded"][0]
    a.evicted(0, 5.0)
    a.delivered(2, [(1, range(1))], 6.0)
    assert only(a.finish(7.0), V.CAPACITY_EXCEEDED) == 1


def test_replay_evictions_are_normal_and_never_lost():
    a = Auditor(Replay(capacity=10, replay_ratio=1.0, min_size=5))
    for i in range(5):
        a.ingested(mk(i, steps=5), float(i))
        if i >= 2:
            a.evicted(i - 2, float(i))
    report = a.finish(10.0)
    assert only(report, V.RATIO_OUT_OF_BAND) == 1  # never sampled: under-sampled after warm-up
    assert report.by_kind["lost"] == 0


# =============================================================================================
# always: tiers, checksums, bookkeeping
# =============================================================================================


def test_tier_occupancy_follows_place_move_evict():
    a = Auditor(OnPolicy(), {"hbm": 100, "host": 150})
    a.placed("x", "host", 80, 0.0)
    a.placed("y", "host", 70, 0.0)  # exactly full: fine
    a.moved("x", "host", "hbm", 80, 1.0)
    assert (a.occupancy("host"), a.occupancy("hbm")) == (70, 80)
    a.placed("z", "hbm", 20, 1.5)  # full again
    a.placed("w", "hbm", 1, 2.0)  # one byte over
    a.evicted("w", 2.5, tier="hbm")
    a.moved("y", "host", "hbm", 70, 3.0)  # evict-before-place not respected
    a.evicted("y", 3.5)  # leaves the plane: all its tiers
    a.evicted("nothing", 3.6, tier="hbm")  # unknown: ignored
    report = a.finish(4.0)
    assert only(report, V.CAPACITY_EXCEEDED) == 2
    assert a.occupancy("hbm") == 100 and a.occupancy("host") == 0
    assert report.peak_occupancy == {"host": 150, "hbm": 170}
    assert len(report.examples["capacity_exceeded"]) == 2


def test_checksums_are_compared_only_when_both_sides_are_known():
    a = Auditor(OnPolicy())
    a.ingested(mk("a", checksum=11), 0.0)
    a.ingested(mk("b", checksum=None), 0.0)
    a.delivered(0, [("a", range(5)), ("b", range(5))], 1.0, {"a": 11, "b": 99})
    assert a.report().checksums_verified == 1 and a.report().violations == 0
    a.delivered(0, [("a", range(5, 10)), ("b", range(5, 10))], 2.0, {"a": 12})
    assert only(a.report(), V.BYTES_CHANGED) == 1


def test_checksum_of_real_bytes_round_trip():
    payload = {"obs": np.random.default_rng(1).random((16, 4)), "rew": np.arange(16.0)}
    c = Chunk.from_payload("p", "actor", "node", 0, 0.0, payload)
    a = Auditor(OnPolicy())
    a.ingested(c, 0.0)
    moved = {k: v.copy() for k, v in payload.items()}  # a faithful copy
    a.delivered(0, [("p", range(8))], 1.0, {"p": checksum_bytes(moved)})
    moved["obs"][3, 1] += 1e-12  # one flipped low bit
    a.delivered(0, [("p", range(8, 16))], 2.0, {"p": checksum_bytes(moved)})
    assert only(a.finish(3.0), V.BYTES_CHANGED) == 1


def test_duplicate_ingestion_is_a_duplicate():
    a = Auditor(BoundedStaleness(max_lag=1))
    a.ingested(mk("c", steps=3), 0.0)
    a.ingested(mk("c", steps=3), 1.0)
    a.delivered(0, [("c", range(3))], 2.0)
    report = a.finish(3.0)
    assert only(report, V.DUPLICATED) == 3
    assert report.ingested_samples == 3 and report.ingested_chunks == 1


def test_drops_are_counted_by_reason_and_never_violations():
    a = Auditor(BoundedStaleness(max_lag=0))
    a.ingested(mk("c", steps=10), 0.0)
    a.dropped("c", 1.0, "stale", indices=range(4))
    a.dropped("c", 1.5, "stale", indices=np.array([3, 4]))  # 3 already dropped
    a.dropped("c", 2.0, "producer-died")
    a.dropped("ghost", 2.0, "producer-died", indices=range(2))
    a.evicted("c", 3.0)
    report = a.finish(4.0)
    assert_clean(report)
    assert report.dropped_samples == {"stale": 5, "producer-died": 7}


def test_report_is_json_ready_and_examples_are_bounded():
    a = Auditor(OnPolicy())
    for i in range(2 * MAX_EXAMPLES):
        a.ingested(mk(i, steps=2, version=1), 0.0)
        a.delivered(0, [(i, range(2))], 1.0)
    report = a.finish(2.0)
    assert report.by_kind["stale"] == 4 * MAX_EXAMPLES
    assert len(report.examples["stale"]) == MAX_EXAMPLES
    assert report.delivered_bytes == report.ingested_bytes == 2 * MAX_EXAMPLES * 16
    d = json.loads(json.dumps(report.to_dict()))
    assert d["violations"] == report.violations == 4 * MAX_EXAMPLES
    assert set(d["by_kind"]) == ALL_KINDS
    assert d["contract"] == {"kind": "on_policy"}
    assert "stale=20" in report.summary()
    assert not report.ok


def test_finish_is_final():
    a = Auditor(OnPolicy())
    a.ingested(mk("c", steps=2), 0.0)
    first = a.finish(1.0)
    assert a.finish(2.0) is first and a.report() is first
    with pytest.raises(ConduitError, match="finish"):
        a.delivered(0, [("c", range(2))], 3.0)


def test_observe_matches_direct_calls_and_checks_fields():
    c = mk("c", steps=4, checksum=1)
    direct = Auditor(OnPolicy(), {"hbm": 64})
    direct.ingested(c, 0.0)
    direct.placed("c", "hbm", 32, 0.1)
    direct.moved("c", "hbm", "host", 32, 0.2)
    direct.dropped("c", 0.3, "truncated", np.array([3]))
    direct.delivered(0, [("c", range(3))], 0.4, {"c": 1})
    direct.consumed(0, 0.5)
    direct.evicted("c", 0.6, "host")
    direct.evicted("c", 0.7)
    streamed = Auditor(OnPolicy(), {"hbm": 64})
    for ev in [
        PlaneEvent(E.INGESTED, 0.0, chunk=c),
        PlaneEvent(E.PLACED, 0.1, chunk_id="c", tier="hbm", nbytes=32),
        PlaneEvent("moved", 0.2, chunk_id="c", src_tier="hbm", dst_tier="host", nbytes=32),
        PlaneEvent(E.DROPPED, 0.3, chunk_id="c", reason="truncated", indices=np.array([3])),
        PlaneEvent(E.DELIVERED, 0.4, update=0, selections=[("c", range(3))], checksums={"c": 1}),
        PlaneEvent(E.CONSUMED, 0.5, update=0),
        PlaneEvent(E.EVICTED, 0.6, chunk_id="c", tier="host"),
        PlaneEvent(E.EVICTED, 0.7, chunk_id="c"),
    ]:
        streamed.observe(ev)
    assert direct.finish(1.0) == streamed.finish(1.0)
    with pytest.raises(ConduitError, match="reason"):
        streamed_bad = Auditor(OnPolicy())
        streamed_bad.observe(PlaneEvent(E.DROPPED, 0.0, chunk_id="c"))
    with pytest.raises(ConduitError, match="update"):
        Auditor(OnPolicy()).observe(PlaneEvent(E.DELIVERED, 0.0, selections=[]))


def test_the_auditor_imports_no_backend():
    import ast
    import inspect

    import conduit.audit
    import conduit.chunk
    import conduit.contracts

    for module in (conduit.audit, conduit.chunk, conduit.contracts):
        tree = ast.parse(inspect.getsource(module))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in names if m.split(".")[0] in {"simpy", "torch", "ray"}}
        assert not {m for m in names if m.startswith(("conduit.sim", "conduit.runtime"))}


def test_range_selections_audit_fast():
    """Order-of-magnitude guard: 2M range sample-deliveries must take well under a second."""
    import time

    a = Auditor(OnPolicy())
    chunks = [mk(i, steps=500) for i in range(400)]
    for c in chunks:
        a.ingested(c, 0.0)
    batches = [[(c.id, range(500)) for c in chunks[b::8]] for b in range(8)]
    start = time.perf_counter()
    for _ in range(10):
        for batch in batches:
            a.delivered(0, batch, 1.0)
    elapsed = time.perf_counter() - start
    assert a.report().delivered_samples == 2_000_000
    assert elapsed < 2.0, f"{2e6 / elapsed:,.0f} samples/s"


# =============================================================================================
# lazy per-chunk state: identical to eager per-sample arrays, O(1) for whole-chunk traffic
# =============================================================================================


class EagerAuditor(Auditor):
    """The reference: per-sample arrays from ingestion on, as if the lazy path did not exist."""

    lazy = False


WHOLE_SHAPES = ["range", "slice", "padded", "arange", "mask"]
PART_SHAPES = ["part_range", "part_array", "full_length", "strided", "reversed", "perm", "empty"]


@st.composite
def any_indices(draw, steps):
    """Indices naming a whole chunk (five spellings) or part of it (in range or not, repeats;
    ``full_length`` names ``steps`` samples, but some twice)."""
    shape = draw(st.sampled_from(WHOLE_SHAPES + PART_SHAPES))
    if shape == "range":
        return range(steps)
    if shape == "slice":
        return draw(st.sampled_from([slice(None), slice(0, None), slice(None, steps)]))
    if shape == "padded":  # whole, plus out-of-range indices on both sides
        return range(-draw(st.integers(0, 2)), steps + draw(st.integers(0, 2)))
    if shape == "arange":
        return np.arange(steps)
    if shape == "mask":
        return np.ones(steps, np.bool_)
    if shape == "part_range":
        lo = draw(st.integers(0, steps))
        return range(lo, draw(st.integers(lo, steps)))
    if shape == "part_array":
        return np.array(draw(st.lists(st.integers(-1, steps), max_size=steps + 2)), np.int64)
    if shape == "full_length":
        return np.array(draw(st.lists(st.integers(0, steps - 1), min_size=steps, max_size=steps)))
    if shape == "strided":
        return range(draw(st.integers(0, 2)), steps, draw(st.integers(2, 3)))
    if shape == "reversed":
        return slice(None, None, -1)
    if shape == "perm":
        return np.array(draw(st.permutations(range(steps))), np.int64)
    return range(0)


@st.composite
def mixed_streams(draw):
    """Random events under any contract: chunks ingested (some twice), placed, moved, delivered
    whole or in part to any update (stale, repeated, reused, unknown, after eviction or drop,
    with right or corrupted checksums), dropped whole or in part, consumed, evicted. ``None``
    marks a point where the live reports are compared."""
    which = draw(st.sampled_from(["on_policy", "bounded_staleness", "replay"]))
    if which == "on_policy":
        contract = OnPolicy()
    elif which == "bounded_staleness":
        contract = BoundedStaleness(max_lag=draw(st.integers(0, 2)),
                                    max_reuse=draw(st.integers(1, 3)))
    else:
        min_size = draw(st.integers(0, 10))
        contract = Replay(capacity=draw(st.integers(max(min_size, 1), 60)),
                          replay_ratio=draw(st.sampled_from([0.5, 1.0, 2.0])), min_size=min_size,
                          error_buffer=draw(st.sampled_from([None, 8.0])))
    caps = {"hbm": draw(st.integers(50, 400)), "host": 400}
    chunks: list[Chunk] = []
    events: list[PlaneEvent | None] = []
    t = 0.0
    ops = ["ingest", "deliver", "deliver", "deliver", "drop", "drop", "evict", "consume", "tier",
           "report"]
    for _ in range(draw(st.integers(1, 60))):
        op = draw(st.sampled_from(ops))
        t += 0.25
        if op == "ingest" or not chunks:
            if chunks and draw(st.integers(0, 9)) == 0:  # the same id again
                c = draw(st.sampled_from(chunks))
            else:
                steps = draw(st.sampled_from([1, 2, 3, 5, 8, 13, 30]))
                c = mk(len(chunks), steps=steps, version=draw(st.integers(0, 4)),
                       checksum=draw(st.sampled_from([None, 7])))
                chunks.append(c)
            events.append(PlaneEvent(E.INGESTED, t, chunk=c))
        elif op == "report":
            events.append(None)
        elif op == "deliver":
            sels, sums = [], {}
            for _ in range(draw(st.integers(1, 3))):
                if draw(st.integers(0, 9)) == 0:
                    sels.append(("ghost", range(draw(st.integers(0, 3)))))
                    continue
                c = draw(st.sampled_from(chunks))
                sels.append((c.id, draw(any_indices(c.steps))))
                sums[c.id] = draw(st.sampled_from([None, 7, 8]))
            events.append(PlaneEvent(E.DELIVERED, t, update=draw(st.integers(0, 5)),
                                     selections=sels,
                                     checksums=sums if draw(st.booleans()) else None))
        elif op == "drop":
            if draw(st.integers(0, 9)) == 0:
                cid, indices = "ghost", draw(st.sampled_from([None, range(2), np.arange(3)]))
            else:
                c = draw(st.sampled_from(chunks))
                cid = c.id
                indices = None if draw(st.booleans()) else draw(any_indices(c.steps))
            events.append(PlaneEvent(E.DROPPED, t, chunk_id=cid, indices=indices,
                                     reason=draw(st.sampled_from(["stale", "truncated"]))))
        elif op == "evict":
            events.append(PlaneEvent(E.EVICTED, t, chunk_id=draw(st.sampled_from(chunks)).id))
        elif op == "consume":
            events.append(PlaneEvent(E.CONSUMED, t, update=draw(st.integers(0, 5))))
        else:
            c = draw(st.sampled_from(chunks))
            how = draw(st.sampled_from(["place", "move", "evict"]))
            if how == "place":
                events.append(PlaneEvent(E.PLACED, t, chunk_id=c.id,
                                         tier=draw(st.sampled_from(["hbm", "host"])),
                                         nbytes=c.nbytes))
            elif how == "move":
                events.append(PlaneEvent(E.MOVED, t, chunk_id=c.id, src_tier="host",
                                         dst_tier="hbm", nbytes=c.nbytes))
            else:
                events.append(PlaneEvent(E.EVICTED, t, chunk_id=c.id,
                                         tier=draw(st.sampled_from(["hbm", "host"]))))
    return contract, caps, events, t + 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_streams())
def test_lazy_chunk_state_reports_exactly_what_eager_arrays_do(stream):
    contract, caps, events, end = stream
    lazy, eager = Auditor(contract, caps), EagerAuditor(contract, caps)
    for ev in events:
        if ev is None:
            assert lazy.report().to_dict() == eager.report().to_dict()
        else:
            lazy.observe(ev)
            eager.observe(ev)
    assert lazy.finish(end).to_dict() == eager.finish(end).to_dict()


def test_partial_selections_expand_the_uniform_counters_exactly():
    """Whole, then part, then whole again: counts and messages as with per-sample arrays."""
    for cls in (Auditor, EagerAuditor):
        a = cls(BoundedStaleness(max_lag=10, max_reuse=2))
        a.ingested(mk("c", steps=10, version=5), 0.0)
        a.delivered(5, [("c", range(10))], 1.0)  # use 1, all samples alike
        a.delivered(5, [("c", range(3, 6))], 1.5)  # same update: nothing new, still alike
        a.delivered(6, [("c", np.array([0, 1, 2]))], 2.0)  # use 2 for 0..2: they differ now
        a.delivered(7, [("c", slice(None))], 3.0)  # use 3 for 0..2, use 2 for 3..9
        a.dropped("c", 3.5, "truncated", indices=range(8, 10))
        a.dropped("c", 3.6, "truncated", indices=np.arange(10))  # the rest
        a.delivered(7, [("c", range(10))], 4.0)
        report = a.finish(5.0)
        assert report.by_kind["over_reused"] == 3
        assert report.examples["over_reused"] == [(
            "3 samples of chunk 'c' [0:10] delivered to update 7 at t=3 after being used in 2 "
            "other update(s)"
        )]
        assert report.by_kind["evicted_then_sampled"] == 10 and report.violations == 13
        assert report.unused_resident_samples == 0
        assert report.dropped_samples == {"truncated": 10}


def test_huge_chunks_delivered_whole_cost_no_per_sample_memory_or_time():
    """1,000 chunks of 1,000,000 tokens: OnPolicy, each delivered whole (two epochs), consumed,
    evicted; a few dropped whole or never delivered. Eager arrays would need 12 GB."""
    import time
    import tracemalloc

    steps, n, per_update = 1_000_000, 1_000, 250
    tracemalloc.start()
    start = time.perf_counter()
    a = Auditor(OnPolicy(), {"hbm": per_update * steps * 2})
    for k in range(n // per_update):
        chunks = [mk(k * per_update + i, steps=steps, version=k, nbytes=steps * 2)
                  for i in range(per_update)]
        for c in chunks:
            a.ingested(c, float(k))
            a.placed(c.id, "hbm", c.nbytes, float(k))
        a.dropped(chunks[0].id, k + 0.1, "producer-died")
        sels = [(c.id, range(steps)) for c in chunks[2:]]
        for _ in range(2):  # epochs
            for b in range(0, len(sels), 16):
                a.delivered(k, sels[b:b + 16], k + 0.2)
        a.consumed(k, k + 0.5)  # chunks[1] was never delivered: lost
        for c in chunks:
            a.evicted(c.id, k + 0.6)
    report = a.finish(float(n))
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    updates = n // per_update
    assert only(report, V.LOST) == updates * steps
    assert report.examples["lost"][0] == (
        "1000000 samples of chunk 1 [0, 1, 2, 3, 4, 5, ...] (version 0) were never delivered nor "
        "dropped, and update 0 was consumed at t=0.5"
    )
    assert report.delivered_samples == 2 * (n - 2 * updates) * steps
    assert report.dropped_samples == {"producer-died": updates * steps}
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert elapsed < 2.0, f"{report.delivered_samples / elapsed:,.0f} samples/s"


# =============================================================================================
# retired chunks folded into totals: flat memory, the same report while late events stay
# within the window
# =============================================================================================


class UnboundedAuditor(Auditor):
    """The reference for folding: every chunk's state kept forever (the auditor before folding)."""

    retire = False


def window_pair(contract, caps, window):
    """A folding auditor keeping ``window`` retired chunks, and the unbounded reference with the
    same ``RETIRED_WINDOW`` (it appears in ``unknown_sample`` messages)."""
    folded = type("Folded", (Auditor,), {"RETIRED_WINDOW": window})
    unbounded = type("Unbounded", (UnboundedAuditor,), {"RETIRED_WINDOW": window})
    return folded(contract, caps), unbounded(contract, caps)


def _named(ev: PlaneEvent) -> list:
    if ev.kind is E.INGESTED:
        return [ev.chunk.id]
    if ev.kind is E.DELIVERED:
        return [cid for cid, _ in ev.selections] + list(ev.checksums or ())
    return [ev.chunk_id]


def refers_beyond_window(events, window: int) -> bool:
    """Whether an event names a chunk retired more than ``window`` retirements before it: the
    folding auditor's rule (a known chunk retires when evicted without a tier) replayed on ids."""
    from collections import deque

    live: set = set()
    retired: deque = deque()
    forgotten: set = set()
    for ev in events:
        if ev is None:
            continue
        if any(cid in forgotten for cid in _named(ev)):
            return True
        if ev.kind is E.INGESTED and ev.chunk.id not in retired:
            live.add(ev.chunk.id)
        elif ev.kind is E.EVICTED and ev.tier is None and ev.chunk_id in live:
            live.remove(ev.chunk_id)
            retired.append(ev.chunk_id)
            while len(retired) > window:
                forgotten.add(retired.popleft())
    return False


@st.composite
def retiring_streams(draw, safe=False):
    """Chunks that live a whole life (ingested, placed, moved, delivered, dropped, consumed,
    evicted from a tier, then out of the plane: retired), and late events naming retired chunks:
    deliveries, drops, placements, evictions and re-ingestions. ``None`` marks a point where the
    live reports are compared.

    ``safe`` streams keep late events to those a forgotten id counts alike (see the module doc of
    :mod:`conduit.audit`): late deliveries name in-range indices that spell their size, go to the
    update of the chunk's version (admitted under every contract) and carry no checksum; late drops
    name no indices; no re-ingestion; Replay's rate band is too wide to leave.
    """
    which = draw(st.sampled_from(["on_policy", "bounded_staleness", "replay"]))
    if which == "on_policy":
        contract = OnPolicy()
    elif which == "bounded_staleness":
        contract = BoundedStaleness(max_lag=draw(st.integers(0, 2)),
                                    max_reuse=draw(st.integers(1, 3)))
    elif safe:
        contract = Replay(capacity=draw(st.integers(1, 60)), replay_ratio=1.0, min_size=0,
                          error_buffer=1e9)
    else:
        min_size = draw(st.integers(0, 10))
        contract = Replay(capacity=draw(st.integers(max(min_size, 1), 60)),
                          replay_ratio=draw(st.sampled_from([0.5, 1.0, 2.0])), min_size=min_size,
                          error_buffer=draw(st.sampled_from([None, 8.0])))
    caps = {"hbm": draw(st.integers(50, 400)), "host": 400}
    live: list[Chunk] = []
    retired: list[Chunk] = []
    events: list[PlaneEvent | None] = []
    t = 0.0
    ops = ["ingest", "ingest", "place", "move", "deliver", "deliver", "drop", "consume",
           "evict_tier", "retire", "retire", "retire", "late", "late", "report"]
    if not safe:
        ops.append("reingest")
    for _ in range(draw(st.integers(1, 80))):
        op = draw(st.sampled_from(ops))
        t += 0.25
        if op in ("late", "reingest") and not retired or op not in ("consume", "report") and not live:
            op = "ingest"
        if op == "ingest":
            c = mk(len(live) + len(retired), steps=draw(st.sampled_from([1, 2, 3, 5, 8])),
                   version=draw(st.integers(0, 3)), checksum=draw(st.sampled_from([None, 7])))
            live.append(c)
            events.append(PlaneEvent(E.INGESTED, t, chunk=c))
        elif op == "report":
            events.append(None)
        elif op == "place":
            c = draw(st.sampled_from(live))
            events.append(PlaneEvent(E.PLACED, t, chunk_id=c.id,
                                     tier=draw(st.sampled_from(["hbm", "host"])), nbytes=c.nbytes))
        elif op == "move":
            c = draw(st.sampled_from(live))
            events.append(PlaneEvent(E.MOVED, t, chunk_id=c.id, src_tier="host", dst_tier="hbm",
                                     nbytes=c.nbytes))
        elif op == "deliver":
            sels, sums = [], {}
            for _ in range(draw(st.integers(1, 3))):
                c = draw(st.sampled_from(live))
                sels.append((c.id, draw(any_indices(c.steps))))
                sums[c.id] = draw(st.sampled_from([None, 7, 8]))
            events.append(PlaneEvent(E.DELIVERED, t, update=draw(st.integers(0, 4)),
                                     selections=sels,
                                     checksums=sums if draw(st.booleans()) else None))
        elif op == "drop":
            c = draw(st.sampled_from(live))
            indices = None if draw(st.booleans()) else draw(any_indices(c.steps))
            events.append(PlaneEvent(E.DROPPED, t, chunk_id=c.id, indices=indices,
                                     reason=draw(st.sampled_from(["stale", "truncated"]))))
        elif op == "consume":
            events.append(PlaneEvent(E.CONSUMED, t, update=draw(st.integers(0, 4))))
        elif op == "evict_tier":
            events.append(PlaneEvent(E.EVICTED, t, chunk_id=draw(st.sampled_from(live)).id,
                                     tier=draw(st.sampled_from(["hbm", "host"]))))
        elif op == "retire":
            c = live.pop(draw(st.integers(0, len(live) - 1)))
            retired.append(c)
            events.append(PlaneEvent(E.EVICTED, t, chunk_id=c.id))
        elif op == "reingest":
            events.append(PlaneEvent(E.INGESTED, t, chunk=draw(st.sampled_from(retired))))
        else:  # a late event naming a retired chunk
            c = draw(st.sampled_from(retired))
            what = draw(st.sampled_from(["deliver", "deliver", "drop", "place", "evict"]))
            if what == "deliver":
                if safe:
                    lo = draw(st.integers(0, c.steps - 1))
                    hi = draw(st.integers(lo + 1, c.steps))
                    sels = [(c.id, draw(st.sampled_from([range(lo, hi), np.arange(lo, hi)])))]
                    if live and draw(st.booleans()):
                        other = draw(st.sampled_from(live))
                        sels.append((other.id, range(other.steps)))
                    events.append(PlaneEvent(E.DELIVERED, t, update=c.policy_version,
                                             selections=sels))
                else:
                    events.append(PlaneEvent(
                        E.DELIVERED, t, update=draw(st.integers(0, 4)),
                        selections=[(c.id, draw(any_indices(c.steps)))],
                        checksums={c.id: draw(st.sampled_from([None, 7, 8]))}
                        if draw(st.booleans()) else None))
            elif what == "drop":
                indices = None if safe or draw(st.booleans()) else draw(any_indices(c.steps))
                events.append(PlaneEvent(E.DROPPED, t, chunk_id=c.id, indices=indices,
                                         reason="stale"))
            elif what == "place":
                events.append(PlaneEvent(E.PLACED, t, chunk_id=c.id, tier="host",
                                         nbytes=c.nbytes))
            else:
                events.append(PlaneEvent(E.EVICTED, t, chunk_id=c.id,
                                         tier=draw(st.sampled_from([None, "host"]))))
    return contract, caps, events, t + 1


def replay_both(folded, unbounded, events, end, check):
    """Feed both auditors; ``check(folded_dict, unbounded_dict)`` at every marker and at finish."""
    for ev in events:
        if ev is None:
            check(folded.report().to_dict(), unbounded.report().to_dict())
        else:
            folded.observe(ev)
            unbounded.observe(ev)
    check(folded.finish(end).to_dict(), unbounded.finish(end).to_dict())


def _identical(f, u):
    assert f == u


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(retiring_streams(), mixed_streams()), st.integers(0, 4))
def test_folding_reports_exactly_what_the_unbounded_auditor_does(stream, small):
    """With a window larger than the stream the reports are identical, always; with a small
    window too, whenever no event names a chunk retired beyond it."""
    contract, caps, events, end = stream
    replay_both(*window_pair(contract, caps, len(events) + 1), events, end, _identical)
    folded, unbounded = window_pair(contract, caps, small)
    if refers_beyond_window(events, small):
        for ev in events:  # must not fail; what it counts differently is the next test's
            if ev is not None:
                folded.observe(ev)
        folded.finish(end)
    else:
        replay_both(folded, unbounded, events, end, _identical)


def _same_total(f, u):
    """Equal but for violations moved from evicted_then_sampled to unknown_sample (and those
    samples not counted as delivered; and drops of forgotten ids, naming no indices, count 0)."""
    fk, uk = f.pop("by_kind"), u.pop("by_kind")
    moved = uk["evicted_then_sampled"] - fk["evicted_then_sampled"]
    assert moved >= 0
    assert fk["unknown_sample"] == uk["unknown_sample"] + moved
    fk["evicted_then_sampled"] = uk["evicted_then_sampled"]
    fk["unknown_sample"] = uk["unknown_sample"]
    assert fk == uk
    assert f.pop("delivered_samples") == u.pop("delivered_samples") - moved
    if moved:
        assert f.pop("delivered_bytes") < u.pop("delivered_bytes")
    for d in (f, u):
        del d["examples"]
        # a late drop of a forgotten id, naming no indices, counts 0 samples under its reason
        d["dropped_samples"] = {k: v for k, v in d["dropped_samples"].items() if v}
    assert f == u  # violations (the total) included


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(retiring_streams(safe=True), st.integers(0, 2))
def test_a_tiny_window_keeps_the_violation_total(stream, window):
    """Late deliveries of chunks retired beyond the window count as unknown_sample instead of
    evicted_then_sampled, sample for sample; every other count is unchanged."""
    contract, caps, events, end = stream
    replay_both(*window_pair(contract, caps, window), events, end, _same_total)


def _whole_lives(a: Auditor, contract, first: int, n: int, live: int, per_update: int = 10):
    """``n`` chunks ingested, placed, delivered whole, consumed by update, evicted; then ``live``
    more ingested and placed in the next update, left resident and unconsumed."""
    ids = range(first, first + n)
    for k in range(first // per_update, (first + n) // per_update):
        chunks = [mk(i, steps=4, version=k) for i in ids[k * per_update - first:][:per_update]]
        for c in chunks:
            a.ingested(c, float(k))
            a.placed(c.id, "hbm", c.nbytes, float(k))
        a.delivered(k, [(c.id, range(4)) for c in chunks], k + 0.25)
        a.consumed(k, k + 0.5)
        for c in chunks:
            a.evicted(c.id, k + 0.75, "hbm")
            a.evicted(c.id, k + 0.75)
    k = (first + n) // per_update
    for i in range(first + n, first + n + live):
        a.ingested(mk(i, steps=4, version=k), float(k))
        a.placed(i, "hbm", 32, float(k))


@pytest.mark.parametrize("contract", [
    OnPolicy(),
    BoundedStaleness(max_lag=1, max_reuse=2),
    Replay(capacity=400, replay_ratio=1.0, min_size=0, error_buffer=1e9),
], ids=["on_policy", "bounded_staleness", "replay"])
def test_retired_chunks_leave_exactly_the_window_behind(contract):
    window, n, live = 16, 200, 3
    folded, unbounded = window_pair(contract, {"hbm": 10_000}, window)
    for a in (folded, unbounded):
        _whole_lives(a, contract, 0, n, live)
    assert len(folded._chunks) == live + window
    assert list(folded._retired) == list(range(n - window, n))
    assert set(folded._chunks) == set(range(n - window, n + live))
    assert set(folded._residency) == set(range(n, n + live))
    pending = {v: set(chunks) for v, chunks in folded._by_version.items()}
    assert pending == ({n // 10: set(range(n, n + live))} if contract.kind == "on_policy" else {})
    assert len(unbounded._chunks) == len(unbounded._residency) == n + live
    # memory stays flat: another n chunks leave the same number of entries
    for a in (folded, unbounded):
        a.delivered(n // 10, [(i, range(4)) for i in range(n, n + live)], 100.0)
        a.consumed(n // 10, 100.5)
        for i in range(n, n + live):
            a.evicted(i, 100.75)
        _whole_lives(a, contract, n + 10, n, live)
    assert len(folded._chunks) == live + window
    assert set(folded._residency) == set(range(2 * n + 10, 2 * n + 10 + live))
    assert sum(map(len, folded._by_version.values())) == (live if contract.kind == "on_policy" else 0)
    assert len(unbounded._chunks) == 2 * (n + live)
    assert folded.finish(200.0).to_dict() == unbounded.finish(200.0).to_dict()
    assert folded.finish(200.0).violations == 0


def test_late_chunks_of_a_consumed_version_leave_no_version_entry():
    """OnPolicy: chunks arriving for an update already consumed are dropped and evicted; the
    unbounded auditor keeps a version list for them forever, the folding one nothing."""
    folded, unbounded = window_pair(OnPolicy(), None, 4)
    for a in (folded, unbounded):
        a.consumed(0, 0.0)
        for i in range(50):
            a.ingested(mk(i, steps=2, version=0), 1.0)
            a.dropped(i, 1.5, "stale")
            a.evicted(i, 2.0)
    assert folded._by_version == {} and len(folded._chunks) == 4 and folded._residency == {}
    assert len(unbounded._by_version[0]) == 50
    assert_clean(folded.finish(3.0))
    assert folded.finish(3.0) == unbounded.finish(3.0)


def test_late_events_within_and_beyond_the_window():
    """Window 2: of a, b, c retired in that order, b and c are remembered and a is not."""
    folded, unbounded = window_pair(OnPolicy(), None, 2)
    for a in (folded, unbounded):
        for cid in "abc":
            a.ingested(mk(cid, steps=4), 0.0)
        a.delivered(0, [(cid, range(4)) for cid in "abc"], 0.5)
        a.consumed(0, 1.0)
        for cid in "abc":
            a.evicted(cid, 1.5)
        a.delivered(0, [("b", range(4))], 2.0)  # within the window
        a.delivered(0, [("a", np.arange(1, 4))], 3.0)  # beyond it
        a.ingested(mk("c", steps=4), 4.0)  # within: a duplicate
        a.ingested(mk("a", steps=4), 5.0)  # beyond: a new chunk (version 0, already consumed)
    f, u = folded.finish(6.0), unbounded.finish(6.0)
    assert u.by_kind["evicted_then_sampled"] == 7 and u.by_kind["duplicated"] == 8
    assert u.violations == 15 and u.ingested_chunks == 3
    assert f.by_kind["evicted_then_sampled"] == 4 and f.by_kind["unknown_sample"] == 3
    assert f.by_kind["duplicated"] == 4
    assert f.by_kind["lost"] == 4  # the new "a", never delivered, of a consumed version
    assert f.violations == 15 and f.ingested_chunks == 4
    assert f.examples["unknown_sample"] == [
        ("chunk 'a' was never ingested, or retired more than 2 chunks ago, but 3 of its samples "
         "were delivered to update 0 at t=3")
    ]
    assert f.examples["evicted_then_sampled"] == u.examples["evicted_then_sampled"][:1]
    assert f.delivered_samples == u.delivered_samples - 3


def test_the_window_must_be_a_count():
    for bad in (-1, 2.5, None):
        with pytest.raises(ConduitError, match="RETIRED_WINDOW"):
            type("Bad", (Auditor,), {"RETIRED_WINDOW": bad})(OnPolicy())
    folded, _ = window_pair(Replay(capacity=8, replay_ratio=1.0, min_size=0), None, 0)
    folded.ingested(mk("a", steps=2), 0.0)
    folded.evicted("a", 1.0)
    assert folded._chunks == {} and not folded._retired  # a window of 0 forgets at once


def test_an_auditors_own_window_is_set_by_keyword():
    a = Auditor(OnPolicy(), retired_window=3)
    assert a.RETIRED_WINDOW == 3 and Auditor.RETIRED_WINDOW == 65536
    for cid in "abcde":
        a.ingested(mk(cid, steps=1), 0.0)
        a.dropped(cid, 0.5, "stale")
        a.evicted(cid, 1.0)
    assert list(a._retired) == ["c", "d", "e"] and set(a._chunks) == {"c", "d", "e"}
    for bad in (-1, 2.5, "8"):
        with pytest.raises(ConduitError, match="retired_window"):
            Auditor(OnPolicy(), retired_window=bad)


@st.composite
def batch_extent_streams(draw):
    """A plane's delivered batches as the auditor sees them: extents under ids it never ingested
    (``("batch", k)``), placed in a tier and later evicted from it, possibly moved in between,
    interleaved with chunks that live and retire, and with reports."""
    contract = draw(st.sampled_from([OnPolicy(), BoundedStaleness(max_lag=1, max_reuse=2),
                                     Replay(capacity=40, replay_ratio=1.0, min_size=0, error_buffer=1e9)]))
    events: list[PlaneEvent | None] = []
    open_batches: list[tuple] = []
    live: list[Chunk] = []
    t, k, n = 0.0, 0, 0
    for _ in range(draw(st.integers(1, 60))):
        t += 0.25
        op = draw(st.sampled_from(["batch", "batch", "move", "release", "release", "chunk", "retire", "report"]))
        if op == "batch":
            bid = ("batch", k)
            k += 1
            open_batches.append(bid)
            events.append(PlaneEvent(E.PLACED, t, chunk_id=bid, tier="hbm", nbytes=draw(st.integers(1, 40))))
        elif op == "move" and open_batches:
            events.append(PlaneEvent(E.MOVED, t, chunk_id=draw(st.sampled_from(open_batches)), src_tier="hbm",
                                     dst_tier="host", nbytes=draw(st.integers(1, 40))))
        elif op == "release" and open_batches:
            bid = open_batches.pop(draw(st.integers(0, len(open_batches) - 1)))
            for tier in draw(st.permutations(["hbm", "host"])):
                events.append(PlaneEvent(E.EVICTED, t, chunk_id=bid, tier=tier))
        elif op == "chunk":
            c = mk(n, steps=2)
            n += 1
            live.append(c)
            events += [PlaneEvent(E.INGESTED, t, chunk=c), PlaneEvent(E.PLACED, t, chunk_id=c.id, tier="host",
                                                                      nbytes=c.nbytes)]
        elif op == "retire" and live:
            c = live.pop(0)
            events += [PlaneEvent(E.DROPPED, t, chunk_id=c.id, reason="stale"),
                       PlaneEvent(E.EVICTED, t, chunk_id=c.id, tier="host"), PlaneEvent(E.EVICTED, t, chunk_id=c.id)]
        elif op == "report":
            events.append(None)
    return contract, events, t + 1, set(open_batches), {c.id for c in live}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch_extent_streams())
def test_released_batch_extents_leave_no_residency_behind(stream):
    """A batch's extent is a tier occupant under an id that is no chunk: once it left every tier,
    the folding auditor keeps nothing of it (one entry per batch ever delivered was a leak on a
    long run), and every report equals the unbounded auditor's, which keeps the empty maps."""
    contract, events, end, still_open, live = stream
    folded, unbounded = window_pair(contract, {"hbm": 10_000, "host": 10_000}, 4)
    replay_both(folded, unbounded, events, end, _identical)
    leftover = {cid for cid in folded._residency if isinstance(cid, tuple)}
    assert leftover <= still_open
    assert {cid for cid in folded._residency if not isinstance(cid, tuple)} <= live
