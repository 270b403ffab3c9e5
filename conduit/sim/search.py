"""``janus-best``: the best fixed Janus configuration for one workload on one topology.

:func:`janus_best` runs the simulator once per Janus configuration (:mod:`conduit.policies.janus`:
placement x collection overlap x selection overlap x granularity, 60 in all) and returns the best
by an objective — mean iteration time by default, ties (equal to 1e-9, relative) broken by exposed
experience-path latency, then by the mean experience path per chunk, then by the configurations'
fixed order, which runs from the least resourceful to the most (pageable before pinned before gpu,
no overlap before overlap, then granularity ascending), so a tie goes to the configuration that needs
the least pinned memory, HBM and concurrency — **among runs with zero audit violations only**. A
configuration that breaks the data contract cannot win however fast it is. The search is what a
careful engineer with a simulator would do by hand; ``janus-best`` is therefore the strongest
fixed-configuration baseline, and the gap between it and ``conduit`` is what adaptive placement,
deadline scheduling and per-chunk batch building add.

**Configurations that cannot differ are not simulated twice.** Each is mapped to a canonical
configuration that behaves identically for the workload's algorithm, and only canonical ones run;
the table still lists every configuration, the skipped ones marked ``evaluated: False`` with
``same_as`` (the canonical name, whose numbers they carry) and ``skip_reason``:

* **PPO** — *selection overlap is irrelevant to PPO's synchronous loop*: sampling of iteration
  *k + 1* starts only after update *k* and its weight sync, so there is no next batch to select while
  an update runs, and with per-batch building the learner copies its whole batch when it asks (no move
  is ever handed to a scheduler). ``so`` configurations are the ``nso`` ones.
* **PPO** — *granularity beyond the chunks a runner produces per iteration*: a group never spans
  iterations (nor learners), so every ``g`` at or above a runner's chunks per iteration
  (``ceil(ceil(learners * train_batch_per_learner / chunk_steps) / runners)``) coalesces the same
  groups; only the smallest such ``g`` runs.
* **APPO** — *selection overlap*: with per-batch building (every Janus configuration) the learner
  builds and copies each batch when it assembles it, so there is no move for a scheduler to start
  early; ``so`` configurations are the ``nso`` ones.

Granularity is evaluated for APPO and DQN (a runner coalesces ``g`` chunks before each hand-off),
selection overlap for DQN (the next batch is sampled and gathered during the update), and collection
overlap and placement for all three.

**Then the two knobs an RLlib user tunes first**, on the winner of the 60: the fragment length
(``fragment_steps`` in :data:`~conduit.policies.janus.FRAGMENT_STEPS`, only those shorter than the
workload's fragment) and per-fragment advantages (``per_fragment_advantages``), each combination
one more run, appended to the table after the 60 (``refinement: True``). The winner is the best of
all eligible rows; ties go to the 60 (the plainer configuration).

Results are cached in-process, keyed by (topology name, workload name, iterations, seed); a key
whose topology source or workload definition changed is recomputed, never served stale.
:func:`clear_cache` empties it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from conduit.errors import ConduitError
from conduit.policies.janus import (
    FRAGMENT_STEPS,
    GRANULARITIES,
    JANUS_BEST,
    janus,
    janus_configurations,
    janus_name,
)
from conduit.policy import Policy
from conduit.sim.workload import Workload
from conduit.topology import Topology

DEFAULT_OBJECTIVE = "iteration_time_s"
TIE_BREAK = "exposed_experience_path_s"
#: objective values this close (relative) are a tie, broken by exposed experience-path latency, then
#: by mean experience path per chunk, then by the configurations' fixed order
TIE_TOLERANCE = 1e-9
#: ``simulate(..., "janus-best")`` searches with at most this many iterations (ranking needs a
#: steady state, not a long run), then simulates the winner with the iterations asked for.
MAX_SEARCH_ITERATIONS = 20
_METRICS = ("iteration_time_s", "exposed_experience_path_s", "experience_path_s", "experience_share",
            "rejected_decisions")


@dataclass
class _CacheEntry:
    fingerprint: tuple
    rows: list[dict[str, Any]]


_CACHE: dict[tuple[str, str, int, int], _CacheEntry] = {}
_REFINED: dict[tuple, _CacheEntry] = {}


def clear_cache() -> None:
    """Forget every cached search."""
    _CACHE.clear()
    _REFINED.clear()


def search_iterations(iterations: int) -> int:
    """The iterations ``simulate(..., "janus-best")`` searches with: ``min(iterations, 20)``."""
    return max(1, min(int(iterations), MAX_SEARCH_ITERATIONS))


def chunks_per_runner(topology: Topology, workload: Workload) -> int:
    """Chunks one env runner produces per synchronous (PPO) iteration, at most."""
    from conduit.sim.cluster import lay_out
    from conduit.sim.engine import auto_fragment

    layout = lay_out(topology, workload)
    workload = auto_fragment(workload, len(layout.runners), len(layout.learners))
    total = math.ceil(len(layout.learners) * workload.train_batch_per_learner / workload.chunk_steps)
    return max(1, math.ceil(total / len(layout.runners)))


def canonical(kwargs: dict[str, Any], topology: Topology, workload: Workload,
              _per_runner: int | None = None) -> tuple[dict[str, Any], str | None]:
    """The configuration that behaves identically to ``kwargs`` for this workload, and why (``None``
    when ``kwargs`` is its own canonical form). See the module docstring for the rules."""
    out, reasons = dict(kwargs), []
    if workload.algorithm == "ppo":
        if out["overlap_selection"]:
            out["overlap_selection"] = False
            reasons.append("selection overlap is irrelevant to PPO's synchronous loop")
        cap = _per_runner if _per_runner is not None else chunks_per_runner(topology, workload)
        top = min((g for g in GRANULARITIES if g >= cap), default=GRANULARITIES[-1])
        if out["granularity"] > top:
            reasons.append(f"granularity {out['granularity']} exceeds the {cap} chunk(s) a runner "
                           f"produces per iteration (same groups as g{top})")
            out["granularity"] = top
    elif workload.algorithm == "appo" and out["overlap_selection"]:
        out["overlap_selection"] = False
        reasons.append("APPO with per-batch building copies each batch when the learner assembles it: "
                       "there is no move for a scheduler to start early")
    return out, ("; ".join(reasons) or None)


def janus_best(topology: Any, workload: Any, *, iterations: int = 10, seed: int = 0,
               objective: str = DEFAULT_OBJECTIVE,
               progress: Callable[[int, int], None] | None = None) -> tuple[Policy, list[dict[str, Any]]]:
    """Exhaustive search over the 60 Janus configurations on the simulator.

    ``topology`` and ``workload`` may be names, paths or objects. Returns the winning policy — a
    :func:`~conduit.policies.janus.janus` policy named ``janus-best=<configuration>`` — and the full
    table: one row per configuration (60), in :func:`~conduit.policies.janus.janus_configurations`
    order, with its keyword arguments, ``evaluated``/``same_as``/``skip_reason``, the run's metrics
    (``iteration_time_s``, ``exposed_experience_path_s``, ``experience_path_s``, ``experience_share``,
    ``rejected_decisions``), ``violations`` and ``best``. ``objective`` is any metric of the
    simulator's ``metrics`` (lower is better). ``progress(done, total)`` is called after each run.
    Raises :class:`ConduitError` when every configuration violates the data contract.
    """
    from conduit.sim.workload import load_workload
    from conduit.topology import load_topology

    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    wl = load_workload(workload)
    rows = _table(topo, wl, int(iterations), int(seed), progress)
    rows = copy.deepcopy(rows)  # callers may annotate their copy; the cache keeps its own
    if objective not in rows[0]["metrics"]:
        raise ConduitError(f"janus-best: unknown objective {objective!r}; "
                           f"known: {', '.join(sorted(rows[0]['metrics']))}")
    eligible = [r for r in rows if r["evaluated"] and r["violations"] == 0]
    if not eligible:
        raise ConduitError(f"janus-best: every Janus configuration violated the data contract of workload "
                           f"{wl.name!r} on topology {topo.name!r}; nothing to choose from")
    best = _pick(eligible, (objective, TIE_BREAK, "experience_path_s"))
    rows = rows + copy.deepcopy(_refine(topo, wl, int(iterations), int(seed), best, len(rows)))
    eligible = [r for r in rows if r["evaluated"] and r["violations"] == 0]
    best = _pick(eligible, (objective, TIE_BREAK, "experience_path_s"))
    for r in rows:
        r["best"] = r["name"] == best["name"]
        r["objective"] = objective
    winner = janus(**best["kwargs"])
    winner = replace(
        winner,
        name=f"{JANUS_BEST}={best['name']}",
        params={**winner.params, "configuration": best["name"]},
        summary=(f"best of {len(eligible)} Janus configurations for {wl.name} on {topo.name} by {objective} "
                 f"({iterations} iterations, seed {seed}): {best['name']}"),
    )
    return winner, rows


def _refine(topo: Topology, wl: Workload, iterations: int, seed: int, best: dict[str, Any],
            start: int) -> list[dict[str, Any]]:
    """Rows for the fragment-length and per-fragment-advantage variants of ``best``."""
    from conduit.sim.engine import Simulation

    key = (topo.name, wl.name, iterations, seed, best["name"])
    fingerprint = (str(getattr(topo, "source", "")), len(topo.devices), wl)
    cached = _REFINED.get(key)
    if cached is not None and cached.fingerprint == fingerprint:
        return cached.rows
    base = {k: best["kwargs"][k] for k in ("placement", "overlap_collection", "overlap_selection", "granularity")}
    variants = [(f, pfa) for f in FRAGMENT_STEPS for pfa in (False, True)
                if (f or pfa) and (not f or f < wl.fragment_length)]
    rows = []
    for offset, (f, pfa) in enumerate(variants):
        kwargs = {**base, "fragment_steps": f or None, "per_fragment_advantages": pfa}
        result = Simulation(topo, wl, janus(**kwargs), iterations=iterations, seed=seed).run()
        metrics = dict(result.metrics)
        rows.append({
            "index": start + offset, "name": janus_name(**kwargs), "kwargs": kwargs, **kwargs,
            "evaluated": True, "same_as": None, "skip_reason": None, "refinement": True,
            "metrics": metrics, "violations": int(result.audit.violations),
            **{k: metrics.get(k, math.nan) for k in _METRICS},
        })
    _REFINED[key] = _CacheEntry(fingerprint, rows)
    return rows


def _finite(x: float) -> float:
    return math.inf if x is None or math.isnan(x) else x


def _pick(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """Lexicographic minimum over ``keys`` where values within :data:`TIE_TOLERANCE` (relative) tie
    — means of simulated times differ in the last bits between configurations that are equal —
    then the configurations' fixed order."""
    for key in keys:
        low = min(_finite(r["metrics"].get(key, math.nan)) for r in rows)
        if math.isinf(low):
            continue
        rows = [r for r in rows if _finite(r["metrics"].get(key, math.nan)) <= low + TIE_TOLERANCE * abs(low) + 1e-15]
    return min(rows, key=lambda r: r["index"])


def _table(topo: Topology, wl: Workload, iterations: int, seed: int,
           progress: Callable[[int, int], None] | None) -> list[dict[str, Any]]:
    from conduit.sim.engine import Simulation

    key = (topo.name, wl.name, iterations, seed)
    fingerprint = (str(getattr(topo, "source", "")), len(topo.devices), wl)
    cached = _CACHE.get(key)
    if cached is not None and cached.fingerprint == fingerprint:
        return cached.rows
    per_runner = chunks_per_runner(topo, wl) if wl.algorithm == "ppo" else None
    configs = list(janus_configurations())
    plan = []
    for index, (name, kwargs) in enumerate(configs):
        canon, reason = canonical(kwargs, topo, wl, per_runner)
        plan.append((index, name, kwargs, janus_name(**canon), reason))
    to_run = [p for p in plan if p[3] == p[1]]
    results: dict[str, dict[str, Any]] = {}
    for done, (_, name, kwargs, _, _) in enumerate(to_run, start=1):
        result = Simulation(topo, wl, janus(**kwargs), iterations=iterations, seed=seed).run()
        results[name] = {"metrics": dict(result.metrics), "violations": int(result.audit.violations)}
        if progress is not None:
            progress(done, len(to_run))
    rows = []
    for index, name, kwargs, same_as, reason in plan:
        source = results[same_as]
        rows.append({
            "index": index, "name": name, "kwargs": dict(kwargs), **kwargs,
            "evaluated": same_as == name, "same_as": None if same_as == name else same_as, "skip_reason": reason,
            "metrics": dict(source["metrics"]), "violations": source["violations"],
            **{k: source["metrics"].get(k, math.nan) for k in _METRICS},
        })
    _CACHE[key] = _CacheEntry(fingerprint, rows)
    return rows
