"""``conduit topology validate|show|list``."""

from __future__ import annotations

import argparse
import json

from conduit.cli.conventions import help_handler
from conduit.errors import ConduitError
from conduit.units import Kind, format_quantity


def register(sub: argparse._SubParsersAction) -> None:
    topo = sub.add_parser("topology", help="validate and inspect hardware topologies")
    topo.set_defaults(handler=help_handler(topo))  # no action: this help, exit 0
    topo_sub = topo.add_subparsers(title="topology commands", metavar="ACTION")
    validate = topo_sub.add_parser("validate", help="check a topology file; exit 0 when it is good")
    validate.add_argument("file", help="a YAML path or a library name")
    validate.add_argument("--json", action="store_true",
                          help='print one JSON object: {"ok", "file", "source", "name", "nodes", "gpus", '
                               '"devices", "links"}, or {"ok": false, "file", "error"} (exit status as without)')
    validate.set_defaults(handler=cmd_topology_validate)
    show = topo_sub.add_parser("show", help="summarise a topology: devices, tiers, GPU paths")
    show.add_argument("topology", help="a library name (e.g. dgx-h100) or a YAML path")
    show.add_argument("--json", action="store_true", help="print the summary as JSON")
    show.set_defaults(handler=cmd_topology_show)
    lst = topo_sub.add_parser("list", help="list the library topologies")
    lst.add_argument("--json", action="store_true", help='print one JSON object: {"topologies": [NAME, ...]}')
    lst.set_defaults(handler=cmd_topology_list)


def cmd_topology_validate(args: argparse.Namespace) -> int:
    from conduit.topology import load_topology

    try:
        topology = load_topology(args.file)
    except ConduitError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"ok": False, "file": str(args.file), "error": str(exc)}, indent=2))
        raise  # the usual one-line message on stderr and exit status
    if getattr(args, "json", False):
        print(json.dumps({"ok": True, "file": str(args.file), "source": str(topology.source), "name": topology.name,
                          "nodes": len(topology.nodes), "gpus": len(topology.devices_of("gpu")),
                          "devices": len(topology.devices), "links": len(topology.links)}, indent=2))
        return 0
    print(f"{topology.source}: ok ({topology!r})")
    return 0


def cmd_topology_list(args: argparse.Namespace) -> int:
    from conduit.topology import library_names

    names = library_names()
    if getattr(args, "json", False):
        print(json.dumps({"topologies": names}, indent=2))
        return 0
    print("\n".join(names))
    return 0


def cmd_topology_show(args: argparse.Namespace) -> int:
    from conduit.topology import load_topology

    summary = load_topology(args.topology).summary()
    if args.json:
        print(json.dumps(summary, indent=2, default=float))
        return 0
    print(f"topology {summary['name']}  ({summary['source']})")
    print(f"  nodes: {summary['nodes']}   links: {summary['links']}")
    print("  devices by kind:")
    for kind, count in summary["devices_by_kind"].items():
        print(f"    {kind:<8} {count:>6}")
    print("  memory per tier:")
    for kind, entry in summary["tiers"].items():
        total = format_quantity(entry["total_bytes"], Kind.BYTES)
        each = format_quantity(entry["total_bytes"] / entry["count"], Kind.BYTES)
        print(f"    {kind:<8} {entry['count']:>6} x {each:>10}  = {total}")
    paths = [("GPU-GPU in a node", p) for p in summary.get("intra_node_gpu_paths", [])]
    if "inter_node_gpu_path" in summary:
        paths.append(("GPU-GPU across nodes", summary["inter_node_gpu_path"]))
    for label, p in paths:
        bw = format_quantity(p["bottleneck_bandwidth"], Kind.BANDWIDTH)
        lat = format_quantity(p["latency"], Kind.TIME)
        print(f"  {label}: slowest link {bw} ({p['src']} -> {p['dst']}, {p['hops']} hops, latency {lat})")
    return 0
