"""Ingestion and placement: a chunk handed over, checked, placed (the plane core decides), copied once.

An ingest *reserves* (its id, table room, memory) under the lock, copies outside it, and *commits*
(the auditor hears of it) only once the copy has landed; a failure gives every reservation back.
Producers in other processes reach the same path through shared-memory rings.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from conduit.chunk import Chunk, checksum_bytes
from conduit.errors import CapacityError, ConduitError, DuplicateChunkError, PlaneFullError, UnknownNameError
from conduit.policy import ChunkInfo, Move
from conduit.runtime.batch import BatchBuild
from conduit.runtime.records import (
    _Admission,
    _Chunk,
    _deadline,
    _Learner,
    _secs,
    _timeout_arg,
)
from conduit.runtime.tiers import Extent, RuntimeTier

log = logging.getLogger(__name__)  # conduit.runtime.ingestion: the counted failures, with their details
from conduit.runtime.transfer import copy_rows


class Ingestion:
    """Ingestion and placement, a part of :class:`~conduit.runtime.plane.ExperiencePlane` (see the module doc)."""

    # ---------------------------------------------------------------------------- ingestion
    def ingest(
        self,
        payload: Mapping[str, Any],
        *,
        policy_version: int,
        chunk_id: Hashable | None = None,
        producer: str = "local",
        node: str | None = None,
        t_created: float | None = None,
        learner: str | None = None,
        timeout: float | None = None,
        checksum: int | None = None,
        annotation: Any = None,
    ) -> Hashable:
        """Hand a chunk (``{column: array}``, first dimension = steps) to the plane; returns its id.

        Nothing is stored until the chunk has passed every check, and the auditor hears of it only
        once its copy has landed. On any error (:class:`PlaneFullError` after ``timeout`` seconds,
        default the plane's ``ingest_timeout``; a failed copy; the plane closing) the caller still
        owns the chunk, nothing of it is in the plane, and the same id may be ingested again.
        ``annotation`` is a small (picklable) object that travels with the chunk, not through the
        tiers: every batch (and :class:`~conduit.runtime.batch.Peek`) with rows of the chunk carries
        it in ``annotations``; the plane drops its reference when the chunk leaves. ``node`` is the
        producer's node in the topology (default: the plane's), what a placement policy sees as
        :attr:`~conduit.policy.ChunkInfo.node`.
        """
        timeout = _timeout_arg("timeout", timeout)
        if node is None:
            node = self.node
        elif node not in self.topology.nodes:
            raise UnknownNameError("node", node, self.topology.nodes)
        steps = self.schema.validate(payload, where=f"chunk {chunk_id!r}" if chunk_id is not None else "chunk")
        t_created = time.time() if t_created is None else float(t_created)
        version = int(policy_version)
        if checksum is None and self.verify_checksums:
            checksum = checksum_bytes({k: np.asarray(v) for k, v in payload.items()})
        need = self.schema.extent_bytes(steps)
        largest = self._largest_tier
        if need > largest:
            raise CapacityError(f"chunk {chunk_id!r}: {steps} steps need {need} B, more than any tier holds "
                                f"(largest: {largest} B); split it or raise the plane's capacities")
        if self.rules.tabled and steps > self.contract.capacity:
            raise CapacityError(f"chunk {chunk_id!r}: {steps} steps exceed Replay.capacity "
                                f"{self.contract.capacity}; split it")
        timeout = self.ingest_timeout if timeout is None else timeout
        deadline = _deadline(timeout)
        with self._cond:
            self._check_open()
            if learner is not None and learner not in self._learners:
                raise UnknownNameError("learner", learner, list(self._learners))
            if chunk_id is None:
                chunk_id = f"{producer}-{next(self._chunk_seq)}"
            elif chunk_id in self._chunks or chunk_id in self._admitting or self.auditor.knows(chunk_id):
                # ids are unique: one in the plane, or one that left it but the auditor still
                # remembers (the last RETIRED_WINDOW), is refused here rather than audited as a duplicate
                raise DuplicateChunkError(f"chunk {chunk_id!r}: a chunk with this id is already in the plane (or "
                                          "left it recently); chunk ids must be unique")
            self._admitting.add(chunk_id)  # the id is this call's until it commits or fails
        adm: _Admission | None = None
        try:
            meta = Chunk(chunk_id, producer, node, steps, self.schema.payload_bytes(steps), version,
                         t_created, checksum)
            adm = _Admission(_Chunk(meta, learner, None, annotation=annotation))
            with self._cond:
                self._check_open()
                placed = self._admit(adm, deadline, timeout)
            if placed is not None:
                self._write(adm, placed, payload)
        except BaseException as exc:
            with self._cond:
                if adm is not None:
                    self._abort(adm, exc)
                else:
                    self._admitting.discard(chunk_id)
                    self._cond.notify_all()
            raise
        return chunk_id

    def _admit(self, adm: _Admission, deadline: float, timeout: float | None) -> tuple[str, BatchBuild | None, int] | None:
        """Under the lock: reserve what the chunk needs (table room, placement, rows in a batch or
        room in a tier). Returns ``(tier, build, first_row)``, or None when the chunk was dropped
        on arrival (stale: committed at once, nothing to copy)."""
        c = adm.chunk
        meta = c.meta
        q: _Learner | None = None
        if self.rules.tabled:
            steps = meta.steps
            # one predicate, so no other producer is admitted between the check and the reservation below
            self._wait(lambda: self.contract.can_insert(steps, self._inserted + self._inserting, self._delivered)
                       and self._trim_replay(steps), deadline,
                       lambda: f"chunk {meta.id!r}: the replay rate limiter blocked insertion for {_secs(timeout)} "
                               f"(sampled {self._delivered} of {self._inserted} inserted steps; the table's "
                               f"oldest chunk may be in use)")
            self._inserting += steps  # the limiter's view of it until it commits (or fails)
            self._table_steps += steps  # its room in the table, reserved
            adm.table_steps = steps
            c.learner = None
        else:
            c.learner = c.learner or next(self._round_robin)
            q = self._learners[c.learner]
            if self._stale_on_arrival(q, meta):
                self._commit_stale(c)
                return None
        tier = self._place(c, q)
        if q is not None and tier == q.tier.id:
            self._open_builds(q, meta.policy_version)
            build = self._target_build(q, meta)
            if build is not None and build.can_take(meta.steps):
                start, _ = self._reserve(q, build, c, meta.steps, whole=True)
                build.inflight += 1
                adm.build, adm.start = build, start
                return (tier, build, start)
        extent = self._room(c, tier, deadline, timeout)
        c.extent = extent
        return (extent.tier.id, None, 0)

    def _write(self, adm: _Admission, placed: tuple[str, BatchBuild | None, int], payload: Mapping[str, Any]) -> None:
        """Outside the lock: the one ingestion copy, then commit the chunk."""
        tier, build, start = placed
        c = adm.chunk
        meta = c.meta
        src = {k: payload[k] for k in self.schema.names}
        target = build.extent if build is not None else c.extent  # neither is freed while this runs
        dst_tier, dst = target.tier, target.columns()
        row = start if build is not None else 0
        self.engine.run_now(("producer", tier), lambda: self._copy(None, src, 0, meta.steps, dst_tier, dst, row),
                            cuda=dst_tier.medium.device_side)
        with self._cond:
            self._commit(adm, tier)
            self._maybe_compact()

    def _commit_stale(self, c: _Chunk) -> None:
        """Under the lock: a chunk too old for its learner on arrival is ingested and dropped at once."""
        meta = c.meta
        now = time.time()
        self._admitting.discard(meta.id)
        self.auditor.ingested(meta, now)
        self.metrics_.count("ingested_chunks")
        self.metrics_.count("ingested_bytes", meta.nbytes)
        self.auditor.dropped(meta.id, now, "stale")
        self.metrics_.count("dropped_stale_samples", meta.steps)
        self.auditor.evicted(meta.id, now)  # it left the plane at once (the auditor folds it, keeps its id)

    def _commit(self, adm: _Admission, tier: str) -> None:
        """Under the lock: the chunk's copy landed; it is in the plane now and the auditor hears of it."""
        self._check_open()  # closed (or stopped) while copying: the ingest fails and gives everything back
        c = adm.chunk
        meta = c.meta
        now = time.time()
        self._admitting.discard(meta.id)
        self._chunks[meta.id] = c
        self.auditor.ingested(meta, now)
        self.metrics_.count("ingested_chunks")
        self.metrics_.count("ingested_bytes", meta.nbytes)
        build, adm.build = adm.build, None
        if build is not None:  # it was written straight into its batch
            self.ledger.carried(meta.id, tier)
            build.inflight -= 1
            if build.dead is not None:  # the batch was discarded while the copy ran: its rows go the same way
                self.auditor.dropped(meta.id, now, build.dead)
                self.metrics_.count(f"dropped_{build.dead}_samples", meta.steps)
                c.builds -= 1  # the discard did not count this chunk: it was not committed then
                self._settle_build(build)
                self._maybe_retire(c)
            else:
                self._filled(build, adm.start, meta.steps)
            self._pump()
            return
        self._durable_added(c)
        self.ledger.placed(meta.id, tier, c.extent.nbytes, now)
        if self.rules.tabled:
            self._inserting -= adm.table_steps
            self._inserted += adm.table_steps  # with the auditor's ingested(), in this same lock hold
            adm.table_steps = 0
            self._insert_replay(c)
        else:
            self._learners[c.learner].pending.append(c)
        self._pump()

    def _abort(self, adm: _Admission, exc: BaseException) -> None:
        """Under the lock: an ingest failed before it committed; give back all it reserved."""
        c = adm.chunk
        self._admitting.discard(c.meta.id)
        if adm.table_steps:
            self._inserting -= adm.table_steps
            self._table_steps -= adm.table_steps
            adm.table_steps = 0
        if c.extent is not None:
            c.extent.free()
            c.extent = None
        build, adm.build = adm.build, None
        if build is not None:
            build.inflight -= 1
            if build.dead is not None:
                self._settle_build(build)
            else:
                build.withdraw(adm.start)
                build.give_back(adm.start, c.meta.steps)
                build.whole.discard(c.meta.id)
                build.annotations.pop(c.meta.id, None)
        if isinstance(exc, PlaneFullError):
            self.metrics_.count("refused_full")
        elif not self._closed and self._error is None:
            self.metrics_.count("failed_ingests")
            self._last_ingest_error = repr(exc)
            log.warning("ingest of chunk %r failed (its reservations given back; raised to the producer): %r",
                        c.meta.id, exc)
        self._cond.notify_all()
        self._pump()  # rows given back in a batch may be filled from what is pending

    def _stale_on_arrival(self, q: _Learner, meta: Chunk) -> bool:
        return self.rules.stale_on_arrival(meta.policy_version, next_update=q.next_update, current=self._version)

    def _place(self, c: _Chunk, q: _Learner | None) -> str:
        """The tier for a new chunk: the policy's choice as the plane core checks it, or the core's
        safe default (pinned, then pageable memory on this node)."""
        meta = c.meta
        info = ChunkInfo(meta.id, meta.node, self._cpu_of(meta.node), float(meta.nbytes), meta.policy_version,
                         q.model.id if q is not None else None)
        return self.arbiter.place(info, self.view, need=float(self.schema.extent_bytes(meta.steps)), node=self.node)

    def _room(self, c: _Chunk, tier_id: str, deadline: float, timeout: float | None) -> Extent:
        """An extent for the chunk in ``tier_id``: when the tier is full, the policy's checked spill
        moves make room; otherwise the producer waits for room (backpressure), up to ``timeout``."""
        steps = c.meta.steps
        tier = self.tiers[tier_id]
        need = tier.schema.extent_bytes(steps)
        while True:
            extent = tier.allocate(steps)
            if extent is None and tier.capacity >= need:
                self._spill(tier, need)
                extent = tier.allocate(steps)
            if extent is not None:
                return extent
            if time.monotonic() >= deadline:
                raise PlaneFullError(  # counted (refused_full) by the ingest giving its reservations back
                    f"chunk {c.meta.id!r} ({c.meta.nbytes} B): {tier_id} had no room within {_secs(timeout)} "
                    f"({', '.join(f'{t.id} {t.used}/{t.capacity} B' for t in self.tiers.values())}); "
                    "the chunk was not ingested")
            self.metrics_.count("backpressure_waits")
            self._cond.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            self._check_open()

    def _spill(self, tier: RuntimeTier, nbytes: int) -> None:
        """Make room for ``nbytes`` in a full tier: the policy's spill moves, as the plane core
        accepts them, each executed as one copy."""
        need = tier.used + nbytes - tier.capacity
        moves = self.arbiter.spill(tier.id, float(need if need > 0 else nbytes), self.view,
                                   size_in=lambda cid: self.ledger.size_in(cid, tier.id), movable=self._movable)
        for move in moves:
            self._spill_move(tier, move)

    def _movable(self, chunk_id: Hashable) -> bool:
        c = self._chunks.get(chunk_id)
        return c is not None and c.extent is not None and c.busy == 0

    def _spill_move(self, tier: RuntimeTier, move: Move) -> None:
        c = self._chunks[move.chunk_id]
        dst = self.tiers[move.dst_tier]
        new = dst.allocate(c.meta.steps)
        if new is None:  # room by the books, none in one piece: the chunk stays where it is
            self.metrics_.count("failed_spills")
            self._last_spill_error = f"spill of chunk {move.chunk_id!r}: {dst.id} has no contiguous room"
            log.warning("%s; the chunk stays in %s", self._last_spill_error, tier.id)
            return
        old = c.extent
        try:  # under the lock: nothing else reads or frees either extent meanwhile
            nbytes = self.engine.run_now((tier.id, dst.id), lambda: copy_rows(
                old.columns(), slice(0, c.meta.steps), new.columns(), 0) * self.schema.step_bytes,
                cuda=tier.medium.device_side or dst.medium.device_side)
        except Exception as exc:  # noqa: BLE001 - the chunk stays where it was, intact; counted
            new.free()
            self.metrics_.count("failed_spills")
            self._last_spill_error = f"spill of chunk {move.chunk_id!r} to {dst.id} failed: {exc!r}"
            log.warning("%s; the chunk stays in %s, intact", self._last_spill_error, tier.id)
            return
        c.extent = new
        if c.first_id >= 0:  # a chunk of the Replay table: draws read its extent from the table's snapshot
            self._table_snapshot = None
        self._durable_added(c)
        self._durable_removed(c, old)
        old.free()
        self.ledger.moved(c.meta.id, dst.id, new.nbytes, time.time())
        self.metrics_.count("spilled_chunks")
        self.metrics_.count("spilled_bytes", nbytes)

    # ---------------------------------------------------------------------------- producers in other processes
    def attach_producer(self, producer: str, ring_bytes: int = 64 << 20) -> Any:
        """A shared-memory ring for a producer in another process on this node; returns the
        picklable spec that process passes to :class:`~conduit.runtime.shm_ring.RingProducer`."""
        from conduit.runtime.shm_ring import ShmRing

        ring = ShmRing(self.schema, ring_bytes, producer)
        with self._cond:
            self._rings.append(ring)
            if self._ring_thread is None:
                self._ring_thread = threading.Thread(target=self._ring_loop, name="conduit-rings", daemon=True)
                self._ring_thread.start()
        return ring.spec()

    def _ring_loop(self) -> None:
        """Serve every producer ring: drain what is committed, then sleep in ``select`` on the
        rings' notification pipes until a producer commits (or dies), so a chunk is picked up
        within microseconds without spinning."""
        while not self._closed:
            with self._lock:
                rings = list(self._rings)
            idle = True
            for ring in rings:
                try:
                    records = ring.poll(0.0)
                except Exception as exc:  # noqa: BLE001 - a broken ring must not stop the others; counted
                    self.metrics_.count("ring_errors")
                    self._last_ring_error = repr(exc)
                    log.warning("producer ring %r: poll failed (the other rings go on): %r",
                                getattr(ring, "producer", "?"), exc)
                    continue
                for rec in records:
                    idle = False
                    self._ingest_record(ring, rec)
                lost = ring.check_producer() if not ring.producer_alive else 0
                if lost:
                    self.metrics_.count("partial_chunks_discarded", lost)
            if idle:
                fds = [r.fileno() for r in rings if r.producer_alive]
                if fds:
                    select.select(fds, [], [], 0.05)
                else:
                    time.sleep(0.05)

    def _ingest_record(self, ring: Any, rec: Any) -> None:
        """Ingest one committed ring record; retried while the plane is full (a refused ingest leaves
        no trace, so the retry with the same id is clean), counted and dropped if refused otherwise."""
        while not self._closed:
            try:
                self.ingest(rec.columns, policy_version=rec.policy_version, chunk_id=rec.chunk_id,
                            producer=rec.producer, t_created=rec.t_created, checksum=rec.checksum,
                            timeout=1.0, annotation=rec.annotation)
                break
            except PlaneFullError:
                continue  # the ring holds the chunk meanwhile: backpressure reaches the producer
            except Exception as exc:  # noqa: BLE001 - one bad record must not stop the ring thread; counted
                if self._closed:
                    break
                self.metrics_.count("ring_rejected_chunks")
                self._last_ring_error = str(exc) if isinstance(exc, ConduitError) else repr(exc)
                log.warning("producer ring %r: chunk %r refused and dropped: %s", getattr(ring, "producer", "?"),
                            rec.chunk_id, self._last_ring_error)
                break
        ring.release(rec)
