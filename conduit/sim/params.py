"""Cost parameters of the experience path, each with its source.

Two sets exist. :class:`StockCosts` are the CPU-side costs of stock Ray RLlib 2.60's experience
path (serialization, remote-call overhead, learner-connector work, replay-buffer copies). They were
fitted to the segment-by-segment measurements in ``shared/reference/rllib-2.60-stock-cpu.md``
(2-core VM, ray 2.60.0, torch 2.13.0; "ref" below) as follows:

* ``rpc_overhead`` — DQN's ``a`` is one remote call returning one ~2.8 KB step: 1.67 ms per call,
  so ~1.6 ms is the fixed round trip (ref, "DQN per env step").
* ``serialize_per_episode``/``deserialize_per_episode`` and the byte rates — from ``a`` and ``b`` of
  the PPO runs: CartPole moves ~180 short episodes and 0.33 MB (a = 9.1 ms, b = 6.9 ms), the
  84x84x4 run 10 episodes and 57.6 MB (a = 12.0 ms, b = 13.6 ms). Solving ``calls*rpc + episodes*e +
  bytes/bw`` for both gives e ~ 30 us per episode (split evenly between the two ends) and ~6.5 GB/s
  end-to-end (13 GB/s for each of serialize and deserialize).
* ``driver_bookkeeping`` — segment ``a2``, 0.7-0.8 ms for 2 runner results: 0.35 ms per result.
* ``connector_per_call``/``_per_sample``/``_per_byte`` — segment ``c``: 1.1 ms per DQN call (32
  rows), 4.7 ms for 4,000 CartPole rows, 21.1 ms for 2,000 rows of 28 KB. Fitting gives 1.1 ms +
  0.9 us per row + 0.32 ns per byte (~3.1 GB/s, the concatenation of observation arrays).
* ``to_tensor_per_call`` — segment ``d``: 0.14 ms per DQN call; 0.2-0.3 ms for PPO's one call.
* ``buffer_add_per_call``/``_per_step``/``buffer_sample_per_call`` — DQN: 0.47 ms per one-step add
  (``add`` deep-copies), 1.74 ms per sample (ref). The reference adds one step per call, so it cannot
  split the add into fixed and per-step parts; we assume 0.35 ms + 0.12 ms per step (an assumption,
  named so it can be changed).
* ``driver_loop_overhead`` — DQN: ~2.1 s per ~1,000-step iteration that the hooks could not
  attribute: 2.1 ms per training step.

CPU costs are per core of the reference VM. On cluster topologies they are divided by the node's
``cpu_speed`` attribute (default 1.0: a Sapphire Rapids or EPYC core is about as fast per thread as
the reference VM's core for this pointer-chasing, pickling-bound code — our estimate, stated here so
a reader can change it).

:class:`PlaneCosts` are Conduit's own costs: writing a chunk columnar into a preallocated staging
slot is a memcpy (``ingest_copy_bandwidth``), and the per-sample connector work is the same work as
stock's (we do not assume our batch building is cheaper; we only move it off the critical path).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from conduit.errors import ConduitError


@dataclass(frozen=True)
class StockCosts:
    """Stock RLlib 2.60 experience-path CPU costs (seconds, bytes/s), fitted to the reference."""

    rpc_overhead: float = 1.6e-3
    serialize_per_episode: float = 16e-6
    deserialize_per_episode: float = 16e-6
    serialize_bandwidth: float = 13e9
    deserialize_bandwidth: float = 13e9
    driver_bookkeeping: float = 0.35e-3
    connector_per_call: float = 1.1e-3
    connector_per_sample: float = 0.9e-6
    connector_per_byte: float = 0.32e-9
    to_tensor_per_call: float = 0.14e-3
    buffer_add_per_call: float = 0.35e-3
    buffer_add_per_step: float = 0.12e-3
    buffer_sample_per_call: float = 1.74e-3
    driver_loop_overhead: float = 2.1e-3

    def serialize(self, episodes: float, nbytes: float) -> float:
        return episodes * self.serialize_per_episode + nbytes / self.serialize_bandwidth

    def deserialize(self, episodes: float, nbytes: float) -> float:
        return episodes * self.deserialize_per_episode + nbytes / self.deserialize_bandwidth

    def connector(self, samples: float, nbytes: float, calls: int = 1) -> float:
        return calls * self.connector_per_call + samples * self.connector_per_sample + nbytes * self.connector_per_byte


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


def with_overrides(costs: Any, overrides: dict[str, Any] | None, source: str) -> Any:
    """``costs`` with fields replaced from a mapping; unknown names are an error naming ``source``."""
    if not overrides:
        return costs
    known = {f.name for f in fields(costs)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConduitError(f"{source}: unknown cost parameter(s) {unknown}; known: {sorted(known)}")
    return replace(costs, **{k: float(v) for k, v in overrides.items()})
