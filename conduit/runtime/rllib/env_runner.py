"""The EnvRunner side: experience goes from the EnvRunner straight into Conduit's placement.

:func:`conduit_env_runner_class` subclasses the config's EnvRunner class (``env_runner_cls``, a
public extension point). Its ``sample()`` runs the stock sampler, packs what it returns into a chunk
(:mod:`conduit.runtime.rllib.layout`) and sends it to the plane of the learner's node with one
asynchronous call; the episodes never travel to the driver. What it returns instead:

* PPO: one zero-step *ticket* episode (PPO's ``training_step`` skips the update when the EnvRunners
  return nothing, so they return a placeholder with the chunk ids);
* APPO, IMPALA, DQN, SAC: nothing (their training loops count steps from the EnvRunner metrics).

Episode metrics, step counters and callbacks are the stock sampler's (they are computed before
``sample()`` returns). Evaluation EnvRunners (``config.in_evaluation``) are left alone.

For PPO a sample call is streamed in sub-chunks of ``plan.chunk_steps``: ``sample()`` calls the stock
sampler repeatedly for the same total number of steps. Each call cuts ongoing episodes; the
learner joins the pieces again by episode id, so the train batch is the one stock RLlib builds,
while the learner already works on the first sub-chunks as the later ones are sampled.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, ClassVar

from conduit.errors import ConduitError
from conduit.runtime.rllib.layout import TRAJECTORY, pack_trajectories, pack_transitions
from conduit.runtime.rllib.plan import Plan

TICKET_KEY = "conduit_ticket"
MAX_IN_FLIGHT = 16  # unacknowledged chunks per EnvRunner before sample() waits for the plane


class ConduitEnvRunnerMixin:
    """Mixed in front of the config's EnvRunner class by :func:`conduit_env_runner_class`."""

    conduit_plan: ClassVar[Plan]
    _conduit_env_runner = True

    def conduit_attach(self, cluster: Any, schema: Any, learner: str) -> None:
        """Called by the driver's callback once the plane runs: where this runner's chunks go."""
        self._cd_cluster = cluster
        self._cd_schema = schema
        self._cd_learner = learner
        self._cd_seq = itertools.count()
        self._cd_in_flight: list[Any] = []
        self._cd_steps = 0

    def sample(self, *, num_timesteps: int | None = None, num_episodes: int | None = None, explore: bool | None = None,
               random_actions: bool = False, force_reset: bool = False) -> list:
        if getattr(self.config, "in_evaluation", False):
            return super().sample(num_timesteps=num_timesteps, num_episodes=num_episodes, explore=explore,
                                  random_actions=random_actions, force_reset=force_reset)
        if getattr(self, "_cd_cluster", None) is None:
            raise ConduitError("this EnvRunner was built by conduit.runtime.rllib.enable() but never attached to a "
                               "plane: build the algorithm with config.build_algo() so the Conduit callback runs")
        plan = self.conduit_plan
        ids: list[Any] = []
        steps = 0
        kw = {"explore": explore, "random_actions": random_actions}
        if plan.chunk_steps and num_episodes is None:
            total = num_timesteps or self.config.get_rollout_fragment_length(self.worker_index) * self.num_envs
            first = True
            while steps < total:
                n = min(plan.chunk_steps, total - steps)
                episodes = super().sample(num_timesteps=n, force_reset=force_reset and first, **kw)
                first = False
                steps += self._cd_push(episodes, ids)
        else:
            episodes = super().sample(num_timesteps=num_timesteps, num_episodes=num_episodes,
                                      force_reset=force_reset, **kw)
            steps += self._cd_push(episodes, ids)
        self._cd_check()
        if not plan.returns_ticket:
            return []
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode

        ticket = SingleAgentEpisode()
        ticket.custom_data[TICKET_KEY] = {"runner": self.worker_index, "steps": steps, "chunks": ids,
                                          "version": int(self._weights_seq_no)}
        return [ticket]

    def _cd_push(self, episodes: list, ids: list) -> int:
        plan = self.conduit_plan
        version = int(self._weights_seq_no)
        if plan.layout == TRAJECTORY:
            payload, annotation = pack_trajectories(episodes, self._cd_schema, version)
        else:
            payload, annotation = pack_transitions(episodes, self._cd_schema, plan.n_step, plan.gamma), None
        if not payload:
            return 0
        steps = len(payload["obs"])
        cid = f"r{self.worker_index}-{next(self._cd_seq)}"
        ref = self._cd_cluster.ingest_async(payload, policy_version=version, chunk_id=cid,
                                            producer=f"env_runner{self.worker_index}", learner=self._cd_learner,
                                            t_created=time.time(), annotation=annotation)
        self._cd_in_flight.append(ref)
        ids.append(cid)
        self._cd_steps += steps
        if len(self._cd_in_flight) > MAX_IN_FLIGHT:
            self._cd_check(leave=MAX_IN_FLIGHT)
        return steps

    def _cd_check(self, *, leave: int | None = None) -> None:
        """Collect acknowledged chunks; with ``leave``, wait until at most that many are unacknowledged.

        A refused chunk (schema, capacity, a full plane) raises here, on the EnvRunner, with the
        plane's message."""
        import ray

        refs = self._cd_in_flight
        if not refs:
            return
        if leave is None:
            ready, rest = ray.wait(refs, num_returns=len(refs), timeout=0)
        elif len(refs) > leave:
            ready, rest = ray.wait(refs, num_returns=len(refs) - leave)
        else:
            return
        self._cd_in_flight = rest
        if ready:
            ray.get(ready)

    def conduit_flush(self) -> int:
        """Wait until every chunk this runner sent is in the plane; returns the steps sent so far."""
        self._cd_check(leave=0)
        return self._cd_steps


def conduit_env_runner_class(base: type, plan: Plan) -> type:
    """``Conduit<Base>``: ``base`` (an EnvRunner class) whose ``sample()`` feeds Conduit."""
    if getattr(base, "_conduit_env_runner", False):
        base = base.__bases__[1]  # re-enabling: wrap the original class again, with the new plan
    name = f"Conduit{base.__name__}"
    return type(name, (ConduitEnvRunnerMixin, base), {"__module__": __name__, "__qualname__": name,
                                                       "conduit_plan": plan})
