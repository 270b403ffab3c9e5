"""Who runs where: env runners, learners and the driver, laid out on a topology.

The layout follows RLlib's on a GPU cluster. Each GPU hosts ``runners_per_gpu`` env runners (a
fraction means one runner per several GPUs, e.g. an LLM generator per node) and one learner; the
driver runs on the first node. On a topology without GPUs (the 2-core reference VM) runners are spread
over the nodes and the learners compute on a CPU, whose "device memory" is host memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from conduit.errors import ConduitError
from conduit.sim.workload import Workload
from conduit.topology import TierKind, Topology


@dataclass
class RunnerRole:
    id: str
    index: int
    node: str
    device: str | None  # the GPU it runs inference on, None on CPU-only nodes
    memory: str  # host memory device its chunks are written to


@dataclass
class LearnerRole:
    id: str
    index: int
    node: str
    device: str  # GPU, or the CPU device for a CPU learner
    memory: str  # host memory device on its node
    hbm: str | None  # HBM tier id; None for a CPU learner (host memory is its device memory)
    pinned: str  # the pinned and pageable tiers of ``memory`` (from the topology)
    pageable: str
    runners: list[RunnerRole] = field(default_factory=list)

    @property
    def device_tier(self) -> str:
        """Where a batch must sit for the update: HBM, or pageable host memory for a CPU learner."""
        return self.hbm if self.hbm is not None else self.pageable


@dataclass
class ClusterLayout:
    runners: list[RunnerRole]
    learners: list[LearnerRole]
    driver_node: str
    driver_memory: str
    learner_of_runner: dict[str, LearnerRole]
    #: learners each runner feeds, in turn: its own, plus learners on its node with no runner
    feeds: dict[str, list[LearnerRole]]

    def target(self, runner: RunnerRole, i: int) -> LearnerRole:
        fed = self.feeds[runner.id]
        return fed[i % len(fed)]


def lay_out(topology: Topology, workload: Workload) -> ClusterLayout:
    """Place runners, learners and the driver; raise when the topology cannot host the workload."""
    nodes = topology.nodes
    memory_of: dict[str, str] = {}
    for node in nodes:
        mems = topology.devices_of("memory", node)
        if mems:
            memory_of[node] = mems[0].id
    if not memory_of:
        raise ConduitError(f"topology {topology.name!r} has no host 'memory' device; the plane needs one per node")
    gpus = topology.devices_of("gpu")
    hosts = [n for n in nodes if n in memory_of]

    def learner(i: int, device: str, node: str, memory: str) -> LearnerRole:
        return LearnerRole(f"learner{i}", i, node, device, memory, topology.tier_of(device, TierKind.HBM),
                           topology.tier_of(memory, TierKind.PINNED), topology.tier_of(memory, TierKind.PAGEABLE))

    def memory_near(node: str) -> str:
        if node in memory_of:
            return memory_of[node]
        raise ConduitError(f"node {node!r} of topology {topology.name!r} has no host 'memory' device")

    if gpus:
        n_learners = workload.learners or len(gpus)
        if n_learners > len(gpus):
            raise ConduitError(
                f"workload {workload.name!r} asks for {n_learners} learners; "
                f"topology {topology.name!r} has {len(gpus)} GPUs"
            )
        stride = len(gpus) / n_learners
        learner_devices = [gpus[int(i * stride)] for i in range(n_learners)]
        learners = [learner(i, d.id, d.node, memory_near(d.node)) for i, d in enumerate(learner_devices)]
        n_runners = workload.env_runners or max(1, round(workload.runners_per_gpu * len(gpus)))
        stride = len(gpus) / n_runners
        runners = [
            RunnerRole(
                f"runner{j}",
                j,
                gpus[int(j * stride)].node,
                gpus[int(j * stride)].id,
                memory_near(gpus[int(j * stride)].node),
            )
            for j in range(n_runners)
        ]
    else:
        cpus = [c for c in topology.devices_of("cpu") if c.node in memory_of]
        if not cpus:
            raise ConduitError(f"topology {topology.name!r} has neither a GPU nor a CPU with host memory")
        n_learners = workload.learners or 1
        learners = [
            learner(i, cpus[i % len(cpus)].id, cpus[i % len(cpus)].node, memory_of[cpus[i % len(cpus)].node])
            for i in range(n_learners)
        ]
        n_runners = workload.env_runners or len(hosts)
        runners = [
            RunnerRole(f"runner{j}", j, hosts[j % len(hosts)], None, memory_of[hosts[j % len(hosts)]])
            for j in range(n_runners)
        ]
    learner_of_runner: dict[str, LearnerRole] = {}
    by_device = {lr.device: lr for lr in learners}
    for j, runner in enumerate(runners):
        learner = by_device.get(runner.device) or _nearest(runner, learners, j)
        learner.runners.append(runner)
        learner_of_runner[runner.id] = learner
    feeds = {r.id: [learner_of_runner[r.id]] for r in runners}
    orphans = [lr for lr in learners if not lr.runners]
    # learners with no runner of their own: first those with a runner on their node (least-loaded
    # local runner), then the rest to the least-loaded runner anywhere, so feeds stay balanced
    for lr in orphans:
        local = [r for r in runners if r.node == lr.node]
        if local:
            feeds[min(local, key=lambda r: (len(feeds[r.id]), r.index)).id].append(lr)
    for lr in orphans:
        if not any(r.node == lr.node for r in runners):
            feeds[min(runners, key=lambda r: (len(feeds[r.id]), r.index)).id].append(lr)
    driver_node = hosts[0]
    tiers = {t.id for t in topology.tiers}
    for lr in learners:
        for tier in (lr.pinned, lr.pageable):
            if tier not in tiers:  # pragma: no cover - derived from the same memory device
                raise ConduitError(f"tier {tier!r} missing from topology {topology.name!r}")
    return ClusterLayout(runners, learners, driver_node, memory_of[driver_node], learner_of_runner, feeds)


def _nearest(runner: RunnerRole, learners: list[LearnerRole], j: int) -> LearnerRole:
    """A learner on the runner's node (balanced by count), else round-robin over all learners."""
    local = [lr for lr in learners if lr.node == runner.node]
    pool = local or learners
    return min(pool, key=lambda lr: (len(lr.runners), lr.index)) if local else pool[j % len(pool)]
