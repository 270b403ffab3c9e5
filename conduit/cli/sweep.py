"""``conduit sweep``: a grid of simulations, one CSV row per run, resumable (:func:`conduit.studies.sweep`).

``conduit sweep --topology T --workload W --grid runners_per_gpu=1,2,4 --grid bytes_per_step=1KB,28KB
--policies rllib-stock,conduit --seeds 0,1 --iterations 5 --out results.csv`` runs the cartesian product
and appends one row per run to ``results.csv`` as it finishes; rerun the same command and the rows
already there are skipped.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from conduit.cli import _args, conventions
from conduit.sim.run import MAX_ITERATIONS

_SHOWN = ("exposed_experience_path_s", "iteration_time_s", "experience_share", "violations")


def cmd_sweep(args: argparse.Namespace) -> int:
    from conduit.sim.workload_fields import parse_assignments
    from conduit.studies import parse_grid, sweep

    grid = parse_grid(args.grid)
    overrides = parse_assignments(args.set)
    out = args.out
    before = _rows_in(out)
    show_progress = conventions.progress_enabled(args)
    table = sweep(args.topology, args.workload, grid=grid, policies=args.policies, seeds=args.seeds,
                  iterations=args.iterations, overrides=overrides, out=out, progress=show_progress)
    if out is None:
        table.to_csv(sys.stdout)  # type: ignore[arg-type]
        return 0
    new = _rows_in(out) - before
    print(f"conduit sweep: {len(table)} runs, {new} new, {len(table) - new} already in {out}")
    _print_table(table)
    return 0


def _rows_in(path: Path | None) -> int:
    if path is None or not path.is_file():
        return 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        return max(0, sum(1 for _ in handle) - 1)


def _print_table(table, limit: int = 40) -> None:
    from conduit.units import Kind, format_quantity

    keys = [c for c in table.columns if c not in (*_metric_columns(), "iterations")]
    header = [*keys, "exposed", "iteration", "share", "violations"]
    rows = [header]
    for row in table[:limit]:
        cells = [str(row.get(k, "")) for k in keys]
        for c in _SHOWN:
            v = row.get(c)
            if isinstance(v, float) and math.isnan(v) or v is None:
                cells.append("n/a")
            elif c.endswith("_s"):
                cells.append(format_quantity(v, Kind.TIME) if v > 0 else "0 s")
            elif c == "experience_share":
                cells.append(f"{100 * v:.2f} %")
            else:
                cells.append(str(v))
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  " + "  ".join(cell.ljust(w) if i < len(keys) else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(r, widths, strict=True))))
    if len(table) > limit:
        print(f"  ... {len(table) - limit} more rows in the CSV")


def _metric_columns():
    from conduit.studies import METRIC_COLUMNS

    return METRIC_COLUMNS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="simulate a grid of workloads x topologies x policies x seeds into one CSV (resumable)",
        description="Run the cartesian product of every --grid key's values, --policies and --seeds; one CSV "
                    "row per run (the grid values, policy, seed, exposed experience-path latency, iteration "
                    "time, experience share, audit violations). Rows already in --out are skipped, so an "
                    "interrupted sweep resumes. Grid keys: any workload field (docs/workload-format.md), "
                    "'topology' or 'workload'.",
    )
    p.add_argument("--topology", help="library name or YAML path (default dgx-h100-x2; or a grid key)")
    p.add_argument("--workload", help="preset name or YAML path (default ppo; or a grid key)")
    p.add_argument("--grid", action="append", metavar="KEY=V1,V2", default=[],
                   help="a grid axis: a workload field, 'topology' or 'workload', and its values (repeatable)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="a workload field for every run (repeatable)")
    p.add_argument("--policies", default="rllib-stock", help="comma-separated policy names (default rllib-stock)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    p.add_argument("--iterations", type=_args.iterations, default=10,
                   help=f"learner updates per run, 1 to {MAX_ITERATIONS:,} (default 10)")
    p.add_argument("--out", type=Path, help="CSV file; rows are appended as runs finish and skipped on rerun "
                                            "(without --out the table goes to stdout)")
    conventions.add_progress_flag(p)
    p.set_defaults(handler=cmd_sweep)
