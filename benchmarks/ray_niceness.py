"""Who gets a core first on a crowded Ray node: the driver (nice 0) before Ray's workers (nice 15)

Ray starts every worker process at ``worker_niceness`` (``src/ray/common/ray_config_def.h``: 15, "so that the
OS prioritizes CPU for other processes over worker"), and leaves the driver at the nice it was started with.
The simulator's crowded-node model (``conduit.sim.resources.CpuPool``: who runs first) rests on that: the
driver's process (its thread, a local learner's update and torch team) runs before any worker. This prints:

* the nice value of the driver and of a Ray actor, read from ``/proc/<pid>/stat``;
* the round trip of an empty actor call (``ray.get(actor.f.remote())``, a 5 ms sleep between calls) with the
  cores idle, beside as many busy processes at the driver's nice as cores (``conduit.runtime.contention.
  Neighbours``), beside as many busy Ray actors (nice 15: the actor's peers), and beside one nice-0 process with
  Ray actors on the other cores (a local learner's spinning torch thread beside a sampling EnvRunner), in
  alternating windows.

2026-12-07 on the 2-core VM: driver nice 0, actor 15; round trip median 1.33-1.65 ms idle, **9.8-10.7 ms**
beside two nice-0 processes (the actor waits for their slices), 1.56-1.78 ms beside two busy Ray actors; at
04:03, 0.94 ms idle, 9.79 beside two nice-0 processes, 1.60 beside two Ray actors and **1.50 ms** (mean 1.65)
beside one nice-0 process and one Ray actor: one core left to the workers is enough for a call's hops.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/ray_niceness.py [--windows 3] [--calls 100]   # ~30 s
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def nice_of(pid: int) -> int:
    """The nice value of a process (``/proc/<pid>/stat``, field 19)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[16])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, default=3, help="windows of each kind")
    p.add_argument("--calls", type=int, default=100, help="calls per window")
    a = p.parse_args(argv)
    if a.windows < 1 or a.calls < 1:
        p.error("--windows and --calls must be at least 1")
    if not Path("/proc/self/stat").exists():
        p.error("needs /proc (Linux)")
    import ray
    from _ray_echo import echo_actor

    from conduit.runtime.contention import Neighbours, _learner_like_update

    Echo = echo_actor(ray)

    @ray.remote(num_cpus=0)
    class Busy:
        def run(self, seconds: float) -> int:
            import torch

            torch.set_num_threads(1)
            update, start, n = _learner_like_update(), time.perf_counter(), 0
            while time.perf_counter() - start < seconds:
                n += update()
            return n

    cores = len(os.sched_getaffinity(0))
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray_niceness_"))
    try:
        echo = Echo.remote()
        actor_pid = ray.get(echo.pid.remote())
        print(f"{cores} cores; nice: driver {nice_of(os.getpid())}, Ray actor {nice_of(actor_pid)}")

        def window() -> list[float]:
            out = []
            for _ in range(a.calls):
                time.sleep(0.005)
                t = time.perf_counter()
                ray.get(echo.f.remote())
                out.append(time.perf_counter() - t)
            return out

        mixed = "beside one nice-0 process, the rest Ray actors"
        times: dict[str, list[float]] = {"idle": [], "beside nice-0 processes": [], "beside busy Ray actors": [],
                                         mixed: []}
        busy = [Busy.remote() for _ in range(cores)]
        ray.get([b.run.remote(0.5) for b in busy])  # torch imported, first updates done
        with Neighbours(cores) as crowd, Neighbours(1) as lone:
            for i in range(a.windows):
                for kind in (list(times) if i % 2 == 0 else list(reversed(times))):
                    crowd.busy(kind == "beside nice-0 processes")
                    lone.busy(kind == mixed)
                    actors = busy if kind == "beside busy Ray actors" else busy[1:] if kind == mixed else []
                    refs = [b.run.remote(a.calls * 0.008 + 0.5) for b in actors]
                    if refs:
                        time.sleep(0.3)
                    times[kind] += window()
                    ray.get(refs)
        for kind, v in times.items():
            q = statistics.quantiles(v, n=20)
            print(f"round trip {kind:<24} median {statistics.median(v) * 1e3:7.3f} ms   mean "
                  f"{statistics.fmean(v) * 1e3:7.3f} ms   p95 {q[-1] * 1e3:7.3f} ms   ({len(v)} calls)")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
