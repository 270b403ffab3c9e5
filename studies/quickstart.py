"""Quickstart study: the experience path of PPO, APPO and DQN under several policies.

On the built-in default topology (``dgx-h100-x2``, 16 H100 GPUs) it simulates each preset under each
policy and prints exposed experience-path latency, iteration time and experience share (docs/metrics.md
definitions), with the audit's violation count for every run. Writes ``results/quickstart.csv`` and
``results/quickstart.png``. This is what ``make demo`` runs.

    python studies/quickstart.py [--topology dgx-h100-x2] [--policies rllib-stock host-only all-gpu]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from conduit.sim.run import simulate
from conduit.topology import DEFAULT_TOPOLOGY, load_topology

WORKLOADS = {"ppo": 6, "appo": 60, "dqn": 300}  # iterations: enough updates for stable means


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default=DEFAULT_TOPOLOGY)
    parser.add_argument("--policies", nargs="+", default=["rllib-stock", "janus-best", "conduit"])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    topology = load_topology(args.topology)
    started = time.perf_counter()
    rows = []
    header = (f"{'workload':<8} {'policy':<12} {'exposed path':>13} {'vs stock':>9} {'iteration':>10} "
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
            print(f"{workload:<8} {policy:<12} {1e3 * row['exposed_experience_path_s']:>10.2f} ms "
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
    print(f"wrote {csv_path} and {png_path} in {time.perf_counter() - started:.1f} s")
    return 1 if any(r["violations"] for r in rows) else 0


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def _chart(rows: list[dict], path: Path, topology: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(policies)
    for i, policy in enumerate(policies):
        for ax, key, scale in ((axes[0], "exposed_experience_path_s", 1e3), (axes[1], "experience_share", 100)):
            values = [next(r[key] for r in rows if r["workload"] == w and r["policy"] == policy) * scale
                      for w in workloads]
            ax.bar([x + i * width for x in range(len(workloads))], values, width, label=policy)
    for ax, title in ((axes[0], "exposed experience-path latency (ms / update)"), (axes[1], "experience share (%)")):
        ax.set_xticks([x + width * (len(policies) - 1) / 2 for x in range(len(workloads))], workloads)
        ax.set_title(title)
        ax.set_yscale("log" if ax is axes[0] else "linear")
    axes[0].legend()
    fig.suptitle(f"Conduit quickstart: simulated on {topology}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
