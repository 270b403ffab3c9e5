"""Hop-count shortest-path routing with deterministic ECMP.

The model: every undirected edge ``{u, v}`` of the topology graph is a full-duplex
link made of two independent *directed links*, ``u -> v`` and ``v -> u``. Edge
number ``e`` (in ``graph.edges()`` order, self-loops skipped) owns directed links
``2e`` (``u -> v`` as networkx lists the edge) and ``2e + 1`` (the reverse); the
flow solver and the link statistics use these indices.

A transfer from ``src`` to ``dst`` follows a path with the fewest hops. Where
several such paths exist (equal-cost multi-path, ECMP), the walk from ``src``
picks the next hop at each node among the neighbours one hop closer to ``dst``:

1. *widest first*: only the neighbours through which the widest bottleneck is
   still reachable are candidates. ``width[v]``, the largest bottleneck
   bandwidth of any hop-shortest path from ``v`` to ``dst``, is a dynamic
   programme over the BFS DAG towards ``dst``: ``width[dst] = inf`` and
   ``width[v] = max(min(bandwidth(v, n), width[n]))`` over the neighbours ``n``
   one hop closer. So the route is always a hop-count shortest path whose
   slowest link is as fast as possible (the path
   :meth:`conduit.topology.Topology.widest_shortest_path` measures): two GPUs
   behind one PCIe switch that also share an NVSwitch talk over NVLink, not
   over the switch. Edges without a numeric ``bandwidth`` count as infinitely
   wide (the network itself rejects them).
2. *ECMP among equals*: where several candidates lead to the same width, the
   pick hashes ``(src, dst, current node)`` with CRC-32 — a stable hash, so the
   same graph routes the same way in every process, whatever
   ``PYTHONHASHSEED`` is. Candidates are ordered by ``repr(node)`` before
   hashing, so the choice depends only on the node names, not on the order the
   graph was built in; node names should therefore have a stable ``repr``
   (strings, ints, tuples of those).

Every pair of endpoints has a single route; routes are cached.

Distances are one breadth-first search per destination (run by
:mod:`scipy.sparse.csgraph`, depths by pointer jumping in NumPy) and widths one
vectorised pass per BFS layer, both cached, so routing on a fat tree of
thousands of nodes costs one C-level BFS per distinct destination plus a few
array operations per layer and per hop.
"""

from __future__ import annotations

import math
import numbers
import zlib
from collections.abc import Hashable
from typing import NamedTuple

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order

from conduit.errors import ConduitError

Node = Hashable


class Route(NamedTuple):
    """The path a transfer takes: its nodes, and the directed links between them."""

    nodes: tuple[Node, ...]
    links: np.ndarray  # directed link indices (intp, read-only), len(nodes) - 1 of them


class Router:
    """Deterministic hop-count shortest-path routes over an undirected graph."""

    def __init__(self, graph: nx.Graph) -> None:
        if not isinstance(graph, nx.Graph):
            raise ConduitError(f"graph: expected a networkx.Graph, got {type(graph).__name__}")
        if graph.is_directed():
            raise ConduitError(
                "graph: directed graphs are not supported; links are full duplex, so give an undirected networkx.Graph"
            )
        if graph.is_multigraph():
            raise ConduitError("graph: multigraphs are not supported; merge parallel links into one edge")
        self.nodes: list[Node] = list(graph.nodes)
        self._index: dict[Node, int] = {node: i for i, node in enumerate(self.nodes)}
        #: Undirected edges, ``edges[e] == (u, v)``; directed links ``2e`` and ``2e + 1``.
        self.edges: list[tuple[Node, Node]] = [(u, v) for u, v in graph.edges if u != v]
        #: Directed links, ``links[i] == (from, to)``.
        self.links: list[tuple[Node, Node]] = []
        for u, v in self.edges:
            self.links += [(u, v), (v, u)]
        self._link_index = {link: i for i, link in enumerate(self.links)}
        width = []
        for u, v in self.edges:
            bw = graph.edges[u, v].get("bandwidth")
            ok = isinstance(bw, numbers.Real) and not isinstance(bw, bool) and not math.isnan(bw)
            width += [float(bw) if ok else math.inf] * 2
        #: Per directed link: the bandwidth the widest-path choice compares (inf when unknown).
        self._width = np.array(width, dtype=np.float64)

        n = len(self.nodes)
        tails = np.array([self._index[u] for u, _ in self.links], dtype=np.intp)
        heads = np.array([self._index[v] for _, v in self.links], dtype=np.intp)
        self._tails, self._heads = tails, heads
        order = np.lexsort((heads, tails))
        self._nbr = heads[order]  # CSR adjacency: neighbours of node i ...
        self._nbr_link = order.astype(np.intp)  # ... and the directed link to each
        self._indptr = np.concatenate(([0], np.cumsum(np.bincount(tails, minlength=n))))
        self._adjacency = csr_matrix((np.ones(len(self.links)), (tails, heads)), shape=(n, n))
        ranks = sorted(range(n), key=lambda i: (type(self.nodes[i]).__name__, repr(self.nodes[i])))
        self._rank = np.empty(n, dtype=np.intp)
        self._rank[ranks] = np.arange(n)
        self._dist: dict[int, np.ndarray] = {}
        self._widths: dict[int, np.ndarray] = {}
        self._routes: dict[tuple[Node, Node], Route] = {}

    def __contains__(self, node: object) -> bool:
        try:
            return node in self._index
        except TypeError:  # unhashable
            return False

    def link_index(self, u: Node, v: Node) -> int:
        """The index of the directed link ``u -> v``."""
        try:
            return self._link_index[(u, v)]
        except KeyError:
            raise ConduitError(f"no link {u!r} -> {v!r}") from None

    def route(self, src: Node, dst: Node) -> Route:
        """The route from ``src`` to ``dst`` (cached); ``src == dst`` has no links."""
        key = (src, dst)
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = self._walk(src, dst)
        return route

    def _distances(self, dst: int) -> np.ndarray:
        """Hops from every node to ``dst`` (-1: unreachable), from one BFS tree."""
        dist = self._dist.get(dst)
        if dist is None:
            order, parent = breadth_first_order(self._adjacency, dst, directed=True, return_predecessors=True)
            # Depth in the BFS tree by pointer jumping: hops[v] counts the tree
            # edges from v up to up[v]; doubling up[] reaches the root in log2(depth) steps.
            up = np.arange(self._rank.size)
            up[order[1:]] = parent[order[1:]]
            hops = np.zeros(self._rank.size, dtype=np.int64)
            hops[order[1:]] = 1
            while True:
                upup = up[up]
                if np.array_equal(upup, up):
                    break
                hops = hops + hops[up]
                up = upup
            reached = np.zeros(self._rank.size, dtype=bool)
            reached[order] = True
            dist = self._dist[dst] = np.where(reached, hops, -1).astype(np.int32)
        return dist

    def _bottlenecks(self, dst: int) -> np.ndarray:
        """``width[v]``: the widest bottleneck of a hop-shortest path from ``v`` to ``dst``.

        One pass per BFS layer, nearest first: every DAG link ``v -> n`` (``n`` one
        hop closer to ``dst``) offers ``min(bandwidth, width[n])`` to ``v``.
        Unreachable nodes get ``-inf``.
        """
        width = self._widths.get(dst)
        if width is None:
            dist = self._distances(dst)
            width = np.full(dist.size, -math.inf)
            width[dst] = math.inf
            depth = int(dist.max())
            if self._tails.size and depth > 0:
                # small integer keys: the stable argsort below is then a radix sort
                key = dist.astype(np.int16 if depth < 2**15 else np.int64)
                tail_key = key[self._tails]
                dag = np.flatnonzero(tail_key - key[self._heads] == 1)  # unreachable: -1 - -1 = 0
                layer = tail_key[dag]
                by_layer = np.argsort(layer, kind="stable")
                dag, layer = dag[by_layer], layer[by_layer]
                bounds = np.searchsorted(layer, np.arange(1, depth + 2))
                for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
                    e = dag[lo:hi]
                    np.maximum.at(width, self._tails[e], np.minimum(self._width[e], width[self._heads[e]]))
            self._widths[dst] = width
        return width

    def _walk(self, src: Node, dst: Node) -> Route:
        for name, node in (("src", src), ("dst", dst)):
            if node not in self:
                raise ConduitError(f"{name}: unknown device {node!r}")
        s, d = self._index[src], self._index[dst]
        dist = self._distances(d)
        if dist[s] < 0:
            raise ConduitError(f"no path from {src!r} to {dst!r}")
        width = None
        nodes, links = [s], []
        cur = s
        while cur != d:
            lo, hi = self._indptr[cur], self._indptr[cur + 1]
            nbrs = self._nbr[lo:hi]
            closer = np.flatnonzero(dist[nbrs] == dist[cur] - 1)
            if closer.size > 1:  # widest first, then ECMP among the equally wide
                if width is None:
                    width = self._bottlenecks(d)
                offer = np.minimum(self._width[self._nbr_link[lo + closer]], width[nbrs[closer]])
                closer = closer[offer == offer.max()]
            if closer.size > 1:
                closer = closer[np.argsort(self._rank[nbrs[closer]], kind="stable")]
                salt = repr((src, dst, self.nodes[cur])).encode("utf-8")
                pick = closer[zlib.crc32(salt) % closer.size]
            else:
                pick = closer[0]
            links.append(self._nbr_link[lo + pick])
            cur = int(nbrs[pick])
            nodes.append(cur)
        link_array = np.array(links, dtype=np.intp)
        link_array.flags.writeable = False
        return Route(tuple(self.nodes[i] for i in nodes), link_array)
