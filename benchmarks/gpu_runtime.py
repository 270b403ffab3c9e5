"""The runtime's GPU paths on one CUDA device: copy bandwidths, overlap, plane throughput, exposed latency.

A prepared script for a GPU machine (written for one H200; any CUDA GPU works). Needs only numpy,
torch with CUDA and this repository's ``conduit`` package (``PYTHONPATH=.``; ``conduit`` itself needs
networkx and pyyaml for the plane's topology: without them sections b and c are skipped with the
import error and section a still runs). No Ray, no network. Without CUDA it exits with status 2 and
says so; ``--dry-run-cpu`` runs the same code paths with device ``cpu`` (figures meaningless, logic
exercised) so the script can be tested on a machine without a GPU.

a. **Host -> device copy bandwidth**, pageable vs pinned source, ``--sizes-mib`` (1, 8, 64, 256), CUDA
   events around each copy on a side stream, median of ``--reps``. Then the same copy **overlapped
   with compute**: a loop of bf16 matmuls on the default stream (sized to last about twice the copy),
   the copy on the side stream launched while it runs. Reported: compute slowdown (its time with the
   copy running / alone), the copy's effective bandwidth while overlapped, the copy time left exposed
   (overlapped total - compute alone) and whether the copy was hidden (finished before the compute,
   total within 5% of compute alone).
b. **Plane ingest -> device batch throughput**: an :class:`ExperiencePlane` (OnPolicy, learner on
   ``cuda:0``, capacities for hbm/pinned/pageable) fed 8 MiB chunks from pageable numpy, batches of
   ``--chunks-per-batch`` chunks, timed to the batch being complete on the device (synchronised);
   against ``torch.from_numpy(x).to("cuda")`` of the same arrays and against ``.to("cuda",
   non_blocking=True)`` from already-pinned copies (the upper bound). Medians over ``--repeats``,
   side by side, ratios. The first batch is checked byte for byte.
c. **Exposed experience-path latency** with a simulated learner: a producer thread keeps chunks
   coming (at most a few batches ahead), the learner loop takes a batch, runs an update of about
   ``--update-ms`` (a matmul loop on the default stream, then a synchronize), releases it. Plane with
   ``prefetch_depth=2`` vs ``prefetch_depth=0`` (and the ``host-only`` policy, no prefetch at all, for
   reference): time blocked in ``next_batch``, the plane's exposed latency per update, iteration time,
   and the producer's ``ingest`` call times (which show whether ingestion copies queue behind the
   learner's kernels).

Every section is timed against ``--budget-s`` (default 200 s, so the whole run ends within about 4
minutes on an H200 including CUDA start-up); what does not fit is skipped and says so. A section that
fails is recorded with its traceback and the others still run (exit status 1 then). Results go to
``$OUT/gpu_runtime.json`` when ``OUT`` is set, else ``results/gpu_runtime.json``, rewritten after every
section.

    PYTHONPATH=. python benchmarks/gpu_runtime.py                 # on the GPU machine
    .venv/bin/python benchmarks/gpu_runtime.py --dry-run-cpu      # here: same logic on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from _plane_workload import make_payloads, make_schema, pick_device

MiB = 1 << 20

try:
    import torch
except ImportError as _exc:  # pragma: no cover - reported in main()
    torch = None
    _TORCH_ERROR = repr(_exc)
else:
    _TORCH_ERROR = ""


# ---------------------------------------------------------------------------------------------- device glue
class Dev:
    """Everything that differs between the real run (CUDA) and ``--dry-run-cpu``."""

    def __init__(self, device: str):
        self.device = device
        self.cuda = device.startswith("cuda")
        self.torch_device = torch.device(device)
        self.side = torch.cuda.Stream(device=self.torch_device) if self.cuda else None
        self.can_pin = self.cuda

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.torch_device)

    def on(self, stream: Any) -> Any:
        return torch.cuda.stream(stream) if self.cuda and stream is not None else contextlib.nullcontext()

    def event(self) -> Event:
        return Event(self)

    def matmul_operands(self, n: int) -> tuple[Any, Any, Any]:
        dtype = torch.bfloat16 if self.cuda else torch.float32
        torch.manual_seed(0)
        a = torch.randn(n, n, device=self.torch_device, dtype=dtype)
        b = torch.randn(n, n, device=self.torch_device, dtype=dtype) / math.sqrt(n)  # keeps values finite
        return a, b, torch.empty(n, n, device=self.torch_device, dtype=dtype)


class Event:
    """A CUDA timing event, or a host clock reading on the CPU (where every op is synchronous)."""

    def __init__(self, dev: Dev):
        self.dev = dev
        self.ev = torch.cuda.Event(enable_timing=True) if dev.cuda else None
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        if self.ev is not None:
            if stream is None:
                self.ev.record()
            else:
                self.ev.record(stream)
        else:
            self.t = time.perf_counter()

    def ms_to(self, later: Event) -> float:
        if self.ev is not None:
            return float(self.ev.elapsed_time(later.ev))
        return (later.t - self.t) * 1e3


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def _p(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


class Budget:
    def __init__(self, seconds: float):
        self.t0 = time.monotonic()
        self.seconds = seconds

    @property
    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.t0)

    def has(self, seconds: float) -> bool:
        return self.left >= seconds


# ---------------------------------------------------------------------------------------------- a. copies
class Matmuls:
    """The compute kernel: ``count`` matmuls of two n x n matrices into a preallocated output."""

    def __init__(self, dev: Dev, n: int):
        self.dev = dev
        self.a, self.b, self.c = dev.matmul_operands(n)
        self.run(3)
        dev.sync()
        self.ms_each = self.time(8) / 8

    def run(self, count: int) -> None:
        for _ in range(count):
            torch.matmul(self.a, self.b, out=self.c)

    def time(self, count: int) -> float:
        e0, e1 = self.dev.event(), self.dev.event()
        self.dev.sync()
        e0.record()
        self.run(count)
        e1.record()
        self.dev.sync()
        return e0.ms_to(e1)

    def count_for(self, ms: float, cap: int = 20000) -> int:
        return int(min(cap, max(1, math.ceil(ms / max(self.ms_each, 1e-6)))))


def h2d_copies(dev: Dev, args: argparse.Namespace, budget: Budget) -> dict[str, Any]:
    mm = Matmuls(dev, args.matmul_n)
    out: dict[str, Any] = {"matmul": {"n": args.matmul_n, "dtype": str(mm.a.dtype), "ms_each": mm.ms_each},
                           "rows": [], "skipped": []}
    kinds = ["pageable"] + (["pinned"] if dev.can_pin else [])
    if not dev.can_pin:
        out["skipped"].append("pinned: needs CUDA (dry run)")
    for size in args.sizes_mib:
        n = int(size * MiB)
        for kind in kinds:
            if not budget.has(15):
                out["skipped"].append(f"{kind} {size:g} MiB: time budget")
                continue
            src = torch.empty(n, dtype=torch.uint8, pin_memory=(kind == "pinned"))
            src.fill_(7)
            dst = torch.empty(n, dtype=torch.uint8, device=dev.torch_device)

            def copy(dst: Any = dst, src: Any = src) -> None:
                dst.copy_(src, non_blocking=True)

            with dev.on(dev.side):
                copy()
                copy()
            dev.sync()
            reps = args.reps if n >= 64 * MiB else 3 * args.reps
            ev_ms, wall_ms = [], []
            for _ in range(reps):
                e0, e1 = dev.event(), dev.event()
                dev.sync()
                t0 = time.perf_counter()
                with dev.on(dev.side):
                    e0.record(dev.side)
                    copy()
                    e1.record(dev.side)
                dev.sync()
                wall_ms.append((time.perf_counter() - t0) * 1e3)
                ev_ms.append(e0.ms_to(e1))
            copy_ms = _median(ev_ms)
            row: dict[str, Any] = {"kind": kind, "size_mib": size, "bytes": n, "copy_ms": copy_ms,
                                   "gbs": n / (copy_ms / 1e3) / 1e9, "wall_ms": _median(wall_ms),
                                   "wall_gbs": n / (_median(wall_ms) / 1e3) / 1e9}
            row["overlap"] = _overlap(dev, mm, copy, n, copy_ms, max(3, args.reps // 2))
            out["rows"].append(row)
            del src, dst
    return out


def _overlap(dev: Dev, mm: Matmuls, copy: Any, nbytes: int, copy_ms: float, reps: int) -> dict[str, Any]:
    """Compute on the default stream; the copy launched on the side stream while it runs."""
    count = mm.count_for(max(2 * copy_ms, 5.0))
    alone = [mm.time(count) for _ in range(reps)]
    comp, cp, total, copy_first = [], [], [], []
    for _ in range(reps):
        c0, c1, x0, x1 = dev.event(), dev.event(), dev.event(), dev.event()
        dev.sync()
        c0.record()
        mm.run(count)
        c1.record()
        with dev.on(dev.side):
            x0.record(dev.side)
            copy()
            x1.record(dev.side)
        dev.sync()
        comp.append(c0.ms_to(c1))
        cp.append(x0.ms_to(x1))
        end_c, end_x = c0.ms_to(c1), c0.ms_to(x1)
        total.append(max(end_c, end_x))
        copy_first.append(end_x <= end_c)
    compute_alone = _median(alone)
    tot = _median(total)
    exposed = max(0.0, tot - compute_alone)
    return {
        "matmuls": count, "compute_alone_ms": compute_alone, "compute_with_copy_ms": _median(comp),
        "compute_slowdown": _median(comp) / compute_alone if compute_alone > 0 else float("nan"),
        "copy_overlapped_ms": _median(cp), "copy_overlapped_gbs": nbytes / (_median(cp) / 1e3) / 1e9,
        "total_ms": tot, "exposed_copy_ms": exposed,
        "hidden": bool(sum(copy_first) * 2 > len(copy_first) and tot <= 1.05 * compute_alone),
    }


def print_copies(res: dict[str, Any]) -> None:
    m = res["matmul"]
    print(f"\na. host -> device copies (CUDA events, side stream); compute = {m['n']}x{m['n']} {m['dtype']} matmuls, "
          f"{m['ms_each']:.3f} ms each")
    print(f"{'source':>9} {'size':>8} {'GB/s':>7} {'copy ms':>8} | {'compute ms':>10} {'+copy ms':>9} {'slowdown':>9} "
          f"{'copy GB/s':>10} {'exposed ms':>11} {'hidden':>7}")
    for r in res["rows"]:
        o = r["overlap"]
        print(f"{r['kind']:>9} {r['size_mib']:>4g} MiB {r['gbs']:>7.2f} {r['copy_ms']:>8.3f} | "
              f"{o['compute_alone_ms']:>10.2f} {o['compute_with_copy_ms']:>9.2f} {o['compute_slowdown']:>9.3f} "
              f"{o['copy_overlapped_gbs']:>10.2f} {o['exposed_copy_ms']:>11.3f} {'yes' if o['hidden'] else 'no':>7}")
    by = {(r["kind"], r["size_mib"]): r for r in res["rows"]}
    for (kind, size), r in sorted(by.items()):
        if kind == "pinned" and ("pageable", size) in by:
            print(f"  pinned / pageable at {size:g} MiB: x{r['gbs'] / by[('pageable', size)]['gbs']:.2f}")
    for s in res["skipped"]:
        print(f"  skipped: {s}")


# ---------------------------------------------------------------------------------------------- b. plane
def _host(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.detach().cpu().numpy()


def _check_batch(batch: Any, payloads: list[dict[str, np.ndarray]], key: Any) -> None:
    """The delivered batch holds exactly the ingested rows, in the order its selections say."""
    by_id = {key(i): p for i, p in enumerate(payloads)}
    row = 0
    for cid, idx in batch.selections:
        n = len(idx)
        for name, col in batch.columns.items():
            src = by_id[cid][name]
            want = src[idx.start : idx.stop] if isinstance(idx, range) else src[np.asarray(idx)]
            if not np.array_equal(_host(col[row : row + n]), want):
                raise AssertionError(f"batch {batch.update}: column {name!r} rows {row}:{row + n} differ from "
                                     f"chunk {cid!r}")
        row += n
    if row != batch.steps:
        raise AssertionError(f"batch {batch.update}: {row} rows selected, {batch.steps} delivered")


def _capacities(schema: Any, steps: int, cpb: int, dev: Dev) -> dict[str, int]:
    batch = schema.extent_bytes(steps * cpb)
    chunk = schema.extent_bytes(steps)
    caps = {"pageable": max(256 * MiB, 4 * batch + 4 * cpb * chunk)}
    if dev.cuda:
        caps["hbm"] = max(1 << 30, 8 * batch + 4 * cpb * chunk)
        caps["pinned"] = max(256 * MiB, 2 * batch)
    return caps


def plane_throughput(dev: Dev, args: argparse.Namespace, budget: Budget) -> dict[str, Any]:
    from conduit.contracts import OnPolicy
    from conduit.runtime.plane import ExperiencePlane

    schema = make_schema(args.obs_dim)
    cpb = args.chunks_per_batch
    steps = max(1, int(args.chunk_mib * MiB) // schema.step_bytes)
    batch_bytes = schema.payload_bytes(steps) * cpb
    payloads = make_payloads(schema, steps, cpb)
    caps = _capacities(schema, steps, cpb, dev)
    plane = ExperiencePlane(schema, OnPolicy(), batch_steps=steps * cpb, learners={"learner0": dev.device},
                            capacities=caps, verify_checksums=False)
    state = {"version": 0}

    def plane_batch(check: bool = False) -> None:
        k = state["version"]
        for i, p in enumerate(payloads):
            plane.ingest(p, policy_version=k, chunk_id=(k, i))
        b = plane.next_batch(timeout=60)
        dev.sync()
        if check:
            _check_batch(b, payloads, lambda i, k=k: (k, i))
        b.release()
        state["version"] = k + 1
        plane.set_policy_version(k + 1)

    def pageable_to() -> None:
        held = [torch.from_numpy(p[c]).to(dev.torch_device, copy=True) for p in payloads for c in p]
        dev.sync()
        del held

    pinned_src = [{c: (torch.from_numpy(a).pin_memory() if dev.can_pin else torch.from_numpy(a).clone())
                   for c, a in p.items()} for p in payloads]

    def pinned_to() -> None:
        held = [t.to(dev.torch_device, non_blocking=True, copy=True) for p in pinned_src for t in p.values()]
        dev.sync()
        del held

    ways = {"plane": plane_batch, "pageable .to()": pageable_to,
            ("pinned .to(non_blocking)" if dev.can_pin else "unpinned .to() (dry run)"): pinned_to}
    got: dict[str, list[float]] = {k: [] for k in ways}
    try:
        plane_batch(check=True)
        for _ in range(2):
            for fn in ways.values():
                fn()
        before = plane.metrics()
        names = list(ways)
        for r in range(args.repeats):
            if not budget.has(10):
                break
            k = r % len(names)
            for name in names[k:] + names[:k]:
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    ways[name]()
                got[name].append(batch_bytes * args.iters / (time.perf_counter() - t0) / 1e9)
        after = plane.metrics()
    finally:
        plane.close()
    med = {k: _median(v) for k, v in got.items()}
    base_pageable = med["pageable .to()"]
    base_pinned = med[names[2]]
    return {
        "chunk_bytes": schema.payload_bytes(steps), "steps_per_chunk": steps, "chunks_per_batch": cpb,
        "batch_bytes": batch_bytes, "capacities": caps, "repeats_done": len(got["plane"]),
        "gbs": got, "gbs_median": med,
        "plane_over_pageable_to": med["plane"] / base_pageable, "plane_over_pinned_to": med["plane"] / base_pinned,
        "moves_per_batch": (after.get("moves", 0) - before.get("moves", 0)) / max(1, len(got["plane"]) * args.iters),
        "bytes_copied_per_byte_ingested": (after["transfers"]["bytes"] - before["transfers"]["bytes"])
        / max(1, after.get("ingested_bytes", 0) - before.get("ingested_bytes", 0)),
        "bandwidth": {route: {"gbs": v["bandwidth"] / 1e9, "samples": v["samples"]}
                      for route, v in after["bandwidth"].items() if v["samples"]},
        "counters": {k: v for k, v in after.items() if isinstance(v, int | float) and not isinstance(v, bool)},
        "tiers": {t: {"medium": d["medium"], "capacity": d["capacity"]} for t, d in after["tiers"].items()},
        "unavailable_tiers": after["unavailable_tiers"],
    }


def print_plane(res: dict[str, Any]) -> None:
    print(f"\nb. plane ingest -> device batch: {res['chunk_bytes'] / MiB:.1f} MiB pageable numpy chunks, "
          f"{res['chunks_per_batch']} per batch ({res['batch_bytes'] / MiB:.0f} MiB), {res['repeats_done']} repeats")
    for name, v in res["gbs_median"].items():
        print(f"  {name:28s} {v:7.2f} GB/s")
    print(f"  plane / pageable .to(): {res['plane_over_pageable_to']:.2f};  plane / pinned .to(): "
          f"{res['plane_over_pinned_to']:.2f};  plane copies/byte {res['bytes_copied_per_byte_ingested']:.2f}, "
          f"moves/batch {res['moves_per_batch']:.2f}")
    for route, v in res["bandwidth"].items():
        print(f"  plane estimate {route:34s} {v['gbs']:7.2f} GB/s ({v['samples']} copies)")
    tiers = ", ".join(f"{t} ({d['medium']})" for t, d in res["tiers"].items())
    print(f"  tiers: {tiers}")


# ---------------------------------------------------------------------------------------------- c. exposed
def exposed_latency(dev: Dev, args: argparse.Namespace, budget: Budget) -> dict[str, Any]:
    schema = make_schema(args.obs_dim)
    cpb = args.chunks_per_batch
    steps = max(1, int(args.chunk_mib * MiB) // schema.step_bytes)
    payloads = make_payloads(schema, steps, 2 * cpb)
    n = args.update_matmul_n
    mm = Matmuls(dev, n)
    count = mm.count_for(args.update_ms)
    configs = [
        ("conduit prefetch_depth=2", {"policy": "conduit", "prefetch_depth": 2}),
        ("conduit prefetch_depth=0", {"policy": "conduit", "prefetch_depth": 0}),
        ("host-only (no prefetch)", {"policy": "host-only"}),
    ]
    out: dict[str, Any] = {"update_matmuls": count, "matmul_n": n, "matmul_ms_each": mm.ms_each,
                           "contract": f"BoundedStaleness(max_lag={args.max_lag})", "configs": {}, "skipped": []}
    for label, kw in configs:
        need = (args.updates + 3) * args.update_ms / 1e3 * 2 + 10
        if not budget.has(need):
            out["skipped"].append(f"{label}: time budget ({budget.left:.0f} s left, ~{need:.0f} s needed)")
            continue
        out["configs"][label] = _learner_run(dev, schema, steps, payloads, mm, count, kw, args)
    return out


def _learner_run(dev: Dev, schema: Any, steps: int, payloads: list[dict[str, np.ndarray]], mm: Matmuls,
                 count: int, kw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from conduit.contracts import BoundedStaleness
    from conduit.errors import ConduitError, PlaneFullError
    from conduit.runtime.plane import ExperiencePlane

    cpb = args.chunks_per_batch
    plane = ExperiencePlane(schema, BoundedStaleness(max_lag=args.max_lag), batch_steps=steps * cpb,
                            learners={"learner0": dev.device}, capacities=_capacities(schema, steps, cpb, dev),
                            verify_checksums=False, **kw)
    stop = threading.Event()
    lock = threading.Lock()
    produced = [0]
    consumed = [0]
    ingest_ms: list[float] = []
    errors: list[BaseException] = []
    ahead = (max(1, plane.prefetch_depth) + 2) * cpb

    def producer() -> None:
        i = 0
        try:
            while not stop.is_set():
                with lock:
                    room = produced[0] - consumed[0] < ahead
                if not room:
                    time.sleep(0.0005)
                    continue
                t0 = time.perf_counter()
                try:
                    plane.ingest(payloads[i % len(payloads)], policy_version=plane.policy_version,
                                 chunk_id=("c", i), timeout=0.5)
                except PlaneFullError:
                    continue
                ingest_ms.append((time.perf_counter() - t0) * 1e3)
                i += 1
                with lock:
                    produced[0] += 1
        except ConduitError:
            if not stop.is_set():
                raise
        except BaseException as exc:  # noqa: BLE001 - handed to the learner loop
            errors.append(exc)

    thread = threading.Thread(target=producer, name="bench-producer", daemon=True)
    waits, exposed, iters, updates = [], [], [], []
    try:
        thread.start()
        last = None
        for u in range(args.updates + 3):
            if errors:
                raise RuntimeError("producer failed") from errors[0]
            t_ask = time.perf_counter()
            b = plane.next_batch(timeout=60)
            t_got = time.perf_counter()
            obs = b.columns["obs"]
            obs = torch.from_numpy(obs) if isinstance(obs, np.ndarray) else obs
            s = obs.float().sum()  # the update reads its batch
            mm.run(count)
            s.item()
            dev.sync()
            t_done = time.perf_counter()
            b.release()
            plane.set_policy_version(plane.policy_version + 1)
            with lock:
                consumed[0] += b.steps // steps
            if u >= 3:  # warm-up excluded
                waits.append((t_got - t_ask) * 1e3)
                exposed.append(plane.last_exposed * 1e3)
                updates.append((t_done - t_got) * 1e3)
                if last is not None:
                    iters.append((t_got - last) * 1e3)
            last = t_got
        m = plane.metrics()
    finally:
        stop.set()
        thread.join(timeout=10)
        plane.close()
    if errors:
        raise RuntimeError("producer failed") from errors[0]
    return {
        "wait_ms_p50": _median(waits), "wait_ms_p90": _p(waits, 90), "exposed_ms_p50": _median(exposed),
        "exposed_ms_mean": float(np.mean(exposed)), "exposed_ms_p90": _p(exposed, 90),
        "update_ms_p50": _median(updates), "iteration_ms_p50": _median(iters),
        "exposed_share": float(np.mean(exposed)) / _median(iters) if iters else None,
        "ingest_ms_p50": _median(ingest_ms), "ingest_ms_p99": _p(ingest_ms, 99), "ingests": len(ingest_ms),
        "plane_exposed_mean_ms": (m.get("exposed_experience_path_s") or 0) * 1e3,
        "dropped_stale_samples": m.get("dropped_stale_samples", 0), "moves": m.get("moves", 0),
        "prefetch_depth": plane.prefetch_depth, "waits_ms": waits, "exposed_ms": exposed,
    }


def print_exposed(res: dict[str, Any]) -> None:
    print(f"\nc. exposed experience-path latency, {res['contract']}, learner update = {res['update_matmuls']} x "
          f"{res['matmul_n']}^2 matmuls + sync")
    print(f"{'config':>26} {'wait p50':>9} {'wait p90':>9} {'exposed p50':>12} {'exp. mean':>10} {'update':>8} "
          f"{'iteration':>10} {'share':>7} {'ingest p50':>11} {'ingest p99':>11}")
    for label, r in res["configs"].items():
        share = "-" if r["exposed_share"] is None else f"{r['exposed_share']:.3f}"
        print(f"{label:>26} {r['wait_ms_p50']:>9.3f} {r['wait_ms_p90']:>9.3f} {r['exposed_ms_p50']:>12.3f} "
              f"{r['exposed_ms_mean']:>10.3f} {r['update_ms_p50']:>8.2f} {r['iteration_ms_p50']:>10.2f} "
              f"{share:>7} {r['ingest_ms_p50']:>11.3f} {r['ingest_ms_p99']:>11.3f}")
    print("  (ms; wait = time blocked in next_batch; exposed = the plane's exposed experience-path latency per "
          "update; share = mean exposed / iteration)")
    cfg = res["configs"]
    a, b = cfg.get("conduit prefetch_depth=2"), cfg.get("conduit prefetch_depth=0")
    if a and b:
        print(f"  prefetch_depth=2 vs 0: exposed mean {a['exposed_ms_mean']:.3f} vs {b['exposed_ms_mean']:.3f} ms, "
              f"iteration {a['iteration_ms_p50']:.2f} vs {b['iteration_ms_p50']:.2f} ms")
    for s in res["skipped"]:
        print(f"  skipped: {s}")


# ---------------------------------------------------------------------------------------------- main
def _out_path(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    out = os.environ.get("OUT")
    return Path(out) / "gpu_runtime.json" if out else Path("results") / "gpu_runtime.json"


def _write(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=str))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run-cpu", action="store_true", help="run every section on the CPU (logic check only)")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--sections", default="abc", help="which sections to run (letters)")
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--reps", type=int, default=10, help="a: copies timed per size (x3 below 64 MiB)")
    parser.add_argument("--matmul-n", type=int, default=None, help="a: matmul size (default 8192 CUDA, 256 CPU)")
    parser.add_argument("--chunk-mib", type=float, default=8.0)
    parser.add_argument("--chunks-per-batch", type=int, default=4)
    parser.add_argument("--obs-dim", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7, help="b: side-by-side repeats")
    parser.add_argument("--iters", type=int, default=5, help="b: batches per repeat")
    parser.add_argument("--updates", type=int, default=30, help="c: timed learner updates per config")
    parser.add_argument("--update-ms", type=float, default=50.0, help="c: simulated update length")
    parser.add_argument("--update-matmul-n", type=int, default=None, help="c: matmul size (4096 CUDA, 256 CPU)")
    parser.add_argument("--max-lag", type=int, default=8, help="c: BoundedStaleness max_lag")
    parser.add_argument("--budget-s", type=float, default=200.0, help="stop starting new work after this")
    parser.add_argument("--json", default=None, help="output (default $OUT/gpu_runtime.json or results/)")
    args = parser.parse_args()

    if torch is None:
        print(f"gpu_runtime: torch is not importable ({_TORCH_ERROR}); this script needs PyTorch", file=sys.stderr)
        return 2
    device = pick_device("gpu_runtime", args.dry_run_cpu, args.device, torch)
    if device is None:
        return 2
    if args.dry_run_cpu:
        print("gpu_runtime: DRY RUN on the CPU: same code paths, figures are not GPU figures")
    args.matmul_n = args.matmul_n or (8192 if device != "cpu" else 256)
    args.update_matmul_n = args.update_matmul_n or (4096 if device != "cpu" else 256)
    if device != "cpu":
        torch.cuda.set_device(torch.device(device))
    budget = Budget(args.budget_s)
    dev = Dev(device)
    path = _out_path(args.json)
    results: dict[str, Any] = {
        "dry_run_cpu": args.dry_run_cpu, "device": device, "args": vars(args),
        "env": {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                "numpy": np.__version__, "host": platform.node(), "cpus": os.cpu_count()},
        "sections": {}, "errors": {},
    }
    if dev.cuda:
        props = torch.cuda.get_device_properties(dev.torch_device)
        results["env"]["gpu"] = {"name": props.name, "memory_bytes": props.total_memory,
                                 "capability": f"{props.major}.{props.minor}"}
        print(f"device {device}: {props.name}, {props.total_memory / 2**30:.0f} GiB; torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}")
    plane_ok, plane_err = True, ""
    try:
        import conduit.runtime.plane  # noqa: F401 - needs networkx and pyyaml besides numpy/torch
    except ImportError as exc:
        plane_ok, plane_err = False, f"cannot import conduit.runtime.plane: {exc!r} (PYTHONPATH=. and networkx, pyyaml?)"
        print(f"gpu_runtime: {plane_err}; sections b and c are skipped", file=sys.stderr)
    sections = [("a", "h2d_copies", h2d_copies, print_copies, False),
                ("b", "plane_throughput", plane_throughput, print_plane, True),
                ("c", "exposed_latency", exposed_latency, print_exposed, True)]
    for letter, name, fn, show, needs_plane in sections:
        if letter not in args.sections:
            continue
        if needs_plane and not plane_ok:
            results["errors"][name] = plane_err
            continue
        if not budget.has(20):
            results["sections"][name] = {"skipped": f"time budget ({budget.left:.0f} s left)"}
            print(f"\n{letter}. skipped: time budget")
            continue
        t0 = time.monotonic()
        try:
            res = fn(dev, args, budget)
            res["seconds"] = time.monotonic() - t0
            results["sections"][name] = res
            show(res)
        except Exception as exc:  # noqa: BLE001 - recorded; the other sections still run
            results["errors"][name] = "".join(traceback.format_exception(exc))
            print(f"\n{letter}. FAILED: {exc!r}", file=sys.stderr)
            traceback.print_exc()
        _write(path, results)
    results["seconds"] = time.monotonic() - budget.t0
    _write(path, results)
    print(f"\nwrote {path} ({results['seconds']:.0f} s)")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
