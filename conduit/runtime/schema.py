"""Columnar chunk layout: which columns a chunk has, their dtypes and per-step shapes.

The runtime never stores a chunk as a dict of separately allocated arrays. A :class:`Schema` fixes
the columns (``obs``, ``actions``, ``rewards``, ...) with a dtype and a per-step shape each, and a
chunk of ``steps`` samples is laid out as one contiguous extent: column after column, each column a
C-contiguous ``(steps, *shape)`` block starting on a 64-byte boundary (a cache line, and the
alignment CUDA copies like). :meth:`Schema.layout` computes those offsets; stores allocate extents
of :meth:`Schema.extent_bytes` and build zero-copy column views over them.

A payload handed to the plane is checked against the schema (:meth:`Schema.validate`) before any
byte is copied, so a bad chunk is refused whole with an error that names the column and what
differs; nothing of it lands anywhere.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conduit.errors import SchemaError

ALIGN = 64
"""Every column of an extent starts on a multiple of this many bytes."""


def align_up(n: int, alignment: int = ALIGN) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class Column:
    """One column: ``dtype`` and the shape of one step (``()`` for a scalar per step)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...] = ()
    step_bytes: int = field(init=False, compare=False, repr=False)
    """Bytes of one step of this column (computed once: it sits on every ingestion's path)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SchemaError(f"schema: column name must be a non-empty string, got {self.name!r}")
        try:
            dtype = np.dtype(self.dtype)
        except TypeError as exc:
            raise SchemaError(f"schema: column {self.name!r}: dtype {self.dtype!r} is not a numpy dtype") from exc
        if dtype.hasobject or dtype.itemsize == 0:
            raise SchemaError(f"schema: column {self.name!r}: dtype {dtype} holds no fixed-size data")
        shape = tuple(int(s) for s in self.shape)
        if any(s < 0 for s in shape):
            raise SchemaError(f"schema: column {self.name!r}: shape {shape} has a negative dimension")
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "step_bytes", int(dtype.itemsize * int(np.prod(shape, dtype=np.int64))))


@dataclass(frozen=True)
class Schema:
    """The columns every chunk of a plane carries, in a fixed order."""

    columns: tuple[Column, ...]
    _layouts: dict = field(default_factory=dict, init=False, compare=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        if not self.columns:
            raise SchemaError("schema: at least one column is needed")
        names = [c.name for c in self.columns]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SchemaError(f"schema: duplicate column names {dup}")

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def of(cls, spec: Mapping[str, Any] | Iterable[Column] | Schema) -> Schema:
        """A schema from ``{name: (shape, dtype)}`` / ``{name: dtype}``, columns, or a schema."""
        if isinstance(spec, Schema):
            return spec
        if isinstance(spec, Mapping):
            cols = []
            for name, value in spec.items():
                if isinstance(value, Column):
                    cols.append(value)
                elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], tuple | list):
                    cols.append(Column(name, value[1], tuple(value[0])))
                else:
                    cols.append(Column(name, value))
            return cls(tuple(cols))
        return cls(tuple(spec))

    @classmethod
    def infer(cls, payload: Mapping[str, np.ndarray]) -> Schema:
        """The schema of one example payload (column order as given)."""
        if not payload:
            raise SchemaError("schema: cannot infer from an empty payload")
        return cls(tuple(Column(k, np.asarray(v).dtype, np.asarray(v).shape[1:]) for k, v in payload.items()))

    def to_dict(self) -> dict[str, Any]:
        return {c.name: {"dtype": c.dtype.str, "shape": list(c.shape)} for c in self.columns}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Schema:
        return cls(tuple(Column(k, np.dtype(v["dtype"]), tuple(v["shape"])) for k, v in d.items()))

    # -- layout ----------------------------------------------------------------------------
    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @functools.cached_property
    def step_bytes(self) -> int:
        """Payload bytes of one sample (no padding)."""
        return sum(c.step_bytes for c in self.columns)

    def payload_bytes(self, steps: int) -> int:
        """Bytes of a chunk's data (what the auditor and the view count)."""
        return steps * self.step_bytes

    def layout(self, steps: int) -> tuple[tuple[int, ...], int]:
        """Column offsets within an extent of ``steps`` samples, and the extent's total size."""
        cached = self._layouts.get(steps)
        if cached is not None:
            return cached
        offsets, pos = [], 0
        for c in self.columns:
            offsets.append(pos)
            pos = align_up(pos + steps * c.step_bytes)
        out = (tuple(offsets), max(pos, ALIGN))
        if len(self._layouts) < 4096:
            self._layouts[steps] = out
        return out

    def extent_bytes(self, steps: int) -> int:
        return self.layout(steps)[1]

    def views(self, buffer: np.ndarray, steps: int) -> dict[str, np.ndarray]:
        """Zero-copy column arrays over a uint8 ``buffer`` of at least :meth:`extent_bytes`."""
        offsets, _ = self.layout(steps)
        out = {}
        for c, off in zip(self.columns, offsets, strict=True):
            n = steps * c.step_bytes
            out[c.name] = buffer[off : off + n].view(c.dtype).reshape((steps, *c.shape))
        return out

    # -- validation -------------------------------------------------------------------------
    def validate(self, payload: Mapping[str, Any], where: str = "chunk") -> int:
        """Check a payload against the schema; return its number of steps.

        Every column must be present, no extra ones, each with the schema's dtype (exactly: a silent
        cast would change the bytes the auditor checks) and per-step shape, and all with the same
        number of steps (> 0).
        """
        if not isinstance(payload, Mapping):
            raise SchemaError(f"{where}: payload must be a mapping of column name to array, got {type(payload).__name__}")
        missing = [n for n in self.names if n not in payload]
        if missing:
            raise SchemaError(f"{where}: missing column(s) {missing}; the schema has {list(self.names)}")
        extra = [n for n in payload if n not in self.names]
        if extra:
            raise SchemaError(f"{where}: unknown column(s) {extra}; the schema has {list(self.names)}")
        steps = None
        for c in self.columns:
            arr = payload[c.name]
            dtype = getattr(arr, "dtype", None)
            shape = getattr(arr, "shape", None)
            if dtype is None or shape is None:
                raise SchemaError(f"{where}: column {c.name!r}: expected an array, got {type(arr).__name__}")
            if np.dtype(_numpy_dtype(dtype)) != c.dtype:
                raise SchemaError(f"{where}: column {c.name!r}: dtype {dtype}, the schema says {c.dtype}")
            if len(shape) == 0 or tuple(shape[1:]) != c.shape:
                raise SchemaError(
                    f"{where}: column {c.name!r}: shape {tuple(shape)}, the schema says (steps, *{c.shape})")
            if steps is None:
                steps = int(shape[0])
            elif int(shape[0]) != steps:
                raise SchemaError(f"{where}: column {c.name!r} has {shape[0]} steps, column "
                                  f"{self.columns[0].name!r} has {steps}")
        if not steps:
            raise SchemaError(f"{where}: a chunk needs at least one step")
        return steps


def _numpy_dtype(dtype: Any) -> Any:
    """numpy's dtype for a numpy or torch dtype."""
    if isinstance(dtype, np.dtype):
        return dtype
    try:
        import torch

        if isinstance(dtype, torch.dtype):
            return torch.empty((), dtype=dtype).numpy().dtype
    except ImportError:  # no torch (conduit-rl[runtime]): not a torch dtype
        pass
    return dtype
