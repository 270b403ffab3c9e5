"""``conduit workload list|show``: the workload presets and every field's resolved value and unit.

The fields, units, defaults and plausible ranges are documented in ``docs/workload-format.md``.
"""

from __future__ import annotations

import argparse

from conduit.cli import conventions

_LIST_COLUMNS = ("algorithm", "runners_per_gpu", "env_runners", "envs_per_runner", "fragment_length",
                 "bytes_per_step", "chunk_bytes")


def register(sub: argparse._SubParsersAction) -> None:
    wl = sub.add_parser("workload", help="list workload presets; show a workload's fields with units")
    wl_sub = wl.add_subparsers(title="workload commands", metavar="ACTION")
    lst = wl_sub.add_parser("list", help="the presets, one line each")
    lst.add_argument("--json", action="store_true", help="every preset's resolved fields as JSON")
    lst.set_defaults(handler=cmd_workload_list)
    show = wl_sub.add_parser("show", help="every field of a preset or YAML workload, with its unit",
                             description="Print every field of a workload (a preset name or a YAML path) "
                                         "with its unit, marking values that differ from the default. "
                                         "Fields and units: docs/workload-format.md.")
    show.add_argument("workload", help="preset name (conduit workload list) or YAML path")
    show.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                      help="override a field, as in 'conduit sim --set' (repeatable)")
    show.add_argument("--topology", help="also show how runners and learners map onto this topology's GPUs")
    show.add_argument("--json", action="store_true", help="print the fields (and layout) as JSON")
    show.set_defaults(handler=cmd_workload_show)
    wl.set_defaults(handler=conventions.help_handler(wl))


def cmd_workload_list(args: argparse.Namespace) -> int:
    from conduit.sim.metrics import dumps
    from conduit.sim.workload import PRESETS
    from conduit.sim.workload_fields import format_value, resolved

    if args.json:
        print(dumps({name: resolved(w) for name, w in PRESETS.items()}))
        return 0
    header = ("name", *_LIST_COLUMNS)
    rows = [header] + [(name, *(format_value(c, resolved(w)[c]) for c in _LIST_COLUMNS)) for name, w in PRESETS.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths,
                                                                                                   strict=True))))
    print("\nfields and units: conduit workload show NAME, or docs/workload-format.md")
    return 0


def cmd_workload_show(args: argparse.Namespace) -> int:
    from conduit.sim.metrics import dumps
    from conduit.sim.workload import load_workload
    from conduit.sim.workload_fields import (
        DERIVED,
        FIELD_INFO,
        FIELD_NAMES,
        apply_overrides,
        default_of,
        format_value,
        parse_assignments,
        resolved,
    )

    workload = apply_overrides(load_workload(args.workload), parse_assignments(args.set))
    values = resolved(workload)
    layout = _layout(args.topology, workload) if args.topology else None
    if args.json:
        out = {"fields": {k: values[k] for k in FIELD_NAMES}, "derived": {k: values[k] for k in DERIVED},
               "contract": type(workload.contract()).__name__}
        if layout is not None:
            out["layout"] = layout
        print(dumps(out))
        return 0
    print(f"workload {workload.name} ({workload.algorithm}, contract {type(workload.contract()).__name__}); "
          "* = differs from the default")
    width = max(len(n) for n in (*FIELD_NAMES, *DERIVED))
    for name in FIELD_NAMES:
        unit = FIELD_INFO[name][0]
        mark = "*" if name not in ("name", "algorithm") and values[name] != default_of(name) else " "
        print(f" {mark}{name:<{width}}  {format_value(name, values[name]):>14}  {unit}")
    print("  derived:")
    for name, meaning in DERIVED.items():
        print(f"  {name:<{width}}  {format_value(name, values[name]):>14}  {meaning}")
    if layout is not None:
        print(f"  on {layout['topology']}: {layout['runners']} env runners and {layout['learners']} learners "
              f"on {layout['gpus']} GPUs ({layout['learner_devices']})")
    return 0


def _layout(topology: str, workload) -> dict:
    from conduit.sim.cluster import lay_out
    from conduit.topology import load_topology

    topo = load_topology(topology)
    layout = lay_out(topo, workload)
    devices = sorted({lr.device for lr in layout.learners})
    return {
        "topology": topo.name,
        "gpus": len(topo.devices_of("gpu")),
        "runners": len(layout.runners),
        "learners": len(layout.learners),
        "learner_devices": ", ".join(devices[:4]) + (f", ... ({len(devices)} devices)" if len(devices) > 4 else ""),
        "runners_per_learner": {lr.id: len(lr.runners) for lr in layout.learners},
    }
