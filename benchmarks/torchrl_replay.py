"""TorchRL's replay buffers against Conduit's, side by side in one run.

Buffers (each a ``TensorDictReplayBuffer`` as a TorchRL user builds it, batch ``--batch`` steps):

* ``lazy``: ``LazyTensorStorage(capacity)`` (tensors in this process's memory);
* ``memmap``: ``LazyMemmapStorage(capacity, scratch_dir=...)`` (memory-mapped files);
* ``ray``: ``RayReplayBuffer`` (the buffer in a Ray actor; skipped with a reason if it cannot start);
* ``conduit``: :class:`~conduit.runtime.torchrl.ConduitReplayBuffer` (the plane's Replay table).

Frames: ``cartpole`` (observation float32[4], action, reward, done, next observation: 45 B/step) and
``atari`` (observation uint8[84, 84, 4], action, reward, done: 28 KiB/step). Samplers: ``uniform``
(TorchRL ``RandomSampler``; Conduit's uniform sampler) and ``prioritized`` (TorchRL
``PrioritizedSampler(alpha=0.6, beta=0.4)``; Conduit ``alpha=0.6, beta=0.4``). TorchRL's
``PrioritizedSampler`` needs its C++ extension; when the extension does not load, the error is
printed and that row is skipped.

Figures, medians over ``--repeats`` rounds (the buffers take turns inside each round, in a rotating
order, so drift and other tenants hit them all): ``extend`` (``--chunk`` steps per call, a table kept
full so every call evicts) and ``sample`` (``--batch`` steps; for Conduit the TensorDict is dropped
before the next call, which hands its batch back to the plane) as per-call latency and steps/s and
GB/s. Ratios are Conduit over ``lazy``.

**The loop** (``--loop-seconds``, 0 to skip): ``--workers`` collector-like worker processes
(``spawn``) each get the buffer the way TorchRL's multi-process collectors hand it over (``share()``,
then pickled to the process) and ``extend`` it with ``--chunk``-step batches as fast as they can,
while this process calls ``sample()`` as fast as it can. Reported: steps written per second (all
workers) and steps sampled per second, for ``lazy`` and ``conduit``; the target is Conduit's loop
throughput (written + sampled steps/s) >= 1.5x ``lazy`` for atari frames and >= 0.8x for cartpole
frames.

    .venv/bin/python benchmarks/torchrl_replay.py [--frames cartpole atari] [--repeats 5] [--loop-seconds 8]

Runs with ``torch.set_num_threads(1)`` (two torch threads on a 2-core machine made small writes 40x
slower). Ray is started locally (``RAY_AUTH_MODE=disabled``, ``num_cpus=1``, ``_temp_dir``) and shut
down at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("RL_WARNINGS", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch
from tensordict import TensorDict

GB = 1e9


def make_frames(kind: str, steps: int, seed: int = 0) -> TensorDict:
    """``steps`` transitions of the given kind (random content, fixed per seed)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "cartpole":
        obs = torch.randn(steps, 4, generator=g)
        return TensorDict({"observation": obs, "action": torch.randint(0, 2, (steps,), generator=g),
                           "next": {"observation": obs + 0.01, "reward": torch.ones(steps, 1),
                                    "done": torch.zeros(steps, 1, dtype=torch.bool)}}, batch_size=[steps])
    if kind == "atari":
        return TensorDict({"observation": torch.randint(0, 255, (steps, 84, 84, 4), dtype=torch.uint8, generator=g),
                           "action": torch.randint(0, 6, (steps,), generator=g),
                           "next": {"reward": torch.ones(steps, 1), "done": torch.zeros(steps, 1, dtype=torch.bool)}},
                          batch_size=[steps])
    raise ValueError(f"--frames: unknown kind {kind!r} (cartpole, atari)")


def step_bytes(td: TensorDict) -> int:
    return sum(v.element_size() * v[0].numel() for v in td.values(True, True))


# ---------------------------------------------------------------------------------- the buffers
def make_buffer(kind: str, sampler: str, capacity: int, batch: int, scratch: Path, example: TensorDict) -> Any:
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers import PrioritizedSampler, RandomSampler

    def torchrl_sampler() -> Any:
        if sampler == "uniform":
            return RandomSampler()
        return PrioritizedSampler(max_capacity=capacity, alpha=0.6, beta=0.4)

    if kind == "lazy":
        return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=torchrl_sampler(), batch_size=batch)
    if kind == "memmap":
        d = scratch / f"memmap-{sampler}-{time.monotonic_ns()}"
        return TensorDictReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=d), sampler=torchrl_sampler(),
                                      batch_size=batch)
    if kind == "ray":
        from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer

        return RayReplayBuffer(storage=LazyTensorStorage(capacity), sampler=torchrl_sampler(), batch_size=batch,
                               replay_buffer_cls=TensorDictReplayBuffer,
                               ray_init_config={"num_cpus": 1, "include_dashboard": False,
                                                "_temp_dir": str(scratch / "ray")})
    if kind == "conduit":
        from conduit.runtime.torchrl import ConduitReplayBuffer

        prio = {"alpha": 0.6, "beta": 0.4} if sampler == "prioritized" else {}
        return ConduitReplayBuffer(capacity=capacity, batch_size=batch, example=example, seed=0, **prio)
    raise ValueError(kind)


def close_buffer(rb: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if hasattr(rb, "close") and type(rb).__name__ == "ConduitReplayBuffer":
        out["audit_violations"] = rb.close().violations
    elif hasattr(rb, "shutdown"):
        with contextlib.suppress(Exception):
            rb.shutdown()
    return out


def timed(fn: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


# ---------------------------------------------------------------------------------- extend / sample
def bench_calls(frames: str, sampler: str, kinds: list[str], args: argparse.Namespace, scratch: Path) -> list[dict]:
    chunk = make_frames(frames, args.chunk, seed=1)
    sb = step_bytes(chunk)
    capacity = args.capacity[frames]
    buffers: dict[str, Any] = {}
    rows: list[dict] = []
    for kind in kinds:
        try:
            rb = make_buffer(kind, sampler, capacity, args.batch, scratch, chunk)
            for _ in range(max(1, capacity // args.chunk)):  # fill the table: every timed extend evicts
                rb.extend(chunk.clone())
            s = rb.sample()
            if sampler == "prioritized":
                s.set("td_error", torch.rand(args.batch))
                rb.update_tensordict_priority(s)
            del s
            buffers[kind] = rb
        except Exception as exc:  # noqa: BLE001 - a buffer that cannot run here is reported, not fatal
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            print(f"  {frames}/{sampler}/{kind}: SKIPPED - {msg}", flush=True)
            rows.append({"frames": frames, "sampler": sampler, "buffer": kind, "skipped": msg})
            if kind == "ray":
                with contextlib.suppress(Exception):
                    import ray

                    ray.shutdown()
    ext: dict[str, list[float]] = {k: [] for k in buffers}
    smp: dict[str, list[float]] = {k: [] for k in buffers}
    upd: dict[str, list[float]] = {k: [] for k in buffers}
    order = list(buffers)
    for r in range(args.repeats):
        for kind in order[r % len(order):] + order[:r % len(order)] if order else []:
            rb = buffers[kind]
            calls = args.calls if kind != "ray" else max(2, args.calls // 4)
            ext[kind] += timed(lambda rb=rb, kind=kind: rb.extend(chunk.clone() if kind == "ray" else chunk), calls)

            def one_sample(rb=rb, kind=kind) -> None:
                s = rb.sample()
                del s

            smp[kind] += timed(one_sample, calls)
            if sampler == "prioritized":
                s = rb.sample()
                prio = torch.rand(args.batch)

                def one_update(rb=rb, s=s, prio=prio) -> None:
                    s.set("td_error", prio)
                    rb.update_tensordict_priority(s)

                upd[kind] += timed(one_update, calls)
                del s
    for kind, rb in buffers.items():
        e, s = statistics.median(ext[kind]), statistics.median(smp[kind])
        row = {"frames": frames, "sampler": sampler, "buffer": kind, "step_bytes": sb,
               "extend_ms": e * 1e3, "extend_steps_s": args.chunk / e, "extend_GBs": args.chunk * sb / e / GB,
               "sample_ms": s * 1e3, "sample_steps_s": args.batch / s, "sample_GBs": args.batch * sb / s / GB}
        if upd[kind]:
            row["update_priority_ms"] = statistics.median(upd[kind]) * 1e3
        row.update(close_buffer(rb))
        rows.append(row)
    if "ray" in buffers:
        import ray

        ray.shutdown()
    return rows


# ---------------------------------------------------------------------------------- the loop
def _loop_worker(rb: Any, frames: str, chunk: int, seed: int, stop: Any, counter: Any, ready: Any) -> None:
    torch.set_num_threads(1)
    td = make_frames(frames, chunk, seed=seed)
    ready.release()
    n = 0
    while not stop.is_set():
        rb.extend(td)
        n += chunk
    with counter.get_lock():
        counter.value += n
    if hasattr(rb, "close"):
        rb.close()


def bench_loop(frames: str, kind: str, args: argparse.Namespace, scratch: Path) -> dict:
    ctx = mp.get_context("spawn")
    chunk = make_frames(frames, args.chunk, seed=1)
    rb = make_buffer(kind, "uniform", args.capacity[frames], args.batch, scratch, chunk)
    if kind != "conduit":  # TorchRL's collectors initialise a lazy storage before sharing it (fake frame, empty)
        rb.extend(chunk[:1].clone())
        rb.empty()
    rb.share()
    stop, counter, ready = ctx.Event(), ctx.Value("q", 0), ctx.Semaphore(0)
    procs = [ctx.Process(target=_loop_worker, args=(rb, frames, args.chunk, i, stop, counter, ready), daemon=True)
             for i in range(args.workers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire(timeout=120)
    deadline = time.monotonic() + 60
    while len(rb) < args.batch and time.monotonic() < deadline:
        time.sleep(0.01)
    w0 = rb.write_count
    sampled = 0
    t0 = time.perf_counter()
    end = t0 + args.loop_seconds
    while time.perf_counter() < end:
        s = rb.sample()
        sampled += s.batch_size[0]
        del s
    elapsed = time.perf_counter() - t0
    written = rb.write_count - w0
    stop.set()
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    row = {"frames": frames, "buffer": kind, "workers": args.workers, "seconds": elapsed,
           "written_steps_s": written / elapsed, "sampled_steps_s": sampled / elapsed,
           "loop_steps_s": (written + sampled) / elapsed, "step_bytes": step_bytes(chunk)}
    row.update(close_buffer(rb))
    return row


# ---------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", nargs="+", default=["cartpole", "atari"])
    p.add_argument("--samplers", nargs="+", default=["uniform", "prioritized"])
    p.add_argument("--buffers", nargs="+", default=["lazy", "memmap", "ray", "conduit"])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--chunk", type=int, default=256, help="steps per extend call")
    p.add_argument("--capacity-cartpole", type=int, default=100_000)
    p.add_argument("--capacity-atari", type=int, default=8_192)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, default=20, help="timed calls per buffer per round")
    p.add_argument("--loop-seconds", type=float, default=8.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default="results/torchrl_replay.json")
    args = p.parse_args(argv)
    args.capacity = {"cartpole": args.capacity_cartpole, "atari": args.capacity_atari}
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    scratch = Path(tempfile.mkdtemp(prefix="torchrl-bench-"))
    rows: list[dict] = []
    loops: list[dict] = []
    try:
        for frames in args.frames:
            for sampler in args.samplers:
                print(f"== {frames} frames, {sampler} sampler", flush=True)
                rows += bench_calls(frames, sampler, args.buffers, args, scratch)
                gc.collect()
        if args.loop_seconds > 0:
            for frames in args.frames:
                for kind in ("lazy", "conduit"):
                    print(f"== loop: {args.workers} workers -> {kind} -> sample(), {frames} frames", flush=True)
                    loops.append(bench_loop(frames, kind, args, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(rows, loops)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"calls": rows, "loop": loops, "argv": sys.argv[1:]}, indent=1))
    print(f"\nwrote {out}")
    return 0


def report(rows: list[dict], loops: list[dict]) -> None:
    print("\nmedians; ratio = conduit / lazy (steps/s)")
    print(f"{'frames':9}{'sampler':12}{'buffer':9}{'extend ms':>10}{'Msteps/s':>10}{'GB/s':>7}"
          f"{'sample ms':>11}{'Msteps/s':>10}{'GB/s':>7}{'upd ms':>8}")
    base = {(r["frames"], r["sampler"]): r for r in rows if r["buffer"] == "lazy" and "skipped" not in r}
    for r in rows:
        if "skipped" in r:
            print(f"{r['frames']:9}{r['sampler']:12}{r['buffer']:9}  skipped: {r['skipped']}")
            continue
        print(f"{r['frames']:9}{r['sampler']:12}{r['buffer']:9}{r['extend_ms']:10.3f}{r['extend_steps_s'] / 1e6:10.3f}"
              f"{r['extend_GBs']:7.2f}{r['sample_ms']:11.3f}{r['sample_steps_s'] / 1e6:10.3f}{r['sample_GBs']:7.2f}"
              f"{r.get('update_priority_ms', float('nan')):8.3f}"
              + (f"  audit violations {r['audit_violations']}" if "audit_violations" in r else ""))
        b = base.get((r["frames"], r["sampler"]))
        if r["buffer"] == "conduit" and b is not None:
            print(f"{'':30}ratio extend {r['extend_steps_s'] / b['extend_steps_s']:.2f}x, "
                  f"sample {r['sample_steps_s'] / b['sample_steps_s']:.2f}x")
    if loops:
        print(f"\nloop: workers -> buffer -> sample()\n{'frames':9}{'buffer':9}{'written/s':>12}{'sampled/s':>12}"
              f"{'loop/s':>12}")
        for r in loops:
            print(f"{r['frames']:9}{r['buffer']:9}{r['written_steps_s']:12.0f}{r['sampled_steps_s']:12.0f}"
                  f"{r['loop_steps_s']:12.0f}"
                  + (f"  audit violations {r['audit_violations']}" if "audit_violations" in r else ""))
        for frames in sorted({r["frames"] for r in loops}):
            by = {r["buffer"]: r for r in loops if r["frames"] == frames}
            if "lazy" in by and "conduit" in by:
                ratio = by["conduit"]["loop_steps_s"] / by["lazy"]["loop_steps_s"]
                target = 1.5 if frames == "atari" else 0.8
                print(f"  {frames}: conduit / lazy loop throughput {ratio:.2f}x (target >= {target}x): "
                      f"{'PASS' if ratio >= target else 'FAIL'}")


if __name__ == "__main__":
    sys.exit(main())
