"""The plane's counters through ``ray.util.metrics``, so Ray's Prometheus/Grafana stack shows them.

**What is exported** (Ray prefixes every name with ``ray_`` in Prometheus). Every series carries the
tags ``node_id`` (the plane's Ray node) and ``contract`` (``on_policy``, ``bounded_staleness`` or
``replay``); tier series add ``tier``, violation series ``kind``, drop series ``reason``.

* Counters (:data:`COUNTERS`, ``conduit_plane_<name>_total``): the plane's monotonic counters from
  :meth:`ExperiencePlane.metrics <conduit.runtime.plane.ExperiencePlane.metrics>`, such as
  ``ingested_chunks``, ``delivered_samples``, ``backpressure_waits``, ``spilled_bytes``; each
  publication adds what the counter grew by since the last one.
* Gauges (:data:`GAUGES`, ``conduit_plane_<name>``): the docs/metrics.md figures as the plane
  measures them (``exposed_experience_path_s``, ``experience_path_s``, ``iteration_time_s``,
  ``experience_share``, ``updates``).
* ``conduit_tier_used_bytes`` / ``conduit_tier_capacity_bytes`` per ``tier``.
* ``conduit_audit_violations`` per ``kind`` (and ``kind="all"``), ``conduit_audit_samples`` per
  ``what`` (``ingested``, ``delivered``, ``unused_resident``) and ``conduit_audit_dropped_samples``
  per ``reason``: the live audit.

**When.** The plane actor publishes on a cadence (``export_interval_s``, 10 s by default), from a
thread of its own, and once more when it closes; nothing is recorded per chunk. :func:`export_values`
(which series, with which values) is plain code; :class:`MetricsExporter` only hands the values to
Ray's metric objects.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

COUNTERS: dict[str, str] = {
    "ingested_chunks": "chunks ingested by the plane",
    "ingested_bytes": "bytes ingested by the plane",
    "delivered_batches": "batches handed to learners",
    "delivered_samples": "samples handed to learners",
    "backpressure_waits": "times a producer waited for room in a tier",
    "refused_full": "ingests refused because the plane stayed full (PlaneFullError)",
    "failed_ingests": "ingests that failed after admission",
    "spilled_chunks": "chunks moved to another tier to make room",
    "spilled_bytes": "bytes moved to another tier to make room",
    "evicted_chunks": "Replay chunks evicted from the table (FIFO)",
    "dropped_stale_samples": "samples dropped as too old for their contract",
    "rejected_decisions": "policy decisions the plane core rejected (safe default used)",
    "forced_moves": "moves forced for a waiting learner",
    "restored_chunks": "chunks restored from a checkpoint",
}
"""Monotonic plane counters exported as ``conduit_plane_<name>_total``."""

GAUGES: dict[str, str] = {
    "exposed_experience_path_s": "mean exposed experience-path latency per update (s)",
    "experience_path_s": "mean experience-path latency per chunk (s)",
    "iteration_time_s": "mean time between batch hand-overs (s)",
    "experience_share": "exposed experience-path latency / iteration time",
    "updates": "batches handed over (updates served)",
}
"""Plane figures exported as ``conduit_plane_<name>`` gauges."""

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _tags(base: Mapping[str, str], **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({**base, **more}.items()))


def export_values(metrics: Mapping[str, Any], audit: Mapping[str, Any], *, node_id: str,
                  contract: str) -> tuple[Series, Series]:
    """``(counters, gauges)``: every exported series ``(name, tags) -> value`` for one plane's
    :meth:`~conduit.runtime.plane.ExperiencePlane.metrics` and audit report (``to_dict`` form)."""
    base = {"node_id": node_id, "contract": contract}
    counters: Series = {}
    gauges: Series = {}
    for name in COUNTERS:
        v = metrics.get(name)
        if isinstance(v, int | float):
            counters[(f"conduit_plane_{name}_total", _tags(base))] = float(v)
    for name in GAUGES:
        v = metrics.get(name)
        if isinstance(v, int | float) and math.isfinite(v):
            gauges[(f"conduit_plane_{name}", _tags(base))] = float(v)
    for tier, d in (metrics.get("tiers") or {}).items():
        if isinstance(d, Mapping):
            for key, series in (("used", "conduit_tier_used_bytes"), ("capacity", "conduit_tier_capacity_bytes")):
                if isinstance(d.get(key), int | float):
                    gauges[(series, _tags(base, tier=str(tier)))] = float(d[key])
    if audit:
        gauges[("conduit_audit_violations", _tags(base, kind="all"))] = float(audit.get("violations", 0))
        for kind, n in (audit.get("by_kind") or {}).items():
            gauges[("conduit_audit_violations", _tags(base, kind=str(kind)))] = float(n)
        for what, key in (("ingested", "ingested_samples"), ("delivered", "delivered_samples"),
                          ("unused_resident", "unused_resident_samples")):
            gauges[("conduit_audit_samples", _tags(base, what=what))] = float(audit.get(key, 0))
        for reason, n in (audit.get("dropped_samples") or {}).items():
            gauges[("conduit_audit_dropped_samples", _tags(base, reason=str(reason)))] = float(n)
    return counters, gauges


TAG_KEYS: dict[str, tuple[str, ...]] = {
    "conduit_tier_used_bytes": ("node_id", "contract", "tier"),
    "conduit_tier_capacity_bytes": ("node_id", "contract", "tier"),
    "conduit_audit_violations": ("node_id", "contract", "kind"),
    "conduit_audit_samples": ("node_id", "contract", "what"),
    "conduit_audit_dropped_samples": ("node_id", "contract", "reason"),
}


def _description(name: str) -> str:
    for key, text in {**COUNTERS, **GAUGES}.items():
        if name in (f"conduit_plane_{key}_total", f"conduit_plane_{key}"):
            return text
    return name.replace("_", " ")


class MetricsExporter:
    """Hands :func:`export_values` to ``ray.util.metrics`` Counters and Gauges (created on first use).

    ``published`` holds, per series, the value last published (a counter's running total), and
    ``metrics`` the Ray metric objects by name."""

    def __init__(self, node_id: str, contract: str):
        self.node_id, self.contract = node_id, contract
        self.metrics: dict[str, Any] = {}
        self.published: Series = {}
        self.publications = 0
        self._lock = threading.Lock()

    def _metric(self, name: str, counter: bool) -> Any:
        m = self.metrics.get(name)
        if m is None:
            from ray.util.metrics import Counter, Gauge

            keys = TAG_KEYS.get(name, ("node_id", "contract"))
            m = (Counter if counter else Gauge)(name, description=_description(name), tag_keys=keys)
            self.metrics[name] = m
        return m

    def publish(self, metrics: Mapping[str, Any], audit: Mapping[str, Any]) -> None:
        counters, gauges = export_values(metrics, audit, node_id=self.node_id, contract=self.contract)
        with self._lock:
            for (name, tags), total in counters.items():
                grew = total - self.published.get((name, tags), 0.0)
                if grew > 0:
                    self._metric(name, True).inc(grew, tags=dict(tags))
                    self.published[(name, tags)] = total
                else:
                    self.published.setdefault((name, tags), total if total > 0 else 0.0)
            for (name, tags), value in gauges.items():
                self._metric(name, False).set(value, tags=dict(tags))
                self.published[(name, tags)] = value
            self.publications += 1

    def snapshot(self) -> dict[str, Any]:
        """What was published: ``{"series": {name: {tags-as-"k=v,...": value}}, "publications": n,
        "metrics": {name: {"type", "tag_keys", "recording"}}}`` (``recording`` is False when Ray
        discarded the metric, e.g. for an invalid name)."""
        with self._lock:
            series: dict[str, dict[str, float]] = {}
            for (name, tags), v in self.published.items():
                series.setdefault(name, {})[",".join(f"{k}={val}" for k, val in tags)] = v
            return {"series": series, "publications": self.publications,
                    "metrics": {n: {"type": type(m).__name__, "tag_keys": list(m._tag_keys),
                                    "recording": getattr(m, "_metric", None) is not None}
                                for n, m in self.metrics.items()}}
