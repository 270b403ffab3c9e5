"""The SimPy backend: a discrete-event model of interconnects, memory tiers and workloads.

``simulate_transfers`` is the fixed entry point of the flow-level network model
(:mod:`conduit.sim.transfers`); it is imported on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["simulate_transfers"]


def __getattr__(name: str) -> Any:
    if name == "simulate_transfers":
        from conduit.sim.transfers import simulate_transfers

        return simulate_transfers
    raise AttributeError(f"module 'conduit.sim' has no attribute {name!r}")
