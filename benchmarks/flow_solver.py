"""Benchmark: max-min re-solves per second on a 1,024-GPU rail-optimized fat tree.

Setup: ``--flows`` concurrent transfers (random GPU pairs on different nodes,
seeded) active at once on ``dgx-h100-x128`` (128 DGX H100 nodes, 1,024 GPUs,
one 400 Gb/s NIC per GPU, 32 leaf x 16 spine switches, rail-optimized) or, if
that library topology does not load, the equivalent fabric from
:func:`build_fat_tree`.

Method: a re-solve is the max-min work a flow start or end causes: find the
component of that flow's links in the flow–link bipartite graph and solve
max-min rates on it (:func:`conduit.sim.maxmin.resolve_component`; the
:class:`conduit.sim.network.Network` itself skips the solve for flows alone on
their links and solves route classes, see its docstring). Each step ends one flow
(re-solve without it) and starts it again (re-solve with it), cycling through
the flows in a seeded order. The same steps run with the vectorised solver and
with the textbook ``progressive_filling_reference`` (fed the same component,
converted to per-flow link lists), side by side in one process; each figure is
the median over ``--repeats`` runs. Last, one full ``simulate_transfers`` of
the same transfers (16 MiB +- 2x each, all starting at 0) gives events/s
(flow starts and completions, per wall-clock second, routing included).

Usage: ``python benchmarks/flow_solver.py [--flows N] [--repeats R]``
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import networkx as nx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conduit.errors import ConduitError
from conduit.sim.maxmin import max_min_rates, progressive_filling_reference, resolve_component
from conduit.sim.routing import Router
from conduit.sim.transfers import run_transfers

GB = 1e9


def build_fat_tree(
    nodes: int = 128,
    gpus_per_node: int = 8,
    leaves: int = 32,
    spines: int = 16,
    *,
    nic_bandwidth: float = 50 * GB,  # 400 Gb/s ConnectX-7 per GPU
    nvlink_bandwidth: float = 450 * GB,  # per GPU per direction into the NVSwitch crossbar
    pcie_bandwidth: float = 55 * GB,  # GPU <-> its NIC, achievable PCIe Gen5 x16
    uplink_bandwidth: float | None = None,  # leaf <-> spine; default: non-blocking
    latency: float = 1e-6,
) -> nx.Graph:
    """A rail-optimized two-level fat tree of DGX-like nodes, as a networkx graph.

    Node ``n{i}`` has GPUs ``n{i}.gpu{r}`` on an NVSwitch crossbar ``n{i}.nvswitch``
    and one NIC ``n{i}.nic{r}`` per GPU. The leaves are split into one rail per
    GPU index; NIC ``r`` of node ``i`` goes to leaf ``i // nodes_per_leaf`` of rail
    ``r``. Every leaf links to every spine, with enough uplink bandwidth to be
    non-blocking unless ``uplink_bandwidth`` says otherwise.
    """
    if leaves % gpus_per_node or nodes % (leaves // gpus_per_node):
        raise ValueError("leaves must split evenly into rails, and nodes evenly over a rail's leaves")
    leaves_per_rail = leaves // gpus_per_node
    nodes_per_leaf = nodes // leaves_per_rail
    if uplink_bandwidth is None:
        uplink_bandwidth = nodes_per_leaf * nic_bandwidth / spines
    g = nx.Graph(name=f"fat-tree-{nodes}x{gpus_per_node}")
    for i in range(nodes):
        switch = f"n{i}.nvswitch"
        g.add_node(switch, kind="switch", node=f"n{i}")
        for r in range(gpus_per_node):
            gpu, nic = f"n{i}.gpu{r}", f"n{i}.nic{r}"
            g.add_node(gpu, kind="gpu", node=f"n{i}")
            g.add_node(nic, kind="nic", node=f"n{i}")
            g.add_edge(gpu, switch, bandwidth=nvlink_bandwidth, latency=latency)
            g.add_edge(gpu, nic, bandwidth=pcie_bandwidth, latency=latency)
            leaf = f"leaf{r * leaves_per_rail + i // nodes_per_leaf}"
            g.add_edge(nic, leaf, bandwidth=nic_bandwidth, latency=latency)
    for leaf in range(leaves):
        for spine in range(spines):
            g.add_edge(f"leaf{leaf}", f"spine{spine}", bandwidth=uplink_bandwidth, latency=latency)
    return g


def load_fabric(built: bool = False) -> tuple[nx.Graph, str]:
    """``dgx-h100-x128`` from the topology library, else (or if ``built``) :func:`build_fat_tree`."""
    if built:
        return build_fat_tree(), "build_fat_tree()"
    try:
        from conduit.topology import load_topology

        return load_topology("dgx-h100-x128").graph, "dgx-h100-x128 (topology library)"
    except (ImportError, ConduitError) as err:
        return build_fat_tree(), f"build_fat_tree() fallback ({str(err).splitlines()[0][:80]})"


def gpu_pairs(graph: nx.Graph, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` seeded random (src, dst) GPU pairs, never two GPUs of one node."""
    gpus = sorted(v for v, data in graph.nodes(data=True) if data.get("kind") == "gpu")
    node_of = {v: graph.nodes[v].get("node") for v in gpus}
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < n:
        src, dst = rng.sample(gpus, 2)
        if node_of[src] != node_of[dst]:
            pairs.append((src, dst))
    return pairs


def reference_solver(flows: np.ndarray, links: np.ndarray, capacity: np.ndarray, n_flows: int) -> np.ndarray:
    """``progressive_filling_reference`` behind the vectorised solver's signature."""
    flow_links: list[list[int]] = [[] for _ in range(n_flows)]
    for f, link in zip(flows.tolist(), links.tolist()):
        flow_links[f].append(link)
    return np.array(progressive_filling_reference(flow_links, capacity.tolist()))


def resolves_per_second(ent_flow, ent_link, capacity, order, solver, steps: int) -> tuple[float, float]:
    """Time ``steps`` end+start pairs (2 re-solves each); re-solves/s and mean component size."""
    n_flows = len(order)
    sizes = []
    t0 = time.perf_counter()
    for k in range(steps):
        f = order[k % n_flows]
        mine = ent_flow == f
        seed = ent_link[mine]
        ended = resolve_component(ent_flow[~mine], ent_link[~mine], seed, capacity, n_flows, solver=solver)
        started = resolve_component(ent_flow, ent_link, seed, capacity, n_flows, solver=solver)
        sizes += [ended.flows.size, started.flows.size]
    elapsed = time.perf_counter() - t0
    return 2 * steps / elapsed, float(np.mean(sizes))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, default=1024, help="concurrent transfers (default 1024)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per solver (default 5)")
    parser.add_argument("--steps", type=int, default=100, help="end+start steps per repeat, vectorised")
    parser.add_argument("--reference-steps", type=int, default=5, help="end+start steps per repeat, reference")
    parser.add_argument("--built", action="store_true", help="use build_fat_tree() even if dgx-h100-x128 loads")
    args = parser.parse_args(argv)

    graph, source = load_fabric(args.built)
    pairs = gpu_pairs(graph, args.flows, seed=0)
    t0 = time.perf_counter()
    router = Router(graph)
    routes = [router.route(s, d).links for s, d in pairs]
    routing_s = time.perf_counter() - t0
    capacity = np.array([graph.edges[u, v]["bandwidth"] for u, v in router.links], dtype=float)
    ent_flow = np.repeat(np.arange(len(routes)), [r.size for r in routes])
    ent_link = np.concatenate(routes)
    order = random.Random(1).sample(range(len(routes)), len(routes))

    print(f"fabric: {source}: {graph.number_of_nodes()} nodes, {graph.number_of_edges()} edges")
    print(f"flows: {len(routes)} active, {ent_link.size} flow-link entries, routed in {routing_s * 1e3:.0f} ms")
    full = resolve_component(ent_flow, ent_link, np.unique(ent_link), capacity, len(routes))
    ref = reference_solver(ent_flow, ent_link, capacity, len(routes))
    err = float(np.max(np.abs(full.rates / ref - 1)))
    print(f"agreement: max relative difference vectorised vs reference {err:.1e}")

    fast, slow, sizes = [], [], []
    for _ in range(args.repeats):  # interleaved, so both see the same machine state
        rate, size = resolves_per_second(ent_flow, ent_link, capacity, order, max_min_rates, args.steps)
        fast.append(rate)
        sizes.append(size)
        slow.append(resolves_per_second(ent_flow, ent_link, capacity, order, reference_solver, args.reference_steps)[0])
    v, r = statistics.median(fast), statistics.median(slow)
    print(f"component re-solve: mean component {statistics.mean(sizes):.0f} flows")
    print(f"  vectorised max_min_rates:      {v:10.1f} re-solves/s  (median of {args.repeats})")
    print(f"  progressive_filling_reference: {r:10.1f} re-solves/s  (median of {args.repeats})")
    print(f"  speed-up: {v / r:.1f}x (target >= 20x)")

    rng = random.Random(2)
    transfers = [{"src": s, "dst": d, "bytes": rng.uniform(8, 32) * 2**20} for s, d in pairs]
    t0 = time.perf_counter()
    times, network = run_transfers(graph, transfers)
    wall = time.perf_counter() - t0
    print(
        f"simulate_transfers: {len(transfers)} transfers, {network.events} events, {network.resolves} re-solves "
        f"({network.resolved_flows / max(network.resolves, 1):.0f} flows re-rated on average), {wall:.2f} s wall, "
        f"{network.events / wall:.0f} events/s, simulated makespan {max(times) * 1e3:.3f} ms"
    )


if __name__ == "__main__":
    main()
