"""Cost parameters of the experience path, each with its source.

Two sets exist. :class:`StockCosts` are the CPU-side costs of stock Ray RLlib 2.60's experience
path (serialization, remote-call overhead, learner-connector work, replay-buffer copies). They were
fitted to the segment-by-segment measurements in ``shared/reference/rllib-2.60-stock-cpu.md``
(2-core VM, ray 2.60.0, torch 2.13.0; "ref" below) as follows:

* Per-step figures of the DQN run use its ~1,082 env steps per iteration (1,882 ms of sampling
  the buffer at 1.74 ms per call): a = 1.624 ms, b = 0.058 ms (a *local* learner: a function call),
  c = 1.012 ms, d = 0.128 ms, add = 0.453 ms, sample = 1.739 ms, and 2.98 ms per step the hooks
  could not attribute (``driver_loop_overhead``).
* ``rpc_overhead`` — DQN's ``a`` is one remote call returning one ~2.8 KB step: 1.624 ms, minus
  its (de)serialization, leaves 1.567 ms of fixed round trip. ``local_call_overhead`` is DQN's ``b``.
* ``sample_*_per_episode`` — PPO CartPole's ``a`` (9.1 ms, 2 runners, ~180 short episodes): the
  runner serializes its ~90 episodes while the driver deserializes both results in turn, so
  ``90 e + 2 (rpc/2 + 90 e) = 9.1 ms`` gives e = 27.8 us per episode per side.
* ``shard_*_per_episode`` — PPO CartPole's ``b`` (6.9 ms with a remote learner): ``rpc + 180 (e_s +
  e_d)`` gives 14.7 us per episode per side (the shard path handles episodes more cheaply).
* byte rates — the 84x84x4 run's ``a`` (12.0 ms for 2 x 28.8 MB) and ``b`` (13.6 ms for 57.6 MB)
  give 8.7 and 9.8 GB/s per side; we use 9.2 GB/s for both (each within 6%).
* ``driver_bookkeeping`` — segment ``a2``, 0.7-0.8 ms for 2 runner results: 0.35 ms per result.
* ``connector_per_*`` — segment ``c``: 1.012 ms per DQN call (32 rows, 1.7 KB) and 21.1 ms for the
  2,000 rows (56.5 MB) of the 84x84x4 run, with 4.7 ms for 4,000 CartPole rows: 0.983 ms per call +
  0.9 us per row + 0.324 ns per byte (~3.1 GB/s, concatenating observation arrays).
* ``to_tensor_*`` — segment ``d``: 0.128 ms per DQN call; 0.3 ms for the 56.5 MB PPO batch.
* ``buffer_*`` — DQN: 0.453 ms per one-step ``add`` (it deep-copies) and 1.739 ms per ``sample``.
  The reference adds one step per call, so it cannot split an add into fixed and per-step parts; we
  assume 0.35 ms + 0.103 ms per step (an assumption, named so it can be changed).

CPU costs are per core of the reference VM. On cluster topologies they are divided by the node's
``cpu_speed`` attribute (default 1.0: a Sapphire Rapids or EPYC core is about as fast per thread as
the reference VM's core for this pointer-chasing, pickling-bound code — our estimate, stated here so
a reader can change it).

:class:`PlaneCosts` are Conduit's own costs: writing a chunk columnar into a preallocated staging
slot is a memcpy (``ingest_copy_bandwidth``), and the per-sample connector work is the same work as
stock's (we do not assume our batch building is cheaper; we only move it off the critical path).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StockCosts:
    """Stock RLlib 2.60 experience-path CPU costs (seconds, bytes/s), fitted to the reference."""

    rpc_overhead: float = 1.567e-3
    local_call_overhead: float = 0.058e-3
    sample_serialize_per_episode: float = 27.8e-6
    sample_deserialize_per_episode: float = 27.8e-6
    shard_serialize_per_episode: float = 14.7e-6
    shard_deserialize_per_episode: float = 14.7e-6
    serialize_bandwidth: float = 9.2e9
    deserialize_bandwidth: float = 9.2e9
    driver_bookkeeping: float = 0.35e-3
    connector_per_call: float = 0.983e-3
    connector_per_sample: float = 0.9e-6
    connector_per_byte: float = 0.324e-9
    to_tensor_per_call: float = 0.128e-3
    to_tensor_per_byte: float = 3.0e-12
    buffer_add_per_call: float = 0.35e-3
    buffer_add_per_step: float = 0.103e-3
    buffer_sample_per_call: float = 1.739e-3
    driver_loop_overhead: float = 2.98e-3

    def sample_serialize(self, episodes: float, nbytes: float) -> float:
        """EnvRunner side of returning sampled episodes (pickling, object-store put)."""
        return episodes * self.sample_serialize_per_episode + nbytes / self.serialize_bandwidth

    def sample_deserialize(self, episodes: float, nbytes: float) -> float:
        """Receiving side of sampled episodes (driver ``ray.get``, or a learner resolving refs)."""
        return episodes * self.sample_deserialize_per_episode + nbytes / self.deserialize_bandwidth

    def shard_serialize(self, episodes: float, nbytes: float) -> float:
        """Driver side of ``LearnerGroup.update``: a shard of episodes as an actor-call argument."""
        return episodes * self.shard_serialize_per_episode + nbytes / self.serialize_bandwidth

    def shard_deserialize(self, episodes: float, nbytes: float) -> float:
        return episodes * self.shard_deserialize_per_episode + nbytes / self.deserialize_bandwidth

    def connector(self, samples: float, nbytes: float, calls: int = 1) -> float:
        return calls * self.connector_per_call + samples * self.connector_per_sample + nbytes * self.connector_per_byte

    def to_tensor(self, nbytes: float) -> float:
        return self.to_tensor_per_call + nbytes * self.to_tensor_per_byte


@dataclass(frozen=True)
class PlaneCosts:
    """Conduit's own per-chunk costs."""

    #: columnar write of a chunk into a preallocated staging slot: one memcpy, single core
    #: (~10 GB/s per core for large copies on DDR4/DDR5 servers; our measurement class, see
    #: benchmarks/ in the runtime issue)
    ingest_copy_bandwidth: float = 10e9
    #: fixed cost of one ingest call (slot reservation, metadata, audit event)
    ingest_per_call: float = 20e-6
    #: sampling a replay batch on the device: an index gather; fixed cost of the kernel launches
    device_sample_per_call: float = 50e-6
