"""The experience plane: ingestion, placement and delivery of real bytes, decided by policies.

:class:`ExperiencePlane` is the runtime's core, usable in one process with no Ray (the GPU machine
tests it that way) and wrapped one-per-node by :mod:`conduit.runtime.ray_plane`.

Every decision is the plane core's (:mod:`conduit.plane`), shared with the simulator: this module
only moves bytes.

**Ingestion.** A producer hands over a chunk (:meth:`ExperiencePlane.ingest`, or through a
shared-memory ring from another process, :meth:`ExperiencePlane.attach_producer`). It is checked
against the schema before a byte moves; the placement policy chooses its tier, as the core's
:class:`~conduit.plane.Arbiter` checks it (a wrong type, an unknown tier, one without room, another
node's HBM, or an exception inside the policy is counted by reason and replaced by the one safe
default: pinned, then pageable memory on the consumer's node); the plane copies it there once. When
that tier is its learner's and a batch for it is being assembled, that one copy writes it straight
into the batch.

**Placement.** Tiers are real memory (:mod:`conduit.runtime.machine`); the core's
:class:`~conduit.plane.ChunkLedger` keeps which chunk is where and tells the auditor. A full tier asks
the policy to ``spill`` (its moves checked by the core; each accepted one is executed as one copy);
a chunk larger than every tier is refused at once (:class:`CapacityError`), and a tier with no room
makes the producer wait, up to a timeout (:class:`PlaneFullError`): backpressure, never unbounded
memory.

**Delivery.** Each learner has batches assembled ahead of need in its device tier, at most
``prefetch_depth`` at a time. The core's :meth:`~conduit.plane.Arbiter.plan` decides which chunks move
now: the scheduling policy's checked plan; a waiting learner's chunks whatever the policy says
(*forced*, counted: a policy can cost time, never data); a CPU learner's as they arrive when the path
settings ask for ``overlap_collection``. Moves run on the transfer engine's background workers, so
they overlap the learner's update. The other path settings are executed here as in the simulator
(``batch_build``, ``overlap_update``, ``granularity``, ``split``/``target_chunk_bytes``, ``pinned``;
see :meth:`ExperiencePlane._pump` and :meth:`ExperiencePlane._start_moves`); ``route="driver"`` (stock
RLlib's path) is refused at construction, naming the setting. A learner may also read its next batch
while it is assembled (:meth:`ExperiencePlane.peek`: the rows from 0 whose copies have all finished)
and take it whole with ``next_batch`` afterwards; each chunk's ``annotation`` comes along with the
batches (and peeks) that carry its rows.

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

**The audit is told what happened, when it happened.** An ingest first *reserves*: the chunk id
(atomically, so two producers racing with one id cannot both get in), its room in the Replay table,
its rows in a batch or an extent in a tier. Only when its copy has landed is it *committed*, and only
then does the auditor hear of it (``ingested``, ``placed``, a drop on arrival). A call that fails
(:class:`PlaneFullError`, a copy that raises, the plane closing) gives every reservation back and
leaves no trace but a refusal counter (``refused_full``, ``failed_ingests``), so the documented retry
with the same id is a first ingest. Memory is freed only when nothing still copies into or out of it:
a batch released or discarded while copies run is freed by the last of them, a chunk's extent once no
copy reads it, and :meth:`ExperiencePlane.close` waits for every copy before it frees anything.

**Timeouts.** Every blocking call (``ingest``, ``next_batch``, ``peek``) waits at most its timeout,
wakes up when the plane is closed, and takes ``None`` for "until close()"; a timeout that is negative,
infinite or NaN is refused at once with a :class:`~conduit.errors.ConduitError` naming the argument.
"""

from __future__ import annotations

import itertools
import math
import numbers
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
from conduit.contracts import Contract, contract_from_dict
from conduit.errors import CapacityError, ConduitError, PlaneFullError, UnknownNameError
from conduit.plane import Arbiter, ChunkLedger, Rejections, rules_for
from conduit.policy import ChunkInfo, Move, Policy
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


class DeliveryTimeout(ConduitError, TimeoutError):
    """A learner waited longer than its timeout for a batch; names what was missing."""


def _timeout_arg(name: str, value: Any) -> float | None:
    """A timeout argument: ``None`` (wait until close()) or a finite number of seconds >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConduitError(f"{name} must be a number of seconds or None (wait until close()), got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ConduitError(f"{name} must be a finite number of seconds >= 0, or None to wait until close(); "
                           f"got {value!r}")
    return seconds


def _deadline(timeout: float | None) -> float:
    return math.inf if timeout is None else time.monotonic() + timeout


def _secs(timeout: float | None) -> str:
    return "until close()" if timeout is None else f"{timeout:g} s"


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
class _Segment:
    """Rows ``[first, first + n)`` of a chunk copied into rows ``[start, start + n)`` of a batch."""

    chunk: _Chunk
    build: BatchBuild
    first: int
    start: int
    n: int


@dataclass(eq=False)
class _Admission:
    """What one ingest holds before it commits, so that a failure gives all of it back."""

    chunk: _Chunk
    table_steps: int = 0  # Replay: room reserved in the table (counted in ``_inserting`` too)
    build: BatchBuild | None = None  # the batch its one copy writes into, rows [start, start + steps)
    start: int = 0


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


def _check_path_settings(policy: Policy) -> None:
    """Refuse, naming the field, a path setting this backend cannot execute (see the module doc)."""
    path = policy.path
    if path.route != "direct":
        raise ConduitError(
            f"policy {policy.name!r}: path setting route={path.route!r} cannot run in the runtime plane: the "
            "plane is the direct route (producer -> placement -> learner); the driver route is stock RLlib "
            "itself (run without enable()), and only the simulator models it")


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
        self.contract_rules = self.rules = rules_for(self.contract)
        self.policy = self._load_policy(policy, params, params_file)
        self.path = self.policy.path
        _check_path_settings(self.policy)
        self.prefetch_depth = self.path.prefetch_depth if prefetch_depth is None else int(prefetch_depth)
        if self.prefetch_depth < 0:
            raise ConduitError(f"prefetch_depth must be >= 0, got {prefetch_depth!r}")
        self.ingest_timeout = _timeout_arg("ingest_timeout", ingest_timeout)
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
        self._dropped_ids: set[Hashable] = set()  # chunks dropped on arrival: their ids stay taken
        self._table: OrderedDict[Hashable, _Chunk] = OrderedDict()  # Replay: live chunks, oldest first
        self._table_steps = 0
        # Replay sampling state, rebuilt only when the table changes: (chunks, steps, cumulative steps)
        self._table_snapshot: tuple[list[_Chunk], np.ndarray, np.ndarray] | None = None
        self._inserted = 0  # committed steps (what the auditor has seen ingested)
        self._inserting = 0  # steps of inserts admitted and still copying (their table room is reserved)
        self._sampled = 0  # steps selected for batches (the sampling side of the limiter)
        self._delivered = 0  # steps handed over, counted with the auditor's delivered() (the inserting side)
        self._round_robin = itertools.cycle(list(learners))
        self._rings: list[Any] = []
        self._last_spill_error: str | None = None  # the latest spill copy that failed (metrics)
        self._last_ring_error: str | None = None
        self._last_ingest_error: str | None = None  # the latest ingest that failed after admission (metrics)
        self._released: dict[int, set[str]] = {}  # OnPolicy: learners done with update k
        self._ring_thread: threading.Thread | None = None
        self._admitting: set[Hashable] = set()  # ids of ingests under way (reserved, not committed)
        self._sampling = 0  # replay samples copying now
        self._handed: set[BatchBuild] = set()  # batches handed to learners, not released yet
        self._finished = False  # the auditor gave its final report (close)

        self.estimator = BandwidthEstimator()
        self.engine = TransferEngine(self.estimator, workers=copy_workers)
        self.metrics_ = PlaneMetrics()
        caps = {t.id: t.capacity for t in self.tiers.values()}
        self.auditor = Auditor(self.contract, caps)
        self.ledger = ChunkLedger(self.tiers, self.auditor)
        self.rejections = Rejections()
        self.arbiter = Arbiter(self.policy, self.rejections)
        self._learners: dict[str, _Learner] = {}
        for lid, dev in learners.items():
            tier = self.tiers[self._machine.learner_tier[dev]]
            model = LearnerModel(lid, self._compute_device(dev, tier), self.node,
                                 self.schema.payload_bytes(batch_steps), tier=tier.id)
            self._learners[lid] = _Learner(model, dev, tier, batch_steps)
            if tier.schema.extent_bytes(batch_steps) > tier.capacity:
                self.close()
                raise CapacityError(
                    f"a batch of {batch_steps} steps ({tier.schema.extent_bytes(batch_steps)} B) does not fit "
                    f"the learner tier {tier.id} ({tier.capacity} B); raise capacities[{tier.id!r}]")
        self.view = RuntimeClusterView(self.topology, self.tiers, {k: v.model for k, v in self._learners.items()},
                                       self.estimator, self.ledger, lambda: self._version)

    # ---------------------------------------------------------------------------- set-up
    def _cpu_of(self, node: str) -> str | None:
        """The CPU device of ``node`` in the topology (where a producer there runs)."""
        cpus = self.topology.devices_of("cpu", node)
        return cpus[0].id if cpus else None

    def _compute_device(self, dev: str, tier: RuntimeTier) -> str:
        """The topology's compute device of a learner: its GPU, or the node's CPU device (the same
        names the simulator's learners carry)."""
        if tier.kind is TierKind.HBM:
            return tier.device
        return self._cpu_of(self.node) or tier.device

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
            elif chunk_id in self._chunks or chunk_id in self.ledger or chunk_id in self._dropped_ids \
                    or chunk_id in self._admitting:
                raise ConduitError(f"chunk {chunk_id!r}: a chunk with this id is already in the plane")
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
        self._dropped_ids.add(meta.id)  # the id stays taken (the auditor remembers it)

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
            return
        old.free()
        c.extent = new
        self.ledger.moved(c.meta.id, dst.id, new.nbytes, time.time())
        self.metrics_.count("spilled_chunks")
        self.metrics_.count("spilled_bytes", nbytes)

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
            build = BatchBuild(q.model.id, key, extent, self.batch_steps)
            build.id = ("batch", q.model.id, next(self._ids))
            self.auditor.placed(build.id, q.tier.id, extent.nbytes, time.time())
            q.builds[key] = build
            if self.rules.by_version:
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
        if pending:
            start.extend((self._learners[lid], self._chunks[cid])
                         for lid, cid in self.arbiter.plan(pending, self.view, asking=asking))
        if start:
            self._start_moves(start)

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
            return Batch(self, build, upd, dst)

    # ---------------------------------------------------------------------------- helpers
    def _wait(self, ok: Callable[[], bool], deadline: float, message: Callable[[], str],
              error: type[Exception] = PlaneFullError) -> None:
        """Under the lock: wait until ``ok()``, at most until ``deadline`` (``math.inf``: until close())."""
        while not ok():
            self._check_open()
            left = deadline - time.monotonic()
            if left <= 0:
                raise error(message())
            self._cond.wait(min(0.1, left))

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
        """Ingest one committed ring record; retried while the plane is full (a refused ingest leaves
        no trace, so the retry with the same id is clean), counted and dropped if refused otherwise."""
        while not self._closed:
            try:
                self.ingest(rec.columns, policy_version=rec.policy_version, chunk_id=rec.chunk_id,
                            producer=rec.producer, t_created=rec.t_created, checksum=rec.checksum,
                            timeout=1.0)
                break
            except PlaneFullError:
                continue  # the ring holds the chunk meanwhile: backpressure reaches the producer
            except Exception as exc:  # noqa: BLE001 - one bad record must not stop the ring thread; counted
                if self._closed:
                    break
                self.metrics_.count("ring_rejected_chunks")
                self._last_ring_error = str(exc) if isinstance(exc, ConduitError) else repr(exc)
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
            out["rejections"] = self.rejections.to_dict()  # by reason code, as the simulator's --json
            out["rejected_decisions"] = self.rejections.total
            out["forced_moves"] = self.rejections.forced_moves
            out["last_rejection"] = self.rejections.last
            out["last_spill_error"] = self._last_spill_error
            out["last_ring_error"] = self._last_ring_error
            out["last_ingest_error"] = self._last_ingest_error
            return out

    def close(self, timeout: float = 30.0) -> AuditReport:
        """Stop, free all memory, and return the final audit.

        Blocked calls wake up and fail (:class:`~conduit.errors.ConduitError`: the plane is closed);
        copies still running are waited for (up to ``timeout`` seconds) before any memory is freed.
        Batches assembled but never handed over are dropped as ``shutdown``. Memory a copy still
        used after the wait is left allocated (``close_copies_running`` in :meth:`metrics`), never
        freed under it."""
        with self._cond:
            if self._closed:
                return self.auditor.report()
            self._closed = True
            self._cond.notify_all()
        if self._ring_thread is not None:
            self._ring_thread.join(timeout=5)
        drained = self.engine.close(timeout=timeout)  # runs the copies already queued, their callbacks too
        end = time.monotonic() + timeout
        with self._cond:
            # ingests and replay samples copying now give their memory back when they see the plane closed
            while (self._admitting or self._sampling) and time.monotonic() < end:
                self._cond.wait(0.05)
            builds = [b for q in self._learners.values() for b in [*q.builds.values(), *q.ready]]
            running = len(self._admitting) + self._sampling + sum(b.inflight for b in builds)
            now = time.time()
            for b in builds:  # batches assembled but never handed over: say so
                n = 0
                for cid, idx in b.selections:
                    if cid not in self._admitting:
                        self.auditor.dropped(cid, now, "shutdown", idx)
                        n += len(idx)
                self.metrics_.count("dropped_shutdown_samples", n)
            report = self.auditor.finish(time.time())
            self._finished = True
            quiet = drained and running == 0
            if quiet:
                self._free_all(builds)
            else:
                self.metrics_.count("close_copies_running", running or 1)
        for ring in self._rings:
            ring.close()
        if quiet:
            self._machine.close()
        return report

    def _free_all(self, builds: list[BatchBuild]) -> None:
        """Under the lock, at close and with no copy running: every extent goes back to its tier."""
        for b in [*builds, *self._handed]:
            if not b.freed:
                b.freed = True
                b.extent.free()
            b.dead = b.dead or "shutdown"
        self._handed.clear()
        for q in self._learners.values():
            q.builds.clear()
            q.ready.clear()
            q.pending.clear()
            q.peeked = None
        for c in self._chunks.values():
            if c.extent is not None:
                c.extent.free()
                c.extent = None
            c.annotation = None
        self._chunks.clear()
        self._table.clear()
        self._table_snapshot = None
        self.ledger.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _host(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.cpu().numpy()
