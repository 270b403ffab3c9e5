"""Policy protocols: what a placement or scheduling policy decides, and how it is packaged.

Conduit controls the experience path at three points. A **placement policy** answers *where*: the
tier a chunk's first copy lands in (ingestion) and where data goes when a tier fills up (spill). A
**scheduling policy** answers *when and in what order*: which moves to start now so that each
learner's next batch is on its device before it asks. Both read only a
:class:`~conduit.view.ClusterView` and return plain decision objects; a backend (simulator or
runtime) validates and executes them. A decision that is invalid — over capacity, an unknown tier,
one that breaks the data contract — is rejected by the backend with :class:`InvalidDecision`, counted,
and replaced by the safe default, so a buggy policy can cost time but never samples.

A :class:`Policy` bundles one placement policy, one scheduling policy and the **path settings**
(:class:`PathSettings`) that say how the surrounding pipeline runs: through the driver or directly,
per-batch or per-chunk batch building, pinned or pageable copies, coalescing granularity. The
``rllib-stock`` baseline is one such bundle; Conduit's own policy is another.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from conduit.errors import ConduitError, shown
from conduit.view import ClusterView


class InvalidDecision(ConduitError):
    """A policy's decision that the plane refused: names the policy, the call and the value.

    ``code`` is the reason's short name, the key rejections are counted under in both backends
    (``unknown-tier``, ``over-capacity``, ``wrong-type``, ``raised``...); ``call`` the policy method
    that made the decision (``place``, ``spill``, ``plan``). The value is shown bounded, so a huge
    or self-referencing object cannot flood a log.
    """

    def __init__(self, policy: str, decision: object, reason: str, *, call: str | None = None,
                 code: str = "refused-by-policy"):
        self.policy = policy
        self.decision = decision
        self.reason = reason
        self.call = call
        self.code = code
        where = f" in {call}()" if call else ""
        super().__init__(f"policy {policy!r} made an invalid decision{where} {shown(decision)}: {reason}")


@dataclass(frozen=True)
class Placement:
    """Put a chunk in ``tier`` (a tier id of the view)."""

    tier: str


@dataclass(frozen=True)
class Move:
    """Copy chunk ``chunk_id`` into ``dst_tier``; ``deadline`` orders moves (earliest first)."""

    chunk_id: Hashable
    dst_tier: str
    deadline: float | None = None


@dataclass(frozen=True)
class ChunkInfo:
    """What a placement decision knows about the chunk being placed and who will consume it."""

    chunk_id: Hashable
    node: str | None
    device: str | None
    nbytes: float
    policy_version: int
    consumer: str | None = None  # learner id, when the plane has already chosen one


@runtime_checkable
class PlacementPolicy(Protocol):
    """Chooses tiers. ``place`` for a new chunk; ``spill`` to free ``nbytes`` in a full tier."""

    name: str

    def place(self, chunk: ChunkInfo, view: ClusterView) -> Placement: ...

    def spill(self, tier: str, nbytes: float, view: ClusterView) -> Sequence[Move]: ...


@runtime_checkable
class SchedulingPolicy(Protocol):
    """Chooses when data moves: ``plan`` returns the moves to start now, in priority order.

    ``pending`` lists, per learner, the chunks assigned to its next batch that are not yet on its
    device, with their sizes; the backend calls ``plan`` whenever something changes (a chunk arrives,
    a move finishes, a learner starts an update).
    """

    name: str

    def plan(
        self, pending: Mapping[str, Sequence[tuple[Hashable, float]]], view: ClusterView
    ) -> Sequence[Move]: ...


Route = Literal["driver", "direct"]
BatchBuild = Literal["per-batch", "per-chunk"]
Deployment = Literal["enable", "target"]


@dataclass(frozen=True)
class PathSettings:
    """How the pipeline around the policies runs (executed identically by both backends).

    * ``route`` — ``driver``: experience is gathered into the driver process and sharded to learners
      (stock RLlib); ``direct``: from the producer straight to its placement.
    * ``batch_build`` — ``per-batch``: the learner connector (batch building, to-tensor, value pass)
      runs over the whole batch after sampling ends; ``per-chunk``: it runs on each chunk as it arrives,
      which the contracts allow (PPO's value function of version *k* is fixed while *k* samples).
    * ``pinned`` — host->device copies from a pinned staging ring (DMA at link speed) or pageable
      memory (staged through a bounce buffer).
    * ``granularity`` — chunks coalesced into one transfer.
    * ``overlap_collection`` — move data while sampling still runs.
    * ``overlap_update`` — prepare batch *k+1* while update *k* runs, when the contract allows.
    * ``prefetch_depth`` — batches per learner allowed in flight ahead of need.
    * ``split`` — pieces each rollout fragment is handed over in (finer ingestion granularity than
      the runner's fragment: the tail of an iteration shrinks, per-piece overheads grow);
      ``target_chunk_bytes`` asks for as many pieces as keep each under that size (the larger of
      the two wins). ``fragment_steps`` asks for pieces of at most that many vector steps (the
      fragment length an RLlib user tunes; the simulator applies it, the runtime's assembly does
      not read it yet).
    """

    route: Route = "direct"
    batch_build: BatchBuild = "per-chunk"
    pinned: bool = True
    granularity: int = 1
    overlap_collection: bool = True
    overlap_update: bool = True
    prefetch_depth: int = 2
    split: int = 1
    target_chunk_bytes: float | None = None
    fragment_steps: int | None = None
    deployment: Deployment = "target"

    def pieces(self, fragment_bytes: float, fragment_length: int | None = None) -> int:
        """Pieces a fragment of ``fragment_bytes`` (and ``fragment_length`` vector steps, when
        known) is handed over in."""
        by_size = math.ceil(fragment_bytes / self.target_chunk_bytes) if self.target_chunk_bytes else 1
        by_steps = (math.ceil(fragment_length / self.fragment_steps)
                    if self.fragment_steps and fragment_length else 1)
        return max(self.split, by_size, by_steps, 1)

    def __post_init__(self) -> None:
        if self.route not in ("driver", "direct"):
            raise ConduitError(f"path setting 'route' must be 'driver' or 'direct', got {shown(self.route)}")
        if self.batch_build not in ("per-batch", "per-chunk"):
            raise ConduitError(
                f"path setting 'batch_build' must be 'per-batch' or 'per-chunk', got {shown(self.batch_build)}"
            )
        for name, minimum in (("granularity", 1), ("prefetch_depth", 0), ("split", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ConduitError(f"path setting {name!r} must be an integer >= {minimum}, got {shown(value)}")
        if self.deployment not in ("enable", "target"):
            raise ConduitError(f"path setting 'deployment' must be 'enable' or 'target', got {shown(self.deployment)}")
        if self.deployment == "enable" and self.route != "direct":
            raise ConduitError("path setting deployment='enable' models the plane's direct route; "
                               f"it needs route='direct', got route={shown(self.route)}")
        steps = self.fragment_steps
        if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
            raise ConduitError(f"path setting 'fragment_steps' must be an integer >= 1, got {shown(steps)}")
        size = self.target_chunk_bytes
        if size is not None and (isinstance(size, bool) or not isinstance(size, int | float)
                                 or not 0 < size < math.inf):
            raise ConduitError(f"path setting 'target_chunk_bytes' must be a finite number > 0, got {shown(size)}")


@dataclass(frozen=True)
class Param:
    """A tunable parameter a policy declares: integer or real range, or a set of choices."""

    name: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    integer: bool = False
    log: bool = False


@dataclass
class Policy:
    """A complete policy: placement + scheduling + path settings, plus declared parameters.

    ``params`` are the values in force; ``space`` the parameters ``conduit tune`` may search;
    ``given`` the names of the parameters the user gave (set by :func:`conduit.registry.create_policy`):
    only those change what ``enable()`` deploys (:mod:`conduit.deploy_settings`).
    """

    name: str
    placement: PlacementPolicy
    scheduling: SchedulingPolicy
    path: PathSettings = field(default_factory=PathSettings)
    params: dict[str, Any] = field(default_factory=dict)
    space: tuple[Param, ...] = ()
    summary: str = ""
    given: frozenset[str] = frozenset()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "placement": self.placement.name,
            "scheduling": self.scheduling.name,
            "path": asdict(self.path),
            "params": dict(self.params),
        }

    def with_path(self, **changes: Any) -> Policy:
        return replace(self, path=replace(self.path, **changes))
