"""The plane's metrics, with the definitions of docs/metrics.md, measured on the wall clock.

* **experience path** of a chunk: ``t_ready - t_created``, from when its producer finished it to when
  the batch that carries it sits complete in the learner's device memory.
* **exposed experience-path latency** of an update: ``t_batch_ready - max(t_learner_free,
  t_last_needed_chunk_created)``, where ``t_learner_free`` is when the learner asked for the batch and
  ``t_batch_ready`` the moment it got it (a batch prefetched before the learner asked is handed over
  at once and exposes nothing). Clamped at zero.
* **iteration time**: between the starts of consecutive updates, i.e. consecutive batch hand-overs to
  one learner.
* **experience share**: exposed experience-path latency / iteration time (means).

Clocks: producers stamp ``t_created`` with ``time.time()`` (comparable across processes of one host),
so the plane uses the same clock.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class PlaneMetrics:
    window: int = 1000
    exposed: deque = field(default_factory=deque)
    iteration: deque = field(default_factory=deque)
    path: deque = field(default_factory=deque)
    counters: dict[str, float] = field(default_factory=dict)
    _last_start: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _push(self, q: deque, value: float) -> None:
        q.append(value)
        if len(q) > self.window:
            q.popleft()

    def count(self, name: str, n: float = 1) -> None:
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + n

    def update_started(self, learner: str, t_asked: float, t_ready: float, t_handed: float,
                       created: list[float]) -> float:
        """Record one hand-over; returns its exposed experience-path latency."""
        last_created = max(created) if created else t_asked
        exposed = max(0.0, t_handed - max(t_asked, last_created))
        with self._lock:
            self._push(self.exposed, exposed)
            prev = self._last_start.get(learner)
            if prev is not None:
                self._push(self.iteration, t_handed - prev)
            self._last_start[learner] = t_handed
            for c in created:
                self._push(self.path, max(0.0, t_ready - c))
        return exposed

    def summary(self) -> dict[str, float | int | None]:
        with self._lock:
            exposed = float(np.mean(self.exposed)) if self.exposed else None
            iteration = float(np.mean(self.iteration)) if self.iteration else None
            path = float(np.mean(self.path)) if self.path else None
            out: dict[str, float | int | None] = {
                "exposed_experience_path_s": exposed,
                "experience_path_s": path,
                "iteration_time_s": iteration,
                "experience_share": (exposed / iteration) if exposed is not None and iteration else None,
                "exposed_experience_path_p50_s": float(np.median(self.exposed)) if self.exposed else None,
                "updates": len(self.exposed),
            }
            out.update(self.counters)
        return out
