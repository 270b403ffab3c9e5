"""The Replay contract's sampler (:mod:`conduit.plane.sampler`), against RLlib's and on its own.

Checked:

* **RLlib's distribution.** With the same priorities, :class:`PrioritizedSampler` and RLlib 2.60's
  ``PrioritizedEpisodeReplayBuffer`` draw the same distribution: each passes a chi-square
  goodness-of-fit test against the exact ``P(i) = p_i^alpha / sum p^alpha``, a two-sample
  chi-square test between them does not reject, their total-variation distance is small; and the
  importance weight each returns for a sample is the same to 1e-9 (relative). Priorities are set
  through RLlib's public API (``add(weight=)``, ``sample`` then ``update_priorities``), and new
  samples after an update take the maximum priority in both.
* **Exact math** on small tables: probabilities and weights from the trees equal the formulas.
* **Stateful (hypothesis)**: a table + sampler under add / evict / sample / update priorities /
  state round trip: only live ids are drawn, weights are in (0, 1] with the maximum 1 when
  beta > 0, probabilities match a plain-dict model, updates for evicted ids are dropped and
  counted (never an error), and the auditor sees 0 violations for every draw.
* Uniform sampler: weights 1, only live ids, the same interface.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from scipy import stats

from conduit.audit import Auditor
from conduit.chunk import Chunk
from conduit.contracts import Prioritized, Replay, contract_from_dict
from conduit.errors import ConduitError, UnknownNameError
from conduit.plane.sampler import PrioritizedSampler, UniformSampler, make_sampler

ALPHA, BETA = 0.6, 0.4


# ----------------------------------------------------------------------------- against RLlib
def _episode(rewards):
    gym = pytest.importorskip("gymnasium")
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    n = len(rewards)
    return SingleAgentEpisode(observation_space=gym.spaces.Box(-1, 1, (1,), np.float32),
                              action_space=gym.spaces.Discrete(2), observations=[np.zeros(1, np.float32)] * (n + 1),
                              actions=[0] * n, rewards=[float(r) for r in rewards], len_lookback_buffer=0)


def _rllib_buffer_with(lengths, weights):
    """RLlib's buffer holding one episode per length, each with its starting priority; a step's
    reward is its global index, so a sampled one-step episode names the step it came from."""
    pytest.importorskip("ray.rllib")
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer

    buf = PrioritizedEpisodeReplayBuffer(capacity=10_000, alpha=ALPHA)
    buf.rng = np.random.default_rng(1)  # RLlib's buffer draws from self.rng (a numpy Generator)
    start = 0
    for n, w in zip(lengths, weights, strict=True):
        buf.add([_episode(np.arange(start, start + n))], weight=w)  # the public way to give steps a starting priority
        start += n
    return buf


def _rllib_draws(buf, n, *, chunk=512):
    ids, weights = [], []
    while len(ids) < n:
        got = buf.sample(num_items=min(chunk, n - len(ids)), n_step=1, beta=BETA, gamma=0.99)
        for eps in got:
            ids.append(round(float(eps.get_rewards()[0])))
            weights.append(float(eps.get_extra_model_outputs("weights")[0]))
    return np.asarray(ids), np.asarray(weights)


def _agree(ids_a, ids_b, p, label):
    k = len(p)
    fa = np.bincount(ids_a, minlength=k)
    fb = np.bincount(ids_b, minlength=k)
    for f, who in ((fa, "conduit"), (fb, "rllib")):
        gof = stats.chisquare(f, f_exp=p * f.sum())
        assert gof.pvalue > 1e-4, f"{label}: {who}'s draws do not fit P(i): {gof}"
    seen = (fa + fb) > 0
    two = stats.chi2_contingency(np.vstack([fa[seen], fb[seen]]))
    assert two.pvalue > 1e-4, f"{label}: conduit's and rllib's draws differ: p={two.pvalue}"
    tv = 0.5 * np.abs(fa / fa.sum() - fb / fb.sum()).sum()
    assert tv < 0.05, f"{label}: total-variation distance {tv:.3f}"


def test_prioritized_sampling_matches_rllib_prioritized_episode_buffer():
    lengths = [3, 5, 2, 4, 6]
    weights = [1.0, 4.0, 0.25, 2.0, 0.5]
    buf = _rllib_buffer_with(lengths, weights)
    steps = sum(lengths)
    ours = PrioritizedSampler(ALPHA, BETA, capacity=steps)
    start = 0
    for n, w in zip(lengths, weights, strict=True):
        ours.add(np.arange(start, start + n), priority=w)
        start += n
    prio = np.repeat(weights, lengths)
    p = prio ** ALPHA / (prio ** ALPHA).sum()
    np.testing.assert_allclose(ours.probabilities(np.arange(steps)), p, rtol=1e-12)

    draws = 20_000
    r_ids, r_w = _rllib_draws(buf, draws)
    c_ids, c_w = ours.sample(draws, np.random.default_rng(2))
    _agree(c_ids, r_ids, p, "starting priorities")
    # importance weights: the same number for the same sample, and RLlib's formula
    expect = (p * steps) ** -BETA / (p.min() * steps) ** -BETA
    np.testing.assert_allclose(r_w, expect[r_ids], rtol=1e-9)
    np.testing.assert_allclose(c_w, expect[c_ids], rtol=1e-9)

    # priorities updated from "TD errors" through RLlib's own update path (its last sample), then
    # a new episode at the maximum priority: the same distribution and weights again
    td_of = np.linspace(0.05, 3.0, steps)[::-1].copy()
    td_of[7] = 0.0  # floored at 1e-12 by both
    for _ in range(5):
        got_ids, _ = _rllib_draws(buf, 8, chunk=8)
        buf.update_priorities(td_of[got_ids])
        assert ours.update(got_ids, td_of[got_ids]) == 0
    extra = _episode(np.arange(steps, steps + 3, dtype=float))
    buf.add([extra])  # weight None: RLlib's max priority
    ours.add(np.arange(steps, steps + 3))  # priority None: ours
    assert ours.max_priority == buf._max_priority  # the one private read: both maxima agree
    q = ours.probabilities(np.arange(steps + 3))
    r_ids, r_w = _rllib_draws(buf, draws)
    c_ids, c_w = ours.sample(draws, np.random.default_rng(3))
    _agree(c_ids, r_ids, q, "after updates")
    n = steps + 3
    expect = (q * n) ** -BETA / (q.min() * n) ** -BETA
    np.testing.assert_allclose(r_w, expect[r_ids], rtol=1e-9)
    np.testing.assert_allclose(c_w, expect[c_ids], rtol=1e-9)


# ----------------------------------------------------------------------------- exact math
def test_probabilities_and_weights_follow_the_formulas():
    s = PrioritizedSampler(alpha=0.7, beta=0.5, capacity=4)  # grows past 4
    s.add([10, 11, 12])
    s.add([13, 14, 15, 16], priority=3.0)
    assert s.update([11, 12, 999], [0.5, 9.0, 1.0]) == 1  # 999 was never live: dropped, counted
    assert s.max_priority == 9.0
    s.add([17])  # at the max priority, 9
    prio = np.array([1.0, 0.5, 9.0, 3, 3, 3, 3, 9.0])
    p = prio ** 0.7 / (prio ** 0.7).sum()
    ids = np.arange(10, 18)
    np.testing.assert_allclose(s.probabilities(ids), p, rtol=1e-12)
    got, w = s.sample(4000, np.random.default_rng(0))
    expect = dict(zip(ids.tolist(), ((p * 8) ** -0.5 / (p.min() * 8) ** -0.5).tolist(), strict=True))
    np.testing.assert_allclose(w, [expect[i] for i in got.tolist()], rtol=1e-12)
    assert w.max() == pytest.approx(1.0) and 11 in got  # the least likely has weight 1
    assert s.counters() == {"drawn": 4000, "priority_updates": 2, "priority_updates_dropped": 1}


def test_make_sampler_resolves_the_contract():
    assert isinstance(make_sampler(Replay(capacity=8, replay_ratio=1, min_size=0)), UniformSampler)
    pr = make_sampler(Replay(capacity=8, replay_ratio=1, min_size=0, sampler=Prioritized(0.3, 0.9)))
    assert isinstance(pr, PrioritizedSampler) and (pr.alpha, pr.beta) == (0.3, 0.9)
    assert Replay(capacity=8, replay_ratio=1, min_size=0, sampler="prioritized").sampler == Prioritized()
    with pytest.raises(UnknownNameError, match="fifo"):
        make_sampler(Replay(capacity=8, replay_ratio=1, min_size=0, sampler="fifo"))
    rp = Replay(capacity=8, replay_ratio=1, min_size=0, sampler={"kind": "prioritized", "alpha": 1, "beta": 0})
    assert contract_from_dict(rp.to_dict()) == rp and rp.sampler == Prioritized(1.0, 0.0)
    with pytest.raises(ConduitError, match="sampler.alpha"):
        Replay(capacity=8, replay_ratio=1, min_size=0, sampler=Prioritized(alpha=-1))
    with pytest.raises(ConduitError, match="sampler.gamma"):
        Replay(capacity=8, replay_ratio=1, min_size=0, sampler={"kind": "prioritized", "gamma": 1})


@pytest.mark.parametrize("make", [lambda: UniformSampler(4), lambda: PrioritizedSampler(0.6, 0.4, 4)])
def test_bad_calls_are_errors(make):
    s = make()
    with pytest.raises(ConduitError, match="empty"):
        s.sample(1, np.random.default_rng(0))
    s.add([1, 2])
    with pytest.raises(ConduitError, match="already live"):
        s.add([2])
    with pytest.raises(ConduitError, match="priorities"):
        s.update([1, 2], [1.0])
    assert s.sample(0, np.random.default_rng(0))[0].size == 0


# ----------------------------------------------------------------------------- stateful
class SamplerAndTable(RuleBasedStateMachine):
    """A FIFO Replay table of chunks (ids = steps, never reused) with its sampler and an auditor.

    The table evicts oldest-first to stay within capacity (removing the ids from the sampler and
    telling the auditor), every draw is reported to the auditor as a draw, learners update
    priorities of batches drawn earlier (some evicted since). A plain dict is the model of the
    priorities.
    """

    CAPACITY = 24

    @initialize(prioritized=st.booleans(), alpha=st.sampled_from([0.0, 0.6, 1.0]),
                beta=st.sampled_from([0.0, 0.4, 1.0]))
    def start(self, prioritized, alpha, beta):
        spec = Prioritized(alpha, beta) if prioritized else "uniform"
        self.contract = Replay(capacity=self.CAPACITY, replay_ratio=1, min_size=0, sampler=spec,
                               error_buffer=1e9)
        self.sampler = make_sampler(self.contract, capacity=8)  # small: the trees grow
        self.auditor = Auditor(self.contract)
        self.prioritized = prioritized
        self.alpha, self.beta = alpha, beta
        self.rng = np.random.default_rng(0)
        self.table: list[tuple[int, int, int]] = []  # (chunk id, first sample id, steps), oldest first
        self.prio: dict[int, float] = {}  # live id -> priority (the model)
        self.max_p = 1.0
        self.next_id = 0
        self.next_chunk = 0
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []  # drawn batches awaiting their update
        self.dropped = 0
        self.t = 0.0

    def _tick(self):
        self.t += 1.0
        return self.t

    def _chunk_of(self, ids):
        out = {}
        for i in ids.tolist():
            for cid, first, steps in self.table:
                if first <= i < first + steps:
                    out.setdefault(cid, []).append(i - first)
                    break
            else:
                raise AssertionError(f"sample id {i} is in no live chunk")
        return [(cid, np.asarray(rows)) for cid, rows in out.items()]

    @rule(steps=st.integers(1, 9), priority=st.one_of(st.none(), st.floats(0.01, 10)))
    def insert(self, steps, priority):
        while self.table and sum(s for _, _, s in self.table) + steps > self.CAPACITY:
            cid, first, n = self.table.pop(0)
            ids = np.arange(first, first + n)
            self.sampler.remove(ids)
            for i in ids.tolist():
                del self.prio[i]
            self.auditor.evicted(cid, self._tick())
        cid = self.next_chunk
        self.next_chunk += 1
        ids = np.arange(self.next_id, self.next_id + steps)
        self.next_id += steps
        self.auditor.ingested(Chunk(id=cid, producer="p", node="n", steps=steps, nbytes=steps * 8,
                                    policy_version=0, t_created=self.t), self._tick())
        self.sampler.add(ids, priority=priority)
        self.table.append((cid, int(ids[0]), steps))
        for i in ids.tolist():
            self.prio[i] = self.max_p if priority is None else priority

    @precondition(lambda self: bool(self.table))
    @rule(n=st.integers(1, 40))
    def draw(self, n):
        ids, w = self.sampler.sample(n, self.rng)
        assert len(ids) == n and set(ids.tolist()) <= set(self.prio)
        self.auditor.drawn(self._chunk_of(ids), self._tick())
        assert np.all(w > 0) and np.all(w <= 1 + 1e-12)
        if not self.prioritized or self.beta == 0:
            np.testing.assert_allclose(w, 1.0)
        self.pending.append((ids, w))

    @precondition(lambda self: bool(self.pending))
    @rule(td=st.lists(st.floats(0.0, 50.0), min_size=1, max_size=1), which=st.integers(0, 10))
    def update(self, td, which):
        ids, _ = self.pending.pop(which % len(self.pending))
        prios = np.resize(np.asarray(td + [0.3, 7.0]), len(ids))
        gone = sum(i not in self.prio for i in ids.tolist())
        assert self.sampler.update(ids, prios) == gone
        self.dropped += gone
        for i, p in zip(ids.tolist(), prios.tolist(), strict=True):
            if i in self.prio:
                self.prio[i] = max(p, 1e-12)
                self.max_p = max(self.max_p, max(p, 1e-12))

    @rule()
    def round_trip(self):
        fresh = make_sampler(self.contract, capacity=2)
        fresh.load_state_dict(self.sampler.state_dict())
        self.sampler = fresh

    @invariant()
    def matches_the_model(self):
        if not hasattr(self, "sampler"):
            return
        assert len(self.sampler) == len(self.prio)
        assert self.sampler.counters()["priority_updates_dropped"] == self.dropped
        assert self.auditor.report().violations == 0
        if self.prioritized and self.prio:
            ids = np.fromiter(self.prio, np.int64)
            raw = np.array([self.prio[i] for i in ids.tolist()]) ** self.alpha
            np.testing.assert_allclose(self.sampler.probabilities(ids), raw / raw.sum(), rtol=1e-9)
            assert self.sampler.max_priority == pytest.approx(self.max_p)


SamplerAndTable.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                             suppress_health_check=[HealthCheck.too_slow])
TestSamplerAndTable = SamplerAndTable.TestCase


# ----------------------------------------------------------------------------- the audit of draws
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_auditor_counts_exactly_the_draws_of_samples_that_are_not_live(data):
    """Chunks ingested, some evicted, some partly dropped, one never ingested; random draws over all
    of them: ``evicted_then_sampled`` is exactly the drawn samples that left the plane or were
    dropped, ``unknown_sample`` exactly those of the unknown chunk, and a draw of live samples only
    counts nothing."""
    steps = data.draw(st.lists(st.integers(1, 12), min_size=1, max_size=8), label="steps")
    auditor = Auditor(Replay(capacity=10**6, replay_ratio=1, min_size=0, error_buffer=1e9))
    for cid, n in enumerate(steps):
        auditor.ingested(Chunk(id=cid, producer="p", node="n", steps=n, nbytes=8 * n, policy_version=0,
                               t_created=0.0), 0.0)
    evicted = data.draw(st.sets(st.sampled_from(range(len(steps)))), label="evicted")
    dropped: dict[int, set[int]] = {}
    for cid in sorted(evicted):
        auditor.evicted(cid, 1.0)
    for cid in range(len(steps)):
        if cid not in evicted and data.draw(st.booleans(), label=f"drop from {cid}"):
            rows = data.draw(st.sets(st.integers(0, steps[cid] - 1), min_size=1), label=f"dropped rows {cid}")
            auditor.dropped(cid, 1.5, "stale", np.array(sorted(rows)))
            dropped[cid] = rows
    unknown = len(steps)  # never ingested
    draws = data.draw(st.lists(st.tuples(st.integers(0, len(steps)), st.integers(0, 11)), min_size=1, max_size=40),
                      label="draws")
    selections: dict[int, list[int]] = {}
    want_gone = want_unknown = 0
    for cid, r in draws:
        if cid == unknown:
            selections.setdefault(cid, []).append(r)
            continue
        r %= steps[cid]
        selections.setdefault(cid, []).append(r)
    for cid, rows in selections.items():
        if cid == unknown:
            want_unknown += len(rows)
        elif cid in evicted:
            want_gone += len(rows)
        else:
            want_gone += sum(r in dropped.get(cid, set()) for r in rows)
    auditor.drawn([(cid, np.array(rows)) for cid, rows in selections.items()], 2.0)
    report = auditor.report()
    assert report.by_kind["evicted_then_sampled"] == want_gone
    assert report.by_kind["unknown_sample"] == want_unknown
    assert report.violations == want_gone + want_unknown
    assert report.drawn_samples == sum(len(r) for c, r in selections.items() if c != unknown)
    assert report.delivered_samples == 0  # a draw is not a delivery
