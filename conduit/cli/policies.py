"""``conduit policies list``."""

from __future__ import annotations

import argparse
import json
import re

from conduit.cli.conventions import help_handler

#: the 60 fixed Janus configurations, collapsed into one row unless ``--all``
_JANUS_CONFIGURATION = re.compile(r"^janus-(pageable|pinned|gpu)-(co|nco)-(so|nso)-g\d+$")


def register(sub: argparse._SubParsersAction) -> None:
    pol = sub.add_parser("policies", help="placement and scheduling policies")
    pol.set_defaults(handler=help_handler(pol))  # no action: this help, exit 0
    pol_sub = pol.add_subparsers(title="policies commands", metavar="ACTION")
    pol_list = pol_sub.add_parser("list", help="built-in and plug-in policies, by name")
    pol_list.add_argument("--json", action="store_true")
    pol_list.add_argument("--all", action="store_true", help="list every janus-* configuration (collapsed by default)")
    pol_list.set_defaults(handler=cmd_policies_list)


def cmd_policies_list(args: argparse.Namespace) -> int:
    """Registered policies. The 60 ``janus-*`` fixed configurations collapse into one row unless
    ``--all`` is given."""
    from conduit.registry import policy_registry

    rows = policy_registry().describe()
    if not getattr(args, "all", False):
        collapsed = [r for r in rows if r["origin"] == "built-in" and _JANUS_CONFIGURATION.match(r["name"])]
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
