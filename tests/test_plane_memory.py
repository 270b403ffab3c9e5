"""A Replay plane keeps no record of an evicted chunk (the soak's question, asked in-process and fast).

``benchmarks/soak_dqn.py`` watches the plane actor's RSS for an hour-scale leak; this checks the
plane's own bookkeeping directly: after many thousands of small chunks stream through a full FIFO
table and batches are sampled from it, the live ``_Chunk`` records and tier ``Extent`` objects are
exactly the ones the table holds.
"""

from __future__ import annotations

import gc

import numpy as np

from conduit.contracts import Replay
from conduit.runtime.plane import ExperiencePlane
from conduit.runtime.records import _Chunk
from conduit.runtime.schema import Schema
from conduit.runtime.tiers import Extent


def _live(kind: type) -> int:
    gc.collect()
    return sum(isinstance(o, kind) for o in gc.get_objects())


def test_evicted_replay_chunks_leave_no_records():
    schema = Schema.of({"obs": ((4,), "float32"), "a": "int64"})
    contract = Replay(capacity=300, replay_ratio=1.0, min_size=30, error_buffer=10**9)
    rng = np.random.default_rng(0)
    counts = []
    with ExperiencePlane(schema, contract, batch_steps=16, capacities={"pageable": "8 MiB", "nvme": "8 MiB"}) as plane:
        for rnd in range(4):
            for i in range(1000):
                plane.ingest({"obs": rng.standard_normal((3, 4)).astype(np.float32), "a": rng.integers(0, 2, 3)},
                             policy_version=0, chunk_id=(rnd, i))
                if i % 10 == 9 and (rnd or i > 20):
                    with plane.next_batch(timeout=5):
                        pass
            counts.append((_live(_Chunk), _live(Extent), len(plane._table), len(plane._chunks)))
        assert plane.audit().violations == 0
    assert all(c == (100, 100, 100, 100) for c in counts), counts  # 300 steps / 3 per chunk, every round
