"""CPU a never-sleeping Ray driver loop costs (issue 13, APPO on 2 cores).

``IMPALA.training_step`` runs in a loop (``Algorithm._run_one_training_iteration``) and its
``EnvRunnerGroup.fetch_ready_async_reqs`` calls ``ray.wait(..., timeout=0)`` on the pending sample
requests (``timeout_s_sampler_manager=0.0``). Timed here: that wait alone, in a tight loop on a pending
call of an idle actor, for 5 s, against a driver that sleeps; per process CPU time (the driver, the
actor, raylet, GCS: read from /proc, so other load on the machine does not count), in cores.
It does not include the rest of ``training_step``'s Python work per pass.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/driver_wait_loop.py
"""

from __future__ import annotations

import glob
import os
import tempfile
import time

HZ = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def main(seconds: float = 5.0) -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    tmp = tempfile.mkdtemp(prefix="waitloop")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
    try:
        @ray.remote(num_cpus=0.5)
        class Idle:
            def sleep(self, s: float) -> int:
                time.sleep(s)
                return 1

            def pid(self) -> int:
                return os.getpid()

        actor = Idle.remote()
        apid, mine = ray.get(actor.pid.remote()), os.getpid()
        pids = [mine, apid] + [int(d.split("/")[2]) for d in glob.glob("/proc/[0-9]*")
                               if tmp in _cmd(int(d.split("/")[2])) and int(d.split("/")[2]) not in (mine, apid)]
        names = {p: "driver" if p == mine else "actor" if p == apid else _cmd(p).split()[0].split("/")[-1]
                 for p in pids}

        def cpu() -> dict[int, float]:
            out = {}
            for p in pids:
                try:
                    out[p] = _cpu_of(p)
                except OSError:
                    pass
            return out

        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        for label in ("driver sleeps", "ray.wait(timeout=0) loop"):
            ref = actor.sleep.remote(seconds + 1)
            c0, t0, loops = cpu(), time.time(), 0
            while time.time() - t0 < seconds:
                if label == "driver sleeps":
                    time.sleep(0.05)
                else:
                    ray.wait([ref], timeout=0)
                    loops += 1
            c1, dt = cpu(), time.time() - t0
            per = {names[p]: (c1[p] - c0[p]) / dt for p in c1 if p in c0}
            top = ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items(), key=lambda x: -x[1])[:4])
            print(f"{label}: {loops} loops; cores busy {sum(per.values()):.2f} ({top})")
            ray.get(ref)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
