"""Microbenchmarks of the plane's own primitives, the source of :class:`~conduit.sim.params.PlaneCosts`.

Runs :func:`conduit.runtime.calibrate.measure_plane` (in-process ``ExperiencePlane.ingest`` and
``next_batch`` per call and per byte, a Ray ``PlaneActor`` round trip, memcpy) and writes the same JSON
as ``conduit calibrate --plane-json FILE``; ``conduit sim --plane-costs FILE`` reads either. No
end-to-end run feeds any figure.

    RAY_AUTH_MODE=disabled python benchmarks/plane_primitives.py [--out FILE] [--quick]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/plane_primitives.json"))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from conduit.runtime.calibrate import measure_plane, to_json

    measurements = measure_plane(quick=args.quick, progress=print)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(to_json(measurements) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
