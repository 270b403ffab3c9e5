"""Producer processes for the plane's cross-process tests (tests/test_runtime_plane.py).

A spawned child imports the module of its target by name before it runs it. Kept here, apart from
the test module (which imports torch, hypothesis and the whole runtime), a child imports only numpy,
the schema and the ring: about 1 s instead of about 15 s per child on a loaded 2-core machine.
"""

from __future__ import annotations

import os
import random
import time

import numpy as np

from conduit.runtime.schema import Schema


def make_chunk(schema: Schema, steps: int, seed: int) -> dict[str, np.ndarray]:
    """``steps`` rows of every column of ``schema``: random bytes seeded by ``seed`` (any dtype, any bit pattern)."""
    rng = np.random.default_rng(seed)
    out = {}
    for c in schema.columns:
        raw = rng.integers(0, 256, size=steps * c.step_bytes, dtype=np.uint8)
        out[c.name] = raw.view(c.dtype).reshape((steps, *c.shape)).copy()
    return out


def ring_producer(spec, schema_dict: dict, seed: int, sizes: list[int], version: int, die_after: int | None) -> None:
    """A producer process: writes chunks through its ring; optionally dies in the middle of one."""
    from conduit.runtime.shm_ring import RingProducer

    schema = Schema.from_dict(schema_dict)
    rnd = random.Random(seed)
    with RingProducer(spec) as producer:
        for i, n in enumerate(sizes):
            if die_after is not None and i == die_after:
                slot = producer.reserve(n)
                first = next(iter(slot.columns.values()))
                first[: max(1, n // 2)] = 1  # half written, never committed
                os._exit(1)
            producer.write(make_chunk(schema, n, seed * 1000 + i), chunk_id=(seed, i), policy_version=version)
            time.sleep(rnd.random() * 0.002)  # jitter the interleaving with the other producers
