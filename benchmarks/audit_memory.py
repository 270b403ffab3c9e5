"""How much memory the auditor holds on an unbounded stream: retired chunks folded, or kept.

``--chunks`` chunks (1,000,000 by default) of ``--steps`` steps stream through two auditors side by
side: the folding one (the default ``Auditor``: a chunk's per-chunk state is dropped once it has left
the plane and its books are settled; the last ``RETIRED_WINDOW`` = 65,536 retired chunks stay known
for late events) and the unbounded one (``retire = False``: every chunk's state kept forever, the
auditor before folding). Both see the same events, under OnPolicy and under Replay. Each update
ingests ``--per-update`` chunks and places them in HBM; OnPolicy delivers each whole once (batches of
``--per-batch`` chunks), consumes the update and evicts them all; Replay evicts its oldest chunks once
it holds more than ``--capacity-chunks`` chunks and then delivers the update's chunks whole once. Both
reports must be clean and identical.

**Memory** is what the auditor's state occupies after 10k, 100k and 1M chunks, in tracemalloc's
terms ("current" traced bytes). Tracing allocations slows a stream about 5x (both streams, both
auditors, 1M chunks: ~10 minutes here), so by default each auditor's object graph is measured
instead: ``sys.getsizeof`` of every object reachable from it, each counted once, which is the size
its allocations request and tracemalloc traces (classes, functions, enum members and other
singletons excluded). Every run checks that on a short stream (the first checkpoint) traced by
tracemalloc from before the auditor's creation and prints both figures. ``--direct`` measures the
whole stream with tracemalloc, one auditor at a time (use it with ``--chunks 100000``). **Events/s**
counts only the auditors' calls (an event is one call: ingest, place, delivery of a batch, consume,
evict), untraced in the default mode; the two auditors take turns going first, update by update.
Run time: ~2 minutes on 2 shared cores.

    PYTHONPATH=. python benchmarks/audit_memory.py [--chunks 1000000] [--direct]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from abc import ABCMeta
from collections import deque
from collections.abc import Callable
from enum import EnumType
from itertools import compress
from operator import not_
from types import BuiltinFunctionType, FunctionType, ModuleType

from conduit.audit import Auditor
from conduit.chunk import Chunk
from conduit.contracts import Contract, OnPolicy, Replay

CHECKPOINTS = (10_000, 100_000, 1_000_000)
MiB = 2**20


class _Unbounded(Auditor):
    """The auditor before folding: every chunk's state kept forever (the baseline)."""

    retire = False


_SKIP_KINDS = {type, EnumType, ABCMeta, FunctionType, BuiltinFunctionType, ModuleType,
               type(None), bool}
"""Kinds of object that exist whatever the auditor holds: classes, code, singletons."""


def _graph_size(root: object) -> int:
    """Bytes of every object reachable from ``root``, each counted once: ``sys.getsizeof``, the
    object with its GC header and its own tables, i.e. what its allocations request and tracemalloc
    traces. Classes, functions, modules, enum members, ``None``, bools and CPython's cached small
    ints are shared by everything and left out. Walks level by level, in C where it can."""
    seen = {id(i) for i in range(-5, 257)}
    total = 0
    frontier = [root]
    while frontier:
        fresh = dict(zip(map(id, frontier), frontier, strict=True))  # deduplicated
        for i in seen.intersection(fresh):
            del fresh[i]
        seen.update(fresh)
        objs = list(fresh.values())
        kinds = list(map(type, objs))
        skip = {k for k in set(kinds) if k in _SKIP_KINDS or isinstance(k, EnumType)}
        if skip:
            objs = list(compress(objs, map(not_, map(skip.__contains__, kinds))))
        total += sum(map(sys.getsizeof, objs))
        frontier = gc.get_referents(*objs)
    return total


def stream(contract: Contract, auditors: list[Auditor], n: int, args: argparse.Namespace,
           measure: Callable[[list[Auditor]], list[int]]) -> tuple[dict[int, list[int]], list[float]]:
    """Feed ``n`` chunks to every auditor in ``auditors``; return ``measure(auditors)`` (bytes,
    one per auditor) at each checkpoint and each auditor's events per second of its own calls."""
    per_update, per_batch, steps = args.per_update, args.per_batch, args.steps
    checkpoints = [c for c in CHECKPOINTS if c < n] + [n]
    on_policy = isinstance(contract, OnPolicy)
    memory: dict[int, list[int]] = {}
    busy = [0.0] * len(auditors)
    events = [0] * len(auditors)
    resident: deque[int] = deque()  # Replay: ids in the buffer, oldest first
    done = 0
    k = 0
    while done < n:
        count = min(per_update, n - done)
        t = float(k)
        chunks = [Chunk(done + i, "actor0", "node0", steps, steps * 512, k, t) for i in range(count)]
        batches = [[(c.id, range(steps)) for c in chunks[b:b + per_batch]]
                   for b in range(0, count, per_batch)]
        gone: list[int] = []
        if not on_policy:
            resident.extend(c.id for c in chunks)
            while len(resident) > args.capacity_chunks:
                gone.append(resident.popleft())
        order = range(len(auditors)) if k % 2 == 0 else range(len(auditors) - 1, -1, -1)
        for j in order:
            a = auditors[j]
            start = time.perf_counter()
            for c in chunks:
                a.ingested(c, t)
                a.placed(c.id, "hbm", c.nbytes, t)
            if on_policy:
                for batch in batches:
                    a.delivered(k, batch, t + 0.25)
                a.consumed(k, t + 0.5)
                for c in chunks:
                    a.evicted(c.id, t + 0.75)
            else:
                for cid in gone:
                    a.evicted(cid, t + 0.25)
                for batch in batches:
                    a.delivered(k, batch, t + 0.5)
            busy[j] += time.perf_counter() - start
            events[j] += 2 * count + len(batches) + (1 + count if on_policy else len(gone))
        done += count
        k += 1
        if done in checkpoints:
            del chunks, batches, gone
            memory[done] = measure(auditors)
    reports = [a.finish(float(k)) for a in auditors]
    assert reports[0].violations == 0, reports[0].summary()
    assert all(r.to_dict() == reports[0].to_dict() for r in reports), "folded != unbounded"
    return memory, [e / b for e, b in zip(events, busy, strict=True)]


def traced(contract: Contract, cls: type[Auditor], n: int, caps: dict[str, int],
           args: argparse.Namespace) -> tuple[dict[int, int], float]:
    """One auditor on a stream traced by tracemalloc from before its creation: its traced memory
    ("current", less what was traced before it existed) at each checkpoint, and its events/s."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]

    def measure(_: list[Auditor]) -> list[int]:
        gc.collect()
        return [tracemalloc.get_traced_memory()[0] - base]

    try:
        memory, (rate,) = stream(contract, [cls(contract, caps)], n, args, measure)
    finally:
        tracemalloc.stop()
    return {c: m for c, (m,) in memory.items()}, rate


def contracts(args: argparse.Namespace) -> dict[str, Contract]:
    update_steps = args.per_update * args.steps
    return {
        "OnPolicy": OnPolicy(),
        # every update inserts one update's steps, then samples as many: the rate error swings
        # between 0 and one update's steps
        "Replay": Replay(capacity=args.capacity_chunks * args.steps, replay_ratio=1.0, min_size=0,
                         error_buffer=float(update_steps)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=1_000_000, help="chunks per stream")
    parser.add_argument("--steps", type=int, default=64, help="steps per chunk")
    parser.add_argument("--per-update", type=int, default=100, help="chunks per update")
    parser.add_argument("--per-batch", type=int, default=10, help="chunks per delivery")
    parser.add_argument("--capacity-chunks", type=int, default=1_000, help="Replay buffer, in chunks")
    parser.add_argument("--direct", action="store_true",
                        help="tracemalloc on the whole live stream, one auditor at a time (~5x slower)")
    args = parser.parse_args()
    caps = {"hbm": (args.capacity_chunks + args.per_update) * args.steps * 512}
    check_n = min(CHECKPOINTS[0], args.chunks)
    how = ("tracemalloc on the live stream" if args.direct else
           f"object graph sizes; tracemalloc on the live stream checks them at {check_n:,}")
    print(f"audit memory: {args.chunks:,} chunks of {args.steps} steps, {args.per_update} per "
          f"update, RETIRED_WINDOW {Auditor.RETIRED_WINDOW:,} ({how})")
    print(f"{'contract':9s} {'chunks':>10s} {'unbounded MiB':>14s} {'folded MiB':>11s} {'ratio':>7s}")
    wall = time.perf_counter()
    rates = {}
    checks = []
    for name, contract in contracts(args).items():
        if args.direct:
            (mf, rf), (mu, ru) = (traced(contract, cls, args.chunks, caps, args)
                                  for cls in (Auditor, _Unbounded))
            memory = {c: [mf[c], mu[c]] for c in mf}
            rate = [rf, ru]
        else:
            def sizes(auditors: list[Auditor]) -> list[int]:
                gc.collect()
                return [_graph_size(a) for a in auditors]

            memory, rate = stream(contract, [Auditor(contract, caps), _Unbounded(contract, caps)],
                                  args.chunks, args, sizes)
            check = [traced(contract, cls, check_n, caps, args)[0][check_n]
                     for cls in (Auditor, _Unbounded)]
            checks.append((name, memory[check_n], check))
        for c, (fold, full) in memory.items():
            print(f"{name:9s} {c:>10,} {full / MiB:>14.1f} {fold / MiB:>11.1f} "
                  f"{full / fold:>6.1f}x")
        rates[name] = rate
    for name, (walk_f, walk_u), (tm_f, tm_u) in checks:
        print(f"check, {name} at {check_n:,} chunks: tracemalloc on the live stream "
              f"{tm_u / MiB:.2f} / {tm_f / MiB:.2f} MiB, object graph {walk_u / MiB:.2f} / "
              f"{walk_f / MiB:.2f} MiB (unbounded / folded)")
    print("events/s (auditor calls only" + (", traced)" if args.direct else ", untraced)"))
    for name, (fold, full) in rates.items():
        print(f"{name:9s} unbounded {full:>12,.0f}   folded {fold:>12,.0f}   "
              f"folded/unbounded {fold / full:.2f}")
    print(f"wall time {time.perf_counter() - wall:.0f} s")


if __name__ == "__main__":
    main()
