"""A local learner's torch thread team: the cores its extra intra-op threads take from its node.

A local learner (RLlib ``num_learners=0``) trains in the driver's process, where Ray does not set
``OMP_NUM_THREADS=1`` (it does so only in its workers): torch keeps one intra-op thread per core. Its
parallel regions run on an OpenMP team, and on Linux builds (libgomp) an idle team member spin-waits
before it sleeps (``GOMP_SPINCOUNT``). So during an update each extra thread is on a CPU for a share of
the update's duration, and after it keeps a core for the spin, unless the next region starts first.
On a node with a core per thread that costs nothing; on a crowded one (the 2-core validation machine:
driver, EnvRunner, plane actor) the spinning thread competes with every other process.

``conduit calibrate`` measures both numbers on the learner's own update (``torch_team:<workload>``,
:func:`conduit.runtime.calibrate.measure_torch_team`): the spin, CPU seconds per extra thread in an idle
gap after an update (``Workload.learner_spin_s``), and the extra threads' share of the update's wall
time (``Workload.learner_thread_share``). On this project's 2-core machine, DQN CartPole: 9.7 ms and
0.85; a real DQN run's per-thread schedstat showed the team's thread on a CPU 0.75 of the time.

Not only updates start regions: a weight sync's ``set_state`` on the driver's local EnvRunner copies the
new weights into its module (``copy_`` of a tensor of at least torch's grain size, 32,768 elements, runs
on the team), after which the team spins again (DQN CartPole, 2 threads: 1.2 ms of set_state, then 5.8 ms
of the extra thread's CPU in an idle gap; ``Workload.sync_spin_s``, :meth:`conduit.sim.dqn.DqnLoop.dqn_weight_sync`).

The model: :meth:`TorchTeam.region` at the start of an update of ``seconds`` gives each extra thread
``share * seconds`` of work plus ``spin`` of spinning; the work left from the previous region (the rest
of its spin) is dropped, since a thread that spins until the next region starts works on that region
instead. Each thread runs its work on the node's :class:`~conduit.sim.resources.CpuPool` in quanta. The team
is the driver process's (nice 0, where Ray starts its workers at 15), so on a crowded node's preemptive pool
its quanta run before the workers' (the pool's class doc: who runs first); it shares the cores with the
driver's own thread.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from conduit.sim.resources import CpuPool


class TorchTeam:
    """``workers`` extra torch threads of one process, on ``pool``'s cores (see the module doc)."""

    def __init__(self, env: simpy.Environment, pool: CpuPool, workers: int, share: float, spin_s: float,
                 quantum: float):
        if workers < 1:
            raise ValueError(f"a torch team needs at least one extra thread, got {workers}")
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"a thread's share of an update must be within [0, 1], got {share}")
        if spin_s < 0 or quantum <= 0:
            raise ValueError(f"spin ({spin_s}) must be >= 0 and quantum ({quantum}) > 0")
        self.env, self.pool = env, pool
        self.share, self.spin_s, self.quantum = share, spin_s, quantum
        self._left = [0.0] * workers
        self._wake: list[simpy.Event | None] = [None] * workers
        #: CPU seconds the team's threads ran (work and spin), for tests and studies
        self.cpu_seconds = 0.0
        self.regions = 0
        for i in range(workers):
            env.process(self._thread(i))

    @property
    def workers(self) -> int:
        return len(self._left)

    def region(self, seconds: float, spin_s: float | None = None) -> None:
        """Parallel work of ``seconds`` starts (an update): each thread works ``share * seconds``, then spins
        ``spin_s`` (default: the team's, measured after an update)."""
        spin = self.spin_s if spin_s is None else spin_s
        if spin < 0:
            raise ValueError(f"spin ({spin}) must be >= 0")
        self.regions += 1
        for i in range(self.workers):
            self._left[i] = self.share * max(0.0, seconds) + spin
            wake, self._wake[i] = self._wake[i], None
            if wake is not None:
                wake.succeed()

    def _thread(self, i: int) -> Generator[Any, Any, None]:
        """One extra thread: asleep until a region gives it work, then on a core in quanta until its
        work and spin are done (or a new region resets them)."""
        while True:
            if self._left[i] <= 0.0:
                self._wake[i] = self.env.event()  # never triggered once the run ends: the event queue empties
                yield self._wake[i]
                continue
            step = min(self.quantum, self._left[i])
            self._left[i] -= step
            yield from self.pool.work(step, urgent=self.pool.preemptive)  # the driver's process: nice 0
            self.cpu_seconds += step
