"""Benchmark: wall time to simulate PPO iterations on the 1,024-GPU ``dgx-h100-x128``.

Target (simulator issue): 100 iterations of the default ``ppo`` preset (8 actors per GPU) in <= 60 s
on the 2-core development machine. Prints wall time and SimPy events per second for the baseline
(``rllib-stock``, the default policy of ``conduit sim``) and a direct-path policy (``all-gpu``) side
by side in one run (medians over ``--repeats``). ``--policies conduit`` adds Conduit's own policy,
which hands each 57.8 MB fragment over in 8 pieces and so simulates 8x as many chunks.

    python benchmarks/sim_ppo_x128.py [--iterations 100] [--repeats 1] [--policies rllib-stock all-gpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

from conduit.registry import create_policy
from conduit.sim.engine import Simulation
from conduit.sim.workload import load_workload
from conduit.topology import load_topology


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="dgx-h100-x128")
    parser.add_argument("--workload", default="ppo")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--policies", nargs="+", default=["rllib-stock", "all-gpu"])
    args = parser.parse_args()
    t0 = time.perf_counter()
    topology = load_topology(args.topology)
    workload = load_workload(args.workload)
    print(f"loaded {topology!r} in {time.perf_counter() - t0:.2f} s; workload {workload.name}: "
          f"{workload.envs_per_runner} actors per GPU, {workload.chunk_steps} steps per chunk")
    print(f"{'policy':<14} {'iterations':>10} {'wall s (median)':>16} {'events':>10} {'events/s':>10} "
          f"{'chunks':>8} {'violations':>10}")
    for name in args.policies:
        walls, result = [], None
        for _ in range(args.repeats):
            sim = Simulation(topology, workload, create_policy(name), iterations=args.iterations, seed=0)
            start = time.perf_counter()
            result = sim.run()
            walls.append(time.perf_counter() - start)
        wall = statistics.median(walls)
        print(f"{name:<14} {args.iterations:>10} {wall:>16.2f} {result.events:>10} {result.events / wall:>10.0f} "
              f"{result.metrics['chunks']:>8} {result.audit.violations:>10}")
    print("target: <= 60 s for 100 iterations (simulator issue)")


if __name__ == "__main__":
    main()
