"""The simulator's model of a fresh mapping's first touch on a VM that reports free memory to its host.

A block above glibc's mmap ceiling (:data:`MMAP_CEILING_BYTES`) is mapped afresh on every allocation: its
first touch costs ``fresh_map_per_byte`` over a pre-faulted buffer (page faults, zeroing). A share of it lands
on memory the host has taken back, and that share costs ``reported_map_per_byte`` more; the share grows with
how long the process sat idle since it last freed such a block, from 0 at ``reported_ramp_from`` to 1 at
``reported_ramp_to`` (:func:`ramp`), the kernel reporting freed memory about two seconds after it was freed. :func:`fit_ramp` fits the three from the rounds of :func:`conduit.runtime.freshmap.measure`; the
simulator charges them through :meth:`conduit.sim.params.StockCosts.fresh_map`. Pure arithmetic: shared by
the runtime's measurement and the simulator.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

#: glibc's largest mmap threshold on 64-bit (``malloc.c``: ``DEFAULT_MMAP_THRESHOLD_MAX`` = 4 MiB x
#: ``sizeof(long)``): an allocation above it is always a fresh mapping, whatever was freed before it
MMAP_CEILING_BYTES = 32 << 20
#: the grid (seconds) :func:`fit_ramp` searches the ramp's two ends on
RAMP_GRID_S = 0.05


def fit_ramp(gaps: Sequence[float], extra_s: Sequence[Sequence[float]], nbytes: int) -> dict[str, Any]:
    """The simulator's model from the rounds (extra seconds of a fresh block of ``nbytes`` over a pre-faulted
    one, per gap): ``fresh_map_per_byte`` the median extra per byte at the shortest gap (the faults and zeroing
    of a fresh mapping on memory the guest still holds); ``reported_map_per_byte`` what the longest gap's median
    adds to that (every block reported by then; at least 0); a round *slow* when its extra exceeds the base by
    more than half of that; the share of slow rounds per gap; and the linear ramp (``reported_ramp_from`` ..
    ``reported_ramp_to``, seconds, on a :data:`RAMP_GRID_S` grid) that fits those shares best (least squares;
    ties: the narrowest ramp, then the earliest). Nothing added at the longest gap (no reporting): no ramp."""
    if len(gaps) != len(extra_s) or not gaps or any(not rounds for rounds in extra_s):
        raise ValueError("fit_ramp: one non-empty list of rounds per gap")
    if list(gaps) != sorted(gaps) or len(set(gaps)) != len(gaps):
        raise ValueError(f"fit_ramp: gaps must increase strictly, got {list(gaps)}")
    if nbytes < 1:
        raise ValueError(f"fit_ramp: nbytes must be >= 1, got {nbytes}")
    base = max(0.0, statistics.median(extra_s[0]))
    reported = max(0.0, statistics.median(extra_s[-1]) - base)
    out = {"fresh_map_per_byte": base / nbytes, "reported_map_per_byte": reported / nbytes}
    if reported <= 0:
        return {**out, "reported_ramp_from": 0.0, "reported_ramp_to": 0.0, "slow_share": [0.0] * len(gaps)}
    shares = [sum(1 for x in rounds if x > base + reported / 2) / len(rounds) for rounds in extra_s]
    steps = round(max(gaps) / RAMP_GRID_S)
    best: tuple[float, float, float, float] | None = None
    for i in range(steps + 1):
        for j in range(i, steps + 1):
            lo, hi = i * RAMP_GRID_S, j * RAMP_GRID_S
            err = sum((ramp(g, lo, hi) - s) ** 2 for g, s in zip(gaps, shares, strict=True))
            key = (round(err, 12), hi - lo, lo, hi)
            if best is None or key < best:
                best = key
    assert best is not None
    return {**out, "reported_ramp_from": round(best[2], 6), "reported_ramp_to": round(best[3], 6),
            "slow_share": shares}


def ramp(gap: float, lo: float, hi: float) -> float:
    """The share of a fresh mapping on reported memory after ``gap`` idle seconds: 0 up to ``lo``, 1 from
    ``hi``, linear between (a step at ``lo`` when the two are equal)."""
    if gap <= lo:
        return 0.0
    if gap >= hi:
        return 1.0
    return (gap - lo) / (hi - lo)
