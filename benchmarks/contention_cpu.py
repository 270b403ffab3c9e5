"""Does CPU work cost more CPU when its node is over-subscribed? (issue 13: why iterations are predicted short)

Runs :func:`conduit.runtime.contention.measure` (its docstring has the method: an RLlib EnvRunner sampling, timed
in process CPU per env step, in paired windows beside learner-like neighbours switched off and on) for ``cores -
1`` neighbours (every thread still has a core: the control) and ``cores`` neighbours (one thread more than there
are cores), on PPO CartPole and PPO large-obs sampling. Printed per row: the median ratio busy / idle of CPU per
step over the pairs with its quartiles, and the wall-clock ratio (the simulator's fair share of the cores predicts
``(k + 1) / cores`` once ``k + 1`` exceeds the cores); then the ``oversubscribed_cpu_cost`` that ``conduit
calibrate --workloads`` would write (the rows with ``cores`` neighbours pooled).

2026-12-06 on the 2-core VM (02:40-02:45 UTC, 16 pairs of 0.5 s): with one neighbour (control) 0.993 [0.934,
1.022] (large-obs) and 1.074 [1.011, 1.279] (CartPole); with two, 1.134 [1.018, 1.204] and 1.039 [0.977, 1.162],
wall 1.92 and 1.64 where a fair share predicts 1.5; with three (CartPole) 1.158 [1.087, 1.338], wall 2.35 (fair
share: 2.0). ``--json FILE`` writes the figures.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/contention_cpu.py [--pairs 16] [--window 0.5]
        [--neighbours 1 2] [--json FILE]                                                       # ~3 min
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=16, help="idle/busy pairs per row")
    p.add_argument("--window", type=float, default=0.5, help="seconds of sampling per timed window")
    p.add_argument("--neighbours", type=int, nargs="+", help="neighbour counts (default: cores - 1 and cores)")
    p.add_argument("--json", type=Path, help="write the figures here")
    a = p.parse_args(argv)
    if a.pairs < 1:
        p.error("--pairs must be at least 1")
    if a.window <= 0:
        p.error("--window must be positive")
    if a.neighbours and any(k < 0 for k in a.neighbours):
        p.error("--neighbours must not be negative")
    from conduit.runtime.calibrate import _named_env_runner
    from conduit.runtime.contention import measure

    cores = len(os.sched_getaffinity(0))
    ks = a.neighbours or [max(0, cores - 1), cores]
    print(f"{a.pairs} pairs of {a.window} s windows per row, {cores} cores, load average {os.getloadavg()[0]:.2f}",
          flush=True)
    out = measure(_named_env_runner, pairs=a.pairs, window=a.window, neighbours=ks, progress=lambda s: print(s, flush=True))
    cost = out["oversubscribed_cpu_cost"]
    print(f"oversubscribed_cpu_cost: {cost:.3f} ({out['note']})" if cost else out["note"])
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"written {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
