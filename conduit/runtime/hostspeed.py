"""How fast this host runs a fixed piece of work now: a probe that makes two moments comparable.

A shared or virtualised machine does not run at one speed. On the 2-core development VM the same
EnvRunner microbenchmark (``env_runner:ppo-largeobs``) read 1.64 ms per step one evening and 1.93 ms
the next night, with nothing else running and no steal time reported by the guest. Calibrated
primitives predict a real run only if both were taken at the same host speed, so the probe is taken
with each, and a validation report says how far apart they were instead of counting the host's drift
as the model's error.

The work is fixed (the same operations, sizes and seed every time) and mixes what an RL experience
path spends CPU on: interpreted Python (RLlib's per-step bookkeeping), fresh numpy arrays
(observations: allocation and the page faults of new memory) and, where torch is installed, a
one-thread convolution (an RLModule's forward pass). It is timed in process CPU seconds, so other
tenants' time on a core does not count, only their effect on the speed of this work; each part is the
median of ``reps`` runs.

It tracks the host only in part: between 01:56 and 02:50 one night it moved +7% while the EnvRunner
microbenchmark moved +24%, and between 2026-12-05 and 12-06 it moved 4-7% while the same APPO
``Learner.update`` moved +40%. A drift it reports is a lower bound; the faithful probes are the workloads'
own primitives (the EnvRunner sweep and the learner update) re-timed next to the runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import numpy as np

#: a drift beyond this fraction is worth a warning: comparable to the validation's targets
DRIFT_WARNING = 0.05


def _python_part() -> None:
    counts: dict[int, int] = {}
    for i in range(1_500_000):
        key = i % 97
        counts[key] = counts.get(key, 0) + i


def _numpy_part() -> None:
    rng = np.random.default_rng(0)
    for _ in range(3):
        obs = rng.integers(0, 255, size=(256, 84, 84, 4), dtype=np.uint8)  # 7 MB of fresh observations
        obs.astype(np.float32).sum()


def _torch_part() -> Callable[[], None] | None:
    try:
        import torch
    except ImportError:
        return None
    gen = torch.Generator().manual_seed(0)
    conv = torch.nn.Conv2d(4, 16, 8, stride=4)
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.rand(p.shape, generator=gen))
    x = torch.rand(64, 4, 84, 84, generator=gen)

    def run() -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                for _ in range(40):
                    conv(x)
        finally:
            torch.set_num_threads(threads)

    return run


def probe(reps: int = 3) -> dict[str, float]:
    """CPU seconds of the fixed work on this host now: ``{"total_s", "python_s", "numpy_s", "torch_s"}``
    (``torch_s`` absent without torch); each part the median of ``reps`` runs after one warm-up, the
    total their sum. About 0.5 s per run, 2 s in all, on the development machine."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    parts: dict[str, Callable[[], None]] = {"python_s": _python_part, "numpy_s": _numpy_part}
    if (torch_run := _torch_part()) is not None:
        parts["torch_s"] = torch_run
    out: dict[str, float] = {}
    for name, work in parts.items():
        work()  # warm-up: first-call paths, allocator
        times = []
        for _ in range(reps):
            c0 = time.process_time()
            work()
            times.append(time.process_time() - c0)
        out[name] = statistics.median(times)
    out["total_s"] = sum(out.values())
    return out


def drift(reference: Mapping[str, float], now: Mapping[str, float]) -> float:
    """How much slower (positive) or faster (negative) the host ran the probe ``now`` than at ``reference``:
    ``now / reference - 1`` on the parts both have (a probe without torch compares with one that had it)."""
    shared = [k for k in ("python_s", "numpy_s", "torch_s") if k in reference and k in now]
    if not shared:
        raise ValueError("the two probes share no part")
    ref = sum(float(reference[k]) for k in shared)
    if ref <= 0:
        raise ValueError(f"reference probe must be positive, got {ref}")
    return sum(float(now[k]) for k in shared) / ref - 1.0
