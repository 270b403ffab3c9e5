"""RLlib checkpoints of an ``enable()``d DQN carry the plane (conduit/runtime/rllib/checkpoint.py).

* ``store_buffer_in_checkpoints=True``: ``algo.save_to_path()`` writes the Replay table (one ``.npy`` per
  column), ``Algorithm.from_checkpoint()`` loads it into the new plane, and the restored run trains in
  its first iteration (no new warm-up, no ``DeliveryTimeout``), with the audit carried over and 0
  violations.
* ``store_buffer_in_checkpoints=False``: the restored table is empty, its samples are counted as dropped
  at the checkpoint, and the learner skips the driver's updates until the plane has warmed up again
  (``build_algo()`` then ``restore_from_path()``), without a hang.
"""

from __future__ import annotations

import os

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"  # before any Ray process starts

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'conduit-rl[rllib]')")

from conduit.runtime.checkpoint import DROP_REASON
from conduit.runtime.rllib import enable, shutdown
from conduit.runtime.rllib.callbacks import cluster_of

pytestmark = pytest.mark.slow


def _config(store: bool):
    from ray.rllib.algorithms.dqn import DQNConfig

    cfg = (DQNConfig().environment("CartPole-v1")
           .env_runners(num_env_runners=0)
           .reporting(min_sample_timesteps_per_iteration=120)
           .training(num_steps_sampled_before_learning_starts=100, train_batch_size_per_learner=16,
                     store_buffer_in_checkpoints=store))
    return enable(cfg, delivery_timeout=60, verify_checksums=True)


def _trained(result: dict) -> int:
    return int(result.get("learners", {}).get("__all_modules__", {}).get("num_env_steps_trained", 0) or 0)


def _skipped(result: dict) -> int:
    return int(result.get("learners", {}).get("__all_modules__", {}).get("conduit", {})
               .get("warmup_skipped_updates", 0) or 0)


def _end(algo) -> dict:
    final = shutdown(algo)
    algo.stop()
    return final


def test_checkpoint_with_the_table_resumes_without_warm_up(local_ray, tmp_path):
    from ray.rllib.algorithms.algorithm import Algorithm

    algo = _config(True).build_algo()
    algo.train()
    path = algo.save_to_path(str(tmp_path / "ckpt"))
    saved_plane = cluster_of(algo).metrics()
    before = cluster_of(algo).audit()
    table_steps = next(iter(saved_plane.values()))["tiers"]
    _end(algo)
    cols = list((tmp_path / "ckpt").rglob("conduit_plane/columns/*/*.npy"))
    assert {c.stem for c in cols} >= {"obs", "next_obs", "actions", "rewards"}  # the table, column by column
    assert table_steps

    algo = Algorithm.from_checkpoint(path)
    try:
        restored = cluster_of(algo).audit()
        assert restored["ingested_samples"] == before["ingested_samples"]  # carried, not ingested twice
        assert restored["delivered_samples"] >= before["delivered_samples"]
        assert restored["dropped_samples"].get(DROP_REASON, 0) == 0  # nothing left behind
        result = algo.train()  # would wait for DeliveryTimeout if the table were not there
        assert _trained(result) > 0 and _skipped(result) == 0
        metrics = result["conduit"]["metrics"]
        assert metrics["restored_chunks"] > 0 and metrics["restored_samples"] > 0
        assert result["conduit"]["violations"] == 0, result["conduit"]["audit"]["examples"]
    finally:
        final = _end(algo)
    assert final["violations"] == 0, final["examples"]
    assert final["ingested_samples"] > before["ingested_samples"]


@pytest.mark.e2e  # about 70 s on a shared 2-core machine: make test-e2e
def test_checkpoint_without_the_table_warms_up_again(local_ray, tmp_path):
    algo = _config(False).build_algo()
    for _ in range(2):
        algo.train()
    path = algo.save_to_path(str(tmp_path / "ckpt"))
    live = cluster_of(algo).audit()["ingested_samples"]
    _end(algo)
    assert not list((tmp_path / "ckpt").rglob("*.npy"))

    algo = _config(False).build_algo()
    try:
        algo.restore_from_path(path)
        dropped = cluster_of(algo).audit()["dropped_samples"].get(DROP_REASON, 0)
        assert 0 < dropped <= live  # the table's samples: dropped at the checkpoint, counted
        results = [algo.train() for _ in range(2)]
        assert _skipped(results[0]) > 0  # the driver asked during the new warm-up: skipped, not stuck
        assert sum(_trained(r) for r in results) > 0  # then it trains again
        assert all(r["conduit"]["violations"] == 0 for r in results)
    finally:
        final = _end(algo)
    assert final["violations"] == 0, final["examples"]
