"""The learner-side prefetcher: batches come out once each, in fetch order, at most ``depth`` ahead."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.runtime.plane import DeliveryTimeout
from conduit.runtime.rllib.delivery import Prefetcher


class CountingFetch:
    """A fetch that hands out 0, 1, 2, ... and records how far ahead of the consumer it got."""

    def __init__(self, timeouts_first: int = 0):
        self.next = 0
        self.timeouts_left = timeouts_first
        self.lock = threading.Lock()

    def __call__(self, poll_s: float) -> int:
        with self.lock:
            if self.timeouts_left:
                self.timeouts_left -= 1
                raise DeliveryTimeout("nothing yet")
            n, self.next = self.next, self.next + 1
            return n


def _wait_for(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@settings(max_examples=25, deadline=None)
@given(depth=st.integers(1, 4), gets=st.integers(1, 12))
def test_prefetcher_keeps_depth_batches_ahead_in_order(depth, gets):
    fetch = CountingFetch()
    pre = Prefetcher(fetch, poll_s=0.01, depth=depth)
    try:
        _wait_for(lambda: fetch.next == depth)  # the first `depth` batches are fetched before any is asked for
        time.sleep(0.02)
        assert fetch.next == depth  # and no more
        got = []
        for _ in range(gets):
            got.append(pre.get(timeout=5))
            pre.request()  # the learner asks for one more when its update ends
        assert got == list(range(gets))  # each once, in order
        _wait_for(lambda: fetch.next == gets + depth)
        time.sleep(0.02)
        assert fetch.next == gets + depth
    finally:
        pre.stop()


def test_prefetcher_retries_delivery_timeouts_and_reports_other_errors():
    fetch = CountingFetch(timeouts_first=3)  # warm-up: the plane has nothing to sample yet
    pre = Prefetcher(fetch, poll_s=0.01, depth=2)
    try:
        assert pre.get(timeout=5) == 0
    finally:
        pre.stop()

    def broken(poll_s: float) -> int:
        raise ValueError("plane refused the batch")

    pre = Prefetcher(broken, poll_s=0.01)
    try:
        with pytest.raises(ValueError, match="plane refused"):
            pre.get(timeout=5)
    finally:
        pre.stop()


def test_prefetcher_times_out_with_a_delivery_timeout_and_refuses_depth_zero():
    pre = Prefetcher(CountingFetch(timeouts_first=10**9), poll_s=0.01)
    try:
        with pytest.raises(DeliveryTimeout, match="within 0.1 s"):
            pre.get(timeout=0.1)
    finally:
        pre.stop()
    with pytest.raises(ValueError, match="depth"):
        Prefetcher(CountingFetch(), depth=0)


def test_value_stream_narrows_the_torch_pool_only_around_its_passes():
    """The stream's thread runs its passes on one intra-op thread; the learner keeps its pool (the
    setting is process-wide, so a permanent ``set_num_threads(1)`` there would slow every update)."""
    import torch

    from conduit.runtime.rllib.values import _one_intra_op_thread

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        inside: list[int] = []

        def stream_pass() -> None:
            with _one_intra_op_thread():
                inside.append(torch.get_num_threads())
                torch.ones(64, 64) @ torch.ones(64, 64)

        t = threading.Thread(target=stream_pass)
        t.start()
        t.join()
        assert inside == [1]
        assert torch.get_num_threads() == 2  # the learner's thread has its pool back
    finally:
        torch.set_num_threads(before)


@given(versions=st.lists(st.integers(0, 5), min_size=1, max_size=16))
@settings(max_examples=50, deadline=None)
def test_sender_coalesces_replay_calls_across_weight_syncs_but_not_trajectories(versions):
    """DQN syncs weights after every update: replay chunks gather calls of several versions (labelled
    with the oldest); trajectory chunks keep one version each (their contracts judge by version)."""
    from types import SimpleNamespace

    from conduit.runtime.rllib.env_runner import _Sender
    from conduit.runtime.rllib.layout import TRAJECTORY, TRANSITION

    items = [([f"ep{i}"], v, f"c{i}", float(i)) for i, v in enumerate(versions)]
    sender = _Sender.__new__(_Sender)
    sender.runner = SimpleNamespace(conduit_plan=SimpleNamespace(layout=TRANSITION))
    (group,) = sender._groups(items)
    assert [e for item in group for e in item[0]] == [f"ep{i}" for i in range(len(versions))]  # every call, in order
    assert group[0][1] == min(versions) and group[0][2] == "c0" and group[0][3] == 0.0

    sender.runner = SimpleNamespace(conduit_plan=SimpleNamespace(layout=TRAJECTORY))
    groups = sender._groups(items)
    assert [item for g in groups for item in g] == items
    assert all(len({item[1] for item in g}) == 1 for g in groups)
