"""The linear ramp the cost models share: a share of a surcharge that grows with time.

The cold-call law (:class:`conduit.sim.raycalls.ColdRamp`: time since a process's previous call), the
warm-up debt (:mod:`conduit.sim.coldwork`) and the fresh mapping's reported share (:mod:`conduit.fresh_mapping`:
time since the learner last freed its batch) each charge a figure measured at its two ends, interpolated
linearly between them.
"""

from __future__ import annotations


def linear_ramp(x: float, lo: float, hi: float) -> float:
    """0 up to ``lo`` (inclusive), 1 from ``hi`` on, linear between; a step at ``lo`` when the two are equal."""
    if x <= lo:
        return 0.0
    if x >= hi:
        return 1.0
    return (x - lo) / (hi - lo)
