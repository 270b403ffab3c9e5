"""The SimPy backend: a discrete-event model of interconnects, memory tiers and workloads.

* ``simulate_transfers(topology, transfers)`` — the fixed entry point of the flow-level network
  model (:mod:`conduit.sim.transfers`);
* ``simulate(topology, workload, policy, iterations=..., seed=...)`` — one audited training-run
  simulation (:mod:`conduit.sim.run`), returning a :class:`~conduit.sim.engine.SimResult`.

Both are imported on first use, so ``import conduit.sim`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["simulate", "simulate_transfers"]


def __getattr__(name: str) -> Any:
    if name == "simulate_transfers":
        from conduit.sim.transfers import simulate_transfers

        return simulate_transfers
    if name == "simulate":
        from conduit.sim.run import simulate

        return simulate
    raise AttributeError(f"module 'conduit.sim' has no attribute {name!r}")
