"""A fresh mapping's first touch after the process sat idle: what a VM's free page reporting costs.

glibc serves every allocation above its mmap ceiling (32 MiB on 64-bit: ``malloc.c``,
``DEFAULT_MMAP_THRESHOLD_MAX``) with a fresh ``mmap`` and gives it back with ``munmap`` when freed, so a
learner that builds a 57 MB train batch each iteration maps it afresh each time. On bare metal the first touch
costs a page fault and a zeroing per page. A VM with free page reporting (virtio-balloon; ``/sys/module/
page_reporting``, :mod:`conduit.runtime.pagereport`) also hands free memory back to its host, about two seconds
after it was freed (the kernel's ``PAGE_REPORTING_DELAY``); memory the host took back is backed again on first
touch, in the host, while the vCPU waits. The kernel hands out recently freed, unreported blocks first (reported
ones go to the tail of the free lists), so what a fresh mapping costs depends on how long ago the memory it
reuses was freed: a learner that freed its last update's tensors a second ago maps warm memory, one that sat
idle for two seconds maps memory its host has taken back.

On the 2-core development VM, 2026-12-07 (a 56 MB copy into a fresh array, 8 rounds per gap): 5 ms after an
idle gap of 0.25-1.0 s (one round in eight slow), 5-73 ms after 1.5 s (five of eight slow), 64-128 ms from
2.0 s on (all slow); a copy into a pre-faulted buffer took 5 ms.

:func:`measure` times it the same way: per round, a fresh block touched and freed (the "last update"), an idle
gap, then a copy into a fresh block, against a copy into a pre-faulted one. :func:`conduit.fresh_mapping.fit_ramp` turns the
rounds into the simulator's model (``StockCosts.fresh_map_per_byte``, ``reported_map_per_byte`` and the ramp
``reported_ramp_from`` .. ``reported_ramp_to``: the share of a fresh mapping that lands on reported memory grows
linearly from 0 to 1 over the idle gap; :meth:`conduit.sim.params.StockCosts.fresh_map`).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from conduit.fresh_mapping import fit_ramp
from conduit.runtime import pagereport

#: idle gaps timed (seconds): below, around and past the kernel's two-second reporting delay
GAPS_S = (0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
QUICK_GAPS_S = (0.05, 0.5)
#: the block touched: above glibc's 32 MiB mmap ceiling, about a large-observation PPO train batch
BLOCK_BYTES = 64 << 20
QUICK_BLOCK_BYTES = 40 << 20


def measure(gaps: Sequence[float] = GAPS_S, rounds: int = 5, nbytes: int = BLOCK_BYTES, seed: int = 0,
            sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Time a copy of ``nbytes`` into a fresh array after each idle gap, ``rounds`` times per gap (the gaps
    shuffled per round, so the host's drift hits every gap alike), against a copy into a pre-faulted array in
    the same round. Returns the rounds' extra seconds per gap, the warm copy's seconds, the reporting settings
    (None without page reporting) and the fitted model (:func:`conduit.fresh_mapping.fit_ramp`)."""
    if not gaps or rounds < 1 or nbytes < 1:
        raise ValueError(f"measure: need gaps, rounds >= 1 and nbytes >= 1 (got {list(gaps)}, {rounds}, {nbytes})")
    src = np.random.default_rng(seed).integers(0, 255, nbytes, dtype=np.uint8)
    warm = np.empty_like(src)
    np.copyto(warm, src)  # pre-faulted
    order = random.Random(seed)
    extra: dict[float, list[float]] = {float(g): [] for g in gaps}
    warm_s: list[float] = []
    started = pagereport.snapshot()
    t_start = time.perf_counter()
    for _ in range(rounds):
        shuffled = [float(g) for g in gaps]
        order.shuffle(shuffled)
        for gap in shuffled:
            block = src.copy()  # the "last update": a fresh block touched, then freed
            del block
            sleep(gap)
            t0 = time.perf_counter()
            block = src.copy()
            fresh = time.perf_counter() - t0
            del block
            t0 = time.perf_counter()
            np.copyto(warm, src)
            copied = time.perf_counter() - t0
            warm_s.append(copied)
            extra[gap].append(max(0.0, fresh - copied))
    reported = pagereport.reported_between(started, pagereport.snapshot())
    out: dict[str, Any] = {
        "block_bytes": int(nbytes), "rounds": int(rounds), "gaps_s": sorted(extra),
        "extra_s": [extra[g] for g in sorted(extra)], "warm_copy_s": statistics.median(warm_s),
        "elapsed_s": round(time.perf_counter() - t_start, 2),
        "reporting": None if reported is None else reported.get("settings"),
        "reported_mb": None if reported is None else reported.get("mb"),
        "note": (f"a copy of {nbytes / 2**20:.0f} MiB into a fresh array after an idle gap (a fresh block touched and "
                 f"freed just before it), less a copy into a pre-faulted array in the same round; {rounds} rounds per "
                 f"gap, gaps shuffled per round"),
    }
    out.update(fit_ramp(out["gaps_s"], out["extra_s"], nbytes))
    return out
