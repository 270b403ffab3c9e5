"""Microbenchmarks of the primitives the ``rllib-stock`` model is built from (Ray 2.60, RLlib 2.60).

Each figure is one primitive timed in isolation (medians over repeats), never an end-to-end run:

* ``rpc_round_trip_s`` — one actor method call with no arguments and no result, ``ray.get`` of its
  reference (the fixed cost every ``FaultTolerantActorManager.foreach_actor`` call pays);
* ``rpc_driver_cpu_s`` — the calling process's own CPU time per such call (submission, reply
  handling): the only part of a round trip that occupies the driver's thread;
* ``rpc_overlap_ratio`` — ``n`` such calls issued together and gathered with one ``ray.get`` (what
  ``foreach_actor`` does: it calls ``.remote()`` on every actor, then waits on all references),
  divided by one call: near 1 means the round trips overlap, near ``n`` that they add up;
CPU-bound, single-process primitives are timed in CPU time (``time.process_time``), so that other
processes on a shared machine do not inflate them; Ray calls are timed in wall time.

* ``episode_pickle_s`` / ``episode_unpickle_s`` — protocol-5 pickling of one numpy-ized
  ``SingleAgentEpisode`` of CartPole-sized steps (per-episode object overhead, no bulk bytes);
* ``put_bandwidth`` — ``ray.put`` of a list of numpy-ized episodes with large observations, in the
  putting process's CPU time: bytes per second into the object store (a copy; the slope between
  the smallest and the largest size), and the per-call latency that leaves;
* ``get_s`` — ``ray.get`` of the same object in the putting process: the numpy buffers are mapped
  zero-copy, so the time does not grow with bytes (reported for the smallest and largest size);
* ``buffer_add_s`` / ``buffer_add_per_step_s`` / ``buffer_sample_s`` — RLlib's
  ``EpisodeReplayBuffer.add`` of one episode of 1 and of 64 steps and ``sample(num_items=32)`` and, from ``sample(num_items=256)``, the cost per further item.

Writes JSON (``--out``, default ``results/stock_primitives.json``) that
:mod:`conduit.sim.params` quotes as the source of :class:`~conduit.sim.params.StockCosts`.

    RAY_AUTH_MODE=disabled python benchmarks/stock_primitives.py [--out FILE]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/stock_primitives.json"))
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer

    out: dict = {"host": platform.node(), "cpus": os.cpu_count(), "ray": ray.__version__,
                 "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    # -- pickling of episodes (no Ray): per-episode object overhead
    small = [_episode(200, (4,), "float32") for _ in range(20)]
    out["episode_pickle_s"] = _cpu(lambda: [pickle.dumps(e, protocol=5) for e in small], args.repeats) / len(small)
    blobs = [pickle.dumps(e, protocol=5) for e in small]
    out["episode_unpickle_s"] = _cpu(lambda: [pickle.loads(b) for b in blobs], args.repeats) / len(small)
    # -- replay buffer primitives
    buf = EpisodeReplayBuffer(capacity=50_000)
    one = [_episode(1, (4,), "float32") for _ in range(args.repeats * 4)]
    many = [_episode(64, (4,), "float32") for _ in range(args.repeats)]
    it1, it64 = iter(one), iter(many)
    for _ in range(200):
        buf.add([_episode(8, (4,), "float32")])
    out["buffer_add_s"] = _cpu(lambda: buf.add([next(it1)]), args.repeats)
    add64 = _cpu(lambda: buf.add([next(it64)]), args.repeats // 2)
    out["buffer_add_per_step_s"] = max(0.0, (add64 - out["buffer_add_s"]) / 63)
    out["buffer_sample_s"] = _cpu(lambda: buf.sample(num_items=32), args.repeats)
    sample256 = _cpu(lambda: buf.sample(num_items=256), args.repeats // 2)
    out["buffer_sample_per_item_s"] = max(0.0, (sample256 - out["buffer_sample_s"]) / 224)
    # -- Ray: round trips, overlap, put/get
    with tempfile.TemporaryDirectory(prefix="cdt-prim-") as tmp:
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tmp, object_store_memory=512 << 20,
                 log_to_driver=False)
        try:
            @ray.remote(num_cpus=0)
            class Echo:
                def ping(self):
                    return None

            actors = [Echo.remote() for _ in range(4)]
            ray.get([a.ping.remote() for a in actors])
            single = _median(lambda: ray.get(actors[0].ping.remote()), args.repeats * 4)
            together = _median(lambda: ray.get([a.ping.remote() for a in actors]), args.repeats * 2)
            calls = args.repeats * 4
            cpu0 = time.process_time()
            for _ in range(calls):
                ray.get(actors[0].ping.remote())
            out["rpc_driver_cpu_s"] = (time.process_time() - cpu0) / calls
            out["rpc_round_trip_s"] = single
            out["rpc_overlap_n"] = len(actors)
            out["rpc_overlap_ratio"] = together / single
            sizes, put_times, get_times = [], [], []
            for frames in (1, 4, 16, 64):
                eps = [_episode(50 * frames, (84, 84), "uint8")]
                nbytes = sum(a.nbytes for a in (eps[0].get_observations(),))
                put = _cpu(lambda eps=eps: ray.put(eps), max(9, args.repeats // 3))
                ref = ray.put(eps)
                get = _median(lambda ref=ref: ray.get(ref), max(5, args.repeats // 5))
                sizes.append(nbytes)
                put_times.append(put)
                get_times.append(get)
            slope = (put_times[-1] - put_times[0]) / (sizes[-1] - sizes[0])
            out["put_bandwidth"] = 1.0 / slope if slope > 0 else float("inf")
            out["put_latency_s"] = max(0.0, put_times[0] - sizes[0] * slope)
            out["put_cpu_s"] = put_times
            out["get_s_smallest"], out["get_s_largest"] = get_times[0], get_times[-1]
            out["get_sizes_bytes"] = [sizes[0], sizes[-1]]
        finally:
            ray.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for key, value in out.items():
        print(f"{key:<24} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
