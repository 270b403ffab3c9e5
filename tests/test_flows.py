"""The flow-level network model: closed forms, max-min properties, errors."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import networkx as nx
import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.errors import ConduitError
from conduit.sim import simulate_transfers
from conduit.sim.maxmin import component, incidence, max_min_rates, progressive_filling_reference
from conduit.sim.network import COMPLETION_RTOL, Network
from conduit.sim.routing import Router
from conduit.sim.transfers import run_transfers

REPO = Path(__file__).resolve().parents[1]


def link(g: nx.Graph, u, v, bandwidth=100.0, latency=0.0) -> None:
    g.add_edge(u, v, bandwidth=bandwidth, latency=latency)


def chain(k: int, bandwidth=100.0, latency=0.0) -> nx.Graph:
    g = nx.Graph()
    for i in range(k):
        link(g, f"n{i}", f"n{i + 1}", bandwidth, latency)
    return g


def t(src, dst, nbytes, start=0.0) -> dict:
    return {"src": src, "dst": dst, "bytes": nbytes, "start": start}


def rates_at(graph, transfers, when):
    """Run until ``when`` and return {transfer index: rate} of the active flows."""
    env = simpy.Environment()
    net = Network(env, graph)
    for i, x in enumerate(transfers):
        net.transfer(x["src"], x["dst"], x["bytes"], tag=i)
    env.run(until=when)
    return {x.tag: r for x, r in net.active_rates().items()}


# -- closed forms ------------------------------------------------------------


def test_one_transfer_is_latency_plus_bytes_over_bandwidth():
    g = nx.Graph()
    link(g, "a", "b", bandwidth=100.0, latency=0.5)
    assert simulate_transfers(g, [t("a", "b", 1000)]) == pytest.approx([10.5])


def test_n_equal_transfers_share_one_link_equally():
    g = nx.Graph()
    link(g, "a", "b", bandwidth=100.0, latency=0.25)
    n = 5
    assert simulate_transfers(g, [t("a", "b", 1000)] * n) == pytest.approx([0.25 + n * 10.0] * n)


def test_full_duplex_opposite_directions_do_not_share():
    g = nx.Graph()
    link(g, "a", "b", bandwidth=100.0, latency=0.0)
    assert simulate_transfers(g, [t("a", "b", 1000), t("b", "a", 1000)]) == pytest.approx([10.0, 10.0])


def test_late_start_shares_from_its_start():
    g = nx.Graph()
    link(g, "a", "b", bandwidth=100.0)
    # alone for 5 s (500 B), then 50 B/s each: first ends at 15, second alone at 100 B/s until 20;
    # the first flow's timer for t=10, armed at t=0, goes stale at t=5 and must not fire
    assert simulate_transfers(g, [t("a", "b", 1000), t("a", "b", 1000, start=5)]) == pytest.approx([15.0, 20.0])


def test_parking_lot_long_flow_gets_half():
    k, c, b = 4, 100.0, 1000.0
    g = chain(k, bandwidth=c)
    xs = [t("n0", f"n{k}", b)] + [t(f"n{i}", f"n{i + 1}", b) for i in range(k)]
    assert sorted(rates_at(g, xs, 1e-9).values()) == pytest.approx([c / 2] * (k + 1))
    assert simulate_transfers(g, xs) == pytest.approx([2 * b / c] * (k + 1))


def test_parking_lot_short_flows_leave_early():
    k, c, big, small = 3, 100.0, 1000.0, 100.0
    g = chain(k, bandwidth=c)
    xs = [t("n0", f"n{k}", big)] + [t(f"n{i}", f"n{i + 1}", small) for i in range(k)]
    t1 = 2 * small / c  # all at c/2 until the short ones finish, then the long one alone
    assert simulate_transfers(g, xs) == pytest.approx([t1 + (big - small) / c] + [t1] * k)


def test_parking_lot_max_min_unequal_bottlenecks():
    # link 0 carries the long flow and two short ones, the others one short one
    c = 90.0
    g = chain(3, bandwidth=c)
    xs = [t("n0", "n3", 1e6), t("n0", "n1", 1e6), t("n0", "n1", 1e6), t("n1", "n2", 1e6), t("n2", "n3", 1e6)]
    env = simpy.Environment()
    net = Network(env, g)
    for i, x in enumerate(xs):
        net.transfer(x["src"], x["dst"], x["bytes"], tag=i)
    env.run(until=1e-9)
    r = {x.tag: rate for x, rate in net.active_rates().items()}
    assert [r[i] for i in range(5)] == pytest.approx([c / 3, c / 3, c / 3, 2 * c / 3, 2 * c / 3])
    forward = [net.router.link_index(f"n{i}", f"n{i + 1}") for i in range(3)]
    assert net.link_rates()[forward] == pytest.approx([c, c, c])
    assert net.link_flow_counts()[forward].tolist() == [3, 2, 2]


def test_multi_hop_latency_is_the_sum_and_bytes_go_at_the_bottleneck():
    g = nx.Graph()
    link(g, "a", "b", bandwidth=100.0, latency=1.0)
    link(g, "b", "c", bandwidth=50.0, latency=2.0)
    link(g, "c", "d", bandwidth=200.0, latency=3.0)
    assert simulate_transfers(g, [t("a", "d", 0), t("a", "d", 500)]) == pytest.approx([6.0, 16.0])


def test_same_endpoints_complete_at_start_and_zero_bytes_after_latency():
    g = nx.Graph()
    link(g, "a", "b", bandwidth=100.0, latency=0.5)
    assert simulate_transfers(g, [t("a", "a", 1e9, start=2.0), t("a", "b", 0, start=1.0)]) == [2.0, 1.5]


def test_resolves_only_the_component_that_changed():
    g = nx.Graph()
    link(g, "a", "b")
    link(g, "c", "d")
    xs = [t("a", "b", 100)] * 3 + [t("c", "d", 1000, start=1.0)]
    times, net = run_transfers(g, xs)
    assert times == pytest.approx([3.0, 3.0, 3.0, 11.0])
    # t=0: the 3 flows on a->b; t=1: only the c->d flow (not the 3 others); t=3, t=11: nobody left
    assert (net.resolves, net.resolved_flows) == (2, 4)


def test_link_stats_bytes_and_busy_time():
    g = chain(2, bandwidth=100.0)
    times, net = run_transfers(g, [t("n0", "n2", 1000), t("n1", "n2", 500, start=20)])
    assert times == pytest.approx([10.0, 25.0])
    stats = net.link_stats()
    assert stats["n0", "n1"].bytes == pytest.approx(1000)
    assert stats["n1", "n2"].bytes == pytest.approx(1500)
    assert stats["n1", "n0"].bytes == 0 and stats["n1", "n0"].busy_s == 0
    assert stats["n1", "n2"].busy_s == pytest.approx(15.0)
    assert stats["n1", "n2"].utilization(25.0) == pytest.approx(1500 / (100 * 25))
    assert not net.link_rates().any() and not net.link_flow_counts().any()
    assert net.events == 4 and net.resolves == 2  # an end that leaves no flow solves nothing


def test_accepts_topology_objects_and_yaml_paths(tmp_path):
    g = chain(1)
    xs = [t("n0", "n1", 100)]
    assert simulate_transfers(SimpleNamespace(graph=g), xs) == [1.0]
    pytest.importorskip("conduit.topology")
    path = tmp_path / "two.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            devices:
              - {id: n0, kind: gpu, memory: "80 GiB"}
              - {id: n1, kind: gpu, memory: "80 GiB"}
            links:
              - {src: n0, dst: n1, bandwidth: "100 B/s", latency: 0}
            """
        )
    )
    for topology in (path, str(path)):
        assert simulate_transfers(topology, xs) == pytest.approx([1.0])


# -- routing -----------------------------------------------------------------


def two_level_fabric(hosts=8, spines=4, reverse=False) -> nx.Graph:
    edges = [(f"h{h}", f"leaf{h % 2}") for h in range(hosts)]
    edges += [(f"leaf{i}", f"spine{s}") for i in range(2) for s in range(spines)]
    g = nx.Graph()
    for u, v in reversed(edges) if reverse else edges:
        link(g, u, v, bandwidth=10.0, latency=0.001)
    return g


def all_routes(g: nx.Graph) -> dict:
    router = Router(g)
    return {(s, d): router.route(s, d).nodes for s in g for d in g}


def test_ecmp_is_deterministic_and_independent_of_build_order():
    g = two_level_fabric()
    routes = all_routes(g)
    assert routes == all_routes(g) == all_routes(two_level_fabric(reverse=True))
    spines = {nodes[2] for (s, d), nodes in routes.items() if s.startswith("h") and len(nodes) == 5}
    assert len(spines) > 1  # equal-cost paths are spread, not all on one spine
    for (s, d), nodes in routes.items():
        assert nodes[0] == s and nodes[-1] == d
        assert len(nodes) - 1 == nx.shortest_path_length(g, s, d)


def test_ecmp_does_not_depend_on_the_hash_seed():
    code = (
        "import json, sys; sys.path.insert(0, '.');"
        "from tests.test_flows import two_level_fabric, all_routes;"
        "print(json.dumps(sorted(map(list, all_routes(two_level_fabric()).values()))))"
    )
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", code], check=False, cwd=REPO, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        outs.add(out.stdout)
    assert len(outs) == 1 and json.loads(outs.pop())


def test_route_links_are_directed_indices():
    g = chain(2)
    router = Router(g)
    route = router.route("n2", "n0")
    assert [router.links[i] for i in route.links] == [("n2", "n1"), ("n1", "n0")]
    assert router.link_index("n1", "n0") == route.links[1]


def bottleneck(g: nx.Graph, nodes) -> float:
    return min((g.edges[u, v]["bandwidth"] for u, v in itertools.pairwise(nodes)), default=math.inf)


def test_widest_route_prefers_nvlink_over_the_shared_pcie_switch():
    topology = pytest.importorskip("conduit.topology").load_topology("dgx-h100")
    router = Router(topology.graph)
    for a, b, switch in [("gpu0", "gpu1", "pcie0"), ("gpu2", "gpu3", "pcie1"), ("gpu4", "gpu5", "pcie2"),
                         ("gpu6", "gpu7", "pcie3")]:
        assert topology.graph.has_edge(a, switch) and topology.graph.has_edge(b, switch)  # the 55 GB/s detour exists
        for src, dst in ((a, b), (b, a)):
            assert router.route(src, dst).nodes == (src, "nvswitch", dst)
    # 1 GB at 450 GB/s after 1 us of latency, not 18 ms over PCIe
    (done,) = simulate_transfers(topology, [t("gpu0", "gpu1", 1e9)])
    assert done == pytest.approx(1e-6 + 1e9 / 450e9)


def test_widest_route_matches_the_topology_model():
    topology = pytest.importorskip("conduit.topology").load_topology("dgx-h100")
    g, router = topology.graph, Router(topology.graph)
    devices = sorted(g.nodes)
    for src in devices:
        for dst in devices:
            if src != dst:
                width, _latency, hops = topology.widest_shortest_path(src, dst)
                nodes = router.route(src, dst).nodes
                assert (len(nodes) - 1, bottleneck(g, nodes)) == (hops, width), (src, dst, nodes)


@st.composite
def weighted_graphs(draw):
    n = draw(st.integers(2, 9))
    g = nx.Graph()
    g.add_nodes_from(f"v{i}" for i in range(n))
    pairs = [(draw(st.integers(0, i - 1)), i) for i in range(1, n)]  # connected ...
    pairs += draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2 * n))  # ... with cycles
    for a, b in pairs:
        if a != b:
            link(g, f"v{a}", f"v{b}", draw(st.sampled_from([1.0, 2.0, 5.0, 10.0, 50.0])))
    return g


@given(weighted_graphs())
@settings(max_examples=150, deadline=None)
def test_routes_are_hop_shortest_with_the_widest_bottleneck(g):
    router = Router(g)
    for src in g:
        for dst in g:
            route = router.route(src, dst)
            assert route.nodes[0] == src and route.nodes[-1] == dst
            assert [router.links[i] for i in route.links] == list(itertools.pairwise(route.nodes))
            assert len(route.nodes) - 1 == nx.shortest_path_length(g, src, dst)
            best = max(bottleneck(g, p) for p in nx.all_shortest_paths(g, src, dst))
            assert bottleneck(g, route.nodes) == best
    # deterministic: a fresh router, and the same graph built in another order, route the same way
    rebuilt = nx.Graph()
    rebuilt.add_nodes_from(reversed(list(g.nodes)))
    rebuilt.add_edges_from((v, u, data) for u, v, data in reversed(list(g.edges(data=True))))
    assert all_routes(g) == all_routes(g) == all_routes(rebuilt)


def test_equal_width_paths_still_spread_by_hash():
    # a non-uniform fabric: leaf-spine uplinks of two speeds; only the fast spines are used,
    # and ECMP still spreads routes over them
    g = two_level_fabric(hosts=8, spines=4)
    for i in range(2):
        for s in (2, 3):
            g.edges[f"leaf{i}", f"spine{s}"]["bandwidth"] = 5.0
    routes = all_routes(g)
    spines = {nodes[2] for (s, d), nodes in routes.items() if s.startswith("h") and len(nodes) == 5}
    assert spines == {"spine0", "spine1"}


# -- properties --------------------------------------------------------------

capacities = st.sampled_from([1.0, 2.0, 3.0, 5.0, 7.5, 10.0])


@st.composite
def incidences(draw):
    n_links = draw(st.integers(1, 6))
    n_flows = draw(st.integers(1, 10))
    flow_links = [
        sorted(draw(st.sets(st.integers(0, n_links - 1), min_size=1, max_size=n_links))) for _ in range(n_flows)
    ]
    caps = draw(st.lists(st.floats(0.5, 100.0), min_size=n_links, max_size=n_links))
    return flow_links, caps


def assert_max_min(flow_links, caps, rates, rtol=1e-6):
    load = np.zeros(len(caps))
    for links, r in zip(flow_links, rates):
        load[links] += r
    assert np.all(load <= np.asarray(caps) * (1 + rtol))
    for links, r in zip(flow_links, rates):
        assert r > 0
        bottleneck = [
            lk
            for lk in links
            if load[lk] >= caps[lk] * (1 - rtol)
            and r >= max(q for ls, q in zip(flow_links, rates) if lk in ls) * (1 - rtol)
        ]
        assert bottleneck, f"flow on {links} at {r} has no bottleneck"


@given(incidences())
@settings(max_examples=300, deadline=None)
def test_vectorised_solver_is_max_min_and_matches_reference(case):
    flow_links, caps = case
    flows, links = incidence(flow_links)
    rates = max_min_rates(flows, links, np.array(caps), len(flow_links))
    assert_max_min(flow_links, caps, rates)
    assert rates == pytest.approx(progressive_filling_reference(flow_links, caps), rel=1e-6)
    assert_max_min(flow_links, caps, progressive_filling_reference(flow_links, caps))


def test_solver_edge_cases():
    assert max_min_rates([], [], np.array([1.0]), 2).tolist() == [math.inf, math.inf]
    assert progressive_filling_reference([[], [0]], [4.0]) == [math.inf, 4.0]
    flow_in, link_in = component(np.array([0, 0, 1, 2]), np.array([0, 1, 1, 3]), np.array([0]), 4, 5)
    assert flow_in.tolist() == [True, True, False, False]
    assert link_in.tolist() == [True, True, False, False, False]


@st.composite
def scenarios(draw):
    n = draw(st.integers(2, 7))
    g = nx.Graph()
    g.add_nodes_from(f"v{i}" for i in range(n))
    pairs = [(draw(st.integers(0, i - 1)), i) for i in range(1, n)]  # a spanning tree ...
    pairs += draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=n))  # ... plus more
    for a, b in pairs:
        if a != b:
            link(g, f"v{a}", f"v{b}", draw(capacities), draw(st.sampled_from([0.0, 0.0, 0.1, 0.25])))
    node = st.integers(0, n - 1).map(lambda i: f"v{i}")
    transfers = draw(
        st.lists(
            st.builds(
                t,
                node,
                node,
                st.one_of(st.just(0), st.integers(1, 50), st.floats(0.01, 50.0)),
                st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.5]),
            ),
            min_size=1,
            max_size=10,
        )
    )
    return g, transfers


def trace(graph, transfers):
    """Step a network through ``transfers``; the rates in force after each instant."""
    env = simpy.Environment()
    net = Network(env, graph)
    xfers = {}

    def submit(i, x):
        xfers[i] = net.transfer(x["src"], x["dst"], x["bytes"], tag=i)

    for i, x in enumerate(transfers):
        env.timeout(x["start"]).callbacks.append(lambda _e, i=i, x=x: submit(i, x))
    snapshots = []
    while env.peek() < math.inf:
        env.step()
        if snapshots and snapshots[-1][0] == env.now:
            snapshots.pop()
        snapshots.append((env.now, net.active_rates()))
        if env.peek() > env.now:  # the instant is over: link totals and counts agree with the flows
            load = np.zeros(net.bandwidth.size)
            flows = np.zeros(net.bandwidth.size, dtype=int)
            for x, r in snapshots[-1][1].items():
                load[x.route.links] += r
                flows[x.route.links] += 1
            assert net.link_rates() == pytest.approx(load, rel=1e-9, abs=1e-12)
            assert net.link_flow_counts().tolist() == flows.tolist()
    return net, [xfers[i] for i in range(len(transfers))], snapshots


@given(scenarios())
@settings(max_examples=120, deadline=None)
def test_simulation_properties(scenario):
    graph, transfers = scenario
    times = simulate_transfers(graph, transfers)
    assert simulate_transfers(graph, transfers) == times  # deterministic, bit for bit
    net, xfers, snapshots = trace(graph, transfers)
    assert [x.value for x in xfers] == times
    caps = net.bandwidth
    sent = dict.fromkeys(xfers, 0.0)
    for (now, rates), (nxt, _) in zip(snapshots, snapshots[1:] + [(snapshots[-1][0], {})]):
        flow_links = [list(x.route.links) for x in rates]
        assert_max_min(flow_links, caps, list(rates.values()))
        for x, r in rates.items():
            sent[x] += r * (nxt - now)
    for x, spec in zip(xfers, transfers):
        if x.route.links.size:  # src == dst moves nothing over the network
            assert sent[x] == pytest.approx(x.nbytes, rel=1e-6, abs=1e-9)  # bytes conserved
        assert x.submitted == spec["start"]
        floor = x.submitted + x.latency + (x.nbytes / caps[x.route.links].min() if x.route.links.size else 0)
        assert x.value >= floor * (1 - 1e-9)
    stats = net.link_stats()
    for i, (u, v) in enumerate(net.router.links):
        on_link = [x for x in xfers if i in x.route.links and x.nbytes > 0]
        carried = sum(x.nbytes for x in on_link)
        assert stats[u, v].bytes == pytest.approx(carried, rel=1e-6, abs=1e-6)
        # busy: the measure of the union of the intervals its flows shared it
        busy, end = 0.0, -math.inf
        for lo, hi in sorted((x.started, x.value) for x in on_link):
            busy += max(0.0, hi - max(lo, end))
            end = max(end, hi)
        assert stats[u, v].busy_s == pytest.approx(busy, rel=1e-9, abs=1e-12)


def reference_times(graph: nx.Graph, transfers: list[dict]) -> list[float]:
    """A deliberately naive event loop: every instant re-solves all active flows from scratch."""
    router = Router(graph)
    cap = [0.0] * len(router.links)
    for i, (u, v) in enumerate(router.links):
        cap[i] = graph.edges[u, v]["bandwidth"]
    pending, done = [], [math.nan] * len(transfers)
    for i, x in enumerate(transfers):
        route = router.route(x["src"], x["dst"])
        begin = x["start"] + sum(graph.edges[a, b]["latency"] for a, b in itertools.pairwise(route.nodes))
        if x["src"] == x["dst"]:
            done[i] = x["start"]
        elif x["bytes"] == 0:
            done[i] = begin
        else:
            pending.append((begin, i, list(route.links)))
    pending.sort()
    active: dict[int, list] = {}  # i -> [links, remaining]
    now = 0.0
    while pending or active:
        ids = list(active)
        rates = progressive_filling_reference([active[i][0] for i in ids], cap)
        t_next = min([pending[0][0]] if pending else [math.inf])
        t_end = min((now + active[i][1] / r for i, r in zip(ids, rates)), default=math.inf)
        step = min(t_next, t_end)
        for i, r in zip(ids, rates):
            active[i][1] -= (step - now) * r
        now = step
        for i in ids:
            if active[i][1] <= 1e-9 * transfers[i]["bytes"]:
                done[i] = now
                del active[i]
        while pending and pending[0][0] <= now:
            _begin, i, links = pending.pop(0)
            active[i] = [links, float(transfers[i]["bytes"])]
    return done


@st.composite
def busy_scenarios(draw):
    """Few endpoints, many transfers: flows with the same route, shared links, starts and ends together."""
    n = draw(st.integers(3, 6))
    g = nx.Graph()
    for i in range(1, n):
        link(g, f"v{draw(st.integers(0, i - 1))}", f"v{i}", draw(capacities), draw(st.sampled_from([0.0, 0.1])))
    for _ in range(draw(st.integers(0, 3))):
        a, b = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        if a != b:
            link(g, f"v{a}", f"v{b}", draw(capacities), 0.0)
    node = st.integers(0, n - 1).map(lambda i: f"v{i}")
    size = st.sampled_from([1, 5, 10, 20, 37.5])
    start = st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0, 3.3])
    transfers = draw(st.lists(st.builds(t, node, node, size, start), min_size=1, max_size=30))
    return g, transfers


@given(busy_scenarios())
@settings(max_examples=150, deadline=None)
def test_network_matches_a_naive_global_resolve(scenario):
    graph, transfers = scenario
    assert simulate_transfers(graph, transfers) == pytest.approx(reference_times(graph, transfers), rel=1e-6)
    trace(graph, transfers)  # checks link totals and counts at every instant


def solved_by(graph, transfers, component_solve: bool, class_heaps: bool | None = None):
    """Completion times and the rates (by transfer index) after every step, with the network's
    component-local re-solve and its per-class heaps on or off (the heaps follow the re-solve unless
    given)."""
    env = simpy.Environment()
    net = Network(env, graph, component_solve=component_solve,
                  class_heaps=component_solve if class_heaps is None else class_heaps)
    xfers = {}
    for i, x in enumerate(transfers):
        env.timeout(x["start"]).callbacks.append(
            lambda _e, i=i, x=x: xfers.__setitem__(i, net.transfer(x["src"], x["dst"], x["bytes"], tag=i)))
    steps = []
    while env.peek() < math.inf:
        env.step()
        steps.append((env.now, sorted((x.tag, r) for x, r in net.active_rates().items()),
                      net.link_rates().tolist()))
    return [xfers[i].value for i in range(len(transfers))], steps


@given(st.one_of(scenarios(), busy_scenarios()))
@settings(max_examples=150, deadline=None)
def test_component_local_resolve_is_the_global_resolve_bit_for_bit(scenario):
    """Re-solving only the components an instant's starts and ends touch and keeping the flows'
    finishes in a heap per class (the defaults) give every flow the very rate, and every transfer the
    very completion time, of re-solving every class and scanning every flow; so does either alone."""
    graph, transfers = scenario
    reference = solved_by(graph, transfers, False)
    assert solved_by(graph, transfers, True) == reference
    assert solved_by(graph, transfers, True, class_heaps=False) == reference
    assert solved_by(graph, transfers, False, class_heaps=True) == reference


@given(st.one_of(scenarios(), busy_scenarios()))
@settings(max_examples=100, deadline=None)
def test_every_flow_is_sent_its_bytes_to_the_completion_tolerance(scenario):
    """Flows of a class progress on the class's clock: integrating each flow's own rate history
    (per-flow remaining-bytes bookkeeping) gives its size when it completes, to the completion
    tolerance and the rounding of the sums."""
    graph, transfers = scenario
    _net, xfers, snapshots = trace(graph, transfers)
    sent = dict.fromkeys(xfers, 0.0)
    for (now, rates), (nxt, _) in itertools.pairwise(snapshots):
        for x, r in rates.items():
            sent[x] += r * (nxt - now)
    rounding = 64 * np.finfo(float).eps * sum(float(x["bytes"]) for x in transfers)
    for x in xfers:
        if x.route.links.size and x.nbytes:
            assert abs(sent[x] - x.nbytes) <= COMPLETION_RTOL * x.nbytes + rounding


@st.composite
def weighted_incidences(draw):
    flow_links, caps = draw(incidences())
    weights = draw(st.lists(st.integers(1, 4), min_size=len(flow_links), max_size=len(flow_links)))
    return flow_links, caps, weights


@given(weighted_incidences())
@settings(max_examples=200, deadline=None)
def test_weighted_solver_is_the_solver_of_the_repeated_flows(case):
    flow_links, caps, weights = case
    flows, links = incidence(flow_links)
    weighted = max_min_rates(flows, links, np.array(caps), len(flow_links), weights=np.array(weights, dtype=float))
    repeated = [links_ for links_, k in zip(flow_links, weights) for _ in range(k)]
    expected = progressive_filling_reference(repeated, caps)
    assert [r for r, k in zip(weighted, weights) for _ in range(k)] == pytest.approx(expected, rel=1e-6)


# -- other contended resources -------------------------------------------------


jobs_lists = st.lists(
    st.tuples(st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.5]), st.sampled_from([0.0, 0.25, 1.0, 2.0])), min_size=1, max_size=25
)


def schedule(cores: int, jobs, server: str):
    """(time, "start"/"end", job) of ``jobs`` (arrival, seconds) on ``cores`` FIFO servers."""
    from conduit.sim.resources import FifoServer

    env = simpy.Environment()
    res = simpy.Resource(env, capacity=cores) if server == "simpy" else FifoServer(env, cores)
    log = []

    def job(i, arrive, seconds):
        yield env.timeout(arrive)
        if server == "simpy":
            with res.request() as req:
                yield req
                log.append((env.now, "start", i))
                yield env.timeout(seconds)
        else:
            yield res.acquire()
            log.append((env.now, "start", i))
            yield env.timeout(seconds)
            res.release()
        log.append((env.now, "end", i))

    for i, (arrive, seconds) in enumerate(jobs):
        env.process(job(i, arrive, seconds))
    env.run()
    return sorted(log)


@given(st.integers(1, 3), jobs_lists)
@settings(max_examples=150, deadline=None)
def test_fifo_server_schedules_like_a_simpy_resource(cores, jobs):
    assert schedule(cores, jobs, "fifo") == schedule(cores, jobs, "simpy")


@given(st.integers(1, 3), jobs_lists)
@settings(max_examples=100, deadline=None)
def test_cpu_pool_and_compute_engine_timing_and_busy_time(cores, jobs):
    from conduit.sim.resources import ComputeEngine, CpuPool

    for n, make in ((cores, lambda env: CpuPool(env, "n0", cores, speed=2.0)), (1, lambda env: ComputeEngine(env, "g"))):
        env = simpy.Environment()
        unit = make(env)
        ends = []

        def job(i, arrive, seconds, unit=unit, env=env, ends=ends):
            yield env.timeout(arrive)
            if isinstance(unit, CpuPool):
                yield from unit.work(2.0 * seconds)  # core-seconds at speed 2
            else:
                yield from unit.run(seconds)
            ends.append((env.now, "end", i))

        for i, (arrive, seconds) in enumerate(jobs):
            env.process(job(i, arrive, seconds))
        env.run()
        # zero-length work takes no core: it ends on arrival and queues nobody
        real = [i for i, (_a, seconds) in enumerate(jobs) if seconds > 0]
        expected = [(t_, kind, real[j]) for t_, kind, j in schedule(n, [jobs[i] for i in real], "simpy") if kind == "end"]
        expected += [(arrive, "end", i) for i, (arrive, seconds) in enumerate(jobs) if seconds <= 0]
        assert sorted(ends) == sorted(expected)
        busy = unit.busy_core_seconds if isinstance(unit, CpuPool) else unit.busy_seconds
        assert busy == pytest.approx(sum(seconds for _arrive, seconds in jobs))


# -- errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("transfers", "message"),
    [
        ([t("n0", "n1", 1), t("n0", "gpu9", 1)], "transfers[1].dst: unknown device 'gpu9'"),
        ([{"src": "n0", "dst": "n1"}], "transfers[0].bytes: missing"),
        ([{"dst": "n1", "bytes": 1}], "transfers[0].src: missing"),
        ([t("n0", "n1", -1)], "transfers[0].bytes: must be"),
        ([t("n0", "n1", "1 GB")], "transfers[0].bytes: must be a number"),
        ([t("n0", "n1", 1), t("n0", "n1", 1), t("n0", "n1", 1, start=-2)], "transfers[2].start: must be"),
        ([5], "transfers[0]: expected a mapping"),
        ([t("n0", "island", 1)], "transfers[0]: no path from 'n0' to 'island'"),
    ],
)
def test_bad_transfers_are_named(transfers, message):
    g = chain(1)
    g.add_node("island")
    with pytest.raises(ConduitError) as err:
        simulate_transfers(g, transfers)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"latency": 0.0}, "edges['n0', 'n1'].bandwidth: missing"),
        ({"bandwidth": 0.0, "latency": 0.0}, "edges['n0', 'n1'].bandwidth: must be"),
        ({"bandwidth": "fast", "latency": 0.0}, "edges['n0', 'n1'].bandwidth: must be a number"),
        ({"bandwidth": 1.0}, "edges['n0', 'n1'].latency: missing"),
        ({"bandwidth": 1.0, "latency": -1.0}, "edges['n0', 'n1'].latency: must be"),
        ({"bandwidth": 1.0, "latency": math.nan}, "edges['n0', 'n1'].latency: must be"),
    ],
)
def test_bad_edges_are_named(attrs, message):
    g = nx.Graph()
    g.add_edge("n0", "n1", **attrs)
    with pytest.raises(ConduitError) as err:
        simulate_transfers(g, [t("n0", "n1", 1)])
    assert message in str(err.value)


def test_bad_topologies_and_network_arguments():
    with pytest.raises(ConduitError, match="topology: expected"):
        simulate_transfers(42, [])
    with pytest.raises(ConduitError, match="directed"):
        simulate_transfers(nx.DiGraph(chain(1)), [])
    net = Network(simpy.Environment(), chain(1))
    with pytest.raises(ConduitError, match="src: unknown device 'x'"):
        net.transfer("x", "n1", 1)
    with pytest.raises(ConduitError, match="nbytes: must be"):
        net.transfer("n0", "n1", -1)
