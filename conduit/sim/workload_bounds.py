"""Plausible ranges of workload fields: refused when impossible, a warning when implausible.

:meth:`Workload.validate <conduit.sim.workload.Workload.validate>` calls :func:`check_bounds` last and
raises the refusal it returns. This module imports nothing from :mod:`conduit.sim.workload` (which
imports it while validating its presets). The table is in ``docs/workload-format.md``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from conduit.units import Kind, format_quantity

log = logging.getLogger("conduit")


@dataclass(frozen=True)
class Bound:
    """``warn_above``: implausible (a warning); ``refuse_above``: refused (a :class:`WorkloadError`)."""

    field: str
    warn_above: float | None
    refuse_above: float | None
    why: str
    warn_below: float | None = None


#: Plausible ranges. Refusal limits are far outside any real run: beyond them the simulator would
#: model millions of runners or chunks of petabytes, i.e. exhaust memory or never finish. Derived
#: quantities (``chunk_steps``, ``chunk_bytes``) are checked too.
BOUNDS: tuple[Bound, ...] = (
    Bound("runners_per_gpu", 64, 256, "a runner is a process with its own CPU share; a DGX H100 has 224 "
          "hardware threads for 8 GPUs (28 per GPU), and RLlib deployments run a handful of runners per GPU"),
    Bound("env_runners", 65_536, 1_048_576, "64 runners per GPU on the 1,024-GPU library topology is 65,536"),
    Bound("envs_per_runner", 4_096, 1_048_576, "vectorised runners step tens to a few hundred environments"),
    Bound("frame_stack", 16, 1_024, "Atari recipes stack 4 frames"),
    Bound("fragment_length", 65_536, 16_777_216, "RLlib fragments are tens to thousands of steps "
          "(grpo-llm: 8,192 tokens)"),
    Bound("chunk_steps", 16_777_216, 2**31, "samples per chunk; grpo-llm has about 1 M"),
    Bound("bytes_per_step", 64 * 2**20, 2**40, "an Atari step is 28 KB, a stack of four 1080p RGB frames "
          "25 MB", warn_below=1.0),
    Bound("chunk_bytes", 16 * 2**30, 2**50, "a chunk must fit a GPU's memory to be trained on (80 GiB on an H100)"),
    Bound("learners", 65_536, 1_048_576, "one learner per GPU"),
    Bound("epochs", 100, 100_000, "PPO runs 1 to about 30 epochs"),
    Bound("env_step_time", 10.0, None, "seconds per vector step"),
    Bound("inference_time", 10.0, None, "seconds per vector step"),
    Bound("runner_call_overhead", 10.0, None, "seconds per fragment"),
    Bound("runner_metrics_time", 10.0, None, "seconds per sample() call"),
    Bound("update_time_per_sample", 0.1, None, "seconds per sample per epoch"),
    Bound("value_pass_per_sample", 0.1, None, "seconds per sample"),
    Bound("stream_value_pass_per_sample", 0.1, None, "seconds per sample"),
    Bound("advantage_per_sample", 0.1, None, "seconds per sample"),
    Bound("update_overhead", 60.0, None, "seconds per update"),
    Bound("weight_sync_time", 600.0, None, "seconds per broadcast"),
    Bound("weight_set_time", 600.0, None, "seconds per broadcast"),
    Bound("env_step_cv", 10.0, None, "a coefficient of variation"),
    Bound("max_lag", 1_000, None, "policy versions of staleness"),
    Bound("replay_ratio", 1_024, None, "sampled per inserted sample"),
)

_warned: set[tuple[str, float]] = set()


_TIMES = {"env_step_time", "inference_time", "runner_call_overhead", "runner_metrics_time", "update_time_per_sample",
          "value_pass_per_sample", "stream_value_pass_per_sample", "advantage_per_sample", "update_overhead", "weight_sync_time",
          "weight_set_time"}


def show_bound(name: str, value: float) -> str:
    if name in ("bytes_per_step", "chunk_bytes"):
        return format_quantity(value, Kind.BYTES) if value >= 1024 else f"{value:g} B"
    if name in _TIMES:
        return f"{value:g} s"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:g}"


def check_bounds(workload: Any, source: str = "<workload>") -> tuple[str, str] | None:
    """Warn once per (field, value) about implausible values; return ``(field, message)`` for the first
    impossible one (the caller raises :class:`~conduit.sim.workload.WorkloadError`), else ``None``."""
    for b in BOUNDS:
        value = getattr(workload, b.field)
        if value is None or not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
            continue
        if b.refuse_above is not None and value > b.refuse_above:
            return b.field, (f"{show_bound(b.field, value)} is above the limit {show_bound(b.field, b.refuse_above)} "
                             f"({b.why}); see docs/workload-format.md")
        implausible = ((b.warn_above is not None and value > b.warn_above)
                       or (b.warn_below is not None and value < b.warn_below))
        if implausible and (b.field, value) not in _warned:
            _warned.add((b.field, value))
            limit = (f"above {show_bound(b.field, b.warn_above)}" if b.warn_above is not None and value > b.warn_above
                     else f"below {show_bound(b.field, b.warn_below)}")
            log.warning("%s: %s: %s is implausible (%s: %s); simulating it anyway", source, b.field,
                        show_bound(b.field, value), limit, b.why)
    return None
