"""A plane actor killed mid-run: Ray restarts it, EnvRunners and the learner reattach, training goes on.

* ``PlaneCluster``: a killed plane actor (its PID, obtained from the actor) answers again as
  incarnation 1 with its NVMe chunks taken over and the rest counted lost; once its restarts are
  used up, calls fail at once with a ConduitError naming it (no hang).
* DQN (Replay) and PPO (OnPolicy) under ``enable()``: the plane actor is killed mid-run, training
  completes more iterations, the audit reports 0 violations, one restart, and lost samples > 0
  that match what was lost (Replay: the table's steps not on NVMe; OnPolicy: the sampled steps the
  learner never trained on).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"  # before any Ray process starts

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'conduit-rl[rllib]')")

from conduit.contracts import Replay
from conduit.errors import ConduitError
from conduit.plane.recovery import REASON
from conduit.runtime.ray_plane import PlaneCluster
from conduit.runtime.rllib import cluster_of, enable, shutdown
from conduit.runtime.schema import Schema

pytestmark = pytest.mark.slow


def _kill(cluster: PlaneCluster) -> int:
    """SIGKILL the plane actor's process (its PID asked from the actor itself); returns the PID."""
    actor = cluster.actor(cluster.nodes[0])
    pid = ray.get(actor.pid.remote(), timeout=30)
    os.kill(pid, signal.SIGKILL)
    return pid


def test_plane_cluster_restarts_then_gives_up_cleanly(fresh_ray):
    schema = Schema.of({"x": ((64,), "float32")})
    contract = Replay(capacity=4000, replay_ratio=1.0, min_size=16, error_buffer=1e6)
    cluster = PlaneCluster.start(schema, contract, batch_steps=16, learners={"l": "local"}, max_restarts=1,
                                 capacities={"pageable": "64 KiB", "nvme": "8 MiB", "pinned": 0}, restart_timeout=60)
    try:
        for i in range(40):
            cluster.ingest({"x": np.full((16, 64), i, np.float32)}, policy_version=0, chunk_id=f"c{i}")
        before = cluster.metrics()[cluster.nodes[0]]
        on_disk = before["tiers"]["nvme0:nvme"]["extents"]
        pid = _kill(cluster)
        batch = cluster.next_batch("l", timeout=60)  # reaches the restarted actor
        assert batch.incarnation == 1 and batch.steps == 16
        for cid, idx in batch.selections:  # drawn from the chunks taken over from NVMe, bytes intact
            assert (batch.columns["x"][: len(idx)] == float(cid[1:])).all()
            break
        audit = cluster.audit()
        m = cluster.metrics()[cluster.nodes[0]]
        assert ray.get(cluster.actor(cluster.nodes[0]).pid.remote()) != pid
        assert audit["restarts"] == 1 and audit["violations"] == 0
        assert m["restored_chunks"] == on_disk > 0
        assert audit["lost_samples"][REASON] + m["restored_samples"] == before["table_steps"] == 640
        _kill(cluster)  # the second death: no restart left
        t0 = time.monotonic()
        with pytest.raises(ConduitError, match="died"):
            cluster.next_batch("l", timeout=60)
        assert time.monotonic() - t0 < 30  # it fails, it does not wait out the timeout
    finally:
        cluster.shutdown(timeout=10)


def _trained(result: dict) -> float:
    return result.get("learners", {}).get("__all_modules__", {}).get("num_env_steps_trained_lifetime") or 0


# make test-e2e's: test_plane_cluster_restarts_then_gives_up_cleanly restores a replay table after the actor dies,
# and the PPO test above keeps RLlib training through the restart (the same PlaneCluster recovery path)
@pytest.mark.e2e
def test_dqn_keeps_training_after_the_plane_actor_is_killed(fresh_ray):
    from ray.rllib.algorithms.dqn import DQNConfig

    cfg = (DQNConfig().environment("CartPole-v1")
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
           .reporting(min_sample_timesteps_per_iteration=150)
           .training(num_steps_sampled_before_learning_starts=100, train_batch_size_per_learner=16, n_step=3,
                     replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 50000}))
    # a small memory tier: most of the table lives on the NVMe tier, which survives the restart
    algo = enable(cfg, delivery_timeout=60, capacities={"pageable": "8 KiB", "nvme": "16 MiB", "pinned": 0}).build_algo()
    try:
        results = [algo.train()]
        cluster = cluster_of(algo)
        algo.env_runner_group.foreach_env_runner(lambda r: r.conduit_flush(), local_env_runner=False)
        before = cluster.metrics()[cluster.nodes[0]]
        ray.kill(cluster.actor(cluster.nodes[0]), no_restart=False)  # Ray's own way: restart it
        results.append(algo.train())
        after = results[-1]["conduit"]
        audit = after["audit"]
        assert after["violations"] == 0, audit["examples"]
        assert audit["restarts"] == 1 and after["metrics"]["incarnation"] == 1
        assert _trained(results[-1]) > _trained(results[0]) > 0  # the learner went on updating
        assert results[-1]["training_iteration"] == 2
        restored = after["metrics"]["restored_samples"]
        assert restored > 0 and audit["lost_samples"][REASON] > 0
        # what was in the table before the kill is exactly what was taken over plus what was lost
        assert audit["lost_samples"][REASON] + restored == before["table_steps"]
    finally:
        algo.stop()
        final = shutdown(algo)
    assert final["violations"] == 0 and final["restarts"] == 1


def test_ppo_keeps_training_after_the_plane_actor_is_killed_mid_iteration(fresh_ray):
    from ray.rllib.algorithms.ppo import PPOConfig

    cfg = (PPOConfig().environment("CartPole-v1").debugging(seed=1)
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
           .learners(num_learners=0)
           .training(train_batch_size_per_learner=200, minibatch_size=100, num_epochs=1))
    algo = enable(cfg, delivery_timeout=60, chunk_steps=25).build_algo()
    cluster = cluster_of(algo)
    killed: list[int] = []

    def killer(stop: threading.Event, start_chunks: int) -> None:
        # kill once some (not all 8) chunks of this iteration's batch are in the plane
        while not stop.is_set() and not killed:
            got = cluster.audit()["ingested_chunks"] - start_chunks
            if 1 <= got <= 5:
                killed.append(_kill(cluster))
                return
            time.sleep(0.01)

    try:
        results = [algo.train()]
        for _ in range(4):  # the kill lands in one of these iterations
            stop = threading.Event()
            t = threading.Thread(target=killer, args=(stop, cluster.audit()["ingested_chunks"]), daemon=True)
            t.start()
            results.append(algo.train())
            stop.set()
            t.join()
            if killed:
                break
        assert killed, "the plane was never caught with part of a batch in it"
        results.append(algo.train())
        audit = results[-1]["conduit"]["audit"]
        assert results[-1]["conduit"]["violations"] == 0, audit["examples"]
        assert audit["restarts"] == 1
        lost = audit["lost_samples"][REASON]
        assert lost > 0
        sampled = results[-1]["env_runners"]["num_env_steps_sampled_lifetime"]
        # every sampled step was either trained on once or counted lost with the plane
        assert audit["delivered_samples"] + lost == sampled == 200 * len(results)
        assert _trained(results[-1]) > _trained(results[-2]) > _trained(results[-3])  # updates went on
        assert sum(audit["dropped_samples"].values()) == 0
    finally:
        algo.stop()
        final = shutdown(algo)
    assert final["violations"] == 0
