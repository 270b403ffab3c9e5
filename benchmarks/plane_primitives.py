"""Microbenchmarks of the plane's own primitives, the source of :class:`~conduit.sim.params.PlaneCosts`.

Runs :func:`conduit.runtime.calibrate.measure_plane` (in-process ``ExperiencePlane.ingest`` and
``next_batch`` per call and per byte, a prioritized Replay table's draw and priority update per call and
per row, a Ray ``PlaneActor``'s round trip and its process's CPU per call, memcpy) and writes the same
JSON as ``conduit calibrate --plane-json FILE``; ``conduit sim --plane-costs FILE`` reads either. No
end-to-end run feeds any figure.

``--only NAME ...`` keeps those measurements of the run; with ``--merge`` they replace their namesakes in
the ``--out`` file, whose other measurements and host facts stay, and the file's ``notes`` record which
were added when and on which host (a primitive the model newly reads, measured without re-measuring the
ones the committed results rest on).

    RAY_AUTH_MODE=disabled python benchmarks/plane_primitives.py [--out FILE] [--quick]
    RAY_AUTH_MODE=disabled python benchmarks/plane_primitives.py --out benchmarks/plane_primitives.2core-vm.json \\
        --merge --only plane_actor_callee plane_replay_draw plane_replay_priorities
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path


def merged(old: dict, new: dict, names: list[str]) -> dict:
    """``old`` (a plane-primitives file) with ``names`` taken from ``new`` and a note saying so."""
    out = dict(old)
    out["measurements"] = {**old.get("measurements", {}), **{n: new["measurements"][n] for n in names}}
    host = new.get("host", {})
    note = (f"{', '.join(names)}: measured {host.get('date', datetime.datetime.now(datetime.UTC).isoformat())} on "
            f"{host.get('hostname', '?')} ({host.get('cpu_model', '?')}, {host.get('cores', '?')} cores) by "
            f"benchmarks/plane_primitives.py --merge; "
            f"the other measurements are the host's above")
    out["notes"] = [*old.get("notes", []), note]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/plane_primitives.json"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="keep only these measurements")
    parser.add_argument("--merge", action="store_true", help="replace only the measured ones in --out (needs --only)")
    args = parser.parse_args(argv)
    if args.merge and not args.only:
        parser.error("--merge needs --only: say which measurements replace the file's")
    if args.merge and not args.out.is_file():
        parser.error(f"--merge: {args.out} does not exist")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from conduit.runtime.calibrate import measure_plane, to_json

    measurements = measure_plane(quick=args.quick, progress=print)
    data = json.loads(to_json(measurements))
    if args.only:
        unknown = sorted(set(args.only) - set(data["measurements"]))
        if unknown:
            print(f"--only: not measured by this run: {', '.join(unknown)} (measured: "
                  f"{', '.join(sorted(data['measurements']))})", file=sys.stderr)
            return 2
        failed = [n for n in args.only if not data["measurements"][n].get("samples")]
        if failed:
            print(f"--only: {', '.join(failed)} could not be measured; {args.out} is left as it was", file=sys.stderr)
            return 1
        if args.merge:
            data = merged(json.loads(args.out.read_text()), data, args.only)
        else:
            data["measurements"] = {n: data["measurements"][n] for n in args.only}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
