"""What a simulated result rests on, and how far it can be trusted: provenance, validity, steady state.

A simulated figure is evidence only if a reader can tell what produced it and how far it lies from
what was measured. Every :class:`~conduit.sim.engine.SimResult` therefore carries three blocks
(``to_dict()`` and ``conduit sim --json`` print them):

* **provenance** (:func:`provenance`): the resolved workload (every field, after presets, YAML and
  ``--set`` overrides), the topology's name, source and a SHA-256 of its devices and links (two
  files that describe the same cluster hash alike; any change of a device attribute or a link does
  not), the cost parameters in force (``StockCosts`` with the file they came from, ``PlaneCosts``),
  the policy with its parameters and path settings, the project's version, the seed, and the
  versions of the libraries the model runs on.
* **validity** (:func:`validity`): how far the run is from the *calibrated points*, the runs the
  stock cost model reproduces (:data:`CALIBRATED_RUNS`, the runs of
  :data:`conduit.sim.calibration.REFERENCE`, each on the machine it was measured on), along the
  dimensions that decide whether the fitted costs still apply: env runners, GPUs, and bytes per env
  step. For each, the calibrated range and the factor
  from the nearest calibrated value; outside the range the run **extrapolates**, and a warning
  says along which dimension and by how much.
* **steady state** (:func:`steady_state`): the updates left out as warm-up and the ones measured,
  the length in updates of one *round* of the algorithm (PPO: one update; APPO: a weight broadcast,
  ``broadcast_interval`` updates; DQN: the updates one sampling round pays for, ``replay_ratio``
  times the steps the runners insert over the batch all learners draw), and warnings when the
  measured window holds fewer than :data:`MIN_ROUNDS` rounds or when the iteration time still
  trends (the two halves of the window differ by more than :data:`TREND_TOLERANCE`). A 30-update
  DQN run once showed a 24% error and a false trend: these are the checks that catch it.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
from dataclasses import asdict, fields, is_dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from conduit.sim.engine import Simulation
    from conduit.topology import Topology

#: a window shorter than this many rounds of the algorithm is warned about
MIN_ROUNDS = 5
#: relative difference between the mean iteration time of the window's two halves that counts as a trend
TREND_TOLERANCE = 0.10
#: a window needs at least this many updates before its halves are compared
TREND_MIN_UPDATES = 8


def topology_hash(topology: Topology) -> str:
    """SHA-256 (hex) of the topology's devices and links in a canonical form: sorted, numbers as
    floats, attribute maps with sorted keys. The name and source file are not part of it. Computed
    once per :class:`~conduit.topology.Topology` object (topologies are immutable)."""
    cached = topology.__dict__.get("_conduit_sha256")
    if cached is not None:
        return cached
    devices = sorted(
        [d.id, d.kind, d.node, {k: _plain(v) for k, v in sorted(d.attrs.items())}] for d in topology.devices.values()
    )
    links = sorted([min(ln.src, ln.dst), max(ln.src, ln.dst), float(ln.bandwidth), float(ln.latency),
                    {k: _plain(v) for k, v in sorted(ln.attrs.items())}] for ln in topology.links)
    text = json.dumps({"devices": devices, "links": links}, sort_keys=True, default=str, separators=(",", ":"))
    digest = topology.__dict__["_conduit_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    return digest


def _version(module: Any) -> str:
    """A library's version: its ``__version__``, else its installed distribution's (SimPy sets
    ``__version__`` only from the distribution's metadata), else ``"unknown"`` (a copy on sys.path)."""
    from importlib import metadata

    found = getattr(module, "__version__", None)
    if found:
        return str(found)
    try:
        return metadata.version(module.__name__)
    except metadata.PackageNotFoundError:
        return "unknown"


def provenance(sim: Simulation, stock_source: str | None = None) -> dict[str, Any]:
    """The provenance block of one run (see the module docstring)."""
    import networkx
    import simpy

    from conduit import __version__

    policy = sim.policy
    folded = {"fold": sim.fold.describe()} if sim.fold.factor > 1 else {}  # only a folded run has the block
    return {
        "project_version": __version__,
        "seed": sim.seed,
        "iterations": sim.iterations,
        "workload": {k: _plain(v) for k, v in asdict(sim.workload).items()},
        "topology": {"name": sim.unfolded_topology.name, "source": str(sim.unfolded_topology.source),
                     "sha256": topology_hash(sim.unfolded_topology), "gpus": len(sim.unfolded_topology.devices_of("gpu")),
                     "nodes": len(sim.unfolded_topology.nodes)},
        **folded,
        "policy": {"name": policy.name, "params": {k: _plain(v) for k, v in (policy.params or {}).items()},
                   "path": {k: _plain(v) for k, v in asdict(policy.path).items()} if is_dataclass(policy.path) else {}},
        "cost_parameters": {
            "stock": {"source": stock_source or "built-in defaults (conduit/sim/params.py StockCosts)",
                      "values": {f.name: getattr(sim.stock, f.name) for f in fields(sim.stock)}},
            "plane": {"source": getattr(sim, "plane_source", None)
                      or "built-in defaults (conduit/sim/params.py PlaneCosts)",
                      "values": {f.name: getattr(sim.plane, f.name) for f in fields(sim.plane)}},
        },
        "libraries": {"python": platform.python_version(), "numpy": np.__version__, "simpy": _version(simpy),
                      "networkx": _version(networkx)},
    }


# --------------------------------------------------------------------------- validity
def calibrated_points() -> list[dict[str, Any]]:
    """The runs the stock cost model was calibrated on, as the dimensions :func:`validity` compares:
    each of :data:`CALIBRATED_RUNS` laid out on its machine."""
    global _POINTS
    if _POINTS is None:
        from conduit.sim.cluster import lay_out
        from conduit.sim.workload import load_workload
        from conduit.topology import load_topology

        points = []
        for topology_name, name in CALIBRATED_RUNS:
            topology, workload = load_topology(topology_name), load_workload(name)
            layout = lay_out(topology, workload)
            points.append({"workload": name, "topology": topology_name, "source": CALIBRATION_SOURCE,
                           **_dimensions(topology, workload, len(layout.runners))})
        _POINTS = points
    return [dict(p) for p in _POINTS]


#: (topology, workload) of every run the stock costs were fitted on: the keys of
#: :data:`conduit.sim.calibration.REFERENCE` on its machine (restated here, not imported, so that this
#: module, which the engine uses, does not import the calibration, which runs the engine;
#: ``tests/test_sim_trust.py`` checks the two agree)
CALIBRATED_RUNS: tuple[tuple[str, str], ...] = (("reference-2core", "ref-ppo-atari"),
                                                ("reference-2core", "ref-dqn-cartpole"))
CALIBRATION_SOURCE = "shared/reference/rllib-2.60-stock-cpu.md"
REFERENCE_TOPOLOGY = "reference-2core"
_POINTS: list[dict[str, Any]] | None = None
DIMENSIONS = ("runners", "gpus", "bytes_per_step")


def _dimensions(topology: Topology, workload: Any, runners: int) -> dict[str, float]:
    return {"runners": runners, "gpus": len(topology.devices_of("gpu")), "bytes_per_step": float(workload.bytes_per_step)}


def validity(sim: Simulation) -> dict[str, Any]:
    """The validity block of one run: per dimension, the run's value, the calibrated range, the
    nearest calibrated value and the factor from it (``None`` when no calibrated point has any,
    e.g. GPUs on a CPU-only reference), whether the run extrapolates, and the warnings."""
    points = calibrated_points()
    run = _dimensions(sim.unfolded_topology, sim.workload, sim.logical_runners)
    out: dict[str, Any] = {"calibrated_points": points, "run": run, "dimensions": {}, "warnings": []}
    if sim.fold.factor > 1:
        out["warnings"].append(
            f"folded: {len(sim.fold.multiplicity)} of {sim.fold.logical_nodes} nodes simulated, each standing for up "
            f"to {max(sim.fold.multiplicity.values())} (fold={sim.fold.factor}); an approximation of the exact "
            f"simulation (benchmarks/sim_speed.py --fold prints its error)")
    extrapolating = False
    for dim in DIMENSIONS:
        values = sorted({float(p[dim]) for p in points})
        x = float(run[dim])
        low, high = values[0], values[-1]
        nearest = min(values, key=lambda v: abs(math.log(x / v)) if x > 0 and v > 0 else abs(x - v))
        factor = _factor(x, nearest)
        outside = x < low or x > high
        out["dimensions"][dim] = {"value": x, "calibrated_range": [low, high], "nearest": nearest,
                                  "factor_from_nearest": factor, "extrapolating": outside}
        if outside:
            extrapolating = True
            how = (f"{factor:.3g}x the nearest calibrated value ({nearest:g})" if factor is not None
                   else f"no calibrated point has any (calibrated: {low:g} to {high:g})")
            out["warnings"].append(f"extrapolating in {dim}: this run has {x:g}, {how}; the stock costs were "
                                   f"fitted at {', '.join(p['workload'] for p in points)} on {REFERENCE_TOPOLOGY}")
    out["extrapolating"] = extrapolating
    return out


def _factor(x: float, ref: float) -> float | None:
    if x == ref:
        return 1.0
    if x <= 0 or ref <= 0:
        return None
    return max(x / ref, ref / x)


# --------------------------------------------------------------------------- steady state
def round_updates(sim: Simulation) -> int:
    """Updates in one round of the algorithm (see the module docstring)."""
    w = sim.workload
    if w.algorithm == "appo":
        return max(1, int(w.broadcast_interval))
    if w.algorithm == "dqn":
        learners = max(1, sim.logical_learners)
        inserted = sim.logical_runners * w.chunk_steps
        return max(1, math.ceil(w.replay_ratio * inserted / (w.batch_size * learners)))
    return 1


def steady_state(sim: Simulation, warmup: int) -> dict[str, Any]:
    """The steady-state block: warm-up left out, window measured, rounds in it, trend, warnings."""
    series = _iteration_series(sim, warmup)
    measured = int(series.size)
    rounds = round_updates(sim)
    out: dict[str, Any] = {"warmup_updates": warmup, "measured_updates": measured, "window_s": float(series.sum()),
                           "round_updates": rounds,
                           "rounds_measured": measured / rounds, "min_rounds": MIN_ROUNDS, "trend": None,
                           "warnings": []}
    if measured < MIN_ROUNDS * rounds:
        out["warnings"].append(
            f"short window: {measured} measured update(s) after {warmup} warm-up update(s) hold "
            f"{measured / rounds:.3g} round(s) of {rounds} update(s) ({sim.workload.algorithm}); at least "
            f"{MIN_ROUNDS} rounds ({MIN_ROUNDS * rounds + warmup} iterations) are needed for a steady-state mean")
    trend, warning = window_trend(series)
    out["trend"] = trend
    if warning is not None:
        out["warnings"].append(warning)
    return out


def window_trend(series: np.ndarray) -> tuple[float | None, str | None]:
    """The window's trend (second half's mean iteration time relative to the first half's; None
    for fewer than :data:`TREND_MIN_UPDATES` updates) and the warning it deserves, if any."""
    if series.size < TREND_MIN_UPDATES:
        return None, None
    half = series.size // 2
    first, second = float(np.mean(series[:half])), float(np.mean(series[-half:]))
    trend = (second - first) / first if first > 0 else 0.0
    if abs(trend) <= TREND_TOLERANCE:
        return trend, None
    return trend, (f"not steady: the mean iteration time of the window's second half differs from its first "
                   f"half's by {100 * trend:+.1f}% (tolerance {100 * TREND_TOLERANCE:.0f}%); run longer")


def _iteration_series(sim: Simulation, warmup: int) -> np.ndarray:
    """Iteration times of the measured updates, in update order. Lockstep learners: the metrics'
    own series. Independent learners (the plane's replay loop): per update index, the mean over the
    learners of their own gaps, so the series is one learner's time line (its sum is simulated time,
    not learners times it)."""
    if sim.rec.synchronous:
        _, iteration = sim.rec.per_update(warmup)
        return iteration[np.isfinite(iteration)]
    by_learner: dict[str, list] = {}
    for u in sim.rec.updates:
        by_learner.setdefault(u.learner, []).append(u)
    gaps = []
    for ups in by_learner.values():
        ups.sort(key=lambda u: u.update)
        gaps.append([ups[i].t_start - ups[i - 1].t_start for i in range(max(1, warmup), len(ups))])
    n = min((len(g) for g in gaps), default=0)
    if n == 0:
        return np.zeros(0)
    return np.mean(np.array([g[:n] for g in gaps]), axis=0)


def _plain(value: Any) -> Any:
    """A JSON-ready copy: enums by value, tuples as lists, numpy scalars as Python numbers."""
    if hasattr(value, "value") and not isinstance(value, int | float | str):
        return _plain(value.value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)
