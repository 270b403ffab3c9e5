"""The driver's part: start the plane when the algorithm is built, report it in every result.

:class:`ConduitCallback` is added to the config's callbacks by :func:`~conduit.runtime.rllib.enable`.

* ``on_algorithm_init``: reads the spaces from an EnvRunner and the learner's Ray node, builds the
  chunk schema (:mod:`conduit.runtime.rllib.layout`), starts a
  :class:`~conduit.runtime.ray_plane.PlaneCluster` (one plane actor on the learner's node; chunks
  from EnvRunners on other nodes cross through Ray's object store), and hands its (picklable)
  handle to every EnvRunner and to the learner through their groups' public ``foreach_*`` calls.
* ``on_env_runners_recreated``: a restarted EnvRunner is attached again.
* A checkpoint is a cut: ``algo.get_state()`` (so ``save_to_path``, ``save``) first waits until every
  chunk the EnvRunners' sending threads still hold is in the plane (:func:`flush_runners`), so the
  saved table and audit hold everything sampled before the save (without it, chunks in flight at the
  save were in neither the checkpoint nor its audit).
* The plane actor itself is restarted by Ray (``max_restarts``, default 3): every handle stays
  valid, so nothing is handed out again; EnvRunners and the learner notice the restart on their
  next call and repeat it (see *Restarts* in :mod:`conduit.runtime.ray_plane`).
* ``on_train_result``: ``result["conduit"]`` gets the plane's metrics (docs/metrics.md definitions:
  ``exposed_experience_path_s``, ``experience_path_s``, ``iteration_time_s``,
  ``experience_share``, plus counters) and the live audit (``violations`` and what was checked),
  next to RLlib's own numbers.

The plane actors are ended by ``algo.stop()`` (the driver's local EnvRunner calls :func:`stop_plane`,
which also writes ``conduit_final_audit.json`` into the algorithm's log directory) or by
:func:`~conduit.runtime.rllib.shutdown`, which returns the final audit either way.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from conduit.runtime.rllib.layout import TRAJECTORY, trajectory_schema, transition_schema
from conduit.runtime.rllib.plan import Plan

LEARNER_ID = "learner0"
_CLUSTERS: dict[int, Any] = {}  # id(algorithm) -> PlaneCluster (driver process)
_ALGOS: dict[int, Any] = {}  # id(algorithm) -> weakref to it (to detach its learners when the plane stops)
_FINALS: dict[int, dict[str, Any]] = {}  # id(algorithm) -> final audit, once its plane was shut down
FINAL_AUDIT_FILE = "conduit_final_audit.json"


def _values(results: Any) -> list:
    return [r.get() for r in results]


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def plan_of(algorithm: Any) -> Plan:
    plan = getattr(algorithm.config.env_runner_cls, "conduit_plan", None)
    if plan is None:
        raise RuntimeError("ConduitCallback on an algorithm whose config did not go through enable()")
    return plan


def cluster_of(algorithm: Any) -> Any:
    """The running :class:`~conduit.runtime.ray_plane.PlaneCluster` of an algorithm built from ``enable()``."""
    try:
        return _CLUSTERS[id(algorithm)]
    except KeyError:
        raise KeyError("no Conduit plane for this algorithm (not built from enable(), or already shut down)") from None


class ConduitCallback(RLlibCallback):
    """Starts and connects Conduit's plane (``on_algorithm_init``); reports it (``on_train_result``)."""

    def on_algorithm_init(self, *, algorithm: Any, metrics_logger: Any = None, **kwargs: Any) -> None:
        from ray.rllib.core import DEFAULT_MODULE_ID

        from conduit.runtime.ray_plane import LOCAL, PlaneCluster

        plan = plan_of(algorithm)
        spaces = algorithm.env_runner_group.get_spaces()
        obs_space, act_space = spaces[DEFAULT_MODULE_ID]
        lg = algorithm.learner_group
        if plan.layout == TRAJECTORY:
            dim = _values(lg.foreach_learner(
                lambda learner, space=act_space: learner.module[DEFAULT_MODULE_ID]
                .get_exploration_action_dist_cls().required_input_dim(space)))[0]
            schema = trajectory_schema(obs_space, act_space, dim)
        else:
            schema = transition_schema(obs_space, act_space)
        node = LOCAL if lg.is_local else _values(lg.foreach_learner(lambda learner: _node_id()))[0]
        o = plan.options
        cluster = PlaneCluster.start(
            schema, plan.contract, batch_steps=plan.plane_batch_steps, learners={LEARNER_ID: node},
            policy=o.get("policy", "conduit"), params=o.get("params"), params_file=o.get("params_file"),
            capacities=o.get("capacities"), inline_bytes=o.get("inline_bytes", 256 << 10),
            prefetch_depth=o.get("prefetch_depth", 1), topology=o.get("topology"),
            verify_checksums=o.get("verify_checksums", False), ingest_timeout=o.get("ingest_timeout", 120.0),
            max_restarts=o.get("max_restarts", 3), restart_timeout=o.get("restart_timeout", 120.0),
            call_timeout=o.get("call_timeout", 120.0),
            export_interval_s=o.get("metrics_export_s", 10.0), audit_window=o.get("audit_window"))
        _CLUSTERS[id(algorithm)] = cluster
        _ALGOS[id(algorithm)] = weakref.ref(algorithm)
        _FINALS.pop(id(algorithm), None)
        weakref.finalize(algorithm, _forget, id(algorithm))
        self._attach_runners(algorithm.env_runner_group, cluster, schema)
        _values(lg.foreach_learner(
            lambda learner, c=cluster, sp=(obs_space, act_space): learner.conduit_attach(c, LEARNER_ID, sp)))
        algorithm._conduit_schema = schema
        _flush_before_state(algorithm)

    @staticmethod
    def _attach_runners(group: Any, cluster: Any, schema: Any, indices: list[int] | None = None) -> None:
        group.foreach_env_runner(lambda r, c=cluster, s=schema: r.conduit_attach(c, s, LEARNER_ID),
                                 local_env_runner=indices is None, remote_worker_ids=indices)

    def on_env_runners_recreated(self, *, algorithm: Any, env_runner_group: Any, env_runner_indices: list[int],
                                 is_evaluation: bool = False, **kwargs: Any) -> None:
        if not is_evaluation and id(algorithm) in _CLUSTERS:
            self._attach_runners(env_runner_group, _CLUSTERS[id(algorithm)], algorithm._conduit_schema,
                                 list(env_runner_indices))

    def on_train_result(self, *, algorithm: Any, metrics_logger: Any = None, result: dict, **kwargs: Any) -> None:
        cluster = _CLUSTERS.get(id(algorithm))
        if cluster is None:
            return
        result["conduit"] = report(cluster, plan_of(algorithm))


def report(cluster: Any, plan: Plan) -> dict[str, Any]:
    """Conduit's block of a train result: the plane's metrics and the live audit."""
    per_node = cluster.metrics()
    plane = next(iter(per_node.values())) if len(per_node) == 1 else per_node
    audit = cluster.audit()
    return {
        "algorithm": plan.algorithm,
        "contract": plan.contract.to_dict() if hasattr(plan.contract, "to_dict") else repr(plan.contract),
        "batch_steps": plan.batch_steps,
        "metrics": plane,
        "audit": audit,
        "violations": int(audit.get("violations", 0)),
    }


def flush_runners(algorithm: Any) -> None:
    """Wait until every chunk the algorithm's EnvRunners have sent is in the plane (each runner's
    ``conduit_flush``; a chunk the plane refused is raised here)."""
    algorithm.env_runner_group.foreach_env_runner(lambda r: r.conduit_flush(), local_env_runner=True)


def _flush_before_state(algorithm: Any) -> None:
    """Make ``algorithm.get_state`` flush the runners first (see the module doc). The wrapper holds the
    algorithm weakly, so the plane's finalizer still runs when the algorithm is dropped."""
    ref = weakref.ref(algorithm)
    cls_get_state = type(algorithm).get_state

    def get_state(*args: Any, **kwargs: Any) -> dict[str, Any]:
        algo = ref()
        if algo is None:
            raise ReferenceError("the algorithm is gone")
        if id(algo) in _CLUSTERS:
            flush_runners(algo)
        return cls_get_state(algo, *args, **kwargs)

    get_state.__doc__ = cls_get_state.__doc__
    algorithm.get_state = get_state


def _forget(key: int) -> None:
    for table in (_CLUSTERS, _ALGOS, _FINALS):
        table.pop(key, None)


def shutdown(algorithm: Any, timeout: float = 60.0) -> dict[str, Any] | None:
    """End the algorithm's plane actors; returns the final merged audit (None if there was no plane).

    ``algo.stop()`` does this too (through the driver's local EnvRunner); afterwards this returns
    the final audit it recorded."""
    key = id(algorithm)
    if key not in _CLUSTERS:
        return _FINALS.get(key)
    return _stop_plane(key, timeout)


def stop_plane(cluster: Any, timeout: float = 60.0) -> dict[str, Any] | None:
    """``algo.stop()``: the driver's local EnvRunner ends the plane it was attached to (see :func:`shutdown`)."""
    key = next((k for k, c in _CLUSTERS.items() if c is cluster), None)
    return None if key is None else _stop_plane(key, timeout)


def _stop_plane(key: int, timeout: float) -> dict[str, Any]:
    """Detach the learners, close the planes (final audit), end their actors; the final audit is kept
    for :func:`shutdown` and written to ``conduit_final_audit.json`` in the algorithm's log directory
    (under Tune: the trial's directory)."""
    import json
    import logging
    import os

    cluster = _CLUSTERS.pop(key)
    ref = _ALGOS.get(key)
    algorithm = ref() if ref is not None else None
    if algorithm is not None:
        with contextlib.suppress(Exception):  # the learners may already be gone; the plane still closes
            algorithm.learner_group.foreach_learner(lambda learner: learner.conduit_detach())
    final = cluster.shutdown(timeout=timeout)
    _FINALS[key] = final
    logdir = getattr(algorithm, "logdir", None) if algorithm is not None else None
    if logdir and os.path.isdir(logdir):
        try:
            with open(os.path.join(logdir, FINAL_AUDIT_FILE), "w") as f:
                json.dump(final, f, indent=1, default=str)
        except OSError as exc:
            logging.getLogger("conduit.runtime.rllib").warning("could not write the final audit to %s: %r",
                                                               logdir, exc)
    return final
