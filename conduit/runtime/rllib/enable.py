"""``enable(config, **options)``: one call around an RLlib ``AlgorithmConfig`` routes its experience through Conduit.

Only RLlib's public extension points are used (nothing of RLlib is patched or copied):

* ``config.env_runners(env_runner_cls=...)``: :mod:`conduit.runtime.rllib.env_runner`;
* ``config.learners(learner_class=...)``: :mod:`conduit.runtime.rllib.learner` (and, inside its
  ``build``, the learner-connector pipeline's public ``remove``/``insert_after`` for PPO's streamed
  value pass);
* ``config.callbacks(...)``: :mod:`conduit.runtime.rllib.callbacks`;
* DQN/SAC: ``replay_buffer_config={"type": "<import path>"}``: :mod:`conduit.runtime.rllib.replay_buffer`;
* SAC: a ``SACConfig`` subclass (:class:`ConduitSACConfig`) whose ``validate()`` accepts that buffer
  (stock SAC only accepts its four built-in buffer names).

Everything that depends on the algorithm (contract, layout, batch size) is decided here by
:func:`~conduit.runtime.rllib.plan.make_plan`, so a config Conduit cannot run faithfully is refused
now, with an :class:`~conduit.runtime.rllib.plan.EnableError` naming the setting.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from typing import Any

from conduit.errors import ConduitError
from conduit.runtime.rllib.callbacks import ConduitCallback
from conduit.runtime.rllib.env_runner import conduit_env_runner_class
from conduit.runtime.rllib.learner import conduit_learner_class
from conduit.runtime.rllib.plan import ORIGINAL_TYPE, REPLAY, EnableError, make_plan
from conduit.runtime.rllib.replay_buffer import IMPORT_PATH

OPTIONS: dict[str, str] = {
    "policy": "placement and scheduling policy: a registered name (default 'conduit') or a Policy object",
    "params": "parameters for a policy given by name",
    "params_file": "a tuned-parameter file written by `conduit tune` for that policy",
    "capacities": "bytes of each tier the plane takes, e.g. {'dram0:pageable': '8 GiB'}",
    "topology": "topology of the learner's node (a Topology, YAML path or mapping; default: probe it)",
    "prefetch_depth": "batches assembled ahead of the learner (default 1; DQN/SAC 2 with a uniform buffer, 1 with a "
                      "prioritized one, so each draw sees the previous update's priorities)",
    "chunk_steps": "PPO: env steps per sub-chunk an EnvRunner streams while it samples",
    "value_pass": "PPO: 'per_chunk' (default: value-function pass as chunks arrive) or 'batch' (stock timing)",
    "max_lag": "APPO/IMPALA: the BoundedStaleness bound in learner updates (default: from the config's queues)",
    "coalesce_s": "DQN/SAC: an EnvRunner gathers its samples for up to this many seconds into one chunk (0.1)",
    "delivery_timeout": "seconds a learner waits for its batch before DeliveryTimeout (default 600)",
    "ingest_timeout": "seconds a chunk may wait for room in the plane before PlaneFullError (default 120)",
    "inline_bytes": "chunks smaller than this travel inside the call, not through the object store (256 KiB)",
    "verify_checksums": "check every delivered chunk's bytes against its ingest checksum (default False)",
    "max_restarts": "times Ray restarts a plane actor whose process died (default 3; 0: never, -1: no limit)",
    "restart_timeout": "seconds a caller waits for a restarted plane actor to answer (default 120)",
    "call_timeout": "seconds a plane actor may take to answer a call (a control call, or its answer past the "
                    "call's own timeout) before PlaneCallTimeout (default 120)",
    "audit_window": "retired chunks the live audit remembers to classify late events exactly (default 65,536): "
                    "bounds the plane's memory for chunks that left it",
    "metrics_export_s": "seconds between publications of the plane's counters through ray.util.metrics "
                        "(default 10; 0: off)",
}


def _check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise EnableError(f"enable(): unknown option(s) {unknown}; options are {sorted(OPTIONS)}")
    out = dict(options)
    policy = out.get("policy", "conduit")
    if isinstance(policy, str):
        pf = out.get("params_file")
        if pf is not None and not os.path.exists(pf):
            raise EnableError(f"enable(): params_file {os.fspath(pf)!r}: no such file")
        from conduit.registry import create_policy
        from conduit.tuning_file import resolve_params

        try:
            create_policy(policy, **resolve_params(policy, dict(out.get("params") or {}), out.get("params_file")))
        except ConduitError as exc:
            raise EnableError(f"enable(): policy={policy!r}: {exc}") from exc
        except TypeError as exc:
            raise EnableError(f"enable(): params for policy {policy!r}: {exc}") from exc
    elif out.get("params") is not None or out.get("params_file") is not None:
        raise EnableError("enable(): params/params_file configure a policy given by name; a Policy object comes "
                          "configured (pass policy='name' with params, or the object alone)")
    elif not hasattr(policy, "placement") or not hasattr(policy, "scheduling"):
        raise EnableError(f"enable(): policy must be a registered name or a conduit Policy, got {policy!r}")
    _check_plane_options(out)
    vp = out.get("value_pass", "per_chunk")
    if vp not in ("per_chunk", "batch"):
        raise EnableError(f"enable(): value_pass must be 'per_chunk' or 'batch', got {vp!r}")
    mr = out.get("max_restarts")
    if mr is not None and (isinstance(mr, bool) or not isinstance(mr, int) or mr < -1):
        raise EnableError(f"enable(): max_restarts must be an integer >= -1 (-1: no limit), got {mr!r}")
    for key in ("delivery_timeout", "ingest_timeout", "restart_timeout", "call_timeout"):
        v = out.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            raise EnableError(f"enable(): {key} must be a positive number of seconds, got {v!r}")
    window = out.get("audit_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
        raise EnableError(f"enable(): audit_window must be a non-negative integer (retired chunks), got {window!r}")
    depth = out.get("prefetch_depth")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise EnableError(f"enable(): prefetch_depth must be a non-negative integer, got {depth!r}")
    return out


def _check_plane_options(out: Mapping[str, Any]) -> None:
    """The plane's own options, checked now rather than when the plane starts inside ``build_algo()``."""
    inline = out.get("inline_bytes")
    if inline is not None and (isinstance(inline, bool) or not isinstance(inline, int) or inline < 0):
        raise EnableError(f"enable(): inline_bytes must be a non-negative integer (bytes), got {inline!r}")
    caps = out.get("capacities")
    if caps is not None:
        if not isinstance(caps, Mapping):
            raise EnableError(f"enable(): capacities must map tier ids or kinds to sizes, got {caps!r}")
        from conduit.runtime.machine import parse_capacity

        for tier, size in caps.items():
            try:
                parse_capacity(str(tier), size)
            except ConduitError as exc:
                raise EnableError(f"enable(): {exc}") from None
    topo = out.get("topology")
    if topo is not None:
        from conduit.runtime.machine import resolve_topology

        try:
            resolve_topology(topo)
        except (ConduitError, OSError, ValueError) as exc:
            raise EnableError(f"enable(): topology={topo!r}: {exc}") from None
    export = out.get("metrics_export_s")
    if export is not None and (isinstance(export, bool) or not isinstance(export, (int, float))
                               or not math.isfinite(export) or export < 0):
        raise EnableError(f"enable(): metrics_export_s must be a finite number of seconds >= 0 (0: off), "
                          f"got {export!r}")
    window = out.get("coalesce_s")
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, float)) or window < 0):
        raise EnableError(f"enable(): coalesce_s must be a non-negative number of seconds, got {window!r}")


@functools.cache
def _conduit_sac_config_class() -> type:
    from ray.rllib.algorithms.sac import SACConfig

    class ConduitSACConfig(SACConfig):
        """``SACConfig`` that accepts Conduit's replay buffer (stock SAC only takes built-in buffer names)."""

        _conduit_config = True

        def validate(self) -> None:
            buf = self.replay_buffer_config
            if buf.get("type") != IMPORT_PATH:
                return super().validate()
            buf["type"] = "EpisodeReplayBuffer"
            try:
                super().validate()
            finally:
                buf["type"] = IMPORT_PATH

    return ConduitSACConfig


def enable(config: Any, **options: Any) -> Any:
    """A copy of ``config`` (PPO, APPO, IMPALA, DQN or SAC; RLlib 2.60 new API stack) whose experience
    path runs through Conduit. ``options``: see :data:`OPTIONS` (``help(conduit.runtime.rllib)``).

    Build and train it as usual (``algo = enable(cfg).build_algo(); algo.train()``); each result has a
    ``"conduit"`` entry with the plane's metrics and live audit. Call
    :func:`conduit.runtime.rllib.shutdown` (``algo``) to end the plane and get the final audit.
    """
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.callbacks.callbacks import RLlibCallback
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    if not isinstance(config, AlgorithmConfig):
        raise EnableError(f"enable(): expected an RLlib AlgorithmConfig, got {type(config).__name__}")
    opts = _check_options(options)
    plan = make_plan(config, opts)
    cfg = config.copy(copy_frozen=False)
    if plan.algorithm == "SAC" and not getattr(type(cfg), "_conduit_config", False):
        cfg.__class__ = _conduit_sac_config_class()
    runner = cfg.env_runner_cls
    if runner is None:  # RLlib's own choice (env_runner_group.py:EnvRunnerGroup.__init__): a recording runner
        if getattr(cfg, "output", None):  # for offline_data(output=...), else the single-agent runner
            from ray.rllib.offline.offline_env_runner import OfflineSingleAgentEnvRunner

            runner = OfflineSingleAgentEnvRunner
        else:
            runner = SingleAgentEnvRunner
    if not issubclass(runner, SingleAgentEnvRunner):
        raise EnableError(f"enable(): env_runner_cls={runner.__name__} is not a SingleAgentEnvRunner; Conduit's "
                          "EnvRunner side extends the single-agent runner")
    cfg.env_runners(env_runner_cls=conduit_env_runner_class(runner, plan))
    cfg.learners(learner_class=conduit_learner_class(cfg.learner_class, plan))
    existing = cfg.callbacks_class
    existing = list(existing) if isinstance(existing, (list, tuple)) else [existing]
    existing = [c for c in existing if c is not None and c is not RLlibCallback and c is not ConduitCallback]
    cfg.callbacks(callbacks_class=[*existing, ConduitCallback] if existing else ConduitCallback)
    if plan.family == REPLAY:
        buf = dict(cfg.replay_buffer_config or {})
        original = buf.get(ORIGINAL_TYPE, buf.get("type", "PrioritizedEpisodeReplayBuffer"))
        cfg.replay_buffer_config = {**buf, "type": IMPORT_PATH, ORIGINAL_TYPE: original}
    return cfg
