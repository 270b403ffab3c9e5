"""Assembly and delivery: batches built in the learner's tier, moves started as the plane core plans
them, batches handed to learners, released, or dropped when the contract says so.

Memory is freed only when nothing still copies into or out of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

import numpy as np

from conduit.chunk import Chunk, checksum_bytes
from conduit.errors import ConduitError, UnknownNameError
from conduit.runtime.batch import Batch, BatchBuild, Peek, slice_selections
from conduit.runtime.records import (
    DeliveryTimeout,
    _Chunk,
    _host,
    _Learner,
    _Segment,
    _timeout_arg,
)
from conduit.runtime.tiers import RuntimeTier
from conduit.runtime.transfer import CopyJob, copy_rows
from conduit.topology.model import TierKind


class Assembly:
    """Assembly and delivery, a part of :class:`~conduit.runtime.plane.ExperiencePlane` (see the module doc)."""

    # ---------------------------------------------------------------------------- assembly
    def _target_build(self, q: _Learner, meta: Chunk) -> BatchBuild | None:
        if self.rules.by_version:
            b = q.builds.get(meta.policy_version)
            return b if b is not None and b.free_rows > 0 else None
        for b in q.builds.values():
            if b.free_rows > 0:
                return b
        return None

    def _reserve(self, q: _Learner, build: BatchBuild, c: _Chunk, n: int, whole: bool = False) -> tuple[int, int]:
        """Rows of ``build`` for the chunk's next (at most ``n``) rows; returns ``(start, rows)``."""
        start, n = build.take(min(n, c.remaining), whole)
        if n <= 0:
            return start, 0
        first, c.next_row = c.next_row, c.next_row + n
        build.add(start, c.meta.id, range(first, first + n), c.meta.t_created, c.meta.policy_version)
        if n == c.meta.steps:
            build.whole.add(c.meta.id)
        if c.annotation is not None:
            build.annotations[c.meta.id] = c.annotation
        c.builds += 1
        if c.remaining == 0 and c in q.pending:
            q.pending.remove(c)
        return start, n

    def _filled(self, build: BatchBuild, start: int, n: int) -> None:
        """Under the lock: the copy into rows ``[start, start + n)`` of ``build`` finished."""
        prefix = build.prefix
        build.fill(start, n)
        q = self._learners[build.learner]
        if build.complete and build.t_ready is None:
            build.t_ready = time.time()
            q.builds.pop(build.key, None)
            q.ready.append(build)
            self._cond.notify_all()
        elif build.prefix > prefix and q.peeking:
            self._cond.notify_all()  # a learner streams this batch: new rows to read

    def _open_builds(self, q: _Learner, arriving: int | None = None) -> None:
        """Open batches for the learner up to its prefetch depth; ``arriving`` is the version of a
        chunk being ingested right now (so its one copy can go straight into its batch)."""
        limit = max(1, self.prefetch_depth)
        if self.prefetch_depth == 0 and not q.asking:
            return  # depth 0: nothing is assembled before the learner asks
        if self.rules.by_version:
            versions = {c.meta.policy_version for c in q.pending if c.remaining}
            if arriving is not None:
                versions.add(arriving)
            versions.update(self._shortfall)  # a restart left these batches short: open them even if nothing comes
            keys = [k for k in sorted(versions - q.opened) if k >= q.next_update]
        else:
            has_rows = arriving is not None or any(c.remaining for c in q.pending)
            keys = [] if not has_rows or any(b.free_rows for b in q.builds.values()) else [q.seq]
        for key in keys:
            # OnPolicy: the batch the learner needs next is never starved by batches of later
            # versions that happened to open first (it may go one over the prefetch depth)
            if len(q.builds) + len(q.ready) >= limit + (self.rules.by_version and key == q.next_update):
                return
            extent = q.tier.allocate(self.batch_steps)
            if extent is None:
                self._spill(q.tier, q.tier.schema.extent_bytes(self.batch_steps))
                extent = q.tier.allocate(self.batch_steps)
            if extent is None:
                self.metrics_.count("batch_alloc_waits")
                return
            # OnPolicy: the size the learner announced (size_batch), less, after a restart, the samples
            # of that version the restart lost
            rows = q.sizes.get(key, self.batch_steps)
            if self.rules.by_version:
                rows = max(0, rows - self._shortfall.get(key, 0))
            build = BatchBuild(q.model.id, key, extent, rows)
            build.id = ("batch", q.model.id, next(self._ids))
            self.auditor.placed(build.id, q.tier.id, extent.nbytes, time.time())
            q.builds[key] = build
            if self.rules.by_version:
                q.opened.add(key)
            else:
                q.seq += 1
            if rows == 0:  # everything of it was lost: an empty batch, ready now
                build.t_ready = time.time()
                q.builds.pop(key, None)
                q.ready.append(build)
                self._cond.notify_all()

    def size_batch(self, learner: str | None = None, *, update: int, rows: int) -> None:
        """OnPolicy: batch ``update`` holds exactly ``rows`` samples (1 to ``batch_steps``).

        Without it a batch holds ``batch_steps`` samples. A producer whose rounds vary in size (RLlib's
        vectorized envs sample up to ``num_envs - 1`` steps more than asked) makes ``batch_steps`` the
        most a round can hold; the learner, which knows how many steps round *k* sampled, announces
        it here before it asks for the batch. The batch is then complete, and handed over, with
        exactly those rows: its chunks stay whole. It may be called before the batch is opened; it
        is an error when more than ``rows`` samples are already in the batch, or when the update was
        already delivered."""
        if isinstance(rows, bool) or not isinstance(rows, int | np.integer) or not 1 <= rows <= self.batch_steps:
            raise ConduitError(f"size_batch: rows must be an integer in [1, {self.batch_steps}], got {rows!r}")
        if isinstance(update, bool) or not isinstance(update, int | np.integer):
            raise ConduitError(f"size_batch: update must be an integer, got {update!r}")
        learner = learner or next(iter(self._learners))
        if learner not in self._learners:
            raise UnknownNameError("learner", learner, list(self._learners))
        if not self.rules.by_version:
            raise ConduitError("size_batch applies to OnPolicy batches (one per update)")
        update, rows = int(update), int(rows)
        q = self._learners[learner]
        with self._cond:
            self._check_open()
            if update < q.next_update:
                raise ConduitError(f"size_batch: learner {learner!r}: update {update} was already delivered")
            q.sizes[update] = rows
            rows = max(0, rows - self._shortfall.get(update, 0))  # after a restart: less what it lost
            done = next((b for b in q.ready if b.key == update), None)
            if done is not None and done.rows != rows:
                raise ConduitError(f"size_batch: learner {learner!r}: batch {update} is complete with {done.rows} "
                                   f"samples, not the {rows} announced")
            build = q.builds.get(update)
            if build is not None:
                taken = build.reserved - sum(n for _, n in build.holes)
                if taken > rows or build.reserved > rows:
                    raise ConduitError(f"size_batch: learner {learner!r}: batch {update} already holds {taken} "
                                       f"samples (rows up to {build.reserved}), more than the {rows} announced")
                build.rows = rows
                if build.complete and build.t_ready is None:
                    build.t_ready = time.time()
                    q.builds.pop(build.key, None)
                    q.ready.append(build)
            self._cond.notify_all()
            self._pump()

    def _drop_stale(self, q: _Learner) -> None:
        for c in list(q.pending):
            if c.remaining and self._stale_on_arrival(q, c.meta):
                self.auditor.dropped(c.meta.id, time.time(), "stale", range(c.next_row, c.meta.steps))
                self.metrics_.count("dropped_stale_samples", c.remaining)
                c.next_row = c.meta.steps
                q.pending.remove(c)
                self._maybe_retire(c)

    def _holds_batch(self, q: _Learner) -> bool:
        """The learner holds a handed-over batch it has not released (its update is running)."""
        return any(b.learner == q.model.id for b in self._handed)

    def _covered(self, q: _Learner, build: BatchBuild) -> bool:
        """Per-batch building: every free row of ``build`` has arrived (pending rows cover it)."""
        key = build.key if self.rules.by_version else None
        rows = sum(c.remaining for c in q.pending
                   if c.busy == 0 and (key is None or c.meta.policy_version == key))
        return rows >= build.free_rows

    def _pump(self) -> None:
        """Under the lock: drop what the contract no longer admits, open batches, start moves.

        What moves when is the plane core's (:meth:`~conduit.plane.Arbiter.plan`): the policy's
        checked plan, a CPU learner's free run, a waiting learner's forced moves. Path settings:
        with ``overlap_update`` off nothing is prepared for a learner while it holds a batch; with
        ``batch_build="per-batch"`` a batch's chunks move together once all of its rows have arrived
        (the learner builds the whole batch, as in the simulator, with no scheduler); a chunk already
        in the learner's tier is copied into its batch at once (no link to schedule)."""
        if self._closed or self.rules.tabled:
            return
        per_batch = self.path.batch_build == "per-batch"
        pending: dict[str, list[tuple[Hashable, float]]] = {}
        start: list[tuple[_Learner, _Chunk]] = []
        asking: list[str] = []
        for q in self._learners.values():
            self._drop_stale(q)
            if not self.path.overlap_update and self._holds_batch(q):
                continue  # its update runs: batch k+1 is prepared only after it
            self._open_builds(q)
            waiting = []
            for c in q.pending:
                if not c.remaining or c.busy or c.extent is None:
                    continue
                build = self._target_build(q, c.meta)
                if build is None:
                    continue
                if per_batch:
                    if self._covered(q, build):
                        start.append((q, c))
                elif c.extent.tier is q.tier:
                    start.append((q, c))
                else:
                    waiting.append((c.meta.id, float(c.remaining * self.schema.step_bytes)))
            if waiting:
                pending[q.model.id] = waiting
                if q.asking or q.peeked is not None:
                    asking.append(q.model.id)
        if pending and self._plan_due(pending, asking):
            start.extend((self._learners[lid], self._chunks[cid])
                         for lid, cid in self.arbiter.plan(pending, self.view, asking=asking))
        if start:
            self._start_moves(start)

    def _plan_due(self, pending: Mapping[str, list[tuple[Hashable, float]]], asking: list[str]) -> bool:
        """Whether to ask the core to plan now: on the simulator's triggers only (a chunk became
        pending, a learner started waiting, a move finished), never merely because time passed, so
        a policy is asked equally often in both backends."""
        ids = {cid for items in pending.values() for cid, _ in items}
        waiting = set(asking)
        due = self._replan or not ids <= self._planned_ids or not waiting <= self._planned_asking
        if due:
            self._replan = False
            self._planned_ids, self._planned_asking = ids, waiting
        return due

    def _start_moves(self, moves: list[tuple[_Learner, _Chunk]]) -> None:
        """Under the lock: reserve batch rows for each chunk and submit the copies. Path settings:
        a chunk of more than ``target_chunk_bytes`` (or with ``split`` > 1) moves in that many
        pieces, each its own copy (rows land, and stream to a peeking learner, piece by piece);
        up to ``granularity`` chunks going the same way are coalesced into one copy job."""
        jobs: dict[tuple[str, str, str], list[list[_Segment]]] = {}
        for q, c in moves:
            build = self._target_build(q, c.meta)
            if build is None or c.extent is None or c.busy:
                continue
            first = c.next_row
            start, n = self._reserve(q, build, c, c.remaining)
            if n <= 0:
                continue
            piece = -(-c.meta.steps // self.path.pieces(float(c.meta.nbytes)))
            for off in range(0, n, piece):
                seg = _Segment(c, build, first + off, start + off, min(piece, n - off))
                c.busy += 1  # its extent is not freed while this copy reads it
                build.inflight += 1  # nor the batch's while it writes there
                self.metrics_.count("moves")
                key = (q.model.id, c.extent.tier.id, build.extent.tier.id)
                groups = jobs.setdefault(key, [[]])
                if piece < c.meta.steps or len(groups[-1]) >= self.path.granularity:
                    groups.append([])
                groups[-1].append(seg)
        for (_, src, dst), groups in jobs.items():
            for segs in groups:
                if segs:
                    self._submit(src, dst, segs)

    def _submit(self, src: str, dst: str, segs: list[_Segment]) -> None:
        """One copy job for ``segs`` (rows of chunks in ``src`` into batches in ``dst``)."""
        cuda = self.tiers[src].medium.device_side or self.tiers[dst].medium.device_side
        plan = [(s, s.chunk.extent, s.build.extent) for s in segs]  # neither is freed while this runs

        def work() -> int:
            return sum(self._copy(a.tier, a.columns(), s.first, s.n, b.tier, b.columns(), s.start)
                       for s, a, b in plan)

        def done(err: BaseException | None) -> None:
            with self._cond:
                for s in segs:
                    c, build = s.chunk, s.build
                    c.busy -= 1
                    build.inflight -= 1
                    if build.dead is not None:  # released or discarded meanwhile: only let go of the memory
                        if err is not None:
                            self.metrics_.count("failed_copies")
                        self._settle_build(build)
                        self._maybe_retire(c)
                        continue
                    if err is not None:
                        self.metrics_.count("failed_copies")
                        self._error = err
                        continue
                    self._filled(build, s.start, s.n)
                    self._maybe_retire(c)  # its extent goes once every row is out of it
                self._cond.notify_all()
                self._replan = True  # a move finished: the scheduler is asked again
                if err is None or all(s.build.dead is not None for s in segs):
                    self._pump()

        self.metrics_.count("copy_jobs")
        self.engine.submit(CopyJob((src, dst), work, done, cuda=cuda))

    def _copy(self, src_tier: RuntimeTier | None, src: Mapping[str, Any], first: int, n: int,
              dst_tier: RuntimeTier, dst: Mapping[str, Any], start: int) -> int:
        """Rows ``first:first+n`` of ``src`` into rows ``start:`` of ``dst``; returns bytes moved.

        Host memory to a device goes through the pinned staging ring when the path settings ask for
        pinned copies and it has room (one memcpy, then a DMA at link speed); pinned or device
        sources are copied directly. Call inside the stream the copy should run on."""
        step_bytes = self.schema.step_bytes
        to_device = dst_tier.medium.device_side and (src_tier is None or not src_tier.medium.device_side)
        if to_device and self.path.pinned and (src_tier is None or src_tier.kind is not TierKind.PINNED):
            stage_tier = next((t for t in self.tiers.values() if t.kind is TierKind.PINNED), None)
            stage = stage_tier.allocate(n) if stage_tier is not None else None
            if stage is not None:
                try:
                    staged = stage.columns()
                    copy_rows(src, slice(first, first + n), staged, 0)
                    copy_rows(staged, slice(0, n), dst, start, non_blocking=True)
                    import torch

                    torch.cuda.current_stream().synchronize()  # the staging slot is reused after this
                finally:
                    stage.free()
                return n * step_bytes
        copy_rows(src, slice(first, first + n), dst, start, non_blocking=dst_tier.medium.device_side)
        return n * step_bytes

    def _free_extent(self, c: _Chunk) -> None:
        self._durable_removed(c, c.extent)
        c.extent.free()
        c.extent = None
        self.ledger.vacated(c.meta.id, time.time(), self._learners[c.learner].tier.id if c.learner else None)
        self._cond.notify_all()

    def _maybe_retire(self, c: _Chunk) -> None:
        """Under the lock: a chunk whose every row went into a batch or was dropped gives its extent
        back once no copy reads it; once its batches are released too, it leaves the plane."""
        if c.remaining or c.busy:
            return
        if c.extent is not None:
            self._free_extent(c)
        if c.builds == 0 and c.meta.id in self._chunks:
            self.ledger.retired(c.meta.id, time.time())
            self._chunks.pop(c.meta.id, None)
            c.annotation = None

    def _settle_build(self, build: BatchBuild) -> None:
        """Under the lock: a released or discarded batch gives its memory back, once no copy runs into it."""
        if build.inflight or build.freed:
            return
        build.freed = True
        build.extent.free()
        if not self._finished:
            self.auditor.evicted(build.id, time.time(), build.extent.tier.id)
        self._cond.notify_all()

    # ---------------------------------------------------------------------------- delivery
    def next_batch(self, learner: str | None = None, *, update: int | None = None,
                   timeout: float | None = None) -> Batch:
        """The learner's next batch, waiting up to ``timeout`` seconds (None: forever).

        Under ``OnPolicy`` it is the batch of ``update`` (default: the learner's next update, which
        starts at the plane's policy version and advances with each release).
        """
        timeout = _timeout_arg("timeout", timeout)
        learner = learner or next(iter(self._learners))
        if learner not in self._learners:
            raise UnknownNameError("learner", learner, list(self._learners))
        if self.rules.tabled:
            return self._sample(learner, timeout)
        q = self._learners[learner]
        t_asked = time.time()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._check_open()
            self._advance_to(q, update)
            q.model.requested(t_asked)
            self._pump()
            while True:
                build = self._take_ready(q)
                if build is not None:
                    break
                self._check_open()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    q.model.served()
                    raise DeliveryTimeout(self._missing(q, timeout))
                self._cond.wait(0.1 if remaining is None else min(0.1, remaining))
                self._pump()
            q.model.served()
            if q.peeked is build:
                q.peeked = None
            upd = build.key if self.rules.by_version else self._version
            t_handed = time.time()
            checks = self._checksums(build) if self.verify_checksums else None
            self.auditor.delivered(upd, build.selections, t_handed, checks)
            exposed = self.metrics_.update_started(learner, t_asked, build.t_ready, t_handed, build.created)
            self.metrics_.count("delivered_batches")
            self.metrics_.count("delivered_samples", build.filled)
            self.last_exposed = exposed
            self._handed.add(build)
            batch = Batch(self, build, upd, build.extent.columns())
            self._pump()
            return batch

    def peek(self, learner: str | None = None, *, update: int | None = None, start: int = 0,
             timeout: float | None = None) -> Peek:
        """Rows ``[start, stop)`` of the learner's next batch that have landed, while the rest arrives.

        The batch is the one :meth:`next_batch` will hand over next: under ``OnPolicy`` that of
        ``update`` (default: the learner's next update; a later one skips ahead as in
        :meth:`next_batch`), under ``BoundedStaleness`` the first ready batch, else the oldest one
        being assembled. ``stop`` is the batch's filled prefix (rows ``[0, stop)`` are all written;
        copies finishing out of order do not count until the rows before them are in). It waits up
        to ``timeout`` seconds (None: forever) for the prefix to pass ``start`` and returns an empty
        peek (``stop == start``) if it does not; it is not an error.

        Nothing is delivered: the auditor sees the batch when :meth:`next_batch` hands it over, whole,
        as usual. While a learner peeks, the plane treats it as waiting for rows: the batch is
        opened even with ``prefetch_depth`` 0 and its chunks are moved whatever the scheduling
        policy says, and the batch is reserved for that learner's next :meth:`next_batch`. A
        learner streams a batch by peeking with ``start`` = the previous ``stop`` until
        :attr:`Peek.done`. (Under ``BoundedStaleness`` a peeked batch that grows too old before it
        is handed over is still dropped whole; the next batch then starts with other selections.)
        """
        return self._peek(learner, update, start, timeout)

    def _peek(self, learner: str | None, update: int | None, start: int, timeout: float | None,
              copy: Callable[[Any], Any] | None = None) -> Peek:
        """:meth:`peek`; ``copy`` (e.g. to host memory) is applied to the rows under the lock, so
        they cannot be reused by a release racing with the caller."""
        timeout = _timeout_arg("timeout", timeout)
        learner = learner or next(iter(self._learners))
        if learner not in self._learners:
            raise UnknownNameError("learner", learner, list(self._learners))
        if self.rules.tabled:
            raise ConduitError("peek needs OnPolicy or BoundedStaleness")
        if isinstance(start, bool) or not isinstance(start, int | np.integer) or not 0 <= start <= self.batch_steps:
            raise ConduitError(f"peek: start must be a row in [0, {self.batch_steps}], got {start!r}")
        start = int(start)
        q = self._learners[learner]
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._check_open()
            self._advance_to(q, update)
            q.peeking += 1
            try:
                self._pump()
                while True:
                    build = self._peek_build(q)
                    if build is not None and (build.prefix > start or build.complete):
                        break
                    self._check_open()
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return self._peek_of(q, build, start, start, copy)
                    self._cond.wait(0.1 if remaining is None else min(0.1, remaining))
                    self._pump()
                stop = max(start, build.prefix)
                self.metrics_.count("peeks")
                self.metrics_.count("peeked_samples", stop - start)
                return self._peek_of(q, build, start, stop, copy)
            finally:
                q.peeking -= 1

    def _peek_build(self, q: _Learner) -> BatchBuild | None:
        """Under the lock: the batch a peek reads (and :meth:`next_batch` hands over next), or None yet."""
        if q.peeked is not None:
            return q.peeked
        if self.rules.by_version:
            build = q.builds.get(q.next_update) or next((b for b in q.ready if b.key == q.next_update), None)
        else:
            floor = self._version - self.contract.max_lag
            build = next((b for b in q.ready if min(b.versions) >= floor), None)
            if build is None:
                build = next(iter(q.builds.values()), None)  # insertion order: the oldest first
        q.peeked = build
        return build

    def _peek_of(self, q: _Learner, build: BatchBuild | None, start: int, stop: int,
                 copy: Callable[[Any], Any] | None) -> Peek:
        upd = q.next_update if self.rules.by_version else self._version
        if build is None:
            cols = {c.name: np.empty((0, *c.shape), c.dtype) for c in self.schema.columns}
            return Peek(upd, start, stop, cols, [], {}, False, self.batch_steps)
        cols = {k: v[start:stop] for k, v in build.extent.columns().items()}
        if copy is not None:
            cols = {k: copy(v) for k, v in cols.items()}
        sel = slice_selections(build.selections, start, stop)
        notes = {cid: build.annotations[cid] for cid, _ in sel if cid in build.annotations}
        return Peek(build.key if self.rules.by_version else upd, start, stop, cols, sel, notes,
                    build.complete, build.rows)

    def _take_ready(self, q: _Learner) -> BatchBuild | None:
        while q.ready:
            if self.rules.by_version:
                for b in q.ready:
                    if b.key == q.next_update:
                        q.ready.remove(b)
                        return b
                return None
            if q.peeked is not None:  # a peek chose the next batch: it is handed over first (or dropped)
                if q.peeked not in q.ready:
                    return None
                b = q.peeked
                q.ready.remove(b)
            else:
                b = q.ready.popleft()
            if self.rules.too_old(b.versions, self._version):
                self._discard_build(q, b, "stale")  # went stale while waiting: dropped whole
                continue
            return b
        return None

    def _advance_to(self, q: _Learner, update: int | None) -> None:
        """OnPolicy, under the lock: a learner asking for ``update`` (None: its next one)."""
        if self.rules.by_version and update is not None and update != q.next_update:
            if update < q.next_update:
                raise ConduitError(f"learner {q.model.id!r}: update {update} was already delivered")
            self._skip_to(q, update)

    def _skip_to(self, q: _Learner, update: int) -> None:
        """OnPolicy: the learner jumps ahead; everything of earlier versions is stale."""
        q.next_update = update
        for key in [k for k in q.builds if k < update]:
            self._discard_build(q, q.builds.pop(key), "stale")
        for b in [b for b in q.ready if b.key < update]:
            q.ready.remove(b)
            self._discard_build(q, b, "stale")
        self._drop_stale(q)

    def _discard_build(self, q: _Learner, build: BatchBuild, reason: str) -> None:
        """Under the lock: drop a batch that will never be handed over, with the reason.

        Rows of a chunk whose ingestion copy still runs into it are reported by that ingest when
        it commits (the auditor has not heard of the chunk yet); copies still running into it keep
        its memory until they end."""
        now = time.time()
        n = 0
        for cid, idx in build.selections:
            if cid not in self._admitting:
                self.auditor.dropped(cid, now, reason, idx)
                n += len(idx)
        if n:
            self.metrics_.count(f"dropped_{reason}_samples", n)
        build.dead = reason
        self._release(build, None)

    def _missing(self, q: _Learner, timeout: float | None) -> str:
        what = f"update {q.next_update}" if self.rules.by_version else "its next batch"
        have = sum(b.filled for b in q.builds.values())
        pend = sum(c.remaining for c in q.pending)
        return (f"learner {q.model.id!r} waited {timeout:g} s for {what}: {have} of {self.batch_steps} rows "
                f"assembled, {pend} more samples pending (policy version {self._version})")

    def _checksums(self, build: BatchBuild) -> dict[Hashable, int]:
        cols = build.extent.columns()
        out, row = {}, 0
        for cid, idx in build.selections:
            n = len(idx)
            if cid in build.whole:
                out[cid] = checksum_bytes({k: _host(v[row : row + n]) for k, v in cols.items()})
            row += n
        return out

    def _release(self, build: BatchBuild, update: int | None) -> None:
        with self._cond:
            if self._finished:
                return  # after close(): its memory is gone already and the audit is final
            q = self._learners[build.learner]
            if q.peeked is build:
                q.peeked = None
            self._handed.discard(build)
            if build.dead is None:
                build.dead = "released"
            self._settle_build(build)  # now, or when the last copy into it ends
            if self.rules.tabled:
                if update is not None:
                    self.auditor.consumed(update, time.time())
                self._cond.notify_all()
                return
            for cid, _ in build.selections:
                c = self._chunks.get(cid)
                if c is not None:
                    c.builds -= 1
            if update is not None and self.rules.by_version:
                for c in list(q.pending):  # version-k samples beyond batch k's rows
                    if c.meta.policy_version == update and c.remaining:
                        self.auditor.dropped(c.meta.id, time.time(), "surplus", range(c.next_row, c.meta.steps))
                        self.metrics_.count("dropped_surplus_samples", c.remaining)
                        c.next_row = c.meta.steps
                        q.pending.remove(c)
                        self._maybe_retire(c)  # its extent goes now; it leaves once its batches are released
                q.next_update = max(q.next_update, update + 1)
                q.sizes = {k: v for k, v in q.sizes.items() if k >= q.next_update}
                q.opened = {k for k in q.opened if k >= q.next_update}
                self._shortfall = {k: n for k, n in self._shortfall.items() if k >= q.next_update}
                done = self._released.setdefault(update, set())
                done.add(q.model.id)
                if len(done) == len(self._learners):  # update k = every learner's batch k
                    del self._released[update]
                    self.auditor.consumed(update, time.time())
            for cid, _ in build.selections:
                c = self._chunks.get(cid)
                if c is not None:
                    self._maybe_retire(c)
            self._cond.notify_all()
            self._pump()
            self._maybe_compact()

    def batches(self, learner: str | None = None, *, timeout: float | None = None,
                count: int | None = None) -> Iterator[Batch]:
        """Iterate over the learner's batches; each is released when the next one is asked for."""
        n = 0
        prev: Batch | None = None
        try:
            while count is None or n < count:
                batch = self.next_batch(learner, timeout=timeout)
                if prev is not None:
                    prev.release()
                prev = batch
                n += 1
                yield batch
        finally:
            if prev is not None:
                prev.release()
