"""The learner side: learners take their batches from Conduit's delivery, not from the driver.

:func:`conduit_learner_class` subclasses the algorithm's Learner class (``learner_class``, a public
extension point). Its ``update()`` ignores the placeholder data the driver passes (PPO's tickets,
APPO's empty episode references, DQN's replay ticket), takes this learner's batch from the plane -
OnPolicy: the batch of its current weights version; BoundedStaleness: its next batch; Replay: a
draw by the contract's sampler, with each row's importance weight in the ``weights`` column that
DQN's and SAC's losses read - rebuilds the episodes RLlib's learner connector expects
(:mod:`conduit.runtime.rllib.layout`), and runs the stock update on them. After the update it tells
the plane the new weights version, which is what OnPolicy and BoundedStaleness enforce.

**Priorities (Replay).** RLlib's DQN/SAC ``training_step`` takes the TD errors the loss logs
(``TD_ERROR_KEY``, one per row) out of the learner results and hands them to its buffer's
``update_priorities`` (``ray/rllib/utils/replay_buffers/utils.py:
update_priorities_in_episode_replay_buffer``). Here the learner itself sends them, with the batch's
sample ids, to the plane (:meth:`~conduit.runtime.ray_plane.PlaneCluster.update_priorities`) as
soon as its update returns, asynchronously; the next fetch waits for that call to land before it
draws, so each batch is drawn with the priorities of every update that finished before its fetch
began (with ``prefetch_depth=1``, the default for a prioritized buffer, that is RLlib's order: batch
*k+1* sees update *k*'s priorities).

For PPO the learner also runs a :class:`~conduit.runtime.rllib.values.ValueStream`: while the
EnvRunners still sample iteration *k*, a background thread reads the chunks that already landed in
batch *k* and runs the value-function forward pass on them (the weights of version *k* do not change
until update *k* starts). The GAE piece of the learner connector is swapped for
:class:`~conduit.runtime.rllib.values.StreamedGAE`, which takes those values instead of running the
pass over the whole batch after sampling; the advantages are computed by RLlib's own code.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, ClassVar

import numpy as np

from conduit.contracts import Prioritized
from conduit.errors import ConduitError
from conduit.runtime.rllib.plan import ON_POLICY, REPLAY, Plan

DATA_ARGS = ("batch", "batches", "batch_refs", "episodes", "episodes_refs", "data_iterators", "training_data")
METRICS_KEY = "conduit"


class ConduitLearnerMixin:
    """Mixed in front of the algorithm's Learner class by :func:`conduit_learner_class`."""

    conduit_plan: ClassVar[Plan]
    _conduit_learner = True

    def conduit_attach(self, cluster: Any, learner: str, spaces: tuple[Any, Any]) -> None:
        """Called by the driver's callback once the plane runs: how this learner gets its batches."""
        from conduit.runtime.rllib.delivery import DirectReplay, Prefetcher, fetch_now

        self._cd_cluster = cluster
        self._cd_id = learner
        self._cd_spaces = spaces
        self._cd_stream = self._cd_prefetch = None
        self._cd_prio_lock = threading.Lock()
        self._cd_prio_refs: list[Any] = []  # priority updates sent, not yet known to have landed
        self._cd_last_ids: np.ndarray | None = None  # the sample ids of the batch being trained on
        plan = self.conduit_plan
        if plan.family == ON_POLICY:
            if plan.options.get("value_pass", "per_chunk") == "per_chunk":
                from conduit.runtime.rllib.values import ValueStream, install_streamed_gae

                if install_streamed_gae(self):
                    self._cd_stream = ValueStream(self, cluster, learner)
        elif (depth := int(plan.options.get("prefetch_depth", 1))) > 0:
            if plan.family == REPLAY:  # the raw batch: DirectReplay decides how it reaches the update
                self._cd_prefetch = Prefetcher(lambda t: self._cd_draw(t), depth=depth)
            else:
                self._cd_prefetch = Prefetcher(
                    lambda t: fetch_now(cluster, learner, plan.layout, spaces, update=None, timeout=t))
        self._cd_direct = DirectReplay() if plan.family == REPLAY else None

    def conduit_detach(self) -> None:
        for part in (getattr(self, "_cd_stream", None), getattr(self, "_cd_prefetch", None)):
            if part is not None:
                part.stop()
        self._cd_stream = self._cd_prefetch = None
        self._cd_cluster = None
        self._cd_direct = None

    def _cd_draw(self, timeout: float) -> Any:
        """Replay: the next draw from the plane, once the priority updates sent so far have landed."""
        self._cd_flush_priorities()
        return self._cd_cluster.next_batch(self._cd_id, timeout=timeout)

    def _cd_flush_priorities(self) -> None:
        with self._cd_prio_lock:
            refs, self._cd_prio_refs = self._cd_prio_refs, []
        if not refs:
            return
        import ray

        try:  # the plane counts updates for samples evicted meanwhile (priority_updates_dropped)
            self._cd_cluster.get(refs)
        except ray.exceptions.RayActorError as exc:
            # sent to a plane that died: the samples they name died with it (memory tiers) or came back
            # under new ids (taken over from NVMe, at the sampler's starting priority): nothing to update
            from ray.rllib.core import ALL_MODULES

            self.metrics.log_value((ALL_MODULES, METRICS_KEY, "priority_updates_lost"), len(refs), reduce="sum")
            logging.getLogger("conduit.runtime.rllib").warning(
                "%d priority updates were lost with a plane restart: %s", len(refs), type(exc).__name__)

    def _cd_send_priorities(self, result: Any) -> None:
        """Replay: this update's TD errors (as RLlib's ``training_step`` collects them) to the plane's sampler."""
        from ray.rllib.core import DEFAULT_MODULE_ID
        from ray.rllib.utils.metrics import TD_ERROR_KEY
        from ray.rllib.utils.numpy import convert_to_numpy

        ids = self._cd_last_ids
        self._cd_last_ids = None
        stats = (result or {}).get(DEFAULT_MODULE_ID, {}).get(TD_ERROR_KEY) if isinstance(result, dict) else None
        if ids is None or stats is None:
            return  # a loss that logs no TD errors: RLlib skips the update too (with a warning)
        values = stats.peek() if hasattr(stats, "peek") else stats
        values = values if isinstance(values, list | tuple) else [values]
        td = np.concatenate([np.asarray(convert_to_numpy(v), np.float64).reshape(-1) for v in values])
        if len(td) != len(ids):
            raise ConduitError(f"the learner logged {len(td)} TD errors for a replay batch of {len(ids)} rows; "
                               "priorities need one per row (RLlib's update_priorities asserts the same)")
        ref = self._cd_cluster.update_priorities_async(self._cd_id, ids, np.abs(td))
        with self._cd_prio_lock:
            self._cd_prio_refs.append(ref)

    # ------------------------------------------------------------------ checkpoints (conduit.runtime.rllib.checkpoint)
    def get_checkpointable_components(self) -> list:
        from conduit.runtime.rllib.checkpoint import COMPONENT, PlaneState

        return [*super().get_checkpointable_components(), (COMPONENT, PlaneState(self))]

    def get_state(self, components: Any = None, *, not_components: Any = None, **kwargs: Any) -> dict:
        from conduit.runtime.rllib.checkpoint import COMPONENT, PlaneState

        state = super().get_state(components, not_components=not_components, **kwargs)
        if getattr(self, "_cd_cluster", None) is not None and components is None and \
                self._check_component(COMPONENT, components, not_components):
            state[COMPONENT] = PlaneState(self).get_state()  # only for a whole-learner state (checkpoints)
        return state

    def set_state(self, state: dict) -> None:
        from conduit.runtime.rllib.checkpoint import COMPONENT

        if COMPONENT in state:
            state = dict(state)
            plane = state.pop(COMPONENT)
            if plane:
                self.conduit_restore(plane)
        super().set_state(state)

    def conduit_restore(self, state: dict) -> None:
        """Load a checkpoint's plane state (:class:`~conduit.runtime.rllib.checkpoint.PlaneState`) into this
        learner's (fresh) plane. Without the Replay table the plane warms up again, and until it has, the
        updates the driver asks for are skipped (counted as ``warmup_skipped_updates``)."""
        import logging

        cluster = getattr(self, "_cd_cluster", None)
        if cluster is None:
            raise ConduitError("a Conduit checkpoint can only be restored into an algorithm built from enable() "
                               "(its learner is attached to a plane)")
        try:
            from conduit.runtime.rllib.checkpoint import TABLE_TIMEOUT_S

            got = cluster.restore(state["planes"], timeout=TABLE_TIMEOUT_S if state.get("table") else None)
        except ConduitError as exc:
            raise ConduitError(f"{exc}. Restore a Conduit checkpoint into a freshly built algorithm "
                               "(Algorithm.from_checkpoint(path), or build_algo() then restore_from_path(path) "
                               "before training)") from exc
        self._cd_rewarm = self.conduit_plan.family == REPLAY and not state.get("table")
        logging.getLogger("conduit.runtime.rllib").info(
            "restored the plane: %d chunks (%d samples) back in the Replay table, %d samples dropped at the "
            "checkpoint%s", got["chunks"], got["samples"], got["dropped"],
            "; the table warms up again" if self._cd_rewarm else "")

    def _cd_training_data(self, version: int, timeout: float) -> Any:
        """This update's data from the plane, as RLlib's ``TrainingData``."""
        from ray.rllib.core.learner.training_data import TrainingData

        from conduit.runtime.rllib.delivery import fetch_now, rebuild

        plan = self.conduit_plan
        if self._cd_stream is not None:
            return TrainingData(episodes=self._cd_stream.episodes_for(version, timeout))
        if self._cd_direct is not None:  # Replay: a raw batch, as a ready train batch once verified
            batch = self._cd_prefetch.get(timeout) if self._cd_prefetch is not None else self._cd_draw(timeout)
            self._cd_last_ids = batch.replay_ids
            direct = self._cd_direct
            if direct.verified:
                return direct.train_data(batch.columns, batch.weights)
            episodes = rebuild(batch, plan.layout, self._cd_spaces)
            if direct.verified is None and not direct.verify(self, batch.columns, batch.weights, episodes):
                from ray.rllib.core import ALL_MODULES

                self.metrics.log_value((ALL_MODULES, METRICS_KEY, "direct_batch_refused"), direct.reason,
                                       reduce="item")
            return TrainingData(episodes=episodes)
        if self._cd_prefetch is not None:
            return TrainingData(episodes=self._cd_prefetch.get(timeout))
        return TrainingData(episodes=fetch_now(self._cd_cluster, self._cd_id, plan.layout, self._cd_spaces,
                                               update=version if plan.family == ON_POLICY else None,
                                               timeout=timeout))

    def update(self, *args: Any, **kwargs: Any) -> Any:
        from ray.rllib.core import ALL_MODULES

        cluster = getattr(self, "_cd_cluster", None)
        if cluster is None:
            raise ConduitError("this Learner was built by conduit.runtime.rllib.enable() but never attached to a "
                               "plane: build the algorithm with config.build_algo() so the Conduit callback runs")
        plan = self.conduit_plan
        if plan.family == ON_POLICY:
            self._cd_size_batch(cluster, kwargs)
        for key in DATA_ARGS:  # the driver's placeholders: the data comes from the plane
            kwargs.pop(key, None)
        if getattr(self, "_cd_rewarm", False):  # restored without the table: the driver's loop does not know
            if cluster.warming_up(self._cd_id):
                self.metrics.log_value((ALL_MODULES, METRICS_KEY, "warmup_skipped_updates"), 1, reduce="sum")
                if kwargs.get("_no_metrics_reduce"):
                    return None
                results = self.metrics.reduce()
                for module_results in results.values():  # no update ran: no TD errors to update priorities with
                    if isinstance(module_results, dict):
                        module_results.pop("td_error", None)
                return results
            self._cd_rewarm = False
        t0 = time.time()
        data = self._cd_training_data(int(self._weights_seq_no), plan.options.get("delivery_timeout", 600.0))
        self.metrics.log_value((ALL_MODULES, METRICS_KEY, "delivery_ms"), (time.time() - t0) * 1e3, window=20)
        if data.episodes is not None and not data.episodes and data.batch is None:
            # OnPolicy after a plane restart: every sample of this update died with the plane. No
            # gradient step; the weights version still advances, as Learner.update does first
            # (ray/rllib/core/learner/learner.py: Learner.update), so sampling and the plane go on.
            self._weights_seq_no += 1
            self.metrics.log_value((ALL_MODULES, METRICS_KEY, "skipped_updates"), 1, reduce="sum")
            cluster.set_policy_version(int(self._weights_seq_no))
            return self.metrics.reduce()
        if self._cd_stream is not None:
            with self._cd_stream.module_lock:  # no value pass of the stream while the weights change
                result = super().update(training_data=data, **kwargs)
        else:
            result = super().update(training_data=data, **kwargs)
        if plan.family == REPLAY and isinstance(plan.contract.sampler, Prioritized):
            self._cd_send_priorities(result)  # before the next fetch is requested: it waits for these to land
        if self._cd_prefetch is not None:
            self._cd_prefetch.request()  # the next batch is fetched while the learner is idle
        if plan.family != REPLAY:
            cluster.set_policy_version(int(self._weights_seq_no))
        return result

    def _cd_size_batch(self, cluster: Any, kwargs: dict[str, Any]) -> None:
        """PPO: tell the plane how many steps this update's batch holds, from the EnvRunners' tickets.

        A round's size varies with vectorized envs (up to ``num_envs - 1`` steps more per sample call,
        see :attr:`Plan.plane_batch_steps`); the tickets the driver passes carry each sample call's
        exact step count, so batch *k* is exactly what round *k* sampled, whole chunks included."""
        plan = self.conduit_plan
        version = int(self._weights_seq_no)
        steps = _ticket_steps(kwargs, version)
        if steps is None:
            if plan.batch_slack:
                raise ConduitError("PPO with num_envs_per_env_runner > 1 samples rounds of varying size; the "
                                   "learner sizes its batch from the EnvRunners' tickets, and this update() got none")
            return
        if not 0 < steps <= plan.plane_batch_steps:
            raise ConduitError(f"the EnvRunners' tickets of update {version} count {steps} steps; a batch holds "
                               f"1 to {plan.plane_batch_steps}")
        cluster.size_batch(self._cd_id, update=version, rows=steps)

    def after_gradient_based_update(self, *, timesteps: Any) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        gae = getattr(self, "_cd_gae", None)
        if gae is not None:  # GAE passes on streamed values, and fallbacks to the full pass (per iteration)
            from ray.rllib.core import ALL_MODULES

            seen = getattr(self, "_cd_gae_seen", {})
            for name, n in gae.counters.items():
                self.metrics.log_value((ALL_MODULES, METRICS_KEY, f"values_{name}"), n - seen.get(name, 0),
                                       reduce="sum")
            self._cd_gae_seen = dict(gae.counters)


def _ticket_steps(kwargs: dict[str, Any], version: int) -> int | None:
    """Env steps the PPO tickets of ``version`` in ``update()``'s data arguments count (None: no ticket)."""
    from conduit.runtime.rllib.env_runner import TICKET_KEY

    data = kwargs.get("training_data")
    if data is not None:
        if data.episodes is None and data.episodes_refs is not None:
            data.solve_refs()
        episodes = data.episodes or []
    else:
        episodes = kwargs.get("episodes") or []
    tickets = [t for e in episodes if (t := getattr(e, "custom_data", {}).get(TICKET_KEY)) is not None]
    if not tickets:
        return None
    return sum(int(t["steps"]) for t in tickets if int(t["version"]) == version)


def conduit_learner_class(base: type | str, plan: Plan) -> type:
    """``Conduit<Base>``: ``base`` (a Learner class or import path) that takes its batches from Conduit."""
    if isinstance(base, str):
        from ray.rllib.utils import deserialize_type

        base = deserialize_type(base, error=True)
    if getattr(base, "_conduit_learner", False):
        base = base.__bases__[1]  # re-enabling: wrap the original class again, with the new plan
    name = f"Conduit{base.__name__}"
    return type(name, (ConduitLearnerMixin, base), {"__module__": __name__, "__qualname__": name,
                                                     "conduit_plan": plan})
