"""Confidence intervals over seeds: ``conduit sim --seeds N``, :func:`simulate_seeds`.

One seed is one sample of the simulator's randomness (env-step times, replay draws). A figure worth
citing says how much it moves between seeds: :func:`simulate_seeds` runs seeds ``seed, seed + 1,
..., seed + N - 1`` of the same configuration and :class:`SeedSummary` reports, for every metric,
the mean over seeds, the sample standard deviation and a two-sided 95% confidence interval of the
mean from Student's t distribution with ``N - 1`` degrees of freedom (``mean +- t * s / sqrt(N)``;
the metric definitions themselves are docs/metrics.md's, unchanged, computed per seed). A metric
that is NaN for some seed (a run too short to have an iteration time) is summarised over the seeds
where it is finite, and ``n`` says how many.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conduit.errors import ConduitError, shown

#: the most seeds one call may run (a typo such as ``--seeds 10000`` is refused, not run for hours)
MAX_SEEDS = 1000
CONFIDENCE = 0.95


def check_seeds(seeds: Any) -> int:
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
        raise ConduitError(f"seeds must be an integer from 1 to {MAX_SEEDS} (runs, one per seed), got {shown(seeds)}")
    return seeds


def interval(values: list[float]) -> dict[str, Any]:
    """Mean, sample standard deviation and the 95% t interval of the mean of the finite values."""
    from scipy.stats import t

    x = np.array([v for v in values if isinstance(v, int | float) and math.isfinite(v)], dtype=float)
    n = int(x.size)
    if n == 0:
        return {"n": 0, "mean": math.nan, "std": math.nan, "half_width": math.nan, "ci95": [math.nan, math.nan]}
    mean = float(x.mean())
    if n == 1:
        return {"n": 1, "mean": mean, "std": math.nan, "half_width": math.nan, "ci95": [math.nan, math.nan]}
    std = float(x.std(ddof=1))
    half = float(t.ppf(0.5 + CONFIDENCE / 2, n - 1) * std / math.sqrt(n))
    return {"n": n, "mean": mean, "std": std, "half_width": half, "ci95": [mean - half, mean + half]}


@dataclass
class SeedSummary:
    """Runs of one configuration over several seeds, and their confidence intervals."""

    results: list[Any]
    seeds: list[int] = field(default_factory=list)

    @property
    def confidence(self) -> dict[str, dict[str, Any]]:
        """Per numeric metric: ``n``, ``mean``, ``std``, ``half_width``, ``ci95`` (see the module doc)."""
        names = [k for k, v in self.results[0].metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)]
        return {name: interval([r.metrics.get(name, math.nan) for r in self.results]) for name in names}

    @property
    def metrics(self) -> dict[str, float]:
        """The mean over seeds of each metric."""
        return {name: c["mean"] for name, c in self.confidence.items()}

    @property
    def violations(self) -> int:
        return sum(r.audit.violations for r in self.results)

    @property
    def warnings(self) -> list[str]:
        seen: list[str] = []
        for r in self.results:
            for w in r.warnings:
                if w not in seen:
                    seen.append(w)
        return seen

    def to_dict(self) -> dict[str, Any]:
        """One JSON object: ``metrics`` (means over seeds, the same names and definitions as a single
        run's), ``confidence`` per metric, ``audit.violations`` summed over seeds, ``runs`` (each
        seed's metrics and violations), and the first run's provenance (its seed replaced by the list)
        and validity; ``warnings`` merges every run's."""
        first = self.results[0].to_dict()
        provenance = dict(first["provenance"])
        provenance["seed"] = list(self.seeds)
        return {
            "topology": first["topology"], "workload": first["workload"], "policy": first["policy"],
            "seeds": list(self.seeds), "iterations": [r.iterations for r in self.results],
            "metrics": self.metrics,
            "confidence": self.confidence,
            "audit": {"violations": self.violations,
                      "by_seed": {str(s): r.audit.violations for s, r in zip(self.seeds, self.results, strict=True)}},
            "runs": [{"seed": s, "metrics": r.metrics, "violations": r.audit.violations,
                      "steady_state": r.steady_state} for s, r in zip(self.seeds, self.results, strict=True)],
            "warnings": self.warnings,
            "validity": first["validity"],
            "provenance": provenance,
        }


def simulate_seeds(topology: Any, workload: Any, policy: Any = "rllib-stock", *, seeds: int = 5, seed: int = 0,
                   progress: Callable[[int, int], None] | None = None, **kwargs: Any) -> SeedSummary:
    """Run :func:`~conduit.sim.run.simulate` for seeds ``seed .. seed + seeds - 1`` (every other
    argument as there) and summarise them (:class:`SeedSummary`). ``progress(done, total)`` counts seeds."""
    from conduit.sim.run import MAX_SEED, simulate

    check_seeds(seeds)
    if isinstance(seed, int) and not isinstance(seed, bool) and seed + seeds - 1 > MAX_SEED:
        raise ConduitError(f"seed {seed} plus {seeds} seeds runs past the largest seed (2**64 - 1)")
    results, used = [], []
    for i in range(seeds):
        results.append(simulate(topology, workload, policy, seed=seed + i, **kwargs))
        used.append(seed + i)
        if progress is not None:
            progress(i + 1, seeds)
    return SeedSummary(results, used)
