"""A Replay plane keeps no record of an evicted chunk (the soak's question, asked in-process and fast).

``benchmarks/soak_dqn.py`` watches the plane actor's RSS for an hour-scale leak; this checks the
plane's own bookkeeping directly: after many thousands of small chunks stream through a full FIFO
table and batches are sampled from it, the live ``_Chunk`` records and tier ``Extent`` objects are
exactly the ones the table holds; and (hypothesis) on any such stream, at every step, everything else
the plane and its auditor keep per chunk or per batch is bounded by the table, the open batches and
the audit's window: the auditor's residency holds only what occupies a tier now (a released batch
leaves nothing: one entry per delivered batch was the leak the soak found), the retired chunks it
remembers and the evicted ranges a bad draw is named from are at most ``audit_window``, the
sampler's slots at most the capacity.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.contracts import Prioritized, Replay
from conduit.errors import ConduitError
from conduit.runtime.plane import ExperiencePlane
from conduit.runtime.records import _Chunk
from conduit.runtime.schema import Schema
from conduit.runtime.tiers import Extent


def _live(kind: type) -> int:
    gc.collect()
    return sum(type(o) is kind for o in gc.get_objects())


def test_evicted_replay_chunks_leave_no_records():
    schema = Schema.of({"obs": ((4,), "float32"), "a": "int64"})
    contract = Replay(capacity=300, replay_ratio=1.0, min_size=30, error_buffer=10**9)
    rng = np.random.default_rng(0)
    counts = []
    with ExperiencePlane(schema, contract, batch_steps=16, capacities={"pageable": "8 MiB", "nvme": "8 MiB", "pinned": 0}) as plane:
        for rnd in range(4):
            for i in range(400):  # 400 chunks of 3 steps: the 300-step table turned over 4 times a round
                plane.ingest({"obs": rng.standard_normal((3, 4)).astype(np.float32), "a": rng.integers(0, 2, 3)},
                             policy_version=0, chunk_id=(rnd, i))
                if i % 10 == 9 and (rnd or i > 20):
                    with plane.next_batch(timeout=5):
                        pass
            counts.append((_live(_Chunk), _live(Extent), len(plane._table), len(plane._chunks)))
        assert plane.audit().violations == 0
    assert all(c == (100, 100, 100, 100) for c in counts), counts  # 300 steps / 3 per chunk, every round


BOUND_SCHEMA = Schema.of({"obs": ((4,), "float32"), "reward": ((), "float32")})
SMALL = {"pageable": "8 MiB", "nvme": "8 MiB", "pinned": 0}


def _chunk(steps: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"obs": rng.standard_normal((steps, 4), dtype=np.float32), "reward": np.ones(steps, np.float32)}


def _check_bounded(plane: ExperiencePlane, window: int, open_batches: int) -> None:
    aud = plane.auditor
    table = len(plane._table)
    assert len(plane._chunks) == table
    assert len(aud._retired) <= window
    assert len(aud._chunks) <= table + window
    assert len(aud._residency) <= table + open_batches
    assert len(plane._evicted_ranges) <= window
    assert len(plane._sampler._slot) <= plane.contract.capacity


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=st.integers(8, 40), window=st.integers(0, 16), prioritized=st.booleans(),
       sizes=st.lists(st.integers(1, 5), min_size=60, max_size=160), seed=st.integers(0, 2**16))
def test_a_long_replay_stream_leaves_bounded_state(capacity, window, prioritized, sizes, seed):
    sampler = Prioritized(alpha=0.6, beta=0.4) if prioritized else "uniform"
    contract = Replay(capacity=capacity, replay_ratio=1.0, min_size=1, error_buffer=1e12, sampler=sampler)
    rng = np.random.default_rng(seed)
    with ExperiencePlane(BOUND_SCHEMA, contract, batch_steps=4, capacities=SMALL, seed=seed, audit_window=window) as plane:
        held = None
        for i, steps in enumerate(sizes):
            plane.ingest(_chunk(steps, rng), policy_version=0, timeout=5)
            b = plane.next_batch(timeout=5)
            _check_bounded(plane, window, open_batches=1 + (held is not None))
            if held is None and i % 3 == 0:  # a batch kept while the next ones are drawn, released later
                held = b
                continue
            ids = b.replay_ids.copy()
            b.release()
            plane.update_priorities(ids, rng.random(len(ids)) + 0.1)
            if held is not None and i % 3 == 2:
                held.release()
                held = None
            _check_bounded(plane, window, open_batches=int(held is not None))
        if held is not None:
            held.release()
        _check_bounded(plane, window, open_batches=0)
        report = plane.audit()
        assert report.violations == 0
        assert report.drawn_samples == report.delivered_samples


def test_audit_window_is_checked_when_the_plane_is_built():
    for bad in (-1, 2.5, True, "8"):
        with pytest.raises(ConduitError, match="audit_window"):
            ExperiencePlane(BOUND_SCHEMA, Replay(capacity=8, replay_ratio=1.0, min_size=1), batch_steps=4,
                            capacities=SMALL, audit_window=bad)
