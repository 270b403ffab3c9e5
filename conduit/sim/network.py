"""A flow-level network: transfers sharing full-duplex links max-min fairly.

The model, in the tradition of SimGrid's flow-level network models:

* The topology is an undirected :class:`networkx.Graph` whose edges carry
  ``bandwidth`` (bytes/s, > 0) and ``latency`` (s, >= 0). Each edge is full
  duplex: its two directions are independent links with the full bandwidth.
* A transfer follows its hop-count shortest route (see :mod:`.routing`). It
  first waits the sum of its links' latencies, then becomes a *flow* that shares
  bandwidth max-min fairly (see :mod:`.maxmin`) with every active flow on each
  directed link it crosses, and completes when its last byte arrives.
* Rates change only when a flow starts or ends. A transfer with ``src == dst``
  completes at once; one of 0 bytes completes after its route's latency.

How it is simulated. Nothing happens between flow starts and ends, so the
network keeps no per-byte state. All starts and ends at one instant are batched
into a single re-solve at that instant, run by a zero-delay event queued behind
every event already due then. Progress is kept per route class, not per flow
(see :mod:`.flowclock`): the flows of a class share one rate, so one virtual
clock per class (the bytes each of its flows has been served since the class
last had no flow) gives every flow's remaining bytes, and a class's next
completion is that of its flow with the smallest finishing virtual bytes (a
heap per class). A re-rate advances the clocks of the classes whose rate
changed, whatever the number of their flows.

*Route classes.* Flows with the same endpoints cross the same links, so max-min
fairness gives them the same rate. The solver therefore works on classes, one
per ``(src, dst)`` pair in use, weighted by how many flows each holds (on the
DGX fabrics hundreds of flows fall into a few dozen classes: every runner of a
node sends to the same driver memory).

*Fast paths.* Each directed link counts the flows on it. A flow that starts
alone on every link of its route gets its route's bottleneck capacity and
disturbs nobody; a flow that ends leaving all its links empty frees them and
disturbs nobody. An instant whose starts and ends are all of these kinds runs
no solve at all.

*Re-solves.* Otherwise the instant re-solves every active class at once with
the vectorised bottleneck algorithm: it fixes every local bottleneck of every
component in the same round, so independent components cost no extra rounds,
and the arithmetic of each component is the same as if it were solved alone,
so a class whose component did not change gets bit for bit its old rate. Only
classes whose rate changed have their clock advanced and their next finish
re-predicted; every other class keeps its predicted finish, exactly as a
component-local re-solve would leave it. The solve runs on compact numberings of the classes and links in use
(incidence entries are kept incrementally and compacted when classes empty),
so its cost follows the active flows, not the size of the fabric.

SimPy cannot cancel an event, so the network keeps a single completion timer
for the earliest predicted finish over all flows (over the classes' next finishes). Each time it is armed it gets
a new epoch number; a timer that fires with an old epoch is stale and does
nothing. When the timer fires, every flow whose remaining bytes are within a
relative epsilon of zero completes, which absorbs floating-point crumbs.

Link statistics cost nothing while the simulation runs: a link is busy from
the instant its flow count leaves zero until it returns to zero (plain counters
at flow start and end), and the bytes a link carried are the bytes its flows
sent — every route class sums what its completed flows sent, and
:meth:`Network.link_stats` adds the progress of the active ones when asked.
The total rate on each link (:meth:`Network.link_rates`) is kept current at
every instant's re-solve.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np
import simpy

from conduit.errors import ConduitError, TopologyError
from conduit.sim import maxmin
from conduit.sim.flowclock import FlowClocks, HeapClocks, ScanClocks, grown
from conduit.sim.routing import Route, Router

#: Re-solves that skip the component search after it found one component holding every class.
WHOLE_SOLVES = 16

#: A flow completes when its remaining bytes are at most this fraction of its size.
COMPLETION_RTOL = 1e-9


class Transfer(simpy.Event):
    """A point-to-point transfer; the event succeeds with its completion time.

    Attributes: ``src``, ``dst``, ``nbytes``, ``tag`` (anything the caller
    passed), ``route``, ``latency`` (sum over the route), ``submitted`` (when
    :meth:`Network.transfer` was called), ``started`` (when it began sharing
    bandwidth: ``submitted + latency``) and ``completed`` (``None`` until done).
    """

    def __init__(
        self,
        env: simpy.Environment,
        src: Hashable,
        dst: Hashable,
        nbytes: float,
        tag: Any,
        route: Route,
        latency: float,
    ) -> None:
        super().__init__(env)
        self.src = src
        self.dst = dst
        self.nbytes = nbytes
        self.tag = tag
        self.route = route
        self.latency = latency
        self.submitted: float = env.now
        self.started: float | None = None
        self.completed: float | None = None
        self._cls = 0  # the network's route class (0: none)

    def __repr__(self) -> str:
        return f"<Transfer {self.src!r}->{self.dst!r} {self.nbytes} B tag={self.tag!r}>"


@dataclass(frozen=True)
class LinkStats:
    """What one directed link ``src -> dst`` carried so far."""

    src: Hashable
    dst: Hashable
    bandwidth: float  # bytes/s
    latency: float  # s
    bytes: float  # bytes carried
    busy_s: float  # time with at least one flow sharing it

    def utilization(self, horizon: float) -> float:
        """Carried bytes over what the link could carry in ``horizon`` seconds."""
        return self.bytes / (self.bandwidth * horizon) if horizon > 0 else 0.0


def _edge_attribute(u: Hashable, v: Hashable, data: dict, name: str, unit: str, positive: bool) -> float:
    field = f"edges[{u!r}, {v!r}].{name}"
    if name not in data:
        raise TopologyError("<graph>", field, f"missing (a number in {unit})")
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TopologyError("<graph>", field, f"must be a number in {unit}, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise TopologyError("<graph>", field, f"must be a finite number {bound} in {unit}, got {value!r}")
    return value


class Network:
    """Transfers over ``graph`` in ``env``, sharing links max-min fairly.

    ``multiplicity`` (graph node -> count, a folded simulation's representatives, :mod:`conduit.sim.fold`):
    a transfer with an end on such a node stands for that many identical flows (the larger count of its
    two ends), its route class weighted by it in the solver, the links' flow counts and their bytes.

    Counters: ``events`` (flow starts and completions handled), ``resolves``
    (instants whose starts or ends gave some flow a new rate: a fast-path
    start or a re-solve) and ``resolved_flows`` (flows those instants gave a
    rate, summed; over ``resolves`` it is the mean number of flows re-rated).
    """

    def __init__(self, env: simpy.Environment, graph: nx.Graph, *, component_solve: bool = True,
                 class_heaps: bool = True, multiplicity: Mapping[Hashable, int] | None = None) -> None:
        self.env = env
        #: graph node -> how many identical devices it stands for (a folded simulation,
        #: :mod:`conduit.sim.fold`): a flow with an end there stands for that many flows
        self.multiplicity = dict(multiplicity or {})
        #: re-solve only the components an instant's starts and ends touch (exact; False: every
        #: active class at every re-solve, the reference)
        self.component_solve = component_solve
        #: flows' finishes kept per class in heaps (exact; False: every active flow scanned at every
        #: query, the reference); see :mod:`.flowclock`
        self.class_heaps = class_heaps
        self._clocks: FlowClocks = HeapClocks() if class_heaps else ScanClocks()
        self._whole_left = 0  # re-solves left that solve every class without a component search
        self.router = Router(graph)
        bandwidth, latency = [], []
        for u, v in self.router.edges:
            data = graph.edges[u, v]
            bw = _edge_attribute(u, v, data, "bandwidth", "bytes/s", positive=True)
            lat = _edge_attribute(u, v, data, "latency", "s", positive=False)
            bandwidth += [bw, bw]
            latency += [lat, lat]
        #: Per directed link (indexed like ``router.links``): bytes/s and seconds.
        self.bandwidth = np.array(bandwidth, dtype=np.float64)
        self.latency = np.array(latency, dtype=np.float64)
        self.events = 0
        self.resolves = 0
        self.resolved_flows = 0
        #: Bumped at every instant whose starts or ends may change a rate: while it is unchanged, so
        #: are the link rates (readers keep what they derived from them).
        self.rates_version = 0

        n_links = self.bandwidth.size
        self._n_links = n_links
        # Per directed link, plus an always-idle sentinel at index n_links.
        self._link_rate = np.zeros(n_links + 1)  # sum of the rates of the flows on it
        #: The same array, for readers that index a few links at a time (``item(i)``); read only.
        self.link_rate_values = self._link_rate
        self._count = [0] * n_links  # flows on each link
        self._busy_s = [0.0] * n_links  # length of the link's finished busy periods
        self._busy_since = [0.0] * n_links  # start of the current one (while count > 0)

        # Route classes (global ids; 0 is "no class", the class of free slots).
        self._class_of: dict[tuple[Hashable, Hashable], int] = {}
        self._c_route: list[Route | None] = [None]
        self._c_links: list[tuple[int, ...]] = [()]
        self._c_solo: list[float] = [0.0]  # the route's bottleneck capacity
        self._c_latency: list[float] = [0.0]
        self._c_mult: list[int] = [0]  # active flows in the class (each counted as its weight)
        self._c_weight: list[int] = [1]  # the flows each transfer of the class stands for
        self._c_local: list[int] = [0]  # listed id (0: not listed)
        self._c_bytes: list[float] = [0.0]  # bytes the class's completed flows sent

        # Listed classes: those whose incidence entries are kept for the solver,
        # numbered compactly from 1 (0 is a dummy that never has a flow).
        self._l_mult = np.zeros(8)
        self._l_rate = np.zeros(8)  # the rate the class's flows have now
        self._l_gid = np.zeros(8, dtype=np.intp)  # the class of each listed id
        self._l_free: list[int] = []
        self._n_l = 1
        self._unlisted: set[int] = set()  # active classes not listed (each alone on its links)
        self._dead: set[int] = set()  # listed ids whose class has no flow left
        # Links of listed classes, numbered compactly from 0.
        self._k_of = [-1] * n_links
        self._k_glob = np.full(8, n_links, dtype=np.intp)  # sentinel for free ids
        self._k_cap = np.ones(8)
        self._k_users = [0] * n_links  # listed classes crossing each link
        self._k_free: list[int] = []
        self._n_k = 0
        # The classes x links incidence of listed classes, as COO entries.
        self._ent_c = np.zeros(0, dtype=np.intp)
        self._ent_k = np.zeros(0, dtype=np.intp)

        # Flows live in slots (their progress in ``_clocks``); freed slots are reused.
        self._xfer: list[Transfer | None] = []
        self._free: list[int] = []

        self._starting: list[Transfer] = []  # began sharing bandwidth, not yet solved
        self._ended: list[int] = []  # classes of flows that ended, not yet solved
        self._flush_pending = False
        self._epoch = 0  # completion timers carry the epoch they were armed in
        self._armed_at: float | None = None

    # -- public interface -------------------------------------------------

    def route(self, src: Hashable, dst: Hashable) -> Route:
        """The route a transfer from ``src`` to ``dst`` takes."""
        return self.router.route(src, dst)

    def transfer(self, src: Hashable, dst: Hashable, nbytes: float, *, tag: Any = None) -> Transfer:
        """Start moving ``nbytes`` from ``src`` to ``dst`` now.

        Returns an event that succeeds with the completion time (the time the
        last byte arrives).
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real):
            raise ConduitError(f"nbytes: must be a number of bytes, got {nbytes!r}")
        if not (math.isfinite(nbytes) and nbytes >= 0):
            raise ConduitError(f"nbytes: must be a finite number >= 0, got {nbytes!r}")
        cls = self._class_of.get((src, dst))
        if cls is None:
            cls = self._new_class(src, dst)
        latency = self._c_latency[cls]
        xfer = Transfer(self.env, src, dst, nbytes, tag, self._c_route[cls], latency)
        xfer._cls = cls
        if src == dst:
            self._complete(xfer)
        elif latency > 0:
            self.env.timeout(latency, xfer).callbacks.append(self._after_latency)
        else:
            self._begin(xfer)
        return xfer

    def active_rates(self) -> dict[Transfer, float]:
        """The current rate (bytes/s) of every transfer sharing bandwidth."""
        rate, cls = self._clocks.rate, self._clocks.cls
        return {x: float(rate[cls[i]]) for i, x in enumerate(self._xfer) if x is not None}

    def link_rates(self) -> np.ndarray:
        """Total rate (bytes/s) of the flows on each directed link now (read-only view).

        Indexed like ``router.links``. Starts and ends at the current instant
        count once the instant's re-solve has run.
        """
        view = self._link_rate[: self._n_links]
        view.flags.writeable = False
        return view

    def link_flow_counts(self) -> np.ndarray:
        """How many flows share each directed link now (indexed like ``router.links``)."""
        return np.array(self._count, dtype=np.intp)

    def link_stats(self) -> dict[tuple[Hashable, Hashable], LinkStats]:
        """Bytes carried and busy time of every directed link, up to now.

        Starts and ends at the current instant count once the instant's
        re-solve has run.
        """
        now = self.env.now
        carried = np.zeros(self._n_links + 1)
        sent = dict(enumerate(self._c_bytes))
        clocks = self._clocks
        live = clocks.live_slots()
        progress = clocks.nbytes[live] - clocks.remaining(live, now)
        for cls, nbytes in zip(clocks.cls[live].tolist(), progress.tolist()):
            sent[cls] += nbytes * self._c_weight[cls]
        for cls, nbytes in sent.items():
            if nbytes:
                carried[self._c_route[cls].links] += nbytes
        count, since = self._count, self._busy_since
        busy = [b + (now - since[i] if count[i] else 0.0) for i, b in enumerate(self._busy_s)]
        return {
            (u, v): LinkStats(
                u,
                v,
                float(self.bandwidth[i]),
                float(self.latency[i]),
                float(carried[i]),
                busy[i],
            )
            for i, (u, v) in enumerate(self.router.links)
        }

    # -- route classes ----------------------------------------------------

    def _new_class(self, src: Hashable, dst: Hashable) -> int:
        route = self.router.route(src, dst)
        cls = len(self._c_route)
        if self._clocks.add_class() != cls:
            raise AssertionError("flow clocks and route classes out of step")
        self._c_route.append(route)
        self._c_links.append(tuple(route.links.tolist()))
        self._c_solo.append(float(self.bandwidth[route.links].min()) if route.links.size else math.inf)
        self._c_latency.append(float(self.latency[route.links].sum()))
        self._c_mult.append(0)
        mult = self.multiplicity
        self._c_weight.append(max(mult.get(src, 1), mult.get(dst, 1)) if mult else 1)
        self._c_local.append(0)
        self._c_bytes.append(0.0)
        self._class_of[(src, dst)] = cls
        return cls

    def _list(self, classes: set[int]) -> None:
        """Give ``classes`` listed ids and incidence entries (compact link ids too)."""
        new_c: list[int] = []
        new_k: list[int] = []
        k_of, k_users = self._k_of, self._k_users
        for cls in sorted(classes):
            if self._l_free:
                lid = self._l_free.pop()
            else:
                lid = self._n_l
                self._n_l += 1
                if lid >= self._l_mult.size:
                    self._l_mult = grown(self._l_mult, lid + 1, 0.0)
                    self._l_rate = grown(self._l_rate, lid + 1, 0.0)
                    self._l_gid = grown(self._l_gid, lid + 1, 0)
            self._l_gid[lid] = cls
            self._c_local[cls] = lid
            self._l_mult[lid] = self._c_mult[cls]
            self._l_rate[lid] = self._c_solo[cls]  # unlisted active classes are alone on their links
            for link in self._c_links[cls]:
                k = k_of[link]
                if k < 0:
                    if self._k_free:
                        k = self._k_free.pop()
                    else:
                        k = self._n_k
                        self._n_k += 1
                        if k >= self._k_glob.size:
                            self._k_glob = grown(self._k_glob, k + 1, self._n_links)
                            self._k_cap = grown(self._k_cap, k + 1, 1.0)
                    k_of[link] = k
                    self._k_glob[k] = link
                    self._k_cap[k] = self.bandwidth[link]
                k_users[link] += 1
                new_c.append(lid)
                new_k.append(k)
        self._ent_c = np.concatenate([self._ent_c, np.array(new_c, dtype=np.intp)])
        self._ent_k = np.concatenate([self._ent_k, np.array(new_k, dtype=np.intp)])

    def _compact(self) -> None:
        """Drop the entries of listed classes left without flows; free their ids."""
        keep = self._l_mult[self._ent_c] > 0
        self._ent_c = self._ent_c[keep]
        self._ent_k = self._ent_k[keep]
        k_of, k_users = self._k_of, self._k_users
        for lid in sorted(self._dead):
            cls = int(self._l_gid[lid])
            self._l_gid[lid] = 0
            self._c_local[cls] = 0
            self._l_rate[lid] = 0.0
            self._l_free.append(lid)
            for link in self._c_links[cls]:
                k_users[link] -= 1
                if not k_users[link]:
                    k = k_of[link]
                    k_of[link] = -1
                    self._k_glob[k] = self._n_links
                    self._k_free.append(k)
        self._dead.clear()

    # -- flow lifecycle ---------------------------------------------------

    def _complete(self, xfer: Transfer) -> None:
        xfer.completed = self.env.now
        self.events += 1
        xfer.succeed(self.env.now)

    def _after_latency(self, event: simpy.Event) -> None:
        self._begin(event._value)

    def _begin(self, xfer: Transfer) -> None:
        xfer.started = self.env.now
        if xfer.nbytes == 0:
            self._complete(xfer)
            return
        self._starting.append(xfer)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        # One re-solve per instant: queued behind every event already due now.
        if not self._flush_pending:
            self._flush_pending = True
            self.env.timeout(0).callbacks.append(self._flush)

    def _flush(self, _event: simpy.Event | None = None) -> None:
        """Give new rates to what the starts and ends of this instant disturbed."""
        self._flush_pending = False
        started = self._admit(self._starting) if self._starting else []
        self._starting = []
        ended = self._ended
        self._ended = []
        if not started and not ended:
            return
        self.rates_version += 1
        if self._all_alone(started, ended):
            self._flush_alone(started, set(ended))
        else:
            self._resolve(started, ended)
        self._arm()

    def _all_alone(self, started: list[tuple[int, int]], ended: list[int]) -> bool:
        """Whether every start is the only flow on each of its links and every end left its links empty."""
        count, c_links, c_mult = self._count, self._c_links, self._c_mult
        for _slot, cls in started:
            if c_mult[cls] != 1:
                return False
            for link in c_links[cls]:
                if count[link] != 1:
                    return False
        for cls in ended:
            for link in c_links[cls]:
                if count[link]:
                    return False
        return True

    def _admit(self, starting: list[Transfer]) -> list[tuple[int, int]]:
        """Give each started transfer a slot and count it on its links; ``[(slot, class)]``."""
        now = self.env.now
        count, c_links, c_mult, c_local = self._count, self._c_links, self._c_mult, self._c_local
        c_weight = self._c_weight
        since = self._busy_since
        clocks = self._clocks
        admitted = []
        for xfer in starting:
            slot = self._alloc()
            cls = xfer._cls
            self._xfer[slot] = xfer
            if not c_mult[cls]:  # the class's clock starts at the rate the solver has for it now
                lid = c_local[cls]
                clocks.start_epoch(cls, now, float(self._l_rate[lid]) if lid else self._c_solo[cls])
            nbytes = float(xfer.nbytes)
            clocks.join(slot, cls, nbytes, COMPLETION_RTOL * nbytes, now)
            weight = c_weight[cls]
            for link in c_links[cls]:
                if not count[link]:
                    since[link] = now
                count[link] += weight
            first = not c_mult[cls]
            c_mult[cls] += weight
            lid = c_local[cls]
            if lid:
                self._l_mult[lid] = c_mult[cls]
                if first:
                    self._dead.discard(lid)
            elif first:
                self._unlisted.add(cls)
            admitted.append((slot, cls))
        self.events += len(starting)
        return admitted

    def _flush_alone(self, started: list[tuple[int, int]], ended: set[int]) -> None:
        """Every start is alone on its links and every end leaves its links empty."""
        now = self.env.now
        for cls in ended:
            self._link_rate[self._c_route[cls].links] = 0.0
        for _slot, cls in started:
            rate = self._c_solo[cls]
            self._clocks.set_rate(cls, rate, now)
            lid = self._c_local[cls]
            if lid:
                self._l_rate[lid] = rate
            self._link_rate[self._c_route[cls].links] = rate
        if started:
            self.resolves += 1
            self.resolved_flows += len(started)

    def _resolve(self, started: list[tuple[int, int]], ended: list[int]) -> None:
        """Re-solve every active class; advance the clocks of the classes whose rate changed."""
        now = self.env.now
        for cls in ended:
            if not self._c_local[cls]:  # an unlisted class was alone: nobody else re-rates its links
                self._link_rate[self._c_route[cls].links] = 0.0
        if self._unlisted:
            self._list(self._unlisted)
            self._unlisted = set()
        n_l = self._n_l
        l_mult = self._l_mult[:n_l]
        ent_c, ent_k = self._ent_c, self._ent_k
        if self._dead:
            live = l_mult[ent_c] > 0
            ent_c, ent_k = ent_c[live], ent_k[live]
        # classes without flows (and the dummy, and free ids) have no entries: rate 0
        if self.component_solve:
            new = self._solve_components(started, ended, ent_c, ent_k, l_mult)
        else:
            new = maxmin.max_min_rates(ent_c, ent_k, self._k_cap[: self._n_k], n_l, weights=l_mult,
                                       unconstrained=0.0)
        changed = new != self._l_rate[:n_l]
        self._l_rate[:n_l] = new

        # Classes: advance the clocks of those with flows whose rate changes.
        lids = np.flatnonzero(changed & (l_mult > 0))
        if lids.size:
            self._clocks.rerate(self._l_gid[lids], new[lids], now)
        c_local = self._c_local
        rerated = int(l_mult[lids].sum()) + sum(1 for _slot, cls in started if not changed[c_local[cls]])
        if rerated:
            self.resolves += 1
            self.resolved_flows += rerated

        # Links: the total on every listed link (emptied ones included; free ids hit the sentinel).
        self._link_rate[self._k_glob[: self._n_k]] = np.bincount(
            self._ent_k, weights=(new * l_mult)[self._ent_c], minlength=self._n_k
        )
        if self._dead:
            self._compact()

    def _solve_components(self, started: list[tuple[int, int]], ended: list[int], ent_c: np.ndarray,
                          ent_k: np.ndarray, l_mult: np.ndarray) -> np.ndarray:
        """The rates :func:`~conduit.sim.maxmin.max_min_rates` gives every listed class, solving only
        the components (of the class-link incidence) that this instant's starts and ends touch.

        Exact: every operation of the bottleneck rounds acts per link or per class, and a link's
        sums run over its own entries in their stored order, so a component's rates do not depend
        on what else is solved with it; one that no start or end touched keeps its classes and
        multiplicities, hence the rates it got when last solved (classes without flows: 0). When the
        search finds one component holding every class (a fabric whose flows all meet at one link),
        the next :data:`WHOLE_SOLVES` re-solves solve every class without searching: the same rates."""
        k_of, c_links = self._k_of, self._c_links
        seeds = {k_of[link] for cls in (*[c for _s, c in started], *ended) for link in c_links[cls]}
        seeds.discard(-1)
        n_l, n_k = self._n_l, self._n_k
        if self._whole_left > 0:  # the last components found spanned every class: solve them all
            self._whole_left -= 1
            return maxmin.max_min_rates(ent_c, ent_k, self._k_cap[:n_k], n_l, weights=l_mult, unconstrained=0.0)
        new = self._l_rate[:n_l].copy()
        if seeds and ent_c.size:
            c_in, _k_in = maxmin.component(ent_c, ent_k, np.fromiter(seeds, np.intp, len(seeds)), n_l, n_k)
            sel = c_in[ent_c]
            if sel.all():  # one component holds every class: skip the search for the next few solves
                self._whole_left = WHOLE_SOLVES
            solved = maxmin.max_min_rates(ent_c[sel], ent_k[sel], self._k_cap[:n_k], n_l, weights=l_mult,
                                          unconstrained=0.0)
            new[c_in] = solved[c_in]
        new[l_mult == 0] = 0.0
        return new

    def _alloc(self) -> int:
        if not self._free:
            old = len(self._xfer)
            new = max(8, 2 * old)
            self._xfer += [None] * (new - old)
            self._free = list(range(new - 1, old - 1, -1))
            self._clocks.grow_slots(new)
        return self._free.pop()

    def _arm(self) -> None:
        """Point the completion timer at the earliest predicted finish."""
        t_next = self._clocks.next_finish()
        if t_next == self._armed_at:
            return
        self._epoch += 1
        if math.isinf(t_next):
            self._armed_at = None
            return
        self._armed_at = t_next
        timer = self.env.timeout(max(t_next - self.env.now, 0.0), self._epoch)
        timer.callbacks.append(self._on_timer)

    def _on_timer(self, timer: simpy.Event) -> None:
        if timer._value != self._epoch:
            return  # stale: rates changed after this timer was armed
        self._armed_at = None
        now = self.env.now
        clocks = self._clocks
        slots, lefts = clocks.finished(now)
        if not slots:
            self._arm()
            return
        count, c_links, c_mult, c_local = self._count, self._c_links, self._c_mult, self._c_local
        busy, since = self._busy_s, self._busy_since
        slot_cls, nbytes = clocks.cls[slots].tolist(), clocks.nbytes[slots].tolist()
        finished = []
        c_weight = self._c_weight
        for slot, cls, size, left in zip(slots, slot_cls, nbytes, lefts):
            weight = c_weight[cls]
            for link in c_links[cls]:
                count[link] -= weight
                if not count[link]:
                    busy[link] += now - since[link]
            c_mult[cls] -= weight
            self._c_bytes[cls] += (size - left) * weight  # what it sent, crumbs included
            lid = c_local[cls]
            if lid:
                self._l_mult[lid] = c_mult[cls]
                if not c_mult[cls]:
                    self._dead.add(lid)
            elif not c_mult[cls]:
                self._unlisted.discard(cls)
            self._ended.append(cls)
            finished.append(self._xfer[slot])
            self._xfer[slot] = None
        clocks.release(slots)
        self._free.extend(reversed(slots))
        for xfer in finished:
            self._complete(xfer)
        self._schedule_flush()
