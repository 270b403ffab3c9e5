"""The plane core: every decision the experience plane makes, once, for both backends.

The simulator (:mod:`conduit.sim`) advances time and flows; the runtime (:mod:`conduit.runtime`)
moves real bytes. Everything in between that is *decision logic* lives here and imports neither
backend:

* :mod:`~conduit.plane.arbiter` — asks the policy (place, spill, plan), checks each answer at the
  boundary, replaces an invalid one by the one safe default, and counts the rejection by reason;
* :mod:`~conduit.plane.ledger` — chunk bookkeeping: which tier holds each chunk, the residents of
  each tier oldest first, and the auditor's placement events, reported when they happen;
* :mod:`~conduit.plane.cadence` — the learner cadence model that predicts when each learner will
  next ask for a batch (one rule before there is history);
* :mod:`~conduit.plane.rules` — the per-contract rules (stale on arrival, which batch a chunk joins,
  a batch too old to hand over, Replay admission), built on the contract objects;
* :mod:`~conduit.plane.recovery` — after the plane's process died: the audit's journal, and which
  chunks a restarted plane takes over from its durable tier and which it counts lost.
"""

from conduit.plane.arbiter import Arbiter, Rejections
from conduit.plane.cadence import LearnerCadence
from conduit.plane.ledger import ChunkLedger
from conduit.plane.rules import ContractRules, rules_for

__all__ = ["Arbiter", "ChunkLedger", "ContractRules", "LearnerCadence", "Rejections", "rules_for"]
