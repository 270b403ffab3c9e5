"""What a piece of work costs after its thread slept: the warm-up debt.

Every compute figure the models read is timed back to back, with the thread's caches, TLB and branch history
hot. A training loop does not run its threads that way. DQN's EnvRunner sleeps about 16 ms of every round,
while the driver adds, samples, updates and syncs; the driver sleeps while it waits for the sample call; each of
the driver's primitives runs once a round. On the 2-core VM (2026-12-07, AMD EPYC host; ``benchmarks/wake_debt.py``)
an RLlib EnvRunner's ``sample()`` costs 1.0 ms of thread CPU back to back and 2.3 ms right after a 16 ms sleep, in
one process with nothing else running, and the work after it stays dearer for a few more milliseconds. With a
spinner keeping the core busy during the sleep the growth is the same: the thread's own state goes cold, not an
idle core. It grows with the work's code and data (a tight Python loop: +0.1 ms; the EnvRunner's sample: +1.2 to
+3 ms), so each primitive has its own figure.

The model (:class:`ColdWorkCosts`, a mixin of :class:`~conduit.sim.engine.Simulation`): a primitive of kind *k*
that a process starts at ``t`` costs its back-to-back figure plus ``share(t - end of the process's previous k) *
wake_k``, where ``share`` is the :class:`~conduit.sim.raycalls.ColdRamp` through section ``wake`` of
``benchmarks/stock_primitives.py`` (``wake_warm_within``, ``wake_cold_after``: the EnvRunner's sample call after
sleeps of 1-20 ms) and ``wake_k`` that section's figure for *k* right after a 20 ms sleep
(:class:`~conduit.sim.params.StockCosts`: ``wake_runner_call``, ``wake_set_state``, ``wake_get_state``,
``wake_replay_add``, ``wake_replay_sample``, ``wake_update``). A process never seen doing *k* pays all of it.

Each figure is its primitive timed alone after the sleep, so the model charges every primitive of a round as if
it ran first after its thread's sleep: in the real round the EnvRunner's ``set_state`` runs just before its
``sample()``, and the driver's update follows its buffer's sample. Charged where DQN runs those primitives,
stock and deployed (:mod:`conduit.sim.dqn`, :mod:`conduit.sim.deployed`); a learner's update only on a CPU
learner (a GPU update's debt is not measured). Other algorithms run the same kinds of work in pieces of tens of
milliseconds to seconds, back to back, where a debt of 1-3 ms once per call is lost in the figures' noise; they
are not charged. The built-in costs carry section ``wake`` of ``benchmarks/stock_primitives.2core-vm.json``
(merged 2026-12-07 13:25; :class:`~conduit.sim.params.StockCosts` restates it); a validation window measured before
the section has none (all 0: no debt).
"""

from __future__ import annotations

from collections.abc import Hashable

from conduit.sim.raycalls import ColdRamp

#: the kinds of work with a warm-up debt: the StockCosts field of each is ``wake_<kind>``
KINDS = ("runner_call", "set_state", "get_state", "replay_add", "replay_sample", "update")


class ColdWorkCosts:
    """The debt charged: a mixin of :class:`~conduit.sim.engine.Simulation` (which sets ``stock`` and ``env`` and
    calls :meth:`start_cold_work`)."""

    def start_cold_work(self) -> None:
        s = self.stock
        self.wake_ramp = ColdRamp(s.wake_warm_within, s.wake_cold_after)
        self._wake = {kind: getattr(s, f"wake_{kind}") for kind in KINDS}
        #: (process, kind) -> when the process's last piece of that kind ends
        self._work_ends: dict[tuple[Hashable, str], float] = {}

    def cold_work(self, process: Hashable, kind: str, seconds: float = 0.0) -> float:
        """The debt a piece of ``kind`` that ``process`` starts now pays on top of its back-to-back ``seconds``
        (0 with no debt); the piece is taken to end ``seconds`` plus that debt from now (work that queues for a
        core ends later, and the next piece's idle interval reads that much longer)."""
        extra = self._wake[kind]
        if extra <= 0.0 or not self.wake_ramp.active:
            return 0.0
        now = self.env.now
        key = (process, kind)
        last = self._work_ends.get(key)
        share = 1.0 if last is None else self.wake_ramp.share(now - last)
        debt = share * extra
        self._work_ends[key] = now + seconds + debt
        return debt
