"""TorchRL's PPO loop with its collectors writing to the plane and the plane feeding ``ClipPPOLoss``.

Stock TorchRL PPO (``torchrl/objectives/ppo.py`` with the loop of TorchRL's PPO tutorial and
``sota-implementations/ppo``): a multi-process collector's workers step their envs, each worker puts its
``[envs, frames]`` batch in a shared-memory buffer, the main process gathers the workers' batches into one
TensorDict, runs the advantage module (GAE: the value network over every observation and next
observation, then the backward recursion) and hands the result to the loss in minibatches.

Under Conduit (:class:`OnPolicyFeed`):

* **Producers.** The feed is passed to the collector as its ``replay_buffer=``, a public argument of
  ``MultiSyncCollector`` / ``MultiAsyncCollector`` (``torchrl/collectors/_multi_base.py``). The collector
  pickles it to every worker process (``_run_processes``: the ``replay_buffer`` kwarg of each worker), and
  each worker's inner collector calls its ``extend`` with the worker's batch (``_single.py``, the
  ``replay_buffer.extend(tensordict_out)`` of ``iterator``). Each pickling of the feed for a worker
  attaches a shared-memory ring of its own to the plane (:mod:`conduit.runtime.torchrl.rings`, the code
  path the replay buffer uses too), and every batch is written straight into it: nothing goes through the main process, which only
  counts frames (the collector yields ``None`` when it has a replay buffer).
* **Versions.** The collector is built with ``track_policy_version=True`` (its public argument): TorchRL's
  ``PolicyVersion`` transform stamps every frame with the version of the weights that produced it, and
  ``collector.increment_version()`` + ``update_policy_weights_()`` carry the new version to the workers
  with the weights. A chunk is labelled with the *oldest* version among its frames.
* **Contracts** follow the collector. ``MultiSyncCollector``: workers sample only between two updates, so
  batch *k* is exactly the version-*k* frames of ``rounds`` collector iterations (the collector is built
  with ``frames_per_batch = feed.collector_frames_per_batch``, one round; weights change only after the
  batch): ``OnPolicy``, ``batch_steps = frames_per_batch``. ``MultiAsyncCollector``: workers keep sampling
  while the learner updates, each collector iteration yields one worker's batch of ``frames_per_batch``
  frames: ``BoundedStaleness(max_lag, max_reuse=1)`` with ``batch_steps = frames_per_batch`` (a batch is one
  worker batch, never cut) and ``max_lag = num_workers`` by default (each of the other workers can have
  one batch sampled with older weights ahead of it in the plane).
* **Value/advantage pass.** Under ``OnPolicy`` the value network of version *k* is fixed while iteration
  *k* samples (weights change only inside update *k*, and version-*k+1* frames cannot exist before it
  ended), so a thread runs the value pass (TorchRL's own GAE module: values of every observation and next
  observation) on each chunk as it lands (``peek``), while the workers still sample the later rounds:
  ``value_pass="per_chunk"``. At hand-over only GAE's cheap backward recursion runs, over each worker's
  chunks joined along time: a worker's collector continues its envs from one iteration to the next, so
  its ``rounds`` chunks are the one ``[envs, rounds x frames]`` segment a stock worker collecting the
  whole batch at once writes, and the advantages equal stock GAE's over the gathered batch
  (``tests/test_torchrl_onpolicy.py`` checks it with hypothesis, cuts and episode ends anywhere). Under
  ``BoundedStaleness`` the value network changes while chunks wait, so the pass runs when the batch is
  handed over (stock timing): ``value_pass="batch"``. Advantage standardisation (the GAE module's
  ``average_gae``) needs the whole batch and runs at hand-over, with TorchRL's formula.
* **Audit.** The plane's auditor sees every ingest, delivery and release when it happens;
  :meth:`OnPolicyFeed.report` returns the contract, the plane's metrics and the live audit, and
  :meth:`OnPolicyFeed.close` the final audit.

Adoption (the lines that change in TorchRL's PPO loop)::

    feed = OnPolicyFeed(make_env, actor, advantage=gae, frames_per_batch=F, num_workers=2)   # new
    collector = MultiSyncCollector([make_env] * 2, actor, frames_per_batch=feed.collector_frames_per_batch,
                                   total_frames=T, replay_buffer=feed, track_policy_version=True)  # 3 arguments
    for data in feed.iterate(collector):                  # was: for data in collector: gae(data)
        ...                                               # epochs and minibatches of ClipPPOLoss, unchanged
    audit = feed.close()                                  # new (the loop's update_policy_weights_ goes)

Only TorchRL's public API is used: the collectors' ``replay_buffer=``, ``track_policy_version=``,
``increment_version()``, ``update_policy_weights_()``, ``policy_version``, ``num_workers``; a
``ReplayBuffer`` subclass (its documented extension point) for the feed; the GAE module's constructor and
attributes. Nothing of TorchRL is patched or copied.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import ReplayBuffer

from conduit.audit import AuditReport
from conduit.contracts import BoundedStaleness, Contract, OnPolicy
from conduit.errors import ConduitError
from conduit.runtime.torchrl.columns import TensorDictLayout
from conduit.runtime.torchrl.replay import TorchRLSettingError
from conduit.runtime.torchrl.rings import WorkerRing

log = logging.getLogger(__name__)  # conduit.runtime.torchrl.onpolicy

VERSION_KEY = ("next", "policy_version")
"""Where TorchRL's ``PolicyVersion`` transform stamps the weights version of every frame."""

VALUE_PASSES = ("per_chunk", "batch")


class FeedError(TorchRLSettingError):
    """A setting of :class:`OnPolicyFeed` (or of the collector it feeds) that the feed cannot run; the
    message names it (a :class:`~conduit.runtime.torchrl.replay.TorchRLSettingError`, as the replay
    buffer's)."""


def example_batch(create_env_fn: Callable[[], Any], policy: Any, frames: int = 2) -> TensorDictBase:
    """One small batch of the frames a collector worker would extend with: TorchRL's own single-process
    ``Collector`` over the same env and policy, with policy-version tracking (its public arguments), so
    the feed's layout has exactly the keys, dtypes and shapes the workers will write."""
    from torchrl.collectors import Collector

    collector = Collector(create_env_fn(), policy, frames_per_batch=frames, total_frames=frames,
                          track_policy_version=True)
    try:
        return next(iter(collector)).clone()
    finally:
        collector.shutdown()


def _gae_twin(advantage: Any, values: bool = True) -> Any:
    """A GAE module with the user's gamma, lambda, value network (``values``; else none: the values are
    read from the TensorDict, the recursion only) and keys, without standardisation (done over the whole
    batch at hand-over)."""
    from torchrl.objectives.value import GAE

    if type(advantage) is not GAE:
        raise FeedError(f"advantage: expected torchrl.objectives.value.GAE, got {type(advantage).__name__} "
                        "(PPO's advantage module; other estimators and GAE subclasses are not supported yet)")
    if getattr(advantage, "group_key", None) is not None:
        raise FeedError("advantage: GAE with group_key (standardisation by group) is not supported yet")
    if advantage.value_network is None:
        raise FeedError("advantage: the GAE module has no value_network; the feed runs the value pass")
    twin = GAE(gamma=advantage.gamma.clone(), lmbda=advantage.lmbda.clone(),
               value_network=advantage.value_network if values else None,
               average_gae=False, vectorized=advantage.vectorized, time_dim=advantage.time_dim,
               shifted=advantage.shifted, deactivate_vmap=advantage.deactivate_vmap)
    keys = dataclasses.asdict(advantage.tensor_keys)
    twin.set_keys(**{k: keys[k] for k in ("advantage", "value_target", "value", "reward", "done", "terminated")})
    return twin


def standardize(adv: torch.Tensor) -> torch.Tensor:
    """TorchRL's advantage standardisation (``torchrl/objectives/value/advantages.py``,
    ``ValueEstimatorBase._normalize_advantage`` with no validity mask and no groups: ``(adv - mean) /
    std.clamp_min(1e-4)``, the unbiased std), over the whole batch."""
    return (adv - adv.mean()) / adv.std().clamp_min(1e-4)


class _Worker:
    """The feed's state in a collector worker process: its own ring (:class:`~conduit.runtime.torchrl.rings.WorkerRing`)."""

    def __init__(self, ring: WorkerRing, layout: dict, checksums: bool, write_timeout: float):
        self.ring = ring
        self.layout = TensorDictLayout.from_dict(layout)
        self.checksums, self.write_timeout = checksums, write_timeout
        self.seq = 0
        self.written = 0

    def extend(self, td: TensorDictBase) -> None:
        t_created = time.time()  # the worker has finished the batch: the chunk is created
        versions = td.get(VERSION_KEY, None)
        if versions is None:
            raise FeedError(f"OnPolicyFeed: the collector's frames carry no {VERSION_KEY!r}; build the collector "
                            "with track_policy_version=True")
        cols = self.layout.columns(td)
        chunk_id = (self.ring.name, self.seq)
        self.ring.write(cols, chunk_id=chunk_id, policy_version=int(versions.min()), t_created=t_created,
                            checksum=self.checksums, timeout=self.write_timeout, annotation=tuple(td.batch_size))
        self.seq += 1
        self.written += self.layout.steps(td)


class OnPolicyFeed(ReplayBuffer):
    """The plane between TorchRL's multi-process collectors and ``ClipPPOLoss`` (see the module doc).

    ``create_env_fn`` and ``policy`` are the collector's (one example batch is collected in this process
    to learn the frames' layout; or pass ``example=``, a TensorDict of such frames). ``advantage`` is the
    loop's ``GAE`` module. ``frames_per_batch`` and ``num_workers`` must be the collector's;
    ``asynchronous`` says which collector (``MultiAsyncCollector``: True). ``value_pass`` (``"per_chunk"``
    under OnPolicy by default; ``"batch"`` is stock timing and the only choice under BoundedStaleness),
    ``max_lag`` (BoundedStaleness only), ``policy`` / ``capacities`` (the plane's placement and
    scheduling policy and tier sizes), ``ring_bytes`` (each worker's ring), ``verify_checksums``,
    ``delivery_timeout`` and ``write_timeout`` (seconds) configure the plane.
    """

    def __init__(
        self,
        create_env_fn: Callable[[], Any] | None = None,
        policy: Any = None,
        *,
        advantage: Any,
        frames_per_batch: int,
        num_workers: int,
        asynchronous: bool = False,
        rounds: int | None = None,
        example: TensorDictBase | None = None,
        value_pass: str | None = None,
        max_lag: int | None = None,
        plane_policy: str = "conduit",
        capacities: dict[str, Any] | None = None,
        ring_bytes: int | None = None,
        verify_checksums: bool = False,
        delivery_timeout: float = 600.0,
        write_timeout: float = 600.0,
    ):
        super().__init__()
        self.shared = True  # see share()
        from conduit.runtime.plane import ExperiencePlane

        for name, value in (("frames_per_batch", frames_per_batch), ("num_workers", num_workers)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise FeedError(f"{name} must be a positive integer, got {value!r}")
        if rounds is None:
            rounds = 1 if asynchronous else 4
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds <= 0:
            raise FeedError(f"rounds must be a positive integer, got {rounds!r}")
        if asynchronous and rounds != 1:
            raise FeedError("rounds: MultiAsyncCollector's batch is one worker's batch (rounds=1)")
        if not asynchronous and frames_per_batch % (num_workers * rounds):
            raise FeedError(f"frames_per_batch={frames_per_batch} is not a multiple of num_workers x rounds = "
                            f"{num_workers} x {rounds}: each collector iteration gives each worker "
                            "frames_per_batch // (num_workers x rounds) frames")
        self.rounds = rounds
        if value_pass is None:
            value_pass = "batch" if asynchronous else "per_chunk"
        if value_pass not in VALUE_PASSES:
            raise FeedError(f"value_pass must be one of {VALUE_PASSES}, got {value_pass!r}")
        if asynchronous and value_pass == "per_chunk":
            raise FeedError("value_pass='per_chunk' needs OnPolicy (MultiSyncCollector): with MultiAsyncCollector "
                            "the value network changes while chunks wait, so the pass runs at hand-over ('batch')")
        if max_lag is not None and not asynchronous:
            raise FeedError("max_lag is the BoundedStaleness bound of MultiAsyncCollector (asynchronous=True); "
                            "MultiSyncCollector's contract is OnPolicy")
        if max_lag is not None and (isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0):
            raise FeedError(f"max_lag must be an integer >= 0, got {max_lag!r}")
        if mp.get_start_method(allow_none=True) == "fork":
            raise FeedError("the multiprocessing start method is 'fork': a forked worker inherits every ring's pipe "
                            "end (and hides another worker's death); use 'spawn' (TorchRL's default) or 'forkserver'")
        self._twin = _gae_twin(advantage)
        self._joined = _gae_twin(advantage, values=False)
        self._average = bool(advantage.average_gae)
        self._adv_key = advantage.tensor_keys.advantage
        if example is None:
            if create_env_fn is None or policy is None:
                raise FeedError("OnPolicyFeed needs create_env_fn and policy (or example=) to learn the frames' layout")
            example = example_batch(create_env_fn, policy)
        self.layout = TensorDictLayout.infer(example.reshape(-1)[:1] if example.batch_dims else example)
        self.asynchronous = bool(asynchronous)
        self.frames_per_batch = frames_per_batch
        self.num_workers = num_workers
        self.value_pass = value_pass
        self.contract: Contract = (BoundedStaleness(max_lag=num_workers if max_lag is None else max_lag, max_reuse=1)
                                   if asynchronous else OnPolicy())
        self.delivery_timeout = float(delivery_timeout)
        chunk_bytes = self.layout.schema.extent_bytes(self.collector_frames_per_batch if asynchronous
                                                      else self.collector_frames_per_batch // num_workers)
        ring_bytes = int(ring_bytes) if ring_bytes is not None else max(4 << 20, 3 * chunk_bytes)
        if capacities is None:  # room for a few batches in flight in each memory tier
            need = self.layout.schema.extent_bytes(frames_per_batch)
            capacities = {"pinned": max(256 << 20, 4 * need), "pageable": max(1 << 30, 8 * need)}
        self.plane = ExperiencePlane(self.layout.schema, self.contract, batch_steps=frames_per_batch,
                                     policy=plane_policy, capacities=capacities, prefetch_depth=1,
                                     verify_checksums=verify_checksums, ingest_timeout=write_timeout)
        self._ring_bytes = ring_bytes
        self._rings_handed = 0  # one ring per pickling, i.e. per collector worker
        self._worker_state = {"layout": self.layout.to_dict(), "checksums": verify_checksums,
                              "write_timeout": float(write_timeout)}
        self._worker: _Worker | None = None
        self._results: dict[Hashable, TensorDict] = {}  # chunk id -> its value/advantage pass outputs
        self._lock = threading.Condition()
        self._stream_update: int | None = None
        self._busy = False  # the stream is running the pass on a chunk
        self._closed = False
        self._stream: threading.Thread | None = None
        self.timings: list[dict[str, float]] = []  # per update: t_asked, t_ready, t_last_created (wall clock)
        self.counters = {"streamed_chunks": 0, "handover_chunks": 0}
        self._final: AuditReport | None = None

    @property
    def collector_frames_per_batch(self) -> int:
        """The ``frames_per_batch`` to build the collector with: one round of a batch (``frames_per_batch //
        rounds``; asynchronous: one worker's batch, ``frames_per_batch``)."""
        return self.frames_per_batch // self.rounds

    # -- the collector side (runs in the worker processes) -------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """Pickled for a collector worker: a ring of its own goes with it (see :mod:`~conduit.runtime.torchrl.rings`)."""
        if self.plane is None:
            raise FeedError("OnPolicyFeed: a collector worker's copy of the feed cannot be handed on")
        if self._rings_handed >= self.num_workers:
            raise FeedError(f"OnPolicyFeed: handed to more than num_workers={self.num_workers} collector workers; "
                            "the feed's num_workers must be the collector's")
        ring = WorkerRing.attach(self.plane, f"worker{self._rings_handed}", self._ring_bytes)
        self._rings_handed += 1
        return {"_conduit_worker": {"ring": ring, **self._worker_state}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        ReplayBuffer.__init__(self)
        self.shared = True
        self._worker = _Worker(**state["_conduit_worker"])
        self.plane = None

    def share(self, shared: bool = True) -> OnPolicyFeed:
        """Nothing to share: every worker writes to the plane through its own ring (``shared`` is True from
        the start, so the collector does not call this and warn)."""
        return self

    @property
    def write_count(self) -> int:
        """Frames this process wrote (in a worker) or the plane ingested (in the learner's process)."""
        if self._worker is not None:
            return self._worker.written
        return int(self.plane.metrics().get("ingested_samples", 0)) if self.plane is not None else 0

    def extend(self, data: TensorDictBase, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """A collector worker's batch: written to this worker's ring (in the learner's process: refused)."""
        if self._worker is None:
            raise FeedError("OnPolicyFeed.extend is called by collector workers (replay_buffer=feed); in the "
                            "learner's process, batches come from feed.iterate(collector)")
        self._worker.extend(data)

    def add(self, data: Any) -> Any:
        raise FeedError("OnPolicyFeed takes whole collector batches (extend), from collector workers")

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        raise FeedError("OnPolicyFeed delivers whole on-policy batches: use feed.iterate(collector), not sample()")

    # -- the learner side ---------------------------------------------------------------------------
    def _check_collector(self, collector: Any) -> None:
        from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector

        want = MultiAsyncCollector if self.asynchronous else MultiSyncCollector
        if not isinstance(collector, want):
            raise FeedError(f"the feed was built with asynchronous={self.asynchronous}, for a {want.__name__}; got a "
                            f"{type(collector).__name__}")
        if collector.num_workers != self.num_workers:
            raise FeedError(f"num_workers: the feed has {self.num_workers}, the collector {collector.num_workers}")
        per_worker = collector.frames_per_batch_worker(worker_idx=0)
        expected = (self.collector_frames_per_batch if self.asynchronous
                    else self.collector_frames_per_batch // self.num_workers)
        if per_worker != expected:
            raise FeedError(f"frames_per_batch: the collector gives each worker {per_worker} frames per iteration, "
                            f"the feed expects {expected}: build the collector with frames_per_batch="
                            f"feed.collector_frames_per_batch ({self.collector_frames_per_batch})")
        if collector.policy_version is None:
            raise FeedError("the collector does not track policy versions: build it with track_policy_version=True")
        if collector.replay_buffer is not self:
            raise FeedError("the collector was not built with replay_buffer=feed")

    def iterate(self, collector: Any) -> Iterator[TensorDict]:
        """Drive ``collector`` and yield each update's batch: a flat ``[frames_per_batch]`` TensorDict of the
        frames with the GAE module's ``advantage``, ``value_target`` and values filled in. After the loop's
        update, the next step of the iterator releases the batch (the plane closes update *k*'s books),
        increments the collector's policy version and sends the new weights to the workers."""
        self._check_collector(collector)
        self.plane.set_policy_version(int(collector.policy_version))
        if self.value_pass == "per_chunk" and self._stream is None:
            self._stream = threading.Thread(target=self._stream_loop, name="conduit-torchrl-values", daemon=True)
            self._stream.start()
        t_free = time.time()
        rounds = 0
        for _ in collector:  # one collector iteration: every worker (one, asynchronous) extended
            rounds += 1
            if rounds < self.rounds:
                continue
            rounds = 0
            update = self.plane.policy_version
            data, batch = self._take(update, t_free)
            try:
                yield data
            finally:
                t_free = time.time()
                batch.release()
            collector.increment_version()
            self.plane.set_policy_version(int(collector.policy_version))
            with self._lock:
                self._stream_update = self.plane.policy_version if not self.asynchronous else None
                self._lock.notify_all()
            collector.update_policy_weights_()

    def _take(self, update: int, t_free: float) -> tuple[TensorDict, Any]:
        t_asked = time.time()
        if self.asynchronous:
            batch = self.plane.next_batch(timeout=self.delivery_timeout)
        else:
            with self._lock:
                self._stream_update = update
                self._lock.notify_all()
            batch = self.plane.next_batch(update=update, timeout=self.delivery_timeout)
            with self._lock:  # the stream stops; a chunk it is on is finished first
                self._stream_update = None
                while self._busy:
                    self._lock.wait(0.1)
        segments: dict[Hashable, list[tuple[int, TensorDict]]] = {}  # worker -> its chunks (seq, values)
        row = 0
        for cid, idx in batch.selections:
            n = len(idx)
            shape = batch.annotations[cid]
            if n != int(np.prod(shape)):
                raise ConduitError(f"chunk {cid!r} was split across batches ({n} of {int(np.prod(shape))} rows): a "
                                   "batch must hold whole collector batches")
            with self._lock:
                out = self._results.pop(cid, None)
            if out is None:  # not streamed (value_pass="batch", or it landed as the batch was handed over)
                out = self._value_pass({k: v[row:row + n] for k, v in batch.columns.items()}, shape)
                self.counters["handover_chunks"] += 1
            worker, seq = cid
            segments.setdefault(worker, []).append((seq, out))
            row += n
        data = torch.cat([self._recursion(chunks) for _, chunks in sorted(segments.items(), key=lambda kv: kv[0])])
        if self._average:
            data.set(self._adv_key, standardize(data.get(self._adv_key)))
        t_ready = time.time()
        self.timings.append({"t_free": t_free, "t_asked": t_asked, "t_ready": t_ready,
                             "t_last_created": max(batch.created), "update": float(batch.update)})
        return data, batch

    def _value_pass(self, columns: dict[str, Any], shape: tuple[int, ...]) -> TensorDict:
        """The value pass over one chunk, in its ``[envs, frames]`` shape: the GAE module's own (values of
        the observations and next observations, then a recursion that :meth:`_recursion` redoes over the
        worker's whole segment). The frames are copied out of the plane's batch, which is released after
        the update."""
        td = self.layout.tensordict({k: np.array(v) for k, v in columns.items()}).reshape(shape)
        with torch.no_grad():
            return self._twin(td)

    def _recursion(self, chunks: list[tuple[int, TensorDict]]) -> TensorDict:
        """One worker's chunks of this batch, joined along time in the order it wrote them (its collector
        continues its envs from one iteration to the next, so they are one ``[envs, rounds x frames]``
        segment, the one a stock worker collecting ``frames_per_batch`` at once would have written), and
        GAE's recursion over it with the values the pass computed; flattened to ``[steps]``."""
        chunks.sort(key=lambda c: c[0])
        tds = [td for _, td in chunks]
        seg = tds[0] if len(tds) == 1 else torch.cat(tds, dim=tds[0].batch_dims - 1)
        with torch.no_grad():
            return self._joined(seg).reshape(-1)

    def _stream_loop(self) -> None:
        """OnPolicy: the value pass on each chunk of batch *k* as it lands (the module doc says why that is
        the value the stock pass computes after sampling)."""
        start, current = 0, None
        while not self._closed:
            with self._lock:
                while not self._closed and self._stream_update is None:
                    self._lock.wait(0.1)
                update = self._stream_update
            if self._closed or update is None:
                return
            if update != current:
                current, start = update, 0
            try:
                peek = self.plane.peek(update=update, start=start, timeout=0.05)
            except ConduitError:
                if self._closed:
                    return
                time.sleep(0.01)
                continue
            if peek.stop <= start:
                continue
            # whole chunks only: a chunk whose rows are not all in is read again from its first row
            row, done_to = start, start
            for cid, idx in peek.selections:
                n = len(idx)
                shape = peek.annotations.get(cid)
                if shape is None or n != int(np.prod(shape)):
                    break
                with self._lock:
                    if self._stream_update != update:
                        break
                    self._busy = True
                try:
                    out = self._value_pass({k: v[row - start:row - start + n] for k, v in peek.columns.items()},
                                           shape)
                except Exception:  # the hand-over runs the pass instead; logged
                    log.exception("value stream: the pass on chunk %r failed; it runs at hand-over", cid)
                    out = None
                with self._lock:
                    self._busy = False
                    if out is not None:
                        self._results[cid] = out
                    self._lock.notify_all()
                if out is None:
                    break
                self.counters["streamed_chunks"] += 1
                row += n
                done_to = row
            if done_to == start:
                time.sleep(0.001)  # a chunk still landing piece by piece
            start = done_to

    def report(self) -> dict[str, Any]:
        """The contract, the plane's metrics (docs/metrics.md), the feed's counters and the live audit."""
        audit = self.plane.audit()
        return {"contract": self.contract.to_dict(), "value_pass": self.value_pass, "metrics": self.plane.metrics(),
                "feed": dict(self.counters), "audit": audit.to_dict(), "violations": audit.violations}

    def close(self) -> AuditReport:
        """Stop the value stream and the plane; returns the final audit."""
        if self._final is not None:
            return self._final
        self._closed = True
        with self._lock:
            self._lock.notify_all()
        if self._stream is not None:
            self._stream.join(timeout=10)
        self._final = self.plane.close()
        return self._final
