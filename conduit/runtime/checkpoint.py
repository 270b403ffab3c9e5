"""Checkpoints of a plane: what a snapshot holds, and how a fresh plane continues from one.

**What a snapshot is.** :meth:`PlaneCheckpoint.snapshot` returns a plain dict (numpy arrays, ints,
strings; picklable and msgpack-able) with

* ``table`` (Replay only, and only when asked for): the Replay table as it is, columnar: one array
  per schema column holding every live chunk's rows back to back, oldest chunk first, and each
  chunk's metadata (id, producer, node, steps, bytes, policy version, creation time, checksum,
  annotation) in the same order. The tiers' bytes are copied out as they are; nothing is re-encoded;
* ``limiter``: the Replay rate limiter's cumulative inserted and sampled steps (what the contract's
  band is measured on) and the sampler's random generator;
* ``audit``: the auditor's counts (:meth:`~conduit.audit.Auditor.carry`), with every live sample
  the snapshot does not hold counted as dropped for :data:`DROP_REASON`;
* ``learners``: each learner's next OnPolicy update, and the policy version;
* ``parts``: a ``state_dict()`` from each part registered with :meth:`PlaneCheckpoint.register_part`
  (a table component with its own state: the Replay sampler, with its priorities, registers as
  ``"sampler"``), loaded back with ``load_state_dict`` once the table is restored, and only with the
  table (without it, the parts start afresh as the table does). Each chunk keeps its sample ids
  (``first_id``; the table's ``next_sample_id``), so the sampler's state names the same samples.
  This is the one hook a table component needs.

**What it does not hold.** Data in flight is not carried: under ``OnPolicy`` and
``BoundedStaleness`` every chunk not yet delivered (pending, or in a batch being assembled or not
yet handed over) is dropped at the checkpoint, and counted in the restored run's audit under
``dropped_samples["checkpoint"]`` (a drop, never a silent loss); the restored EnvRunners sample
again with the restored weights. Ingests and replay samples still copying when the snapshot is
taken are not in it (the auditor had not seen them either). Without the table (``table=False``,
RLlib's ``store_buffer_in_checkpoints=False``), the Replay table's samples are dropped the same
way, and the restored plane's rate limiter and the audit's rate band start again from zero: the
table warms up again (``min_size`` inserted steps before the first sample).

**Restoring.** :meth:`PlaneCheckpoint.restore` loads a snapshot into a fresh plane (nothing
ingested yet) with the same schema and contract. The table's chunks keep their ids; each is placed
by the policy (checked by the plane core, as any ingest) and copied into its tier once; the
auditor resumes with every count carried and the restored chunks live again
(:meth:`~conduit.audit.Auditor.resume`), so samples restored are neither ingested twice nor
unknown when sampled.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from conduit.chunk import Chunk
from conduit.errors import ConduitError
from conduit.runtime.records import _Chunk, _host

FORMAT = "conduit-plane-snapshot"
VERSION = 1
DROP_REASON = "checkpoint"
"""The reason under which a snapshot's audit counts the live samples it does not hold."""


class StatePart(Protocol):
    """A table component with its own state (e.g. a sampler): what :meth:`PlaneCheckpoint.register_part` takes."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class PlaneCheckpoint:
    """Snapshot and restore, a part of :class:`~conduit.runtime.plane.ExperiencePlane` (see the module doc)."""

    def register_part(self, name: str, part: StatePart) -> None:
        """Have ``part.state_dict()`` saved with every snapshot under ``name`` and loaded back
        (``part.load_state_dict``) after the table, on restore."""
        if not callable(getattr(part, "state_dict", None)) or not callable(getattr(part, "load_state_dict", None)):
            raise ConduitError(f"register_part({name!r}): a part needs state_dict() and load_state_dict()")
        parts = self.__dict__.setdefault("_state_parts", {})
        if name in parts:
            raise ConduitError(f"register_part({name!r}): a part with this name is registered already")
        parts[name] = part

    def warming_up(self) -> bool:
        """Replay: the table has had fewer than ``min_size`` steps inserted since it started (or was
        restored without its data); no sample is allowed yet. False for the other contracts."""
        with self._lock:
            return bool(self.rules.tabled) and self._inserted < self.contract.min_size

    # ---------------------------------------------------------------------------- snapshot
    def snapshot(self, *, table: bool = True) -> dict[str, Any]:
        """The plane's state for a checkpoint (see the module doc); ``table=False`` leaves the Replay
        table's data out (its samples are counted as dropped in the snapshot's audit)."""
        with self._cond:
            self._check_open()
            tabled = bool(self.rules.tabled)
            chunks = list(self._table.values()) if tabled and table else []
            out: dict[str, Any] = {
                "format": FORMAT, "version": VERSION, "t": time.time(),
                "schema": self.schema.to_dict(), "contract": self.contract.to_dict(),
                "batch_steps": self.batch_steps, "policy_version": self._version,
                "learners": {lid: {"next_update": q.next_update} for lid, q in self._learners.items()},
                "next_chunk_seq": next(self._chunk_seq),
                "table": None, "limiter": None,
                "audit": self.auditor.carry((c.meta.id for c in chunks), DROP_REASON, time.time()),
                "parts": {name: part.state_dict() for name, part in self.__dict__.get("_state_parts", {}).items()},
            }
            self._chunk_seq = itertools.count(out["next_chunk_seq"] + 1)
            if tabled:
                out["limiter"] = {"inserted": self._inserted, "sampled": self._delivered,
                                  "rng": self._rng.bit_generator.state} if table else None
            if tabled and table:
                out["table"] = {
                    "chunks": [_meta_dict(c) for c in chunks],
                    "next_sample_id": self._next_sample_id,
                    "columns": {name: _concat([_host(c.columns()[name][:c.meta.steps]) for c in chunks],
                                              self.schema, name) for name in self.schema.names},
                }
            self.metrics_.count("snapshots")
        return out

    # ---------------------------------------------------------------------------- restore
    def restore(self, snap: Mapping[str, Any], timeout: float = 60.0) -> dict[str, int]:
        """Continue from ``snap`` (:meth:`snapshot`) in this fresh plane; returns what was restored
        (``chunks``, ``samples``, ``dropped`` at the checkpoint)."""
        if snap.get("format") != FORMAT or snap.get("version") != VERSION:
            raise ConduitError(f"restore: not a plane snapshot of format {FORMAT} v{VERSION} "
                               f"(got {snap.get('format')!r} v{snap.get('version')!r})")
        if dict(snap["schema"]) != self.schema.to_dict():
            raise ConduitError(f"restore: the snapshot's schema {snap['schema']} is not this plane's "
                               f"{self.schema.to_dict()}")
        if dict(snap["contract"]) != self.contract.to_dict():
            raise ConduitError(f"restore: the snapshot's contract {snap['contract']} is not this plane's "
                               f"{self.contract.to_dict()}")
        tab = snap.get("table")
        metas = [_meta(m) for m in tab["chunks"]] if tab else []
        deadline = time.monotonic() + timeout
        with self._cond:
            self._check_open()
            if self._chunks or self._admitting or self._inserted or self._delivered:
                raise ConduitError("restore: the plane is not fresh (chunks were ingested or sampled already); "
                                   "restore a snapshot before any producer or learner uses the plane")
            self.auditor.resume(snap["audit"], metas, rate=snap.get("limiter") is not None)
            self._version = int(snap["policy_version"])
            for lid, q in self._learners.items():
                q.model.version = self._version
                q.next_update = int(snap["learners"].get(lid, {}).get("next_update", 0))
            self._chunk_seq = itertools.count(int(snap["next_chunk_seq"]))
            row = 0
            now = time.time()
            for meta, m in zip(metas, tab["chunks"] if tab else [], strict=True):
                c = _Chunk(meta, None, None, annotation=m.get("annotation"))
                tier_id = self._place(c, None)
                c.extent = self._room(c, tier_id, deadline, timeout)
                src = {name: tab["columns"][name] for name in self.schema.names}
                dst_tier = c.extent.tier
                self.engine.run_now(("checkpoint", dst_tier.id), lambda src=src, row=row, c=c, t=dst_tier: self._copy(
                    None, src, row, c.meta.steps, t, c.extent.columns(), 0), cuda=dst_tier.medium.device_side)
                row += meta.steps
                self._chunks[meta.id] = c
                self.ledger.placed(meta.id, dst_tier.id, c.extent.nbytes, now)
                self._table_steps += meta.steps
                if m.get("first_id", -1) >= 0:  # the sample ids the saved sampler state knows
                    self._next_sample_id = int(m["first_id"])
                self._insert_replay(c)
            lim = snap.get("limiter")
            if lim is not None:
                self._inserted = int(lim["inserted"])
                self._sampled = self._delivered = int(lim["sampled"])
                self._rng.bit_generator.state = lim["rng"]
            if tab is not None:  # parts are the table's: without its data, they start afresh too
                self._next_sample_id = max(self._next_sample_id, int(tab.get("next_sample_id", 0)))
                parts = self.__dict__.get("_state_parts", {})
                for name, state in (snap.get("parts") or {}).items():
                    if name in parts:
                        parts[name].load_state_dict(state)
            self.metrics_.count("restored_chunks", len(metas))
            self.metrics_.count("restored_samples", row)
            self._compact()  # a recoverable plane's log starts from the restored audit (not journaled event by event)
            self._cond.notify_all()
            self._pump()
        dropped = int(snap["audit"]["dropped"].get(DROP_REASON, 0))
        return {"chunks": len(metas), "samples": row, "dropped": dropped}


def _meta_dict(c: _Chunk) -> dict[str, Any]:
    m = c.meta
    return {"id": m.id, "producer": m.producer, "node": m.node, "steps": m.steps, "nbytes": m.nbytes,
            "policy_version": m.policy_version, "t_created": m.t_created, "checksum": m.checksum,
            "annotation": c.annotation, "first_id": c.first_id}


def _meta(m: Mapping[str, Any]) -> Chunk:
    return Chunk(m["id"], m["producer"], m["node"], int(m["steps"]), int(m["nbytes"]), int(m["policy_version"]),
                 float(m["t_created"]), m.get("checksum"))


def _concat(parts: list[np.ndarray], schema: Any, name: str) -> np.ndarray:
    if parts:
        return np.ascontiguousarray(np.concatenate(parts, axis=0))
    col = next(c for c in schema.columns if c.name == name)
    return np.zeros((0, *col.shape), col.dtype)
