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
network keeps no per-byte state, only each flow's rate and its remaining bytes
as of the last time its rate changed (``t_last``); progress is advanced lazily,
vectorised, ``remaining -= (now - t_last) * rate``, when a flow's rate is about
to change. All starts and ends at one instant are batched into a single
re-solve at that instant. A re-solve touches only the *component* of the
change: the flows connected to the links of the started/ended flows in the
flow–link bipartite graph, transitively; every other flow keeps its rate and
its predicted finish time.

SimPy cannot cancel an event, so the network keeps a single completion timer
for the earliest predicted finish over all flows. Each time it is armed it gets
a new epoch number; a timer that fires with an old epoch is stale and does
nothing. When the timer fires, every flow whose remaining bytes are within a
relative epsilon of zero completes, which absorbs floating-point crumbs.

Link statistics (bytes carried and busy time per directed link) are integrated
the same lazy way from each link's total rate.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np
import simpy

from conduit.errors import ConduitError, TopologyError
from conduit.sim import maxmin
from conduit.sim.routing import Route, Router

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

    Counters: ``events`` (flow starts and completions handled), ``resolves``
    (component re-solves run) and ``resolved_flows`` (flows whose rates those
    re-solves recomputed, summed; over ``resolves`` it is the mean component).
    """

    def __init__(self, env: simpy.Environment, graph: nx.Graph) -> None:
        self.env = env
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

        n_links = self.bandwidth.size
        self._link_rate = np.zeros(n_links)  # sum of the rates of the flows on it
        self._link_t = np.zeros(n_links)  # when bytes/busy were last integrated
        self._link_bytes = np.zeros(n_links)
        self._link_busy = np.zeros(n_links)

        # Flows live in slots; the arrays grow by doubling, freed slots are reused.
        self._xfer: list[Transfer | None] = []
        self._free: list[int] = []
        self._rate = np.zeros(0)
        self._remaining = np.zeros(0)
        self._nbytes = np.zeros(0)
        self._t_last = np.zeros(0)
        self._t_finish = np.zeros(0)  # predicted finish; inf for free slots
        # The flows x links incidence of active flows, as COO entries.
        self._ent_flow = np.zeros(0, dtype=np.intp)
        self._ent_link = np.zeros(0, dtype=np.intp)

        self._starting: list[Transfer] = []  # began sharing bandwidth, not yet solved
        self._dirty: list[np.ndarray] = []  # links whose flows ended, not yet solved
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
        route = self.router.route(src, dst)
        latency = float(self.latency[route.links].sum())
        xfer = Transfer(self.env, src, dst, nbytes, tag, route, latency)
        if src == dst:
            self._complete(xfer)
        elif latency > 0:
            self.env.timeout(latency).callbacks.append(lambda _ev: self._begin(xfer))
        else:
            self._begin(xfer)
        return xfer

    def active_rates(self) -> dict[Transfer, float]:
        """The current rate (bytes/s) of every transfer sharing bandwidth."""
        return {x: float(self._rate[i]) for i, x in enumerate(self._xfer) if x is not None}

    def link_rates(self) -> np.ndarray:
        """Total rate (bytes/s) of the flows on each directed link now (read-only view).

        Indexed like ``router.links``. Starts and ends at the current instant
        count once the instant's re-solve has run.
        """
        view = self._link_rate.view()
        view.flags.writeable = False
        return view

    def link_flow_counts(self) -> np.ndarray:
        """How many flows share each directed link now (indexed like ``router.links``)."""
        return np.bincount(self._ent_link, minlength=self.bandwidth.size)

    def link_stats(self) -> dict[tuple[Hashable, Hashable], LinkStats]:
        """Bytes carried and busy time of every directed link, up to now."""
        self._integrate_links(np.arange(self.bandwidth.size))
        return {
            (u, v): LinkStats(
                u,
                v,
                float(self.bandwidth[i]),
                float(self.latency[i]),
                float(self._link_bytes[i]),
                float(self._link_busy[i]),
            )
            for i, (u, v) in enumerate(self.router.links)
        }

    # -- flow lifecycle ---------------------------------------------------

    def _complete(self, xfer: Transfer) -> None:
        xfer.completed = self.env.now
        self.events += 1
        xfer.succeed(self.env.now)

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
        """Re-solve the component of every flow that started or ended now."""
        self._flush_pending = False
        now = self.env.now
        seeds = self._dirty
        self._dirty = []
        if self._starting:
            seeds.append(self._admit(self._starting))
            self._starting = []
        if not seeds:
            return
        seed = np.unique(np.concatenate(seeds))
        change = maxmin.resolve_component(self._ent_flow, self._ent_link, seed, self.bandwidth, len(self._xfer))
        flows, links = change.flows, change.links

        # Lazy progress: the old rates held from t_last until now.
        sent = (now - self._t_last[flows]) * self._rate[flows]
        self._remaining[flows] = np.maximum(self._remaining[flows] - sent, 0.0)
        self._t_last[flows] = now
        self._integrate_links(links)

        if flows.size:
            self.resolves += 1
            self.resolved_flows += flows.size
        self._rate[flows] = change.rates
        self._t_finish[flows] = now + self._remaining[flows] / change.rates
        self._link_rate[links] = change.link_rates
        self._arm()

    def _admit(self, started: list[Transfer]) -> np.ndarray:
        """Give each started transfer a slot and its incidence entries; its links."""
        slots = [self._alloc() for _ in started]
        for slot, xfer in zip(slots, started):
            self._xfer[slot] = xfer
        slot_arr = np.array(slots, dtype=np.intp)
        new_links = np.concatenate([x.route.links for x in started])
        new_flows = np.repeat(slot_arr, [x.route.links.size for x in started])
        self._ent_flow = np.concatenate([self._ent_flow, new_flows])
        self._ent_link = np.concatenate([self._ent_link, new_links])
        nbytes = np.array([float(x.nbytes) for x in started])
        self._nbytes[slot_arr] = nbytes
        self._remaining[slot_arr] = nbytes
        self._rate[slot_arr] = 0.0
        self._t_last[slot_arr] = self.env.now
        self.events += len(started)
        return new_links

    def _alloc(self) -> int:
        if not self._free:
            old = len(self._xfer)
            new = max(8, 2 * old)
            self._xfer += [None] * (new - old)
            self._free = list(range(new - 1, old - 1, -1))
            for name in ("_rate", "_remaining", "_nbytes", "_t_last"):
                setattr(self, name, np.concatenate([getattr(self, name), np.zeros(new - old)]))
            self._t_finish = np.concatenate([self._t_finish, np.full(new - old, np.inf)])
        return self._free.pop()

    def _arm(self) -> None:
        """Point the completion timer at the earliest predicted finish."""
        t_next = float(self._t_finish.min()) if self._t_finish.size else math.inf
        if t_next == self._armed_at:
            return
        self._epoch += 1
        if math.isinf(t_next):
            self._armed_at = None
            return
        self._armed_at = t_next
        epoch = self._epoch
        timer = self.env.timeout(max(t_next - self.env.now, 0.0))
        timer.callbacks.append(lambda _ev: self._on_timer(epoch))

    def _on_timer(self, epoch: int) -> None:
        if epoch != self._epoch:
            return  # stale: rates changed after this timer was armed
        self._armed_at = None
        now = self.env.now
        left = self._remaining - (now - self._t_last) * self._rate
        done = (self._t_finish <= now) | (np.isfinite(self._t_finish) & (left <= COMPLETION_RTOL * self._nbytes))
        slots = np.flatnonzero(done)
        if not slots.size:
            self._arm()
            return
        gone = done[self._ent_flow]
        self._dirty.append(self._ent_link[gone])
        self._ent_flow = self._ent_flow[~gone]
        self._ent_link = self._ent_link[~gone]
        self._t_finish[slots] = np.inf
        self._rate[slots] = 0.0
        self._remaining[slots] = 0.0
        finished = [self._xfer[i] for i in slots]
        for i in slots:
            self._xfer[i] = None
        self._free.extend(int(i) for i in slots[::-1])
        for xfer in finished:
            self._complete(xfer)
        self._schedule_flush()

    def _integrate_links(self, links: np.ndarray) -> None:
        """Account link bytes and busy time from the last integration to now."""
        dt = self.env.now - self._link_t[links]
        rate = self._link_rate[links]
        self._link_bytes[links] += rate * dt
        self._link_busy[links] += np.where(rate > 0, dt, 0.0)
        self._link_t[links] = self.env.now
