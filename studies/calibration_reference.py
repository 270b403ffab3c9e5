"""Study: does the simulator's ``rllib-stock`` reproduce stock RLlib's measured experience path?

Simulates the two reference runs of ``shared/reference/rllib-2.60-stock-cpu.md`` (PPO 84x84x4, DQN
CartPole) on ``conduit/topologies/reference-2core.yaml`` and prints, per segment, the measured and simulated
share of the iteration (target: within 25%). Writes ``results/calibration_reference.csv``.

Read it honestly: the cost parameters (``conduit/sim/params.py``) were fitted to these same
measurements, partly through the CartPole runs, so agreement shows that the modelled *structure*
(which work is serial on the driver, what runs in parallel on the runners, what follows sampling)
reproduces the measured path, not that the parameters were predicted independently.

    python studies/calibration_reference.py [--out results]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from conduit.sim.calibration import REFERENCE_SOURCE, TOLERANCE, compare, format_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    rows = compare()
    print(f"stock RLlib 2.60, measured ({REFERENCE_SOURCE}) vs simulated (rllib-stock):")
    print(format_table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "calibration_reference.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["workload", "segment", "measured_share", "simulated_share", "relative_error", "ok"])
        for r in rows:
            writer.writerow([r.workload, r.segment, r.measured_share, r.simulated_share, r.relative_error, r.ok])
    bad = [r for r in rows if not r.ok]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} segments within {TOLERANCE:.0%}; written {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
