"""Microbenchmarks of the plane's own primitives, the source of :class:`~conduit.sim.params.PlaneCosts`.

Runs :func:`conduit.runtime.calibrate.measure_plane` (in-process ``ExperiencePlane.ingest`` and
``next_batch`` per call and per byte, a prioritized Replay table's draw and priority update per call and
per row, a Ray ``PlaneActor``'s round trip and its process's CPU per call, memcpy) and writes the same
JSON as ``conduit calibrate --plane-json FILE``; ``conduit sim --plane-costs FILE`` reads either. No
end-to-end run feeds any figure.

``--only NAME ...`` keeps those measurements of the run; with ``--merge`` they replace their namesakes in
the ``--out`` file, whose other measurements and host facts stay, and the file's ``notes`` record which
were added when and on which host (a primitive the model newly reads, measured without re-measuring the
ones the committed results rest on). ``--runs N`` (with ``--only``) measures N times, one run after the
other, and keeps for each named measurement the run whose per-call figure (``latency``) is the median (the
lower of the two middle ones for an even N); the note gives every run's figure, so a reader sees the spread
(a cold-call surcharge is a difference of two medians and moves from one run to the next).

    RAY_AUTH_MODE=disabled python benchmarks/plane_primitives.py [--out FILE] [--quick]
    RAY_AUTH_MODE=disabled python benchmarks/plane_primitives.py --out benchmarks/plane_primitives.2core-vm.json \\
        --merge --only plane_actor_callee plane_replay_draw plane_replay_priorities
    RAY_AUTH_MODE=disabled python benchmarks/plane_primitives.py --out benchmarks/plane_primitives.2core-vm.json \\
        --merge --runs 3 --only plane_actor_call_cold plane_actor_callee_cold plane_replay_draw_cold \\
        plane_replay_priorities_cold
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path


def merged(old: dict, new: dict, names: list[str], how: str = "") -> dict:
    """``old`` (a plane-primitives file) with ``names`` taken from ``new`` and a note saying so (``how``: how
    ``new`` was chosen among several runs, :func:`median_runs`)."""
    out = dict(old)
    out["measurements"] = {**old.get("measurements", {}), **{n: new["measurements"][n] for n in names}}
    host = new.get("host", {})
    note = (f"{', '.join(names)}: measured {host.get('date', datetime.datetime.now(datetime.UTC).isoformat())} on "
            f"{host.get('hostname', '?')} ({host.get('cpu_model', '?')}, {host.get('cores', '?')} cores) by "
            f"benchmarks/plane_primitives.py --merge{how}; "
            f"the other measurements are the host's above")
    out["notes"] = [*old.get("notes", []), note]
    return out


def median_runs(runs: list[dict], names: list[str]) -> tuple[dict, str]:
    """Of several runs' files (the same measurements, one after the other), one holding for each of ``names`` the
    run whose ``latency`` is the median (``statistics.median_low``), with the first run's host facts; and the
    note's words for it: every run's figure, in order, and which run each kept figure came from."""
    data = {**runs[0], "measurements": dict(runs[0]["measurements"])}
    parts = []
    for name in names:
        figures = [float(run["measurements"][name]["latency"]) for run in runs]
        pick = figures.index(statistics.median_low(figures))
        data["measurements"][name] = runs[pick]["measurements"][name]
        parts.append(f"{name} from run {pick + 1} (" + ", ".join(f"{f * 1e3:.3f}" for f in figures) + " ms)")
    return data, f" --runs {len(runs)}, each figure the median run's: {'; '.join(parts)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/plane_primitives.json"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="keep only these measurements")
    parser.add_argument("--merge", action="store_true", help="replace only the measured ones in --out (needs --only)")
    parser.add_argument("--runs", type=int, default=1,
                        help="with --only: measure this many times and keep each measurement's median run")
    args = parser.parse_args(argv)
    if args.merge and not args.only:
        parser.error("--merge needs --only: say which measurements replace the file's")
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    if args.runs > 1 and not args.only:
        parser.error("--runs needs --only: say which measurements are chosen by their median run")
    if args.merge and not args.out.is_file():
        parser.error(f"--merge: {args.out} does not exist")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from conduit.runtime.calibrate import measure_plane, to_json

    runs = []
    for run in range(args.runs):
        if args.runs > 1:
            print(f"run {run + 1} of {args.runs}")
        data = json.loads(to_json(measure_plane(quick=args.quick, progress=print)))
        if args.only:
            unknown = sorted(set(args.only) - set(data["measurements"]))
            if unknown:
                print(f"--only: not measured by this run: {', '.join(unknown)} (measured: "
                      f"{', '.join(sorted(data['measurements']))})", file=sys.stderr)
                return 2
            failed = [n for n in args.only if not data["measurements"][n].get("samples")]
            if failed:
                print(f"--only: {', '.join(failed)} could not be measured; {args.out} is left as it was",
                      file=sys.stderr)
                return 1
        runs.append(data)
    how = ""
    if args.runs > 1:
        data, how = median_runs(runs, args.only)
        print(how.strip())
    if args.only:
        if args.merge:
            data = merged(json.loads(args.out.read_text()), data, args.only, how)
        else:
            data["measurements"] = {n: data["measurements"][n] for n in args.only}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
