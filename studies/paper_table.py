"""Study: the paper's table, reproduced against the faithful stock model (issue 13).

For every algorithm (PPO, APPO, DQN and GRPO, the built-in presets ``ppo``, ``appo``, ``dqn`` and
``grpo-llm``, which follow RLlib's recipes as ``conduit/sim/workload.py`` cites them) and every scale
(8, 64, 128 and 1,024 GPUs: ``dgx-h100``, ``dgx-h100-x8``, ``dgx-h100-x16``, ``dgx-h100-x128`` from
``conduit/topologies/``), it simulates ``rllib-stock`` (stock RLlib 2.60 as its code runs) and
``conduit`` (the policy registered under that name: Conduit as ``enable()`` deploys it once the
deployed model lands) over several seeds, and reports

* the **exposed experience-path latency reduction**, ``1 - conduit / stock`` of the mean exposed
  latency per update (published: up to -97% at 1,024 GPUs), and
* the **iteration-time reduction**, ``1 - conduit / stock`` of the mean iteration time (published:
  up to -38%),

as the mean over seeds of the per-seed (paired) ratio with a 95% Student-t confidence interval. A
design-target variant of Conduit, if the registry has one (:data:`DESIGN_TARGET_NAMES`), is run too
and labelled as such: it is never the headline.

Every run's length is chosen so that its steady-state window (``conduit/sim/provenance.py``: warm-up
left out) holds :data:`~conduit.sim.provenance.MIN_ROUNDS` rounds of the algorithm; the run's own
steady-state and validity warnings are kept with its row. Every run must audit with zero violations
(the study asserts it).

Writes, under ``--out`` (default ``results/paper_table``): ``runs.csv`` (one row per run),
``paper_table.csv`` (one row per algorithm, scale and policy), ``paper_table.md`` (the table next to
the published figures, with provenance), ``paper_table.png`` (with matplotlib) and
``provenance.json`` (every run's provenance block, the stock costs in force, the topology hashes).

    python studies/paper_table.py [--quick] [--algorithms ppo appo dqn grpo] [--gpus 8 64 128 1024]
                                  [--seeds 0 1 2] [--stock-costs FILE] [--out results/paper_table]
    python studies/paper_table.py --merge DIR [DIR ...] --out DIR   # one table from runs made apart

``--quick`` (for tests): 8 GPUs only, two seeds.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conduit.registry import create_policy, policy_registry
from conduit.sim.cost_file import resolve_stock_costs
from conduit.sim.deployed import MULTI_LEARNER_WARNING
from conduit.sim.engine import SimResult, Simulation
from conduit.sim.params import StockCosts
from conduit.sim.provenance import MIN_ROUNDS, TREND_MIN_UPDATES, round_updates, topology_hash
from conduit.sim.workload import Workload, load_workload
from conduit.topology import Topology, load_topology

#: algorithm -> built-in preset
ALGORITHMS: dict[str, str] = {"ppo": "ppo", "appo": "appo", "dqn": "dqn", "grpo": "grpo-llm"}
#: GPUs -> library topology
SCALES: dict[int, str] = {8: "dgx-h100", 64: "dgx-h100-x8", 128: "dgx-h100-x16", 1024: "dgx-h100-x128"}
#: the published claims (at 1,024 GPUs): exposed latency up to 97% lower, iteration time up to 38% lower
PUBLISHED = {"exposed_reduction": 0.97, "iteration_reduction": 0.38}
BASELINE = "rllib-stock"
HEADLINE = "conduit"
#: names a design-target (idealised) Conduit variant may be registered under; run and labelled if present
DESIGN_TARGET_NAMES = ("conduit-design-target", "conduit-ideal", "conduit-target")
DEFAULT_SEEDS = (0, 1, 2)
QUICK_SEEDS = (0, 1)

# two-sided 95% Student-t quantiles by degrees of freedom (1..30); above 30 the normal 1.96
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its two-sided 95% Student-t confidence interval (``nan`` for one
    value: a single seed gives no interval)."""
    vals = [float(v) for v in values]
    if not vals:
        return math.nan, math.nan
    mean = statistics.fmean(vals)
    if len(vals) < 2:
        return mean, math.nan
    dof = len(vals) - 1
    t = _T95[dof - 1] if dof <= len(_T95) else 1.96
    return mean, t * statistics.stdev(vals) / math.sqrt(len(vals))


def warmup_updates(algorithm: str, iterations: int) -> int:
    """The updates a run of ``iterations`` leaves out as warm-up: ``Simulation._warmup``'s rule (PPO:
    the first update; APPO and DQN: a tenth of the run, at least one)."""
    if algorithm == "ppo":
        return 1 if iterations > 1 else 0
    return max(1, iterations // 10)


def steady_iterations(sim: Simulation, rounds: int = MIN_ROUNDS) -> int:
    """The fewest iterations whose measured window (after warm-up) holds ``rounds`` rounds of the
    algorithm (:func:`conduit.sim.provenance.round_updates` of this layout); for the asynchronous
    loops (APPO, DQN), whose queues and buffers take a while to settle, also at least
    :data:`~conduit.sim.provenance.TREND_MIN_UPDATES` updates, so that the trend check runs. (A
    synchronous PPO iteration starts from the same state every time: one round is one update.)"""
    need = rounds * round_updates(sim)
    if sim.workload.algorithm != "ppo":
        need = max(need, TREND_MIN_UPDATES)
    n = need + 1
    while n - warmup_updates(sim.workload.algorithm, n) < need:
        n += 1
    return n


def design_targets() -> list[str]:
    """The design-target variants of Conduit the registry holds (none until one is registered)."""
    names = set(policy_registry().names("policy"))
    return [n for n in DESIGN_TARGET_NAMES if n in names]


@dataclass(frozen=True)
class Cell:
    algorithm: str
    gpus: int
    topology: Topology
    workload: Workload


#: how many times a run whose window still trends is rerun, each time twice as long
MAX_EXTEND = 3
#: the steady-state check's warning (``conduit/sim/provenance.py``)
NOT_STEADY = "not steady"


def not_steady(result: SimResult) -> bool:
    """Whether ``result``'s steady-state check found a trend in its window."""
    return any(w.startswith(NOT_STEADY) for w in result.steady_state.get("warnings", []))


def run_steady(run: Callable[[int], SimResult], iterations: int, extend: int = MAX_EXTEND) -> tuple[SimResult, int]:
    """``run(iterations)``, rerun with twice the iterations while its window still trends, at most
    ``extend`` times: the result and how many times it was extended. A run still trending after that
    keeps its warning (its mean depends on the run's length: the queues grow without bound)."""
    result = run(iterations)
    extended = 0
    while extended < extend and not_steady(result):
        iterations *= 2
        extended += 1
        result = run(iterations)
    return result, extended


def run_one(cell: Cell, policy: str, seed: int, stock: StockCosts | None, stock_source: str | None,
            rounds: int = MIN_ROUNDS, extend: int = MAX_EXTEND) -> tuple[SimResult, int]:
    """One steady-state run of ``policy`` on ``cell`` (:func:`run_steady`); asserts zero audit
    violations."""
    def make(iterations: int) -> Simulation:
        return Simulation(cell.topology, cell.workload, create_policy(policy), iterations=iterations, seed=seed,
                          stock=stock, stock_source=stock_source)

    result, extended = run_steady(lambda n: make(n).run(), steady_iterations(make(1), rounds), extend)
    assert result.audit.violations == 0, (
        f"{cell.algorithm} at {cell.gpus} GPUs, {policy}, seed {seed}: {result.audit.violations} audit violation(s)")
    return result, extended


def run_row(cell: Cell, policy: str, seed: int, result: SimResult, wall_s: float, extended: int = 0) -> dict[str, Any]:
    m = result.metrics
    return {"algorithm": cell.algorithm, "workload": cell.workload.name, "gpus": cell.gpus,
            "topology": cell.topology.name, "policy": result.policy.name, "seed": seed,
            "iterations": result.iterations, "measured_updates": result.steady_state.get("measured_updates"),
            "rounds_measured": result.steady_state.get("rounds_measured"),
            "iteration_time_s": m["iteration_time_s"], "exposed_experience_path_s": m["exposed_experience_path_s"],
            "experience_share": m["experience_share"], "violations": int(result.audit.violations),
            "sim_wall_s": wall_s, "extended": extended, "not_steady": not_steady(result),
            "warnings": " | ".join(result.warnings)}


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 1.0 if num == den else math.inf


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (algorithm, GPUs, policy other than the baseline): per-seed paired reductions
    against ``rllib-stock``, mean and 95% CI, next to the mean absolute figures."""
    by_key: dict[tuple, dict[int, dict]] = {}
    for r in runs:
        by_key.setdefault((r["algorithm"], r["gpus"], r["policy"]), {})[r["seed"]] = r
    out = []
    for (algorithm, gpus, policy), seeds in sorted(by_key.items(), key=lambda kv: (list(ALGORITHMS).index(kv[0][0])
                                                                                  if kv[0][0] in ALGORITHMS else 99,
                                                                                  kv[0][1], kv[0][2])):
        if policy == BASELINE:
            continue
        base = by_key.get((algorithm, gpus, BASELINE), {})
        paired = sorted(s for s in seeds if s in base)
        if not paired:
            continue
        iter_red = [1 - _ratio(seeds[s]["iteration_time_s"], base[s]["iteration_time_s"]) for s in paired]
        exp_red = [1 - _ratio(seeds[s]["exposed_experience_path_s"], base[s]["exposed_experience_path_s"])
                   for s in paired]
        ir, ir_ci = mean_ci(iter_red)
        er, er_ci = mean_ci(exp_red)
        out.append({
            "algorithm": algorithm, "gpus": gpus, "topology": seeds[paired[0]]["topology"],
            "workload": seeds[paired[0]]["workload"], "policy": policy,
            "label": "headline" if policy == HEADLINE else "design target (not the headline)",
            "seeds": len(paired),
            "stock_iteration_s": statistics.fmean(base[s]["iteration_time_s"] for s in paired),
            "policy_iteration_s": statistics.fmean(seeds[s]["iteration_time_s"] for s in paired),
            "stock_exposed_s": statistics.fmean(base[s]["exposed_experience_path_s"] for s in paired),
            "policy_exposed_s": statistics.fmean(seeds[s]["exposed_experience_path_s"] for s in paired),
            "stock_share": statistics.fmean(base[s]["experience_share"] for s in paired),
            "policy_share": statistics.fmean(seeds[s]["experience_share"] for s in paired),
            "iteration_reduction": ir, "iteration_reduction_ci95": ir_ci,
            "exposed_reduction": er, "exposed_reduction_ci95": er_ci,
            "violations": sum(base[s]["violations"] + seeds[s]["violations"] for s in paired),
            "warnings": sum(bool(base[s]["warnings"]) + bool(seeds[s]["warnings"]) for s in paired),
            "beyond_deployed": any(beyond_deployed(seeds[s]) for s in paired),
            "not_steady": sum(_flag(base[s].get("not_steady")) + _flag(seeds[s].get("not_steady")) for s in paired),
        })
    return out


def _flag(value: Any) -> bool:
    """A boolean column of ``runs.csv``, typed (``True``/``"True"``) or absent (``None``: false)."""
    return value is True or str(value) == "True"


def beyond_deployed(run: dict[str, Any]) -> bool:
    """Whether ``run`` (a row of ``runs.csv``) applied the deployed mechanisms to more than one
    learner, which ``enable()`` refuses today: the simulator's validity warning
    (:data:`conduit.sim.deployed.MULTI_LEARNER_WARNING`) is among its warnings."""
    return MULTI_LEARNER_WARNING in run["warnings"]


def _pct(x: float, ci: float | None = None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    text = f"{-100 * x:+.1f}%"
    if ci is not None and not math.isnan(ci):
        text += f" ± {100 * ci:.1f}"
    return text


def _ms(x: float) -> str:
    return f"{1e3 * x:,.1f}" if x < 100 else f"{x:,.1f} s"


def format_table(rows: list[dict[str, Any]], headline: bool = True) -> str:
    """The paper table in markdown: changes are signed (a reduction is negative, as published).
    ``headline``: the headline policy's rows only (a dagger marks a row beyond the deployed runtime);
    otherwise the design targets' rows only, which never share a table with the headline."""
    lines = [("| algorithm | GPUs | policy | iteration stock → policy (ms) | iteration change (95% CI) | "
             "exposed stock → policy (ms) | exposed change (95% CI) | stock share | seeds | violations |"),
             "| --- | ---: | --- | --- | --- | --- | --- | ---: | ---: | ---: |"]
    for r in rows:
        if (r["label"] == "headline") != headline:
            continue
        mark = (" †" if _flag(r.get("beyond_deployed")) else "") + (" ‡" if r.get("not_steady") else "")
        lines.append(
            f"| {r['algorithm']} | {r['gpus']:,}{mark} | {r['policy']} | {_ms(r['stock_iteration_s'])} → {_ms(r['policy_iteration_s'])} | "
            f"{_pct(r['iteration_reduction'], r['iteration_reduction_ci95'])} | "
            f"{_ms(r['stock_exposed_s'])} → {_ms(r['policy_exposed_s'])} | "
            f"{_pct(r['exposed_reduction'], r['exposed_reduction_ci95'])} | {100 * r['stock_share']:.1f}% | "
            f"{r['seeds']} | {r['violations']} |")
    return "\n".join(lines)


def published_comparison(rows: list[dict[str, Any]]) -> str:
    """The largest simulated reductions of the headline policy next to the published -97% / -38%."""
    head = [r for r in rows if r["label"] == "headline"]
    if not head:
        return "No headline rows."
    lines = ["| figure | published (1,024 GPUs) | this table, best headline cell | this table, at the largest scale run |",
             "| --- | ---: | --- | --- |"]
    top = max(r["gpus"] for r in head)
    for key, label in (("exposed_reduction", "exposed experience-path latency"),
                       ("iteration_reduction", "iteration time")):
        best = max(head, key=lambda r: r[key])
        at_top = [r for r in head if r["gpus"] == top]
        top_text = ", ".join(f"{r['algorithm']} {_pct(r[key], r[key + '_ci95'])}" for r in at_top)
        lines.append(f"| {label} | {_pct(PUBLISHED[key])} | {_pct(best[key], best[key + '_ci95'])} "
                     f"({best['algorithm']}, {best['gpus']:,} GPUs) | {top_text} ({top:,} GPUs) |")
    return "\n".join(lines)


def where_it_does_not_help(rows: list[dict[str, Any]], threshold: float = 0.05) -> list[str]:
    """Cells where the headline policy cuts iteration time by less than ``threshold``, and cells
    whose mean clears it but whose 95% interval reaches below it (not distinguishable from no help)."""
    out = []
    for r in rows:
        if r["label"] != "headline":
            continue
        ci = r["iteration_reduction_ci95"]
        if r["iteration_reduction"] < threshold:
            out.append(f"{r['algorithm']} at {r['gpus']:,} GPUs: iteration {_pct(r['iteration_reduction'])}"
                       + (" (slower than stock)" if r["iteration_reduction"] < 0 else "")
                       + f" (stock share {100 * r['stock_share']:.1f}%)")
        elif not math.isnan(ci) and r["iteration_reduction"] - ci < threshold:
            out.append(f"{r['algorithm']} at {r['gpus']:,} GPUs: iteration {_pct(r['iteration_reduction'], ci)}: "
                       f"the 95% interval reaches below a {100 * threshold:.0f}% gain, so no help cannot be ruled "
                       f"out (stock share {100 * r['stock_share']:.1f}%)")
    return out


def draw(rows: list[dict[str, Any]]):
    """Two panels (exposed-latency change, iteration-time change) against GPUs, one line per
    algorithm with 95% CI error bars, the published figures as dashed lines: the headline policy in
    the top row and, when there is one, the design target in a separate row below, never on the same
    axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [("headline", [r for r in rows if r["label"] == "headline"])]
    target_rows = [r for r in rows if r["label"] != "headline"]
    if target_rows:
        groups.append(("design target, not deployed", target_rows))
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 4.2 * len(groups)), squeeze=False)
    ticks = sorted({r["gpus"] for r in rows})
    for (label, group), ax_row in zip(groups, axes, strict=True):
        policy = group[0]["policy"] if group else HEADLINE
        for ax, key, title in ((ax_row[0], "exposed_reduction", "exposed experience-path latency"),
                               (ax_row[1], "iteration_reduction", "iteration time")):
            for algorithm in ALGORITHMS:
                mine = sorted((r for r in group if r["algorithm"] == algorithm), key=lambda r: r["gpus"])
                if not mine:
                    continue
                err = [0.0 if math.isnan(r[key + "_ci95"]) else 100 * r[key + "_ci95"] for r in mine]
                ax.errorbar([r["gpus"] for r in mine], [-100 * r[key] for r in mine], yerr=err,
                            fmt="-o" if label == "headline" else ":x", capsize=3, label=algorithm)
            ax.axhline(-100 * PUBLISHED[key], color="grey", linestyle="--",
                       label=f"published {-100 * PUBLISHED[key]:.0f}% (1,024 GPUs)")
            ax.axhline(0, color="black", linewidth=0.6)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
            ax.set_xlabel("GPUs")
            ax.set_ylabel("change vs rllib-stock (%)")
            ax.set_title(f"{title}: {policy} ({label}) vs rllib-stock", fontsize=9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


@functools.cache
def _git_commit() -> str:
    """HEAD's commit, marked ``+dirty`` when tracked files under ``conduit/`` or ``studies/`` differ from it;
    read once, when the study starts (a commit made while it runs is not the code it runs)."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                                cwd=here, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "../conduit", "."],
                               capture_output=True, text=True, check=True, cwd=here, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def read_before_citing(rows: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[str]:
    """The caveats a reader must see before citing a figure of ``rows``, each from the data: what is
    simulated, which headline rows extrapolate beyond the deployed runtime (more than one learner),
    which are dominated by the stock model's serial driver work, and what the design target is."""
    head = [r for r in rows if r["label"] == "headline"]
    beyond = [r for r in head if r.get("beyond_deployed")]
    within = [r for r in head if not r.get("beyond_deployed")]
    dominated = [r for r in head if r["stock_share"] > 0.9]
    warned = [r for r in runs if r["warnings"]]
    kinds = sorted({"num_learners > 1 beyond the deployed runtime" if w == MULTI_LEARNER_WARNING else w.split(":")[0]
                    for r in warned for w in r["warnings"].split(" | ")})
    out = [
        ("- **Simulated.** The stock side is RLlib 2.60's code path with costs from microbenchmarks of primitives "
        "(`conduit/sim/params.py`); the `conduit` side is Conduit as `enable()` deploys it "
        "(`conduit/sim/deployed.py`) with the plane's costs measured by `conduit calibrate --plane-json` on a "
        "2-core CPU machine. Every GPU cluster here is beyond the calibrated points; the out-of-sample error "
        "of the simulator is reported by `studies/validation.py`, not here."),
    ]
    if beyond:
        out.append(
            "- **Beyond the deployed runtime (†).** `enable()` refuses `num_learners > 1` today. "
            f"{len(beyond)} of {len(head)} headline rows have more than one learner ("
            + ", ".join(f"{r['algorithm']} at {r['gpus']:,} GPUs" for r in beyond)
            + "): the simulator applies the deployed mechanisms per learner (one plane actor per learner node), "
            "what the runtime would do once it feeds each learner its own batch. Every such run carries that "
            "validity warning (`runs.csv`); these rows are an extrapolation, not a model of software that runs "
            "today." + (" Rows within the deployed runtime (one learner): "
                        + ", ".join(f"{r['algorithm']} at {r['gpus']:,} GPUs" for r in within) + "."
                        if within else " No row is within the deployed runtime."))
    unsteady = [r for r in rows if r.get("not_steady")]
    if unsteady:
        out.append(
            "- **Not steady (‡).** In these cells a run's iteration time still trended after the run was doubled "
            f"{MAX_EXTEND} times (`not steady` in `runs.csv`; a queue that grows without bound): its mean depends "
            "on the run's length, so the change is not a steady-state figure: "
            + ", ".join(f"{r['algorithm']} at {r['gpus']:,} GPUs ({r['policy']}: {r['not_steady']} of "
                        f"{2 * r['seeds']} runs)" for r in unsteady) + ".")
    if dominated:
        out.append(
            "- **Dominated by the stock model.** Cells whose stock experience share exceeds 90% ("
            + ", ".join(f"{r['algorithm']} at {r['gpus']:,} GPUs, {100 * r['stock_share']:.0f}%" for r in dominated)
            + ") are dominated by the stock model's experience path: their reductions rest on that model's "
            "costs at a scale no measurement confirms.")
    targets = sorted({r["policy"] for r in rows if r["label"] != "headline"})
    if targets:
        out.append(
            f"- **Design target.** {', '.join(f'`{t}`' for t in targets)} is the idealised Conduit (no driver loop, "
            "free plane calls, batches in HBM): not deployed, shown only in its own table below, never the headline.")
    out.append(f"- {len(warned)} of {len(runs)} runs carry warnings ({', '.join(kinds) or 'none'}); "
               "every warning is in `runs.csv`.")
    return out


def write_report(out: Path, rows: list[dict[str, Any]], runs: list[dict[str, Any]], provenance: dict[str, Any],
                 args: argparse.Namespace, wall_s: float) -> None:
    weak = where_it_does_not_help(rows)
    fewer = [r for r in rows if r["label"] == "headline" and r["seeds"] < len(provenance["seeds"])]
    has_target = any(r["label"] != "headline" for r in rows)
    scales = sorted({r["gpus"] for r in rows})
    missing = [f"{a} at {g:,} GPUs" for a in ALGORITHMS for g in scales
               if not any(r["algorithm"] == a and r["gpus"] == g and r["label"] == "headline" for r in rows)]
    text = [
        "# The paper table: Conduit as deployed against the faithful stock model",
        "",
        f"`python studies/paper_table.py {' '.join(args.argv)}`".replace(" `", "`"),
        "",
        ("Change of `conduit` (Conduit as `enable()` deploys it) against `rllib-stock` (negative: lower than "
        "stock), mean over seeds of the per-seed paired ratio, with the half-width of its 95% Student-t interval. "
        "Iteration time and exposed experience-path latency as defined in `/work/shared/DESIGN.md`; means over "
        f"each run's steady-state window ({MIN_ROUNDS} rounds of the algorithm after warm-up, "
        "`conduit/sim/provenance.py`; a run whose window still trends is rerun twice as long, at most "
        f"{MAX_EXTEND} times). † marks a row beyond the deployed runtime (more than one learner, which "
        "`enable()` refuses today), ‡ a row not in steady state: read the section below before citing either."),
        "",
        format_table(rows),
        "",
        *([f"Not in this table (not run, or stopped before the pair finished): {', '.join(missing)}.", ""]
          if missing else []),
        *([("Fewer seeds than the others (time): " + ", ".join(f"{r['algorithm']} at {r['gpus']:,} GPUs {r['seeds']} "
                                                                 f"seed(s)" for r in fewer)
            + f"; the other rows {len(provenance['seeds'])}. A single seed has no interval."), ""]
          if fewer else []),
        "## Next to the published figures",
        "",
        published_comparison(rows),
        "",
        "## Read before citing",
        "",
        *read_before_citing(rows, runs),
        "",
        "## Where Conduit does not help (iteration time less than 5% lower)",
        "",
        *([f"- {line}" for line in weak] or ["- every cell gains at least 5%"]),
        "",
        *(["## Design target (not deployed, not the headline)", "",
           "The idealised Conduit the runtime does not yet implement, against the same stock runs:", "",
           format_table(rows, headline=False), ""] if has_target else []),
        "## Provenance",
        "",
        f"- project version {provenance['project_version']}, git commit `{provenance['git_commit']}`",
        f"- stock costs: {provenance['stock_costs']['source']}",
        f"- policies: baseline `{BASELINE}`, headline `{HEADLINE}` (whatever the registry holds under that name "
        "at the commit above: Conduit as `enable()` deploys it, `conduit/sim/deployed.py`)"
        + (f", design targets {', '.join(provenance['design_targets'])}" if provenance["design_targets"] else
           ", no design-target variant registered"),
        "- topologies (SHA-256 of devices and links): "
        + ", ".join(f"`{k}` {v[:12]}" for k, v in provenance["topologies"].items()),
        (f"- seeds {', '.join(str(s) for s in args.seeds)}; {len(runs)} runs, {wall_s:.0f} s of simulation wall "
        "time; every run's provenance block is in `provenance.json`"),
        "",
    ]
    (out / "paper_table.md").write_text("\n".join(text))


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        path.write_text("")
        return
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)


def cells(algorithms: Iterable[str], gpus: Iterable[int]) -> list[Cell]:
    out = []
    for n in gpus:
        topology = load_topology(SCALES[n])
        for algorithm in algorithms:
            out.append(Cell(algorithm, n, topology, load_workload(ALGORITHMS[algorithm])))
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 GPUs, two seeds (for tests)")
    parser.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS), default=None)
    parser.add_argument("--gpus", nargs="+", type=int, choices=list(SCALES), default=None)
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--stock-costs", default=None, help="stock cost file (YAML/JSON of StockCosts fields)")
    parser.add_argument("--out", type=Path, default=Path("results/paper_table"))
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--extend", type=int, default=MAX_EXTEND, metavar="N",
                        help=f"rerun a run whose window still trends with twice the iterations, at most N times "
                             f"(default {MAX_EXTEND})")
    parser.add_argument("--merge", nargs="+", type=Path, default=None, metavar="DIR",
                        help="write one table from earlier outputs (their runs.csv and provenance.json), run nothing")
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    args.algorithms = args.algorithms or list(ALGORITHMS)
    args.gpus = args.gpus or ([8] if args.quick else list(SCALES))
    args.seeds = args.seeds or list(QUICK_SEEDS if args.quick else DEFAULT_SEEDS)
    if len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0:
        parser.error("--seeds: distinct non-negative integers")
    if args.extend < 0:
        parser.error("--extend must be >= 0")
    return args


def _provenance(run_provenance: list[dict[str, Any]], stock: StockCosts | None, stock_source: str | None,
                policies: list[str], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "project_version": run_provenance[0]["provenance"]["project_version"] if run_provenance else "unknown",
        "git_commit": _git_commit(),
        "stock_costs": {"source": stock_source or "built-in defaults (conduit/sim/params.py StockCosts)",
                        "values": vars(stock or StockCosts())},
        "design_targets": [p for p in policies if p not in (BASELINE, HEADLINE)],
        "topologies": {c.topology.name: topology_hash(c.topology) for c in cells(args.algorithms, args.gpus)},
        "seeds": args.seeds,
        "runs": run_provenance,
    }


_INT_COLUMNS = ("gpus", "seed", "iterations", "measured_updates", "violations")
_FLOAT_COLUMNS = ("rounds_measured", "iteration_time_s", "exposed_experience_path_s", "experience_share", "sim_wall_s")


def read_runs(directory: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The runs (typed back from ``runs.csv``) and the provenance a previous run wrote in ``directory``."""
    runs = []
    with (directory / "runs.csv").open() as fh:
        for row in csv.DictReader(fh):
            for k in _INT_COLUMNS:
                row[k] = int(row[k])
            for k in _FLOAT_COLUMNS:
                row[k] = float(row[k])
            # columns added later (runs written before them: never extended; the warning says "not steady")
            row["extended"] = int(row.get("extended") or 0)
            row["not_steady"] = any(w.startswith(NOT_STEADY) for w in row["warnings"].split(" | "))
            row["warnings"] = row.pop("warnings")  # kept last, as run_row writes it
            runs.append(row)
    return runs, json.loads((directory / "provenance.json").read_text())


def merge(directories: list[Path]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Runs and provenance of several earlier outputs (e.g. the small scales and 1,024 GPUs run
    apart), refusing two that disagree on the stock costs or the project version."""
    runs: list[dict[str, Any]] = []
    merged: dict[str, Any] = {}
    for directory in directories:
        more, prov = read_runs(directory)
        if merged:
            for key in ("stock_costs", "project_version"):
                if prov[key] != merged[key]:
                    raise SystemExit(f"--merge: {directory} has other {key} than {directories[0]}")
            merged["topologies"].update(prov["topologies"])
            merged["runs"] += prov["runs"]
            merged["seeds"] = sorted(set(merged["seeds"]) | set(prov["seeds"]))
            merged["git_commit"] = ", ".join(dict.fromkeys([*merged["git_commit"].split(", "), prov["git_commit"]]))
            merged["design_targets"] = sorted(set(merged["design_targets"]) | set(prov["design_targets"]))
        else:
            merged = dict(prov)
        runs += more
    merged["merged_from"] = [str(d) for d in directories]
    return runs, merged


def write_outputs(args: argparse.Namespace, runs: list[dict[str, Any]], provenance: dict[str, Any],
                  wall: float) -> list[dict[str, Any]]:
    rows = summarise(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    _write_csv(args.out / "runs.csv", runs)
    _write_csv(args.out / "paper_table.csv", rows)
    (args.out / "provenance.json").write_text(json.dumps(provenance, indent=1, default=str) + "\n")
    write_report(args.out, rows, runs, provenance, args, wall)
    if not args.no_plot:
        try:
            fig = draw(rows)
        except ImportError:
            print("matplotlib is not installed (pip install 'conduit[plot]'): no figure")
        else:
            fig.savefig(args.out / "paper_table.png", dpi=120)
    print()
    print(format_table(rows))
    print()
    print(published_comparison(rows))
    print(f"\nwrote {args.out}/paper_table.{{csv,md,png}}, runs.csv, provenance.json ({wall:.0f} s)")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _git_commit()  # the code this run starts with
    if args.merge:
        runs, provenance = merge(args.merge)
        args.seeds = provenance["seeds"]
        write_outputs(args, runs, provenance, sum(r["sim_wall_s"] for r in runs))
        return 0
    stock, stock_source = resolve_stock_costs(args.stock_costs)
    policies = [BASELINE, HEADLINE, *design_targets()]
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    run_provenance: list[dict[str, Any]] = []
    for cell in cells(args.algorithms, args.gpus):
        for seed in args.seeds:
            for policy in policies:
                t0 = time.perf_counter()
                result, extended = run_one(cell, policy, seed, stock, stock_source, extend=args.extend)
                row = run_row(cell, policy, seed, result, time.perf_counter() - t0, extended)
                runs.append(row)
                run_provenance.append({"algorithm": cell.algorithm, "gpus": cell.gpus, "policy": policy,
                                       "seed": seed, "provenance": result.provenance,
                                       "steady_state": result.steady_state, "validity": {
                                           k: v for k, v in result.validity.items() if k != "calibrated_points"}})
                # every finished run is on disk at once: a long run stopped early can still be merged
                args.out.mkdir(parents=True, exist_ok=True)
                _write_csv(args.out / "runs.csv", runs)
                (args.out / "provenance.json").write_text(json.dumps(
                    _provenance(run_provenance, stock, stock_source, policies, args), indent=1, default=str) + "\n")
                print(f"{cell.algorithm:<5} {cell.gpus:>5} GPUs  {policy:<22} seed {seed}: "
                      f"iteration {1e3 * row['iteration_time_s']:.2f} ms, exposed "
                      f"{1e3 * row['exposed_experience_path_s']:.3f} ms, {row['iterations']} iterations, "
                      f"{row['sim_wall_s']:.1f} s", flush=True)
    wall = time.perf_counter() - started
    write_outputs(args, runs, _provenance(run_provenance, stock, stock_source, policies, args), wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
