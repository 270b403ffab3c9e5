"""A collector worker's own shared-memory ring to the plane: the one code path the replay buffer
(:class:`~conduit.runtime.torchrl.replay.ConduitReplayBuffer`) and the PPO feed
(:class:`~conduit.runtime.torchrl.onpolicy.OnPolicyFeed`) share.

TorchRL's multi-process collectors pickle the ``replay_buffer=`` object once for every worker process
(``torchrl/collectors/_multi_base.py``: ``_run_processes`` passes it in each ``Process``'s arguments;
with ``spawn``/``forkserver`` each is pickled on its own). So the object, when pickled in the process
that owns the plane, calls :meth:`WorkerRing.attach`: a new ring is attached to the plane
(:meth:`~conduit.runtime.plane.ExperiencePlane.attach_producer`) and its picklable spec travels in the
pickled state, to exactly one worker. The worker opens the ring (a
:class:`~conduit.runtime.shm_ring.RingProducer`) at its first write: one copy into shared memory, which
the plane's ring thread ingests; the learner's process is not on the way. Each worker holds only its
own ring's pipe end, so the plane sees a worker's death as its ring's end closing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conduit.runtime.plane import ExperiencePlane


class WorkerRing:
    """One worker's ring: ``name`` is the producer's name in the plane (its chunk ids start with it)."""

    def __init__(self, spec: Any, name: str):
        self.spec = spec
        self.name = name
        self._producer: Any = None

    @classmethod
    def attach(cls, plane: ExperiencePlane, name: str, ring_bytes: int) -> WorkerRing:
        """In the plane's process, while pickling for a worker: a new ring of ``ring_bytes`` for it."""
        return cls(plane.attach_producer(name, ring_bytes=ring_bytes), name)

    def write(self, columns: Mapping[str, Any], **kwargs: Any) -> Any:
        """In the worker: write one chunk (:meth:`RingProducer.write` arguments), opening the ring first."""
        if self._producer is None:
            from conduit.runtime.shm_ring import RingProducer

            self._producer = RingProducer(self.spec)
        return self._producer.write(columns, **kwargs)

    def close(self) -> None:
        """The worker is done writing (its records stay until the plane ingests them)."""
        if self._producer is not None:
            self._producer.close()
            self._producer = None

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.spec, self.name, self._producer = state["spec"], state["name"], None

    def __repr__(self) -> str:
        return f"WorkerRing({self.name!r})"
