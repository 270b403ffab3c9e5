"""The ``conduit`` command line.

Each sub-command lives in a small function that takes parsed arguments and returns an exit code. A
:class:`ConduitError` (a user mistake) becomes one line on stderr and exit status 2; any other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from conduit.errors import ConduitError
from conduit.units import Kind, format_quantity

Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return handler(args)
    except ConduitError as exc:
        print(f"conduit: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into e.g. `head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("conduit: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conduit", description="Conduit: an experience data plane for distributed RL."
    )
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    topo = sub.add_parser("topology", help="validate and inspect hardware topologies")
    topo_sub = topo.add_subparsers(title="topology commands", metavar="ACTION")
    validate = topo_sub.add_parser("validate", help="check a topology file; exit 0 when it is good")
    validate.add_argument("file", help="a YAML path or a library name")
    validate.set_defaults(handler=cmd_topology_validate)
    show = topo_sub.add_parser("show", help="summarise a topology: devices, tiers, GPU paths")
    show.add_argument("topology", help="a library name (e.g. dgx-h100) or a YAML path")
    show.add_argument("--json", action="store_true", help="print the summary as JSON")
    show.set_defaults(handler=cmd_topology_show)
    lst = topo_sub.add_parser("list", help="list the library topologies")
    lst.set_defaults(handler=cmd_topology_list)

    pol = sub.add_parser("policies", help="placement and scheduling policies")
    pol_sub = pol.add_subparsers(title="policies commands", metavar="ACTION")
    pol_list = pol_sub.add_parser("list", help="built-in and plug-in policies, by name")
    pol_list.add_argument("--json", action="store_true")
    pol_list.add_argument("--all", action="store_true", help="list every janus-* configuration (collapsed by default)")
    pol_list.set_defaults(handler=cmd_policies_list)

    cal = sub.add_parser("calibrate", help="measure this machine and write a topology file the simulator loads",
                         description="Measure memcpy, shared memory, pickle, disk, Ray's object store and (with "
                                     "CUDA) host<->device copies, and write an explicit-form topology YAML. "
                                     "Progress goes to stderr.")
    cal.add_argument("--out", help="write the topology YAML here (default: print it on stdout)")
    cal.add_argument("--quick", action="store_true", help="small sizes and few repeats: a few seconds, rougher")
    cal.add_argument("--no-ray", action="store_true", help="skip the Ray object store")
    cal.add_argument("--no-disk", action="store_true", help="skip the disk")
    cal.add_argument("--json", action="store_true",
                     help="print the raw measurements as one JSON object on stdout (YAML only to --out)")
    cal.set_defaults(handler=cmd_calibrate)

    import conduit.sim.run  # noqa: F401 - registers 'conduit sim'
    import conduit.sim.tune as _tune  # noqa: F401 - registers 'conduit tune'

    for register in _EXTRA_COMMANDS:
        register(sub)
    return parser


#: later modules (sim, tune, calibrate) add their sub-commands here
_EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


def extra_command(register: Callable[[argparse._SubParsersAction], None]):
    _EXTRA_COMMANDS.append(register)
    return register


def cmd_topology_validate(args: argparse.Namespace) -> int:
    from conduit.topology import load_topology

    topology = load_topology(args.file)
    print(f"{topology.source}: ok ({topology!r})")
    return 0


def cmd_topology_list(args: argparse.Namespace) -> int:
    from conduit.topology import library_names

    print("\n".join(library_names()))
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


def cmd_policies_list(args: argparse.Namespace) -> int:
    """Registered policies. The 60 ``janus-*`` fixed configurations collapse into one row unless
    ``--all`` is given."""
    import re

    from conduit.registry import policy_registry

    rows = policy_registry().describe()
    if not getattr(args, "all", False):
        config = re.compile(r"^janus-(pageable|pinned|gpu)-(co|nco)-(so|nso)-g\d+$")
        collapsed = [r for r in rows if r["origin"] == "built-in" and config.match(r["name"])]
        if len(collapsed) > 1:
            first = rows.index(collapsed[0])
            rows = [r for r in rows if r not in collapsed]
            rows.insert(first, {"name": "janus-<placement>-<co|nco>-<so|nso>-g<g>", "role": "policy",
                                "origin": "built-in",
                                "summary": f"{len(collapsed)} fixed configurations (--all lists them)"})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max((len(r["name"]) for r in rows), default=4)
    origin_width = max((len(r["origin"]) for r in rows), default=8)
    for row in rows:
        print(f"{row['name']:<{width}}  {row['role']:<10} {row['origin']:<{origin_width}}  {row['summary']}")
    return 0

def cmd_calibrate(args: argparse.Namespace) -> int:
    from conduit.runtime import calibrate as cal

    if args.out is not None:
        cal.check_out_path(args.out)  # before minutes of measuring

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    text, measurements = cal.calibrate(args.out, quick=args.quick, ray=not args.no_ray, disk=not args.no_disk,
                                       progress=progress)
    if args.json:
        print(cal.to_json(measurements))
    elif args.out is None:
        sys.stdout.write(text)
    if args.out is not None:
        print(f"calibrate: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
