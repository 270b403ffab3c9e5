"""Ingest -> deliver throughput of the experience plane for large chunks, against a plain memcpy.

One :class:`~conduit.runtime.plane.ExperiencePlane` per chunk size (OnPolicy, one CPU learner, a
batch of ``--chunks-per-batch`` chunks) is created once and warmed up; then every timed iteration
ingests the batch's chunks (policy version *k*), takes batch *k* with ``next_batch``, releases it and
moves the policy version on: the whole experience path of a PPO-like loop, from the producer's arrays
to a complete batch in the learner's memory. The baseline copies the same source arrays, column by
column, into a preallocated (already touched) batch buffer of the same layout with ``np.copyto``:
the one copy an ideal plane would make. Both run side by side in every repeat (alternating which goes
first, so drift and noise from other tenants hit both); each repeat times ``--iters`` batches and the
figures are medians over ``--repeats``.

Target: plane throughput >= 0.5 x memcpy (``--target``). The script prints GB/s for both, the ratio
and PASS/FAIL per chunk size, the time split between ``ingest`` calls and waiting in ``next_batch``,
the bytes the plane copied per byte ingested, and the plane's own metrics once (exposed
experience-path latency, live bandwidth estimates). ``--profile`` adds a cProfile of the plane loop.

    .venv/bin/python benchmarks/runtime_throughput.py [--sizes-mib 8 32] [--repeats 7] [--iters 4]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _plane_workload import make_payloads, make_schema

from conduit.contracts import OnPolicy
from conduit.runtime.plane import ExperiencePlane
from conduit.runtime.schema import Schema

MiB = 1 << 20


class MemcpyBaseline:
    """The same bytes copied with ``np.copyto`` into a preallocated batch buffer of the same layout."""

    def __init__(self, schema: Schema, steps: int, chunks: int):
        self.steps = steps
        self.buffer = np.ones(schema.extent_bytes(steps * chunks), dtype=np.uint8)  # touched: no page faults
        self.columns = schema.views(self.buffer, steps * chunks)

    def batch(self, payloads: list[dict[str, np.ndarray]]) -> None:
        row = 0
        for p in payloads:
            for name, dst in self.columns.items():
                np.copyto(dst[row : row + self.steps], p[name], casting="no")
            row += self.steps


class PlaneLoop:
    """A plane created once; :meth:`batch` is one OnPolicy iteration (ingest, deliver, release)."""

    def __init__(self, schema: Schema, steps: int, chunks: int, prefetch_depth: int | None, copy_workers: int,
                 policy: str):
        batch_bytes = schema.extent_bytes(steps * chunks)
        chunk_bytes = schema.extent_bytes(steps)
        pageable = max(256 * MiB, 4 * batch_bytes + 2 * chunks * chunk_bytes)
        self.plane = ExperiencePlane(schema, OnPolicy(), batch_steps=steps * chunks, policy=policy,
                                     capacities={"pageable": pageable}, prefetch_depth=prefetch_depth,
                                     copy_workers=copy_workers, verify_checksums=False)
        self.version = 0
        self.ingest_s = 0.0
        self.deliver_s = 0.0

    def batch(self, payloads: list[dict[str, np.ndarray]], check: bool = False) -> None:
        k = self.version
        t0 = time.perf_counter()
        for i, p in enumerate(payloads):
            self.plane.ingest(p, policy_version=k, chunk_id=(k, i))
        t1 = time.perf_counter()
        b = self.plane.next_batch(timeout=60)
        if check:
            _check_batch(b, payloads)
        b.release()
        self.version = k + 1
        self.plane.set_policy_version(self.version)
        self.ingest_s += t1 - t0
        self.deliver_s += time.perf_counter() - t1

    def close(self) -> None:
        self.plane.close()


def _check_batch(batch: Any, payloads: list[dict[str, np.ndarray]]) -> None:
    """The delivered batch holds exactly the ingested rows, in the order its selections say."""
    by_id = {(batch.update, i): p for i, p in enumerate(payloads)}
    row = 0
    for cid, idx in batch.selections:
        n = len(idx)
        for name, col in batch.columns.items():
            want = by_id[cid][name][idx.start : idx.stop] if isinstance(idx, range) else by_id[cid][name][idx]
            if not np.array_equal(np.asarray(col[row : row + n]), want):
                raise AssertionError(f"batch {batch.update}: column {name!r} rows {row}:{row + n} differ from "
                                     f"chunk {cid!r}")
        row += n
    if row != batch.steps:
        raise AssertionError(f"batch {batch.update}: {row} rows selected, {batch.steps} delivered")


def _time(fn: Any, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return time.perf_counter() - t0


def run_size(schema: Schema, size_mib: float, args: argparse.Namespace) -> dict[str, Any]:
    steps = max(1, int(size_mib * MiB) // schema.step_bytes)
    chunk_bytes = schema.payload_bytes(steps)
    batch_bytes = chunk_bytes * args.chunks_per_batch
    payloads = make_payloads(schema, steps, args.chunks_per_batch)
    base = MemcpyBaseline(schema, steps, args.chunks_per_batch)
    loop = PlaneLoop(schema, steps, args.chunks_per_batch, args.prefetch_depth, args.copy_workers, args.policy)
    try:
        loop.batch(payloads, check=True)  # warm-up 0 also checks the bytes delivered
        for _ in range(max(0, args.warmup - 1)):
            loop.batch(payloads)
        for _ in range(args.warmup):
            base.batch(payloads)
        loop.ingest_s = loop.deliver_s = 0.0
        before = loop.plane.metrics()
        mem_gbs, plane_gbs, ratios = [], [], []
        for r in range(args.repeats):
            order = ("memcpy", "plane") if r % 2 == 0 else ("plane", "memcpy")
            got = {}
            for which in order:
                fn = (lambda: base.batch(payloads)) if which == "memcpy" else (lambda: loop.batch(payloads))
                got[which] = batch_bytes * args.iters / _time(fn, args.iters) / 1e9
            mem_gbs.append(got["memcpy"])
            plane_gbs.append(got["plane"])
            ratios.append(got["plane"] / got["memcpy"])
        after = loop.plane.metrics()
        profile = None
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.iters):
                loop.batch(payloads)
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
            profile = s.getvalue()
        timed = args.repeats * args.iters
        ingested = after.get("ingested_bytes", 0) - before.get("ingested_bytes", 0)
        copied = after["transfers"]["bytes"] - before["transfers"]["bytes"]
        moves = after.get("moves", 0) - before.get("moves", 0)
        med_mem, med_plane = statistics.median(mem_gbs), statistics.median(plane_gbs)
        return {
            "chunk_mib": size_mib, "chunk_bytes": chunk_bytes, "steps_per_chunk": steps,
            "chunks_per_batch": args.chunks_per_batch, "batch_bytes": batch_bytes,
            "memcpy_gbs": mem_gbs, "plane_gbs": plane_gbs, "ratios": ratios,
            "memcpy_gbs_median": med_mem, "plane_gbs_median": med_plane,
            "ratio_of_medians": med_plane / med_mem, "ratio_median": statistics.median(ratios),
            "ingest_share": loop.ingest_s / max(1e-12, loop.ingest_s + loop.deliver_s),
            "ingest_ms_per_batch": 1e3 * loop.ingest_s / timed, "deliver_ms_per_batch": 1e3 * loop.deliver_s / timed,
            "bytes_copied_per_byte_ingested": copied / ingested if ingested else None,
            "moves_per_batch": moves / timed,
            "plane_metrics": _metrics_brief(after),
            "profile": profile,
        }
    finally:
        loop.close()


def _metrics_brief(m: dict[str, Any]) -> dict[str, Any]:
    keys = ("exposed_experience_path_s", "exposed_experience_path_p50_s", "experience_path_s", "iteration_time_s",
            "experience_share", "updates", "ingested_chunks", "moves", "delivered_batches")
    out = {k: m.get(k) for k in keys}
    out["bandwidth"] = {route: {"gbs": v["bandwidth"] / 1e9, "latency_s": v["latency"], "samples": v["samples"]}
                        for route, v in m["bandwidth"].items() if v["samples"]}
    out["transfers"] = m["transfers"]
    return out


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[8, 32], help="chunk sizes (MiB)")
    parser.add_argument("--chunks-per-batch", type=int, default=4)
    parser.add_argument("--obs-dim", type=int, default=1024, help="float32 observation width (sets step bytes)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iters", type=int, default=4, help="batches timed per repeat")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches first (the first checks the bytes)")
    parser.add_argument("--prefetch-depth", type=int, default=None, help="plane prefetch depth (default: policy's)")
    parser.add_argument("--copy-workers", type=int, default=2)
    parser.add_argument("--policy", default="conduit")
    parser.add_argument("--target", type=float, default=0.5, help="PASS when plane >= target x memcpy")
    parser.add_argument("--profile", action="store_true", help="cProfile the plane loop and print the top entries")
    parser.add_argument("--json", default="results/runtime_throughput.json", help="write results here ('' : don't)")
    args = parser.parse_args()

    schema = make_schema(args.obs_dim)
    print(f"schema: {len(schema.columns)} columns, {schema.step_bytes} B/step; OnPolicy, 1 CPU learner, "
          f"{args.chunks_per_batch} chunks/batch; {args.repeats} repeats x {args.iters} batches, "
          f"{args.warmup} warm-up batches")
    rows = [run_size(schema, s, args) for s in args.sizes_mib]

    print()
    print(f"{'chunk':>9} {'batch':>9} {'memcpy GB/s':>12} {'plane GB/s':>11} {'ratio':>6} {'ratio/rep':>10} "
          f"{'ingest ms':>10} {'deliver ms':>11} {'copies/B':>9} {'result':>7}")
    ok = True
    for r in rows:
        passed = r["ratio_of_medians"] >= args.target
        ok &= passed
        r["pass"] = passed
        print(f"{r['chunk_mib']:>5g} MiB {r['batch_bytes'] / MiB:>5.0f} MiB {r['memcpy_gbs_median']:>12.2f} "
              f"{r['plane_gbs_median']:>11.2f} {r['ratio_of_medians']:>6.2f} {r['ratio_median']:>10.2f} "
              f"{r['ingest_ms_per_batch']:>10.2f} {r['deliver_ms_per_batch']:>11.2f} "
              f"{r['bytes_copied_per_byte_ingested']:>9.2f} {'PASS' if passed else 'FAIL':>7}")
    print(f"(medians over {args.repeats} repeats; 'ratio' = plane median / memcpy median, 'ratio/rep' = median of "
          f"per-repeat ratios; target >= {args.target:g}x memcpy; ingest/deliver ms = time in ingest calls / in "
          "next_batch+release per batch; copies/B = bytes the plane copied per byte ingested)")

    m = rows[-1]["plane_metrics"]
    print(f"\nplane metrics ({rows[-1]['chunk_mib']:g} MiB chunks, whole run incl. warm-up):")
    print(f"  exposed experience-path latency: mean {_fmt_s(m['exposed_experience_path_s'])}, "
          f"p50 {_fmt_s(m['exposed_experience_path_p50_s'])} over {m['updates']} updates")
    share = "-" if m["experience_share"] is None else f"{m['experience_share']:.3f}"
    print(f"  experience path (created -> batch ready): mean {_fmt_s(m['experience_path_s'])}; iteration "
          f"{_fmt_s(m['iteration_time_s'])}; experience share {share}")
    for route, v in m["bandwidth"].items():
        print(f"  bandwidth estimate {route:34s} {v['gbs']:7.2f} GB/s  latency {v['latency_s'] * 1e6:8.1f} us  "
              f"({v['samples']} copies)")
    t = m["transfers"]
    print(f"  transfers: {t['copies']} copies, {t['bytes'] / 1e9:.2f} GB, busy {t['busy_s']:.3f} s; "
          f"moves/batch (second copies) {rows[-1]['moves_per_batch']:.2f}")
    for r in rows:
        if r["profile"]:
            print(f"\ncProfile of {args.iters} plane batches, {r['chunk_mib']:g} MiB chunks:\n{r['profile']}")

    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"args": vars(args), "target": args.target, "pass": ok, "rows": rows}, indent=1))
        print(f"wrote {path}")
    print("PASS" if ok else "FAIL", f"(plane >= {args.target:g}x memcpy at every chunk size)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
