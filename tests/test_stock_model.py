"""The ``rllib-stock`` model's mechanics, each against the RLlib 2.60 code it restates.

* ``ShardObjectRefIterator`` (APPO packages): shards concatenate to the package, as equal as possible;
  in the simulated loop every package is split across all learners;
* ``foreach_actor``: round trips overlap -- N results cost one round trip plus N times the driver's
  own CPU per call, not N round trips;
* DQN's ``training_step``: one ``add`` per round, one ``sample`` of the total batch per update round,
  one update call per learner;
* PPO's ``"auto"`` fragment: every runner samples in every iteration;
* learner-side frame stacking: the wire carries one frame per step;
* every measured ``StockCosts`` default equals the microbenchmark file it names;
* the Janus knobs (fragment length, per-fragment advantages) round-trip through names.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import fields, replace
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.policies.janus import janus, janus_name, parse_janus_name
from conduit.registry import create_policy
from conduit.sim.appo import shard_object_refs
from conduit.sim.engine import Simulation
from conduit.sim.params import (
    STOCK_COLD_SOURCES,
    STOCK_PRIMITIVES_FILE,
    STOCK_SOURCES,
    STOCK_WAKE_SOURCES,
    StockCosts,
)
from conduit.sim.workload import load_workload
from conduit.topology import topology_from_dict

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def topology(nodes: int = 1, gpus: int = 2, cores: int = 16):
    devices, links = [], []
    for n in range(nodes):
        p = f"n{n}."
        devices += [{"id": p + "cpu0", "kind": "cpu", "cores": cores},
                    {"id": p + "dram0", "kind": "memory", "capacity": 64e9, "bandwidth": "50 GB/s"},
                    {"id": p + "pcie", "kind": "switch"}, {"id": p + "nic0", "kind": "nic", "bandwidth": "100 Gb/s"}]
        links += [{"src": p + "cpu0", "dst": p + "dram0", "bandwidth": "50 GB/s", "latency": "100 ns"},
                  {"src": p + "cpu0", "dst": p + "pcie", "bandwidth": "50 GB/s", "latency": "1 us"},
                  {"src": p + "pcie", "dst": p + "nic0", "bandwidth": "25 GB/s", "latency": "1 us"}]
        for g in range(gpus):
            devices.append({"id": f"{p}gpu{g}", "kind": "gpu", "memory": 8e9, "memory_bandwidth": "2 TB/s"})
            links.append({"src": f"{p}gpu{g}", "dst": p + "pcie", "bandwidth": "25 GB/s", "latency": "1 us"})
    if nodes > 1:
        devices.append({"id": "fabric", "kind": "switch", "node": "fabric"})
        links += [{"src": f"n{n}.nic0", "dst": "fabric", "bandwidth": "100 Gb/s", "latency": "2 us"}
                  for n in range(nodes)]
    return topology_from_dict({"name": f"stock-{nodes}x{gpus}", "devices": devices, "links": links})


def run(topo, workload: dict, policy: str = "rllib-stock", iterations: int = 3, stock: StockCosts | None = None):
    sim = Simulation(topo, load_workload(workload), create_policy(policy), iterations=iterations, stock=stock)
    result = sim.run()
    assert result.audit.violations == 0, result.audit.to_dict()
    return sim, result


# ---------------------------------------------------------------- sharding (APPO/IMPALA)
@given(st.lists(st.integers(), max_size=200), st.integers(1, 64))
def test_shards_concatenate_to_the_package_as_equal_as_possible(refs, shards):
    out = shard_object_refs(refs, shards)
    assert len(out) == shards
    assert [x for shard in out for x in shard] == refs
    sizes = [len(s) for s in out]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # ShardObjectRefIterator: the first ones are longer


def test_sharding_refuses_zero_shards():
    with pytest.raises(ValueError, match="num_shards"):
        shard_object_refs([1, 2], 0)


@SETTINGS
@given(gpus=st.integers(1, 4), runners=st.integers(1, 3), per_batch=st.integers(1, 4))
def test_stock_appo_splits_every_package_across_all_learners(gpus, runners, per_batch):
    # a core per process (runners, learners, driver): on a crowded node the driver's calls also wait
    # for cores (tests/test_sim_appo_cores.py), which this sharding property is not about
    topo = topology(gpus=gpus, cores=32)
    wl = {"base": "appo", "runners_per_gpu": runners, "chunks_per_batch": per_batch, "envs_per_runner": 2,
          "fragment_length": 8, "bytes_per_step": 1024, "frame_stack": 1}
    sim, result = run(topo, wl, iterations=6)
    packages = sim.stock_calls["package"]
    assert packages >= 6 // 2  # an update needs fresh data at least every max_reuse (2) updates
    # each package gives every learner exactly chunks_per_batch of its references
    assert sim.stock_shards == [[per_batch] * gpus] * packages
    # one reference-only update call per learner and package (the last may still be going out)
    assert (packages - 1) * gpus <= sim.stock_calls["update_call"] <= packages * gpus
    trained = {t.learner for t in result.recorder.chunks.values() if not math.isnan(t.t_ready)}
    assert trained == {lr.id for lr in sim.layout.learners}


@SETTINGS
@given(gpus=st.integers(1, 3), per_batch=st.integers(1, 4), connector_ms=st.floats(5.0, 40.0))
def test_a_stock_appo_learner_builds_each_update_calls_shard_once_on_its_main_thread(gpus, per_batch, connector_ms):
    """``IMPALALearner.update`` resolves the shard's references and runs the learner connector once over the
    whole shard, on the learner actor's main thread, one call after another: with every other cost 0, the CPU
    the learners spend is one connector call per update call (not one per chunk), a shard's chunks are ready
    together, and one learner's shards at least a connector call apart."""
    zero = {f.name: 0.0 for f in fields(StockCosts)}
    zero["serialize_bandwidth"] = zero["deserialize_bandwidth"] = math.inf
    stock = StockCosts(**{**zero, "connector_per_call": connector_ms * 1e-3})
    wl = {"base": "appo", "runners_per_gpu": 2, "chunks_per_batch": per_batch, "envs_per_runner": 1,
          "fragment_length": 4, "bytes_per_step": 1, "frame_stack": 1, "env_step_cv": 0.0}
    sim, result = run(topology(gpus=gpus, cores=64), wl, iterations=6, stock=stock)
    calls = sim.stock_calls["update_call"]
    built: dict[str, dict[float, int]] = {}
    for t in result.recorder.chunks.values():
        if not math.isnan(t.t_ready):
            by_time = built.setdefault(t.learner, {})
            by_time[t.t_ready] = by_time.get(t.t_ready, 0) + 1
    shards = sum(len(v) for v in built.values())
    assert shards <= calls and all(n == per_batch for v in built.values() for n in v.values())
    cpu = sum(result.cpu_busy.values())
    assert shards * connector_ms * 1e-3 <= cpu + 1e-6  # every built shard paid one connector call
    assert cpu <= calls * connector_ms * 1e-3 * (1 + 1e-6) + 1e-6  # and no call paid more than one
    for times in built.values():
        ordered = sorted(times)
        assert all(b - a >= connector_ms * 1e-3 - 1e-9 for a, b in pairwise(ordered))


# ---------------------------------------------------------------- overlapping round trips
@SETTINGS
@given(runners=st.integers(1, 12), rtt_ms=st.floats(5.0, 50.0), cpu_ms=st.floats(0.0, 0.5))
def test_foreach_actor_round_trips_overlap(runners, rtt_ms, cpu_ms):
    """Segment *a* (sampling done -> every result in the driver) costs one round trip plus the
    driver's own CPU per result: the maximum of the round trips, not their sum."""
    zero = {f.name: 0.0 for f in fields(StockCosts)}
    zero["serialize_bandwidth"] = zero["deserialize_bandwidth"] = math.inf
    stock = StockCosts(**{**zero, "rpc_overhead": rtt_ms * 1e-3, "rpc_driver_cpu": cpu_ms * 1e-3})
    wl = {"base": "ppo", "env_runners": runners, "envs_per_runner": 1, "fragment_length": 4,
          "train_batch_per_learner": 4 * runners, "bytes_per_step": 8, "env_step_cv": 0.0, "frame_stack": 1,
          "learners": 1}
    _, result = run(topology(gpus=1), wl, iterations=3, stock=stock)
    a = result.segments["a"]
    transfer_slack = 1e-4  # a few bytes over links with microsecond latencies
    assert a == pytest.approx(rtt_ms * 1e-3 + (runners - 1) * cpu_ms * 1e-3, abs=transfer_slack)
    if runners > 1:
        assert a < runners * rtt_ms * 1e-3  # not serial


# ---------------------------------------------------------------- DQN's sample/add structure
@SETTINGS
@given(gpus=st.integers(1, 3), learners=st.integers(1, 3), ratio=st.sampled_from([1.0, 4.0, 8.0]))
def test_stock_dqn_adds_once_per_round_and_samples_once_per_update(gpus, learners, ratio):
    learners = min(learners, gpus)
    wl = {"base": "dqn", "learners": learners, "envs_per_runner": 2, "fragment_length": 4, "bytes_per_step": 512,
          "min_size": 64, "replay_capacity": 8192, "replay_ratio": ratio, "batch_size": 16, "frame_stack": 1}
    iterations = 12
    sim, _ = run(topology(gpus=gpus), wl, iterations=iterations)
    calls = sim.stock_calls
    assert calls["buffer_add"] == calls["round"] >= 1
    assert calls["sample_result"] == calls["round"] * len(sim.layout.runners)
    assert calls["buffer_sample"] == iterations  # one sample() of learners x batch_size per update
    assert calls["update_call"] == iterations * learners


@SETTINGS
@given(gpus=st.integers(1, 3), learners=st.integers(1, 3), per_call_ms=st.floats(0.0, 2.0),
       per_result_ms=st.floats(0.0, 1.0), policy=st.sampled_from(["rllib-stock", "conduit"]))
def test_dqns_driver_handles_every_learners_result_after_each_update(gpus, learners, per_call_ms, per_result_ms,
                                                                     policy):
    """``DQN._training_step_new_api_stack`` isolates the TD errors from each learner's result and aggregates the
    results into its metrics after every ``LearnerGroup.update``, on the driver's thread: one
    ``learner_results(L)`` per update, L the learners that returned a result, the same under ``enable()``
    (the training step is RLlib's). The driver does nothing else in that stretch, so the span is the charge."""
    learners = min(learners, gpus)
    stock = replace(StockCosts(), learner_results_per_call=per_call_ms * 1e-3,
                    learner_results_per_result=per_result_ms * 1e-3)
    wl = {"base": "dqn", "learners": learners, "envs_per_runner": 2, "fragment_length": 4, "bytes_per_step": 512,
          "min_size": 64, "replay_capacity": 8192, "replay_ratio": 4.0, "batch_size": 16, "frame_stack": 1}
    iterations = 6
    sim, _ = run(topology(gpus=gpus), wl, policy, iterations=iterations, stock=stock)
    charge = (per_call_ms + learners * per_result_ms) * 1e-3
    spans = [sim.rec.segments[u]["learner_results"] for u in range(iterations)]
    assert spans == pytest.approx([charge] * iterations, rel=1e-9, abs=1e-12)
    assert stock.learner_results(learners) == pytest.approx(charge)


# ---------------------------------------------------------------- PPO's "auto" fragment
@SETTINGS
@given(gpus=st.integers(1, 2), runners=st.integers(1, 8), batch=st.sampled_from([64, 96, 128]))
def test_every_ppo_runner_samples_in_every_iteration(gpus, runners, batch):
    wl = {"base": "ppo", "runners_per_gpu": runners, "envs_per_runner": 2, "fragment_length": 32,
          "train_batch_per_learner": batch, "bytes_per_step": 64, "frame_stack": 1, "epochs": 1}
    iterations = 2
    steps = {}
    for policy in ("rllib-stock", "all-gpu"):
        sim, result = run(topology(gpus=gpus), wl, policy, iterations=iterations)
        per_runner = Counter()
        for t in result.recorder.chunks.values():
            per_runner[t.runner] += t.steps
        assert set(per_runner) == {r.id for r in sim.layout.runners}  # nobody idles
        for u in result.recorder.updates:
            assert u.samples >= batch
        steps[policy] = per_runner
    assert steps["rllib-stock"] == steps["all-gpu"]  # both sides sample the same fragments


# ---------------------------------------------------------------- the learner connector visits each episode
@SETTINGS
@given(samples=st.floats(1, 1e5), episodes=st.floats(0, 1e4), nbytes=st.floats(0, 1e9),
       more=st.floats(1, 1e3))
def test_the_connector_charges_per_call_sample_episode_and_byte(samples, episodes, nbytes, more):
    """``StockCosts.connector``: linear in each of its inputs, with the measured per-episode term (the pipeline
    visits every episode in Python): the same samples in more episodes cost more, by exactly the episodes'."""
    s = StockCosts()
    assert s.connector_per_episode > 0
    base = s.connector(samples, episodes, nbytes)
    assert base == pytest.approx(s.connector_per_call + samples * s.connector_per_sample
                                 + episodes * s.connector_per_episode + nbytes * s.connector_per_byte)
    assert s.connector(samples, episodes + more, nbytes) - base == pytest.approx(more * s.connector_per_episode)


@SETTINGS
@given(episode_length=st.floats(5.0, 5000.0), per_episode=st.floats(0.0, 1e-3))
def test_a_stock_ppo_batch_of_short_episodes_costs_its_connector_more(episode_length, per_episode):
    """Stock PPO's segment *c* (the learner connector over the shard, a core per process here) is the connector of
    the shard's samples in its episodes (``Workload.chunk_episodes`` per chunk), so it grows exactly with
    ``connector_per_episode`` times the episodes."""
    wl = {"base": "ppo", "runners_per_gpu": 1, "envs_per_runner": 2, "fragment_length": 64,
          "train_batch_per_learner": 256, "bytes_per_step": 64, "frame_stack": 1, "epochs": 1,
          "episode_length": episode_length}
    costs = {x: replace(StockCosts(), connector_per_episode=x) for x in (0.0, per_episode)}
    c = {}
    for x, stock in costs.items():
        sim, result = run(topology(gpus=1), wl, iterations=3, stock=stock)
        c[x] = result.segments["c"]
    w = sim.workload
    chunks = math.ceil(w.train_batch_per_learner / w.chunk_steps)
    episodes = chunks * w.chunk_episodes
    assert c[per_episode] - c[0.0] == pytest.approx(per_episode * episodes, rel=1e-6, abs=1e-12)


# ---------------------------------------------------------------- learner-side frame stacking
def test_frame_stacking_in_the_learner_keeps_one_frame_on_the_wire():
    base = {"base": "ppo", "runners_per_gpu": 1, "envs_per_runner": 2, "fragment_length": 64,
            "train_batch_per_learner": 128, "bytes_per_step": 84 * 84 + 17, "epochs": 1}
    topo = topology(nodes=2, gpus=1)
    wire, built = {}, {}
    for stack in (1, 4):
        sim, result = run(topo, {**base, "frame_stack": stack}, iterations=3)
        fabric = [s.bytes for (u, v), s in sim.network.link_stats().items() if "fabric" in (u, v)]
        wire[stack] = sum(fabric)
        built[stack] = result.segments["c"]
    assert wire[1] == wire[4] > 0
    assert built[4] > built[1]


# ---------------------------------------------------------------- provenance of the costs
def test_every_measured_stock_cost_is_the_figure_of_the_file_it_names():
    data = json.loads((ROOT / STOCK_PRIMITIVES_FILE).read_text())
    defaults = StockCosts()
    for name, (key, how) in STOCK_SOURCES.items():
        value = data[key]
        if name == "buffer_sample_per_call":
            value = data["buffer_sample_s"] - 32 * data["buffer_sample_per_item_s"]
        else:
            assert how == "as measured"
        if name == "serialize_bandwidth":
            assert getattr(defaults, name) == pytest.approx(value, rel=1e-3)
        else:
            assert getattr(defaults, name) == pytest.approx(value, rel=2e-3), name
    assert math.isinf(defaults.deserialize_bandwidth)  # ray.get reads numpy zero-copy
    for name, (key, how) in STOCK_COLD_SOURCES.items():  # the cold-call law: section gap, merged into the file
        assert how == "as measured" and getattr(defaults, name) == pytest.approx(data[key], rel=2e-3), name
    assert 0 < defaults.rpc_warm_within < defaults.rpc_cold_after
    for name, (key, how) in STOCK_WAKE_SOURCES.items():  # the warm-up debt: section wake, merged into the file
        assert how == "as measured" and getattr(defaults, name) == pytest.approx(data[key], rel=2e-3), name
    assert 0 < defaults.wake_warm_within < defaults.wake_cold_after


# ---------------------------------------------------------------- Janus knobs
@given(placement=st.sampled_from(["pageable", "pinned", "gpu"]), co=st.booleans(), so=st.booleans(),
       g=st.sampled_from([1, 2, 4, 8, 16]), f=st.sampled_from([None, 8, 32, 128]), pfa=st.booleans())
def test_janus_names_round_trip_with_fragment_and_advantage_knobs(placement, co, so, g, f, pfa):
    kwargs = {"placement": placement, "overlap_collection": co, "overlap_selection": so, "granularity": g,
              "fragment_steps": f, "per_fragment_advantages": pfa}
    name = janus_name(**kwargs)
    parsed = parse_janus_name(name)
    assert janus(**parsed).name == name
    policy = janus(**kwargs)
    assert policy.path.batch_build == ("per-chunk" if pfa else "per-batch")
    assert policy.path.fragment_steps == f


def test_janus_fragment_length_splits_the_runners_fragment():
    wl = {"base": "ppo", "runners_per_gpu": 1, "envs_per_runner": 2, "fragment_length": 64,
          "train_batch_per_learner": 128, "bytes_per_step": 64, "frame_stack": 1, "epochs": 1}
    sim = Simulation(topology(gpus=1), load_workload(wl), janus("gpu", True, False, 1, fragment_steps=16))
    assert sim.workload.fragment_length == 16
    with pytest.raises(Exception, match="fragment_steps"):
        janus("gpu", True, False, 1, fragment_steps=-1)


# ---------------------------------------------------------------- DQN's weight sync (EnvRunnerGroup.sync_weights)
@SETTINGS
@given(runners=st.sampled_from([1, 2, 4]), local=st.booleans(), sync_ms=st.floats(0.1, 5.0),
       set_ms=st.floats(0.0, 5.0), callee_ms=st.floats(0.0, 1.0), get_ms=st.floats(0.0, 1.0),
       driver_ms=st.floats(0.0, 0.5), step_ms=st.floats(0.1, 2.0))
def test_dqn_weight_sync_holds_the_driver_and_runs_set_state_before_each_runners_next_sample(
        runners, local, sync_ms, set_ms, callee_ms, get_ms, driver_ms, step_ms):
    """``sync_weights`` is the driver's work (``weight_sync_time``) plus one ``rpc_driver_cpu`` per EnvRunner
    (and, with remote learners, a round trip to the first learner); each EnvRunner serves its ``set_state``
    call (dispatch, the state's ``ray.get``, ``weight_set_time``) before the next round's ``sample()``, which
    pays its own dispatch too: the next round's sampling span is both calls plus the step."""
    zero = {f.name: 0.0 for f in fields(StockCosts)}
    zero["serialize_bandwidth"] = zero["deserialize_bandwidth"] = math.inf
    rtt = 3e-3
    stock = StockCosts(**{**zero, "rpc_overhead": rtt, "rpc_driver_cpu": driver_ms * 1e-3,
                          "rpc_callee_cpu": callee_ms * 1e-3, "get_per_object": get_ms * 1e-3})
    batch = 32  # one update per round once learning starts: replay_ratio x steps per round = batch
    wl = {"base": "dqn", "env_runners": runners, "envs_per_runner": 1, "fragment_length": 1, "bytes_per_step": 64,
          "env_step_time": step_ms * 1e-3, "env_step_cv": 0.0, "inference_time": 0.0, "runner_call_overhead": 0.0,
          "min_size": 64, "replay_capacity": 8192, "replay_ratio": batch / runners, "batch_size": batch,
          "learners": 1, "local_learner": local, "frame_stack": 1,
          "weight_sync_time": sync_ms * 1e-3, "weight_set_time": set_ms * 1e-3}
    sim, _ = run(topology(gpus=1), wl, iterations=4, stock=stock)
    sync = (sync_ms + runners * driver_ms + (0.0 if local else driver_ms)) * 1e-3 + (0.0 if local else rtt - driver_ms * 1e-3)
    sample = (callee_ms + get_ms + set_ms) * 1e-3 + (callee_ms + step_ms) * 1e-3
    for it in (1, 2, 3):  # every round after the first update: one sample round, one update, one sync
        seg = sim.rec.segments[it]
        assert seg["weight_sync"] == pytest.approx(sync, rel=1e-9, abs=1e-12)
        assert seg["sampling"] == pytest.approx(sample, rel=1e-9, abs=1e-12)


# ---------------------------------------------------------------- a local PPO learner is called in place
@SETTINGS
@given(runners=st.integers(1, 4), local=st.booleans(), rtt_ms=st.floats(0.5, 20.0), driver_ms=st.floats(0.0, 0.5),
       serialize=st.sampled_from([math.inf, 1e8, 1e9]), call_ms=st.floats(0.0, 1.0))
def test_a_local_ppo_learner_is_called_in_place(runners, local, rtt_ms, driver_ms, serialize, call_ms):
    """``learner_group.py: LearnerGroup.update``: with ``num_learners=0`` (``is_local``) the driver calls
    ``self._learner.update(...)`` itself -- no shard pickled, no call, no get -- so the driver-to-learner segment
    *b* is one in-process call (``local_call_overhead``) whatever the RPC and serialisation cost; a remote
    learner's *b* pays the pickling on the driver's thread and half a round trip."""
    zero = {f.name: 0.0 for f in fields(StockCosts)}
    zero["deserialize_bandwidth"] = math.inf
    stock = StockCosts(**{**zero, "serialize_bandwidth": serialize, "rpc_overhead": rtt_ms * 1e-3,
                          "rpc_driver_cpu": driver_ms * 1e-3, "local_call_overhead": call_ms * 1e-3})
    wl = {"base": "ppo", "env_runners": runners, "envs_per_runner": 1, "fragment_length": 50, "bytes_per_step": 4096,
          "env_step_time": 1e-4, "env_step_cv": 0.0, "inference_time": 0.0, "runner_call_overhead": 0.0,
          "train_batch_per_learner": 50 * runners, "learners": 1, "local_learner": local, "frame_stack": 1}
    sim, _ = run(topology(gpus=1), wl, iterations=3, stock=stock)
    for it in (1, 2):
        b = sim.rec.segments[it]["b"]
        if local:
            assert b == pytest.approx(call_ms * 1e-3, rel=1e-9, abs=1e-12)
        else:
            assert b >= driver_ms * 1e-3 + (rtt_ms - driver_ms) * 1e-3 / 2 - 1e-12
    assert sim.stock_calls["update_call"] == 3


# ---------------------------------------------------------------- the driver reads replies after the last arrives
@SETTINGS
@given(runners=st.integers(1, 4), get_ms=st.floats(0.5, 20.0), cv=st.floats(0.0, 0.8), per_step_us=st.floats(0.0, 50.0),
       steps_per_row=st.sampled_from([1, 5, 50]))
def test_the_driver_reads_every_reply_only_after_the_last_arrives(runners, get_ms, cv, per_step_us, steps_per_row):
    """``utils/actor_manager.py: FaultTolerantActorManager._fetch_result`` waits for every ``sample()`` reply
    (``ray.wait(num_returns=len(calls))``), then ``ray.get``s each on the driver's thread: an early runner's
    episodes are not read while a later one still samples, so segment *a* (from the last runner's end) holds
    every reply's read -- the get plus each RLlib timestep's share (``sample_deserialize_per_step``; a row of
    ``steps_per_row`` tokens is one timestep) -- and, with nothing else to pay, little more."""
    zero = {f.name: 0.0 for f in fields(StockCosts)}
    zero["deserialize_bandwidth"] = math.inf
    zero["serialize_bandwidth"] = math.inf
    stock = StockCosts(**{**zero, "get_per_object": get_ms * 1e-3, "sample_deserialize_per_step": per_step_us * 1e-6})
    fragment = 50
    wl = {"base": "ppo", "env_runners": runners, "envs_per_runner": 1, "fragment_length": fragment,
          "bytes_per_step": 1, "env_step_time": 1e-3, "env_step_cv": cv, "inference_time": 0.0,
          "runner_call_overhead": 0.0, "train_batch_per_learner": fragment * runners, "learners": 1,
          "local_learner": True, "frame_stack": 1, "steps_per_row": steps_per_row}
    sim, _ = run(topology(gpus=1), wl, iterations=3, stock=stock)
    read = runners * (get_ms * 1e-3 + fragment / steps_per_row * per_step_us * 1e-6)
    for it in (1, 2):
        assert read * (1 - 1e-9) <= sim.rec.segments[it]["a"] <= read + 1e-4
    assert sim.stock_calls["sample_result"] == 3 * runners


# ---------------------------------------------------------------- PPO's "auto" fragment keeps batches exact
@given(runners=st.integers(1, 64), learners=st.integers(1, 4), batch=st.integers(1, 5000),
       fragment=st.integers(1, 4000))
def test_auto_fragment_divides_the_learners_batch_whenever_it_shortens_the_fragment(runners, learners, batch,
                                                                                    fragment):
    """A fragment that did not divide ``train_batch_per_learner`` would make the last chunk overshoot the batch
    (found by hypothesis: runners=10, batch=81 gave fragment 8 and an 88-step batch that overflowed an HBM sized
    for 81 steps, a stall)."""
    from conduit.sim.engine import auto_fragment

    wl = load_workload({"base": "ppo", "envs_per_runner": 1, "fragment_length": fragment,
                        "train_batch_per_learner": max(batch, fragment)})
    out = auto_fragment(wl, runners, learners)
    if out.fragment_length == wl.fragment_length:
        # nothing to shorten: the runners' fragments fit the batch, or the fragment is one step already
        assert runners * wl.chunk_steps <= learners * wl.train_batch_per_learner or \
            out.fragment_length <= max(1, learners * wl.train_batch_per_learner // runners)
    else:
        assert out.fragment_length < wl.fragment_length
        assert wl.train_batch_per_learner % out.fragment_length == 0
        assert out.fragment_length <= max(1, learners * wl.train_batch_per_learner // runners)
