"""The Replay table: a FIFO of chunks of at most ``capacity`` steps, sampled uniformly over live
steps across every tier, through the contract's rate limiter.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from conduit.runtime.batch import Batch, BatchBuild
from conduit.runtime.records import (
    DeliveryTimeout,
    _Chunk,
    _deadline,
    _secs,
)
from conduit.runtime.tiers import Extent
from conduit.runtime.transfer import copy_rows


class ReplayTable:
    """The Replay table, a part of :class:`~conduit.runtime.plane.ExperiencePlane` (see the module doc)."""

    # ---------------------------------------------------------------------------- replay
    def _insert_replay(self, c: _Chunk) -> None:
        self._table[c.meta.id] = c  # counted and given room at admission (ingest)
        self._table_snapshot = None
        self._cond.notify_all()

    def _trim_replay(self, steps: int) -> bool:
        """Under the lock: evict the oldest chunks until ``steps`` more fit in the table. False (wait,
        evicting nothing) while the oldest needed is being sampled, or the room is held by inserts
        still copying."""
        excess = self._table_steps + steps - self.contract.capacity
        if excess <= 0:
            return True
        freed = 0
        for old in self._table.values():  # oldest first: can enough of them go now?
            if old.busy:
                return False
            freed += old.meta.steps
            if freed >= excess:
                break
        else:
            return False
        while self._table_steps + steps > self.contract.capacity:
            cid, old = next(iter(self._table.items()))
            self._table.pop(cid)
            self._table_snapshot = None
            self._table_steps -= old.meta.steps
            old.next_row = old.meta.steps
            self._maybe_retire(old)
            self.metrics_.count("evicted_chunks")
        return True

    def _sample(self, learner: str, timeout: float | None) -> Batch:
        q = self._learners[learner]
        n = self.batch_steps
        t_asked = time.time()
        deadline = _deadline(timeout)
        got: list[Extent] = []

        def allowed() -> bool:
            return bool(self._table) and self.contract.can_sample(n, self._inserted, self._sampled)

        def ready() -> bool:  # the limiter allows a batch and the learner's tier has room for it
            if not allowed():
                return False
            extent = q.tier.allocate(n)
            if extent is None:  # the table may fill the learner's tier: spill, as for any batch
                self._spill(q.tier, q.tier.schema.extent_bytes(n))
                extent = q.tier.allocate(n)
            if extent is not None:
                got.append(extent)
            return extent is not None

        def why() -> str:
            if not allowed():
                return (f"learner {learner!r}: the replay rate limiter allowed no sample within {_secs(timeout)} "
                        f"({self._inserted} steps inserted, {self._sampled} sampled, min_size {self.contract.min_size})")
            return (f"learner {learner!r}: no room for a batch of {n} steps in {q.tier.id} within {_secs(timeout)} "
                    f"({q.tier.used}/{q.tier.capacity} B used)")

        with self._cond:
            self._check_open()
            q.model.requested(t_asked)
            try:
                self._wait(ready, deadline, why, DeliveryTimeout)
            except BaseException:
                q.model.served()
                raise
            extent = got[0]
            if self._table_snapshot is None:  # rebuilt only when the table changed since the last sample
                chunks = list(self._table.values())
                steps = np.fromiter((c.meta.steps for c in chunks), np.int64, len(chunks))
                self._table_snapshot = (chunks, steps, np.cumsum(steps))
            chunks, steps, ends = self._table_snapshot
            # n steps uniformly over every step in the table, with replacement: a position in the
            # concatenated table names a chunk (the first whose cumulative end lies past it) and a row
            flat = np.sort(self._rng.integers(0, int(ends[-1]), size=n))
            owner = np.searchsorted(ends, flat, side="right")
            rows = (flat - (ends[owner] - steps[owner])).astype(np.intp)
            bounds = [0, *(np.flatnonzero(np.diff(owner)) + 1).tolist(), n]  # runs of draws from one chunk
            selections = []
            for lo, hi in itertools.pairwise(bounds):
                c = chunks[int(owner[lo])]
                c.busy += 1  # neither evicted nor moved while the copy reads it
                selections.append((c, rows[lo:hi]))
            self._sampled += n
            self._sampling += 1  # close() waits for this copy before it frees memory
        build = BatchBuild(learner, -1, extent, n)
        build.id = ("batch", learner, next(self._ids))
        dst = extent.columns()
        by_tier: dict[str, list[tuple[_Chunk, np.ndarray, int]]] = {}  # one timed copy run per source tier
        row = 0
        for c, idx in selections:
            by_tier.setdefault(c.extent.tier.id, []).append((c, idx, row))
            build.add(row, c.meta.id, idx, c.meta.t_created, c.meta.policy_version)
            row += len(idx)
            if c.annotation is not None:
                build.annotations[c.meta.id] = c.annotation

        def gather(parts: list[tuple[_Chunk, np.ndarray, int]]) -> int:
            return sum(copy_rows(c.columns(), idx, dst, start) for c, idx, start in parts) \
                * self.schema.step_bytes

        def give_back() -> None:  # under the lock: the sample failed; nothing of it stays
            self._sampling -= 1
            self._sampled -= n
            for c, _ in selections:
                c.busy -= 1
            extent.free()
            q.model.served()
            self._cond.notify_all()

        try:
            for src_tier, parts in by_tier.items():
                device_side = q.tier.medium.device_side or parts[0][0].extent.tier.medium.device_side
                self.engine.run_now((src_tier, q.tier.id), lambda parts=parts: gather(parts), cuda=device_side)
        except BaseException:
            with self._cond:
                give_back()
                self.metrics_.count("failed_samples")
            raise
        build.reserved = build.filled = build.prefix = n
        build.t_ready = time.time()
        with self._cond:
            if self._closed or self._error is not None:
                give_back()
                self._check_open()
            self._sampling -= 1
            self._cond.notify_all()
            self.auditor.placed(build.id, q.tier.id, extent.nbytes, time.time())
            q.model.served()
            upd = self._version
            t_handed = time.time()
            self.auditor.delivered(upd, build.selections, t_handed)
            self._delivered += n
            for c, _ in selections:  # only now may a producer evict them (after the auditor saw the delivery)
                c.busy -= 1
            self._handed.add(build)
            self.metrics_.update_started(learner, t_asked, build.t_ready, t_handed, [])
            self.metrics_.count("delivered_batches")
            self.metrics_.count("delivered_samples", n)
            self._maybe_compact()
            return Batch(self, build, upd, dst)
