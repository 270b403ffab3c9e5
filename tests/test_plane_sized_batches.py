"""OnPolicy batches whose size the learner announces (``ExperiencePlane.size_batch``).

RLlib's vectorized envs make a sampling round vary in size (a sample call of n steps returns up to
``num_envs - 1`` more, see :mod:`conduit.runtime.rllib.plan`), so the plane's ``batch_steps`` is the
most a round can hold and the learner announces batch *k*'s exact size from the EnvRunners'
tickets. Checked here without Ray: batch *k* then holds exactly the version-*k* chunks, each whole,
whether the size is announced before, during or after their arrival; nothing is dropped; the audit
shows no violation; wrong announcements are refused with a message, never absorbed.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.contracts import BoundedStaleness, OnPolicy
from conduit.errors import ConduitError
from conduit.runtime.plane import ExperiencePlane
from conduit.runtime.schema import Schema

SMALL = {"pageable": "8 MiB", "nvme": "8 MiB", "pinned": 0}
SCHEMA = Schema.of({"obs": ((3,), "float32"), "a": "int64"})


def _chunk(steps: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((steps, 3)).astype(np.float32), "a": rng.integers(0, 9, steps)}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_announced_batches_hold_exactly_the_round_whole_chunks(data):
    capacity = data.draw(st.integers(8, 60), label="batch_steps (capacity)")
    depth = data.draw(st.integers(0, 2), label="prefetch_depth")
    sources: dict = {}
    with ExperiencePlane(SCHEMA, OnPolicy(), batch_steps=capacity, capacities=SMALL, prefetch_depth=depth,
                         verify_checksums=True) as plane:
        for v in range(data.draw(st.integers(1, 3), label="rounds")):
            rows = data.draw(st.integers(1, capacity), label="round size")
            sizes, left = [], rows
            while left:
                sizes.append(data.draw(st.integers(1, left), label="chunk steps"))
                left -= sizes[-1]
            when = data.draw(st.integers(0, len(sizes)), label="announced after this many chunks")
            for i, n in enumerate(sizes):
                if i == when:
                    plane.size_batch(update=v, rows=rows)
                sources[(v, i)] = _chunk(n, v * 100 + i)
                plane.ingest(sources[(v, i)], policy_version=v, chunk_id=(v, i))
            if when == len(sizes):
                plane.size_batch(update=v, rows=rows)
            with plane.next_batch(update=v, timeout=10) as b:
                assert b.steps == rows
                assert sorted(cid for cid, _ in b.selections) == [(v, i) for i in range(len(sizes))]
                row = 0
                for cid, idx in b.selections:  # each chunk whole, its bytes as ingested
                    assert list(idx) == list(range(len(sources[cid]["a"])))
                    for k in ("obs", "a"):
                        np.testing.assert_array_equal(b.columns[k][row:row + len(idx)], sources[cid][k])
                    row += len(idx)
            plane.set_policy_version(v + 1)
        report = plane.audit()
        assert report.violations == 0, report.examples
        assert report.delivered_samples == report.ingested_samples == sum(len(s["a"]) for s in sources.values())
        assert sum(report.dropped_samples.values()) == 0
        assert report.checksums_verified == len(sources)


def test_unannounced_batch_waits_for_capacity_rows():
    """Without an announcement a batch holds ``batch_steps`` rows, as before."""
    with ExperiencePlane(SCHEMA, OnPolicy(), batch_steps=10, capacities=SMALL) as plane:
        plane.ingest(_chunk(6, 0), policy_version=0, chunk_id="a")
        assert plane.peek(update=0, timeout=0.5).complete is False
        plane.ingest(_chunk(4, 1), policy_version=0, chunk_id="b")
        with plane.next_batch(update=0, timeout=5) as b:
            assert b.steps == 10


def test_wrong_announcements_are_refused():
    with ExperiencePlane(SCHEMA, OnPolicy(), batch_steps=10, capacities=SMALL) as plane:
        for bad in (0, 11, -1, 2.5, True):
            with pytest.raises(ConduitError, match="rows must be an integer"):
                plane.size_batch(update=0, rows=bad)
        plane.ingest(_chunk(7, 0), policy_version=0, chunk_id="a")
        with pytest.raises(ConduitError, match="already holds 7 samples"):
            plane.size_batch(update=0, rows=5)  # more version-0 rows arrived than announced
        plane.size_batch(update=0, rows=7)
        with plane.next_batch(update=0, timeout=5) as b:
            assert b.steps == 7
        plane.set_policy_version(1)
        with pytest.raises(ConduitError, match="already delivered"):
            plane.size_batch(update=0, rows=7)
        assert plane.audit().violations == 0
    with ExperiencePlane(SCHEMA, BoundedStaleness(max_lag=2), batch_steps=10, capacities=SMALL) as plane, \
            pytest.raises(ConduitError, match="OnPolicy"):
        plane.size_batch(update=0, rows=5)
