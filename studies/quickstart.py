"""Quickstart study: the experience path of PPO, APPO and DQN under several policies.

On the built-in default topology (``dgx-h100-x2``, 16 H100 GPUs) it simulates each preset under each
policy and prints exposed experience-path latency, iteration time and experience share (docs/metrics.md
definitions), with the audit's violation count for every run.

The headline is ``conduit``: Conduit as ``enable()`` deploys it today (:mod:`conduit.sim.deployed`:
RLlib's driver loop kept, a plane-actor round trip per call, copies into and out of the plane, host
batches). ``conduit-target`` is the design target (no driver, free plane calls, HBM batches), shown
for comparison under its own name, never as the headline; ``janus-best`` is modelled like it (an
idealised path), so compare it with ``conduit-target``. The study ends by saying, per workload,
where the deployed Conduit does not help. Writes ``results/quickstart.csv`` and
``results/quickstart.png`` (the figure needs matplotlib, ``conduit-rl[plot]``; without it the study
says so and writes the CSV only). This is what ``make demo`` runs.

    python studies/quickstart.py [--topology dgx-h100-x2] [--policies rllib-stock host-only all-gpu]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

from conduit.sim.run import simulate
from conduit.topology import DEFAULT_TOPOLOGY, load_topology

WORKLOADS = {"ppo": 6, "appo": 60, "dqn": 300}  # iterations: enough updates for stable means
#: the policy whose figures are the headline: Conduit as enable() deploys it
HEADLINE = "conduit"
DEFAULT_POLICIES = ["rllib-stock", HEADLINE, "conduit-target", "janus-best"]
#: a deployed iteration within this fraction of stock's counts as "no gain"
NO_GAIN = 0.02


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default=DEFAULT_TOPOLOGY)
    parser.add_argument("--policies", nargs="+", default=DEFAULT_POLICIES)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    topology = load_topology(args.topology)
    started = time.perf_counter()
    rows = []
    header = (f"{'workload':<8} {'policy':<15} {'exposed path':>13} {'vs stock':>9} {'iteration':>10} "
              f"{'vs stock':>9} {'exp. share':>10} {'violations':>10}")
    print(f"Conduit quickstart on {topology.name}: {len(topology.devices_of('gpu'))} GPUs, "
          f"{len(topology.nodes)} nodes\n")
    print(header)
    print("-" * len(header))
    for workload in args.workloads:
        base = None
        for policy in args.policies:
            result = simulate(topology, workload, policy, iterations=WORKLOADS.get(workload, 10), seed=args.seed)
            m = result.metrics
            if base is None:
                base = m
            row = {
                "topology": topology.name, "workload": workload, "policy": policy,
                "exposed_experience_path_s": m["exposed_experience_path_s"],
                "iteration_time_s": m["iteration_time_s"], "experience_share": m["experience_share"],
                "experience_path_s": m["experience_path_s"],
                "exposed_vs_first": _ratio(m["exposed_experience_path_s"], base["exposed_experience_path_s"]),
                "iteration_vs_first": _ratio(m["iteration_time_s"], base["iteration_time_s"]),
                "violations": result.audit.violations,
            }
            rows.append(row)
            print(f"{workload:<8} {policy:<15} {1e3 * row['exposed_experience_path_s']:>10.2f} ms "
                  f"{row['exposed_vs_first']:>8.3f}x {1e3 * row['iteration_time_s']:>7.1f} ms "
                  f"{row['iteration_vs_first']:>8.3f}x {100 * row['experience_share']:>9.2f}% {row['violations']:>10}")
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "quickstart.csv"
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    png_path = _chart(rows, args.out / "quickstart.png", topology.name)
    print(f"\n'vs stock' is the ratio to the first policy ({args.policies[0]}); 0 audit violations expected.")
    for line in where_conduit_does_not_help(rows, args.policies[0]):
        print(line)
    written = f"{csv_path} and {png_path}" if png_path else f"{csv_path}"
    print(f"wrote {written} in {time.perf_counter() - started:.1f} s")
    if png_path is None:
        print("note: matplotlib is not installed, so no figure was drawn; "
              "pip install 'conduit-rl[plot]' (or `make demo`) to get results/quickstart.png")
    return 1 if any(r["violations"] for r in rows) else 0


def where_conduit_does_not_help(rows: list[dict], baseline: str) -> list[str]:
    """Plain sentences: for each workload, whether the deployed Conduit (:data:`HEADLINE`) shortens the
    iteration against ``baseline``, and how far the design target is from what is deployed."""
    out = [f"\n{HEADLINE} is Conduit as enable() deploys it; conduit-target is the design target, not deployed."]
    by = {(r["workload"], r["policy"]): r for r in rows}
    for workload in dict.fromkeys(r["workload"] for r in rows):
        ours, base = by.get((workload, HEADLINE)), by.get((workload, baseline))
        if ours is None or base is None:
            continue
        ratio = ours["iteration_time_s"] / base["iteration_time_s"]
        if ratio > 1 + NO_GAIN:
            verdict = f"does NOT help: iteration {ratio:.3f}x {baseline} (slower)"
        elif ratio >= 1 - NO_GAIN:
            verdict = f"does not help: iteration {ratio:.3f}x {baseline}"
        else:
            verdict = f"helps: iteration {ratio:.3f}x {baseline}"
        target = by.get((workload, "conduit-target"))
        extra = (f"; the design target would reach {target['iteration_time_s'] / base['iteration_time_s']:.3f}x"
                 if target is not None else "")
        out.append(f"  {workload}: {HEADLINE} {verdict}, exposed path "
                   f"{ours['exposed_experience_path_s'] / base['exposed_experience_path_s']:.3f}x{extra}")
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


#: the chart's panels: (row key, scale to the axis unit, title, y label, y scale)
PANELS = (
    ("exposed_experience_path_s", 1e3, "exposed experience-path latency",
     "ms per update (symlog: linear below 1 ms)", "symlog"),
    ("iteration_time_s", 1e3, "iteration time", "ms (log)", "log"),
    ("experience_share", 100, "experience share", "% of iteration time", "linear"),
)


def _label(value: float) -> str:
    """A bar's value, short: 0 shows as "0" (a zero bar has no height to see)."""
    if math.isnan(value):
        return "n/a"
    if value == 0:
        return "0"
    if abs(value) < 10:
        return f"{value:.2f}"
    if abs(value) < 100:
        return f"{value:.1f}"
    return f"{value:.0f}"


def _chart(rows: list[dict], path: Path, topology: str) -> Path | None:
    """Exposed latency, iteration time and experience share per workload and policy, every bar labelled
    with its value. The latency axis is symlog (linear below 1 ms), so a zero is a visible "0", not a
    bar missing from a log axis. None when matplotlib (``conduit-rl[plot]``) is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = plt.subplots(1, len(PANELS), figsize=(16, 4.8))
    width = 0.8 / len(policies)
    for ax, (key, scale, title, ylabel, yscale) in zip(axes, PANELS, strict=True):
        for i, policy in enumerate(policies):
            values = [next(r[key] for r in rows if r["workload"] == w and r["policy"] == policy) * scale
                      for w in workloads]
            bars = ax.bar([x + i * width for x in range(len(workloads))], values, width, label=policy)
            ax.bar_label(bars, labels=[_label(v) for v in values], fontsize=7, padding=2)
        ax.set_xticks([x + width * (len(policies) - 1) / 2 for x in range(len(workloads))], workloads)
        ax.set_xlabel("workload (preset)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if yscale == "symlog":
            ax.set_yscale("symlog", linthresh=1.0)
            ax.set_ylim(0, ax.get_ylim()[1] * 3)  # room for the labels above the tallest bar
        elif yscale == "log":
            ax.set_yscale("log")
            low, high = ax.get_ylim()
            ax.set_ylim(low, high * 3)
        else:
            ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
    axes[0].legend(title="policy", fontsize=8)
    fig.suptitle(f"Conduit quickstart: simulated on {topology} (means after warm-up; lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
