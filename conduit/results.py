"""Results as plain data: :class:`Table` (a list of dict rows) and :func:`result_rows` of one simulation.

``to_frame()`` turns either into a pandas DataFrame; pandas is optional, and its absence is an
:class:`ImportError` that names it. :class:`~conduit.sim.engine.SimResult` and
:func:`conduit.sweep <conduit.studies.sweep>` use this module; it imports neither.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from conduit.errors import ConduitError


def to_frame(rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None):
    """``rows`` as a pandas DataFrame. pandas is optional: without it, an ImportError says so."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("to_frame() needs pandas, which Conduit does not install: `pip install pandas`, "
                          "or use .to_rows() for plain rows (a list of dicts)") from None
    return pd.DataFrame([dict(r) for r in rows], columns=list(columns) if columns else None)


class Table(list):
    """A study's rows: a list of dicts (plain data), one per run, with fixed :attr:`columns`."""

    def __init__(self, rows: Iterable[Mapping[str, Any]] = (), columns: Sequence[str] | None = None):
        super().__init__(dict(r) for r in rows)
        self.columns: list[str] = list(columns) if columns else (list(self[0]) if self else [])

    def to_rows(self) -> list[dict[str, Any]]:
        """A copy of the rows, as plain dicts."""
        return [dict(r) for r in self]

    def to_dict(self) -> dict[str, list[Any]]:
        """Column name -> the column's values."""
        return {c: [r.get(c) for r in self] for c in self.columns}

    def to_frame(self):
        """A pandas DataFrame (pandas is optional; see :func:`to_frame`)."""
        return to_frame(self, self.columns)

    def to_csv(self, path: Any) -> None:
        """Write the rows as CSV to a path or an open text file."""
        if hasattr(path, "write"):
            writer = csv.DictWriter(path, fieldnames=self.columns, extrasaction="ignore", lineterminator="\n")
            writer.writeheader()
            writer.writerows(self)
            return
        with open(path, "w", newline="", encoding="utf-8") as handle:
            self.to_csv(handle)


def result_rows(result: Any, kind: str = "summary") -> list[dict[str, Any]]:
    """Plain rows of a :class:`~conduit.sim.engine.SimResult`: ``summary`` (one row: what ran and
    every metric), ``updates`` (one per learner update) or ``chunks`` (one per chunk)."""
    if kind == "summary":
        row: dict[str, Any] = {
            "topology": result.topology,
            "workload": result.workload.name,
            "algorithm": result.workload.algorithm,
            "policy": result.policy.name,
            "seed": result.seed,
            "iterations": result.iterations,
        }
        row.update(result.metrics)
        row.update(violations=result.audit.violations, rejected_decisions=result.rejections.get("total", 0),
                   sim_time_s=result.sim_time, events=result.events)
        return [row]
    if kind == "updates":
        return [{**asdict(u), "exposed_experience_path_s": u.exposed} for u in result.recorder.updates]
    if kind == "chunks":
        return [{**asdict(c), "experience_path_s": c.t_ready - c.t_created} for c in result.recorder.chunks.values()]
    raise ConduitError(f"unknown row kind {kind!r}; one of summary, updates, chunks")
