"""The explicit form's parser: devices, links and whole-graph checks, with errors that name the place.

Both ways into a :class:`~conduit.topology.model.Topology` end here: :mod:`conduit.topology.loader`
(the explicit form) and :mod:`conduit.topology.templates` (node types repeated into a cluster), so a
template can never produce a topology that the explicit form would reject. A :class:`Context` names
the file; :meth:`Context.fail` raises :class:`~conduit.errors.TopologyError` with the field path and,
when known, the line.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from typing import Any

import networkx as nx

from conduit.errors import TopologyError, UnitError, shown
from conduit.topology.model import DEVICE_KINDS, Device, Link, Topology
from conduit.topology.yamlio import line_of
from conduit.units import kind_of_field, parse_quantity

#: fields a device of each kind must state
REQUIRED_FIELDS = {"gpu": ("memory",), "memory": ("capacity",), "nvme": ("capacity",), "nic": ("bandwidth",)}
#: quantities that may be zero; every other quantity must be strictly positive
MAY_BE_ZERO = ("latency", "overhead", "_time")
#: fields every device may carry (``model`` and ``description`` are free text)
COMMON_DEVICE_FIELDS = ("id", "kind", "node", "model", "description")
#: the fields each device kind may carry besides :data:`COMMON_DEVICE_FIELDS` (docs/topology-format.md);
#: the ``memory``/``nvme``/``gpu`` extras are the measurements ``conduit calibrate`` records
DEVICE_FIELDS = {
    "gpu": ("memory", "memory_bandwidth", "copy_launch_overhead", "d2h_pinned_bandwidth", "h2d_pageable_bandwidth"),
    "cpu": ("cores", "oversubscribed_cpu_cost", "wake_latency", "wake_slice_time"),
    "memory": ("capacity", "pinned_capacity", "bandwidth", "pageable_copy_bandwidth",
               "shm_bandwidth", "shm_latency", "shm_create_latency", "pickle_bandwidth", "pickle_latency",
               "pickle_oob_latency", "object_store_put_bandwidth", "object_store_get_bandwidth",
               "object_store_latency", "object_store_get_latency", "object_store_cold_put_bandwidth"),
    "nvme": ("capacity", "read_bandwidth", "write_bandwidth", "bandwidth", "read_4k_latency", "write_latency"),
    "nic": ("bandwidth",),
    "switch": (),
}
LINK_FIELDS = ("src", "dst", "bandwidth", "latency", "model", "description")
TOP_LEVEL_FIELDS = ("name", "description", "devices", "links", "cluster")
#: a field of the user's own, kept as an attribute and never read by Conduit, starts with this
USER_FIELD_PREFIX = "x_"


class Context:
    """Where we are in a file, to name it in errors."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, field: str | None, message: str, container: Any = None, key: Any = None):
        line = line_of(container, key) if container is not None else None
        if line is not None:
            message = f"{message} (line {line})"
        raise TopologyError(self.source, field, message)


def check_fields(mapping: Mapping, known: Iterable[str], ctx: Context, where: str | None, what: str) -> None:
    """Refuse a field that is not in ``known`` (nor starts with ``x_``), suggesting the closest known
    one: a misspelt field (``memory_bandwith``) must not be ignored while its default is used."""
    known = tuple(known)
    for key in mapping:
        if isinstance(key, str) and (key in known or key.startswith(USER_FIELD_PREFIX)):
            continue
        name = key if isinstance(key, str) else shown(key)
        close = difflib.get_close_matches(name[:100], known, n=1, cutoff=0.7)
        hint = f"did you mean {close[0]!r}? " if close else ""
        ctx.fail(f"{where}.{name}" if where else name,
                 f"unknown field for {what}; {hint}known: {', '.join(known) or 'none'} "
                 f"(a field of your own must start with {USER_FIELD_PREFIX!r})", mapping, key)


def parse_devices(items: Any, ctx: Context, prefix: str = "", node: str | None = None) -> list[Device]:
    """Validate a ``devices`` list. With ``prefix``/``node`` (templates) ids become ``node.id``."""
    if not isinstance(items, list) or not items:
        ctx.fail(f"{prefix}devices", "must be a non-empty list of devices", items)
    devices: list[Device] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        where = f"{prefix}devices[{i}]"
        if not isinstance(item, Mapping):
            ctx.fail(where, f"must be a mapping with 'id' and 'kind', got {type(item).__name__}", items, i)
        if "id" not in item:
            ctx.fail(f"{where}.id", "missing", item)
        local_id = item["id"]
        if not isinstance(local_id, str | int) or isinstance(local_id, bool) or str(local_id) == "":
            ctx.fail(f"{where}.id", f"must be a non-empty string, got {shown(local_id)}", item, "id")
        local_id = str(local_id)
        if local_id in seen:
            ctx.fail(f"{where}.id", f"duplicate device id {shown(local_id)} (first at devices[{seen[local_id]}])", item, "id")
        seen[local_id] = i
        kind = item.get("kind")
        if not isinstance(kind, str) or kind not in DEVICE_KINDS:
            ctx.fail(f"{where}.kind", f"must be one of {', '.join(DEVICE_KINDS)}, got {shown(kind)}", item, "kind")
        check_fields(item, COMMON_DEVICE_FIELDS + DEVICE_FIELDS[kind], ctx, where, f"a {kind} device")
        for required in REQUIRED_FIELDS.get(kind, ()):
            if required not in item:
                ctx.fail(f"{where}.{required}", f"required for a {kind} device", item)
        attrs = {}
        for key, value in item.items():
            if key in ("id", "kind", "node"):
                continue
            attrs[key] = quantity_field(key, value, f"{where}.{key}", ctx, item)
        if kind == "cpu":
            cores = attrs.setdefault("cores", 1)
            if not isinstance(cores, int) or isinstance(cores, bool) or cores < 1:
                ctx.fail(f"{where}.cores", f"must be a positive integer, got {shown(cores)}", item, "cores")
            cost = attrs.get("oversubscribed_cpu_cost", 1.0)
            if isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost) or cost < 1:
                ctx.fail(f"{where}.oversubscribed_cpu_cost", f"must be a number >= 1 (CPU seconds on a crowded "
                         f"core per CPU second alone), got {shown(cost)}", item, "oversubscribed_cpu_cost")
        if kind == "memory" and "pinned_capacity" in attrs and attrs["pinned_capacity"] > attrs["capacity"]:
            ctx.fail(f"{where}.pinned_capacity", "exceeds the device's capacity", item, "pinned_capacity")
        if node is not None:
            device_id, device_node = f"{node}.{local_id}", node
        else:
            device_id = local_id
            device_node = item.get("node")
            if device_node is not None and (not isinstance(device_node, str | int) or isinstance(device_node, bool)):
                ctx.fail(f"{where}.node", f"must be a machine name, got {shown(device_node)}", item, "node")
            device_node = str(device_node) if device_node is not None else _default_node(local_id)
        devices.append(Device(device_id, kind, device_node, attrs))
    return devices


def parse_links(
    items: Any, ctx: Context, known: set[str], prefix: str = "", node: str | None = None
) -> list[Link]:
    """Validate a ``links`` list against the declared device ids."""
    if not isinstance(items, list):
        ctx.fail(f"{prefix}links", f"must be a list of links, got {type(items).__name__}", items)
    links: list[Link] = []
    for i, item in enumerate(items):
        where = f"{prefix}links[{i}]"
        if not isinstance(item, Mapping):
            ctx.fail(where, f"must be a mapping with src, dst, bandwidth, latency, got {type(item).__name__}", items, i)
        check_fields(item, LINK_FIELDS, ctx, where, "a link")
        ends = []
        for end in ("src", "dst"):
            if end not in item:
                ctx.fail(f"{where}.{end}", "missing", item)
            if not isinstance(item[end], str | int) or isinstance(item[end], bool):
                ctx.fail(f"{where}.{end}", f"must be a device id, got {shown(item[end])}", item, end)
            device_id = str(item[end])
            full_id = f"{node}.{device_id}" if node is not None else device_id
            if full_id not in known:
                ctx.fail(f"{where}.{end}", f"unknown device {shown(device_id)}", item, end)
            ends.append(full_id)
        if ends[0] == ends[1]:
            ctx.fail(where, f"self-loop on device {ends[0]!r}", items, i)
        values = {}
        for key in ("bandwidth", "latency"):
            if key not in item:
                ctx.fail(f"{where}.{key}", "missing", item)
            values[key] = quantity_field(key, item[key], f"{where}.{key}", ctx, item)
        attrs = {k: v for k, v in item.items() if k not in ("src", "dst", "bandwidth", "latency")}
        links.append(Link(ends[0], ends[1], values["bandwidth"], values["latency"], attrs))
    return links


def build(name: str, source: str, devices: list[Device], links: list[Link], ctx: Context) -> Topology:
    """Final whole-graph checks (duplicate links, connectivity) and construction."""
    pairs: dict[frozenset, int] = {}
    for i, link in enumerate(links):
        pair = frozenset((link.src, link.dst))
        if pair in pairs:
            ctx.fail(f"links[{i}]", f"duplicate link between {link.src!r} and {link.dst!r} (first at links[{pairs[pair]}])")
        pairs[pair] = i
    topology = Topology(name, source, devices, links)
    if len(devices) > 1 and not nx.is_connected(topology.graph):
        parts = sorted(nx.connected_components(topology.graph), key=len, reverse=True)
        a, b = min(parts[0]), min(parts[1])
        ctx.fail("links", f"graph is disconnected ({len(parts)} components): {a!r} cannot reach {b!r}")
    return topology


def quantity_field(key: str, value: Any, where: str, ctx: Context, container: Any) -> Any:
    kind = kind_of_field(key)
    if kind is None:
        return value
    if value is None:
        ctx.fail(where, "missing value", container, key)
    try:
        number = parse_quantity(value, kind)
    except UnitError as exc:
        ctx.fail(where, str(exc), container, key)
    may_be_zero = key == "latency" or key.endswith(MAY_BE_ZERO)
    if number < 0 or (number == 0 and not may_be_zero):
        ctx.fail(where, f"must be {'>= 0' if may_be_zero else '> 0'}, got {shown(value)}", container, key)
    return number


def _default_node(device_id: str) -> str:
    return device_id.split(".", 1)[0] if "." in device_id else "node0"
