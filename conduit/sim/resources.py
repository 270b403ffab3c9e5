"""Contended resources besides the network: CPU cores, GPU compute engines and memory tiers.

* :class:`CpuPool` — a node's cores. Serialization, deserialization, deep copies and per-sample
  batch building take *core-seconds*; a piece of work holds one core for its duration, so work on a
  busy node queues (FIFO). Busy core-seconds are recorded per node.
* :class:`ComputeEngine` — a GPU (or the CPU learner) executing kernels one at a time: updates,
  value passes, device-side batch assembly.
* :class:`ThreadLane` — one Python thread: a :class:`FifoServer` of one on a crowded node, arithmetic
  elsewhere.
* :class:`FifoServer` — the FIFO multi-server both are built on: ``simpy.Resource`` semantics without
  its request/release events.
* :class:`TierLedger` — capacity accounting of every memory tier. A reservation that does not fit
  either waits (``reserve``) until space is released or is refused (``try_reserve``); occupancy never
  exceeds capacity, and every change is sampled into an occupancy trace.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator, Hashable
from typing import Any

import simpy

from conduit.errors import ConduitError
from conduit.topology import Topology


def _processed_event(env: simpy.Environment) -> simpy.Event:
    """An event that has already happened: a process that yields it goes on in the same step.

    Shared by every caller that gets it, so nobody may add callbacks to it or trigger it.
    """
    event = simpy.Event(env)
    event._ok = True
    event._value = None
    event.callbacks = None  # processed
    return event


class FifoServer:
    """``capacity`` identical servers with one FIFO queue: SimPy's ``Resource`` semantics, lighter.

    A ``Resource`` request/release pair costs a request event, a release event and the bookkeeping
    of both, even when a server is free. Here work that finds a free server starts at once (one
    timeout event for :meth:`hold`, no event at all for :meth:`acquire`); work that finds every
    server busy waits in FIFO order, and whoever frees a server hands it to the head of the queue,
    as ``Resource.release`` does, so the waiter starts at the same instant. Timing is that of a
    ``Resource``; only the order of same-instant steps differs (a granted request no longer goes
    through the event queue). Work is never interrupted (nothing in the simulator interrupts a
    process).
    """

    __slots__ = ("_granted", "busy", "capacity", "env", "queue")

    def __init__(self, env: simpy.Environment, capacity: int):
        self.env = env
        self.capacity = capacity
        self.busy = 0  # servers taken (running or just handed to a waiter)
        self.queue: deque[simpy.Event] = deque()
        self._granted = _processed_event(env)

    def acquire(self, first: bool = False) -> simpy.Event:
        """An event to yield that succeeds once a server is this caller's (already, if one is free);
        ``first``: waiting at the head of the queue."""
        if self.busy < self.capacity:
            self.busy += 1
            return self._granted
        turn = self.env.event()
        if first:
            self.queue.appendleft(turn)
        else:
            self.queue.append(turn)
        return turn  # the server is handed over with the event: busy is unchanged

    def release(self) -> None:
        """Free a server: the head of the queue gets it now, else it goes idle."""
        if self.queue:
            self.queue.popleft().succeed()
        else:
            self.busy -= 1

    def hold(self, seconds: float) -> Generator[Any, Any, None]:
        """Take a server (waiting FIFO if all are busy), keep it ``seconds``, hand it on."""
        if self.busy < self.capacity:
            self.busy += 1
        else:
            turn = self.env.event()
            self.queue.append(turn)
            yield turn
        yield self.env.timeout(seconds)
        if self.queue:
            self.queue.popleft().succeed()
        else:
            self.busy -= 1


#: the priorities of work on a preemptive :class:`CpuPool` (its class doc: who runs first)
ORDINARY, WOKEN, DRIVER = 0, 1, 2


class _Hold:
    """One piece of work on a core of a :class:`CpuPool` that tracks who runs (see ``preemptive``)."""

    __slots__ = ("owed", "paused", "paused_since", "priority", "resume")

    def __init__(self, priority: int):
        self.priority = priority
        self.owed = 0.0  # seconds preempting work took from this one's core (pauses that ended)
        self.paused = False  # preempting work runs on its core now
        self.paused_since = 0.0
        self.resume: simpy.Event | None = None  # its own time is up, it waits for the pause to end

    def pause(self, now: float) -> None:
        self.paused, self.paused_since = True, now

    def unpause(self, now: float) -> None:
        """The pause ends (the preempting work is done, or this piece moved to a free core): it owes its length."""
        self.paused = False
        self.owed += now - self.paused_since
        if self.resume is not None:
            self.resume.succeed()
            self.resume = None


class _Preemption:
    """Preempting work running on a paused piece's core (see ``preemptive``): until it ends, or until another core
    frees and the paused piece moves there (``moved``: the preempting work then holds a core of its own)."""

    __slots__ = ("moved", "victim")

    def __init__(self, victim: _Hold):
        self.victim = victim
        self.moved = False


class CpuPool:
    """The cores of one node: FIFO servers, with busy-time accounting.

    **Who runs first** (``preemptive``, off unless the simulation turns it on for a crowded node:
    :meth:`enable_preemption`). Each piece of work has a priority, the kernel's view of its thread:

    * ``DRIVER`` (``urgent``): a thread of the driver's process. Ray starts every worker process (EnvRunners,
      learner actors, the plane actor) at nice 15 and leaves the driver at 0 (``src/ray/common/
      ray_config_def.h: worker_niceness``, 15, "so that the OS prioritizes CPU for other processes over
      worker"): at weights 1024 against 36 the driver's threads (its own, a local learner's update and torch
      team) get a core whenever they want one. APPO's never-sleeping driver loop is one of them
      (``benchmarks/appo_driver_loop.py``; on ``appo-cartpole-2r-1l`` the driver's thread waited 0.04 of a
      core for 0.81 on a CPU, each EnvRunner 0.56 for 0.42, from ``/proc/<pid>/task/<tid>/schedstat``).
    * ``WOKEN``: a worker's thread that just woke (``woken``: an idle APPO learner's poll; and, with
      ``wake_slice`` set, the first slice of any piece of ordinary work: see below). Among threads of equal
      nice a woken one has used less than its share and preempts a running one.
    * ``ORDINARY``: everything else, first in, first out.

    Work with a priority that finds every core busy starts at once on the core of the longest-running piece
    of lower priority not paused already, which is paused for as long (it ends that much later); when no
    such piece runs it waits at the head of the queue for the next free core. A queued piece runs from the instant
    a core is handed to it, so work of higher priority that comes in that same instant preempts it like any running
    piece (a driver's thread that holds a core in back-to-back quanta, a torch team's spin, keeps it: the kernel
    never took it away). A paused piece is runnable:
    when a core frees while it waits and no other work is queued, it moves there at once (the kernel's idle
    balancing pulls a waiting thread to an idle CPU): it loses only the time it was paused; the preempting
    work keeps the core it took.

    **Work on an over-subscribed node costs more** (``oversubscribed_cost``, the topology CPU's
    ``oversubscribed_cpu_cost``, default 1: no extra). A thread that shares its core with another pays
    more CPU for the same work than it does alone: the other thread evicts its caches and branch
    history, and every switch costs the kernel's own work (``conduit.runtime.contention``: an RLlib
    EnvRunner's CPU per env step, and a learner-like update's, beside as many busy learner-like
    processes as cores; on the 2-core VM 1.02-1.27x per kind of work, 1.081 pooled over 128 pairs,
    against 0.98-1.09x with a core still free). The workload's own compute (``compute``:
    sampling, a CPU learner's update; the kinds of work that microbenchmark times) that arrives while
    every core is taken (it waits, or preempts) is charged ``oversubscribed_cost`` times its seconds;
    compute that finds a core free is not, and neither is the data path's work (copies,
    serialisation: not measured under contention, so not extrapolated to). Crowded nodes hold
    compute in quanta (:mod:`conduit.sim.cores`), so a long call pays the extra for the quanta it
    runs while the node is crowded.

    **A poller on the node costs its neighbours more** (``poll_cost``, ``StockCosts.poll_neighbour_cost``;
    :meth:`polling`). A thread that wakes thousands of times a second (an idle APPO learner's, polling its
    empty ``CircularBuffer`` every 0.1 ms) preempts whatever runs on a core at every wake, and the thread
    it preempts pays for the switch and its caches on top of over-subscription's cost
    (:mod:`conduit.runtime.learner_poll`). While at least one poller polls, compute that arrives with
    every core taken is charged ``poll_cost`` times more as well.

    **A worker's thread that wakes gets a core at once, for a slice** (``wake_latency``, ``wake_slice``: the
    topology CPU's ``wake_latency`` and ``wake_slice_time``, measured by :mod:`conduit.runtime.wakeup`; off
    while ``wake_slice`` is 0). The data path's short pieces of work (a call's sender side, the plane actor's
    handling of it, a learner's connector on a batch that just came) run on threads that slept until their
    input came. A fair-share kernel does not queue such a thread behind the running ones' slices: it has used
    less than its share, so it preempts one of equal nice (EEVDF, Linux >= 6.6; on the 2-core VM beside two
    busy processes a woken thread ran after 0.05-0.08 ms and kept the core 3.4-3.6 ms, median). So on a
    preemptive pool with every core taken, ordinary work that is not ``compute`` waits ``wake_latency`` and
    then runs as ``WOKEN`` work for up to ``wake_slice`` seconds; what is left of it queues first in, first
    out. The workload's compute (sampling, a remote CPU learner's update) runs in back-to-back quanta of a
    thread that keeps its core busy, so it keeps no such credit and queues; a piece of the same thread that
    follows its compute at once runs on for what is left of the compute's turn (:meth:`_wake_credit`).
    """

    def __init__(self, env: simpy.Environment, node: str, cores: int, speed: float = 1.0,
                 oversubscribed_cost: float = 1.0, wake_latency: float = 0.0, wake_slice: float = 0.0):
        if not oversubscribed_cost >= 1.0:
            raise ValueError(f"{node}: oversubscribed_cost must be >= 1, got {oversubscribed_cost!r}")
        for name, value in (("wake_latency", wake_latency), ("wake_slice", wake_slice)):
            if not (value >= 0.0 and math.isfinite(value)):
                raise ValueError(f"{node}: {name} must be a finite number of seconds >= 0, got {value!r}")
        self.wake_latency, self.wake_slice = wake_latency, wake_slice
        self._threads: dict[Hashable, tuple[float, float]] = {}  # thread -> (when its last piece ended, slice left)
        #: the turn compute is held in on this pool (:mod:`conduit.sim.cores`: ``SAMPLING_QUANTUM``); a thread's
        #: piece right after a shorter piece of its compute continues on for the rest of the turn
        self.quantum = 0.0
        self.env = env
        self.node = node
        self.cores = cores
        self.speed = speed
        self.oversubscribed_cost = oversubscribed_cost
        self._server = FifoServer(env, cores)
        self.busy_core_seconds = 0.0
        self._running: dict[_Hold, None] | None = None  # preemptive pools: running work, oldest first
        self._preempted: deque[_Preemption] = deque()  # preemptive pools: paused pieces waiting for their core
        self._queued: dict[simpy.Event, _Hold] = {}  # preemptive pools: a queued piece's turn -> the piece
        self._arrivals: list[simpy.Event] = []  # preemptive pools: who waits for work to arrive at an idle pool
        self.poll_cost = 1.0
        self._pollers = 0  # pollers polling now (:meth:`polling`)
        self._foreground = 0  # pieces of work not a background load's, running or waiting (:attr:`wanted`)

    @property
    def preemptive(self) -> bool:
        return self._running is not None

    def enable_preemption(self) -> None:
        """Track running work so that work with a priority can preempt it; call before any work starts."""
        if self._running is None:
            if self._server.busy:
                raise RuntimeError(f"{self.node}: preemption must be enabled before work starts on its cores")
            self._running = {}

    def polling(self, on: bool) -> None:
        """A poller on this node starts (``on``) or stops polling (class doc, ``poll_cost``)."""
        self._pollers += 1 if on else -1
        if self._pollers < 0:
            raise RuntimeError(f"{self.node}: a poller stopped that had not started")

    @property
    def wanted(self) -> bool:
        """Some work other than a background load's runs or waits here (:meth:`work`, ``background``)."""
        return self._foreground > 0

    def work_arrives(self) -> simpy.Event:
        """An event that succeeds when work other than a background load's next arrives at this
        (preemptive) pool. A background load that only matters when it competes (APPO's spinning driver
        loop, an idle APPO learner's poll) waits on it while nothing else is :attr:`wanted`, instead of
        keeping the event queue alive: a run whose other processes all wait on something that never comes
        still ends, and is reported as stalled (two background loads never keep each other going)."""
        if self._running is None:
            raise RuntimeError(f"{self.node}: work_arrives on a pool without preemption")
        event = self.env.event()
        self._arrivals.append(event)
        return event

    def work(self, core_seconds: float, urgent: bool = False, compute: bool = False,
             background: bool = False, woken: bool = False, thread: Hashable | None = None) -> Generator[Any, Any, None]:
        """Run ``core_seconds`` of reference-core work on one core of this node (class doc: ``urgent``, the
        driver process's, runs first; ``woken``, a woken worker thread's, next; both only on a preemptive
        pool; ``compute``: the workload's own compute, sampling or a CPU learner's update, which pays
        ``oversubscribed_cost`` while every core is taken; ``background``: a poll's, which does not count as
        :attr:`wanted`; ``thread``: the thread it runs on, which woke for it unless its previous piece
        ended at this instant: see :meth:`_wake_credit`)."""
        if core_seconds <= 0:
            return
        seconds = core_seconds / self.speed
        if compute and self._server.busy >= self._server.capacity:  # every core taken: this work shares one
            seconds *= self.oversubscribed_cost * (self.poll_cost if self._pollers else 1.0)  # (class doc)
        priority = DRIVER if urgent else WOKEN if woken else ORDINARY
        if self._running is None:  # no preemption (most pools): nothing to track
            if priority:
                raise RuntimeError(f"{self.node}: {'urgent' if urgent else 'woken'} work on a pool without preemption")
            yield from self._server.hold(seconds)
            self.busy_core_seconds += seconds
            return
        if background:  # a quantum that found no core to take is not run (:meth:`_tracked`): the poller,
            if (yield from self._tracked(seconds, priority, background=True)):  # runnable, waits it out
                self.busy_core_seconds += seconds
            else:
                yield self.env.timeout(seconds)
            return
        self._foreground += 1
        if self._arrivals:
            arrivals, self._arrivals = self._arrivals, []
            for event in arrivals:
                event.succeed()
        try:
            if self.wake_slice > 0 and not (priority or compute):  # (class doc: a worker's thread that wakes)
                credit, woke = self._wake_credit(thread)
                if credit > 0 and self._server.busy >= self._server.capacity:
                    yield from self._woken(seconds, credit, woke)
                else:
                    yield from self._tracked(seconds, ORDINARY)
                if thread is not None:
                    self._threads[thread] = (self.env.now, max(0.0, credit - seconds))
            else:
                yield from self._tracked(seconds, priority)
                if compute and thread is not None and self.wake_slice > 0:  # what is left of its turn
                    self._threads[thread] = (self.env.now, max(0.0, self.quantum - seconds))
        finally:
            self._foreground -= 1
        self.busy_core_seconds += seconds

    def _wake_credit(self, thread: Hashable | None) -> tuple[float, bool]:
        """``(seconds this thread's next piece may run as WOKEN work, whether the thread woke for it)``. A piece
        that starts when the same thread's previous one ended (no wait between: one stretch of the thread's
        running) continues it: after ordinary work, with what is left of that piece's slice; after compute,
        which runs in turns of :attr:`quantum`, with what is left of its turn (a last, shorter piece of
        sampling leaves the rest for the serialisation that follows it on the same thread: it runs on, it
        does not queue behind the node's other turns; a whole turn leaves nothing). Any other piece is a
        fresh wake with a whole ``wake_slice``. Work not tied to a thread (``None``) always wakes."""
        if thread is not None:
            last = self._threads.get(thread)
            if last is not None and last[0] == self.env.now:
                return last[1], False
        return self.wake_slice, True

    def _woken(self, seconds: float, credit: float, woke: bool) -> Generator[Any, Any, None]:
        """Work of a worker's thread with ``credit`` seconds of its slice while every core is taken (class
        doc): after ``wake_latency`` (when it ``woke`` for this piece) it runs as ``WOKEN`` work for up to
        ``credit`` seconds (ordinary work if a core freed meanwhile); the rest queues."""
        if woke and self.wake_latency > 0:
            yield self.env.timeout(self.wake_latency)
        first = min(seconds, credit)
        yield from self._tracked(first, WOKEN if self._server.busy >= self._server.capacity else ORDINARY)
        if seconds > first:
            yield from self._tracked(seconds - first, ORDINARY)

    def _tracked(self, seconds: float, priority: int, background: bool = False) -> Generator[Any, Any, bool]:
        """Run the work (class doc); returns whether it ran. A background load's quantum that finds no core
        running work of lower priority not paused does not queue for one: it is not run (a poll that missed
        its turn does not catch up; :meth:`work` lets its time pass, so a loop that polls a whole core still
        moves on), so background loads never starve the node's other work, however many share it (two idle
        learners' polls and the driver's loop on one core want more than the core)."""
        running, server = self._running, self._server
        if priority and server.busy >= server.capacity:
            victim = next((h for h in running if h.priority < priority and not h.paused), None)
            if victim is None and background:
                return False
            if victim is not None:  # preempt it: this work runs now on its core, it ends later by as much
                victim.pause(self.env.now)
                preemption = _Preemption(victim)
                self._preempted.append(preemption)
                yield self.env.timeout(seconds)
                if preemption.moved:  # the victim went to a core that freed: this work held a core of its own
                    self._free_a_core()
                else:
                    victim.unpause(self.env.now)
                    self._preempted.remove(preemption)
                return True
        hold = _Hold(priority)
        turn = server.acquire(first=priority > 0)
        if not turn.processed:  # queued: it runs from the instant a core is handed to it (:meth:`_free_a_core`)
            self._queued[turn] = hold
        yield turn
        running[hold] = None
        yield self.env.timeout(seconds)
        while hold.paused or hold.owed > 0:  # preempted meanwhile: the time it lost
            if hold.paused:  # its time ran out while paused: it waits for the pause to end, and the
                waited = self.env.now  # part of the pause spent waiting is owed no more
                hold.resume = self.env.event()
                yield hold.resume
                hold.owed = max(0.0, hold.owed - (self.env.now - waited))
            else:
                owed, hold.owed = hold.owed, 0.0
                yield self.env.timeout(owed)
        del running[hold]
        self._free_a_core()
        return True

    def _free_a_core(self) -> None:
        """A core frees: queued work gets it (FIFO), else the longest-paused piece moves there (class doc)."""
        server = self._server
        if server.queue:  # the head of the queue runs from now: work of higher priority that comes at this
            self._running[self._queued.pop(server.queue[0])] = None  # instant preempts it, as any running
            server.release()  # piece (its process resumes later in the instant)
            return
        if not self._preempted:
            server.release()
            return
        preemption = self._preempted.popleft()
        preemption.moved = True
        preemption.victim.unpause(self.env.now)  # its pause ends now, not when the preempting work ends


class ComputeEngine:
    """A device that runs one kernel at a time (FIFO)."""

    def __init__(self, env: simpy.Environment, device: str):
        self.env = env
        self.device = device
        self._server = FifoServer(env, 1)
        self.busy_seconds = 0.0

    def run(self, seconds: float) -> Generator[Any, Any, None]:
        if seconds <= 0:
            return
        yield from self._server.hold(seconds)
        self.busy_seconds += seconds


class CapacityError(ConduitError):
    """A reservation that can never fit its tier."""


class TierLedger:
    """Bytes used per tier, never above capacity; waiting reservations are served FIFO per tier."""

    def __init__(self, env: simpy.Environment, topology: Topology, trace_every: float = 0.0):
        self.env = env
        self.capacity = {t.id: float(t.capacity) for t in topology.tiers}
        self.used = dict.fromkeys(self.capacity, 0.0)
        self.peak = dict.fromkeys(self.capacity, 0.0)
        self._waiters: dict[str, deque[tuple[float, simpy.Event]]] = {}
        self.trace: list[tuple[float, str, float]] = []
        # What reserve() returns when the bytes fit at once: an event already processed, so a
        # process that yields it goes on in the same step (no zero-delay event, no queueing
        # behind the rest of the instant).
        self._granted = _processed_event(env)

    def fits(self, tier: str, nbytes: float) -> bool:
        return self.used[tier] + nbytes <= self.capacity[tier]

    def try_reserve(self, tier: str, nbytes: float) -> bool:
        used = self.used[tier] + nbytes
        if used > self.capacity[tier] or self._waiters.get(tier):
            return False
        self.used[tier] = used
        self.peak[tier] = max(self.peak[tier], used)
        self.trace.append((self.env.now, tier, used))
        return True

    def reserve(self, tier: str, nbytes: float) -> simpy.Event:
        """An event that succeeds once ``nbytes`` are reserved in ``tier`` (maybe after waiting).

        When they fit at once the event is already processed (shared, do not add callbacks): a
        process yielding it continues immediately."""
        if nbytes > self.capacity[tier]:
            raise CapacityError(f"{nbytes:.0f} bytes can never fit tier {tier!r} ({self.capacity[tier]:.0f} bytes)")
        if self.try_reserve(tier, nbytes):
            return self._granted
        event = self.env.event()
        self._waiters.setdefault(tier, deque()).append((nbytes, event))
        return event

    def release(self, tier: str, nbytes: float) -> None:
        used = self.used[tier] - nbytes
        if used < 1e-6 * max(1.0, nbytes):
            used = max(0.0, used)
        self.used[tier] = used
        self.trace.append((self.env.now, tier, used))
        queue = self._waiters.get(tier)
        while queue and self.fits(tier, queue[0][0]):
            nbytes_w, event = queue.popleft()
            self._take(tier, nbytes_w)
            event.succeed()

    def _take(self, tier: str, nbytes: float) -> None:
        used = self.used[tier] = self.used[tier] + nbytes
        self.peak[tier] = max(self.peak[tier], used)
        self.trace.append((self.env.now, tier, used))


class ThreadLane:
    """One Python thread (an EnvRunner's, a learner's, a plane actor's, the driver's) on ``node``: a FIFO
    server held through events (``fifo``) on an oversubscribed node, else served by arithmetic
    (``free_at``: start at ``max(arrival, free)``, exact for calls in issue order, since on a node with a
    core per thread the thread never waits for a core)."""

    __slots__ = ("fifo", "free_at", "node")

    def __init__(self, node: str, fifo: FifoServer | None = None):
        self.node, self.fifo, self.free_at = node, fifo, 0.0

    def reserve(self, t_arrive: float, busy: float) -> float:
        """Hold the thread from ``max(t_arrive, free)`` for ``busy`` seconds; returns the end."""
        self.free_at = max(t_arrive, self.free_at) + busy
        return self.free_at

    def serve(self, t_arrive: float, seconds: float, cpu: Any) -> float:
        """Start at ``max(t_arrive, free)``, run ``seconds`` of reference-core work (its core-seconds
        counted now); returns the end."""
        busy = seconds / cpu.speed
        cpu.busy_core_seconds += busy
        return self.reserve(t_arrive, busy)
