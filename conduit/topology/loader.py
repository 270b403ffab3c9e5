"""Turning YAML (or a plain dict) into a validated :class:`Topology`.

Two forms exist (docs/topology-format.md). The **explicit form** lists ``devices`` and ``links`` and
always loads; the **cluster form** repeats node types (explicit-form files) into a cluster and builds a
fabric between their NICs (:mod:`conduit.topology.templates`). Both end in the same validation
(:mod:`conduit.topology.parse`, which both import), so a template can never produce a topology that
the explicit form would reject.

Validation stops at the first problem and raises :class:`TopologyError` naming the file, the field
path and, when known, the line.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conduit.errors import shown
from conduit.topology.library import resolve
from conduit.topology.model import Topology
from conduit.topology.parse import TOP_LEVEL_FIELDS, Context, build, check_fields, parse_devices, parse_links
from conduit.topology.templates import expand_cluster
from conduit.topology.yamlio import read_yaml


def load_topology(spec: str | Path | Mapping[str, Any]) -> Topology:
    """Load a topology from a library name (``dgx-h100``), a YAML path, or an already-parsed dict."""
    if isinstance(spec, Mapping):
        return topology_from_dict(spec, source="<dict>")
    path = resolve(spec)
    return topology_from_dict(read_yaml(path), source=str(path), base_dir=path.parent)


def topology_from_dict(
    data: Any, source: str = "<dict>", base_dir: Path | None = None
) -> Topology:
    """Validate parsed YAML into a :class:`Topology`."""
    ctx = Context(source)
    if not isinstance(data, Mapping):
        kind = "empty" if data is None else type(data).__name__
        ctx.fail(None, f"top level must be a mapping with 'devices' and 'links', got {kind}")
    check_fields(data, TOP_LEVEL_FIELDS, ctx, None, "a topology")
    name = data.get("name")
    if name is not None and (not isinstance(name, str | int | float) or isinstance(name, bool)):
        ctx.fail("name", f"must be a string, got {shown(name)}", data, "name")
    name = str(name or Path(source).stem)
    if "cluster" in data:
        devices, links = expand_cluster(data["cluster"], ctx, base_dir or Path.cwd())
    else:
        for key in ("devices", "links"):
            if key not in data:
                ctx.fail(key, f"missing '{key}' (or a 'cluster' template)", data)
        devices, links = parse_devices(data["devices"], ctx), None
        links = parse_links(data["links"], ctx, {d.id for d in devices})
    return build(name, source, devices, links, ctx)
