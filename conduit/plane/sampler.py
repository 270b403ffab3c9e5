"""The Replay contract's sampler: which live samples a replay batch draws, and their importance weights.

A Replay table (:class:`~conduit.contracts.Replay`) holds samples; the sampler decides which of them
a batch draws. It knows samples only by **opaque integer ids** (``int64``), given to it by the
table that owns the data: the runtime names each step of a chunk by one id (never reused), a
TorchRL storage could use its storage indices. It imports neither backend and no framework.

The interface (:class:`ReplaySampler`), the same for every sampler:

* ``add(ids, priority=None)`` — the samples became live (inserted into the table);
* ``remove(ids)`` — they left it (evicted); they are never drawn again;
* ``sample(n, rng) -> (ids, weights)`` — ``n`` draws, with replacement, over the live samples,
  with their importance weights;
* ``update(ids, priorities) -> dropped`` — new priorities (from the learner's TD errors); an id no
  longer live (evicted between the draw and the update) is skipped and **counted**, not an error;
* ``state_dict()`` / ``load_state_dict(state)`` — plain numpy/int/float state, so a checkpoint can
  carry it;
* ``counters()`` — what it did, for the plane's metrics.

Two samplers, resolved from the contract's ``sampler`` by :func:`make_sampler`:

* :class:`UniformSampler` (``"uniform"``): every live sample equally likely, weights 1 — RLlib's
  ``EpisodeReplayBuffer`` timestep sampling. A dense id array with swap-remove, O(1) per id.
* :class:`PrioritizedSampler` (:class:`~conduit.contracts.Prioritized`): proportional
  prioritization exactly as RLlib 2.60's ``PrioritizedEpisodeReplayBuffer`` does it
  (``ray/rllib/utils/replay_buffers/prioritized_episode_buffer.py``), over a sum tree and a min
  tree (``ray/rllib/execution/segment_tree.py``), here numpy arrays updated and searched for a whole
  batch at once, O(log n) per id:

  - a new sample's priority is the largest priority seen so far (``_max_priority``, 1.0 at the
    start); the tree stores ``priority ** alpha`` (``add`` / ``_get_free_node_and_assign``); an
    explicit ``priority`` given to ``add`` does not raise the maximum (as RLlib's ``add(weight=)``);
  - ``P(i) = p_i^alpha / sum_k p_k^alpha``: a draw is ``u * total`` with ``u ~ U[0, 1)``, located
    by a prefix-sum descent (``SumSegmentTree.find_prefixsum_idx``: go left while the left sum
    exceeds the remainder);
  - ``w_i = (N P(i))^-beta / max_w`` with ``max_w = (N P_min)^-beta``, ``P_min`` the smallest live
    probability and ``N`` the number of live samples (``sample``: ``p_min``, ``max_weight``,
    ``weight / max_weight``);
  - an update sets ``priority = max(td, 1e-12)``, stores ``priority ** alpha`` and raises the
    maximum (``update_priorities``). Within one update the last value for a repeated id wins, as
    in RLlib's sequential loop.

  Two deliberate differences, both where RLlib's own behaviour is undefined: RLlib updates the
  samples of *its last draw*, positionally; here updates are keyed by id, so a batch drawn ahead
  and samples evicted meanwhile are handled exactly (the latter counted as dropped). And a
  floating-point remainder that would send the descent into an empty subtree (RLlib issue 54284,
  which RLlib papers over by clipping the draw by 1e-5) goes to the non-empty side, so a removed
  sample can never be drawn.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

import numpy as np

from conduit.contracts import Prioritized, Replay
from conduit.errors import ConduitError, UnknownNameError

log = logging.getLogger("conduit.plane.sampler")

MIN_PRIORITY = 1e-12
"""Priorities are floored here before use (RLlib: ``max(priority, 1e-12)`` in ``update_priorities``)."""


def _ids(ids: Any) -> np.ndarray:
    out = np.asarray(ids, dtype=np.int64).reshape(-1)
    return out


@runtime_checkable
class ReplaySampler(Protocol):
    """What a Replay table asks of its sampler (see the module doc)."""

    name: str

    def __len__(self) -> int: ...

    def add(self, ids: Any, priority: float | None = None) -> None: ...

    def remove(self, ids: Any) -> None: ...

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]: ...

    def update(self, ids: Any, priorities: Any) -> int: ...

    def counters(self) -> dict[str, int]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class _Base:
    """Bookkeeping shared by both samplers: the id -> slot map and the counters."""

    name = "base"

    def __init__(self) -> None:
        self._slot: dict[int, int] = {}  # live id -> its slot (dense position or tree leaf)
        self._drawn = 0
        self._updated = 0
        self._dropped = 0

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, sample_id: object) -> bool:
        return int(sample_id) in self._slot  # type: ignore[call-overload]

    def live_ids(self) -> np.ndarray:
        """Every live id (in no particular order)."""
        return np.fromiter(self._slot, np.int64, len(self._slot))

    def counters(self) -> dict[str, int]:
        """``drawn`` samples, priority ``updated`` samples, and updates ``dropped`` (evicted ids)."""
        return {"drawn": self._drawn, "priority_updates": self._updated, "priority_updates_dropped": self._dropped}

    def _new(self, ids: np.ndarray) -> None:
        if len(np.unique(ids)) != len(ids):
            raise ConduitError(f"{self.name} sampler: add() got the same id twice")
        for i in ids.tolist():
            if i in self._slot:
                raise ConduitError(f"{self.name} sampler: id {i} is already live")

    def _live_mask(self, ids: np.ndarray) -> np.ndarray:
        slot = self._slot
        return np.fromiter((i in slot for i in ids.tolist()), np.bool_, len(ids))

    def _check_n(self, n: int) -> int:
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise ConduitError(f"{self.name} sampler: sample(n) needs an integer n >= 0, got {n!r}")
        if n and not self._slot:
            raise ConduitError(f"{self.name} sampler: sample({n}) from an empty table")
        return int(n)


class UniformSampler(_Base):
    """Every live sample equally likely, importance weights 1 (see the module doc)."""

    name = "uniform"

    def __init__(self, capacity: int = 1024) -> None:
        super().__init__()
        self._dense = np.empty(max(1, int(capacity)), np.int64)  # live ids in [0, len)

    def add(self, ids: Any, priority: float | None = None) -> None:
        """Make ``ids`` live (``priority`` is accepted and ignored: every sample weighs the same)."""
        ids = _ids(ids)
        self._new(ids)
        n0 = len(self._slot)
        need = n0 + len(ids)
        if need > len(self._dense):
            grown = np.empty(max(need, 2 * len(self._dense)), np.int64)
            grown[:n0] = self._dense[:n0]
            self._dense = grown
        self._dense[n0:need] = ids
        self._slot.update(zip(ids.tolist(), range(n0, need), strict=True))

    def remove(self, ids: Any) -> None:
        """``ids`` left the table: swap each with the last live id (ids not live are ignored)."""
        dense, slot = self._dense, self._slot
        for i in _ids(ids).tolist():
            pos = slot.pop(i, None)
            if pos is None:
                continue
            last = len(slot)
            if pos != last:
                moved = int(dense[last])
                dense[pos] = moved
                slot[moved] = pos

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` live ids uniformly with replacement, weights 1."""
        n = self._check_n(n)
        if n == 0:
            return np.empty(0, np.int64), np.empty(0, np.float64)
        picks = self._dense[rng.integers(0, len(self._slot), size=n)].copy()
        self._drawn += n
        return picks, np.ones(n, np.float64)

    def update(self, ids: Any, priorities: Any) -> int:
        """Priorities do not change a uniform draw; ids no longer live are counted as dropped."""
        ids = _ids(ids)
        if len(np.asarray(priorities).reshape(-1)) != len(ids):
            raise ConduitError(f"uniform sampler: update() got {len(ids)} ids but "
                               f"{len(np.asarray(priorities).reshape(-1))} priorities")
        dropped = int(len(ids) - np.count_nonzero(self._live_mask(ids)))
        self._updated += len(ids) - dropped
        self._dropped += dropped
        return dropped

    def state_dict(self) -> dict[str, Any]:
        """The live ids and counters (plain numpy and ints)."""
        return {"name": self.name, "ids": self._dense[:len(self._slot)].copy(), **self.counters()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace this sampler's state by ``state`` (from :meth:`state_dict`)."""
        if state.get("name") != self.name:
            raise ConduitError(f"uniform sampler: cannot load the state of a {state.get('name')!r} sampler")
        self._slot.clear()
        self.add(state["ids"])
        self._drawn = int(state["drawn"])
        self._updated = int(state["priority_updates"])
        self._dropped = int(state["priority_updates_dropped"])


class PrioritizedSampler(_Base):
    """Proportional prioritized sampling, RLlib's ``PrioritizedEpisodeReplayBuffer`` math (module doc).

    ``capacity`` is the number of live samples expected (the table's capacity); the trees grow
    by doubling if more are added.
    """

    name = "prioritized"

    def __init__(self, alpha: float = 0.6, beta: float = 0.4, capacity: int = 1024) -> None:
        super().__init__()
        if not (np.isfinite(alpha) and alpha >= 0):
            raise ConduitError(f"prioritized sampler: alpha must be >= 0, got {alpha!r}")
        if not (np.isfinite(beta) and beta >= 0):
            raise ConduitError(f"prioritized sampler: beta must be >= 0, got {beta!r}")
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.max_priority = 1.0  # RLlib: self._max_priority = 1.0
        self._alloc(max(1, int(capacity)))

    # ------------------------------------------------------------------ trees
    def _alloc(self, leaves: int) -> None:
        size = 1
        while size < leaves:
            size *= 2
        self._size = size  # leaves; node k has children 2k, 2k+1; leaf j is node size + j; root 1
        self._sum = np.zeros(2 * size, np.float64)
        self._min = np.full(2 * size, np.inf, np.float64)
        self._leaf_id = np.full(size, -1, np.int64)
        # free leaves as a stack: [0, _nfree) of _free; its top (the end) is the lowest free leaf at first
        self._free = np.arange(size - 1, -1, -1, dtype=np.int64)
        self._nfree = size

    def _set(self, leaves: np.ndarray, values: np.ndarray) -> None:
        """Leaves take ``values`` (0 for a free leaf); their ancestors are recomputed from children."""
        nodes = leaves + self._size
        self._sum[nodes] = values
        self._min[nodes] = np.where(values > 0, values, np.inf)
        nodes = np.unique(nodes >> 1)  # sorted: a shift keeps it sorted, so each level dedupes neighbours only
        while len(nodes) and nodes[0] >= 1:
            left = nodes << 1
            self._sum[nodes] = self._sum[left] + self._sum[left + 1]
            self._min[nodes] = np.minimum(self._min[left], self._min[left + 1])
            if nodes[0] == 1:
                break
            nodes = nodes >> 1
            if len(nodes) > 1:
                nodes = nodes[np.concatenate(([True], nodes[1:] != nodes[:-1]))]

    def _grow(self, need: int) -> None:
        ids = self._leaf_id[self._leaf_id >= 0]
        vals = self._sum[self._size + np.flatnonzero(self._leaf_id >= 0)]
        size = self._size
        while size < need:
            size *= 2
        log.debug("prioritized sampler: trees grow from %d to %d leaves", self._size, size)
        self._alloc(size)
        self._slot.clear()
        self._place(ids, vals)

    def _place(self, ids: np.ndarray, values: np.ndarray) -> None:
        k = len(ids)
        leaves = self._free[self._nfree - k:self._nfree][::-1].copy()
        self._nfree -= k
        self._leaf_id[leaves] = ids
        self._slot.update(zip(ids.tolist(), leaves.tolist(), strict=True))
        self._set(leaves, values)

    # ------------------------------------------------------------------ interface
    def add(self, ids: Any, priority: float | None = None) -> None:
        """Make ``ids`` live with ``priority`` (default: the largest priority seen so far)."""
        ids = _ids(ids)
        self._new(ids)
        if len(self._slot) + len(ids) > self._size:
            self._grow(len(self._slot) + len(ids))
        p = self.max_priority if priority is None else float(priority)
        if not (np.isfinite(p) and p >= 0):
            raise ConduitError(f"prioritized sampler: add() priority must be finite and >= 0, got {priority!r}")
        self._place(ids, np.full(len(ids), p ** self.alpha))

    def remove(self, ids: Any) -> None:
        """``ids`` left the table: their leaves are freed (sum 0, min inf); ids not live are ignored."""
        leaves = [leaf for i in _ids(ids).tolist() if (leaf := self._slot.pop(i, None)) is not None]
        if not leaves:
            return
        leaves_a = np.asarray(leaves, np.int64)
        self._leaf_id[leaves_a] = -1
        k = len(leaves_a)
        self._free[self._nfree:self._nfree + k] = np.sort(leaves_a)[::-1]
        self._nfree += k
        self._set(leaves_a, np.zeros(len(leaves_a)))

    def probabilities(self, ids: Any) -> np.ndarray:
        """``P(i)`` of live ``ids`` (for tests and reports)."""
        leaves = np.array([self._slot[i] for i in _ids(ids).tolist()], np.int64)
        return self._sum[leaves + self._size] / self._sum[1]

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` draws with ``P(i)`` proportional to ``p_i^alpha``, and their normalised weights."""
        n = self._check_n(n)
        if n == 0:
            return np.empty(0, np.int64), np.empty(0, np.float64)
        s = self._sum
        total = s[1]
        count = len(self._slot)
        prefix = rng.random(n) * total
        prefix = np.where(prefix >= total, total - 1e-5, prefix)  # RLlib's clip (never hit: u < 1)
        node = np.ones(n, np.int64)
        while node[0] < self._size:  # every query is at the same depth
            left = node << 1
            lsum = s[left]
            go_left = (lsum > prefix) | (s[left + 1] <= 0)
            prefix = np.where(go_left, prefix, prefix - lsum)
            node = np.where(go_left, left, left + 1)
        leaves = node - self._size
        ids = self._leaf_id[leaves]
        p_min = self._min[1] / total
        max_weight = (p_min * count) ** (-self.beta)
        p_sample = s[node] / total
        weights = (p_sample * count) ** (-self.beta) / max_weight
        self._drawn += n
        return ids.copy(), weights

    def update(self, ids: Any, priorities: Any) -> int:
        """Set new priorities (``max(p, 1e-12)``); returns how many ids were no longer live (skipped)."""
        ids = _ids(ids)
        prios = np.asarray(priorities, np.float64).reshape(-1)
        if len(prios) != len(ids):
            raise ConduitError(f"prioritized sampler: update() got {len(ids)} ids but {len(prios)} priorities")
        if not np.all(np.isfinite(prios)):
            raise ConduitError("prioritized sampler: update() got a priority that is not finite")
        live = self._live_mask(ids)
        dropped = int(len(ids) - np.count_nonzero(live))
        ids, prios = ids[live], np.maximum(prios[live], MIN_PRIORITY)
        if len(ids):
            # the last value for a repeated id wins, as in RLlib's sequential loop
            _, last = np.unique(ids[::-1], return_index=True)
            keep = len(ids) - 1 - last
            leaves = np.array([self._slot[i] for i in ids[keep].tolist()], np.int64)
            self._set(leaves, prios[keep] ** self.alpha)
            self.max_priority = max(self.max_priority, float(prios.max()))
        self._updated += len(ids)
        self._dropped += dropped
        return dropped

    def state_dict(self) -> dict[str, Any]:
        """Live ids with their tree values, ``max_priority``, ``alpha``, ``beta`` and counters."""
        used = np.flatnonzero(self._leaf_id >= 0)
        return {"name": self.name, "alpha": self.alpha, "beta": self.beta, "max_priority": self.max_priority,
                "ids": self._leaf_id[used].copy(), "values": self._sum[self._size + used].copy(),
                **self.counters()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace this sampler's state by ``state`` (from :meth:`state_dict`); alpha and beta must match."""
        if state.get("name") != self.name:
            raise ConduitError(f"prioritized sampler: cannot load the state of a {state.get('name')!r} sampler")
        if (float(state["alpha"]), float(state["beta"])) != (self.alpha, self.beta):
            raise ConduitError(f"prioritized sampler: the state has alpha={state['alpha']}, beta={state['beta']}; "
                               f"this sampler has alpha={self.alpha}, beta={self.beta}")
        ids = _ids(state["ids"])
        self._slot.clear()
        self._alloc(max(self._size, len(ids)))
        self._place(ids, np.asarray(state["values"], np.float64))
        self.max_priority = float(state["max_priority"])
        self._drawn = int(state["drawn"])
        self._updated = int(state["priority_updates"])
        self._dropped = int(state["priority_updates_dropped"])


SAMPLERS = ("uniform", "prioritized")
"""The sampler names :func:`make_sampler` knows."""


def make_sampler(spec: Replay | str | Prioritized, capacity: int | None = None) -> UniformSampler | PrioritizedSampler:
    """The sampler a Replay contract declares (``spec`` may be the contract or its ``sampler``)."""
    if isinstance(spec, Replay):
        capacity = spec.capacity if capacity is None else capacity
        spec = spec.sampler
    cap = 1024 if capacity is None else int(capacity)
    if isinstance(spec, Prioritized):
        return PrioritizedSampler(spec.alpha, spec.beta, capacity=cap)
    if spec == "uniform":
        return UniformSampler(capacity=cap)
    raise UnknownNameError("Replay sampler", str(spec), list(SAMPLERS))
