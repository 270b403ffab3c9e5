"""Study: how much Conduit's gain depends on the workload -- the known risk (issue 13, "Sensitivity").

For PPO, APPO, DQN and GRPO (presets ``ppo``, ``appo``, ``dqn``, ``grpo-llm``) it maps the
``conduit`` / ``rllib-stock`` iteration-time ratio (below 1: Conduit is faster) over three planes:

* **actor/learner ratio x observation bytes** on 8 GPUs (``dgx-h100``): ``runners_per_gpu`` times
  ``bytes_per_step`` (the preset's bytes scaled by :data:`BYTES_SCALES`), as workload overrides of the
  public :func:`conduit.simulate` (each layout's iteration count covers its steady-state window);
* **scale x RPC cost**: 8, 64, 128 and 1,024 GPUs times the stock model's per-call costs
  (:data:`RPC_FIELDS` of :class:`~conduit.sim.params.StockCosts`, scaled together by
  :data:`COST_SCALES`);
* **scale x serialisation cost**: the same scales times the pickling/unpickling costs and the
  inverse of the object-store put bandwidth (:data:`SERIALISATION_FIELDS`).

The cost planes pass each variant as ``stock_costs`` to :func:`conduit.simulate` (the mechanism of
``conduit sim --stock-costs FILE``; every variant is written to ``costs/*.yaml`` so it can be
rerun from the command line, and each run's provenance echoes it). Every run's length covers
:data:`~conduit.sim.provenance.MIN_ROUNDS` rounds of its algorithm after warm-up, and a run whose
window still trends is rerun twice as long, at most ``MAX_EXTEND`` times (``paper_table.run_steady``;
a cell still trending after that is counted in ``not_steady`` and named in the report); every run
must audit with zero violations (asserted).

Writes, under ``--out`` (default ``results/sensitivity``): ``sensitivity.csv`` (one row per
cell: both policies' figures and the ratio), ``sensitivity.png`` (one row of heatmaps per
algorithm), ``sensitivity.md`` (the ranges, and plainly where Conduit does not help: an iteration
less than :data:`NO_HELP` lower than stock), ``costs/`` (the cost variants).

    python studies/sensitivity.py [--quick] [--algorithms ppo appo dqn grpo] [--gpus 8 64 128 1024]
                                  [--seed 0] [--out results/sensitivity]
    python studies/sensitivity.py --merge DIR [DIR ...] --out DIR   # one report from runs made apart

``--quick`` (for tests): 8 GPUs, two ratios, two byte scales, two cost scales.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import yaml

import conduit
from conduit.registry import create_policy
from conduit.sim.deployed import MULTI_LEARNER_WARNING
from conduit.sim.engine import Simulation
from conduit.sim.params import StockCosts
from conduit.sim.workload import load_workload
from conduit.sim.workload_fields import apply_overrides
from conduit.topology import load_topology

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper_table import ALGORITHMS, BASELINE, HEADLINE, MAX_EXTEND, SCALES, not_steady, run_steady, steady_iterations

#: actor/learner ratios (env runners per GPU) per algorithm; the preset's value is among them
RATIOS: dict[str, list[float]] = {"ppo": [1, 4, 10, 32], "appo": [1, 2, 4, 8], "dqn": [1, 2, 4, 8],
                                  "grpo": [0.125, 0.25, 0.5, 1]}
QUICK_RATIOS: dict[str, list[float]] = {"ppo": [1, 10], "appo": [1, 4], "dqn": [1, 2], "grpo": [0.125, 0.5]}
#: observation bytes per step, as multiples of the preset's
BYTES_SCALES = [0.1, 1.0, 10.0]
QUICK_BYTES_SCALES = [1.0, 10.0]
#: multiples of the measured stock costs
COST_SCALES = [0.25, 1.0, 4.0]
QUICK_COST_SCALES = [1.0, 4.0]
#: the stock model's per-call (round-trip and object-store call) costs: both processes' CPU per Ray call, its
#: round trip, what a cold call adds to each (the cold-call law's surcharges; its ramp is a time, not a cost,
#: and stays), and the object store's fixed get and put
RPC_FIELDS = ("rpc_overhead", "rpc_driver_cpu", "rpc_callee_cpu", "rpc_cold_round_trip", "rpc_cold_caller_cpu",
              "rpc_cold_callee_cpu", "get_per_object", "put_per_call")
#: pickling and unpickling per episode; ``serialize_bandwidth`` is divided by the scale
SERIALISATION_FIELDS = ("sample_serialize_per_episode", "sample_deserialize_per_episode",
                        "shard_serialize_per_episode", "shard_deserialize_per_episode", "serialize_bandwidth")
#: an iteration less than this much lower than stock counts as "does not help"
NO_HELP = 0.05
PLANES = ("ratio_x_bytes", "scale_x_rpc", "scale_x_serialisation")


def scaled_costs(kind: str, scale: float, base: StockCosts | None = None) -> StockCosts:
    """``base`` (default: the measured :class:`StockCosts`) with the ``kind`` (``rpc`` or
    ``serialisation``) fields multiplied by ``scale`` (a bandwidth divided by it)."""
    base = base or StockCosts()
    names = RPC_FIELDS if kind == "rpc" else SERIALISATION_FIELDS
    values = {n: (getattr(base, n) / scale if n.endswith("bandwidth") else getattr(base, n) * scale) for n in names}
    return replace(base, **values)


def _iterations(topology, workload) -> int:
    return steady_iterations(Simulation(topology, workload, create_policy(BASELINE), iterations=1))


def _check(row: dict[str, Any], where: str) -> None:
    assert int(row["violations"]) == 0, f"{where}, {row['policy']}: {row['violations']} audit violation(s)"


def _run(topology, wl, policy: str, iterations: int, seed: int, where: str, **kwargs: Any) -> dict[str, Any]:
    """One cell's run of ``policy`` through :func:`conduit.simulate`, rerun longer while its window
    still trends (:func:`paper_table.run_steady`); its figures, audit and steadiness."""
    result, extended = run_steady(lambda n: conduit.simulate(topology, wl, policy, iterations=n, seed=seed, **kwargs),
                                  iterations)
    row = {"policy": policy, "violations": result.audit.violations, "extended": extended,
           "not_steady": not_steady(result), "beyond_deployed": MULTI_LEARNER_WARNING in result.warnings,
           **{k: result.metrics[k] for k in ("iteration_time_s", "exposed_experience_path_s", "experience_share")}}
    _check(row, where)
    return row


def ratio_x_bytes(algorithm: str, ratios: list[float], byte_scales: list[float], seed: int) -> list[dict]:
    """The actor/learner x bytes plane on 8 GPUs (workload overrides of :func:`conduit.simulate`)."""
    topology = load_topology(SCALES[8])
    base = load_workload(ALGORITHMS[algorithm])
    out = []
    for ratio in ratios:
        wl = apply_overrides(base, {"runners_per_gpu": ratio})
        iterations = _iterations(topology, wl)
        for s in byte_scales:
            nbytes = base.bytes_per_step * s
            cell = apply_overrides(wl, {"bytes_per_step": nbytes})
            where = f"{algorithm} runners_per_gpu={ratio} bytes_per_step={nbytes}"
            rows = {p: _run(topology, cell, p, iterations, seed, where) for p in (BASELINE, HEADLINE)}
            out.append(_cell(algorithm, "ratio_x_bytes", "runners_per_gpu", ratio, "bytes_scale", s, 8,
                             rows[BASELINE], rows[HEADLINE], iterations, bytes_per_step=nbytes))
    return out


def scale_x_costs(algorithm: str, kind: str, gpus: list[int], scales: list[float], seed: int,
                  costs_dir: Path | None) -> list[dict]:
    """A scale x stock-cost plane: each variant passed as ``stock_costs`` to :func:`conduit.simulate`."""
    out = []
    wl = load_workload(ALGORITHMS[algorithm])
    for n in gpus:
        topology = load_topology(SCALES[n])
        iterations = _iterations(topology, wl)
        for s in scales:
            costs = scaled_costs(kind, s)
            if costs_dir is not None:
                costs_dir.mkdir(parents=True, exist_ok=True)
                path = costs_dir / f"{kind}-x{s:g}.yaml"
                path.write_text(yaml.safe_dump({f.name: getattr(costs, f.name) for f in fields(costs)
                                                if math.isfinite(getattr(costs, f.name))}, sort_keys=False))
            where = f"{algorithm} at {n} GPUs, {kind} costs x{s:g}"
            rows = {p: _run(topology, wl, p, iterations, seed, where, stock_costs=costs) for p in (BASELINE, HEADLINE)}
            out.append(_cell(algorithm, f"scale_x_{kind}", "gpus", n, f"{kind}_scale", s, n, rows[BASELINE],
                             rows[HEADLINE], iterations))
    return out


def _cell(algorithm: str, plane: str, x_name: str, x: float, y_name: str, y: float, gpus: int, stock: dict,
          ours: dict, iterations: int, **extra: Any) -> dict[str, Any]:
    s_it, c_it = float(stock["iteration_time_s"]), float(ours["iteration_time_s"])
    s_ex, c_ex = float(stock["exposed_experience_path_s"]), float(ours["exposed_experience_path_s"])
    return {"algorithm": algorithm, "plane": plane, "x_name": x_name, "x": x, "y_name": y_name, "y": y,
            "gpus": gpus, "iterations": iterations, **extra,
            "stock_iteration_s": s_it, "conduit_iteration_s": c_it,
            "iteration_ratio": c_it / s_it if s_it > 0 else math.nan,
            "stock_exposed_s": s_ex, "conduit_exposed_s": c_ex,
            "exposed_ratio": c_ex / s_ex if s_ex > 0 else (1.0 if c_ex == 0 else math.inf),
            "stock_share": float(stock["experience_share"]),
            "violations": int(stock["violations"]) + int(ours["violations"]),
            "not_steady": int(bool(stock.get("not_steady"))) + int(bool(ours.get("not_steady"))),
            "extended": int(stock.get("extended", 0)) + int(ours.get("extended", 0)),
            "beyond_deployed": bool(ours.get("beyond_deployed"))}


def draw(rows: list[dict[str, Any]]):
    """One row of heatmaps per algorithm, one column per plane; colour and label: conduit/stock
    iteration ratio (1.00: no gain)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algorithms = [a for a in ALGORITHMS if any(r["algorithm"] == a for r in rows)]
    planes = [p for p in PLANES if any(r["plane"] == p for r in rows)]
    fig, axes = plt.subplots(len(algorithms), len(planes), figsize=(4.8 * len(planes) + 1, 3.6 * len(algorithms)),
                             squeeze=False, layout="constrained")
    image = None
    for i, algorithm in enumerate(algorithms):
        for j, plane in enumerate(planes):
            ax = axes[i][j]
            cells = [r for r in rows if r["algorithm"] == algorithm and r["plane"] == plane]
            xs = sorted({r["x"] for r in cells})
            ys = sorted({r["y"] for r in cells})
            grid = [[math.nan] * len(xs) for _ in ys]
            for r in cells:
                grid[ys.index(r["y"])][xs.index(r["x"])] = r["iteration_ratio"]
            image = ax.imshow(grid, origin="lower", cmap="RdYlGn_r", vmin=0.0, vmax=1.2, aspect="auto")
            for yi, row in enumerate(grid):
                for xi, v in enumerate(row):
                    ax.text(xi, yi, "–" if math.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=8)
            ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
            ax.set_yticks(range(len(ys)), [f"x{y:g}" for y in ys])
            x_name = cells[0]["x_name"] if cells else ""
            y_name = cells[0]["y_name"] if cells else ""
            ax.set_xlabel({"runners_per_gpu": "env runners per GPU", "gpus": "GPUs"}.get(x_name, x_name))
            ax.set_ylabel({"bytes_scale": "obs. bytes/step (x preset)", "rpc_scale": "RPC costs (x measured)",
                           "serialisation_scale": "serialisation (x measured)"}.get(y_name, y_name))
            ax.set_title(f"{algorithm}: {plane.replace('_x_', ' x ')}", fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="conduit / rllib-stock iteration time")
    return fig


def report(rows: list[dict[str, Any]], args: argparse.Namespace, wall_s: float) -> str:
    lines = ["# Sensitivity: where Conduit's gain holds and where it does not", "",
             f"`python studies/sensitivity.py {' '.join(args.argv)}`".replace(" `", "`"), "",
             ("Iteration-time ratio `conduit / rllib-stock` (below 1: Conduit is faster; 1.00: no gain), "
             f"seed {args.seed}, {len(rows)} cells, "
             + (f"merged from {', '.join(f'`{d}`' for d in args.merge)}" if args.merge else f"{wall_s:.0f} s")
             + ". Heatmaps: `sensitivity.png`; "
             "every cell: `sensitivity.csv`."), "",
             "| algorithm | cells | best ratio (cell) | worst ratio (cell) | cells with < 5% gain |",
             "| --- | ---: | --- | --- | ---: |"]

    def where(r: dict) -> str:
        return f"{r['plane']}: {r['x_name']}={r['x']:g}, {r['y_name']}={r['y']:g}"

    for algorithm in ALGORITHMS:
        cells = [r for r in rows if r["algorithm"] == algorithm]
        if not cells:
            continue
        best = min(cells, key=lambda r: r["iteration_ratio"])
        worst = max(cells, key=lambda r: r["iteration_ratio"])
        weak = [r for r in cells if r["iteration_ratio"] > 1 - NO_HELP]
        lines.append(f"| {algorithm} | {len(cells)} | {best['iteration_ratio']:.3f} ({where(best)}) | "
                     f"{worst['iteration_ratio']:.3f} ({where(worst)}) | {len(weak)} |")
    lines += ["", "## Where Conduit does not help", ""]
    for algorithm in ALGORITHMS:
        cells = [r for r in rows if r["algorithm"] == algorithm]
        if not cells:
            continue
        weak = [r for r in cells if r["iteration_ratio"] > 1 - NO_HELP]
        gains = [1 - r["iteration_ratio"] for r in cells]
        if len(weak) == len(cells):
            lines.append(f"- **{algorithm}: nowhere in this sweep.** The iteration gain is "
                         f"{100 * min(gains):.1f}% to {100 * max(gains):.1f}% in every cell. " + _why(cells))
        elif weak:
            lines.append(f"- **{algorithm}**: less than {100 * NO_HELP:.0f}% in {len(weak)} of {len(cells)} cells: "
                         + "; ".join(f"{where(r)} (gain {100 * (1 - r['iteration_ratio']):+.1f}%)" for r in weak[:12])
                         + (" ..." if len(weak) > 12 else "") + " " + _why(weak))
        else:
            lines.append(f"- {algorithm}: at least {100 * NO_HELP:.0f}% in every cell "
                         f"({100 * min(gains):.1f}% to {100 * max(gains):.1f}%).")
    slower = [r for r in rows if r["iteration_ratio"] > 1]
    if slower:
        lines += ["", f"Slower than stock (ratio above 1) in {len(slower)} of {len(rows)} cells: "
                  + "; ".join(f"{r['algorithm']} {where(r)} ({r['iteration_ratio']:.3f})" for r in slower[:16])
                  + (" ..." if len(slower) > 16 else "") + "."]
    unsteady = [r for r in rows if int(r.get("not_steady") or 0)]
    lines += ["", (f"Not steady after {MAX_EXTEND} doublings of the run (its mean depends on the run's length; "
                   "read those cells as a trend, not a steady-state ratio): "
                   + ("; ".join(f"{r['algorithm']} {where(r)}" for r in unsteady) if unsteady else "none") + ".")]
    beyond = [a for a in ALGORITHMS if any(r["algorithm"] == a and str(r.get("beyond_deployed")) == "True"
                                           for r in rows)]
    lines += ["", ("Conduit here is `conduit`, Conduit as `enable()` deploys it (`conduit/sim/deployed.py`). "
                   + (f"The {', '.join(beyond)} cells have more than one learner, which `enable()` refuses today: they "
                      "apply the deployed mechanisms per learner, an extrapolation beyond the deployed runtime "
                      "(column `beyond_deployed`)." if beyond else "Every cell has one learner, as deployed."))]
    lines += ["", ("The `conduit` policy is whatever the registry holds under that name; the stock costs are the "
              "measured `StockCosts` (`conduit/sim/params.py`) scaled as the plane says, each variant in `costs/`."),
              "Every cell audited with 0 violations.", ""]
    return "\n".join(lines)


def _why(cells: list[dict[str, Any]]) -> str:
    """What the data says about cells where Conduit does not help: slower than stock, or nothing to
    remove (stock's exposed latency a small share of the iteration), or neither."""
    slower = [r for r in cells if r["iteration_ratio"] > 1]
    shares = [r["stock_share"] for r in cells]
    if slower:
        worst = max(slower, key=lambda r: r["iteration_ratio"])
        return (f"Conduit is slower than stock in {len(slower)} of {len(cells)} cells, up to "
                f"{worst['iteration_ratio']:.2f}x ({worst['plane']}: {worst['x_name']}={worst['x']:g}, "
                f"{worst['y_name']}={worst['y']:g}): there the deployed path's per-fragment work (a plane-actor "
                "round trip and copies into and out of the plane's host tiers, on the node's CPUs: "
                "`conduit/sim/deployed.py`) costs more than stock's path.")
    if max(shares) < 0.05:
        return (f"Stock's exposed latency is only {100 * min(shares):.1f}% to {100 * max(shares):.1f}% of an "
                "iteration: the iteration is paced by work the experience path does not shorten (sampling or "
                "generation, or the update), so there is almost nothing to remove.")
    return (f"Stock's exposed latency is {100 * min(shares):.1f}% to {100 * max(shares):.1f}% of an iteration, "
            "yet the deployed path does not shorten the iteration: what it removes from the learner's wait is "
            "paid back elsewhere in the loop.")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 GPUs, smaller grids (for tests)")
    parser.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS), default=list(ALGORITHMS))
    parser.add_argument("--gpus", nargs="+", type=int, choices=list(SCALES), default=None)
    parser.add_argument("--planes", nargs="+", choices=list(PLANES), default=list(PLANES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/sensitivity"))
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--merge", nargs="+", type=Path, default=None, metavar="DIR",
                        help="write one report from earlier outputs (their sensitivity.csv), run nothing")
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    args.gpus = args.gpus or ([8] if args.quick else list(SCALES))
    if args.seed < 0:
        parser.error("--seed must be >= 0")
    return args


_NUMERIC = ("x", "y", "gpus", "iterations", "bytes_per_step", "stock_iteration_s", "conduit_iteration_s",
            "iteration_ratio", "stock_exposed_s", "conduit_exposed_s", "exposed_ratio", "stock_share", "violations",
            "not_steady", "extended")


def read_cells(directory: Path) -> list[dict[str, Any]]:
    """The cells an earlier run wrote in ``directory/sensitivity.csv``, typed back."""
    rows = []
    with (directory / "sensitivity.csv").open() as fh:
        for row in csv.DictReader(fh):
            for key in _NUMERIC:
                text = row.get(key)
                if text not in (None, ""):  # as written: "4" was an int, "4.0" a float
                    row[key] = int(text) if text.lstrip("-").isdigit() else float(text)
            rows.append(row)
    return rows


def write_outputs(args: argparse.Namespace, rows: list[dict[str, Any]], wall: float) -> str:
    """``sensitivity.csv``, ``sensitivity.md`` and (with matplotlib) ``sensitivity.png``."""
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "sensitivity.csv").open("w", newline="") as fh:
        columns = list(dict.fromkeys(k for r in rows for k in r))
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    text = report(rows, args, wall)
    (args.out / "sensitivity.md").write_text(text)
    if not args.no_plot and rows:
        try:
            fig = draw(rows)
        except ImportError:
            print("matplotlib is not installed (pip install 'conduit[plot]'): no figure")
        else:
            fig.savefig(args.out / "sensitivity.png", dpi=110)
            import matplotlib.pyplot as plt

            plt.close(fig)
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        rows = [r for d in args.merge for r in read_cells(d)]
        print(write_outputs(args, rows, 0.0))
        return 0
    started = time.perf_counter()
    ratios = QUICK_RATIOS if args.quick else RATIOS
    byte_scales = QUICK_BYTES_SCALES if args.quick else BYTES_SCALES
    cost_scales = QUICK_COST_SCALES if args.quick else COST_SCALES
    rows: list[dict[str, Any]] = []
    text = ""
    for algorithm in args.algorithms:
        t0 = time.perf_counter()
        if "ratio_x_bytes" in args.planes:
            rows += ratio_x_bytes(algorithm, ratios[algorithm], byte_scales, args.seed)
        for kind in ("rpc", "serialisation"):
            if f"scale_x_{kind}" in args.planes:
                rows += scale_x_costs(algorithm, kind, args.gpus, cost_scales, args.seed, args.out / "costs")
        print(f"{algorithm}: {sum(r['algorithm'] == algorithm for r in rows)} cells, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        # the outputs so far, rewritten after every algorithm: a long run stopped early keeps them
        text = write_outputs(args, rows, time.perf_counter() - started)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
