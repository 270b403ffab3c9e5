"""ConduitReplayBuffer (conduit.runtime.torchrl.replay): TorchRL's TensorDictReplayBuffer interface on the
plane's Replay table.

* a stateful hypothesis test drives extend / sample / update_tensordict_priority / empty against a
  reference model of a FIFO table of ``capacity`` steps: ids are opaque and never reused, a sample
  holds only live samples with the bytes written for them, priority updates for evicted samples are
  dropped and counted, and the audit stays at zero violations;
* the prioritized draw follows ``P(i) = p_i^alpha / sum p^alpha`` (chi-square against the plane's own
  sampler probabilities) and the importance weights follow ``(N P(i))^-beta / max_w``;
* the rate limiter never deadlocks: a call that only its own thread could unblock fails at once,
  saying why, while an extend thread and a sample thread run freely together;
* bad settings are refused naming the setting.
"""

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("torchrl")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from scipy.stats import chisquare
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage

from conduit.errors import ConduitError, PlaneFullError
from conduit.runtime.records import DeliveryTimeout
from conduit.runtime.torchrl import ConduitReplayBuffer, TorchRLSettingError


def frames(values: list[int]) -> TensorDict:
    """Steps whose every column encodes the step's value (so a sampled row can be checked)."""
    v = torch.tensor(values, dtype=torch.int64)
    return TensorDict({"obs": v.to(torch.float64).unsqueeze(-1).expand(-1, 3).clone(),
                       "next": {"val": v.clone(), "done": (v % 2 == 0).unsqueeze(-1)}}, batch_size=[len(values)])


class ReplayModel(RuleBasedStateMachine):
    """The buffer against a reference FIFO table (see the module doc)."""

    @initialize(prioritized=st.booleans(), capacity=st.integers(8, 40), batch=st.integers(1, 8))
    def setup(self, prioritized, capacity, batch):
        prio = {"alpha": 0.7, "beta": 0.5} if prioritized else {}
        self.rb = ConduitReplayBuffer(capacity=capacity, batch_size=batch, seed=1, sample_timeout=5, **prio)
        self.capacity, self.batch, self.prioritized = capacity, batch, prioritized
        self.table: list[list[int]] = []  # live chunks (lists of ids), oldest first
        self.value: dict[int, int] = {}  # id -> the value written for it
        self.seen: set[int] = set()
        self.samples: list[torch.Tensor] = []  # ids of past samples (for priority updates)
        self.next_value = 0
        self.writes = 0
        self.dropped = 0

    def live(self) -> set[int]:
        return {i for chunk in self.table for i in chunk}

    @rule(k=st.integers(1, 12))
    def extend(self, k):
        k = min(k, self.capacity)
        values = list(range(self.next_value, self.next_value + k))
        self.next_value += k
        td = frames(values)
        index = self.rb.extend(td)
        ids = index.tolist()
        assert len(ids) == k and len(set(ids)) == k
        assert not self.seen & set(ids), "an id was reused"
        assert torch.equal(td["index"], index)
        self.seen |= set(ids)
        while sum(map(len, self.table)) + k > self.capacity:
            self.table.pop(0)  # FIFO eviction, whole chunks
        self.table.append(ids)
        self.value.update(zip(ids, values, strict=True))
        self.writes += k

    @precondition(lambda self: self.table)
    @rule()
    def sample(self):
        s = self.rb.sample()
        ids = s["index"].tolist()
        assert s.batch_size == torch.Size([self.batch])
        assert set(ids) <= self.live(), "a sample held an evicted (or unknown) id"
        expect = torch.tensor([self.value[i] for i in ids])
        assert torch.equal(s["next", "val"], expect)
        assert torch.equal(s["obs"], expect.to(torch.float64).unsqueeze(-1).expand(-1, 3))
        assert torch.equal(s["next", "done"], (expect % 2 == 0).unsqueeze(-1))
        if self.prioritized:
            w = s["priority_weight"].double().numpy()
            sampler = self.rb.plane.replay_sampler
            p = sampler.probabilities(np.asarray(ids))
            live = np.asarray(sorted(self.live()))
            n = len(live)
            max_w = (n * sampler.probabilities(live).min()) ** -0.5
            np.testing.assert_allclose(w, (n * p) ** -0.5 / max_w, rtol=1e-5)
            assert (w > 0).all() and (w <= 1 + 1e-6).all()
        else:
            assert s.get("priority_weight", None) is None
        self.samples.append(s["index"].clone())
        del s

    @precondition(lambda self: self.samples)
    @rule(data=st.data())
    def update_priority(self, data):
        index = data.draw(st.sampled_from(self.samples))
        prio = data.draw(st.lists(st.floats(0, 10), min_size=len(index), max_size=len(index)))
        td = TensorDict({"index": index, "td_error": torch.tensor(prio)}, batch_size=[len(index)])
        live = self.live()
        self.dropped += sum(1 for i in index.tolist() if i not in live)
        self.rb.update_tensordict_priority(td)

    @rule()
    def empty(self):
        self.rb.empty()
        self.table.clear()
        self.writes = 0

    @invariant()
    def agrees(self):
        if not hasattr(self, "rb"):
            return
        assert len(self.rb) == len(self.live())
        assert self.rb.write_count == self.writes
        if self.rb.layout is not None:
            assert self.rb.metrics()["priority_updates_dropped"] == self.dropped
            assert self.rb.audit().violations == 0

    def teardown(self):
        if hasattr(self, "rb"):
            report = self.rb.close()
            assert report is None or report.violations == 0


TestReplayModel = ReplayModel.TestCase
TestReplayModel.settings = settings(max_examples=25, stateful_step_count=25, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prios=st.lists(st.floats(0.05, 20), min_size=3, max_size=8), alpha=st.sampled_from([0.0, 0.6, 1.0]))
def test_prioritized_draws_follow_the_priorities(prios, alpha):
    n = len(prios)
    rb = ConduitReplayBuffer(capacity=64, batch_size=64, alpha=alpha, beta=0.4, seed=7)
    try:
        index = rb.extend(frames(list(range(n))))
        rb.update_priority(index, torch.tensor(prios, dtype=torch.float64))
        counts = np.zeros(n)
        for _ in range(60):
            s = rb.sample()
            counts += np.bincount(s["next", "val"].numpy(), minlength=n)
            del s
        p = np.asarray(prios) ** alpha
        expected = p / p.sum() * counts.sum()
        np.testing.assert_allclose(rb.plane.replay_sampler.probabilities(index.numpy()), p / p.sum(), rtol=1e-9)
        assert chisquare(counts, expected).pvalue > 1e-4
        assert rb.audit().violations == 0
    finally:
        rb.close()


def test_uniform_draws_are_uniform_and_carry_no_weights():
    rb = ConduitReplayBuffer(storage=LazyTensorStorage(64), batch_size=64, seed=3)
    try:
        rb.extend(frames(list(range(10))))
        counts = np.zeros(10)
        for _ in range(50):
            s = rb.sample()
            assert s.get("priority_weight", None) is None
            counts += np.bincount(s["next", "val"].numpy(), minlength=10)
        assert chisquare(counts).pvalue > 1e-4
    finally:
        rb.close()


def test_a_sample_is_plane_memory_until_its_tensors_are_gone():
    rb = ConduitReplayBuffer(capacity=32, batch_size=4, seed=0)
    try:
        rb.extend(frames(list(range(8))))
        s = rb.sample()
        kept = s["obs"][:2]  # a view keeps the batch
        del s
        rb.extend(frames([8]))  # drains handed-back batches: this one is still viewed
        handed = rb.plane.metrics()["delivered_batches"]
        assert handed == 1 and kept.shape == (2, 3)
        clone = rb.sample().clone()  # a clone owns its memory: the batch goes back at the next call
        del kept
        rb.extend(frames([9]))
        assert len(rb.plane._handed) == 0  # every batch is back
        assert clone.batch_size == torch.Size([4])
    finally:
        rb.close()


def test_the_rate_limiter_never_waits_on_its_own_thread():
    rb = ConduitReplayBuffer(capacity=200, batch_size=8, replay_ratio=1.0, min_size=8, error_buffer=8)
    try:
        rb.extend(frames(list(range(4))))
        with pytest.raises(DeliveryTimeout, match="only one that writes"):
            rb.sample()  # 4 < min_size, and this thread is the only producer
        rb.extend(frames(list(range(4, 8))))
        rb.sample()
        rb.extend(frames(list(range(8, 16))))
        rb.extend(frames(list(range(16, 24))))  # 24 - min_size - 8 sampled = 8: the edge of the band
        with pytest.raises(PlaneFullError, match="deadlock"):
            rb.extend(frames(list(range(24, 32))))  # ahead of sampling by 16 > error_buffer
        rb.sample()
        rb.extend(frames(list(range(24, 32))))  # a sample later it fits again
        assert rb.audit().violations == 0
    finally:
        rb.close()


def test_an_extend_thread_and_a_sample_thread_run_together_within_the_band():
    rb = ConduitReplayBuffer(capacity=500, batch_size=16, replay_ratio=2.0, min_size=32, error_buffer=64,
                             extend_timeout=60, sample_timeout=60, example=frames([0]))
    rounds = 60
    errors = []

    def produce():
        try:
            for r in range(rounds):
                rb.extend(frames(list(range(r * 16, r * 16 + 16))))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    try:
        sampled = 0
        while sampled < 2 * rounds * 16 - 2 * 32 - 64:  # what the band lets the learner take
            s = rb.sample()
            sampled += 16
            del s
        t.join(timeout=120)
        assert not errors and not t.is_alive()
        report = rb.close()
        assert report.violations == 0 and report.drawn_samples == sampled
    finally:
        rb.close()


@pytest.mark.parametrize("kwargs, setting", [
    ({"capacity": 10, "batch_size": 0}, "batch_size"),
    ({"batch_size": 4}, "capacity"),
    ({"capacity": 10, "storage": LazyTensorStorage(20), "batch_size": 4}, "capacity=10"),
    ({"capacity": 10, "batch_size": 4, "alpha": 0.5}, "alpha= and beta="),
    ({"capacity": 10, "batch_size": 4, "prefetch": 3}, "prefetch"),
    ({"capacity": 10, "batch_size": 4, "writer": object()}, "writer"),
    ({"capacity": 10, "batch_size": 4, "error_buffer": 5.0}, "error_buffer"),
    ({"capacity": 10, "batch_size": 4, "sample_timeout": float("inf")}, "sample_timeout"),
])
def test_bad_settings_are_refused_naming_them(kwargs, setting):
    with pytest.raises(TorchRLSettingError, match=setting.replace("=", "=").replace("(", r"\(")):
        ConduitReplayBuffer(**kwargs)


def test_other_samplers_and_batch_sizes_are_refused():
    from torchrl.data.replay_buffers import SamplerWithoutReplacement

    with pytest.raises(TorchRLSettingError, match="SamplerWithoutReplacement"):
        ConduitReplayBuffer(capacity=10, batch_size=4, sampler=SamplerWithoutReplacement())
    rb = ConduitReplayBuffer(capacity=10, batch_size=4)
    with pytest.raises(ConduitError, match="nothing was written"):
        rb.sample()
    rb.extend(frames([1, 2, 3]))
    with pytest.raises(TorchRLSettingError, match="batch_size=5"):
        rb.sample(5)
    with pytest.raises(ConduitError, match="layout"):
        rb.extend(TensorDict({"other": torch.zeros(2)}, batch_size=[2]))
    assert rb.close().violations == 0


def test_large_and_small_rows_are_gathered_across_chunks():
    """Rows over transfer.GATHER_SMALL_ROW bytes are copied chunk by chunk, small ones in one call: both
    land where the batch says."""
    rb = ConduitReplayBuffer(capacity=64, batch_size=32, seed=5)
    try:
        for first in range(0, 48, 3):  # 16 chunks of 3 steps
            v = torch.arange(first, first + 3)
            rb.extend(TensorDict({"frame": v.to(torch.uint8).view(3, 1, 1, 1).expand(3, 84, 84, 4).clone(),
                                  "val": v.clone(), "flag": (v % 3 == 0)}, batch_size=[3]))
        for _ in range(5):
            s = rb.sample()
            vals = s["val"]
            assert torch.equal(s["frame"], vals.to(torch.uint8).view(-1, 1, 1, 1).expand(-1, 84, 84, 4))
            assert torch.equal(s["flag"], vals % 3 == 0)
            assert len(set(s["index"].tolist())) > 1
            del s
        assert rb.close().violations == 0
    finally:
        rb.close()
