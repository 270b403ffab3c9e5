"""The validated topology: devices, full-duplex links and the memory tiers they carry.

A :class:`Topology` is what every other part of Conduit reads hardware facts from. It wraps a
``networkx.Graph`` whose nodes are device ids (with a ``device`` attribute holding the
:class:`Device`) and whose edges carry ``bandwidth`` (bytes/s, per direction) and ``latency`` (s),
so the flow simulator and ``simulate_transfers`` can take it directly.

Memory tiers are derived, not declared: a GPU's ``memory`` is an ``hbm`` tier, a host ``memory``
device is split into a ``pinned`` tier (``pinned_capacity``) and a ``pageable`` tier (the rest), and an
``nvme`` device is an ``nvme`` tier. The split keeps every tier's capacity independent, so capacity
accounting never has to reason about two tiers drawing on one pool.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

import networkx as nx

DEVICE_KINDS = ("gpu", "cpu", "memory", "nvme", "nic", "switch")

#: default cost of launching one host<->device copy, when a gpu does not state it (order of
#: magnitude of a cudaMemcpyAsync launch plus completion polling; our estimate).
DEFAULT_COPY_LAUNCH_OVERHEAD = 10e-6


class TierKind(str, Enum):
    """Where experience can live, from fastest to slowest for a learner."""

    HBM = "hbm"
    PINNED = "pinned"
    PAGEABLE = "pageable"
    NVME = "nvme"


SPILL_ORDER = (TierKind.HBM, TierKind.PINNED, TierKind.PAGEABLE, TierKind.NVME)
"""Tier kinds from fastest to slowest for a learner: the order data spills down."""


@dataclass(frozen=True)
class Device:
    """One piece of hardware. ``attrs`` holds every other field, quantities in base units."""

    id: str
    kind: str
    node: str | None
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


@dataclass(frozen=True)
class Link:
    """A full-duplex link: each direction has ``bandwidth`` bytes/s of its own."""

    src: str
    dst: str
    bandwidth: float
    latency: float
    attrs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryTier:
    """A place experience can be stored: capacity (bytes) and the device that holds it.

    ``read_bandwidth`` and ``write_bandwidth`` are the tier's own media speeds (HBM, DRAM, flash);
    the speed of moving data between tiers comes from the links on the path between their devices.
    """

    id: str
    kind: TierKind
    node: str | None
    device: str
    capacity: float
    read_bandwidth: float
    write_bandwidth: float


class Topology:
    """A validated hardware topology. Build it with :func:`conduit.topology.load_topology`."""

    def __init__(self, name: str, source: str, devices: list[Device], links: list[Link]):
        self.name = name
        self.source = source
        self.devices: Mapping[str, Device] = MappingProxyType({d.id: d for d in devices})
        self.links: tuple[Link, ...] = tuple(links)
        graph = nx.Graph(name=name)
        for device in devices:
            graph.add_node(device.id, kind=device.kind, node=device.node, device=device)
        for link in links:
            graph.add_edge(link.src, link.dst, bandwidth=link.bandwidth, latency=link.latency)
        self.graph: nx.Graph = graph
        self.tiers: tuple[MemoryTier, ...] = tuple(_derive_tiers(devices))
        self._tier_index = {t.id: t for t in self.tiers}
        self._tier_of = {(t.device, t.kind): t.id for t in reversed(self.tiers)}
        self._nodes = sorted({d.node for d in devices if d.node is not None}, key=_natural_key)

    def __repr__(self) -> str:
        return (
            f"Topology({self.name!r}, nodes={len(self._nodes)}, gpus={len(self.devices_of('gpu'))}, "
            f"devices={len(self.devices)}, links={len(self.links)})"
        )

    @property
    def nodes(self) -> list[str]:
        """Machine names, in natural order (``n2`` before ``n10``)."""
        return list(self._nodes)

    def devices_of(self, kind: str, node: str | None = None) -> list[Device]:
        """Devices of one kind, optionally on one node, in natural id order."""
        found = [d for d in self.devices.values() if d.kind == kind and (node is None or d.node == node)]
        return sorted(found, key=lambda d: _natural_key(d.id))

    def tiers_of(self, kind: TierKind | str, node: str | None = None) -> list[MemoryTier]:
        kind = TierKind(kind)
        return [t for t in self.tiers if t.kind is kind and (node is None or t.node == node)]

    def tier(self, tier_id: str) -> MemoryTier:
        tier = self._tier_index.get(tier_id)
        if tier is None:
            from conduit.errors import UnknownNameError

            raise UnknownNameError("tier", tier_id, [t.id for t in self.tiers][:20])
        return tier

    def tier_of(self, device: str, kind: TierKind | str) -> str | None:
        """The id of ``device``'s tier of ``kind`` (a GPU's HBM, a memory's pinned or pageable
        part, an NVMe drive), or None when the device has no such tier."""
        return self._tier_of.get((device, TierKind(kind)))

    def widest_shortest_path(self, src: str, dst: str) -> tuple[float, float, int]:
        """Among the hop-count shortest paths from ``src`` to ``dst``, the one whose slowest link is
        fastest: returns (bottleneck bandwidth, latency of that path, hops)."""
        if src == dst:
            return float("inf"), 0.0, 0
        dist = nx.single_source_shortest_path_length(self.graph, dst)
        best: dict[str, tuple[float, float]] = {dst: (float("inf"), 0.0)}
        # walk the BFS layers from dst outwards so every successor is solved before its predecessor
        for node in sorted(dist, key=dist.get):
            if node == dst:
                continue
            options = []
            for nbr in self.graph.neighbors(node):
                if dist.get(nbr) == dist[node] - 1:
                    edge = self.graph.edges[node, nbr]
                    width, lat = best[nbr]
                    options.append((min(width, edge["bandwidth"]), -(lat + edge["latency"])))
            width, neg_lat = max(options)
            best[node] = (width, -neg_lat)
            if node == src:
                break
        width, latency = best[src]
        return width, latency, dist[src]

    def summary(self) -> dict[str, Any]:
        """The figures ``conduit topology show`` prints, as plain data."""
        by_kind: dict[str, int] = {}
        for device in self.devices.values():
            by_kind[device.kind] = by_kind.get(device.kind, 0) + 1
        tiers: dict[str, dict[str, float]] = {}
        for tier in self.tiers:
            entry = tiers.setdefault(tier.kind.value, {"count": 0, "total_bytes": 0.0})
            entry["count"] += 1
            entry["total_bytes"] += tier.capacity
        out: dict[str, Any] = {
            "name": self.name,
            "source": self.source,
            "nodes": len(self._nodes),
            "devices_by_kind": dict(sorted(by_kind.items())),
            "tiers": tiers,
            "links": len(self.links),
        }
        gpus_by_node = {n: self.devices_of("gpu", n) for n in self._nodes}
        # one GPU pair per kind of node (GPU count, memory and memory bandwidth): a mixed cluster
        # reports each machine type, a uniform one a single line
        kinds: dict[tuple, list[Device]] = {}
        for gpus in gpus_by_node.values():
            if len(gpus) >= 2:
                kinds.setdefault((len(gpus), gpus[0].get("memory"), gpus[0].get("memory_bandwidth")), gpus)
        paths = []
        for gpus in kinds.values():
            width, latency, hops = self.widest_shortest_path(gpus[0].id, gpus[1].id)
            paths.append({"src": gpus[0].id, "dst": gpus[1].id,
                          "bottleneck_bandwidth": width, "latency": latency, "hops": hops})
        if paths:
            out["intra_node_gpu_path"] = min(paths, key=lambda p: p["bottleneck_bandwidth"])
            out["intra_node_gpu_paths"] = paths
        with_gpus = [g for g in gpus_by_node.values() if g]
        if len(with_gpus) >= 2:
            src, dst = with_gpus[0][0], with_gpus[-1][-1]
            width, latency, hops = self.widest_shortest_path(src.id, dst.id)
            out["inter_node_gpu_path"] = {
                "src": src.id, "dst": dst.id,
                "bottleneck_bandwidth": width, "latency": latency, "hops": hops,
            }
        return out


def _derive_tiers(devices: list[Device]) -> Iterator[MemoryTier]:
    for d in devices:
        if d.kind == "gpu":
            bw = d.get("memory_bandwidth", 1e12)
            yield MemoryTier(f"{d.id}:hbm", TierKind.HBM, d.node, d.id, d.get("memory"), bw, bw)
        elif d.kind == "memory":
            capacity = d.get("capacity")
            pinned = d.get("pinned_capacity", capacity / 2)
            bw = d.get("bandwidth", 100e9)
            yield MemoryTier(f"{d.id}:pinned", TierKind.PINNED, d.node, d.id, pinned, bw, bw)
            yield MemoryTier(
                f"{d.id}:pageable", TierKind.PAGEABLE, d.node, d.id, capacity - pinned, bw, bw
            )
        elif d.kind == "nvme":
            read = d.get("read_bandwidth", d.get("bandwidth", 3e9))
            write = d.get("write_bandwidth", read)
            yield MemoryTier(f"{d.id}:nvme", TierKind.NVME, d.node, d.id, d.get("capacity"), read, write)


def _natural_key(text: str) -> tuple:
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))
