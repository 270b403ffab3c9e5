"""The arbiter: the one place a policy's decisions are asked for, checked and, if invalid, replaced.

A policy is a plug-in: it may return the wrong type, name a tier that does not exist, overfill a
tier, move a chunk that is not where it says, or raise. The plane must survive all of it without
losing a sample, and both backends must survive it *the same way*, or a policy tuned in the
simulator would behave differently for real. So every call into a policy goes through
:class:`Arbiter`:

* :meth:`Arbiter.place` asks ``placement.place`` and accepts the answer only if it is a
  :class:`~conduit.policy.Placement` of a tier the view knows, with room for the chunk, and not the
  HBM of a node other than the consumer's. Otherwise the rejection is counted and the **safe
  default** is used: pinned, then pageable host memory on the consumer's node, the first with room
  (or pageable memory, where the chunk then waits for room: backpressure, never an overfilled tier).
* :meth:`Arbiter.spill` asks ``placement.spill`` and returns only the valid moves: each must be a
  :class:`~conduit.policy.Move` of a chunk resident in the full tier and free to move, to another
  known tier with room for it (counting the moves already accepted in the same answer).
* :meth:`Arbiter.plan` asks ``scheduling.plan`` and returns the moves to start, in the policy's
  order. A move must name a pending chunk; its destination must be the learner's tier (a move
  elsewhere is counted and executed towards the learner's tier anyway). With the path setting
  ``overlap_collection`` off, a valid move waits until its learner asks (data does not move while
  sampling runs: for a synchronous algorithm the ask marks the end of sampling). Then the one rule for a
  learner that is **waiting now**: every pending chunk of it that the policy did not plan is moved
  anyway, and counted as *forced* (a policy can cost time, never data, and never stall a run). A
  learner with no device memory of its own (a CPU learner) receives its chunks as they arrive when
  the path settings ask for ``overlap_collection``: nothing crosses a device link.

A rejection is an :class:`~conduit.policy.InvalidDecision` naming the policy, the call and the
value; exceptions raised inside a policy become one too (code ``raised``). :class:`Rejections`
counts them by code, identically in both backends, and keeps the first few messages for the CLI's
``--json`` and the runtime's metrics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from typing import Any

from conduit.policy import ChunkInfo, InvalidDecision, Move, Placement, Policy
from conduit.topology.model import TierKind
from conduit.view import ClusterView

MAX_MESSAGES = 20
"""Rejection messages kept (the counts are always complete)."""

SAFE_DEFAULT = (TierKind.PINNED, TierKind.PAGEABLE)
"""The one fallback order for a refused placement: host tiers on the consumer's node."""


class Rejections:
    """Refused policy decisions, counted by reason code, with the first few messages."""

    def __init__(self) -> None:
        self.by_code: Counter[str] = Counter()
        self.messages: list[str] = []
        self.forced_moves = 0

    @property
    def total(self) -> int:
        return sum(self.by_code.values())

    @property
    def last(self) -> str | None:
        return self.messages[-1] if self.messages else None

    def count(self, exc: InvalidDecision) -> None:
        self.by_code[exc.code] += 1
        if len(self.messages) < MAX_MESSAGES:
            self.messages.append(str(exc))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: total, counts by code, the kept messages, and moves forced for waiting
        learners (the scheduler planned nothing for data a learner was waiting on)."""
        return {"total": self.total, "by_reason": dict(sorted(self.by_code.items())),
                "messages": list(self.messages), "forced_moves": self.forced_moves}


class Arbiter:
    """Asks ``policy`` for decisions and returns only checked ones (see the module doc)."""

    def __init__(self, policy: Policy, rejections: Rejections | None = None):
        self.policy = policy
        self.placement = policy.placement
        self.scheduling = policy.scheduling
        self.path = policy.path
        self.rejections = rejections if rejections is not None else Rejections()

    # ------------------------------------------------------------------ asking, at the boundary
    def _ask(self, owner: Any, call: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call into the policy; an exception raised inside it becomes an InvalidDecision."""
        try:
            return fn(*args)
        except InvalidDecision as exc:
            if exc.call is not None:
                raise
            raise InvalidDecision(exc.policy, exc.decision, exc.reason, call=call, code=exc.code) from exc
        except Exception as exc:  # a plug-in's bug is reported as a rejection, never propagated
            raise InvalidDecision(_name(owner), exc, f"raised {type(exc).__name__}: {exc}", call=call,
                                  code="raised") from exc

    def _reject(self, exc: InvalidDecision) -> None:
        self.rejections.count(exc)

    def _moves(self, owner: Any, call: str, answer: Any) -> list[Move]:
        """The answer must be an iterable of Move; each other element is refused alone."""
        if isinstance(answer, Move) or answer is None or isinstance(answer, str | bytes | Mapping) \
                or not isinstance(answer, Iterable):
            raise InvalidDecision(_name(owner), answer, "expected a sequence of Move", call=call,
                                  code="wrong-type")
        out = []
        for m in answer:
            if isinstance(m, Move):
                out.append(m)
            else:
                self._reject(InvalidDecision(_name(owner), m, "expected a Move", call=call, code="wrong-type"))
        return out

    # ------------------------------------------------------------------ placement
    def place(self, info: ChunkInfo, view: ClusterView, *, need: float, node: str | None) -> str:
        """The tier for a new chunk. ``need`` is the bytes the chunk takes in a tier (the payload in
        the simulator, the padded extent in the runtime); ``node`` the consumer's node (where the
        safe default lives)."""
        name = self.placement
        try:
            decision = self._ask(name, "place", self.placement.place, info, view)
            if not isinstance(decision, Placement):
                raise InvalidDecision(_name(name), decision, "expected a Placement", call="place", code="wrong-type")
            tier = decision.tier
            state = view.tiers.get(tier) if isinstance(tier, str) else None
            if state is None:
                raise InvalidDecision(_name(name), tier, f"unknown tier (tiers: {_few(view.tiers)})", call="place",
                                      code="unknown-tier")
            if not state.fits(need):
                raise InvalidDecision(_name(name), tier, f"over capacity ({need:.6g} bytes do not fit in "
                                      f"{state.free:.6g} free)", call="place", code="over-capacity")
            if state.kind is TierKind.HBM and state.node != node:
                raise InvalidDecision(_name(name), tier, "HBM of another node than the consumer's", call="place",
                                      code="remote-hbm")
            return tier
        except InvalidDecision as exc:
            self._reject(exc)
        return self.safe_tier(view, node, need)

    @staticmethod
    def safe_tier(view: ClusterView, node: str | None, need: float) -> str:
        """The safe default: pinned, then pageable host memory on ``node``, the first with room;
        when neither has room, the pageable tier (the chunk waits there for room)."""
        candidates = [t for kind in SAFE_DEFAULT for t in view.tiers_on(node, kind)]
        if not candidates:
            raise InvalidDecision("plane", node, "no host memory tier on the consumer's node", call="place",
                                  code="no-safe-default")
        for t in candidates:
            if t.fits(need):
                return t.id
        pageable = [t for t in candidates if t.kind is TierKind.PAGEABLE]
        return (pageable or candidates)[0].id

    # ------------------------------------------------------------------ spill
    def spill(self, tier: str, need: float, view: ClusterView, *, size_in: Callable[[Hashable], float | None],
              movable: Callable[[Hashable], bool] = lambda cid: True) -> list[Move]:
        """The valid moves of the policy's answer to "free ``need`` bytes of ``tier``".
        ``size_in(chunk_id)`` is the bytes the chunk holds in ``tier`` (None: not a resident);
        ``movable`` says whether nothing is reading or writing it now."""
        owner = self.placement
        try:
            moves = self._moves(owner, "spill", self._ask(owner, "spill", self.placement.spill, tier, need, view))
        except InvalidDecision as exc:
            self._reject(exc)
            return []
        accepted: list[Move] = []
        taken: dict[str, float] = {}
        seen: set[Hashable] = set()
        for m in moves:
            why = None
            size = size_in(m.chunk_id) if _hashable(m.chunk_id) else None
            dst = view.tiers.get(m.dst_tier) if isinstance(m.dst_tier, str) else None
            if size is None:
                why = ("not-resident", f"chunk is not a resident of {tier!r}")
            elif m.chunk_id in seen:
                why = ("duplicate-move", "the same chunk is moved twice")
            elif not movable(m.chunk_id):
                why = ("busy", "the chunk is being read or written now")
            elif dst is None:
                why = ("unknown-tier", f"unknown destination (tiers: {_few(view.tiers)})")
            elif dst.id == tier:
                why = ("same-tier", "the destination is the tier being spilled")
            elif dst.used + taken.get(dst.id, 0.0) + size > dst.capacity:
                why = ("over-capacity", f"{dst.id} has no room for {size:.6g} bytes")
            if why is not None:
                self._reject(InvalidDecision(_name(owner), m, why[1], call="spill", code=why[0]))
                continue
            seen.add(m.chunk_id)
            taken[dst.id] = taken.get(dst.id, 0.0) + size
            accepted.append(m)
        return accepted

    # ------------------------------------------------------------------ scheduling
    def plan(self, pending: Mapping[str, Sequence[tuple[Hashable, float]]], view: ClusterView, *,
             asking: Collection[str] = ()) -> list[tuple[str, Hashable]]:
        """``(learner, chunk_id)`` moves to start now, in order: the policy's valid moves, then the
        free-running chunks of CPU learners, then the forced moves of waiting learners."""
        if not pending:
            return []
        owner = self.scheduling
        owners = {cid: lid for lid, items in pending.items() for cid, _ in items}
        approved: list[tuple[str, Hashable]] = []
        started: set[Hashable] = set()
        try:
            moves = self._moves(owner, "plan", self._ask(owner, "plan", self.scheduling.plan, pending, view))
        except InvalidDecision as exc:
            self._reject(exc)
            moves = []
        for m in moves:
            lid = owners.get(m.chunk_id) if _hashable(m.chunk_id) else None
            if lid is None:
                self._reject(InvalidDecision(_name(owner), m, "not a pending chunk", call="plan", code="unknown-chunk"))
                continue
            if m.chunk_id in started:
                continue  # planned twice in one answer: one move
            target = view.learner_tier(lid)
            if m.dst_tier != target:
                self._reject(InvalidDecision(_name(owner), m, f"moves must target the learner's tier {target!r}; "
                                             "it is moved there", call="plan", code="wrong-destination"))
            if not self.path.overlap_collection and lid not in asking:
                continue  # no overlap with collection: a learner's data moves once it asks (deferred, not refused)
            started.add(m.chunk_id)
            approved.append((lid, m.chunk_id))
        for lid, items in pending.items():
            forced = lid in asking
            free = not forced and self.path.overlap_collection and view.hbm_of(view.learners[lid].device) is None
            if not (forced or free):
                continue
            for cid, _ in items:
                if cid not in started:
                    started.add(cid)
                    approved.append((lid, cid))
                    if forced:
                        self.rejections.forced_moves += 1
        return approved


def _name(component: Any) -> str:
    return str(getattr(component, "name", type(component).__name__))


def _few(tiers: Mapping[str, Any]) -> str:
    ids = sorted(tiers)
    return ", ".join(ids[:8]) + (f", ... ({len(ids)} in all)" if len(ids) > 8 else "")


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
