"""What a Ray call costs after its caller or its callee sat without one: the cold-call surcharge.

Every Ray figure the models read (``rpc_*`` of :class:`~conduit.sim.params.StockCosts`, the plane actor's
``call_round_trip``, ``actor_callee_cpu``, ``replay_draw_*``, ``priorities_*``) is timed over calls issued
back to back. A training loop does not call that way: DQN calls its EnvRunner and the plane once per update,
PPO each EnvRunner once per fragment. Measured on the 2-core VM (``benchmarks/call_gap.py``), an empty actor
call issued 10 ms or more after the previous one costs about 2-3x one issued back to back, in round trip, in
the caller's CPU and in the callee's. The same file's windows place the cost:

* it is **per process**, not per core: with both cores kept busy by other processes the spaced call costs the
  same (so it is Ray's threads of the two processes going to sleep and their caches going cold, not an idle
  CPU's wake-up);
* a process **computing** between its calls pays it as one sleeping does;
* the interval counts from the **start** of the process's previous call: a call issued right after a 10 ms
  call returned pays most of it;
* the caller's and the callee's parts add up: a caller calling back to back round robin over 8 actors (each
  callee idle about 7 calls' time) pays the callee's part only.

The law (:class:`ColdRamp`, :class:`CallClock`, charged by :class:`ColdCallCosts`): a call started at ``t`` by process *c* to process *e* costs

* the caller's CPU ``rpc_driver_cpu + share(t - last start of c) * cold_caller_cpu``;
* the callee's CPU its back-to-back figure ``+ share(t - last start of e) * cold_callee_cpu`` (per kind: an
  RLlib actor's ``apply``, a plane control call, a replay draw, a priority update);
* a latency ``share(t - last start of e) * cold_trip`` besides: whatever of the spaced round trip's growth
  the two CPU parts do not account for (0 where they do).

``share`` is 0 for an interval up to ``warm_within`` (the back-to-back interval), 1 from ``cold_after`` on,
and linear between: the ramp through ``benchmarks/stock_primitives.py``'s gap curve (``rpc_gap_curve``: the
round trip per sleep between calls, each against the start-to-start interval it gives). Every figure is
a microbenchmark's: the built-in costs carry section ``gap`` of ``benchmarks/stock_primitives.2core-vm.json``
and the ``plane_*_cold`` figures of ``benchmarks/plane_primitives.2core-vm.json``. With none (``cold_after == 0``: a
cost file that sets it so, or a validation window measured before the section) every call costs its back-to-back
figure, as before this law.

A process is named by what the simulation calls it: ``"driver"``, ``("runner", id)``, ``("learner", id)``,
``("plane", node)``, ``("aggregator", id)``.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from conduit.ramp import linear_ramp


@dataclass(frozen=True)
class ColdRamp:
    """The share of the cold-call surcharge a process pays ``interval`` seconds after its previous call
    started: 0 up to ``warm_within``, 1 from ``cold_after`` on, linear between (``cold_after == 0``: never)."""

    warm_within: float = 0.0
    cold_after: float = 0.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.warm_within <= self.cold_after or self.cold_after == 0.0):
            raise ValueError(f"a cold ramp needs 0 <= warm_within <= cold_after, got {self.warm_within!r} and "
                             f"{self.cold_after!r}")

    @property
    def active(self) -> bool:
        return self.cold_after > 0.0

    def share(self, interval: float) -> float:
        return linear_ramp(interval, self.warm_within, self.cold_after) if self.cold_after > 0.0 else 0.0


class CallClock:
    """When each process last started a Ray call (as caller or callee), and the share of the cold-call
    surcharge a call started now pays on either side. A process never seen before is cold (its first call
    follows its start-up)."""

    def __init__(self, ramp: ColdRamp):
        self.ramp = ramp
        self._last: dict[Hashable, float] = {}

    def share(self, process: Hashable, now: float) -> float:
        """The share for ``process`` of a call starting at ``now``, without marking it."""
        if not self.ramp.active:
            return 0.0
        last = self._last.get(process)
        return 1.0 if last is None else self.ramp.share(now - last)

    def start(self, caller: Hashable, callee: Hashable, now: float) -> tuple[float, float]:
        """A call from ``caller`` to ``callee`` starts at ``now``: ``(caller's share, callee's share)``, and
        both are marked as having started a call then."""
        if not self.ramp.active:
            return 0.0, 0.0
        shares = self.share(caller, now), self.share(callee, now)
        self._last[caller] = max(now, self._last.get(caller, now))
        self._last[callee] = max(now, self._last.get(callee, now))
        return shares


class ColdCallCosts:
    """The law charged: a mixin of :class:`~conduit.sim.engine.Simulation` (which sets ``stock``, ``plane``,
    ``env``, ``workload`` and :meth:`start_cold_law`). Each method starts one call on the :class:`CallClock`
    and returns its figures with that call's shares applied; with no law they are the back-to-back ones."""

    def start_cold_law(self) -> None:
        s = self.stock
        self.calls = CallClock(ColdRamp(s.rpc_warm_within, s.rpc_cold_after))
        #: the spaced round trip's growth the caller's and the callee's CPU do not account for: latency
        self.cold_trip = max(0.0, s.rpc_cold_round_trip - s.rpc_cold_caller_cpu - s.rpc_cold_callee_cpu)
        p = self.plane
        self.plane_cold_trip = (0.0 if p is None else
                                max(0.0, p.cold_call_round_trip - s.rpc_cold_caller_cpu - p.cold_callee_cpu))
        #: runner id -> (caller's share, callee's share) of its sample() call in flight, for the reply
        self.sample_call_shares: dict[str, tuple[float, float]] = {}
        #: learner id -> the learner's share of the LearnerGroup.update call in flight to it
        self.update_call_shares: dict[str, float] = {}

    def learner_process(self, lr: Any) -> Hashable:
        """The process a learner's calls come from: the driver's for a local learner (``num_learners=0``)."""
        return "driver" if self.workload.local_learner else ("learner", lr.id)

    def start_call(self, caller: Hashable, callee: Hashable) -> tuple[float, float]:
        """A call from ``caller`` to ``callee`` starts now: ``(caller's share, callee's share)``."""
        return self.calls.start(caller, callee, self.env.now)

    def caller_cpu(self, share: float, calls: int = 1, spacing: float = 0.0) -> float:
        """The caller's CPU for an actor call (``rpc_driver_cpu``), cold by ``share``. ``calls`` > 1: a folded role
        standing for several (:mod:`conduit.sim.fold`), whose calls the unfolded caller makes one after another,
        ``spacing`` seconds apart (its own work per call): the first is cold by ``share``, each other one by the
        ramp's share of ``spacing`` (0 for calls issued back to back)."""
        s = self.stock
        shares = share + (calls - 1) * self.calls.ramp.share(spacing)
        return calls * s.rpc_driver_cpu + shares * s.rpc_cold_caller_cpu

    def callee_cpu(self, share: float) -> float:
        """An RLlib actor's CPU for serving a ``foreach_actor`` call (``rpc_callee_cpu``), cold by ``share``."""
        s = self.stock
        return s.rpc_callee_cpu + share * s.rpc_cold_callee_cpu

    def reply_trip(self, share: float) -> float:
        """An actor call's latency less the caller's CPU (``rpc_overhead - rpc_driver_cpu``), its callee cold by
        ``share``."""
        s = self.stock
        return max(0.0, s.rpc_overhead - s.rpc_driver_cpu) + share * self.cold_trip

    def start_sample_call(self, runner: Any) -> float:
        """The driver's ``sample()`` call reaches ``runner`` now: its shares are kept for the reply
        (:meth:`sample_reply`); returns the runner's CPU for serving the call."""
        shares = self.sample_call_shares[runner.id] = self.start_call("driver", ("runner", runner.id))
        return self.callee_cpu(shares[1])

    def sample_reply(self, runner: Any, calls: int = 1) -> tuple[float, float]:
        """``(latency, the driver's CPU)`` of the reply to ``runner``'s ``sample()`` call in flight (``calls``: the
        runners a folded one stands for, :meth:`caller_cpu`)."""
        caller, callee = self.sample_call_shares.pop(runner.id, (0.0, 0.0))
        return self.reply_trip(callee), self.caller_cpu(caller, calls)
