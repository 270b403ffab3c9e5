"""How soon a woken thread gets a core on a crowded node, and for how long (issue 13: the data path's hops)

Runs :func:`conduit.runtime.wakeup.measure` (its docstring has the method: a thread that sleeps and wakes, beside
as many busy learner-like processes as cores, switched off and on in paired windows) and prints the figures the
simulator reads from the calibrated topology's CPU: ``wake_latency`` (how long a woken thread waits for a core,
less the timer's own overshoot) and ``wake_slice_time`` (how long it then runs before it shares the core).
``--json FILE`` writes them; ``--into FILE`` adds them as the ``wakeup`` block of a contention file
(``benchmarks/contention_cpu.py --json``, which ``studies/validation.py --contention`` reads).

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/wake_latency.py [--pairs 8] [--wakes 40]
        [--neighbours K] [--json FILE] [--into CONTENTION_FILE]                               # ~20 s
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=8, help="idle/busy pairs of windows")
    p.add_argument("--wakes", type=int, default=40, help="wakes per window")
    p.add_argument("--neighbours", type=int, help="busy processes (default: the cores)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--into", type=Path, help="add the figures as the 'wakeup' block of this contention file")
    a = p.parse_args(argv)
    if a.pairs < 1:
        p.error("--pairs must be at least 1")
    if a.wakes < 1:
        p.error("--wakes must be at least 1")
    if a.neighbours is not None and a.neighbours < 1:
        p.error("--neighbours must be at least 1 (the figures are those of a crowded node)")
    contention = None
    if a.into is not None:  # read (and check) before measuring: a bad file costs nothing
        try:
            contention = json.loads(a.into.read_text())
        except (OSError, ValueError) as exc:
            p.error(f"--into: cannot read {a.into}: {exc}")
        if not isinstance(contention, dict):
            p.error(f"--into: {a.into}: not a contention file (a JSON object)")
    from conduit.runtime.wakeup import measure

    print(f"{a.pairs} pairs of {a.wakes} wakes, {len(os.sched_getaffinity(0))} cores, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    out = measure(pairs=a.pairs, wakes=a.wakes, neighbours=a.neighbours)

    def ms(q: list[float]) -> str:
        return ", ".join(f"{v * 1e3:.3f}" for v in q)

    print(f"wake latency, busy: quartiles {ms(out['latency_busy_quartiles'])} ms, mean "
          f"{out['latency_busy_mean'] * 1e3:.3f} ms; idle (the timer's own): mean {out['latency_idle_mean'] * 1e3:.3f} ms")
    print(f"first run before sharing the core: quartiles {ms(out['first_run_quartiles'])} ms; "
          f"preempted {out['preempted_share']:.0%}")
    print(f"wake_latency: {out['wake_latency'] * 1e3:.3f} ms   wake_slice_time: {out['wake_slice_time'] * 1e3:.3f} ms")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"written {a.json}")
    if contention is not None:
        contention["wakeup"] = out
        a.into.write_text(json.dumps(contention, indent=1) + "\n")
        print(f"added as 'wakeup' to {a.into}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
