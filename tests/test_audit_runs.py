"""The auditor's whole-draw events (``drawn_runs``, ``delivered_runs``) against the per-selection ones.

A replay draw reaches the auditor as runs (chunk ids, rows per run, all rows as one array) so that a
batch of hundreds of chunks is checked with numpy instead of a Python loop per chunk. The audit must
stay exact: a state machine drives two auditors with the same random stream - ingestions,
evictions from the plane and from tiers, partial and whole drops, draws and deliveries that name
live samples, evicted ones, dropped ones, unknown chunks, chunks retired beyond a small window, and
rows out of range, in every contract - one fed the runs, the other the selections they spell. Their
reports (counts, examples, totals, rate band) must be equal after every event.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conduit.audit import Auditor, runs_to_selections
from conduit.chunk import Chunk
from conduit.contracts import BoundedStaleness, OnPolicy, Replay
from conduit.errors import ConduitError
from conduit.plane.recovery import JournaledAuditor, replay_audit

CONTRACTS = [
    Replay(capacity=64, replay_ratio=2.0, min_size=4),
    Replay(capacity=1_000_000, replay_ratio=1.0, min_size=0, error_buffer=1e18),
    OnPolicy(),
    BoundedStaleness(max_lag=1, max_reuse=2),
]


class RunsAgainstSelections(RuleBasedStateMachine):
    """Two auditors, one stream: the runs path and the per-selection path must report the same."""

    @initialize(which=st.sampled_from(range(len(CONTRACTS))), window=st.sampled_from([1, 3, 65536]))
    def start(self, which: int, window: int) -> None:
        contract = CONTRACTS[which]
        self.runs = Auditor(contract, {"host": 4096}, retired_window=window)
        self.sels = Auditor(contract, {"host": 4096}, retired_window=window)
        self.steps: dict[int, int] = {}  # every chunk id ever ingested -> steps
        self.next_id = 0
        self.t = 0.0

    def _tick(self) -> float:
        self.t += 1.0
        return self.t

    def _both(self, name: str, *args) -> None:
        getattr(self.runs, name)(*args)
        getattr(self.sels, name)(*args)

    @rule(steps=st.integers(1, 12), version=st.integers(0, 3), nbytes=st.integers(0, 200),
          reuse=st.booleans())
    def ingest(self, steps: int, version: int, nbytes: int, reuse: bool) -> None:
        if reuse and self.steps:  # re-ingesting an id: duplicated, or a new chunk beyond the window
            cid = min(self.steps)
        else:
            cid = self.next_id
            self.next_id += 1
        self.steps[cid] = steps
        chunk = Chunk(cid, "p", "n", steps, nbytes, version, self.t)
        t = self._tick()
        self._both("ingested", chunk, t)
        self._both("placed", cid, "host", nbytes, t)

    @precondition(lambda self: self.steps)
    @rule(data=st.data(), tier_only=st.booleans())
    def evict(self, data: st.DataObject, tier_only: bool) -> None:
        cid = data.draw(st.sampled_from(sorted(self.steps)))
        self._both("evicted", cid, self._tick(), "host" if tier_only else None)

    @precondition(lambda self: self.steps)
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.steps)))
        n = self.steps[cid]
        rows = data.draw(st.one_of(st.none(), st.lists(st.integers(0, n - 1), max_size=n)))
        self._both("dropped", cid, self._tick(), "stale", None if rows is None else np.asarray(rows, np.int64))

    def _draw_runs(self, data: st.DataObject) -> tuple[list, np.ndarray, np.ndarray]:
        known = sorted(self.steps)
        ids = st.sampled_from(known) if known else st.just(10_000)
        # half the draws name only ingested chunks (live, evicted, dropped or retired) with rows in range,
        # the runs path's fast case; the others mix in unknown ids and rows out of range
        tidy = data.draw(st.booleans())
        cids = data.draw(st.lists(ids if tidy else st.one_of(ids, st.integers(10_000, 10_003)), max_size=6))
        counts, rows = [], []
        for cid in cids:
            n = self.steps.get(cid, 4)
            k = data.draw(st.integers(0, 5))
            r = data.draw(st.lists(st.integers(0, n - 1) if tidy else st.integers(-2, n + 2), min_size=k, max_size=k))
            counts.append(k)
            rows.extend(r)
        return cids, np.asarray(counts, np.int64), np.asarray(rows, np.int64)

    @rule(data=st.data())
    def draw(self, data: st.DataObject) -> None:
        cids, counts, rows = self._draw_runs(data)
        t = self._tick()
        self.runs.drawn_runs(cids, counts, rows, t)
        self.sels.drawn(runs_to_selections(cids, counts, rows), t)

    @rule(data=st.data(), update=st.integers(0, 4))
    def deliver(self, data: st.DataObject, update: int) -> None:
        cids, counts, rows = self._draw_runs(data)
        t = self._tick()
        self.runs.delivered_runs(update, cids, counts, rows, t)
        self.sels.delivered(update, runs_to_selections(cids, counts, rows), t)

    @rule(update=st.integers(0, 4))
    def consume(self, update: int) -> None:
        self._both("consumed", update, self._tick())

    @invariant()
    def same_report(self) -> None:
        if hasattr(self, "runs"):
            assert self.runs.report().to_dict() == self.sels.report().to_dict()

    def teardown(self) -> None:
        if hasattr(self, "runs"):
            t = self._tick()
            assert self.runs.finish(t).to_dict() == self.sels.finish(t).to_dict()


RunsAgainstSelections.TestCase.settings = settings(max_examples=80, stateful_step_count=25, deadline=None,
                                                   suppress_health_check=[HealthCheck.too_slow])
TestRunsAgainstSelections = RunsAgainstSelections.TestCase


def test_clean_draw_counts_totals_and_a_bad_one_every_violation():
    aud = Auditor(Replay(capacity=100, replay_ratio=1.0, min_size=0, error_buffer=1e18))
    for cid in range(3):
        aud.ingested(Chunk(cid, "p", "n", 4, 40, 0, 0.0), 0.0)
    aud.drawn_runs([0, 2], [2, 1], np.array([0, 3, 1]), 1.0)
    aud.delivered_runs(0, [0, 2], [2, 1], np.array([0, 3, 1]), 1.0)
    rep = aud.report()
    assert (rep.violations, rep.drawn_samples, rep.delivered_samples, rep.delivered_bytes) == (0, 3, 3, 30)
    aud.evicted(1, 2.0)
    aud.drawn_runs([1, 7, 2], [1, 2, 1], np.array([0, 0, 1, 9]), 3.0)
    rep = aud.report()
    assert rep.by_kind["evicted_then_sampled"] == 1  # chunk 1 left the plane
    assert rep.by_kind["unknown_sample"] == 3  # chunk 7 never ingested (2), row 9 of chunk 2 (1)


def test_runs_that_do_not_spell_a_draw_are_refused():
    aud = Auditor(Replay(capacity=100, replay_ratio=1.0, min_size=0))
    aud.ingested(Chunk(0, "p", "n", 4, 40, 0, 0.0), 0.0)
    with pytest.raises(ConduitError, match="do not spell a draw"):
        aud.drawn_runs([0], [3], np.array([0, 1]), 1.0)
    with pytest.raises(ConduitError, match="integer"):
        aud.drawn_runs([0], [1], np.array([0.5]), 1.0)


def test_journaled_runs_replay_to_the_same_auditor():
    records: list = []
    contract = Replay(capacity=100, replay_ratio=1.0, min_size=0, error_buffer=1e18)
    aud = JournaledAuditor(contract, sink=records.append)
    for cid in range(3):
        aud.ingested(Chunk(cid, "p", "n", 4, 40, 0, 0.0), 0.0)
    aud.evicted(0, 0.5)
    aud.drawn_runs([0, 1], [1, 2], np.array([0, 1, 3]), 1.0)
    aud.delivered_runs(0, [1, 2], [2, 1], np.array([1, 3, 0]), 1.0)
    again = Auditor(contract)
    assert replay_audit(again, records) == len(records)
    assert again.report().to_dict() == aud.report().to_dict()
    assert [r[1] for r in records].count("drawn") == 0  # the fallback inside drawn_runs is not logged twice
