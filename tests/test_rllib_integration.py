"""Conduit under real RLlib 2.60 training: every supported algorithm, two nodes, RLlib untouched.

Each test builds a small algorithm from ``enable(config)``, trains it for an iteration or two on a
local Ray instance (2 CPUs) and checks what the integration promises:

* experience went EnvRunner -> plane -> learner: every sampled env step was ingested by the plane,
  the learner trained on what the plane delivered (OnPolicy: exactly the sampled steps), and the
  driver's data path carried only tickets;
* the contract follows the algorithm and the live audit in ``result["conduit"]`` shows 0 violations;
* bytes delivered are the bytes ingested: every run has ``verify_checksums=True``, and every delivery
  of a whole chunk (PPO, APPO, IMPALA: batches are whole chunks) was checked against the chunk's
  ingest checksum with no ``bytes_changed``;
* PPO's value pass ran on the streamed chunks (no fallback to the whole-batch pass);
* on a two-node ``ray.cluster_utils.Cluster`` the plane runs on the learner's node and the
  EnvRunner's chunks cross nodes through the object store;
* RLlib's installed files match their wheel's RECORD hashes, and no RLlib class or function is
  replaced by enabling, building and training (checked in a fresh interpreter).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"  # before any Ray process starts

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'conduit-rl[rllib]')")

from conduit.runtime.rllib import enable, shutdown

TMP = "/tmp/cdtrl"
pytestmark = pytest.mark.slow


def _trained(result: dict) -> float:
    return result.get("learners", {}).get("__all_modules__", {}).get("num_env_steps_trained_lifetime") or 0


def _train(cfg, iterations: int, until_trained: bool = False, **options):
    """``iterations`` train() calls (with ``until_trained``: more, up to 30, until the learner has
    trained - APPO/IMPALA spend their first ~10-40 s here starting up, the longer on a loaded
    machine), with every delivered chunk's bytes checked against its ingest checksum
    (``verify_checksums=True``)."""
    algo = enable(cfg, verify_checksums=True, **options).build_algo()
    results = []
    try:
        while len(results) < iterations or until_trained and not _trained(results[-1]) and len(results) < 30:
            results.append(algo.train())
    finally:
        algo.stop()  # EnvRunners first (APPO's keep sampling), then the plane
        final = shutdown(algo)
    return results, final


def _learner_stat(result: dict, name: str):
    return result["learners"]["__all_modules__"].get("conduit", {}).get(name)


def _check_common(results, final, contract_kind: str):
    for r in results:
        cd = r["conduit"]
        assert cd["violations"] == 0, cd["audit"]["examples"]
        assert cd["contract"]["kind"] == contract_kind
        assert {"exposed_experience_path_s", "iteration_time_s", "experience_share"} <= set(cd["metrics"])
    assert final["violations"] == 0 and final["finished"]


def _check_whole_chunks_verified(final: dict, chunk_steps: int) -> None:
    """Every chunk is ``chunk_steps`` long and batches are made of whole chunks (their sizes are
    multiples of it), so each delivery of a chunk carried it whole and the plane checksummed it:
    ``checksums_verified`` equals the chunk deliveries, ``delivered_samples / chunk_steps``."""
    assert final["ingested_samples"] == chunk_steps * final["ingested_chunks"], final
    assert final["delivered_samples"] % chunk_steps == 0, final
    assert final["checksums_verified"] == final["delivered_samples"] // chunk_steps > 0, final
    assert final["by_kind"]["bytes_changed"] == 0


def _ppo(**learners):
    from ray.rllib.algorithms.ppo import PPOConfig

    return (PPOConfig().environment("CartPole-v1").debugging(seed=1)
            .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
            .learners(**learners)
            .training(train_batch_size_per_learner=400, minibatch_size=100, num_epochs=2))


# the batch value pass (RLlib's own GAE over the whole batch, the stock connector path) is make test-e2e's: the
# per-chunk run covers the same enable() -> plane -> learner path, and the plan's handling of value_pass="batch"
# is checked fast in tests/test_rllib_enable.py
@pytest.mark.parametrize("value_pass", ["per_chunk", pytest.param("batch", marks=pytest.mark.e2e)])
def test_ppo_trains_on_exactly_what_was_sampled(local_ray, value_pass):
    results, final = _train(_ppo(num_learners=0), 2, value_pass=value_pass, chunk_steps=100)
    _check_common(results, final, "on_policy")
    sampled = results[-1]["env_runners"]["num_env_steps_sampled_lifetime"]
    assert sampled == 800
    # every sampled step went through the plane, and each was delivered in exactly one update
    assert final["ingested_samples"] == final["delivered_samples"] == sampled
    assert final["updates_consumed"] == 2 and sum(final["dropped_samples"].values()) == 0
    assert results[-1]["conduit"]["metrics"]["delivered_batches"] == 2
    # 8 chunks of 100 steps, each delivered once, whole, and checksummed
    _check_whole_chunks_verified(final, 100)
    assert final["checksums_verified"] == final["ingested_chunks"] == 8
    streamed = [_learner_stat(r, "values_streamed") for r in results]
    fallback = [_learner_stat(r, "values_fallback") for r in results]
    if value_pass == "per_chunk":  # one GAE pass per iteration, each on the streamed values
        assert streamed == [1, 1] and fallback == [0, 0]
    else:
        assert streamed == [None, None]


# the two-node test below makes the same run with its remote learner on another node, and checks the same
# (800 steps delivered, 16 whole chunks checksummed, no fallback value pass): this one is make test-e2e's
@pytest.mark.e2e
def test_ppo_remote_learner(local_ray):
    results, final = _train(_ppo(num_learners=1, num_cpus_per_learner=1), 2)
    _check_common(results, final, "on_policy")
    assert final["delivered_samples"] == results[-1]["env_runners"]["num_env_steps_sampled_lifetime"] == 800
    assert [_learner_stat(r, "values_fallback") for r in results] == [0, 0]
    # the default sub-chunk: an eighth of the 400-step fragment; 16 chunks, each delivered once and checksummed
    _check_whole_chunks_verified(final, 50)
    assert final["checksums_verified"] == final["ingested_chunks"] == 16


# IMPALA is APPO's base class: the same EnvRunner -> plane -> learner path and contract (about 85 s under load)
@pytest.mark.parametrize("name", ["APPO", pytest.param("IMPALA", marks=pytest.mark.e2e)])
def test_appo_impala_bounded_staleness(local_ray, name):
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.impala import IMPALAConfig

    cfg = (APPOConfig() if name == "APPO" else IMPALAConfig()).environment("CartPole-v1")
    cfg = (cfg.env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5, rollout_fragment_length=50)
           .learners(num_learners=1, num_cpus_per_learner=1)
           .training(train_batch_size_per_learner=200)
           .reporting(min_time_s_per_iteration=3))
    results, final = _train(cfg, 2, until_trained=True)
    _check_common(results, final, "bounded_staleness")
    assert _trained(results[-1]) > 0
    assert final["delivered_samples"] >= 200 and final["delivered_samples"] % 200 == 0
    # every ingested sample was delivered, or is accounted for (in a batch cut off by the shutdown, or unused)
    assert final["ingested_samples"] == final["delivered_samples"] + sum(final["dropped_samples"].values()) + \
        final["unused_resident_samples"]
    # a chunk is one 50-step fragment and a batch 4 of them: every delivery of a chunk (APPO reuses a
    # batch, each delivery counts) was checksummed
    _check_whole_chunks_verified(final, 50)


def test_dqn_replay_from_the_plane(local_ray):
    from ray.rllib.algorithms.dqn import DQNConfig

    cfg = (DQNConfig().environment("CartPole-v1")
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
           .reporting(min_sample_timesteps_per_iteration=150)
           .training(num_steps_sampled_before_learning_starts=100, train_batch_size_per_learner=16, n_step=3))
    results, final = _train(cfg, 2, delivery_timeout=60)
    _check_common(results, final, "replay")
    sampled = results[-1]["env_runners"]["num_env_steps_sampled_lifetime"]
    # the EnvRunner sent every step (but the last n_step - 1, which wait for their n-step window); the
    # driver's buffer none
    assert sampled - 2 <= final["ingested_samples"] <= sampled
    # n_step=3 makes RLlib's "auto" fragment 3 steps: one update of 16 rows per 3 env steps after learning starts
    assert final["delivered_samples"] % 16 == 0 and final["delivered_samples"] >= 16 * 40
    # DQN's default buffer is prioritized: so is the plane's sampler, and the learner's TD errors
    # updated its priorities (all but the batches drawn and not yet trained on, at most one ahead)
    conduit = results[-1]["conduit"]
    assert conduit["contract"]["sampler"] == {"kind": "prioritized", "alpha": 0.6, "beta": 0.4}
    metrics = conduit["metrics"]
    assert metrics["replay_sampler"] == "prioritized"
    updated = metrics["priority_updates"] + metrics["priority_updates_dropped"]
    assert metrics["priority_updates"] > 0 and final["delivered_samples"] - 2 * 16 <= updated <= final["delivered_samples"]
    assert final["drawn_samples"] == final["delivered_samples"]  # every draw audited live (0 violations above)
    # the rows went to the loss as a ready train batch, importance weights included, after matching
    # what RLlib's own connector builds from the same one-step episodes (weights in extra_model_outputs)
    assert "direct_batch_refused" not in results[-1]["learners"]["__all_modules__"].get("conduit", {})
    # replay batches are rows drawn with replacement: no delivery carries a whole chunk, and only
    # whole chunks are checksummed, so there is nothing to verify (and nothing may differ)
    assert final["checksums_verified"] == 0 and final["by_kind"]["bytes_changed"] == 0


# make test-e2e's: test_dqn_replay_from_the_plane runs the same ConduitEpisodeReplayBuffer path with DQN's default
# prioritized buffer, and tests/test_replay_sampler.py checks the prioritized sampler against RLlib's
@pytest.mark.e2e
@pytest.mark.parametrize("buffer", ["EpisodeReplayBuffer", "PrioritizedEpisodeReplayBuffer"])
def test_sac_replay_from_the_plane(local_ray, buffer):
    from ray.rllib.algorithms.sac import SACConfig

    cfg = (SACConfig().environment("Pendulum-v1")
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
           .reporting(min_sample_timesteps_per_iteration=60)
           .training(num_steps_sampled_before_learning_starts=40, train_batch_size_per_learner=16))
    # replaced, not merged: SAC's default holds alpha and beta, which the uniform buffer does not take
    cfg.replay_buffer_config = {"type": buffer, "capacity": 1000,
                                **({"alpha": 1.0, "beta": 0.5} if "Prioritized" in buffer else {})}
    results, final = _train(cfg, 1)
    _check_common(results, final, "replay")
    assert final["ingested_samples"] == results[-1]["env_runners"]["num_env_steps_sampled_lifetime"]
    assert final["delivered_samples"] >= 16 * 10
    metrics = results[-1]["conduit"]["metrics"]
    if "Prioritized" in buffer:  # SAC's loss logs TD errors too: they became priorities
        assert results[-1]["conduit"]["contract"]["sampler"] == {"kind": "prioritized", "alpha": 1.0, "beta": 0.5}
        assert metrics["replay_sampler"] == "prioritized" and metrics["priority_updates"] > 0
    else:  # the uniform buffer asked for, and given; no priority traffic
        assert results[-1]["conduit"]["contract"]["sampler"] == "uniform"
        assert metrics["replay_sampler"] == "uniform" and metrics["priority_updates"] == 0
    assert final["drawn_samples"] == final["delivered_samples"]
    assert final["checksums_verified"] == 0 and final["by_kind"]["bytes_changed"] == 0  # rows, not chunks (see DQN)


# ------------------------------------------------------------------------------------------ one fresh interpreter
# The two-node run and the check that RLlib stays untouched share one interpreter (its start, the import of
# every RLlib module and a Ray start cost about 15 s on a loaded 2-core machine): it snapshots every RLlib
# module and class before conduit is imported, makes the two-node PPO run, then the local PPO and DQN runs on
# the same cluster, and snapshots again.
FRESH = textwrap.dedent("""
    import importlib, inspect, json, os, pkgutil, socket, sys
    os.environ["RAY_AUTH_MODE"] = "disabled"
    tmp = sys.argv[1]
    os.makedirs(f"{tmp}/ray", exist_ok=True)  # Cluster writes its address file under $RAY_TMPDIR/ray
    os.environ["RAY_TMPDIR"] = tmp
    import ray, ray.rllib
    names = [m.name for m in pkgutil.walk_packages(ray.rllib.__path__, "ray.rllib.")
             if ".tests" not in m.name and ".examples" not in m.name and "tf" not in m.name.split(".")[-1]]
    mods = {}
    for n in names:
        try:
            mods[n] = importlib.import_module(n)
        except Exception:
            pass

    def snapshot():
        out = {}
        for n, m in mods.items():
            for k, v in list(vars(m).items()):
                out[(n, k)] = id(v)
                if inspect.isclass(v) and v.__module__ == n:
                    for a, w in list(vars(v).items()):
                        out[(n, k, a)] = id(w)
        return out

    before = snapshot()
    from ray.cluster_utils import Cluster
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from conduit.runtime.rllib import enable, shutdown

    with socket.socket() as sock:  # a GCS port of its own: never attach to another Ray on this machine
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cluster = Cluster(initialize_head=True, connect=True, head_node_args={
        "num_cpus": 1, "resources": {"runner_node": 1}, "include_dashboard": False, "temp_dir": tmp,
        "object_store_memory": 128 << 20, "gcs_server_port": port})
    try:
        cluster.add_node(num_cpus=1, resources={"learner_node": 1}, object_store_memory=128 << 20)
        cluster.wait_for_nodes()
        # two nodes: the EnvRunner on the head node, the learner on the worker node
        cfg = (PPOConfig().environment("CartPole-v1").debugging(seed=1)
               .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5,
                            custom_resources_per_env_runner={"runner_node": 0.1})
               .learners(num_learners=1, num_cpus_per_learner=1, custom_resources_per_learner={"learner_node": 0.1})
               .training(train_batch_size_per_learner=400, minibatch_size=100, num_epochs=2))
        algo = enable(cfg, verify_checksums=True).build_algo()
        try:
            results = [algo.train(), algo.train()]
            nodes = algo.learner_group.foreach_learner(lambda learner: ray.get_runtime_context().get_node_id())
            learner_node = next(r.get() for r in nodes)
            runner_node = algo.env_runner_group.foreach_env_runner(
                lambda r: ray.get_runtime_context().get_node_id(), local_env_runner=False)[0]
        finally:
            algo.stop()
            final = shutdown(algo)
        # RLlib untouched: enabling, building and training a local PPO and a DQN (in this process)
        for local in (PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=0)
                      .training(train_batch_size_per_learner=200, minibatch_size=100, num_epochs=1),
                      DQNConfig().environment("CartPole-v1").env_runners(num_env_runners=0)
                      .reporting(min_sample_timesteps_per_iteration=60)
                      .training(num_steps_sampled_before_learning_starts=32, train_batch_size_per_learner=16)):
            local_algo = enable(local).build_algo()
            local_algo.train()
            local_algo.stop()
            assert shutdown(local_algo)["violations"] == 0
    finally:
        ray.shutdown()
        cluster.shutdown()
    after = snapshot()
    changed = sorted(str(k) for k in before if k in after and before[k] != after[k] and len(k) == 3)
    changed += sorted(str(k) for k in before if k in after and before[k] != after[k] and len(k) == 2
                      and (inspect.isclass(getattr(mods[k[0]], k[1], None)) or inspect.isfunction(getattr(mods[k[0]], k[1], None))))
    fallback = [r["learners"]["__all_modules__"].get("conduit", {}).get("values_fallback") for r in results]
    print("RESULT", json.dumps({"learner_node": learner_node, "runner_node": runner_node, "fallback": fallback,
                                "metrics": results[-1]["conduit"]["metrics"], "final": final}, default=str))
    print("CHECKED", len(before))
    print("CHANGED", changed)
""")


@pytest.fixture(scope="module")
def fresh_interpreter() -> list[str]:
    """The lines :data:`FRESH` printed (run once for the module's two tests that read them)."""
    proc = subprocess.run([sys.executable, "-c", FRESH, TMP + "2"], check=False, capture_output=True, text=True,
                          timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def test_two_node_cluster_places_on_the_learners_node(fresh_interpreter):
    """EnvRunner on the head node, learner on the worker node: the plane runs next to the learner and
    every chunk crosses nodes through the object store. (In a fresh interpreter: a driver that already
    ran and shut down another Ray in this process could not connect its EnvRunners to the new cluster.)"""
    import json

    got = json.loads(next(line for line in fresh_interpreter if line.startswith("RESULT"))[len("RESULT "):])
    assert got["learner_node"] != got["runner_node"]
    metrics = got["metrics"]
    assert metrics["node_id"] == got["learner_node"]  # one plane, on the learner's node
    transport = metrics["transport"]
    assert transport["remote_chunks"] == transport["store_chunks"] + transport["inline_chunks"] > 0
    assert got["final"]["violations"] == 0 and got["final"]["delivered_samples"] == 800
    # the chunks that crossed nodes arrived byte for byte: 16 chunks of 50 steps, each checksummed once
    _check_whole_chunks_verified(got["final"], 50)
    assert got["final"]["checksums_verified"] == got["final"]["ingested_chunks"] == 16
    assert got["fallback"] == [0, 0]  # the remote learner's value pass ran on the streamed chunks


# ------------------------------------------------------------------------------------------ RLlib untouched
def test_rllib_files_match_their_wheel_record():
    """No file of the installed RLlib differs from what its wheel shipped (RECORD sha256)."""
    import base64
    import hashlib
    from importlib import metadata

    dist = metadata.distribution("ray")
    checked = 0
    for f in dist.files or ():
        if not str(f).startswith("ray/rllib/") or f.hash is None or f.hash.mode != "sha256":
            continue
        data = f.locate().read_bytes()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f.hash.value, f"{f} differs from the ray wheel's RECORD"
        checked += 1
    assert checked > 500


def test_rllib_classes_and_functions_are_not_replaced(fresh_interpreter):
    """Enabling, building and training (two nodes, a local PPO, a DQN) replaces no attribute of any RLlib
    class or module function."""
    out = fresh_interpreter
    checked = int(next(line for line in out if line.startswith("CHECKED")).split()[1])
    changed = next(line for line in out if line.startswith("CHANGED"))
    assert checked > 10_000
    assert changed == "CHANGED []", changed
