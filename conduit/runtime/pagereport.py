"""How much freed memory this virtual machine handed back to its host: free page reporting, read from sysfs.

A guest kernel with free page reporting (``virtio_balloon``'s REPORTING feature, ``mm/page_reporting.c``)
tells the hypervisor which of its free pages it may take back. A page the host took back costs more the next
time the guest faults it in: the host must supply and zero a page first, and the guest sees that time as
system time of the faulting thread, on the same count of minor faults.

That is the PPO large-obs GAE piece's extra cost (issue 13). RLlib's ``GeneralAdvantageEstimation`` faults in
about 190 thousand fresh 4 KiB pages per call on 2,000 steps of 84x84x4 observations (the value pass's
activations, above glibc's mmap threshold, so every call maps them afresh). On the 2-core development VM
(kernel ``6.18.44-fc``: ``min_free_ms`` 0, so freed memory is reported as soon as ``max_waiting_mib`` of it has
gathered, system-wide), 2026-12-07 17:56, twelve calls in two processes, nothing else running:

| the GAE piece's call | wall | system time |
|---|---:|---:|
| no memory reported in the 3-4 s before it | 0.44-0.45 s | 0.26-0.29 s |
| 126-228 MB reported in the 3-4 s before it | 0.83-1.19 s | 0.67-1.05 s |

The real learner actor's piece took 0.97-1.29 s in every validation window, where the calibration usually
timed 0.45-0.59 s: a real run's processes free far more memory per iteration than one calibrating process, so
the learner meets reported pages. Reporting alone does not decide it (a call right after 924 MB were reported
by a flush of another mapping stayed at 0.44 s): the pages the call is handed, and what the host did with them,
do. This module only measures how much was reported, so that a report can say whether the calibration and the
runs it predicts saw the same condition; it changes nothing.

Where the kernel has no such counter (bare metal, another hypervisor, a kernel without the parameters)
:func:`snapshot` returns None and every figure derived from it is None: unknown, never 0.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

#: where the guest kernel's page reporting parameters live
PARAMETERS = Path("/sys/module/page_reporting/parameters")
#: the cumulative counter: KiB of free memory reported to the host since boot
COUNTER = "reported_kib"
#: the settings recorded next to the counter, where the kernel has them (``min_free_ms``: how long a page must
#: have been free before it is reported; ``max_waiting_mib``: how much freed memory may wait before a report;
#: ``page_reporting_order``: the smallest block reported, as a power of two pages)
SETTINGS = ("page_reporting_order", "min_free_ms", "max_waiting_mib")


@dataclass(frozen=True)
class Snapshot:
    """The counter at one moment (``time.monotonic()`` seconds) and the settings in force."""

    reported_kib: int
    at_s: float
    settings: Mapping[str, int] = field(default_factory=dict)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def snapshot(parameters: Path | None = None) -> Snapshot | None:
    """The counter now (in ``parameters``, default :data:`PARAMETERS`), or None where this kernel does not report
    free pages (or the counter is unreadable)."""
    parameters = PARAMETERS if parameters is None else parameters
    kib = _read_int(parameters / COUNTER)
    if kib is None or kib < 0:
        return None
    settings = {name: value for name in SETTINGS if (value := _read_int(parameters / name)) is not None}
    return Snapshot(reported_kib=kib, at_s=time.monotonic(), settings=settings)


def reported_between(before: Snapshot | None, after: Snapshot | None) -> dict[str, Any] | None:
    """``{"mb", "seconds", "mb_per_s", "settings"}`` reported between two snapshots; None when either is
    missing or the counter went backwards (a reboot between them: not one machine's interval)."""
    if before is None or after is None or after.reported_kib < before.reported_kib or after.at_s < before.at_s:
        return None
    mb = (after.reported_kib - before.reported_kib) / 1024
    seconds = after.at_s - before.at_s
    return {"mb": round(mb, 3), "seconds": round(seconds, 3),
            "mb_per_s": round(mb / seconds, 3) if seconds > 0 else None, "settings": dict(after.settings)}


class Watch:
    """Memory reported to the host over a block: ``with Watch() as w: ...`` then ``w.result`` (None where
    unknown, see :func:`reported_between`)."""

    def __init__(self, parameters: Path | None = None):
        self.parameters = parameters
        self.before: Snapshot | None = None
        self.result: dict[str, Any] | None = None

    def __enter__(self) -> Self:
        self.before = snapshot(self.parameters)
        return self

    def __exit__(self, *exc: object) -> None:
        self.result = reported_between(self.before, snapshot(self.parameters))


def median_known(values: Iterable[Any]) -> float | None:
    """The median of the values that are known (not None, finite); None when none is."""
    got = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(got) if got else None


def call_summary(calls: list[Mapping[str, Any]], now: Snapshot | None) -> dict[str, Any]:
    """What a timed piece's calls met, for a calibration entry's ``extra``: per call its wall seconds, its
    thread's minor faults and system seconds, and the memory the VM reported in the round before it and
    during it (None: unknown); the medians of faults and system time; the reporting settings in force
    (``now``'s), and whether this kernel reports at all."""
    return {"calls": [dict(c) for c in calls], "faults_median": median_known(c.get("faults") for c in calls),
            "system_s_median": median_known(c.get("system_s") for c in calls), "page_reporting": now is not None,
            "settings": dict(now.settings) if now is not None else {}}
