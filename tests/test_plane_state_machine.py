"""The audit must be the truth: a stateful test of the in-process plane against a reference model.

Hypothesis drives an :class:`~conduit.runtime.plane.ExperiencePlane` (CPU, one learner, the
``all-gpu`` policy: on a CPU machine every chunk lands in the learner's own pageable tier and is
copied into its batch as soon as that batch is open — per-chunk building) through producers ingesting chunks (fresh ids, ids retried after a
:class:`PlaneFullError`, duplicate ids, payloads of the wrong schema, invalid timeouts), full planes,
two producer threads at once (the same id in both, or two ids), a learner taking and releasing
batches (OnPolicy: skipping ahead too), policy versions advancing, and ``close()``; one machine per
contract.

Next to the plane runs :class:`Model`, plain Python bookkeeping written from the contracts and the
plane's documented assembly rules (each contract's batches, staleness on arrival and while pending,
OnPolicy surplus at release, BoundedStaleness batches that went stale while waiting, the Replay
FIFO table and rate limiter, prefetch depth) and from the memory the plane has: every extent here is
one 128-byte slot (a chunk of 1-4 steps or a batch of 4; the NVMe tier is too small to take one), so
the model knows exactly when the plane is full. After every step, with the copy workers idle, the
plane's live ``audit()`` must equal the model: ingested chunks and samples, deliveries, delivered
samples, dropped samples by reason, zero violations of every kind; the learner tier holds exactly
the slots the model says; no tier exceeds its capacity; every delivered row has the bytes that were
ingested under its ``(chunk_id, index)``, still when the batch is released. After ``close()`` the
final audit is checked the same way and every tier is empty.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections import Counter
from typing import Any

import numpy as np
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conduit.contracts import BoundedStaleness, OnPolicy, Replay
from conduit.errors import CapacityError, ConduitError, PlaneFullError, SchemaError
from conduit.runtime.plane import DeliveryTimeout, ExperiencePlane
from conduit.runtime.schema import Schema
from conduit.topology.model import TierKind

SCHEMA = Schema.of({"obs": ((4,), "float32"), "act": "int64"})
B = 4  # batch steps
SLOT = 128  # bytes of every extent in these planes: a chunk of 1..B steps, or a batch
assert {SCHEMA.extent_bytes(n) for n in range(1, B + 1)} == {SLOT}
SETTINGS = settings(max_examples=30, stateful_step_count=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
BAD_TIMEOUTS = [float("nan"), -1.0, float("inf"), -float("inf"), "soon"]


def make_payload(seed: int, steps: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((steps, 4)).astype(np.float32),
            "act": rng.integers(-(2**62), 2**62, steps, dtype=np.int64)}


def in_thread(fn, *args, limit: float = 10.0, **kwargs) -> tuple[str, Any]:
    """``fn(*args, **kwargs)`` in a thread: ``("ok", value)`` or ``("raised", exc)``; a call that does
    not return within ``limit`` seconds fails the test instead of hanging it."""
    out: list = []

    def run() -> None:
        try:
            out.append(("ok", fn(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(("raised", exc))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} still blocked after {limit} s"
    return out[0]


# ----------------------------------------------------------------------------------- the model
class MChunk:
    def __init__(self, cid: str, version: int, steps: int, extent: bool):
        self.cid, self.version, self.steps = cid, version, steps
        self.next_row = 0
        self.extent = extent  # holds a slot of its own (not written straight into a batch)

    @property
    def remaining(self) -> int:
        return self.steps - self.next_row


class MBuild:
    def __init__(self, key: int):
        self.key = key
        self.rows: list[tuple[str, int, int]] = []  # (chunk id, version, rows), in row order
        self.reserved = 0
        self.full_at = -1

    @property
    def free(self) -> int:
        return B - self.reserved


class Model:
    """What the plane must do and report, from the contract and the memory it has."""

    def __init__(self, contract, depth: int, slots: int):
        self.contract = contract
        self.on_policy = isinstance(contract, OnPolicy)
        self.replay = isinstance(contract, Replay)
        self.lag = contract.max_lag if isinstance(contract, BoundedStaleness) else None
        self.depth, self.slots, self.used = depth, slots, 0
        self.version = 0
        self.next_update = 0  # OnPolicy: the update the learner takes next
        self.builds: list[MBuild] = []  # batches assembling or assembled, not handed over (open order)
        self.opened: set[int] = set()
        self.seq = 0
        self.pending: list[MChunk] = []
        self.moving: list[MChunk] = []  # every row moved out; its slot goes when the copy has run
        self.held: MBuild | str | None = None
        self.asking = False
        self.closed = False
        self.table: list[MChunk] = []  # Replay, oldest first
        self.table_steps = self.inserted = self.sampled = 0
        self.dropped_on_arrival: set[str] = set()
        self.ingested_chunks = self.ingested_samples = self.deliveries = self.delivered_samples = 0
        self.dropped: Counter = Counter()
        self._full = itertools.count()

    # memory: one slot per extent
    def alloc(self) -> bool:
        if self.used < self.slots:
            self.used += 1
            return True
        return False

    def free(self) -> None:
        self.used -= 1
        assert self.used >= 0

    # contract rules
    def stale(self, version: int) -> bool:
        if self.on_policy:
            return version < self.next_update
        return self.lag is not None and version < self.version - self.lag

    def version_for(self, offset: int) -> int:
        base = self.next_update if self.on_policy else self.version
        return max(0, base + (0 if self.replay else offset))

    def target(self, version: int) -> MBuild | None:
        if self.on_policy:
            return next((b for b in self.builds if b.key == version and b.free > 0), None)
        return next((b for b in self.builds if b.free > 0), None)

    def open_builds(self, arriving: int | None = None) -> None:
        if self.depth == 0 and not self.asking:
            return
        limit = max(1, self.depth)
        if self.on_policy:
            versions = {c.version for c in self.pending if c.remaining}
            if arriving is not None:
                versions.add(arriving)
            keys = [k for k in sorted(versions - self.opened) if k >= self.next_update]
        else:
            has_rows = arriving is not None or any(c.remaining for c in self.pending)
            keys = [] if not has_rows or any(b.free for b in self.builds) else [self.seq]
        for key in keys:
            if len(self.builds) >= limit + (self.on_policy and key == self.next_update):
                return
            if not self.alloc():
                return
            self.builds.append(MBuild(key))
            if self.on_policy:
                self.opened.add(key)
            else:
                self.seq += 1

    def reserve(self, b: MBuild, c: MChunk, n: int) -> None:
        n = min(n, b.free, c.remaining)
        b.rows.append((c.cid, c.version, n))
        b.reserved += n
        if not b.free:
            b.full_at = next(self._full)
        c.next_row += n
        if not c.remaining:
            if c in self.pending:
                self.pending.remove(c)
            if c.extent:
                self.moving.append(c)

    def drop_pending(self, c: MChunk, reason: str) -> None:
        self.dropped[reason] += c.remaining
        c.next_row = c.steps
        self.pending.remove(c)
        if c.extent:
            c.extent = False
            self.free()

    def discard(self, b: MBuild, reason: str) -> None:
        self.dropped[reason] += b.reserved
        self.builds.remove(b)
        self.free()
        self.pump()

    def pump(self) -> None:
        if self.closed or self.replay:
            return
        for c in list(self.pending):
            if c.remaining and self.stale(c.version):
                self.drop_pending(c, "stale")
        self.open_builds()
        for c in list(self.pending):
            b = self.target(c.version)
            if c.remaining and b is not None:
                self.reserve(b, c, c.remaining)

    def settle(self) -> None:
        """The copies in flight have run: moved-out chunks give their slots back, and the plane pumps."""
        for _ in range(50):
            for c in self.moving:
                c.extent = False
                self.free()
            self.moving.clear()
            self.pump()
            if not self.moving:
                return
        raise AssertionError("model did not settle")

    def commit(self, steps: int) -> None:
        self.ingested_chunks += 1
        self.ingested_samples += steps

    # the plane's calls
    def ingest(self, cid: str, version: int, steps: int) -> str:
        """``"ok"`` or ``"full"`` (timeout 0); a refused ingest changes nothing but what the plane
        did for others meanwhile (a batch it opened stays open)."""
        if self.replay:
            if not self.contract.can_insert(steps, self.inserted, self.sampled):
                return "full"
            while self.table_steps + steps > self.contract.capacity:  # FIFO eviction
                old = self.table.pop(0)
                self.table_steps -= old.steps
                self.free()
            if not self.alloc():
                return "full"
            self.table.append(MChunk(cid, version, steps, True))
            self.table_steps += steps
            self.inserted += steps
            self.commit(steps)
            return "ok"
        if self.stale(version):
            self.commit(steps)
            self.dropped["stale"] += steps
            self.dropped_on_arrival.add(cid)
            return "ok"
        self.open_builds(arriving=version)
        b = self.target(version)
        c = MChunk(cid, version, steps, False)
        if b is not None and b.free >= steps:  # its one copy goes straight into the batch
            self.reserve(b, c, steps)
        elif self.alloc():
            c.extent = True
            self.pending.append(c)
        else:
            self.pump()
            return "full"
        self.commit(steps)
        self.pump()
        return "ok"

    def take(self, update: int | None = None) -> tuple[str, MBuild | None]:
        """``("deliver", batch)``, ``("timeout", None)`` or ``("error", None)``."""
        if self.replay:
            if self.table and self.contract.can_sample(B, self.inserted, self.sampled) and self.alloc():
                self.sampled += B
                self.deliveries += 1
                self.delivered_samples += B
                self.held = "replay"
                return ("deliver", None)
            return ("timeout", None)
        if self.on_policy and update is not None and update != self.next_update:
            if update < self.next_update:
                return ("error", None)
            self.next_update = update  # skip ahead: everything older is stale
            older = [b for b in self.builds if b.key < update]
            for b in [b for b in older if b.free] + sorted((b for b in older if not b.free), key=lambda b: b.full_at):
                self.discard(b, "stale")
            for c in list(self.pending):
                if c.remaining and c.version < update:
                    self.drop_pending(c, "stale")
        self.asking = True
        try:
            self.pump()
            while True:
                self.settle()
                if self.on_policy:
                    b = next((b for b in self.builds if b.key == self.next_update and not b.free), None)
                else:
                    b = min((b for b in self.builds if not b.free), key=lambda b: b.full_at, default=None)
                if b is None:
                    return ("timeout", None)
                if self.lag is not None and min(v for _, v, _ in b.rows) < self.version - self.lag:
                    self.discard(b, "stale")  # went stale while it waited: dropped whole
                    continue
                self.builds.remove(b)
                self.held = b
                self.deliveries += 1
                self.delivered_samples += B
                break
        finally:
            self.asking = False
        self.pump()
        return ("deliver", b)

    def release(self) -> None:
        b, self.held = self.held, None
        self.free()
        if self.on_policy:
            for c in list(self.pending):
                if c.version == b.key and c.remaining:
                    self.drop_pending(c, "surplus")
            self.next_update = max(self.next_update, b.key + 1)
            self.opened = {k for k in self.opened if k >= self.next_update}
        self.pump()

    def bump(self, by: int) -> None:
        self.version += by
        self.pump()

    def close(self) -> None:
        for b in self.builds:
            self.dropped["shutdown"] += b.reserved
        self.builds.clear()
        self.closed = True

    def live_ids(self) -> set[str]:
        """Ids the plane still holds for sure (a duplicate of one must be refused)."""
        if self.replay:
            return {c.cid for c in self.table}
        ids = {c.cid for c in self.pending} | self.dropped_on_arrival
        for b in [*self.builds, *([self.held] if isinstance(self.held, MBuild) else [])]:
            ids |= {cid for cid, _, _ in b.rows}
        return ids

    def counts(self) -> dict[str, Any]:
        return {"ingested_chunks": self.ingested_chunks, "ingested_samples": self.ingested_samples,
                "deliveries": self.deliveries, "delivered_samples": self.delivered_samples,
                "dropped_samples": {k: v for k, v in self.dropped.items() if v}}


# ----------------------------------------------------------------------------------- the machine
class PlaneMachine(RuleBasedStateMachine):
    KIND = "on_policy"

    def __init__(self):
        super().__init__()
        self.plane: ExperiencePlane | None = None
        self.closed = False

    @initialize(data=st.data())
    def start(self, data):
        slots = data.draw(st.integers(3, 8), label="slots")
        depth = data.draw(st.integers(0, 1), label="prefetch_depth")
        if self.KIND == "on_policy":
            contract = OnPolicy()
        elif self.KIND == "bounded":
            contract = BoundedStaleness(max_lag=data.draw(st.integers(0, 2), label="max_lag"), max_reuse=1)
        else:
            capacity = data.draw(st.integers(8, 16), label="capacity")
            contract = Replay(capacity=capacity, replay_ratio=data.draw(st.sampled_from([0.5, 1.0, 2.0]), label="ratio"),
                              min_size=data.draw(st.integers(4, 8), label="min_size"))
            slots = capacity + data.draw(st.integers(1, 3), label="spare slots")
        self.plane = ExperiencePlane(SCHEMA, contract, batch_steps=B, policy="all-gpu", prefetch_depth=depth,
                                     capacities={"pageable": slots * SLOT, "nvme": 64, "pinned": 0}, seed=0)
        self.learner_tier = next(t for t in self.plane.tiers.values() if t.kind is TierKind.PAGEABLE)
        self.model = Model(contract, depth, slots)
        self.commits: list = []  # chunk ids in the order the plane reported them ingested
        reported = self.plane.auditor.ingested

        def ingested(chunk, t):
            self.commits.append(chunk.id)
            return reported(chunk, t)

        self.plane.auditor.ingested = ingested
        self.ids = itertools.count()
        self.seeds = itertools.count(1)
        self.payloads: dict[str, dict[str, np.ndarray]] = {}
        self.versions: dict[str, int] = {}
        self.refused: dict[str, tuple[int, dict[str, np.ndarray]]] = {}
        self.delivered: set[tuple[str, int]] = set()
        self.batch = None
        self.batch_bytes: dict[str, bytes] = {}

    def teardown(self):  # (run with --hypothesis-show-statistics to see what the runs reached)
        if self.plane is not None:
            report = self.plane.audit()
            event(f"deliveries: {min(report.deliveries, 3)}{'+' if report.deliveries > 3 else ''}")
            for reason, n in report.dropped_samples.items():
                if n:
                    event(f"dropped: {reason}")
        if self.plane is not None and not self.closed:
            self.plane.close()

    # helpers
    def quiesce(self) -> None:
        assert self.plane.engine.wait_idle(10), "copies still running after 10 s"
        self.model.settle()

    def fresh_id(self) -> str:
        return f"c{next(self.ids)}"

    def ingest(self, cid: str, version: int, p: dict[str, np.ndarray]) -> str:
        steps = len(p["act"])
        expect = self.model.ingest(cid, version, steps)
        try:
            self.plane.ingest(p, policy_version=version, chunk_id=cid, timeout=0)
            got = "ok"
        except PlaneFullError:
            got = "full"
        event(f"ingest: {got}")
        assert got == expect, f"ingest of {cid} ({steps} steps, version {version}): plane {got}, model {expect}"
        self.record(cid, version, p, got)
        self.quiesce()
        return got

    def record(self, cid: str, version: int, p: dict[str, np.ndarray], outcome: str) -> None:
        if outcome == "ok":
            self.payloads[cid], self.versions[cid] = p, version
            self.refused.pop(cid, None)
        else:
            self.refused[cid] = (version, p)

    def refused_no_trace(self, call, error: type[BaseException], match: str) -> None:
        """A refused call changes neither the audit nor the plane's memory."""
        before, used = self.plane.audit(), self.learner_tier.used
        kind, exc = in_thread(call)
        assert kind == "raised" and isinstance(exc, error) and match in str(exc), (kind, exc)
        after = self.plane.audit()
        assert (after.ingested_chunks, after.deliveries, after.dropped_samples) == \
               (before.ingested_chunks, before.deliveries, before.dropped_samples)
        assert self.learner_tier.used == used

    def check_rows(self, batch) -> None:
        """Every delivered row carries the bytes ingested under its (chunk id, index)."""
        row = 0
        for cid, idx in batch.selections:
            idx = np.asarray(list(idx) if isinstance(idx, range) else idx, dtype=np.intp)
            for name, col in batch.columns.items():
                assert col[row : row + len(idx)].tobytes() == self.payloads[cid][name][idx].tobytes(), (cid, name)
            row += len(idx)
        assert row == batch.steps == B

    def refused_when_closed(self) -> bool:
        """After close(): every call fails with "closed" and changes nothing (True: the rule is done)."""
        if not self.closed:
            return False
        final = self.plane.audit()
        for fn in (lambda: self.plane.ingest(make_payload(0, 1), policy_version=0, timeout=0),
                   lambda: self.plane.next_batch(timeout=0.01)):
            kind, exc = in_thread(fn)
            assert kind == "raised" and isinstance(exc, ConduitError) and "closed" in str(exc), exc
        if self.batch is not None:
            self.batch.release()  # the learner lets go after close(): nothing more happens
            self.batch = None
        assert self.plane.audit() == final
        return True

    # producers
    @rule(steps=st.integers(1, B), offset=st.sampled_from([-3, -2, -1, 0, 0, 0, 1, 2]))
    def ingest_fresh(self, steps, offset):
        if self.refused_when_closed():
            return
        self.ingest(self.fresh_id(), self.model.version_for(offset), make_payload(next(self.seeds), steps))

    @rule(sizes=st.sampled_from([(4,), (2, 2), (1, 3), (3, 2), (1, 1, 2)]))
    def produce_batch(self, sizes):
        """Chunks at the learner's version adding up to about one batch."""
        if self.refused_when_closed():
            return
        for n in sizes:
            self.ingest(self.fresh_id(), self.model.version_for(0), make_payload(next(self.seeds), n))

    @precondition(lambda self: self.refused)
    @rule(data=st.data())
    def retry_refused(self, data):
        if self.refused_when_closed():
            return
        cid = data.draw(st.sampled_from(sorted(self.refused)), label="refused id")
        version, p = self.refused[cid]
        self.ingest(cid, version, p)  # the same id again: a first ingest, never a duplicate

    @rule()
    def fill_the_plane(self):
        """Ingest at the learner's version until the plane refuses (memory, or the replay limiter)."""
        if self.refused_when_closed():
            return
        for _ in range(self.model.slots + 3):
            if self.ingest(self.fresh_id(), self.model.version_for(0), make_payload(next(self.seeds), B)) == "full":
                break

    @rule(data=st.data(), how=st.sampled_from(["duplicate", "dtype", "missing", "extra", "steps", "shape",
                                                "too-big", "timeout"]))
    def bad_input(self, data, how):
        """Refused at once, with a clear error, leaving no trace."""
        if self.refused_when_closed():
            return
        p = make_payload(next(self.seeds), 3)
        cid, version = self.fresh_id(), self.model.version_for(0)
        error, match = SchemaError, "chunk"
        if how == "duplicate":
            live = sorted(self.model.live_ids())
            if not live:
                return
            cid = data.draw(st.sampled_from(live), label="duplicate id")
            error, match = ConduitError, "already in the plane"
        elif how == "dtype":
            p["obs"] = p["obs"].astype(np.float64)
        elif how == "missing":
            del p["act"]
        elif how == "extra":
            p["extra"] = p["act"]
        elif how == "steps":
            p["act"] = p["act"][:2]
        elif how == "shape":
            p["obs"] = p["obs"][:, :3]
        elif how == "too-big":  # more steps than the Replay table holds, or than any tier (otherwise)
            p = make_payload(next(self.seeds), 17 if self.model.replay else 4096)
            error = CapacityError
        else:
            value = data.draw(st.sampled_from(BAD_TIMEOUTS), label="timeout")
            call = data.draw(st.sampled_from(["ingest", "next_batch", "peek"]), label="call")
            if call == "next_batch":
                self.refused_no_trace(lambda: self.plane.next_batch(timeout=value), ConduitError, "timeout")
                return
            if call == "peek" and not self.model.replay:
                self.refused_no_trace(lambda: self.plane.peek(timeout=value), ConduitError, "timeout")
                return
            self.refused_no_trace(lambda: self.plane.ingest(p, policy_version=version, chunk_id=cid, timeout=value),
                                  ConduitError, "timeout")
            return
        self.refused_no_trace(lambda: self.plane.ingest(p, policy_version=version, chunk_id=cid, timeout=0),
                              error, match)

    @rule(same_id=st.booleans(), steps=st.integers(1, B), offset=st.sampled_from([-1, 0, 0, 1]))
    def two_producers_at_once(self, same_id, steps, offset):
        if self.refused_when_closed():
            return
        version = self.model.version_for(offset)
        ids = [self.fresh_id()] * 2 if same_id else [self.fresh_id(), self.fresh_id()]
        payloads = [make_payload(next(self.seeds), steps) for _ in ids]
        barrier = threading.Barrier(2)
        results: list[Any] = [None, None]

        def produce(i: int) -> None:
            try:
                barrier.wait(5)
                self.plane.ingest(payloads[i], policy_version=version, chunk_id=ids[i], timeout=0)
                results[i] = "ok"
            except PlaneFullError:
                results[i] = "full"
            except ConduitError as exc:
                results[i] = "dup" if "already in the plane" in str(exc) else exc
            except BaseException as exc:  # noqa: BLE001 - reported below
                results[i] = exc

        threads = [threading.Thread(target=produce, args=(i,), daemon=True) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads), "a producer thread is still blocked"
        assert all(isinstance(r, str) for r in results), results
        assert self.plane.engine.wait_idle(10)
        if same_id:  # exactly one gets the id; the other is refused (or finds the plane full too)
            expect = self.model.ingest(ids[0], version, steps)
            event(f"same-id race: {sorted(results)}")
            allowed = [["dup", "ok"]] if expect == "ok" else [["dup", "full"], ["full", "full"]]
            assert sorted(results) in allowed, (results, expect)
            winner = results.index("ok") if "ok" in results else 0
            self.record(ids[0], version, payloads[winner], expect)
        else:
            trial = copy.deepcopy(self.model)
            expect = [trial.ingest(cid, version, steps) for cid in ids]
            assert sorted(results) == sorted(expect), (results, expect)
            # equal chunks: the model follows the order the plane committed them in (then the refused one)
            order = sorted(range(2), key=lambda i: (ids[i] not in self.commits,
                                                    self.commits.index(ids[i]) if ids[i] in self.commits else 0))
            for i in order:
                assert self.model.ingest(ids[i], version, steps) == results[i]
                self.record(ids[i], version, payloads[i], results[i])
        self.quiesce()

    # the learner
    @rule(skip=st.sampled_from([None, None, None, None, 0, 1, 2, -1]))
    def take(self, skip):
        if self.refused_when_closed() or self.batch is not None:
            return
        update = None
        if self.model.on_policy and skip is not None:
            update = self.model.next_update + skip
            if update < 0:
                update = None
        outcome, mbuild = self.model.take(update)
        timeout = 5.0 if outcome == "deliver" else 0.03  # copies are idle before the call: 30 ms is plenty
        kind, got = in_thread(self.plane.next_batch, update=update, timeout=timeout)
        event(f"next_batch: {outcome}")
        if outcome == "error":
            assert kind == "raised" and isinstance(got, ConduitError) and "already delivered" in str(got), got
        elif outcome == "timeout":
            assert kind == "raised" and isinstance(got, DeliveryTimeout), (kind, got)
        else:
            assert kind == "ok", f"model expected a batch, plane said {got!r}"
            self.check_delivery(got, mbuild)
        self.quiesce()

    @rule(skip=st.sampled_from([None, None, None, 0, 1]))
    def learner_step(self, skip):
        """What a training loop does: give back the batch it holds, take the next one."""
        if self.batch is not None:
            self.release()
        self.take(skip)

    def check_delivery(self, batch, mbuild: MBuild | None) -> None:
        self.check_rows(batch)
        ids = batch.sample_ids()
        if self.model.replay:
            live = {c.cid for c in self.model.table}
            assert {cid for cid, _ in ids} <= live, "sampled a chunk that is not in the table"
        else:
            assert not set(ids) & self.delivered and len(set(ids)) == len(ids), "a sample delivered twice"
            self.delivered |= set(ids)
            versions = [self.versions[cid] for cid, _ in batch.selections]
            assert [(v, len(idx)) for v, (_, idx) in zip(versions, batch.selections, strict=True)] == \
                   [(v, n) for _, v, n in mbuild.rows]
            if self.model.on_policy:
                assert batch.update == mbuild.key and set(versions) == {mbuild.key}
            else:
                assert min(versions) >= batch.update - self.model.lag
        self.batch = batch
        self.batch_bytes = {k: np.asarray(v).tobytes() for k, v in batch.columns.items()}

    @rule()
    def release(self):
        if self.refused_when_closed() or self.batch is None:
            return
        assert {k: np.asarray(v).tobytes() for k, v in self.batch.columns.items()} == self.batch_bytes, \
            "a delivered batch changed while the learner held it"
        self.batch.release()
        self.batch = None
        self.model.release()
        self.quiesce()

    @rule(by=st.integers(1, 2))
    def advance_version(self, by):
        if self.refused_when_closed():
            return
        self.model.bump(by)
        self.plane.set_policy_version(self.model.version)
        self.quiesce()

    @rule(now=st.integers(0, 3))
    def close(self, now):
        if self.refused_when_closed() or now:
            return  # closes one time in four it is drawn
        self.quiesce()
        final = self.plane.close()
        self.closed = True
        self.model.close()
        assert final.finished
        self.check_report(final)
        assert all(t.used == 0 for t in self.plane.tiers.values()), "memory left allocated after close()"
        assert self.plane.close() == final  # idempotent

    # after every step
    def check_report(self, report) -> None:
        got = {"ingested_chunks": report.ingested_chunks, "ingested_samples": report.ingested_samples,
               "deliveries": report.deliveries, "delivered_samples": report.delivered_samples,
               "dropped_samples": {k: v for k, v in report.dropped_samples.items() if v}}
        assert got == self.model.counts()
        assert report.violations == 0 and not any(report.by_kind.values()), report.examples

    @invariant()
    def audit_equals_the_model(self):
        if self.plane is None:
            return
        if not self.closed:
            self.quiesce()
        self.check_report(self.plane.audit())
        for tier in self.plane.tiers.values():
            assert 0 <= tier.used <= tier.capacity
        if not self.closed:
            assert self.learner_tier.used == self.model.used * SLOT, (self.learner_tier.used, self.model.used)


class OnPolicyMachine(PlaneMachine):
    KIND = "on_policy"


class BoundedStalenessMachine(PlaneMachine):
    KIND = "bounded"


class ReplayMachine(PlaneMachine):
    KIND = "replay"


TestOnPolicyPlane = OnPolicyMachine.TestCase
TestOnPolicyPlane.settings = SETTINGS
TestBoundedStalenessPlane = BoundedStalenessMachine.TestCase
TestBoundedStalenessPlane.settings = SETTINGS
TestReplayPlane = ReplayMachine.TestCase
TestReplayPlane.settings = SETTINGS
