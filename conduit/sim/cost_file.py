"""The stock cost model from a file: ``conduit sim --stock-costs FILE``, ``simulate(stock_costs=...)``.

A reader who doubts the baseline's assumptions changes them without editing source. The file is YAML
(JSON is YAML too): a mapping from :class:`~conduit.sim.params.StockCosts` field names to values;
fields it does not name keep their built-in values. Values are numbers in base units (seconds,
bytes/s, seconds per byte) or, for time and bandwidth fields, strings with units (``"1.5 ms"``,
``"9.2 GB/s"``). Either the mapping itself or the same mapping under a top-level ``stock_costs:`` key.

Every mistake is an error naming the file and the field: a file that does not exist or does not
parse, a top level that is not a mapping, an unknown field (with the closest name), a value that
is not a number, is negative, NaN or infinite, or a bandwidth of 0. The costs in force and the file
they came from are echoed in every result's provenance (:mod:`conduit.sim.provenance`).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from conduit.errors import ConduitError, UnitError, shown
from conduit.sim.params import StockCosts
from conduit.units import Kind, parse_quantity


class CostFileError(ConduitError):
    """A stock-cost file that cannot be used; the message names the file and the field."""

    def __init__(self, source: str, field: str | None, message: str):
        where = f"{source}: {field}: " if field else f"{source}: "
        super().__init__(where + message)
        self.source, self.field = source, field


def _kind(name: str) -> Kind | None:
    if name.endswith("_bandwidth"):
        return Kind.BANDWIDTH
    if name.endswith("_per_byte"):
        return None  # seconds per byte: a plain number
    return Kind.TIME


def stock_costs_from_mapping(data: Any, source: str = "<mapping>") -> StockCosts:
    """:class:`StockCosts` with the fields ``data`` names replaced (validated; see the module doc)."""
    if isinstance(data, Mapping) and set(data) == {"stock_costs"}:
        data = data["stock_costs"]
        prefix = "stock_costs."
    else:
        prefix = ""
    if not isinstance(data, Mapping):
        raise CostFileError(source, None, f"expected a mapping of StockCosts fields to values, got "
                                          f"{type(data).__name__} {shown(data)}")
    if not data:
        raise CostFileError(source, None, "the mapping is empty; name at least one StockCosts field")
    names = [f.name for f in fields(StockCosts)]
    values: dict[str, float] = {}
    for key, raw in data.items():
        field = f"{prefix}{key}"
        if not isinstance(key, str) or key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise CostFileError(source, field, f"unknown StockCosts field{hint} (fields: {', '.join(names)})")
        kind = _kind(key)
        try:
            if kind is None:
                if isinstance(raw, bool) or not isinstance(raw, int | float):
                    raise UnitError(f"expected a number (seconds per byte), got {shown(raw)}")
                value = float(raw)
                if not math.isfinite(value):
                    raise UnitError(f"{shown(raw)} is not a finite number")
            else:
                value = parse_quantity(raw, kind)
        except UnitError as exc:
            raise CostFileError(source, field, str(exc)) from None
        if value < 0:
            raise CostFileError(source, field, f"must be >= 0, got {shown(raw)}")
        if kind is Kind.BANDWIDTH and value == 0:
            raise CostFileError(source, field, f"a bandwidth must be > 0, got {shown(raw)}")
        values[key] = value
    return replace(StockCosts(), **values)


def load_stock_costs(path: str | Path) -> StockCosts:
    """Read a stock-cost file (see the module doc)."""
    import yaml

    source = str(path)
    target = Path(path)
    if not target.exists():
        raise CostFileError(source, None, "no such file")
    if not target.is_file():
        raise CostFileError(source, None, "not a file")
    try:
        text = target.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CostFileError(source, None, f"cannot be read ({exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise CostFileError(source, None, f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    return stock_costs_from_mapping(data, source)


def resolve_stock_costs(spec: Any) -> tuple[StockCosts | None, str | None]:
    """``(costs, source)`` from ``None`` (built-in), a :class:`StockCosts`, a mapping or a file path."""
    if spec is None:
        return None, None
    if isinstance(spec, StockCosts):
        return spec, "StockCosts object passed to simulate()"
    if isinstance(spec, Mapping):
        return stock_costs_from_mapping(spec, "stock_costs"), "mapping passed to simulate()"
    if isinstance(spec, str | Path):
        return load_stock_costs(spec), str(Path(spec).resolve())
    raise ConduitError(f"stock_costs must be a file path, a mapping or a StockCosts, got {type(spec).__name__}")
