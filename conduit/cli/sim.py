"""``conduit sim``: simulate a workload's experience path on a topology (:func:`conduit.sim.run.simulate`).

Prints a readable summary by default, or with ``--json`` one JSON object (``metrics`` with the four
metrics of docs/metrics.md, ``audit`` with ``violations``, and the ``provenance``, ``validity``,
``steady_state`` blocks and ``warnings`` of :mod:`conduit.sim.provenance`). ``--seeds N`` runs N seeds
and reports means with 95% confidence intervals (:mod:`conduit.sim.seeds`); ``--sim-time`` replaces
``--iterations``; ``--plane-costs FILE`` replaces Conduit's own costs (a ``conduit calibrate
--plane-json`` file); ``--stock-costs FILE`` replaces the stock cost model's fields
(:mod:`conduit.sim.cost_file`). Warnings go to stderr in the readable form. Exits 3 when the audit
counts violations.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from conduit.cli import _args, conventions
from conduit.errors import ConduitError
from conduit.sim.run import DEFAULT_POLICY, MAX_ITERATIONS, simulate
from conduit.units import Kind, format_quantity

#: ``conduit sim``'s exit status when the run finished but the audit counted violations
EXIT_VIOLATIONS = 3


def cmd_sim(args: argparse.Namespace) -> int:
    from conduit.sim.metrics import dumps

    if args.iterations is not None and args.iterations < 1:
        raise ConduitError(f"--iterations must be >= 1, got {args.iterations}")
    if args.trace:
        from conduit.sim.metrics import Recorder

        Recorder.check_trace_path(args.trace)  # before the run, not after it
    params = None
    if args.params:
        from conduit.tuning_file import load_params

        params = load_params(args.params, args.policy)
    from conduit.sim.workload_fields import parse_assignments

    overrides = parse_assignments(args.set)
    stock_costs = None
    if args.stock_costs is not None:
        from conduit.sim.cost_file import load_stock_costs

        try:
            load_stock_costs(args.stock_costs)  # refused here, naming the argument, before any run
        except ConduitError as exc:
            raise ConduitError(f"--stock-costs {exc}") from None
        stock_costs = str(args.stock_costs)
    plane_costs = None
    if getattr(args, "plane_costs", None) is not None:
        from conduit.sim.cost_file import load_plane_costs

        try:
            load_plane_costs(args.plane_costs)  # refused here, naming the argument, before any run
        except ConduitError as exc:
            raise ConduitError(f"--plane-costs {exc}") from None
        plane_costs = str(args.plane_costs)
    if args.seeds > 1 and args.trace:
        raise ConduitError("--trace writes one run's traces; it cannot be combined with --seeds above 1")
    if args.sim_time is not None and args.iterations is not None:
        raise ConduitError("--sim-time and --iterations are alternatives; give one of them")
    iterations = args.iterations if args.iterations is not None else DEFAULT_ITERATIONS
    run = {"iterations": iterations, "params": params, "overrides": overrides, "stock_costs": stock_costs,
           "sim_time": args.sim_time, "plane_costs": plane_costs, "fold": args.fold}
    if args.seeds > 1:
        from conduit.sim.seeds import simulate_seeds

        with conventions.progress_bar(f"simulating {args.workload} on {args.topology}, {args.seeds} seeds",
                                      conventions.progress_enabled(args), unit="seed") as progress:
            summary = simulate_seeds(args.topology, args.workload, args.policy, seeds=args.seeds, seed=args.seed,
                                     progress=progress, **run)
        if args.json:
            print(dumps(summary.to_dict()))
        else:
            print_seed_summary(summary)
        return EXIT_VIOLATIONS if summary.violations else 0
    with conventions.progress_bar(f"simulating {args.workload} on {args.topology}",
                                  conventions.progress_enabled(args), unit="update") as progress:
        result = simulate(args.topology, args.workload, args.policy, seed=args.seed, progress=progress, **run)
    written = result.recorder.write_trace(args.trace, tiers=result.tier_trace) if args.trace else []
    if args.json:
        print(dumps(result.to_dict()))
        return EXIT_VIOLATIONS if result.audit.violations else 0
    print_summary(result)
    for path in written:
        print(f"trace written: {path}")
    if result.audit.violations:
        print(f"conduit sim: the audit found {result.audit.violations} violation(s) "
              f"(exit status {EXIT_VIOLATIONS})", file=sys.stderr)
        return EXIT_VIOLATIONS
    return 0


DEFAULT_ITERATIONS = 10


def print_seed_summary(summary) -> None:
    first = summary.results[0]
    print(f"conduit sim: {first.workload.name} ({first.workload.algorithm}) on {first.topology}, policy "
          f"{first.policy.name}, seeds {summary.seeds[0]}..{summary.seeds[-1]} ({len(summary.seeds)} runs)")
    conf = summary.confidence
    print(f"  {'metric':<28} {'mean':>12} {'95% CI (t)':>27} {'std':>11}")
    for name in ("exposed_experience_path_s", "experience_path_s", "iteration_time_s", "experience_share"):
        c = conf[name]
        fmt = (lambda v: f"{100 * v:.2f} %") if name == "experience_share" else _t
        ci = f"[{fmt(c['ci95'][0])}, {fmt(c['ci95'][1])}]" if math.isfinite(c["half_width"]) else "n/a"
        print(f"  {name:<28} {fmt(c['mean']):>12} {ci:>27} {fmt(c['std']) if math.isfinite(c['std']) else 'n/a':>11}")
    print(f"  audit violations (all seeds)  {summary.violations}")
    _print_warnings(summary.warnings)


def _print_warnings(warnings: list[str]) -> None:
    for w in warnings:
        print(f"conduit sim: warning: {w}", file=sys.stderr)


def print_summary(result) -> None:
    m = result.metrics
    print(f"conduit sim: {result.workload.name} ({result.workload.algorithm}) on {result.topology}, "
          f"policy {result.policy.name}, {result.iterations} iterations, seed {result.seed}")
    rows = [
        ("exposed experience-path latency (mean/update)", _t(m["exposed_experience_path_s"])),
        ("experience path (mean/chunk)", _t(m["experience_path_s"])),
        ("experience path p99", _t(m["experience_path_p99_s"])),
        ("iteration time (mean)", _t(m["iteration_time_s"])),
        ("experience share", f"{100 * m['experience_share']:.2f} %" if not math.isnan(m["experience_share"]) else "n/a"),
        ("updates / chunks", f"{m['updates']} / {m['chunks']}"),
        ("rejected policy decisions", _rejections(result.rejections)),
        ("audit violations", f"{result.audit.violations}"),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if result.segments:
        print("  segments per iteration (observed learner / driver):")
        for name, value in result.segments.items():
            print(f"    {name:<14} {_t(value)}")
    if result.link_utilization:
        top = list(result.link_utilization.items())[:3]
        print("  busiest links: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in top))
    if result.audit.violations:
        print("  audit: " + ", ".join(f"{k}={v}" for k, v in result.audit.by_kind.items() if v))
    print(f"  simulated {result.sim_time:.3f} s")
    topo = result.provenance.get("topology", {})
    if topo:
        print(f"  provenance: conduit {result.provenance['project_version']}, topology sha256 "
              f"{topo['sha256'][:12]}, stock costs: {result.provenance['cost_parameters']['stock']['source']}")
    _print_warnings(result.warnings)


def _rejections(rejections: dict) -> str:
    """``3 (unknown-tier 2, over-capacity 1)``, plus the moves forced for waiting learners."""
    text = str(rejections.get("total", 0))
    reasons = rejections.get("by_reason") or {}
    if reasons:
        text += " (" + ", ".join(f"{code} {n}" for code, n in reasons.items()) + ")"
    forced = rejections.get("forced_moves", 0)
    if forced:
        text += (f"; {forced} moves forced: the scheduler planned nothing for data a learner was "
                 "waiting on, so the plane moved it")
    return text


def _t(seconds: float) -> str:
    if math.isnan(seconds):
        return "n/a"
    return format_quantity(seconds, Kind.TIME) if seconds > 0 else "0 s"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="simulate a workload's experience path on a topology",
                       epilog=f"Exit status: 0 when the run finished with zero audit violations, "
                              f"{EXIT_VIOLATIONS} when the audit counted violations (the results are still "
                              f"printed), 2 for a usage or input error (a message names the argument, file or "
                              f"field), 1 for a bug in Conduit.")
    p.add_argument("--topology", default="dgx-h100-x2", help="library name or YAML path (default dgx-h100-x2)")
    p.add_argument("--workload", default="ppo",
                   help=f"preset name or YAML path (default ppo; presets: {conventions.workload_choices()})")
    p.add_argument("--policy", default=DEFAULT_POLICY,
                   help=f"registered policy name (default {DEFAULT_POLICY}; policies: {conventions.policy_choices()}; "
                        "see 'conduit policies list')")
    p.add_argument("--params", type=Path, help="tuned-parameter file written by 'conduit tune'")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="override a workload field, e.g. --set runners_per_gpu=4 --set env_step_time='1 ms' "
                        "(repeatable; fields: conduit workload show NAME, docs/workload-format.md)")
    p.add_argument("--iterations", type=_args.iterations, default=None,
                   help=f"learner updates to simulate, 1 to {MAX_ITERATIONS:,} (default {DEFAULT_ITERATIONS})")
    p.add_argument("--sim-time", type=_args.sim_time, default=None, metavar="SECONDS",
                   help="instead of --iterations: run until the measured steady-state window covers this many "
                        "simulated seconds (e.g. 30 or '500 ms')")
    p.add_argument("--seed", type=_args.seed, default=0, help="a non-negative integer (default 0)")
    p.add_argument("--seeds", type=_args.seeds, default=1, metavar="N",
                   help="run seeds SEED..SEED+N-1 and report each metric's mean and 95%% confidence interval "
                        "(default 1)")
    p.add_argument("--stock-costs", type=Path, default=None, metavar="FILE",
                   help="YAML/JSON mapping of StockCosts fields (the rllib-stock cost model) to values; the "
                        "costs in force are echoed in the output's provenance")
    p.add_argument("--plane-costs", type=Path, default=None, metavar="FILE",
                   help="Conduit's own costs (PlaneCosts): a calibration from `conduit calibrate --plane-json FILE` "
                        "or a YAML/JSON mapping of PlaneCosts fields; echoed in the output's provenance")
    p.add_argument("--fold", type=_args.fold, default=1, metavar="K",
                   help="PPO: simulate one representative per K identical nodes besides the driver's; an "
                        "approximation for large clusters, marked in the result (default 1: exact)")
    p.add_argument("--json", action="store_true", help="print one JSON object (metrics per docs/metrics.md, audit)")
    p.add_argument("--trace", type=Path, help="chunk, update and tier traces: t.csv, t.updates.csv, t.tiers.csv")
    conventions.add_progress_flag(p)
    p.set_defaults(handler=cmd_sim)
