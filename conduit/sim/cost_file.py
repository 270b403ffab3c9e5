"""Cost models from files: ``conduit sim --stock-costs FILE`` / ``--plane-costs FILE``,
``simulate(stock_costs=..., plane_costs=...)``.

**Plane costs** (:class:`~conduit.sim.params.PlaneCosts`) are read the same way, from a mapping of
its field names (or the same under ``plane_costs:``), or from a calibration file written by ``conduit
calibrate --plane-json FILE`` / ``benchmarks/plane_primitives.py`` (``{"host": ..., "measurements":
{...}}``), whose measurements become fields through :data:`~conduit.sim.params.PLANE_SOURCES`; a
measurement the file lacks or could not take keeps the built-in value, and the result says which
fields came from the file (:func:`load_plane_costs` returns them).

A reader who doubts the baseline's assumptions changes them without editing source. The file is YAML
(JSON is YAML too): a mapping from :class:`~conduit.sim.params.StockCosts` field names to values;
fields it does not name keep their built-in values. Values are numbers in base units (seconds,
bytes/s, seconds per byte, a thread's cores, factors) or, for time and bandwidth fields, strings with
units (``"1.5 ms"``, ``"9.2 GB/s"``). Either the mapping itself or the same mapping under a top-level ``stock_costs:`` key.

Every mistake is an error naming the file and the field: a file that does not exist or does not
parse, a top level that is not a mapping, an unknown field (with the closest name), a value that
is not a number, is negative, NaN or infinite, a bandwidth of 0, a thread's demand above one core
(``*_cores``) or a factor below 1 (``*_cost``). The costs in force and the file
they came from are echoed in every result's provenance (:mod:`conduit.sim.provenance`).
"""

from __future__ import annotations

import difflib
import functools
import json
import math
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from conduit.errors import ConduitError, UnitError, shown
from conduit.sim.params import PLANE_COLD_SOURCES, PLANE_SOURCES, PlaneCosts, StockCosts
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
    if name.endswith(("_per_byte", "_bytes", "_calls", "_in_flight", "_pieces", "_cores", "_cost")):
        return None  # seconds per byte, bytes, counts, one thread's cores, factors: plain numbers
    return Kind.TIME


def stock_costs_from_mapping(data: Any, source: str = "<mapping>") -> StockCosts:
    """:class:`StockCosts` with the fields ``data`` names replaced (validated; see the module doc)."""
    return _costs_from_mapping(StockCosts, "stock_costs", data, source)


def plane_costs_from_mapping(data: Any, source: str = "<mapping>") -> PlaneCosts:
    """:class:`PlaneCosts` with the fields ``data`` names replaced (validated like stock costs)."""
    return _costs_from_mapping(PlaneCosts, "plane_costs", data, source)


def _costs_from_mapping(cls: type, top: str, data: Any, source: str) -> Any:
    what = cls.__name__
    if isinstance(data, Mapping) and set(data) == {top}:
        data = data[top]
        prefix = f"{top}."
    else:
        prefix = ""
    if not isinstance(data, Mapping):
        raise CostFileError(source, None, f"expected a mapping of {what} fields to values, got "
                                          f"{type(data).__name__} {shown(data)}")
    if not data:
        raise CostFileError(source, None, f"the mapping is empty; name at least one {what} field")
    names = [f.name for f in fields(cls)]
    values: dict[str, float] = {}
    for key, raw in data.items():
        field = f"{prefix}{key}"
        if not isinstance(key, str) or key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise CostFileError(source, field, f"unknown {what} field{hint} (fields: {', '.join(names)})")
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
        if key.endswith("_cores") and value > 1:
            raise CostFileError(source, field, f"one thread's demand: at most 1 core, got {shown(raw)}")
        if key.endswith("_cost") and value < 1:
            raise CostFileError(source, field, f"a factor on CPU time: must be >= 1, got {shown(raw)}")
        if kind is Kind.BANDWIDTH and value == 0:
            raise CostFileError(source, field, f"a bandwidth must be > 0, got {shown(raw)}")
        if isinstance(getattr(cls, key, None), int):  # counts (PlaneCosts' runtime settings)
            if not float(value).is_integer() or value < 1:
                raise CostFileError(source, field, f"must be an integer >= 1, got {shown(raw)}")
            value = int(value)
        values[key] = value
    try:
        return replace(cls(), **values)
    except ConduitError as exc:  # fields that contradict each other (StockCosts' cold-call ramp)
        field = next((f"{prefix}{k}" for k in values if str(exc).startswith(k)), None)
        raise CostFileError(source, field, str(exc)) from None


def _read_yaml(path: str | Path) -> Any:
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
    if target.suffix.lower() == ".json":  # calibration files: JSON, whose "1e-06" YAML 1.1 reads as a string
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise CostFileError(source, None, f"not valid JSON at line {exc.lineno}, column {exc.colno}: "
                                              f"{exc.msg}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise CostFileError(source, None, f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    return data


def load_stock_costs(path: str | Path) -> StockCosts:
    """Read a stock-cost file (see the module doc)."""
    return stock_costs_from_mapping(_read_yaml(path), str(path))


def plane_costs_from_calibration(data: Mapping[str, Any], source: str) -> tuple[PlaneCosts, dict[str, str]]:
    """:class:`PlaneCosts` from a calibration's ``measurements`` (``conduit calibrate --plane-json``):
    each field of :data:`~conduit.sim.params.PLANE_SOURCES` (and of ``PLANE_COLD_SOURCES``, the cold-call law's,
    where measured) from its measurement's latency or bandwidth; returns the costs and ``{field: "<file>: <measurement>.<figure>"}`` for the fields taken."""
    measurements = data.get("measurements")
    if not isinstance(measurements, Mapping):
        raise CostFileError(source, "measurements", "a calibration file needs a mapping of measurements")
    values: dict[str, float] = {}
    taken: dict[str, str] = {}
    for name, (measurement, how) in {**PLANE_SOURCES, **PLANE_COLD_SOURCES}.items():
        m = measurements.get(measurement)
        if not isinstance(m, Mapping) or not m.get("samples"):
            continue  # not measured there: the built-in value stays
        figure = "bandwidth" if how.startswith("bandwidth") else "latency"
        value = m.get(figure)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise CostFileError(source, f"measurements.{measurement}.{figure}", f"not a usable figure: {shown(value)}")
        if figure == "bandwidth" and value == 0:
            raise CostFileError(source, f"measurements.{measurement}.{figure}", "a bandwidth must be > 0")
        values[name] = float(value)
        taken[name] = f"{source}: {measurement}.{figure}"
    if not set(taken) - set(PLANE_COLD_SOURCES):
        raise CostFileError(source, "measurements", "holds none of the plane's primitives ("
                                                    + ", ".join(sorted({m for m, _ in PLANE_SOURCES.values()})) + ")")
    return replace(PlaneCosts(), **values), taken


def load_plane_costs(path: str | Path) -> tuple[PlaneCosts, dict[str, str]]:
    """Read a plane-cost file: a calibration JSON or a mapping of :class:`PlaneCosts` fields. Returns
    the costs and, per field taken from the file, where it came from."""
    source = str(path)
    data = _read_yaml(path)
    if isinstance(data, Mapping) and "measurements" in data:
        return plane_costs_from_calibration(data, source)
    costs = plane_costs_from_mapping(data, source)
    inner = data.get("plane_costs", data) if isinstance(data, Mapping) else {}
    return costs, {k: source for k in inner}


@functools.cache
def default_plane_costs() -> tuple[PlaneCosts, dict[str, str]]:
    """The built-in :class:`PlaneCosts`: the measured file shipped with the project
    (:data:`~conduit.sim.params.PLANE_PRIMITIVES_FILE`) when it is there, else the dataclass defaults."""
    from conduit.sim.params import PLANE_PRIMITIVES_FILE

    here = Path(__file__).resolve().parents[2] / PLANE_PRIMITIVES_FILE
    if here.is_file():
        costs, taken = load_plane_costs(here)
        return costs, {k: v.replace(str(here), PLANE_PRIMITIVES_FILE) for k, v in taken.items()}
    # an installed wheel carries no benchmarks/: the dataclass defaults restate that file
    return PlaneCosts(), {k: f"{PLANE_PRIMITIVES_FILE}: {m}" for k, (m, _) in {**PLANE_SOURCES, **PLANE_COLD_SOURCES}.items()}


def resolve_plane_costs(spec: Any) -> tuple[PlaneCosts | None, str | None]:
    """``(costs, source)`` from ``None`` (built-in), a :class:`PlaneCosts`, a mapping or a file path."""
    if spec is None:
        return None, None
    if isinstance(spec, PlaneCosts):
        return spec, "PlaneCosts object passed to simulate()"
    if isinstance(spec, Mapping):
        return plane_costs_from_mapping(spec, "plane_costs"), "mapping passed to simulate()"
    if isinstance(spec, str | Path):
        return load_plane_costs(spec)[0], str(Path(spec).resolve())
    raise ConduitError(f"plane_costs must be a file path, a mapping or a PlaneCosts, got {type(spec).__name__}")


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
