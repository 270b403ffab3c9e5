"""Cost parameters of the experience path, each with its source.

Two sets exist. :class:`StockCosts` are the CPU-side costs of stock Ray RLlib 2.60's experience
path. Each comes from a **microbenchmark of one primitive**, never from an end-to-end run: the file
is ``benchmarks/stock_primitives.2core-vm.json``, written by ``benchmarks/stock_primitives.py`` on the
2-core development VM (ray 2.60.0; CPU-bound primitives in process CPU time, so other processes on
the shared machine do not inflate them). The parameter -> field of that file:

* ``rpc_overhead`` = ``rpc_round_trip_s`` (1.06 ms): one actor call with no payload, wall time;
  ``rpc_driver_cpu`` = ``rpc_driver_cpu_s`` (0.52 ms): the caller's own CPU time per such call, the
  only part of a round trip that holds the driver's thread. ``FaultTolerantActorManager.foreach_actor``
  (``ray/rllib/utils/actor_manager.py``) issues ``.remote()`` on every actor and then waits on all
  references, so N calls cost the driver ``N * rpc_driver_cpu`` and ``rpc_overhead - rpc_driver_cpu``
  of latency that overlaps (same file: ``rpc_overlap_ratio`` 2.70 for 4 calls against the 2.47 this
  model predicts from the two figures above);
  ``rpc_callee_cpu`` = ``rpc_callee_cpu_s`` (0.70 ms): the called actor's CPU per such call as RLlib
  makes it (``actor.apply.remote(func=...)``: the function unpickled, applied, the reply sent; every
  thread of the callee's process, less its idle burn), charged on the EnvRunner's core for each
  ``sample()`` and ``set_state`` call it serves (three runs: 0.69-0.83 ms);
* ``*_serialize_per_episode`` = ``episode_put_s`` (55.6 us) and ``*_serialize_per_step`` =
  ``episode_put_per_step_s`` (0.086 us), ``*_deserialize_per_episode`` = ``episode_get_s`` (29.2 us) and
  ``*_deserialize_per_step`` = ``episode_get_per_step_s`` (0.079 us): one more real sampled episode in a
  list through Ray's serializer (``ray.put`` / ``ray.get`` CPU time), as Ray moves ``EnvRunner.sample()``'s
  return value and ``LearnerGroup.update``'s shard argument: one object per call, one pickler whose memo
  the episodes share, the arrays out of band. (Until 2026-12-06 these were ``episode_pickle_s`` (103 us)
  and ``episode_unpickle_s`` (90 us), an episode pickled *alone*, which the same file still holds: 1.9x and
  3.1x what an episode costs in Ray's list);
* ``serialize_bandwidth`` = ``put_bandwidth`` (1.55 GB/s) and ``put_per_call`` = ``put_latency_s``
  (1.10 ms): ``ray.put`` of episodes with large observations copies their arrays into the object
  store (a runner returning ``sample()``'s episodes, the driver passing shards as call arguments);
* ``get_per_object`` = ``get_s_smallest`` (0.29 ms): ``ray.get`` maps numpy buffers zero-copy (the
  same file: 0.72 ms for 63x the bytes), so a get costs a fixed amount plus each episode's and step's share,
  with no per-byte term (``deserialize_bandwidth`` is infinite);
* ``buffer_add_per_call`` = ``buffer_add_s`` (0.61 ms), ``buffer_add_per_step`` =
  ``buffer_add_per_step_s`` (2.9 us): ``EpisodeReplayBuffer.add``; ``buffer_sample_per_item`` =
  ``buffer_sample_per_item_s`` (149 us) and ``buffer_sample_per_call`` = ``buffer_sample_s`` less 32
  items (0.51 ms): ``EpisodeReplayBuffer.sample(num_items=n)`` builds one episode per item.
* ``buffer_update_priorities_per_call``/``_per_item`` (0 here: the uniform buffer has no priorities):
  ``update_priorities_in_episode_replay_buffer`` on a ``PrioritizedEpisodeReplayBuffer``, DQN's default,
  charged only for a workload with ``prioritized_replay: true``.
  ``studies/validation.py`` takes these and the buffer's add/sample costs from the workload's own
  buffer (``conduit calibrate``'s ``replay_*`` primitives, :func:`conduit.runtime.calibrate.measure_learner`).

* ``connector_per_call`` = ``connector_per_call_s`` (0.082 ms), ``connector_per_sample`` =
  ``connector_per_sample_s`` (0.54 us), ``connector_per_episode`` = ``connector_per_episode_s`` (20.3 us),
  ``connector_per_byte`` = ``connector_per_byte_s`` (0.095 ns): RLlib's default learner connector pipeline
  (``AlgorithmConfig.build_learner_connector``, without ``NumpyToTensor`` and without PPO's GAE) over
  numpy-ized episodes, four sizes timed round-robin (CPU time; ``--sections connector --repeats 2001``,
  2026-12-06 22:16). Every piece of the pipeline visits each episode in Python, so 4,000 CartPole steps
  cost 2.3 ms as 4 episodes and 6.3 ms as 200 (CartPole's episodes are about 20 steps early in
  training). Until 2026-12-06 the fit had no episode term (0.113 ms + 2.0 us/sample, measured on 4
  episodes); the model under-charged the connector of a batch of short episodes by half (the reference
  window's PPO CartPole *c*: 3.0 ms simulated, 5.4-5.7 ms measured). Three runs of the section gave
  17.1-22.6 us per episode and 0.53-0.57 us per sample. Charged per episode object: a PPO or APPO
  chunk's ``Workload.chunk_episodes``, a deployed learner's rebuilt episode runs, and a DQN batch's
  items (``sample_episodes=True``: each sampled item is its own episode);
* ``to_tensor_per_call`` = ``to_tensor_per_call_s`` (0.200 ms), ``to_tensor_per_byte`` =
  ``to_tensor_per_byte_s`` (7.5 ps): ``NumpyToTensor`` on the built batch (CPU time), timed in the same
  rounds as the connector (until 2026-12-06 in a tight loop of its own, 0.121 ms: a warm cache the real
  call after the connector does not have; the reference window measured *d* at 0.17-0.19 ms);
* ``driver_bookkeeping`` = ``driver_bookkeeping_s`` (0.672 ms): ``MetricsLogger.aggregate`` of one
  real ``SingleAgentEnvRunner``'s ``get_metrics()`` (CPU time), the driver's work per EnvRunner result.
* ``learner_results_per_call`` = ``learner_results_per_call_s`` (0.55 ms) and ``learner_results_per_result`` =
  ``learner_results_per_result_s`` (0.10 ms): DQN's driver after each ``LearnerGroup.update``
  (``DQN._training_step_new_api_stack``): the TD errors isolated from each learner's result, the results
  aggregated into the algorithm's metrics, the replay buffer's metrics aggregated, the update's three timers
  and two peeks (``benchmarks/stock_primitives.py --sections learner``: RLlib's default DQN config for
  CartPole, CPU time; five runs 0.53-0.60 ms and 0.10-0.13 ms; fitted over 1 and 2 results, so
  many learners' results are a linear extrapolation). Charged on stock and deployed DQN alike
  (``enable()`` keeps the training step). PPO's and APPO's drivers aggregate their learners' results too
  (PPO once per iteration of seconds; APPO per learner reply); the model does not charge those.

* ``driver_poll_cores`` (0.85): the cores an APPO/IMPALA driver's main thread wants while its never-sleeping
  loop (``Algorithm._run_one_training_iteration`` -> ``IMPALA.training_step``) runs: the real loop on the
  workload's APPO config with environments that sleep instead of computing, so that nothing else wants the
  cores (``benchmarks/appo_driver_loop.py``; ``/proc/<pid>/task/<tid>/schedstat`` time on a CPU plus time
  waiting for one, per wall second). The ``ray.wait(timeout=0)`` call alone takes 0.22
  (``benchmarks/driver_wait_loop.py``); the rest is each pass's Python (metrics, the learner group's
  async update, result handling). Used only on a node with fewer cores than processes, where the
  thread gets its cores first (wake-up preemption: :class:`conduit.sim.resources.CpuPool`).
* ``learner_poll_cores`` (0.151) and ``poll_neighbour_cost`` (1.163): an idle APPO learner's thread polls its
  empty ``CircularBuffer`` every 0.1 ms (``algorithms/appo/utils.py: CircularBuffer.get``), ~5,200 wakes a second.
  ``benchmarks/appo_learner_poll.py --windows 3 --pairs 48`` (:mod:`conduit.runtime.learner_poll`), run twice on
  2026-12-06 19:20-19:30 (``results/validation/learner_poll/``): the cores a real idle APPO learner's
  ``_learner_thread`` wants (RLlib's default ``APPOConfig``, CartPole; ``schedstat``, on a CPU + waiting): 0.151 and
  0.150; and the ratio of an APPO EnvRunner's CPU per env step with a poller process on / off beside as many busy
  learner-like neighbours as cores (over-subscribed either way: the poller's cost on top of
  ``oversubscribed_cpu_cost``): 1.141 and 1.187, the median over both runs' 96 pairs 1.163 (quartiles 1.01, 1.37).
  Used only on a crowded node, while the learner's thread is not training (:meth:`conduit.sim.appo.AppoLoop.appo_learner_poll`).

Until this change ``connector_*``, ``to_tensor_*`` and ``driver_bookkeeping`` restated segments *c*,
*d* and *a2* of ``shared/reference/rllib-2.60-stock-cpu.md`` (0.983 ms + 0.9 us/sample + 0.324
ns/B, 0.128 ms + 3 ps/B, 0.35 ms): in-sample for the comparison :mod:`conduit.sim.calibration` makes.
Every measured figure now comes from a microbenchmark. ``local_call_overhead`` (a Python method call
on a local learner, 0.058 ms) is still the reference's DQN *b*. The old ``driver_loop_overhead``
(2.98 ms per DQN step that the reference's hooks could not attribute: a residual of an end-to-end
run) is gone.

CPU costs are per core of the reference VM. On cluster topologies they are divided by the node's
``cpu_speed`` attribute (default 1.0: a Sapphire Rapids or EPYC core is about as fast per thread as
the reference VM's core for this pointer-chasing, pickling-bound code -- our estimate, stated here so
a reader can change it).

The ``rpc_cold_*``, ``rpc_warm_within`` and ``rpc_cold_after`` fields are the cold-call law
(:mod:`conduit.sim.raycalls`): what a call adds when its caller or callee has not started one lately, from
section ``gap`` of ``benchmarks/stock_primitives.py`` (``STOCK_COLD_SOURCES``), merged into
:data:`STOCK_PRIMITIVES_FILE` on 2026-12-07 09:36 (``--sections gap --merge``; ``gap_when``):
``rpc_warm_within`` = ``rpc_warm_within_s`` (1.16 ms) and ``rpc_cold_after`` = ``rpc_cold_after_s``
(12.3 ms), start-to-start intervals within which a call is back to back and from which it is cold;
``rpc_cold_round_trip`` (+1.18 ms), ``rpc_cold_caller_cpu`` (+0.56 ms) and ``rpc_cold_callee_cpu`` (+0.45 ms)
= ``rpc_cold_round_trip_s``, ``rpc_cold_caller_cpu_s`` and ``rpc_cold_callee_cpu_s``: RLlib's ``apply`` call
20 ms apart against back to back. A second run of the section minutes later read 0.80 / 12.6 ms and +1.41 /
+0.84 / +0.55 ms; the validation window ``results/validation/run-0746`` 0.91 / 12.1 ms and +0.70 ms caller,
+0.49 ms callee. All 0 is no law (every call at its back-to-back cost): what a file measured before the
section gives (:func:`studies.validation.stock_costs_from_primitives`).

The ``wake_*`` fields are the warm-up debt (:mod:`conduit.sim.coldwork`): what each of DQN's per-round
primitives costs more right after its thread slept 20 ms than back to back, from section ``wake`` of
``benchmarks/stock_primitives.py`` (``STOCK_WAKE_SOURCES``), merged into :data:`STOCK_PRIMITIVES_FILE` on
2026-12-07 13:25 (``--sections wake --merge``; ``wake_when``): the EnvRunner's sample call +1.46 ms, its
``set_state`` +0.56 ms, the learner's ``get_state`` +0.48 ms, the buffer's ``add`` +0.71 ms and ``sample`` +0.73 ms,
the learner's update +1.38 ms; the ramp (the EnvRunner's call after sleeps of 1-20 ms) warm within 1 ms, cold from
10 ms. A second run a minute later read +1.17 / +0.48 / +0.44 / +0.64 / +0.89 / +1.41 ms, warm within 0, cold from
10 ms. All 0 (``wake_cold_after`` 0) is no debt: what a file measured before the section gives.

The ``fresh_map_per_byte``, ``reported_map_per_byte``, ``reported_ramp_from`` and ``reported_ramp_to`` fields are
the fresh mapping (:mod:`conduit.fresh_mapping`, charged by :meth:`StockCosts.fresh_map` on the learner connector's
batch): a batch above glibc's 32 MiB mmap ceiling is mapped afresh each time, and on a VM with free page reporting a
share of it lands on memory the host took back, by how long the learner sat idle since its last update. They are
machine figures, not RLlib's: ``conduit calibrate`` measures them (the host block's ``fresh_mapping``,
:mod:`conduit.runtime.freshmap`) and ``studies/validation.py`` reads them from its calibration. The built-in
costs leave them 0 (off): they are one machine's figures (a fresh mapping's faults cost something anywhere, but
the reported share is a VM's), and the presets model clusters they do not describe. On the 2-core development VM,
2026-12-07 19:58: 0.036 ms per MiB fresh, 1.33 ms per MiB more on reported memory, none reported after 0.7 s idle
or less, all from 2.7 s (20:10, in a validation window's calibration: 0.036, 1.01, 0.65 and 2.3).

:class:`PlaneCosts` are Conduit's own costs: writing a chunk columnar into a preallocated staging
slot is a memcpy (``ingest_copy_bandwidth``), and the per-sample connector work is the same work as
stock's (we do not assume our batch building is cheaper; we only move it off the critical path).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from conduit.errors import ConduitError
from conduit.fresh_mapping import MMAP_CEILING_BYTES
from conduit.ramp import linear_ramp

#: the microbenchmark file every measured :class:`StockCosts` default comes from
STOCK_PRIMITIVES_FILE = "benchmarks/stock_primitives.2core-vm.json"
#: StockCosts field -> (field of :data:`STOCK_PRIMITIVES_FILE`, how the value follows from it)
STOCK_SOURCES: dict[str, tuple[str, str]] = {
    "rpc_overhead": ("rpc_round_trip_s", "as measured"),
    "rpc_driver_cpu": ("rpc_driver_cpu_s", "as measured"),
    "rpc_callee_cpu": ("rpc_callee_cpu_s", "as measured"),
    "sample_serialize_per_episode": ("episode_put_s", "as measured"),
    "sample_serialize_per_step": ("episode_put_per_step_s", "as measured"),
    "sample_deserialize_per_episode": ("episode_get_s", "as measured"),
    "sample_deserialize_per_step": ("episode_get_per_step_s", "as measured"),
    "shard_serialize_per_episode": ("episode_put_s", "as measured"),
    "shard_serialize_per_step": ("episode_put_per_step_s", "as measured"),
    "shard_deserialize_per_episode": ("episode_get_s", "as measured"),
    "shard_deserialize_per_step": ("episode_get_per_step_s", "as measured"),
    "serialize_bandwidth": ("put_bandwidth", "as measured"),
    "put_per_call": ("put_latency_s", "as measured"),
    "get_per_object": ("get_s_smallest", "as measured"),
    "buffer_add_per_call": ("buffer_add_s", "as measured"),
    "buffer_add_per_step": ("buffer_add_per_step_s", "as measured"),
    "buffer_sample_per_item": ("buffer_sample_per_item_s", "as measured"),
    "buffer_sample_per_call": ("buffer_sample_s", "less 32 x buffer_sample_per_item_s"),
    "connector_per_call": ("connector_per_call_s", "as measured"),
    "connector_per_sample": ("connector_per_sample_s", "as measured"),
    "connector_per_episode": ("connector_per_episode_s", "as measured"),
    "connector_per_byte": ("connector_per_byte_s", "as measured"),
    "to_tensor_per_call": ("to_tensor_per_call_s", "as measured"),
    "to_tensor_per_byte": ("to_tensor_per_byte_s", "as measured"),
    "driver_bookkeeping": ("driver_bookkeeping_s", "as measured"),
    "learner_results_per_call": ("learner_results_per_call_s", "as measured"),
    "learner_results_per_result": ("learner_results_per_result_s", "as measured"),
}
#: StockCosts fields of the cold-call law (:mod:`conduit.sim.raycalls`), from section ``gap`` of a
#: ``benchmarks/stock_primitives.py`` file; a file measured before that section keeps them 0 (no law: every
#: call at its back-to-back cost) and a study reading it says so
STOCK_COLD_SOURCES: dict[str, tuple[str, str]] = {
    "rpc_cold_round_trip": ("rpc_cold_round_trip_s", "as measured"),
    "rpc_cold_caller_cpu": ("rpc_cold_caller_cpu_s", "as measured"),
    "rpc_cold_callee_cpu": ("rpc_cold_callee_cpu_s", "as measured"),
    "rpc_warm_within": ("rpc_warm_within_s", "as measured"),
    "rpc_cold_after": ("rpc_cold_after_s", "as measured"),
}
#: StockCosts fields of the warm-up debt (:mod:`conduit.sim.coldwork`), from section ``wake`` of a
#: ``benchmarks/stock_primitives.py`` file; a file measured before that section keeps them 0 (no debt)
STOCK_WAKE_SOURCES: dict[str, tuple[str, str]] = {
    "wake_runner_call": ("wake_runner_call_s", "as measured"),
    "wake_set_state": ("wake_set_state_s", "as measured"),
    "wake_get_state": ("wake_get_state_s", "as measured"),
    "wake_replay_add": ("wake_replay_add_s", "as measured"),
    "wake_replay_sample": ("wake_replay_sample_s", "as measured"),
    "wake_update": ("wake_update_s", "as measured"),
    "wake_warm_within": ("wake_warm_within_s", "as measured"),
    "wake_cold_after": ("wake_cold_after_s", "as measured"),
}


@dataclass(frozen=True)
class StockCosts:
    """Stock RLlib 2.60 experience-path CPU costs (seconds, bytes/s); sources in the module docstring."""

    rpc_overhead: float = 1.0595e-3
    rpc_driver_cpu: float = 0.5224e-3
    rpc_callee_cpu: float = 0.6984e-3
    local_call_overhead: float = 0.058e-3
    sample_serialize_per_episode: float = 55.64e-6
    sample_serialize_per_step: float = 86.3e-9
    sample_deserialize_per_episode: float = 29.21e-6
    sample_deserialize_per_step: float = 79.41e-9
    shard_serialize_per_episode: float = 55.64e-6
    shard_serialize_per_step: float = 86.3e-9
    shard_deserialize_per_episode: float = 29.21e-6
    shard_deserialize_per_step: float = 79.41e-9
    serialize_bandwidth: float = 1.549e9
    put_per_call: float = 1.099e-3
    get_per_object: float = 0.2852e-3
    deserialize_bandwidth: float = math.inf
    driver_bookkeeping: float = 0.6720e-3
    connector_per_call: float = 0.08201e-3
    connector_per_sample: float = 0.5423e-6
    connector_per_episode: float = 20.34e-6
    connector_per_byte: float = 0.09472e-9
    to_tensor_per_call: float = 0.1996e-3
    to_tensor_per_byte: float = 7.456e-12
    buffer_add_per_call: float = 0.6124e-3
    buffer_add_per_step: float = 2.923e-6
    buffer_sample_per_call: float = 0.5082e-3
    buffer_sample_per_item: float = 149.4e-6
    buffer_update_priorities_per_call: float = 0.0
    buffer_update_priorities_per_item: float = 0.0
    learner_results_per_call: float = 0.5463e-3
    learner_results_per_result: float = 0.1042e-3
    driver_poll_cores: float = 0.85  # benchmarks/appo_driver_loop.py (see the module doc)
    learner_poll_cores: float = 0.151  # benchmarks/appo_learner_poll.py (see the module doc)
    poll_neighbour_cost: float = 1.163  # benchmarks/appo_learner_poll.py (see the module doc)
    # the cold-call law (conduit.sim.raycalls): what a call adds when its caller / callee has not started one
    # for rpc_cold_after seconds (none within rpc_warm_within: back to back); all 0: no law
    rpc_cold_round_trip: float = 1.178e-3
    rpc_cold_caller_cpu: float = 0.5635e-3
    rpc_cold_callee_cpu: float = 0.4485e-3
    rpc_warm_within: float = 1.163e-3
    rpc_cold_after: float = 12.35e-3
    # the warm-up debt (conduit.sim.coldwork): what each of DQN's per-round primitives adds when its thread has not
    # run it for wake_cold_after seconds (none within wake_warm_within); all 0: no debt
    wake_runner_call: float = 1.456e-3
    wake_set_state: float = 0.5551e-3
    wake_get_state: float = 0.4795e-3
    wake_replay_add: float = 0.7080e-3
    wake_replay_sample: float = 0.7317e-3
    wake_update: float = 1.380e-3
    wake_warm_within: float = 1.0e-3
    wake_cold_after: float = 10.0e-3
    # a fresh mapping's first touch (conduit.fresh_mapping): a block above glibc's mmap ceiling costs
    # fresh_map_per_byte more than a pre-faulted one, and reported_map_per_byte more on the share its host has
    # taken back (0 up to reported_ramp_from seconds since the learner last freed one, all from reported_ramp_to);
    # all 0: off (the built-in costs; conduit calibrate measures them: host.fresh_mapping)
    fresh_map_per_byte: float = 0.0
    reported_map_per_byte: float = 0.0
    reported_ramp_from: float = 0.0
    reported_ramp_to: float = 0.0

    def __post_init__(self) -> None:
        if self.rpc_cold_after > 0 and self.rpc_warm_within > self.rpc_cold_after:
            raise ConduitError(f"rpc_warm_within ({self.rpc_warm_within!r} s) must not exceed rpc_cold_after "
                               f"({self.rpc_cold_after!r} s): a call is warm up to the first and cold from the second")
        if self.reported_ramp_from > self.reported_ramp_to:
            raise ConduitError(f"reported_ramp_from ({self.reported_ramp_from!r} s) must not exceed reported_ramp_to "
                               f"({self.reported_ramp_to!r} s): none of a fresh mapping is on reported memory up to "
                               f"the first and all of it from the second")
        if self.wake_cold_after > 0 and self.wake_warm_within > self.wake_cold_after:
            raise ConduitError(f"wake_warm_within ({self.wake_warm_within!r} s) must not exceed wake_cold_after "
                               f"({self.wake_cold_after!r} s): work is warm up to the first and cold from the second")

    def without_cold_calls(self) -> StockCosts:
        """These costs with the cold-call law off (no ramp: every call at its back-to-back cost); the surcharges
        stay, unread (:class:`~conduit.sim.raycalls.ColdRamp`)."""
        from dataclasses import replace

        return replace(self, rpc_warm_within=0.0, rpc_cold_after=0.0)

    def without_warm_up_debt(self) -> StockCosts:
        """These costs with the warm-up debt off (:mod:`conduit.sim.coldwork`: every primitive at its back-to-back
        cost); the figures stay, unread."""
        from dataclasses import replace

        return replace(self, wake_warm_within=0.0, wake_cold_after=0.0)

    def sample_serialize(self, episodes: float, steps: float, nbytes: float) -> float:
        """EnvRunner side of returning sampled episodes (one object: Ray's serializer over the list, its
        arrays copied into the object store): a put, each episode's and each step's share, the bytes."""
        return (self.put_per_call + episodes * self.sample_serialize_per_episode + steps * self.sample_serialize_per_step
                + nbytes / self.serialize_bandwidth)

    def sample_deserialize(self, episodes: float, steps: float, nbytes: float) -> float:
        """Receiving side of sampled episodes (driver ``ray.get``, or a learner resolving refs): a
        fixed get plus each episode's and each step's share of deserialising the list; numpy arrays are
        read zero-copy (``nbytes`` is only charged if ``deserialize_bandwidth`` is made finite)."""
        return (self.get_per_object + episodes * self.sample_deserialize_per_episode
                + steps * self.sample_deserialize_per_step + nbytes / self.deserialize_bandwidth)

    def shard_serialize(self, episodes: float, steps: float, nbytes: float) -> float:
        """Driver side of ``LearnerGroup.update``: a shard of episodes as an actor-call argument
        (serialised as one list, its arrays copied into the object store)."""
        return (self.put_per_call + episodes * self.shard_serialize_per_episode + steps * self.shard_serialize_per_step
                + nbytes / self.serialize_bandwidth)

    def shard_deserialize(self, episodes: float, steps: float, nbytes: float) -> float:
        """Learner side of a shard: the argument's get, each episode's and each step's share."""
        return (self.get_per_object + episodes * self.shard_deserialize_per_episode
                + steps * self.shard_deserialize_per_step + nbytes / self.deserialize_bandwidth)

    def buffer_add(self, steps: float) -> float:
        """One ``EpisodeReplayBuffer.add`` call of ``steps`` env steps."""
        return self.buffer_add_per_call + steps * self.buffer_add_per_step

    def buffer_sample(self, items: float) -> float:
        """One ``EpisodeReplayBuffer.sample(num_items=items)`` call."""
        return self.buffer_sample_per_call + items * self.buffer_sample_per_item

    def buffer_update_priorities(self, items: float) -> float:
        """``update_priorities_in_episode_replay_buffer`` after an update (a prioritized buffer only)."""
        return self.buffer_update_priorities_per_call + items * self.buffer_update_priorities_per_item

    def learner_results(self, results: int) -> float:
        """DQN's driver after one ``LearnerGroup.update`` that returned ``results`` learner results."""
        return self.learner_results_per_call + results * self.learner_results_per_result

    def connector(self, samples: float, episodes: float, nbytes: float) -> float:
        """RLlib's learner connector over one batch of ``samples`` timesteps in ``episodes`` episode objects
        (every piece of the pipeline visits each episode in Python) holding ``nbytes`` of observations."""
        return (self.connector_per_call + samples * self.connector_per_sample + episodes * self.connector_per_episode
                + nbytes * self.connector_per_byte)

    def fresh_map(self, nbytes: float, idle_s: float) -> float:
        """The extra seconds of building a block of ``nbytes`` (the learner connector's train batch) in fresh
        memory, ``idle_s`` seconds after the process last freed such a block (:mod:`conduit.fresh_mapping`):
        nothing at or below glibc's mmap ceiling (the allocator reuses what was freed), above it the fresh
        mapping's first touch, and the reported share's."""
        if nbytes <= MMAP_CEILING_BYTES:
            return 0.0
        share = linear_ramp(idle_s, self.reported_ramp_from, self.reported_ramp_to) if self.reported_map_per_byte > 0 else 0.0
        return nbytes * (self.fresh_map_per_byte + share * self.reported_map_per_byte)

    def to_tensor(self, nbytes: float) -> float:
        return self.to_tensor_per_call + nbytes * self.to_tensor_per_byte


#: the microbenchmark file every measured :class:`PlaneCosts` default comes from (``conduit calibrate
#: --plane-json FILE`` writes one; :func:`conduit.sim.cost_file.load_plane_costs` reads it)
PLANE_PRIMITIVES_FILE = "benchmarks/plane_primitives.2core-vm.json"
#: PlaneCosts field -> (measurement of :data:`PLANE_PRIMITIVES_FILE`, which figure of it)
PLANE_SOURCES: dict[str, tuple[str, str]] = {
    "call_round_trip": ("plane_actor_call", "latency: a PlaneActor call with no payload, wall, caller to reply"),
    "ingest_per_call": ("plane_ingest", "latency: in-process ExperiencePlane.ingest, per call"),
    "ingest_copy_bandwidth": ("plane_ingest", "bandwidth: in-process ExperiencePlane.ingest, per byte"),
    "deliver_per_call": ("plane_deliver", "latency: in-process ExperiencePlane.next_batch + release, per call"),
    "deliver_copy_bandwidth": ("plane_deliver", "bandwidth: in-process next_batch's copy out, per byte"),
    "pack_bandwidth": ("memcpy", "bandwidth: one-thread numpy copy (an EnvRunner packing its columns)"),
    "actor_callee_cpu": ("plane_actor_callee", "latency: a PlaneActor process's CPU per control call it serves"),
    "replay_draw_per_call": ("plane_replay_draw", ("latency: a PlaneActor process's CPU per prioritized Replay "
                                                  "next_batch call")),
    "replay_draw_rows_per_s": ("plane_replay_draw", "bandwidth: the same, rows per second"),
    "priorities_per_call": ("plane_replay_priorities", "latency: a PlaneActor process's CPU per update_priorities call"),
    "priorities_rows_per_s": ("plane_replay_priorities", "bandwidth: the same, rows per second"),
    "rebuild_per_call": ("plane_rebuild", "latency: a learner's rebuild_trajectories of a delivered batch, per call"),
    "rebuild_runs_per_s": ("plane_rebuild", "bandwidth: the same, episode runs per second"),
}
#: PlaneCosts fields of the cold-call law (:mod:`conduit.sim.raycalls`), from a calibration that measured them
#: (``conduit calibrate`` since 2026-12-07); merged into :data:`PLANE_PRIMITIVES_FILE` on 2026-12-07, each the median
#: of three runs (the file's ``notes``); a calibration without them keeps the built-in values
PLANE_COLD_SOURCES: dict[str, tuple[str, str]] = {
    "cold_call_round_trip": ("plane_actor_call_cold",
                             "latency: what a cold PlaneActor control call adds to its round trip"),
    "cold_callee_cpu": ("plane_actor_callee_cold", "latency: what a cold control call adds to the actor's CPU"),
    "cold_draw": ("plane_replay_draw_cold", "latency: what a cold replay draw adds to the actor's CPU"),
    "cold_priorities": ("plane_replay_priorities_cold", "latency: what a cold priority update adds to the actor's CPU"),
}


@dataclass(frozen=True)
class PlaneCosts:
    """Conduit's own costs: the plane's primitives as ``conduit calibrate`` measures them.

    The measured fields (:data:`PLANE_SOURCES`) default to :data:`PLANE_PRIMITIVES_FILE`, measured on
    the 2-core development VM; ``conduit sim --plane-costs FILE`` (a calibration JSON or a mapping of
    these fields, :mod:`conduit.sim.cost_file`) replaces them. No end-to-end figure feeds any of them.

    The rest are **runtime settings**, not costs: ``enable()``'s defaults, restated so the simulator
    does not import the runtime (``tests/test_sim_deployed.py`` checks they equal the runtime's):
    ``inline_bytes`` (``enable(inline_bytes=)``, chunks below it travel inside the call),
    ``coalesce_s`` and ``max_coalesced_calls`` (``enable(coalesce_s=)``, DQN/SAC: an EnvRunner's
    sender gathers sample calls for that long, at most :data:`~conduit.runtime.rllib.env_runner.MAX_IN_FLIGHT`
    of them), ``max_in_flight`` (unacknowledged chunks per EnvRunner before ``sample()`` waits), and
    ``return_inline_bytes`` (Ray returns a smaller actor result inside the reply, a larger one
    through the object store: Ray's ``max_direct_call_object_size``, 100 KiB). PPO's stream chunk
    size and the prefetch depth are not restated: the simulator calls the functions the runtime uses
    (:mod:`conduit.deploy_settings`).

    ``actor_callee_cpu`` is Ray's side of every call a plane actor serves (the task's dispatch, the
    arguments' deserialisation, the reply's serialisation), on the actor's own core; the in-process
    ``ingest_*``/``deliver_*`` figures do not contain it. ``replay_draw_*`` and ``priorities_*`` are
    whole calls as the actor's process pays them, Ray's side included: a prioritized Replay table's
    ``next_batch`` of n rows and its ``update_priorities`` of n ids (DQN under ``enable()``), per call
    and per row, on CartPole-sized rows; a larger row's bytes are copied out at
    ``deliver_copy_bandwidth`` besides.

    ``rebuild_per_call`` and ``rebuild_runs_per_s`` are the learner's side of every trajectory batch under
    ``enable()`` (``layout.py: rebuild_trajectories``: one ``SingleAgentEpisode`` per episode run, so that
    RLlib's own learner connector builds the train batch), on CartPole-sized rows; a larger row's
    observations are concatenated with the run's final one, a copy at ``pack_bandwidth`` besides
    (:meth:`rebuild`).

    ``device_sample_per_call`` is the design target's on-device replay gather (``conduit-target``
    only; the deployed runtime has no device tier under ``enable()``): an assumption, not measured.
    """

    # the measured fields restate PLANE_PRIMITIVES_FILE (4 significant digits; the file is not in an
    # installed wheel, so the defaults must carry it; tests/test_sim_deployed.py checks they agree)
    call_round_trip: float = 1.118e-3
    ingest_per_call: float = 148.2e-6
    ingest_copy_bandwidth: float = 6.256e9
    deliver_per_call: float = 262.1e-6
    deliver_copy_bandwidth: float = 5.929e9
    pack_bandwidth: float = 1.318e9
    inline_bytes: float = 256 * 1024
    coalesce_s: float = 0.1
    max_coalesced_calls: int = 16
    max_in_flight: int = 16
    return_inline_bytes: float = 100 * 1024
    device_sample_per_call: float = 50e-6
    actor_callee_cpu: float = 486.9e-6
    replay_draw_per_call: float = 1.617e-3
    replay_draw_rows_per_s: float = 162.4e3
    priorities_per_call: float = 864.3e-6
    priorities_rows_per_s: float = 786.2e3
    rebuild_per_call: float = 0.0
    rebuild_runs_per_s: float = 32.84e3
    # the cold-call law (conduit.sim.raycalls) on the plane actor's side (PLANE_COLD_SOURCES, the same file)
    cold_call_round_trip: float = 1.223e-3
    cold_callee_cpu: float = 563.8e-6
    cold_draw: float = 893.9e-6
    cold_priorities: float = 571.1e-6

    def scaled(self, factor: float) -> PlaneCosts:
        """Every measured cost multiplied by ``factor`` (times up, bandwidths down); settings kept.
        ``factor=0`` makes the plane's calls and copies free (the design target's assumption)."""
        from dataclasses import replace

        inf = math.inf
        return replace(self, call_round_trip=self.call_round_trip * factor,
                       ingest_per_call=self.ingest_per_call * factor,
                       deliver_per_call=self.deliver_per_call * factor,
                       ingest_copy_bandwidth=self.ingest_copy_bandwidth / factor if factor else inf,
                       deliver_copy_bandwidth=self.deliver_copy_bandwidth / factor if factor else inf,
                       pack_bandwidth=self.pack_bandwidth / factor if factor else inf,
                       actor_callee_cpu=self.actor_callee_cpu * factor,
                       replay_draw_per_call=self.replay_draw_per_call * factor,
                       replay_draw_rows_per_s=self.replay_draw_rows_per_s / factor if factor else inf,
                       priorities_per_call=self.priorities_per_call * factor,
                       priorities_rows_per_s=self.priorities_rows_per_s / factor if factor else inf,
                       rebuild_per_call=self.rebuild_per_call * factor,
                       rebuild_runs_per_s=self.rebuild_runs_per_s / factor if factor else inf,
                       cold_call_round_trip=self.cold_call_round_trip * factor,
                       cold_callee_cpu=self.cold_callee_cpu * factor, cold_draw=self.cold_draw * factor,
                       cold_priorities=self.cold_priorities * factor)

    def rebuild(self, runs: float, nbytes: float) -> float:
        """A learner's ``rebuild_trajectories`` of a delivered batch of ``runs`` episode runs and ``nbytes``
        of rows: the episode objects, and the observations copied once (concatenated with each run's final
        observation) at ``pack_bandwidth``."""
        return self.rebuild_per_call + runs / self.rebuild_runs_per_s + nbytes / self.pack_bandwidth

    def replay_draw(self, rows: float) -> float:
        """The plane actor's CPU for one prioritized draw call of ``rows`` rows, Ray's side included."""
        return self.replay_draw_per_call + rows / self.replay_draw_rows_per_s

    def priorities(self, rows: float) -> float:
        """The plane actor's CPU for one priority update call of ``rows`` ids, Ray's side included."""
        return self.priorities_per_call + rows / self.priorities_rows_per_s
