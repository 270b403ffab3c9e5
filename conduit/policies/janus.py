"""Janus baselines: the fixed configurations a careful engineer would hand-tune today.

Janus is not a new mechanism; it is the honest upper bound of *tuning the knobs an RL framework
already exposes*, applied without any knowledge of the workload at run time. Four knobs, 60 fixed
configurations (3 x 2 x 2 x 5):

=================  ==========================================================================
knob               values and what they map to in Conduit's primitives
=================  ==========================================================================
placement          ``pageable`` — :class:`TierPreference` ``(PAGEABLE, NVME)``, pageable copies;
                   ``pinned`` — ``(PINNED, PAGEABLE, NVME)``, pinned copies;
                   ``gpu`` — ``(HBM, PINNED, PAGEABLE, NVME)``, pinned copies
                   (``PathSettings.pinned`` is ``placement != "pageable"``)
collection         ``co``: experience moves while sampling still runs
overlap            (``PathSettings.overlap_collection``); ``nco``: after sampling ends
selection          ``so``: the next batch is selected and prefetched while the current update runs
overlap            (``overlap_update=True``, ``prefetch_depth=2``, :class:`EarliestDeadlineFirst`
                   scheduling); ``nso``: selected when the learner asks (``overlap_update=False``,
                   ``prefetch_depth=0``, :class:`OnDemand` scheduling)
granularity        ``g`` in 1, 2, 4, 8, 16 chunks coalesced into one transfer
=================  ==========================================================================

Two further knobs are the first an RLlib user tunes, and each configuration can take them (keyword
arguments of :func:`janus`; a name gains a suffix only when they are not the default):

* ``fragment_steps`` (``-f{n}``) — the rollout fragment length: runners hand experience over every
  ``n`` vector steps (``PathSettings.fragment_steps``) instead of once per workload fragment;
* ``per_fragment_advantages`` (``-pfa``) — the learner connector, including PPO's advantages (the GAE
  value pass), runs per fragment as it arrives (``batch_build="per-chunk"``), as RLlib computes
  advantages over each episode chunk (``GeneralAdvantageEstimation`` is per episode), rather than
  over the whole batch once it has arrived.

``janus-best`` searches the 60 configurations, then these two knobs on the winner
(:func:`conduit.sim.search.janus_best`).

Every configuration takes the ``direct`` route (no driver hop) and builds batches **per batch**
(``batch_build="per-batch"``): Janus keeps the learner connector (batch building, to-tensor, PPO's
value pass) where the framework it wraps runs it — over the whole batch, once it has arrived.
Moving that work per chunk, as chunks arrive, is what Conduit's own policy adds on top of the best
Janus configuration; comparing ``conduit`` against ``janus-best`` isolates that gain.

Names are ``janus-{placement}-{co|nco}-{so|nso}-g{g}``, e.g. ``janus-gpu-co-so-g4``. All 60 are
registered by name, plus the parametric ``janus`` (keyword parameters, a declared ``Param`` space for
``conduit tune``) and ``janus-best`` — the best configuration per workload and topology, which only a
backend can resolve (it is searched exhaustively on the simulator: :func:`conduit.sim.search.janus_best`).
Nothing here imports :mod:`conduit.sim` or :mod:`conduit.runtime`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from conduit.errors import ConduitError
from conduit.policies.components import EarliestDeadlineFirst, OnDemand, TierPreference
from conduit.policy import Param, PathSettings, Policy
from conduit.topology.model import TierKind

PLACEMENTS: dict[str, tuple[TierKind, ...]] = {
    "pageable": (TierKind.PAGEABLE, TierKind.NVME),
    "pinned": (TierKind.PINNED, TierKind.PAGEABLE, TierKind.NVME),
    "gpu": (TierKind.HBM, TierKind.PINNED, TierKind.PAGEABLE, TierKind.NVME),
}
GRANULARITIES: tuple[int, ...] = (1, 2, 4, 8, 16)
#: fragment lengths (vector steps) ``janus-best`` tries on its winner; 0 is the workload's own
FRAGMENT_STEPS: tuple[int, ...] = (0, 128, 64, 32, 16)
#: batches per learner allowed in flight when selection overlaps the update
PREFETCH_DEPTH = 2
JANUS_BEST = "janus-best"
NAME_PATTERN = re.compile(r"^janus-(pageable|pinned|gpu)-(co|nco)-(so|nso)-g(\d+)(?:-f(\d+))?(-pfa)?$")

SPACE: tuple[Param, ...] = (
    Param("placement", choices=tuple(PLACEMENTS)),
    Param("overlap_collection", choices=(True, False)),
    Param("overlap_selection", choices=(True, False)),
    Param("granularity", choices=GRANULARITIES),
    Param("fragment_steps", choices=FRAGMENT_STEPS),
    Param("per_fragment_advantages", choices=(False, True)),
)


def janus_name(placement: str, overlap_collection: bool, overlap_selection: bool, granularity: int,
               fragment_steps: int | None = None, per_fragment_advantages: bool = False) -> str:
    """``janus-{placement}-{co|nco}-{so|nso}-g{g}[-f{n}][-pfa]``."""
    return (f"janus-{placement}-{'co' if overlap_collection else 'nco'}-"
            f"{'so' if overlap_selection else 'nso'}-g{granularity}"
            f"{f'-f{fragment_steps}' if fragment_steps else ''}{'-pfa' if per_fragment_advantages else ''}")


def parse_janus_name(name: str) -> dict[str, Any]:
    """The ``janus()`` keyword arguments a configuration name stands for (inverse of :func:`janus_name`)."""
    match = NAME_PATTERN.match(name)
    if match is None or int(match.group(4)) not in GRANULARITIES:
        raise ConduitError(f"{name!r} is not a Janus configuration name "
                           f"(janus-<pageable|pinned|gpu>-<co|nco>-<so|nso>-g<{'|'.join(map(str, GRANULARITIES))}>)")
    placement, co, so, g, f, pfa = match.groups()
    out: dict[str, Any] = {"placement": placement, "overlap_collection": co == "co",
                           "overlap_selection": so == "so", "granularity": int(g)}
    if f is not None:
        if int(f) < 1:
            raise ConduitError(f"{name!r}: the fragment length after '-f' must be >= 1")
        out["fragment_steps"] = int(f)
    if pfa:
        out["per_fragment_advantages"] = True
    return out


def _check(placement: Any, overlap_collection: Any, overlap_selection: Any, granularity: Any,
           fragment_steps: Any = None, per_fragment_advantages: Any = False) -> None:
    if placement not in PLACEMENTS:
        raise ConduitError(f"janus: placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    for name, value in (("overlap_collection", overlap_collection), ("overlap_selection", overlap_selection)):
        if not isinstance(value, bool):
            raise ConduitError(f"janus: {name} must be true or false, got {value!r}")
    if isinstance(granularity, bool) or granularity not in GRANULARITIES:
        raise ConduitError(f"janus: granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if fragment_steps is not None and (isinstance(fragment_steps, bool) or not isinstance(fragment_steps, int)
                                       or fragment_steps < 0):
        raise ConduitError(f"janus: fragment_steps must be an integer >= 1, or 0 or null for the workload's "
                           f"own fragment, got {fragment_steps!r}")
    if not isinstance(per_fragment_advantages, bool):
        raise ConduitError(f"janus: per_fragment_advantages must be true or false, got {per_fragment_advantages!r}")


def janus(placement: str = "gpu", overlap_collection: bool = True, overlap_selection: bool = True,
          granularity: int = 1, fragment_steps: int | None = None, per_fragment_advantages: bool = False) -> Policy:
    """A Janus fixed configuration: tier placement, collection/selection overlap, granularity,
    fragment length and per-fragment advantages."""
    _check(placement, overlap_collection, overlap_selection, granularity, fragment_steps, per_fragment_advantages)
    granularity = int(granularity)
    fragment_steps = fragment_steps or None
    name = janus_name(placement, overlap_collection, overlap_selection, granularity, fragment_steps,
                      per_fragment_advantages)
    depth = PREFETCH_DEPTH if overlap_selection else 0
    scheduling = EarliestDeadlineFirst(depth=depth) if overlap_selection else OnDemand()
    return Policy(
        name=name,
        placement=TierPreference(PLACEMENTS[placement], name=f"janus-{placement}"),
        scheduling=scheduling,
        path=PathSettings(route="direct", batch_build="per-chunk" if per_fragment_advantages else "per-batch",
                          pinned=placement != "pageable", granularity=granularity,
                          overlap_collection=overlap_collection, overlap_update=overlap_selection,
                          prefetch_depth=depth, fragment_steps=fragment_steps),
        params={"placement": placement, "overlap_collection": overlap_collection,
                "overlap_selection": overlap_selection, "granularity": granularity,
                **({"fragment_steps": fragment_steps} if fragment_steps else {}),
                **({"per_fragment_advantages": True} if per_fragment_advantages else {})},
        space=SPACE,
        summary=_summary(placement, overlap_collection, overlap_selection, granularity, fragment_steps,
                         per_fragment_advantages),
    )


def _summary(placement: str, co: bool, so: bool, g: int, fragment_steps: int | None = None,
             pfa: bool = False) -> str:
    extra = (f", fragments of {fragment_steps} vector steps" if fragment_steps else "") + (
        ", advantages per fragment" if pfa else "")
    return (f"Janus fixed configuration: {placement} placement, collection "
            f"{'overlapped with' if co else 'after'} rollout, selection "
            f"{'overlapped with' if so else 'after'} the update, {g} chunk{'s' if g > 1 else ''} per transfer"
            f"{extra}")


def janus_configurations() -> Iterator[tuple[str, dict[str, Any]]]:
    """All 60 configurations as ``(name, janus() keyword arguments)``, in a fixed order."""
    for placement in PLACEMENTS:
        for co in (False, True):
            for so in (False, True):
                for g in GRANULARITIES:
                    kwargs = {"placement": placement, "overlap_collection": co, "overlap_selection": so,
                              "granularity": g}
                    yield janus_name(**kwargs), kwargs


def configuration_factory(name: str) -> Callable[[], Policy]:
    """A no-argument factory for one named configuration (what the registry stores)."""
    kwargs = parse_janus_name(name)

    def factory() -> Policy:
        return janus(**kwargs)

    factory.__name__ = name.replace("-", "_")
    factory.__doc__ = _summary(kwargs["placement"], kwargs["overlap_collection"], kwargs["overlap_selection"],
                               kwargs["granularity"], kwargs.get("fragment_steps"),
                               kwargs.get("per_fragment_advantages", False))
    return factory


def janus_best_unresolved() -> Policy:
    """The ``janus-best`` registry factory, which refuses: ``janus-best`` depends on the workload and topology, so a backend resolves it."""
    raise ConduitError(
        "policy 'janus-best' has no fixed configuration: it is resolved by a backend search over the "
        "60 janus-* configurations for one workload on one topology — run it through the simulator "
        "(`conduit sim --policy janus-best`, `simulate(..., 'janus-best')`) or call "
        "conduit.sim.search.janus_best(topology, workload, ...) for the winning Policy"
    )
