"""Benchmark: Conduit vs the baselines on the simulated clusters, against the policy issue's targets.

For ``dgx-h100-x2``, ``dgx-h100-x16`` and ``dgx-h100-x128`` and the presets ``ppo``, ``appo``, ``dqn`` and
``grpo-llm`` it simulates ``rllib-stock`` and ``conduit`` (and, with ``--janus``, ``janus-best``, whose
exhaustive search is only affordable on the smaller clusters) side by side with the same seed, and
prints exposed experience-path latency and iteration time with their ratios to ``rllib-stock``.

Targets (docs/metrics.md definitions, zero audit violations in every run), checked on ``dgx-h100-x128``:
exposed latency <= 0.05x for ppo and dqn, <= 0.10x for appo and grpo-llm; dqn iteration time <= 0.70x.

    python benchmarks/policy_targets.py [--topologies dgx-h100-x2 ...] [--janus] [--csv results/targets.csv]
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

from conduit.sim.run import simulate
from conduit.topology import load_topology

EXPOSED_TARGET = {"ppo": 0.05, "dqn": 0.05, "appo": 0.10, "grpo-llm": 0.10}
ITERATION_TARGET = {"dqn": 0.70}
#: updates per run: enough to average over after warm-up, small enough for 1,024 GPUs
ITERATIONS = {
    "dgx-h100-x2": {"ppo": 6, "appo": 60, "dqn": 300, "grpo-llm": 2},
    "dgx-h100-x16": {"ppo": 4, "appo": 30, "dqn": 100, "grpo-llm": 2},
    "dgx-h100-x128": {"ppo": 3, "appo": 20, "dqn": 30, "grpo-llm": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", nargs="+", default=list(ITERATIONS))
    parser.add_argument("--workloads", nargs="+", default=list(EXPOSED_TARGET))
    parser.add_argument("--janus", action="store_true", help="also run janus-best (exhaustive search)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args()
    policies = ["rllib-stock", "conduit"] + (["janus-best"] if args.janus else [])
    rows = []
    print(f"{'topology':<14} {'workload':<9} {'policy':<30} {'exposed':>11} {'ratio':>8} {'target':>7} "
          f"{'iteration':>11} {'ratio':>7} {'viol.':>5} {'wall':>6}")
    for name in args.topologies:
        topology = load_topology(name)
        for workload in args.workloads:
            iterations = ITERATIONS.get(name, {}).get(workload, 5)
            base = None
            for policy in policies:
                start = time.perf_counter()
                result = simulate(topology, workload, policy, iterations=iterations, seed=args.seed)
                wall = time.perf_counter() - start
                m = result.metrics
                base = base or m
                exposed_ratio = m["exposed_experience_path_s"] / base["exposed_experience_path_s"]
                iter_ratio = m["iteration_time_s"] / base["iteration_time_s"]
                target = EXPOSED_TARGET.get(workload) if policy == "conduit" else None
                verdict = ""
                if target is not None and name == "dgx-h100-x128":
                    ok = exposed_ratio <= target and iter_ratio <= ITERATION_TARGET.get(workload, float("inf"))
                    verdict = "met" if ok and result.audit.violations == 0 else "MISSED"
                rows.append({"topology": name, "workload": workload, "policy": result.policy.name,
                             "exposed_s": m["exposed_experience_path_s"], "exposed_ratio": exposed_ratio,
                             "iteration_s": m["iteration_time_s"], "iteration_ratio": iter_ratio,
                             "violations": result.audit.violations, "target": target, "verdict": verdict})
                print(f"{name:<14} {workload:<9} {result.policy.name:<30} {1e3 * m['exposed_experience_path_s']:>8.2f} ms "
                      f"{exposed_ratio:>7.4f}x {('<=' + format(target, '.2f')) if target else '':>7} "
                      f"{1e3 * m['iteration_time_s']:>8.1f} ms {iter_ratio:>6.3f}x {result.audit.violations:>5} "
                      f"{wall:>5.0f}s {verdict}")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
