"""``simulate()``: the library function behind ``conduit sim`` (the command is :mod:`conduit.cli.sim`).

``simulate(topology, workload, policy, ...)`` resolves names (library topology, preset workload,
registered policy, ``janus-best``) and runs one :class:`~conduit.sim.engine.Simulation`.
"""

from __future__ import annotations

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


def simulate(topology: Any, workload: Any, policy: Any = DEFAULT_POLICY, *, iterations: int = 10, seed: int = 0,
             params: dict | None = None, progress=None, overrides: dict | None = None):
    """Run one simulation; every argument may be a name, a path or an object. Public as ``conduit.simulate``.

    ``overrides`` replaces workload fields (``{"runners_per_gpu": 4}``; text such as ``"2 ms"`` is typed
    by the field, see docs/workload-format.md). ``progress``: ``True`` for a progress bar (tqdm when
    installed), or a callable ``(done, total)``. The :class:`~conduit.sim.engine.SimResult` has
    ``to_dict()``, ``to_rows()`` and ``to_frame()`` (pandas optional).

    ``policy="janus-best"`` is resolved here: :func:`conduit.sim.search.janus_best` searches the Janus
    configurations for this workload and topology with the same seed and ``min(iterations, 20)``
    iterations (cached in-process), then the winner runs for ``iterations``; the result's policy is
    named ``janus-best=<winning configuration>``."""
    from conduit.registry import create_policy
    from conduit.sim.engine import Simulation
    from conduit.sim.workload import load_workload
    from conduit.topology import Topology, load_topology

    check_run_arguments(iterations, seed)
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
    return Simulation(topo, wl, pol, iterations=iterations, seed=seed, progress=progress).run()
