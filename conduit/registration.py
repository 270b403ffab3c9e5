"""The policy registry's machinery: entries, the registry, plug-in discovery. It knows no policy.

A registry entry is a name, a role (``policy`` for a full :class:`~conduit.policy.Policy` bundle,
``placement`` or ``scheduling`` for a single component), and a factory that builds a fresh object from
keyword parameters. The built-ins are registered into the process-wide registry by
:func:`conduit.policies.register_builtins`, which :func:`conduit.registry.policy_registry` calls:
this module imports no policy and :mod:`conduit.policies` imports this module, never
:mod:`conduit.registry`, so the dependencies run one way.

Third-party packages register through the entry-point group ``conduit.policies``::

    [project.entry-points."conduit.policies"]
    my-policy = "my_package.policy:make_policy"

The entry point may name a :class:`PolicyEntry`, or a factory (class or function) whose return value
tells its role. A plug-in that fails to import is listed with its error instead of breaking the CLI.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from conduit.errors import ConduitError, UnknownNameError

log = logging.getLogger(__name__)  # conduit.registration

ENTRY_POINT_GROUP = "conduit.policies"
ROLES = ("policy", "placement", "scheduling")


@dataclass(frozen=True)
class PolicyEntry:
    """A registered policy factory."""

    name: str
    role: str
    factory: Callable[..., Any]
    summary: str = ""
    origin: str = "built-in"

    def keywords(self) -> dict[str, Any] | None:
        """The factory's keyword parameters (:func:`factory_keywords`)."""
        return factory_keywords(self.factory)


def factory_keywords(factory: Callable[..., Any]) -> dict[str, Any] | None:
    """The keyword parameters ``factory`` takes, in order, each with its default
    (:data:`inspect.Parameter.empty` when it has none); ``None`` when it takes any keyword
    (``**kwargs``) or its signature cannot be read."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    out: dict[str, Any] = {}
    for p in signature.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            out[p.name] = p.default
    return out


class PolicyRegistry:
    """Name -> factory, across built-ins and entry-point plug-ins."""

    def __init__(self) -> None:
        self._entries: dict[str, PolicyEntry] = {}
        self._broken: dict[str, str] = {}
        self._plugins_loaded = False

    def register(self, entry: PolicyEntry) -> PolicyEntry:
        if entry.role not in ROLES:
            raise ConduitError(f"policy {entry.name!r}: role must be one of {ROLES}, got {entry.role!r}")
        existing = self._entries.get(entry.name)
        if existing is not None and existing.factory is not entry.factory:
            raise ConduitError(
                f"policy name {entry.name!r} is taken by {existing.origin}; "
                f"{entry.origin} must choose another"
            )
        self._entries[entry.name] = entry
        return entry

    def load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            origin = f"plugin:{ep.dist.name if ep.dist else ep.value}"
            try:
                target = ep.load()
                entry = target if isinstance(target, PolicyEntry) else _entry_from_factory(ep.name, target, origin)
                if entry.origin == "built-in":
                    entry = PolicyEntry(entry.name, entry.role, entry.factory, entry.summary, origin)
                self.register(entry)
            except Exception as exc:  # noqa: BLE001 - a broken plug-in must not break the tool
                self._broken[ep.name] = f"{origin}: {type(exc).__name__}: {exc}"
                log.warning("policy plug-in %r failed to load (%s); other policies are unaffected",
                            ep.name, self._broken[ep.name])

    def names(self, role: str | None = None) -> list[str]:
        self.load_plugins()
        return sorted(n for n, e in self._entries.items() if role is None or e.role == role)

    def entry(self, name: str) -> PolicyEntry:
        self.load_plugins()
        if name in self._entries:
            return self._entries[name]
        if name in self._broken:
            raise ConduitError(f"policy {name!r} failed to load: {self._broken[name]}")
        raise UnknownNameError("policy", name, list(self._entries))

    def create(self, name: str, **params: Any) -> Any:
        """A fresh policy object built with ``params`` (unknown parameters are an error)."""
        entry = self.entry(name)
        try:
            return entry.factory(**params)
        except TypeError as exc:
            raise ConduitError(f"policy {name!r}: bad parameters {sorted(params)}: {exc}") from None

    def describe(self) -> list[dict[str, str]]:
        self.load_plugins()
        rows = [
            {"name": e.name, "role": e.role, "origin": e.origin, "summary": e.summary}
            for e in sorted(self._entries.values(), key=lambda e: (e.origin != "built-in", e.name))
        ]
        rows += [
            {"name": n, "role": "?", "origin": "broken", "summary": why} for n, why in sorted(self._broken.items())
        ]
        return rows


def _entry_from_factory(name: str, factory: Callable[..., Any], origin: str) -> PolicyEntry:
    from conduit.policy import PlacementPolicy, Policy, SchedulingPolicy

    sample = factory()
    if isinstance(sample, Policy):
        role = "policy"
    elif isinstance(sample, PlacementPolicy):
        role = "placement"
    elif isinstance(sample, SchedulingPolicy):
        role = "scheduling"
    else:
        raise ConduitError(f"factory returned {type(sample).__name__}, not a Policy, PlacementPolicy or SchedulingPolicy")
    summary = getattr(sample, "summary", "") or (factory.__doc__ or "").strip().splitlines()[0:1]
    if isinstance(summary, list):
        summary = summary[0] if summary else ""
    return PolicyEntry(name, role, factory, summary, origin)
