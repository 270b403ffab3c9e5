"""What a simulation measured: per-chunk and per-update traces, segments, and the metrics of docs/metrics.md.

Definitions (docs/metrics.md, used exactly):

* **experience path** of a chunk: ``t_ready - t_created``, where ``t_ready`` is when its data sits in
  the learner's compute-device memory in the layout the update consumes (after batch building,
  to-tensor and, for PPO, the value pass);
* **exposed experience-path latency** of an update:
  ``t_batch_ready - max(t_learner_free, t_last_needed_chunk_created)``;
* **iteration time**: time between the starts of consecutive learner updates;
* **experience share**: exposed experience-path latency / iteration time (ratio of the means).

Segments (``a``, ``b``, ``c``, ``d``, ``gae``, ...) are wall-clock spans on the observed learner (learner
0) and the driver, summed per iteration, named as in the reference measurement.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class ChunkTrace:
    chunk_id: int
    runner: str
    learner: str
    version: int
    steps: int
    nbytes: float
    tier: str
    t_created: float
    t_ready: float = math.nan


@dataclass
class UpdateTrace:
    update: int
    learner: str
    samples: int
    t_learner_free: float
    t_last_created: float
    t_batch_ready: float
    t_start: float
    t_end: float

    @property
    def exposed(self) -> float:
        return max(0.0, self.t_batch_ready - max(self.t_learner_free, self.t_last_created))


@dataclass
class Recorder:
    chunks: dict[int, ChunkTrace] = field(default_factory=dict)
    updates: list[UpdateTrace] = field(default_factory=list)
    segments: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    spilled: int = 0
    #: learners update in lockstep (data-parallel); False when each learner runs its own loop
    synchronous: bool = True

    def span(self, iteration: int, name: str, start: float, end: float) -> None:
        self.segments[iteration][name] += end - start

    # -- summary ----------------------------------------------------------------------------
    def per_update(self, warmup: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(exposed, iteration) per update index ``u >= max(1, warmup)``, paired over the same updates.

        Synchronous (lockstep) learners: an update starts when its last learner starts it, and
        its iteration is the time since the previous update started; its exposed latency is the
        largest over its learners (a synchronous update waits for the slowest learner's data). Both
        series cover the same updates, so their ratio is a share of the same time. Independent
        learners (the plane's replay loop): the same pairing per learner, over all learners."""
        if not self.synchronous:  # independent learners: pair each learner's own updates
            by_learner: dict[str, list[UpdateTrace]] = defaultdict(list)
            for u in self.updates:
                by_learner[u.learner].append(u)
            pairs = []
            for ups in by_learner.values():
                ups.sort(key=lambda u: u.update)
                first = max(1, warmup) if len(ups) - max(1, warmup) >= 1 else 1
                pairs += [(ups[i].exposed, ups[i].t_start - ups[i - 1].t_start) for i in range(first, len(ups))]
            return self._unzip(pairs, [u.exposed for u in self.updates])
        start: dict[int, float] = {}
        exposed: dict[int, float] = {}
        for u in self.updates:
            start[u.update] = max(start.get(u.update, -math.inf), u.t_start)
            exposed[u.update] = max(exposed.get(u.update, 0.0), u.exposed)
        keys = sorted(start)
        first = max(1, warmup)
        if len(keys) - first < 1:  # too short a run to skip warm-up: use what there is
            first = 1
        pairs = [(exposed[u], start[u] - start[keys[i - 1]]) for i, u in enumerate(keys) if i >= first]
        return self._unzip(pairs, [exposed[u] for u in keys])

    @staticmethod
    def _unzip(pairs: list[tuple[float, float]], fallback: list[float]) -> tuple[np.ndarray, np.ndarray]:
        if not pairs:
            return np.array(fallback or [0.0]), np.array([math.nan])
        e, it = zip(*pairs, strict=True)
        return np.array(e), np.array(it)

    def metrics(self, warmup: int = 1) -> dict[str, Any]:
        """The metrics of docs/metrics.md over updates after ``warmup`` (the first ones fill empty pipelines)."""
        exposed, iteration = self.per_update(warmup)
        paths = np.array([c.t_ready - c.t_created for c in self.chunks.values() if not math.isnan(c.t_ready)])
        mean_iter = float(np.mean(iteration))
        mean_exposed = float(np.mean(exposed))
        return {
            "exposed_experience_path_s": mean_exposed,
            "experience_path_s": float(np.mean(paths)) if len(paths) else math.nan,
            "iteration_time_s": mean_iter,
            "experience_share": mean_exposed / mean_iter if mean_iter > 0 else math.nan,
            "exposed_experience_path_p50_s": float(np.median(exposed)),
            "experience_path_p99_s": float(np.percentile(paths, 99)) if len(paths) else math.nan,
            "iteration_time_p50_s": float(np.median(iteration)),
            "updates": len({u.update for u in self.updates}),
            "chunks": len(self.chunks),
            "spilled_chunks": self.spilled,
        }

    def segment_means(self, warmup: int = 1) -> dict[str, float]:
        iters = [k for k in sorted(self.segments) if k >= warmup] or sorted(self.segments)
        names = sorted({n for k in iters for n in self.segments[k]})
        return {n: float(np.mean([self.segments[k].get(n, 0.0) for k in iters])) for n in names}

    # -- traces ---------------------------------------------------------------------------------
    @staticmethod
    def trace_paths(path: str | Path) -> list[Path]:
        """The files :meth:`write_trace` may write for ``path``: chunks, updates, tiers."""
        path = Path(path)
        return [path, path.with_name(f"{path.stem}.updates{path.suffix}"),
                path.with_name(f"{path.stem}.tiers{path.suffix}")]

    @classmethod
    def check_trace_path(cls, path: str | Path) -> None:
        """Refuse, before a run, a trace path that cannot be written: a directory (or one of the
        derived ``.updates``/``.tiers`` names is), a folder that does not exist or is not writable,
        or ``.parquet`` without pyarrow."""
        import os

        from conduit.errors import ConduitError

        path = Path(path)
        if path.is_dir():
            raise ConduitError(f"--trace {path}: is a directory; give a file name such as {path / 'trace.csv'}")
        for target in cls.trace_paths(path)[1:]:
            if target.is_dir():
                raise ConduitError(f"--trace {path}: {target}, one of the files a trace writes, is a directory")
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise ConduitError(f"--trace {path}: directory {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConduitError(f"--trace {path}: directory {parent} is not writable")
        if path.suffix == ".parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise ConduitError("--trace FILE.parquet needs pyarrow; use a .csv file name instead") from None

    def write_trace(self, path: str | Path, tiers: list[tuple[float, str, float]] | None = None) -> list[Path]:
        """Per-chunk and per-update traces as CSV (``FILE`` and ``FILE`` with ``.updates`` before the
        suffix), or Parquet when the suffix is ``.parquet`` and pyarrow is installed; with ``tiers``
        (time, tier, bytes used) also the tier occupancy over time (``FILE`` with ``.tiers`` before the
        suffix), so ``conduit sim --trace`` writes three files. Returns the paths written."""
        path = Path(path)
        chunk_rows = [
            {
                "chunk_id": c.chunk_id,
                "runner": c.runner,
                "learner": c.learner,
                "version": c.version,
                "steps": c.steps,
                "bytes": c.nbytes,
                "tier": c.tier,
                "t_created": c.t_created,
                "t_ready": c.t_ready,
                "experience_path_s": c.t_ready - c.t_created,
            }
            for c in self.chunks.values()
        ]
        update_rows = [
            {
                "update": u.update,
                "learner": u.learner,
                "samples": u.samples,
                "t_learner_free": u.t_learner_free,
                "t_last_needed_chunk_created": u.t_last_created,
                "t_batch_ready": u.t_batch_ready,
                "t_start": u.t_start,
                "t_end": u.t_end,
                "exposed_experience_path_s": u.exposed,
            }
            for u in self.updates
        ]
        update_path = path.with_name(f"{path.stem}.updates{path.suffix}")
        tier_rows = [{"t": t, "tier": tier, "used_bytes": used} for t, tier, used in (tiers or [])]
        tier_path = path.with_name(f"{path.stem}.tiers{path.suffix}")
        if path.suffix == ".parquet":
            from conduit.errors import ConduitError

            try:
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ImportError:
                raise ConduitError("--trace FILE.parquet needs pyarrow; use a .csv file name instead") from None
            pq.write_table(pa.Table.from_pylist(chunk_rows), path)
            pq.write_table(pa.Table.from_pylist(update_rows), update_path)
            if tier_rows:
                pq.write_table(pa.Table.from_pylist(tier_rows), tier_path)
        else:
            for rows, target in ((chunk_rows, path), (update_rows, update_path), (tier_rows, tier_path)):
                if target is tier_path and not tier_rows:
                    continue
                with open(target, "w", newline="") as handle:
                    writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["empty"])
                    writer.writeheader()
                    writer.writerows(rows)
        return [path, update_path] + ([tier_path] if tier_rows else [])


def dumps(obj: Any) -> str:
    """JSON with NaN written as null, so any JSON reader accepts it."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        if isinstance(x, np.generic):
            return clean(x.item())
        return x

    return json.dumps(clean(obj), indent=2)
