"""How RLlib experience is laid out in Conduit's columnar chunks, and how it is rebuilt on the learner.

An EnvRunner's ``sample()`` returns episode *pieces* (done episodes and cut chunks of ongoing
ones). Conduit carries them as one chunk per sample call, one **row per env step**, so that the
plane's step counts are RLlib's env-step counts and a batch of ``batch_steps`` rows is exactly the
train batch RLlib would build:

* **Trajectory layout** (PPO, APPO, IMPALA): columns ``obs``, ``actions``, ``rewards``,
  ``terminateds``, ``truncateds`` and the module outputs the loss needs (``action_logp``,
  ``action_dist_inputs``). A piece of ``n`` steps has ``n + 1`` observations; the last one (the
  value bootstrap at a cut, or the final observation of a done episode) is not a step, so it rides
  in the chunk's *annotation* together with the piece table (episode id, first timestep, length,
  terminated, truncated, weights version). The learner rebuilds the pieces as
  ``SingleAgentEpisode`` objects, joins consecutive pieces of one episode (a runner may cut an
  episode into several chunks while it streams), and RLlib's own learner connector takes it from
  there: the train batch is the one stock RLlib would build.
* **Transition layout** (DQN, SAC): every row is a self-contained n-step transition: ``obs``,
  ``next_obs`` (the observation ``k = min(n_step, steps to the episode's end)`` steps later),
  ``actions``, ``rewards`` (the discounted sum of the ``k`` rewards), ``terminateds``,
  ``truncateds`` and ``n_step`` (= ``k``). An EnvRunner's :class:`TransitionPacker` holds the last
  ``n_step - 1`` steps of a cut piece until the episode's next piece arrives, so windows run across
  sample calls as in RLlib's episode buffer. The plane's Replay sampler draws rows as RLlib's
  buffer draws timesteps (uniformly, or by priority for the prioritized buffer); the learner uses
  each sampled row as the one-step episode RLlib's buffer would have returned (with its importance
  weight in ``weights``), or directly as a row of the train batch (:class:`~conduit.runtime.rllib.delivery.DirectReplay`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from conduit.errors import ConduitError
from conduit.runtime.schema import Schema

TRAJECTORY = "trajectory"
TRANSITION = "transition"

# module outputs each on-policy family's loss reads from the episodes (besides obs/actions/rewards)
ON_POLICY_OUTPUTS = ("action_logp", "action_dist_inputs")
WEIGHTS_SEQ_NO = "weights_seq_no"


@dataclass(frozen=True)
class Piece:
    """One episode piece in a chunk: rows ``[row, row + length)`` of the chunk."""

    episode_id: str
    t_started: int
    length: int
    terminated: bool
    truncated: bool
    version: int


def _space_column(space: Any, name: str) -> tuple[tuple[int, ...], np.dtype]:
    shape = getattr(space, "shape", None)
    dtype = getattr(space, "dtype", None)
    if shape is None or dtype is None:
        raise ConduitError(f"Conduit carries fixed-shape arrays; the {name} space {space!r} has no fixed shape and "
                           "dtype (Dict/Tuple spaces are not supported yet: flatten them in the environment)")
    return tuple(int(s) for s in shape), np.dtype(dtype)


def trajectory_schema(observation_space: Any, action_space: Any, dist_inputs_dim: int) -> Schema:
    """The on-policy chunk layout for these spaces (``dist_inputs_dim``: the action distribution's inputs)."""
    obs_shape, obs_dtype = _space_column(observation_space, "observation")
    act_shape, act_dtype = _space_column(action_space, "action")
    return Schema.of({
        "obs": (obs_shape, obs_dtype),
        "actions": (act_shape, act_dtype),
        "rewards": ((), np.float32),
        "terminateds": ((), np.bool_),
        "truncateds": ((), np.bool_),
        "action_logp": ((), np.float32),
        "action_dist_inputs": ((int(dist_inputs_dim),), np.float32),
    })


def transition_schema(observation_space: Any, action_space: Any) -> Schema:
    """The replay chunk layout for these spaces."""
    obs_shape, obs_dtype = _space_column(observation_space, "observation")
    act_shape, act_dtype = _space_column(action_space, "action")
    return Schema.of({
        "obs": (obs_shape, obs_dtype),
        "next_obs": (obs_shape, obs_dtype),
        "actions": (act_shape, act_dtype),
        "rewards": ((), np.float32),
        "terminateds": ((), np.bool_),
        "truncateds": ((), np.bool_),
        "n_step": ((), np.int64),
    })


def _steps(e: Any) -> int:
    return len(e)


def _cast(values: Any, dtype: np.dtype, shape: tuple[int, ...], n: int, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.shape != (n, *shape):
        raise ConduitError(f"episode {what}: expected shape {(n, *shape)}, got {arr.shape}")
    return arr.astype(dtype, copy=False)


def pack_trajectories(episodes: Sequence[Any], schema: Schema, version: int) -> tuple[dict[str, np.ndarray], dict]:
    """One chunk (payload, annotation) from an EnvRunner's episode pieces (trajectory layout)."""
    cols = {c.name: c for c in schema.columns}
    parts: dict[str, list[np.ndarray]] = {name: [] for name in cols}
    pieces: list[Piece] = []
    finals: list[np.ndarray] = []
    for e in episodes:
        n = _steps(e)
        if n == 0:
            continue
        rows = slice(0, n)
        got = {
            "obs": e.get_observations(rows),
            "actions": e.get_actions(rows),
            "rewards": e.get_rewards(rows),
            "terminateds": np.zeros(n, np.bool_),
            "truncateds": np.zeros(n, np.bool_),
        }
        got["terminateds"][-1] = bool(e.is_terminated)
        got["truncateds"][-1] = bool(e.is_truncated)
        for key in ON_POLICY_OUTPUTS:
            got[key] = e.get_extra_model_outputs(key, rows)
        extra = set(e.extra_model_outputs.keys()) - set(ON_POLICY_OUTPUTS) - {WEIGHTS_SEQ_NO}
        if extra:
            raise ConduitError(f"episode {e.id_!r} carries module outputs {sorted(extra)} that Conduit's trajectory "
                               f"layout does not carry (it carries {list(ON_POLICY_OUTPUTS)})")
        for name, col in cols.items():
            parts[name].append(_cast(got[name], col.dtype, col.shape, n, f"{e.id_!r} column {name!r}"))
        finals.append(np.asarray(e.get_observations(-1), dtype=cols["obs"].dtype))
        pieces.append(Piece(str(e.id_), int(e.t_started), n, bool(e.is_terminated), bool(e.is_truncated),
                            int(version)))
    if not pieces:
        return {}, {}
    payload = {name: np.concatenate(p) if len(p) > 1 else p[0] for name, p in parts.items()}
    return payload, {"pieces": pieces, "final_obs": np.stack(finals), "t": time.time()}


def _windows(obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, emit: int, done: tuple[bool, bool],
             n_step: int, gamma: float) -> dict[str, np.ndarray]:
    """Transitions for steps ``[0, emit)`` of a run of ``L = len(rewards)`` steps (``L + 1`` observations):
    ``k = min(n_step, L - t)``; ``done`` = (terminated, truncated) of the run's end."""
    n = len(rewards)
    t = np.arange(emit)
    k = np.minimum(n_step, n - t)
    if n_step == 1:
        summed = rewards[:emit]
    else:
        padded = np.concatenate([rewards, np.zeros(n_step - 1)])
        windows = np.lib.stride_tricks.sliding_window_view(padded, n_step)[:emit]
        summed = (windows * gamma ** np.arange(n_step, dtype=np.float64)).sum(axis=1)  # zeros past the end add 0
    ends = t + k == n
    return {"obs": obs[:emit], "next_obs": obs[t + k], "actions": actions[:emit], "rewards": summed,
            "terminateds": ends & done[0], "truncateds": ends & done[1], "n_step": k}


@dataclass
class _Carry:
    """Steps of an ongoing episode whose n-step window reaches into its next piece."""

    t_end: int  # timestep of the next expected step
    obs: np.ndarray  # observations of the carried steps and the one after them (len = steps + 1)
    actions: np.ndarray
    rewards: np.ndarray


class TransitionPacker:
    """Packs an EnvRunner's episode pieces into n-step transitions (transition layout), across calls.

    A sample call cuts ongoing episodes; the last ``n_step - 1`` steps of a cut piece have no full
    window yet. They are carried to the episode's next piece (RLlib's episode buffer joins pieces
    by episode id the same way), so every transition gets ``k = n_step`` except at an episode's
    real end. Carries of episodes that never continue (an env reset) are emitted with the shorter
    windows they have after :data:`MAX_CARRIES` newer episodes, or by :meth:`flush`.
    """

    MAX_CARRIES = 256

    def __init__(self, schema: Schema, n_step: int, gamma: float):
        self.cols = {c.name: c for c in schema.columns}
        self.n_step, self.gamma = int(n_step), float(gamma)
        self.carries: dict[str, _Carry] = {}

    def pack(self, episodes: Sequence[Any]) -> dict[str, np.ndarray]:
        parts: dict[str, list[np.ndarray]] = {name: [] for name in self.cols}
        for e in episodes:
            n = _steps(e)
            if n == 0:
                continue
            obs = np.asarray(e.get_observations(slice(0, n + 1)))
            actions = np.asarray(e.get_actions(slice(0, n)))
            rewards = np.asarray(e.get_rewards(slice(0, n)), dtype=np.float64)
            key = str(e.id_)
            carry = self.carries.pop(key, None)
            if carry is not None and carry.t_end == int(e.t_started):
                obs = np.concatenate([carry.obs[:-1], obs])
                actions = np.concatenate([carry.actions, actions])
                rewards = np.concatenate([carry.rewards, rewards])
            elif carry is not None:
                self._emit(parts, carry.obs, carry.actions, carry.rewards, len(carry.rewards), (False, False), key)
            done = (bool(e.is_terminated), bool(e.is_truncated))
            total = len(rewards)
            emit = total if any(done) else max(0, total - (self.n_step - 1))
            self._emit(parts, obs, actions, rewards, emit, done, key)
            if emit < total:
                self.carries[key] = _Carry(int(e.t_started) + n, obs[emit:], actions[emit:], rewards[emit:])
        while len(self.carries) > self.MAX_CARRIES:
            key, c = next(iter(self.carries.items()))
            del self.carries[key]
            self._emit(parts, c.obs, c.actions, c.rewards, len(c.rewards), (False, False), key)
        return self._concat(parts)

    def flush(self) -> dict[str, np.ndarray]:
        """Every carried step, with the windows it has (the end of a run, or a test)."""
        parts: dict[str, list[np.ndarray]] = {name: [] for name in self.cols}
        for key, c in self.carries.items():
            self._emit(parts, c.obs, c.actions, c.rewards, len(c.rewards), (False, False), key)
        self.carries.clear()
        return self._concat(parts)

    def _emit(self, parts: dict, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, emit: int,
              done: tuple[bool, bool], key: str) -> None:
        if emit <= 0:
            return
        got = _windows(obs, actions, rewards, emit, done, self.n_step, self.gamma)
        for name, col in self.cols.items():
            parts[name].append(_cast(got[name], col.dtype, col.shape, emit, f"{key!r} column {name!r}"))

    @staticmethod
    def _concat(parts: dict[str, list[np.ndarray]]) -> dict[str, np.ndarray]:
        if not parts["obs"]:
            return {}
        return {name: np.concatenate(p) if len(p) > 1 else p[0] for name, p in parts.items()}


def pack_transitions(episodes: Sequence[Any], schema: Schema, n_step: int, gamma: float) -> dict[str, np.ndarray]:
    """Transitions of these pieces alone: every window stops at its piece's end (no carry across calls)."""
    packer = TransitionPacker(schema, n_step, gamma)
    parts = {name: [] for name in packer.cols}
    for e in episodes:
        n = _steps(e)
        if n:
            packer._emit(parts, np.asarray(e.get_observations(slice(0, n + 1))), np.asarray(e.get_actions(slice(0, n))),
                         np.asarray(e.get_rewards(slice(0, n)), dtype=np.float64), n,
                         (bool(e.is_terminated), bool(e.is_truncated)), str(e.id_))
    return packer._concat(parts)


# ------------------------------------------------------------------------------------------ rebuilding
@dataclass
class _Run:
    """Consecutive rows of one episode, gathered from one or more pieces."""

    episode_id: str
    t_started: int
    rows: list[tuple[int, int]]  # (first row in the batch, length) per piece
    final: np.ndarray
    terminated: bool
    truncated: bool
    version: int
    last: tuple[Any, int]  # (chunk id, piece index) of the run's last piece: whose final observation ends it

    @property
    def length(self) -> int:
        return sum(n for _, n in self.rows)


def _runs(selections: Iterable[tuple[Any, Any]], annotations: Mapping[Any, dict], row_offset: int = 0) -> list[_Run]:
    """The episode runs of a batch, in the order their first piece appears.

    ``selections`` is the batch's ``(chunk_id, row indices)`` list in row order; every chunk must be
    carried whole (the trajectory layout's batches are multiples of whole chunks)."""
    runs: list[_Run] = []
    open_runs: dict[str, _Run] = {}
    row = row_offset
    for cid, idx in selections:
        ann = annotations.get(cid)
        count = len(idx)
        if ann is None:
            raise ConduitError(f"chunk {cid!r} reached the learner without its piece table")
        pieces: list[Piece] = ann["pieces"]
        if count != sum(p.length for p in pieces):
            raise ConduitError(f"chunk {cid!r} was split across batches ({count} of "
                               f"{sum(p.length for p in pieces)} rows); trajectory batches hold whole chunks")
        for i, (p, final) in enumerate(zip(pieces, ann["final_obs"], strict=True)):
            run = open_runs.get(p.episode_id)
            if run is not None and run.t_started + run.length == p.t_started and not (run.terminated or run.truncated):
                run.rows.append((row, p.length))
                run.final, run.terminated, run.truncated, run.last = final, p.terminated, p.truncated, (cid, i)
            else:
                run = _Run(p.episode_id, p.t_started, [(row, p.length)], final, p.terminated, p.truncated, p.version,
                           (cid, i))
                runs.append(run)
                open_runs[p.episode_id] = run
            row += p.length
    return runs


def run_rows(run: _Run) -> np.ndarray:
    """Row indices (into the batch) of a run, in time order."""
    return np.concatenate([np.arange(first, first + n) for first, n in run.rows])


def rebuild_trajectories(columns: Mapping[str, np.ndarray], selections: Sequence[tuple[Any, Any]],
                         annotations: Mapping[Any, dict], *, observation_space: Any = None,
                         action_space: Any = None) -> tuple[list[Any], list[_Run]]:
    """``SingleAgentEpisode`` pieces (joined per episode) from a trajectory-layout batch, and their runs."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    runs = _runs(selections, annotations)
    episodes = []
    for run in runs:
        idx = slice(run.rows[0][0], run.rows[0][0] + run.length) if len(run.rows) == 1 else run_rows(run)
        obs = columns["obs"][idx]
        n = len(obs)
        episodes.append(SingleAgentEpisode(
            id_=run.episode_id,
            observations=np.concatenate([obs, run.final[None].astype(obs.dtype, copy=False)]),
            actions=columns["actions"][idx],
            rewards=columns["rewards"][idx],
            infos=[{} for _ in range(n + 1)],
            extra_model_outputs={
                **{k: columns[k][idx] for k in ON_POLICY_OUTPUTS},
                WEIGHTS_SEQ_NO: np.full(n, run.version, np.int64),
            },
            terminated=run.terminated,
            truncated=run.truncated,
            t_started=run.t_started,
            len_lookback_buffer=0,
            observation_space=observation_space,
            action_space=action_space,
        ))
    return episodes, runs


def rebuild_transitions(columns: Mapping[str, np.ndarray], *, weights: Any = None, observation_space: Any = None,
                        action_space: Any = None) -> list[Any]:
    """The one-step episodes RLlib's episode buffer returns, one per sampled transition row, each
    with its importance weight (``weights``, one per row; 1 when None, as the uniform buffer)."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    obs, nxt, act = columns["obs"], columns["next_obs"], columns["actions"]
    w = np.ones(len(obs)) if weights is None else np.asarray(weights, np.float64)
    rew, term, trunc, nst = columns["rewards"], columns["terminateds"], columns["truncateds"], columns["n_step"]
    return [
        SingleAgentEpisode(
            observations=[obs[i], nxt[i]],
            actions=[act[i]],
            rewards=[float(rew[i])],
            infos=[{}, {}],
            terminated=bool(term[i]),
            truncated=bool(trunc[i]),
            extra_model_outputs={"n_step": [int(nst[i])], "weights": [float(w[i])]},
            len_lookback_buffer=0,
            observation_space=observation_space,
            action_space=action_space,
        )
        for i in range(len(obs))
    ]
