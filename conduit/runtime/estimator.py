"""Online bandwidth estimation: what copies really cost, learned from the copies themselves.

Every copy the transfer engine makes is a measurement ``(bytes, seconds)`` of one route (a source
tier and a destination tier). :class:`LinkEstimate` fits ``seconds = latency + bytes / bandwidth``
to them by least squares with exponential forgetting: it keeps exponentially weighted moments of
bytes, seconds, bytes² and bytes·seconds, so the fit follows a machine whose load changes (another
job on the PCIe switch, a NUMA-remote buffer) while staying robust to single outliers. With only
similar-sized copies the slope is ill-conditioned; then the estimate keeps the prior latency and
takes the bandwidth from the weighted mean rate. A prior (from the topology or ``conduit
calibrate``) enters as pseudo-observations, so the first decisions are sensible and live numbers
take over after a handful of copies.

:class:`BandwidthEstimator` holds one estimate per route and is what the runtime's
:class:`~conduit.view.ClusterView` reads, so the same policies decide from live numbers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class LinkEstimate:
    """Exponentially forgetting least-squares fit of ``t = latency + bytes / bandwidth``."""

    prior_bandwidth: float
    prior_latency: float = 0.0
    alpha: float = 0.2
    weight: float = 0.0
    samples: int = 0
    _m_n: float = 0.0
    _m_t: float = 0.0
    _m_nn: float = 0.0
    _m_nt: float = 0.0
    _m_rate: float = 0.0

    def __post_init__(self) -> None:
        # two pseudo-observations spanning four orders of magnitude pin the prior line
        for n in (64e3, 640e6):
            self._add(n, self.prior_latency + n / self.prior_bandwidth, 0.5)
        self.samples = 0

    def _add(self, nbytes: float, seconds: float, w: float) -> None:
        total = self.weight + w
        a = w / total
        self._m_n += a * (nbytes - self._m_n)
        self._m_t += a * (seconds - self._m_t)
        self._m_nn += a * (nbytes * nbytes - self._m_nn)
        self._m_nt += a * (nbytes * seconds - self._m_nt)
        self._m_rate += a * (nbytes / max(seconds, 1e-12) - self._m_rate)
        self.weight = total

    def observe(self, nbytes: float, seconds: float) -> None:
        if nbytes <= 0 or seconds <= 0:
            return
        # forgetting: old weight decays so each new copy carries about ``alpha`` of the total
        self.weight *= 1.0 - self.alpha
        self._add(float(nbytes), float(seconds), self.alpha)
        self.samples += 1

    @property
    def bandwidth(self) -> float:
        var = self._m_nn - self._m_n**2
        if var > (0.05 * self._m_n) ** 2:
            slope = (self._m_nt - self._m_n * self._m_t) / var
            if slope > 0:
                return 1.0 / slope
        return max(self._m_rate, 1.0)

    @property
    def latency(self) -> float:
        lat = self._m_t - self._m_n / self.bandwidth
        return max(lat, 0.0)


class BandwidthEstimator:
    """One :class:`LinkEstimate` per route ``(src, dst)``, created from a prior on first use."""

    def __init__(self, alpha: float = 0.2):
        self.alpha = alpha
        self._routes: dict[tuple[str, str], LinkEstimate] = {}
        self._lock = threading.Lock()
        self.generation = 0  # bumped by every observation: readers cache derived numbers against it

    def prior(self, src: str, dst: str, bandwidth: float, latency: float = 0.0) -> None:
        """Seed a route (replaces any estimate it had)."""
        with self._lock:
            self._routes[(src, dst)] = LinkEstimate(bandwidth, latency, self.alpha)

    def observe(self, src: str, dst: str, nbytes: float, seconds: float,
                default: tuple[float, float] = (10e9, 0.0)) -> None:
        with self._lock:
            est = self._routes.get((src, dst))
            if est is None:
                est = self._routes[(src, dst)] = LinkEstimate(default[0], default[1], self.alpha)
            est.observe(nbytes, seconds)
            self.generation += 1

    def get(self, src: str, dst: str) -> LinkEstimate | None:
        return self._routes.get((src, dst))

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Current estimates, for metrics: ``{"src->dst": {bandwidth, latency, samples}}``."""
        with self._lock:
            return {f"{s}->{d}": {"bandwidth": e.bandwidth, "latency": e.latency, "samples": e.samples}
                    for (s, d), e in self._routes.items()}
