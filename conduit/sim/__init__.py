"""The SimPy backend: a discrete-event model of interconnects, memory tiers and workloads.

* ``simulate_transfers(topology, transfers)`` — the fixed entry point of the flow-level network
  model (:mod:`conduit.sim.transfers`);
* ``simulate(topology, workload, policy, iterations=..., seed=...)`` — one audited training-run
  simulation (:mod:`conduit.sim.run`), returning a :class:`~conduit.sim.engine.SimResult` with its
  provenance, validity and steady-state blocks (:mod:`conduit.sim.provenance`);
* ``simulate_seeds(topology, workload, policy, seeds=N, ...)`` — the same over N seeds, with each
  metric's mean and 95% confidence interval (:mod:`conduit.sim.seeds`).

Both are imported on first use, so ``import conduit.sim`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["simulate", "simulate_seeds", "simulate_transfers"]


def __getattr__(name: str) -> Any:
    if name == "simulate_transfers":
        from conduit.sim.transfers import simulate_transfers

        return simulate_transfers
    if name == "simulate":
        from conduit.sim.run import simulate

        return simulate
    if name == "simulate_seeds":
        from conduit.sim.seeds import simulate_seeds

        return simulate_seeds
    raise AttributeError(f"module 'conduit.sim' has no attribute {name!r}")
