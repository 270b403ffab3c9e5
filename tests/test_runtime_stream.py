"""Streaming a batch while it is assembled (ExperiencePlane.peek), chunk annotations, filled prefixes.

A learner that computes per chunk (a value-function pass, say) reads the rows of its next batch as
they land with ``peek`` and then takes the whole batch with ``next_batch``. The properties checked:
successive peeks, each starting where the last one stopped, cover exactly the batch ``next_batch``
later returns (same bytes, same samples in the same order, same annotations); peeking delivers
nothing (the audit counts the batch once, at hand-over, with no violations); a build's filled
prefix is the longest run of finished rows from row 0 whatever order the copies finish in; and the
annotation a producer attaches to a chunk comes back with every batch carrying its rows, under every
contract, through the Ray plane actors too.
"""

from __future__ import annotations

import gc
import random
import threading
import time
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.contracts import BoundedStaleness, OnPolicy, Replay
from conduit.errors import ConduitError, UnknownNameError
from conduit.runtime.batch import BatchBuild, Peek, slice_selections
from conduit.runtime.plane import ExperiencePlane
from conduit.runtime.schema import Schema

SCHEMA = Schema.of({"obs": ((3,), "float32"), "action": "int64", "done": "bool"})
SMALL = {"pageable": "8 MiB", "nvme": "8 MiB", "pinned": 0}
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_chunk(steps: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((steps, 3)).astype(np.float32),
            "action": rng.integers(0, 1 << 40, steps),
            "done": rng.integers(0, 2, steps).astype(bool)}


def rows_of(selections, sources) -> dict[str, np.ndarray]:
    """The rows ``selections`` name, regenerated from the ingested payloads."""
    out = {}
    for name in SCHEMA.names:
        parts = [sources[cid][name][np.asarray(list(idx) if isinstance(idx, range) else idx, dtype=np.intp)]
                 for cid, idx in selections]
        out[name] = np.concatenate(parts) if parts else np.empty((0,))
    return out


def flat(selections) -> list[tuple]:
    return [(cid, int(i)) for cid, idx in selections for i in idx]


class Note:
    """An annotation (weak-referenceable, to see the plane let go of it)."""

    def __init__(self, cid, last_obs):
        self.cid, self.last_obs = cid, last_obs

    def __eq__(self, other):
        return isinstance(other, Note) and self.cid == other.cid and np.array_equal(self.last_obs, other.last_obs)

    __hash__ = None


# ------------------------------------------------------------------------------------------ prefix
@SETTINGS
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=12), data=st.data())
def test_filled_prefix_is_the_longest_finished_run_from_row_zero(sizes, data):
    rows = sum(sizes)
    build = BatchBuild("l", 0, None, rows)
    ranges = [(build.reserve(n), n) for n in sizes]
    order = data.draw(st.permutations(ranges), label="completion order")
    done = np.zeros(rows, bool)
    for start, n in order:
        build.fill(start, n)
        done[start : start + n] = True
        expect = rows if done.all() else int(np.argmin(done))
        assert build.prefix == expect
        assert build.filled == int(done.sum())
    assert build.complete and build.prefix == rows and not build.landed


@SETTINGS
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=10), data=st.data())
def test_rows_given_back_by_failed_copies_are_refilled_in_row_order(sizes, data):
    """Reservations whose copies fail give their rows back (holes); later reservations fill the holes
    first; the selections stay in row order and the batch completes with every row written once."""
    rows = sum(sizes)
    build = BatchBuild("l", 0, None, rows)
    reserved = []
    for i, n in enumerate(sizes):
        start, got = build.take(n)
        assert got == n
        build.add(start, f"c{i}", range(n), 0.0, 0)
        reserved.append((start, n, f"c{i}"))
    failed = data.draw(st.lists(st.sampled_from(reserved), unique=True), label="failed copies")
    for start, n, cid in failed:
        assert build.withdraw(start) == (cid, range(n))
        build.give_back(start, n)
    assert build.free_rows == sum(n for _, n, _ in failed)
    for start, n, _ in reserved:  # the copies that did land
        if (start, n, _) not in failed:
            build.fill(start, n)
    k = 0
    while build.free_rows:  # refill, in pieces of any size (whole pieces only where they fit)
        n = data.draw(st.integers(1, 6), label="refill")
        whole = data.draw(st.booleans(), label="whole")
        fits = build.can_take(n)
        start, got = build.take(n, whole)
        if whole:
            assert got == (n if fits else 0)
            if not got:
                continue
        assert 0 < got <= n
        build.add(start, f"r{k}", range(got), 0.0, 0)
        build.fill(start, got)
        k += 1
    assert build.complete and build.prefix == rows and not build.holes
    assert build.starts == sorted(build.starts)
    covered = [build.starts[i] + j for i, (_, idx) in enumerate(build.selections) for j in range(len(idx))]
    assert covered == list(range(rows))  # every row once, in order


def test_slice_selections_splits_at_boundaries():
    sel = [("a", range(2, 6)), ("b", np.array([7, 1, 3])), ("c", range(2))]  # rows 0-3, 4-6, 7-8
    got = slice_selections(sel, 2, 8)
    assert [c for c, _ in got] == ["a", "b", "c"]
    assert got[0][1] == range(4, 6) and list(got[1][1]) == [7, 1, 3] and got[2][1] == range(1)
    assert slice_selections(sel, 4, 7) == [sel[1]]
    assert slice_selections(sel, 3, 3) == []


# ------------------------------------------------------------------------------------------ annotations
@pytest.mark.parametrize("contract", [OnPolicy(), BoundedStaleness(max_lag=1),
                                      Replay(capacity=64, replay_ratio=4.0, min_size=16)],
                         ids=["on_policy", "bounded", "replay"])
def test_annotations_travel_with_their_chunks(contract):
    batch, steps = 16, 4
    sources, notes = {}, {}
    with ExperiencePlane(SCHEMA, contract, batch_steps=batch, capacities=SMALL, seed=0) as plane:
        for v in range(2):
            for i in range(4 * v, 4 * v + 4):
                payload = make_chunk(steps, i)
                note = Note(i, payload["obs"][-1]) if i % 3 else None  # some chunks carry nothing
                cid = plane.ingest(payload, policy_version=v, chunk_id=f"c{i}", annotation=note, timeout=5)
                sources[cid] = payload
                if note is not None:
                    notes[cid] = note
            with plane.next_batch(timeout=5) as b:
                carried = {cid for cid, _ in b.selections}
                assert b.annotations == {cid: notes[cid] for cid in carried if cid in notes}
                assert all(b.annotations[cid] is notes[cid] for cid in b.annotations)  # not copied in-process
                for name, col in rows_of(b.selections, sources).items():
                    assert b.columns[name].tobytes() == col.tobytes()
            plane.set_policy_version(v + 1)
        assert plane.audit().violations == 0


def test_plane_lets_go_of_an_annotation_when_its_chunk_leaves():
    with ExperiencePlane(SCHEMA, OnPolicy(), batch_steps=8, capacities=SMALL) as plane:
        note = Note("x", np.zeros(3))
        ref = weakref.ref(note)
        plane.ingest(make_chunk(8, 0), policy_version=0, chunk_id="x", annotation=note)
        del note
        b = plane.next_batch(timeout=5)
        assert b.annotations["x"] is ref()
        b.release()
        del b
        gc.collect()
        assert ref() is None and "x" not in plane._chunks


# ------------------------------------------------------------------------------------------ peek
def _produce(plane, order, sources, notes, errors):
    try:
        for v, i, n in order:
            payload = sources[(v, i)]
            plane.ingest(payload, policy_version=v, chunk_id=(v, i), annotation=notes.get((v, i)), timeout=10)
            time.sleep(random.random() * 0.002)
    except BaseException as exc:  # noqa: BLE001 - reported by the test thread
        errors.append(exc)


@SETTINGS
@given(data=st.data())
def test_successive_peeks_reassemble_exactly_the_delivered_batch(data):
    """Chunks arrive from a thread in random sizes and order, copies finish out of order (several copy
    workers); the learner streams every batch with peek, then takes it with next_batch."""
    kind = data.draw(st.sampled_from(["on_policy", "bounded"]), label="contract")
    batch = data.draw(st.integers(4, 40), label="batch_steps")
    versions = data.draw(st.integers(1, 3), label="batches")
    depth = data.draw(st.integers(0, 2), label="prefetch_depth")
    workers = data.draw(st.integers(1, 4), label="copy_workers")
    policy = data.draw(st.sampled_from(["conduit", "host-only", "all-gpu"]), label="policy")
    contract = OnPolicy() if kind == "on_policy" else BoundedStaleness(max_lag=versions)
    sources, notes, order = {}, {}, []
    for v in range(versions):
        sizes = []
        while sum(sizes) < batch:
            sizes.append(data.draw(st.integers(1, batch), label="chunk_steps"))
        if kind == "bounded":  # batches take rows in arrival order: no surplus, so fill them exactly
            sizes[-1] -= sum(sizes) - batch
        mine = []
        for i, n in enumerate(sizes):
            sources[(v, i)] = make_chunk(n, seed=1000 * v + i)
            if data.draw(st.booleans(), label="annotated"):
                notes[(v, i)] = {"last_obs": sources[(v, i)]["obs"][-1].copy(), "chunk": (v, i)}
            mine.append((v, i, n))
        # version v+1 is sampled with weights trained after batch v, so versions arrive in order; a
        # version's own chunks in any order (under BoundedStaleness every order is the arrival order)
        order += data.draw(st.permutations(mine), label="arrival order") if kind == "on_policy" else mine
    errors: list = []
    with ExperiencePlane(SCHEMA, contract, batch_steps=batch, policy=policy, capacities=SMALL,
                         prefetch_depth=depth, copy_workers=workers) as plane:
        producer = threading.Thread(target=_produce, args=(plane, order, sources, notes, errors), daemon=True)
        producer.start()
        for v in range(versions):
            update = v if kind == "on_policy" else None
            pos, parts, sels, seen_notes = 0, [], [], {}
            while True:
                p = plane.peek(update=update, start=pos, timeout=10)
                assert isinstance(p, Peek) and p.start == pos and p.rows == batch
                assert p.stop > pos or p.done, f"no rows within 10 s (errors: {errors})"
                assert sum(len(idx) for _, idx in p.selections) == p.stop - p.start
                assert all(len(col) == p.stop - p.start for col in p.columns.values())
                if kind == "on_policy":
                    assert p.update == v
                parts.append({k: np.array(c) for k, c in p.columns.items()})
                sels += p.selections
                seen_notes.update(p.annotations)
                pos = p.stop
                if p.done:
                    break
            b = plane.next_batch(update=update, timeout=10)
            assert b.steps == batch and pos == batch
            assert flat(sels) == b.sample_ids()  # the same samples, in the same row order
            for name in SCHEMA.names:
                streamed = np.concatenate([part[name] for part in parts])
                assert streamed.tobytes() == np.asarray(b.columns[name]).tobytes()
                assert streamed.tobytes() == rows_of(b.selections, sources)[name].tobytes()
            assert set(seen_notes) == set(b.annotations)
            assert all(seen_notes[c] is b.annotations[c] for c in seen_notes)
            assert set(b.annotations) == {cid for cid, _ in b.selections if cid in notes}
            b.release()
            plane.set_policy_version(v + 1)
        producer.join(10)
        assert not errors, errors
        report = plane.audit()
        assert report.violations == 0, report.examples
        assert report.delivered_samples == versions * batch


def test_peek_returns_what_has_landed_then_empty_on_timeout():
    with ExperiencePlane(SCHEMA, OnPolicy(), batch_steps=16, capacities=SMALL, prefetch_depth=0) as plane:
        t = time.monotonic()
        p = plane.peek(timeout=0.2)  # nothing ingested yet
        assert time.monotonic() - t >= 0.15
        assert (p.start, p.stop, p.update, p.rows, p.complete) == (0, 0, 0, 16, False)
        assert p.selections == [] and p.annotations == {} and p.columns["obs"].shape == (0, 3)
        first = make_chunk(6, 1)
        plane.ingest(first, policy_version=0, chunk_id="a", annotation="note-a")
        p = plane.peek(start=0, timeout=5)  # depth 0, yet the batch opened: the learner asked
        assert (p.start, p.stop, p.complete) == (0, 6, False)
        assert p.selections == [("a", range(6))] and p.annotations == {"a": "note-a"}
        assert p.columns["action"].tobytes() == first["action"].tobytes()
        p2 = plane.peek(start=3, timeout=5)  # a start inside a chunk splits its selection
        assert p2.selections == [("a", range(3, 6))] and p2.columns["obs"].shape == (3, 3)
        empty = plane.peek(start=6, timeout=0.1)
        assert empty.stop == empty.start == 6 and empty.selections == [] and not empty.complete
        second = make_chunk(12, 2)  # 10 of its 12 rows fit; 2 are surplus
        plane.ingest(second, policy_version=0, chunk_id="b")
        p = plane.peek(start=6, timeout=5)
        assert (p.stop, p.complete, p.annotations) == (16, True, {}) and p.done
        assert plane.audit().deliveries == 0  # peeking delivers nothing
        with plane.next_batch(timeout=5) as b:
            assert b.sample_ids() == [("a", i) for i in range(6)] + [("b", i) for i in range(10)]
            assert b.annotations == {"a": "note-a"}
        report = plane.audit()
        assert report.violations == 0 and report.deliveries == 1


def test_peek_under_bounded_staleness_reserves_the_batch_for_next_batch():
    """With two batches open, the one peeked is the one handed over next (ready ones wait behind it)."""
    with ExperiencePlane(SCHEMA, BoundedStaleness(max_lag=2), batch_steps=8, capacities=SMALL,
                         prefetch_depth=2) as plane:
        plane.ingest(make_chunk(5, 0), policy_version=0, chunk_id="a")
        p = plane.peek(timeout=5)
        assert p.selections == [("a", range(5))] and not p.complete
        q = plane._learners["learner0"]
        peeked = q.peeked
        plane.ingest(make_chunk(3, 1), policy_version=0, chunk_id="b")
        plane.ingest(make_chunk(8, 2), policy_version=0, chunk_id="c")
        with plane.next_batch(timeout=5) as b:
            assert b._build is peeked and [cid for cid, _ in b.selections] == ["a", "b"]
        with plane.next_batch(timeout=5) as b:
            assert [cid for cid, _ in b.selections] == ["c"]
        assert plane.audit().violations == 0


def test_peek_refuses_replay_unknown_learners_and_bad_rows():
    replay = Replay(capacity=64, replay_ratio=1.0, min_size=8)
    with ExperiencePlane(SCHEMA, replay, batch_steps=8, capacities=SMALL) as plane, \
            pytest.raises(ConduitError, match="peek needs OnPolicy or BoundedStaleness"):
        plane.peek(timeout=0.1)
    with ExperiencePlane(SCHEMA, OnPolicy(), batch_steps=8, capacities=SMALL) as plane:
        with pytest.raises(UnknownNameError, match="unknown learner 'zz'"):
            plane.peek("zz", timeout=0.1)
        with pytest.raises(ConduitError, match="start must be a row"):
            plane.peek(start=9, timeout=0.1)
        plane.ingest(make_chunk(8, 0), policy_version=0, chunk_id="a")
        plane.next_batch(timeout=5).release()
        with pytest.raises(ConduitError, match="already delivered"):
            plane.peek(update=0, timeout=0.1)
        plane.ingest(make_chunk(8, 1), policy_version=2, chunk_id="b")
        p = plane.peek(update=2, timeout=5)  # skips ahead, as next_batch(update=2) would
        assert p.update == 2 and p.done
        with plane.next_batch(update=2, timeout=5) as b:
            assert b.update == 2 and b.sample_ids() == [("b", i) for i in range(8)]
        assert plane.audit().violations == 0


# ------------------------------------------------------------------------------------------ ray
def test_ray_peek_then_rest_of_batch_with_annotations(local_ray):
    from conduit.runtime.ray_plane import PlaneCluster, RemoteBatch

    cluster = PlaneCluster.start(SCHEMA, OnPolicy(), batch_steps=32, learners={"learner": "local"},
                                 capacities=SMALL)
    try:
        a, b = make_chunk(16, 1), make_chunk(16, 2)
        cluster.ingest(a, policy_version=0, chunk_id="a", annotation={"last_obs": a["obs"][-1]})
        p = cluster.peek(update=0, start=0, timeout=10)
        assert isinstance(p, Peek) and (p.start, p.stop, p.complete, p.rows) == (0, 16, False, 32)
        assert p.selections == [("a", range(16))]
        assert np.array_equal(p.annotations["a"]["last_obs"], a["obs"][-1])
        assert all(p.columns[k].tobytes() == a[k].tobytes() for k in SCHEMA.names)
        empty = cluster.get(cluster.peek_async("learner", start=16, timeout=0.2))
        assert empty.stop == empty.start == 16
        cluster.ingest(b, policy_version=0, chunk_id="b", annotation="note-b")
        got = cluster.next_batch(update=0, timeout=10, from_row=p.stop)
        assert isinstance(got, RemoteBatch) and got.row_offset == 16 and got.steps == 32
        assert got.sample_ids() == [("a", i) for i in range(16)] + [("b", i) for i in range(16)]
        assert all(got.columns[k].tobytes() == b[k].tobytes() for k in SCHEMA.names)  # only rows [16:]
        assert set(got.annotations) == {"a", "b"} and got.annotations["b"] == "note-b"
    finally:
        audit = cluster.shutdown()
    assert audit["violations"] == 0, audit["examples"]
    assert audit["delivered_samples"] == 32


def test_on_policy_next_update_is_not_starved_by_a_later_version_opened_first():
    """A version-1 chunk reaching the plane before any version-0 chunk opens batch 1 first; batch 0 (the one
    the learner needs next) must still be assembled and delivered, then batch 1."""
    from conduit.contracts import OnPolicy
    from conduit.runtime.plane import ExperiencePlane
    from conduit.runtime.schema import Schema

    schema = Schema.of({"x": ((2,), np.float32)})
    with ExperiencePlane(schema, OnPolicy(), batch_steps=4, prefetch_depth=1,
                         capacities={"pageable": "8 MiB", "nvme": "8 MiB", "pinned": 0}) as plane:
        rows = lambda v: {"x": np.full((4, 2), v, np.float32)}
        plane.ingest(rows(1), policy_version=1, chunk_id="v1")
        plane.ingest(rows(0), policy_version=0, chunk_id="v0")
        b0 = plane.next_batch(update=0, timeout=5)
        assert b0.update == 0 and np.all(b0.columns["x"] == 0)
        b0.release()
        plane.set_policy_version(1)
        b1 = plane.next_batch(update=1, timeout=5)
        assert b1.update == 1 and np.all(b1.columns["x"] == 1)
        b1.release()
        assert plane.audit().violations == 0
