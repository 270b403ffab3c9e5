"""The Replay table: a FIFO of chunks of at most ``capacity`` steps, drawn from by the contract's
sampler over live steps across every tier, through the contract's rate limiter.

**Sample ids.** Every step in the table has an integer id for the sampler
(:mod:`conduit.plane.sampler`): a chunk entering the table takes the next ``steps`` ids
(``_Chunk.first_id + row``), never reused, so an id names one sample for the plane's lifetime.
The table is FIFO and ids are handed out in table order, so the live chunks' first ids are
increasing and an id is found by a binary search. A chunk evicted from the table has its ids
removed from the sampler in the same lock hold.

**A draw.** Under the lock the sampler draws the batch's ids and importance weights; the ids are
resolved to ``(chunk, row)``; the auditor hears the draw (``Auditor.drawn``: every drawn sample must
be live); the chunks are pinned (``busy``) so none is evicted or moved while their rows are copied
into the batch; the delivery is reported after the copy. Rows are in id order (grouped by chunk),
with their ids and weights alongside (``Batch.replay_ids``, ``Batch.weights``). An id that resolves
to no live chunk would be a sampler bug: the draw is reported as it is (the auditor counts the
violation) and the call fails, copying nothing.

**Priorities.** :meth:`ReplayTable.update_priorities` hands a batch's ids and new priorities (the
learner's TD errors) to the sampler; ids evicted since their draw are skipped and counted
(``priority_updates_dropped`` in :meth:`~conduit.runtime.plane.ExperiencePlane.metrics`).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from operator import itemgetter
from typing import Any

import numpy as np

from conduit.errors import ConduitError
from conduit.runtime.batch import Batch, BatchBuild
from conduit.runtime.records import (
    DeliveryTimeout,
    _Chunk,
    _deadline,
    _secs,
)
from conduit.runtime.tiers import Extent
from conduit.runtime.transfer import copy_rows, gather_runs


def _pick(seq: list[Any], at: list[int]) -> list[Any]:
    """``[seq[i] for i in at]`` in one C call."""
    if len(at) == 1:
        return [seq[at[0]]]
    return list(itemgetter(*at)(seq)) if at else []


class _TableSnapshot:
    """The table's live chunks in table (= sample id) order, with what a draw needs of them as arrays:
    first sample id, steps, extent offset, ``t_created``, policy version. Rebuilt when the table
    changes or one of its chunks moves to another extent (a spill), never per draw."""

    __slots__ = ("annotated", "chunks", "created", "firsts", "ids", "offsets", "one_tier", "steps", "tiers",
                 "versions")

    def __init__(self, chunks: list[_Chunk]):
        n = len(chunks)
        self.chunks = chunks
        self.ids = [c.meta.id for c in chunks]
        self.firsts = np.fromiter((c.first_id for c in chunks), np.int64, n)
        self.steps = np.fromiter((c.meta.steps for c in chunks), np.int64, n)
        self.offsets = np.fromiter((c.extent.offset for c in chunks), np.int64, n)
        self.created = np.fromiter((c.meta.t_created for c in chunks), np.float64, n)
        self.versions = np.fromiter((c.meta.policy_version for c in chunks), np.int64, n)
        self.tiers = [c.extent.tier for c in chunks]
        first = self.tiers[0] if chunks else None
        self.one_tier = first if all(t is first for t in self.tiers) else None
        self.annotated = any(c.annotation is not None for c in chunks)


class ReplayTable:
    """The Replay table, a part of :class:`~conduit.runtime.plane.ExperiencePlane` (see the module doc)."""

    # ---------------------------------------------------------------------------- replay
    def _insert_replay(self, c: _Chunk) -> None:
        self._table[c.meta.id] = c  # counted and given room at admission (ingest)
        c.first_id = self._next_sample_id
        self._next_sample_id += c.meta.steps
        self._sampler.add(np.arange(c.first_id, self._next_sample_id, dtype=np.int64))
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
            self._evict_oldest()
        return True

    def _evict_oldest(self) -> None:
        """Under the lock: the table's oldest chunk (not busy) leaves it; its ids leave the sampler."""
        cid, old = next(iter(self._table.items()))
        self._table.pop(cid)
        self._table_snapshot = None
        self._table_steps -= old.meta.steps
        self._sampler.remove(np.arange(old.first_id, old.first_id + old.meta.steps, dtype=np.int64))
        self._evicted_ranges.append((old.first_id, old.meta.steps, cid))
        old.next_row = old.meta.steps
        self._maybe_retire(old)
        self.metrics_.count("evicted_chunks")

    def clear_table(self, timeout: float | None = None) -> int:
        """Replay: evict every chunk in the table now, oldest first, as capacity would (each one reported
        ``evicted`` to the auditor; never drawn again); returns the steps evicted. Waits up to ``timeout``
        (default: the plane's ``ingest_timeout``) while a sample still copies rows of a chunk. Inserts
        still copying land afterwards. The rate limiter's counts go on (the contract is on cumulative
        counts). This is TorchRL's ``ReplayBuffer.empty()``."""
        if not self.rules.tabled:
            raise ConduitError(f"clear_table: the {self.contract.kind} contract has no Replay table")
        timeout = self.ingest_timeout if timeout is None else timeout
        with self._cond:
            self._check_open()
            self._wait(lambda: not any(c.busy for c in self._table.values()), _deadline(timeout),
                       lambda: f"clear_table: a sample still copied rows of the table after {_secs(timeout)}")
            steps = 0
            while self._table:
                steps += next(iter(self._table.values())).meta.steps
                self._evict_oldest()
            self._cond.notify_all()
            return steps

    @property
    def live_samples(self) -> int:
        """Replay: how many samples the table holds now (live in the sampler; 0 for other contracts)."""
        with self._cond:
            return 0 if self._sampler is None else len(self._sampler)

    def replay_ids(self, chunk_id: Hashable) -> np.ndarray | None:
        """Replay: the sample ids of a chunk in the table (``first id + row``, what batches carry in
        ``replay_ids``), or None once it has left the table."""
        with self._cond:
            c = self._table.get(chunk_id)
            if c is None:
                return None
            return np.arange(c.first_id, c.first_id + c.meta.steps, dtype=np.int64)

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
                self._table_snapshot = _TableSnapshot(list(self._table.values()))
            snap = self._table_snapshot
            chunks, firsts, steps = snap.chunks, snap.firsts, snap.steps
            # n draws by the contract's sampler, with replacement; in id order, so grouped by chunk
            ids, weights = self._sampler.sample(n, self._rng)
            order = np.argsort(ids, kind="stable")
            ids, weights = ids[order], weights[order]
            owner = np.searchsorted(firsts, ids, side="right") - 1
            rows = ids - firsts[np.maximum(owner, 0)]
            dead = (owner < 0) | (rows >= steps[np.maximum(owner, 0)])
            if dead.any():  # a sampler bug: report the draw as it is, copy nothing
                self._bad_draw(ids, owner, rows, dead)
                extent.free()
                q.model.served()
                self._cond.notify_all()
                raise ConduitError(f"learner {learner!r}: the replay sampler drew {int(dead.sum())} samples that are "
                                   "no longer in the table (reported to the audit as evicted_then_sampled)")
            rows = rows.astype(np.intp)
            # runs of draws from one chunk: chunk ids, counts and rows as arrays (no per-sample Python)
            heads = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
            counts = np.diff(np.r_[heads, n])
            at = owner[heads]
            picks = at.tolist()
            run_chunks = _pick(chunks, picks)
            for c in run_chunks:
                c.busy += 1  # neither evicted nor moved while the copy reads it
            cids = _pick(snap.ids, picks)
            self.auditor.drawn_runs(cids, counts, rows, time.time())
            self._sampled += n
            self._sampling += 1  # close() waits for this copy before it frees memory
        build = BatchBuild(learner, -1, extent, n)
        build.id = ("batch", learner, next(self._ids))
        build.replay_ids, build.weights = ids, weights
        build.runs = (cids, counts, rows, snap.created[at].tolist(), snap.versions[at].tolist())
        if snap.annotated:
            for c in run_chunks:
                if c.annotation is not None:
                    build.annotations[c.meta.id] = c.annotation
        dst = extent.columns()
        firsts_row = np.r_[0, np.cumsum(counts)[:-1]]
        host_dst = all(isinstance(v, np.ndarray) for v in dst.values())
        tier_of = snap.tiers if snap.one_tier is None else None
        groups: dict[str, list[int]] = {}  # source tier -> its runs, in order (one timed copy per tier)
        if tier_of is None:
            groups[snap.one_tier.id] = list(range(len(run_chunks)))
        else:
            for i, t in enumerate(_pick(tier_of, picks)):
                groups.setdefault(t.id, []).append(i)

        def gather(members: list[int]) -> int:
            tier = run_chunks[members[0]].extent.tier
            buffer = getattr(tier.medium, "buffer", None)
            if host_dst and isinstance(buffer, np.ndarray) and buffer.ndim == 1 and buffer.dtype == np.uint8:
                # host memory on both sides: one gather per column across every chunk of the tier
                sel = np.asarray(members, np.intp)
                part = rows if len(members) == len(run_chunks) else np.concatenate(
                    [rows[firsts_row[i]:firsts_row[i] + counts[i]] for i in members])
                return gather_runs(buffer, self.schema, snap.offsets[at[sel]], steps[at[sel]], counts[sel], part,
                                   firsts_row[sel], dst) \
                    * self.schema.step_bytes
            return sum(copy_rows(run_chunks[i].columns(), rows[firsts_row[i]:firsts_row[i] + counts[i]], dst,
                                 int(firsts_row[i])) for i in members) * self.schema.step_bytes

        def give_back() -> None:  # under the lock: the sample failed; nothing of it stays
            self._sampling -= 1
            self._sampled -= n
            for c in run_chunks:
                c.busy -= 1
            extent.free()
            q.model.served()
            self._cond.notify_all()

        try:
            for src_tier, members in groups.items():
                device_side = q.tier.medium.device_side or run_chunks[members[0]].extent.tier.medium.device_side
                self.engine.run_now((src_tier, q.tier.id), lambda members=members: gather(members), cuda=device_side)
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
            self.auditor.delivered_runs(upd, cids, counts, rows, t_handed)
            self._delivered += n
            for c in run_chunks:  # only now may a producer evict them (after the auditor saw the delivery)
                c.busy -= 1
            self._handed.add(build)
            self.metrics_.update_started(learner, t_asked, build.t_ready, t_handed, [])
            self.metrics_.count("delivered_batches")
            self.metrics_.count("delivered_samples", n)
            self._maybe_compact()
            return Batch(self, build, upd, dst)

    def _bad_draw(self, ids: np.ndarray, owner: np.ndarray, rows: np.ndarray, dead: np.ndarray) -> None:
        """Under the lock: report a draw with ids in no live chunk, naming each sample as well as is known
        (a recently evicted chunk by its id and row, an id never handed out as its own unknown chunk)."""
        sel: dict[Hashable, list[int]] = {}
        chunks = self._table_snapshot.chunks
        for i, o, r, d in zip(ids.tolist(), owner.tolist(), rows.tolist(), dead.tolist(), strict=True):
            if not d:
                sel.setdefault(chunks[o].meta.id, []).append(r)
                continue
            for first, steps, cid in reversed(self._evicted_ranges):
                if first <= i < first + steps:
                    sel.setdefault(cid, []).append(i - first)
                    break
            else:
                sel.setdefault(("unknown-sample-id", i), []).append(0)
        self.auditor.drawn([(cid, np.asarray(r, np.intp)) for cid, r in sel.items()], time.time())
        self.metrics_.count("bad_draws")

    def update_priorities(self, ids: Any, priorities: Any) -> int:
        """New priorities for the samples ``ids`` of a delivered Replay batch (``Batch.replay_ids``),
        typically the learner's absolute TD errors, one per row. Ids evicted since their draw are
        skipped; returns how many (also counted in :meth:`metrics` as ``priority_updates_dropped``).
        A uniform sampler ignores the values but counts the same way."""
        if self._sampler is None:
            raise ConduitError(f"update_priorities: the {self.contract.kind} contract has no replay sampler")
        ids = np.asarray(ids, np.int64).reshape(-1)
        prios = np.asarray(priorities, np.float64).reshape(-1)
        if len(ids) != len(prios):
            raise ConduitError(f"update_priorities: {len(ids)} sample ids but {len(prios)} priorities")
        with self._cond:
            self._check_open()
            return self._sampler.update(ids, prios)

    @property
    def replay_sampler(self) -> Any:
        """The Replay table's sampler (:mod:`conduit.plane.sampler`; None for other contracts). Its
        ``state_dict()`` / ``load_state_dict()`` carry it through a checkpoint, with the table."""
        return self._sampler
