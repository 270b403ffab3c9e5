"""Per-chunk overhead of the experience plane for small chunks, against a raw numpy copy of the bytes.

Small chunks (``--sizes-kib``, 1 and 16 KiB by default, and a 1-row chunk) are where the plane's fixed
cost per chunk (schema check, the auditor, the placement policy, the lock, batch bookkeeping) shows,
not the copy. One plane per size (OnPolicy, one CPU learner, a batch of ``--chunks-per-batch``
chunks), created once and warmed up; each timed iteration ingests one batch's chunks (policy version
*k*), takes batch *k*, releases it and moves the version on. Two plane figures, in microseconds per
chunk:

* ``ingest``: time inside ``ingest`` calls only;
* ``ingest->delivered``: the whole iteration (ingest, ``next_batch``, ``release``,
  ``set_policy_version``) divided by the chunks in it;

against ``numpy``: copying the same chunks' columns with ``np.copyto`` into a preallocated batch
buffer (the bytes an ideal plane must move). ``overhead`` = plane - numpy. All three run side by side
in each repeat (alternating order); the figures are medians over ``--repeats``.

There is no pass/fail target here: the figure is the fixed cost a producer pays per chunk, which says
how small chunks may get before the plane, not the memory, limits throughput.

    .venv/bin/python benchmarks/runtime_small_chunks.py [--sizes-kib 1 16] [--rows 1] [--repeats 7]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from typing import Any

import numpy as np
from _plane_workload import make_payloads, make_schema, write_json

from conduit.contracts import OnPolicy
from conduit.runtime.plane import ExperiencePlane
from conduit.runtime.schema import Schema

KiB = 1 << 10


def run_case(schema: Schema, label: str, steps: int, args: argparse.Namespace) -> dict[str, Any]:
    n = args.chunks_per_batch
    payloads = make_payloads(schema, steps, n)
    dst_buf = np.ones(schema.extent_bytes(steps * n), dtype=np.uint8)
    dst = schema.views(dst_buf, steps * n)
    plane = ExperiencePlane(schema, OnPolicy(), batch_steps=steps * n, policy=args.policy,
                            capacities={"pageable": max(64 << 20, 8 * schema.extent_bytes(steps * n))},
                            prefetch_depth=args.prefetch_depth, verify_checksums=False)
    version = 0

    def numpy_copy() -> None:
        row = 0
        for p in payloads:
            for name, d in dst.items():
                np.copyto(d[row : row + steps], p[name], casting="no")
            row += steps

    def plane_iter() -> float:
        nonlocal version
        k = version
        t0 = time.perf_counter()
        for i, p in enumerate(payloads):
            plane.ingest(p, policy_version=k, chunk_id=(k, i))
        t_ingest = time.perf_counter() - t0
        b = plane.next_batch(timeout=30)
        if b.steps != steps * n:
            raise AssertionError(f"batch of {b.steps} rows, expected {steps * n}")
        b.release()
        version = k + 1
        plane.set_policy_version(version)
        return t_ingest

    try:
        for _ in range(args.warmup):
            plane_iter()
            numpy_copy()
        ingest_us, e2e_us, numpy_us = [], [], []
        for r in range(args.repeats):
            order = ("numpy", "plane") if r % 2 == 0 else ("plane", "numpy")
            for which in order:
                if which == "numpy":
                    t0 = time.perf_counter()
                    for _ in range(args.iters):
                        numpy_copy()
                    numpy_us.append(1e6 * (time.perf_counter() - t0) / (args.iters * n))
                else:
                    t_in = 0.0
                    t0 = time.perf_counter()
                    for _ in range(args.iters):
                        t_in += plane_iter()
                    e2e_us.append(1e6 * (time.perf_counter() - t0) / (args.iters * n))
                    ingest_us.append(1e6 * t_in / (args.iters * n))
        profile = None
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.iters):
                plane_iter()
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
            profile = s.getvalue()
        m = plane.metrics()
    finally:
        plane.close()
    med_np, med_in, med_e2e = statistics.median(numpy_us), statistics.median(ingest_us), statistics.median(e2e_us)
    return {
        "case": label, "steps": steps, "chunk_bytes": schema.payload_bytes(steps), "chunks_per_batch": n,
        "numpy_us": numpy_us, "ingest_us": ingest_us, "e2e_us": e2e_us,
        "numpy_us_median": med_np, "ingest_us_median": med_in, "e2e_us_median": med_e2e,
        "ingest_overhead_us": med_in - med_np, "e2e_overhead_us": med_e2e - med_np,
        "e2e_ratio": med_e2e / med_np, "chunks_per_s": 1e6 / med_e2e,
        "moves": m.get("moves", 0), "ingested_chunks": m.get("ingested_chunks", 0),
        "profile": profile,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-kib", type=float, nargs="+", default=[1, 16], help="chunk payload sizes (KiB)")
    parser.add_argument("--rows", type=int, nargs="*", default=[1], help="also chunks of exactly this many rows")
    parser.add_argument("--obs-dim", type=int, default=32, help="float32 observation width (sets step bytes)")
    parser.add_argument("--chunks-per-batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iters", type=int, default=8, help="batches timed per repeat")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--prefetch-depth", type=int, default=None)
    parser.add_argument("--policy", default="conduit")
    parser.add_argument("--profile", action="store_true", help="cProfile the plane loop (by own time)")
    parser.add_argument("--json", default="results/runtime_small_chunks.json", help="write results here ('' : don't)")
    args = parser.parse_args()

    schema = make_schema(args.obs_dim)
    cases = [(f"{s:g} KiB", max(1, int(s * KiB) // schema.step_bytes)) for s in args.sizes_kib]
    cases += [(f"{r} row{'s' if r != 1 else ''}", r) for r in args.rows]
    print(f"schema: {len(schema.columns)} columns, {schema.step_bytes} B/step; OnPolicy, 1 CPU learner, "
          f"{args.chunks_per_batch} chunks/batch; {args.repeats} repeats x {args.iters} batches")
    rows = [run_case(schema, label, steps, args) for label, steps in cases]

    print()
    print(f"{'chunk':>9} {'rows':>5} {'bytes':>7} {'numpy us':>9} {'ingest us':>10} {'ingest->deliv us':>17} "
          f"{'overhead us':>12} {'x numpy':>8} {'chunks/s':>9}")
    for r in rows:
        print(f"{r['case']:>9} {r['steps']:>5} {r['chunk_bytes']:>7} {r['numpy_us_median']:>9.2f} "
              f"{r['ingest_us_median']:>10.1f} {r['e2e_us_median']:>17.1f} {r['e2e_overhead_us']:>12.1f} "
              f"{r['e2e_ratio']:>8.0f} {r['chunks_per_s']:>9,.0f}")
    print(f"(per chunk, medians over {args.repeats} repeats; overhead = ingest->delivered - numpy copy of the same "
          "bytes; x numpy = ingest->delivered / numpy)")
    for r in rows:
        if r["profile"]:
            print(f"\ncProfile of {args.iters} plane batches, {r['case']} chunks (by own time):\n{r['profile']}")
    if args.json:
        write_json(args.json, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
