"""Max-min fair bandwidth sharing: the flow-level solver.

The model (as in SimGrid's flow-level network models): a set of flows crosses a
set of directed links, link ``l`` has capacity ``c[l]`` (bytes/s), and every flow
gets a rate. An allocation is *max-min fair* when no flow's rate can be raised
without lowering the rate of a flow that has an equal or smaller rate. A feasible
allocation is max-min fair exactly when every flow crosses a *bottleneck*: a link
that is saturated (its flows' rates add up to its capacity) and on which that
flow's rate is the largest.

The incidence is given as index arrays, one entry per (flow, link) crossing:
``flows[k]`` crosses ``links[k]`` (the COO form of the flows × links incidence
matrix). A flow crosses a link at most once. A flow that crosses no link is not
constrained and gets an infinite rate.

:func:`max_min_rates` is the vectorised bottleneck algorithm (progressive
filling). In each round every link's fair share is its unused capacity divided
by its unfixed flows, and a link is a *bottleneck* when its share is the
smallest that any of its flows sees on any of its links. A bottleneck's flows
are fixed at its share: the other links they cross saturate no earlier (a
link's share only grows as its flows are fixed below it), so nothing can hold
them lower. The textbook algorithm fixes only the global minimum each round;
fixing every such local minimum at once gives the same allocation in far fewer
rounds (one per "chain" of nested bottlenecks rather than one per distinct
level). A round is a dozen NumPy operations over the entries not yet fixed, so a
solve costs O(rounds x entries) in C.

:func:`progressive_filling_reference` is the textbook water-filling with Python
loops, kept as the oracle for tests and the baseline for the benchmark.

With ``weights``, one row of the incidence stands for several identical flows
(same links, hence the same max-min rate): :class:`~conduit.sim.network.Network`
solves one row per route class, weighted by the flows in it. Because the
bottleneck rounds act on every component at once and each component's
arithmetic only involves its own links, solving all active classes together
gives every component the rates it would get alone.

:func:`component` finds what a change disturbs: the flows and links connected
to some seed links in the flow–link bipartite graph. When a flow starts or ends,
only the rates in its component can change; :func:`resolve_component` re-solves
just that (the benchmark's unit of work).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

#: Relative tolerance under which two fair shares count as the same water level.
RTOL = 1e-9


def max_min_rates(
    flows: np.ndarray,
    links: np.ndarray,
    capacity: np.ndarray,
    n_flows: int | None = None,
    *,
    rtol: float = RTOL,
    weights: np.ndarray | None = None,
    unconstrained: float = np.inf,
) -> np.ndarray:
    """Max-min fair rates of ``n_flows`` flows; ``flows[k]`` crosses ``links[k]``.

    ``capacity[l]`` is link ``l``'s capacity (> 0). Returns a float array of
    ``n_flows`` rates (``unconstrained``, by default ``inf``, for a flow that
    crosses no link).

    ``weights[i]`` (optional, integers >= 1 as floats) makes flow ``i`` stand for
    that many identical flows — flows with the same links, which max-min
    fairness always gives the same rate; each of them gets the returned rate.
    """
    f = np.asarray(flows, dtype=np.intp)
    l_ = np.asarray(links, dtype=np.intp)
    remaining = np.array(capacity, dtype=np.float64)
    n_links = remaining.size
    if n_flows is None:
        n_flows = int(f.max()) + 1 if f.size else 0
    rates = np.full(n_flows, unconstrained, dtype=np.float64)
    if not f.size:
        return rates
    if weights is None:
        w = None
        count = np.bincount(l_, minlength=n_links).astype(np.float64)
    else:
        w = np.asarray(weights, dtype=np.float64)[f]  # per entry
        count = np.bincount(l_, weights=w, minlength=n_links)
    fixed = np.zeros(n_flows, dtype=bool)
    share = np.zeros(n_links)  # a link without unfixed flows keeps a stale share: no entry reads it
    tightest = np.empty(n_flows)  # per flow: the smallest share among its links
    seen = np.empty(n_links)  # per link: the smallest share its flows see anywhere
    level = 1.0 + rtol
    while True:
        np.divide(remaining, count, out=share, where=count > 0)
        tightest.fill(np.inf)
        np.minimum.at(tightest, f, share[l_])
        entry_rate = tightest[f]
        seen.fill(np.inf)
        np.minimum.at(seen, l_, entry_rate)
        bottleneck = share <= seen * level
        fixed[f[bottleneck[l_]]] = True
        done = fixed[f]
        rates[f] = entry_rate  # final for the fixed; the others are overwritten later
        if done.all():
            return rates
        l_done = l_[done]
        if w is None:
            remaining -= np.bincount(l_done, weights=entry_rate[done], minlength=n_links)
            count -= np.bincount(l_done, minlength=n_links)
        else:
            w_done = w[done]
            remaining -= np.bincount(l_done, weights=entry_rate[done] * w_done, minlength=n_links)
            count -= np.bincount(l_done, weights=w_done, minlength=n_links)
            w = w[~done]
        np.maximum(remaining, 0.0, out=remaining)
        keep = ~done
        f, l_ = f[keep], l_[keep]


def progressive_filling_reference(
    flow_links: Sequence[Sequence[int]],
    capacity: Sequence[float],
    *,
    rtol: float = RTOL,
) -> list[float]:
    """Textbook progressive filling, one Python loop per step; the test oracle.

    ``flow_links[i]`` lists the links flow ``i`` crosses. All unfrozen flows'
    rates rise together until some link saturates; the flows crossing a
    saturated link freeze; repeat until every flow is frozen.
    """
    n = len(flow_links)
    rates = [0.0] * n
    remaining = [float(c) for c in capacity]
    frozen = [not links for links in flow_links]
    for i, links in enumerate(flow_links):
        if not links:
            rates[i] = float("inf")
    while not all(frozen):
        count = [0] * len(remaining)
        for i, links in enumerate(flow_links):
            if not frozen[i]:
                for link in links:
                    count[link] += 1
        step = min(remaining[link] / count[link] for link in range(len(remaining)) if count[link])
        for i, links in enumerate(flow_links):
            if not frozen[i]:
                rates[i] += step
                for link in links:
                    remaining[link] -= step
        saturated = [count[link] > 0 and remaining[link] <= rtol * capacity[link] for link in range(len(remaining))]
        for i, links in enumerate(flow_links):
            if not frozen[i] and any(saturated[link] for link in links):
                frozen[i] = True
    return rates


def component(
    flows: np.ndarray,
    links: np.ndarray,
    seed_links: np.ndarray,
    n_flows: int,
    n_links: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The flows and links reachable from ``seed_links`` over the incidence.

    Breadth-first search in the flow–link bipartite graph, one frontier per step
    (a few vectorised passes over the entries not yet reached). Returns boolean
    masks ``(flow_in, link_in)`` of sizes ``n_flows`` and ``n_links``; the seed
    links are always in ``link_in``, even when no flow crosses them.
    """
    f = np.asarray(flows, dtype=np.intp)
    l_ = np.asarray(links, dtype=np.intp)
    flow_in = np.zeros(n_flows, dtype=bool)
    link_in = np.zeros(n_links, dtype=bool)
    link_in[seed_links] = True
    while f.size:
        hit = link_in[l_]
        if not hit.any():
            break
        flow_in[f[hit]] = True
        reached = flow_in[f]
        link_in[l_[reached]] = True
        keep = ~reached
        f, l_ = f[keep], l_[keep]
    return flow_in, link_in


class Resolve(NamedTuple):
    """The outcome of re-solving one component."""

    flows: np.ndarray  # ids of the flows in the component
    links: np.ndarray  # ids of its links (the seed links included)
    rates: np.ndarray  # the new rate of each of ``flows``
    link_rates: np.ndarray  # the new total rate on each of ``links``


Solver = Callable[[np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]


def resolve_component(
    flows: np.ndarray,
    links: np.ndarray,
    seed_links: np.ndarray,
    capacity: np.ndarray,
    n_flows: int,
    *,
    solver: Solver = max_min_rates,
) -> Resolve:
    """Re-solve only what a change at ``seed_links`` can disturb.

    Finds the :func:`component` of ``seed_links`` in the incidence
    ``(flows, links)`` (ids below ``n_flows`` and ``capacity.size``), renumbers
    it densely and runs ``solver`` (same signature as :func:`max_min_rates`) on
    it alone. Every flow outside the component keeps its rate: none of its links
    is shared with a flow inside.
    """
    flow_in, link_in = component(flows, links, seed_links, n_flows, capacity.size)
    comp_flows = np.flatnonzero(flow_in)
    comp_links = np.flatnonzero(link_in)
    entries = flow_in[flows]
    local_flow = np.empty(n_flows, dtype=np.intp)
    local_flow[comp_flows] = np.arange(comp_flows.size)
    local_link = np.empty(capacity.size, dtype=np.intp)
    local_link[comp_links] = np.arange(comp_links.size)
    lf = local_flow[flows[entries]]
    ll = local_link[links[entries]]
    rates = solver(lf, ll, capacity[comp_links], comp_flows.size) if comp_flows.size else np.zeros(0)
    link_rates = np.bincount(ll, weights=rates[lf], minlength=comp_links.size)
    return Resolve(comp_flows, comp_links, rates, link_rates)


def incidence(flow_links: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """The ``(flows, links)`` index arrays of per-flow link lists."""
    lengths = [len(links) for links in flow_links]
    flows = np.repeat(np.arange(len(flow_links), dtype=np.intp), lengths)
    links = (
        np.concatenate([np.asarray(x, dtype=np.intp) for x in flow_links]) if flows.size else np.zeros(0, dtype=np.intp)
    )
    return flows, links
