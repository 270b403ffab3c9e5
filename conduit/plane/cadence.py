"""When will each learner ask for its next batch? The learner cadence model.

A learner alternates between *asking* for a batch (it waits, its device idle) and *updating* on
it. Scheduling is latency-aware only if the plane can predict the next ask, so it keeps, per
learner, an exponentially weighted moving average of the time between consecutive asks
(``EWMA = 0.3`` on the newest gap). The prediction of the next ask is the last ask plus that
interval.

**Before there is history** (no ask yet, or a single one, so no gap was seen) the rule is the
same in both backends: the interval is unknown and taken as zero, so ``update_time`` is ``0.0``
and ``next_need_at`` is the last ask (or *now* before any ask): the learner is treated as needing
data now, the most urgent case, so a cold pipeline is filled as early as possible.

Times are whatever clock the backend keeps (simulated seconds, or the wall clock): only
differences between them mean anything, as for :attr:`~conduit.view.ClusterView.now`.
"""

from __future__ import annotations

from conduit.view import LearnerState

EWMA = 0.3
"""Weight of the newest inter-ask gap in the interval estimate."""


class LearnerCadence:
    """One learner's identity (device, node, the tier its batches end in) and its ask cadence."""

    def __init__(self, id: str, device: str, node: str | None, tier: str | None, batch_bytes: float):
        self.id = id
        self.device = device
        self.node = node
        self.tier = tier
        self.batch_bytes = float(batch_bytes)
        self.interval = 0.0
        self.last_ask: float | None = None
        self.waiting = False
        self.version = 0

    def asked(self, now: float) -> None:
        """The learner asks for its next batch now (and waits until it is served)."""
        if self.last_ask is not None:
            gap = now - self.last_ask
            self.interval = gap if not self.interval else (1 - EWMA) * self.interval + EWMA * gap
        self.last_ask = now
        self.waiting = True

    def served(self) -> None:
        """The learner has its batch and is updating."""
        self.waiting = False

    def next_need_at(self, now: float) -> float | None:
        """Predicted time of the next ask; ``None`` while the learner is waiting now."""
        if self.waiting:
            return None
        if self.last_ask is None:
            return now
        return self.last_ask + self.interval

    def state(self, now: float) -> LearnerState:
        """The learner as a policy sees it in a :class:`~conduit.view.ClusterView`."""
        return LearnerState(self.id, self.device, self.node, self.next_need_at(now), self.interval,
                            self.version, self.batch_bytes, self.tier)
