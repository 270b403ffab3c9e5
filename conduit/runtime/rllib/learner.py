"""The learner side: learners take their batches from Conduit's delivery, not from the driver.

:func:`conduit_learner_class` subclasses the algorithm's Learner class (``learner_class``, a public
extension point). Its ``update()`` ignores the placeholder data the driver passes (PPO's tickets,
APPO's empty episode references, DQN's replay ticket), takes this learner's batch from the plane -
OnPolicy: the batch of its current weights version; BoundedStaleness: its next batch; Replay: a
uniform sample - rebuilds the episodes RLlib's learner connector expects
(:mod:`conduit.runtime.rllib.layout`), and runs the stock update on them. After the update it tells
the plane the new weights version, which is what OnPolicy and BoundedStaleness enforce.

For PPO the learner also runs a :class:`~conduit.runtime.rllib.values.ValueStream`: while the
EnvRunners still sample iteration *k*, a background thread reads the chunks that already landed in
batch *k* and runs the value-function forward pass on them (the weights of version *k* do not change
until update *k* starts). The GAE piece of the learner connector is swapped for
:class:`~conduit.runtime.rllib.values.StreamedGAE`, which takes those values instead of running the
pass over the whole batch after sampling; the advantages are computed by RLlib's own code.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

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
        plan = self.conduit_plan
        if plan.family == ON_POLICY:
            if plan.options.get("value_pass", "per_chunk") == "per_chunk":
                from conduit.runtime.rllib.values import ValueStream, install_streamed_gae

                if install_streamed_gae(self):
                    self._cd_stream = ValueStream(self, cluster, learner)
        elif (depth := int(plan.options.get("prefetch_depth", 1))) > 0:
            if plan.family == REPLAY:  # the raw batch: DirectReplay decides how it reaches the update
                self._cd_prefetch = Prefetcher(lambda t: cluster.next_batch(learner, timeout=t), depth=depth)
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

    def _cd_training_data(self, version: int, timeout: float) -> Any:
        """This update's data from the plane, as RLlib's ``TrainingData``."""
        from ray.rllib.core.learner.training_data import TrainingData

        from conduit.runtime.rllib.delivery import fetch_now, rebuild

        plan = self.conduit_plan
        if self._cd_stream is not None:
            return TrainingData(episodes=self._cd_stream.episodes_for(version, timeout))
        if self._cd_direct is not None:  # Replay: a raw batch, as a ready train batch once verified
            batch = self._cd_prefetch.get(timeout) if self._cd_prefetch is not None else \
                self._cd_cluster.next_batch(self._cd_id, timeout=timeout)
            direct = self._cd_direct
            if direct.verified:
                return direct.train_data(batch.columns)
            episodes = rebuild(batch, plan.layout, self._cd_spaces)
            if direct.verified is None and not direct.verify(self, batch.columns, episodes):
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
        t0 = time.time()
        data = self._cd_training_data(int(self._weights_seq_no), plan.options.get("delivery_timeout", 600.0))
        self.metrics.log_value((ALL_MODULES, METRICS_KEY, "delivery_ms"), (time.time() - t0) * 1e3, window=20)
        if self._cd_stream is not None:
            with self._cd_stream.module_lock:  # no value pass of the stream while the weights change
                result = super().update(training_data=data, **kwargs)
        else:
            result = super().update(training_data=data, **kwargs)
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
