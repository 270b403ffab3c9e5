"""Point-to-point transfers on a topology: the fixed entry point of the network model.

:func:`simulate_transfers` runs a list of transfers through a :class:`Network`
(full-duplex links, hop-count routes with deterministic ECMP, route latency
first, then max-min fair sharing; see :mod:`conduit.sim.network`) and returns
when each one's last byte arrived. :func:`run_transfers` does the same and also
hands back the network, for its counters and link statistics.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Mapping
from typing import Any

import networkx as nx
import simpy

from conduit.errors import ConduitError
from conduit.sim.network import Network


def simulate_transfers(topology: Any, transfers: Iterable[Mapping[str, Any]]) -> list[float]:
    """Completion times (s), in input order, of point-to-point transfers.

    ``topology`` is a :class:`conduit.topology.Topology`, a YAML path (``str``
    or :class:`os.PathLike`; anything ``load_topology`` accepts) or a
    :class:`networkx.Graph` whose edges carry ``bandwidth`` (bytes/s) and
    ``latency`` (s). Each transfer is a mapping with ``src``, ``dst``, ``bytes``
    and optionally ``start`` (s, default 0).
    """
    times, _network = run_transfers(topology, transfers)
    return times


def run_transfers(topology: Any, transfers: Iterable[Mapping[str, Any]]) -> tuple[list[float], Network]:
    """Like :func:`simulate_transfers`, also returning the :class:`Network` it ran."""
    graph = _graph_of(topology)
    env = simpy.Environment()
    network = Network(env, graph)
    specs = _validate(list(transfers), network)
    times = [math.nan] * len(specs)

    def submit(i: int, src: Any, dst: Any, nbytes: float) -> None:
        event = network.transfer(src, dst, nbytes, tag=i)
        event.callbacks.append(lambda ev: times.__setitem__(i, ev.value))

    for i, (src, dst, nbytes, start) in enumerate(specs):
        if start == 0:
            submit(i, src, dst, nbytes)
        else:
            env.timeout(start).callbacks.append(
                lambda _ev, i=i, src=src, dst=dst, nbytes=nbytes: submit(i, src, dst, nbytes)
            )
    env.run()
    return times, network


def _graph_of(topology: Any) -> nx.Graph:
    if isinstance(topology, nx.Graph):
        return topology
    if isinstance(topology, (str, os.PathLike)):
        from conduit.topology import load_topology

        topology = load_topology(topology)
    graph = getattr(topology, "graph", None)
    if isinstance(graph, nx.Graph):
        return graph
    raise ConduitError(f"topology: expected a Topology, a YAML path or a networkx.Graph, got {type(topology).__name__}")


def _number(value: Any, field: str, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConduitError(f"{field}: must be a number of {unit}, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ConduitError(f"{field}: must be a finite number >= 0 ({unit}), got {value!r}")
    return value


def _validate(transfers: list, network: Network) -> list[tuple[Any, Any, float, float]]:
    specs = []
    for i, t in enumerate(transfers):
        where = f"transfers[{i}]"
        if not isinstance(t, Mapping):
            raise ConduitError(f"{where}: expected a mapping with src, dst, bytes, got {t!r}")
        for key in ("src", "dst", "bytes"):
            if key not in t:
                raise ConduitError(f"{where}.{key}: missing")
        for key in ("src", "dst"):
            if t[key] not in network.router:
                raise ConduitError(f"{where}.{key}: unknown device {t[key]!r}")
        nbytes = _number(t["bytes"], f"{where}.bytes", "bytes")
        start = _number(t.get("start", 0), f"{where}.start", "seconds")
        try:
            network.route(t["src"], t["dst"])
        except ConduitError as err:
            raise ConduitError(f"{where}: {err}") from None
        specs.append((t["src"], t["dst"], nbytes, start))
    return specs
