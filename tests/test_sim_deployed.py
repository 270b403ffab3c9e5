"""``conduit`` in the simulator is Conduit as ``enable()`` deploys it (:mod:`conduit.sim.deployed`).

What is checked: the headline policy named ``conduit`` is the deployed model and the design target is
a separately named variant; the deployed model obeys its own costs (DQN's iteration is never below its
per-step sample-RPC floor, a dearer plane round trip never makes an APPO or DQN run faster and a PPO run
faster only by its value stream's tail, the plane calls it makes
are the runtime's); the contracts hold (0 violations) under random plane costs; the plane's costs come
from the measured file (and from any calibration given), and the runtime settings it restates are the
runtime's.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, fields, replace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_sim import tiny_topology_dict

from conduit.registry import create_policy
from conduit.sim.cost_file import (
    CostFileError,
    default_plane_costs,
    load_plane_costs,
    plane_costs_from_mapping,
)
from conduit.sim.deployed import MULTI_LEARNER_WARNING
from conduit.sim.engine import Simulation
from conduit.sim.params import PLANE_COLD_SOURCES, PLANE_PRIMITIVES_FILE, PLANE_SOURCES, PlaneCosts, StockCosts
from conduit.sim.run import simulate
from conduit.sim.workload import load_workload
from conduit.topology import load_topology, topology_from_dict

SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REF = "reference-2core"


def tiny(nodes: int = 1, gpus: int = 2):
    return topology_from_dict(tiny_topology_dict(nodes=nodes, gpus=gpus))


# ------------------------------------------------------------------ the headline is the deployed model
def test_the_policy_named_conduit_is_the_deployed_model():
    deployed, target = create_policy("conduit"), create_policy("conduit-target")
    assert deployed.path.deployment == "enable" and target.path.deployment == "target"
    # the same decisions: only the simulator's model of the surrounding runtime differs
    assert deployed.params == target.params
    assert replace(deployed.path, deployment="target") == target.path
    sim = Simulation(tiny(), load_workload("ppo"), deployed, iterations=1)
    assert sim.deployed is True
    assert Simulation(tiny(), load_workload("ppo"), target, iterations=1).deployed is False
    # the quickstart's headline is the deployed one, and it shows the design target only by its own name
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("quickstart", Path(__file__).parents[1] / "studies" / "quickstart.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    assert "conduit" in quickstart.DEFAULT_POLICIES
    assert quickstart.HEADLINE == "conduit"


def test_deployment_setting_is_checked():
    from conduit.errors import ConduitError
    from conduit.policy import PathSettings

    with pytest.raises(ConduitError, match="deployment"):
        PathSettings(deployment="someday")
    with pytest.raises(ConduitError, match="route='direct'"):
        PathSettings(route="driver", deployment="enable")


# ------------------------------------------------------------------ the model obeys its costs
@SETTINGS
@given(rtt=st.floats(0.0, 20e-3), sync=st.floats(0.0, 5e-3), frag=st.integers(1, 4), ratio=st.sampled_from([8.0, 32.0]))
def test_dqn_iteration_is_never_below_its_sample_rpc_floor(rtt, sync, frag, ratio):
    """RLlib's DQN loop stays: each round is a synchronous ``sample()`` round trip of ``frag`` steps,
    then its updates, then the weight sync. An update can never come faster than that round divided
    by the updates it allows."""
    w = replace(load_workload("ref-dqn-cartpole"), fragment_length=frag, replay_ratio=ratio,
                weight_sync_time=sync)
    stock = StockCosts()
    sim = Simulation(load_topology(REF), w, create_policy("conduit"), iterations=40,
                     plane=replace(PlaneCosts(), call_round_trip=rtt))
    result = sim.run()
    assert result.audit.violations == 0
    per_round = (w.runner_call_overhead + frag * (w.env_step_time + w.inference_time) + stock.rpc_overhead
                 + sync + w.update_overhead)
    updates_per_round = max(1.0, ratio * frag / w.batch_size)
    floor = per_round / updates_per_round
    assert result.metrics["iteration_time_s"] >= floor * (1 - 1e-9)
    # the driver really ran RLlib's loop: one sample result per runner and round, one update call per update
    assert sim.stock_calls["update_call"] == 40
    assert sim.stock_calls["sample_result"] == sim.stock_calls["round"] >= 40 / updates_per_round


@SETTINGS
@example(algorithm="dqn", base=0.0, extra=0.01171875)  # found by hypothesis: 2.1 ms sooner of 28.1 s
@given(algorithm=st.sampled_from(["dqn", "appo"]), base=st.floats(0.0, 5e-3), extra=st.floats(1e-4, 20e-3))
def test_a_dearer_plane_round_trip_makes_conduit_sooner_by_at_most_the_replies_thread_work(algorithm, base, extra):
    """APPO and DQN: every plane call lies on a fixed path (a chunk's ingest, a batch's delivery), so a
    dearer round trip can end the same work sooner only through the one thing it moves: where a
    delivery's own work on the learner's thread (the call's ``rpc_driver_cpu``, the reply's
    ``get_per_object``) falls among the thread's other work. The learner's threads share one GIL, which
    the model keeps as one FIFO thread: with a free round trip DQN's reply lands on the thread just
    before the weight sync's ``get_state`` and delays it 0.52 ms a round; a dearer one moves it after
    (the example). So the run is never sooner by more than that work, once per delivery. (PPO's value
    stream is the other exception: the next test.)"""
    topo, w = tiny(), load_workload(algorithm)
    iters = {"dqn": 40, "appo": 12}[algorithm]
    runs = []
    for rtt in (base, base + extra):
        sim = Simulation(topo, w, create_policy("conduit"), iterations=iters,
                         plane=replace(PlaneCosts(), call_round_trip=rtt))
        runs.append((sim.run(), sim))
    (cheap, _), (dear, sim) = runs
    assert cheap.audit.violations == 0 and dear.audit.violations == 0
    stock = sim.stock
    # the most the delivery's work on the learner's thread can weigh: the call, and a reply's get
    per_delivery = stock.rpc_driver_cpu + stock.get_per_object
    slack = sim.plane_calls["next_batch"] * per_delivery
    # the run's length in simulated time: the same work, never sooner by more than the slack
    assert dear.sim_time >= cheap.sim_time * (1 - 1e-9) - slack


@SETTINGS
@example(base=0.003025846821837113, extra=0.0001, cv=0.1)  # dearer run 0.17 ms sooner (of 2.78 s)
@example(base=0.000303425000349335, extra=0.000303425000349335, cv=0.0)  # 0.84 ms sooner, no random steps
@given(base=st.floats(0.0, 5e-3), extra=st.floats(1e-4, 20e-3), cv=st.sampled_from([0.0, 0.1]))
def test_a_dearer_round_trip_makes_ppo_sooner_by_at_most_the_value_streams_tail(base, extra, cv):
    """PPO under ``enable()``: the learner's value stream (``values.py: ValueStream``) peeks whatever has
    landed, one call for all of it, then runs the value pass on it. A dearer round trip shifts the
    peeks against the landings, so a later peek can cover more chunks: the work left at update start
    (the stream's tail) can be smaller, and the run can end sooner -- a genuine scheduling anomaly of a
    polling stream, found by hypothesis (the examples above; also with deterministic env steps, so it is
    not the random draws). What the phase changes per update is the tail, so the gain asserted is at most
    the stream's work on one chunk in each of the last two peeks (its value pass and a peek call) per
    update: about 7 ms, against 0.84 ms the largest gain seen over 160 draws of 2 updates."""
    topo = tiny()
    iters = 2
    costs = PlaneCosts()
    w = load_workload("ppo")
    runs = [simulate(topo, "ppo", "conduit", iterations=iters, overrides={"env_step_cv": cv},
                     plane_costs=replace(costs, call_round_trip=rtt)) for rtt in (base, base + extra)]
    cheap, dear = runs
    assert cheap.audit.violations == 0 and dear.audit.violations == 0
    tail = 2 * (w.chunk_steps * w.value_pass_per_sample + base + extra + costs.deliver_per_call)
    assert dear.sim_time >= cheap.sim_time - iters * tail
    # and never sooner by more than a small fraction: the anomaly is a phase, not a speed-up
    assert dear.sim_time >= cheap.sim_time * (1 - 0.01)


@SETTINGS
@given(local=st.booleans(), pickling=st.floats(0.5, 2.0))
def test_a_local_ppo_learner_is_called_in_place_under_enable(local, pickling):
    """``LearnerGroup.update`` with ``num_learners=0`` calls the learner in the driver (``is_local``): the update
    call pickles nothing, so what a remote call's argument costs (``shard_serialize_per_episode``, here 0.5-2 s a
    ticket: longer than the value stream's tail, which a cheaper call hides) does not touch a local learner's
    run, and delays a remote one's."""
    topo = tiny(gpus=1)
    over = {"local_learner": local, "learners": 1, "env_runners": 2}
    free, dear = (simulate(topo, "ppo", "conduit", iterations=2, overrides=over,
                           stock_costs=replace(StockCosts(), shard_serialize_per_episode=cost))
                  for cost in (0.0, pickling))
    assert free.audit.violations == 0 and dear.audit.violations == 0
    if local:
        assert dear.sim_time == free.sim_time
    else:
        assert dear.sim_time > free.sim_time


@SETTINGS
@given(rate=st.floats(50.0, 5e4), episode_length=st.floats(5.0, 2000.0))
def test_a_ppo_learner_rebuilds_its_batch_as_episodes_at_update_start(rate, episode_length):
    """``values.py: ValueStream.episodes_for`` -> ``layout.py: rebuild_trajectories`` builds one
    ``SingleAgentEpisode`` per episode run before RLlib's connector, on the learner's thread at update start:
    a slower rebuild (``PlaneCosts.rebuild_runs_per_s``) delays every PPO update by exactly its extra time on
    a topology with a core per process, by the runs the batch holds (its episodes plus one per runner)."""
    topo = tiny(gpus=1)
    over = {"local_learner": False, "learners": 1, "env_runners": 2, "episode_length": episode_length}
    free, dear = (Simulation(topo, load_workload({"base": "ppo", **over}), create_policy("conduit"), iterations=2,
                             plane=replace(PlaneCosts(), rebuild_runs_per_s=r, rebuild_per_call=0.0,
                                                 pack_bandwidth=math.inf))
                  for r in (math.inf, rate))
    slow = dear.run()
    fast = free.run()
    assert slow.audit.violations == 0 and fast.audit.violations == 0
    w = dear.workload
    lr = dear.layout.learners[0]
    cids = [c for c, t in dear.rec.chunks.items() if t.learner == lr.id and t.version == 0]
    runs = len(cids) * w.chunk_steps / w.episode_length + len({dear.rec.chunks[c].runner for c in cids})
    assert dear.rebuild_time(cids) == pytest.approx(runs / rate, rel=1e-12)
    ready_slow = min(u.t_batch_ready for u in dear.rec.updates if u.update == 0)
    ready_fast = min(u.t_batch_ready for u in free.rec.updates if u.update == 0)
    assert ready_slow - ready_fast == pytest.approx(runs / rate, rel=1e-6, abs=1e-9)


def test_free_plane_calls_and_copies_cost_nothing_on_the_plane():
    """With every plane cost at zero (``PlaneCosts.scaled(0)``) what remains is RLlib's control path
    and the learner's pipeline: never slower than with the measured plane costs."""
    zero = PlaneCosts().scaled(0.0)
    assert zero.call_round_trip == 0 and zero.ingest_copy_bandwidth == math.inf
    for algorithm, iters in (("ppo", 3), ("appo", 15), ("dqn", 40)):
        free = simulate(tiny(), algorithm, "conduit", iterations=iters, plane_costs=zero)
        measured = simulate(tiny(), algorithm, "conduit", iterations=iters)
        assert free.audit.violations == 0
        assert free.sim_time <= measured.sim_time * (1 + 1e-9), algorithm


@pytest.mark.parametrize("algorithm", ["ppo", "appo", "dqn"])
def test_the_plane_calls_are_the_runtimes(algorithm):
    """Which calls the deployed model makes: PPO: a delivery per update per learner plus value-stream
    peeks, one driver ``update`` call per update per learner, one result per runner per iteration; DQN:
    one ``update`` call per update, deliveries drawn ahead by the prefetch thread, one result per runner
    per round; APPO: a plane batch enters a learner only through a driver ``update`` call (the learner
    reuses its circular buffer in between, as stock's does)."""
    iters = {"ppo": 3, "dqn": 40, "appo": 12}[algorithm]
    sim = Simulation(tiny(), load_workload(algorithm), create_policy("conduit"), iterations=iters)
    result = sim.run()
    assert result.audit.violations == 0
    learners = len(sim.layout.learners)
    assert sim.plane_calls["ingest"] >= 1
    if algorithm == "ppo":
        assert sim.plane_calls["next_batch"] == iters * learners
        assert sim.plane_calls["peek"] >= iters * learners
        assert sim.stock_calls["update_call"] == iters * learners
        assert sim.stock_calls["sample_result"] == iters * len(sim.layout.runners)
    elif algorithm == "dqn":
        assert sim.stock_calls["update_call"] == iters * learners
        assert sim.plane_calls["next_batch"] >= iters * learners  # drawn ahead by the prefetcher
        assert sim.stock_calls["sample_result"] == sim.stock_calls["round"] * len(sim.layout.runners)
    else:  # fresh data enters a learner only through the driver's update calls; the learner reuses it
        # the prefetch thread fetches one batch ahead of the calls
        assert 1 <= sim.plane_calls["next_batch"] <= sim.stock_calls["update_call"] + learners
        cpb = sim.workload.chunks_per_batch
        for lr in sim.layout.learners:
            assert 0 < sim.appo_admitted[lr.id] <= sim._deployed_calls[lr.id] * cpb


@SETTINGS
@given(depth=st.sampled_from([None, 0, 1, 2, 3]), update_scale=st.sampled_from([0.2, 1.0, 20.0]))
def test_deployed_appo_builds_batches_on_the_main_thread_beside_training(depth, update_scale):
    """APPO under ``enable()`` (``learner.py``): the learner actor's main thread takes the prefetched
    batch when a driver ``update`` call arrives, runs the connector and hands the batch to the learner
    thread, which trains on its own. So a batch enters the circular buffer only through a call (at most
    ``chunks_per_batch`` chunks per call), the prefetch thread is never more than ``depth`` batches
    ahead of the calls, and when the learner is the bottleneck (long updates) the next batch is built
    while it trains: no update waits on the experience path (measured for real on appo-largeobs-2r-1l:
    0 ms exposed, ``results/validation/measured.json``)."""
    w = load_workload("appo")
    w = replace(w, update_time_per_sample=w.update_time_per_sample * update_scale)
    params = {} if depth is None else {"depth": depth}
    sim = Simulation(tiny(), w, create_policy("conduit", **params), iterations=12)
    result = sim.run()
    assert result.audit.violations == 0
    learners = sim.layout.learners
    ahead = 1 if depth is None else depth
    assert sim.plane_calls["next_batch"] <= sim.stock_calls["update_call"] + ahead * len(learners)
    for lr in learners:
        assert 0 < sim.appo_admitted[lr.id] <= sim._deployed_calls[lr.id] * w.chunks_per_batch
    assert not sim._chunks  # every chunk, wherever the end found it (plane, prefetch, main thread), released
    if update_scale >= 20:
        steady = [u for u in sim.rec.updates if u.update >= 4]
        assert steady and max(u.exposed for u in steady) == 0.0


@SETTINGS
@given(prioritized=st.booleans(), ratio=st.sampled_from([8.0, 32.0]), rtt=st.floats(0.2e-3, 10e-3),
       runners=st.sampled_from([1.0, 2.0]))
def test_deployed_dqn_draws_after_the_priorities_it_must_see(prioritized, ratio, rtt, runners):
    """``enable()`` with a prioritized buffer (``learner.py``): every update's end sends its TD errors to the
    plane (one ``update_priorities`` call per update; none with a uniform table), and asks the prefetch
    thread for one more batch; the thread keeps one batch requested (two for a uniform table), and a draw
    waits until every priority update sent before it has landed. So with a prioritized table draw *k* (k >= 1)
    begins after update *k - 1* ended and after its priorities landed; with a uniform one, after update
    *k - 2* ended."""
    w = replace(load_workload("ref-dqn-cartpole"), prioritized_replay=prioritized, replay_ratio=ratio,
                runners_per_gpu=runners)
    iters = 30
    sim = Simulation(load_topology(REF), w, create_policy("conduit"), iterations=iters,
                     plane=replace(PlaneCosts(), call_round_trip=rtt))
    result = sim.run()
    assert result.audit.violations == 0
    (lr,) = sim.layout.learners
    ends = sorted(u.t_end for u in result.recorder.updates if u.learner == lr.id)
    draws = sim.replay_draw_times[lr.id]
    assert len(ends) == iters and len(draws) >= iters
    if prioritized:
        assert sim.plane_calls["update_priorities"] == len(sim.priorities_landed[lr.id]) >= iters - 1
        landed = sim.priorities_landed[lr.id]
        for k in range(1, len(draws)):
            assert draws[k] >= ends[k - 1] and draws[k] >= landed[k - 1] > ends[k - 1]
    else:
        assert sim.plane_calls["update_priorities"] == 0 and not sim.priorities_landed[lr.id]
        for k in range(2, len(draws)):
            assert draws[k] >= ends[k - 2]


def test_each_plane_call_costs_the_actor_rays_side_too():
    """``PlaneCosts.actor_callee_cpu`` (Ray's side of a call, measured as the actor's process CPU per call)
    is charged on the plane actor's core for every call: dearer, it never ends a DQN run sooner, and a run
    with it at zero is no slower."""
    topo = tiny()
    base = simulate(topo, "dqn", "conduit", iterations=40, plane_costs=replace(PlaneCosts(), actor_callee_cpu=0.0))
    dear = simulate(topo, "dqn", "conduit", iterations=40, plane_costs=replace(PlaneCosts(), actor_callee_cpu=5e-3))
    assert base.audit.violations == 0 and dear.audit.violations == 0
    assert dear.sim_time >= base.sim_time * (1 - 1e-9)
    assert dear.cpu_busy[next(iter(dear.cpu_busy))] > base.cpu_busy[next(iter(base.cpu_busy))]


def test_more_than_one_learner_is_an_extrapolation_and_says_so():
    many = simulate(tiny(gpus=2), "ppo", "conduit", iterations=2)
    assert len({u.learner for u in many.recorder.updates}) == 2
    assert MULTI_LEARNER_WARNING in many.warnings
    one = simulate(REF, "ref-dqn-cartpole", "conduit", iterations=20)
    assert MULTI_LEARNER_WARNING not in one.warnings
    assert MULTI_LEARNER_WARNING not in simulate(tiny(gpus=2), "ppo", "conduit-target", iterations=2).warnings


# ------------------------------------------------------------------ contracts under random costs
@SETTINGS
@given(algorithm=st.sampled_from(["ppo", "appo", "dqn"]), scale=st.floats(0.0, 50.0),
       inline=st.sampled_from([0.0, 256 * 1024, 1e12]), runners=st.sampled_from([1, 2]), nodes=st.sampled_from([1, 2]))
def test_deployed_runs_keep_the_contracts(algorithm, scale, inline, runners, nodes):
    plane = replace(PlaneCosts().scaled(scale), inline_bytes=inline)
    iters = {"ppo": 2, "dqn": 30, "appo": 12}[algorithm]
    result = simulate(tiny(nodes=nodes), algorithm, "conduit", iterations=iters, plane_costs=plane,
                      overrides={"runners_per_gpu": runners})
    assert result.audit.violations == 0
    assert result.metrics["updates"] >= min(iters, 1)
    assert math.isfinite(result.metrics["iteration_time_s"]) and result.metrics["iteration_time_s"] > 0


# ------------------------------------------------------------------ costs measured, not assumed
def test_plane_cost_defaults_restate_the_measured_file():
    costs, taken = default_plane_costs()
    assert set(taken) == set(PLANE_SOURCES) | set(PLANE_COLD_SOURCES)
    assert all(v.startswith(PLANE_PRIMITIVES_FILE) for v in taken.values())
    builtin = PlaneCosts()
    for name in PLANE_SOURCES:
        assert getattr(builtin, name) == pytest.approx(getattr(costs, name), rel=1e-3), name
    for name in PLANE_COLD_SOURCES:  # the cold-call law's plane side, merged into the same file
        assert taken[name].startswith(PLANE_PRIMITIVES_FILE)
        assert getattr(costs, name) > 0 and getattr(builtin, name) == pytest.approx(getattr(costs, name), rel=1e-3), name
    prov = simulate(tiny(), "ppo", "conduit", iterations=1).provenance["cost_parameters"]["plane"]
    assert PLANE_PRIMITIVES_FILE in prov["source"]


def test_runtime_settings_restated_in_plane_costs_are_the_runtimes():
    """Read from the runtime's source text (importing it would import Ray and RLlib: seconds)."""
    import re
    from pathlib import Path

    import conduit

    rllib = Path(conduit.__file__).parent / "runtime" / "rllib"
    env_runner, plan, callbacks = ((rllib / f"{name}.py").read_text() for name in ("env_runner", "plan", "callbacks"))
    p = PlaneCosts()
    assert int(re.search(r"^MAX_IN_FLIGHT = (\d+)", env_runner, re.MULTILINE).group(1)) == p.max_in_flight == p.max_coalesced_calls
    assert f'"coalesce_s": {p.coalesce_s}' in plan
    assert f"inline_bytes\", {int(p.inline_bytes) >> 10} << 10" in callbacks
    # PPO's stream chunk size is not restated: both sides call conduit.deploy_settings (test_deploy_settings.py)
    assert "stream_chunk_steps(smallest, envs)" in plan and not hasattr(p, "ppo_pieces")


def test_plane_costs_from_a_calibration_file(tmp_path):
    calibration = {"host": {"hostname": "x"}, "measurements": {
        "plane_actor_call": {"latency": 0.004, "bandwidth": 1e18, "samples": 10},
        "plane_ingest": {"latency": 1e-4, "bandwidth": 2e9, "samples": 10},
        "memcpy": {"latency": None, "bandwidth": None, "samples": 0, "note": "failed"}}}
    path = tmp_path / "plane.json"
    path.write_text(json.dumps(calibration))
    costs, taken = load_plane_costs(path)
    assert costs.call_round_trip == 0.004 and costs.ingest_per_call == 1e-4 and costs.ingest_copy_bandwidth == 2e9
    assert costs.pack_bandwidth == PlaneCosts().pack_bandwidth  # not measured there: the built-in stays
    assert set(taken) == {"call_round_trip", "ingest_per_call", "ingest_copy_bandwidth"}
    result = simulate(tiny(), "ppo", "conduit", iterations=1, plane_costs=path)
    assert result.provenance["cost_parameters"]["plane"]["values"]["call_round_trip"] == 0.004
    assert str(path) in result.provenance["cost_parameters"]["plane"]["source"]


@pytest.mark.parametrize(("data", "field"), [
    ({"call_round_trip": -1}, "call_round_trip"),
    ({"call_round_trp": 1e-3}, "call_round_trip"),  # a typo names the closest field
    ({"max_in_flight": 2.5}, "max_in_flight"),
    ({"measurements": {"plane_ingest": {"latency": "fast", "bandwidth": 1e9, "samples": 3}}}, "plane_ingest"),
    ({"measurements": {"disk_read": {"latency": 1.0, "bandwidth": 1e9, "samples": 3}}}, "measurements"),
])
def test_bad_plane_cost_files_name_the_file_and_field(tmp_path, data, field):
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps(data))
    with pytest.raises(CostFileError) as err:
        load_plane_costs(path)
    assert str(path) in str(err.value) and field in str(err.value)


def test_a_json_calibration_reads_exponent_floats_as_numbers(tmp_path):
    """``json.dumps`` writes 1e-06 without a dot, which YAML 1.1 would read as a string: a ``.json`` cost
    file is read as JSON; a broken one is named with its line."""
    path = tmp_path / "plane.json"
    path.write_text(json.dumps({"measurements": {"plane_actor_callee": {"latency": 1e-6, "bandwidth": 1e18,
                                                                        "samples": 3}}}))
    costs, taken = load_plane_costs(path)
    assert costs.actor_callee_cpu == 1e-6 and set(taken) == {"actor_callee_cpu"}
    path.write_text('{"measurements": {')
    with pytest.raises(CostFileError, match="not valid JSON at line 1"):
        load_plane_costs(path)


def test_plane_costs_mapping_round_trips():
    costs = PlaneCosts()
    again = plane_costs_from_mapping({f.name: getattr(costs, f.name) for f in fields(costs)})
    assert asdict(again) == asdict(costs)


def test_calibrate_measures_the_plane_in_process():
    from conduit.runtime.calibrate import measure_plane

    ms = measure_plane(quick=True, ray=False)
    for name in ("plane_ingest", "plane_deliver", "memcpy"):
        assert ms[name].ok, ms[name].note
        assert ms[name].latency >= 0 and ms[name].bandwidth > 0
    # the actor's figures (its round trip, its CPU per call) need Ray: tests/test_runtime_calibrate.py
    assert not {"plane_actor_call", "plane_actor_callee", "plane_replay_draw", "plane_replay_priorities"} & set(ms)


@SETTINGS
@given(runners=st.sampled_from([1.0, 2.0, 3.0]), get_ms=st.floats(0.5, 10.0), book_ms=st.floats(0.0, 5.0))
def test_deployed_dqn_reads_each_empty_reply_after_the_last_with_the_metrics_once(runners, get_ms, book_ms):
    """Under ``enable()`` DQN's ``sample()`` returns an empty list (the transitions went to the plane), but the
    driver's ``FaultTolerantActorManager._fetch_result`` still waits for every reply and ``ray.get``s each, and the
    runners' metrics are aggregated as in stock RLlib: segment *a* of every round holds each reply's get and its
    bookkeeping (:meth:`~conduit.sim.engine.Simulation.read_runner_results`, the rule stock uses)."""
    zero = {f.name: 0.0 for f in fields(StockCosts)}
    zero.update(deserialize_bandwidth=math.inf, serialize_bandwidth=math.inf)
    stock = StockCosts(**{**zero, "get_per_object": get_ms * 1e-3, "driver_bookkeeping": book_ms * 1e-3})
    w = replace(load_workload("ref-dqn-cartpole"), runners_per_gpu=runners)
    sim = Simulation(load_topology(REF), w, create_policy("conduit"), iterations=12, stock=stock)
    result = sim.run()
    assert result.audit.violations == 0
    n = len(sim.layout.runners)
    rounds = sim.stock_calls["round"]
    assert sim.stock_calls["sample_result"] == rounds * n
    read = n * (get_ms + book_ms) * 1e-3
    spans = [seg["a"] for seg in sim.rec.segments.values() if "a" in seg]
    assert spans and all(a >= read * (1 - 1e-9) for a in spans)


@SETTINGS
@given(rest=st.floats(0.0, 40e-6), policy=st.sampled_from(["conduit", "rllib-stock"]))
def test_gae_after_its_forward_pass_runs_where_each_side_runs_it(rest, policy):
    """RLlib's GAE piece is the value forward pass (``value_pass_per_sample``, on the learner's device) and then the
    bootstrap rows, value targets and advantages (``advantage_per_sample``, numpy on the learner's CPU thread).
    Stock runs both after sampling; under ``enable()`` the ``ValueStream`` runs only the forward pass while the
    runners sample and ``StreamedGAE`` the rest over the whole batch at update start (``values.py``). Either way
    the rest leaves the device's busy time alone and, with a core per process, adds exactly its time to each
    update's exposed latency."""
    topo = tiny(gpus=1)
    over = {"local_learner": False, "learners": 1, "env_runners": 2, "value_pass_per_sample": 40e-6}
    none, some = (Simulation(topo, load_workload({"base": "ppo", **over, "advantage_per_sample": a}),
                             create_policy(policy), iterations=2) for a in (0.0, rest))
    assert none.run().audit.violations == 0 and some.run().audit.violations == 0
    lr = some.layout.learners[0]
    assert some.compute[lr.device].busy_seconds == pytest.approx(none.compute[lr.device].busy_seconds, rel=1e-12)
    for k in (0, 1):  # each update's exposed latency (its batch ready after its last chunk sampled)
        delay = (max(u.exposed for u in some.rec.updates if u.update == k)
                 - max(u.exposed for u in none.rec.updates if u.update == k))
        samples = max(u.samples for u in some.rec.updates if u.update == k)
        assert delay == pytest.approx(samples * rest, rel=1e-6, abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(seconds=st.floats(1e-3, 0.5), others=st.integers(0, 3))
def test_a_cpu_learners_value_pass_takes_a_core_of_its_crowded_node(seconds, others):
    """GAE's value pass (under ``enable()`` the ``ValueStream``'s, which runs while the runners sample) is torch
    compute of the learner's process: on a CPU learner of a crowded node it holds a core of that node, as the
    update does, so its core-seconds are the node's and, beside ``others`` threads' compute on the node's cores,
    the last of them ends no sooner than the cores allow. A GPU learner's runs on the GPU and takes no core."""
    workload = load_workload({"base": "ppo", "env_runners": 2, "learners": 1, "local_learner": False})
    for topology, on_cpu in ((load_topology(REF), True), (tiny(gpus=1), False)):
        sim = Simulation(topology, workload, create_policy("conduit"), iterations=1)
        lr = sim.layout.learners[0]
        assert (lr.hbm is None) == on_cpu
        if on_cpu:
            assert sim.crowded[lr.node]
        pool, ends = sim.cpus[lr.node], []

        def thread(work, ends=ends, env=sim.env):
            yield from work
            ends.append(env.now)

        for _ in range(others):
            sim.env.process(thread(sim.on_cores(lr.node, seconds)))
        sim.env.process(thread(sim.value_pass(lr, seconds)))
        sim.env.run()
        assert sim.compute[lr.device].busy_seconds == pytest.approx(seconds)
        if on_cpu:
            threads = others + 1
            assert pool.busy_core_seconds >= threads * seconds * (1 - 1e-9)
            assert max(ends) >= threads * seconds / pool.cores * (1 - 1e-9)
        else:  # a node with a core per process: nothing waits, nothing is counted on its pool
            assert pool.busy_core_seconds == 0.0 and max(ends) == pytest.approx(seconds)


@settings(max_examples=8, deadline=None)
@given(per_sample=st.floats(1e-7, 2e-4), share=st.floats(0.0, 1.0))
def test_the_value_stream_charges_its_pieces_their_own_figure(per_sample, share):
    """``stream_value_pass_per_sample`` prices the deployed ValueStream's forward pass on its pieces; unset, it
    is ``value_pass_per_sample`` (the same run to the event). The learner device's busy time falls by exactly
    the streamed samples times the difference (linear in the figure), and stock, which runs the pass on the
    whole batch, does not read it. (Update times are not monotone in it: the pass shares the node's cores with
    the runners, and the order of their slices moves.)"""
    base = {"base": "ppo", "env_runners": 2, "learners": 1, "local_learner": False,
            "value_pass_per_sample": per_sample}
    topology = load_topology(REF)

    def run(policy, **extra):
        sim = Simulation(topology, load_workload({**base, **extra}), create_policy(policy), iterations=3)
        sim.run()
        busy = sim.compute[sim.layout.learners[0].device].busy_seconds
        return busy, [(u.update, u.t_start, u.exposed) for u in sim.rec.updates]

    unset = run("conduit")
    assert run("conduit", stream_value_pass_per_sample=per_sample) == unset
    free = unset[0] - run("conduit", stream_value_pass_per_sample=0.0)[0]
    assert free > 0  # the stream ran the pass on some samples
    cheaper = unset[0] - run("conduit", stream_value_pass_per_sample=per_sample * share)[0]
    assert cheaper == pytest.approx((1 - share) * free, rel=1e-6, abs=1e-9)
    assert run("rllib-stock", stream_value_pass_per_sample=per_sample * share) == run("rllib-stock")


def test_the_piece_figure_is_a_workload_field_that_may_be_left_unset():
    from conduit.sim.workload import WorkloadError
    from conduit.sim.workload_fields import coerce_field

    assert coerce_field("stream_value_pass_per_sample", "null") is None
    assert coerce_field("stream_value_pass_per_sample", "70 us") == pytest.approx(70e-6)
    assert load_workload({"base": "ppo"}).stream_value_pass_per_sample is None
    with pytest.raises(WorkloadError, match="stream_value_pass_per_sample"):
        load_workload({"base": "ppo", "stream_value_pass_per_sample": -1e-6})
