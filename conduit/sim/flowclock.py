"""Flow progress by route class: one virtual clock per class, not one remaining-bytes counter per flow.

Max-min fairness gives every flow of a route class the same rate (see :mod:`.network`), so the
progress of all of them is one number: the bytes each flow of the class has been served since the
class's *epoch* (the instant it last went from no flow to one). This is the virtual time of
processor sharing. Per class ``c`` the clock keeps ``served[c]`` (bytes per flow from the epoch to
``since[c]``) and ``rate[c]`` (the rate its flows have had since ``since[c]``); it is advanced,
``served += (now - since) * rate; since = now``, only when the class's rate changes. The bytes per
flow served up to ``now`` are ``served_now = served + (now - since) * rate``.

A flow of ``nbytes`` joining class ``c`` at ``now`` records its *finishing virtual bytes*
``vfinish = served_now + nbytes``. From then on its remaining bytes are ``vfinish - served_now`` and
its predicted finish is ``since + (vfinish - served) / rate``: both are monotone in ``vfinish``, so
a class's next finish is that of its flow with the smallest ``vfinish``. A re-rate costs one update
per class whose rate changed, whatever the number of its flows.

A completion timer at ``now`` completes exactly the flows whose predicted finish is ``<= now`` or
whose remaining bytes are at most their tolerance (``tol``, a relative epsilon of their size, which
absorbs floating-point crumbs); they are reported in slot order.

Two implementations keep the same per-class and per-slot state and do the same floating-point
operations on it, so they give bit for bit the same finishes, completions and remaining bytes:

* :class:`ScanClocks`, the reference: every query scans every active flow (``since[cls] +
  (vfinish - served[cls]) / rate[cls]`` over all of them);
* :class:`HeapClocks`, the fast path: a heap per class of its flows keyed by ``vfinish``; a class's
  next finish is kept per class; a timer looks at the classes that can hold a finished flow and pops
  from their heaps only the flows that can have finished (by the monotonicity above, a prefix of
  each heap: the flows with ``vfinish - served_now <= max tol of the class`` or a predicted finish
  ``<= now``), testing each exactly and pushing back those that have not.

Precision: ``vfinish - served_now`` carries an absolute error of about one unit in the last place
of ``served`` (the bytes per flow served since the epoch), so a flow's remaining bytes are exact to
``1e-16 * served / nbytes`` relative to its size: far below the completion tolerance
(``COMPLETION_RTOL``, 1e-9) unless a class stays busy without a break for a million times the size
of its flows.
"""

from __future__ import annotations

import heapq
import math

import numpy as np


def grown(array: np.ndarray, size: int, fill: float) -> np.ndarray:
    """``array`` extended to at least ``size`` elements (doubling), new ones ``fill`` (the flow clocks'
    arrays and the network's link and class arrays)."""
    new = max(8, 2 * array.size)
    while new < size:
        new *= 2
    return np.concatenate([array, np.full(new - array.size, fill, dtype=array.dtype)])


class FlowClocks:
    """The state and arithmetic both implementations share.

    Per class (global ids from 1; 0 is the class of free slots): ``served``, ``since``, ``rate`` and
    ``maxtol`` (the largest ``tol`` of a flow that joined in the current epoch). Per slot:
    ``vfinish``, ``nbytes``, ``tol`` (-1 for free slots) and ``cls`` (0 for free slots).
    """

    def __init__(self) -> None:
        self.n_classes = 1
        self.served = np.zeros(8)
        self.since = np.zeros(8)
        self.rate = np.zeros(8)
        self.maxtol = np.zeros(8)
        self.vfinish = np.zeros(0)
        self.nbytes = np.zeros(0)
        self.tol = np.zeros(0)
        self.cls = np.zeros(0, dtype=np.intp)

    # -- sizes -------------------------------------------------------------

    def add_class(self) -> int:
        """A new class id (no flow, epoch not started)."""
        cls = self.n_classes
        self.n_classes += 1
        if cls >= self.served.size:
            for name in ("served", "since", "rate", "maxtol"):
                setattr(self, name, grown(getattr(self, name), cls + 1, 0.0))
            self._grew_classes(cls + 1)
        return cls

    def grow_slots(self, size: int) -> None:
        """Room for ``size`` slots."""
        self.vfinish = grown(self.vfinish, size, 0.0)
        self.nbytes = grown(self.nbytes, size, 0.0)
        self.tol = grown(self.tol, size, -1.0)
        self.cls = grown(self.cls, size, 0)

    def _grew_classes(self, size: int) -> None:
        """Hook: per-class arrays of a subclass."""

    # -- flows -------------------------------------------------------------

    def start_epoch(self, cls: int, now: float, rate: float) -> None:
        """Class ``cls``, which has no flow, gets its first: its clock starts at 0 bytes, now."""
        self.served[cls] = 0.0
        self.since[cls] = now
        self.rate[cls] = rate
        self.maxtol[cls] = 0.0

    def join(self, slot: int, cls: int, nbytes: float, tol: float, now: float) -> None:
        """A flow of ``nbytes`` enters class ``cls`` in ``slot`` now."""
        served_now = self.served[cls] + (now - self.since[cls]) * self.rate[cls]
        vfinish = float(served_now + nbytes)
        self.vfinish[slot] = vfinish
        self.nbytes[slot] = nbytes
        self.tol[slot] = tol
        self.cls[slot] = cls
        self.maxtol[cls] = max(self.maxtol[cls], tol)
        self._joined(slot, cls, vfinish)

    def _joined(self, slot: int, cls: int, vfinish: float) -> None:
        """Hook: a flow joined."""

    def rerate(self, classes: np.ndarray, rates: np.ndarray, now: float) -> None:
        """Classes ``classes`` (distinct, each with a flow) run at ``rates`` from now on."""
        since = self.since[classes]
        self.served[classes] += (now - since) * self.rate[classes]
        self.since[classes] = now
        self.rate[classes] = rates
        self._rerated(classes)

    def set_rate(self, cls: int, rate: float, now: float) -> None:
        """One class runs at ``rate`` from now on."""
        self.served[cls] += (now - self.since[cls]) * self.rate[cls]
        self.since[cls] = now
        self.rate[cls] = rate
        self._rerated(np.array([cls], dtype=np.intp))

    def _rerated(self, classes: np.ndarray) -> None:
        """Hook: classes got new rates."""

    def remaining(self, slots: np.ndarray, now: float) -> np.ndarray:
        """Bytes left to send of the flows in ``slots`` as of ``now`` (may be a crumb below 0)."""
        cls = self.cls[slots]
        return self.vfinish[slots] - (self.served[cls] + (now - self.since[cls]) * self.rate[cls])

    def live_slots(self) -> np.ndarray:
        """Slots holding a flow, ascending."""
        return np.flatnonzero(self.cls)

    def release(self, slots: list[int]) -> None:
        """Free the slots of flows :meth:`finished` returned."""
        self.cls[slots] = 0
        self.tol[slots] = -1.0
        self.nbytes[slots] = 0.0
        self.vfinish[slots] = 0.0

    # -- interface of the implementations ----------------------------------

    def next_finish(self) -> float:
        """The earliest predicted finish over all flows (``inf`` when none)."""
        raise NotImplementedError

    def finished(self, now: float) -> tuple[list[int], list[float]]:
        """The flows done at ``now``, taken out of the queues: their slots (ascending) and remaining
        bytes (the slots stay allocated until :meth:`release`)."""
        raise NotImplementedError


class ScanClocks(FlowClocks):
    """The reference: every query scans every active flow."""

    def next_finish(self) -> float:
        live = self.live_slots()
        if not live.size:
            return math.inf
        cls = self.cls[live]
        return float((self.since[cls] + (self.vfinish[live] - self.served[cls]) / self.rate[cls]).min())

    def finished(self, now: float) -> tuple[list[int], list[float]]:
        live = self.live_slots()
        if not live.size:
            return [], []
        cls = self.cls[live]
        vfinish = self.vfinish[live]
        served_now = self.served + (now - self.since) * self.rate  # per class
        left = vfinish - served_now[cls]
        t_finish = self.since[cls] + (vfinish - self.served[cls]) / self.rate[cls]
        done = (t_finish <= now) | (left <= self.tol[live])
        slots = live[done].tolist()
        lefts = left[done].tolist()
        return slots, lefts


class HeapClocks(FlowClocks):
    """The fast path: per class a heap of its flows by ``vfinish``; per class its next finish."""

    def __init__(self) -> None:
        super().__init__()
        self._heaps: list[list[tuple[float, int]]] = [[]]
        self.vmin = np.full(8, math.inf)  # smallest vfinish in the class (inf: no flow)
        self.next = np.full(8, math.inf)  # predicted finish of that flow
        self._stale: list[int] = []  # classes whose ``next`` needs recomputing

    def add_class(self) -> int:
        cls = super().add_class()
        self._heaps.append([])
        return cls

    def _grew_classes(self, size: int) -> None:
        self.vmin = grown(self.vmin, size, math.inf)
        self.next = grown(self.next, size, math.inf)

    def _joined(self, slot: int, cls: int, vfinish: float) -> None:
        heap = self._heaps[cls]
        heapq.heappush(heap, (vfinish, slot))
        if heap[0][1] == slot:
            self.vmin[cls] = vfinish
        self._stale.append(cls)

    def _rerated(self, classes: np.ndarray) -> None:
        # every re-rated class has a flow and a positive rate: its next finish follows at once
        self.next[classes] = self.since[classes] + (self.vmin[classes] - self.served[classes]) / self.rate[classes]

    def _refresh(self) -> None:
        """Recompute the next finish of the classes whose flows or clock changed."""
        heaps, nxt, served, since, rate = self._heaps, self.next, self.served, self.since, self.rate
        for cls in set(self._stale):
            heap = heaps[cls]
            nxt[cls] = since[cls] + (heap[0][0] - served[cls]) / rate[cls] if heap else math.inf
        self._stale = []

    def next_finish(self) -> float:
        if self._stale:
            self._refresh()
        return float(self.next[: self.n_classes].min())

    def finished(self, now: float) -> tuple[list[int], list[float]]:
        if self._stale:
            self._refresh()
        n = self.n_classes
        served, since, rate = self.served[:n], self.since[:n], self.rate[:n]
        served_now = served + (now - since) * rate
        # a class holds a finished flow only if its first flow by vfinish passes one of the tests
        cand = (self.next[:n] <= now) | (self.vmin[:n] - served_now <= self.maxtol[:n])
        slots: list[int] = []
        lefts: list[float] = []
        tol = self.tol
        for cls in np.flatnonzero(cand).tolist():
            heap = self._heaps[cls]
            s_now, s, t, r, maxtol = (float(served_now[cls]), float(served[cls]), float(since[cls]),
                                      float(rate[cls]), float(self.maxtol[cls]))
            back = []
            while heap:
                vfinish, slot = heap[0]
                left = vfinish - s_now
                t_finish = t + (vfinish - s) / r
                if not (t_finish <= now or left <= maxtol):
                    break  # neither can hold for this flow nor any later one
                heapq.heappop(heap)
                if t_finish <= now or left <= tol[slot]:
                    slots.append(slot)
                    lefts.append(left)
                else:
                    back.append((vfinish, slot))
            for item in back:
                heapq.heappush(heap, item)
            self.vmin[cls] = heap[0][0] if heap else math.inf
            self._stale.append(cls)
        if len(slots) > 1:
            order = sorted(range(len(slots)), key=slots.__getitem__)
            slots = [slots[i] for i in order]
            lefts = [lefts[i] for i in order]
        return slots, lefts
