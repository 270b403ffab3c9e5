"""Benchmark: wall time to simulate PPO iterations at 1,024 GPUs, per policy, and conduit / stock.

Targets (issue 13, speed):

* simulating ``conduit`` costs at most 2x simulating ``rllib-stock`` (same workload, same iterations);
* 100 PPO iterations at 1,024 GPUs (``dgx-h100-x128``, the ``ppo`` preset) take <= 60 s for every
  policy on the 2-core development machine.

Prints, in one run, per policy: wall seconds for ``--iterations`` iterations, seconds per iteration,
the same scaled to 100 iterations, SimPy events and events per second, chunks, audit violations;
then the conduit / rllib-stock ratio. ``--reference`` also runs every policy with the
straightforward view (``Simulation(memoize_view=False)``: every fact recomputed on every access, the
view as it was before its memo) side by side, prints its seconds and the speed-up, and checks that
the two runs' JSON results are identical (exit status 1 if not). The other exact speed-ups (the
placement's staging tier looked up once per decision, the env-step distribution's parameters once
per run, the PPO plan's per-node learner lists once) apply to both sides: for the whole change,
compare with an earlier commit.

Wall times on a shared machine are noisy: compare the ratios printed by one run, and rerun before
believing a small difference. The policies run alternately first-to-last and last-to-first over
``--repeats`` (medians), so drift hits all of them.

    python benchmarks/sim_speed.py [--iterations 100] [--policies rllib-stock conduit all-gpu host-only]
                                   [--reference] [--repeats 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conduit.registry import create_policy
from conduit.sim.engine import Simulation
from conduit.sim.metrics import dumps
from conduit.sim.workload import load_workload
from conduit.topology import load_topology

DEFAULT_POLICIES = ("rllib-stock", "conduit", "all-gpu", "host-only", "janus-gpu-co-so-g2")
TARGET_S_PER_100 = 60.0
TARGET_RATIO = 2.0


def _run(topology, workload, policy: str, iterations: int, memoize: bool):
    sim = Simulation(topology, workload, create_policy(policy), iterations=iterations, seed=0,
                     memoize_view=memoize)
    start = time.perf_counter()
    result = sim.run()
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="dgx-h100-x128")
    parser.add_argument("--workload", default="ppo")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
    parser.add_argument("--reference", action="store_true",
                        help="also run the straightforward view (memoize_view=False) and check identical results")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.repeats < 1:
        parser.error("--iterations and --repeats must be >= 1")
    topology, workload = load_topology(args.topology), load_workload(args.workload)
    print(f"{workload.name} on {topology.name}: {args.iterations} iterations, seed 0, "
          f"median of {args.repeats} repeat(s)")
    modes = [True, False] if args.reference else [True]
    walls: dict[tuple[str, bool], list[float]] = {}
    results: dict[tuple[str, bool], object] = {}
    for rep in range(args.repeats):
        order = args.policies if rep % 2 == 0 else list(reversed(args.policies))
        for name in order:
            for memoize in (modes if rep % 2 == 0 else list(reversed(modes))):
                wall, result = _run(topology, workload, name, args.iterations, memoize)
                walls.setdefault((name, memoize), []).append(wall)
                results[(name, memoize)] = result
                print(f"  ran {name:<22} {'memoized' if memoize else 'reference'} view: {wall:.1f} s", flush=True)
    print()
    head = (f"{'policy':<22} {'wall s':>8} {'s/iter':>8} {'s/100 it':>9} {'events':>9} {'events/s':>9} "
            f"{'chunks':>8} {'viol.':>5}")
    if args.reference:
        head += f" {'ref. s':>8} {'speed-up':>8} {'same':>5}"
    print(head)
    status = 0
    per_100: dict[str, float] = {}
    for name in args.policies:
        wall = statistics.median(walls[(name, True)])
        result = results[(name, True)]
        per_100[name] = wall / args.iterations * 100
        line = (f"{name:<22} {wall:>8.1f} {wall / args.iterations:>8.3f} {per_100[name]:>9.1f} {result.events:>9} "
                f"{result.events / wall:>9.0f} {result.metrics['chunks']:>8} {result.audit.violations:>5}")
        if args.reference:
            ref = statistics.median(walls[(name, False)])
            same = dumps(result.to_dict()) == dumps(results[(name, False)].to_dict())
            status |= 0 if same else 1
            line += f" {ref:>8.1f} {ref / wall:>7.2f}x {'yes' if same else 'NO':>5}"
        print(line)
    print()
    if "conduit" in per_100 and "rllib-stock" in per_100:
        ratio = per_100["conduit"] / per_100["rllib-stock"]
        verdict = "meets" if ratio <= TARGET_RATIO else "misses"
        print(f"conduit / rllib-stock simulation time: {ratio:.2f}x ({verdict} the target <= {TARGET_RATIO:g}x)")
    worst = max(per_100, key=per_100.get)
    verdict = "meets" if per_100[worst] <= TARGET_S_PER_100 else "misses"
    print(f"slowest policy: {worst}, {per_100[worst]:.1f} s per 100 iterations "
          f"({verdict} the target <= {TARGET_S_PER_100:g} s on the 2-core development machine)")
    return status


if __name__ == "__main__":
    sys.exit(main())
