"""Benchmark: wall time to simulate PPO iterations at 1,024 GPUs, per policy, and conduit / stock.

Targets (issue 13, speed):

* simulating ``conduit`` costs at most 2x simulating ``rllib-stock`` (same workload, same iterations);
* 100 PPO iterations at 1,024 GPUs (``dgx-h100-x128``, the ``ppo`` preset) take <= 60 s for every
  policy on the 2-core development machine.

Prints, in one run, per policy: wall seconds for ``--iterations`` iterations, seconds per iteration,
the same scaled to 100 iterations, SimPy events and events per second, chunks, audit violations;
then the conduit / rllib-stock ratio. ``--reference`` also runs every policy with every exact fast
path off (``Simulation(memoize_view=False, fast=False)``: the straightforward view, every fact
recomputed on every access; env-step times drawn one call per sample; moves and placements always
through a process step; the driver's thread held through events; the network re-solving every active
class at every instant) side by side, prints its seconds and the speed-up, and checks that the two
runs' JSON results (less the count of SimPy events, which the fast paths exist to lower) are identical
(exit status 1 if not). The older exact speed-ups (the placement's staging tier looked up once per
decision, the env-step distribution's parameters once per run, the PPO plan's per-node learner lists
once) apply to both sides: for the whole change, compare with an earlier commit.

``--profile`` runs every policy once more under cProfile and prints where its time goes, by layer
(the flow network and its solver, the placement decision, the algorithm loops, SimPy's own event
loop, the auditor and ledgers; NumPy and builtins count for the layer that called them), with the network's counters: re-solves, flows re-rated per re-solve
and the classes and entries of the mean max-min solve -- the figures that tell which lever is left.

``--fold K`` times every policy folded (:mod:`conduit.sim.fold`: the driver's node and one
representative for every K of the others) instead of exact, and checks the approximation: each policy
also runs exact and folded for ``--check-iterations`` iterations (default 3), and the relative error of
the folded iteration time, exposed experience-path latency and experience share is printed with the
exact run's time and the speed-up. The speed target is judged on the folded times then, and the line
says so; the exact figures stay what ``--fold 1`` (the default) prints.

Wall times on a shared machine are noisy: compare the ratios printed by one run, and rerun before
believing a small difference. The policies run alternately first-to-last and last-to-first over
``--repeats`` (medians), so drift hits all of them.

    python benchmarks/sim_speed.py [--iterations 100] [--policies rllib-stock conduit all-gpu host-only]
                                   [--reference] [--repeats 1] [--profile] [--fold K [--check-iterations 3]]
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

DEFAULT_POLICIES = ("rllib-stock", "conduit", "conduit-target", "all-gpu", "host-only", "janus-gpu-co-so-g2")
TARGET_S_PER_100 = 60.0
TARGET_RATIO = 2.0


#: the figures the fold check compares (docs/metrics.md)
FOLD_METRICS = ("iteration_time_s", "exposed_experience_path_s", "experience_share")


def _run(topology, workload, policy: str, iterations: int, memoize: bool, fold: int = 1):
    sim = Simulation(topology, workload, create_policy(policy), iterations=iterations, seed=0,
                     memoize_view=memoize, fast=memoize, fold=fold)
    start = time.perf_counter()
    result = sim.run()
    return time.perf_counter() - start, result


#: profile layers: (label, path fragments of the functions' files), first match wins
LAYERS = (
    ("flow network (network, flowclock, maxmin, routing)", ("conduit/sim/network.py", "conduit/sim/flowclock.py",
                                                            "conduit/sim/maxmin.py", "conduit/sim/routing.py")),
    ("placement decision (policy, arbiter, view)", ("conduit/policies/", "conduit/plane/arbiter.py",
                                                    "conduit/sim/view.py", "conduit/view.py")),
    ("algorithm loops (ppo, appo, dqn, direct, engine)", ("conduit/sim/ppo.py", "conduit/sim/appo.py",
                                                          "conduit/sim/dqn.py", "conduit/sim/direct.py",
                                                          "conduit/sim/engine.py")),
    ("auditor, ledgers, resources, traces", ("conduit/audit.py", "conduit/plane/", "conduit/sim/resources.py",
                                             "conduit/sim/metrics.py", "conduit/chunk.py")),
    ("SimPy's event loop", ("simpy/",)),
)


def profile(topology, workload, policy: str, iterations: int) -> None:
    """Run once under cProfile; print own time by layer and the network's counters."""
    import cProfile
    import pstats

    from conduit.sim import maxmin
    from conduit.sim import network as network_module

    sizes: list[tuple[int, int]] = []
    solver = maxmin.max_min_rates

    def counted(flows, links, capacity, n_flows=None, **kw):
        sizes.append((n_flows or 0, len(flows)))
        return solver(flows, links, capacity, n_flows, **kw)

    sim = Simulation(topology, workload, create_policy(policy), iterations=iterations, seed=0)
    prof = cProfile.Profile()
    network_module.maxmin.max_min_rates = counted
    try:
        prof.enable()
        result = sim.run()
        prof.disable()
    finally:
        network_module.maxmin.max_min_rates = solver
    stats = pstats.Stats(prof).stats
    total = sum(tt for (_cc, _nc, tt, _ct, _callers) in stats.values()) or 1.0
    other = "other (interpreter, library code called from elsewhere)"

    def layer_of(key) -> str | None:
        name = key[0].replace("\\", "/")
        return next((label for label, parts in LAYERS if any(p in name for p in parts)), None)

    by_layer: dict[str, float] = {}
    for key, (_cc, _nc, tt, _ct, callers) in stats.items():
        layer = layer_of(key)
        if layer is not None or not callers:
            by_layer[layer or other] = by_layer.get(layer or other, 0.0) + tt
            continue
        # numpy and builtins count for the layer that called them, in proportion to each caller's share
        edge_total = sum(edge[2] for edge in callers.values()) or 1.0
        for caller, edge in callers.items():
            target = layer_of(caller) or other
            by_layer[target] = by_layer.get(target, 0.0) + tt * edge[2] / edge_total
    net = sim.network
    print(f"{policy}: {result.events} events, {result.metrics['chunks']} chunks; own time by layer:")
    for layer, tt in sorted(by_layer.items(), key=lambda kv: -kv[1]):
        print(f"    {100 * tt / total:5.1f}%  {layer}")
    solves = len(sizes)
    print(f"    network: {net.events} flow starts+ends, {net.resolves} re-rating instants, "
          f"{net.resolved_flows / max(1, net.resolves):.1f} flows re-rated per instant, {solves} max-min solves "
          f"of {sum(s[0] for s in sizes) / max(1, solves):.0f} classes / {sum(s[1] for s in sizes) / max(1, solves):.0f} "
          f"entries on average")


def check_fold(topology, workload, policies, fold: int, iterations: int) -> int:
    """Run every policy exact and folded for ``iterations``; print the folded figures' relative errors,
    both wall times and the speed-up. Returns 1 if a folded run has audit violations the exact one has
    not (folding must not invent or hide one), else 0."""
    print(f"fold check: exact vs fold={fold}, {iterations} iterations each, seed 0 (relative error of the folded figure)")
    head = f"{'policy':<22} " + " ".join(f"{m:>27}" for m in FOLD_METRICS) + f" {'exact s':>8} {'fold s':>7} {'speed-up':>8}"
    print(head)
    status = 0
    for name in policies:
        wall_exact, exact = _run(topology, workload, name, iterations, True)
        wall_fold, folded = _run(topology, workload, name, iterations, True, fold)
        cells = []
        for metric in FOLD_METRICS:
            ref, got = exact.metrics[metric], folded.metrics[metric]
            if ref:
                cells.append(f"{got:>11.4g} vs {ref:>8.4g} {100 * (got - ref) / ref:+5.2f}%")
            else:  # no relative error of a zero: say whether the folded figure is zero too
                cells.append(f"{got:>11.4g} vs {ref:>8.4g} {'exact' if got == ref else 'n/a':>6}")
        if bool(folded.audit.violations) != bool(exact.audit.violations):
            status = 1
        print(f"{name:<22} " + " ".join(f"{c:>27}" for c in cells)
              + f" {wall_exact:>8.1f} {wall_fold:>7.1f} {wall_exact / wall_fold:>7.1f}x")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="dgx-h100-x128")
    parser.add_argument("--workload", default="ppo")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
    parser.add_argument("--reference", action="store_true",
                        help="also run with every exact fast path off (memoize_view=False, fast=False) "
                             "and check identical results")
    parser.add_argument("--fold", type=int, default=1, metavar="K",
                        help="time every policy folded (one representative per K nodes besides the driver's) "
                             "and print the fold's error against the exact simulation (default 1: exact)")
    parser.add_argument("--check-iterations", type=int, default=3, metavar="N",
                        help="with --fold: iterations of the exact and folded runs compared (default 3)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile every policy once and print its time by layer")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.repeats < 1 or args.fold < 1 or args.check_iterations < 1:
        parser.error("--iterations, --repeats, --fold and --check-iterations must be >= 1")
    topology, workload = load_topology(args.topology), load_workload(args.workload)
    print(f"{workload.name} on {topology.name}: {args.iterations} iterations, seed 0, "
          f"median of {args.repeats} repeat(s)" + (f", folded (fold={args.fold})" if args.fold > 1 else ""))
    modes = [True, False] if args.reference else [True]
    walls: dict[tuple[str, bool], list[float]] = {}
    results: dict[tuple[str, bool], object] = {}
    for rep in range(args.repeats):
        order = args.policies if rep % 2 == 0 else list(reversed(args.policies))
        for name in order:
            for memoize in (modes if rep % 2 == 0 else list(reversed(modes))):
                wall, result = _run(topology, workload, name, args.iterations, memoize, args.fold)
                walls.setdefault((name, memoize), []).append(wall)
                results[(name, memoize)] = result
                print(f"  ran {name:<22} {'fast' if memoize else 'reference'} paths: {wall:.1f} s", flush=True)
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
            same = dumps(result.outcome()) == dumps(results[(name, False)].outcome())  # all but the event count
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
    how = f"folded (fold={args.fold}; the exact simulation is slower, see below)" if args.fold > 1 else "exact"
    print(f"slowest policy: {worst}, {per_100[worst]:.1f} s per 100 iterations, {how} "
          f"({verdict} the target <= {TARGET_S_PER_100:g} s on the 2-core development machine)")
    if args.fold > 1:
        print()
        status |= check_fold(topology, workload, args.policies, args.fold, args.check_iterations)
    if args.profile:
        print()
        for name in args.policies:
            profile(topology, workload, name, args.iterations)
    return status


if __name__ == "__main__":
    sys.exit(main())
