"""What Conduit does for one RLlib algorithm config: the contract, the layout and the batch size.

:func:`make_plan` reads an ``AlgorithmConfig`` (RLlib 2.60, new API stack) and decides, before any
actor starts, everything that depends on the algorithm. All refusals happen here, so a bad
combination fails at :func:`~conduit.runtime.rllib.enable` time with a message naming the setting,
not deep inside a training run.

**Families.**

* ``on_policy`` (PPO): contract ``OnPolicy``. The train batch of iteration *k* is exactly the
  version-*k* steps the EnvRunners sample in one synchronous round: ``rollout_fragment_length x
  num_envs_per_env_runner`` per runner, summed over runners, times the rounds RLlib needs to reach
  ``train_batch_size``. EnvRunners stream each sample call to the plane in sub-chunks of
  ``chunk_steps`` while they sample, so the learner can work on them (the value-function pass)
  while the rest is still being sampled: PPO's value function of version *k* is fixed while
  iteration *k* samples.
* ``async`` (APPO, IMPALA): contract ``BoundedStaleness(max_lag, max_reuse)``. A learner batch is the
  whole number of sample calls RLlib packages per update (``ceil(train_batch_size_per_learner /
  (rollout_fragment_length x num_envs))`` of them). ``max_reuse`` is APPO's
  ``circular_buffer_iterations_per_batch`` (1 for IMPALA or without the circular buffer);
  ``max_lag``, in learner updates, is the most RLlib's own queues can hold between a sample and its
  use (the runner requests in flight, the learner's in-flight updates and queue or circular
  buffer, each batch trained ``max_reuse`` times) - RLlib never drops for staleness, so neither
  does Conduit within that bound.
* ``replay`` (DQN, SAC): contract ``Replay(capacity, replay_ratio, min_size)``. ``capacity`` is the
  replay buffer's, ``min_size`` is ``num_steps_sampled_before_learning_starts`` less the steps the
  EnvRunners hold back for their n-step windows (``(n_step - 1)`` per env), ``replay_ratio``
  is sampled steps per inserted step as RLlib's training loop runs it (``calculate_rr_weights``).
  The contract's sampler is the config's buffer (:func:`replay_sampler`): ``EpisodeReplayBuffer``
  samples uniformly, ``PrioritizedEpisodeReplayBuffer`` (DQN's and SAC's default) by priority with
  its ``alpha`` and ``beta``; any other buffer, and any buffer setting Conduit does not implement,
  is refused here, naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from conduit.contracts import BoundedStaleness, Contract, OnPolicy, Prioritized, Replay
from conduit.deploy_settings import policy_depth, prefetch_depth, stream_chunk_steps, target_chunk_bytes
from conduit.errors import ConduitError
from conduit.runtime.rllib.layout import TRAJECTORY, TRANSITION

ON_POLICY = "on_policy"
ASYNC = "async"
REPLAY = "replay"


class EnableError(ConduitError, ValueError):
    """``enable()`` refused a config or an option; the message names the setting to change."""


@dataclass(frozen=True)
class Plan:
    """Everything Conduit decided for one algorithm config (picklable; travels with the classes)."""

    algorithm: str
    family: str
    layout: str
    contract: Contract
    batch_steps: int
    chunk_steps: int | None  # on_policy: sub-chunk size a runner streams while it samples
    n_step: int = 1
    gamma: float = 0.99
    batch_slack: int = 0  # on_policy: steps a round may sample beyond batch_steps (vectorized envs)
    options: dict[str, Any] = field(default_factory=dict)
    #: on_policy: the policy's given target_chunk_bytes (None: not given, or chunk_steps/recording decide)
    target_chunk_bytes: float | None = None

    def stream_chunk_steps(self, fragment_steps: int, num_envs: int, bytes_per_step: float) -> int:
        """On-policy: env steps per sub-chunk for a sample call of ``fragment_steps`` whose steps take
        ``bytes_per_step`` in the layout (:func:`conduit.deploy_settings.stream_chunk_steps`, the function
        the simulator's deployed model uses too): the policy's given ``target_chunk_bytes`` when there is
        one, else :attr:`chunk_steps` (the ``chunk_steps`` option, a whole fragment when recording, or
        enable()'s default of an eighth of the smallest fragment)."""
        if self.target_chunk_bytes is None or self.chunk_steps is None:
            return int(self.chunk_steps or fragment_steps)
        return stream_chunk_steps(fragment_steps, num_envs, bytes_per_step, self.target_chunk_bytes)

    @property
    def plane_batch_steps(self) -> int:
        """The plane's batch size: the most one batch can hold. On-policy rounds with vectorized envs
        vary in size, so the learner announces each batch's exact size (``size_batch``) from the
        EnvRunners' tickets."""
        return self.batch_steps + self.batch_slack

    @property
    def returns_ticket(self) -> bool:
        """PPO skips training when its EnvRunners return no episodes: it gets one zero-step ticket."""
        return self.family == ON_POLICY


def _algorithm_name(config: Any) -> str:
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.algorithms.sac import SACConfig

    for cls, name in ((APPOConfig, "APPO"), (IMPALAConfig, "IMPALA"), (PPOConfig, "PPO"), (SACConfig, "SAC"),
                      (DQNConfig, "DQN")):
        if isinstance(config, cls):
            exact = type(config) is cls or getattr(type(config), "_conduit_config", False)
            algo = getattr(config, "algo_class", None)
            algo_name = getattr(algo, "__name__", name) if isinstance(algo, type) else name
            if not exact and algo_name.upper() not in {name, f"CONDUIT{name}"}:
                break  # a derived algorithm (e.g. CQL from SAC): its experience path is not ours to change
            return name
    what = getattr(getattr(config, "algo_class", None), "__name__", None) or type(config).__name__
    raise EnableError(f"enable(): algorithm {what} is not supported; Conduit integrates PPO, APPO, IMPALA, DQN and SAC")


def _fragment_steps(config: Any, runners: int) -> list[int]:
    """Env steps one ``sample()`` call returns, per EnvRunner (index 0 = the local runner)."""
    envs = max(1, int(config.num_envs_per_env_runner))
    indices = range(1, runners + 1) if runners > 0 else [0]
    return [int(config.get_rollout_fragment_length(i)) * envs for i in indices]


def _check_common(config: Any, name: str) -> None:
    if not (getattr(config, "enable_rl_module_and_learner", False) and
            getattr(config, "enable_env_runner_and_connector_v2", False)):
        raise EnableError(f"enable(): {name} is on RLlib's old API stack; Conduit needs the new one "
                          "(config.api_stack(enable_rl_module_and_learner=True, "
                          "enable_env_runner_and_connector_v2=True), the default in RLlib 2.60)")
    if getattr(config, "is_multi_agent", False):
        raise EnableError("enable(): multi-agent configs are not supported yet (config.multi_agent(...) is set)")
    if getattr(config, "input_", "sampler") != "sampler":
        raise EnableError(f"enable(): offline input (config.offline_data(input_={config.input_!r})) has no "
                          "EnvRunner experience path for Conduit to take over")
    if int(config.num_learners or 0) > 1:
        raise EnableError(f"enable(): num_learners={config.num_learners}: this version of the integration "
                          "drives one learner (local or remote); use num_learners=0 or 1")
    model = dict(getattr(config, "model_config", None) or {})
    if model.get("use_lstm") or model.get("use_attention"):
        raise EnableError("enable(): recurrent modules (model_config use_lstm/use_attention) are not supported yet")
    spec = getattr(config, "_rl_module_spec", None)
    module_class = getattr(spec, "module_class", None)
    if isinstance(module_class, type):
        initial_state = getattr(module_class, "get_initial_state", None)
        owner = getattr(initial_state, "__module__", "") or ""
        if initial_state is not None and not owner.startswith(("ray.rllib.core.", "ray.rllib.algorithms.")):
            # RLlib's default modules define it too (empty unless use_lstm, checked above); a custom
            # module that defines it carries a recurrent state the trajectory layout does not.
            raise EnableError(f"enable(): rl_module(rl_module_spec=...) module_class={module_class.__name__} defines "
                              "get_initial_state (a stateful module); stateful modules are not supported yet")
    learner_connector = getattr(config, "_learner_connector", None)
    learner_connector = getattr(learner_connector, "user_factory", learner_connector)  # instrument()'s entry piece
    if learner_connector is not None:
        # RLlib cuts an ongoing episode with `episode_lookback_horizon` steps of lookback
        # (single_agent_env_runner.py:_sample, eps.cut(len_lookback_buffer=...)), and custom pieces
        # such as FrameStackingLearner read it; the episodes Conduit rebuilds have no lookback, so
        # such a piece would silently see other data than under stock RLlib.
        raise EnableError("enable(): training(learner_connector=...) adds custom learner-connector pieces, which may "
                          "read an episode's lookback buffer (e.g. RLlib's FrameStackingLearner); the episodes "
                          "Conduit rebuilds on the learner do not carry it yet. Remove learner_connector (RLlib's "
                          "default pieces are supported)")


def _given_policy_params(options: dict[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
    """The policy parameters the user gave (``params``, ``params_file``; a Policy object's ``given``)
    and their names: only these change the deployment (:mod:`conduit.deploy_settings`)."""
    policy = options.get("policy", "conduit")
    if not isinstance(policy, str):
        return dict(getattr(policy, "params", {}) or {}), frozenset(getattr(policy, "given", frozenset()))
    from conduit.tuning_file import resolve_params

    params = resolve_params(policy, dict(options.get("params") or {}), options.get("params_file"))
    return params, frozenset(params)


def make_plan(config: Any, options: dict[str, Any]) -> Plan:
    """The plan for ``config``; raises :class:`EnableError` for what Conduit cannot run faithfully."""
    name = _algorithm_name(config)
    _check_common(config, name)
    runners = int(config.num_env_runners or 0)
    frags = _fragment_steps(config, runners)
    for key, owners in (("chunk_steps", ("PPO",)), ("max_lag", ("APPO", "IMPALA"))):
        if options.get(key) is not None and name not in owners:
            raise EnableError(f"enable(): option {key}= applies to {'/'.join(owners)}, not {name}")
    # the policy parameters the user gave, read once (a params_file is read here, not once per setting)
    given = _given_policy_params(options)
    if name == "PPO":
        if config.batch_mode != "truncate_episodes":
            raise EnableError(f"enable(): PPO with batch_mode={config.batch_mode!r} samples a variable number of "
                              "steps per iteration; Conduit's OnPolicy batches need batch_mode='truncate_episodes'")
        per_round = sum(frags)
        rounds = max(1, math.ceil(int(config.total_train_batch_size) / per_round))
        chunk = options.get("chunk_steps")
        smallest = min(frags)
        envs = max(1, int(config.num_envs_per_env_runner))
        recording = bool(getattr(config, "output", None))
        if recording and chunk is not None and chunk < smallest:
            raise EnableError(f"enable(): chunk_steps={chunk} with offline_data(output=...): RLlib records each "
                              "sample() call's episodes, and sub-chunks would cut the recorded episodes more often "
                              f"than stock; leave chunk_steps unset (a whole fragment, {smallest} steps, is streamed)")
        target = None
        if chunk is None:
            # recording (output=...): one chunk per sample call, so the recorded episodes are cut as in stock RLlib
            chunk = smallest if recording else stream_chunk_steps(smallest, envs)
            # a given target_chunk_bytes sizes the sub-chunks once the EnvRunner knows its bytes per step
            target = None if recording else target_chunk_bytes(*given)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0 or chunk % envs:
            raise EnableError(f"enable(): chunk_steps must be a positive multiple of num_envs_per_env_runner "
                              f"({envs}), got {chunk!r}")
        # RLlib's vectorized envs reset a finished sub-env on the next vector step (gymnasium's
        # NEXT_STEP autoreset), and that step is no env step for the sub-env, so a sample call of n
        # steps returns between n and n + num_envs - 1 (single_agent_env_runner.py:_sample loops
        # `while ts < num_timesteps`, each vector step adding num_envs minus the resetting sub-envs).
        # A round can hold that many more per EnvRunner; the learner sizes each batch exactly.
        slack = rounds * max(1, runners) * (envs - 1)
        options = {**options, "prefetch_depth": prefetch_depth(ON_POLICY, option=options.get("prefetch_depth"),
                                                               depth=policy_depth(*given))}
        return Plan(name, ON_POLICY, TRAJECTORY, OnPolicy(), per_round * rounds, min(chunk, smallest),
                    gamma=float(config.gamma), batch_slack=slack, options=options, target_chunk_bytes=target)
    if name in ("APPO", "IMPALA"):
        if int(getattr(config, "num_aggregator_actors_per_learner", 0) or 0) > 0:
            raise EnableError("enable(): num_aggregator_actors_per_learner > 0 runs the learner connector in "
                              "aggregator actors, which Conduit's delivery replaces; set it to 0")
        if int(config.num_envs_per_env_runner or 1) > 1:
            # A sample call of n steps with vectorized envs returns up to num_envs - 1 more (see the PPO
            # branch); APPO/IMPALA batches are a whole number of sample calls, so their size varies too,
            # and their learner gets no step counts to size the plane's batch with (PPO's tickets do).
            raise EnableError(f"enable(): {name} with num_envs_per_env_runner={config.num_envs_per_env_runner}: "
                              "vectorized sample calls vary in length, and Conduit's BoundedStaleness batches "
                              "cannot follow RLlib's per-call packaging yet; set num_envs_per_env_runner=1 "
                              "(PPO, DQN and SAC take vectorized envs)")
        frag = frags[0]
        if len(set(frags)) > 1:
            raise EnableError(f"enable(): {name} needs the same rollout_fragment_length on every EnvRunner "
                              f"(got {sorted(set(frags))} steps per sample call)")
        per_learner = int(config.train_batch_size_per_learner)
        batch = math.ceil(per_learner / frag) * frag
        reuse = 1
        if name == "APPO" and getattr(config, "use_circular_buffer", True):
            reuse = int(config.circular_buffer_iterations_per_batch)
            queue = int(config.circular_buffer_num_batches)
        else:
            queue = int(getattr(config, "learner_queue_size", 3) or 3)
        in_flight = int(config.max_requests_in_flight_per_env_runner) * max(1, runners) * frag
        lag = reuse * (queue + int(config.max_requests_in_flight_per_learner) + 1 + math.ceil(in_flight / batch)) \
            + int(getattr(config, "broadcast_interval", 1) or 1)
        max_lag = options.get("max_lag")
        if max_lag is None:
            max_lag = lag
        if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0:
            raise EnableError(f"enable(): max_lag must be a non-negative integer (learner updates), got {max_lag!r}")
        options = {**options, "prefetch_depth": prefetch_depth(ASYNC, option=options.get("prefetch_depth"),
                                                               depth=policy_depth(*given))}
        return Plan(name, ASYNC, TRAJECTORY, BoundedStaleness(max_lag=max_lag, max_reuse=reuse), batch, None,
                    gamma=float(config.gamma), options=options)
    # DQN / SAC
    buf = dict(config.replay_buffer_config or {})
    n_step = getattr(config, "n_step", 1)
    if not isinstance(n_step, int) or isinstance(n_step, bool) or n_step < 1:
        raise EnableError(f"enable(): {name} with n_step={n_step!r}: Conduit stores fixed n-step transitions; "
                          "set n_step to a positive integer")
    sampler = replay_sampler(buf, name)
    from ray.rllib.algorithms.dqn.dqn import calculate_rr_weights

    store_w, train_w = calculate_rr_weights(config)
    inserted = store_w * sum(frags)
    batch = int(config.train_batch_size_per_learner)
    ratio = train_w * batch / max(1, inserted)
    capacity = int(buf.get("capacity", 50_000))
    # RLlib starts learning once it has *sampled* this many steps. The plane may have received up to
    # (n_step - 1) steps per env fewer by then (they wait on the EnvRunner for their n-step window), and a
    # synchronous DQN loop samples nothing while its learner waits: so the warm-up must not count them.
    held = (n_step - 1) * max(1, int(config.num_envs_per_env_runner)) * max(1, runners)
    min_size = min(max(0, int(config.num_steps_sampled_before_learning_starts or 0) - held), capacity)
    contract = Replay(capacity=capacity, replay_ratio=ratio, min_size=min_size, sampler=sampler,
                      error_buffer=max(1.0, ratio) * max(min_size, batch, sum(frags) * 4))
    # Two replay batches fetched ahead: a plane round trip can outlast one idle gap of the learner.
    # Prioritized: one, so that each batch is drawn after the previous update's priorities are in (RLlib's
    # order); a deeper prefetch draws that many updates early, with priorities that many updates old.
    # (conduit.deploy_settings.prefetch_depth, shared with the simulator; a given policy depth replaces it)
    depth = prefetch_depth(REPLAY, isinstance(sampler, Prioritized), options.get("prefetch_depth"),
                           policy_depth(*given))
    options = {"coalesce_s": 0.1, **options, "prefetch_depth": depth}
    return Plan(name, REPLAY, TRANSITION, contract, batch, None, n_step=n_step, gamma=float(config.gamma),
                options=options)


ORIGINAL_TYPE = "conduit_original_type"
"""The key under which ``enable()`` keeps the config's own buffer type in ``replay_buffer_config``
(its ``type`` becomes Conduit's driver-side buffer), so that enabling again reads the same sampler."""

_UNIFORM = "EpisodeReplayBuffer"
_PRIORITIZED = "PrioritizedEpisodeReplayBuffer"
_PATHS = {
    "ray.rllib.utils.replay_buffers.episode_replay_buffer.EpisodeReplayBuffer": _UNIFORM,
    "ray.rllib.utils.replay_buffers.EpisodeReplayBuffer": _UNIFORM,
    "ray.rllib.utils.replay_buffers.prioritized_episode_buffer.PrioritizedEpisodeReplayBuffer": _PRIORITIZED,
    "ray.rllib.utils.replay_buffers.PrioritizedEpisodeReplayBuffer": _PRIORITIZED,
}
# Keys of replay_buffer_config that do not change what is sampled, for both buffers: DQN's and SAC's
# training_step pass the batch size and sequence length to sample() (num_items, batch_length_T=0 for
# a stateless module), overriding batch_size_B / batch_length_T; the smoothing window is for metrics.
_NEUTRAL_KEYS = {"type", ORIGINAL_TYPE, "capacity", "batch_size_B", "batch_length_T",
                 "metrics_num_episodes_for_smoothing"}


def replay_sampler(buf: dict[str, Any], name: str) -> str | Prioritized:
    """The Replay sampler a DQN/SAC ``replay_buffer_config`` asks for, or :class:`EnableError`.

    ``EpisodeReplayBuffer``: ``"uniform"`` (its ``sample`` draws timesteps uniformly).
    ``PrioritizedEpisodeReplayBuffer``: :class:`~conduit.contracts.Prioritized` with the config's
    ``alpha`` (the constructor's default, 1.0, if absent) and ``beta`` (required: DQN's and SAC's
    ``training_step`` pass ``replay_buffer_config.get("beta")`` to ``sample()``, whose ``assert
    beta >= 0.0`` fails on None). Any other buffer type, and any key beyond ``capacity``,
    ``alpha``, ``beta`` and the sampling-neutral ``batch_size_B``, ``batch_length_T`` and
    ``metrics_num_episodes_for_smoothing``, is refused, naming it: Conduit does not implement it,
    and would not silently drop it.
    """
    raw = buf.get(ORIGINAL_TYPE, buf.get("type", _PRIORITIZED))
    kind = raw if isinstance(raw, str) else getattr(raw, "__name__", repr(raw))
    if not isinstance(raw, str) and getattr(raw, "__module__", "").startswith("ray.rllib."):
        kind = f"{raw.__module__}.{raw.__name__}"
    kind = _PATHS.get(kind, kind)
    if kind not in (_UNIFORM, _PRIORITIZED):
        raise EnableError(f"enable(): {name} with replay_buffer_config['type']={kind!r}: Conduit's Replay table "
                          f"implements {_UNIFORM!r} (uniform) and {_PRIORITIZED!r} (prioritized) only")
    allowed = _NEUTRAL_KEYS | ({"alpha", "beta"} if kind == _PRIORITIZED else set())
    for key in sorted(buf, key=str):
        if key not in allowed:
            raise EnableError(f"enable(): {name} with replay_buffer_config[{key!r}]: Conduit's {kind} does not "
                              f"implement this setting (it takes {', '.join(sorted(allowed - {ORIGINAL_TYPE}))}); "
                              "remove it")
    if kind == _UNIFORM:
        return "uniform"
    if buf.get("beta") is None:
        raise EnableError(f"enable(): {name} with a {_PRIORITIZED} needs replay_buffer_config['beta'] (RLlib passes "
                          "it to sample() and fails without it)")
    try:
        return Prioritized(alpha=buf.get("alpha", 1.0), beta=buf["beta"])
    except ConduitError as exc:
        raise EnableError(f"enable(): {name} replay_buffer_config: {exc}") from None
