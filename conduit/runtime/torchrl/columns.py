"""TensorDict <-> the plane's columnar schema.

The plane stores a chunk as named columns, each a C-contiguous ``(steps, *shape)`` block of one numpy
dtype (:class:`~conduit.runtime.schema.Schema`). A TensorDict is a tree of tensors sharing leading batch
dimensions. :class:`TensorDictLayout` maps one to the other:

* **Names.** Each tensor leaf is one column, named by its nested key joined with :data:`SEPARATOR`
  (``("next", "observation")`` <-> ``"next.observation"``), the same convention as TensorDict's own
  ``flatten_keys(".")``. A key whose parts contain the separator, or an empty part, cannot be mapped
  back unambiguously and is refused (:class:`~conduit.errors.SchemaError` naming the key).
* **Steps.** Every batch dimension of the TensorDict is flattened into the step dimension: a
  collector's ``[num_envs, frames]`` batch is ``num_envs * frames`` steps, in row-major order (what
  ``td.reshape(-1)`` gives, and what TorchRL's one-dimensional storages store). A TensorDict with no
  batch dimension (``ReplayBuffer.add`` of one transition) is one step. What is left of a tensor's
  shape after the batch dimensions is the column's per-step shape.
* **Types.** A column's dtype is numpy's equivalent of the tensor's (``torch.bool`` <-> ``bool``,
  ``torch.uint8`` <-> ``uint8``, ...). A dtype numpy lacks (``bfloat16``, complex halves, quantised
  types) and a leaf that is not a tensor (``NonTensorData``, strings) are refused, naming the key: the
  plane moves fixed-size bytes only, and a silent cast would change the bytes the audit checks.
* **No copy where the layout allows.** :meth:`TensorDictLayout.columns` returns numpy views sharing
  memory with the CPU tensors when they are contiguous (flattening the batch dimensions of a
  contiguous tensor is a view); only a non-contiguous or non-CPU tensor is copied, once, to a
  contiguous host array. :meth:`TensorDictLayout.tensordict` wraps columns as tensors with
  ``torch.from_numpy`` (shared memory, no copy) and nests them back.

A layout is plain data (:meth:`TensorDictLayout.to_dict`), so it travels to collector worker
processes with the buffer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from conduit.errors import SchemaError
from conduit.runtime.schema import Column, Schema

SEPARATOR = "."
"""Joins the parts of a nested key into a column name (TensorDict's ``flatten_keys`` default)."""

NestedKey = str | tuple[str, ...]

_TORCH_TO_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(np.bool_),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}
_NUMPY_TO_TORCH = {v: k for k, v in _TORCH_TO_NUMPY.items()}


def flatten_key(key: NestedKey) -> str:
    """The column name of a (nested) TensorDict key; refuses a key that would not map back."""
    parts = (key,) if isinstance(key, str) else tuple(key)
    if not parts or not all(isinstance(p, str) for p in parts):
        raise SchemaError(f"TensorDict key {key!r}: a key is a string or a tuple of strings")
    for p in parts:
        if not p or SEPARATOR in p:
            raise SchemaError(f"TensorDict key {key!r}: the part {p!r} is empty or contains {SEPARATOR!r}, "
                              f"which joins nested keys into column names; rename the key")
    return SEPARATOR.join(parts)


def unflatten_key(name: str) -> NestedKey:
    """The TensorDict key of a column name (a string for a top-level key, else a tuple)."""
    parts = tuple(name.split(SEPARATOR))
    return parts[0] if len(parts) == 1 else parts


def numpy_dtype(dtype: torch.dtype, key: NestedKey = "?") -> np.dtype:
    """numpy's dtype for a torch dtype, or a :class:`SchemaError` naming ``key``."""
    try:
        return _TORCH_TO_NUMPY[dtype]
    except KeyError:
        raise SchemaError(f"TensorDict key {key!r}: dtype {dtype} has no numpy equivalent; the plane stores "
                          f"{sorted(str(d) for d in _TORCH_TO_NUMPY)}") from None


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """torch's dtype for a numpy dtype (one a layout holds)."""
    return _NUMPY_TO_TORCH[np.dtype(dtype)]


def _leaves(td: TensorDictBase) -> Iterable[tuple[tuple[str, ...], Any]]:
    """Every leaf of ``td`` with its key as a tuple, in the TensorDict's key order (depth first)."""
    for key in td.keys():  # noqa: SIM118 - iterating a TensorDict walks its batch dimension, not its keys
        value = td.get(key)
        if isinstance(value, TensorDictBase) and not _is_non_tensor(value):
            for sub, leaf in _leaves(value):
                yield (key, *sub), leaf
        else:
            yield (key,), value


def _is_non_tensor(value: Any) -> bool:
    from tensordict import is_non_tensor

    return bool(is_non_tensor(value))


class TensorDictLayout:
    """Which columns a TensorDict maps to, and how (see the module doc).

    ``schema`` is the plane's schema (one column per tensor leaf, flattened names); ``keys`` the
    TensorDict key of each column, in schema order.
    """

    def __init__(self, schema: Schema | Mapping[str, Any]):
        self.schema = Schema.of(schema)
        self.keys: tuple[NestedKey, ...] = tuple(unflatten_key(c.name) for c in self.schema.columns)
        for key, col in zip(self.keys, self.schema.columns, strict=True):
            if flatten_key(key) != col.name:
                raise SchemaError(f"column {col.name!r} does not name a TensorDict key")
            if col.dtype not in _NUMPY_TO_TORCH:
                raise SchemaError(f"column {col.name!r}: dtype {col.dtype} has no torch equivalent")

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def infer(cls, td: TensorDictBase) -> TensorDictLayout:
        """The layout of an example TensorDict: one column per tensor leaf, per-step shape after the
        batch dimensions."""
        if not isinstance(td, TensorDictBase):
            raise SchemaError(f"expected a TensorDict, got {type(td).__name__}")
        bdims = td.batch_dims
        cols = []
        for key, value in _leaves(td):
            name = flatten_key(key)
            if not isinstance(value, torch.Tensor) or _is_non_tensor(value):
                raise SchemaError(f"TensorDict key {_show(key)!r}: a {type(value).__name__} is not a tensor; the "
                                  "plane stores tensors only (drop the key, e.g. td.exclude(key), before extend)")
            cols.append(Column(name, numpy_dtype(value.dtype, _show(key)), tuple(value.shape[bdims:])))
        if not cols:
            raise SchemaError("TensorDict has no tensor to store")
        return cls(Schema(tuple(cols)))

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the schema's dict), for pickling to worker processes."""
        return self.schema.to_dict()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorDictLayout:
        return cls(Schema.from_dict(d))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorDictLayout) and self.schema == other.schema

    def __hash__(self) -> int:
        return hash(self.schema)

    def __repr__(self) -> str:
        cols = ", ".join(f"{c.name}: {c.dtype}{list(c.shape)}" for c in self.schema.columns)
        return f"TensorDictLayout({cols})"

    # -- TensorDict -> columns ----------------------------------------------------------------
    def steps(self, td: TensorDictBase) -> int:
        """How many steps ``td`` holds (the product of its batch dimensions; 1 with none)."""
        return int(td.batch_size.numel()) if td.batch_dims else 1

    def columns(self, td: TensorDictBase) -> dict[str, np.ndarray]:
        """``td`` as the schema's columns, ``(steps, *shape)`` numpy arrays; views of the tensors'
        memory when they are contiguous CPU tensors (a copy otherwise). Refuses, naming the key, a
        missing or extra key and a dtype or per-step shape that differs from the schema."""
        if not isinstance(td, TensorDictBase):
            raise SchemaError(f"expected a TensorDict, got {type(td).__name__}")
        bdims = td.batch_dims
        steps = self.steps(td)
        out: dict[str, np.ndarray] = {}
        for key, col in zip(self.keys, self.schema.columns, strict=True):
            value = td.get(key, None)
            if value is None:
                raise SchemaError(f"TensorDict key {_show(key)!r} is missing; the layout has "
                                  f"{[_show(k) for k in self.keys]}")
            if not isinstance(value, torch.Tensor) or _is_non_tensor(value):
                raise SchemaError(f"TensorDict key {_show(key)!r}: a {type(value).__name__} is not a tensor")
            dtype = numpy_dtype(value.dtype, _show(key))
            shape = tuple(value.shape[bdims:])
            if dtype != col.dtype or shape != col.shape:
                raise SchemaError(f"TensorDict key {_show(key)!r}: dtype {dtype} per-step shape {list(shape)}; the "
                                  f"layout says dtype {col.dtype} per-step shape {list(col.shape)}")
            t = value.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            t = t.reshape((steps, *shape))  # a view of a contiguous tensor
            if not t.is_contiguous():
                t = t.contiguous()
            out[col.name] = t.numpy()
        if len(out) != sum(1 for _ in _leaves(td)):
            known = set(self.schema.names)
            extra = [_show(k) for k, _ in _leaves(td) if flatten_key(k) not in known]
            raise SchemaError(f"TensorDict key(s) {extra} are not in the layout {[_show(k) for k in self.keys]}")
        return out

    # -- columns -> TensorDict ----------------------------------------------------------------
    def tensordict(self, columns: Mapping[str, Any], batch_size: int | None = None) -> TensorDict:
        """Columns (numpy arrays or tensors, ``(steps, *shape)``) as a TensorDict of batch size
        ``[steps]``, sharing their memory (``torch.from_numpy``: no copy)."""
        tree: dict[str, Any] = {}
        n = batch_size
        for key, col in zip(self.keys, self.schema.columns, strict=True):
            try:
                arr = columns[col.name]
            except KeyError:
                raise SchemaError(f"column {col.name!r} is missing; the layout has {list(self.schema.names)}") from None
            t = torch.from_numpy(arr) if isinstance(arr, np.ndarray) else arr
            if n is None:
                n = int(t.shape[0])
            node = tree
            if isinstance(key, tuple):
                for part in key[:-1]:
                    node = node.setdefault(part, {})
                node[key[-1]] = t
            else:
                node[key] = t
        return TensorDict(_nest(tree, n), batch_size=[n])


def _nest(tree: dict[str, Any], n: int) -> dict[str, Any]:
    return {k: (TensorDict(_nest(v, n), batch_size=[n]) if isinstance(v, dict) else v) for k, v in tree.items()}


def _show(key: NestedKey) -> NestedKey:
    """A key as TensorDict users write it (a one-part tuple as its string)."""
    if isinstance(key, tuple) and len(key) == 1:
        return key[0]
    return key
