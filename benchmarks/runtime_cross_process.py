"""Cross-process transfer on one node: Conduit's shared-memory rings against Ray's object store.

A producer in another process hands chunks of ``--sizes-kib`` (64 KiB, 1, 8 and 64 MiB by default)
to a consumer in this process, three ways, side by side:

* ``shm``: a raw :class:`~conduit.runtime.shm_ring.ShmRing`. The producer (a ``spawn``\\ ed process)
  writes each chunk into the ring with :meth:`RingProducer.write` (one copy into shared memory); the
  consumer polls the record, copies it into its own buffer and releases it.
* ``plane``: the same producer writing through :meth:`ExperiencePlane.attach_producer`: the plane's
  ring thread ingests every record into the plane (schema check, placement, auditor, the copy into
  the batch) and the consumer takes OnPolicy batches with ``next_batch`` (``--chunks-per-batch``
  chunks each for throughput, one chunk for latency). The batch is the consumer's copy.
* ``ray``: a Ray actor (another process on the same node) does ``ray.put`` of the same bytes and
  yields the reference (a streaming generator, at most ``--depth`` objects ahead, as many as the
  ring holds); the consumer does ``ray.get`` (zero-copy from the object store) and copies the array
  into its own buffer.
* ``ray_ret`` (skip with ``--no-ray-return``): Ray's cheaper way to hand over an array: the actor
  method returns it (Ray writes the return value into the store itself), ``--depth`` calls in flight,
  ``ray.get`` and the same copy here. Shown so the comparison is not only against Ray's slowest path.

``--consume view`` skips the consumer's copy for ``shm`` and ``ray`` (both then hand out zero-copy
views; ``plane`` always copies into the batch). Checksums are off on every path.

Two figures per path and size, medians over ``--repeats``: **throughput** of a stream of chunks
(from the consumer's request to its last chunk consumed), and **per-transfer latency** of a single
chunk on an idle path (ping): one-way from the producer stamping ``t_created`` just before it starts
writing to the consumer holding the bytes (``time.time()`` on both sides; same host), plus the round
trip from the consumer's request. Ratios are shm (or plane) against ray: > 1 means faster than Ray
for throughput, lower latency for latency (ray / shm).

    .venv/bin/python benchmarks/runtime_cross_process.py [--sizes-kib 64 1024 8192 65536] [--repeats 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections import deque
from typing import Any

import numpy as np
from _plane_workload import write_json

from conduit.contracts import OnPolicy
from conduit.runtime.schema import Schema

KiB = 1 << 10
MiB = 1 << 20


def make_schema(row_bytes: int) -> Schema:
    return Schema.of({"obs": ((row_bytes // 4,), np.float32)})


def make_payload(schema: Schema, steps: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(steps)
    return {c.name: rng.standard_normal((steps, *c.shape), dtype=np.float32) for c in schema.columns}


# -- the producer process (spawned: must be importable, and must not import ray) ----------------------------
def _producer_main(specs: dict[str, Any], conn: Any, schema_dict: dict, steps: int) -> None:
    from conduit.runtime.shm_ring import RingProducer

    schema = Schema.from_dict(schema_dict)
    payload = make_payload(schema, steps)
    rings = {name: RingProducer(spec) for name, spec in specs.items()}
    seq = 0
    try:
        while True:
            cmd = conn.recv()
            if cmd[0] == "stop":
                return
            _, ring, n, version, per_version = cmd
            for i in range(n):
                rings[ring].write(payload, chunk_id=seq, policy_version=version + i // per_version,
                                  t_created=time.time(), checksum=False, timeout=60)
                seq += 1
            if cmd[0] == "stream":
                conn.send(("done", seq))
    finally:
        for r in rings.values():
            r.close()


# -- Ray (imported only in the consumer, never at module level) ---------------------------------------------
def _ray_producer_class(depth: int) -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class RayProducer:
        def __init__(self, schema_dict: dict):
            self.schema = Schema.from_dict(schema_dict)
            self.payloads: dict[int, np.ndarray] = {}
            # The owner keeps its last references a little while: a reference yielded inside a list by a
            # streaming generator can otherwise be freed before the consumer has registered as a borrower
            # (ReferenceCountingAssertionError). With backpressure ``depth`` the consumer is done with an
            # object well before ``2 * depth + 4`` newer ones exist.
            self.recent: deque = deque(maxlen=2 * depth + 4)

        def _payload(self, steps: int) -> np.ndarray:
            if steps not in self.payloads:
                self.payloads[steps] = make_payload(self.schema, steps)["obs"]
            return self.payloads[steps]

        def prepare(self, steps: int) -> int:
            return int(self._payload(steps).nbytes)

        def ping(self, steps: int) -> list:
            x = self._payload(steps)
            t = time.time()
            ref = ray.put(x)
            self.recent.append(ref)
            return [ref, t]

        def value(self, steps: int) -> list:
            x = self._payload(steps)
            return [x, time.time()]  # stamped before Ray stores the return value

        @ray.method(num_returns="streaming", _generator_backpressure_num_objects=depth)
        def stream(self, steps: int, n: int):
            x = self._payload(steps)
            for _ in range(n):
                t = time.time()
                ref = ray.put(x)
                self.recent.append(ref)
                yield [ref, t]

    return RayProducer


class RayPath:
    def __init__(self, schema: Schema, args: argparse.Namespace):
        import ray

        self.ray = ray
        self.depth = args.depth
        self.actor = _ray_producer_class(args.depth).remote(schema.to_dict())

    def prepare(self, steps: int) -> None:
        self.ray.get(self.actor.prepare.remote(steps))

    def stream(self, steps: int, n: int, dst: np.ndarray | None) -> float:
        """``ray.put`` in the actor, references streamed to us, ``ray.get`` here."""
        ray = self.ray
        t0 = time.perf_counter()
        got = 0
        for item in self.actor.stream.remote(steps, n):
            ref, _ = ray.get(item)
            arr = ray.get(ref)
            if dst is not None:
                np.copyto(dst, arr)
            del arr, ref
            got += 1
        if got != n:
            raise RuntimeError(f"ray stream: {got} of {n} objects")
        return time.perf_counter() - t0

    def stream_return(self, steps: int, n: int, dst: np.ndarray | None) -> float:
        """The array as an actor task's return value (Ray stores it), ``depth`` calls in flight."""
        ray = self.ray
        t0 = time.perf_counter()
        inflight: deque = deque()
        issued = 0
        for _ in range(n):
            while issued < n and len(inflight) < self.depth:
                inflight.append(self.actor.value.remote(steps))
                issued += 1
            arr, _ = ray.get(inflight.popleft())
            if dst is not None:
                np.copyto(dst, arr)
            del arr
        return time.perf_counter() - t0

    def ping(self, steps: int, dst: np.ndarray | None) -> tuple[float, float]:
        ray = self.ray
        t_req = time.time()
        ref, t_created = ray.get(self.actor.ping.remote(steps))
        arr = ray.get(ref)
        if dst is not None:
            np.copyto(dst, arr)
        t_done = time.time()
        del arr, ref
        return t_done - t_created, t_done - t_req

    def ping_return(self, steps: int, dst: np.ndarray | None) -> tuple[float, float]:
        ray = self.ray
        t_req = time.time()
        arr, t_created = ray.get(self.actor.value.remote(steps))
        if dst is not None:
            np.copyto(dst, arr)
        t_done = time.time()
        del arr
        return t_done - t_created, t_done - t_req


# -- one size: rings, a plane, a producer process ------------------------------------------------------------
class ShmPaths:
    """The raw ring, two planes fed by rings (throughput: batches of several chunks; latency: one),
    and the producer process that writes into all three."""

    def __init__(self, schema: Schema, steps: int, args: argparse.Namespace):
        from conduit.runtime.plane import ExperiencePlane
        from conduit.runtime.shm_ring import RECORD_HEADER_BYTES, ShmRing

        self.steps = steps
        self.cpb = args.chunks_per_batch
        record = RECORD_HEADER_BYTES + 128 + schema.extent_bytes(steps)
        ring_bytes = args.depth * record
        chunk = schema.extent_bytes(steps)
        self.planes: dict[str, Any] = {}
        self.rings: dict[str, Any] = {}
        self.proc = None
        self.ctl = None
        try:
            self.rings["shm"] = ShmRing(schema, ring_bytes, "raw")
            specs = {"shm": self.rings["shm"].spec()}
            for name, cpb in (("plane", self.cpb), ("plane1", 1)):
                batch = schema.extent_bytes(steps * cpb)
                cap = max(64 * MiB, 4 * batch + (args.depth + 2) * chunk)
                plane = ExperiencePlane(schema, OnPolicy(), batch_steps=steps * cpb, capacities={"pageable": cap},
                                        verify_checksums=False)
                self.planes[name] = plane
                specs[name] = plane.attach_producer(f"bench-{name}", ring_bytes)
            ctx = mp.get_context("spawn")
            self.ctl, child = ctx.Pipe()
            self.proc = ctx.Process(target=_producer_main, args=(specs, child, schema.to_dict(), steps),
                                    name="conduit-bench-producer", daemon=True)
            self.proc.start()
            child.close()
            self.rings["shm"].producer_started()
        except BaseException:
            self.close()
            raise
        self.versions = {name: 0 for name in self.planes}

    # raw ring
    def shm_stream(self, n: int, dst: np.ndarray | None) -> float:
        ring = self.rings["shm"]
        t0 = time.perf_counter()
        self.ctl.send(("stream", "shm", n, 0, 1))
        got = 0
        while got < n:
            recs = ring.poll(10.0)
            if not recs:
                raise RuntimeError(f"shm stream: no record within 10 s ({got} of {n})")
            for rec in recs:
                if dst is not None:
                    np.copyto(dst, rec.columns["obs"])
                ring.release(rec)
                got += 1
        dt = time.perf_counter() - t0
        self.ctl.recv()
        return dt

    def shm_ping(self, dst: np.ndarray | None) -> tuple[float, float]:
        ring = self.rings["shm"]
        t_req = time.time()
        self.ctl.send(("ping", "shm", 1, 0, 1))
        recs = ring.poll(10.0)
        if len(recs) != 1:
            raise RuntimeError(f"shm ping: {len(recs)} records")
        rec = recs[0]
        if dst is not None:
            np.copyto(dst, rec.columns["obs"])
        t_done = time.time()
        t_created = rec.t_created
        ring.release(rec)
        return t_done - t_created, t_done - t_req

    # through the plane
    def plane_stream(self, n_batches: int) -> float:
        plane = self.planes["plane"]
        v0 = self.versions["plane"]
        t0 = time.perf_counter()
        self.ctl.send(("stream", "plane", n_batches * self.cpb, v0, self.cpb))
        for k in range(n_batches):
            b = plane.next_batch(timeout=30)
            if b.update != v0 + k or b.steps != self.steps * self.cpb:
                raise RuntimeError(f"plane stream: batch {b.update} of {b.steps} rows, expected {v0 + k}")
            b.release()
            plane.set_policy_version(v0 + k + 1)
        dt = time.perf_counter() - t0
        self.versions["plane"] = v0 + n_batches
        self.ctl.recv()
        return dt

    def plane_ping(self) -> tuple[float | None, float]:
        plane = self.planes["plane1"]
        v = self.versions["plane1"]
        t_req = time.time()
        self.ctl.send(("ping", "plane1", 1, v, 1))
        b = plane.next_batch(timeout=30)
        t_done = time.time()
        # the chunk's t_created, as the plane recorded it (Batch does not expose it publicly)
        created = getattr(getattr(b, "_build", None), "created", None)
        b.release()
        plane.set_policy_version(v + 1)
        self.versions["plane1"] = v + 1
        return (t_done - max(created) if created else None), t_done - t_req

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.ctl.send(("stop",))
            except OSError:
                pass
            self.proc.join(timeout=10)
            if self.proc.is_alive():
                self.proc.terminate()  # our own child, by its handle
                self.proc.join(timeout=5)
        for p in self.planes.values():
            p.close()
        for r in self.rings.values():
            r.close()
        if self.ctl is not None:
            self.ctl.close()


def measure_size(schema: Schema, size_kib: float, ray_path: RayPath, args: argparse.Namespace) -> dict[str, Any]:
    """Every path at one chunk size: streams (rotating who goes first), then pings."""
    steps = max(1, int(size_kib * KiB) // schema.step_bytes)
    nbytes = schema.payload_bytes(steps)
    n = int(min(args.max_transfers, max(args.min_transfers, args.stream_mib * MiB // nbytes)))
    n_batches = max(1, -(-n // args.chunks_per_batch))
    n_plane = n_batches * args.chunks_per_batch
    pings = int(min(args.pings, max(5, 64 * MiB // nbytes)))
    dst = np.ones((steps, args.row_bytes // 4), dtype=np.float32) if args.consume == "copy" else None
    ray_path.prepare(steps)
    paths = ["shm", "plane", "ray"] + (["ray_ret"] if args.ray_return else [])
    shm = ShmPaths(schema, steps, args)
    try:
        stream = {
            "shm": lambda: n * nbytes / shm.shm_stream(n, dst),
            "plane": lambda: n_plane * nbytes / shm.plane_stream(n_batches),
            "ray": lambda: n * nbytes / ray_path.stream(steps, n, dst),
            "ray_ret": lambda: n * nbytes / ray_path.stream_return(steps, n, dst),
        }
        ping = {
            "shm": lambda: shm.shm_ping(dst),
            "plane": shm.plane_ping,
            "ray": lambda: ray_path.ping(steps, dst),
            "ray_ret": lambda: ray_path.ping_return(steps, dst),
        }
        # warm-up: touch every ring page, Ray's store, the planes' memory
        warm = min(n, 2 * args.depth)
        shm.shm_stream(warm, dst)
        shm.plane_stream(2)
        ray_path.stream(steps, warm, dst)
        if args.ray_return:
            ray_path.stream_return(steps, warm, dst)
        for _ in range(2):
            for which in paths:
                ping[which]()
        tp: dict[str, list[float]] = {k: [] for k in paths}
        lat: dict[str, list[float]] = {k: [] for k in paths}
        rtt: dict[str, list[float]] = {k: [] for k in paths}
        for r in range(args.repeats):
            k = r % len(paths)
            for which in paths[k:] + paths[:k]:  # rotate who goes first
                tp[which].append(stream[which]() / 1e9)
            for _ in range(pings):
                for which in paths:
                    one, rt = ping[which]()
                    if one is not None:
                        lat[which].append(one)
                    rtt[which].append(rt)
        plane_metrics = shm.planes["plane1"].metrics()
        plane_tp_metrics = shm.planes["plane"].metrics()
    finally:
        shm.close()
    med = {k: statistics.median(v) for k, v in tp.items()}
    mlat = {k: statistics.median(v) for k, v in lat.items() if v}
    mrtt = {k: statistics.median(v) for k, v in rtt.items()}
    row = {
        "size_kib": size_kib, "bytes": nbytes, "steps": steps, "transfers": n, "plane_transfers": n_plane,
        "pings": pings * args.repeats, "gbs": tp, "gbs_median": med,
        "one_way_s": lat, "one_way_s_median": mlat, "rtt_s": rtt, "rtt_s_median": mrtt,
        "shm_over_ray_gbs": med["shm"] / med["ray"], "plane_over_ray_gbs": med["plane"] / med["ray"],
        "ray_over_shm_one_way": mlat["ray"] / mlat["shm"],
        "ray_over_plane_one_way": mlat["ray"] / mlat["plane"] if "plane" in mlat else None,
        "ray_over_plane_rtt": mrtt["ray"] / mrtt["plane"],
        "shm_over_ray_ret_gbs": med["shm"] / med["ray_ret"] if "ray_ret" in med else None,
        "ray_ret_over_shm_one_way": mlat["ray_ret"] / mlat["shm"] if "ray_ret" in mlat else None,
        "plane_exposed_p50_s": plane_metrics.get("exposed_experience_path_p50_s"),
        "plane_experience_path_s": plane_metrics.get("experience_path_s"),
        "plane_moves": plane_tp_metrics.get("moves"),
        "plane_ring_errors": plane_tp_metrics.get("ring_errors", 0) + plane_metrics.get("ring_errors", 0),
    }
    print(f"  {_size(nbytes):>8}: " + ", ".join(f"{k} {v:.2f} GB/s" for k, v in med.items())
          + "; one-way " + ", ".join(f"{k} {v * 1e6:,.0f} us" for k, v in mlat.items()), flush=True)
    return row


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray

    schema = make_schema(args.row_bytes)
    biggest = max(args.sizes_kib) * KiB
    store = int(max(512 * MiB, 3 * args.depth * biggest))
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir="/tmp/ray-bench", object_store_memory=store,
             logging_level="WARNING", log_to_driver=False)
    try:
        ray_path = RayPath(schema, args)
        return [measure_size(schema, s, ray_path, args) for s in args.sizes_kib]
    finally:
        ray.shutdown()


def _size(nbytes: int) -> str:
    return f"{nbytes / MiB:g} MiB" if nbytes >= MiB else f"{nbytes / KiB:g} KiB"


def _us(x: float) -> str:
    return f"{x * 1e6:,.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-kib", type=float, nargs="+", default=[64, 1024, 8192, 65536])
    parser.add_argument("--row-bytes", type=int, default=1024, help="bytes per sample (one float32 column)")
    parser.add_argument("--depth", type=int, default=4, help="chunks in flight: ring records / Ray backpressure")
    parser.add_argument("--chunks-per-batch", type=int, default=4, help="plane throughput: chunks per batch")
    parser.add_argument("--stream-mib", type=int, default=256, help="bytes streamed per repeat and size")
    parser.add_argument("--min-transfers", type=int, default=8)
    parser.add_argument("--max-transfers", type=int, default=400)
    parser.add_argument("--pings", type=int, default=10, help="latency samples per repeat (fewer for big chunks)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-ray-return", dest="ray_return", action="store_false",
                        help="skip the second Ray path (the array as an actor task's return value)")
    parser.add_argument("--consume", choices=("copy", "view"), default="copy",
                        help="copy: the consumer copies each chunk into its own buffer; view: zero-copy views")
    parser.add_argument("--json", default="results/runtime_cross_process.json", help="write results here ('' : don't)")
    args = parser.parse_args()

    print(f"producer in a spawned process / a Ray actor; consumer copies chunks: {args.consume == 'copy'}; "
          f"depth {args.depth}; {args.repeats} repeats")
    t0 = time.time()
    rows = run(args)

    def cell(d: dict, key: str, fmt: Any) -> str:
        return "-" if d.get(key) is None else fmt(d[key])

    def ratio(num: float | None, den: float | None) -> str:
        return "-" if num is None or den is None else f"{num / den:.2f}"

    def gbs(x: float) -> str:
        return f"{x:.2f}"

    print("\nthroughput, GB/s (streamed; higher is better)")
    print(f"{'size':>8} {'shm':>7} {'plane':>7} {'ray put':>8} {'ray ret':>8} | {'shm/ray':>8} {'plane/ray':>10} "
          f"{'shm/ray ret':>12}")
    for r in rows:
        g = r["gbs_median"]
        print(f"{_size(r['bytes']):>8} {g['shm']:>7.2f} {g['plane']:>7.2f} {g['ray']:>8.2f} "
              f"{cell(g, 'ray_ret', gbs):>8} | {ratio(g['shm'], g['ray']):>8} {ratio(g['plane'], g['ray']):>10} "
              f"{ratio(g['shm'], g.get('ray_ret')):>12}")
    print("\nlatency of one chunk on an idle path, us (lower is better): one-way | round trip")
    print(f"{'size':>8} {'shm':>8} {'plane':>8} {'ray put':>8} {'ray ret':>8} | {'ray/shm':>8} {'ray/plane':>10} | "
          f"{'shm':>8} {'plane':>8} {'ray put':>8} {'ray ret':>8}")
    for r in rows:
        lat, rt = r["one_way_s_median"], r["rtt_s_median"]
        print(f"{_size(r['bytes']):>8} {_us(lat['shm']):>8} {cell(lat, 'plane', _us):>8} {_us(lat['ray']):>8} "
              f"{cell(lat, 'ray_ret', _us):>8} | {ratio(lat['ray'], lat['shm']):>8} "
              f"{ratio(lat['ray'], lat.get('plane')):>10} | {_us(rt['shm']):>8} {_us(rt['plane']):>8} "
              f"{_us(rt['ray']):>8} {cell(rt, 'ray_ret', _us):>8}")
    print("(medians over repeats. shm: raw ShmRing; plane: ShmRing -> ExperiencePlane -> next_batch (throughput: "
          f"{args.chunks_per_batch}-chunk batches; latency: 1-chunk batches); ray put: ray.put in an actor + ray.get "
          "here; ray ret: the array as an actor method's return value. one-way: producer's t_created (just before "
          "it starts writing / putting) -> the consumer holds the bytes; round trip: from the consumer's request.)")
    print(f"total {time.time() - t0:.1f} s")
    if args.json:
        write_json(args.json, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
