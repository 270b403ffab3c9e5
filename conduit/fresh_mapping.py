"""The simulator's model of a fresh mapping's first touch on a VM that reports free memory to its host.

A block above glibc's mmap ceiling (:data:`MMAP_CEILING_BYTES`) is mapped afresh on every allocation: its
first touch costs ``fresh_map_per_byte`` over a pre-faulted buffer (page faults, zeroing). A share of it lands
on memory the host has taken back, and that share costs ``reported_map_per_byte`` more; the share grows with
how long the process sat idle since it last freed such a block, from 0 at ``reported_ramp_from`` to 1 at
``reported_ramp_to`` (:func:`conduit.ramp.linear_ramp`), the kernel reporting freed memory about two seconds
after it was freed. :func:`fit_ramp` fits the four from the rounds of :func:`conduit.runtime.freshmap.measure`;
the simulator charges them through :meth:`conduit.sim.params.StockCosts.fresh_map`. Pure arithmetic, shared by
the runtime's measurement and the simulator.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from conduit.ramp import linear_ramp

#: glibc's largest mmap threshold on 64-bit (``malloc.c``: ``DEFAULT_MMAP_THRESHOLD_MAX`` = 4 MiB x
#: ``sizeof(long)``): an allocation above it is always a fresh mapping, whatever was freed before it
MMAP_CEILING_BYTES = 32 << 20
#: the grid (seconds) :func:`fit_ramp` searches the ramp's two ends on, up to this multiple of the longest gap (a
#: ramp that has not ended by the longest gap ends past it)
RAMP_GRID_S = 0.05
RAMP_REACH = 2.0


def fit_ramp(gaps: Sequence[float], extra_s: Sequence[Sequence[float]], nbytes: int) -> dict[str, Any]:
    """The simulator's model from the rounds (extra seconds of a fresh block of ``nbytes`` over a pre-faulted
    one, per gap): ``fresh_map_per_byte`` the median extra per byte at the shortest gap (the faults and zeroing
    of a fresh mapping on memory the guest still holds); then, over every gap, the mean extra beyond that (what a
    round costs on average: a gap's rounds are either cheap or land on reported memory and cost far more) fitted
    by an amplitude times a linear ramp, ``reported_map_per_byte`` the amplitude per byte and
    ``reported_ramp_from`` .. ``reported_ramp_to`` the ramp (seconds, on a :data:`RAMP_GRID_S` grid up to
    :data:`RAMP_REACH` times the longest gap; for each
    candidate ramp the least-squares amplitude, at least 0; the ramp with the least squared error wins, ties to
    the narrowest, then the earliest). The expected value, not the median: on the development VM the longest
    gaps still had one cheap round in five, which a median-and-share fit read as a ramp stretched to 3.3 s.
    ``slow_share`` per gap (rounds more than half the amplitude above the base) is kept as a diagnostic. No mean
    extra at any gap (no reporting): no ramp."""
    if len(gaps) != len(extra_s) or not gaps or any(not rounds for rounds in extra_s):
        raise ValueError("fit_ramp: one non-empty list of rounds per gap")
    if list(gaps) != sorted(gaps) or len(set(gaps)) != len(gaps):
        raise ValueError(f"fit_ramp: gaps must increase strictly, got {list(gaps)}")
    if nbytes < 1:
        raise ValueError(f"fit_ramp: nbytes must be >= 1, got {nbytes}")
    base = max(0.0, statistics.median(extra_s[0]))
    means = [max(0.0, statistics.fmean(rounds) - base) for rounds in extra_s]
    best: tuple[float, float, float, float, float] | None = None
    steps = math.ceil(RAMP_REACH * max(gaps) / RAMP_GRID_S)
    for i in range(steps + 1):
        for j in range(i, steps + 1):
            lo, hi = i * RAMP_GRID_S, j * RAMP_GRID_S
            shape = [linear_ramp(g, lo, hi) for g in gaps]
            norm = sum(r * r for r in shape)
            amplitude = max(0.0, sum(m * r for m, r in zip(means, shape, strict=True)) / norm) if norm > 0 else 0.0
            err = sum((m - amplitude * r) ** 2 for m, r in zip(means, shape, strict=True))
            key = (round(err, 15), hi - lo, lo, hi, amplitude)
            if best is None or key[:4] < best[:4]:
                best = key
    assert best is not None
    _err, _width, lo, hi, amplitude = best
    if amplitude <= 0:
        lo = hi = 0.0
    return {"fresh_map_per_byte": base / nbytes, "reported_map_per_byte": amplitude / nbytes,
            "reported_ramp_from": round(lo, 6), "reported_ramp_to": round(hi, 6),
            "slow_share": [sum(1 for x in rounds if x > base + amplitude / 2) / len(rounds) if amplitude > 0 else 0.0
                           for rounds in extra_s]}
