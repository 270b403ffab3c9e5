"""Folding identical nodes: simulate a few representative nodes, each standing for several.

At 1,024 GPUs most of a synchronous PPO iteration is the same thing happening on 128 identical
nodes: every node's runners sample, every node's learners take their batches, and the nodes meet only
at shared places -- the driver (its thread, its node's links and memory) and the fabric. *Folding*
keeps the driver's node as it is and simulates ``ceil((N - 1) / fold)`` of the other nodes, each
standing for ``multiplicity`` nodes (the multiplicities add up to ``N - 1``). What each node does on
its own is simulated once per representative; what the represented nodes do to a shared place is
charged ``multiplicity`` times:

* **the network**: a flow with an end on a representative node stands for ``multiplicity`` identical
  flows (:class:`~conduit.sim.network.Network`'s class weights), and the links private to that node
  (those between its own devices, and its NICs' links to their switches) carry ``multiplicity`` times
  their bandwidth, so each of the represented flows gets the rate it would get alone on its own node,
  while a shared link (the driver node's, a switch's) is divided among all of them: max-min fairness
  gives every represented flow the share the unfolded cluster would give it;
* **the driver**: every per-runner and per-learner piece of the driver's work (a reply handled, a
  result read, an ``update`` call issued) is charged ``multiplicity`` times on its one thread
  (:meth:`Fold.of_node`, the algorithm loops).

What is *not* exact, and why the result carries a ``fold`` block and a validity warning:

* the slowest of fewer runners sets the end of sampling (a straggler among 10,240 draws is a little
  slower than among 640), so folding shortens a sampling-bound iteration slightly;
* a represented node's ``update`` call arrives when its representative's last one does;
* occupancy of the driver node's memory tiers is that of the representatives' chunks, not all of them;
* the representatives hang off the first switches of the fabric: what the other switches would carry
  between themselves is not simulated (a non-blocking fat tree carries it without queueing);
* a flow between two representatives that stand for different numbers of nodes (16 and 15) carries the
  larger multiplicity (PPO's flows run between a node and the driver's node, or within a node);
* counts in the result (chunks, calls, bytes) are the representatives'.

``benchmarks/sim_speed.py --fold K`` runs the folded and the exact simulation side by side and prints
the error of every headline figure; folding is never the default.

Folding needs the nodes it folds to be the same: the same devices (kinds and attributes) and the same
private links (the driver's node, simulated as it is, may differ: a head node). A topology whose other
nodes differ is refused, naming the first node that differs; so is an
algorithm whose loop does not charge the driver per represented role (today: PPO and GRPO only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from conduit.errors import ConduitError
from conduit.topology import Topology
from conduit.topology.model import Device, Link

#: algorithms whose driver-side work is charged per represented role (see the module docstring)
FOLDABLE_ALGORITHMS = ("ppo",)


@dataclass(frozen=True)
class Fold:
    """Which nodes are simulated and how many nodes each stands for (1 for the driver's node)."""

    factor: int
    multiplicity: Mapping[str, int]  # simulated node -> nodes it stands for
    logical_nodes: int

    def of_node(self, node: str | None) -> int:
        """How many nodes ``node`` stands for (1 for an unfolded one or a switch)."""
        return self.multiplicity.get(node, 1) if node is not None else 1

    def describe(self) -> dict[str, Any]:
        """The result's ``fold`` block."""
        return {
            "factor": self.factor,
            "nodes": self.logical_nodes,
            "simulated_nodes": len(self.multiplicity),
            "multiplicity": dict(self.multiplicity),
            "note": ("representative nodes: times are the cluster's; counts (chunks, calls, bytes) are of the "
                     "simulated nodes; see conduit.sim.fold for what folding does not model"),
        }


def _private(link: Link, node_of: Mapping[str, str | None]) -> str | None:
    """The node a link belongs to alone: both ends on it, or one end on it and the other a switch."""
    a, b = node_of[link.src], node_of[link.dst]
    if a is not None and (b is None or b == a):
        return a
    if b is not None and a is None:
        return b
    return None


def _signature(topology: Topology, node: str, private: list[Link]) -> tuple:
    """What makes two nodes the same: their devices (kind, attributes) and private links, ids left out."""
    devices = sorted((d.kind, tuple(sorted((k, repr(v)) for k, v in d.attrs.items())))
                     for d in topology.devices.values() if d.node == node)
    links = sorted((link.bandwidth, link.latency) for link in private)
    return tuple(devices), tuple(links)


def check_factor(factor: Any) -> int:
    """``factor`` if it is an integer >= 1, else a :class:`ConduitError` naming ``fold``."""
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ConduitError(f"fold: must be an integer >= 1 (1: no folding), got {factor!r}")
    return factor


def check_fold(factor: Any, workload: Any) -> int:
    """``factor`` when ``workload`` can be folded by it (:func:`check_factor`; 1 always can), else a
    :class:`ConduitError` naming ``fold`` and the algorithm."""
    if check_factor(factor) != 1 and workload.algorithm not in FOLDABLE_ALGORITHMS:
        raise ConduitError(f"fold: folding is implemented for {', '.join(FOLDABLE_ALGORITHMS)}; workload "
                           f"{workload.name!r} is {workload.algorithm!r} (use fold=1)")
    return factor


def fold_topology(topology: Topology, driver_node: str, factor: int) -> tuple[Topology, Fold]:
    """The folded topology (the driver's node and the representatives, private links widened) and its
    :class:`Fold`. ``factor`` 1, or a cluster with nothing to fold (every node would stand for itself),
    returns the topology unchanged: the exact simulation."""
    nodes = topology.nodes
    if check_factor(factor) == 1 or len(nodes) < 2:
        return topology, Fold(1, {n: 1 for n in nodes}, len(nodes))
    node_of = {d.id: d.node for d in topology.devices.values()}
    private: dict[str, list[Link]] = {n: [] for n in nodes}
    for link in topology.links:
        owner = _private(link, node_of)
        if owner is not None:
            private[owner].append(link)
    others = [n for n in nodes if n != driver_node]  # the driver's node is simulated as it is: it may differ
    reference = _signature(topology, others[0], private[others[0]])
    for node in others[1:]:
        if _signature(topology, node, private[node]) != reference:
            raise ConduitError(f"fold: node {node!r} of topology {topology.name!r} differs from node "
                               f"{others[0]!r} (devices or links): only identical nodes can be folded")
    simulated = math.ceil(len(others) / factor)
    if simulated == len(others):  # every node would stand for itself: the exact simulation
        return topology, Fold(1, {n: 1 for n in nodes}, len(nodes))
    base, extra = divmod(len(others), simulated)
    multiplicity = {driver_node: 1}
    for i, node in enumerate(others[:simulated]):
        multiplicity[node] = base + (1 if i < extra else 0)
    kept = set(multiplicity)
    devices: list[Device] = [d for d in topology.devices.values() if d.node is None or d.node in kept]
    links: list[Link] = []
    for link in topology.links:
        a, b = node_of[link.src], node_of[link.dst]
        if (a is not None and a not in kept) or (b is not None and b not in kept):
            continue
        owner = _private(link, node_of)
        m = multiplicity.get(owner, 1) if owner is not None else 1
        links.append(link if m == 1 else Link(link.src, link.dst, link.bandwidth * m, link.latency, link.attrs))
    folded = Topology(f"{topology.name}", topology.source, devices, links)
    return folded, Fold(factor, multiplicity, len(nodes))
