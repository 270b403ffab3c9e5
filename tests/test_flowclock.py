"""Per-class virtual clocks (:mod:`conduit.sim.flowclock`): the heaps give bit for bit what a scan of
every flow gives, and both send every flow its bytes.

A stateful hypothesis machine drives a :class:`HeapClocks` and a :class:`ScanClocks` through the same
joins, re-rates, clock advances and completion timers, as :class:`~conduit.sim.network.Network`
drives them (a timer fires at the earliest predicted finish, a re-rate touches classes with flows),
and checks after every step that both predict the same next finish and complete the same flows with
the same remaining bytes; and that each completed flow was served its size (the rate history
integrated per flow, the way per-flow remaining-bytes bookkeeping does it) to the completion
tolerance.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from conduit.sim.flowclock import HeapClocks, ScanClocks
from conduit.sim.network import COMPLETION_RTOL

N_CLASSES = 4
EPS = float(np.finfo(float).eps)
sizes = st.one_of(st.sampled_from([1.0, 5.0, 10.0, 37.5, 1e6]), st.floats(0.01, 1e3))
rates = st.one_of(st.sampled_from([1.0, 2.0, 2.5, 10.0]), st.floats(0.1, 100.0))


class ClocksMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.heap, self.scan = HeapClocks(), ScanClocks()
        for clocks in (self.heap, self.scan):
            for _ in range(N_CLASSES):
                clocks.add_class()
        self.now = 0.0
        self.free: list[int] = []
        self.n_slots = 0
        self.members: dict[int, set[int]] = {c: set() for c in range(1, N_CLASSES + 1)}
        self.rate = dict.fromkeys(self.members, 0.0)
        # per flow: [bytes left by per-flow bookkeeping, time it was last advanced, size]
        self.flows: dict[int, list[float]] = {}

    def _slack(self, cls: int, size: float) -> float:
        """Rounding allowed between the clock and per-flow bookkeeping: a few units in the last place
        of the bytes served per flow since the class's epoch (and of the flow's size)."""
        served = float(self.heap.served[cls] + (self.now - self.heap.since[cls]) * self.heap.rate[cls])
        return 64 * EPS * (abs(served) + size)

    def _advance_flows(self, cls: int) -> None:
        for slot in self.members[cls]:
            left, t_last, _size = self.flows[slot]
            self.flows[slot][:2] = [left - (self.now - t_last) * self.rate[cls], self.now]

    @rule(cls=st.integers(1, N_CLASSES), nbytes=sizes, rate=rates)
    def join(self, cls, nbytes, rate):
        if not self.free:
            new = max(8, 2 * self.n_slots)
            for clocks in (self.heap, self.scan):
                clocks.grow_slots(new)
            self.free = list(range(new - 1, self.n_slots - 1, -1))
            self.n_slots = new
        slot = self.free.pop()
        for clocks in (self.heap, self.scan):
            if not self.members[cls]:
                clocks.start_epoch(cls, self.now, rate)
            clocks.join(slot, cls, nbytes, COMPLETION_RTOL * nbytes, self.now)
        if not self.members[cls]:
            self.rate[cls] = rate
        self.members[cls].add(slot)
        self.flows[slot] = [nbytes, self.now, nbytes]

    @rule(data=st.data())
    def rerate(self, data):
        busy = sorted(c for c, m in self.members.items() if m)
        if not busy:
            return
        classes = data.draw(st.lists(st.sampled_from(busy), min_size=1, unique=True))
        new = [data.draw(rates) for _ in classes]
        for clocks in (self.heap, self.scan):
            clocks.rerate(np.array(classes, dtype=np.intp), np.array(new), self.now)
        for cls, rate in zip(classes, new):
            self._advance_flows(cls)
            self.rate[cls] = rate

    @rule(fraction=st.sampled_from([0.0, 0.25, 0.5, 0.999, 1.0]))
    def wait(self, fraction):
        """Time passes, at most to the next predicted finish (the network's timer)."""
        t_next = self.heap.next_finish()
        if t_next < math.inf:
            self.now = max(self.now, self.now + fraction * (t_next - self.now))

    @precondition(lambda self: self.flows)
    @rule()
    def timer(self):
        """The completion timer fires at the earliest predicted finish."""
        self.now = max(self.now, self.heap.next_finish())
        done = self.heap.finished(self.now)
        assert done == self.scan.finished(self.now)
        slots, lefts = done
        assert slots, "a timer at the earliest finish completes a flow"
        for slot, left in zip(slots, lefts):
            cls = int(self.heap.cls[slot])
            old_left, t_last, size = self.flows.pop(slot)
            by_flow = old_left - (self.now - t_last) * self.rate[cls]
            slack = self._slack(cls, size)
            assert abs(by_flow - left) <= slack  # the same bytes left
            # done, to the completion tolerance (and the rounding of the finish time to a float)
            assert by_flow <= COMPLETION_RTOL * size + slack + 4 * EPS * self.now * self.rate[cls]
            self.members[cls].discard(slot)
        for clocks in (self.heap, self.scan):
            clocks.release(slots)
        self.free.extend(reversed(slots))

    @invariant()
    def same_next_finish_and_bytes_left(self):
        assert self.heap.next_finish() == self.scan.next_finish()
        live = self.heap.live_slots()
        assert live.tolist() == self.scan.live_slots().tolist() == sorted(self.flows)
        assert self.heap.remaining(live, self.now).tolist() == self.scan.remaining(live, self.now).tolist()
        for slot, left in zip(live.tolist(), self.heap.remaining(live, self.now).tolist()):
            old_left, t_last, size = self.flows[slot]
            cls = int(self.heap.cls[slot])
            assert abs(old_left - (self.now - t_last) * self.rate[cls] - left) <= self._slack(cls, size)


TestClocks = ClocksMachine.TestCase
TestClocks.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
