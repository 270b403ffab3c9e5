"""``conduit tune``: search a policy's declared parameters on the simulator (:func:`conduit.sim.tune.tune`)
and write the best to a file ``conduit sim --params`` loads."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from conduit.cli import _args, conventions
from conduit.errors import ConduitError
from conduit.sim.tune import (
    DEFAULT_BUDGET,
    DEFAULT_ITERATIONS,
    DEFAULT_OBJECTIVE,
    OBJECTIVES,
    TuneResult,
    _json_metrics,
    _plain,
    tune,
    write_result,
)


def _time(seconds: Any) -> str:
    """Seconds with five significant digits (gains of a fraction of a percent stay visible)."""
    try:
        x = float(seconds)
    except (TypeError, ValueError):
        return "n/a"
    if not math.isfinite(x):
        return "n/a"
    if x <= 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if x >= scale:
            return f"{x / scale:.5g} {unit}"
    return f"{x / 1e-9:.5g} ns"


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_table(result: TuneResult, written: Path | None = None) -> None:
    print(f"conduit tune: policy {result.policy} for {result.workload} on {result.topology}, "
          f"objective {result.objective}; {result.simulations} simulations (budget {result.budget}), "
          f"{result.iterations} iterations, seed {result.seed}, {result.wall_s:.1f} s")
    if result.fold != 1:
        print(f"  every simulation folded (fold={result.fold}): an approximation of the exact simulation "
              f"(benchmarks/sim_speed.py --fold prints its error); a gain smaller than that error is not a finding")
    infeasible = sum(not t.feasible for t in result.history)
    if infeasible:
        print(f"  {infeasible} infeasible run(s) (audit violations or refused parameters) were never chosen")
    names = list(result.best_params) or list(result.default_params)
    width = max([len(n) for n in names] + [len("parameter")])
    print(f"  {'parameter':<{width}}  {'default':>12}  {'best':>12}")
    for n in names:
        mark = "" if result.default_params.get(n) == result.best_params.get(n) else "  *"
        print(f"  {n:<{width}}  {_value(result.default_params.get(n, '-')):>12}  "
              f"{_value(result.best_params.get(n)):>12}{mark}")
    rows = (("exposed experience-path latency", "exposed_experience_path_s"),
            ("iteration time", "iteration_time_s"))
    label_width = max(len(label) for label, _ in rows) + len(" (objective)")
    print(f"  {'metric (mean)':<{label_width}}  {'default':>10}  {'best':>10}  {'default/best':>12}  {'reduction':>9}")
    for label, key in rows:
        ratio, percent = result.gain(key)
        shown = label + (" (objective)" if key == result.objective else "")
        ratio_s = "n/a" if math.isnan(ratio) else ("inf" if math.isinf(ratio) else f"{ratio:.3f}x")
        percent_s = "n/a" if math.isnan(percent) else f"{percent:.2f} %"
        print(f"  {shown:<{label_width}}  {_time(result.default_metrics.get(key)):>10}  "
              f"{_time(result.best_metrics.get(key)):>10}  {ratio_s:>12}  {percent_s:>9}")
    if not result.improved:
        print("  the defaults were not beaten: they are the best parameters found")
    if written is not None:
        print(f"  written: {written}  (use: conduit sim --policy {result.policy} --params {written} "
              f"--topology {result.topology} --workload {result.workload} --iterations {result.iterations} "
              f"--seed {result.seed})")


def cmd_tune(args: argparse.Namespace) -> int:
    if args.budget < 1:
        raise ConduitError(f"--budget must be >= 1 (simulations, the defaults included), got {args.budget}")
    if args.iterations < 1:
        raise ConduitError(f"--iterations must be >= 1, got {args.iterations}")
    with conventions.progress_bar(f"tuning {args.policy} for {args.workload} on {args.topology}",
                                  conventions.progress_enabled(args), unit="simulation") as bar:
        result = tune(args.topology, args.workload, args.policy, budget=args.budget, seed=args.seed,
                      iterations=args.iterations, objective=args.objective, progress=bar, fold=args.fold)
    written = write_result(result, args.out)
    if args.json:
        print(json.dumps(result_json(result, written), indent=2))
        return 0
    print_table(result, written)
    return 0


#: the keys of ``conduit tune --json``, in order (documented in the README)
JSON_KEYS = ("policy", "topology", "workload", "objective", "budget", "simulations", "infeasible", "seed",
             "iterations", "wall_s", "default_params", "best_params", "default_metrics", "best_metrics",
             "improved", "gains", "written", "fold")


def result_json(result: TuneResult, written: Path | None) -> dict[str, Any]:
    """``conduit tune --json``: one object with :data:`JSON_KEYS`. Non-finite numbers are null;
    ``gains`` maps each metric the table shows to ``{"ratio": default/best, "reduction_percent"}``."""
    def finite(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    gains = {}
    for key in ("exposed_experience_path_s", "iteration_time_s"):
        ratio, percent = result.gain(key)
        gains[key] = {"ratio": finite(ratio), "reduction_percent": finite(percent)}
    out = {
        "policy": result.policy, "topology": str(result.topology), "workload": str(result.workload),
        "objective": result.objective, "budget": result.budget, "simulations": result.simulations,
        "infeasible": sum(not t.feasible for t in result.history), "seed": result.seed,
        "iterations": result.iterations, "wall_s": result.wall_s,
        "default_params": {k: _plain(v) for k, v in result.default_params.items()},
        "best_params": {k: _plain(v) for k, v in result.best_params.items()},
        "default_metrics": _json_metrics(result.default_metrics), "best_metrics": _json_metrics(result.best_metrics),
        "improved": result.improved, "gains": gains, "written": str(written) if written is not None else None,
        "fold": result.fold,
    }
    return out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="search a policy's declared parameters on the simulator",
                       description="Search the parameters a policy declares (Policy.space) on the simulator for "
                                   "one workload on one topology; the defaults are simulated first and the best "
                                   "feasible parameters (zero audit violations) are written to a file that "
                                   "'conduit sim --params FILE' loads.")
    p.add_argument("--topology", required=True, help="library name or YAML path")
    p.add_argument("--workload", required=True,
                   help=f"preset name or YAML path (presets: {conventions.workload_choices()})")
    p.add_argument("--policy", required=True,
                   help=f"registered policy name, one that declares a space (policies: {conventions.policy_choices()})")
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET,
                   help=f"simulations, the defaults included (default {DEFAULT_BUDGET})")
    p.add_argument("--seed", type=_args.seed, default=0, help="seeds the search and the simulator (default 0)")
    p.add_argument("--iterations", type=_args.iterations, default=DEFAULT_ITERATIONS,
                   help=f"learner updates per simulation (default {DEFAULT_ITERATIONS})")
    p.add_argument("--objective", choices=OBJECTIVES, default=DEFAULT_OBJECTIVE,
                   help=f"what to minimise (default {DEFAULT_OBJECTIVE}; ties broken by the other)")
    p.add_argument("--out", type=Path,
                   help="tuned-parameter file (default results/tuned-<policy>-<workload>-<topology>.json)")
    p.add_argument("--fold", type=_args.fold, default=1, metavar="K",
                   help="PPO: simulate every candidate with one representative per K identical nodes besides the "
                        "driver's (conduit sim --fold); default 1: exact")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the table (keys: " + ", ".join(JSON_KEYS) + ")")
    conventions.add_progress_flag(p)
    p.set_defaults(handler=cmd_tune)
