"""Errors that Conduit raises for user mistakes.

Every error a user can cause (a bad topology file, an unknown policy name, an
invalid decision) derives from :class:`ConduitError`. The CLI catches exactly this
class, prints its one-line message and exits non-zero; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import reprlib


class _BoundedRepr(reprlib.Repr):
    """:mod:`reprlib` with the limits below, applied to subclasses of the builtin containers too
    (plain ``reprlib`` falls back to the full ``repr`` for, say, a ``dict`` subclass)."""

    _BASES = (dict, list, tuple, set, frozenset, str, int)

    def repr1(self, x, level):
        for base in self._BASES:
            if isinstance(x, base) and type(x) is not base and not isinstance(x, bool):
                return getattr(self, f"repr_{base.__name__}")(x, level)
        if isinstance(x, bytes | bytearray) and len(x) > self.maxother:
            return repr(bytes(x[: self.maxother])) + "..."
        return super().repr1(x, level)

    def repr_int(self, x, level):
        if x.bit_length() > 200:  # repr() of a huge int is slow, or refused past 4,300 digits
            return f"<int of {int(x.bit_length() * 0.30103) + 1} digits>"
        return super().repr_int(x, level)


_BOUNDED = _BoundedRepr()
_BOUNDED.maxstring = _BOUNDED.maxother = 120
_BOUNDED.maxlong = 60
_BOUNDED.maxlist = _BOUNDED.maxtuple = _BOUNDED.maxdict = _BOUNDED.maxset = _BOUNDED.maxfrozenset = 5
_BOUNDED.maxlevel = 3
#: the most characters :func:`shown` returns
SHOWN_MAX = 200


def shown(value: object) -> str:
    """``repr(value)`` bounded to a few hundred characters, for error messages.

    A value read from a user's file can be huge (a YAML alias bomb expands to billions of items when
    printed; a huge integer has thousands of digits), so a message never prints it whole: long
    strings and numbers are cut, containers show their first items and a few levels."""
    try:
        text = _BOUNDED.repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        return f"<{type(value).__name__}>"
    return text if len(text) <= SHOWN_MAX else text[: SHOWN_MAX - 3] + "..."


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


class FlushTimeout(ConduitError, TimeoutError):
    """An EnvRunner's sent chunks were not all acknowledged by the plane within the flush's deadline
    (the plane is stuck or unreachable). Nothing was dropped: the sender still holds every
    unacknowledged chunk and keeps sending it."""


class PlaneCallTimeout(ConduitError, TimeoutError):
    """A plane actor did not answer a call within the caller's timeout (it is stuck, or its node is
    unreachable). The call may still run on the actor later; only calls whose late effect is harmless
    (control calls: a policy version, a batch size, priorities, a snapshot) end this way without the
    actor's own deadline: ingest and delivery give the actor the caller's deadline first."""


class DuplicateChunkError(ConduitError):
    """A chunk id the plane already has (or had recently): nothing was ingested.

    A producer that resends a chunk after its plane restarted gets this when the first send had
    been committed before the death: the chunk is accounted for (taken over, or counted lost)."""


class PlaneRestarted(ConduitError):
    """The plane restarted since the caller's last call, and the call depended on state the dead
    incarnation held (the rows of a batch it had streamed): start the batch again from row 0."""
