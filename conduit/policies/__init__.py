"""Built-in policies. Nothing here imports :mod:`conduit.sim` or :mod:`conduit.runtime`.

Registered names (``conduit policies list``):

* ``conduit`` — Conduit as ``enable()`` deploys it (the simulator models the deployed runtime:
  :mod:`conduit.sim.deployed`); ``conduit-target`` — the same policy as a design target (no
  driver, free plane calls, HBM batches), a separately named variant, never the headline.
* ``rllib-stock`` — the baseline: stock RLlib 2.60's path (through the driver, batch building after
  sampling, pageable copies, no prefetch), executed step by step by each backend.
* ``host-only`` — experience stays in pageable host memory on the consumer's node and is copied to the
  device when the learner asks (no prefetch): what a framework with no data plane does.
* ``all-gpu`` — every chunk goes straight to its consumer's HBM (pinned staging), spilling to pinned
  host memory when HBM is full; moves start as soon as a learner has pending data.
* ``janus-{pageable|pinned|gpu}-{co|nco}-{so|nso}-g{1|2|4|8|16}`` — the 60 Janus baselines
  (:mod:`conduit.policies.janus`): fixed hand-tuned configurations of placement, collection overlap,
  selection overlap and granularity, batches built per batch; ``janus`` builds one from keyword
  parameters (a declared ``Param`` space for ``conduit tune``), including fragment length and
  per-fragment advantages (names ``...-f{n}``, ``...-pfa``).
* ``janus-best`` — the best ``janus-*`` configuration for one workload on one topology, found by
  exhaustive search on the simulator (:func:`conduit.sim.search.janus_best`); a backend resolves it,
  so creating it by name alone is an error.
"""

from __future__ import annotations

from conduit.policies.components import EarliestDeadlineFirst, OnDemand, TierPreference
from conduit.policy import PathSettings, Policy
from conduit.registration import PolicyEntry, PolicyRegistry
from conduit.topology.model import TierKind


def host_only() -> Policy:
    """Pageable host memory on the consumer node; copy on demand, no overlap."""
    return Policy(
        name="host-only",
        placement=TierPreference((TierKind.PAGEABLE, TierKind.NVME), name="host-only"),
        scheduling=OnDemand(),
        path=PathSettings(route="direct", batch_build="per-batch", pinned=False,
                          overlap_collection=False, overlap_update=False, prefetch_depth=0),
        summary="pageable host memory, copied to the device on demand",
    )


def all_gpu(depth: int = 2) -> Policy:
    """Straight to the consumer's HBM, spilling to pinned host; earliest-deadline-first moves."""
    return Policy(
        name="all-gpu",
        placement=TierPreference((TierKind.HBM, TierKind.PINNED, TierKind.PAGEABLE, TierKind.NVME), name="all-gpu"),
        scheduling=EarliestDeadlineFirst(depth=depth),
        path=PathSettings(route="direct", batch_build="per-chunk", pinned=True, prefetch_depth=depth),
        params={"depth": depth},
        summary="every chunk to its consumer's HBM, spill to pinned host",
    )


def rllib_stock() -> Policy:
    """Stock Ray RLlib 2.60: through the driver, per-batch connector after sampling, pageable copies."""
    return Policy(
        name="rllib-stock",
        placement=TierPreference((TierKind.PAGEABLE,), name="rllib-stock"),
        scheduling=OnDemand(),
        path=PathSettings(route="driver", batch_build="per-batch", pinned=False,
                          overlap_collection=False, overlap_update=False, prefetch_depth=0),
        summary="stock RLlib 2.60 experience path (the baseline every gain is measured against)",
    )


def register_builtins(registry: PolicyRegistry) -> None:
    from conduit.policies.conduit_policy import conduit, conduit_target

    registry.register(PolicyEntry("conduit", "policy", conduit, conduit.__doc__.strip()))
    registry.register(PolicyEntry("conduit-target", "policy", conduit_target, conduit_target.__doc__.strip()))
    registry.register(PolicyEntry("rllib-stock", "policy", rllib_stock, rllib_stock.__doc__.strip()))
    registry.register(PolicyEntry("host-only", "policy", host_only, host_only.__doc__.strip()))
    registry.register(PolicyEntry("all-gpu", "policy", all_gpu, all_gpu.__doc__.strip()))
    registry.register(PolicyEntry(
        "tier-preference", "placement",
        lambda order=("hbm", "pinned", "pageable", "nvme"): TierPreference(tuple(TierKind(k) for k in order)),
        "placement by a preference order of tier kinds, consumer node first"))
    registry.register(PolicyEntry("on-demand", "scheduling", OnDemand, "no prefetch: move when the learner asks"))
    registry.register(PolicyEntry("edf-prefetch", "scheduling", EarliestDeadlineFirst,
                                  "earliest-deadline-first prefetch, bounded depth per learner"))
    # Janus baselines: the parametric ``janus``, its 60 named configurations, and ``janus-best``
    from conduit.policies import janus as janus_module

    registry.register(PolicyEntry("janus", "policy", janus_module.janus, janus_module.janus.__doc__.strip()))
    for name, _ in janus_module.janus_configurations():
        factory = janus_module.configuration_factory(name)
        registry.register(PolicyEntry(name, "policy", factory, factory.__doc__))
    registry.register(PolicyEntry(
        janus_module.JANUS_BEST, "policy", janus_module.janus_best_unresolved,
        "best janus-* configuration by exhaustive search per workload and topology (resolved by the simulator)"))
