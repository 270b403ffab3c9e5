"""``ConduitReplayBuffer``: TorchRL's ``TensorDictReplayBuffer`` whose data, sampling and priorities
are the plane's Replay table.

**Adoption.** One line: the buffer a TorchRL script builds becomes Conduit's, with the same arguments::

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=256)
    rb = ConduitReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=256)   # or capacity=100_000

    rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(N), batch_size=256)
    rb = ConduitReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(N), batch_size=256)

The storage given is read for its ``max_size`` only: the data lives in the plane.

**Why a buffer subclass, not a storage.** TorchRL's writer and sampler choose the storage indices, so a
storage alone could neither assemble a batch itself nor let the auditor see which samples a batch
holds. The subclass overrides the buffer's public entry points (``extend``, ``add``, ``sample``,
``update_priority``, ``update_tensordict_priority``, ``empty``, ``__len__``, ``write_count``,
``share``, pickling) and keeps TorchRL's own parts where they still mean something (transforms,
``priority_key``, the ``"index"`` and ``"priority_weight"`` entries of a sample). The storage, sampler
and writer objects TorchRL's base class builds stay unused, except a stand-in storage
(:class:`PlaneStorage`) that answers ``len()`` and ``initialized`` (False until the layout is known, so
that a multi-process collector writes its one fake frame, which builds the plane, and empties it
before it pickles the buffer). Nothing of TorchRL is patched.

**The data path.**

* ``extend(td)`` in the process that built the buffer: every batch dimension of ``td`` is flattened
  into steps (:mod:`~conduit.runtime.torchrl.columns`), and the columns (views of the tensors) are
  ingested as one chunk (:meth:`~conduit.runtime.plane.ExperiencePlane.ingest`: one copy into the
  plane's memory). It returns the samples' ids and sets ``td["index"]``, as TorchRL does; priorities in
  ``td[priority_key]`` are applied to them.
* ``extend(td)`` in a collector worker: TorchRL's multi-process collectors call ``share()`` on the
  buffer and pickle it to each worker (``torchrl/collectors/_multi_base.py``:
  ``_setup_multi_replay_buffer``, ``_run_processes``), and the worker's collector calls ``extend``
  (``torchrl/collectors/_runner.py``: ``_main_async_collector``). Each pickling of the buffer attaches
  a new shared-memory ring to the plane (:meth:`~conduit.runtime.plane.ExperiencePlane.attach_producer`)
  and the copy a worker unpickles writes to its own ring (:class:`~conduit.runtime.shm_ring.RingProducer`):
  one copy into shared memory, picked up by the plane's ring thread; the main process is not on the way.
  Worker processes must be started with ``spawn`` or ``forkserver`` (TorchRL's default on Linux is
  ``spawn``); the buffer refuses an ``extend`` from a forked copy, which has no ring.
* ``sample()``: the plane draws the batch with the contract's sampler
  (:mod:`conduit.plane.sampler`: uniform, or prioritized with importance weights) and gathers its rows
  into a batch in the learner's tier, reporting the draw and the delivery to the auditor. The
  TensorDict handed back wraps that batch memory without a copy; the batch goes back to the plane
  when the last tensor viewing it is freed (a TensorDict the caller keeps holds plane memory; a
  ``clone()`` does not). ``"index"`` holds the samples' plane ids: opaque integers, never reused, valid
  for ``update_priority`` (an id evicted since is dropped and counted: ``priority_updates_dropped``).
  Prioritized samples carry ``"priority_weight"`` (what TorchRL's losses multiply by).

**The rate limiter** is the contract's (``replay_ratio``, ``min_size``, ``error_buffer``); by default
(``replay_ratio=None``) there is none, as in TorchRL: inserts never wait and a sample waits only for
data. When ``replay_ratio`` is set, a producer ahead of the learner waits - which deadlocks when the
same thread both extends and samples (a single-process ``Collector(replay_buffer=rb)`` iterated by the
training loop): nothing else would sample. So a call that could only be unblocked by the calling
thread itself does not wait: ``extend`` from a thread that samples, and ``sample`` from a thread that
extends when it is the only one that ever wrote (no other thread, no worker attached), fail at once
with an error that says why, instead of hanging.

**The audit** is the plane's, live: :meth:`ConduitReplayBuffer.audit`, :meth:`ConduitReplayBuffer.stats`
(TorchRL's stats with the plane's metrics and the audit's violations), and the final report from
:meth:`ConduitReplayBuffer.close`.
"""

from __future__ import annotations

import itertools
import logging
import math
import multiprocessing as mp
import os
import threading
import weakref
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.data.replay_buffers import RandomSampler, TensorDictReplayBuffer
from torchrl.data.replay_buffers.storages import Storage

from conduit.audit import AuditReport
from conduit.contracts import Prioritized, Replay
from conduit.errors import ConduitError, PlaneFullError
from conduit.runtime.plane import DeliveryTimeout, ExperiencePlane
from conduit.runtime.torchrl.columns import TensorDictLayout
from conduit.runtime.torchrl.rings import WorkerRing

log = logging.getLogger("conduit.runtime.torchrl")

NO_LIMIT_BAND = 1e18
"""The rate band's half-width (steps) when no ``replay_ratio`` is given: inserts are never held back."""

_REFUSED = {  # TorchRL ReplayBuffer arguments this buffer cannot honour, and why
    "writer": "the plane's FIFO table decides what is evicted",
    "collate_fn": "batches are assembled by the plane",
    "pin_memory": "batches are assembled by the plane",
    "prefetch": "the plane assembles the next batch itself",
    "dim_extend": "every batch dimension is flattened into steps",
    "checkpointer": "checkpoints are the plane's (ExperiencePlane.snapshot)",
    "consume_after_n_samples": "the Replay contract samples with replacement",
    "compilable": "the buffer is not torch.compile-able",
    "delayed_init": "the plane is built at the first extend (or from example=)",
    "transform_factory": "pass transform= instead",
    "sample_unit": "samples are single steps",
    "generator": "the plane samples with its own numpy generator: pass seed=",
}


_BUFFER_KEYS = ("index", "priority_weight")
"""Entries the buffer itself writes into TensorDicts (ids, importance weights): never stored as columns."""


def _buffer_keys(td: TensorDictBase) -> list[str]:
    return [k for k in _BUFFER_KEYS if td.get(k, None) is not None]


class TorchRLSettingError(ConduitError, ValueError):
    """A ConduitReplayBuffer argument that cannot be honoured; the message names it and says why."""


class PlaneStorage(Storage):
    """The stand-in storage TorchRL's buffer base class holds: it has no data (the plane has), answers
    ``len()`` with the plane's live samples and ``initialized`` once the buffer knows its layout."""

    @property
    def initialized(self) -> bool:
        """Whether the buffer knows its layout. A multi-process collector given a buffer that does not
        yet extends it with one fake frame and then empties it (``_check_replay_buffer_init``): that
        builds the plane before the buffer is pickled to the workers."""
        owner = self._owner() if self._owner is not None else None
        return owner is None or owner.layout is not None

    def __init__(self, max_size: int):
        super().__init__(max_size=max_size)
        self._owner: Any = None

    def _refuse(self, what: str) -> ConduitError:
        return ConduitError(f"ConduitReplayBuffer: the plane holds the data; storage.{what} is not available "
                            "(use the buffer's extend / sample)")

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        raise self._refuse("set")

    def get(self, index: Any) -> Any:
        raise self._refuse("get")

    def __len__(self) -> int:
        owner = self._owner() if self._owner is not None else None
        return len(owner) if owner is not None else 0

    def state_dict(self) -> dict[str, Any]:
        raise self._refuse("state_dict")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise self._refuse("load_state_dict")

    def _empty(self) -> None:
        pass

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_owner"] = None
        return state


def _no_collate(data: Any) -> Any:
    """The base class's collate function, never called (the plane assembles batches)."""
    return data


def _contract(capacity: int, batch_size: int, sampler: str | Prioritized, replay_ratio: float | None,
              min_size: int | None, error_buffer: float | None) -> Replay:
    if replay_ratio is None:
        if error_buffer is not None:
            raise TorchRLSettingError("error_buffer is the rate limiter's band; it needs replay_ratio")
        return Replay(capacity, 1.0, 0 if min_size is None else min_size, sampler, error_buffer=NO_LIMIT_BAND)
    return Replay(capacity, replay_ratio, batch_size if min_size is None else min_size, sampler,
                  error_buffer=error_buffer)


class ConduitReplayBuffer(TensorDictReplayBuffer):
    """A ``TensorDictReplayBuffer`` backed by Conduit's experience plane (see the module doc).

    ``capacity`` (or the ``max_size`` of a TorchRL ``storage``) is the table's size in steps;
    ``batch_size`` the steps per sample. ``alpha``/``beta`` (or ``sampler=Prioritized(alpha, beta)``)
    select prioritized sampling; ``sampler=None`` or a TorchRL ``RandomSampler`` is uniform.
    ``replay_ratio``/``min_size``/``error_buffer`` declare a rate limiter (:class:`~conduit.contracts.Replay`;
    none by default). ``example`` (a TensorDict) or ``layout`` fixes the columns before the first
    extend (needed to pickle the buffer to collector workers before anything was written).
    ``policy``/``plane_options`` configure the plane (:class:`~conduit.runtime.plane.ExperiencePlane`
    keyword arguments: ``capacities``, ``topology``, ``recovery_dir``...). ``sample_timeout`` bounds
    how long ``sample`` waits for data, ``extend_timeout`` how long an insert waits for room.
    """

    def __init__(
        self,
        *,
        batch_size: int,
        capacity: int | None = None,
        storage: Storage | None = None,
        sampler: Any = None,
        alpha: float | None = None,
        beta: float | None = None,
        priority_key: str = "td_error",
        replay_ratio: float | None = None,
        min_size: int | None = None,
        error_buffer: float | None = None,
        transform: Any = None,
        example: TensorDictBase | None = None,
        layout: TensorDictLayout | None = None,
        policy: str = "conduit",
        plane_options: Mapping[str, Any] | None = None,
        sample_timeout: float = 30.0,
        extend_timeout: float = 30.0,
        ring_bytes: int = 64 << 20,
        seed: int | None = None,
        shared: bool = False,
        **torchrl_kwargs: Any,
    ):
        for name, value in torchrl_kwargs.items():
            if name in _REFUSED:
                if value not in (None, False, 0):
                    raise TorchRLSettingError(f"ConduitReplayBuffer: {name}={value!r} is not supported: {_REFUSED[name]}")
            else:
                raise TypeError(f"ConduitReplayBuffer got an unexpected keyword argument {name!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise TorchRLSettingError(f"ConduitReplayBuffer: batch_size must be a positive integer, got {batch_size!r} "
                                      "(the plane assembles batches of a fixed size)")
        capacity = self._capacity_of(capacity, storage)
        spec = self._sampler_of(sampler, alpha, beta)
        self._contract = _contract(capacity, batch_size, spec, replay_ratio, min_size, error_buffer)
        for name, value in (("sample_timeout", sample_timeout), ("extend_timeout", extend_timeout)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise TorchRLSettingError(f"ConduitReplayBuffer: {name} must be a finite number of seconds >= 0, "
                                          f"got {value!r}")
        self._plane_kwargs = {"policy": policy, "seed": seed, **dict(plane_options or {})}
        self._sample_timeout = float(sample_timeout)
        self._extend_timeout = float(extend_timeout)
        self._ring_bytes = int(ring_bytes)
        self._plane: ExperiencePlane | None = None
        self._layout: TensorDictLayout | None = None
        self._role = "main"
        self._owner_pid = os.getpid()
        self._ring: WorkerRing | None = None  # in a collector worker's copy: its own ring to the plane
        self._chunk_seq = itertools.count()
        self._workers = 0  # rings attached (one per pickling of the buffer)
        self._write_counter = mp.Value("q", 0)
        self._leases: deque = deque()  # batches whose tensors are gone, to hand back to the plane
        self._sampling_threads: set[int] = set()
        self._extending_threads: set[int] = set()
        plane_storage = PlaneStorage(capacity)
        super().__init__(priority_key=priority_key, storage=plane_storage, sampler=RandomSampler(),
                         batch_size=batch_size, transform=transform, shared=shared, collate_fn=_no_collate)
        plane_storage._owner = weakref.ref(self)
        if layout is not None or example is not None:
            if layout is None:
                meta = _buffer_keys(example)
                layout = TensorDictLayout.infer(example.exclude(*meta) if meta else example)
            self._build_plane(layout)

    # ------------------------------------------------------------------ settings
    @staticmethod
    def _capacity_of(capacity: int | None, storage: Storage | None) -> int:
        if storage is not None:
            if not isinstance(storage, Storage):
                raise TorchRLSettingError(f"ConduitReplayBuffer: storage must be a TorchRL Storage (read for its "
                                          f"max_size), got {type(storage).__name__}")
            if getattr(storage, "ndim", 1) != 1:
                raise TorchRLSettingError(f"ConduitReplayBuffer: storage has ndim={storage.ndim}; only one-dimensional "
                                          "storages map to the plane's table of steps")
            if capacity is not None and int(capacity) != int(storage.max_size):
                raise TorchRLSettingError(f"ConduitReplayBuffer: capacity={capacity} but storage.max_size="
                                          f"{storage.max_size}; give one of them")
            capacity = int(storage.max_size)
        if capacity is None:
            raise TorchRLSettingError("ConduitReplayBuffer: give capacity= (steps) or a storage= with a max_size")
        if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer) or capacity <= 0:
            raise TorchRLSettingError(f"ConduitReplayBuffer: capacity must be a positive integer, got {capacity!r}")
        return int(capacity)

    @staticmethod
    def _sampler_of(sampler: Any, alpha: float | None, beta: float | None) -> str | Prioritized:
        if alpha is not None or beta is not None:
            if sampler is not None:
                raise TorchRLSettingError("ConduitReplayBuffer: give alpha=/beta= or sampler=, not both")
            if alpha is None or beta is None:
                raise TorchRLSettingError("ConduitReplayBuffer: prioritized sampling needs both alpha= and beta=")
            return Prioritized(alpha, beta)
        if sampler is None or sampler == "uniform" or type(sampler) is RandomSampler:
            return "uniform"
        if isinstance(sampler, Prioritized):
            return sampler
        if type(sampler).__name__ == "PrioritizedSampler":
            raise TorchRLSettingError("ConduitReplayBuffer: sampler=PrioritizedSampler(...) is TorchRL's own (its "
                                      "C++ sum tree); pass alpha= and beta= and the plane samples by priority")
        raise TorchRLSettingError(f"ConduitReplayBuffer: sampler={type(sampler).__name__} is not supported: the "
                                  "plane samples single steps with replacement, uniformly or by priority "
                                  "(sampler=None, RandomSampler(), or alpha=/beta=)")

    @property
    def contract(self) -> Replay:
        """The Replay contract the plane enforces and the auditor checks."""
        return self._contract

    @property
    def prioritized(self) -> bool:
        return isinstance(self._contract.sampler, Prioritized)

    @property
    def layout(self) -> TensorDictLayout | None:
        """The TensorDict <-> column mapping (None before the first extend without ``example``)."""
        return self._layout

    @property
    def plane(self) -> ExperiencePlane:
        """The plane (built at the first extend, or from ``example``/``layout``); main process only."""
        return self._main_plane("plane")

    def _build_plane(self, layout: TensorDictLayout) -> None:
        self._layout = layout
        self._plane = ExperiencePlane(layout.schema, self._contract, batch_steps=self._batch_size,
                                      **self._plane_kwargs)
        log.info("ConduitReplayBuffer: plane built, %s, %s", self._contract, layout)

    def _main_plane(self, what: str) -> ExperiencePlane:
        if self._role != "main":
            raise ConduitError(f"ConduitReplayBuffer.{what}: this is a collector worker's copy of the buffer; it only "
                               "extends (through its ring); sample and manage the buffer in the process that built it")
        if os.getpid() != self._owner_pid:
            raise ConduitError(f"ConduitReplayBuffer.{what}: called in a forked copy of the buffer (pid {os.getpid()}, "
                               f"built in {self._owner_pid}); start collector workers with 'spawn' or 'forkserver' "
                               "so each gets its own ring")
        if self._plane is None:
            raise ConduitError(f"ConduitReplayBuffer.{what}: nothing was written yet, so the layout is unknown; "
                               "extend once, or pass example= (a TensorDict) or layout=")
        return self._plane

    # ------------------------------------------------------------------ writing
    def extend(self, tensordicts: TensorDictBase, *, update_priority: bool | None = None) -> torch.Tensor:
        """Write a batch of steps (every batch dimension flattened). Returns the samples' ids (and sets
        ``tensordicts["index"]``) in the main process; in a collector worker the write goes to the
        worker's ring and returns an empty index (ids are given when the plane ingests it)."""
        if not isinstance(tensordicts, TensorDictBase):
            raise TypeError(f"{type(self).__name__} only accepts TensorDictBase subclasses, got "
                             f"{type(tensordicts).__name__}")
        if self._transform is not None and len(self._transform):
            tensordicts = self._transform.inv(tensordicts)
        if tensordicts is None:
            return torch.zeros((0,), dtype=torch.long)
        data = tensordicts
        meta = _buffer_keys(data)
        if meta:  # what a buffer wrote into the TensorDict (a sample written back, a td extended twice)
            data = data.exclude(*meta)
        if self._role == "worker":
            return self._extend_worker(data)
        if self._plane is None and os.getpid() == self._owner_pid:
            self._build_plane(TensorDictLayout.infer(data))
        plane = self._main_plane("extend")
        self._drain_leases()
        cols = self._layout.columns(data)
        steps = self._layout.steps(data)
        me = threading.get_ident()
        self._extending_threads.add(me)
        waits = me not in self._sampling_threads or self._contract.error_buffer == NO_LIMIT_BAND
        try:
            cid = plane.ingest(cols, policy_version=plane.policy_version, producer="main",
                               timeout=self._extend_timeout if waits else 0.0)
        except PlaneFullError as exc:
            if waits:
                raise
            raise PlaneFullError(
                f"ConduitReplayBuffer.extend of {steps} steps: {exc}. This thread also samples, so waiting would "
                f"deadlock (nothing else would sample): sample more between extends (replay_ratio="
                f"{self._contract.replay_ratio:g}), widen error_buffer, or extend from another thread or a "
                "collector worker") from exc
        with self._write_counter.get_lock():
            self._write_counter.value += steps
        ids = plane.replay_ids(cid)
        index = torch.from_numpy(ids) if ids is not None else torch.full((steps,), -1, dtype=torch.long)
        tensordicts.set("index", index.reshape(tensordicts.batch_size) if tensordicts.batch_dims else index[0])
        if update_priority is not False and ids is not None:
            prio = tensordicts.get(self.priority_key, None)
            if prio is not None:
                self.update_priority(index, self._reduce_priority(prio, steps))
        return index

    def _extend_worker(self, td: TensorDictBase) -> torch.Tensor:
        if td.get(self.priority_key, None) is not None:
            raise ConduitError(f"ConduitReplayBuffer.extend in a collector worker: {self.priority_key!r} priorities "
                               "cannot travel through the worker's ring; update them from the learner")
        cols = self._layout.columns(td)
        steps = self._layout.steps(td)
        self._ring.write(cols, chunk_id=f"{self._ring.name}-{next(self._chunk_seq)}", policy_version=0,
                         checksum=False, timeout=self._extend_timeout)
        with self._write_counter.get_lock():
            self._write_counter.value += steps
        return torch.zeros((0,), dtype=torch.long)

    def add(self, data: TensorDictBase) -> int:
        """One step (a TensorDict with no batch dimension); returns its id."""
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"{type(self).__name__} only accepts TensorDictBase subclasses")
        if data.batch_dims:
            raise ConduitError(f"ConduitReplayBuffer.add takes one step (batch_size []), got batch_size "
                               f"{list(data.batch_size)}: use extend()")
        index = self.extend(data.unsqueeze(0))
        out = int(index[0]) if len(index) else -1
        data.set("index", torch.tensor(out))
        return out

    @property
    def write_count(self) -> int:
        """Steps written through extend/add, in every process (a counter in shared memory)."""
        return int(self._write_counter.value)

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int | None = None, return_info: bool = False,
               include_info: bool | None = None) -> Any:
        """A batch drawn by the plane's sampler: the rows, ``"index"`` (sample ids) and, prioritized,
        ``"priority_weight"``. The TensorDict views plane memory (see the module doc)."""
        if batch_size is not None and batch_size != self._batch_size:
            raise TorchRLSettingError(f"ConduitReplayBuffer.sample: batch_size={batch_size}, but the plane assembles "
                                      f"batches of {self._batch_size} (the buffer's batch_size)")
        plane = self._main_plane("sample")
        self._drain_leases()
        me = threading.get_ident()
        self._sampling_threads.add(me)
        alone = self._workers == 0 and self._extending_threads == {me}  # nobody else has ever written
        try:
            batch = plane.next_batch(timeout=0.0 if alone else self._sample_timeout)
        except DeliveryTimeout as exc:
            if not alone:
                raise
            raise DeliveryTimeout(f"ConduitReplayBuffer.sample: {exc}. This thread is the only one that writes to "
                                  "the buffer, so waiting would deadlock: extend first (min_size="
                                  f"{self._contract.min_size}, {len(self)} steps held)") from exc
        td = self._wrap(batch)
        info: dict[str, Any] = {"index": td.get("index")}
        if self.prioritized:
            info["priority_weight"] = td.get("priority_weight")
        if self._transform is not None and len(self._transform):
            td = self._transform(td)
        if return_info:
            return td, info
        return td

    def _wrap(self, batch: Any) -> TensorDictBase:
        """The batch as a TensorDict over its memory; the batch goes back to the plane (at the next
        call) once every tensor viewing it is gone."""
        views = {name: arr.view() for name, arr in batch.columns.items()}
        remaining = [len(views)]
        leases = self._leases
        lock = threading.Lock()

        def gone() -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                leases.append(batch)

        for arr in views.values():
            weakref.finalize(arr, gone)
        td = self._layout.tensordict(views)
        td.set("index", torch.from_numpy(np.asarray(batch.replay_ids, np.int64)))
        if self.prioritized:
            td.set("priority_weight", torch.from_numpy(np.asarray(batch.weights, np.float32)))
        return td

    def _drain_leases(self) -> None:
        while self._leases:
            try:
                batch = self._leases.popleft()
            except IndexError:
                return
            batch.release()

    # ------------------------------------------------------------------ priorities
    def _reduce_priority(self, priority: torch.Tensor, steps: int) -> torch.Tensor:
        """One priority per step: the max over a step's entries (TorchRL's default ``reduction="max"``)."""
        p = priority.detach().to("cpu", torch.float64)
        return p.reshape(steps, -1).amax(dim=1) if p.numel() != steps else p.reshape(steps)

    def update_priority(self, index: Any, priority: Any) -> None:
        """New priorities for sample ids from a batch's ``"index"``; ids evicted since are dropped and
        counted (``stats()["conduit"]["priority_updates_dropped"]``)."""
        plane = self._main_plane("update_priority")
        ids = torch.as_tensor(index).reshape(-1).to("cpu", torch.int64).numpy()
        prios = torch.as_tensor(priority).detach().reshape(-1).to("cpu", torch.float64).numpy()
        if prios.size == 1 and ids.size != 1:
            prios = np.full(ids.size, prios[0])
        plane.update_priorities(ids, prios)

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Priorities from ``data[priority_key]`` for the samples in ``data["index"]`` (TorchRL's
        ``update_tensordict_priority``; a missing key sets the largest priority seen, TorchRL's default)."""
        index = data.get("index")
        while index.ndim > 1:
            index = index[..., 0]
        n = index.numel()
        prio = data.get(self.priority_key, None)
        if prio is None:
            sampler = self._main_plane("update_tensordict_priority").replay_sampler
            value = float(getattr(sampler, "max_priority", 1.0))
            priority = torch.full((n,), value, dtype=torch.float64)
        else:
            priority = self._reduce_priority(prio, n)
        self.update_priority(index, priority)

    # ------------------------------------------------------------------ the rest of the buffer
    def __len__(self) -> int:
        if self._role != "main" or self._plane is None:
            return 0
        return self._plane.live_samples

    def empty(self, empty_write_count: bool = True) -> None:
        """Every sample leaves the table (evicted, audited as such); the write count restarts at 0."""
        if self._plane is not None:
            self._main_plane("empty").clear_table()
        if empty_write_count:
            with self._write_counter.get_lock():
                self._write_counter.value = 0

    def share(self, shared: bool = True) -> ConduitReplayBuffer:
        """TorchRL calls this before it pickles the buffer to collector workers: each pickling then
        attaches one ring for the worker that unpickles it (see the module doc)."""
        super().share(shared)
        return self

    def audit(self) -> AuditReport:
        """The live audit of the plane (``violations`` must stay 0)."""
        return self._main_plane("audit").audit()

    def metrics(self) -> dict[str, Any]:
        """The plane's metrics (docs/metrics.md): deliveries, priority updates and drops, evictions."""
        return self._main_plane("metrics").metrics()

    def stats(self) -> dict[str, Any]:
        """TorchRL's buffer stats, with the plane's counters and the live audit under ``"conduit"``."""
        out: dict[str, Any] = {"size": len(self), "capacity": self._contract.capacity,
                               "write_count": self.write_count, "batch_size": self._batch_size}
        if self._role == "main" and self._plane is not None:
            m = self._plane.metrics()
            audit = self._plane.audit()
            out["conduit"] = {k: m.get(k) for k in ("delivered_batches", "delivered_samples", "evicted_chunks",
                                                    "drawn", "priority_updates", "priority_updates_dropped",
                                                    "replay_sampler", "ring_rejected_chunks")}
            out["conduit"]["audit_violations"] = audit.violations
            out["conduit"]["workers"] = self._workers
        return out

    def close(self) -> AuditReport | None:
        """Close the plane and return its final audit (None if nothing was ever written)."""
        if self._role != "main" or self._plane is None:
            if self._ring is not None:
                self._ring.close()
            return None
        self._drain_leases()
        report = self._plane.close()
        log.info("ConduitReplayBuffer closed: %d audit violations", report.violations)
        return report

    def state_dict(self) -> dict[str, Any]:
        raise ConduitError("ConduitReplayBuffer.state_dict: checkpoint the plane instead (buffer.plane.snapshot())")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise ConduitError("ConduitReplayBuffer.load_state_dict: restore the plane instead (buffer.plane.restore())")

    # ------------------------------------------------------------------ pickling (collector workers)
    def __getstate__(self) -> dict[str, Any]:
        plane = self._main_plane("pickling for a collector worker")
        self._workers += 1
        ring = WorkerRing.attach(plane, f"torchrl-{self._owner_pid}-{self._workers}", self._ring_bytes)
        state = super().__getstate__()
        for key in ("_plane", "_leases", "_sampling_threads", "_extending_threads", "_chunk_seq"):
            state.pop(key, None)
        state.update(_role="worker", _ring=ring, _layout_dict=self._layout.to_dict(), _layout=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        layout = TensorDictLayout.from_dict(state.pop("_layout_dict"))
        super().__setstate__(state)
        self._layout = layout
        self._plane = None
        self._leases = deque()
        self._sampling_threads = set()
        self._extending_threads = set()
        self._chunk_seq = itertools.count()
