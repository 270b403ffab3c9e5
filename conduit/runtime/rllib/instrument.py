"""Non-invasive hooks that measure RLlib's experience path, the same way on stock RLlib and on Conduit.

The method follows ``shared/reference/rllib-2.60-stock-cpu.md``; every hook uses a public extension
point of RLlib 2.60 (new API stack) or wraps *instance* methods of objects the algorithm built, from
outside, at runtime. No RLlib module or class attribute is patched.

Where the stamps come from (wall-clock ``time.time()``, compared across processes on one host):

- **EnvRunner** - :class:`InstrumentCallback.on_sample_end` writes the sample-end time and a sample
  id into every returned episode's ``custom_data`` (so the stamp travels with the data) and logs
  ``(sample_id, t, steps)`` into the EnvRunner's ``MetricsLogger`` (so the driver also sees it when
  only an object reference travels, as in APPO/IMPALA).
- **Driver** - :class:`InstrumentCallback.on_algorithm_init` wraps instance methods of the algorithm's
  ``EnvRunnerGroup`` (``foreach_env_runner``, ``foreach_env_runner_async_fetch_ready``,
  ``sync_weights``, ``sync_env_runner_states``, ``get_merged_env_runner_state``), of the local
  EnvRunner (``sample``), of the ``LearnerGroup`` (``update``) and of the replay buffer (``add``,
  ``sample``, ``update_priorities``). The ``LearnerGroup.update`` wrapper passes a small
  ``_conduit_call`` kwarg (call id, call time, newest sample-end stamp); ``LearnerGroup.update``
  forwards user kwargs to ``Learner.update`` by design.
- **Learner** - :func:`instrumented_learner_class` builds a subclass of the algorithm's Learner that
  wraps ``update`` (entry stamp), ``_make_batch_if_necessary`` (pipeline entry and exit, only when
  the input is episodes), ``after_gradient_based_update`` (end of a gradient update) and, in
  ``build``, inserts pass-through :class:`StampConnector` pieces right before and right after
  ``NumpyToTensor``. One more :class:`StampConnector` is placed first among the custom pieces via the
  config's public ``learners(learner_connector=...)`` hook. Records go into the Learner's
  ``MetricsLogger`` (``reduce="item_series"``) under ``(ALL_MODULES, "conduit_instrument")`` and so
  reach the driver inside the learner results.
- **Result** - :meth:`InstrumentCallback.on_train_result` joins driver and learner records and writes
  ``result["conduit_instrument"] = {"segments": {...}, "meta": {...}}``; :func:`segments` returns the
  numbers.

Segments (milliseconds; the definitions are the reference's, the metric names docs/metrics.md's):

- ``a_ms`` EnvRunner->driver: driver receive time minus sample-end stamp (serialize, RPC, get);
- ``a2_ms`` driver bookkeeping: from data arriving at the driver to handing it on (to the learner
  call, or to the replay buffer's ``add``; for replay, also from ``buffer.sample`` returning to the
  learner call);
- ``b_ms`` driver->learner: ``Learner.update`` entry minus the driver's ``LearnerGroup.update`` call
  (shard, serialize, actor call), not counting ``learner_queue_ms``, the time the call waited for
  the learner's previous ``update`` to return (backpressure; about 0 for synchronous algorithms,
  large for APPO/IMPALA, whose learner main thread blocks until its learner thread catches up);
- ``get_ms`` learner ``update`` entry to learner-connector entry (resolving object references: APPO's
  ``ray.get`` of episode refs; about 0 for PPO/DQN);
- ``c_ms`` learner connector from its entry up to ``NumpyToTensor``; ``d_ms`` ``NumpyToTensor``;
- ``gae_ms`` after ``NumpyToTensor`` to pipeline exit (PPO: the GAE value pass);
- ``buffer_add_ms`` / ``buffer_sample_ms`` (replay algorithms);
- ``exp_ms`` = a + a2 + b + get + c + d + buffer add + buffer sample (the reference's EXP; ``get`` is
  about 0 outside APPO/IMPALA); ``exp_with_gae_ms`` adds GAE; ``exp_share`` = ``exp_ms`` /
  ``train_iteration_ms``;
- ``exposed_ms`` sum over this iteration's learner updates of the **exposed experience-path
  latency** ``t_batch_ready - max(t_learner_free, t_last_needed_chunk_created)`` (0 for an update
  whose batch was ready before the learner became free); ``t_batch_ready`` is the pipeline exit,
  ``t_learner_free`` the end of the learner's previous gradient update, and
  ``t_last_needed_chunk_created`` the newest sample-end stamp the driver had received when it called
  the learner (for PPO the batch's newest chunk; for DQN the step whose insertion the replay ratio
  requires before this update; for APPO the package's newest chunk);
- ``chunk_path_ms`` the **experience-path latency per chunk**: mean over the chunks sampled in this
  iteration (one per ``on_sample_end``) of the time from its sample-end stamp to the exit of the
  first learner pipeline after it (the chunk is then in a batch, in the layout the update consumes);
- ``iteration_ms`` the **iteration time**: mean time between the starts of consecutive learner
  updates (falls back to ``train_iteration_ms`` while there is no previous update);
  ``train_iteration_ms`` the wall time of the ``train()`` call;
- ``experience_share`` = exposed experience-path latency / iteration time (summed over updates);
- also ``sampling_ms``, ``learner_update_ms`` (driver-side ``LearnerGroup.update``),
  ``learner_busy_ms`` (sum of gradient updates), ``weight_sync_ms``, ``state_sync_ms``,
  ``buffer_update_prios_ms``, ``batch_mb`` (batch as tensors, per update), counts.

Synchronous algorithms (PPO, DQN) report per-iteration sums. Asynchronous ones (APPO, IMPALA;
``meta["mode"] == "async"``) report ``a``/``a2``/``b``/``get``/``c``/``d``/``gae`` as means per sample
result or per learner batch, because sampling, batch building and training overlap there; their
``exp_ms`` is then the latency of one batch, and ``exp_share`` is not an occupancy.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.connectors.learner import NumpyToTensor
from ray.rllib.utils.metrics import ALL_MODULES

__all__ = [
    "KEY",
    "SEGMENT_KEYS",
    "InstrumentCallback",
    "StampConnector",
    "instrument",
    "instrumented_learner_class",
    "segments",
]

#: Key of the instrument's entry in ``algo.train()`` results (and of its metrics everywhere).
KEY = "conduit_instrument"
_EP_T = "conduit_t_sample_end"
_EP_ID = "conduit_sample_id"

#: The numbers :func:`segments` returns (all finite floats, all >= 0).
SEGMENT_KEYS = (
    "iteration_ms",
    "chunk_path_ms",
    "train_iteration_ms",
    "sampling_ms",
    "a_ms",
    "a2_ms",
    "b_ms",
    "learner_queue_ms",
    "get_ms",
    "c_ms",
    "d_ms",
    "gae_ms",
    "buffer_add_ms",
    "buffer_sample_ms",
    "buffer_update_prios_ms",
    "exp_ms",
    "exp_with_gae_ms",
    "exp_share",
    "exp_share_with_gae",
    "exposed_ms",
    "exposed_per_update_ms",
    "experience_share",
    "learner_update_ms",
    "learner_busy_ms",
    "weight_sync_ms",
    "state_sync_ms",
    "batch_mb",
    "num_sample_rounds",
    "num_batches",
    "num_updates",
    "env_steps_sampled",
)


# ================================================================================================
# Learner-side pieces
# ================================================================================================
class StampConnector(ConnectorV2):
    """A pass-through learner-connector piece that records when the batch passes it.

    The time goes into ``self.t`` (read by the instrumented Learner, which holds the piece) and into
    ``shared_data["conduit_t_<name>"]``. The batch is returned untouched.
    """

    def __init__(self, input_observation_space=None, input_action_space=None, *, name: str = "entry", **kwargs):
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.name = name
        self.t: float | None = None

    def __call__(self, *, rl_module, batch, episodes, explore=None, shared_data=None, metrics=None, **kwargs):
        self.t = time.time()
        if shared_data is not None:
            shared_data[f"conduit_t_{self.name}"] = self.t
        return batch


class _EntryConnectorFactory:
    """``learner_connector`` callable: an entry :class:`StampConnector`, then the user's pieces."""

    def __init__(self, user_factory: Callable | None = None):
        self.user_factory = user_factory

    def __call__(self, input_observation_space, input_action_space, *args):
        pieces: list = [StampConnector(name="entry")]
        if self.user_factory is not None:
            user = self.user_factory(input_observation_space, input_action_space, *args)
            pieces.extend(user if isinstance(user, (list, tuple)) else [user])
        return pieces


def _tensor_bytes(obj) -> int:
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return int(obj.element_size() * obj.numel())
    if hasattr(obj, "nbytes") and hasattr(obj, "dtype"):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


class _InstrumentedLearnerMixin:
    """Mixed in front of an algorithm's Learner class by :func:`instrumented_learner_class`."""

    _conduit_instrumented = True

    def build(self) -> None:
        super().build()
        self._ci_grad_start: dict[int, float] = {}
        self._ci_pending: dict[int, dict] = {}  # per thread: the update() call being served
        self._ci_last_return: float | None = None
        self._ci_pre = self._ci_post = self._ci_entry = None
        pipe = getattr(self, "_learner_connector", None)
        if pipe is None:  # e.g. IMPALA/APPO with aggregator actors: the pipeline runs there.
            return
        for piece in pipe.connectors:
            if isinstance(piece, StampConnector) and piece.name == "entry":
                self._ci_entry = piece
        if any(type(p) is NumpyToTensor for p in pipe.connectors):
            self._ci_pre = StampConnector(name="pre_n2t")
            self._ci_post = StampConnector(name="post_n2t")
            pipe.insert_before(NumpyToTensor, self._ci_pre)
            pipe.insert_after(NumpyToTensor, self._ci_post)

    def update(self, *args, **kwargs):
        t_entry = time.time()
        call = kwargs.pop("_conduit_call", None)
        self._ci_pending[threading.get_ident()] = {"t_entry": t_entry, "call": call,
                                                   "t_prev_return": self._ci_last_return}
        try:
            return super().update(*args, **kwargs)
        finally:
            self._ci_pending.pop(threading.get_ident(), None)
            self._ci_last_return = time.time()

    def _make_batch_if_necessary(self, training_data):
        if getattr(training_data, "episodes", None) is None and threading.get_ident() not in self._ci_pending:
            # Already a batch, outside an update() call (the IMPALA/APPO learner thread).
            batch = super()._make_batch_if_necessary(training_data)
            self._ci_grad_start[threading.get_ident()] = time.time()
            return batch
        # Episodes through the learner connector, or a batch handed to update() ready-made: either way
        # this is where the batch reaches the layout the update consumes.
        t_batch = time.time()
        episodes = training_data.episodes or ()
        t_chunk_eps = None
        steps = 0
        for e in episodes:
            steps += len(e)
            t = e.custom_data.get(_EP_T) if hasattr(e, "custom_data") else None
            if t is not None and (t_chunk_eps is None or t > t_chunk_eps):
                t_chunk_eps = t
        for piece in (self._ci_entry, self._ci_pre, self._ci_post):
            if piece is not None:
                piece.t = None
        batch = super()._make_batch_if_necessary(training_data)
        t_exit = time.time()
        if not episodes and batch is not None:
            steps = int(batch.env_steps())
        pending = self._ci_pending.pop(threading.get_ident(), None) or {}
        call = pending.get("call") or {}
        t_chunk = call.get("t_last_chunk") or t_chunk_eps
        record = {
            "learner": int(getattr(self, "_learner_index", 0) or 0),
            "call": call.get("id"),
            "t_entry": pending.get("t_entry", t_batch),
            "t_prev_return": pending.get("t_prev_return"),
            "t_batch": t_batch,
            "t_conn_entry": self._ci_entry.t if self._ci_entry is not None else None,
            "t_pre": self._ci_pre.t if self._ci_pre is not None else None,
            "t_post": self._ci_post.t if self._ci_post is not None else None,
            "t_exit": t_exit,
            "t_last_chunk": t_chunk,
            "env_steps": steps,
            "bytes": _tensor_bytes(
                {mid: dict(b) for mid, b in getattr(batch, "policy_batches", {}).items()} if batch is not None else {}
            ),
        }
        self.metrics.log_value((ALL_MODULES, KEY, "batches"), record, reduce="item_series")
        self._ci_grad_start[threading.get_ident()] = t_exit
        return batch

    def after_gradient_based_update(self, *, timesteps) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        t_end = time.time()
        t_start = self._ci_grad_start.pop(threading.get_ident(), None)
        self.metrics.log_value(
            (ALL_MODULES, KEY, "updates"),
            {"learner": int(getattr(self, "_learner_index", 0) or 0), "t_start": t_start, "t_end": t_end},
            reduce="item_series",
        )


_LEARNER_CLASSES: dict[type, type] = {}


def instrumented_learner_class(base: type | str) -> type:
    """Returns (and caches) ``Instrumented<Base>``: ``base`` with the instrument's Learner hooks.

    ``base`` may be a Learner class or an import path. Already-instrumented classes are returned
    as they are.
    """
    if isinstance(base, str):
        from ray.rllib.utils import deserialize_type

        base = deserialize_type(base, error=True)
    if getattr(base, "_conduit_instrumented", False):
        return base
    cls = _LEARNER_CLASSES.get(base)
    if cls is None:
        name = f"Instrumented{base.__name__}"
        cls = type(name, (_InstrumentedLearnerMixin, base), {"__module__": __name__, "__qualname__": name})
        _LEARNER_CLASSES[base] = cls
    return cls


# ================================================================================================
# Driver side
# ================================================================================================
def _is_episode(x) -> bool:
    return hasattr(x, "custom_data") and hasattr(x, "env_steps")


def _stamps_from_metrics(metrics) -> list[tuple]:
    """``(sample_id, t, steps)`` items an EnvRunner logged under ``(KEY, "sample_end")``."""
    try:
        node = metrics[KEY]["sample_end"]
    except (KeyError, TypeError, IndexError):
        return []
    items = getattr(node, "items", node)
    if callable(items):  # a plain dict's .items
        return []
    try:
        return [tuple(i) for i in items]
    except TypeError:
        return []


def _stamps_from_episodes(episodes) -> list[tuple]:
    seen: dict[Any, list] = {}
    for e in episodes:
        if not _is_episode(e):
            continue
        t = e.custom_data.get(_EP_T)
        if t is None:
            continue
        sid = e.custom_data.get(_EP_ID)
        entry = seen.setdefault(sid, [sid, t, 0])
        entry[1] = max(entry[1], t)
        entry[2] += len(e)
    return [tuple(v) for v in seen.values()]


class _Iteration:
    """What the driver saw during one ``train()`` call."""

    def __init__(self):
        self.mode = "sync"
        self.rounds = 0
        self.sampling_s = 0.0
        self.a: list[float] = []
        self.a2: list[float] = []
        self.steps = 0
        self.update_s = 0.0
        self.add_s = 0.0
        self.sample_s = 0.0
        self.prios_s = 0.0
        self.weight_sync_s = 0.0
        self.state_sync_s = 0.0
        self.chunk_ends: list[float] = []  # sample-end stamp of every chunk seen this iteration


class _DriverRecorder:
    """Driver-side state of the instrument (lives in the driver's :class:`InstrumentCallback`)."""

    def __init__(self):
        self.it = _Iteration()
        self.calls: dict[int, dict] = {}
        self._ids = itertools.count(1)
        self.t_newest_chunk: float | None = None
        self.t_data_arrived: float | None = None  # sync: last sample round's return, not yet handed on
        self.t_buffer_sampled: float | None = None
        self.ref_info: dict[str, tuple[float, float]] = {}  # APPO: ref hex -> (t_return, t_end)
        self.uses_buffer = False
        self.last_update: dict[int, dict] = {}
        self.pending_batches: dict[int, list] = defaultdict(list)

    # -- sample rounds -------------------------------------------------------------------------
    def sync_round(self, t_call: float, t_return: float, stamps: list[tuple]) -> None:
        it = self.it
        it.rounds += 1
        it.sampling_s += t_return - t_call
        if stamps:
            t_end = max(s[1] for s in stamps)
            it.a.append(max(0.0, t_return - t_end))
            it.steps += sum(int(s[2]) for s in stamps)
            it.chunk_ends.extend(float(s[1]) for s in stamps)
            self._chunk(t_end)
        self.t_data_arrived = t_return

    def async_results(self, t_call: float, t_return: float, results: list) -> None:
        it = self.it
        it.mode = "async"
        it.sampling_s += t_return - t_call
        for res in results:
            payload = res[1] if isinstance(res, tuple) and len(res) == 2 and isinstance(res[0], int) else res
            if not (isinstance(payload, tuple) and len(payload) == 3):
                continue
            ref, _states, metrics = payload
            stamps = _stamps_from_metrics(metrics)
            it.rounds += 1
            if not stamps:
                continue
            t_end = max(s[1] for s in stamps)
            it.a.append(max(0.0, t_return - t_end))
            it.steps += sum(int(s[2]) for s in stamps)
            it.chunk_ends.extend(float(s[1]) for s in stamps)
            self._chunk(t_end)
            hex_ = getattr(ref, "hex", None)
            if callable(hex_):
                self.ref_info[hex_()] = (t_return, t_end)

    def _chunk(self, t_end: float) -> None:
        if self.t_newest_chunk is None or t_end > self.t_newest_chunk:
            self.t_newest_chunk = t_end

    # -- hand-offs -------------------------------------------------------------------------------
    def buffer_add(self, t0: float, t1: float) -> None:
        self.uses_buffer = True
        self.it.add_s += t1 - t0
        if self.t_data_arrived is not None:
            self.it.a2.append(max(0.0, t0 - self.t_data_arrived))
            self.t_data_arrived = None

    def buffer_sample(self, t0: float, t1: float) -> None:
        self.uses_buffer = True
        self.it.sample_s += t1 - t0
        self.t_buffer_sampled = t1

    def update_call(self, t_call: float, kwargs: dict) -> dict:
        cid = next(self._ids)
        td = kwargs.get("training_data")
        refs = getattr(td, "episodes_refs", None) if td is not None else None
        t_chunk = self.t_newest_chunk
        if refs:
            infos = [self.ref_info.pop(r.hex(), None) for r in refs if hasattr(r, "hex")]
            infos = [i for i in infos if i is not None]
            if infos:
                t_chunk = max(i[1] for i in infos)
                self.it.a2.append(max(0.0, t_call - max(i[0] for i in infos)))
        elif self.uses_buffer and self.t_buffer_sampled is not None:
            self.it.a2.append(max(0.0, t_call - self.t_buffer_sampled))
            self.t_buffer_sampled = None
        elif self.t_data_arrived is not None:
            self.it.a2.append(max(0.0, t_call - self.t_data_arrived))
            self.t_data_arrived = None
        self.calls[cid] = {"t_call": t_call, "t_last_chunk": t_chunk}
        if len(self.calls) > 10_000:  # async results that never came back: forget the oldest
            for k in list(self.calls)[:5_000]:
                del self.calls[k]
        return {"id": cid, "t_call": t_call, "t_last_chunk": t_chunk}

    # -- per-iteration summary -------------------------------------------------------------------
    def summarize(self, batches: list[dict], updates: list[dict], train_iteration_s: float) -> dict:
        it, self.it = self.it, _Iteration()
        sync = it.mode == "sync"

        def agg(values: list[float]) -> float:
            if not values:
                return 0.0
            return sum(values) if sync else sum(values) / len(values)

        # One record per learner call: the critical (last to finish) learner.
        per_call: dict[Any, dict] = {}
        for r in batches:
            if r.get("t_last_chunk") is None and r.get("call") in self.calls:
                r["t_last_chunk"] = self.calls[r["call"]].get("t_last_chunk")
            cid = r.get("call")
            key = cid if cid is not None else ("anon", id(r))
            if key not in per_call or r["t_exit"] > per_call[key]["t_exit"]:
                per_call[key] = r
        b, queue, get, c, d, gae, nbytes = [], [], [], [], [], [], []
        for r in per_call.values():
            call = self.calls.pop(r.get("call"), None)
            if call:
                # The learner takes one call at a time: time spent waiting for its previous
                # `update` to return is queueing (backpressure), the rest is transport.
                t_prev = r.get("t_prev_return")
                t_free = max(call["t_call"], t_prev) if t_prev is not None else call["t_call"]
                b.append(max(0.0, r["t_entry"] - t_free))
                queue.append(max(0.0, min(t_free, r["t_entry"]) - call["t_call"]))
            else:
                b.append(0.0)
                queue.append(0.0)
            get.append(max(0.0, r["t_batch"] - r["t_entry"]))
            t_pre, t_post = r.get("t_pre"), r.get("t_post")
            if t_pre is not None and t_post is not None:
                c.append(max(0.0, t_pre - r["t_batch"]))
                d.append(max(0.0, t_post - t_pre))
                gae.append(max(0.0, r["t_exit"] - t_post))
            else:
                c.append(max(0.0, r["t_exit"] - r["t_batch"]))
                d.append(0.0)
                gae.append(0.0)
            nbytes.append(r.get("bytes", 0))

        # Exposed experience-path latency per gradient update, learner by learner.
        for r in batches:
            self.pending_batches[r.get("learner", 0)].append(r)
        exposed_by_l: dict[int, list[float]] = defaultdict(list)
        periods_by_l: dict[int, list[float]] = defaultdict(list)
        busy = 0.0
        by_learner: dict[int, list[dict]] = defaultdict(list)
        for u in updates:
            if u.get("t_start") is not None:
                by_learner[u.get("learner", 0)].append(u)
        for lid, ups in by_learner.items():
            ups.sort(key=lambda u: u["t_start"])
            pend = sorted(self.pending_batches[lid], key=lambda r: r["t_exit"])
            prev = self.last_update.get(lid)
            for u in ups:
                busy += max(0.0, u["t_end"] - u["t_start"])
                free = prev["t_end"] if prev else -math.inf
                ready = [r for r in pend if free < r["t_exit"] <= u["t_start"] + 1e-6]
                if ready:
                    rb = ready[-1]
                    floor = max(free, rb["t_last_chunk"] if rb.get("t_last_chunk") is not None else -math.inf)
                    exposed = max(0.0, rb["t_exit"] - floor) if math.isfinite(floor) else 0.0
                else:
                    exposed = 0.0
                pend = [r for r in pend if r["t_exit"] > u["t_start"] + 1e-6]
                if prev is not None:
                    periods_by_l[lid].append(u["t_start"] - prev["t_start"])
                    exposed_by_l[lid].append(exposed)
                else:
                    exposed_by_l[lid].append(exposed)
                prev = u
            self.pending_batches[lid] = pend[-64:]
            self.last_update[lid] = prev

        n_learners = max(1, len(by_learner))
        exposed_s = sum(sum(v) for v in exposed_by_l.values()) / n_learners
        n_updates = sum(len(v) for v in by_learner.values())
        period_sum = sum(sum(v) for v in periods_by_l.values())
        n_periods = sum(len(v) for v in periods_by_l.values())
        # Exposure of the updates that have a previous update (the ones with a period).
        exposed_with_period = 0.0
        for lid, v in exposed_by_l.items():
            exposed_with_period += sum(v[len(v) - len(periods_by_l[lid]) :]) if periods_by_l[lid] else 0.0
        if n_periods:
            iteration_s = period_sum / n_periods
            experience_share = exposed_with_period / period_sum if period_sum > 0 else 0.0
        else:
            iteration_s = train_iteration_s
            experience_share = exposed_s / train_iteration_s if train_iteration_s > 0 else 0.0

        # Experience-path latency per chunk: from a chunk's sample-end stamp to the exit of the first
        # learner pipeline after it (the chunk is then in a batch in the layout the update consumes).
        exits = sorted(r["t_exit"] for r in batches)
        paths = []
        for t_end in it.chunk_ends:
            later = [t for t in exits if t >= t_end]
            if later:
                paths.append(later[0] - t_end)

        ms = 1000.0
        seg = {
            "iteration_ms": iteration_s * ms,
            "chunk_path_ms": (sum(paths) / len(paths) * ms) if paths else 0.0,
            "train_iteration_ms": train_iteration_s * ms,
            "sampling_ms": it.sampling_s * ms,
            "a_ms": agg(it.a) * ms,
            "a2_ms": agg(it.a2) * ms,
            "b_ms": agg(b) * ms,
            "learner_queue_ms": agg(queue) * ms,
            "get_ms": agg(get) * ms,
            "c_ms": agg(c) * ms,
            "d_ms": agg(d) * ms,
            "gae_ms": agg(gae) * ms,
            "buffer_add_ms": it.add_s * ms,
            "buffer_sample_ms": it.sample_s * ms,
            "buffer_update_prios_ms": it.prios_s * ms,
            "exposed_ms": exposed_s * ms,
            "exposed_per_update_ms": (exposed_s / (n_updates / n_learners)) * ms if n_updates else 0.0,
            "experience_share": experience_share,
            "learner_update_ms": it.update_s * ms,
            "learner_busy_ms": busy / n_learners * ms,
            "weight_sync_ms": it.weight_sync_s * ms,
            "state_sync_ms": it.state_sync_s * ms,
            "batch_mb": (sum(nbytes) / len(nbytes) / 1e6) if nbytes else 0.0,
            "num_sample_rounds": float(it.rounds),
            "num_batches": float(len(per_call)),
            "num_updates": float(n_updates),
            "env_steps_sampled": float(it.steps),
        }
        exp = sum(seg[k] for k in ("a_ms", "a2_ms", "b_ms", "get_ms", "c_ms", "d_ms", "buffer_add_ms", "buffer_sample_ms"))
        seg["exp_ms"] = exp
        seg["exp_with_gae_ms"] = exp + seg["gae_ms"]
        wall = seg["train_iteration_ms"]
        seg["exp_share"] = exp / wall if wall > 0 else 0.0
        seg["exp_share_with_gae"] = seg["exp_with_gae_ms"] / wall if wall > 0 else 0.0
        for k, v in seg.items():
            if not math.isfinite(v) or v < 0:
                seg[k] = 0.0
        return {"segments": {k: float(seg[k]) for k in SEGMENT_KEYS}, "meta": {"mode": it.mode}}


def _timed(record: Callable[[float, float], None], fn: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        t0 = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            record(t0, time.time())

    wrapper.__wrapped__ = fn
    wrapper._conduit_wrapped = True
    return wrapper


def _pop_path(d: dict, path: tuple) -> Any:
    node = d
    for k in path[:-1]:
        if not isinstance(node, dict) or k not in node:
            return None
        node = node[k]
    if isinstance(node, dict):
        return node.pop(path[-1], None)
    return None


def _as_list(x) -> list:
    if x is None:
        return []
    if isinstance(x, float) and math.isnan(x):
        return []
    if hasattr(x, "peek"):
        x = x.peek()
    if isinstance(x, dict):  # a compiled item series of length 1 is the item itself
        return [x]
    if isinstance(x, (list, tuple)):
        return list(x)
    return []


class InstrumentCallback(RLlibCallback):
    """The instrument's callback: stamps on EnvRunners, wrappers and the summary on the driver."""

    def __init__(self):
        super().__init__()
        self._n_samples = 0
        self.recorder: _DriverRecorder | None = None

    # -- EnvRunner -------------------------------------------------------------------------------
    def on_sample_end(self, *, env_runner=None, metrics_logger=None, samples=None, **kwargs) -> None:
        t = time.time()
        self._n_samples += 1
        sid = f"{getattr(env_runner, 'worker_index', 0)}:{self._n_samples}"
        steps = 0
        for e in samples or ():
            if _is_episode(e):
                e.custom_data[_EP_T] = t
                e.custom_data[_EP_ID] = sid
                steps += len(e)
        if metrics_logger is not None:
            metrics_logger.log_value((KEY, "sample_end"), (sid, t, steps), reduce="item_series")

    # -- driver ----------------------------------------------------------------------------------
    def on_algorithm_init(self, *, algorithm, metrics_logger=None, **kwargs) -> None:
        rec = self.recorder = _DriverRecorder()
        group = getattr(algorithm, "env_runner_group", None)
        if group is not None:
            self._wrap_env_runner_group(group, rec)
        local = getattr(group, "local_env_runner", None) if group is not None else None
        if local is not None and not getattr(local.sample, "_conduit_wrapped", False):
            orig_sample = local.sample

            def sample(*args, **kw):
                t0 = time.time()
                episodes = orig_sample(*args, **kw)
                rec.sync_round(t0, time.time(), _stamps_from_episodes(episodes))
                return episodes

            sample._conduit_wrapped = True
            local.sample = sample
        lg = getattr(algorithm, "learner_group", None)
        if lg is not None and not getattr(lg.update, "_conduit_wrapped", False):
            orig_update = lg.update

            def update(*args, **kw):
                t0 = time.time()
                kw["_conduit_call"] = rec.update_call(t0, kw)
                try:
                    return orig_update(*args, **kw)
                finally:
                    rec.it.update_s += time.time() - t0

            update._conduit_wrapped = True
            lg.update = update
        buf = getattr(algorithm, "local_replay_buffer", None)
        if buf is not None:
            for name, record in (
                ("add", rec.buffer_add),
                ("sample", rec.buffer_sample),
                ("update_priorities", lambda t0, t1: setattr(rec.it, "prios_s", rec.it.prios_s + t1 - t0)),
            ):
                fn = getattr(buf, name, None)
                if fn is not None and not getattr(fn, "_conduit_wrapped", False):
                    setattr(buf, name, _timed(record, fn))

    @staticmethod
    def _wrap_env_runner_group(group, rec: _DriverRecorder) -> None:
        if not getattr(group.foreach_env_runner, "_conduit_wrapped", False):
            orig = group.foreach_env_runner

            def foreach_env_runner(*args, **kw):
                t0 = time.time()
                results = orig(*args, **kw)
                t1 = time.time()
                stamps, is_sample = [], False
                for res in results or ():
                    episodes, metrics = res, None
                    if isinstance(res, tuple) and len(res) == 2 and isinstance(res[0], list):
                        episodes, metrics = res
                    if isinstance(episodes, list) and (not episodes or _is_episode(episodes[0])):
                        from_eps = _stamps_from_episodes(episodes)
                        from_metrics = _stamps_from_metrics(metrics) if metrics is not None else []
                        if from_eps or from_metrics:
                            is_sample = True
                            stamps.extend(from_eps or from_metrics)
                if is_sample:
                    rec.sync_round(t0, t1, stamps)
                return results

            foreach_env_runner._conduit_wrapped = True
            group.foreach_env_runner = foreach_env_runner
        if not getattr(group.foreach_env_runner_async_fetch_ready, "_conduit_wrapped", False):
            orig_async = group.foreach_env_runner_async_fetch_ready

            def foreach_env_runner_async_fetch_ready(*args, **kw):
                t0 = time.time()
                results = orig_async(*args, **kw)
                t1 = time.time()
                func = kw.get("func", args[0] if args else None)
                if func == "sample_get_state_and_metrics":
                    rec.async_results(t0, t1, list(results or ()))
                elif func == "set_state":
                    pass  # counted by the sync_weights / sync_env_runner_states wrappers
                return results

            foreach_env_runner_async_fetch_ready._conduit_wrapped = True
            group.foreach_env_runner_async_fetch_ready = foreach_env_runner_async_fetch_ready
        for name, attr in (
            ("sync_weights", "weight_sync_s"),
            ("sync_env_runner_states", "state_sync_s"),
            ("get_merged_env_runner_state", "state_sync_s"),
        ):
            fn = getattr(group, name, None)
            if fn is None or getattr(fn, "_conduit_wrapped", False):
                continue

            def record(t0, t1, attr=attr):
                setattr(rec.it, attr, getattr(rec.it, attr) + (t1 - t0))

            setattr(group, name, _timed(record, fn))

    def on_train_result(self, *, algorithm, metrics_logger=None, result: dict, **kwargs) -> None:
        rec = self.recorder
        if rec is None:
            return
        learner_node = _pop_path(result, ("learners", ALL_MODULES, KEY)) or {}
        batches = [dict(r) for r in _as_list(learner_node.get("batches")) if isinstance(r, dict)]
        updates = [dict(u) for u in _as_list(learner_node.get("updates")) if isinstance(u, dict)]
        _pop_path(result, ("env_runners", KEY))
        train_s = float(result.get("time_this_iter_s") or 0.0)
        out = rec.summarize(batches, updates, train_s)
        out["meta"].update(
            {
                "algo": type(algorithm).__name__,
                "iteration": int(result.get("training_iteration", 0) or 0),
                "num_env_runners": int(getattr(algorithm.config, "num_env_runners", 0) or 0),
                "num_learners": int(getattr(algorithm.config, "num_learners", 0) or 0),
            }
        )
        result[KEY] = out


# ================================================================================================
# Public entry points
# ================================================================================================
def instrument(config):
    """Returns a copy of ``config`` (an RLlib ``AlgorithmConfig``, new API stack) with all hooks.

    Adds :class:`InstrumentCallback` to the callbacks, swaps the Learner class for
    :func:`instrumented_learner_class` of it, and puts an entry :class:`StampConnector` in front of
    any custom learner-connector pieces. Works for PPO, APPO, IMPALA and DQN (and other algorithms
    whose Learner builds a connector pipeline). ``algo.train()`` results then carry
    ``result["conduit_instrument"]``; read it with :func:`segments`.
    """
    if not (getattr(config, "enable_rl_module_and_learner", False) and config.enable_env_runner_and_connector_v2):
        raise ValueError("instrument() needs RLlib's new API stack (RLModule/Learner and EnvRunner/ConnectorV2)")
    cfg = config.copy(copy_frozen=False)
    existing = cfg.callbacks_class
    existing = list(existing) if isinstance(existing, (list, tuple)) else [existing]
    existing = [c for c in existing if c is not None and c is not RLlibCallback]
    if not any(isinstance(c, type) and issubclass(c, InstrumentCallback) for c in existing):
        existing.append(InstrumentCallback)
    cfg.callbacks(callbacks_class=existing if len(existing) > 1 else existing[0])
    user_connector = cfg._learner_connector
    if not isinstance(user_connector, _EntryConnectorFactory):
        cfg.learners(learner_connector=_EntryConnectorFactory(user_connector))
    cfg.learners(learner_class=instrumented_learner_class(cfg.learner_class))
    return cfg


def segments(result: dict) -> dict[str, float]:
    """The instrument's numbers for one ``algo.train()`` result (see the module docstring)."""
    try:
        return dict(result[KEY]["segments"])
    except (KeyError, TypeError) as exc:
        raise KeyError(f"no '{KEY}' entry in this result: was the config passed through instrument()?") from exc
