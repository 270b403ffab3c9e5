"""The experience plane: ingestion, placement and delivery of real bytes, decided by policies.

:class:`ExperiencePlane` is the runtime's core, usable in one process with no Ray (the GPU machine
tests it that way) and wrapped one-per-node by :mod:`conduit.runtime.ray_plane`.

**Ingestion.** A producer hands over a chunk (:meth:`ExperiencePlane.ingest`, or through a
shared-memory ring from another process, :meth:`ExperiencePlane.attach_producer`). It is checked
against the schema before a byte moves; the placement policy chooses its tier; the plane copies it
there once. When the policy puts it on its learner's device and a batch for it is being assembled,
that one copy writes it straight into the batch.

**Placement.** Tiers are real memory (:mod:`conduit.runtime.machine`). A full tier asks the policy
to ``spill`` (oldest residents one level down, HBM -> pinned -> pageable -> NVMe), then falls back to
any tier with room; a chunk larger than every tier is refused at once (:class:`CapacityError`), and
a plane with no room anywhere makes the producer wait, up to a timeout (:class:`PlaneFullError`):
backpressure, never unbounded memory.

**Delivery.** Each learner has batches assembled ahead of need in its device tier, at most
``prefetch_depth`` at a time. The scheduling policy sees, per learner, the chunks waiting to go into
them and returns the moves to start now; moves run on the transfer engine's background workers, so
they overlap the learner's update. A learner that is waiting gets everything of its next batch moved
at once whatever the policy says (a policy can cost time, never data), and with no device memory of
its own (a CPU learner) the path settings decide (``overlap_collection``: stream as chunks arrive).
A learner may also read its next batch while it is assembled (:meth:`ExperiencePlane.peek`: the
rows from 0 whose copies have all finished) and take it whole with ``next_batch`` afterwards; each
chunk's ``annotation`` comes along with the batches (and peeks) that carry its rows.

**Contracts** are enforced here and audited live (:class:`~conduit.audit.Auditor`):

* ``OnPolicy``: batch *k* holds only version-*k* samples, each delivered once; samples of a version
  already trained are dropped as ``stale``, and version-*k* samples beyond batch *k*'s rows as
  ``surplus`` when update *k* is released (counted, never silent).
* ``BoundedStaleness(max_lag)``: batches take samples in arrival order; samples older than
  ``current version - max_lag`` are dropped as ``stale``, and a prefetched batch that became too
  old before hand-over is dropped whole.
* ``Replay``: chunks form a FIFO table of ``capacity`` steps (oldest evicted); batches are sampled
  uniformly from live samples across all tiers; inserts and samples pass the rate limiter, so the
  sample/insert ratio stays in the contract's band (a producer ahead of the learner waits).
"""

from __future__ import annotations

import itertools
import os
import select
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np

from conduit.audit import Auditor, AuditReport
from conduit.chunk import Chunk, checksum_bytes
from conduit.contracts import BoundedStaleness, Contract, OnPolicy, Replay, contract_from_dict
from conduit.errors import CapacityError, ConduitError, PlaneFullError, UnknownNameError
from conduit.policy import ChunkInfo, InvalidDecision, Move, Policy
from conduit.registry import create_policy
from conduit.runtime.batch import Batch, BatchBuild, Peek, slice_selections
from conduit.runtime.estimator import BandwidthEstimator
from conduit.runtime.machine import MachineTiers, build_tiers, resolve_topology
from conduit.runtime.metrics import PlaneMetrics
from conduit.runtime.schema import Schema
from conduit.runtime.tiers import Extent, RuntimeTier
from conduit.runtime.transfer import CopyJob, TransferEngine, copy_rows
from conduit.runtime.view import LearnerModel, RuntimeClusterView
from conduit.topology.model import TierKind, Topology
from conduit.tuning_file import resolve_params

SPILL_ORDER = (TierKind.HBM, TierKind.PINNED, TierKind.PAGEABLE, TierKind.NVME)


class DeliveryTimeout(ConduitError, TimeoutError):
    """A learner waited longer than its timeout for a batch; names what was missing."""


@dataclass(eq=False)
class _Chunk:
    """A chunk inside the plane: its metadata, where its bytes are, how much of it is handed out."""

    meta: Chunk
    learner: str | None
    extent: Extent | None
    next_row: int = 0  # rows [0, next_row) have gone into batches (or were dropped)
    busy: int = 0  # copies in flight reading its extent
    builds: int = 0  # batches holding some of its rows, not yet released
    annotation: Any = None  # the producer's small object travelling with the chunk (never in a tier)
    _views: tuple[Extent, dict[str, Any]] | None = None  # column views of ``extent``, made on first use

    def columns(self) -> dict[str, Any]:
        """Column views of the chunk's extent (cached until the chunk moves to another extent)."""
        cached = self._views
        if cached is None or cached[0] is not self.extent:
            cached = self._views = (self.extent, self.extent.columns())
        return cached[1]

    @property
    def tier(self) -> str | None:
        return self.extent.tier.id if self.extent is not None else None

    @property
    def remaining(self) -> int:
        return self.meta.steps - self.next_row


@dataclass(eq=False)
class _Learner:
    model: LearnerModel
    device: str  # "cpu" or "cuda:N"
    tier: RuntimeTier  # where its batches are assembled
    rows: int  # batch size in samples
    pending: deque = field(default_factory=deque)  # _Chunk with rows still to hand out
    builds: dict[int, BatchBuild] = field(default_factory=dict)
    ready: deque = field(default_factory=deque)
    next_update: int = 0
    seq: int = 0
    opened: set = field(default_factory=set)  # OnPolicy: versions that already had their batch opened
    peeking: int = 0  # peek() calls blocked now: the learner is waiting for rows, as in next_batch
    peeked: BatchBuild | None = None  # the batch peek() chose: next_batch hands over this one next

    @property
    def asking(self) -> bool:
        """The learner waits for rows now (in next_batch or peek)."""
        return self.model.waiting or self.peeking > 0


def _as_contract(contract: Contract | Mapping[str, Any]) -> Contract:
    return contract_from_dict(contract) if isinstance(contract, Mapping) else contract


class ExperiencePlane:
    """Real-memory experience plane driven by a :class:`~conduit.policy.Policy`.

    ``schema`` fixes the chunk columns; ``contract`` the data contract; ``policy`` a registered name
    (built-ins and plug-ins) or a :class:`~conduit.policy.Policy`, with ``params`` or a
    ``params_file`` written by ``conduit tune``. ``learners`` maps learner ids to their device
    (``"cpu"`` or ``"cuda:N"``; a list of ids means all on CPU). ``batch_steps`` is the number of
    samples per delivered batch. ``topology`` (default: a probe of this machine) and ``node`` say
    which tiers exist; ``capacities`` how much of each the plane takes.
    """

    def __init__(
        self,
        schema: Schema | Mapping[str, Any],
        contract: Contract | Mapping[str, Any],
        *,
        batch_steps: int,
        policy: str | Policy = "conduit",
        params: Mapping[str, Any] | None = None,
        params_file: str | os.PathLike | None = None,
        learners: Mapping[str, str] | list[str] | tuple[str, ...] = ("learner0",),
        topology: Topology | str | os.PathLike | Mapping | None = None,
        node: str | None = None,
        capacities: Mapping[str, Any] | None = None,
        spill_dir: str | os.PathLike | None = None,
        prefetch_depth: int | None = None,
        ingest_timeout: float = 30.0,
        verify_checksums: bool = False,
        copy_workers: int = 2,
        seed: int | None = None,
    ):
        self.schema = Schema.of(schema)
        self.contract = _as_contract(contract)
        if isinstance(batch_steps, bool) or not isinstance(batch_steps, int) or batch_steps <= 0:
            raise ConduitError(f"batch_steps must be a positive integer, got {batch_steps!r}")
        self.batch_steps = batch_steps
        self.policy = self._load_policy(policy, params, params_file)
        self.path = self.policy.path
        self.prefetch_depth = self.path.prefetch_depth if prefetch_depth is None else int(prefetch_depth)
        if self.prefetch_depth < 0:
            raise ConduitError(f"prefetch_depth must be >= 0, got {prefetch_depth!r}")
        self.ingest_timeout = ingest_timeout
        self.verify_checksums = verify_checksums
        self.topology = resolve_topology(topology)
        if not isinstance(learners, Mapping):
            learners = dict.fromkeys(learners, "cpu")
        if not learners:
            raise ConduitError("a plane needs at least one learner")
        self._machine: MachineTiers = build_tiers(
            self.topology, self.schema, node=node, learner_devices=tuple(sorted(set(learners.values()))),
            capacities=capacities, spill_dir=spill_dir)
        self.node = self._machine.node
        self.tiers: dict[str, RuntimeTier] = self._machine.tiers
        self.unavailable: dict[str, str] = dict(self._machine.unavailable)
        self._largest_tier = max(t.capacity for t in self.tiers.values())  # capacities never change

        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._error: BaseException | None = None
        self._version = 0
        self._ids = itertools.count()
        self._chunk_seq = itertools.count()
        self._rng = np.random.default_rng(seed)
        self._chunks: dict[Hashable, _Chunk] = {}
        self._residents: dict[str, OrderedDict[Hashable, int]] = {t: OrderedDict() for t in self.tiers}
        self._locations: dict[Hashable, str] = {}
        self._table: OrderedDict[Hashable, _Chunk] = OrderedDict()  # Replay: live chunks, oldest first
        self._table_steps = 0
        # Replay sampling state, rebuilt only when the table changes: (chunks, steps, cumulative steps)
        self._table_snapshot: tuple[list[_Chunk], np.ndarray, np.ndarray] | None = None
        self._inserted = 0
        self._sampled = 0  # steps selected for batches (the sampling side of the limiter)
        self._delivered = 0  # steps handed over, counted with the auditor's delivered() (the inserting side)
        self._round_robin = itertools.cycle(list(learners))
        self._rings: list[Any] = []
        self._last_rejection: str | None = None  # the latest refused policy decision (metrics)
        self._last_ring_error: str | None = None
        self._released: dict[int, set[str]] = {}  # OnPolicy: learners done with update k
        self._ring_thread: threading.Thread | None = None

        self.estimator = BandwidthEstimator()
        self.engine = TransferEngine(self.estimator, workers=copy_workers)
        self.metrics_ = PlaneMetrics()
        caps = {t.id: t.capacity for t in self.tiers.values()}
        self.auditor = Auditor(self.contract, caps)
        self._learners: dict[str, _Learner] = {}
        for lid, dev in learners.items():
            tier = self.tiers[self._machine.learner_tier[dev]]
            model = LearnerModel(lid, tier.device, self.node,
                                 self.schema.payload_bytes(batch_steps))
            self._learners[lid] = _Learner(model, dev, tier, batch_steps)
            if tier.schema.extent_bytes(batch_steps) > tier.capacity:
                self.close()
                raise CapacityError(
                    f"a batch of {batch_steps} steps ({tier.schema.extent_bytes(batch_steps)} B) does not fit "
                    f"the learner tier {tier.id} ({tier.capacity} B); raise capacities[{tier.id!r}]")
        self.view = RuntimeClusterView(self.topology, self.tiers, {k: v.model for k, v in self._learners.items()},
                                       self.estimator, self._locations, self._residents, lambda: self._version)

    # ---------------------------------------------------------------------------- set-up
    @staticmethod
    def _load_policy(spec: str | Policy, params: Mapping[str, Any] | None,
                     params_file: str | os.PathLike | None) -> Policy:
        name = spec if isinstance(spec, str) else getattr(spec, "name", None)
        values = resolve_params(name, dict(params or {}), params_file)
        if isinstance(spec, Policy):
            if values:
                raise ConduitError("params and params_file configure a policy given by name; "
                                   "a Policy object comes configured")
            return spec
        return create_policy(spec, **values)

    # ---------------------------------------------------------------------------- versions
    @property
    def policy_version(self) -> int:
        return self._version

    def set_policy_version(self, version: int) -> None:
        """The learners' weights are now ``version`` (producers sample with it from now on)."""
        with self._cond:
            self._version = int(version)
            for q in self._learners.values():
                q.model.version = self._version
            self._pump()

    # ---------------------------------------------------------------------------- ingestion
    def ingest(
        self,
        payload: Mapping[str, Any],
        *,
        policy_version: int,
        chunk_id: Hashable | None = None,
        producer: str = "local",
        t_created: float | None = None,
        learner: str | None = None,
        timeout: float | None = None,
        checksum: int | None = None,
        annotation: Any = None,
    ) -> Hashable:
        """Hand a chunk (``{column: array}``, first dimension = steps) to the plane; returns its id.

        Nothing is stored until the chunk has passed every check; on :class:`PlaneFullError` the
        caller still owns the chunk and nothing of it is in the plane. ``annotation`` is a small
        (picklable) object that travels with the chunk, not through the tiers: every batch (and
        :class:`~conduit.runtime.batch.Peek`) with rows of the chunk carries it in ``annotations``;
        the plane drops its reference when the chunk leaves.
        """
        steps = self.schema.validate(payload, where=f"chunk {chunk_id!r}" if chunk_id is not None else "chunk")
        t_created = time.time() if t_created is None else float(t_created)
        if checksum is None and self.verify_checksums:
            checksum = checksum_bytes({k: np.asarray(v) for k, v in payload.items()})
        need = self.schema.extent_bytes(steps)
        largest = self._largest_tier
        if need > largest:
            raise CapacityError(f"chunk {chunk_id!r}: {steps} steps need {need} B, more than any tier holds "
                                f"(largest: {largest} B); split it or raise the plane's capacities")
        timeout = self.ingest_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            self._check_open()
            if chunk_id is None:
                chunk_id = f"{producer}-{next(self._chunk_seq)}"
            elif chunk_id in self._chunks or chunk_id in self._locations:
                raise ConduitError(f"chunk {chunk_id!r}: a chunk with this id is already in the plane")
            if learner is not None and learner not in self._learners:
                raise UnknownNameError("learner", learner, list(self._learners))
            if isinstance(self.contract, Replay):
                if steps > self.contract.capacity:
                    raise CapacityError(f"chunk {chunk_id!r}: {steps} steps exceed Replay.capacity "
                                        f"{self.contract.capacity}; split it")
                # one predicate, so no other producer is admitted between the check and the counting below
                self._wait(lambda: self.contract.can_insert(steps, self._inserted, self._delivered)
                           and self._trim_replay(steps), deadline,
                           lambda: f"chunk {chunk_id!r}: the replay rate limiter blocked insertion for {timeout:g} s "
                                   f"(sampled {self._delivered} of {self._inserted} inserted steps; the table's "
                                   f"oldest chunk may be in use)")
                self._inserted += steps  # with the auditor's ingested() in _admit, in this same lock hold
                self._table_steps += steps  # its room in the table, reserved
                learner = None
            else:
                learner = learner or next(self._round_robin)
            meta = Chunk(chunk_id, producer, self.node, steps, self.schema.payload_bytes(steps),
                         int(policy_version), t_created, checksum)
            c = _Chunk(meta, learner, None, annotation=annotation)
            placed = self._admit(c, deadline, timeout)
        self._write(c, placed, payload)
        return chunk_id

    def _admit(self, c: _Chunk, deadline: float, timeout: float) -> tuple[str, BatchBuild | None, int]:
        """Under the lock: drop-on-arrival, placement, room. Returns ``(tier, build, first_row)``."""
        meta = c.meta
        self.auditor.ingested(meta, time.time())
        self.metrics_.count("ingested_chunks")
        self.metrics_.count("ingested_bytes", meta.nbytes)
        q = self._learners.get(c.learner) if c.learner is not None else None
        if q is not None and self._stale_on_arrival(q, meta):
            self.auditor.dropped(meta.id, time.time(), "stale")
            self.metrics_.count("dropped_stale_samples", meta.steps)
            self._locations[meta.id] = "dropped"
            return ("", None, -1)
        tier = self._place(c, q)
        if q is not None and tier == q.tier.id:
            self._open_builds(q, meta.policy_version)
            build = self._target_build(q, meta)
            if build is not None and build.free_rows >= meta.steps:
                start = self._reserve(q, build, c, meta.steps)
                return (tier, build, start)
        extent = self._room(c, tier, deadline, timeout)
        c.extent = extent
        return (extent.tier.id, None, 0)

    def _write(self, c: _Chunk, placed: tuple[str, BatchBuild | None, int], payload: Mapping[str, Any]) -> None:
        """Outside the lock: the one ingestion copy, then publish the chunk."""
        tier, build, start = placed
        if start < 0:
            return
        src = {k: payload[k] for k in self.schema.names}
        meta = c.meta
        if build is not None:
            dst_tier = build.extent.tier
            dst = build.extent.columns()
            self.engine.run_now(("producer", tier), lambda: self._copy(None, src, 0, meta.steps, dst_tier, dst, start),
                                cuda=dst_tier.medium.device_side)
            with self._cond:
                self._chunks[meta.id] = c
                self._locations[meta.id] = tier
                self._filled(build, start, meta.steps)
                self._pump()
            return
        dst_tier = c.extent.tier
        dst = c.extent.columns()
        try:
            self.engine.run_now(("producer", tier), lambda: self._copy(None, src, 0, meta.steps, dst_tier, dst, 0),
                                cuda=dst_tier.medium.device_side)
        except BaseException:
            with self._cond:
                c.extent.free()
                if isinstance(self.contract, Replay):
                    self._table_steps -= meta.steps  # its reserved room
                self.auditor.dropped(meta.id, time.time(), "ingest-failed")
                self._cond.notify_all()
            raise
        with self._cond:
            self._chunks[meta.id] = c
            self._locations[meta.id] = tier
            self._residents[tier][meta.id] = c.extent.nbytes
            self.auditor.placed(meta.id, tier, c.extent.nbytes, time.time())
            if isinstance(self.contract, Replay):
                self._insert_replay(c)
            else:
                self._learners[c.learner].pending.append(c)
            self._pump()

    def _stale_on_arrival(self, q: _Learner, meta: Chunk) -> bool:
        if isinstance(self.contract, OnPolicy):
            return meta.policy_version < q.next_update
        if isinstance(self.contract, BoundedStaleness):
            return meta.policy_version < self._version - self.contract.max_lag
        return False

    def _place(self, c: _Chunk, q: _Learner | None) -> str:
        info = ChunkInfo(c.meta.id, self.node, None, float(self.schema.extent_bytes(c.meta.steps)),
                         c.meta.policy_version, q.model.id if q is not None else None)
        try:
            tier = self.policy.placement.place(info, self.view).tier
            if tier not in self.tiers:
                raise InvalidDecision(self.policy.placement.name, tier,
                                      f"no tier {tier!r} on this node; tiers: {sorted(self.tiers)}")
            return tier
        except InvalidDecision as exc:
            self._reject(exc)
        # the safe default: the consumer's own tier, else the fastest host tier
        return q.tier.id if q is not None else self._fallback_tiers()[0].id

    def _reject(self, exc: InvalidDecision) -> None:
        self.metrics_.count("rejected_decisions")
        self._last_rejection = str(exc)

    def _fallback_tiers(self) -> list[RuntimeTier]:
        return sorted(self.tiers.values(), key=lambda t: SPILL_ORDER.index(t.kind))

    def _room(self, c: _Chunk, tier_id: str, deadline: float, timeout: float) -> Extent:
        """An extent for the chunk in ``tier_id``; spill, fall back, or wait for room."""
        steps = c.meta.steps
        while True:
            tier = self.tiers[tier_id]
            extent = tier.allocate(steps)
            if extent is None and tier.capacity >= tier.schema.extent_bytes(steps):
                self._spill(tier, tier.schema.extent_bytes(steps))
                extent = tier.allocate(steps)
            if extent is None:
                for other in self._fallback_tiers():
                    if other is not tier and other.kind.value != "hbm":
                        extent = other.allocate(steps)
                        if extent is not None:
                            self.metrics_.count("fallback_placements")
                            break
            if extent is not None:
                return extent
            if time.monotonic() >= deadline:
                self.auditor.dropped(c.meta.id, time.time(), "refused-full")
                self.metrics_.count("refused_full")
                self._locations.pop(c.meta.id, None)
                raise PlaneFullError(
                    f"chunk {c.meta.id!r} ({c.meta.nbytes} B): no tier had room within {timeout:g} s "
                    f"({', '.join(f'{t.id} {t.used}/{t.capacity} B' for t in self.tiers.values())}); "
                    "the chunk was not ingested")
            self.metrics_.count("backpressure_waits")
            self._cond.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            self._check_open()

    def _spill(self, tier: RuntimeTier, need: int) -> None:
        """Ask the placement policy which residents to move out of a full tier, and move them."""
        try:
            moves = list(self.policy.placement.spill(tier.id, need, self.view))
        except InvalidDecision as exc:
            self._reject(exc)
            moves = []
        for move in moves:
            self._spill_move(tier, move)

    def _spill_move(self, tier: RuntimeTier, move: Move) -> None:
        c = self._chunks.get(move.chunk_id)
        dst = self.tiers.get(move.dst_tier)
        if c is None or c.extent is None or c.extent.tier is not tier or c.busy or dst is None or dst is tier:
            self._reject(InvalidDecision(self.policy.placement.name, move,
                                         "not a resident of the tier being spilled, busy, or an unknown destination"))
            return
        new = dst.allocate(c.meta.steps)
        if new is None:
            self._reject(InvalidDecision(self.policy.placement.name, move, f"{dst.id} has no room"))
            return
        old = c.extent
        nbytes = self.engine.run_now((tier.id, dst.id), lambda: copy_rows(
            old.columns(), slice(0, c.meta.steps), new.columns(), 0) * self.schema.step_bytes,
            cuda=tier.medium.device_side or dst.medium.device_side)
        old.free()
        c.extent = new
        del self._residents[tier.id][c.meta.id]
        self._residents[dst.id][c.meta.id] = new.nbytes
        self._locations[c.meta.id] = dst.id
        self.auditor.moved(c.meta.id, tier.id, dst.id, new.nbytes, time.time())
        self.metrics_.count("spilled_chunks")
        self.metrics_.count("spilled_bytes", nbytes)

    # ---------------------------------------------------------------------------- assembly
    def _target_build(self, q: _Learner, meta: Chunk) -> BatchBuild | None:
        if isinstance(self.contract, OnPolicy):
            b = q.builds.get(meta.policy_version)
            return b if b is not None and b.free_rows > 0 else None
        for b in q.builds.values():
            if b.free_rows > 0:
                return b
        return None

    def _reserve(self, q: _Learner, build: BatchBuild, c: _Chunk, n: int) -> int:
        n = min(n, build.free_rows)
        start = build.reserve(n)
        first, c.next_row = c.next_row, c.next_row + n
        build.selections.append((c.meta.id, range(first, first + n)))
        if n == c.meta.steps:
            build.whole.add(c.meta.id)
        if c.annotation is not None:
            build.annotations[c.meta.id] = c.annotation
        build.created.append(c.meta.t_created)
        build.versions.append(c.meta.policy_version)
        c.builds += 1
        if c.remaining == 0 and c in q.pending:
            q.pending.remove(c)
        return start

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
        if isinstance(self.contract, OnPolicy):
            versions = {c.meta.policy_version for c in q.pending if c.remaining}
            if arriving is not None:
                versions.add(arriving)
            keys = [k for k in sorted(versions - q.opened) if k >= q.next_update]
        else:
            has_rows = arriving is not None or any(c.remaining for c in q.pending)
            keys = [] if not has_rows or any(b.free_rows for b in q.builds.values()) else [q.seq]
        for key in keys:
            # OnPolicy: the batch the learner needs next is never starved by batches of later
            # versions that happened to open first (it may go one over the prefetch depth)
            if len(q.builds) + len(q.ready) >= limit + (isinstance(self.contract, OnPolicy) and key == q.next_update):
                return
            extent = q.tier.allocate(self.batch_steps)
            if extent is None:
                self._spill(q.tier, q.tier.schema.extent_bytes(self.batch_steps))
                extent = q.tier.allocate(self.batch_steps)
            if extent is None:
                self.metrics_.count("batch_alloc_waits")
                return
            build = BatchBuild(q.model.id, key, extent, self.batch_steps)
            build.id = ("batch", q.model.id, next(self._ids))
            self.auditor.placed(build.id, q.tier.id, extent.nbytes, time.time())
            q.builds[key] = build
            if isinstance(self.contract, OnPolicy):
                q.opened.add(key)
            else:
                q.seq += 1

    def _drop_stale(self, q: _Learner) -> None:
        for c in list(q.pending):
            if c.remaining and self._stale_on_arrival(q, c.meta):
                self.auditor.dropped(c.meta.id, time.time(), "stale", range(c.next_row, c.meta.steps))
                self.metrics_.count("dropped_stale_samples", c.remaining)
                c.next_row = c.meta.steps
                q.pending.remove(c)
                self._maybe_retire(c)

    def _pump(self) -> None:
        """Under the lock: drop what the contract no longer admits, open batches, start moves."""
        if self._closed or isinstance(self.contract, Replay):
            return
        pending: dict[str, list[tuple[Hashable, float]]] = {}
        for q in self._learners.values():
            self._drop_stale(q)
            self._open_builds(q)
            waiting = [(c.meta.id, float(c.remaining * self.schema.step_bytes)) for c in q.pending
                       if c.remaining and c.busy == 0 and self._target_build(q, c.meta) is not None]
            if waiting:
                pending[q.model.id] = waiting
        if not pending:
            return
        approved: set[Hashable] = set()
        try:
            moves = list(self.policy.scheduling.plan(pending, self.view))
        except InvalidDecision as exc:
            self._reject(exc)
            moves = []
        for m in moves:
            approved.add(m.chunk_id)
        for lid, items in pending.items():
            q = self._learners[lid]
            free_run = q.asking or q.tier.kind is not TierKind.HBM and self.path.overlap_collection
            for cid, _ in items:
                c = self._chunks[cid]
                streamed = q.peeked is not None and self._target_build(q, c.meta) is q.peeked
                if cid in approved or free_run or streamed or c.tier == q.tier.id:
                    self._start_move(q, c)

    def _start_move(self, q: _Learner, c: _Chunk) -> None:
        build = self._target_build(q, c.meta)
        if build is None or c.extent is None:
            return
        n = min(c.remaining, build.free_rows)
        first = c.next_row
        start = self._reserve(q, build, c, n)
        src_extent, dst_extent = c.extent, build.extent
        c.busy += 1
        cuda = src_extent.tier.medium.device_side or dst_extent.tier.medium.device_side

        def work() -> int:
            return self._copy(src_extent.tier, src_extent.columns(), first, n, dst_extent.tier,
                              dst_extent.columns(), start)

        def done(err: BaseException | None) -> None:
            with self._cond:
                c.busy -= 1
                if err is not None:
                    self._error = err
                    self._cond.notify_all()
                    return
                if c.remaining == 0 and c.busy == 0 and c.extent is not None:
                    self._free_extent(c)
                self._filled(build, start, n)
                self._pump()

        self.metrics_.count("moves")
        self.engine.submit(CopyJob((src_extent.tier.id, dst_extent.tier.id), work, done, cuda=cuda))

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
        tier = c.extent.tier.id
        c.extent.free()
        c.extent = None
        self._residents[tier].pop(c.meta.id, None)
        self._locations[c.meta.id] = self._learners[c.learner].tier.id if c.learner else tier
        self.auditor.evicted(c.meta.id, time.time(), tier)
        self._cond.notify_all()

    def _maybe_retire(self, c: _Chunk) -> None:
        """A chunk whose every row is delivered or dropped, and whose batches are released, leaves."""
        if c.remaining == 0 and c.busy == 0 and c.builds == 0:
            if c.extent is not None:
                self._free_extent(c)
            self.auditor.evicted(c.meta.id, time.time())
            self._chunks.pop(c.meta.id, None)
            self._locations.pop(c.meta.id, None)
            c.annotation = None

    # ---------------------------------------------------------------------------- delivery
    def next_batch(self, learner: str | None = None, *, update: int | None = None,
                   timeout: float | None = None) -> Batch:
        """The learner's next batch, waiting up to ``timeout`` seconds (None: forever).

        Under ``OnPolicy`` it is the batch of ``update`` (default: the learner's next update, which
        starts at the plane's policy version and advances with each release).
        """
        learner = learner or next(iter(self._learners))
        if learner not in self._learners:
            raise UnknownNameError("learner", learner, list(self._learners))
        if isinstance(self.contract, Replay):
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
            upd = build.key if isinstance(self.contract, OnPolicy) else self._version
            t_handed = time.time()
            checks = self._checksums(build) if self.verify_checksums else None
            self.auditor.delivered(upd, build.selections, t_handed, checks)
            exposed = self.metrics_.update_started(learner, t_asked, build.t_ready, t_handed, build.created)
            self.metrics_.count("delivered_batches")
            self.metrics_.count("delivered_samples", build.filled)
            self.last_exposed = exposed
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
        learner = learner or next(iter(self._learners))
        if learner not in self._learners:
            raise UnknownNameError("learner", learner, list(self._learners))
        if isinstance(self.contract, Replay):
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
        if isinstance(self.contract, OnPolicy):
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
        upd = q.next_update if isinstance(self.contract, OnPolicy) else self._version
        if build is None:
            cols = {c.name: np.empty((0, *c.shape), c.dtype) for c in self.schema.columns}
            return Peek(upd, start, stop, cols, [], {}, False, self.batch_steps)
        cols = {k: v[start:stop] for k, v in build.extent.columns().items()}
        if copy is not None:
            cols = {k: copy(v) for k, v in cols.items()}
        sel = slice_selections(build.selections, start, stop)
        notes = {cid: build.annotations[cid] for cid, _ in sel if cid in build.annotations}
        return Peek(build.key if isinstance(self.contract, OnPolicy) else upd, start, stop, cols, sel, notes,
                    build.complete, build.rows)

    def _take_ready(self, q: _Learner) -> BatchBuild | None:
        while q.ready:
            if isinstance(self.contract, OnPolicy):
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
            if isinstance(self.contract, BoundedStaleness) and \
                    min(b.versions) < self._version - self.contract.max_lag:
                for cid, idx in b.selections:  # went stale while waiting: drop it whole
                    self.auditor.dropped(cid, time.time(), "stale", idx)
                self.metrics_.count("dropped_stale_samples", b.filled)
                self._release(b, None)
                continue
            return b
        return None

    def _advance_to(self, q: _Learner, update: int | None) -> None:
        """OnPolicy, under the lock: a learner asking for ``update`` (None: its next one)."""
        if isinstance(self.contract, OnPolicy) and update is not None and update != q.next_update:
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
        for cid, idx in build.selections:
            self.auditor.dropped(cid, time.time(), reason, idx)
        self._release(build, None)

    def _missing(self, q: _Learner, timeout: float | None) -> str:
        what = f"update {q.next_update}" if isinstance(self.contract, OnPolicy) else "its next batch"
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
            q = self._learners[build.learner]
            if q.peeked is build:
                q.peeked = None
            build.extent.free()
            self.auditor.evicted(build.id, time.time(), build.extent.tier.id)
            if isinstance(self.contract, Replay):
                if update is not None:
                    self.auditor.consumed(update, time.time())
                self._cond.notify_all()
                return
            for cid, _ in build.selections:
                c = self._chunks.get(cid)
                if c is not None:
                    c.builds -= 1
            if update is not None and isinstance(self.contract, OnPolicy):
                for c in list(q.pending):  # version-k samples beyond batch k's rows
                    if c.meta.policy_version == update and c.remaining:
                        self.auditor.dropped(c.meta.id, time.time(), "surplus", range(c.next_row, c.meta.steps))
                        self.metrics_.count("dropped_surplus_samples", c.remaining)
                        c.next_row = c.meta.steps
                        q.pending.remove(c)
                        self._maybe_retire(c)  # none of its rows in a batch: it leaves now (as stale ones do)
                q.next_update = max(q.next_update, update + 1)
                q.opened = {k for k in q.opened if k >= q.next_update}
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

    # ---------------------------------------------------------------------------- replay
    def _insert_replay(self, c: _Chunk) -> None:
        self._table[c.meta.id] = c  # counted and given room at admission (ingest)
        self._table_snapshot = None
        self._cond.notify_all()

    def _trim_replay(self, steps: int) -> bool:
        """Under the lock: evict the oldest chunks until ``steps`` more fit in the table. False (wait)
        while the oldest is being sampled or the table's contents are still in flight."""
        while self._table_steps + steps > self.contract.capacity:
            if not self._table:
                return False
            cid, old = next(iter(self._table.items()))
            if old.busy:
                return False
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
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        with self._cond:
            self._check_open()
            q.model.requested(t_asked)
            self._wait(lambda: self._table and self.contract.can_sample(n, self._inserted, self._sampled),
                       deadline, lambda: f"learner {learner!r}: the replay rate limiter allowed no sample within "
                                         f"{timeout} s ({self._inserted} steps inserted, {self._sampled} sampled, "
                                         f"min_size {self.contract.min_size})", DeliveryTimeout)
            extent = q.tier.allocate(n)
            while extent is None:
                self._cond.wait(0.05)
                extent = q.tier.allocate(n)
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
                c.busy += 1
                selections.append((c, rows[lo:hi]))
            self._sampled += n
        build = BatchBuild(learner, -1, extent, n)
        build.id = ("batch", learner, next(self._ids))
        dst = extent.columns()
        by_tier: dict[str, list[tuple[_Chunk, np.ndarray, int]]] = {}  # one timed copy run per source tier
        row = 0
        for c, idx in selections:
            by_tier.setdefault(c.extent.tier.id, []).append((c, idx, row))
            row += len(idx)
            build.selections.append((c.meta.id, idx))
            build.created.append(c.meta.t_created)
            build.versions.append(c.meta.policy_version)
            if c.annotation is not None:
                build.annotations[c.meta.id] = c.annotation

        def gather(parts: list[tuple[_Chunk, np.ndarray, int]]) -> int:
            return sum(copy_rows(c.columns(), idx, dst, start) for c, idx, start in parts) \
                * self.schema.step_bytes

        try:
            for src_tier, parts in by_tier.items():
                device_side = q.tier.medium.device_side or parts[0][0].extent.tier.medium.device_side
                self.engine.run_now((src_tier, q.tier.id), lambda parts=parts: gather(parts), cuda=device_side)
        except BaseException:
            with self._cond:
                for c, _ in selections:
                    c.busy -= 1
                self._cond.notify_all()
            raise
        build.reserved = build.filled = build.prefix = n
        build.t_ready = time.time()
        with self._cond:
            self.auditor.placed(build.id, q.tier.id, extent.nbytes, time.time())
            q.model.served()
            upd = self._version
            t_handed = time.time()
            self.auditor.delivered(upd, build.selections, t_handed)
            self._delivered += n
            for c, _ in selections:  # only now may a producer evict them (after the auditor saw the delivery)
                c.busy -= 1
            self._cond.notify_all()
            self.metrics_.update_started(learner, t_asked, build.t_ready, t_handed, [])
            self.metrics_.count("delivered_batches")
            self.metrics_.count("delivered_samples", n)
            return Batch(self, build, upd, dst)

    # ---------------------------------------------------------------------------- helpers
    def _wait(self, ok: Callable[[], bool], deadline: float, message: Callable[[], str],
              error: type[Exception] = PlaneFullError) -> None:
        while not ok():
            left = deadline - time.monotonic()
            if left <= 0:
                raise error(message())
            self._cond.wait(min(0.1, left))
            self._check_open()

    def _check_open(self) -> None:
        if self._error is not None:
            raise ConduitError(f"the plane stopped after a copy failed: {self._error!r}") from self._error
        if self._closed:
            raise ConduitError("the plane is closed")

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
        while not self._closed:
            try:
                self.ingest(rec.columns, policy_version=rec.policy_version, chunk_id=rec.chunk_id,
                            producer=rec.producer, t_created=rec.t_created, checksum=rec.checksum,
                            timeout=1.0)
                break
            except PlaneFullError:
                continue  # the ring holds the chunk meanwhile: backpressure reaches the producer
            except ConduitError as exc:
                self.metrics_.count("ring_rejected_chunks")
                self._last_ring_error = str(exc)
                break
        ring.release(rec)

    # ---------------------------------------------------------------------------- state
    def audit(self) -> AuditReport:
        with self._lock:
            return self.auditor.report()

    def metrics(self) -> dict[str, Any]:
        """DESIGN.md metrics so far, plane counters, tier occupancy and live bandwidth estimates."""
        with self._lock:
            out = self.metrics_.summary()
            out["tiers"] = {t.id: t.describe() for t in self.tiers.values()}
            out["unavailable_tiers"] = dict(self.unavailable)
            out["bandwidth"] = self.estimator.snapshot()
            out["transfers"] = self.engine.stats()
            out["rings"] = {r.spec().producer: {"used": r.used, "capacity": r.capacity,
                                                 "discarded_partial": r.discarded_partial} for r in self._rings}
            out["policy"] = self.policy.describe()
            out["last_rejection"] = self._last_rejection
            out["last_ring_error"] = self._last_ring_error
            return out

    def close(self) -> AuditReport:
        """Stop, free all memory, and return the final audit."""
        with self._cond:
            if self._closed:
                return self.auditor.report()
            self._closed = True
            self._cond.notify_all()
        if self._ring_thread is not None:
            self._ring_thread.join(timeout=5)
        if hasattr(self, "engine"):
            self.engine.close()
        for ring in self._rings:
            ring.close()
        with self._lock:
            if hasattr(self, "auditor"):
                now = time.time()
                for q in self._learners.values():  # batches assembled but never handed over: say so
                    for b in [*q.builds.values(), *q.ready]:
                        for cid, idx in b.selections:
                            self.auditor.dropped(cid, now, "shutdown", idx)
                        self.metrics_.count("dropped_shutdown_samples", b.reserved)
            report = self.auditor.finish(time.time()) if hasattr(self, "auditor") else None
        self._machine.close()
        return report

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _host(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.cpu().numpy()
