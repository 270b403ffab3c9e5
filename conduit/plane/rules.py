"""Per-contract rules: the questions a plane asks about a chunk or a batch, answered once.

Each data contract (:mod:`conduit.contracts`) states what an update may receive; a plane has to
turn that into decisions on its hot path. :func:`rules_for` gives the :class:`ContractRules` of a
contract, and both backends ask it instead of branching on the contract's type:

* :meth:`~ContractRules.stale_on_arrival` — drop a chunk as it arrives (counted as ``stale``)?
  OnPolicy: its version belongs to an update the learner has already moved past. BoundedStaleness:
  its version is below ``current - max_lag``. Replay: never (Replay has no version rule).
* :meth:`~ContractRules.batch_key` — which batch a chunk joins: OnPolicy keys batches by version
  (update *k* takes version-*k* samples only); the others fill batches in arrival order.
* :meth:`~ContractRules.too_old` — may a batch assembled earlier still be handed over?
  BoundedStaleness drops a batch whose oldest sample fell below the lag bound while it waited.
* :attr:`~ContractRules.tabled` / :meth:`~ContractRules.admits_insert` — Replay keeps a table
  of ``capacity`` steps and admits an insert when its rate limiter allows.
"""

from __future__ import annotations

from collections.abc import Iterable

from conduit.contracts import BoundedStaleness, Contract, OnPolicy, Replay


class ContractRules:
    """The plane's rules for one contract (see the module doc). Subclassed per contract."""

    #: batches keyed by the samples' version (OnPolicy), not by arrival order
    by_version = False
    #: chunks form a replay table sampled with replacement (Replay), not a stream of batches
    tabled = False

    def __init__(self, contract: Contract):
        self.contract = contract

    def stale_on_arrival(self, version: int, *, next_update: int, current: int) -> bool:
        """Drop a chunk of ``version`` on arrival? ``next_update``: the consuming learner's next
        update; ``current``: the plane's policy version."""
        return False

    def batch_key(self, version: int, sequence: int) -> int:
        """The key of the batch a chunk of ``version`` joins (``sequence``: the learner's next
        arrival-order batch)."""
        return sequence

    def too_old(self, versions: Iterable[int], current: int) -> bool:
        """Whether a batch holding samples of ``versions`` may no longer be handed over."""
        return False

    def admits_insert(self, steps: int, inserted: int, sampled: int) -> bool:
        """The rate limiter's insert side (always yes without a limiter)."""
        return self.contract.can_insert(steps, inserted, sampled)


class OnPolicyRules(ContractRules):
    by_version = True

    def stale_on_arrival(self, version: int, *, next_update: int, current: int) -> bool:
        return version < next_update

    def batch_key(self, version: int, sequence: int) -> int:
        return version


class BoundedStalenessRules(ContractRules):
    def stale_on_arrival(self, version: int, *, next_update: int, current: int) -> bool:
        return version < self.contract.min_version(current)

    def too_old(self, versions: Iterable[int], current: int) -> bool:
        return min(versions, default=current) < self.contract.min_version(current)


class ReplayRules(ContractRules):
    tabled = True


def rules_for(contract: Contract) -> ContractRules:
    """The plane's rules for ``contract``."""
    if isinstance(contract, OnPolicy):
        return OnPolicyRules(contract)
    if isinstance(contract, BoundedStaleness):
        return BoundedStalenessRules(contract)
    if isinstance(contract, Replay):
        return ReplayRules(contract)
    raise TypeError(f"no plane rules for contract {contract!r}")
