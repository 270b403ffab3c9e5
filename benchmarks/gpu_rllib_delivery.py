"""The RLlib integration's learner-side delivery path on one GPU, without Ray: staging, assembly, value pass.

A prepared script for a GPU machine (written for one H200; any CUDA GPU works). Needs only numpy,
torch with CUDA, pyyaml and this repository's ``conduit`` package (``PYTHONPATH=.``); it imports
neither Ray nor ``conduit.runtime.rllib``: what the integration does on the learner is re-expressed
here with :class:`~conduit.runtime.plane.ExperiencePlane` directly (``ingest``, ``next_batch``,
``peek``). Without CUDA it exits with status 2 and says why; ``--dry-run-cpu`` runs the same code
paths with learner device ``cpu`` and no pinned memory (the figures are then not GPU figures).

The batch is PPO-sized Atari experience: ``--rows`` rows (2000 and 8000) of 84x84x4 uint8
observations plus actions, rewards, terminateds, logp and value predictions (about 28 KB a row, 57 MB
for 2000 rows), sampled as ``--chunks`` chunks (8 and 16) of ``rows / chunks`` rows each, distinct
pageable numpy arrays. Every figure is measured with its baseline side by side in the same run
(alternating which goes first), one warm-up round excluded, medians over ``--repeats``:

1. **Pinned staging.** The whole batch host -> device: ``torch.from_numpy(x).to(device)`` of every
   column from pageable memory (stock), vs. the plane (learner on ``cuda:0``): the chunks ingested from
   pageable numpy one after the other, each written by its ingestion copy through the pinned staging
   ring (``dramN:pinned``) straight into the batch being assembled in the device tier (``gpuN:hbm``),
   then ``next_batch``; GB/s of payload and the ratio. ``.to(device, non_blocking=True)`` from an
   already-pinned copy is shown as the upper bound. The plane's batch is checked byte for byte.
2. **Device batch assembly while sampling.** A sampler thread hands over one chunk every
   ``--sample-ms / chunks`` ms (sampling takes about ``--sample-ms``, default 1 s; ``--chunk-ms`` sets
   the interval directly). Stock: the chunks
   are collected; after the last one, stacked on the host (``np.concatenate``) and copied with
   ``.to(device)``. Conduit: each chunk is ingested as it is sampled; the learner blocks in
   ``next_batch(update=k)`` and gets the batch when the last chunk has landed. Exposed latency = from
   the last chunk's hand-over to the batch usable as device tensors (synchronised), reported twice:
   from the last ``ingest`` call *returning* (the sampler's cost of that copy excluded) and from it
   being *called* (included; for stock both are the same).
3. **Value pass overlapped with sampling.** A small CNN value network on the device (RLlib's default
   Atari filters ``[16, 8, 4], [32, 4, 2], [64, 3, 2]``, then 256 units and the value head). Stock (what
   PPO's GAE does): after sampling, stack, copy the batch to the device and run the value pass over
   it. Conduit (``ValueStream`` of the RLlib integration, with ``plane.peek`` instead of the plane
   actor): while chunks arrive, ``peek`` the rows that have landed in batch *k* and run the value pass
   on them on a side CUDA stream, so when the last chunk lands only its rows remain; then
   ``next_batch``. Exposed latency = last chunk ingested -> values of the whole batch ready
   (``torch.cuda.synchronize`` at the measurement points). The values of both sides are compared
   row by row through the batch's selections (``allclose``; cuDNN's TF32 default loosens the tolerance).

``--budget-s`` (default 200) stops starting new configurations after that many seconds, so the default
run stays within about 4 minutes on an H200 including CUDA start-up; the total wall time is printed at
the end. ``--json PATH`` writes every figure (default ``$OUT/gpu_rllib_delivery.json`` when ``OUT`` is
set), rewritten after each section. A section that fails is recorded with its traceback and the others
still run (exit status 1 then; also when the values check fails). ``--quick`` is a smoke run (512 rows
in 4 chunks, 200 ms of sampling, 2 repeats).

    PYTHONPATH=. python benchmarks/gpu_rllib_delivery.py                       # on the GPU machine
    PYTHONPATH=. .venv/bin/python benchmarks/gpu_rllib_delivery.py --dry-run-cpu --quick   # here
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

try:  # the shared helpers import conduit (schema): the repository must be on PYTHONPATH
    from _plane_workload import make_payloads, pick_device, write_json
    from gpu_runtime import _TORCH_ERROR, Budget, Dev, _capacities, _check_batch, _median, torch
except ImportError as _exc:  # pragma: no cover - a set-up problem, said in one line
    print(f"gpu_rllib_delivery: cannot import the benchmark helpers or conduit ({_exc!r}); run it from the "
          "repository root with PYTHONPATH=.", file=sys.stderr)
    sys.exit(2)

MB = 1e6
OBS_SHAPE = (84, 84, 4)


# ---------------------------------------------------------------------------------------------- workload
def atari_schema() -> Any:
    """A PPO sample of an Atari env: stacked 84x84 frames and the usual per-step scalars."""
    from conduit.runtime.schema import Schema

    return Schema.of({
        "obs": (OBS_SHAPE, np.uint8),
        "actions": np.int64,
        "rewards": np.float32,
        "terminateds": np.uint8,
        "action_logp": np.float32,
        "vf_preds": np.float32,
    })


_PAYLOADS: dict[tuple[int, int], list[dict[str, np.ndarray]]] = {}  # (steps, chunks) -> the chunks, made once


class Config:
    """One batch shape: ``chunks`` chunks of ``steps`` rows (the payloads are made once and shared)."""

    def __init__(self, schema: Any, rows: int, chunks: int):
        self.schema = schema
        self.chunks = chunks
        self.steps = max(1, rows // chunks)
        self.rows = self.steps * chunks
        self.nbytes = schema.payload_bytes(self.rows)
        key = (self.steps, chunks)
        if key not in _PAYLOADS:
            _PAYLOADS[key] = make_payloads(schema, self.steps, chunks, seed=self.rows + chunks)
        self.payloads = _PAYLOADS[key]

    @property
    def label(self) -> str:
        return f"{self.rows} rows x {self.chunks}"

    def stack(self) -> dict[str, np.ndarray]:
        """Stock: the sampled chunks concatenated on the host (the train batch)."""
        return {k: np.concatenate([p[k] for p in self.payloads]) for k in self.schema.names}

    def row_order(self, selections: list[tuple[Any, Any]]) -> np.ndarray:
        """For each row of a plane batch, its row in :meth:`stack`'s order (chunk ids are ``(v, i)``)."""
        return np.concatenate([i * self.steps + np.asarray(idx, dtype=np.int64) for (_, i), idx in selections])


class Plane:
    """An OnPolicy plane for one configuration; every round is the next policy version (= update)."""

    def __init__(self, dev: Dev, cfg: Config):
        from conduit.contracts import OnPolicy
        from conduit.runtime.plane import ExperiencePlane

        self.cfg = cfg
        self.plane = ExperiencePlane(cfg.schema, OnPolicy(), batch_steps=cfg.rows, learners={"learner0": dev.device},
                                     capacities=_capacities(cfg.schema, cfg.steps, cfg.chunks, dev),
                                     verify_checksums=False)
        self.version = 0

    def next_version(self) -> int:
        v = self.version
        self.version += 1
        return v

    def ingest(self, v: int, i: int) -> None:
        self.plane.ingest(self.cfg.payloads[i], policy_version=v, chunk_id=(v, i), timeout=30)

    def describe(self) -> dict[str, Any]:
        m = self.plane.metrics()
        return {
            "tiers": {t: d["medium"] for t, d in m["tiers"].items()}, "unavailable_tiers": m["unavailable_tiers"],
            "moves": m.get("moves", 0), "peeks": m.get("peeks", 0),
            "bandwidth_gbs": {r: v["bandwidth"] / 1e9 for r, v in m["bandwidth"].items() if v["samples"]},
        }

    def close(self) -> None:
        self.plane.close()


class Sampler(threading.Thread):
    """Hands chunk ``i`` over at ``t0 + (i + 1) * period`` (the EnvRunners sampling), calling ``hand(i)``."""

    def __init__(self, chunks: int, period_s: float, hand: Callable[[int], None]):
        super().__init__(name="bench-sampler", daemon=True)
        self.chunks, self.period_s, self.hand = chunks, period_s, hand
        self.t_called = self.t_last = float("nan")
        self.hand_ms: list[float] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            t0 = time.perf_counter()
            for i in range(self.chunks):
                wait = t0 + (i + 1) * self.period_s - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                t = time.perf_counter()
                self.hand(i)
                self.t_last = time.perf_counter()
                self.t_called = t
                self.hand_ms.append((self.t_last - t) * 1e3)
        except BaseException as exc:  # noqa: BLE001 - re-raised by finish()
            self.error = exc

    def finish(self) -> Sampler:
        self.join(timeout=120)
        if self.is_alive():
            raise RuntimeError("the sampler thread did not finish within 120 s")
        if self.error is not None:
            raise RuntimeError("the sampler failed") from self.error
        return self


def _as_tensor(x: Any) -> Any:
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def _to_device(dev: Dev, cols: dict[str, np.ndarray], non_blocking: bool = False) -> dict[str, Any]:
    return {k: torch.from_numpy(v).to(dev.torch_device, non_blocking=non_blocking) if isinstance(v, np.ndarray)
            else v.to(dev.torch_device, non_blocking=non_blocking) for k, v in cols.items()}


def _configs(schema: Any, args: argparse.Namespace) -> list[Config]:
    return [Config(schema, rows, chunks) for rows in args.rows for chunks in args.chunks]


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


# ---------------------------------------------------------------------------------------------- 1. staging
def _stage_stock(dev: Dev, host: dict[str, np.ndarray]) -> None:
    _to_device(dev, host)
    dev.sync()


def _stage_pinned(dev: Dev, pinned: dict[str, Any]) -> None:
    _to_device(dev, pinned, non_blocking=True)
    dev.sync()


def _stage_plane(dev: Dev, plane: Plane, check: bool = False) -> None:
    v = plane.next_version()
    for i in range(plane.cfg.chunks):
        plane.ingest(v, i)
    b = plane.plane.next_batch(update=v, timeout=60)
    b.tensors()
    dev.sync()
    if check:
        _check_batch(b, plane.cfg.payloads, key=lambda i: (v, i))
    b.release()


def staging(dev: Dev, args: argparse.Namespace, budget: Budget, schema: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"configs": [], "skipped": []}
    for cfg in _configs(schema, args):
        if not budget.has(10 + cfg.nbytes / 1e9 * args.repeats):
            out["skipped"].append(f"{cfg.label}: time budget ({budget.left:.0f} s left)")
            continue
        host = cfg.stack()
        plane = Plane(dev, cfg)
        try:
            ways: dict[str, Callable[[], None]] = {"pageable .to()": partial(_stage_stock, dev, host),
                                                   "plane (pinned ring)": partial(_stage_plane, dev, plane)}
            if dev.can_pin:
                pinned = {k: torch.from_numpy(v).pin_memory() for k, v in host.items()}
                ways["pinned .to() (upper bound)"] = partial(_stage_pinned, dev, pinned)
            _stage_plane(dev, plane, check=True)  # warm-up, and the delivered bytes checked once
            for fn in ways.values():
                fn()
            secs: dict[str, list[float]] = {k: [] for k in ways}
            names = list(ways)
            for r in range(args.repeats):
                k = r % len(names)
                for name in names[k:] + names[:k]:
                    t0 = time.perf_counter()
                    ways[name]()
                    secs[name].append(time.perf_counter() - t0)
            info = plane.describe()
        finally:
            plane.close()
        gbs = {k: cfg.nbytes / _median(v) / 1e9 for k, v in secs.items()}
        out["configs"].append({
            "rows": cfg.rows, "chunks": cfg.chunks, "bytes": cfg.nbytes,
            "ms": {k: [s * 1e3 for s in v] for k, v in secs.items()},
            "ms_median": {k: _median(v) * 1e3 for k, v in secs.items()}, "gbs": gbs,
            "plane_over_pageable": _ratio(gbs["plane (pinned ring)"], gbs["pageable .to()"]),
            "checked": True, "plane": info,
        })
    return out


def print_staging(res: dict[str, Any]) -> None:
    print("\n1. pinned staging: the whole batch host -> device from pageable numpy (payload GB/s, median)")
    for c in res["configs"]:
        ways = "  ".join(f"{k} {v:6.2f}" for k, v in c["gbs"].items())
        print(f"  {c['rows']:>6} rows x {c['chunks']:>2} chunks ({c['bytes'] / MB:6.1f} MB): {ways}  | "
              f"plane / pageable .to(): x{c['plane_over_pageable']:.2f}")
        p = c["plane"]
        est = ", ".join(f"{r} {g:.1f} GB/s" for r, g in p["bandwidth_gbs"].items())
        print(f"      plane tiers: {', '.join(f'{t} ({m})' for t, m in p['tiers'].items())}; background moves "
              f"{p['moves']}; copy estimates: {est}")
        for t, why in p["unavailable_tiers"].items():
            print(f"      (no {t}: {why}; the plane's batch is in host memory, .to() is a no-op: not GPU figures)")
    for s in res["skipped"]:
        print(f"  skipped: {s}")


# ---------------------------------------------------------------------------------------------- 2. assembly
def _period(args: argparse.Namespace, cfg: Config) -> float:
    """Seconds between two chunks: ``--chunk-ms``, else ``--sample-ms`` spread over the batch's chunks."""
    return args.chunk_ms / 1e3 if args.chunk_ms else args.sample_ms / 1e3 / cfg.chunks


def _round_time(args: argparse.Namespace) -> float:
    sampling = args.chunk_ms / 1e3 * max(args.chunks) if args.chunk_ms else args.sample_ms / 1e3
    return 2 * (args.repeats + 1) * (sampling + 0.3) + 5


def _assemble_stock(dev: Dev, cfg: Config, period: float) -> dict[str, float]:
    got: list[int] = []
    s = Sampler(cfg.chunks, period, got.append)
    s.start()
    s.finish()  # the train batch is built after sampling ends
    t0 = time.perf_counter()
    host = cfg.stack()
    t1 = time.perf_counter()
    _to_device(dev, host)
    dev.sync()
    t2 = time.perf_counter()
    return {"exposed_ms": (t2 - s.t_last) * 1e3, "exposed_from_call_ms": (t2 - s.t_called) * 1e3,
            "stack_ms": (t1 - t0) * 1e3, "copy_ms": (t2 - t1) * 1e3}


def _assemble_plane(dev: Dev, plane: Plane, period: float) -> dict[str, float]:
    v = plane.next_version()
    s = Sampler(plane.cfg.chunks, period, partial(plane.ingest, v))
    s.start()
    t_ask = time.perf_counter()
    b = plane.plane.next_batch(update=v, timeout=60)
    b.tensors()
    dev.sync()
    t_ready = time.perf_counter()
    s.finish()
    b.release()
    t_ready = max(t_ready, s.t_last)  # usable before the last ingest call returned: 0 exposed
    return {"exposed_ms": (t_ready - s.t_last) * 1e3, "exposed_from_call_ms": (t_ready - s.t_called) * 1e3,
            "blocked_ms": (t_ready - t_ask) * 1e3, "ingest_ms": _median(s.hand_ms)}


def _medians(got: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {side: {k: _median([x[k] for x in xs]) for k in xs[0]} for side, xs in got.items()}


def _summary(cfg: Config, period: float, got: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    med = _medians(got)
    return {
        "rows": cfg.rows, "chunks": cfg.chunks, "bytes": cfg.nbytes, "period_ms": period * 1e3,
        "rounds": got, "median": med,
        "stock_over_conduit": _ratio(med["stock"]["exposed_ms"], med["conduit"]["exposed_ms"]),
        "stock_over_conduit_from_call": _ratio(med["stock"]["exposed_from_call_ms"],
                                               med["conduit"]["exposed_from_call_ms"]),
    }


def assembly(dev: Dev, args: argparse.Namespace, budget: Budget, schema: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"sample_ms": args.sample_ms, "chunk_ms": args.chunk_ms, "configs": [], "skipped": []}
    for cfg in _configs(schema, args):
        if not budget.has(_round_time(args)):
            out["skipped"].append(f"{cfg.label}: time budget ({budget.left:.0f} s left)")
            continue
        period = _period(args, cfg)
        plane = Plane(dev, cfg)
        try:
            got = _alternate({"stock": partial(_assemble_stock, dev, cfg, period),
                              "conduit": partial(_assemble_plane, dev, plane, period)}, args.repeats)
            info = plane.describe()
        finally:
            plane.close()
        out["configs"].append({**_summary(cfg, period, got), "plane": info})
    return out


def _alternate(ways: dict[str, Callable[[], dict[str, float]]], repeats: int) -> dict[str, list[dict[str, float]]]:
    """One warm-up round of each side, then ``repeats`` rounds alternating which side goes first."""
    for fn in ways.values():
        fn()
    names = list(ways)
    got: dict[str, list[dict[str, float]]] = {k: [] for k in names}
    for r in range(repeats):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            got[name].append(ways[name]())
    return got


def _sampling(res: dict[str, Any]) -> str:
    if res["chunk_ms"]:
        return f"a chunk every {res['chunk_ms']:g} ms"
    return f"~{res['sample_ms']:g} ms of sampling per batch"


def print_assembly(res: dict[str, Any]) -> None:
    print(f"\n2. device batch assembly while sampling ({_sampling(res)}); exposed = last chunk "
          "handed over -> batch usable as device tensors (ms, median)")
    for c in res["configs"]:
        s, d = c["median"]["stock"], c["median"]["conduit"]
        print(f"  {c['rows']:>6} rows x {c['chunks']:>2} chunks ({c['bytes'] / MB:6.1f} MB, a chunk every "
              f"{c['period_ms']:.1f} ms)")
        print(f"      stock   (stack + .to()): exposed {s['exposed_ms']:8.2f}  (stack {s['stack_ms']:.2f} + copy "
              f"{s['copy_ms']:.2f})")
        print(f"      conduit (next_batch)   : exposed {d['exposed_ms']:8.2f} from the last ingest returning, "
              f"{d['exposed_from_call_ms']:.2f} from its call (ingest call {d['ingest_ms']:.2f} ms each)")
        print(f"      stock / conduit: x{c['stock_over_conduit']:.1f} (from return), "
              f"x{c['stock_over_conduit_from_call']:.1f} (from call)")
    for s in res["skipped"]:
        print(f"  skipped: {s}")


# ---------------------------------------------------------------------------------------------- 3. value pass
def value_net(dev: Dev) -> Any:
    """RLlib's default Atari CNN filters, a 256-unit layer and the value head; input NHWC uint8 frames."""
    nn = torch.nn

    class ValueNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = nn.Sequential(
                nn.Conv2d(OBS_SHAPE[2], 16, 8, 4), nn.ReLU(), nn.Conv2d(16, 32, 4, 2), nn.ReLU(),
                nn.Conv2d(32, 64, 3, 2), nn.ReLU(), nn.Flatten())
            with torch.no_grad():
                n = self.convs(torch.zeros(1, OBS_SHAPE[2], *OBS_SHAPE[:2])).shape[1]
            self.head = nn.Sequential(nn.Linear(n, 256), nn.ReLU(), nn.Linear(256, 1))

        def forward(self, obs: Any) -> Any:
            x = obs.permute(0, 3, 1, 2).float().div_(255.0)
            return self.head(self.convs(x)).squeeze(-1)

    torch.manual_seed(0)
    return ValueNet().to(dev.torch_device).eval()


def _values_stock(dev: Dev, cfg: Config, period: float, net: Any, last: dict[str, Any]) -> dict[str, float]:
    """Stock PPO: after sampling, the train batch on the device, then GAE's value pass over all of it."""
    s = Sampler(cfg.chunks, period, lambda i: None)
    s.start()
    s.finish()
    t0 = time.perf_counter()
    host = cfg.stack()
    t1 = time.perf_counter()
    obs = _to_device(dev, host)["obs"]
    dev.sync()
    t2 = time.perf_counter()
    with torch.no_grad():
        values = net(obs)
    dev.sync()
    t3 = time.perf_counter()
    last["stock"] = values.cpu().numpy()
    return {"exposed_ms": (t3 - s.t_last) * 1e3, "exposed_from_call_ms": (t3 - s.t_called) * 1e3,
            "stack_ms": (t1 - t0) * 1e3, "copy_ms": (t2 - t1) * 1e3, "values_ms": (t3 - t2) * 1e3}


def _values_plane(dev: Dev, plane: Plane, period: float, net: Any, vals: Any, last: dict[str, Any]) -> dict[str, float]:
    """ValueStream: the value pass on every piece of batch *k* as it lands (``peek``), on a side stream."""
    cfg = plane.cfg
    v = plane.next_version()
    s = Sampler(cfg.chunks, period, partial(plane.ingest, v))
    if dev.cuda:
        dev.side.wait_stream(torch.cuda.current_stream(dev.torch_device))
    s.start()
    start, pieces, deadline = 0, 0, time.monotonic() + 60
    with torch.no_grad():
        while True:
            pk = plane.plane.peek(update=v, start=start, timeout=0.5)
            if pk.stop > start:
                with dev.on(dev.side):
                    vals[start : pk.stop] = net(_as_tensor(pk.columns["obs"]))
                start = pk.stop
                pieces += 1
            if pk.done:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"update {v}: {start} of {cfg.rows} rows landed after 60 s")
        b = plane.plane.next_batch(update=v, timeout=60)
        dev.sync()
        t_ready = time.perf_counter()
    s.finish()
    t_ready = max(t_ready, s.t_last)  # ready before the last ingest call returned: 0 exposed
    last["conduit"] = (vals.cpu().numpy().copy(), cfg.row_order(b.selections))
    b.release()
    return {"exposed_ms": (t_ready - s.t_last) * 1e3, "exposed_from_call_ms": (t_ready - s.t_called) * 1e3,
            "pieces": float(pieces), "ingest_ms": _median(s.hand_ms)}


def value_pass(dev: Dev, args: argparse.Namespace, budget: Budget, schema: Any) -> dict[str, Any]:
    net = value_net(dev)
    tf32 = bool(dev.cuda and torch.backends.cudnn.allow_tf32)
    rtol, atol = (1e-3, 1e-4) if tf32 else (1e-4, 1e-5)
    out: dict[str, Any] = {"sample_ms": args.sample_ms, "chunk_ms": args.chunk_ms, "tf32": tf32, "rtol": rtol, "atol": atol,
                           "net": str(net), "configs": [], "skipped": []}
    for cfg in _configs(schema, args):
        if not budget.has(_round_time(args)):
            out["skipped"].append(f"{cfg.label}: time budget ({budget.left:.0f} s left)")
            continue
        period = _period(args, cfg)
        plane = Plane(dev, cfg)
        vals = torch.empty(cfg.rows, device=dev.torch_device)
        last: dict[str, Any] = {}
        try:
            got = _alternate({"stock": partial(_values_stock, dev, cfg, period, net, last),
                              "conduit": partial(_values_plane, dev, plane, period, net, vals, last)}, args.repeats)
            info = plane.describe()
        finally:
            plane.close()
        mine, order = last["conduit"]
        ref = last["stock"][order]
        diff = np.abs(mine - ref)
        out["configs"].append({
            **_summary(cfg, period, got),
            "values_allclose": bool(np.allclose(mine, ref, rtol=rtol, atol=atol)),
            "values_max_abs_diff": float(diff.max()), "values_max_abs": float(np.abs(ref).max()),
            "plane": info,
        })
    return out


def print_value_pass(res: dict[str, Any]) -> None:
    print(f"\n3. value pass overlapped with sampling ({_sampling(res)}); exposed = last chunk handed over -> "
          "values of the whole batch ready on the device (ms, median)")
    for c in res["configs"]:
        s, d = c["median"]["stock"], c["median"]["conduit"]
        print(f"  {c['rows']:>6} rows x {c['chunks']:>2} chunks ({c['bytes'] / MB:6.1f} MB, a chunk every "
              f"{c['period_ms']:.1f} ms)")
        print(f"      stock   (stack, .to(), value pass): exposed {s['exposed_ms']:8.2f}  (stack {s['stack_ms']:.2f} "
              f"+ copy {s['copy_ms']:.2f} + values {s['values_ms']:.2f})")
        print(f"      conduit (peek + side-stream pass)  : exposed {d['exposed_ms']:8.2f} from the last ingest "
              f"returning, {d['exposed_from_call_ms']:.2f} from its call ({d['pieces']:.0f} pieces)")
        ok = "PASS" if c["values_allclose"] else "FAIL"
        print(f"      stock / conduit: x{c['stock_over_conduit']:.1f} (from return), "
              f"x{c['stock_over_conduit_from_call']:.1f} (from call);  values check {ok} (max |diff| "
              f"{c['values_max_abs_diff']:.2e}, max |v| {c['values_max_abs']:.2e}, rtol {res['rtol']:g}, "
              f"atol {res['atol']:g}{', TF32' if res['tf32'] else ''})")
    for s in res["skipped"]:
        print(f"  skipped: {s}")


# ---------------------------------------------------------------------------------------------- main
SECTIONS = [("1", "staging", staging, print_staging), ("2", "assembly", assembly, print_assembly),
            ("3", "value_pass", value_pass, print_value_pass)]


def _json_path(arg: str | None) -> Path | None:
    if arg:
        return Path(arg)
    out = os.environ.get("OUT")
    return Path(out) / "gpu_rllib_delivery.json" if out else None


def main() -> int:
    t_start = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run-cpu", action="store_true", help="the same code paths on the CPU (logic check)")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--sections", default="123", help="which sections to run (digits)")
    parser.add_argument("--rows", type=int, nargs="+", default=None, help="batch rows (default 2000 8000)")
    parser.add_argument("--chunks", type=int, nargs="+", default=None, help="chunks per batch (default 8 16)")
    parser.add_argument("--sample-ms", type=float, default=None, help="sampling time of a batch (default 1000)")
    parser.add_argument("--chunk-ms", type=float, default=None,
                        help="time between two chunks (T; default sample-ms / chunks)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per side (default 5)")
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (a smoke run)")
    parser.add_argument("--budget-s", type=float, default=200.0, help="start no new configuration after this")
    parser.add_argument("--json", default=None, help="write every figure here (default $OUT/gpu_rllib_delivery.json)")
    args = parser.parse_args()
    quick = {"rows": [512], "chunks": [4], "sample_ms": 200.0, "repeats": 2}
    full = {"rows": [2000, 8000], "chunks": [8, 16], "sample_ms": 1000.0, "repeats": 5}
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)

    if torch is None:
        print(f"gpu_rllib_delivery: torch is not importable ({_TORCH_ERROR}); this script needs PyTorch",
              file=sys.stderr)
        return 2
    device = pick_device("gpu_rllib_delivery", args.dry_run_cpu, args.device, torch)
    if device is None:
        return 2
    if args.dry_run_cpu:
        print("gpu_rllib_delivery: DRY RUN on the CPU (learner device cpu, no pinned memory): same code paths, "
              "the figures are NOT GPU figures")
    else:
        torch.cuda.set_device(torch.device(device))
    try:
        import conduit.runtime.plane  # noqa: F401 - needs pyyaml (and networkx) besides numpy/torch
    except ImportError as exc:
        print(f"gpu_rllib_delivery: cannot import conduit.runtime.plane ({exc!r}); run from the repository root "
              "with PYTHONPATH=.", file=sys.stderr)
        return 2

    budget = Budget(args.budget_s)
    dev = Dev(device)
    env: dict[str, Any] = {"section": "env", "dry_run_cpu": args.dry_run_cpu, "device": device,
                           "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                           "numpy": np.__version__, "host": platform.node(), "cpus": os.cpu_count()}
    if dev.cuda:
        props = torch.cuda.get_device_properties(dev.torch_device)
        env["gpu"] = {"name": props.name, "memory_bytes": props.total_memory,
                      "capability": f"{props.major}.{props.minor}"}
        print(f"device {device}: {props.name}, {props.total_memory / 2**30:.0f} GiB; torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}")
    schema = atari_schema()
    print(f"batch: {args.rows} rows of {schema.step_bytes} B ({OBS_SHAPE} uint8 obs + 5 scalars) in {args.chunks} "
          f"chunks; {args.repeats} repeats per side; sampling "
          + (f"a chunk every {args.chunk_ms:g} ms" if args.chunk_ms else f"~{args.sample_ms:g} ms per batch"))
    path = _json_path(args.json)
    rows: list[dict[str, Any]] = [env]
    failed = False
    for digit, name, fn, show in SECTIONS:
        if digit not in args.sections:
            continue
        t0 = time.monotonic()
        try:
            res = fn(dev, args, budget, schema)
            res["seconds"] = time.monotonic() - t0
            show(res)
            rows.append({"section": name, **res})
        except Exception as exc:  # noqa: BLE001 - recorded; the other sections still run
            failed = True
            rows.append({"section": name, "error": "".join(traceback.format_exception(exc))})
            print(f"\n{digit}. FAILED: {exc!r}", file=sys.stderr)
            traceback.print_exc()
        if path is not None:
            write_json(path, args, rows)
    checks = [c["values_allclose"] for r in rows if r["section"] == "value_pass" for c in r.get("configs", [])]
    if checks and not all(checks):
        failed = True
        print("\nvalues check FAILED: the streamed values differ from the whole-batch pass", file=sys.stderr)
    wall = time.monotonic() - t_start
    print(f"\ntotal wall time {wall:.1f} s" + (" (DRY RUN on the CPU: not GPU figures)" if args.dry_run_cpu else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
