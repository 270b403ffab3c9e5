"""Who competes for a node's cores: crowded nodes, work held in quanta there, CPU learners' updates.

A node is **crowded** when fewer cores than threads want them: each EnvRunner, each remote learner's
process, the driver, the plane actor of every learner node (Conduit as deployed), and a local
learner's extra torch threads (:mod:`conduit.sim.torchteam`). The count is the same for both sides,
so the stock side's processes compete for cores as the deployed side's do. On a crowded node work is
held in quanta of :data:`SAMPLING_QUANTUM` on the node's :class:`~conduit.sim.resources.CpuPool` (the
OS interleaves the processes), and the pool preempts: the driver's process (nice 0) runs before Ray's
workers (nice 15), and a worker's thread that wakes gets a core for the kernel's slice (the pool's class
doc: who runs first). Elsewhere nobody waits for a core and work is one timeout.
"""

from __future__ import annotations

from collections.abc import Generator, Hashable

from conduit.sim.cluster import LearnerRole
from conduit.sim.torchteam import TorchTeam

#: the quantum work is held in on a crowded node: CPython's GIL switch interval (``sys.getswitchinterval()``,
#: 5 ms); the kernel's time slices are of that order
SAMPLING_QUANTUM = 5e-3


class CoreUse:
    """Crowded nodes and the work that runs on their cores (a mixin of :class:`~conduit.sim.engine.Simulation`)."""

    def _setup_cores(self) -> None:
        self.crowded = self._crowded_nodes()
        for node, crowded in self.crowded.items():
            if crowded:  # the driver's process runs first, a woken worker next (CpuPool: who runs first)
                self.cpus[node].enable_preemption()
                self.cpus[node].quantum = SAMPLING_QUANTUM
        w = self.workload
        self.team: TorchTeam | None = None
        if w.local_learner and w.learner_threads > 1 and self.crowded[self.layout.driver_node]:
            self.team = TorchTeam(self.env, self.cpus[self.layout.driver_node], w.learner_threads - 1,
                                  w.learner_thread_share, w.learner_spin_s, SAMPLING_QUANTUM)

    def _crowded_nodes(self) -> dict[str, bool]:
        threads = self.threads_per_node()
        return {node: threads[node] > self.cpus[node].cores for node in self.cpus}

    def threads_per_node(self) -> dict[str, int]:
        """The threads that want a core of each node: runners, remote learners, plane actors (deployed), the
        driver and a local learner's extra torch threads."""
        w = self.workload
        threads = {node: 0 for node in self.cpus}
        for r in self.layout.runners:
            threads[r.node] += 1
        if not w.local_learner:
            for lr in self.layout.learners:
                threads[lr.node] += 1
        if self.deployed:
            for node in {lr.node for lr in self.layout.learners}:
                threads[node] += 1  # the node's plane actor
        threads[self.layout.driver_node] += 1
        if w.local_learner:
            threads[self.layout.driver_node] += w.learner_threads - 1  # its extra torch threads
        return threads

    def value_pass(self, lr: LearnerRole, seconds: float) -> Generator:
        """The value function's forward pass for GAE (``compute_values``; under ``enable()`` the
        ``ValueStream``'s, ``values.py``) on the learner's device. A GPU runs it on its engine. A CPU
        learner (``lr.hbm`` None) on a crowded node runs it on a core of its node, as its update does
        (:meth:`learner_compute`): the forward pass is torch compute of the learner's process (a local
        learner's: the driver's), so while runners sample beside it -- the deployed ``ValueStream``
        evaluates fragments as they land -- it takes a core from them."""
        node = self.crowded_cpu_learner_node(lr)
        if node is None:
            yield from self.compute[lr.device].run(seconds)
            return
        yield from self.on_cores(node, seconds, urgent=self.workload.local_learner)
        self.compute[lr.device].busy_seconds += seconds

    def gae_pass(self, lr: LearnerRole, samples: float) -> Generator:
        """RLlib's ``GeneralAdvantageEstimation`` piece over ``samples`` as stock runs it: the value forward pass
        on the learner's device (:meth:`value_pass`, ``value_pass_per_sample``), then the bootstrap rows, value
        targets and advantages (``advantage_per_sample``): numpy on the learner's CPU thread (a local learner's:
        the driver's)."""
        w = self.workload
        yield from self.value_pass(lr, samples * w.value_pass_per_sample)
        if w.advantage_per_sample > 0:
            yield from self.learner_cpu(lr, samples * w.advantage_per_sample)

    def learner_cpu(self, lr: LearnerRole, seconds: float) -> Generator:
        """Python/numpy work of a stock learner process: on a core of its node, or a local learner's on the
        driver's thread (it runs in the driver process)."""
        if self.workload.local_learner:
            yield from self.on_driver(seconds)
        else:
            yield from self.cpu(lr.node, seconds, thread=("learner", lr.id))

    def crowded_cpu_learner_node(self, lr: LearnerRole) -> str | None:
        """The node whose cores a CPU learner's compute takes (its own, or the driver's for a local learner)
        when that node is crowded; None when the compute runs on the learner's engine (a GPU, or a node with a
        core per process, where nothing waits)."""
        node = self.layout.driver_node if self.workload.local_learner else lr.node
        return node if lr.hbm is None and self.crowded[node] else None

    def on_cores(self, node: str, seconds: float, urgent: bool = False, thread: Hashable | None = None) -> Generator:
        """``seconds`` of one thread's compute (sampling, a CPU learner's update) on a core of ``node``:
        in quanta on a crowded node (each paying the pool's ``oversubscribed_cost`` while every core is
        taken), one timeout elsewhere. ``urgent``: a thread of the driver's process (a local learner's),
        which runs before Ray's workers (:class:`~conduit.sim.resources.CpuPool`: who runs first);
        ``thread``: the thread it runs on (its next piece of work continues it)."""
        if not self.crowded[node]:
            if seconds > 0:
                yield self.env.timeout(seconds)
            return
        left = seconds
        while left > 0:
            step = min(SAMPLING_QUANTUM, left)
            yield from self.cpu(node, step, urgent=urgent, compute=True, thread=thread)
            left -= step

    def learner_compute(self, lr: LearnerRole, seconds: float) -> Generator:
        """One update's compute on the learner's device. A GPU's is its engine's. A CPU learner
        (``lr.hbm`` None) on a crowded node takes a core of its node: a remote learner's process, or
        a local learner's, the driver's thread (PPO and DQN call ``Learner.update`` from the driver's
        loop; APPO's local learner trains on its own learner thread), with its extra torch threads
        (:class:`~conduit.sim.torchteam.TorchTeam`) on the other cores."""
        w = self.workload
        node = self.crowded_cpu_learner_node(lr)
        if node is None:
            yield from self.compute[lr.device].run(seconds)
            return
        if w.local_learner and self.team is not None:
            self.team.region(seconds)
        if w.local_learner and w.algorithm != "appo":
            yield self.driver_thread.acquire()
            try:
                yield from self.on_cores(node, seconds, urgent=True)
            finally:
                self.driver_thread.release()
        else:
            yield from self.on_cores(node, seconds, urgent=w.local_learner, thread=("learner", lr.id))
        self.compute[lr.device].busy_seconds += seconds
