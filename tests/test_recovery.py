"""Recovery after the plane's process dies (conduit.plane.recovery, ExperiencePlane(recovery_dir=...)).

* The recovery log gives back the auditor the dead process had: any event stream, cut at any point
  (including a torn last record and a death in the middle of a compaction), replays to the same
  report as the auditor that saw it live.
* ``plan_recovery`` restores exactly the live chunks whose bytes are durable (whole ones under
  OnPolicy/BoundedStaleness), counts every other live chunk lost, and sums OnPolicy's shortfall.
* An in-process plane abandoned without ``close()`` (its process "died") and started again on the
  same directory takes over its NVMe chunks byte-identical, counts the rest lost with the reason
  "plane restart" (never a violation), keeps the Replay rate limiter's counts, and under OnPolicy
  hands over batch *k* short by exactly the version-*k* samples lost.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.audit import Auditor
from conduit.chunk import Chunk
from conduit.contracts import BoundedStaleness, OnPolicy, Prioritized, Replay
from conduit.plane.recovery import (
    REASON,
    DurableChunk,
    JournaledAuditor,
    RecoveryLog,
    plan_recovery,
    replay_audit,
)
from conduit.runtime.plane import ExperiencePlane
from conduit.runtime.schema import Schema

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.function_scoped_fixture])
CONTRACTS = [OnPolicy(), BoundedStaleness(max_lag=2, max_reuse=2), Replay(capacity=200, replay_ratio=1.0,
                                                                           min_size=4, error_buffer=1e9)]

# one event: (kind, chunk index, a number)
events = st.lists(st.tuples(st.sampled_from(["ingest", "place", "move", "deliver", "consume", "evict", "drop",
                                             "lost"]),
                            st.integers(0, 7), st.integers(0, 9)), max_size=60)


def _drive(aud: Auditor, script: list, t0: float = 0.0) -> None:
    for i, (kind, k, n) in enumerate(script):
        t = t0 + i
        cid = f"c{k}"
        if kind == "ingest":
            if not aud.knows(cid):
                aud.ingested(Chunk(cid, "p", "n0", 10, 400, n % 3, t), t)
        elif kind == "place":
            aud.placed(cid, ["host", "nvme"][n % 2], 400, t)
        elif kind == "move":
            aud.moved(cid, "host", "nvme", 400, t)
        elif kind == "deliver":
            idx = range(n % 5, 10) if n % 2 else np.array([n % 10, 9, n % 10])  # whole runs and replay draws
            aud.delivered(n % 3, [(cid, idx), ("c0", np.arange(n % 3))], t)
        elif kind == "consume":
            aud.consumed(n % 3, t)
        elif kind == "evict":
            aud.evicted(cid, t, None if n % 2 else "host")
        elif kind == "drop":
            aud.dropped(cid, t, "stale", np.arange(n % 10, 10))
        else:
            aud.lost(cid, t)


@SETTINGS
@given(contract=st.sampled_from(CONTRACTS), script=events, cut=st.integers(0, 60), every=st.integers(1, 30),
       tear=st.booleans())
def test_the_log_gives_back_the_auditor_the_dead_process_had(tmp_path_factory, contract, script, cut, every, tear):
    d = tmp_path_factory.mktemp("log")
    log = RecoveryLog(d)
    log.load()
    live = JournaledAuditor(contract, {"host": 4000}, sink=log.append)
    reference = Auditor(contract, {"host": 4000})
    cut = min(cut, len(script))
    for i, step in enumerate(script[:cut]):
        _drive(live, [step], i)
        _drive(reference, [step], i)
        if log.records_since_snapshot >= every:  # compaction at a safe point, as the plane does
            log.compact({"auditor": live.state()})
    log.close()
    if tear:  # the writer died in the middle of a record: that record never happened
        journals = sorted(d.glob("journal.*"))
        with journals[-1].open("ab") as f:
            f.write(b"\x80\x05\x95garbage")
    again = RecoveryLog(d)
    state, records = again.load()
    aud = JournaledAuditor.from_state(state["auditor"]) if state else JournaledAuditor(contract, {"host": 4000})
    replay_audit(aud, records)
    assert aud.report() == live.report() == reference.report()
    # and it goes on as the live one would
    rest = script[cut:]
    _drive(aud, rest, cut)
    _drive(reference, rest, cut)
    assert aud.finish(1e6) == reference.finish(1e6)


def test_a_death_between_snapshot_and_journal_switch_replays_nothing_twice(tmp_path):
    log = RecoveryLog(tmp_path)
    log.load()
    aud = JournaledAuditor(OnPolicy(), sink=log.append)
    aud.ingested(Chunk("a", "p", "n0", 10, 40, 0, 0.0), 0.0)
    aud.delivered(0, [("a", range(10))], 1.0)
    state = aud.state()
    log.compact({"auditor": state})
    # a compaction that died after writing its snapshot but before removing the old journal:
    (tmp_path / "journal.0").write_bytes(b"")  # a stale generation lying around is ignored
    aud.consumed(0, 2.0)
    log.close()
    st_, records = RecoveryLog(tmp_path).load()
    back = JournaledAuditor.from_state(st_["auditor"])
    replay_audit(back, records)
    assert back.report() == aud.report()
    assert back.report().deliveries == 1 and back.report().updates_consumed == 1


def test_lost_samples_are_counted_never_a_violation():
    for contract in CONTRACTS:
        aud = Auditor(contract)
        aud.ingested(Chunk("a", "p", "n0", 10, 40, 0, 0.0), 0.0)
        aud.ingested(Chunk("b", "p", "n0", 10, 40, 0, 0.0), 0.0)
        aud.placed("a", "host", 40, 0.0)
        aud.placed("b", "nvme", 40, 0.0)
        aud.delivered(0, [("a", range(4))], 1.0)
        n = aud.restarted(2.0, ["a"], keep={"b": "nvme"})
        r = aud.finish(3.0)
        # OnPolicy/BoundedStaleness: the 6 never-delivered samples; Replay: all 10 live ones
        assert n == (10 if isinstance(contract, Replay) else 6)
        assert r.lost_samples == {REASON: n} and r.lost_chunks == {REASON: 1} and r.restarts == 1
        assert r.violations == 0, r.examples
        assert aud.occupancy("host") == 0 and aud.occupancy("nvme") == 40
        assert [c[0] for c in aud.live_chunks()] == ["b"]


chunks = st.lists(st.tuples(st.integers(1, 20), st.integers(0, 4), st.booleans(), st.booleans(), st.booleans()),
                  max_size=30)


@SETTINGS
@given(spec=chunks, whole_only=st.booleans(), next_update=st.integers(0, 4))
def test_plan_recovery_restores_exactly_the_durable_whole_chunks(spec, whole_only, next_update):
    live, durable = [], {}
    for i, (steps, version, partly_used, on_disk, wrong_size) in enumerate(spec):
        deliverable = steps - 1 if partly_used else steps
        live.append((f"c{i}", steps, version, deliverable))
        if on_disk:
            durable[f"c{i}"] = DurableChunk(f"c{i}", "nvme0:nvme", 64 * i, steps + int(wrong_size))
    durable["gone"] = DurableChunk("gone", "nvme0:nvme", 10_000, 3)  # left the plane before the death
    plan = plan_recovery(live, durable, whole_only=whole_only, by_version=True, next_update=next_update)
    restored = {e.chunk_id for e in plan.restore}
    for cid, steps, version, deliverable in live:
        e = durable.get(cid)
        ok = e is not None and e.steps == steps and (not whole_only or deliverable == steps)
        assert (cid in restored) == ok and (cid in plan.lost) != ok
    assert [e.chunk_id for e in plan.restore] == [c[0] for c in live if c[0] in restored]  # ingestion order
    assert {e.chunk_id for e in plan.discard} == set(durable) - restored
    assert plan.lost_samples == sum(c[3] for c in live if c[0] in plan.lost)
    want: dict[int, int] = {}
    for cid, _, version, deliverable in live:
        if cid in plan.lost and version >= next_update and deliverable:
            want[version] = want.get(version, 0) + deliverable
    assert plan.shortfall == want


# ------------------------------------------------------------------------------------------- a real plane
SCHEMA = Schema.of({"x": ((64,), "float32")})  # 256 B per step
CAPS = {"pageable": "64 KiB", "nvme": "8 MiB", "pinned": 0}  # 16 chunks of 16 steps in memory, the rest on NVMe


def _chunk(i: int, steps: int = 16) -> dict[str, np.ndarray]:
    return {"x": np.full((steps, 64), i, np.float32)}


def _die(plane: ExperiencePlane) -> None:
    """What a killed process leaves: no close(), nothing flushed or removed (its copy threads stop)."""
    plane.engine.close(timeout=1)


@pytest.mark.parametrize("sampler", ["uniform", Prioritized(alpha=0.6, beta=0.4)], ids=["uniform", "prioritized"])
def test_replay_plane_takes_over_its_spill_file_and_counts_the_rest_lost(tmp_path, sampler):
    contract = Replay(capacity=4000, replay_ratio=2.0, min_size=64, error_buffer=1e6, sampler=sampler)
    p = ExperiencePlane(SCHEMA, contract, batch_steps=16, capacities=CAPS, recovery_dir=tmp_path, seed=0,
                        snapshot_every=7)
    for i in range(40):
        p.ingest(_chunk(i), policy_version=0, chunk_id=f"c{i}")
    for _ in range(6):
        p.next_batch(timeout=5).release()
    before = p.metrics()
    on_disk = before["tiers"]["nvme0:nvme"]["extents"]
    assert on_disk > 0 and before["tiers"]["dram0:pageable"]["extents"] > 0
    counts = p.auditor.replay_counts
    _die(p)

    q = ExperiencePlane(SCHEMA, contract, batch_steps=16, capacities=CAPS, recovery_dir=tmp_path, seed=1)
    m, a = q.metrics(), q.audit()
    assert q.incarnation == 1 and a.restarts == 1 and a.violations == 0
    assert m["restored_chunks"] == on_disk
    assert a.lost_samples[REASON] + m["restored_samples"] == before["table_steps"] == 640
    assert a.lost_chunks[REASON] == 40 - on_disk
    assert q.auditor.replay_counts == counts == (q._inserted, q._sampled)
    assert len(q.replay_sampler) == m["restored_samples"]  # the restored samples are live in the sampler
    for _ in range(3):  # batches from the restored chunks, byte-identical to what was ingested
        b = q.next_batch(timeout=5)
        row = 0
        for cid, idx in b.selections:
            assert q.ledger.location(cid) == "nvme0:nvme"
            assert (b.columns["x"][row:row + len(idx)] == float(cid[1:])).all()
            row += len(idx)
        b.release()
    with pytest.raises(Exception, match="already in the plane"):  # a resent chunk the dead plane had
        q.ingest(_chunk(3), policy_version=0, chunk_id="c3")
    q.ingest(_chunk(99), policy_version=0, chunk_id="c99")
    final = q.close()
    assert final.violations == 0 and final.ingested_chunks == 41
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # a clean close leaves nothing behind


@pytest.mark.parametrize("kill_again", [False, True])
def test_on_policy_batch_is_short_by_exactly_what_was_lost(tmp_path, kill_again):
    p = ExperiencePlane(SCHEMA, OnPolicy(), batch_steps=64, capacities=CAPS, recovery_dir=tmp_path)
    for i in range(2):  # batch 0, delivered and trained before the death
        p.ingest(_chunk(i, 32), policy_version=0, chunk_id=f"a{i}")
    p.next_batch(update=0, timeout=5).release()
    p.set_policy_version(1)
    p.ingest(_chunk(10, 32), policy_version=1, chunk_id="b0")  # half of batch 1, in memory: lost
    _die(p)
    if kill_again:  # a second death right after the first restart changes nothing more
        _die(ExperiencePlane(SCHEMA, OnPolicy(), batch_steps=64, capacities=CAPS, recovery_dir=tmp_path))
    q = ExperiencePlane(SCHEMA, OnPolicy(), batch_steps=64, capacities=CAPS, recovery_dir=tmp_path)
    assert q.policy_version == 1 and q.audit().lost_samples == {REASON: 32}
    assert q.audit().restarts == (2 if kill_again else 1)
    q.ingest(_chunk(11, 32), policy_version=1, chunk_id="b1")  # the other half arrives after the restart
    b = q.next_batch(update=1, timeout=5)
    assert b.steps == 32 and [cid for cid, _ in b.selections] == ["b1"]
    b.release()
    q.set_policy_version(2)
    q.ingest(_chunk(20, 64), policy_version=2, chunk_id="c0")  # later batches are whole again
    assert q.next_batch(update=2, timeout=5).steps == 64
    final = q.close()
    assert final.violations == 0, final.examples
    assert final.ingested_samples == final.delivered_samples + final.lost_samples[REASON] == 192


def test_on_policy_batch_wholly_lost_is_handed_over_empty(tmp_path):
    p = ExperiencePlane(SCHEMA, OnPolicy(), batch_steps=32, capacities=CAPS, recovery_dir=tmp_path)
    p.ingest(_chunk(0, 32), policy_version=0, chunk_id="a0")
    _die(p)
    q = ExperiencePlane(SCHEMA, OnPolicy(), batch_steps=32, capacities=CAPS, recovery_dir=tmp_path)
    b = q.next_batch(update=0, timeout=5)
    assert b.steps == 0 and b.selections == []
    b.release()
    final = q.close()
    assert final.violations == 0 and final.lost_samples == {REASON: 32} and final.updates_consumed == 1
