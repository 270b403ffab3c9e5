"""RL workloads: who produces experience, who consumes it, and under which contract.

A :class:`Workload` describes one algorithm's loop in the terms the simulator executes:

* **Actors.** One *env runner* per GPU (``runners_per_gpu``), or ``env_runners`` of them spread over
  the nodes when a topology has no GPU. A runner steps ``envs_per_runner`` environments together (RLlib's
  vectorised ``EnvRunner``; the issue's "actors per GPU"): one vector step costs ``env_step_time``
  (lognormal with coefficient of variation ``env_step_cv``) plus ``inference_time``. A **chunk** is
  ``fragment_length`` vector steps, i.e. ``fragment_length * envs_per_runner`` samples of
  ``bytes_per_step`` bytes, holding ``steps / episode_length`` episodes (what pickling pays for)
  and ``steps / steps_per_row`` rows (what per-row batch building and Ray's serializer per timestep pay
  for: a row is a step for control tasks, a whole token sequence for LLM post-training, whose tokens are
  elements of one row's arrays). ``frame_stack`` > 1 stacks frames in
  the learner connector (RLlib's ``FrameStackingLearner``, as its Atari recipes do): the wire and the
  plane carry ``bytes_per_step`` (one frame), the batch built on the learner ``frame_stack`` times that.
* **Learners.** One per GPU (or ``learners`` of them). An update costs ``update_time_per_sample``
  per sample per epoch on the learner's device; PPO's GAE value forward pass (or GRPO's reference
  log-prob pass) costs ``value_pass_per_sample`` per sample on that device, and the rest of GAE (bootstrap
  rows, value targets, advantages) ``advantage_per_sample`` on the learner's CPU thread; a weight
  broadcast costs ``weight_sync_time``.
* **Algorithm.** ``ppo`` (synchronous, :class:`~conduit.contracts.OnPolicy`), ``appo``
  (asynchronous, :class:`~conduit.contracts.BoundedStaleness` from ``max_lag``/``max_reuse``), or
  ``dqn`` (:class:`~conduit.contracts.Replay` from ``replay_capacity``/``replay_ratio``/``min_size``).

Every field, its unit, default, preset values and plausible range: ``docs/workload-format.md``
(generated from :mod:`conduit.sim.workload_fields`).

Presets (:data:`PRESETS`) cover Atari-like ``ppo``/``appo``/``dqn``, ``ppo-mujoco`` and ``grpo-llm``,
plus ``ref-*`` workloads that restate the reference measurements' runs. Users add their own in YAML:
``base: ppo`` plus the fields to change.

The ``ref-*`` presets are **in-sample**: their sampling, update, value-pass and weight-sync figures are
copied from the measured segments of ``shared/reference/rllib-2.60-stock-cpu.md``, so a simulation of
them can only check that the simulator executes the copied figures (:mod:`conduit.sim.calibration`),
never validate it. Out-of-sample validation (``studies/validation.py``) builds its workloads from the
real RLlib configs and microbenchmarked primitives (``conduit calibrate --workloads``) and never uses them.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from conduit.contracts import BoundedStaleness, OnPolicy, Replay
from conduit.errors import ConduitError, UnknownNameError, shown
from conduit.units import Kind, parse_quantity

ALGORITHMS = ("ppo", "appo", "dqn")
ATARI_STEP_BYTES = 84 * 84 * 4 + 4 + 4 + 4 + 4 + 1  # uint8 obs + action, reward, logp, value, done


class WorkloadError(ConduitError):
    """A workload that cannot be used; names the source and the field."""

    def __init__(self, source: str, field: str | None, message: str):
        where = f"{source}: {field}: " if field else f"{source}: "
        super().__init__(where + message)
        self.source, self.field = source, field


#: the workload's true/false fields
_FLAGS = ("local_learner", "prioritized_replay")


@dataclass(frozen=True)
class Workload:
    name: str
    algorithm: str
    # actors
    envs_per_runner: int = 8
    runners_per_gpu: float = 1.0
    env_runners: int | None = None
    env_step_time: float = 2e-3
    env_step_cv: float = 0.1
    inference_time: float = 1e-3
    runner_call_overhead: float = 0.0
    #: RLlib's work on the EnvRunner after ``sample()`` returns, in the same remote call, before its reply:
    #: ``get_metrics()`` (``execution/rollout_ops.py: synchronous_parallel_sample`` with ``_return_metrics``:
    #: ``lambda w: (w.sample(...), w.get_metrics())``; APPO's ``EnvRunner.sample_get_state_and_metrics``
    #: also ``get_state``). It runs after the sample-end stamp, so it is on the experience path
    runner_metrics_time: float = 0.0
    fragment_length: int = 128
    bytes_per_step: float = ATARI_STEP_BYTES
    episode_length: float = 1000.0
    steps_per_row: float = 1.0
    frame_stack: int = 1
    # learners
    learners: int | None = None
    local_learner: bool = False
    learner_threads: int = 1
    learner_spin_s: float = 0.0
    sync_spin_s: float = 0.0
    learner_thread_share: float = 1.0
    update_time_per_sample: float = 20e-6
    update_overhead: float = 0.0
    value_pass_per_sample: float = 0.0
    stream_value_pass_per_sample: float | None = None
    advantage_per_sample: float = 0.0
    epochs: int = 1
    train_batch_per_learner: int = 4096
    weight_sync_time: float = 5e-3
    weight_set_time: float = 0.0
    # appo
    max_lag: int = 4
    max_reuse: int = 2
    chunks_per_batch: int = 4
    broadcast_interval: int = 1
    # dqn
    replay_capacity: int = 100_000
    replay_ratio: float = 8.0
    min_size: int = 1_000
    batch_size: int = 32
    steps_per_train: int = 1
    prioritized_replay: bool = False

    # -- derived -----------------------------------------------------------------------
    @property
    def chunk_steps(self) -> int:
        return self.fragment_length * self.envs_per_runner

    @property
    def chunk_bytes(self) -> float:
        return self.chunk_steps * self.bytes_per_step

    @property
    def chunk_rows(self) -> float:
        """RLlib timesteps in a chunk (``chunk_steps / steps_per_row``): what per-timestep costs scale with."""
        return self.chunk_steps / self.steps_per_row

    @property
    def chunk_episodes(self) -> float:
        return max(1.0, self.chunk_steps / self.episode_length)

    def contract(self, runners: int = 1):
        """The data contract this workload declares. For replay, the rate band must hold one round
        of inserts from every runner (``runners`` chunks arrive between two sampling phases of a
        training step), so its half-width is ``max(1, ratio) * max(min_size, runners * chunk_steps)``."""
        if self.algorithm == "ppo":
            return OnPolicy()
        if self.algorithm == "appo":
            return BoundedStaleness(max_lag=self.max_lag, max_reuse=self.max_reuse)
        band = max(1.0, self.replay_ratio) * max(self.min_size, runners * self.chunk_steps, 1)
        return Replay(capacity=self.replay_capacity, replay_ratio=self.replay_ratio, min_size=self.min_size,
                      error_buffer=band)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self, source: str = "<workload>") -> Workload:
        if not isinstance(self.name, str) or not self.name.strip():
            raise WorkloadError(source, "name", f"must be a non-empty string, got {shown(self.name)}")
        if not isinstance(self.algorithm, str) or self.algorithm not in ALGORITHMS:
            raise WorkloadError(source, "algorithm", f"must be one of {', '.join(ALGORITHMS)}, got {shown(self.algorithm)}")
        for flag in _FLAGS:
            if not isinstance(getattr(self, flag), bool):
                raise WorkloadError(source, flag, f"must be true or false, got {shown(getattr(self, flag))}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("name", "algorithm", *_FLAGS) or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise WorkloadError(source, f.name, f"must be a number, got {shown(value)}")
            if not math.isfinite(value):
                raise WorkloadError(source, f.name, f"must be a finite number, got {shown(value)}")
            if f.type in ("int", "int | None") and int(value) != value:
                raise WorkloadError(source, f.name, f"must be an integer, got {shown(value)}")
            minimum = 0 if f.name in _MAY_BE_ZERO else 1e-300
            if value < minimum:
                raise WorkloadError(source, f.name, f"must be {'>= 0' if minimum == 0 else '> 0'}, got {shown(value)}")
        if self.train_batch_per_learner < self.chunk_steps and self.algorithm == "ppo":
            raise WorkloadError(
                source,
                "train_batch_per_learner",
                f"{self.train_batch_per_learner} is smaller than one chunk ({self.chunk_steps} steps)",
            )
        if self.algorithm == "appo" and self.max_lag < self.broadcast_interval - 1:
            raise WorkloadError(
                source, "max_lag",
                f"{self.max_lag} is below broadcast_interval - 1 ({self.broadcast_interval - 1}): runners get "
                f"new weights only every {self.broadcast_interval} updates, so their chunks would all be stale",
            )
        if self.learner_threads > 1 and not self.local_learner:
            raise WorkloadError(source, "learner_threads",
                                f"{self.learner_threads} torch threads need a local learner (local_learner: true): "
                                f"Ray runs remote learners with OMP_NUM_THREADS=1")
        if self.learner_thread_share > 1:
            raise WorkloadError(source, "learner_thread_share",
                                f"must be <= 1 (a thread's share of an update's wall time), got {shown(self.learner_thread_share)}")
        try:
            contract = self.contract()
        except ConduitError as exc:
            raise WorkloadError(source, None, f"its contract is invalid: {exc}") from None
        if self.algorithm == "dqn":
            # the rate band must admit one chunk and one batch, or the limiter can block both sides
            need = self.replay_ratio * self.chunk_steps + self.batch_size
            if need > 2 * contract.tolerance:
                raise WorkloadError(
                    source, "min_size",
                    f"the replay rate band (half-width {contract.tolerance:g} steps, from min_size "
                    f"{self.min_size}) is narrower than one chunk and one batch need "
                    f"(replay_ratio * chunk steps + batch_size = {need:g} > 2 * half-width)",
                )
            if self.replay_capacity < 2 * self.chunk_steps + self.batch_size:
                raise WorkloadError(source, "replay_capacity",
                                    f"{self.replay_capacity} steps cannot hold two chunks and a batch")
        from conduit.sim.workload_bounds import check_bounds  # plausible ranges (docs/workload-format.md)

        refused = check_bounds(self, source)
        if refused:
            raise WorkloadError(source, *refused)
        return self


_MAY_BE_ZERO = {
    "learner_spin_s",
    "sync_spin_s",
    "learner_thread_share",
    "env_step_cv",
    "inference_time",
    "runner_call_overhead",
    "runner_metrics_time",
    "value_pass_per_sample",
    "stream_value_pass_per_sample",
    "advantage_per_sample",
    "weight_sync_time",
    "weight_set_time",
    "update_overhead",
    "max_lag",
    "min_size",
    "env_step_time",
    "update_time_per_sample",
}
_TIME_FIELDS = {
    "learner_spin_s",
    "sync_spin_s",
    "env_step_time",
    "inference_time",
    "runner_call_overhead",
    "runner_metrics_time",
    "update_time_per_sample",
    "update_overhead",
    "value_pass_per_sample",
    "stream_value_pass_per_sample",
    "advantage_per_sample",
    "weight_sync_time",
    "weight_set_time",
}
_BYTE_FIELDS = {"bytes_per_step"}


def _atari(name: str, algorithm: str, **kw: Any) -> Workload:
    return Workload(name=name, algorithm=algorithm, **kw)


#: Built-in presets. GPU-side times are for one H100 (our estimates from published throughput of the
#: Nature-CNN / IMPALA-CNN policies: ~50k samples/s forward+backward per A100-class GPU at batch 512,
#: i.e. ~20 us per sample per epoch; a value-only forward ~1/3 of that). Env step: ALE ~0.25 ms per
#: frame-skipped step on one core (Machado et al. 2018 report ~5-7k frames/s/core), envs in series.
#: The Atari presets carry one 84x84 uint8 frame per step on the wire and stack 4 in the learner
#: connector (``frame_stack=4``: RLlib's ``FrameStackingLearner``, as ``tuned_examples/ppo/atari_ppo.py``
#: and ``tuned_examples/dqn/benchmark_dqn_atari.py`` in ray-project/ray do).
ATARI_FRAME_BYTES = 84 * 84 + 4 + 4 + 4 + 4 + 1  # one uint8 frame + action, reward, logp, value, done
#: GAE's work besides the value forward pass, per sample (``advantage_per_sample``): the bootstrap rows, value
#: targets, advantages and their tensors, numpy over per-step scalars on the learner's CPU thread, so independent
#: of the observation; stock runs it right after the forward pass, Conduit's ``StreamedGAE`` at update start.
#: Measured, not estimated (the runtime's ``StreamedGAE``, which is exactly this work): ``gae_streamed:ppo-largeobs`` of
#: ``results/validation/calibration.json`` (``studies/validation.py --add-learner-primitives --only gae_streamed``,
#: 2026-12-06 22:4x, one thread: 0.621 us per sample, no per-call part, over 500..2,000 samples of 84x84x4 uint8
#: observations; CartPole's in the same run: 0.247 us + 0.578 ms per call, 0.39 us per sample at 4,000). On a
#: ``cpu_speed`` 1.0 core, as every CPU cost of the model.
ADVANTAGE_PER_SAMPLE = 0.621e-6
PRESETS: dict[str, Workload] = {
    # RLlib's Atari PPO recipe per learner GPU: 10 env runners x 5 envs (tuned_examples/ppo/atari-ppo.yaml:
    # num_env_runners 10, num_envs_per_env_runner 5, num_gpus 1); train_batch_size_per_learner 4000 and
    # num_epochs 10 (tuned_examples/ppo/atari_ppo.py, new API stack); fragment "auto" = 4000 / (10 x 5)
    # = 80 (AlgorithmConfig.get_rollout_fragment_length). Env step 5 x 0.25 ms per vector step.
    "ppo": _atari(
        "ppo",
        "ppo",
        runners_per_gpu=10,
        envs_per_runner=5,
        fragment_length=80,
        train_batch_per_learner=4000,
        bytes_per_step=ATARI_FRAME_BYTES,
        frame_stack=4,
        env_step_time=1.25e-3,
        inference_time=0.5e-3,
        episode_length=1000,
        update_time_per_sample=20e-6,
        value_pass_per_sample=7e-6,
        advantage_per_sample=ADVANTAGE_PER_SAMPLE,
        epochs=10,
        weight_sync_time=10e-3,
    ),
    # APPO keeps one runner per GPU: RLlib's Pong recipe (tuned_examples/ppo/pong-appo.yaml, an old
    # API stack recipe) runs 32 runners x 8 envs on one GPU with fragments of 50 and batches of 750,
    # which this preset does not follow yet (its runner count is not from a recipe).
    "appo": _atari(
        "appo",
        "appo",
        envs_per_runner=8,
        fragment_length=64,
        bytes_per_step=ATARI_FRAME_BYTES,
        frame_stack=4,
        env_step_time=2e-3,
        inference_time=0.5e-3,
        episode_length=1000,
        update_time_per_sample=20e-6,
        chunks_per_batch=4,
        max_lag=4,
        max_reuse=2,
        broadcast_interval=1,
        weight_sync_time=10e-3,
    ),
    # RLlib's Atari DQN recipe (tuned_examples/dqn/benchmark_dqn_atari.py): rollout_fragment_length 4,
    # one env per runner, train_batch_size 32, one learner fed from the driver's one replay buffer
    # (data-parallel DQN learners at batch 32 are not a recipe). The recipe leaves num_learners at its
    # default, 0 (AlgorithmConfig.__init__): the learner is local, in the driver process, on its GPU.
    # One EnvRunner (the recipe's num_rollout_workers=1, new API stack: num_env_runners): DQN's
    # training_step runs one sample round, then one update (dqn.py: calculate_rr_weights returns [1, 1]
    # without training_intensity), so replay_ratio = 32 sampled / 4 inserted = 8 holds for one runner
    # only; runners_per_gpu would place one per GPU (8 on dgx-a100) and, with this ratio, 8 updates per
    # round where RLlib runs one.
    "dqn": _atari(
        "dqn",
        "dqn",
        env_runners=1,
        envs_per_runner=1,
        fragment_length=4,
        learners=1,
        local_learner=True,
        bytes_per_step=ATARI_FRAME_BYTES,
        frame_stack=4,
        env_step_time=0.25e-3,
        inference_time=0.5e-3,
        runner_call_overhead=4e-3,
        episode_length=1000,
        update_time_per_sample=25e-6,
        update_overhead=1.5e-3,
        batch_size=32,
        replay_ratio=8.0,
        replay_capacity=1_000_000,
        min_size=8_192,
        weight_sync_time=2.4e-3,
        steps_per_train=1,
    ),
    "ppo-mujoco": Workload(
        name="ppo-mujoco",
        algorithm="ppo",
        envs_per_runner=8,
        fragment_length=256,
        bytes_per_step=4 * (17 + 6 + 4),
        env_step_time=0.4e-3,
        inference_time=0.3e-3,
        episode_length=1000,
        train_batch_per_learner=4096,
        update_time_per_sample=4e-6,
        value_pass_per_sample=1e-6,
        advantage_per_sample=ADVANTAGE_PER_SAMPLE,
        epochs=10,
        weight_sync_time=2e-3,
    ),
    # GRPO post-training: a chunk is a group of sampled completions, sequences x 8,192 tokens (long chains of thought);
    # per token: token id (4 B), log-prob (4 B), reference log-prob (4 B), mask (1 B), advantage
    # slot (4 B) = 17 B/token. One "env step" is one token; decoding ~30 ms per step for a batch of
    # 128 sequences on an H100-class GPU (vLLM-style throughput for a 7B model, our estimate). Few
    # actors: one generator per node (runners_per_gpu = 1/8), 128 x 8,192 tokens = 17.8 MB per chunk.
    "grpo-llm": Workload(
        name="grpo-llm",
        algorithm="ppo",
        envs_per_runner=128,
        fragment_length=8192,
        runners_per_gpu=0.125,
        bytes_per_step=17.0,
        env_step_time=0.0,
        env_step_cv=0.0,
        inference_time=30e-3,
        episode_length=8192,
        steps_per_row=8192,
        train_batch_per_learner=128 * 8192,
        update_time_per_sample=2e-6,
        value_pass_per_sample=0.7e-6,  # the reference log-prob pass; advantage_per_sample stays 0: GRPO's
        epochs=1,                      # advantages are one normalisation per group of sequences, no per-token GAE
        weight_sync_time=0.5,
    ),
    # The reference runs (shared/reference/rllib-2.60-stock-cpu.md) on the 2-core VM, CPU learner.
    # IN-SAMPLE: these copy measured segments of those runs (see the module docstring); never use them
    # to validate the simulator (studies/validation.py does not).
    "ref-ppo-atari": Workload(
        name="ref-ppo-atari",
        algorithm="ppo",
        env_runners=2,
        envs_per_runner=1,
        fragment_length=1000,
        train_batch_per_learner=2000,
        learners=1,
        env_step_time=1.382e-3,
        env_step_cv=0.0,
        inference_time=0.0,
        episode_length=200,
        update_time_per_sample=0.776e-3,
        value_pass_per_sample=0.755e-3,
        epochs=2,
        weight_sync_time=7.3e-3,
    ),
    "ref-dqn-cartpole": Workload(
        name="ref-dqn-cartpole",
        algorithm="dqn",
        env_runners=1,
        envs_per_runner=1,
        fragment_length=1,
        bytes_per_step=2800.0,
        env_step_time=0.3e-3,
        env_step_cv=0.0,
        inference_time=0.0,
        runner_call_overhead=4.055e-3,
        episode_length=1.0,
        learners=1,
        local_learner=True,
        update_time_per_sample=0.0,
        update_overhead=3.053e-3,
        batch_size=32,
        replay_ratio=32.0,
        replay_capacity=50_000,
        min_size=0,
        weight_sync_time=2.192e-3,
    ),
}
# ref-ppo-atari: one 1,000-step fragment per runner takes the measured 1.382 s of sampling, so
# env_step_time holds the whole per-step cost (env + CPU inference): 1.382 s / 1000 steps.
# ref-dqn-cartpole: per env step of the ~1,082-step iterations: sampling 4.355 ms (call overhead +
# step), update 3.053 ms, weight sync 2.192 ms, a local learner (num_learners=0), one update per step.
# Both copy whole measured calls, cold-call costs included: conduit.sim.calibration.compare simulates them with
# the cold-call law off (the built-in costs' law would count those costs twice).


def load_workload(spec: str | Path | Mapping[str, Any] | Workload) -> Workload:
    """A preset name, a YAML path (``base:`` preset plus overrides), or a mapping."""
    if isinstance(spec, Workload):
        return spec.validate(spec.name)
    if isinstance(spec, Mapping):
        return workload_from_dict(spec, "<dict>")
    text = str(spec)
    if text in PRESETS:
        return PRESETS[text]
    path = Path(text)
    if not path.is_file():
        if path.suffix in (".yaml", ".yml"):
            raise WorkloadError(text, None, "no such file")
        raise UnknownNameError("workload", text, list(PRESETS))
    from conduit.topology.yamlio import read_yaml

    try:
        data = read_yaml(path)
    except ConduitError as exc:  # TopologyError from the shared YAML reader
        raise WorkloadError(text, None, getattr(exc, "detail", str(exc))) from None
    return workload_from_dict(data, text)


def workload_from_dict(data: Any, source: str) -> Workload:
    if not isinstance(data, Mapping):
        raise WorkloadError(source, None, f"top level must be a mapping, got {type(data).__name__}")
    base_name = data.get("base")
    if base_name is not None and (not isinstance(base_name, str) or base_name not in PRESETS):
        raise WorkloadError(source, "base", f"unknown preset {shown(base_name)}; presets: {', '.join(PRESETS)}")
    base = PRESETS[base_name] if base_name else None
    known = {f.name: f for f in fields(Workload)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "base":
            continue
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise WorkloadError(source, shown(key) if not isinstance(key, str) else key,
                                f"unknown field; {hint}known: {', '.join(sorted(known))}")
        if key in _TIME_FIELDS or key in _BYTE_FIELDS:
            try:
                value = parse_quantity(value, Kind.TIME if key in _TIME_FIELDS else Kind.BYTES)
            except ConduitError as exc:
                raise WorkloadError(source, key, str(exc)) from None
        values[key] = value
    if base is None:
        for required in ("name", "algorithm"):
            if required not in values:
                raise WorkloadError(source, required, "missing (or give 'base: <preset>')")
        workload = Workload(**values)
    else:
        values.setdefault("name", Path(source).stem if source != "<dict>" else f"{base.name}-custom")
        workload = replace(base, **values)
    return workload.validate(source)


for _preset in PRESETS.values():
    _preset.validate(f"preset {_preset.name}")
