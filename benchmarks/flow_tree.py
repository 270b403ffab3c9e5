"""Benchmark: ``simulate_transfers`` on 1,024 transfers over a tree whose leaves share a core, against
a straightforward progressive-filling simulation of the same transfers.

Setup: a two-level tree, ``--leaves`` leaf switches of ``--hosts`` hosts each (host links 50 GB/s),
every leaf connected to one core switch by an uplink of ``--uplink`` bytes/s (oversubscribed by default,
so the uplinks, shared by every leaf's flows, are the bottlenecks and every flow lies in one component).
``--transfers`` transfers between random hosts on different leaves (seeded), sizes 1-64 MiB, starts
spread over ``--spread`` seconds.

Baseline: the straightforward simulation (:func:`straightforward_times`): at every flow start or end,
re-solve all active flows from scratch with the textbook progressive-filling algorithm
(:func:`conduit.sim.maxmin.progressive_filling_reference`, per-flow link lists), advance every flow,
and step to the next start or end. Both give the same completion times (checked, relative difference
printed); wall times are medians over ``--repeats``, alternating which goes first.

Target (issue 13): ``simulate_transfers`` stays >= 10x the straightforward simulation.

    python benchmarks/flow_tree.py [--transfers 1024] [--leaves 32] [--hosts 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

import networkx as nx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conduit.sim.maxmin import progressive_filling_reference
from conduit.sim.routing import Router
from conduit.sim.transfers import simulate_transfers

TARGET = 10.0


def tree(leaves: int, hosts: int, uplink: float, host_bw: float = 50e9, latency: float = 1e-6) -> nx.Graph:
    g = nx.Graph()
    for leaf in range(leaves):
        g.add_edge(f"leaf{leaf}", "core", bandwidth=uplink, latency=latency)
        for h in range(hosts):
            g.add_edge(f"h{leaf}.{h}", f"leaf{leaf}", bandwidth=host_bw, latency=latency)
    return g


def workload(leaves: int, hosts: int, n: int, spread: float, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.sample(range(leaves), 2)
        out.append({"src": f"h{a}.{rng.randrange(hosts)}", "dst": f"h{b}.{rng.randrange(hosts)}",
                    "bytes": rng.uniform(1, 64) * 2**20, "start": rng.uniform(0, spread)})
    return out


def straightforward_times(graph: nx.Graph, transfers: list[dict]) -> list[float]:
    """Every start or end re-solves all active flows with progressive filling, from scratch."""
    router = Router(graph)
    cap = [float(graph.edges[u, v]["bandwidth"]) for u, v in router.links]
    pending, done = [], [math.nan] * len(transfers)
    for i, x in enumerate(transfers):
        route = router.route(x["src"], x["dst"])
        links = route.links.tolist()
        begin = x.get("start", 0.0) + sum(graph.edges[a, b]["latency"] for a, b in zip(route.nodes, route.nodes[1:]))
        pending.append((begin, i, links))
    pending.sort()
    active: dict[int, list] = {}
    now, k = 0.0, 0
    while k < len(pending) or active:
        ids = list(active)
        rates = progressive_filling_reference([active[i][0] for i in ids], cap) if ids else []
        t_next = pending[k][0] if k < len(pending) else math.inf
        t_end = min((now + active[i][1] / r for i, r in zip(ids, rates)), default=math.inf)
        step = min(t_next, t_end)
        for i, r in zip(ids, rates):
            active[i][1] -= (step - now) * r
        now = step
        for i in ids:
            if active[i][1] <= 1e-9 * transfers[i]["bytes"]:
                done[i] = now
                del active[i]
        while k < len(pending) and pending[k][0] <= now:
            _begin, i, links = pending[k]
            k += 1
            active[i] = [links, float(transfers[i]["bytes"])]
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transfers", type=int, default=1024)
    parser.add_argument("--leaves", type=int, default=32)
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--uplink", type=float, default=100e9, help="leaf <-> core bytes/s (default 100 GB/s)")
    parser.add_argument("--spread", type=float, default=0.005, help="starts drawn in [0, spread] s")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    graph = tree(args.leaves, args.hosts, args.uplink)
    transfers = workload(args.leaves, args.hosts, args.transfers, args.spread)
    print(f"tree: {args.leaves} leaves x {args.hosts} hosts, uplinks {args.uplink:.3g} B/s to one core; "
          f"{len(transfers)} transfers, starts over {args.spread * 1e3:g} ms")
    fast, slow = [], []
    ours = ref = None
    for rep in range(args.repeats):
        for which in (("ours", "ref") if rep % 2 == 0 else ("ref", "ours")):
            t0 = time.perf_counter()
            if which == "ours":
                ours = simulate_transfers(graph, transfers)
                fast.append(time.perf_counter() - t0)
            else:
                ref = straightforward_times(graph, transfers)
                slow.append(time.perf_counter() - t0)
        print(f"  repeat {rep + 1}: simulate_transfers {fast[-1]:.2f} s, straightforward {slow[-1]:.2f} s", flush=True)
    err = max(abs(a / b - 1) for a, b in zip(ours, ref, strict=True))
    f, s = statistics.median(fast), statistics.median(slow)
    print(f"agreement: max relative difference of completion times {err:.1e}")
    print(f"simulate_transfers: {f:.3f} s   straightforward progressive filling: {s:.3f} s   "
          f"speed-up {s / f:.1f}x ({'meets' if s / f >= TARGET else 'misses'} the target >= {TARGET:g}x)")
    return 0 if err < 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())
