"""The experience plane on a Ray cluster: one plane actor per node that hosts learners.

**Model.** Each node that runs learners gets one :class:`PlaneActor`, pinned there (hard node
affinity), holding an ordinary :class:`~conduit.runtime.plane.ExperiencePlane` whose tiers are that
node's memory. A learner belongs to exactly one node, so every chunk has one destination: the plane
of its learner's node. :class:`PlaneCluster`, a small picklable handle, does the routing; it can be
handed to producer and learner tasks and actors anywhere in the cluster.

**The Ray object store is the cross-node tier.** A producer's chunk is put into its own node's
object store once (``ray.put``) and passed by reference to the destination plane actor. Ray resolves
the reference before the actor's ``ingest`` runs: on the same node the actor reads the chunk from
shared memory in place; on another node Ray first pulls the bytes into that node's object store.
The plane then makes its one ingestion copy into a tier of its node. So a chunk crosses the network
at most once, on its way to the node that consumes it, and never through the driver. Delivered
batches go back to the learner the same way (the actor's return value is an object in the store).
Payloads smaller than ``inline_bytes`` skip ``ray.put`` and travel inside the call itself, as Ray
does for small arguments anyway (off by default: every chunk goes through the store).

**Data contracts hold per node.** Each node's plane enforces the contract for its own learners and
audits their samples: under ``OnPolicy`` a learner's batch *k* holds version-*k* samples routed to
that learner, each delivered once; under ``BoundedStaleness`` staleness is judged against the
version last broadcast (:meth:`PlaneCluster.set_policy_version` reaches every node); under
``Replay`` every node keeps its own table and rate limiter over the chunks routed to it, and its
learners sample only from it. Nothing moves between planes, so the per-node audits are the whole
story; :meth:`PlaneCluster.audit` sums them and keeps each node's report.

**Concurrency.** A plane actor is a threaded actor with three concurrency groups: ``ingest``
(producers, which may block on backpressure or the replay rate limiter), ``deliver`` (learners
blocked in ``next_batch`` or ``peek``) and the default group for control calls (versions, audits,
close). A producer waiting for room therefore never keeps a learner from the batch that would free
it. The plane itself is thread-safe.

**Streaming a batch.** A learner can read its next batch while it is still being assembled:
:meth:`PlaneCluster.peek` returns the rows that have landed (host copies, in a
:class:`~conduit.runtime.batch.Peek`), and ``next_batch(from_row=r)`` then ships only rows
``[r:]`` of the whole batch, so rows already peeked do not travel twice (see :class:`RemoteBatch`).
Chunk annotations (small objects a producer attaches at ingestion) come back with the batches
and peeks that carry the chunk's rows.

**Chunk ids** are unique cluster-wide when the plane assigns them: ``f"{producer}-n{k}-{seq}"``,
with ``k`` the node's index in :attr:`PlaneCluster.nodes` and ``seq`` that plane's counter. An
explicit ``chunk_id`` is checked for duplicates on its node only.

**Restarts.** With ``max_restarts`` (:meth:`PlaneCluster.start`) Ray restarts a plane actor whose
process died, on the same node (hard affinity), and the new process builds its plane on the recovery
directory the dead one left (``<tmp>/conduit-plane-<cluster>-n<k>`` on that node): see *Recovery*
in :mod:`conduit.runtime.plane`. Ray restarts rather than a supervisor of Conduit's own: the actor
keeps its handle, so every copy of this :class:`PlaneCluster` (in EnvRunners, learners, the
driver) reaches the new incarnation without being handed anything; and Ray's control plane, not a
polling thread, notices the death. A call that was running in the dead process fails with Ray's
``RayActorError``; every :class:`PlaneCluster` method catches it, waits (up to
``restart_timeout``) until the actor answers again and repeats the call, at most ``max_restarts +
1`` times in all, within the call's own timeout. Replies say which incarnation answered
(``RemoteBatch.incarnation``, ``Peek.incarnation``); a streaming reader passes the incarnation it
streamed from to ``peek``/``next_batch`` and gets :class:`~conduit.errors.PlaneRestarted`, with
nothing delivered, when the rows it holds came from a dead incarnation.

**Checkpoints and metrics.** :meth:`PlaneCluster.snapshot` / :meth:`PlaneCluster.restore` carry each
node's plane (:mod:`conduit.runtime.checkpoint`), keyed by the learners it serves. Each actor publishes
its counters through ``ray.util.metrics`` every ``export_interval_s`` seconds (``PlaneCluster.start``
keyword, default 10; 0: off) and once more at close (:mod:`conduit.runtime.export`).

**Errors.** Conduit errors raised inside an actor reach the caller as the same class with the same
message (the remote traceback is attached as a note), so ``except PlaneFullError`` works across
nodes.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import pickle
import tempfile
import threading
import time
import traceback
import uuid
import zlib
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Self

import numpy as np

from conduit.contracts import Contract, contract_from_dict
from conduit.errors import ConduitError, PlaneCallTimeout, PlaneRestarted, UnknownNameError
from conduit.runtime.batch import Peek
from conduit.runtime.records import DeliveryTimeout, _timeout_arg
from conduit.runtime.schema import Schema
from conduit.tuning_file import resolve_params

try:  # Ray is an optional dependency (conduit-rl[rllib])
    import ray
except ImportError:  # pragma: no cover - exercised by monkeypatching in the tests
    ray = None

INSTALL_HINT = "pip install 'conduit-rl[rllib]'"
LOCAL = "local"
"""In ``learners``: the node of the process that calls :meth:`PlaneCluster.start`."""


# ------------------------------------------------------------------------------------------- ray
def _require_ray() -> Any:
    """The ``ray`` module, initialised; a :class:`ConduitError` saying what to do otherwise."""
    try:
        import ray as _ray
    except ImportError:
        raise ConduitError(f"the Ray plane needs Ray, which is not installed: {INSTALL_HINT}") from None
    if not _ray.is_initialized():
        raise ConduitError("Ray is not initialised: call ray.init(...) (or start the Ray cluster and connect "
                           "to it) before PlaneCluster.start")
    return _ray


class _Carried(Exception):
    """A Conduit error in transit from an actor: its class, message, attributes and traceback.

    Some Conduit errors take several constructor arguments and cannot be rebuilt by pickle from
    their message alone; this wrapper always can, and :func:`_rebuild` gives the caller the original
    class back.
    """

    def __init__(self, cls: type, message: str, state: dict[str, Any], remote_tb: str, node: str):
        super().__init__(cls, message, state, remote_tb, node)
        self.cls, self.message, self.state, self.remote_tb, self.node = cls, message, state, remote_tb, node

    def __str__(self) -> str:
        return f"{self.cls.__name__}: {self.message}"


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:  # noqa: BLE001 - any failure means "cannot ship"
        return False
    return True


def _carry(exc: ConduitError, node: str) -> _Carried:
    state = {k: v for k, v in vars(exc).items() if _picklable(v)}  # what cannot ship stays behind
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return _Carried(type(exc), str(exc), state, tb, node)


def _rebuild(carried: _Carried) -> BaseException:
    exc = carried.cls.__new__(carried.cls)
    exc.args = (carried.message,)
    exc.__dict__.update(carried.state)
    exc.add_note(f"raised by the Conduit plane actor on node {carried.node}; remote traceback:\n"
                 f"{carried.remote_tb.rstrip()}")
    return exc


def _get(refs: Any, timeout: float | None = None) -> Any:
    """``ray.get`` that re-raises a Conduit error from an actor as itself."""
    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, _Carried):
            raise _rebuild(cause) from None
        raise


def _method(**options: Any) -> Callable[[Callable], Callable]:
    return ray.method(**options) if ray is not None else (lambda fn: fn)


def _portable(fn: Callable) -> Callable:
    """Actor method wrapper: Conduit errors leave the actor as :class:`_Carried`.

    It goes above ``ray.method``: Ray reads method options from the unwrapped function.
    """

    @functools.wraps(fn)
    def wrapper(self: _PlaneActor, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except ConduitError as exc:
            raise _carry(exc, self._node_id) from None

    return wrapper


# ------------------------------------------------------------------------------------------- results
@dataclass
class RemoteBatch:
    """A batch as delivered through a plane actor: the learner's own copy, already released in the plane.

    ``columns`` are numpy arrays holding rows ``[row_offset:]`` of the batch: row ``r`` of each is
    the ``(row_offset + r)``-th sample of ``selections``. ``row_offset`` is 0 unless the learner
    asked for ``next_batch(from_row=...)`` because it had already read the first rows with
    :meth:`PlaneCluster.peek`; ``selections``, ``versions``, ``steps`` and :meth:`sample_ids`
    always describe the **whole** batch. ``annotations`` maps chunk ids to the annotations of the
    batch's chunks that carry one (the whole batch's); ``node_id`` is the Ray node of the plane that
    delivered it.
    """

    learner: str
    update: int
    steps: int
    columns: dict[str, np.ndarray]
    selections: list[tuple[Hashable, range | np.ndarray]]
    versions: list[int]
    node_id: str
    t_ready: float | None = None
    annotations: dict[Hashable, Any] = field(default_factory=dict)
    row_offset: int = 0
    replay_ids: np.ndarray | None = None  # Replay: every row's sampler id (whole batch), for update_priorities
    weights: np.ndarray | None = None  # Replay: every row's importance weight (whole batch)
    incarnation: int = 0

    def sample_ids(self) -> list[tuple[Hashable, int]]:
        """Every sample of the batch, in row order (from row 0, whatever ``row_offset``)."""
        return [(cid, int(i)) for cid, idx in self.selections for i in idx]

    def tensors(self) -> dict[str, Any]:
        """The columns as torch tensors (zero copy; rows ``[row_offset:]``)."""
        import torch

        return {k: torch.from_numpy(v) for k, v in self.columns.items()}

    def release(self) -> None:
        """Nothing to do: the plane released its batch when it copied this one out (kept for symmetry)."""


def _host_copy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return np.array(x, copy=True)
    return x.detach().cpu().numpy().copy()  # a CUDA learner tier: bring the batch to host memory


def _payload_nbytes(payload: Mapping[str, Any]) -> int:
    return int(sum(int(getattr(v, "nbytes", np.asarray(v).nbytes)) for v in payload.values()))


# ------------------------------------------------------------------------------------------- the actor
class _PlaneActor:
    """One node's plane, built inside the actor from plain keyword arguments: ``schema`` in
    :meth:`Schema.to_dict` (or mapping) form, ``contract`` as its ``to_dict``, ``learners`` as
    ``{learner id: "cpu" | "cuda:N"}``, ``index`` the node's position in the cluster (for chunk ids),
    the rest as for :class:`~conduit.runtime.plane.ExperiencePlane` (see :meth:`PlaneCluster.start`)."""

    def __init__(self, *, index: int, schema: Mapping[str, Any], contract: Mapping[str, Any], batch_steps: int,
                 learners: Mapping[str, str], policy: Any = "conduit", params: Mapping[str, Any] | None = None,
                 capacities: Mapping[str, Any] | None = None, recovery: str | None = None,
                 export_interval_s: float = 10.0, **plane_kwargs: Any):
        from conduit.runtime.plane import ExperiencePlane

        if recovery is not None and plane_kwargs.get("recovery_dir") is None:  # on this node's disk
            plane_kwargs["recovery_dir"] = os.path.join(tempfile.gettempdir(), recovery)
        self._incarnation = 0
        self._node_id = ray.get_runtime_context().get_node_id()
        self._index = int(index)
        self._learner_ids = sorted(learners)
        self._seq = itertools.count()
        self._stats_lock = threading.Lock()
        self._transport = {"store_chunks": 0, "store_bytes": 0, "inline_chunks": 0, "inline_bytes": 0,
                           "remote_chunks": 0, "remote_bytes": 0}
        self._plane = None
        self._init_error: BaseException | None = None
        self._final: dict[str, Any] | None = None
        try:
            self._plane = ExperiencePlane(
                _schema(schema), contract_from_dict(contract), batch_steps=batch_steps, policy=policy,
                params=params, learners=dict(learners), capacities=capacities, **plane_kwargs)
            self._incarnation = self._plane.incarnation
        except BaseException as exc:  # noqa: BLE001 - reported by ready(), where the caller sees it
            self._init_error = exc
        self._exporter = None
        self._export_stop = threading.Event()
        if self._plane is not None and export_interval_s and export_interval_s > 0:
            from conduit.runtime.export import MetricsExporter

            self._exporter = MetricsExporter(self._node_id, self._plane.contract.kind)
            threading.Thread(target=self._export_loop, args=(float(export_interval_s),), daemon=True,
                             name="conduit-metrics-export").start()

    def _export(self) -> None:
        plane = self._plane
        self._exporter.publish(plane.metrics(), plane.audit().to_dict())

    def _export_loop(self, interval: float) -> None:
        """Publish the plane's counters through ``ray.util.metrics`` every ``interval`` s (conduit.runtime.export)."""
        import logging

        while not self._export_stop.wait(interval):
            try:
                self._export()
            except Exception as exc:  # noqa: BLE001 - exporting must never stop the plane; logged
                logging.getLogger("conduit.runtime.export").warning("metrics export failed: %r", exc)

    def _live(self) -> Any:
        if self._plane is None:
            raise ConduitError(f"the plane on node {self._node_id} failed to start: {self._init_error}")
        return self._plane

    @_portable
    @_method(concurrency_group="control")
    def ready(self) -> str:
        """The node id once the plane is built; the construction error otherwise."""
        if self._init_error is not None:
            if isinstance(self._init_error, ConduitError):
                raise self._init_error
            raise RuntimeError(f"the plane on node {self._node_id} failed to start") from self._init_error
        return self._node_id

    @_method(concurrency_group="control")
    def node_id(self) -> str:
        return self._node_id

    @_method(concurrency_group="control")
    def incarnation(self) -> int:
        """0 for the first process of this plane, then one more per restart."""
        return self._incarnation

    @_method(concurrency_group="control")
    def pid(self) -> int:
        """The actor's process id (tests kill it to check recovery)."""
        return os.getpid()

    def _expect(self, incarnation: int | None) -> None:
        if incarnation is not None and incarnation != self._incarnation:
            raise PlaneRestarted(f"the plane on node {self._node_id} restarted (incarnation {incarnation} -> "
                                 f"{self._incarnation}): rows streamed from the old one are gone")

    @_portable
    @_method(concurrency_group="ingest")
    def ingest(self, payload: Mapping[str, Any], *, producer: str = "local", chunk_id: Hashable | None = None,
               source_node: str | None = None, via_store: bool = False, annotation: Any = None,
               **meta: Any) -> Hashable:
        """Ingest one chunk (Ray has already resolved an ``ObjectRef`` payload); returns its id."""
        plane = self._live()
        if chunk_id is None:
            chunk_id = f"{producer}-n{self._index}-{next(self._seq)}"
        cid = plane.ingest(payload, producer=producer, chunk_id=chunk_id, annotation=annotation, **meta)
        nbytes = _payload_nbytes(payload)
        with self._stats_lock:
            kind = "store" if via_store else "inline"
            self._transport[f"{kind}_chunks"] += 1
            self._transport[f"{kind}_bytes"] += nbytes
            if source_node is not None and source_node != self._node_id:
                self._transport["remote_chunks"] += 1
                self._transport["remote_bytes"] += nbytes
        return cid

    @_portable
    @_method(concurrency_group="deliver")
    def next_batch(self, learner: str | None = None, update: int | None = None,
                   timeout: float | None = None, from_row: int = 0, incarnation: int | None = None) -> RemoteBatch:
        """The learner's next batch, copied out of the plane (which then releases it); only rows
        ``[from_row:]`` are copied (the learner peeked the others), the rest describes the whole batch.
        With ``incarnation``, refused (:class:`PlaneRestarted`, nothing delivered) by another one."""
        plane = self._live()
        self._expect(incarnation)
        if isinstance(from_row, bool) or not isinstance(from_row, int | np.integer) or \
                not 0 <= from_row <= plane.batch_steps:
            raise ConduitError(f"next_batch: from_row must be a row in [0, {plane.batch_steps}], got {from_row!r}")
        from_row = int(from_row)
        batch = plane.next_batch(learner, update=update, timeout=timeout)
        try:
            return RemoteBatch(batch.learner, batch.update, batch.steps,
                               {k: _host_copy(v[from_row:]) for k, v in batch.columns.items()},
                               list(batch.selections), list(batch.versions), self._node_id, batch.t_ready,
                               annotations=dict(batch.annotations), row_offset=from_row,
                               replay_ids=batch.replay_ids, weights=batch.weights,
                               incarnation=self._incarnation)
        finally:
            batch.release()

    @_portable
    @_method(concurrency_group="deliver")
    def peek(self, learner: str | None = None, update: int | None = None, start: int = 0,
             timeout: float | None = None, incarnation: int | None = None) -> Peek:
        """The rows of the learner's next batch that have landed from ``start`` on, copied to host memory
        (see :meth:`ExperiencePlane.peek <conduit.runtime.plane.ExperiencePlane.peek>`)."""
        plane = self._live()
        self._expect(incarnation)
        got = plane._peek(learner, update, start, timeout, copy=_host_copy)
        return replace(got, selections=list(got.selections), annotations=dict(got.annotations),
                       incarnation=self._incarnation)

    @_portable
    @_method(concurrency_group="control")
    def set_policy_version(self, version: int) -> None:
        self._live().set_policy_version(version)

    @_portable
    @_method(concurrency_group="control")
    def update_priorities(self, ids: Any, priorities: Any) -> int:
        """Replay: new priorities for sample ids of a delivered batch; returns those already evicted."""
        return self._live().update_priorities(ids, priorities)

    @_portable
    @_method(concurrency_group="control")
    def size_batch(self, learner: str | None = None, update: int = 0, rows: int = 0) -> None:
        self._live().size_batch(learner, update=update, rows=rows)

    @_portable
    @_method(concurrency_group="control")
    def audit(self) -> dict[str, Any]:
        if self._final is not None:
            return self._final
        return self._live().audit().to_dict()

    @_portable
    @_method(concurrency_group="control")
    def metrics(self) -> dict[str, Any]:
        out = self._live().metrics()
        with self._stats_lock:
            out["transport"] = dict(self._transport)
        out["node_id"] = self._node_id
        out["node_index"] = self._index
        out["learners"] = list(self._learner_ids)
        out["object_store_bytes_received"] = out["transport"]["store_bytes"]
        return out

    @_portable
    @_method(concurrency_group="control")
    def snapshot(self, table: bool = True) -> dict[str, Any]:
        """The plane's checkpoint (:meth:`ExperiencePlane.snapshot`), with this actor's chunk-id counter."""
        snap = self._live().snapshot(table=table)
        snap["actor_seq"] = next(self._seq)
        self._seq = itertools.count(snap["actor_seq"] + 1)
        return snap

    @_portable
    @_method(concurrency_group="control")
    def restore(self, snap: dict[str, Any]) -> dict[str, int]:
        """Load a checkpoint into this (fresh) plane (:meth:`ExperiencePlane.restore`)."""
        got = self._live().restore(snap)
        self._seq = itertools.count(int(snap.get("actor_seq", 0)))
        return got

    @_portable
    @_method(concurrency_group="control")
    def warming_up(self) -> bool:
        """Whether the Replay table is still warming up (:meth:`ExperiencePlane.warming_up`)."""
        return self._live().warming_up()

    @_portable
    @_method(concurrency_group="control")
    def exported(self, now: bool = False) -> dict[str, Any] | None:
        """What the actor published through ``ray.util.metrics`` (:meth:`MetricsExporter.snapshot
        <conduit.runtime.export.MetricsExporter.snapshot>`); ``now=True`` publishes first. None when off."""
        if self._exporter is None:
            return None
        if now and self._final is None:
            self._export()
        return self._exporter.snapshot()

    @_portable
    @_method(concurrency_group="control")
    def close(self) -> dict[str, Any] | None:
        """Close the plane (waking blocked callers with an error); returns the final audit."""
        if self._plane is None:
            return None
        if self._final is None:
            self._export_stop.set()
            self._final = self._plane.close().to_dict()
            if self._exporter is not None:
                import logging

                try:  # the last values, final audit included
                    self._exporter.publish(self._plane.metrics(), self._final)
                except Exception as exc:  # noqa: BLE001 - closing must not fail on an export
                    logging.getLogger("conduit.runtime.export").warning("final metrics export failed: %r", exc)
        return self._final


class _NoRay:
    """Stands in for :data:`PlaneActor` where Ray is not installed."""

    def __getattr__(self, name: str) -> Any:
        raise ConduitError(f"the Ray plane needs Ray, which is not installed: {INSTALL_HINT}")


CONCURRENCY = {"ingest": 8, "deliver": 4, "control": 2}
#: seconds a plane actor may take to answer a call before the caller gives up on it
#: (``PlaneCluster.start(call_timeout=...)``; see *Timeouts* in :class:`PlaneCluster`)
CALL_TIMEOUT = 120.0
"""Threads per concurrency group of a plane actor (override with ``PlaneCluster.start(concurrency=...)``)."""

if ray is not None:
    PlaneActor = ray.remote(concurrency_groups=CONCURRENCY)(_PlaneActor)
else:  # pragma: no cover
    PlaneActor = _NoRay()


# ------------------------------------------------------------------------------------------- helpers
def _stop(actors: Any, timeout: float) -> list[dict[str, Any] | None]:
    """Close every actor's plane (its final audit, or None where that failed), then end the actors."""
    actors = list(actors)
    refs = [a.close.remote() for a in actors]
    finals: list[dict[str, Any] | None] = []
    deadline = time.monotonic() + timeout
    try:
        for ref in refs:
            try:
                finals.append(_get(ref, timeout=max(0.0, deadline - time.monotonic())))
            except Exception:  # noqa: BLE001 - one dead or stuck node must not keep the others alive
                finals.append(None)
    finally:
        for a in actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(a)
    return finals


def _schema(spec: Schema | Mapping[str, Any]) -> Schema:
    """A schema from a :class:`Schema`, its ``to_dict`` form, or the mapping form ``Schema.of`` takes."""
    if isinstance(spec, Schema):
        return spec
    if isinstance(spec, Mapping) and spec and all(isinstance(v, Mapping) and "dtype" in v for v in spec.values()):
        return Schema.from_dict(spec)
    return Schema.of(spec)


def _short(node_id: str) -> str:
    return node_id[:12]


def merge_audits(per_node: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One report from per-node audit dicts (:meth:`~conduit.audit.AuditReport.to_dict`).

    Counts, violations and drops are summed; ``updates_consumed`` is the largest per-node value
    (every node serves the same policy versions); ``examples`` and ``peak_occupancy`` are keyed by
    ``"<node id prefix>/..."``; ``nodes`` keeps every node's report as it was.
    """
    reports = [r for r in per_node.values() if r is not None]
    out: dict[str, Any] = {
        "contract": dict(reports[0]["contract"]) if reports else {},
        "violations": 0, "by_kind": {}, "examples": {}, "dropped_samples": {}, "peak_occupancy": {},
        "updates_consumed": 0, "finished": bool(reports) and all(r["finished"] for r in reports),
        "t": max((r["t"] for r in reports), default=0.0),
    }
    summed = ("ingested_chunks", "ingested_samples", "ingested_bytes", "deliveries", "delivered_samples",
              "delivered_bytes", "unused_resident_samples", "checksums_verified", "out_of_band_events", "drawn_samples")
    for k in summed:
        out[k] = 0
    out["restarts"] = 0
    out["lost_chunks"], out["lost_samples"] = {}, {}
    for node, r in per_node.items():
        if r is None:
            continue
        out["restarts"] += int(r.get("restarts", 0))
        for key in ("lost_chunks", "lost_samples"):
            for reason, n in (r.get(key) or {}).items():
                out[key][reason] = out[key].get(reason, 0) + n
        out["violations"] += int(r["violations"])
        for k in summed:
            out[k] += r.get(k, 0)
        for kind, n in r["by_kind"].items():
            out["by_kind"][kind] = out["by_kind"].get(kind, 0) + n
        for reason, n in r["dropped_samples"].items():
            out["dropped_samples"][reason] = out["dropped_samples"].get(reason, 0) + n
        for kind, msgs in r["examples"].items():
            out["examples"].setdefault(kind, []).extend(f"[{_short(node)}] {m}" for m in msgs)
        for tier, n in r["peak_occupancy"].items():
            out["peak_occupancy"][f"{_short(node)}/{tier}"] = n
        out["updates_consumed"] = max(out["updates_consumed"], r["updates_consumed"])
    out["nodes"] = {node: r for node, r in per_node.items()}
    return out


# ------------------------------------------------------------------------------------------- the handle
class PlaneCluster:
    """Driver-side handle to the plane actors; picklable, so producers and learners can hold it.

    Build it with :meth:`start`. ``nodes`` lists the Ray node ids that have a plane (in start
    order, which gives each node its index ``k``); ``learners`` maps every learner to its node.
    Only the process that started the cluster should call :meth:`shutdown`.

    **Timeouts.** No call waits without bound unless asked to. A call with its own wait (``ingest``'s
    wait for room, ``next_batch`` and ``peek``'s wait for rows) hands the plane actor what is left of
    the caller's ``timeout`` (restart waits included), so the actor answers with
    :class:`~conduit.errors.PlaneFullError` or :class:`~conduit.runtime.plane.DeliveryTimeout` itself
    and nothing half-done is left behind; the caller then waits ``call_timeout`` more for that answer.
    A control call (``size_batch``, ``set_policy_version``, ``update_priorities``, ``warming_up``,
    ``metrics``, ``audit``, ``snapshot``, ``restore``) waits its ``timeout``, by default
    ``call_timeout``. An actor that does not answer in time (stuck, or its node unreachable) raises
    :class:`~conduit.errors.PlaneCallTimeout`; the call is cancelled if it has not started, and one
    that has may still take effect. ``call_timeout=None`` lifts the bound.
    """

    def __init__(self, actors: Mapping[str, Any], learners: Mapping[str, str], *, schema: Schema,
                 contract: Contract, batch_steps: int, inline_bytes: int = 0, max_restarts: int = 0,
                 restart_timeout: float = 120.0, call_timeout: float | None = CALL_TIMEOUT):
        self.max_restarts = int(max_restarts)
        self.restart_timeout = float(restart_timeout)
        self.call_timeout = _timeout_arg("call_timeout", call_timeout)
        self._actors = dict(actors)
        self._learners = dict(learners)
        self.schema = schema
        self.contract = contract
        self.batch_steps = batch_steps
        self.inline_bytes = int(inline_bytes)
        self._rr: dict[str, int] = {}
        self._lock = threading.Lock()
        self._final: dict[str, Any] | None = None
        self.run_tag = os.urandom(3).hex()  # unique per plane cluster: producers' chunk ids never collide
        # with the ids of chunks a restored checkpoint brings back

    # ----------------------------------------------------------------------------- start
    @classmethod
    def start(
        cls,
        schema: Schema | Mapping[str, Any],
        contract: Contract | Mapping[str, Any],
        *,
        batch_steps: int,
        learners: Mapping[str, str],
        policy: str | Any = "conduit",
        params: Mapping[str, Any] | None = None,
        params_file: str | os.PathLike | None = None,
        capacities: Mapping[str, Any] | None = None,
        devices: Mapping[str, str] | None = None,
        actor_options: Mapping[str, Any] | None = None,
        concurrency: Mapping[str, int] | None = None,
        inline_bytes: int = 0,
        ready_timeout: float = 120.0,
        max_restarts: int = 0,
        restart_timeout: float = 120.0,
        call_timeout: float | None = CALL_TIMEOUT,
        **plane_kwargs: Any,
    ) -> PlaneCluster:
        """Start one plane actor on every node that hosts learners; returns the handle.

        ``learners`` maps learner ids to Ray node ids (``ray.get_runtime_context().get_node_id()``,
        or ``"local"`` for this process's node). ``devices`` maps learner ids to ``"cpu"`` (default)
        or ``"cuda:N"`` (then give the actor GPUs through ``actor_options``). ``policy``, ``params``
        and ``params_file`` (read here, on the caller's node) choose the policy; ``capacities`` and
        the remaining keyword arguments (``prefetch_depth``, ``ingest_timeout``,
        ``verify_checksums``, ``topology``, ...) go to every node's
        :class:`~conduit.runtime.plane.ExperiencePlane`. ``actor_options`` go to Ray (default
        ``num_cpus=0``: the plane's copies run on threads and reserve no CPU); ``concurrency``
        sizes the actor's thread groups (:data:`CONCURRENCY`). Chunks of fewer than
        ``inline_bytes`` bytes travel inside the call rather than through ``ray.put``.
        ``max_restarts`` (-1: no limit) lets Ray restart a plane actor whose process died; the plane
        then keeps a recovery log on its node, and callers wait up to ``restart_timeout`` seconds
        for the restarted actor (see *Restarts* in the module doc). ``call_timeout`` bounds the wait
        for an actor's answer (see *Timeouts* in the class doc).
        """
        ray_ = _require_ray()
        call_timeout = _timeout_arg("call_timeout", call_timeout)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        schema = _schema(schema)
        contract = contract_from_dict(contract) if isinstance(contract, Mapping) else contract
        if isinstance(batch_steps, bool) or not isinstance(batch_steps, int) or batch_steps <= 0:
            raise ConduitError(f"batch_steps must be a positive integer, got {batch_steps!r}")
        if not isinstance(learners, Mapping) or not learners:
            raise ConduitError("learners must map at least one learner id to a Ray node id (or 'local')")
        alive = sorted(n["NodeID"] for n in ray_.nodes() if n.get("Alive"))
        here = ray_.get_runtime_context().get_node_id()
        placed: dict[str, str] = {}
        for lid, node in learners.items():
            node = here if node == LOCAL else node
            if node not in alive:
                raise UnknownNameError(f"Ray node (for learner {lid!r})", str(node), alive)
            placed[str(lid)] = node
        devices = dict(devices or {})
        for lid in devices:
            if lid not in placed:
                raise UnknownNameError("learner (in devices)", lid, list(placed))
        name = policy if isinstance(policy, str) else getattr(policy, "name", None)
        values = resolve_params(name, dict(params or {}), params_file)
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < -1:
            raise ConduitError(f"max_restarts must be an int >= -1 (-1: no limit), got {max_restarts!r}")
        options = {"num_cpus": 0, "max_restarts": max_restarts, **dict(actor_options or {})}
        tag = uuid.uuid4().hex[:12]
        groups = {**CONCURRENCY, **dict(concurrency or {})}
        busiest = max(sum(1 for n in placed.values() if n == node) for node in set(placed.values()))
        # every learner may block in next_batch and in peek at once
        groups["deliver"] = max(groups["deliver"], 2 * busiest + 1)
        actor_cls = PlaneActor if groups == CONCURRENCY else ray_.remote(concurrency_groups=groups)(_PlaneActor)

        nodes = list(dict.fromkeys(placed.values()))  # first-seen order
        actors: dict[str, Any] = {}
        try:
            for k, node in enumerate(nodes):
                local = {lid: devices.get(lid, "cpu") for lid, n in placed.items() if n == node}
                actors[node] = actor_cls.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False), **options,
                ).remote(index=k, schema=schema.to_dict(), contract=contract.to_dict(), batch_steps=batch_steps,
                         learners=local, policy=policy, params=values, capacities=dict(capacities or {}),
                         recovery=f"conduit-plane-{tag}-n{k}" if options["max_restarts"] else None,
                         **plane_kwargs)
            try:
                got = _get([a.ready.remote() for a in actors.values()], timeout=ready_timeout)
            except (ray_.exceptions.GetTimeoutError, ray_.exceptions.ActorUnschedulableError) as exc:
                why = "did not start within {ready_timeout:g} s" if isinstance(exc, ray_.exceptions.GetTimeoutError) \
                    else "cannot be scheduled on their nodes"
                raise ConduitError(
                    f"the plane actors {why.format(ready_timeout=ready_timeout)}: does every node of {nodes} "
                    f"have the resources of actor_options {options}? ({type(exc).__name__})") from None
            for node, seen in zip(actors, got, strict=True):
                if seen != node:  # cannot happen with hard affinity; a guard against silent misplacement
                    raise ConduitError(f"plane actor for node {node} started on node {seen}")
        except BaseException:
            _stop(actors.values(), timeout=10.0)  # planes that did start free their memory and spill files
            raise
        return cls(actors, placed, schema=schema, contract=contract, batch_steps=batch_steps,
                   inline_bytes=inline_bytes, max_restarts=options["max_restarts"], restart_timeout=restart_timeout,
                   call_timeout=call_timeout)

    # ----------------------------------------------------------------------------- lookup
    @property
    def nodes(self) -> list[str]:
        """Ray node ids with a plane, in start order."""
        return list(self._actors)

    @property
    def learners(self) -> dict[str, str]:
        """Learner id -> Ray node id."""
        return dict(self._learners)

    def node_of(self, learner: str) -> str:
        if learner not in self._learners:
            raise UnknownNameError("learner", str(learner), list(self._learners))
        return self._learners[learner]

    def actor(self, node_id: str) -> Any:
        """The plane actor of a node."""
        if node_id not in self._actors:
            raise UnknownNameError("plane node", str(node_id), list(self._actors))
        return self._actors[node_id]

    def _check_live(self) -> None:
        if self._final is not None:
            raise ConduitError("the plane cluster was shut down")

    # ----------------------------------------------------------------------------- restarts
    def await_restart(self, node: str, deadline: float | None = None) -> int:
        """After a ``RayActorError`` from ``node``'s plane: wait until its actor answers again (a
        restarted one), at most ``restart_timeout`` s or until ``deadline`` (``time.monotonic()``);
        returns its incarnation. A :class:`ConduitError` when the plane does not restart (no
        ``max_restarts``, restarts used up, or not back within ``restart_timeout``); a
        :class:`~conduit.runtime.plane.DeliveryTimeout` when ``deadline`` comes first (a short poll
        that may simply ask again)."""
        if not self.max_restarts:
            raise ConduitError(f"the plane actor on node {_short(node)} died, and the plane was started without "
                               "max_restarts: nothing restarts it")
        end = time.monotonic() + self.restart_timeout
        caller_first = deadline is not None and deadline < end
        if caller_first:
            end = deadline
        actor = self.actor(node)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                if caller_first:  # the caller's own timeout ran out while the plane restarts
                    raise DeliveryTimeout(f"the plane actor on node {_short(node)} is restarting; the call's timeout "
                                          "ran out first (ask again)")
                raise ConduitError(f"the plane actor on node {_short(node)} died and did not answer again within "
                                   f"restart_timeout={self.restart_timeout:g} s")
            try:
                return int(_get(actor.incarnation.remote(), timeout=min(left, 5.0)))
            except ray.exceptions.GetTimeoutError:
                continue
            except ray.exceptions.ActorDiedError as exc:  # (a call to a restarting actor waits for it instead)
                raise ConduitError(f"the plane actor on node {_short(node)} died for good (its restarts are used "
                                   f"up, or it was killed without restart): {exc}") from None
            except ray.exceptions.RayActorError:  # unavailable while it restarts
                time.sleep(min(0.2, max(0.0, left)))

    def _call(self, node: str, submit: Callable[[Any], Any] | None, timeout: float | None = None,
              remaining: Callable[[float | None], Any] | None = None, *, what: str = "a call",
              stated: float | None = None) -> Any:
        """``submit(actor)`` on ``node``'s plane and its result, repeated on a restarted actor after a
        ``RayActorError`` (at most ``max_restarts + 1`` attempts). With ``timeout``, every attempt
        and every wait for a restart fits in it. ``remaining(seconds left)`` builds a call that waits
        on the actor itself (given what is left of ``timeout``): its answer may take ``call_timeout``
        more. A call without one is bounded by ``timeout`` alone. ``what`` names the call in a
        :class:`~conduit.errors.PlaneCallTimeout`, with the caller's bound (``stated``: the whole of
        a bound this call has only part of)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        stated = timeout if stated is None else stated
        if remaining is not None and stated is not None and self.call_timeout is not None:
            stated += self.call_timeout
        attempts = 0
        while True:
            actor = self._actors[node]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                if remaining is not None:
                    wait = None if left is None or self.call_timeout is None else left + self.call_timeout
                    return self._answer(remaining(left), wait, node, what, stated)
                return self._answer(submit(actor), left, node, what, stated)
            except ray.exceptions.RayActorError as exc:
                attempts += 1
                if self.max_restarts >= 0 and attempts > self.max_restarts + 1:
                    raise ConduitError(f"the plane actor on node {_short(node)} failed {attempts} times in one call: "
                                       f"{exc}") from None
                self.await_restart(node, deadline)

    @staticmethod
    def _answer(ref: Any, wait: float | None, node: str, what: str, stated: float | None) -> Any:
        """The result of ``ref``, waiting at most ``wait`` seconds (None: until it comes); an actor that
        does not answer in time raises :class:`~conduit.errors.PlaneCallTimeout` and the call is
        cancelled if it has not started. ``ray.get``'s own timer can give up a little early (40 µs before
        a 0.4 s bound, seen in the test suite), so the wait goes on until the bound has really passed."""
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            try:
                return _get(ref, timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                if deadline is not None and time.monotonic() < deadline:
                    continue  # Ray's timer gave up before the bound: wait out the rest
            with contextlib.suppress(Exception):  # already running or finished: nothing to cancel
                ray.cancel(ref)
            raise PlaneCallTimeout(f"{what}: the plane actor on node {_short(node)} did not answer within "
                                   f"{stated if stated is not None else wait:g} s (stuck, or its node is "
                                   f"unreachable)") from None

    def _bound(self, timeout: float | None, name: str = "timeout") -> float | None:
        """A control call's timeout: the caller's, else the cluster's ``call_timeout``."""
        return self.call_timeout if timeout is None else _timeout_arg(name, timeout)

    # ----------------------------------------------------------------------------- ingestion
    def _route(self, learner: str | None, producer: str) -> str:
        if learner is not None:
            self.node_of(learner)
            return learner
        ids = list(self._learners)
        with self._lock:  # per producer, starting at a spot fixed by its name: handles spread producers
            n = self._rr.get(producer, zlib.crc32(producer.encode()) % len(ids))
            self._rr[producer] = n + 1
        return ids[n % len(ids)]

    def ingest_async(
        self,
        payload: Mapping[str, Any] | Any,
        *,
        policy_version: int,
        chunk_id: Hashable | None = None,
        producer: str = "local",
        learner: str | None = None,
        t_created: float | None = None,
        timeout: float | None = None,
        checksum: int | None = None,
        annotation: Any = None,
    ) -> Any:
        """Send a chunk to its learner's plane; returns the ``ObjectRef`` of its chunk id.

        ``payload`` is ``{column: array}`` or an ``ObjectRef`` of one. With ``learner=None`` the
        chunk goes to the next learner in turn (round-robin per producer). ``t_created`` defaults to
        now, here (the producer's clock). ``timeout`` bounds the wait for room in the plane
        (:class:`~conduit.errors.PlaneFullError`). ``annotation``, a small picklable object, travels
        inside the call (not through the store) and comes back with the batches that carry the chunk.
        """
        self._check_live()
        learner = self._route(learner, producer)
        actor = self._actors[self._learners[learner]]
        t_created = time.time() if t_created is None else float(t_created)
        if isinstance(payload, ray.ObjectRef):
            arg, via_store = payload, True
        elif self.inline_bytes and _payload_nbytes(payload) < self.inline_bytes:
            self.schema.validate(payload)  # refuse a bad chunk before it travels
            arg, via_store = payload, False
        else:
            self.schema.validate(payload)
            arg, via_store = ray.put(dict(payload)), True
        return actor.ingest.remote(
            arg, producer=producer, chunk_id=chunk_id, learner=learner, policy_version=int(policy_version),
            t_created=t_created, timeout=timeout, checksum=checksum, annotation=annotation,
            source_node=ray.get_runtime_context().get_node_id(), via_store=via_store)

    def ingest(self, payload: Mapping[str, Any] | Any, *, policy_version: int, chunk_id: Hashable | None = None,
               producer: str = "local", learner: str | None = None, t_created: float | None = None,
               timeout: float | None = None, checksum: int | None = None, annotation: Any = None) -> Hashable:
        """:meth:`ingest_async`, waiting until the chunk is in the plane; returns its chunk id. ``timeout``
        bounds the whole call, waits for a restarted actor included (see *Timeouts* in the class doc)."""
        timeout = _timeout_arg("timeout", timeout)
        learner = self._route(learner, producer)

        def send(left: float | None) -> Any:
            return self.ingest_async(payload, policy_version=policy_version, chunk_id=chunk_id, producer=producer,
                                     learner=learner, t_created=t_created, timeout=left, checksum=checksum,
                                     annotation=annotation)

        return self._call(self._learners[learner], None, timeout, send, what=f"ingest for learner {learner!r}")

    # ----------------------------------------------------------------------------- delivery
    def _learner(self, learner: str | None) -> str:
        if learner is None:
            if len(self._learners) != 1:
                raise ConduitError(f"name the learner: this plane serves {sorted(self._learners)}")
            return next(iter(self._learners))
        self.node_of(learner)
        return learner

    def next_batch_async(self, learner: str | None = None, *, update: int | None = None,
                         timeout: float | None = None, from_row: int = 0, incarnation: int | None = None) -> Any:
        """``ObjectRef`` of the learner's next :class:`RemoteBatch` (see :meth:`next_batch`)."""
        self._check_live()
        learner = self._learner(learner)
        return self._actors[self._learners[learner]].next_batch.remote(learner, update=update, timeout=timeout,
                                                                       from_row=from_row, incarnation=incarnation)

    def next_batch(self, learner: str | None = None, *, update: int | None = None,
                   timeout: float | None = None, from_row: int = 0, incarnation: int | None = None) -> RemoteBatch:
        """The learner's next batch from its node's plane, waiting up to ``timeout`` s (None: forever).

        With ``from_row=r`` only rows ``[r:]`` are shipped (``RemoteBatch.row_offset == r``): the
        learner already has rows ``[0, r)`` from :meth:`peek`. Raises
        :class:`~conduit.runtime.plane.DeliveryTimeout` naming what was missing. With
        ``incarnation`` (the one the peeked rows came from), a restarted plane refuses with
        :class:`~conduit.errors.PlaneRestarted` and delivers nothing.
        """
        learner = self._learner(learner)
        return self._call(self._learners[learner], None, _timeout_arg("timeout", timeout),
                          lambda left: self.next_batch_async(learner, update=update, timeout=left, from_row=from_row,
                                                             incarnation=incarnation),
                          what=f"next_batch for learner {learner!r}")

    def peek_async(self, learner: str | None = None, *, update: int | None = None, start: int = 0,
                   timeout: float | None = None, incarnation: int | None = None) -> Any:
        """``ObjectRef`` of a :class:`~conduit.runtime.batch.Peek` at the learner's next batch (see :meth:`peek`)."""
        self._check_live()
        learner = self._learner(learner)
        return self._actors[self._learners[learner]].peek.remote(learner, update=update, start=start,
                                                                 timeout=timeout, incarnation=incarnation)

    def peek(self, learner: str | None = None, *, update: int | None = None, start: int = 0,
             timeout: float | None = None, incarnation: int | None = None) -> Peek:
        """Rows ``[start, stop)`` of the learner's next batch that have already landed in its node's
        plane, as host copies, waiting up to ``timeout`` s (None: forever) for at least one (an empty
        :class:`~conduit.runtime.batch.Peek` when none came). Nothing is delivered: finish with
        ``next_batch(from_row=last_stop)`` (under ``OnPolicy``, ``update=peek.update``). See
        :meth:`ExperiencePlane.peek <conduit.runtime.plane.ExperiencePlane.peek>`."""
        learner = self._learner(learner)
        return self._call(self._learners[learner], None, _timeout_arg("timeout", timeout),
                          lambda left: self.peek_async(learner, update=update, start=start, timeout=left,
                                                       incarnation=incarnation),
                          what=f"peek for learner {learner!r}")

    @staticmethod
    def get(refs: Any, timeout: float | None = None) -> Any:
        """``ray.get`` for the refs of :meth:`ingest_async` / :meth:`next_batch_async`: a Conduit error
        raised in a plane actor is re-raised as itself (``PlaneFullError``, ``DeliveryTimeout``, ...)."""
        return _get(refs, timeout=timeout)

    def update_priorities_async(self, learner: str | None, ids: Any, priorities: Any) -> Any:
        """``ObjectRef`` of :meth:`update_priorities` (the count of ids evicted since their draw)."""
        self._check_live()
        learner = self._learner(learner)
        return self._actors[self._learners[learner]].update_priorities.remote(
            np.asarray(ids, np.int64), np.asarray(priorities, np.float64))

    def update_priorities(self, learner: str | None, ids: Any, priorities: Any, *, timeout: float | None = None) -> int:
        """Replay: new priorities (e.g. a learner's TD errors) for the samples ``ids`` of a batch this
        learner got (``RemoteBatch.replay_ids``), applied by the sampler of the learner's node; ids
        evicted since their draw are skipped and counted. Returns how many were skipped. ``timeout``
        (default ``call_timeout``): see *Timeouts* in the class doc."""
        learner = self._learner(learner)
        timeout = self._bound(timeout)
        ids, priorities = np.asarray(ids, np.int64), np.asarray(priorities, np.float64)
        return self._call(self._learners[learner], lambda a: a.update_priorities.remote(ids, priorities), timeout,
                          what=f"update_priorities for learner {learner!r}")

    # ----------------------------------------------------------------------------- control
    def size_batch(self, learner: str | None = None, *, update: int, rows: int, timeout: float | None = None) -> None:
        """OnPolicy: the learner's batch ``update`` holds exactly ``rows`` samples (see
        :meth:`ExperiencePlane.size_batch <conduit.runtime.plane.ExperiencePlane.size_batch>`).
        ``timeout`` (default ``call_timeout``): see *Timeouts* in the class doc."""
        self._check_live()
        learner = self._learner(learner)
        self._call(self._learners[learner], lambda a: a.size_batch.remote(learner, update=int(update), rows=int(rows)),
                   self._bound(timeout), what=f"size_batch for learner {learner!r}")

    def _each_node(self, call: Callable[[Any], Any], timeout: float | None, what: str) -> list[Any]:
        """``call(actor)`` on every node's plane, all within one ``timeout`` (default ``call_timeout``)."""
        return self._in_turn([(node, call) for node in self._actors], timeout, what)

    def _in_turn(self, calls: list[tuple[str, Callable[[Any], Any]]], timeout: float | None, what: str) -> list[Any]:
        """Each ``(node, call)`` in turn, all within one ``timeout`` (default ``call_timeout``)."""
        timeout = self._bound(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        got = []
        for node, call in calls:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            got.append(self._call(node, call, left, what=what, stated=timeout))
        return got

    def set_policy_version(self, version: int, *, timeout: float | None = None) -> None:
        """Every node's learners now have weights ``version``. ``timeout`` (default ``call_timeout``)
        bounds the calls to all nodes together."""
        self._check_live()
        self._each_node(lambda a: a.set_policy_version.remote(int(version)), timeout, f"set_policy_version({version})")

    def audit(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The merged audit (:func:`merge_audits`); after :meth:`shutdown`, the final one."""
        if self._final is not None:
            return self._final
        got = self._each_node(lambda a: a.audit.remote(), timeout, "audit")
        return merge_audits(dict(zip(self._actors, got, strict=True)))

    def metrics(self, *, timeout: float | None = None) -> dict[str, dict[str, Any]]:
        """Per node id: the plane's metrics, its learners, and what reached it through the object store."""
        self._check_live()
        got = self._each_node(lambda a: a.metrics.remote(), timeout, "metrics")
        return dict(zip(self._actors, got, strict=True))

    def _key(self, node: str) -> str:
        return ",".join(sorted(lid for lid, n in self._learners.items() if n == node))

    def snapshot(self, table: bool = True, *, timeout: float | None = None) -> dict[str, dict[str, Any]]:
        """Every node's checkpoint (:meth:`ExperiencePlane.snapshot`), keyed by the learners it serves
        (node ids change between runs; learner ids do not). ``timeout`` (default ``call_timeout``)
        bounds all nodes together: give a large table more."""
        self._check_live()
        got = self._each_node(lambda a: a.snapshot.remote(table), timeout, "snapshot")
        return {self._key(node): snap for node, snap in zip(self._actors, got, strict=True)}

    def restore(self, snaps: Mapping[str, Mapping[str, Any]], *, timeout: float | None = None) -> dict[str, int]:
        """Load :meth:`snapshot`'s checkpoints into these (fresh) planes; returns the summed counts.
        ``timeout`` (default ``call_timeout``) bounds all nodes together."""
        self._check_live()
        keys = {self._key(node): node for node in self._actors}
        if set(snaps) != set(keys):
            raise ConduitError(f"restore: the checkpoint has planes for learners {sorted(snaps)}, this cluster "
                               f"for {sorted(keys)}")
        got = self._in_turn([(keys[k], lambda a, snap=snap: a.restore.remote(dict(snap))) for k, snap in snaps.items()],
                            timeout, "restore")
        return {k: sum(g[k] for g in got) for k in ("chunks", "samples", "dropped")}

    def warming_up(self, learner: str | None = None, *, timeout: float | None = None) -> bool:
        """Whether the learner's Replay table is still warming up (no sample before ``min_size`` steps)."""
        self._check_live()
        learner = self._learner(learner)
        return bool(self._call(self._learners[learner], lambda a: a.warming_up.remote(), self._bound(timeout),
                               what=f"warming_up for learner {learner!r}"))

    def shutdown(self, timeout: float = 60.0) -> dict[str, Any]:
        """Close every plane (collecting the final audits), then end the actors; returns the merged
        final audit. Idempotent."""
        if self._final is not None:
            return self._final
        finals = _stop(self._actors.values(), timeout=timeout)
        self._final = merge_audits(dict(zip(self._actors, finals, strict=True)))
        return self._final

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ----------------------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        state["_rr"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        per = {_short(n): sorted(lid for lid, m in self._learners.items() if m == n) for n in self._actors}
        return f"PlaneCluster(nodes={per}, contract={self.contract.to_dict()['kind']})"


__all__ = ["CONCURRENCY", "LOCAL", "Peek", "PlaneActor", "PlaneCluster", "RemoteBatch", "merge_audits"]

