"""The replay buffer DQN and SAC build on the driver, given by import path: it holds no data.

DQN's and SAC's ``training_step`` adds the EnvRunners' episodes to a replay buffer on the driver and
samples train batches from it there. Under Conduit the EnvRunners send their transitions straight
to the plane (whose ``Replay`` contract is the buffer: FIFO table, uniform sampling, rate limiter)
and return nothing, and each learner samples its own batch from the plane. The driver's buffer is
therefore only the control path: ``add`` receives empty lists and ``sample`` returns one zero-step
ticket telling the learner to draw ``num_items`` steps, so the training loop - step counting,
``num_steps_sampled_before_learning_starts``, the training intensity, target-network updates,
weight syncs - runs unchanged.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer

from conduit.errors import ConduitError

IMPORT_PATH = "conduit.runtime.rllib.replay_buffer.ConduitEpisodeReplayBuffer"  # RLlib adds its kwargs to "*EpisodeReplayBuffer"
TICKET_KEY = "conduit_replay_ticket"


class _NamedBufferType(type(EpisodeReplayBuffer)):
    """The buffer class's metaclass: ``"EpisodeReplayBuffer" in ConduitEpisodeReplayBuffer`` is True.

    Why: ``AlgorithmConfig.update_from_dict`` (``algorithm_config.py``) turns an import-path buffer
    ``type`` into the class (``deserialize_type``), and ``Algorithm._create_local_replay_buffer_if_necessary``
    (``algorithm.py``) then tests ``"EpisodeReplayBuffer" in type`` as if it were still a string, which
    raises ``TypeError`` for any class. Ray Tune always takes that road (``Tuner`` passes
    ``param_space.to_dict()``, the trial's algorithm rebuilds its config with ``update_from_dict``).
    Answering the substring test on the class name keeps RLlib's own check working, unchanged.
    """

    def __contains__(cls, text: object) -> bool:
        return isinstance(text, str) and text in cls.__name__


class ConduitEpisodeReplayBuffer(EpisodeReplayBuffer, metaclass=_NamedBufferType):
    """The driver-side stand-in for RLlib's episode replay buffer (import path :data:`IMPORT_PATH`)."""

    def __init__(self, capacity: int = 10000, *, batch_size_B: int = 16, batch_length_T: int = 1, **kwargs: Any):
        super().__init__(capacity=capacity, batch_size_B=batch_size_B, batch_length_T=batch_length_T,
                         metrics_num_episodes_for_smoothing=kwargs.get("metrics_num_episodes_for_smoothing", 100))
        self.tickets = 0

    def add(self, episodes: Any) -> None:
        if episodes:  # the EnvRunners send to the plane; episodes here would be experience lost to the driver
            raise ConduitError(f"ConduitEpisodeReplayBuffer.add() got {len(episodes)} episodes: under Conduit the "
                               "EnvRunners send their experience to the plane and return none to the driver")

    def sample(self, num_items: int | None = None, **kwargs: Any) -> list:
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode

        self.tickets += 1
        ticket = SingleAgentEpisode()
        ticket.custom_data[TICKET_KEY] = {"steps": int(num_items or 0), "seq": self.tickets}
        return [ticket]

    def get_metrics(self) -> dict:
        return {}

    def get_state(self) -> dict[str, Any]:
        return {"tickets": self.tickets}

    def set_state(self, state: dict[str, Any]) -> None:
        self.tickets = int(state.get("tickets", 0))
