"""Errors that Conduit raises for user mistakes.

Every error a user can cause (a bad topology file, an unknown policy name, an
invalid decision) derives from :class:`ConduitError`. The CLI catches exactly this
class, prints its one-line message and exits non-zero; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations


class ConduitError(Exception):
    """A user-facing error with a message that names what is wrong."""


class UnitError(ConduitError, ValueError):
    """A quantity that cannot be parsed, or has the wrong kind of unit."""


class TopologyError(ConduitError):
    """A topology that cannot be loaded.

    ``source`` names the file (or ``<graph>``), ``field`` the offending field as a
    path such as ``links[3].bandwidth``; both appear in the message.
    """

    def __init__(self, source: str, field: str | None, message: str):
        self.source = source
        self.field = field
        self.detail = message
        where = f"{source}: {field}: " if field else f"{source}: "
        super().__init__(where + message)


class UnknownNameError(ConduitError, KeyError):
    """A name (policy, workload, topology, tier) that is not registered."""

    def __init__(self, kind: str, name: str, known: list[str] | tuple[str, ...] = ()):
        self.kind = kind
        self.name = name
        self.known = sorted(known)
        hint = f"; known: {', '.join(self.known)}" if self.known else ""
        super().__init__(f"unknown {kind} {name!r}{hint}")

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.args[0]


class SchemaError(ConduitError, ValueError):
    """A chunk whose columns do not match the plane's schema; names the column and what differs."""


class CapacityError(ConduitError):
    """Data that cannot fit: a chunk larger than any tier, or a tier asked for more than it has."""


class PlaneFullError(ConduitError, TimeoutError):
    """Backpressure: the plane had no room for a chunk within the caller's timeout.

    Nothing was ingested; the caller still owns the chunk and may retry."""
