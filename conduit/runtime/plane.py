"""The experience plane: ingestion, placement and delivery of real bytes, decided by policies.

:class:`ExperiencePlane` is the runtime's core, usable in one process with no Ray (the GPU machine
tests it that way) and wrapped one-per-node by :mod:`conduit.runtime.ray_plane`.

Every decision is the plane core's (:mod:`conduit.plane`), shared with the simulator: the runtime
only moves bytes. The plane is split along its three control points: :mod:`conduit.runtime.ingestion`
(ingestion and placement), :mod:`conduit.runtime.assembly` (assembly and delivery) and
:mod:`conduit.runtime.replay` (the Replay table); :mod:`conduit.runtime.records` holds their records.
This module puts them together, with set-up, versions, metrics and ``close()``.

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
settings ask for ``overlap_collection`` (with it off, planned moves wait for the learner's ask). Moves run on the transfer engine's background workers, so
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
* ``Replay``: chunks form a FIFO table of ``capacity`` steps (oldest evicted); batches are drawn
  from live samples across all tiers by the contract's sampler (:mod:`conduit.plane.sampler`:
  uniform, or prioritized with importance weights and priority updates); inserts and samples pass
  the rate limiter, so the sample/insert ratio stays in the contract's band (a producer ahead of
  the learner waits).

**The audit is told what happened, when it happened.** An ingest first *reserves*: the chunk id
(atomically, so two producers racing with one id cannot both get in), its room in the Replay table,
its rows in a batch or an extent in a tier. Only when its copy has landed is it *committed*, and only
then does the auditor hear of it (``ingested``, ``placed``, a drop on arrival). A call that fails
(:class:`PlaneFullError`, a copy that raises, the plane closing) gives every reservation back and
leaves no trace but a refusal counter (``refused_full``, ``failed_ingests``), so the documented retry
with the same id is a first ingest. Memory is freed only when nothing still copies into or out of it:
a batch released or discarded while copies run is freed by the last of them, a chunk's extent once no
copy reads it, and :meth:`ExperiencePlane.close` waits for every copy before it frees anything.

**Recovery.** With ``recovery_dir`` the plane survives the death of its process: the auditor's
events, the policy version and the index of the NVMe tier's spill file (which chunk's bytes are
where) are recorded in a :class:`~conduit.plane.recovery.RecoveryLog` in that directory before they
take effect, and the spill file has a fixed name there. A plane started on a directory a dead plane
left behind continues its audit; takes over the chunks the spill file still holds (the plane core's
:func:`~conduit.plane.recovery.plan_recovery` decides which); counts every other chunk that was
still in the plane as lost (``lost_samples["plane restart"]`` in the audit: memory tiers, batches
being assembled), never as a violation; restores the Replay rate limiter's counts; and, under
OnPolicy, assembles each not-yet-trained batch short by the samples of its version that were lost.
:attr:`ExperiencePlane.incarnation` counts the restarts.

**Checkpoints.** :meth:`ExperiencePlane.snapshot` returns the plane's state as plain data (the Replay
table column by column, the rate limiter, the audit's counts, the parts registered with
:meth:`ExperiencePlane.register_part`), and :meth:`ExperiencePlane.restore` continues from it in a
fresh plane; data in flight is dropped at the checkpoint and counted (:mod:`conduit.runtime.checkpoint`).

**Timeouts.** Every blocking call (``ingest``, ``next_batch``, ``peek``) waits at most its timeout,
wakes up when the plane is closed, and takes ``None`` for "until close()"; a timeout that is negative,
infinite or NaN is refused at once with a :class:`~conduit.errors.ConduitError` naming the argument.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Self

import numpy as np

from conduit.audit import Auditor, AuditReport
from conduit.contracts import Contract, contract_from_dict
from conduit.errors import CapacityError, ConduitError, PlaneFullError
from conduit.plane import Arbiter, ChunkLedger, Rejections, rules_for
from conduit.plane.recovery import REASON, DurableChunk, JournaledAuditor, RecoveryLog, plan_recovery, replay_audit
from conduit.plane.sampler import make_sampler
from conduit.policy import Policy
from conduit.registry import create_policy
from conduit.runtime.assembly import Assembly
from conduit.runtime.batch import BatchBuild
from conduit.runtime.checkpoint import PlaneCheckpoint
from conduit.runtime.estimator import BandwidthEstimator
from conduit.runtime.ingestion import Ingestion
from conduit.runtime.machine import LEFT_OUT, MachineTiers, build_tiers, resolve_topology
from conduit.runtime.metrics import PlaneMetrics
from conduit.runtime.records import DeliveryTimeout, _Chunk, _Learner, _timeout_arg
from conduit.runtime.replay import ReplayTable
from conduit.runtime.schema import Schema
from conduit.runtime.tiers import RuntimeTier
from conduit.runtime.transfer import TransferEngine
from conduit.runtime.view import LearnerModel, RuntimeClusterView
from conduit.topology.model import TierKind, Topology
from conduit.tuning_file import resolve_params

__all__ = ["DeliveryTimeout", "ExperiencePlane"]

log = logging.getLogger(__name__)  # conduit.runtime.plane


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


class ExperiencePlane(Ingestion, Assembly, ReplayTable, PlaneCheckpoint):
    """Real-memory experience plane driven by a :class:`~conduit.policy.Policy`.

    ``schema`` fixes the chunk columns; ``contract`` the data contract; ``policy`` a registered name
    (built-ins and plug-ins) or a :class:`~conduit.policy.Policy`, with ``params`` or a
    ``params_file`` written by ``conduit tune``. ``learners`` maps learner ids to their device
    (``"cpu"`` or ``"cuda:N"``; a list of ids means all on CPU). ``batch_steps`` is the number of
    samples per delivered batch. ``topology`` (default: a probe of this machine) and ``node`` say
    which tiers exist; ``capacities`` how much of each the plane takes. ``recovery_dir`` makes the
    plane recoverable (see *Recovery* in the module doc); the log is compacted into a snapshot every
    ``snapshot_every`` records. ``audit_window`` is how many retired chunks the live audit remembers
    to classify late events exactly (default :attr:`~conduit.audit.Auditor.RETIRED_WINDOW`): the
    plane's memory for chunks that left it is bounded by it, and reaches that bound after as many
    retirements.
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
        recovery_dir: str | os.PathLike | None = None,
        snapshot_every: int = 20000,
        audit_window: int | None = None,
    ):
        self.schema = Schema.of(schema)
        self.contract = _as_contract(contract)
        if isinstance(batch_steps, bool) or not isinstance(batch_steps, int) or batch_steps <= 0:
            raise ConduitError(f"batch_steps must be a positive integer, got {batch_steps!r}")
        self.batch_steps = batch_steps
        if audit_window is not None and (isinstance(audit_window, bool) or not isinstance(audit_window, int)
                                         or audit_window < 0):
            raise ConduitError(f"audit_window must be a non-negative integer (retired chunks), got {audit_window!r}")
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
        self._log: RecoveryLog | None = None
        self._snapshot_every = int(snapshot_every)
        state: dict[str, Any] | None = None
        records: list[Any] = []
        if recovery_dir is not None:
            self._log = RecoveryLog(recovery_dir)
            state, records = self._log.load()
        self._machine: MachineTiers = build_tiers(
            self.topology, self.schema, node=node, learner_devices=tuple(sorted(set(learners.values()))),
            capacities=capacities, spill_dir=spill_dir, durable_dir=recovery_dir)
        self.node = self._machine.node
        left_out = [tid for tid, why in self._machine.unavailable.items() if why == LEFT_OUT and tid.endswith(":nvme")]
        if recovery_dir is not None and left_out:
            self._machine.close()
            self._log.close()
            raise ConduitError(f"recovery_dir={str(recovery_dir)!r} keeps chunks across a restart in the NVMe tier, "
                               f"but capacities leaves {', '.join(left_out)} out (0 bytes): give it room or drop recovery_dir")
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
        self._table: OrderedDict[Hashable, _Chunk] = OrderedDict()  # Replay: live chunks, oldest first
        self._table_steps = 0
        # Replay: the contract's sampler over sample ids (chunk first_id + row, never reused), the next
        # id, the id ranges of recently evicted chunks (to name a bad draw), and the table's lookup
        # arrays, rebuilt only when the table changes: (chunks, first ids, steps)
        self._sampler = make_sampler(self.contract) if self.rules.tabled else None
        self._next_sample_id = 0
        if self._sampler is not None:  # checkpoints carry its priorities with the table (runtime.checkpoint)
            self.register_part("sampler", self._sampler)
        self._evicted_ranges: deque[tuple[int, int, Hashable]] = deque()  # bounded below, by the audit's window
        self._table_snapshot: Any = None  # replay._TableSnapshot, rebuilt when the table changes
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
        # when the scheduler was last asked: the pending chunks and waiting learners it saw (see _plan_due)
        self._replan = True
        self._planned_ids: set[Hashable] = set()
        self._planned_asking: set[str] = set()
        self._finished = False  # the auditor gave its final report (close)

        self.estimator = BandwidthEstimator()
        self.engine = TransferEngine(self.estimator, workers=copy_workers)
        self.metrics_ = PlaneMetrics()
        caps = {t.id: t.capacity for t in self.tiers.values()}
        # recovery: the durable tiers (their spill files outlive the process), the durable index,
        # OnPolicy batches a restart left short (version -> samples lost)
        self._durable = {t.id for t in self.tiers.values() if self._log is not None and t.kind is TierKind.NVME}
        self._index: dict[Hashable, DurableChunk] = {}
        self._shortfall: dict[int, int] = {}
        self.incarnation = 0
        restarting = state is not None or bool(records)
        if self._log is None:
            self.auditor = Auditor(self.contract, caps, retired_window=audit_window)
        else:
            if state is not None:
                self.auditor = JournaledAuditor.from_state(state["auditor"])
                self._version = state["version"]
                self._index = dict(state["index"])
                self.incarnation = state["incarnation"]
                self._shortfall = dict(state.get("shortfall", {}))
            else:
                self.auditor = JournaledAuditor(self.contract, caps, retired_window=audit_window)
            replay_audit(self.auditor, records)
            self._apply_records(records)
            if restarting:
                self.incarnation += 1
            self.auditor.attach(self._record)
        # a bad draw names an evicted chunk to the audit only while the audit still knows that chunk
        self._evicted_ranges = deque(self._evicted_ranges, maxlen=self.auditor.RETIRED_WINDOW)
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
        if self._log is not None:
            with self._cond:
                if restarting:
                    self._recover()
                else:
                    self._record(("incarnation", 0))
                self._compact()

    # ---------------------------------------------------------------------------- recovery
    def _record(self, record: Any) -> None:
        """Under the lock: one record in the recovery log (before what it records takes effect)."""
        if self._log is not None:
            self._log.append(record)

    def _apply_records(self, records: list[Any]) -> None:
        """The plane's own records (the auditor's are replayed by the auditor)."""
        for rec in records:
            kind = rec[0]
            if kind == "version":
                self._version = rec[1]
            elif kind == "durable+":
                self._index[rec[1].chunk_id] = rec[1]
            elif kind == "durable-":
                self._index.pop(rec[1], None)
            elif kind == "incarnation":
                self.incarnation = rec[1]
            elif kind == "shortfall":
                self._shortfall = dict(rec[1])

    def _state(self) -> dict[str, Any]:
        return {"auditor": self.auditor.state(), "version": self._version, "index": dict(self._index),
                "incarnation": self.incarnation, "shortfall": dict(self._shortfall)}

    def _compact(self) -> None:
        """Under the lock: the log becomes one snapshot of the plane's recoverable state."""
        if self._log is not None and not self._finished:
            self._log.compact(self._state())

    def _maybe_compact(self) -> None:
        """Under the lock, after an event took effect: compact once the journal is long enough."""
        if self._log is not None and self._log.records_since_snapshot >= self._snapshot_every:
            self._compact()

    def _durable_added(self, c: _Chunk) -> None:
        """Under the lock: the chunk's bytes landed in ``c.extent``; index them if that tier is durable."""
        ext = c.extent
        if ext is not None and ext.tier.id in self._durable:
            entry = DurableChunk(c.meta.id, ext.tier.id, ext.offset, c.meta.steps,
                                 (c.meta, c.learner, c.annotation))
            self._record(("durable+", entry))
            self._index[c.meta.id] = entry

    def _durable_removed(self, c: _Chunk, extent: Any) -> None:
        """Under the lock, before ``extent`` is freed: the chunk's bytes there are no longer indexed."""
        if extent is not None and extent.tier.id in self._durable and c.meta.id in self._index:
            self._record(("durable-", c.meta.id))
            del self._index[c.meta.id]

    def _recover(self) -> None:
        """Under the lock, in a plane started on a dead plane's log: take over what the durable tiers
        hold, count the rest as lost, restore the counters the contract's rules depend on."""
        now = time.time()
        self._record(("incarnation", self.incarnation))
        last = self.auditor.last_consumed
        next_update = 0 if last is None else last + 1
        plan = plan_recovery(self.auditor.live_chunks(), self._index, whole_only=not self.rules.tabled,
                             by_version=self.rules.by_version, next_update=next_update)
        restored: list[DurableChunk] = []
        for entry in plan.restore:
            try:
                extent = self.tiers[entry.tier].claim(entry.offset, entry.steps)
            except (CapacityError, KeyError) as exc:  # an index the tier cannot honour: the chunk is lost
                log.warning("recovery: chunk %r cannot be taken over from %s: %s", entry.chunk_id, entry.tier, exc)
                plan.lost.append(entry.chunk_id)
                continue
            meta, learner, annotation = entry.extra
            c = _Chunk(meta, None if self.rules.tabled else learner, extent, annotation=annotation)
            self._chunks[meta.id] = c
            self.ledger.restored(meta.id, entry.tier, extent.nbytes)
            if self.rules.tabled:  # new sample ids, live in the sampler again (priorities start afresh)
                self._insert_replay(c)
                self._table_steps += meta.steps
            else:
                self._learners[c.learner or next(iter(self._learners))].pending.append(c)
            restored.append(entry)
        keep = {e.chunk_id: e.tier for e in restored}
        lost = self.auditor.restarted(now, plan.lost, keep, REASON)
        for cid in [cid for cid in self._index if cid not in keep]:
            self._record(("durable-", cid))
            del self._index[cid]
        if self.rules.tabled:  # the limiter goes on from the counts the audit has (what really happened)
            self._inserted, self._sampled = self.auditor.replay_counts
            self._delivered = self._sampled
            self._table_snapshot = None
        if self.rules.by_version:
            for q in self._learners.values():
                q.next_update = next_update
            if len(self._learners) == 1:  # which learner a lost chunk was routed to is known with one only
                short = {k: n for k, n in self._shortfall.items() if k >= next_update}  # earlier restarts'
                for k, n in plan.shortfall.items():
                    short[k] = short.get(k, 0) + n
                self._shortfall = short
                self._record(("shortfall", dict(short)))
        for q in self._learners.values():
            q.model.version = self._version
        self.metrics_.count("restored_chunks", len(restored))
        self.metrics_.count("restored_samples", sum(e.steps for e in restored))
        self.metrics_.count("lost_chunks", len(plan.lost))
        self.metrics_.count("lost_samples", lost)
        log.warning("plane restarted (incarnation %d): %d chunks taken over from durable tiers, %d chunks "
                    "(%d samples) lost", self.incarnation, len(restored), len(plan.lost), lost)

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
            if self._log is not None and int(version) != self._version:
                self._record(("version", int(version)))
            self._version = int(version)
            for q in self._learners.values():
                q.model.version = self._version
            self._pump()

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

    # ---------------------------------------------------------------------------- state
    def audit(self) -> AuditReport:
        with self._lock:
            return self.auditor.report()

    def metrics(self) -> dict[str, Any]:
        """docs/metrics.md metrics so far, plane counters, tier occupancy and live bandwidth estimates."""
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
            if self._sampler is not None:
                out["replay_sampler"] = self._sampler.name
                out.update(self._sampler.counters())
            out["incarnation"] = self.incarnation
            if self.rules.tabled:
                out["table_steps"] = self._table_steps
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
        if self._log is not None:  # a clean close: nothing to recover from
            self._log.close(remove=True)
            with contextlib.suppress(OSError):
                self._log.dir.rmdir()
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
