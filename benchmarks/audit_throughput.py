"""How many sample-deliveries per second the auditor checks on one core.

A PPO-like stream (OnPolicy): every update ingests ``--samples`` steps in chunks of ``--chunk``
steps, then delivers them ``--epochs`` times in minibatches, then is consumed. Two delivery shapes
are timed: whole-chunk ranges (the simulator's shape) and shuffled per-chunk index arrays (a
runtime that permutes samples into minibatches). A Replay stream with uniformly sampled index
arrays (DQN-sized batches of 256, grouped by chunk) is timed too. Only auditor calls are timed;
building the selections is not.

An LLM-shaped OnPolicy stream is timed last: ``--large-chunks`` chunks of ``--large-steps``
tokens (4,096 x 262,144 by default), each ingested, placed, delivered whole once, consumed and
evicted, ``--large-per-update`` chunks per update. It runs twice side by side: with the auditor's
lazy per-chunk state (the default) and with it disabled (per-sample arrays allocated at ingestion,
the auditor's behaviour before lazy state), so one run prints before and after. The eager run
holds 12 bytes per resident token: ``--large-per-update`` bounds its memory (512 x 262,144
tokens: 1.6 GB).

    PYTHONPATH=. python benchmarks/audit_throughput.py [--updates 20] [--samples 100000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from conduit.audit import Auditor
from conduit.chunk import Chunk
from conduit.contracts import OnPolicy, Replay


def _chunks(update: int, samples: int, chunk_steps: int) -> list[Chunk]:
    n = samples // chunk_steps
    return [
        Chunk((update, i), f"actor{i % 64}", f"node{i % 8}", chunk_steps, chunk_steps * 512, update, float(update))
        for i in range(n)
    ]


def on_policy(updates: int, samples: int, chunk_steps: int, epochs: int, shape: str) -> float:
    """Samples delivered per second of auditor time."""
    rng = np.random.default_rng(0)
    auditor = Auditor(OnPolicy(), {"hbm": 10 * samples * 512})
    busy = 0.0
    delivered = 0
    minibatches = 8
    for k in range(updates):
        chunks = _chunks(k, samples, chunk_steps)
        if shape == "range":
            sels = [(c.id, range(c.steps)) for c in chunks]
            batches = [sels[i::minibatches] for i in range(minibatches)]
        else:  # each minibatch takes a shuffled 1/8 of every chunk
            perms = [rng.permutation(chunk_steps) for _ in chunks]
            batches = [
                [(c.id, p[i::minibatches]) for c, p in zip(chunks, perms, strict=True)] for i in range(minibatches)
            ]
        start = time.perf_counter()
        for c in chunks:
            auditor.ingested(c, float(k))
            auditor.placed(c.id, "hbm", c.nbytes, float(k))
        for _ in range(epochs):
            for batch in batches:
                auditor.delivered(k, batch, float(k))
        auditor.consumed(k, float(k) + 0.5)
        for c in chunks:
            auditor.evicted(c.id, float(k) + 0.5)
        busy += time.perf_counter() - start
        delivered += samples * epochs
    report = auditor.finish(float(updates))
    assert report.violations == 0, report.summary()
    return delivered / busy


def replay(updates: int, samples: int, chunk_steps: int) -> float:
    """Samples delivered per second of auditor time, uniform sampling with replacement."""
    rng = np.random.default_rng(0)
    contract = Replay(capacity=4 * samples, replay_ratio=1.0, min_size=samples, error_buffer=2 * samples)
    auditor = Auditor(contract)
    live: list[Chunk] = []
    busy = 0.0
    delivered = 0
    batch_size = 256
    for k in range(updates):
        chunks = _chunks(k, samples, chunk_steps)
        start = time.perf_counter()
        for c in chunks:
            auditor.ingested(c, float(k))
        busy += time.perf_counter() - start
        live.extend(chunks)
        while sum(c.steps for c in live) > contract.capacity:
            auditor.evicted(live.pop(0).id, float(k))
        if k == 0:
            continue  # warm-up
        # sample as many steps as were inserted, in DQN-sized batches of uniformly drawn steps
        # (a chunk's picks share one selection)
        batches = []
        sizes = [batch_size] * (samples // batch_size) + [samples % batch_size]
        for size in filter(None, sizes):
            picks = np.sort(rng.integers(0, len(live) * chunk_steps, size))
            which, first = np.unique(picks // chunk_steps, return_index=True)
            steps = np.split(picks % chunk_steps, first[1:])
            batches.append([(live[w].id, s) for w, s in zip(which, steps, strict=True)])
        start = time.perf_counter()
        for batch in batches:
            auditor.delivered(k, batch, float(k))
        busy += time.perf_counter() - start
        delivered += sum(len(idx) for batch in batches for _, idx in batch)
    report = auditor.finish(float(updates))
    assert report.violations == 0, report.summary()
    return delivered / busy


class _EagerAuditor(Auditor):
    """The auditor with its lazy per-chunk state disabled: the "before" of the large-chunk run."""

    lazy = False


def large_chunks(chunks: int, steps: int, per_update: int, lazy: bool) -> float:
    """Samples delivered per second of auditor time: huge chunks, each delivered whole once."""
    cls = Auditor if lazy else _EagerAuditor
    auditor = cls(OnPolicy(), {"hbm": per_update * steps * 2})
    busy = 0.0
    delivered = 0
    minibatches = 8
    for k in range((chunks + per_update - 1) // per_update):
        n = min(per_update, chunks - k * per_update)
        batch = [
            Chunk((k, i), f"actor{i % 64}", f"node{i % 8}", steps, steps * 2, k, float(k))
            for i in range(n)
        ]
        sels = [(c.id, range(steps)) for c in batch]
        start = time.perf_counter()
        for c in batch:
            auditor.ingested(c, float(k))
            auditor.placed(c.id, "hbm", c.nbytes, float(k))
        for b in range(minibatches):
            auditor.delivered(k, sels[b::minibatches], float(k))
        auditor.consumed(k, float(k) + 0.5)
        for c in batch:
            auditor.evicted(c.id, float(k) + 0.5)
        busy += time.perf_counter() - start
        delivered += n * steps
    report = auditor.finish(float(chunks))
    assert report.violations == 0, report.summary()
    assert report.delivered_samples == delivered
    return delivered / busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--samples", type=int, default=100_000, help="steps per update")
    parser.add_argument("--chunk", type=int, default=200, help="steps per chunk")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--large-chunks", type=int, default=4096, help="LLM-sized chunks (0: skip)")
    parser.add_argument("--large-steps", type=int, default=262_144, help="tokens per LLM chunk")
    parser.add_argument("--large-per-update", type=int, default=512, help="LLM chunks per update")
    args = parser.parse_args()
    for shape in ("range", "array"):
        rate = on_policy(args.updates, args.samples, args.chunk, args.epochs, shape)
        print(f"OnPolicy, {shape:5s} selections, {args.chunk}-step chunks: {rate:,.0f} samples/s")
    rate = replay(args.updates, args.samples, args.chunk)
    print(f"Replay,   256-step uniform batches grouped by chunk: {rate:,.0f} samples/s")
    if args.large_chunks:
        shape = f"{args.large_chunks} x {args.large_steps:,}-token chunks, delivered whole once"
        before = large_chunks(args.large_chunks, args.large_steps, args.large_per_update, False)
        after = large_chunks(args.large_chunks, args.large_steps, args.large_per_update, True)
        print(f"OnPolicy, {shape}: {before:,.0f} samples/s eager (before), {after:,.0f} samples/s "
              f"lazy (after), x{after / before:,.0f}")


if __name__ == "__main__":
    main()
