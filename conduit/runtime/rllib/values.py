"""PPO's value-function pass, done per chunk while the EnvRunners still sample.

Stock PPO runs GAE's value pass over the whole train batch after sampling ends: on large
observations it is most of the exposed experience path (about 1.5 s of a 6.2 s iteration in the
reference). PPO's data contract allows doing it earlier: the value function of version *k* is fixed
while iteration *k* samples (weights change only inside update *k*). So:

* :class:`ValueStream` - a thread in the learner's process - reads the rows that already landed in
  batch *k* (:meth:`PlaneCluster.peek`, which delivers nothing and leaves the audit alone), writes
  them into the learner's own copy of the batch, and runs ``module.compute_values`` on them, and on
  each piece's final observation (the bootstrap), as they arrive. When update *k* starts, it takes
  delivery of batch *k* (only the rows not streamed yet travel), rebuilds the episodes and hands
  the values to :class:`StreamedGAE`.
* :class:`StreamedGAE` replaces RLlib's ``GeneralAdvantageEstimation`` piece in the learner
  connector (through the pipeline's public ``insert_after``/``remove``). It *is* that piece - same
  GAE, value targets, advantage standardization over the batch, tensor conversion - except that its
  value source returns the streamed values instead of running the forward pass again. The values
  are aligned with the batch (one per row: each episode's steps, then its bootstrap row); if the
  batch does not have the expected rows, it falls back to the real pass and counts it.

The stream and the update never run the module at the same time (one lock): the stream's forward
passes for version *k* end before update *k* starts, and chunks of version *k + 1* cannot exist
before update *k* has ended and its weights reached the EnvRunners.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from ray.rllib.connectors.learner.general_advantage_estimation import GeneralAdvantageEstimation
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI

from conduit.errors import ConduitError, PlaneRestarted
from conduit.runtime.plane import DeliveryTimeout
from conduit.runtime.rllib.layout import rebuild_trajectories, run_rows

log = logging.getLogger(__name__)  # conduit.runtime.rllib.values

# the pieces of a stock PPO learner pipeline (plus the instrument's pass-through stamps): with only
# these before GAE, the batch's observations are the episodes' observations, as the stream sees them
_STOCK_PIECES = {
    "AddOneTsToEpisodesAndTruncate", "AddObservationsFromEpisodesToBatch", "AddColumnsFromEpisodesToTrainBatch",
    "AddTimeDimToBatchAndZeroPad", "AddStatesFromEpisodesToBatch", "AgentToModuleMapping", "BatchIndividualItems",
    "NumpyToTensor", "GeneralAdvantageEstimation", "StampConnector",
}


class _StreamedValues(ValueFunctionAPI):
    """A module's stand-in inside GAE: ``compute_values`` returns the streamed values."""

    def __init__(self, module: Any, values: np.ndarray, counters: dict[str, int]):
        self._module, self._values, self._counters = module, values, counters

    def compute_values(self, batch: dict, embeddings: Any = None) -> Any:
        import torch
        from ray.rllib.core.columns import Columns

        obs = batch[Columns.OBS]
        if len(obs) != len(self._values):  # not the batch the stream prepared: be exact, not fast
            self._counters["fallback"] += 1
            # the first fallback at WARNING, later ones at DEBUG (counted in "fallback")
            log.log(logging.WARNING if self._counters["fallback"] == 1 else logging.DEBUG,
                    "streamed values: the batch has %d rows, the stream prepared %d; the full value pass runs "
                    "instead (fallback #%d)", len(obs), len(self._values), self._counters["fallback"])
            return self._module.compute_values(batch)
        self._counters["streamed"] += 1
        return torch.as_tensor(self._values, device=obs.device if hasattr(obs, "device") else None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


class _ValueSource:
    """The MultiRLModule as GAE sees it: ``foreach_module`` hands it the streamed values."""

    def __init__(self, multi: Any, values: dict[str, np.ndarray], counters: dict[str, int]):
        self._multi, self._values, self._counters = multi, values, counters

    def foreach_module(self, func: Any, return_dict: bool = False, **kwargs: Any) -> Any:
        out = {}
        for mid, module in self._multi.items():
            values = self._values.get(mid)
            out[mid] = func(mid, module if values is None else _StreamedValues(module, values, self._counters))
        return out if return_dict else list(out.values())

    def __getitem__(self, mid: str) -> Any:
        return self._multi[mid]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._multi, name)


class StreamedGAE(GeneralAdvantageEstimation):
    """RLlib's GAE piece whose value pass was already done by the :class:`ValueStream`."""

    def __init__(self, input_observation_space: Any = None, input_action_space: Any = None, *, gamma: float,
                 lambda_: float, **kwargs: Any):
        super().__init__(input_observation_space, input_action_space, gamma=gamma, lambda_=lambda_, **kwargs)
        self.pending: dict[str, np.ndarray] | None = None
        self.counters = {"streamed": 0, "fallback": 0}

    def __call__(self, *, rl_module: Any, episodes: Any, batch: dict, **kwargs: Any) -> Any:
        values, self.pending = self.pending, None
        if values is not None:
            rl_module = _ValueSource(rl_module, values, self.counters)
        return super().__call__(rl_module=rl_module, episodes=episodes, batch=batch, **kwargs)


def install_streamed_gae(learner: Any) -> bool:
    """Swap the learner pipeline's GAE piece for :class:`StreamedGAE`; False (stock pass kept) when the
    pipeline has pieces that may change observations before GAE, or no GAE piece."""
    pipe = getattr(learner, "_learner_connector", None)
    if pipe is None:
        return False
    names = [type(p).__name__ for p in pipe.connectors]
    if "GeneralAdvantageEstimation" not in names or not set(names) <= _STOCK_PIECES:
        return False
    if learner.module is None or any(m.is_stateful() for m in learner.module.values()):
        return False
    gae = next(p for p in pipe.connectors if type(p) is GeneralAdvantageEstimation)
    streamed = StreamedGAE(gamma=gae.gamma, lambda_=gae.lambda_)
    pipe.insert_after(GeneralAdvantageEstimation, streamed)
    pipe.remove(GeneralAdvantageEstimation)
    learner._cd_gae = streamed
    return True


class _Assembly:
    """The learner's copy of batch *k* as it streams in, with the values of every row and bootstrap."""

    def __init__(self, version: int):
        self.version = version
        self.columns: dict[str, np.ndarray] | None = None
        self.rows = 0
        self.stop = 0
        self.complete = False
        self.values: np.ndarray | None = None
        self.final_values: dict[tuple[Any, int], float] = {}
        self.annotations: dict[Any, dict] = {}
        self.chunk_latency_ms: list[float] = []
        self.incarnation: int | None = None  # the plane incarnation its rows came from (None: no rows yet)

    def write(self, start: int, columns: dict[str, np.ndarray], rows: int) -> None:
        if self.columns is None:
            self.rows = rows
            self.columns = {k: np.empty((rows, *v.shape[1:]), v.dtype) for k, v in columns.items()}
            self.values = np.empty(rows, np.float32)
        n = len(next(iter(columns.values())))
        for k, v in columns.items():
            self.columns[k][start:start + n] = v
        self.stop = start + n


@contextlib.contextmanager
def _one_intra_op_thread() -> Iterator[None]:
    """Run the stream's forward passes with one intra-op thread, then give the learner its pool back.

    Measured here (PPO CartPole, local learner, 2 cores): a second thread running torch with the
    default pool makes the learner's update about 2x slower (a second OpenMP team competes with the
    learner's for the cores), and ``torch.set_num_threads(1)`` once in the stream's thread is no fix:
    the setting is process-wide (OpenMP and MKL), so the update then ran on one thread, 1.4x slower.
    So the stream narrows the pool only around its passes, under ``module_lock``, which the learner's
    update also holds: the two never overlap, and the update always runs with the pool it had.
    """
    import torch

    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ValueStream:
    """Runs PPO's value pass on each chunk of batch *k* as it lands (see the module docstring)."""

    def __init__(self, learner: Any, cluster: Any, learner_id: str, poll_s: float = 0.2):
        self.learner, self.cluster, self.learner_id, self.poll_s = learner, cluster, learner_id, poll_s
        self.module_lock = threading.Lock()  # the stream's forward passes vs. the learner's update
        self._cond = threading.Condition()
        self._current: _Assembly | None = None
        self._error: BaseException | None = None
        self._stopped = False
        self.restarts = 0  # batches streamed again because the plane restarted
        self._thread = threading.Thread(target=self._run, name="conduit-value-stream", daemon=True)
        self._thread.start()

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopped:
                version = int(self.learner._weights_seq_no)
                with self._cond:
                    a = self._current
                    if a is None or a.version != version:
                        a = self._current = _Assembly(version)
                    if a.complete:
                        self._cond.wait(self.poll_s)
                        continue
                try:
                    peek = self.cluster.peek(self.learner_id, update=version, start=a.stop, timeout=self.poll_s,
                                             incarnation=a.incarnation)
                except PlaneRestarted:  # the rows streamed so far died with the plane: start batch k again
                    self._restart(version)
                    continue
                except DeliveryTimeout:  # the plane is restarting: ask again
                    continue
                if peek.stop > peek.start:
                    a.incarnation = peek.incarnation
                    self._absorb(a, peek.start, peek.columns, peek.rows, peek.selections, peek.annotations)
                with self._cond:
                    a.complete = a.complete or (peek.complete and a.stop >= peek.rows)
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - surfaced to the learner's next update
            log.warning("value stream stopped: %r (raised at the learner's next update)", exc)
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _absorb(self, a: _Assembly, start: int, columns: dict, rows: int, selections: list, annotations: dict) -> None:
        import torch

        a.write(start, columns, rows)
        a.annotations.update(annotations)
        module = self._value_module()
        device = next(module.parameters()).device if hasattr(module, "parameters") else None
        finals, keys = [], []
        for cid, _ in selections:
            ann = annotations.get(cid) or a.annotations.get(cid)
            if ann is None:
                raise ConduitError(f"chunk {cid!r} reached the learner without its piece table")
            for i, obs in enumerate(ann["final_obs"]):
                if (cid, i) not in a.final_values:
                    keys.append((cid, i))
                    finals.append(obs)
        with self.module_lock, torch.no_grad(), _one_intra_op_thread():
            obs = torch.from_numpy(np.ascontiguousarray(a.columns["obs"][start:a.stop])).to(device)
            a.values[start:a.stop] = _values(module, obs)
            if finals:
                fv = _values(module, torch.from_numpy(np.stack(finals)).to(device))
                a.final_values.update(zip(keys, fv.tolist(), strict=True))
        now = time.time()
        a.chunk_latency_ms.extend((now - ann["t"]) * 1e3 for cid, _ in selections
                                  if (ann := a.annotations.get(cid)) is not None and "t" in ann)

    def _restart(self, version: int) -> None:
        log.warning("plane restarted while batch %d was streaming: streaming it again from row 0", version)
        with self._cond:
            self._current = _Assembly(version)
            self.restarts += 1
            self._cond.notify_all()

    def _value_module(self) -> Any:
        from ray.rllib.core import DEFAULT_MODULE_ID

        return self.learner.module[DEFAULT_MODULE_ID]

    # -- the learner's update --------------------------------------------------------------------
    def episodes_for(self, version: int, timeout: float) -> list:
        """Batch ``version`` as episodes, with its values handed to :class:`StreamedGAE` (blocks until
        the batch is complete; the rows still in flight are fetched and evaluated here). After a plane
        restart the batch may be short (samples lost with the plane) or empty (then ``[]``)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                while True:
                    if self._error is not None:
                        raise self._error
                    a = self._current
                    if a is not None and a.version == version and a.complete:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise DeliveryTimeout(f"learner {self.learner_id!r}: batch {version} not complete after "
                                              f"{timeout:g} s ({a.stop if a else 0} of {a.rows if a else '?'} rows "
                                              "streamed)")
                    self._cond.wait(min(left, self.poll_s))
            try:
                batch = self.cluster.next_batch(self.learner_id, update=version,
                                                timeout=max(0.0, deadline - time.monotonic()), from_row=a.stop,
                                                incarnation=a.incarnation if a.stop else None)
                break
            except PlaneRestarted:
                self._restart(version)
        if batch.steps == 0:  # every sample of this batch was lost with the plane
            return []
        if batch.row_offset < batch.steps:  # rows that landed between the last peek and the delivery
            self._absorb(a, batch.row_offset, batch.columns, a.rows, batch.selections, batch.annotations)
        annotations = {**a.annotations, **batch.annotations}
        spaces = self.learner._cd_spaces
        episodes, runs = rebuild_trajectories(a.columns, batch.selections, annotations,
                                              observation_space=spaces[0], action_space=spaces[1])
        parts = []
        for run in runs:
            parts.append(a.values[run_rows(run)])
            parts.append(np.array([a.final_values[run.last]], np.float32))
        from ray.rllib.core import ALL_MODULES, DEFAULT_MODULE_ID

        self.learner._cd_gae.pending = {DEFAULT_MODULE_ID: np.concatenate(parts) if parts else np.empty(0, np.float32)}
        if a.chunk_latency_ms:
            self.learner.metrics.log_value((ALL_MODULES, "conduit", "chunk_path_ms"),
                                           float(np.median(a.chunk_latency_ms)), window=20)
        return episodes

    def stop(self) -> None:
        self._stopped = True
        self._thread.join(timeout=5)


def _values(module: Any, obs: Any) -> np.ndarray:
    from ray.rllib.core.columns import Columns

    return module.compute_values({Columns.OBS: obs}).detach().cpu().numpy().astype(np.float32, copy=False)
