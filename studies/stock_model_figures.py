"""Study: the headline figures the faithful stock model moves (issue 13).

Prints, with the audit's violation count for every run:

* ``a100``: stock experience share of the default ``ppo`` and ``dqn`` presets on ``dgx-a100`` (8xA100),
  next to the published 26.2% / 50.2% -- an external check, never a fitting target;
* ``appo``: ``conduit`` / ``rllib-stock`` iteration time of the ``appo`` preset on ``dgx-h100-x2``;
* ``x128``: ``conduit`` / ``rllib-stock`` iteration time and exposed experience-path latency of the
  ``ppo`` preset on ``dgx-h100-x128`` (1,024 GPUs; 3 iterations), with the stock segments.

Writes ``results/stock_model_figures.json``.

    python studies/stock_model_figures.py [a100] [appo] [x128] [--out results]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from conduit.sim.run import simulate

PUBLISHED_SHARE = {"ppo": 0.262, "dqn": 0.502}
ITERATIONS = {"ppo": 6, "appo": 60, "dqn": 300}


def _run(topology: str, workload: str, policy: str, iterations: int) -> dict:
    started = time.perf_counter()
    result = simulate(topology, workload, policy, iterations=iterations, seed=0)
    return {"topology": topology, "workload": workload, "policy": policy, "iterations": iterations,
            "metrics": {k: v for k, v in result.metrics.items() if isinstance(v, int | float)},
            "segments_s": dict(result.segments), "violations": int(result.audit.violations),
            "wall_s": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", nargs="*", default=["a100", "appo", "x128"], choices=["a100", "appo", "x128"])
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    runs: list[dict] = []
    if "a100" in args.which:
        for wl in ("ppo", "dqn"):
            r = _run("dgx-a100", wl, "rllib-stock", ITERATIONS[wl])
            runs.append(r)
            share = r["metrics"]["experience_share"]
            print(f"dgx-a100 {wl}: stock experience share {100 * share:.1f}% (published "
                  f"{100 * PUBLISHED_SHARE[wl]:.1f}%, {100 * (share / PUBLISHED_SHARE[wl] - 1):+.0f}%), "
                  f"iteration {1e3 * r['metrics']['iteration_time_s']:.1f} ms, violations {r['violations']}")
    pairs = []
    if "appo" in args.which:
        pairs.append(("dgx-h100-x2", "appo", ITERATIONS["appo"]))
    if "x128" in args.which:
        pairs.append(("dgx-h100-x128", "ppo", 3))
    for topology, wl, its in pairs:
        stock, conduit = _run(topology, wl, "rllib-stock", its), _run(topology, wl, "conduit", its)
        runs += [stock, conduit]
        s, c = stock["metrics"], conduit["metrics"]
        exposed = c["exposed_experience_path_s"] / max(s["exposed_experience_path_s"], 1e-12)
        print(f"{topology} {wl}: iteration stock {1e3 * s['iteration_time_s']:.1f} ms, conduit "
              f"{1e3 * c['iteration_time_s']:.1f} ms, conduit/stock {c['iteration_time_s'] / s['iteration_time_s']:.3f}; "
              f"exposed stock {1e3 * s['exposed_experience_path_s']:.1f} ms, conduit "
              f"{1e3 * c['exposed_experience_path_s']:.1f} ms ({exposed:.3f}); stock share "
              f"{100 * s['experience_share']:.1f}%; violations {stock['violations']}+{conduit['violations']}")
        print("  stock segments (ms): " + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in sorted(stock["segments_s"].items())))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "stock_model_figures.json"
    path.write_text(json.dumps(runs, indent=2) + "\n")
    print(f"wrote {path}")
    return 1 if any(r["violations"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
