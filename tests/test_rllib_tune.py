"""A ``tune.Tuner`` run of an ``enable()``d config: the audit lands in the trial's results, no actor leaks.

One trial of DQN on CartPole for 2 iterations (trainable = the algorithm class, ``param_space`` = the
enabled config object; Tune turns it into ``config.to_dict()`` and the trial's algorithm rebuilds it with
``update_from_dict``, which keeps enable()'s EnvRunner, Learner, callback and buffer classes). The last
reported result carries ``result["conduit"]["audit"]``; when Tune stops the trial, ``algo.stop()`` ends
the plane actors and writes the final audit to ``conduit_final_audit.json`` in the trial's working directory
(``algo.logdir``; Tune puts it under the Ray session's ``artifacts/.../working_dirs/<trial>``).
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"  # before any Ray process starts

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'conduit-rl[rllib]')")

from conduit.runtime.rllib import enable
from conduit.runtime.rllib.callbacks import FINAL_AUDIT_FILE

TMP = "/tmp/cdttune"
pytestmark = pytest.mark.slow


def _plane_actors_alive() -> list:
    """Plane actors the GCS still lists as alive (read from the GCS: this test runs without the dashboard
    that ``ray.util.state.list_actors`` needs)."""
    from ray._private import state

    return [a for a in state.actors().values()
            if "PlaneActor" in a.get("ActorClassName", "") and a.get("State") != "DEAD"]


def test_tuner_run_reports_the_audit_and_ends_the_plane(tmp_path, no_ray):  # its own Ray: it reads its actors
    from ray import tune
    from ray.rllib.algorithms.dqn import DQN, DQNConfig

    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=TMP, object_store_memory=256 << 20,
             log_to_driver=False)
    try:
        cfg = enable(DQNConfig().environment("CartPole-v1")
                     .env_runners(num_env_runners=0)
                     .reporting(min_sample_timesteps_per_iteration=120)
                     .training(num_steps_sampled_before_learning_starts=64, train_batch_size_per_learner=16),
                     delivery_timeout=60)
        tuner = tune.Tuner(DQN, param_space=cfg,
                           run_config=tune.RunConfig(storage_path=str(tmp_path), name="conduit",
                                                     stop={"training_iteration": 2}, verbose=0))
        grid = tuner.fit()
        assert not grid.errors, grid.errors
        result = grid[0]
        audit = result.metrics["conduit"]["audit"]
        assert result.metrics["training_iteration"] == 2
        assert audit["violations"] == 0 and audit["ingested_samples"] > 0 and audit["delivered_samples"] > 0
        assert result.metrics["conduit"]["contract"]["kind"] == "replay"
        files = list(pathlib.Path(TMP).glob(f"session_latest/artifacts/*/conduit/working_dirs/"
                                            f"{pathlib.Path(result.path).name}/{FINAL_AUDIT_FILE}"))
        assert len(files) == 1, files
        final = json.loads(files[0].read_text())
        assert final["finished"] and final["violations"] == 0
        assert final["ingested_samples"] >= audit["ingested_samples"]
        assert _plane_actors_alive() == []  # Tune stopped the trial: algo.stop() ended the plane
        assert any("PlaneActor" in a.get("ActorClassName", "") for a in ray._private.state.actors()
                   .values())  # (there was one: the check above looked at the right actors)
    finally:
        ray.shutdown()
