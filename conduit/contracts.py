"""Data contracts: what "preserving RL correctness" means for a workload.

Every workload declares one contract. It states which samples an update may receive and how often,
and the plane must *enforce* it, not merely survive an audit of it; so each contract answers the
questions a plane asks on its hot path:

* ``admits(version, update)`` — may a sample of this policy version go into this update?
  ``min_version(update)`` is the same rule as a cut-off, for dropping stale data in bulk.
* ``deliveries_allowed(uses)`` — into how many more updates may a sample that has already been
  used in ``uses`` updates go? A **use** is one update: several deliveries of a sample to the same
  update (epochs, minibatches) are one use.
* ``can_insert(n, inserted, sampled)`` / ``can_sample(n, inserted, sampled)`` — the rate limiter:
  may ``n`` more steps be inserted / sampled, given the cumulative steps inserted and sampled so
  far? Only :class:`Replay` limits rates; the others always say yes.

The three contracts:

* :class:`OnPolicy` (PPO): update *k* receives only version-*k* samples; each sample is used in
  exactly one update; nothing is lost or duplicated.
* :class:`BoundedStaleness` (IMPALA/APPO): update *k* receives versions ``>= k - max_lag``; a
  sample is used in at most ``max_reuse`` updates; samples dropped for staleness are counted.
* :class:`Replay` (DQN/SAC): only inserted, not-yet-evicted samples are sampled, and the sampled
  / inserted ratio stays in a band after warm-up. The band is Reverb's ``SampleToInsertRatio``
  rule, in steps: once ``inserted >= min_size``,
  ``|sampled - replay_ratio * (inserted - min_size)| <= error_buffer``.

Contracts round-trip through plain dicts (``to_dict`` / :func:`contract_from_dict`) for YAML and
JSON. Bad values raise :class:`ContractError`, a :class:`~conduit.errors.ConduitError` whose
message and ``field`` name the offending field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Protocol, TypeAlias, runtime_checkable

from conduit.errors import ConduitError, UnknownNameError

_REL_TOL = 1e-9  # float slack in the rate band, relative to the magnitudes compared


class ContractError(ConduitError, ValueError):
    """A contract declared with a bad or missing value; ``field`` names it (e.g. ``max_lag``)."""

    def __init__(self, contract: str, field: str, message: str):
        self.contract = contract
        self.field = field
        super().__init__(f"{contract}.{field}: {message}")


def _int(contract: str, name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool):
        raise ContractError(contract, name, f"must be an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        as_int = int(value)
    except (TypeError, ValueError):
        raise ContractError(contract, name, f"must be an integer, got {value!r}") from None
    if as_int != value:
        raise ContractError(contract, name, f"must be an integer, got {value!r}")
    if as_int < minimum:
        raise ContractError(contract, name, f"must be >= {minimum}, got {as_int}")
    return as_int


def _float(contract: str, name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ContractError(contract, name, f"must be a number, got {value!r}")
    try:
        as_float = float(value)
    except (TypeError, ValueError):
        raise ContractError(contract, name, f"must be a number, got {value!r}") from None
    if not math.isfinite(as_float):
        raise ContractError(contract, name, f"must be finite, got {value!r}")
    return as_float


@runtime_checkable
class DataContract(Protocol):
    """What every contract offers a plane (and the auditor)."""

    kind: ClassVar[str]

    @property
    def max_uses(self) -> int | None: ...

    @property
    def must_deliver(self) -> bool: ...

    @property
    def repeats_in_delivery(self) -> bool: ...

    def admits(self, version: int, update: int) -> bool: ...

    def min_version(self, update: int) -> int | None: ...

    def deliveries_allowed(self, uses: int) -> int | None: ...

    def can_insert(self, n: int, inserted: int, sampled: int) -> bool: ...

    def can_sample(self, n: int, inserted: int, sampled: int) -> bool: ...

    def to_dict(self) -> dict[str, Any]: ...


class _Unlimited:
    """Shared pieces of the contracts without a rate limiter."""

    __slots__ = ()

    def deliveries_allowed(self, uses: int) -> int | None:
        """Updates a sample already used in ``uses`` updates may still go into (None: no limit)."""
        limit = self.max_uses  # type: ignore[attr-defined]
        return None if limit is None else max(0, limit - uses)

    def can_insert(self, n: int, inserted: int, sampled: int) -> bool:
        """No insert rate limit."""
        return True

    def can_sample(self, n: int, inserted: int, sampled: int) -> bool:
        """No sample rate limit."""
        return True


@dataclass(frozen=True, slots=True)
class OnPolicy(_Unlimited):
    """PPO's contract: update *k* uses exactly the version-*k* samples, each in that update only.

    Several deliveries of a sample inside update *k* (epochs, minibatches) are fine; a sample
    repeated inside one delivery, or delivered to a second update, is a duplicate. When update *k*
    is consumed, every version-*k* sample must have been delivered to it or dropped (counted).
    """

    kind: ClassVar[str] = "on_policy"

    @property
    def max_uses(self) -> int | None:
        """A sample goes into exactly one update."""
        return 1

    @property
    def must_deliver(self) -> bool:
        """Samples may not vanish: each is delivered or dropped with a reason."""
        return True

    @property
    def repeats_in_delivery(self) -> bool:
        """One delivery carries each sample at most once."""
        return False

    def admits(self, version: int, update: int) -> bool:
        """Only the version that update *k* was collected for: ``version == update``."""
        return version == update

    def min_version(self, update: int) -> int | None:
        """Samples older than this can never be used again (and should be dropped)."""
        return update

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form for YAML/JSON."""
        return {"kind": self.kind}


@dataclass(frozen=True, slots=True)
class BoundedStaleness(_Unlimited):
    """IMPALA/APPO's contract: bounded policy lag, bounded reuse, counted drops.

    ``max_lag``: update *k* accepts versions ``>= k - max_lag`` (0 means on-policy versions only,
    without OnPolicy's "use everything" obligation). ``max_reuse``: the number of updates a sample
    may go into (1: no reuse). A sample that is neither delivered nor dropped must still be in the
    plane when the run ends; otherwise it was lost.
    """

    max_lag: int
    max_reuse: int = 1

    kind: ClassVar[str] = "bounded_staleness"

    def __post_init__(self) -> None:
        name = type(self).__name__
        object.__setattr__(self, "max_lag", _int(name, "max_lag", self.max_lag, 0))
        object.__setattr__(self, "max_reuse", _int(name, "max_reuse", self.max_reuse, 1))

    @property
    def max_uses(self) -> int | None:
        """A sample goes into at most ``max_reuse`` updates."""
        return self.max_reuse

    @property
    def must_deliver(self) -> bool:
        """Samples may not vanish: each is delivered, dropped with a reason, or still resident."""
        return True

    @property
    def repeats_in_delivery(self) -> bool:
        """One delivery carries each sample at most once."""
        return False

    def admits(self, version: int, update: int) -> bool:
        """Versions no more than ``max_lag`` behind the update (newer versions are fine)."""
        return version >= update - self.max_lag

    def min_version(self, update: int) -> int | None:
        """Oldest version update *k* may receive; older samples should be dropped as stale."""
        return update - self.max_lag

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form for YAML/JSON."""
        return {"kind": self.kind, "max_lag": self.max_lag, "max_reuse": self.max_reuse}


@dataclass(frozen=True, slots=True)
class Prioritized:
    """Proportional prioritized sampling for a :class:`Replay` table (Schaul et al. 2016), as RLlib's
    ``PrioritizedEpisodeReplayBuffer`` runs it.

    ``alpha``: how much priorities count, ``P(i) = p_i^alpha / sum_k p_k^alpha`` (0: uniform).
    ``beta``: the importance-weight exponent, ``w_i = (N P(i))^-beta / max_j w_j`` (0: no
    correction). New samples get the largest priority seen so far. The plane's sampler
    (:mod:`conduit.plane.sampler`) implements it; ``Replay(sampler="prioritized")`` means
    ``Prioritized()``, whose defaults are RLlib's DQN and SAC defaults (``alpha=0.6``,
    ``beta=0.4``).
    """

    alpha: float = 0.6
    beta: float = 0.4

    name: ClassVar[str] = "prioritized"

    def __post_init__(self) -> None:
        for field_name in ("alpha", "beta"):
            value = _float("Replay", f"sampler.{field_name}", getattr(self, field_name))
            if value < 0:
                raise ContractError("Replay", f"sampler.{field_name}", f"must be >= 0, got {value!r}")
            object.__setattr__(self, field_name, value)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form: ``{"kind": "prioritized", "alpha": ..., "beta": ...}``."""
        return {"kind": self.name, "alpha": self.alpha, "beta": self.beta}


def _sampler(value: Any) -> str | Prioritized:
    """A Replay sampler as declared: a name, a :class:`Prioritized`, or its dict form."""
    if isinstance(value, Prioritized):
        return value
    if isinstance(value, str) and value:
        return Prioritized() if value.lower() == Prioritized.name else value
    if isinstance(value, Mapping):
        kind = value.get("kind", value.get("name"))
        if not isinstance(kind, str) or kind.lower() != Prioritized.name:
            if isinstance(kind, str) and kind and set(value) <= {"kind", "name"}:
                return kind
            raise ContractError("Replay", "sampler", f"a sampler mapping takes kind 'prioritized' with alpha and "
                                                     f"beta, got {dict(value)!r}")
        extra = sorted(set(value) - {"kind", "name", "alpha", "beta"})
        if extra:
            raise ContractError("Replay", f"sampler.{extra[0]}", "unknown field (known: alpha, beta)")
        return Prioritized(**{k: v for k, v in value.items() if k in ("alpha", "beta")})
    raise ContractError("Replay", "sampler", f"must be a non-empty string or a Prioritized, got {value!r}")


@dataclass(frozen=True, slots=True)
class Replay:
    """DQN/SAC's contract: a bounded replay buffer with a sample-to-insert rate limiter.

    ``capacity``: steps the buffer holds; older samples are evicted (that is normal, not a loss),
    and evicted samples may never be sampled again. ``replay_ratio``: sampled steps per inserted
    step in steady state (RLlib's training intensity divided by the rollout rate). ``min_size``:
    steps inserted before sampling may start (warm-up). ``sampler``: how samples are drawn:
    ``"uniform"``, or :class:`Prioritized` (``"prioritized"`` and ``{"kind": "prioritized",
    "alpha": ..., "beta": ...}`` are read as one); :func:`conduit.plane.sampler.make_sampler`
    resolves it, and refuses a name it does not know.

    ``error_buffer`` is the half-width of the rate band in steps. It defaults to
    ``max(1, replay_ratio) * max(min_size, 1)``. Why: the plane inserts whole chunks and samples
    whole batches, so one insert moves the error by ``replay_ratio * chunk_steps`` and one sample by
    ``batch_steps``; a band narrower than that deadlocks (neither call is ever allowed). Chunks and
    batches are at most the warm-up size in every sane configuration (DQN warms up on thousands of
    steps and samples batches of 32-256), and with both ``<= min_size`` the default band is provably
    deadlock-free: ``replay_ratio * chunk + batch <= 2 * error_buffer``. It also makes the crossing
    from warm-up into steady state always legal. Tying it to ``min_size`` keeps the tolerated ratio
    error relative: after ``N`` inserted steps the observed ratio is within
    ``max(1, r) * min_size / N`` of the target. Reverb's floor ``error_buffer >= max(1,
    replay_ratio)`` is enforced. With ``min_size == 0`` the default is ``max(1, r)`` steps, which
    only suits single-step inserts; pass ``error_buffer`` explicitly then.
    """

    capacity: int
    replay_ratio: float
    min_size: int
    sampler: str | Prioritized = "uniform"
    error_buffer: float | None = None

    kind: ClassVar[str] = "replay"

    def __post_init__(self) -> None:
        name = type(self).__name__
        capacity = _int(name, "capacity", self.capacity, 1)
        ratio = _float(name, "replay_ratio", self.replay_ratio)
        if ratio <= 0:
            raise ContractError(name, "replay_ratio", f"must be > 0, got {self.replay_ratio!r}")
        min_size = _int(name, "min_size", self.min_size, 0)
        if min_size > capacity:
            raise ContractError(
                name, "min_size", f"must be <= capacity ({capacity}), got {min_size}"
            )
        sampler = _sampler(self.sampler)
        buffer = self.error_buffer
        if buffer is not None:
            buffer = _float(name, "error_buffer", buffer)
            floor = max(1.0, ratio)
            if buffer < floor:
                raise ContractError(
                    name,
                    "error_buffer",
                    f"must be >= max(1, replay_ratio) = {floor:g} steps (a narrower band blocks "
                    f"both inserts and samples), got {self.error_buffer!r}",
                )
        object.__setattr__(self, "capacity", capacity)
        object.__setattr__(self, "replay_ratio", ratio)
        object.__setattr__(self, "min_size", min_size)
        object.__setattr__(self, "sampler", sampler)
        object.__setattr__(self, "error_buffer", buffer)

    # --- the sample rules -------------------------------------------------------------------

    @property
    def max_uses(self) -> int | None:
        """Replay reuses samples freely; the rate limiter bounds the average."""
        return None

    @property
    def must_deliver(self) -> bool:
        """Samples evicted unseen are normal for a replay buffer."""
        return False

    @property
    def repeats_in_delivery(self) -> bool:
        """Sampling is with replacement: a batch may carry a sample twice."""
        return True

    def admits(self, version: int, update: int) -> bool:
        """Off-policy: any version may be sampled."""
        return True

    def min_version(self, update: int) -> int | None:
        """No version cut-off; age is bounded by ``capacity`` instead."""
        return None

    def deliveries_allowed(self, uses: int) -> int | None:
        """No per-sample limit."""
        return None

    # --- the rate limiter -------------------------------------------------------------------

    @property
    def tolerance(self) -> float:
        """The band's half-width in steps: ``error_buffer`` or its default (see the class doc)."""
        if self.error_buffer is not None:
            return self.error_buffer
        return max(1.0, self.replay_ratio) * max(self.min_size, 1)

    def rate_error(self, inserted: int, sampled: int) -> float:
        """Reverb's error: ``replay_ratio * (inserted - min_size) - sampled``; > 0 is under-sampled."""
        return self.replay_ratio * (inserted - self.min_size) - sampled

    def _slack(self, inserted: int, sampled: int) -> float:
        return _REL_TOL * max(1.0, self.replay_ratio * inserted, float(sampled))

    def in_band(self, inserted: int, sampled: int) -> bool:
        """Whether cumulative counts satisfy the contract.

        Before warm-up nothing may have been sampled; after it, ``|rate_error| <= tolerance``.
        A plane that admits every insert and sample through :meth:`can_insert` /
        :meth:`can_sample` never leaves the band.
        """
        if inserted < self.min_size:
            return sampled == 0
        return abs(self.rate_error(inserted, sampled)) <= self.tolerance + self._slack(
            inserted, sampled
        )

    def can_insert(self, n: int, inserted: int, sampled: int) -> bool:
        """May ``n`` more steps be inserted? Free during warm-up, then ``error <= tolerance``."""
        after = inserted + n
        if after <= self.min_size:
            return True
        return self.rate_error(after, sampled) <= self.tolerance + self._slack(after, sampled)

    def can_sample(self, n: int, inserted: int, sampled: int) -> bool:
        """May ``n`` more steps be sampled? Never before warm-up, then ``error >= -tolerance``."""
        if inserted < self.min_size:
            return False
        after = sampled + n
        return self.rate_error(inserted, after) >= -self.tolerance - self._slack(inserted, after)

    def samples_allowed(self, inserted: int, sampled: int) -> int:
        """The most steps :meth:`can_sample` would admit now (0 while warming up or throttled)."""
        if inserted < self.min_size:
            return 0
        n = max(0, math.floor(self.rate_error(inserted, sampled) + self.tolerance))
        while n > 0 and not self.can_sample(n, inserted, sampled):
            n -= 1
        while self.can_sample(n + 1, inserted, sampled):
            n += 1
        return n

    def inserts_allowed(self, inserted: int, sampled: int) -> int:
        """The most steps :meth:`can_insert` would admit now."""
        bound = (self.tolerance + sampled) / self.replay_ratio + self.min_size - inserted
        n = max(self.min_size - inserted, math.floor(bound), 0)
        while n > 0 and not self.can_insert(n, inserted, sampled):
            n -= 1
        while self.can_insert(n + 1, inserted, sampled):
            n += 1
        return n

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form for YAML/JSON (``error_buffer`` as declared, ``None`` for the default)."""
        return {
            "kind": self.kind,
            "capacity": self.capacity,
            "replay_ratio": self.replay_ratio,
            "min_size": self.min_size,
            "sampler": self.sampler.to_dict() if isinstance(self.sampler, Prioritized) else self.sampler,
            "error_buffer": self.error_buffer,
        }


Contract: TypeAlias = OnPolicy | BoundedStaleness | Replay
"""Any of the three contracts."""

_KINDS: dict[str, type[OnPolicy | BoundedStaleness | Replay]] = {
    "onpolicy": OnPolicy,
    "boundedstaleness": BoundedStaleness,
    "replay": Replay,
}


def _canonical(kind: str) -> str:
    return kind.lower().replace("_", "").replace("-", "").replace(" ", "")


def contract_from_dict(d: Mapping[str, Any]) -> Contract:
    """Build a contract from its dict form, ``{"kind": "replay", "capacity": ..., ...}``.

    ``kind`` is ``on_policy``, ``bounded_staleness`` or ``replay`` (class names and hyphens are
    accepted too). Missing, unknown or bad fields raise :class:`ContractError` naming the field;
    an unknown kind raises :class:`~conduit.errors.UnknownNameError`.
    """
    if isinstance(d, OnPolicy | BoundedStaleness | Replay):
        return d
    if not isinstance(d, Mapping):
        raise ContractError("contract", "kind", f"expected a mapping, got {type(d).__name__}")
    if "kind" not in d:
        raise ContractError("contract", "kind", "missing")
    kind = d["kind"]
    if not isinstance(kind, str):
        raise ContractError("contract", "kind", f"must be a string, got {kind!r}")
    cls = _KINDS.get(_canonical(kind))
    if cls is None:
        known = [c.kind for c in _KINDS.values()]
        raise UnknownNameError("contract", kind, known)
    names = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    extra = sorted(set(d) - names - {"kind"})
    if extra:
        raise ContractError(cls.__name__, extra[0], f"unknown field (known: {sorted(names)})")
    missing = sorted(required - set(d))
    if missing:
        raise ContractError(cls.__name__, missing[0], "missing")
    return cls(**{k: v for k, v in d.items() if k != "kind"})
