"""TorchRL's PPO loop through the plane (conduit/runtime/torchrl/onpolicy.py).

* per-chunk GAE (value pass and recursion on each collector worker's batch, standardisation over the
  batch) equals the loop's own GAE module over the gathered batch (hypothesis);
* a real MultiSyncCollector (2 workers, spawn) writes straight to the plane: every batch is update k's
  version-k frames, its advantages equal the stock GAE module's on the same frames, the loss trains on
  it, the audit counts 0 violations; a MultiAsyncCollector runs under BoundedStaleness, also 0;
* bad settings are refused, naming the setting.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest

pytest.importorskip("torchrl")

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.envs import GymEnv
from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from conduit.contracts import BoundedStaleness, OnPolicy
from conduit.runtime.torchrl import FeedError, OnPolicyFeed
from conduit.runtime.torchrl.onpolicy import _gae_twin, standardize

OBS = 3


def _value_net(seed: int) -> ValueOperator:
    torch.manual_seed(seed)
    return ValueOperator(nn.Sequential(nn.Linear(OBS, 8), nn.Tanh(), nn.Linear(8, 1)), in_keys=["observation"])


def _frames(envs: int, steps: int, rng: np.random.Generator) -> TensorDict:
    """Trajectory segments as a collector worker writes them: ``[envs, steps]``, episodes ending anywhere."""
    obs = torch.as_tensor(rng.normal(size=(envs, steps + 1, OBS)), dtype=torch.float32)
    term = torch.as_tensor(rng.random((envs, steps, 1)) < 0.1)
    trunc = torch.as_tensor(rng.random((envs, steps, 1)) < 0.05) & ~term
    return TensorDict({
        "observation": obs[:, :-1],
        "next": {"observation": obs[:, 1:], "reward": torch.as_tensor(rng.normal(size=(envs, steps, 1)),
                                                                      dtype=torch.float32),
                 "terminated": term, "truncated": trunc, "done": term | trunc},
    }, batch_size=[envs, steps])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workers=st.integers(1, 3), envs=st.integers(1, 3), steps=st.integers(1, 12), rounds=st.integers(1, 4),
       average=st.booleans(), gamma=st.floats(0.5, 0.999), lmbda=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_per_chunk_value_pass_equals_whole_batch_gae(workers, envs, steps, rounds, average, gamma, lmbda, seed):
    """The feed's value pass on each chunk (a worker's ``[envs, steps]`` batch of one collector round), the
    recursion over each worker's chunks joined along time, then standardisation over the batch, give the
    advantages, value targets and values the loop's GAE module computes over the batch a stock collector
    gathers from the same trajectories (``[workers * envs, rounds * steps]``), cuts and episode ends anywhere."""
    rng = np.random.default_rng(seed)
    gae = GAE(gamma=gamma, lmbda=lmbda, value_network=_value_net(seed), average_gae=average)
    segments = [_frames(envs, rounds * steps, rng) for _ in range(workers)]
    whole = gae(torch.cat([c.clone() for c in segments], 0)).reshape(-1)  # stock: one gathered batch
    values, recursion = _gae_twin(gae), _gae_twin(gae, values=False)
    with torch.no_grad():
        per_worker = []
        for seg in segments:
            chunks = [values(seg[:, r * steps:(r + 1) * steps].clone()) for r in range(rounds)]
            per_worker.append(recursion(torch.cat(chunks, dim=1)).reshape(-1))
        per_chunk = torch.cat(per_worker)
    if average:
        per_chunk.set("advantage", standardize(per_chunk["advantage"]))
    for key in ("advantage", "value_target", "state_value", ("next", "state_value")):
        torch.testing.assert_close(per_chunk[key], whole[key].detach(), rtol=1e-5, atol=1e-5, equal_nan=True)


# -- real collectors ----------------------------------------------------------------------------------
FRAMES = 64
WORKERS = 2
ITERATIONS = 3


def make_env() -> GymEnv:
    return GymEnv("CartPole-v1")


def _ppo(seed: int = 0):
    torch.manual_seed(seed)
    env = make_env()
    actor = ProbabilisticActor(TensorDictModule(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)),
                                                ["observation"], ["logits"]),
                               in_keys=["logits"], spec=env.action_spec, distribution_class=OneHotCategorical,
                               return_log_prob=True)
    env.close()
    value = ValueOperator(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)), in_keys=["observation"])
    gae = GAE(gamma=0.99, lmbda=0.95, value_network=value, average_gae=True)
    loss = ClipPPOLoss(actor, value)
    return actor, value, gae, loss


def _train(feed, collector, gae, loss) -> list[dict]:
    seen = []
    opt = torch.optim.Adam(loss.parameters(), 1e-3)
    for k, data in enumerate(feed.iterate(collector)):
        versions = data["next", "policy_version"]
        # the stock pass over the same frames, chunk by chunk (each worker's [envs, frames] segment)
        seen.append({"k": k, "rows": data.numel(), "versions": sorted(set(versions.reshape(-1).tolist())),
                     "violations": feed.report()["violations"]})
        if not feed.asynchronous:  # each worker's rounds, joined, are one segment of its env
            stock = []
            for part in data.split(FRAMES // WORKERS):
                stock.append(GAE(gamma=0.99, lmbda=0.95, value_network=gae.value_network)(
                    part.exclude("advantage", "value_target", "state_value", ("next", "state_value")).clone()))
            stock = torch.cat(stock)
            torch.testing.assert_close(data["advantage"], standardize(stock["advantage"]).detach(), rtol=1e-5,
                                       atol=1e-5)
            torch.testing.assert_close(data["value_target"], stock["value_target"].detach(), rtol=1e-5, atol=1e-5)
        for _ in range(2):
            lv = loss(data)
            total = lv["loss_objective"] + lv["loss_critic"] + lv["loss_entropy"]
            opt.zero_grad()
            total.backward()
            opt.step()
    return seen


@pytest.mark.slow
def test_multisync_collector_writes_to_the_plane_onpolicy():
    from torchrl.collectors import MultiSyncCollector

    actor, _value, gae, loss = _ppo()
    feed = OnPolicyFeed(make_env, actor, advantage=gae, frames_per_batch=FRAMES, num_workers=WORKERS, rounds=2)
    assert feed.contract == OnPolicy() and feed.value_pass == "per_chunk"
    collector = MultiSyncCollector([make_env] * WORKERS, actor, frames_per_batch=feed.collector_frames_per_batch,
                                   total_frames=FRAMES * ITERATIONS, replay_buffer=feed, track_policy_version=True)
    try:
        seen = _train(feed, collector, gae, loss)
    finally:
        collector.shutdown()
    report = feed.report()
    audit = feed.close()
    assert [s["k"] for s in seen] == list(range(ITERATIONS))
    assert all(s["rows"] == FRAMES and s["versions"] == [s["k"]] for s in seen), seen  # batch k: version k only
    assert all(s["violations"] == 0 for s in seen)  # live
    assert audit.violations == 0, audit.summary()
    m = report["metrics"]
    assert m["delivered_batches"] == ITERATIONS and m["delivered_samples"] == FRAMES * ITERATIONS
    assert report["feed"]["streamed_chunks"] + report["feed"]["handover_chunks"] == 2 * WORKERS * ITERATIONS
    assert sum(m["rings"][f"worker{i}"]["used"] for i in range(WORKERS)) == 0  # every record released


@pytest.mark.slow
def test_multiasync_collector_runs_under_bounded_staleness():
    from torchrl.collectors import MultiAsyncCollector

    actor, _value, gae, loss = _ppo(1)
    feed = OnPolicyFeed(make_env, actor, advantage=gae, frames_per_batch=FRAMES, num_workers=WORKERS,
                        asynchronous=True)
    assert feed.contract == BoundedStaleness(max_lag=WORKERS, max_reuse=1) and feed.value_pass == "batch"
    collector = MultiAsyncCollector([make_env] * WORKERS, actor, frames_per_batch=FRAMES,
                                    total_frames=FRAMES * ITERATIONS, replay_buffer=feed, track_policy_version=True)
    try:
        seen = _train(feed, collector, gae, loss)
    finally:
        collector.shutdown()
    audit = feed.close()
    assert len(seen) == ITERATIONS and all(s["rows"] == FRAMES for s in seen)
    assert all(min(s["versions"]) >= s["k"] - WORKERS for s in seen), seen
    assert audit.violations == 0, audit.summary()


# -- bad settings -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def example():
    actor, _value, _gae, _loss = _ppo()
    from conduit.runtime.torchrl import example_batch

    return example_batch(make_env, actor), _gae


@pytest.mark.parametrize(("kwargs", "names"), [
    ({"frames_per_batch": 66}, "frames_per_batch"),
    ({"rounds": 0}, "rounds"),
    ({"asynchronous": True, "rounds": 2}, "rounds"),
    ({"frames_per_batch": 0}, "frames_per_batch"),
    ({"num_workers": -1}, "num_workers"),
    ({"value_pass": "later"}, "value_pass"),
    ({"asynchronous": True, "value_pass": "per_chunk"}, "value_pass"),
    ({"max_lag": 3}, "max_lag"),
    ({"asynchronous": True, "max_lag": -1}, "max_lag"),
    ({"advantage": "gae"}, "advantage"),
])
def test_bad_settings_are_refused_naming_them(example, kwargs, names):
    td, gae = example
    args = {"advantage": gae, "frames_per_batch": FRAMES, "num_workers": WORKERS, "example": td, **kwargs}
    with pytest.raises(FeedError, match=names):
        OnPolicyFeed(**args)


def test_the_learner_side_refuses_sampling_and_extending(example):
    td, gae = example
    feed = OnPolicyFeed(advantage=gae, frames_per_batch=FRAMES, num_workers=WORKERS, example=td)
    try:
        with pytest.raises(FeedError, match="iterate"):
            feed.sample()
        with pytest.raises(FeedError, match="collector workers"):
            feed.extend(td)
        assert feed.shared and feed.write_count == 0
        assert mp.get_start_method(allow_none=True) != "fork"
    finally:
        assert feed.close().violations == 0
