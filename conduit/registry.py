"""Finding policies by name: the built-ins and third-party plug-ins.

:func:`policy_registry` is the process-wide :class:`PolicyRegistry` with the built-ins
(:func:`conduit.policies.register_builtins`) registered and entry-point plug-ins (group
``conduit.policies``) loaded on first use; :func:`create_policy` builds a complete policy from a name.
The machinery — :class:`PolicyEntry`, :class:`PolicyRegistry`, plug-in discovery — lives in
:mod:`conduit.registration`, which imports no policy; it is re-exported here, the import path
plug-ins and tools use.
"""

from __future__ import annotations

from typing import Any

from conduit.errors import ConduitError
from conduit.policies import register_builtins
from conduit.registration import ENTRY_POINT_GROUP, ROLES, PolicyEntry, PolicyRegistry

__all__ = ["ENTRY_POINT_GROUP", "ROLES", "PolicyEntry", "PolicyRegistry", "create_policy", "policy_registry"]

_REGISTRY: PolicyRegistry | None = None


def policy_registry() -> PolicyRegistry:
    """The process-wide registry, with built-ins registered and plug-ins loaded on first use."""
    global _REGISTRY
    if _REGISTRY is None:
        registry = PolicyRegistry()
        register_builtins(registry)
        _REGISTRY = registry
    return _REGISTRY


def create_policy(spec: Any, **params: Any):
    """A :class:`~conduit.policy.Policy` from a name (registry) or an object passed through. A policy
    built by name records the parameter names given (:attr:`~conduit.policy.Policy.given`)."""
    from conduit.policy import Policy

    if isinstance(spec, Policy):
        return spec
    if isinstance(spec, str):
        obj = policy_registry().create(spec, **params)
        if not isinstance(obj, Policy):
            raise ConduitError(
                f"{spec!r} is a {policy_registry().entry(spec).role} policy; a complete policy is needed here"
            )
        obj.given = frozenset(params)  # what the user gave: only these change the deployment
        return obj
    raise ConduitError(f"policy must be a name or a Policy object, got {type(spec).__name__}")
