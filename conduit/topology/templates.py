"""Cluster templates: node types repeated into a cluster, joined by a fabric.

A node type is an explicit-form topology of one machine. A cluster names node types with counts and a
fabric; expansion prefixes each node's device ids with the node name (``n3.gpu5``) and links every
``nic`` to the fabric:

* ``single-switch`` — one switch, every NIC on it (a small InfiniBand or Ethernet switch);
* ``fat-tree`` — a two-level leaf/spine Clos, every leaf linked to every spine. With
  ``rail_optimized`` the leaves are split into rails, one per NIC index, and NIC *r* of every node goes
  to a leaf of rail *r* (the layout NVIDIA's SuperPOD reference designs use, so that GPU *r* of every
  node reaches GPU *r* of every other node through one leaf where possible).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conduit.errors import TopologyError, shown
from conduit.topology.library import resolve
from conduit.topology.model import Device, Link
from conduit.topology.parse import (
    TOP_LEVEL_FIELDS,
    Context,
    check_fields,
    parse_devices,
    parse_links,
    quantity_field,
)
from conduit.topology.yamlio import read_yaml

FABRIC_KINDS = ("single-switch", "fat-tree")
DEFAULT_FABRIC_LATENCY = 1e-6
#: the most nodes a cluster may have (the largest published GPU clusters have about 10,000)
MAX_CLUSTER_NODES = 16_384
#: the most devices a cluster may expand to (about 600 MB and 10 s to build; 7,500 DGX nodes)
MAX_CLUSTER_DEVICES = 250_000
#: the most leaf or spine switches a fat tree may have
MAX_FABRIC_SWITCHES = 4_096

CLUSTER_FIELDS = ("nodes", "fabric")
GROUP_FIELDS = ("type", "count", "prefix")
FABRIC_FIELDS = ("kind", "rail_optimized", "leaves", "spines", "host_link", "uplink")
LINK_SPEC_FIELDS = ("bandwidth", "latency")


def expand_cluster(cluster: Any, ctx: Context, base_dir: Path) -> tuple[list[Device], list[Link]]:
    """Expand a ``cluster`` mapping into explicit devices and links."""
    if not isinstance(cluster, Mapping):
        ctx.fail("cluster", f"must be a mapping with 'nodes' and 'fabric', got {type(cluster).__name__}")
    check_fields(cluster, CLUSTER_FIELDS, ctx, "cluster", "a cluster")
    groups = cluster.get("nodes")
    if not isinstance(groups, list) or not groups:
        ctx.fail("cluster.nodes", "must be a non-empty list of {type, count}", cluster, "nodes")

    devices: list[Device] = []
    links: list[Link] = []
    node_nics: list[list[Device]] = []
    index = 0
    for g, group in enumerate(groups):
        where = f"cluster.nodes[{g}]"
        if not isinstance(group, Mapping) or "type" not in group:
            ctx.fail(f"{where}.type", "missing node type", groups, g)
        check_fields(group, GROUP_FIELDS, ctx, where, "a node group")
        count = group.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            ctx.fail(f"{where}.count", f"must be a positive integer, got {shown(count)}", group, "count")
        if index + count > MAX_CLUSTER_NODES:
            ctx.fail(f"{where}.count", f"{count:,} nodes make the cluster larger than {MAX_CLUSTER_NODES:,} nodes, "
                                       "the most a topology may have", group, "count")
        type_source, type_data = _node_type(group["type"], base_dir, ctx, where)
        type_ctx = Context(type_source)
        if not isinstance(type_data, Mapping) or "devices" not in type_data or "links" not in type_data:
            type_ctx.fail(None, "a node type must be an explicit-form mapping with 'devices' and 'links'")
        check_fields(type_data, TOP_LEVEL_FIELDS, type_ctx, None, "a node type")
        local_devices = parse_devices(type_data["devices"], type_ctx)
        local_links = parse_links(type_data["links"], type_ctx, {d.id for d in local_devices})
        if len(devices) + count * len(local_devices) > MAX_CLUSTER_DEVICES:
            ctx.fail(f"{where}.count", f"{count:,} nodes of {len(local_devices)} devices make the cluster larger "
                                       f"than {MAX_CLUSTER_DEVICES:,} devices, the most a topology may have",
                     group, "count")
        prefix = group.get("prefix", "n")
        if not isinstance(prefix, str | int) or isinstance(prefix, bool):
            ctx.fail(f"{where}.prefix", f"must be a string, got {shown(prefix)}", group, "prefix")
        prefix = str(prefix)
        for _ in range(count):
            node = f"{prefix}{index}"
            index += 1
            nics = []
            for d in local_devices:
                device = Device(f"{node}.{d.id}", d.kind, node, d.attrs)
                devices.append(device)
                if d.kind == "nic":
                    nics.append(device)
            links.extend(
                Link(f"{node}.{l.src}", f"{node}.{l.dst}", l.bandwidth, l.latency, l.attrs)
                for l in local_links
            )
            node_nics.append(nics)

    fabric = cluster.get("fabric")
    if fabric is None:
        if index > 1:
            ctx.fail("cluster.fabric", "required for a cluster of more than one node", cluster)
        return devices, links
    if not isinstance(fabric, Mapping):
        ctx.fail("cluster.fabric", "must be a mapping", cluster, "fabric")
    check_fields(fabric, FABRIC_FIELDS, ctx, "cluster.fabric", "a fabric")
    kind = fabric.get("kind")
    if not isinstance(kind, str) or kind not in FABRIC_KINDS:
        ctx.fail("cluster.fabric.kind", f"must be one of {', '.join(FABRIC_KINDS)}, got {shown(kind)}", fabric, "kind")
    if index > 1 and not any(node_nics):
        ctx.fail("cluster.nodes", "node types have no 'nic' device to attach to the fabric", cluster, "nodes")

    def link_spec(key: str, default_bw: float | None) -> tuple[float, float]:
        spec = fabric.get(key, {})
        if not isinstance(spec, Mapping):
            ctx.fail(f"cluster.fabric.{key}", "must be a mapping with bandwidth and latency", fabric, key)
        check_fields(spec, LINK_SPEC_FIELDS, ctx, f"cluster.fabric.{key}", f"the fabric's {key}")
        if "bandwidth" not in spec and default_bw is None:
            ctx.fail(f"cluster.fabric.{key}.bandwidth", "missing", fabric, key)
        bw = quantity_field("bandwidth", spec.get("bandwidth", default_bw), f"cluster.fabric.{key}.bandwidth", ctx, spec)
        lat = quantity_field(
            "latency", spec.get("latency", DEFAULT_FABRIC_LATENCY), f"cluster.fabric.{key}.latency", ctx, spec
        )
        return bw, lat

    def host_link(nic: Device, switch: str) -> Link:
        bw, lat = link_spec("host_link", nic.get("bandwidth"))
        return Link(nic.id, switch, min(bw, nic.get("bandwidth", bw)), lat)

    if kind == "single-switch":
        switch = Device("fabric.switch", "switch", None, {})
        devices.append(switch)
        links.extend(host_link(nic, switch.id) for nics in node_nics for nic in nics)
        return devices, links

    leaves_n = _positive_int(fabric, "leaves", ctx, MAX_FABRIC_SWITCHES)
    spines_n = _positive_int(fabric, "spines", ctx, MAX_FABRIC_SWITCHES)
    uplink_bw, uplink_lat = link_spec("uplink", None)
    leaves = [Device(f"fabric.leaf{j}", "switch", None, {}) for j in range(leaves_n)]
    spines = [Device(f"fabric.spine{k}", "switch", None, {}) for k in range(spines_n)]
    devices.extend(leaves + spines)
    for leaf in leaves:
        links.extend(Link(leaf.id, spine.id, uplink_bw, uplink_lat) for spine in spines)
    nodes_n = len(node_nics)
    if fabric.get("rail_optimized", False):
        rails = max(len(n) for n in node_nics)
        if leaves_n % rails:
            ctx.fail("cluster.fabric.leaves", f"{leaves_n} leaves do not split evenly into {rails} rails", fabric, "leaves")
        per_rail = leaves_n // rails
        per_leaf = math.ceil(nodes_n / per_rail)
        for i, nics in enumerate(node_nics):
            for r, nic in enumerate(nics):
                links.append(host_link(nic, leaves[r * per_rail + i // per_leaf].id))
    else:
        per_leaf = math.ceil(nodes_n / leaves_n)
        for i, nics in enumerate(node_nics):
            links.extend(host_link(nic, leaves[i // per_leaf].id) for nic in nics)
    return devices, links


def _node_type(ref: Any, base_dir: Path, ctx: Context, where: str) -> tuple[str, Any]:
    if isinstance(ref, Mapping):
        return f"{ctx.source} ({where}.type)", ref
    if not isinstance(ref, str):
        ctx.fail(f"{where}.type", f"must be a library name, a path or a mapping, got {shown(ref)}")
    candidate = base_dir / ref
    try:
        path = candidate if candidate.is_file() else resolve(ref)
    except TopologyError as exc:
        ctx.fail(f"{where}.type", exc.detail)
    return str(path), read_yaml(path)


def _positive_int(fabric: Mapping, key: str, ctx: Context, maximum: int) -> int:
    value = fabric.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        ctx.fail(f"cluster.fabric.{key}", f"must be a positive integer, got {shown(value)}", fabric, key)
    if value > maximum:
        ctx.fail(f"cluster.fabric.{key}", f"{value:,} is more than {maximum:,}, the most a fabric may have", fabric, key)
    return value
