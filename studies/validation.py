"""Study: out-of-sample validation of the simulator against real RLlib runs on this machine.

    python studies/validation.py [--calibration FILE] [--predict-only | --measured FILE] [--quick]
        [--workloads NAME,...] [--sides stock,conduit] [--iters 9] [--warmup 1] [--runs 1] [--no-recheck]
        [--out results/validation]

1. **Calibrate** (microbenchmarks only): this machine's primitives (memcpy, shared memory, pickle, Ray's
   object store: :func:`conduit.runtime.calibrate.measure_machine`) and the workload primitives of
   ``studies/rllib_experience_path.py``'s own configs (EnvRunner sampling per step and per call, RLModule
   update and value pass per sample, weight get/set: :func:`conduit.runtime.calibrate.measure_workload_primitives`),
   written to ``OUT/calibration.json``; or read from ``--calibration FILE`` (then the prediction is a
   pure function of that file and the code: rerun it with the same file and it prints the same numbers).
   ``StockCosts`` come from ``--stock-primitives`` (default ``benchmarks/stock_primitives.2core-vm.json``;
   :func:`stock_costs_from_primitives`, the field mapping of :data:`conduit.sim.params.STOCK_SOURCES`) and
   ``PlaneCosts`` from ``--plane-primitives`` (default the built-in ones): a VM can move between hosts, so
   measure both on the calibration's host (``benchmarks/stock_primitives.py``,
   ``benchmarks/plane_primitives.py``). The cold-call law (:mod:`conduit.sim.raycalls`) is on where the stock
   file has section ``gap`` (the built-in one does since 2026-12-07); a ``--plane-primitives`` file must then
   carry the plane's ``*_cold`` figures too, or the study stops before calibrating, naming the file and the
   figures (:func:`check_plane_cold_calls`; ``--no-cold-calls`` turns the law off). No end-to-end figure feeds
   any parameter, and the ``ref-*`` presets (which copy measured segments: in-sample) are not used.
2. **Predict**: each workload of ``studies/rllib_experience_path.py`` (imported, not restated: its
   :data:`WORKLOADS` build the RLlib configs, and :func:`sim_workload` reads the simulator's workload off
   each config, field by field) is simulated on the topology written from the calibration
   (:func:`conduit.runtime.calibrate.topology_yaml`), ``rllib-stock`` for the stock side and ``conduit`` for
   the Conduit side, with a fixed seed.
3. **Measure**: the same workloads run for real through that study's runner (each side in its own
   interpreter, medians over ``--iters - --warmup`` iterations after warm-up; ``--runs N``: every workload and
   side N times, interleaved, and the medians of the runs' medians, with each run's iteration time in the
   report: one run on the shared 2-core VM moves by 1.2-1.3x back to back); or ``--measured FILE`` reuses
   a previous run's ``measured.json``; ``--predict-only`` skips this step.
4. **Compare**: ``OUT/validation.json`` holds a list of ``{workload, side, metric, predicted, measured,
   rel_error}`` for ``iteration_time_s``, ``exposed_experience_path_s`` and ``experience_share`` (measured:
   the instrument's ``iteration_ms``, ``exposed_per_update_ms`` and ``experience_share``, the same
   definitions as docs/metrics.md), the predicted and measured conduit/stock iteration ratios, the
   targets (iteration within 15%, ratio within 0.10, exposed within 25%) with every miss listed, the
   load average during the runs, and an external check: the published 8xA100 experience shares (26.2% PPO,
   50.2% DQN) next to the ``dgx-a100`` default-preset prediction (not a fitting target). Also
   ``OUT/validation.md`` (tables) and ``OUT/validation.png`` (predicted vs measured, log axes, y = x, +-15%).

``--quick``: a quick calibration (small sizes, few repeats) and 4 real iterations (1 warm-up): a smoke run,
not a validation. ``--clock wall`` predicts from the primitives' wall-clock medians instead of their process
CPU time (what they cost on the machine as loaded during the calibration: a shared machine's load inflates
the real runs, not the CPU-time primitives).

The host's speed is probed (:mod:`conduit.runtime.hostspeed`: a fixed mix of interpreted Python, fresh
numpy arrays and a one-thread convolution, in CPU seconds) before and after the calibration, with any
primitives added later, and before and after the real runs; the report prints the drift between them. The
2-core development VM ran the same EnvRunner microbenchmark 10-18% slower some hours than others, with
nothing else running, and the probe itself read 0.28 to 0.42 s in fresh processes seconds apart on the idle
machine: primitives and runs taken at different host speeds mis-predict by that much. The probe tracks that
drift only in part: its drift is a lower bound. (One drift was ours: APPO learners the calibration had built
left their polling learner threads running in this process and slowed every later microbenchmark by 6-7% each,
fixed in :func:`conduit.runtime.calibrate._stop_learner`; ``benchmarks/sweep_under_load.py`` shows that our
own load on the other core does not move the sweep.) So each workload's largest primitives, its EnvRunner
sweep and the learner update its prediction reads (:func:`update_kinds`; the same ``Learner.update`` timed
198 ms on one day and 206-333 ms over two hours of the next while the probe moved 4-7%), are also re-timed just before each
real run (``--recheck``, the default; :func:`recheck_primitives`, 20-60 s a run; DQN's driver calls too,
:func:`driver_kinds`, since its step is made of them): the report prints their
drift per run and a second prediction, the calibration with that run's re-timed primitives swapped in
(``rechecked`` in validation.json; every other primitive as calibrated). Both predictions are out of sample:
no end-to-end figure feeds either. ``measured.json`` keeps the re-timed entries (``env_runner_recheck``; an
older file's hold the sweep alone), so ``--measured`` regenerates both.

``--add-learner-primitives`` (with ``--calibration FILE``): measure only the primitives an older calibration
lacks (RLlib's own ``Learner.update``, DQN's per-step driver calls, a local learner's update with the driver's
torch threads) and write the merged file to ``OUT/calibration.json``, with the load average at the time.

Known limits of the comparison (reported, not corrected): the study's local-learner workloads
(``ppo-cartpole-2r-local``, ``dqn-cartpole-1r``) train in the driver process, where torch keeps its default
thread count (Ray sets ``OMP_NUM_THREADS=1`` only in its workers): ``learner_update_local`` times that in wall
clock and is used only when measured on a quiet machine. APPO's measured ``iteration_ms`` is the mean time
between the starts of consecutive gradient updates (``instrument.py``: the learner thread's
``after_gradient_based_update`` stamps; ``impala_learner.py: _LearnerThread.step`` trains once per batch it
takes from the ``CircularBuffer``, reuses included), the simulator's ``iteration_time_s`` the mean time
between the starts of consecutive updates of ``appo_loop`` (one per batch, reuses included): the same
definition. On 2026-12-04, with the 2-core machine at a load average
of about 15, the study's APPO workloads sampled no env step in any 5 s iteration (both sides, and a plain
``APPOConfig``); on the quiet machine (load 1-2, results/validation/measured.json) they sampled and trained
with the same config (Ray ``num_cpus=2``: 2 EnvRunners at 0.5 CPU and 1 learner fit), so the load, not the
config, starved them. APPO's driver never sleeps (``algorithm.py: Algorithm._run_one_training_iteration``
calls ``IMPALA.training_step`` in a loop until ``min_time_s_per_iteration``, and its
``fetch_ready_async_reqs`` waits ``timeout_s_sampler_manager = 0.0``): the simulator's crowded-node model
(:meth:`conduit.sim.cores.CoreUse.on_cores`) has its loop want ``StockCosts.driver_poll_cores`` (0.85 of a
core: the real loop's main thread, ``benchmarks/appo_driver_loop.py``) and get it first (wake-up preemption,
:class:`conduit.sim.resources.CpuPool`) while the EnvRunners and the learner share the rest of the node's
cores, on both sides; APPO's update primitive is the learner thread's own
``Learner.update`` call (:func:`conduit.runtime.calibrate.measure_learner`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from conduit.errors import ConduitError
from conduit.runtime import hostspeed, pagereport
from conduit.runtime.proccpu import busy_cores
from conduit.sim.params import PLANE_PRIMITIVES_FILE
from conduit.studies import load_script

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
METRICS = ("iteration_time_s", "exposed_experience_path_s", "experience_share")
#: simulator metric -> (instrument segment, scale to the simulator's unit)
MEASURED_AS = {"iteration_time_s": ("iteration_ms", 1e-3), "exposed_experience_path_s": ("exposed_per_update_ms", 1e-3),
               "experience_share": ("experience_share", 1.0)}
SIM_POLICY = {"stock": "rllib-stock", "conduit": "conduit"}
#: targets (issue 13): |rel_error| of iteration time and exposed latency, |ratio difference|
TARGETS = {"iteration_time_s": 0.15, "exposed_experience_path_s": 0.25, "ratio": 0.10}
#: the published 8xA100 experience shares, an external check only (shared/reference/rllib-2.60-stock-cpu.md)
PUBLISHED_SHARES = {"ppo": 0.262, "dqn": 0.502}
#: simulated learner updates per workload (the first tenth, at least one, is warm-up)
SIM_ITERATIONS = {"ppo": 6, "appo": 120, "dqn": 300}
SIM_SEED = 0
DEFAULT_PRIMITIVES = ROOT / "benchmarks" / "stock_primitives.2core-vm.json"


def experience_path_study() -> Any:
    """``studies/rllib_experience_path.py``, loaded by path (studies are scripts, not a package)."""
    return load_script(HERE / "rllib_experience_path.py")


# ------------------------------------------------------------------------------------------------
# Costs from files
# ------------------------------------------------------------------------------------------------
def stock_costs_from_primitives(path: str | Path = DEFAULT_PRIMITIVES):
    """:class:`~conduit.sim.params.StockCosts` from a ``benchmarks/stock_primitives.py`` JSON file, by the
    field mapping of :data:`~conduit.sim.params.STOCK_SOURCES` (fields it does not map keep their defaults) and,
    where the file has section ``gap``, of :data:`~conduit.sim.params.STOCK_COLD_SOURCES` (the cold-call law,
    :mod:`conduit.sim.raycalls`; without it every call is charged its back-to-back cost, even though the built-in
    costs carry a law: theirs was measured on another day) and, where it has section ``wake``, of
    :data:`~conduit.sim.params.STOCK_WAKE_SOURCES` (the warm-up debt, :mod:`conduit.sim.coldwork`; without it, none)."""
    from conduit.sim.params import STOCK_COLD_SOURCES, STOCK_SOURCES, STOCK_WAKE_SOURCES, StockCosts

    data = json.loads(Path(path).read_text())
    values = {}
    for name, (key, _how) in STOCK_SOURCES.items():
        if key not in data:
            raise SystemExit(f"{path}: no field {key!r} (needed for StockCosts.{name})")
        values[name] = float(data[key])
    # the cold-call law (section gap) and the warm-up debt (section wake), each all or none: a file measured before
    # a section has none of it, whatever the built-in costs carry (its window's work was not timed spaced)
    values.update(_section_values(data, path, STOCK_COLD_SOURCES, "the cold-call law", "gap"))
    values.update(_section_values(data, path, STOCK_WAKE_SOURCES, "the warm-up debt", "wake"))
    values["buffer_sample_per_call"] = float(data["buffer_sample_s"]) - 32 * float(data["buffer_sample_per_item_s"])
    return replace(StockCosts(), **values)


def _section_values(data: Mapping[str, Any], path: str | Path, sources: Mapping[str, tuple[str, str]], what: str,
                    section: str) -> dict[str, float]:
    """The StockCosts fields ``sources`` maps from a stock primitives file's optional ``section``: every one as
    measured, or every one 0 when the file has none of them; a file with some but not all is refused, naming the
    missing fields and the command that measures them."""
    present = [name for name, (key, _how) in sources.items() if key in data]
    if present and len(present) < len(sources):
        missing = sorted(key for name, (key, _how) in sources.items() if name not in present)
        raise SystemExit(f"{path}: {what} needs {', '.join(missing)} too (benchmarks/stock_primitives.py "
                         f"--sections {section})")
    return {name: float(data[key]) if present else 0.0 for name, (key, _how) in sources.items()}


def _primitive(calibration: Mapping[str, Any], kind: str, key: str, clock: str = "cpu") -> dict[str, Any]:
    """A workload primitive of the calibration. ``clock="cpu"`` (the default): as measured, in process CPU
    time; ``"wall"``: refitted from the same sweep's wall-clock medians (what the primitive took on the
    machine as loaded during the calibration)."""
    entry = calibration.get("workload", {}).get(f"{kind}:{key}")
    if not entry or not entry.get("samples"):
        why = (entry or {}).get("note", "absent")
        raise SystemExit(f"calibration: workload primitive {kind}:{key} is not measured ({why}); rerun the "
                         f"calibration (studies/validation.py without --calibration)")
    if clock == "wall":
        from conduit.runtime.calibrate import refit

        wall = entry.get("extra", {}).get("wall_medians")
        if not wall:
            raise SystemExit(f"calibration: {kind}:{key} has no wall-clock medians (--clock wall)")
        entry = dict(entry)
        if kind == "weights":  # one call per sweep point; its two ends scaled with it
            scale = float(wall[0]) / float(entry["latency"])
            entry["extra"] = {**entry.get("extra", {}), **{k: float(v) * scale for k, v in entry.get("extra", {}).items()
                                                         if k in ("get_s", "set_s")}}
            entry["latency"] = entry["per_item"] = float(wall[0])
        else:
            lat, rate, _ = refit(entry["sizes"], wall, entry.get("extra"))
            entry["latency"], entry["per_item"] = lat, 1.0 / rate
            entry["clock"] = "wall"  # the medians a reader of the sweep itself takes (stream_value_pass)
            if entry.get("unit") == "calls":  # n calls per sweep point: the slope is the per-call time
                entry["latency"] = entry["per_item"]
    return entry


# ------------------------------------------------------------------------------------------------
# RLlib config -> simulator workload
# ------------------------------------------------------------------------------------------------
def primitive_key(algo: str, env: str) -> str:
    """The calibration entry of a workload's primitives: one per algorithm and env."""
    return f"{algo}-{env}"


def sim_workload(name: str, algo: str, cfg: Any, prims: Mapping[str, Mapping[str, Any]], stock: Any) -> Any:
    """The simulator's :class:`~conduit.sim.workload.Workload` for an RLlib 2.60 ``AlgorithmConfig``.

    ``prims`` holds the calibration's ``env_runner``, ``learner_update``, ``value_pass`` (PPO) and
    ``weights`` entries for this config's algorithm and env (``WorkloadMeasurement.to_dict()``:
    ``per_item``, ``latency``, ``extra``); ``stock`` the :class:`StockCosts` (for the weight sync's RPCs).
    Every field is read off the config or a primitive, never off a run:

    - runners, envs per runner, learners (``num_learners=0``: one local learner), fragment
      (``get_rollout_fragment_length``: PPO's ``"auto"`` is batch / (runners x envs), DQN's is ``n_step``);
    - a vector step = ``envs`` x the EnvRunner's measured seconds per env step (env, exploration forward
      pass, connectors: inference is inside it, so ``inference_time`` is 0), plus its per-``sample()``
      cost as ``runner_call_overhead``; bytes per step and episode length as the sampled episodes had them;
    - PPO: ``train_batch_size_per_learner``, ``num_epochs``; an update costs per sample per epoch the
      module's measured update time, plus ``epochs x ceil(batch / minibatch)`` times its per-call cost;
      the GAE value pass the ``GeneralAdvantageEstimation`` connector piece as timed in the learner's pipeline
      on fresh episodes (:func:`gae_per_sample`; an older calibration: ``compute_values`` per sample);
    - APPO (``algorithms/appo/appo.py: APPOConfig``): a batch of ``train_batch_size_per_learner`` steps
      (``chunks_per_batch`` = batch / fragment), each batch trained ``circular_buffer_iterations_per_batch``
      times (``max_reuse``), at most ``circular_buffer_num_batches`` batches buffered (``max_lag``),
      ``broadcast_interval``;
    - DQN (``algorithms/dqn/dqn.py: calculate_rr_weights``, ``_training_step_new_api_stack``):
      ``replay_ratio`` = updates per round x ``total_train_batch_size`` / steps per round; ``min_size`` =
      ``num_steps_sampled_before_learning_starts``; ``replay_capacity`` from ``replay_buffer_config``;
    - the update primitive is RLlib's own ``Learner.update`` per minibatch (``learner_update``,
      :func:`conduit.runtime.calibrate.measure_learner`; APPO: the learner thread's call); PPO's is the
      whole call of an iteration where measured (``learner_update_call``: the train batch with the
      config's minibatches, epochs and shuffle, :func:`ppo_update_call`); a local
      learner (``num_learners=0``) the same with the driver's torch threads in wall-clock time
      (``learner_update_local``) when that was measured on a quiet machine (:func:`local_usable`), and
      its extra torch threads' spin and share of the update (``torch_team``, measured with it);
    - the EnvRunner's ``get_metrics()`` (APPO: and ``get_state``) rides in each remote sample call after
      ``sample()`` returns (``runner_metrics`` -> ``Workload.runner_metrics_time``); DQN's buffer,
      metrics-aggregate and learner-connector costs are the workload's own (:func:`workload_stock`);
    - weight sync = measured get/set of the module's state + two RPC round trips (learner -> driver,
      driver -> runners, ``StockCosts.rpc_overhead``) + the state's bytes at ``serialize_bandwidth``;
      DQN's (:meth:`conduit.sim.dqn.DqnLoop.dqn_weight_sync`): the driver's work, the learner's ``get_state``
      and the local EnvRunner's ``set_state`` (the ``weights`` primitive's two ends, ``get_s`` and ``set_s``)
      plus ``ray.put`` of the state (``put_per_call`` + its bytes at ``serialize_bandwidth``); each remote
      EnvRunner's ``set_state`` is ``weight_set_time`` (``set_s``), on its own thread.
    """
    from conduit.sim.workload import Workload

    runner, update, weights = prims["env_runner"], local_learner_update(prims), prims["weights"]
    envs = int(cfg.num_envs_per_env_runner)
    runners = max(1, int(cfg.num_env_runners))
    learners = int(cfg.num_learners)
    fragment = int(cfg.get_rollout_fragment_length(worker_index=1))
    step_s = float(runner["per_item"])
    episode = float(runner["extra"].get("episode_length") or math.nan)
    if not math.isfinite(episode) or episode <= 0:
        episode = float(fragment)
    batch = int(cfg.train_batch_size_per_learner)
    fields: dict[str, Any] = {
        "name": name, "algorithm": algo, "env_runners": runners, "envs_per_runner": envs,
        "fragment_length": fragment, "env_step_time": envs * step_s, "env_step_cv": 0.0, "inference_time": 0.0,
        "runner_call_overhead": float(runner["latency"]),
        # the rest of the algorithm's remote sampling call, once per sample call, after sample() returns (so
        # after the sample-end stamp, on the experience path): get_metrics(), which
        # synchronous_parallel_sample's _return_metrics=True asks for; APPO's sample_get_state_and_metrics
        # also gets the connector states
        "runner_metrics_time": float(prims["runner_metrics"]["latency"]) if "runner_metrics" in prims else 0.0,
        "bytes_per_step": float(runner["extra"]["bytes_per_step"]), "episode_length": episode,
        "learners": max(1, learners), "local_learner": learners == 0,
        "update_time_per_sample": float(update["per_item"]),
        "weight_sync_time": float(weights["latency"]) + 2 * stock.rpc_overhead
        + float(weights["extra"].get("state_bytes", 0)) / stock.serialize_bandwidth,
    }
    if algo == "ppo":
        minibatch = int(cfg.minibatch_size or batch)
        call = ppo_update_call(prims)
        if call is not None:  # the whole Learner.update of an iteration: per sample per epoch, plus the call's own
            fields.update(update_time_per_sample=float(call["per_item"]), update_overhead=float(call["latency"]))
        else:  # an older calibration: per-minibatch calls only
            fields.update(update_overhead=int(cfg.num_epochs) * math.ceil(batch / minibatch) * float(update["latency"]))
        gae, rest = gae_per_sample(prims, batch), advantage_per_sample(prims, batch, name)
        # the GAE piece as measured, split where the runtime splits it: the forward pass (streamed under
        # enable()) and the rest (StreamedGAE at update start); stock runs both, one after the other
        fields.update(train_batch_per_learner=batch, epochs=int(cfg.num_epochs),
                      value_pass_per_sample=gae - rest, advantage_per_sample=rest)
        # enable()'s ValueStream runs the forward pass on pieces, not on the batch (unset without the sweep)
        fields.update(stream_value_pass_per_sample=stream_value_pass(prims.get("value_pass") or {},
                                                                     stream_piece_rows(fields)))
    elif algo == "appo":
        fields.update(train_batch_per_learner=batch, chunks_per_batch=max(1, math.ceil(batch / (fragment * envs))),
                      max_reuse=int(cfg.circular_buffer_iterations_per_batch),
                      max_lag=int(cfg.circular_buffer_num_batches), broadcast_interval=int(cfg.broadcast_interval),
                      update_overhead=float(update["latency"]))
    elif algo == "dqn":
        from ray.rllib.algorithms.dqn.dqn import calculate_rr_weights

        from conduit.runtime.rllib.plan import replay_sampler

        ends = weights.get("extra", {})
        if "get_s" not in ends or "set_s" not in ends:
            raise SystemExit(f"calibration: weights primitive of {name} has no get_s/set_s (measured before the "
                             f"weight sync's two ends were timed apart); add them with studies/validation.py "
                             f"--calibration FILE --add-learner-primitives --only weights --out DIR")
        fields.update(weight_sync_time=float(ends["get_s"]) + float(ends["set_s"]) + stock.put_per_call
                      + float(weights["extra"].get("state_bytes", 0)) / stock.serialize_bandwidth,
                      weight_set_time=float(ends["set_s"]))
        store, train = calculate_rr_weights(cfg)
        total = int(cfg.total_train_batch_size)
        steps_per_round = store * fragment * envs * runners
        fields.update(batch_size=total, replay_ratio=train * total / steps_per_round,
                      min_size=int(cfg.num_steps_sampled_before_learning_starts),
                      replay_capacity=int(cfg.replay_buffer_config.get("capacity", 50_000)),
                      update_overhead=float(update["latency"]),
                      # the buffer the config asks for, read as enable() reads it (plan.py: replay_sampler)
                      prioritized_replay=replay_sampler(dict(cfg.replay_buffer_config), name) != "uniform")
    else:
        raise ValueError(f"unknown algorithm {algo!r}")
    team = prims.get("torch_team")
    if learners == 0 and team is not None:  # the local learner's extra torch threads (measure_torch_team)
        fields.update(learner_threads=int(team["extra"]["torch_threads"]), learner_spin_s=float(team["latency"]),
                      learner_thread_share=min(1.0, float(team["extra"]["update_share"])))
        if algo == "dqn":  # every round's weight sync sets the local EnvRunner's weights: a region of the team
            if "sync_spin_s" not in team["extra"]:
                raise SystemExit(f"calibration: torch_team primitive of {name} has no sync_spin_s (measured before "
                                 f"the spin after a weight sync was); add it with studies/validation.py "
                                 f"--calibration FILE --add-learner-primitives --only torch_team --out DIR")
            fields.update(sync_spin_s=float(team["extra"]["sync_spin_s"]))
    return Workload(**fields).validate(f"studies/validation.py: {name}")


#: DQN's per-step driver primitives (:func:`conduit.runtime.calibrate.measure_learner`), used when measured
DQN_DRIVER_PRIMITIVES = ("replay_add", "replay_sample", "replay_priorities", "runner_metrics", "driver_metrics",
                         "learner_connector")
#: DQN's driver after each update (``calibrate.measure_learner_results``): the workload's own when the
#: calibration holds it, else the ``--stock-primitives`` file's (RLlib's default DQN config)
DQN_RESULTS_PRIMITIVE = "learner_results"
#: every DQN driver-call primitive a prediction reads where measured (and a re-timing re-times)
DQN_CALL_PRIMITIVES = (*DQN_DRIVER_PRIMITIVES, DQN_RESULTS_PRIMITIVE)


def workload_stock(stock: Any, algo: str, prims: Mapping[str, Mapping[str, Any]]) -> Any:
    """The :class:`~conduit.sim.params.StockCosts` of one workload: ``stock`` with DQN's replay buffer
    (``add``, ``sample`` + ``get_metrics``, ``update_priorities``: the config's own buffer, prioritized by
    default, where ``benchmarks/stock_primitives.py`` times the uniform one) and the driver's
    ``MetricsLogger.aggregate`` of an EnvRunner's metrics taken from the calibration, when measured; and
    the learner connector DQN's Learner runs (its own pieces, ``NumpyToTensor`` included) in place of the
    default pipeline ``benchmarks/stock_primitives.py`` times (per sampled item, and every item is its own
    episode: no separate per-episode term); and the driver's handling of each update's
    results (:data:`DQN_RESULTS_PRIMITIVE`) where the calibration measured it."""
    if algo == "dqn" and DQN_RESULTS_PRIMITIVE in prims:
        res = prims[DQN_RESULTS_PRIMITIVE]
        stock = replace(stock, learner_results_per_call=float(res["latency"]),
                        learner_results_per_result=float(res["per_item"]))
    if algo != "dqn" or not all(k in prims for k in DQN_DRIVER_PRIMITIVES):
        return stock
    add, smp, prio, agg = (prims[k] for k in ("replay_add", "replay_sample", "replay_priorities", "driver_metrics"))
    conn = prims["learner_connector"]
    return replace(stock, connector_per_call=float(conn["latency"]), connector_per_sample=float(conn["per_item"]),
                   connector_per_episode=0.0, connector_per_byte=0.0, buffer_add_per_call=float(add["latency"]), buffer_add_per_step=0.0,
                   buffer_sample_per_call=float(smp["latency"]), buffer_sample_per_item=float(smp["per_item"]),
                   buffer_update_priorities_per_call=float(prio["latency"]),
                   buffer_update_priorities_per_item=float(prio["per_item"]),
                   driver_bookkeeping=float(agg["latency"]))


#: a wall-clock primitive is used only when measured at a load average below this, per core
QUIET_LOAD_PER_CORE = 1.0
#: busy cores (every process, over the second before a re-timing) below which the machine counts as quiet
QUIET_BUSY_CORES = 0.5


def ppo_update_call(prims: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """PPO's whole-call update primitive (``learner_update_call``: the train batch's ``Learner.update`` with
    the config's minibatches and epochs, :func:`conduit.runtime.calibrate._ppo_update_call`), the local
    learner's (``learner_update_call_local``) where :func:`local_usable` admitted it; None when the
    calibration predates it."""
    return prims.get("learner_update_call_local") or prims.get("learner_update_call")


def gae_per_sample(prims: Mapping[str, Any], batch: int) -> float:
    """PPO's GAE connector per sample at the train batch: the ``gae_connector`` primitive (the
    ``GeneralAdvantageEstimation`` piece timed inside the learner's own connector pipeline on fresh
    episodes, :func:`conduit.runtime.calibrate._ppo_learner_iteration`; a local learner's
    ``gae_connector_local`` where :func:`local_usable` admitted it), its per-call part spread over the
    batch (the simulator charges the pass per sample); an older calibration's ``value_pass``
    (``compute_values`` alone on a cached batch) where it was not measured."""
    entry = prims.get("gae_connector_local") or prims.get("gae_connector")
    if entry is None:
        return float(prims["value_pass"]["per_item"])
    return float(entry["per_item"]) + float(entry["latency"]) / max(1, batch)


def advantage_per_sample(prims: Mapping[str, Any], batch: int, name: str) -> float:
    """GAE's work besides the value forward pass, per sample at the train batch (``Workload.advantage_per_sample``:
    what Conduit's ``StreamedGAE`` still runs at update start): the ``gae_streamed`` primitive (the runtime's
    ``StreamedGAE`` on each timed GAE call's input, with its values: :func:`conduit.runtime.calibrate._ppo_learner_iteration`),
    the local learner's twin where :func:`gae_per_sample` reads the local GAE piece and the twin is admitted too
    (else the one-thread figure: numpy over scalars, little of it torch); capped at the whole piece's figure (the
    forward pass, ``value_pass_per_sample``, is the piece less this). A calibration that timed the GAE piece without
    it is refused (the simulator would stream all of GAE, which the runtime does not); one from before the GAE piece
    was timed (``value_pass`` only) has no rest: its pass is the forward pass alone."""
    if prims.get("gae_connector_local") is None and prims.get("gae_connector") is None:
        return 0.0
    local = prims.get("gae_connector_local") is not None and prims.get("gae_streamed_local") is not None
    kind = "gae_streamed_local" if local else "gae_streamed"
    entry = prims.get(kind)
    if entry is None:
        raise SystemExit(f"calibration: PPO workload {name} has no {kind} primitive (measured before GAE's value "
                         f"pass was timed apart); add it with studies/validation.py --calibration FILE "
                         f"--add-learner-primitives --only {kind} --out DIR")
    per_sample = float(entry["per_item"]) + float(entry["latency"]) / max(1, batch)
    return min(max(0.0, per_sample), gae_per_sample(prims, batch))


def stream_piece_rows(fields: Mapping[str, Any]) -> int:
    """Rows of one piece of enable()'s ValueStream for a PPO workload with these fields: the simulator's own split
    for the deployed policy (:func:`conduit.sim.engine.deployed_pieces` of
    :func:`conduit.sim.deployed.deployed_stream_pieces`, the runtime's
    :func:`conduit.deploy_settings.stream_chunk_steps`; the policy's default parameters)."""
    from conduit.registry import create_policy
    from conduit.sim.deployed import deployed_stream_pieces
    from conduit.sim.engine import deployed_pieces
    from conduit.sim.workload import Workload

    probe = Workload(**fields)
    return deployed_pieces(probe, deployed_stream_pieces(probe, create_policy("conduit"))).chunk_steps


def stream_value_pass(entry: Mapping[str, Any], rows: int) -> float | None:
    """PPO's value forward pass per sample on ``rows`` rows, from the ``value_pass`` sweep
    (``compute_values`` on 64, 256 and 1,024 samples; its clock's medians: process CPU, or the wall-clock ones
    under ``--clock wall``): the sweep's medians interpolated piecewise linearly through the origin and its
    points (beyond the largest, along its last segment), over ``rows``. Not the fitted line: the pass is not
    linear in its size on large observations (on ``ppo-largeobs``, 2026-12-07: 0.05, 0.07 and 0.17 ms a sample
    at 64, 256 and 1,024; the whole GAE piece at 2,000 0.49): above glibc's mmap threshold each call faults its
    activations in afresh, and a piece of a few hundred rows stays below it. None where the entry holds no sweep
    (the simulator then prices the pieces as the batch)."""
    medians = (entry.get("extra") or {}).get("wall_medians") if entry.get("clock") == "wall" else entry.get("medians")
    if not medians or not entry.get("sizes"):
        return None
    points = sorted(zip((float(n) for n in entry["sizes"]), (float(t) for t in medians), strict=True))
    xs, ys = [0.0] + [n for n, _ in points], [0.0] + [t for _, t in points]
    i = next((k for k in range(1, len(xs)) if rows <= xs[k]), len(xs) - 1)
    (x0, y0), (x1, y1) = (xs[i - 1], ys[i - 1]), (xs[i], ys[i])
    at = y0 + (y1 - y0) * (rows - x0) / (x1 - x0) if x1 > x0 else y1
    return max(0.0, at) / max(1, rows)


def local_learner_update(prims: Mapping[str, Any]) -> Mapping[str, Any]:
    """The update primitive of a local learner: ``learner_update_local`` (the driver's torch threads,
    wall clock) when present, else the one-thread ``learner_update``."""
    return prims.get("learner_update_local") or prims["learner_update"]


def local_usable(entry: Mapping[str, Any] | None) -> bool:
    """A ``learner_update_local`` entry measured, and on a quiet machine: wall-clock time on a loaded machine
    measures the load. Quiet: the cores other processes kept busy just before it (``extra.busy_cores``, a
    re-timing's :func:`conduit.runtime.proccpu.busy_cores`) below :data:`QUIET_BUSY_CORES`; for an entry
    without it (a calibration's), its 1-min load average below :data:`QUIET_LOAD_PER_CORE` per core."""
    if not entry or not entry.get("samples"):
        return False
    extra = entry.get("extra") or {}
    if extra.get("busy_cores") is not None:
        return float(extra["busy_cores"]) < QUIET_BUSY_CORES
    load = extra.get("load_average") or [math.inf]
    return float(load[0]) < QUIET_LOAD_PER_CORE * (os.cpu_count() or 1)


def study_configs(study: Any, args: argparse.Namespace, names: Sequence[str] | None = None) -> dict[str, Any]:
    """``{workload name: (study Workload, RLlib config)}`` for the study's workloads (default ones, or ``names``)."""
    known = {w.name: w for w in study.WORKLOADS}
    chosen = [known[n] for n in names] if names else [w for w in study.WORKLOADS if w.default]
    return {w.name: (w, w.build(args)) for w in chosen}


def calibration_configs(configs: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """One config per (algorithm, env) to calibrate the primitives on: the first study workload of each."""
    out: dict[str, tuple[str, Any]] = {}
    for w, cfg in configs.values():
        out.setdefault(primitive_key(w.algo, w.env), (w.algo, cfg))
    return out


def calibrate(configs: Mapping[str, Any], quick: bool, log=print) -> dict[str, Any]:
    """Measure this machine and the workload primitives; the calibration JSON as a dict."""
    from conduit.runtime import calibrate as cal

    before = hostspeed.probe()
    ms = cal.measure_machine(quick=quick, ray=True, disk=False, progress=log,
                             workloads=calibration_configs(configs))
    out = json.loads(cal.to_json(ms))
    out.setdefault("host", {})["speed_probe"] = {"before": before, "after": hostspeed.probe()}
    return out


#: primitives measured with a local learner's torch threads (:func:`conduit.runtime.calibrate.measure_local_learner`)
LOCAL_PRIMITIVES = ("learner_update_local", "learner_update_call_local", "gae_connector_local", "gae_streamed_local",
                    "batch_connector_local", "torch_team")
#: kinds only PPO's learner has (``--only`` with nothing else measures no other algorithm)
PPO_PRIMITIVES = {"learner_update_call", "gae_connector", "gae_streamed", "batch_connector", "learner_update_call_local",
                  "gae_connector_local", "gae_streamed_local", "batch_connector_local"}
#: every kind --add-learner-primitives measures (``--only`` picks among them; ``env_runner`` only when asked)
LEARNER_PRIMITIVES = ("learner_update", "learner_update_call", "gae_connector", "gae_streamed", "batch_connector",
                      *DQN_CALL_PRIMITIVES,
                      *LOCAL_PRIMITIVES, "env_runner", "weights")


def add_learner_primitives(calibration: dict[str, Any], configs: Mapping[str, Any], quick: bool,
                           log=print, repeat: int = 1, only: Sequence[str] = ()) -> dict[str, Any]:
    """``calibration`` with RLlib's own ``Learner.update`` and DQN's per-step driver calls measured now
    (:func:`conduit.runtime.calibrate.measure_learner`, one torch thread, process CPU time), for a
    calibration taken before those primitives existed: the proxy ``learner_update`` is kept as
    ``learner_update_proxy``; the load average at the time is recorded with them. ``repeat`` > 1 measures
    each primitive that many times and fits the per-size medians of the runs (a shared machine's noise).
    ``only``: keep just the primitives of these kinds (the rest of ``calibration`` stays as it was), and
    measure only what they need."""
    from conduit.runtime import calibrate as cal

    out = dict(calibration)
    workload = dict(out.get("workload", {}))
    load = os.getloadavg()
    speed = hostspeed.probe()
    runs: dict[str, list] = {}
    one_thread = not only or any(k not in LOCAL_PRIMITIVES for k in only)
    # what a runner alone measures needs no learner: its calls, its sampling (only when asked for); the
    # module's weight sync (``weights``) needs only the RLModule
    runner_only = bool(only) and set(only) <= {"runner_metrics", "env_runner", "weights"}
    dqn_only = set(DQN_CALL_PRIMITIVES) - {"runner_metrics"}
    chosen = {key: (algo, cfg) for key, (algo, cfg) in calibration_configs(configs).items()
              if (algo == "ppo" or not (only and set(only) <= PPO_PRIMITIVES))
              and (algo == "dqn" or not (only and set(only) <= dqn_only))}
    with cal.attached_ray(log):  # timed as the calibration's workload primitives are: attached to a running Ray
        for _ in range(max(1, repeat)):
            with cal._torch_threads(1):
                for key, (algo, cfg) in chosen.items() if one_thread else ():
                    ms = []
                    if "env_runner" in only:
                        ms.append(cal.measure_env_runner(key, cfg, quick))
                    if "weights" in only:
                        ms += [m for m in cal.measure_module(key, algo, cfg, quick) if m.name.startswith("weights:")]
                    if not runner_only:
                        ms += cal.measure_learner(key, algo, cfg, quick)
                    if runner_only and "runner_metrics" in only:
                        ms += cal.measure_runner_call(key, algo, cfg, quick)
                    for m in ms:
                        runs.setdefault(m.name, []).append(m)
            local = not only or any(k in LOCAL_PRIMITIVES for k in only)
            for key, (algo, cfg) in chosen.items() if local and not runner_only else ():
                if int(cfg.num_learners or 0) == 0:  # a local learner: the driver's torch threads, wall clock
                    for m in cal.measure_local_learner(key, algo, cfg, quick):
                        runs.setdefault(m.name, []).append(m)
    for name, ms in runs.items():
        if only and name.split(":", 1)[0] not in only:
            continue
        m = _median_of_runs(ms)
        proxy = name.replace(":", "_proxy:", 1)
        if name.startswith("learner_update:") and name in workload and proxy not in workload:
            workload[proxy] = workload[name]
        entry = m.to_dict()
        entry["extra"]["load_average"] = [round(x, 2) for x in load]
        entry["extra"]["speed_probe"] = speed
        entry["extra"]["runs"] = len(ms)
        entry["extra"]["ray_attached"] = True
        workload[name] = entry
        log(f"calibrate: {m.summary()}")
    out["workload"] = workload
    out.setdefault("notes", []).append(
        f"{'/'.join(only) if only else 'learner/replay/metrics'} primitives added by studies/validation.py "
        f"--add-learner-primitives{' --only ' + ','.join(only) if only else ''} at "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load average {load[0]:.2f}/{load[1]:.2f}/"
        f"{load[2]:.2f} on {os.cpu_count()} cores")
    return out


def _median_of_runs(ms: Sequence[Any]) -> Any:
    """One measurement from repeated runs of the same sweep: the per-size medians of the runs' medians,
    refitted (``calls``: the slope is the per-call time)."""
    from conduit.runtime.calibrate import refit

    if len(ms) == 1:
        return ms[0]
    first = ms[0]
    if first.unit == "regions":  # torch_team: medians of the spin and of the shares
        spin = statistics.median(m.latency for m in ms)
        extra = {**first.extra, **{k: statistics.median(m.extra[k] for m in ms)
                                   for k in ("update_share", "short_gap_share") if all(k in m.extra for m in ms)}}
        return replace(first, latency=spin, bandwidth=1.0 / spin, medians=[spin], samples=sum(m.samples for m in ms),
                       extra=extra, note=first.note + f"; medians of {len(ms)} runs")
    medians = [statistics.median(m.medians[i] for m in ms) for i in range(len(first.medians))]
    walls = [statistics.median(m.extra["wall_medians"][i] for m in ms) for i in range(len(first.medians))] \
        if all("wall_medians" in m.extra for m in ms) else None
    lat, rate, _ = refit(first.sizes, medians, first.extra)
    ends = {k: statistics.median(m.extra[k] for m in ms) for k in ("get_s", "set_s") if all(k in m.extra for m in ms)}
    m = replace(first, latency=lat, bandwidth=rate, medians=medians, samples=sum(x.samples for x in ms),
                extra={**first.extra, **({"wall_medians": walls} if walls else {}), **ends})
    if m.unit == "calls":
        m.latency = 1.0 / m.bandwidth
    m.note += f"; per-size medians of {len(ms)} runs"
    return m


def with_contention(calibration: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """``calibration`` with its host's ``contention`` block (the topology's ``oversubscribed_cpu_cost``,
    :mod:`conduit.runtime.contention`) replaced by the one in ``path`` (``benchmarks/contention_cpu.py
    --json``); exits naming the file when it holds no cost."""
    try:
        block = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--contention: cannot read {path}: {exc}") from None
    cost = block.get("oversubscribed_cpu_cost") if isinstance(block, dict) else None
    if isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost) or cost < 1:
        raise SystemExit(f"--contention: {path}: 'oversubscribed_cpu_cost' must be a number >= 1, got {cost!r}")
    out = dict(calibration)
    out["host"] = {**dict(calibration.get("host") or {}), "contention": block}
    return out


def topology_from_calibration(calibration: Mapping[str, Any], name: str = "calibrated-validation"):
    """The explicit-form topology that ``conduit calibrate`` writes, rebuilt from the calibration JSON."""
    from conduit.runtime.calibrate import Measurement, Measurements, topology_yaml
    from conduit.topology import topology_from_dict
    from conduit.topology.yamlio import parse_yaml

    ms = Measurements(host=dict(calibration["host"]))
    for key, d in calibration["measurements"].items():
        ms[key] = Measurement(d["name"], math.nan if d["bandwidth"] is None else d["bandwidth"],
                              math.nan if d["latency"] is None else d["latency"], d["samples"], d.get("note", ""),
                              list(d.get("sizes", [])), [math.nan if t is None else t for t in d.get("medians", [])])
    text = topology_yaml(ms, name=name)
    return topology_from_dict(parse_yaml(text, name), source=name), text


def build_workloads(configs: Mapping[str, Any], calibration: Mapping[str, Any], stock: Any,
                    clock: str = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
    """``({name: simulator Workload}, {name: its StockCosts})`` for the study's ``configs`` from a
    calibration's primitives (:func:`sim_workload`, :func:`workload_stock`)."""
    workloads, stocks = {}, {}
    for name, (w, cfg) in configs.items():
        prims = workload_primitives(calibration, w, cfg, clock)
        stocks[name] = workload_stock(stock, w.algo, prims)
        workloads[name] = sim_workload(name, w.algo, cfg, prims, stocks[name])
    return workloads, stocks


def workload_primitives(calibration: Mapping[str, Any], w: Any, cfg: Any, clock: str = "cpu") -> dict[str, Any]:
    """``{kind: entry}``: the calibration's primitives a study workload's prediction reads (its algorithm and
    env's key): the EnvRunner sweep, the update, the weights (PPO: the value pass), the driver's per-call
    primitives measured, PPO's whole call and GAE piece where measured, and a local learner's ``_local`` twins
    where :func:`local_usable` admits them (:func:`sim_workload` prefers them)."""
    key = primitive_key(w.algo, w.env)
    measured = calibration.get("workload", {})
    kinds = ("env_runner", "learner_update", "weights") + (("value_pass",) if w.algo == "ppo" else ())
    prims = {kind: _primitive(calibration, kind, key, clock) for kind in kinds}
    extra = DQN_CALL_PRIMITIVES if w.algo == "dqn" else ("runner_metrics",)
    prims.update({kind: _primitive(calibration, kind, key, clock) for kind in extra
                  if measured.get(f"{kind}:{key}", {}).get("samples")})
    for kind in ("learner_update_call", "gae_connector", "gae_streamed") if w.algo == "ppo" else ():
        if measured.get(f"{kind}:{key}", {}).get("samples"):
            prims[kind] = _primitive(calibration, kind, key, clock)
    for kind in LOCAL_PRIMITIVES:
        local = measured.get(f"{kind}:{key}")
        if int(cfg.num_learners or 0) == 0 and local_usable(local):
            prims[kind] = local
    return prims


# ------------------------------------------------------------------------------------------------
# Predict
# ------------------------------------------------------------------------------------------------
def predict(workloads: Mapping[str, Any], topology: Any, stock: Any, sides: Sequence[str],
            stocks: Mapping[str, Any] | None = None, plane: Any = None) -> dict[tuple[str, str], dict]:
    """``{(workload, side): {metric: value}}`` from one seeded simulation per workload and side
    (``stocks``: a workload's own :class:`StockCosts`, else ``stock``; ``plane``: the
    :class:`~conduit.sim.params.PlaneCosts` of ``--plane-primitives``, None for the built-in ones)."""
    from conduit.sim.run import simulate

    out = {}
    for name, wl in workloads.items():
        for side in sides:
            result = simulate(topology, wl, SIM_POLICY[side], iterations=SIM_ITERATIONS[wl.algorithm], seed=SIM_SEED,
                              stock_costs=(stocks or {}).get(name, stock), plane_costs=plane)
            m = result.metrics
            out[(name, side)] = {k: float(m[k]) for k in METRICS}
            out[(name, side)]["violations"] = int(result.audit.violations) if hasattr(result.audit, "violations") \
                else len(getattr(result.audit, "items", []) or [])
            out[(name, side)]["warnings"] = list(result.warnings)
            out[(name, side)]["segments"] = dict(result.segments)
    return out


def external_check(stock: Any) -> list[dict[str, Any]]:
    """The ``dgx-a100`` default presets' stock experience share next to the published 8xA100 figure."""
    from conduit.sim.run import simulate

    rows = []
    for algo, published in PUBLISHED_SHARES.items():
        result = simulate("dgx-a100", algo, "rllib-stock", iterations=SIM_ITERATIONS[algo] if algo != "ppo" else 6,
                          seed=SIM_SEED, stock_costs=stock)
        share = float(result.metrics["experience_share"])
        rows.append({"topology": "dgx-a100", "workload": algo, "policy": "rllib-stock", "predicted_share": share,
                     "published_share": published, "rel_error": share / published - 1.0,
                     "within_30pct": abs(share / published - 1.0) <= 0.30})
    return rows


# ------------------------------------------------------------------------------------------------
# Measure
# ------------------------------------------------------------------------------------------------
def measure(study: Any, names: Sequence[str], sides: Sequence[str], iters: int, warmup: int,
            log=print, recheck=None, runs: int = 1) -> tuple[dict[tuple[str, str], dict], list[dict[str, Any]]]:
    """Run each (workload, side) for real with the study's runner (own interpreter each), ``runs`` times,
    interleaved (every workload and side once, then again: a drift of the host over the session falls on
    every row alike); each (workload, side)'s medians over its runs (:func:`median_of_run_medians`), and the
    primitives ``recheck(name)`` re-timed just before each run (``[{workload, side, run, entries}]``,
    ``entries`` a ``{kind: calibration entry}`` mapping; none when ``recheck`` is None; ``{workload, side, run,
    error}`` for one that failed)."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    args = study.parse_args(["--iters", str(iters), "--warmup", str(warmup)])
    known = {w.name: w for w in study.WORKLOADS}
    per_run: dict[tuple[str, str], list[dict]] = {}
    rechecks: list[dict[str, Any]] = []
    for run in range(runs):
        for name in names:
            for side in sides:
                tag = f"{name} [{side}]" + (f" run {run + 1}/{runs}" if runs > 1 else "")
                if recheck is not None:
                    try:
                        entries = recheck(name)
                    except Exception as exc:  # noqa: BLE001 -- the run still counts; the report lists the failed re-timing
                        rechecks.append({"workload": name, "side": side, "run": run,
                                         "error": f"{type(exc).__name__}: {exc}"})
                        log(f"  {tag}: re-timing the primitives failed: {type(exc).__name__}: {exc}")
                    else:
                        rechecks.append({"workload": name, "side": side, "run": run, "entries": entries})
                        log(f"  {tag}: re-timed " + ", ".join(f"{kind} {_cost(kind, e) * 1e3:.3f} ms {_cost_unit(kind, e)}"
                                                             for kind, e in entries.items()))
                t0 = time.time()
                with pagereport.Watch() as memory:
                    got = study.run_isolated(known[name], side, args)
                reported = (memory.result or {}).get("mb_per_s")
                log(f"  {tag}: {len(got)} iterations in {time.time() - t0:.0f} s, load average "
                    f"{os.getloadavg()[0]:.2f}" + ("" if reported is None else
                                                   f", the VM reported {reported:.1f} MB/s of freed memory"))
                for m in study.medians(got):
                    # the whole run's (start-up included); NaN where the kernel does not say (pagereport)
                    m["reported_mb_per_s"] = math.nan if reported is None else float(reported)
                    per_run.setdefault((m["workload"], m["side"]), []).append(m)
    return {key: median_of_run_medians(ms) for key, ms in per_run.items()}, rechecks


def median_of_run_medians(ms: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One (workload, side)'s measurement from its runs' medians: each numeric field the median over the
    runs (the median of medians: one slow run moves it no more than one slow iteration moves a run's own),
    ``iterations`` their sum, ``runs`` their number and ``iteration_ms_runs`` each run's own iteration time.
    One run is returned as it was, with ``runs`` and ``iteration_ms_runs`` added."""
    first = ms[0]
    out: dict[str, Any] = dict(first)
    if len(ms) > 1:
        for key, value in first.items():
            if isinstance(value, float):
                vals = [m[key] for m in ms if isinstance(m.get(key), float) and math.isfinite(m[key])]
                out[key] = statistics.median(vals) if vals else float("nan")
        out["iterations"] = sum(int(m.get("iterations", 0)) for m in ms)
    out["runs"] = len(ms)
    out["iteration_ms_runs"] = [float(m.get("iteration_ms", math.nan)) for m in ms]
    return out


def recheck_env_runner(configs: Mapping[str, Any], name: str, quick: bool) -> dict[str, Any]:
    """Workload ``name``'s EnvRunner sweep (:func:`conduit.runtime.calibrate.measure_env_runner`) re-timed
    now, as the calibration timed it: the config the calibration used for its primitive key
    (:func:`calibration_configs`), one torch thread, process CPU time, and ``quick`` as the calibration was
    (the same step counts: the per-step rate is the slope over the two largest). The calibration entry's shape, with
    the host probe and the load average at the time in ``extra``.

    Why: the 2-core VM's speed drifts by more than the error targets over hours (the same sweep, each time
    in a fresh process, read 1.60 to 1.82 ms per step on different hours, nothing else running), and the
    host probe follows that drift only in part. The sweep is every workload's largest primitive; re-timed just before a run it is still a
    microbenchmark (no end-to-end figure enters), so the rechecked prediction (:func:`rechecked_predictions`)
    is as out of sample as the calibration's and differs from it only by the host's drift in the sweep."""
    from conduit.runtime import calibrate as cal

    key = _recheck_key(configs, name)
    _, cfg = calibration_configs(configs)[key]
    load = os.getloadavg()
    with cal.attached_ray():  # as the calibration timed it: attached to a running Ray
        with cal._torch_threads(1):
            m = cal.measure_env_runner(key, cfg, quick)
        return _stamped(m.to_dict(), load)  # stamped while that Ray is still up: ray_attached says so


def _stamped(entry: dict[str, Any], load: Sequence[float]) -> dict[str, Any]:
    """A re-timed entry with the host probe now, the load average before it and whether it was timed
    attached to a running Ray (:func:`conduit.runtime.calibrate.attached_ray`) in ``extra``."""
    import ray

    entry["extra"]["ray_attached"] = bool(ray.is_initialized())
    entry["extra"]["speed_probe"] = hostspeed.probe()
    entry["extra"]["load_average"] = [round(x, 2) for x in load]
    return entry


#: the update primitives a re-timing may cover (each the one-thread kind; a local learner's ``_local`` twin)
UPDATE_KINDS = ("learner_update", "learner_update_call", "gae_connector", "gae_streamed")


def update_kinds(calibration: Mapping[str, Any], configs: Mapping[str, Any], name: str) -> list[str]:
    """The learner primitives workload ``name``'s prediction reads (:func:`workload_primitives`,
    :func:`sim_workload`): ``learner_update`` (APPO: the learner thread's call; DQN: one update), PPO's whole
    call and its GAE piece (``learner_update_call``, ``gae_connector``) where the calibration has them, each
    replaced by its ``_local`` twin where the workload's learner is local and :func:`local_usable` admits the
    calibration's (the driver's torch threads, wall clock)."""
    prims = workload_primitives(calibration, *configs[name])
    return [f"{kind}_local" if f"{kind}_local" in prims else kind for kind in UPDATE_KINDS if kind in prims]


def driver_kinds(calibration: Mapping[str, Any], configs: Mapping[str, Any], name: str) -> list[str]:
    """DQN's driver-call primitives workload ``name``'s prediction reads (:func:`workload_stock`,
    :func:`sim_workload`: the replay buffer's calls, the metrics, the learner connector, the learners' results),
    those the calibration measured; none for other algorithms."""
    w, _ = configs[name]
    if w.algo != "dqn":
        return []
    prims = workload_primitives(calibration, *configs[name])
    return [k for k in DQN_CALL_PRIMITIVES if k in prims]


def recheck_primitives(configs: Mapping[str, Any], calibration: Mapping[str, Any], name: str,
                       quick: bool) -> dict[str, dict[str, Any]]:
    """``{kind: entry}``: workload ``name``'s EnvRunner sweep (:func:`recheck_env_runner`) and the learner
    update primitives its prediction reads (:func:`update_kinds`) re-timed now, as the calibration timed them
    (:func:`conduit.runtime.calibrate.measure_learner` with ``update_only``: the same sweeps, one torch
    thread and process CPU time; a local learner's, :func:`conduit.runtime.calibrate.measure_local_learner`:
    the driver's torch threads, wall clock, with the cores the machine kept busy in the second before it,
    ``extra.busy_cores``, for :func:`local_usable`). DQN: also its driver-call primitives
    (:func:`driver_kinds`), with the calibration's full DQN measurement (one torch thread, process CPU time):
    a step of DQN is made of them as much as of the update. Each entry carries the host probe and the load
    average.

    Why the update too: on the 2-core VM the same ``Learner.update`` of 500 APPO large-observation samples
    timed 198 ms in the 2026-12-05 calibration and, on 2026-12-06, 283-306 ms, then 206-219 ms, then 324-333 ms
    within two hours, while the host probe moved 4-7% and the EnvRunner sweep 5-15%: the update is the
    learner-bound workloads' largest primitive, and its drift is not the sweep's. (Re-timed, it did not close
    APPO large-obs' gap: ``results/validation/NOTES.md``.)"""
    from conduit.runtime import calibrate as cal

    with cal.attached_ray():  # one Ray for every re-timing of this workload
        return _recheck_attached(configs, calibration, name, quick)


def _recheck_attached(configs: Mapping[str, Any], calibration: Mapping[str, Any], name: str,
                      quick: bool) -> dict[str, dict[str, Any]]:
    """:func:`recheck_primitives` with Ray up."""
    from conduit.runtime import calibrate as cal

    out = {"env_runner": recheck_env_runner(configs, name, quick)}
    kinds = update_kinds(calibration, configs, name)
    calls = driver_kinds(calibration, configs, name)
    key = _recheck_key(configs, name)
    algo, cfg = calibration_configs(configs)[key]
    load = os.getloadavg()
    busy = None
    local = any(k.endswith("_local") for k in kinds)
    ms = []
    if local:
        busy = busy_cores(1.0)  # the quiet-machine test of a wall-clock twin (local_usable)
        ms += cal.measure_local_learner(key, algo, cfg, quick, update_only=True)
    if calls or not local:
        with cal._torch_threads(1):
            ms += cal.measure_learner(key, algo, cfg, quick, update_only=not calls)
    got = {m.name.split(":", 1)[0]: m for m in ms}
    kinds += calls
    if missing := [k for k in kinds if k not in got]:
        raise ConduitError(f"{name}: re-timing measured no {', '.join(missing)}")
    for k in kinds:
        out[k] = _stamped(got[k].to_dict(), load)
        if k.endswith("_local"):
            out[k]["extra"]["busy_cores"] = busy
    return out


def _recheck_key(configs: Mapping[str, Any], name: str) -> str:
    w, _ = configs[name]
    return primitive_key(w.algo, w.env)


def recheck_entries(r: Mapping[str, Any]) -> dict[str, Any]:
    """A re-timing record's ``{kind: entry}`` (a file written before the update was re-timed holds one
    EnvRunner ``entry``); empty for a failed one."""
    if "entries" in r:
        return dict(r["entries"])
    return {"env_runner": r["entry"]} if "entry" in r else {}


def _cost(kind: str, entry: Mapping[str, Any]) -> float:
    """What the drift compares: per env step for the EnvRunner sweep (its slope, what a step costs), else the
    fitted time at the sweep's largest size (an update of the largest batch timed; a sweep's latency is part
    of what an update costs; PPO's whole call is fitted per sample per epoch, ``extra.epochs_timed``)."""
    sizes = entry.get("sizes") or []
    if kind == "env_runner" or not sizes:
        return float(entry["per_item"])
    epochs = float((entry.get("extra") or {}).get("epochs_timed", 1))
    return float(entry.get("latency", 0.0)) + float(entry["per_item"]) * float(max(sizes)) * epochs


def _cost_unit(kind: str, entry: Mapping[str, Any]) -> str:
    sizes = entry.get("sizes") or []
    return "per env step" if kind == "env_runner" or not sizes else f"at {max(sizes)} {entry.get('unit', 'items')}"


def primitive_drift(calibration: Mapping[str, Any], configs: Mapping[str, Any],
                    rechecks: Sequence[Mapping[str, Any]], clock: str = "cpu") -> list[dict[str, Any]]:
    """Per re-timed run (or per workload, for :func:`median_rechecks`' pooled entries: side ``all``) and
    primitive: the calibration's and the re-timed cost (:func:`_cost`, ``clock`` as the
    prediction reads them) and the drift ``rechecked / calibrated - 1`` (positive: the host ran it slower just
    before the run than in the calibration). Runs of workloads not in ``configs`` and primitives the calibration
    lacks are skipped."""
    rows = []
    for r in rechecks:
        if r["workload"] not in configs:
            continue
        key = _recheck_key(configs, r["workload"])
        for kind, entry in recheck_entries(r).items():
            if f"{kind}:{key}" not in calibration.get("workload", {}):
                continue
            before = _primitive(calibration, kind, key, clock)
            now = _primitive({"workload": {f"{kind}:{key}": entry}}, kind, key, clock)
            calibrated, rechecked = _cost(kind, before), _cost(kind, now)
            rows.append({"workload": r["workload"], "side": r.get("side", "all"), "primitive": f"{kind}:{key}",
                         "kind": kind,
                         "unit": _cost_unit(kind, now), "calibrated": calibrated, "rechecked": rechecked,
                         "drift": rechecked / calibrated - 1.0 if calibrated > 0 else None})
    return rows


def failed_rechecks(rechecks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The re-timings that failed (``{workload, side, error}``): those runs are predicted from the
    calibration only."""
    return [{k: r[k] for k in ("workload", "side", "error")} for r in rechecks if "error" in r]


def rechecked_predictions(configs: Mapping[str, Any], calibration: Mapping[str, Any],
                          rechecks: Sequence[Mapping[str, Any]], topology: Any, stock: Any,
                          clock: str = "cpu", plane: Any = None) -> dict[tuple[str, str], dict]:
    """:func:`predict` for each re-timed workload, every side it was re-timed for, from the calibration with
    the re-timed primitives in place of the calibration's (each primitive's median over the workload's
    re-timings, both sides and every run pooled: :func:`median_rechecks`); every other primitive as
    calibrated. Both sides read the same primitives, so the predicted conduit/stock ratio moves with the
    host's drift, not with the noise between two microbenchmarks taken a minute apart."""
    out = {}
    for r in median_rechecks(rechecks):
        name = r["workload"]
        if name not in configs:
            continue
        key = _recheck_key(configs, name)
        swapped = {**calibration, "workload": {**calibration.get("workload", {}),
                                               **{f"{kind}:{key}": e for kind, e in r["entries"].items()}}}
        workloads, stocks = build_workloads({name: configs[name]}, swapped, stock, clock)
        out.update(predict(workloads, topology, stock, r["sides"], stocks, plane))
    return out


def median_rechecks(rechecks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per workload, ``{workload, sides, entries}``: for each re-timed primitive the successful re-timing
    whose cost (:func:`_cost`) is the median of the workload's (its sides' and runs' pooled; the lower of
    the two middle ones for an even count): a measured entry, not an average of entries. ``sides``: the
    sides with a successful re-timing, in their first order."""
    groups: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    sides: dict[str, list[str]] = {}
    for r in rechecks:
        entries = recheck_entries(r)
        if entries and r["side"] not in sides.setdefault(r["workload"], []):
            sides[r["workload"]].append(r["side"])
        for kind, entry in entries.items():
            groups.setdefault(r["workload"], {}).setdefault(kind, []).append(entry)
    out = []
    for name, kinds in groups.items():
        entries = {}
        for kind, es in kinds.items():
            ranked = sorted(es, key=lambda e, kind=kind: _cost(kind, e))
            entries[kind] = ranked[(len(ranked) - 1) // 2]
        out.append({"workload": name, "sides": sides[name], "entries": entries})
    return out


def runs_section(medians: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown lines: each (workload, side)'s iteration time in each of its runs and their spread (max / min),
    when some row was run more than once."""
    many = [m for m in medians if int(m.get("runs", 1)) > 1]
    if not many:
        return []
    lines = ["", "## Real runs, each repeated", "",
             ("Each (workload, side) ran several times, interleaved; the measured figures above are the medians "
              "of the runs' medians."), "", "| workload | side | iteration ms per run | max / min |",
             "|---|---|---|---:|"]
    for m in many:
        its = [x for x in m["iteration_ms_runs"] if math.isfinite(x)]
        spread = max(its) / min(its) if its and min(its) > 0 else math.nan
        lines.append(f"| {m['workload']} | {m['side']} | {', '.join(f'{x:.4g}' for x in m['iteration_ms_runs'])} | "
                     f"{_f(spread, '.2f')} |")
    return lines


def host_speed(calibration: Mapping[str, Any], measured_probe: Mapping[str, Any] | None) -> dict[str, Any]:
    """How fast the host ran :func:`conduit.runtime.hostspeed.probe` when the primitives were measured and
    when the real runs were, and the drift between them (positive: the runs saw a slower host). The
    calibration's own probe (before and after it) and any probe recorded with primitives added later
    (``extra.speed_probe``) are listed; the drift is taken from their median against the runs' median. A
    drift beyond :data:`conduit.runtime.hostspeed.DRIFT_WARNING` is flagged: the prediction errors then
    include it (a primitive measured on a host 18% faster predicts a run 18% short)."""
    cal_probes = [p for p in ((calibration.get("host") or {}).get("speed_probe") or {}).values() if p]
    cal_probes += [e["extra"]["speed_probe"] for e in (calibration.get("workload") or {}).values()
                   if (e.get("extra") or {}).get("speed_probe")]
    # one probe per moment: every primitive added in one go carries the same probe, and must not outvote the rest
    cal_probes = list({tuple(sorted(p.items())): p for p in cal_probes}.values())
    run_probes = [p for p in (measured_probe or {}).values() if p]
    out: dict[str, Any] = {"calibration_s": [round(p["total_s"], 4) for p in cal_probes],
                           "runs_s": [round(p["total_s"], 4) for p in run_probes], "drift": None, "warning": False}
    if cal_probes and run_probes:
        def median_probe(ps):
            return {k: statistics.median(p[k] for p in ps) for k in ("python_s", "numpy_s", "torch_s")
                    if all(k in p for p in ps)}

        out["drift"] = hostspeed.drift(median_probe(cal_probes), median_probe(run_probes))
        out["warning"] = abs(out["drift"]) > hostspeed.DRIFT_WARNING
    return out


def gae_piece_memory(configs: Mapping[str, Any], calibration: Mapping[str, Any], rechecks: Sequence[Mapping[str, Any]],
                     medians: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per stock PPO workload, RLlib's GAE piece at the train batch as the calibration timed it, as it was re-timed
    before the runs and as the real runs measured it (the instrument's ``gae_ms``), next to the memory the VM
    handed back to its host (:mod:`conduit.runtime.pagereport`): reported in the round before each timed call, and
    per second over the real runs. A call that follows reported memory can cost twice as much on the same page
    faults (the module's docstring); this says whether the calibration and the runs met the same condition.
    Figures the files do not hold (a calibration from before ``extra.memory``, a kernel without the counter)
    are None."""
    def calls(entry: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
        return list((((entry or {}).get("extra") or {}).get("memory") or {}).get("calls") or [])

    med = pagereport.median_known
    def side(timed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        reported = [c.get("reported_mb_before") for c in timed]
        known = [r for r in reported if r is not None]
        return {"calls": len(timed), "wall_s": med([c.get("wall_s") for c in timed]),
                "system_s": med([c.get("system_s") for c in timed]), "faults": med([c.get("faults") for c in timed]),
                "reported_mb_before": med(reported),
                "calls_after_reporting": sum(1 for r in known if r > 0) if known else None}

    out = []
    cal_entries = calibration.get("workload") or {}
    for m in medians:
        name = m.get("workload")
        if m.get("side") != "stock" or name not in configs or configs[name][0].algo != "ppo":
            continue
        key = _recheck_key(configs, name)
        # a local learner (num_learners=0) runs the piece in the driver, as the _local twin was timed
        kind = "gae_connector_local" if getattr(configs[name][1], "num_learners", 1) == 0 else "gae_connector"
        rechecked = [c for r in rechecks if r.get("workload") == name for c in calls(recheck_entries(r).get(kind))]
        out.append({"workload": name, "primitive": kind, "calibration": side(calls(cal_entries.get(f"{kind}:{key}"))),
                    "rechecked": side(rechecked), "runs_gae_s": med([m.get("gae_ms", math.nan) / 1e3]),
                    "runs_reported_mb_per_s": med([m.get("reported_mb_per_s", math.nan)])})
    return out


def connector_check(configs: Mapping[str, Any], calibration: Mapping[str, Any], workloads: Mapping[str, Any],
                    stocks: Mapping[str, Any], predicted: Mapping[tuple[str, str], Mapping[str, Any]],
                    medians: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per PPO workload, RLlib's learner connector up to ``NumpyToTensor`` (the instrument's *c*) at the train
    batch, four ways: as the calibration timed it (``batch_connector``, each round after the idle gap it
    records), as the model charges those rounds (the connector's fit plus :meth:`StockCosts.fresh_map` of the
    built batch at each round's gap: an out-of-sample check of :mod:`conduit.fresh_mapping`, whose figures come
    from another microbenchmark), as the simulation charged it on the stock side (segment ``c``), and as the real
    runs measured it on both sides. Figures a file does not hold (a calibration from before the rounds) are None."""
    med = pagereport.median_known
    real = {(m.get("workload"), m.get("side")): m.get("c_ms") for m in medians}
    out = []
    for name, wl in workloads.items():
        if wl.algorithm != "ppo":
            continue
        kind = "batch_connector_local" if wl.local_learner else "batch_connector"
        entry = (calibration.get("workload") or {}).get(f"{kind}:{_recheck_key(configs, name)}") or {}
        rounds = list((entry.get("extra") or {}).get("rounds") or [])
        stock = stocks.get(name)
        samples = wl.train_batch_per_learner
        built = samples * wl.bytes_per_step * wl.frame_stack
        episodes = math.ceil(samples / wl.chunk_steps) * wl.chunk_episodes  # the learner's chunks, as ppo.py charges them
        model = [stock.connector(samples / wl.steps_per_row, episodes, built)
                 + stock.fresh_map(built, float(r["idle_s"])) for r in rounds] if stock is not None else []
        seconds = [None if real.get((name, side)) is None else real[(name, side)] / 1e3 for side in ("stock", "conduit")]
        out.append({"workload": name, "primitive": kind, "built_mb": built / 1e6, "rounds": len(rounds),
                    "idle_s": med([r.get("idle_s") for r in rounds]), "calibration_s": med([r.get("cpu_s") for r in rounds]),
                    "model_s": med(model), "simulated_stock_s": (predicted.get((name, "stock")) or {}).get(
                        "segments", {}).get("c"), "runs_stock_s": seconds[0], "runs_conduit_s": seconds[1]})
    return out


def measured_metrics(median: Mapping[str, Any]) -> dict[str, float]:
    """The simulator's metrics from the instrument's medians (``MEASURED_AS``). A run whose median
    iteration saw no learner update (``num_updates`` 0: the instrument's ``iteration_ms`` then falls back
    to the ``train()`` wall time, e.g. APPO's fixed ``min_time_s_per_iteration`` when the learner never got a
    batch in the window) measured none of them: NaN, reported as missing."""
    if float(median.get("num_updates", 1.0)) == 0.0:
        return {metric: math.nan for metric in MEASURED_AS}
    return {metric: float(median.get(key, math.nan)) * scale for metric, (key, scale) in MEASURED_AS.items()}


# ------------------------------------------------------------------------------------------------
# Compare
# ------------------------------------------------------------------------------------------------
def rel_error(predicted: float | None, measured: float | None) -> float | None:
    """``(predicted - measured) / measured``; ``None`` when either is missing or not finite, or measured is 0."""
    if predicted is None or measured is None:
        return None
    if not (math.isfinite(predicted) and math.isfinite(measured)) or measured == 0:
        return None
    return (predicted - measured) / measured


def compare(predicted: Mapping[tuple[str, str], Mapping[str, float]],
            measured: Mapping[tuple[str, str], Mapping[str, float]] | None) -> list[dict[str, Any]]:
    """One row per (workload, side, metric): ``{workload, side, metric, predicted, measured, rel_error}``."""
    rows = []
    for (name, side), pred in predicted.items():
        meas = (measured or {}).get((name, side))
        for metric in METRICS:
            p = pred[metric]
            m = None if meas is None else meas.get(metric)
            if m is not None and not math.isfinite(m):
                m = None
            rows.append({"workload": name, "side": side, "metric": metric, "predicted": p, "measured": m,
                         "rel_error": rel_error(p, m)})
    return rows


def ratios(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """conduit/stock iteration-time ratio per workload, predicted and measured, and their difference."""
    by = {(r["workload"], r["side"]): r for r in rows if r["metric"] == "iteration_time_s"}
    out = []
    for (name, side), r in by.items():
        stock = by.get((name, "stock"))
        if side != "conduit" or stock is None:
            continue
        pred = r["predicted"] / stock["predicted"] if stock["predicted"] else None
        meas = (r["measured"] / stock["measured"]
                if r["measured"] is not None and stock["measured"] else None)
        diff = None if pred is None or meas is None else pred - meas
        out.append({"workload": name, "predicted_ratio": pred, "measured_ratio": meas, "difference": diff,
                    "within_target": None if diff is None else abs(diff) <= TARGETS["ratio"]})
    return out


def within_target(row: Mapping[str, Any]) -> bool | None:
    """Whether one row meets its metric's target; ``None`` when it has no target or no measurement.

    A measured 0 (an APPO learner that never waited for experience) has no relative error: the
    prediction meets it only by being 0 as well, exactly."""
    limit = TARGETS.get(row["metric"])
    if limit is None or row["measured"] is None:
        return None
    if row["measured"] == 0:
        return row["predicted"] == 0
    e = row["rel_error"]
    return e is not None and abs(e) <= limit


def misses(rows: Sequence[Mapping[str, Any]], ratio_rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every target missed, in words."""
    out = []
    for r in rows:
        if within_target(r) is not False:
            continue
        limit = TARGETS[r["metric"]]
        e = r["rel_error"]
        if e is None:
            out.append(f"{r['workload']} [{r['side']}] {r['metric']}: measured {r['measured']:.4g}, predicted "
                       f"{r['predicted']:.4g}: a measured 0 is met only by a predicted 0")
        else:
            out.append(f"{r['workload']} [{r['side']}] {r['metric']}: predicted {r['predicted']:.4g}, measured "
                       f"{r['measured']:.4g}, error {e:+.1%} (target within {limit:.0%})")
    for r in ratio_rows:
        if r["within_target"] is False:
            out.append(f"{r['workload']} conduit/stock iteration ratio: predicted {r['predicted_ratio']:.3f}, "
                       f"measured {r['measured_ratio']:.3f}, difference {r['difference']:+.3f} (target within "
                       f"{TARGETS['ratio']})")
    return out


def target_counts(rows: Sequence[Mapping[str, Any]], ratio_rows: Sequence[Mapping[str, Any]]) -> dict[str, list[int]]:
    """How many measured predictions meet each target: ``{metric or "ratio": [met, measured]}``
    (:func:`within_target`: a measured 0 is met by a predicted 0 and by nothing else)."""
    out = {}
    for metric in ("iteration_time_s", "exposed_experience_path_s"):
        judged = [within_target(r) for r in rows if r["metric"] == metric and r["measured"] is not None]
        out[metric] = [sum(1 for ok in judged if ok), len(judged)]
    judged = [r for r in ratio_rows if r["within_target"] is not None]
    out["ratio"] = [sum(1 for r in judged if r["within_target"]), len(judged)]
    return out


def _counts_line(counts: Mapping[str, Sequence[int]]) -> str:
    names = {"iteration_time_s": "iteration time", "ratio": "conduit/stock ratio",
             "exposed_experience_path_s": "exposed latency"}
    return "; ".join(f"{label} {counts[k][0]} of {counts[k][1]}" for k, label in names.items() if k in counts)


def _error_cell(row: Mapping[str, Any]) -> str:
    """The error column: the relative error, or ``exact (0)`` where both figures are 0."""
    if row.get("measured") == 0 and row.get("predicted") == 0:
        return "exact (0)"
    return _f(row.get("rel_error"), "+.1%")


def _f(x: Any, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _host_speed_line(speed: Mapping[str, Any]) -> str:
    """The report's sentence on the host's speed (:func:`host_speed`)."""
    cal, runs = speed.get("calibration_s") or [], speed.get("runs_s") or []
    if speed.get("drift") is None:
        missing = " and ".join(w for w, got in (("the calibration", cal), ("the real runs", runs)) if not got)
        return f"Host speed: no probe recorded with {missing}, so the host's drift between them is unknown."
    d = speed["drift"]
    line = (f"Host speed (`conduit.runtime.hostspeed.probe`, CPU s): {', '.join(f'{x:.3f}' for x in cal)} with the "
            f"calibration, {', '.join(f'{x:.3f}' for x in runs)} with the real runs: the runs saw a host "
            f"{abs(d):.1%} {'slower' if d > 0 else 'faster'}.")
    if speed.get("warning"):
        line += (f" **More than {hostspeed.DRIFT_WARNING:.0%}: the errors below include that drift** (the "
                 f"primitives, timed on a {'faster' if d > 0 else 'slower'} host, predict the runs "
                 f"{'short' if d > 0 else 'long'}).")
    return line


def check_plane_cold_calls(path: Path, taken: Mapping[str, str]) -> None:
    """The cold-call law is on (the stock primitives have section ``gap``): the plane primitives of the same
    window must carry its plane side too (``PLANE_COLD_SOURCES``), or the prediction would charge the plane's
    calls with the built-in surcharges, measured on another day. Refused naming the file and what is missing."""
    from conduit.sim.params import PLANE_COLD_SOURCES

    missing = sorted(m for name, (m, _how) in PLANE_COLD_SOURCES.items() if name not in taken)
    if missing:
        raise SystemExit(f"--plane-primitives {path}: no {', '.join(missing)} (the cold-call law's plane side, which "
                         f"the stock primitives' section gap turns on); measure them with "
                         f"benchmarks/plane_primitives.py --out {path} --merge --only {' '.join(missing)}, "
                         f"or pass --no-cold-calls")


def cold_call_summary(stock: Any, plane: Any, asked: bool) -> dict[str, Any]:
    """The cold-call law in force (:mod:`conduit.sim.raycalls`): on, off by ``--no-cold-calls``, or off because
    the stock primitives have no section ``gap``; its ramp and surcharges (seconds) when on."""
    from conduit.sim.params import PlaneCosts

    if not asked:
        return {"state": "off (--no-cold-calls)"}
    if stock.rpc_cold_after <= 0:
        return {"state": "off (the stock primitives have no section gap: every call at its back-to-back cost)"}
    p = plane or PlaneCosts()
    return {"state": "on", "warm_within_s": stock.rpc_warm_within, "cold_after_s": stock.rpc_cold_after,
            "caller_cpu_s": stock.rpc_cold_caller_cpu, "callee_cpu_s": stock.rpc_cold_callee_cpu,
            "round_trip_s": stock.rpc_cold_round_trip, "plane_callee_cpu_s": p.cold_callee_cpu,
            "plane_draw_s": p.cold_draw, "plane_priorities_s": p.cold_priorities,
            "plane_round_trip_s": p.cold_call_round_trip}


def _cold_call_line(cold: Mapping[str, Any]) -> str:
    """The report's sentence on the cold-call law (:func:`cold_call_summary`)."""
    if cold.get("state") != "on":
        return f"Cold-call law (`conduit.sim.raycalls`): {cold.get('state', 'not recorded')}."
    ms = {k: v * 1e3 for k, v in cold.items() if k.endswith("_s")}
    return (f"Cold-call law (`conduit.sim.raycalls`): on. A call is warm within {ms['warm_within_s']:.2f} ms of its "
            f"process's previous one and cold from {ms['cold_after_s']:.2f} ms; cold, it adds {ms['caller_cpu_s']:.3f} "
            f"ms to the caller's CPU, {ms['callee_cpu_s']:.3f} ms to an RLlib actor's, "
            f"{ms['plane_callee_cpu_s']:.3f} / {ms['plane_draw_s']:.3f} / {ms['plane_priorities_s']:.3f} ms to a "
            f"plane actor's (control call / replay draw / priorities), round trips +{ms['round_trip_s']:.3f} ms "
            f"(RLlib's call) and +{ms['plane_round_trip_s']:.3f} ms (the plane's).")


#: the StockCosts fields of the fresh-mapping model (conduit.fresh_mapping), as the calibration's host.fresh_mapping
#: holds them (conduit.runtime.freshmap.measure)
FRESH_MAP_FIELDS = ("fresh_map_per_byte", "reported_map_per_byte", "reported_ramp_from", "reported_ramp_to")


def with_fresh_mapping(stock: Any, calibration: Mapping[str, Any], asked: bool) -> tuple[Any, dict[str, Any]]:
    """``stock`` with the calibration's fresh-mapping model (``host.fresh_mapping``: ``conduit calibrate``'s
    :func:`conduit.runtime.freshmap.measure`; charged by :meth:`~conduit.sim.params.StockCosts.fresh_map` on a
    learner's batch above glibc's mmap ceiling; the calibration's rounds, ``extra_s``, refitted by
    :func:`conduit.fresh_mapping.fit_ramp` where it holds them, so a calibration taken before a change of the fit
    is read as the model reads rounds now), and what the report says of it: on, off by ``--no-fresh-mapping``, or
    off because the calibration predates the measurement. Figures that cannot be
    read (not numbers, a ramp that ends before it starts) stop the study with the field named."""
    measured = (calibration.get("host") or {}).get("fresh_mapping") or {}
    if not asked:
        return stock, {"state": "off (--no-fresh-mapping)"}
    if any(measured.get(k) is None for k in FRESH_MAP_FIELDS):
        return stock, {"state": "off (the calibration has no host.fresh_mapping: measured before it existed)"}
    try:
        if measured.get("extra_s"):  # the rounds themselves: fitted as the model fits them now
            from conduit.fresh_mapping import fit_ramp

            measured = {**measured, **fit_ramp(measured["gaps_s"], measured["extra_s"], int(measured["block_bytes"]))}
        values = {k: float(measured[k]) for k in FRESH_MAP_FIELDS}
        stock = replace(stock, **values)  # StockCosts checks the ramp's order
    except (KeyError, TypeError, ValueError, ConduitError) as exc:
        raise SystemExit(f"calibration: host.fresh_mapping: {exc}") from None
    return stock, {"state": "on", **values, **{k: measured.get(k) for k in ("block_bytes", "rounds", "gaps_s",
                                                                          "slow_share", "warm_copy_s")}}


def _fresh_mapping_line(fresh: Mapping[str, Any]) -> str:
    """The report's sentence on the fresh-mapping model (:func:`with_fresh_mapping`)."""
    if fresh.get("state") != "on":
        return f"Fresh mapping (`conduit.fresh_mapping`): {fresh.get('state', 'not recorded')}."
    mib = 2**20 * 1e3
    shares = ", ".join(f"{g:g} s {s:.0%}" for g, s in zip(fresh.get("gaps_s") or [], fresh.get("slow_share") or [],
                                                           strict=False))
    return (f"Fresh mapping (`conduit.fresh_mapping`): on. A learner's batch above glibc's 32 MiB mmap ceiling costs "
            f"{fresh['fresh_map_per_byte'] * mib:.3f} ms per MiB over a pre-faulted one, and "
            f"{fresh['reported_map_per_byte'] * mib:.3f} ms per MiB more on the share its host took back: none after "
            f"{fresh['reported_ramp_from']:.2f} s idle or less, all from {fresh['reported_ramp_to']:.2f} s "
            f"(the calibration's rounds on reported memory per idle gap: {shares}).")


def warm_up_debt_summary(stock: Any, asked: bool) -> dict[str, Any]:
    """The warm-up debt in force (:mod:`conduit.sim.coldwork`): on, off by ``--no-warm-up-debt``, or off because the
    stock primitives have no section ``wake``; its ramp and each primitive's figure (seconds) when on."""
    from conduit.sim.coldwork import KINDS

    if not asked:
        return {"state": "off (--no-warm-up-debt)"}
    if stock.wake_cold_after <= 0:
        return {"state": "off (the stock primitives have no section wake: every primitive at its back-to-back cost)"}
    return {"state": "on", "warm_within_s": stock.wake_warm_within, "cold_after_s": stock.wake_cold_after,
            **{f"{kind}_s": getattr(stock, f"wake_{kind}") for kind in KINDS}}


def _warm_up_debt_line(debt: Mapping[str, Any]) -> str:
    """The report's sentence on the warm-up debt (:func:`warm_up_debt_summary`)."""
    if debt.get("state") != "on":
        return f"Warm-up debt (`conduit.sim.coldwork`): {debt.get('state', 'not recorded')}."
    ms = {k: v * 1e3 for k, v in debt.items() if k.endswith("_s")}
    parts = ", ".join(f"{k[:-2].replace('_', ' ')} +{v:.3f}" for k, v in ms.items()
                      if k not in ("warm_within_s", "cold_after_s"))
    return (f"Warm-up debt (`conduit.sim.coldwork`): on. A DQN primitive is warm within {ms['warm_within_s']:.2f} ms of "
            f"its thread's previous one and cold from {ms['cold_after_s']:.2f} ms; cold, it adds (ms): {parts}.")


def markdown(report: Mapping[str, Any]) -> str:
    """The report as markdown tables."""
    lines = ["# Simulator validation: predicted vs measured (out of sample)", "",
             f"Machine: {report['machine']}; load average during the real runs: {report['load']}.",
             (f"Calibration: {report['calibration_source']} (workload primitives in {report['clock']} time); "
              f"stock costs: {report['stock_costs_source']}; "
              f"plane costs: {report.get('plane_costs_source', 'built-in')}; "
              f"topology: {report['topology']}; simulator seed {SIM_SEED}."), "",
             _host_speed_line(report.get("host_speed") or {}), "",
             _cold_call_line(report.get("cold_calls") or {}),
             _warm_up_debt_line(report.get("warm_up_debt") or {}),
             _fresh_mapping_line(report.get("fresh_mapping") or {}), "",
             "| workload | side | metric | predicted | measured | error |", "|---|---|---|---:|---:|---:|"]
    for r in report["rows"]:
        pct = r["metric"] == "experience_share"
        spec = ".2%" if pct else ".4g"
        lines.append(f"| {r['workload']} | {r['side']} | {r['metric']} | {_f(r['predicted'], spec)} | "
                     f"{_f(r['measured'], spec)} | {_error_cell(r)} |")
    lines += ["", "## conduit / stock iteration time", "", "| workload | predicted | measured | difference |",
              "|---|---:|---:|---:|"]
    for r in report["ratios"]:
        lines.append(f"| {r['workload']} | {_f(r['predicted_ratio'], '.3f')} | {_f(r['measured_ratio'], '.3f')} | "
                     f"{_f(r['difference'], '+.3f')} |")
    lines += ["", "## Targets", "",
              (f"iteration_time_s within {TARGETS['iteration_time_s']:.0%}, conduit/stock ratio within "
               f"{TARGETS['ratio']}, exposed latency within {TARGETS['exposed_experience_path_s']:.0%}."), ""]
    checked = any(r["measured"] is not None for r in report["rows"])
    lines += ([f"- MISS: {m}" for m in report["misses"]] or ["- every measured target met"]) if checked else [
        "- not checked: no measurements (--predict-only)"]
    if checked:
        lines += [f"- NOT MEASURED: {w} [{s}] {m} (the real run gave no value)" for w, s, m in
                  sorted({(r["workload"], r["side"], r["metric"]) for r in report["rows"] if r["measured"] is None})]
    if checked and report.get("counts"):
        lines += ["", f"Met: {_counts_line(report['counts'])}."]
    lines += runs_section(report.get("runs") or [])
    lines += _recheck_section(report.get("rechecked"))
    lines += _gae_memory_section(report.get("gae_piece_memory") or [])
    lines += _connector_section(report.get("connector_check") or [])
    lines += ["", "## External check (not a fitting target): published 8xA100 experience share", "",
              "| topology | workload | predicted (rllib-stock, default preset) | published | error |",
              "|---|---|---:|---:|---:|"]
    for r in report["external"]:
        lines.append(f"| {r['topology']} | {r['workload']} | {r['predicted_share']:.1%} | {r['published_share']:.1%} | "
                     f"{r['rel_error']:+.1%} |")
    return "\n".join(lines) + "\n"


def _gae_memory_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's section on PPO's GAE piece and the VM's free page reporting (:func:`gae_piece_memory`); none
    when no row holds a figure of the reporting."""
    def known(r: Mapping[str, Any]) -> bool:
        return any(x is not None for x in (r["calibration"]["reported_mb_before"], r["rechecked"]["reported_mb_before"],
                                           r["runs_reported_mb_per_s"]))
    if not any(known(r) for r in rows):
        return []

    def timed(t: Mapping[str, Any]) -> str:
        if not t["calls"]:
            return "-"
        after = t["calls_after_reporting"]
        return (f"{_f(t['wall_s'], '.3f')} s ({_f(t['system_s'], '.3f')} s system, {_f(t['faults'], '.0f')} faults); "
                f"{'-' if after is None else after} of {t['calls']} after reported memory "
                f"(median {_f(t['reported_mb_before'], '.0f')} MB)")
    lines = ["", "## PPO's GAE piece and the VM's free page reporting", "",
             ("RLlib's `GeneralAdvantageEstimation` at the train batch: median wall time of the calibration's calls "
              "and of the re-timings before the runs, with their system time and page faults, and how many followed "
              "memory the VM had handed back to its host in the round before them (`conduit.runtime.pagereport`: a "
              "call after reported memory can cost twice as much on the same faults); the real runs' piece "
              "(`gae_ms`) and the memory reported per second over them."), "",
             "| workload | calibration | re-timed before the runs | real runs | reported during the runs |",
             "|---|---|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workload']} (`{r['primitive']}`) | {timed(r['calibration'])} | {timed(r['rechecked'])} | "
                     f"{_f(r['runs_gae_s'], '.3f')} s | {_f(r['runs_reported_mb_per_s'], '.1f')} MB/s |")
    return lines


def _connector_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's section on the learner connector's fresh batch (:func:`connector_check`); none without a
    calibration round to check."""
    rows = [r for r in rows if r["rounds"]]
    if not rows:
        return []
    def ms(x: Any) -> str:
        return "-" if x is None else f"{x * 1e3:.1f}"
    lines = ["", "## The learner connector's fresh batch", "",
             ("RLlib's learner connector up to `NumpyToTensor` (*c*) at the train batch, in ms: as the calibration timed "
              "it (median of its rounds, each after the idle gap it records), as the model charges those rounds (the "
              "connector's fit plus the fresh mapping of the built batch at each round's gap, `conduit.fresh_mapping`: "
              "its figures come from another microbenchmark), as the simulation charged the stock side, and as the "
              "real runs measured it."), "",
             ("| workload | batch (MB) | idle before (s) | calibration | model at those gaps | simulated (stock) | "
              "real (stock) | real (conduit) |"), "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workload']} (`{r['primitive']}`) | {r['built_mb']:.1f} | {_f(r['idle_s'], '.2f')} | "
                     f"{ms(r['calibration_s'])} | {ms(r['model_s'])} | {ms(r['simulated_stock_s'])} | "
                     f"{ms(r['runs_stock_s'])} | {ms(r['runs_conduit_s'])} |")
    return lines


def _recheck_section(rechecked: Mapping[str, Any] | None) -> list[str]:
    """The report's section on the predictions from the primitives re-timed before each run."""
    if not rechecked or not (rechecked.get("drift") or rechecked.get("failed")):
        return []
    lines = ["", "## Primitives re-timed just before each run", "",
             ("The same microbenchmarks as the calibration's, re-timed before each real run: the EnvRunner sweep "
              "(ms per env step), the learner update the prediction reads (ms at the sweep's largest size) and, for "
              "DQN, its driver's calls (ms at the largest count). The "
              "prediction below swaps in each one's median over the workload's re-timings (both sides, every run) "
              "and keeps every other primitive as calibrated. Drift: that median over the calibrated cost, less "
              "one; every re-timing is in validation.json (`rechecked.drift_runs`)."), "",
             "| workload | primitive | calibrated ms | re-timed ms (median) | drift | re-timings |",
             "|---|---|---:|---:|---:|---:|"]
    runs = Counter((d["workload"], d["kind"]) for d in rechecked.get("drift_runs") or [])
    for d in rechecked["drift"]:
        lines.append(f"| {d['workload']} | {d['kind']} ({d['unit']}) | {d['calibrated'] * 1e3:.3f} | "
                     f"{d['rechecked'] * 1e3:.3f} | {_f(d['drift'], '+.1%')} | {runs[(d['workload'], d['kind'])]} |")
    lines += ["", "| workload | side | predicted iteration s (re-timed) | measured | error |", "|---|---|---:|---:|---:|"]
    for r in rechecked["rows"]:
        if r["metric"] == "iteration_time_s":
            lines.append(f"| {r['workload']} | {r['side']} | {_f(r.get('predicted'), '.4g')} | "
                         f"{_f(r.get('measured'), '.4g')} | {_f(r.get('rel_error'), '+.1%')} |")
    lines += ["", "| workload | predicted ratio (re-timed) | measured | difference |", "|---|---:|---:|---:|"]
    for r in rechecked["ratios"]:
        lines.append(f"| {r['workload']} | {_f(r['predicted_ratio'], '.3f')} | {_f(r['measured_ratio'], '.3f')} | "
                     f"{_f(r['difference'], '+.3f')} |")
    lines += ["", f"Met with the re-timed primitives: {_counts_line(rechecked['counts'])}."]
    lines += [f"- RE-TIMING FAILED: {r['workload']} [{r['side']}]: {r['error']} (predicted from the calibration only)"
              for r in rechecked.get("failed") or []]
    return lines


def plot(rows: Sequence[Mapping[str, Any]], path: Path) -> bool:
    """Predicted vs measured on log axes with y = x and a +-15% band; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    pts = [r for r in rows if r["measured"] and r["predicted"] and r["measured"] > 0 and r["predicted"] > 0]
    fig, ax = plt.subplots(figsize=(6.4, 6.0))
    markers = {"iteration_time_s": "o", "exposed_experience_path_s": "s", "experience_share": "^"}
    colours = {"stock": "tab:blue", "conduit": "tab:orange"}
    for metric, marker in markers.items():
        for side, colour in colours.items():
            sel = [r for r in pts if r["metric"] == metric and r["side"] == side]
            if sel:
                ax.scatter([r["measured"] for r in sel], [r["predicted"] for r in sel], marker=marker, c=colour,
                           label=f"{metric} [{side}]", alpha=0.8)
    if pts:
        lo = min(min(r["measured"], r["predicted"]) for r in pts) / 2
        hi = max(max(r["measured"], r["predicted"]) for r in pts) * 2
        xs = [lo, hi]
        ax.plot(xs, xs, "k-", lw=1, label="y = x")
        ax.fill_between(xs, [x * 0.85 for x in xs], [x * 1.15 for x in xs], color="grey", alpha=0.2, label="+-15%")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (s, or share)")
    ax.set_ylabel("predicted (s, or share)")
    ax.set_title("Simulator vs real RLlib runs (this machine)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calibration", type=Path, help="calibration JSON to use (default: measure, write OUT/calibration.json)")
    p.add_argument("--stock-primitives", type=Path, default=DEFAULT_PRIMITIVES,
                   help="benchmarks/stock_primitives.py output for StockCosts")
    p.add_argument("--plane-primitives", type=Path, default=None,
                   help="benchmarks/plane_primitives.py output for PlaneCosts (default: the built-in, measured "
                        "on the development VM); measure both primitive files on the calibration's host")
    p.add_argument("--add-learner-primitives", action="store_true",
                   help="with --calibration: measure RLlib's own Learner.update and DQN's driver calls now, and "
                        "write the merged calibration to OUT/calibration.json")
    p.add_argument("--repeat", type=int, default=1, help="--add-learner-primitives: runs per primitive (medians)")
    p.add_argument("--only", default="", help="--add-learner-primitives: comma-separated primitive kinds to add "
                   "(e.g. torch_team); the calibration's others stay")
    p.add_argument("--contention", type=Path, default=None,
                   help="the oversubscribed CPU cost to use instead of the calibration's: a JSON written by "
                        "benchmarks/contention_cpu.py --json (a paired ratio, so another window's figure applies)")
    p.add_argument("--predict-only", action="store_true", help="predict only; no real runs")
    p.add_argument("--measured", type=Path, help="reuse a previous run's OUT/measured.json instead of running")
    p.add_argument("--quick", action="store_true", help="quick calibration and 4 real iterations (1 warm-up)")
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                   help="workload primitives in process CPU time (default) or refitted from their wall-clock "
                        "medians (the machine as loaded during the calibration)")
    p.add_argument("--workloads", default="", help="comma-separated study workloads (default: the study's defaults)")
    p.add_argument("--sides", default="stock,conduit")
    p.add_argument("--iters", type=int, default=9, help="real iterations per workload and side (with --warmup)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--runs", type=int, default=1,
                   help="real runs per workload and side, interleaved; the targets are judged on the medians of "
                        "their medians (one run on a shared 2-core VM moves by 1.2-1.3x)")
    p.add_argument("--recheck", action=argparse.BooleanOptionalAction, default=True,
                   help="re-time each workload's EnvRunner sweep and learner update just before each real run "
                        "and report the prediction from them next to the calibration's (default: on; about "
                        "20-60 s per run)")
    p.add_argument("--cold-calls", action=argparse.BooleanOptionalAction, default=True,
                   help="charge Ray calls by the cold-call law (conduit.sim.raycalls) where --stock-primitives has "
                        "its figures (section gap; a --plane-primitives file must then have the plane's *_cold "
                        "figures); --no-cold-calls charges every call its back-to-back cost")
    p.add_argument("--warm-up-debt", action=argparse.BooleanOptionalAction, default=True,
                   help="charge DQN's per-round primitives their warm-up debt (conduit.sim.coldwork) where "
                        "--stock-primitives has its figures (section wake); --no-warm-up-debt charges each its "
                        "back-to-back cost")
    p.add_argument("--fresh-mapping", action=argparse.BooleanOptionalAction, default=True,
                   help="charge a learner's batch above glibc's mmap ceiling its fresh mapping and the share on memory "
                        "the VM handed back to its host (conduit.fresh_mapping) where the calibration measured them "
                        "(host.fresh_mapping); --no-fresh-mapping charges it as reused memory")
    p.add_argument("--out", type=Path, default=Path("results/validation"))
    args = p.parse_args(argv)
    if args.quick:
        args.iters, args.warmup = min(args.iters, 4), 1
    if args.iters - args.warmup < 1:
        p.error("--iters must exceed --warmup")
    if args.runs < 1:
        p.error(f"--runs must be at least 1, got {args.runs}")
    if args.runs > 1 and (args.measured or args.predict_only):
        p.error("--runs applies to real runs (not with --measured or --predict-only)")
    if args.add_learner_primitives and not args.calibration:
        p.error("--add-learner-primitives needs --calibration FILE (a full calibration measures them anyway)")
    if args.predict_only and args.measured:
        p.error("--predict-only and --measured exclude each other")
    only = [k.strip() for k in args.only.split(",") if k.strip()]
    if only and not args.add_learner_primitives:
        p.error("--only applies to --add-learner-primitives")
    if bad := [k for k in only if k not in LEARNER_PRIMITIVES]:
        p.error(f"--only: unknown primitive kind(s) {', '.join(bad)}; known: {', '.join(LEARNER_PRIMITIVES)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    study = experience_path_study()
    names = [n.strip() for n in args.workloads.split(",") if n.strip()] or None
    known = {w.name for w in study.WORKLOADS}
    if names and (bad := [n for n in names if n not in known]):
        print(f"error: unknown workload(s) {', '.join(bad)}; known: {', '.join(sorted(known))}", file=sys.stderr)
        return 2
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if bad := [s for s in sides if s not in SIM_POLICY]:
        print(f"error: unknown side(s) {', '.join(bad)}; known: {', '.join(SIM_POLICY)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    study_args = study.parse_args([])
    configs = study_configs(study, study_args, names)
    t0 = time.time()
    # the cost files first: a bad one is refused before any calibration or run
    stock = stock_costs_from_primitives(args.stock_primitives)
    if not args.cold_calls:
        stock = stock.without_cold_calls()
    if not args.warm_up_debt:
        stock = stock.without_warm_up_debt()
    plane = None  # the built-in PlaneCosts
    if args.plane_primitives is not None:  # read once, checked before any simulation
        from conduit.sim.cost_file import CostFileError, load_plane_costs

        try:
            plane, taken = load_plane_costs(args.plane_primitives)
        except (CostFileError, OSError) as exc:
            raise SystemExit(f"--plane-primitives: {exc}") from None
        if stock.rpc_cold_after > 0:
            check_plane_cold_calls(args.plane_primitives, taken)

    if args.calibration:
        calibration = json.loads(args.calibration.read_text())
        source = str(args.calibration)
        if args.add_learner_primitives:
            calibration = add_learner_primitives(calibration, configs, args.quick, repeat=args.repeat,
                                                 only=[k.strip() for k in args.only.split(",") if k.strip()])
            (args.out / "calibration.json").write_text(json.dumps(calibration, indent=1))
            source = f"{args.calibration} + learner primitives measured now ({args.out / 'calibration.json'})"
    else:
        print("calibrating (microbenchmarks: machine primitives and the workloads' primitives) ...", flush=True)
        calibration = calibrate(configs, args.quick)
        (args.out / "calibration.json").write_text(json.dumps(calibration, indent=1))
        source = f"{args.out / 'calibration.json'} (measured now, {time.time() - t0:.0f} s)"
    if args.contention is not None:
        calibration, source = with_contention(calibration, args.contention), f"{source} + {args.contention}"
    topology, topo_text = topology_from_calibration(calibration)
    (args.out / "topology.yaml").write_text(topo_text)
    stock, fresh = with_fresh_mapping(stock, calibration, args.fresh_mapping)

    workloads, stocks = build_workloads(configs, calibration, stock, args.clock)
    print("predicting ...", flush=True)
    predicted = predict(workloads, topology, stock, sides, stocks, plane)
    external = external_check(stock)

    load_before = os.getloadavg()
    measured = None
    measured_probe = None
    rechecks: list[dict[str, Any]] = []
    measured_medians: list[dict[str, Any]] = []
    if args.measured:
        data = json.loads(args.measured.read_text())
        measured_medians = list(data["medians"])
        measured = {(m["workload"], m["side"]): measured_metrics(m) for m in data["medians"]}
        load = data.get("load", "see the measured file")
        measured_probe = data.get("speed_probe")
        rechecks = data.get("env_runner_recheck") or []
    elif not args.predict_only:
        print(f"running for real: {len(workloads)} workloads x {len(sides)} sides, {args.iters} iterations "
              f"({args.warmup} warm-up) each; load average now {load_before[0]:.2f}", flush=True)
        probe_before = hostspeed.probe()
        # the sweep's sizes as the calibration's (a quick sweep's slope is read at other step counts)
        quick_sweep = (calibration.get("host") or {}).get("mode") == "quick"
        recheck = (lambda name: recheck_primitives(configs, calibration, name, quick_sweep)) if args.recheck else None
        meds, rechecks = measure(study, list(workloads), sides, args.iters, args.warmup, recheck=recheck,
                                 runs=args.runs)
        probe_after = hostspeed.probe()
        measured_probe = {"before": probe_before, "after": probe_after}
        load_after = os.getloadavg()
        load = (f"1-min {load_before[0]:.2f} before, {load_after[0]:.2f} after; 15-min {load_after[2]:.2f} "
                f"on {os.cpu_count()} cores")
        (args.out / "measured.json").write_text(json.dumps({"load": load, "iters": args.iters, "warmup": args.warmup,
                                                            "speed_probe": measured_probe,
                                                            "env_runner_recheck": rechecks,
                                                            "medians": list(meds.values())}, indent=1, default=float))
        measured = {k: measured_metrics(m) for k, m in meds.items()}
        measured_medians = list(meds.values())
    else:
        load = f"no real runs (--predict-only); 1-min {load_before[0]:.2f} now"

    rows = compare(predicted, measured)
    ratio_rows = ratios(rows)
    rechecked = None
    if rechecks and measured is not None:
        print("predicting again with the primitives re-timed before each run ...", flush=True)
        re_predicted = rechecked_predictions(configs, calibration, rechecks, topology, stock, args.clock, plane)
        re_rows = compare(re_predicted, measured)
        re_ratios = ratios(re_rows)
        # the table: the re-timing each prediction used (the median run's); every run's drift kept in drift_runs
        rechecked = {"primitives": sorted({k for r in rechecks for k in recheck_entries(r)}),
                     "drift": primitive_drift(calibration, configs, median_rechecks(rechecks), args.clock),
                     "drift_runs": primitive_drift(calibration, configs, rechecks, args.clock),
                     "rows": re_rows, "ratios": re_ratios, "misses": misses(re_rows, re_ratios),
                     "counts": target_counts(re_rows, re_ratios),
                     "failed": failed_rechecks(rechecks)}
    report = {
        "machine": f"{os.uname().nodename}, {os.cpu_count()} cores",
        "load": load,
        "calibration_source": source,
        "stock_costs_source": str(args.stock_primitives),
        "cold_calls": cold_call_summary(stock, plane, args.cold_calls),
        "warm_up_debt": warm_up_debt_summary(stock, args.warm_up_debt),
        "fresh_mapping": fresh,
        "plane_costs_source": str(args.plane_primitives or "built-in PlaneCosts (" + PLANE_PRIMITIVES_FILE + ")"),
        "clock": args.clock,
        "topology": topology.name,
        "workloads": {n: wl.to_dict() for n, wl in workloads.items()},
        "rows": rows,
        "ratios": ratio_rows,
        "targets": TARGETS,
        "misses": misses(rows, ratio_rows),
        "counts": target_counts(rows, ratio_rows),
        "rechecked": rechecked,
        "external": external,
        "host_speed": host_speed(calibration, measured_probe),
        "gae_piece_memory": gae_piece_memory(configs, calibration, rechecks, measured_medians),
        "connector_check": connector_check(configs, calibration, workloads, stocks, predicted, measured_medians),
        "runs": [{"workload": m["workload"], "side": m["side"], "runs": int(m.get("runs", 1)),
                  "iteration_ms_runs": m.get("iteration_ms_runs", [m.get("iteration_ms")])} for m in measured_medians],
        "sim": {f"{n}/{s}": {"violations": p["violations"], "warnings": p["warnings"]}
                for (n, s), p in predicted.items()},
        "wall_s": time.time() - t0,
    }
    (args.out / "validation.json").write_text(json.dumps(report, indent=1, default=float))
    text = markdown(report)
    (args.out / "validation.md").write_text(text)
    drew = measured is not None and plot(rows, args.out / "validation.png")
    print()
    print(text)
    if report["misses"]:
        print(f"{len(report['misses'])} target(s) missed (listed above).")
    print(f"written {args.out}/validation.json, validation.md" + (", validation.png" if drew else "")
          + f"; {report['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
