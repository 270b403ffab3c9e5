"""How a learner gets its next batch from the plane, as the episodes RLlib's learner connector takes.

* :class:`Prefetcher` (DQN, SAC, APPO, IMPALA): a thread keeps the learner's *next* batch fetched and
  rebuilt while the learner trains on the current one, so ``update()`` finds it ready (DQN/SAC: the
  next two with a uniform buffer, the next one with a prioritized buffer). Their contracts allow it:
  a Replay sample drawn an update early is still a draw of inserted, not-yet-evicted steps (the rate
  limiter counts it when it is drawn; a prioritized draw waits for the priorities of the updates
  finished before it, see :mod:`conduit.runtime.rllib.learner`), and a BoundedStaleness batch is
  still within its lag bound (the plane checks it when it hands the batch over; APPO/IMPALA prefetch
  one batch only, so the bound stays the plane's).
* :class:`~conduit.runtime.rllib.values.ValueStream` (PPO): OnPolicy batch *k* cannot be fetched
  before iteration *k* has sampled it, so instead its chunks are read and evaluated as they land.
* :func:`fetch_now` (PPO with ``value_pass="batch"``, or ``prefetch_depth=0``): on demand.

**Replay batches as train batches.** A DQN/SAC replay batch in the transition layout already is the
train batch RLlib's learner connector builds from the one-step episodes its buffer returns: the
same columns, one row per transition. :class:`DirectReplay` hands it to the update as such - no
episode objects, no connector pass - after checking, on the learner's first batch, that it equals
what the stock connector builds from the same data (every key, dtype and value); on any difference
it keeps the stock path for good and says why in the learner's metrics.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from conduit.runtime.plane import DeliveryTimeout
from conduit.runtime.rllib.layout import TRAJECTORY, rebuild_trajectories, rebuild_transitions

log = logging.getLogger(__name__)  # conduit.runtime.rllib.delivery


def rebuild(batch: Any, layout: str, spaces: tuple[Any, Any]) -> list:
    """A delivered batch as the episodes RLlib's learner connector takes (Replay: with each row's
    importance weight, as RLlib's buffers put it in the one-step episodes' ``weights``)."""
    if layout == TRAJECTORY:
        return rebuild_trajectories(batch.columns, batch.selections, batch.annotations,
                                    observation_space=spaces[0], action_space=spaces[1])[0]
    return rebuild_transitions(batch.columns, weights=getattr(batch, "weights", None),
                               observation_space=spaces[0], action_space=spaces[1])


def fetch_now(cluster: Any, learner: str, layout: str, spaces: tuple[Any, Any], *, update: int | None,
              timeout: float) -> list:
    """The learner's next batch (OnPolicy: of ``update``) as episodes, fetched now."""
    return rebuild(cluster.next_batch(learner, update=update, timeout=timeout), layout, spaces)


class DirectReplay:
    """Transition-layout batches as ready train batches (see the module docstring)."""

    def __init__(self) -> None:
        self.verified: bool | None = None  # None: not checked yet
        self.reason = ""
        self.dtypes: dict[str, np.dtype] = {}  # the stock batch's dtype per column (adopted when verified)

    def columns(self, cols: dict[str, np.ndarray], weights: np.ndarray | None) -> dict[str, np.ndarray]:
        from ray.rllib.core.columns import Columns

        if weights is None:
            weights = np.ones(len(cols["obs"]), np.float64)
        out = {
            Columns.OBS: cols["obs"], Columns.NEXT_OBS: cols["next_obs"], Columns.ACTIONS: cols["actions"],
            Columns.REWARDS: cols["rewards"], Columns.TERMINATEDS: cols["terminateds"],
            Columns.TRUNCATEDS: cols["truncateds"], "n_step": cols["n_step"],
            "weights": np.asarray(weights, np.float64),
        }
        return {k: v.astype(self.dtypes[k], copy=False) if k in self.dtypes else v for k, v in out.items()}

    def verify(self, learner: Any, cols: dict[str, np.ndarray], weights: np.ndarray | None, episodes: list) -> bool:
        """Compare with the stock connector's batch for the same episodes; remember the verdict."""
        from ray.rllib.core import DEFAULT_MODULE_ID
        from ray.rllib.utils.numpy import convert_to_numpy

        stock = learner._learner_connector(rl_module=learner.module, batch={}, episodes=copy.deepcopy(episodes),
                                           shared_data={}, metrics=None)
        stock = {k: convert_to_numpy(v) for k, v in stock.get(DEFAULT_MODULE_ID, {}).items()}
        mine = self.columns(cols, weights)
        if set(stock) != set(mine):
            self.reason = f"columns differ: stock {sorted(stock)}, direct {sorted(mine)}"
        else:
            stock = {k: np.asarray(v) for k, v in stock.items()}
            bad = [k for k in mine if stock[k].shape != mine[k].shape
                   or not np.array_equal(stock[k], mine[k].astype(stock[k].dtype))]
            self.reason = f"columns {bad} differ in shape or value" if bad else ""
            self.dtypes = {k: v.dtype for k, v in stock.items()}
        self.verified = not self.reason
        return self.verified

    def train_data(self, cols: dict[str, np.ndarray], weights: np.ndarray | None) -> Any:
        from ray.rllib.core import DEFAULT_MODULE_ID
        from ray.rllib.core.learner.training_data import TrainingData
        from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

        batch = SampleBatch(self.columns(cols, weights))
        return TrainingData(batch=MultiAgentBatch({DEFAULT_MODULE_ID: batch}, env_steps=len(batch)))


class Prefetcher:
    """Keeps the learner's next ``depth`` batches fetched, in a thread (see the module docstring).

    The learner calls :meth:`request` when an update ends: the fetch then runs while the learner is
    idle (the driver syncs weights and samples), not during its gradient steps, where it would only
    compete with them for the CPU. :meth:`get` returns the oldest fetched batch. With ``depth`` 2 a
    fetch that takes longer than one idle gap (a plane round trip on a busy machine) is still ready
    in time, because it had two gaps.
    """

    def __init__(self, fetch: Callable[[float], Any], poll_s: float = 1.0, depth: int = 1):
        if depth < 1:
            raise ValueError(f"Prefetcher: depth must be at least 1, got {depth}")
        self._fetch, self._poll_s = fetch, poll_s
        self._ready: queue.Queue = queue.Queue(maxsize=depth)
        self._wanted = threading.Semaphore(0)
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conduit-prefetch", daemon=True)
        self._thread.start()
        for _ in range(depth):
            self.request()

    def request(self) -> None:
        """Start fetching one more batch."""
        self._wanted.release()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._wanted.acquire(timeout=0.2):
                continue
            while not self._stop.is_set():
                try:
                    self._ready.put(self._fetch(self._poll_s))
                    break
                except DeliveryTimeout:  # nothing to sample yet (warm-up, rate limiter): ask again
                    continue
                except BaseException as exc:  # noqa: BLE001 - handed to the learner's next update
                    log.warning("batch prefetch stopped: %r (raised at the learner's next update)", exc)
                    self._error = exc
                    return

    def get(self, timeout: float) -> Any:
        """The oldest fetched batch, waiting up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._ready.get(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                if self._error is not None:
                    raise self._error from None
                if time.monotonic() >= deadline:
                    raise DeliveryTimeout(f"no batch was delivered within {timeout:g} s") from None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
