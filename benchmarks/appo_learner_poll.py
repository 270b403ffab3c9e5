"""What APPO's idle learner thread costs a crowded node (issue 13: ``StockCosts.learner_poll_cores`` and
``StockCosts.poll_neighbour_cost``).

RLlib 2.60's APPO learner thread polls its empty ``CircularBuffer`` every 0.1 ms (``algorithms/appo/utils.py:
CircularBuffer.get``). :mod:`conduit.runtime.learner_poll` has the method; this script runs its two
microbenchmarks and prints the figures the simulator reads:

* the cores a real, idle APPO learner's thread wants (RLlib's default ``APPOConfig`` on CartPole, built with
  ``config.build_learner``; ``/proc/self/task/<tid>/schedstat``);
* the CPU per env step of an APPO EnvRunner's sampling with a poller process (the same loop over a real
  ``CircularBuffer``) on / off, beside as many busy learner-like neighbours as there are cores (the node
  over-subscribed either way, as where the simulator charges it), in paired windows.

Not the figures the validation reports (iteration time): a thread's own demand, and a ratio of a primitive's
CPU with and without one neighbour, with no RLlib run in either.

2026-12-06 on the 2-core VM (19:40 UTC): see ``conduit/sim/params.py`` (the ``StockCosts`` defaults carry the
figures and the command).

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/appo_learner_poll.py [--pairs 16] [--window 0.4] [--json F]
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
    p.add_argument("--seconds", type=float, default=1.0, help="seconds per window of the idle learner's thread")
    p.add_argument("--windows", type=int, default=5, help="windows of the idle learner's thread")
    p.add_argument("--pairs", type=int, default=16, help="off/on pairs of the poller beside the sampling")
    p.add_argument("--window", type=float, default=0.4, help="seconds of sampling per timed window")
    p.add_argument("--neighbours", type=int, help="busy learner-like neighbours beside the sampling (default: cores)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    a = p.parse_args(argv)
    if a.seconds <= 0 or a.window <= 0:
        p.error("--seconds and --window must be positive")
    if a.windows < 1 or a.pairs < 1:
        p.error("--windows and --pairs must be at least 1")
    if a.neighbours is not None and a.neighbours < 0:
        p.error("--neighbours must not be negative")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from conduit.runtime.calibrate import _named_env_runner
    from conduit.runtime.learner_poll import measure_learner_poll, measure_poll_neighbour_cost

    load = os.getloadavg()[0]
    own = measure_learner_poll(seconds=a.seconds, windows=a.windows)
    each = ", ".join(f"{w['run_cores']:.3f}+{w['wait_cores']:.3f}" for w in own["windows"])
    print(f"load average {load:.2f}; idle APPO learner thread ({own['buffer']}): {own['cores']:.3f} cores "
          f"(per window, on a CPU + waiting: {each}; {own['windows'][0]['slices_per_s']:.0f} slices/s)")
    cost = measure_poll_neighbour_cost(_named_env_runner, pairs=a.pairs, window=a.window, neighbours=a.neighbours)
    lo, med, hi = cost["cpu_ratio_quartiles"]
    print(f"EnvRunner sampling beside {cost['neighbours']} busy neighbour(s) on {cost['cores']} cores: CPU per env step poller on / off "
          f"{med:.3f} [{lo:.3f}, {hi:.3f}] over {a.pairs} pairs, wall {cost['wall_ratio_quartiles'][1]:.3f}; the poller "
          f"held {cost['poller_cores'] or float('nan'):.3f} cores")
    print(f"StockCosts.learner_poll_cores = {own['cores']:.3f}, StockCosts.poll_neighbour_cost = {cost['cost']:.3f}")
    if a.json:
        a.json.write_text(json.dumps({"learner_poll": own, "poll_neighbour": cost, "load_average": load},
                                     indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
