"""Study: is ``conduit`` at least as good as the best hand-tuned fixed configuration everywhere?

For every preset and library topology it runs ``janus-best`` (exhaustive search over the 60 Janus
configurations for that workload and topology) and ``conduit`` with its defaults, side by side with
the same seed, and reports iteration time and exposed experience-path latency with their ratios.
``dgx-h100-x128`` is left out: an exhaustive search there costs hours on a 2-core machine (its
Conduit-vs-stock figures come from ``benchmarks/policy_targets.py``).

"At least as good" allows 0.5% on iteration time: where the iteration is bound by sampling (APPO,
DQN, GRPO) both policies run at the runners' pace, and the seeded env-step noise is drawn in a
different order once chunk sizes differ, which moves the mean by a few parts in a thousand.

Writes ``results/conduit_vs_janus.csv`` and ``results/conduit_vs_janus.md``.

    python studies/conduit_vs_janus.py [--topologies ...] [--workloads ...]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from conduit.errors import ConduitError
from conduit.sim.run import simulate
from conduit.topology import load_topology

TOPOLOGIES = ["dgx-h100", "dgx-a100", "commodity-pcie", "dgx-h100-x2", "dgx-h100-x16", "hetero-mix"]
WORKLOADS = {"ppo": 4, "appo": 40, "dqn": 150, "ppo-mujoco": 4, "grpo-llm": 2}
TOLERANCE = 5e-3  # "at least as good": within 0.5% on iteration time (see the note below)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", nargs="+", default=TOPOLOGIES)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    rows = []
    print(f"{'topology':<15} {'workload':<11} {'janus-best':<24} {'iter janus':>11} {'iter conduit':>13} "
          f"{'ratio':>7} {'exp. janus':>11} {'exp. conduit':>13} {'ok':>4}")
    for name in args.topologies:
        topology = load_topology(name)
        for workload in args.workloads:
            iterations = WORKLOADS.get(workload, 4)
            start = time.perf_counter()
            try:
                janus = simulate(topology, workload, "janus-best", iterations=iterations)
                ours = simulate(topology, workload, "conduit", iterations=iterations)
            except ConduitError as exc:  # a workload that does not fit this machine
                print(f"{name:<15} {workload:<11} skipped: {exc}")
                continue
            j, c = janus.metrics, ours.metrics
            ratio = c["iteration_time_s"] / j["iteration_time_s"]
            ok = ratio <= 1 + TOLERANCE and ours.audit.violations == 0 and janus.audit.violations == 0
            rows.append({"topology": name, "workload": workload, "janus_best": janus.policy.name.split("=")[-1],
                         "iteration_janus_s": j["iteration_time_s"], "iteration_conduit_s": c["iteration_time_s"],
                         "iteration_ratio": ratio, "exposed_janus_s": j["exposed_experience_path_s"],
                         "exposed_conduit_s": c["exposed_experience_path_s"],
                         "violations": janus.audit.violations + ours.audit.violations, "ok": ok,
                         "wall_s": time.perf_counter() - start})
            r = rows[-1]
            print(f"{name:<15} {workload:<11} {r['janus_best']:<24} {1e3 * r['iteration_janus_s']:>8.1f} ms "
                  f"{1e3 * r['iteration_conduit_s']:>10.1f} ms {ratio:>6.3f}x {1e3 * r['exposed_janus_s']:>8.2f} ms "
                  f"{1e3 * r['exposed_conduit_s']:>10.2f} ms {'yes' if ok else 'NO':>4}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "conduit_vs_janus.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    worse = [r for r in rows if not r["ok"]]
    summary = (f"{len(rows) - len(worse)} of {len(rows)} cases: conduit's iteration time within "
               f"{TOLERANCE:.1%} of janus-best or better, zero violations.")
    lines = ["# conduit vs janus-best", "", summary, "",
             "| topology | workload | janus-best | iteration ratio | exposed janus | exposed conduit |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['topology']} | {r['workload']} | {r['janus_best']} | {r['iteration_ratio']:.3f} | "
              f"{1e3 * r['exposed_janus_s']:.2f} ms | {1e3 * r['exposed_conduit_s']:.2f} ms |" for r in rows]
    (args.out / "conduit_vs_janus.md").write_text("\n".join(lines) + "\n")
    print(f"\n{len(rows) - len(worse)}/{len(rows)} ok; wrote {args.out}/conduit_vs_janus.csv and .md")
    return 0 if not worse else 1


if __name__ == "__main__":
    sys.exit(main())
