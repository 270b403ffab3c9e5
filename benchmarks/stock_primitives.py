"""Microbenchmarks of the primitives the ``rllib-stock`` model is built from (Ray 2.60, RLlib 2.60).

Each figure is one primitive timed in isolation (medians over repeats), never an end-to-end run:

* ``rpc_round_trip_s`` — one actor method call with no arguments and no result, ``ray.get`` of its
  reference (the fixed cost every ``FaultTolerantActorManager.foreach_actor`` call pays);
* ``rpc_driver_cpu_s`` — the calling process's own CPU time per such call (submission, reply
  handling): the only part of a round trip that occupies the driver's thread;
* ``rpc_overlap_ratio`` — ``n`` such calls issued together and gathered with one ``ray.get`` (what
  ``foreach_actor`` does: it calls ``.remote()`` on every actor, then waits on all references),
  divided by one call: near 1 means the round trips overlap, near ``n`` that they add up;
* ``rpc_callee_cpu_s`` — the called actor's side of a call as RLlib makes it: every
  ``FaultTolerantActorManager.foreach_actor`` call is ``actor.apply.remote(func=<a function>)``
  (``utils/actor_manager.py``: a method name is wrapped by ``_method_caller``), so the actor unpickles a
  function, applies it and replies. Its process's CPU time (every thread, ``/proc/<pid>/task/<tid>/schedstat``:
  Ray's task loop included) per call over blocks of back-to-back calls of a function that does nothing,
  less what the same process burns idle over the same wall time (measured just before each block). An
  EnvRunner pays it on every call it serves (``sample``, ``set_state``): CPU of the runner's node;
* ``rpc_gap_curve`` and the cold-call figures (section ``gap``) -- the same ``apply`` call issued after the
  caller slept 0-20 ms: per sleep the start-to-start interval, the round trip and both processes' CPU; the
  interval up to which a call is warm (``rpc_warm_within_s``) and from which it is cold (``rpc_cold_after_s``),
  and what a cold call adds (``rpc_cold_round_trip_s``, ``rpc_cold_caller_cpu_s``, ``rpc_cold_callee_cpu_s``):
  the simulator's cold-call law (:mod:`conduit.sim.raycalls`; ``benchmarks/call_gap.py`` shows the curve);

CPU-bound, single-process primitives are timed in CPU time (``time.process_time``), so that other
processes on a shared machine do not inflate them; Ray calls are timed in wall time.

* ``wake_*_s`` (section ``wake``): what each of DQN's per-round primitives (the EnvRunner's sample call and
  ``set_state``, the learner's ``get_state`` and ``update``, the buffer's ``add`` and ``sample``) costs more right
  after its thread slept 20 ms than back to back, in thread CPU: the simulator's warm-up debt
  (:mod:`conduit.sim.coldwork`; :func:`_wake_primitives`; ``benchmarks/wake_debt.py`` gives the curve);

* ``episode_put_s`` / ``episode_put_per_step_s`` and ``episode_get_s`` / ``episode_get_per_step_s`` —
  what one more episode costs in a **list of episodes through Ray's serializer**, the way Ray moves
  ``EnvRunner.sample()``'s return value (one object: the runner's ``ray.put``-equivalent, the driver's
  ``ray.get``) and ``LearnerGroup.update``'s shard argument. The episodes are real: a
  ``SingleAgentEnvRunner`` with PPO's default module samples whole episodes of an environment with
  CartPole's spaces and a fixed length (25 and 200 steps), so they carry what a sampled episode carries
  (infos, the module's extra outputs). Per length, the slope between lists of 4 and 64 episodes (CPU
  time of ``ray.put`` and of ``ray.get`` of the stored object) is the cost of one episode of that
  length; the two lengths split it into a per-episode and a per-step part;
* ``episode_pickle_s`` / ``episode_unpickle_s`` — protocol-5 pickling of one numpy-ized
  ``SingleAgentEpisode`` of CartPole-sized steps *alone* (per-episode object overhead, no bulk bytes).
  Not read by the model any more: one pickler over a list shares its memo (the class and module
  references) across the episodes, and Ray reads the arrays out of band, so an episode alone costs
  more than one in a list (kept beside the serializer's figures to show by how much);
* ``put_bandwidth`` — ``ray.put`` of a list of numpy-ized episodes with large observations, in the
  putting process's CPU time: bytes per second into the object store (a copy; the slope between
  the smallest and the largest size), and the per-call latency that leaves;
* ``get_s`` — ``ray.get`` of the same object in the putting process: the numpy buffers are mapped
  zero-copy, so the time does not grow with bytes (reported for the smallest and largest size);
* ``buffer_add_s`` / ``buffer_add_per_step_s`` / ``buffer_sample_s`` — RLlib's
  ``EpisodeReplayBuffer.add`` of one episode of 1 and of 64 steps and ``sample(num_items=32)`` and, from ``sample(num_items=256)``, the cost per further item.
* ``connector_per_call_s`` / ``connector_per_sample_s`` / ``connector_per_episode_s`` /
  ``connector_per_byte_s`` — RLlib's default learner connector pipeline
  (``AlgorithmConfig.build_learner_connector``: observations, columns, time dim, states,
  ``BatchIndividualItems``; without ``NumpyToTensor``, timed apart, and without PPO's GAE, which the
  learner adds and the workload's value pass models) over numpy-ized episodes: one 1-step episode (per
  call); 4,000 CartPole steps as 4 episodes of 1,000 and as 200 episodes of 20 (the same samples in 50x the
  episodes: per episode, then per sample); 200 steps of 84x84x4 uint8 (per byte). The pipeline loops
  over episodes in Python (every piece visits each episode), so a batch of short episodes -- CartPole's
  are about 20 steps early in training -- costs per episode as much as per sample;
* ``to_tensor_per_call_s`` / ``to_tensor_per_byte_s`` — ``NumpyToTensor`` on the built batch, small
  and large (the slope between them);
* ``driver_bookkeeping_s`` — the driver's handling of one EnvRunner result's metrics:
  ``MetricsLogger.aggregate([metrics], key="env_runners")`` of a real ``SingleAgentEnvRunner``'s
  ``get_metrics()`` after a 200-step CartPole sample (what ``synchronous_parallel_sample``'s caller
  does per result, ``algorithms/algorithm.py``).
* ``learner_results_per_call_s`` / ``learner_results_per_result_s`` — DQN's driver after each
  ``LearnerGroup.update``: the TD errors isolated from each learner's result, the results aggregated into
  the algorithm's metrics, the replay buffer's metrics aggregated, the update's timers and peeks
  (:func:`conduit.runtime.calibrate.measure_learner_results`), on RLlib's default ``DQNConfig`` for
  CartPole with a local learner: per call and per learner result (CPU time); ``learner_results_pieces_s``
  splits it (timers, replay metrics and peeks; TD errors isolated; learner results aggregated) at 1 and 2
  results.

Writes JSON (``--out``, default ``results/stock_primitives.json``) that
:mod:`conduit.sim.params` quotes as the source of :class:`~conduit.sim.params.StockCosts`.

    RAY_AUTH_MODE=disabled python benchmarks/stock_primitives.py [--out FILE]

``--sections`` measures only some of the groups (``pickle``, ``serializer``, ``buffer``, ``connector``, ``ray``,
``callee``, ``gap``, ``learner``, ``wake``); ``--merge`` keeps the other fields of an existing ``--out`` file and stamps the new ones
with ``<section>_when`` (``--keep FIELD,...``: fields a section measures that keep the file's values, the new
readings recorded under ``<section>_kept``), e.g. adding the callee's CPU to the file the simulator reads::

    RAY_AUTH_MODE=disabled python benchmarks/stock_primitives.py --sections callee --merge \
        --out benchmarks/stock_primitives.2core-vm.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import statistics
import tempfile
import time
from pathlib import Path

from conduit.runtime.proccpu import callee_cpu_per_call

SECTIONS = ("pickle", "serializer", "buffer", "connector", "ray", "callee", "gap", "learner", "wake")
#: how long the thread sleeps before a cold unit of section ``wake``: longer than the plateau's start
#: (``benchmarks/wake_debt.py``: 5-10 ms on the 2-core VM) and about a DQN round
WAKE_SLEEP_S = 0.020
#: the sleeps section ``wake`` times the EnvRunner's call after, for the ramp (the last is :data:`WAKE_SLEEP_S`)
WAKE_RAMP_SLEEPS_S = (0.001, 0.002, 0.005, 0.010, WAKE_SLEEP_S)
#: the serializer section's episode lengths (steps) and list sizes (episodes)
SERIALIZER_LENGTHS = (25, 200)
SERIALIZER_LISTS = (4, 64)
#: seconds any one Ray call of the measurements may take (they take milliseconds): past it, GetTimeoutError
CALL_TIMEOUT_S = 60.0


def _median(fn, repeats: int, clock=time.perf_counter) -> float:
    times = []
    for _ in range(repeats):
        t = clock()
        fn()
        times.append(clock() - t)
    return statistics.median(times)


def _cpu(fn, repeats: int) -> float:
    """Median CPU time of this process (``time.process_time``): what one core spends on ``fn``, robust
    against other processes competing for the machine's cores."""
    return _median(fn, repeats, time.process_time)


def _episode(steps: int, obs_shape: tuple[int, ...], dtype: str):
    import numpy as np
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    rng = np.random.default_rng(0)
    obs = [rng.integers(0, 255, size=obs_shape).astype(dtype) for _ in range(steps + 1)]
    ep = SingleAgentEpisode(observations=obs, actions=[0] * steps, rewards=[1.0] * steps,
                            extra_model_outputs={"action_logp": [0.0] * steps}, len_lookback_buffer=0)
    return ep.to_numpy()


def _connector_primitives(repeats: int) -> dict:
    """The learner connector, ``NumpyToTensor`` and the driver's per-result metrics bookkeeping."""
    import gymnasium as gym
    import numpy as np
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.connectors.learner import NumpyToTensor
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    def episodes(n: int, steps: int, space: gym.Space, act: gym.Space) -> list:
        rng = np.random.default_rng(0)
        out = []
        for _ in range(n):
            obs = [space.sample() if space.dtype != np.uint8 else rng.integers(0, 255, space.shape, dtype=np.uint8)
                   for _ in range(steps + 1)]
            ep = SingleAgentEpisode(observations=obs, actions=[0] * steps, rewards=[1.0] * steps,
                                    extra_model_outputs={"action_logp": [0.0] * steps,
                                                         "action_dist_inputs": [np.zeros(act.n, np.float32)] * steps},
                                    len_lookback_buffer=0, observation_space=space, action_space=act)
            out.append(ep.to_numpy())
        return out

    act = gym.spaces.Discrete(6)
    small = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    large = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    out: dict = {}
    # every size's calls (connector, then NumpyToTensor on what it built), timed round-robin: one call of each
    # size per round, so the host's drift over the minute hits every size alike (the fit takes differences
    # between sizes); the large size runs every fifth round
    calls: dict[str, tuple] = {}
    for name, space, n, steps in (("one", small, 1, 1), ("many", small, 4, 1000), ("short", small, 200, 20),
                                  ("large", large, 4, 50)):
        config = PPOConfig().environment(observation_space=space, action_space=act)
        spec = config.get_default_rl_module_spec()
        spec.observation_space, spec.action_space, spec.model_config = space, act, config.model_config
        module = spec.build()
        pipe = config.build_learner_connector(space, act)
        pipe.remove("NumpyToTensor")
        eps = episodes(n, steps, space, act)
        batch = pipe(rl_module=module, batch={}, episodes=eps, shared_data={}, metrics=None)
        calls[name] = (pipe, module, eps, batch, n, n * steps, n * steps * int(np.prod(space.shape)) * space.dtype.itemsize)
    to_tensor = NumpyToTensor(as_learner_connector=True)
    times: dict[str, list[float]] = {k: [] for k in [*calls, *(f"tt_{k}" for k in calls if k != "short")]}
    for r in range(repeats):
        for name, (pipe, module, eps, batch, *_sizes) in calls.items():
            if name == "large" and r % 5:
                continue
            c0 = time.process_time()
            pipe(rl_module=module, batch={}, episodes=eps, shared_data={}, metrics=None)
            times[name].append(time.process_time() - c0)
            if name != "short":
                c0 = time.process_time()
                to_tensor(rl_module=module, batch=dict(batch), episodes=[])
                times[f"tt_{name}"].append(time.process_time() - c0)
    timings = {}
    for name, (_pipe, _module, _eps, batch, n, samples, nbytes) in calls.items():
        timings[name] = (statistics.median(times[name]), samples, nbytes, n)
        if name != "short":
            built = sum(v.nbytes for v in batch.values() if hasattr(v, "nbytes"))
            timings[f"tt_{name}"] = (statistics.median(times[f"tt_{name}"]), 0, built)
    one, many, short, big = timings["one"], timings["many"], timings["short"], timings["large"]
    # time = per_call + (episodes - 1) * per_episode + (samples - 1) * per_sample (+ bytes * per_byte):
    # "many" and "short" hold the same samples, so their difference is the episodes' alone
    per_episode = max(0.0, (short[0] - many[0]) / (short[3] - many[3]))
    per_sample = max(0.0, (many[0] - one[0] - (many[3] - one[3]) * per_episode) / (many[1] - one[1]))
    out["connector_per_call_s"] = one[0]
    out["connector_per_sample_s"] = per_sample
    out["connector_per_episode_s"] = per_episode
    out["connector_per_byte_s"] = max(0.0, (big[0] - one[0] - (big[3] - one[3]) * per_episode
                                            - (big[1] - one[1]) * per_sample) / (big[2] - one[2]))
    tt_small, tt_big = timings["tt_one"], timings["tt_large"]
    out["to_tensor_per_byte_s"] = max(0.0, (tt_big[0] - tt_small[0]) / (tt_big[2] - tt_small[2]))
    out["to_tensor_per_call_s"] = max(0.0, tt_small[0] - tt_small[2] * out["to_tensor_per_byte_s"])
    out["connector_sizes"] = {k: {"cpu_s": v[0], "samples": v[1], "bytes": v[2], **({"episodes": v[3]} if len(v) > 3 else {})}
                              for k, v in timings.items()}
    # the driver's per-result metrics bookkeeping
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    runner = SingleAgentEnvRunner(config=PPOConfig().environment("CartPole-v1"))
    runner.sample(num_timesteps=200)
    metrics = runner.get_metrics()
    logger = MetricsLogger()
    out["driver_bookkeeping_s"] = _cpu(lambda: logger.aggregate([metrics], key="env_runners"), repeats)
    runner.stop()
    return out


def _learner_primitives() -> dict:
    """DQN's driver-side handling of each update's results, on RLlib's default DQN config for CartPole."""
    from ray.rllib.algorithms.dqn import DQNConfig

    from conduit.runtime import calibrate

    cfg = DQNConfig().environment("CartPole-v1").learners(num_learners=0)
    runner = calibrate._local_env_runner(cfg)
    learner = cfg.build_learner(env=runner.env)
    try:
        buffer = calibrate._replay_buffer(dict(cfg.replay_buffer_config))
        n = int(cfg.total_train_batch_size)
        calibrate._fill_replay(buffer, runner, cfg, [n])
        m = calibrate.measure_learner_results("dqn-cartpole", learner, lambda: calibrate._draw_replay(buffer, cfg, n),
                                              buffer)
    finally:
        calibrate._stop_learner(learner)
        runner.stop()
    return {"learner_results_per_call_s": m.latency, "learner_results_per_result_s": m.per_item,
            "learner_results_pieces_s": m.extra["pieces_s"], "learner_results_note": m.note}


def _wake_primitives(repeats: int, trials: int | None = None) -> dict:
    """Section ``wake``: what each of DQN's per-round primitives costs more right after its thread slept
    :data:`WAKE_SLEEP_S` than back to back (:mod:`conduit.runtime.wakedebt`: thread CPU, medians over alternating
    warm and cold units), on RLlib's default DQN config for CartPole, one torch thread (the simulator's warm-up
    debt, :mod:`conduit.sim.coldwork`). Each unit is timed alone, so each figure is what that primitive pays when
    it runs first after the sleep:

    * ``wake_runner_call_s``: the EnvRunner's ``sample()`` (one fragment) and ``get_metrics()``, DQN's call;
    * ``wake_set_state_s``: ``set_state`` of the learner's inference-only weights on a second module of the same
      spec (the EnvRunner's end of the sync: :func:`conduit.runtime.calibrate._local_set_state`);
    * ``wake_get_state_s``: the learner's ``get_state(inference_only=True)`` to numpy (the sync's sender end);
    * ``wake_replay_add_s`` / ``wake_replay_sample_s``: the prioritized buffer's ``add`` of one call's episodes
      and its ``sample`` of the train batch (plus ``get_metrics``);
    * ``wake_update_s``: the learner's ``update`` on a batch of the train batch's size.

    ``wake_units_s`` holds each unit's back-to-back time beside them. The EnvRunner's call is also timed after
    the sleeps of :data:`WAKE_RAMP_SLEEPS_S` (``wake_curve``): ``wake_warm_within_s`` and ``wake_cold_after_s``
    are the ramp through them (:func:`conduit.runtime.wakedebt.debt_ramp`)."""
    import torch
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.learner.training_data import TrainingData
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME
    from ray.rllib.utils.numpy import convert_to_numpy

    from conduit.runtime import calibrate
    from conduit.runtime.wakedebt import debt_curve, debt_ramp

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = DQNConfig().environment("CartPole-v1").learners(num_learners=0)
    runner = calibrate._local_env_runner(cfg)
    learner = cfg.build_learner(env=runner.env)
    trials = trials or max(40, repeats)
    try:
        buffer = calibrate._replay_buffer(dict(cfg.replay_buffer_config))
        n = int(cfg.total_train_batch_size)
        steps = calibrate._fill_replay(buffer, runner, cfg, [n])
        batch = learner._make_batch_if_necessary(TrainingData(episodes=calibrate._draw_replay(buffer, cfg, n)))
        set_state = calibrate._local_set_state(learner)  # on a second module of the spec, as the EnvRunner's
        pending = [runner.sample(num_timesteps=steps, random_actions=True) for _ in range(3 * trials + 40)]
        pending.reverse()  # add in sampling order: each call continues the previous episode
        ts = {NUM_ENV_STEPS_SAMPLED_LIFETIME: 10**6}
        units = {
            "runner_call": lambda: (runner.sample(), runner.get_metrics()),
            "set_state": set_state,
            "get_state": lambda: convert_to_numpy(learner.module.get_state(inference_only=True)),
            "replay_add": lambda: buffer.add(pending.pop()),
            "replay_sample": lambda: calibrate._draw_replay(buffer, cfg, n),
            "update": lambda: learner.update(batch=batch, timesteps=ts),
        }
        out: dict = {"wake_sleep_s": WAKE_SLEEP_S, "wake_units_s": {}}
        for name, unit in units.items():
            sleeps = WAKE_RAMP_SLEEPS_S if name == "runner_call" else (WAKE_SLEEP_S,)
            rows = debt_curve(unit, sleeps, units=1, trials=trials, warmup=10)
            row = rows[-1]
            out[f"wake_{name}_s"] = max(0.0, row["extra_s"][0])
            out["wake_units_s"][name] = row["warm_s"][0]
            if name == "runner_call":  # the ramp, on the EnvRunner's call
                out["wake_warm_within_s"], out["wake_cold_after_s"] = debt_ramp(rows)
                out["wake_curve"] = [{"sleep_s": r["sleep_s"], "extra_s": r["extra_s"][0], "warm_s": r["warm_s"][0]}
                                     for r in rows]
    finally:
        torch.set_num_threads(threads)
        calibrate._stop_learner(learner)
        runner.stop()
    return out


def _pickle_primitives(repeats: int) -> dict:
    small = [_episode(200, (4,), "float32") for _ in range(20)]
    out = {"episode_pickle_s": _cpu(lambda: [pickle.dumps(e, protocol=5) for e in small], repeats) / len(small)}
    blobs = [pickle.dumps(e, protocol=5) for e in small]
    out["episode_unpickle_s"] = _cpu(lambda: [pickle.loads(b) for b in blobs], repeats) / len(small)
    return out


def _fixed_length_env(steps: int):
    """A gymnasium environment with CartPole's spaces whose every episode lasts exactly ``steps`` steps
    (the real env runner's episodes, of a length the benchmark chooses)."""
    import gymnasium as gym
    import numpy as np

    class FixedLength(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self, config=None):
            self._t = 0
            self._rng = np.random.default_rng(0)

        def reset(self, *, seed=None, options=None):
            self._t = 0
            return self.observation_space.sample(), {}

        def step(self, action):
            self._t += 1
            obs = self._rng.uniform(-1.0, 1.0, 4).astype(np.float32)
            return obs, 1.0, False, self._t >= steps, {}

    return FixedLength


def sampled_episodes(steps: int, count: int) -> list:
    """``count`` whole, numpy-ized episodes of ``steps`` steps, sampled by a real ``SingleAgentEnvRunner``
    with PPO's default module (what ``EnvRunner.sample()`` returns)."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    runner = SingleAgentEnvRunner(config=PPOConfig().environment(_fixed_length_env(steps)))
    try:
        episodes = runner.sample(num_episodes=count, random_actions=False)
    finally:
        runner.stop()
    if len(episodes) != count or any(len(e) != steps for e in episodes):
        raise RuntimeError(f"asked for {count} episodes of {steps} steps, the runner returned "
                           f"{[len(e) for e in episodes]}")
    return episodes


def fit_per_step(lengths: tuple[int, int], per_episode: tuple[float, float]) -> tuple[float, float]:
    """Split the cost of one episode at two lengths into ``(fixed per episode, per step)``, each clipped at
    0 (a line through the two points)."""
    (l1, l2), (c1, c2) = lengths, per_episode
    per_step = max(0.0, (c2 - c1) / (l2 - l1))
    return max(0.0, c1 - per_step * l1), per_step


def _serializer_primitives(ray, repeats: int) -> dict:
    """One more episode in a list through Ray's serializer: ``ray.put`` (serialise, copy into the object
    store) and ``ray.get`` of the stored object (deserialise, arrays zero-copy), CPU time of this process."""
    small, large = SERIALIZER_LISTS
    sizes: dict = {}
    slopes = {"put": [], "get": []}
    for steps in SERIALIZER_LENGTHS:
        episodes = sampled_episodes(steps, large)
        row = {}
        for count in SERIALIZER_LISTS:
            chunk = episodes[:count]
            ref = ray.put(chunk)
            row[count] = {"put_cpu_s": _cpu(lambda chunk=chunk: ray.put(chunk), repeats),
                          "get_cpu_s": _cpu(lambda ref=ref: ray.get(ref, timeout=CALL_TIMEOUT_S), repeats)}
        sizes[steps] = row
        for kind, per_length in slopes.items():
            per_length.append((row[large][f"{kind}_cpu_s"] - row[small][f"{kind}_cpu_s"]) / (large - small))
    out: dict = {"serializer_sizes": {str(k): {str(n): v for n, v in row.items()} for k, row in sizes.items()}}
    for kind, per_length in slopes.items():
        fixed, per_step = fit_per_step(SERIALIZER_LENGTHS, tuple(per_length))
        out[f"episode_{kind}_s"], out[f"episode_{kind}_per_step_s"] = fixed, per_step
    return out


def _buffer_primitives(repeats: int) -> dict:
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer

    buf = EpisodeReplayBuffer(capacity=50_000)
    one = [_episode(1, (4,), "float32") for _ in range(repeats * 4)]
    many = [_episode(64, (4,), "float32") for _ in range(repeats)]
    it1, it64 = iter(one), iter(many)
    for _ in range(200):
        buf.add([_episode(8, (4,), "float32")])
    out = {"buffer_add_s": _cpu(lambda: buf.add([next(it1)]), repeats)}
    add64 = _cpu(lambda: buf.add([next(it64)]), repeats // 2)
    out["buffer_add_per_step_s"] = max(0.0, (add64 - out["buffer_add_s"]) / 63)
    out["buffer_sample_s"] = _cpu(lambda: buf.sample(num_items=32), repeats)
    sample256 = _cpu(lambda: buf.sample(num_items=256), repeats // 2)
    out["buffer_sample_per_item_s"] = max(0.0, (sample256 - out["buffer_sample_s"]) / 224)
    return out


def _ray_primitives(ray, repeats: int, sections: set[str]) -> dict:
    out: dict = {}

    @ray.remote(num_cpus=0)
    class Echo:
        def ping(self):
            return None

        def pid(self):
            return os.getpid()

        def apply(self, func, *args, **kwargs):  # FaultAwareApply.apply (utils/actor_manager.py), its try included
            try:
                return func(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - RLlib returns the error as the call's result
                return exc

    actors = [Echo.remote() for _ in range(4)]
    ray.get([a.ping.remote() for a in actors], timeout=CALL_TIMEOUT_S)
    if "ray" in sections:
        single = _median(lambda: ray.get(actors[0].ping.remote(), timeout=CALL_TIMEOUT_S), repeats * 4)
        together = _median(lambda: ray.get([a.ping.remote() for a in actors], timeout=CALL_TIMEOUT_S), repeats * 2)
        calls = repeats * 4
        cpu0 = time.process_time()
        for _ in range(calls):
            ray.get(actors[0].ping.remote(), timeout=CALL_TIMEOUT_S)
        out["rpc_driver_cpu_s"] = (time.process_time() - cpu0) / calls
        out["rpc_round_trip_s"] = single
        out["rpc_overlap_n"] = len(actors)
        out["rpc_overlap_ratio"] = together / single
        sizes, put_times, get_times = [], [], []
        for frames in (1, 4, 16, 64):
            eps = [_episode(50 * frames, (84, 84), "uint8")]
            nbytes = sum(a.nbytes for a in (eps[0].get_observations(),))
            put = _cpu(lambda eps=eps: ray.put(eps), max(9, repeats // 3))
            ref = ray.put(eps)
            get = _median(lambda ref=ref: ray.get(ref, timeout=CALL_TIMEOUT_S), max(5, repeats // 5))
            sizes.append(nbytes)
            put_times.append(put)
            get_times.append(get)
        slope = (put_times[-1] - put_times[0]) / (sizes[-1] - sizes[0])
        out["put_bandwidth"] = 1.0 / slope if slope > 0 else float("inf")
        out["put_latency_s"] = max(0.0, put_times[0] - sizes[0] * slope)
        out["put_cpu_s"] = put_times
        out["get_s_smallest"], out["get_s_largest"] = get_times[0], get_times[-1]
        out["get_sizes_bytes"] = [sizes[0], sizes[-1]]
    if "callee" in sections:
        pid = ray.get(actors[0].pid.remote(), timeout=CALL_TIMEOUT_S)

        def nothing(actor):
            return None

        out["rpc_callee_cpu_s"] = callee_cpu_per_call(lambda: ray.get(actors[0].apply.remote(func=nothing), timeout=CALL_TIMEOUT_S), pid,
                                                      calls=repeats * 4)
    if "gap" in sections:
        out.update(_gap_primitives(ray, actors[1], repeats))
    return out


def _gap_primitives(ray, actor, repeats: int) -> dict:
    """The cold-call law's figures (:mod:`conduit.sim.raycalls`) for the call RLlib makes,
    ``actor.apply.remote(func=...)``: its round trip and both processes' CPU per call back to back and after
    each sleep of :data:`~conduit.runtime.callgap.DEFAULT_SLEEPS_S` (``rpc_gap_curve``), the ramp through them
    (``rpc_warm_within_s``, ``rpc_cold_after_s``: start-to-start intervals) and the surcharges at the longest
    sleep (``rpc_cold_round_trip_s``, ``rpc_cold_caller_cpu_s``, ``rpc_cold_callee_cpu_s``)."""
    from conduit.runtime.callgap import DEFAULT_SLEEPS_S, cold_figures, cold_ramp, gap_costs

    pid = ray.get(actor.pid.remote(), timeout=CALL_TIMEOUT_S) if os.path.isdir("/proc/self/task") else None

    def nothing(actor):
        return None

    rows = gap_costs(lambda: ray.get(actor.apply.remote(func=nothing), timeout=CALL_TIMEOUT_S),
                     os.getpid() if pid is not None else None, pid, DEFAULT_SLEEPS_S, calls=max(20, repeats * 2))
    warm, cold = cold_ramp(rows)
    extra = cold_figures(rows)
    out = {"rpc_gap_curve": rows, "rpc_warm_within_s": warm, "rpc_cold_after_s": cold,
           "rpc_cold_round_trip_s": extra["wall_s"]}
    if pid is not None:
        out["rpc_cold_caller_cpu_s"] = extra["caller_cpu_s"]
        out["rpc_cold_callee_cpu_s"] = extra["callee_cpu_s"]
    return out


def parse_sections(text: str) -> set[str]:
    """``--sections``: a comma-separated subset of :data:`SECTIONS` (``all``: every one)."""
    chosen = {part.strip() for part in text.split(",") if part.strip()}
    if chosen == {"all"}:
        return set(SECTIONS)
    unknown = sorted(chosen - set(SECTIONS))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown section(s) {', '.join(unknown) or '(none given)'}; "
                                         f"known: {', '.join(SECTIONS)} or all")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/stock_primitives.json"))
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--sections", type=parse_sections, default=set(SECTIONS),
                        help=f"comma-separated subset of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other fields of an existing --out file; stamp the new ones <section>_when")
    parser.add_argument("--keep", default="",
                        help="with --merge: comma-separated fields the sections measure that keep the --out file's "
                             "values (e.g. driver_bookkeeping_s, which the connector section also measures); "
                             "the new measurements are recorded under <section>_kept")
    args = parser.parse_args(argv)
    keep = [k.strip() for k in args.keep.split(",") if k.strip()]
    if keep and not args.merge:
        parser.error("--keep applies to --merge")
    if args.repeats < 4:
        parser.error(f"--repeats must be at least 4, got {args.repeats}")
    previous: dict = {}
    if args.merge and args.out.exists():
        try:
            previous = json.loads(args.out.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--merge: {args.out} is not a readable JSON file ({exc})")
        if not isinstance(previous, dict):
            parser.error(f"--merge: {args.out} does not hold a JSON object")
        missing = [k for k in keep if k not in previous]
        if missing:
            parser.error(f"--keep: {args.out} has no field {', '.join(missing)} to keep")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    from conduit.runtime.calibrate import host_facts

    cpu_model = host_facts().get("cpu_model", "?")  # a VM may move between hosts from one day to the next
    out: dict = {"host": platform.node(), "cpu_model": cpu_model, "cpus": os.cpu_count(), "ray": ray.__version__,
                 "when": when}
    if "pickle" in args.sections:  # pickling of episodes (no Ray): per-episode object overhead
        out.update(_pickle_primitives(args.repeats))
    if "buffer" in args.sections:
        out.update(_buffer_primitives(args.repeats))
    if "connector" in args.sections:  # the learner connector, NumpyToTensor, the driver's per-result bookkeeping
        out.update(_connector_primitives(args.repeats))
    if "learner" in args.sections:  # DQN's driver after each update: the learners' results
        out.update(_learner_primitives())
    if "wake" in args.sections:  # DQN's per-round primitives right after their thread slept
        out.update(_wake_primitives(args.repeats))
    if args.sections & {"serializer", "ray", "callee", "gap"}:  # Ray's serializer; round trips, overlap, put/get; callee
        with tempfile.TemporaryDirectory(prefix="cdt-prim-") as tmp:
            ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tmp, object_store_memory=512 << 20,
                     log_to_driver=False)
            try:
                if "serializer" in args.sections:
                    out.update(_serializer_primitives(ray, args.repeats))
                if args.sections & {"ray", "callee", "gap"}:
                    out.update(_ray_primitives(ray, args.repeats, args.sections))
            finally:
                ray.shutdown()
    unmeasured = [k for k in keep if k not in out]
    if unmeasured:
        parser.error(f"--keep: the sections {', '.join(sorted(args.sections))} do not measure "
                     f"{', '.join(unmeasured)}")
    if previous:
        merged = dict(previous)
        merged.update({k: v for k, v in out.items()
                       if k not in ("host", "cpu_model", "cpus", "ray", "when") and k not in keep})
        for section in sorted(args.sections):
            if keep:
                merged[f"{section}_kept"] = {k: out[k] for k in keep}
            merged[f"{section}_when"] = when
            merged[f"{section}_cpu_model"] = cpu_model
        out = merged
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for key, value in out.items():
        print(f"{key:<24} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
