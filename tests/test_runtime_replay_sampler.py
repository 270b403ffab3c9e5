"""The runtime's Replay table draws through the contract's sampler, and the audit checks every draw.

Checked, on the in-process :class:`ExperiencePlane` (real bytes in real tiers):

* a prioritized table's batches carry each row's sampler id and importance weight; the weights are
  RLlib's formula for the table's priorities; after priority updates the draws follow the new
  priorities (chi-square) and the rows still hold the bytes their selections name;
* updates for samples evicted since their draw are skipped and counted, never an error;
* **no false violation** (hypothesis): ingest / draw / release / update-priorities interleavings,
  with eviction pressure, under both samplers: every drawn sample is live, the audit's
  ``drawn_samples`` equals its delivered samples, 0 violations;
* **a real violation is caught**: a sampler that forgets evictions (a deliberately broken one)
  draws an evicted sample; the auditor counts it as ``evicted_then_sampled`` at the draw and the
  call fails without copying;
* a sampler name the plane does not know is refused when the plane is built.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from conduit.contracts import Prioritized, Replay
from conduit.errors import ConduitError, PlaneFullError, UnknownNameError
from conduit.plane.sampler import PrioritizedSampler
from conduit.runtime.plane import DeliveryTimeout, ExperiencePlane
from conduit.runtime.schema import Schema

SMALL = {"pageable": "8 MiB", "nvme": "8 MiB", "pinned": 0}
SCHEMA = Schema.of({"obs": ((2,), "float32"), "tag": ((), "int64")})


def _chunk(first: int, steps: int) -> dict[str, np.ndarray]:
    tag = np.arange(first, first + steps, dtype=np.int64)  # a row's tag is its global step number
    return {"obs": np.stack([tag, -tag], axis=1).astype(np.float32), "tag": tag}


def _fill(plane: ExperiencePlane, sizes: list[int]) -> dict:
    sources, first = {}, 0
    for n in sizes:
        payload = _chunk(first, n)
        sources[plane.ingest(payload, policy_version=0, timeout=5)] = payload
        first += n
    return sources


def _rows_match(batch, sources) -> None:
    row = 0
    for cid, idx in batch.selections:
        idx = np.asarray(idx)
        np.testing.assert_array_equal(batch.columns["tag"][row:row + len(idx)], sources[cid]["tag"][idx])
        row += len(idx)
    assert row == batch.steps == len(batch.replay_ids) == len(batch.weights)


def test_prioritized_batches_carry_ids_weights_and_follow_updated_priorities():
    contract = Replay(capacity=64, replay_ratio=1.0, min_size=1, error_buffer=1e12,
                      sampler=Prioritized(alpha=0.8, beta=0.5))
    with ExperiencePlane(SCHEMA, contract, batch_steps=16, capacities=SMALL, seed=0) as plane:
        sources = _fill(plane, [5, 7, 4])  # 16 steps, ids 0..15, tags 0..15 (one id per tag here)
        b = plane.next_batch(timeout=5)
        _rows_match(b, sources)
        np.testing.assert_array_equal(b.replay_ids, b.columns["tag"])  # ids follow table order here
        np.testing.assert_allclose(b.weights, 1.0)  # every priority is the initial max: P uniform
        b.release()
        # TD errors: step k gets priority k + 1 (from a batch that covers every step once)
        prio = np.arange(1, 17, dtype=float)
        assert plane.update_priorities(np.arange(16), prio) == 0
        p = prio ** 0.8 / (prio ** 0.8).sum()
        counts = np.zeros(16)
        for _ in range(250):
            b = plane.next_batch(timeout=5)
            _rows_match(b, sources)
            ids = b.replay_ids
            expect = (p[ids] * 16) ** -0.5 / (p.min() * 16) ** -0.5
            np.testing.assert_allclose(b.weights, expect, rtol=1e-12)
            np.add.at(counts, ids, 1)
            b.release()
        assert chisquare(counts, p * counts.sum()).pvalue > 1e-4
        m = plane.metrics()
        assert m["replay_sampler"] == "prioritized" and m["priority_updates"] == 16
        report = plane.audit()
        assert report.violations == 0 and report.drawn_samples == report.delivered_samples == 251 * 16


def test_updates_for_evicted_samples_are_dropped_and_counted():
    contract = Replay(capacity=16, replay_ratio=1.0, min_size=1, error_buffer=1e12, sampler="prioritized")
    with ExperiencePlane(SCHEMA, contract, batch_steps=8, capacities=SMALL, seed=3) as plane:
        _fill(plane, [8, 8])
        b = plane.next_batch(timeout=5)
        ids = b.replay_ids.copy()
        b.release()
        plane.ingest(_chunk(16, 8), policy_version=0, timeout=5)  # evicts the first chunk (ids 0..7)
        gone = int(np.count_nonzero(ids < 8))
        assert plane.update_priorities(ids, np.full(len(ids), 2.0)) == gone
        m = plane.metrics()
        assert m["priority_updates_dropped"] == gone and m["priority_updates"] == len(ids) - gone
        with pytest.raises(ConduitError, match="8 sample ids but 2 priorities"):
            plane.update_priorities(ids, [1.0, 2.0])
        assert plane.audit().violations == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prioritized=st.booleans(), capacity=st.integers(16, 64),
       ops=st.lists(st.tuples(st.sampled_from(["ingest", "draw", "update", "release"]), st.integers(1, 12)),
                    min_size=5, max_size=60))
def test_no_false_violation_under_interleavings(prioritized, capacity, ops):
    contract = Replay(capacity=capacity, replay_ratio=1.0, min_size=4, error_buffer=1e12,
                      sampler=Prioritized(0.6, 0.4) if prioritized else "uniform")
    with ExperiencePlane(SCHEMA, contract, batch_steps=8, capacities=SMALL, seed=1) as plane:
        sources, held, drawn, first = {}, [], [], 0
        for op, k in ops:
            if op == "ingest":
                payload = _chunk(first, k)
                try:
                    sources[plane.ingest(payload, policy_version=0, timeout=0.05)] = payload
                    first += k
                except PlaneFullError:  # the oldest chunk is pinned by a batch being copied: not here
                    pass
            elif op == "draw":
                try:
                    b = plane.next_batch(timeout=0.01)
                except DeliveryTimeout:
                    continue
                _rows_match(b, sources)
                assert {cid for cid, _ in b.selections} <= set(plane._table)
                held.append(b)
                drawn.append(b.replay_ids.copy())
            elif op == "release" and held:
                held.pop(0).release()
            elif op == "update" and drawn:
                ids = drawn.pop(k % len(drawn))
                live = set(np.concatenate([np.arange(c.first_id, c.first_id + c.meta.steps)
                                           for c in plane._table.values()]).tolist())
                gone = sum(i not in live for i in ids.tolist())
                assert plane.update_priorities(ids, np.full(len(ids), float(k))) == gone
        for b in held:
            b.release()
        report = plane.audit()
        assert report.violations == 0, report.examples
        assert report.drawn_samples == report.delivered_samples


class _ForgetsEvictions(PrioritizedSampler):
    """A deliberately broken sampler: evicted ids stay drawable (the bug the audit must catch)."""

    def remove(self, ids) -> None:
        pass


def test_a_draw_of_an_evicted_sample_is_a_violation():
    contract = Replay(capacity=8, replay_ratio=1.0, min_size=1, error_buffer=1e12, sampler="prioritized")
    with ExperiencePlane(SCHEMA, contract, batch_steps=8, capacities=SMALL, seed=0) as plane:
        plane._sampler = _ForgetsEvictions(0.6, 0.4, capacity=8)
        _fill(plane, [8])
        plane.next_batch(timeout=5).release()
        plane.ingest(_chunk(8, 8), policy_version=0, timeout=5)  # evicts chunk 0, which the sampler keeps
        drew_dead = False
        for _ in range(10):  # half the sampler's mass is the evicted chunk: a dead draw comes at once
            try:
                plane.next_batch(timeout=5).release()
            except ConduitError as exc:
                assert "no longer in the table" in str(exc)
                drew_dead = True
                break
        assert drew_dead
        report = plane.audit()
        assert report.by_kind["evicted_then_sampled"] > 0
        assert any("before the sampler drew them" in m for m in report.examples["evicted_then_sampled"])
        assert plane.metrics()["bad_draws"] == 1


def test_an_unknown_sampler_is_refused_when_the_plane_is_built():
    with pytest.raises(UnknownNameError, match="fifo"):
        ExperiencePlane(SCHEMA, Replay(capacity=8, replay_ratio=1.0, min_size=1, sampler="fifo"),
                        batch_steps=4, capacities=SMALL)
