"""The callee of the Ray call benchmarks (``ray_niceness.py``, ``call_gap.py``): an actor whose method does
nothing, so a call's round trip and CPU are Ray's own. Imported as ``_ray_echo`` (``python benchmarks/X.py`` puts
``benchmarks/`` on the path)."""

from __future__ import annotations

import os
import time
from typing import Any


def spin(seconds: float) -> None:
    """Compute (a Python loop on this thread) for ``seconds`` of wall time."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def echo_actor(ray: Any) -> Any:
    """A Ray actor class (``num_cpus=0``) with ``pid()``, an empty ``f()`` and ``work(seconds)``, which computes
    that long before it returns."""

    @ray.remote(num_cpus=0)
    class Echo:
        def pid(self) -> int:
            return os.getpid()

        def f(self) -> None:
            return None

        def work(self, seconds: float) -> None:
            spin(seconds)

    return Echo
