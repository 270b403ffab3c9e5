"""``simulate()``: the library function behind ``conduit sim`` (the command is :mod:`conduit.cli.sim`).

``simulate(topology, workload, policy, ...)`` resolves names (library topology, preset workload,
registered policy, ``janus-best``) and runs one :class:`~conduit.sim.engine.Simulation`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from conduit.errors import ConduitError, shown

DEFAULT_POLICY = "rllib-stock"
#: the most learner updates one simulation may run: about 20 minutes and a few GB of traces for
#: 16 GPUs (``conduit sim`` and ``conduit tune`` refuse more)
MAX_ITERATIONS = 100_000
#: seeds are non-negative integers below 2**64 (numpy's seeding refuses negative ones)
MAX_SEED = 2**64 - 1


def check_run_arguments(iterations: Any, seed: Any) -> None:
    """Refuse an iteration count or a seed that no run can use, naming it."""
    if (isinstance(iterations, bool) or not isinstance(iterations, numbers.Integral)
            or not 1 <= iterations <= MAX_ITERATIONS):
        raise ConduitError(f"iterations must be an integer in [1, {MAX_ITERATIONS:,}], got {shown(iterations)}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed <= MAX_SEED:
        raise ConduitError(f"seed must be a non-negative integer below 2**64, got {shown(seed)}")


def check_sim_time(sim_time: Any) -> float | None:
    """Refuse a ``sim_time`` that no run can use (``None``: run by iterations), naming it."""
    if sim_time is None:
        return None
    if isinstance(sim_time, bool) or not isinstance(sim_time, numbers.Real) or not 0 < sim_time < math.inf:
        raise ConduitError(f"sim_time must be a finite number of simulated seconds > 0, got {shown(sim_time)}")
    return float(sim_time)


#: iterations of the first run when ``sim_time`` chooses the length, and the most runs it may take
SIM_TIME_PILOT_ITERATIONS = 5
SIM_TIME_MAX_RUNS = 6


def run_for_sim_time(make, sim_time: float):
    """The first run, in a deterministic sequence of lengths, whose measured steady-state window
    (after warm-up) covers at least ``sim_time`` simulated seconds.

    ``make(iterations)`` builds a :class:`~conduit.sim.engine.Simulation`. The sequence starts at
    :data:`SIM_TIME_PILOT_ITERATIONS` and each next length is extrapolated from the last run's
    window per iteration (plus 10%, and at least one more iteration), capped at
    :data:`MAX_ITERATIONS`; every run is a fresh one with the same seed, so the answer is a pure
    function of the arguments. The result's ``steady_state`` records the target and the runs tried."""
    iterations, tried = SIM_TIME_PILOT_ITERATIONS, []
    for _ in range(SIM_TIME_MAX_RUNS):
        result = make(iterations).run()
        window = result.steady_state.get("window_s", 0.0)
        measured = result.steady_state.get("measured_updates", 0)
        tried.append(iterations)
        if window >= sim_time or iterations >= MAX_ITERATIONS:
            break
        per = window / measured if window > 0 and measured > 0 else 0.0
        guess = math.ceil(1.1 * (iterations - measured + sim_time / per)) + 1 if per > 0 else 2 * iterations
        iterations = min(MAX_ITERATIONS, max(iterations + 1, guess))
    state = result.steady_state
    state["sim_time_target_s"] = sim_time
    state["iterations_tried"] = tried
    if state.get("window_s", 0.0) < sim_time:
        state["warnings"].append(f"sim_time {sim_time:g} s: the measured window covers only "
                                 f"{state.get('window_s', 0.0):.6g} s after {len(tried)} run(s) "
                                 f"(the last of {tried[-1]} iterations)")
    return result


def simulate(topology: Any, workload: Any, policy: Any = DEFAULT_POLICY, *, iterations: int = 10, seed: int = 0,
             params: dict | None = None, progress=None, overrides: dict | None = None,
             stock_costs: Any = None, sim_time: float | None = None, plane_costs: Any = None, fold: int = 1):
    """Run one simulation; every argument may be a name, a path or an object. Public as ``conduit.simulate``.

    ``overrides`` replaces workload fields (``{"runners_per_gpu": 4}``; text such as ``"2 ms"`` is typed
    by the field, see docs/workload-format.md). ``progress``: ``True`` for a progress bar (tqdm when
    installed), or a callable ``(done, total)``. The :class:`~conduit.sim.engine.SimResult` has
    ``to_dict()``, ``to_rows()`` and ``to_frame()`` (pandas optional).

    ``policy="janus-best"`` is resolved here: :func:`conduit.sim.search.janus_best` searches the Janus
    configurations for this workload and topology with the same seed and ``min(iterations, 20)``
    iterations (cached in-process), then the winner runs for ``iterations``; the result's policy is
    named ``janus-best=<winning configuration>``.

    ``stock_costs``: the stock cost model, as a YAML/JSON file path, a mapping of
    :class:`~conduit.sim.params.StockCosts` fields, or a ``StockCosts`` (:mod:`conduit.sim.cost_file`;
    echoed in the result's provenance). ``plane_costs``: Conduit's own costs, likewise (a calibration
    JSON from ``conduit calibrate --plane-json``, a mapping of :class:`~conduit.sim.params.PlaneCosts`
    fields, or a ``PlaneCosts``). ``sim_time``: simulated seconds of steady state to cover,
    instead of ``iterations`` (:func:`run_for_sim_time`). The result carries ``provenance``,
    ``validity`` and ``steady_state`` blocks and their ``warnings`` (:mod:`conduit.sim.provenance`).

    ``fold=K`` (PPO only) simulates one representative for every ``K`` identical nodes besides the
    driver's (:mod:`conduit.sim.fold`): much faster at scale, an approximation whose error against the
    exact run ``benchmarks/sim_speed.py --fold K`` prints; the result says it was folded."""
    from conduit.registry import create_policy
    from conduit.sim.cost_file import resolve_plane_costs, resolve_stock_costs
    from conduit.sim.engine import Simulation
    from conduit.sim.workload import load_workload
    from conduit.topology import Topology, load_topology

    check_run_arguments(iterations, seed)
    sim_time = check_sim_time(sim_time)
    stock, stock_source = resolve_stock_costs(stock_costs)
    plane, plane_source = resolve_plane_costs(plane_costs)
    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    from conduit.progress_display import resolve_progress
    from conduit.sim.workload_fields import apply_overrides

    wl = apply_overrides(load_workload(workload), overrides)
    progress = resolve_progress(progress, f"simulating {wl.name} on {topo.name}")
    if isinstance(policy, str) and policy == "janus-best":
        from conduit.sim.search import janus_best, search_iterations

        if params:
            raise ConduitError(f"policy 'janus-best' takes no parameters (it searches them); got {sorted(params)}")
        pol, _ = janus_best(topo, wl, iterations=search_iterations(iterations), seed=seed, progress=progress)
    else:
        pol = create_policy(policy, **(params or {}))

    def make(n: int) -> Simulation:
        return Simulation(topo, wl, pol, iterations=n, seed=seed, progress=progress, stock=stock,
                          stock_source=stock_source, plane=plane, plane_source=plane_source, fold=fold)

    if sim_time is not None:
        return run_for_sim_time(make, sim_time)
    return make(iterations).run()
