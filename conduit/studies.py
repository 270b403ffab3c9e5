"""Studies without glue: :func:`sweep` over workload fields, topologies, policies and seeds.

The public entry points are re-exported by :mod:`conduit` (lazily, so ``import conduit`` stays light):

* ``conduit.simulate(topology, workload, policy, iterations=, seed=, overrides=, progress=)`` — one
  run (:func:`conduit.sim.run.simulate`); its :class:`~conduit.sim.engine.SimResult` has
  ``.to_dict()``, ``.to_rows()`` and ``.to_frame()``;
* ``conduit.sweep(topology, workload, grid=, policies=, seeds=, iterations=, out=)`` — the cartesian
  product, one row per run, as a :class:`Table` (a list of dicts with ``.to_frame()``); with ``out``
  each row is appended to a CSV file as it finishes and rows already there are not run again.

``conduit sweep`` (:mod:`conduit.cli.sweep`) is the same function on the command line. pandas is
never required: ``to_frame()`` raises an :class:`ImportError` naming it when it is missing.
"""

from __future__ import annotations

import csv
import importlib.util
import itertools
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from conduit.errors import ConduitError
from conduit.progress_display import resolve_progress
from conduit.results import Table, result_rows, to_frame

__all__ = ["METRIC_COLUMNS", "Table", "load_script", "parse_grid", "parse_list", "resolve_progress", "result_rows",
           "sweep", "to_frame"]

DEFAULT_TOPOLOGY = "dgx-h100-x2"
DEFAULT_WORKLOAD = "ppo"
#: a sweep larger than this is refused (a typo such as ``--seeds 0-1000`` or a runaway grid)
MAX_RUNS = 100_000
#: what a sweep row holds after its key columns
METRIC_COLUMNS = (
    "exposed_experience_path_s",
    "iteration_time_s",
    "experience_share",
    "experience_path_s",
    "experience_path_p99_s",
    "updates",
    "chunks",
    "violations",
    "rejected_decisions",
    "policy_name",
)

# -- sweep ------------------------------------------------------------------------------------------
def load_script(path: str | Path) -> ModuleType:
    """A study script loaded by path, as the module named by its file's stem (studies are scripts, not a
    package, and one study reuses another's workloads or figures). Loaded once: it is registered in
    ``sys.modules`` before it runs, because the dataclasses it defines look their module up there."""
    path = Path(path)
    name = path.stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConduitError(f"{path}: not a Python script")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def parse_grid(items: Sequence[str] | None) -> dict[str, list[str]]:
    """``["key=v1,v2", ...]`` (``--grid``) as ``{key: [v1, v2]}``."""
    grid: dict[str, list[str]] = {}
    for item in items or []:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConduitError(f"--grid {_short(item)!r}: expected KEY=V1,V2,..., e.g. --grid runners_per_gpu=1,2,4")
        if key in grid:
            raise ConduitError(f"--grid: {key!r} given twice; list all its values once (KEY=V1,V2,...)")
        grid[key] = [v.strip() for v in values.split(",")]
    return grid


def parse_list(value: Any, what: str, *, integer: bool = False) -> list[Any]:
    """``"a,b"``, a scalar or a sequence as a list (integers for seeds), refusing empties and repeats."""
    if isinstance(value, str):
        items: list[Any] = [v.strip() for v in value.split(",")]
    elif isinstance(value, Iterable):
        items = list(value)
    else:
        items = [value]
    if not items or any(v == "" for v in items):
        raise ConduitError(f"{what}: expected a comma-separated list without empty items, got {_short(value)!r}")
    if integer:
        out = []
        for v in items:
            try:
                if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
                    raise ValueError
                number = int(v)
            except (TypeError, ValueError):
                raise ConduitError(f"{what}: {_short(v)!r} is not an integer") from None
            if number < 0:
                raise ConduitError(f"{what}: {number} is negative")
            out.append(number)
        items = out
    repeated = sorted({str(v) for v in items if items.count(v) > 1})
    if repeated:
        raise ConduitError(f"{what}: {', '.join(repeated)} given more than once")
    return items


def sweep(
    topology: Any = None,
    workload: Any = None,
    *,
    grid: Mapping[str, Any] | Sequence[str] | None = None,
    policies: Any = "rllib-stock",
    seeds: Any = (0,),
    iterations: int = 10,
    overrides: Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    progress: Any = None,
) -> Table:
    """Run the cartesian product of ``grid`` x ``policies`` x ``seeds``; one row per run.

    ``grid`` maps a key to its values (``{"runners_per_gpu": [1, 2, 4]}``; text such as ``"4"`` or
    ``"2 ms"`` is typed by the field), or is a list of ``"key=v1,v2"`` strings. A key is a workload
    field (``docs/workload-format.md``), ``topology`` or ``workload``. ``overrides`` sets fields for
    every run. Every cell is checked (typed, validated, laid out on its topology) before anything runs,
    so a bad grid is refused at once.

    With ``out`` (a CSV path), each row is appended as its run finishes, and a cell whose key columns
    (topology, workload, grid keys, policy, seed, iterations) already have a row there is not run
    again: an interrupted sweep resumes where it stopped. Returns a :class:`Table` of this sweep's rows,
    in product order (rows read back from ``out`` hold the CSV's values, typed back to numbers)."""
    from conduit.registry import create_policy
    from conduit.sim.cluster import lay_out
    from conduit.sim.run import simulate
    from conduit.sim.workload import load_workload
    from conduit.sim.workload_fields import FIELD_NAMES, apply_overrides, coerce_field, unknown_field
    from conduit.topology import load_topology

    axes = _normalise_grid(grid, coerce_field, unknown_field, FIELD_NAMES)
    overrides = dict(overrides or {})
    for key in overrides:
        if key in axes:
            raise ConduitError(f"{key!r} is both a grid key and an override; give it in one place")
        overrides[key] = coerce_field(key, overrides[key], "--set")
    for name, given, default in (("topology", topology, DEFAULT_TOPOLOGY), ("workload", workload, DEFAULT_WORKLOAD)):
        if name in axes and given is not None:
            raise ConduitError(f"{name} is both a grid key and given as --{name} {_short(given)!r}; give it in one place")
        if name not in axes:
            axes = {name: [given if given is not None else default], **axes}
    axes = {"topology": axes.pop("topology"), "workload": axes.pop("workload"), **axes}
    for key, value in overrides.items():
        axes[key] = [value]
    policy_list = parse_list(policies, "policies")
    seed_list = parse_list(seeds, "seeds", integer=True)
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ConduitError(f"iterations must be an integer >= 1, got {_short(iterations)!r}")
    total = math.prod(len(v) for v in axes.values()) * len(policy_list) * len(seed_list)
    if total > MAX_RUNS:
        raise ConduitError(f"the sweep has {total:,} runs (grid x policies x seeds); at most {MAX_RUNS:,}")

    # check everything before running anything
    topologies = {}
    for spec in axes["topology"]:
        try:
            topologies[_key(spec)] = spec if not isinstance(spec, str | Path) else load_topology(spec)
        except ConduitError as exc:
            raise ConduitError(f"grid topology {_short(spec)!r}: {exc}") from None
    bases = {}
    for spec in axes["workload"]:
        try:
            bases[_key(spec)] = load_workload(spec)
        except ConduitError as exc:
            raise ConduitError(f"grid workload {_short(spec)!r}: {exc}") from None
    for name in policy_list:
        if name != "janus-best":
            create_policy(name)
    field_keys = [k for k in axes if k not in ("topology", "workload")]
    cells = []
    for combo in itertools.product(*axes.values()):
        values = dict(zip(axes, combo, strict=True))
        label = _describe(values)
        fields = {k: values[k] for k in field_keys}
        try:
            base = bases[_key(values["workload"])]
            wl = apply_overrides(base, fields, "--grid", where=f"workload {base.name}")
            topo = topologies[_key(values["topology"])]
            lay_out(topo, wl)  # e.g. more learners than the topology has GPUs
        except ConduitError as exc:
            raise ConduitError(f"grid cell {label}: {exc}") from None
        cells.append((values, topo, wl, label))

    columns = [*axes, "policy", "seed", "iterations", *METRIC_COLUMNS]
    key_columns = columns[: len(axes) + 3]
    done = _read_done(Path(out), columns, key_columns) if out is not None else {}
    writer = _Appender(Path(out), columns) if out is not None else None
    report = resolve_progress(progress, "sweep")
    rows: list[dict[str, Any]] = []
    count = 0
    try:
        for values, topo, wl, label in cells:
            for policy in policy_list:
                for seed in seed_list:
                    key_values = {**{k: _plain(v) for k, v in values.items()}, "policy": policy, "seed": seed,
                                  "iterations": iterations}
                    key = tuple(_cell(key_values[c]) for c in key_columns)
                    if key in done:
                        rows.append(done[key])
                    else:
                        try:
                            result = simulate(topo, wl, policy, iterations=iterations, seed=seed)
                        except ConduitError as exc:
                            kept = f"; the rows done so far are in {out}, rerun to resume" if out else ""
                            raise ConduitError(f"run {label}, policy {policy}, seed {seed}: {exc}{kept}") from None
                        summary = result_rows(result)[0]
                        summary["policy_name"] = summary["policy"]
                        row = {**key_values, **{c: summary.get(c) for c in METRIC_COLUMNS}}
                        if writer is not None:
                            writer.write(row)
                        done[key] = row
                        rows.append(row)
                    count += 1
                    if report is not None:
                        report(count, total)
    finally:
        if writer is not None:
            writer.close()
    return Table(rows, columns)


def _normalise_grid(grid, coerce_field, unknown_field, field_names) -> dict[str, list[Any]]:
    if grid is None:
        return {}
    if isinstance(grid, str):
        grid = [grid]
    if not isinstance(grid, Mapping):
        grid = parse_grid(list(grid))
    axes: dict[str, list[Any]] = {}
    for key, values in grid.items():
        if key in ("policy", "policies", "seed", "seeds", "iterations"):
            plural = {"policy": "policies", "seed": "seeds"}.get(key, key)
            raise ConduitError(f"grid key {key!r}: give {plural} with --{plural} (policies=/seeds=/iterations=)")
        if key not in ("topology", "workload") and key not in field_names:
            raise unknown_field(key, "--grid")
        if isinstance(values, str) or not isinstance(values, Iterable):
            values = [values]
        values = list(values)
        if not values or any(v == "" for v in values):
            raise ConduitError(f"grid key {key!r}: no value, or an empty one (KEY=V1,V2,...)")
        typed = values if key in ("topology", "workload") else [coerce_field(key, v, "--grid") for v in values]
        seen = [_cell(_plain(v)) for v in typed]
        repeated = sorted({s for s in seen if seen.count(s) > 1})
        if repeated:
            raise ConduitError(f"grid key {key!r}: {', '.join(repeated)} given more than once")
        axes[key] = typed
    return axes


def _plain(value: Any) -> Any:
    """A grid value as a CSV cell holds it: names for topology and workload objects."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    return getattr(value, "name", str(value))


def _key(spec: Any) -> Any:
    return spec if isinstance(spec, str | Path) else id(spec)


def _cell(value: Any) -> str:
    """What csv writes for ``value`` (the form resumability compares)."""
    return "" if value is None else str(value)


def _describe(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_short(_plain(v), 40)}" for k, v in values.items())


def _short(value: Any, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


_INT = re.compile(r"^[-+]?\d+$")


def _typed(text: str) -> Any:
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    if _INT.match(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def _read_done(path: Path, columns: list[str], key_columns: list[str]) -> dict[tuple[str, ...], dict[str, Any]]:
    """Rows already in ``path`` by their key cells; refuses a file written by a different sweep."""
    if path.is_dir():
        raise ConduitError(f"--out {path}: is a directory")
    if not path.parent.is_dir():
        raise ConduitError(f"--out {path}: directory {path.parent} does not exist")
    if not path.exists() or path.stat().st_size == 0:
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConduitError(f"--out {path}: cannot read it to resume ({exc})") from None
    if not text.endswith("\n"):  # a row cut short by an interruption: drop it, it will run again
        text = text[: text.rfind("\n") + 1]
        path.write_text(text, encoding="utf-8")
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if header != columns:
        raise ConduitError(f"--out {path} holds a different sweep (columns {', '.join(header or [])}; this sweep's: "
                           f"{', '.join(columns)}); choose another --out or remove the file")
    done: dict[tuple[str, ...], dict[str, Any]] = {}
    index = [columns.index(c) for c in key_columns]
    for cells in reader:
        if len(cells) != len(columns):
            continue
        key = tuple(cells[i] for i in index)
        done.setdefault(key, {c: _typed(v) for c, v in zip(columns, cells, strict=True)})
    return done


class _Appender:
    """Appends rows to the CSV, header first on a new file, flushed after each row."""

    def __init__(self, path: Path, columns: list[str]):
        if path.is_dir():
            raise ConduitError(f"--out {path}: is a directory")
        new = not path.exists() or path.stat().st_size == 0
        try:
            self.handle = open(path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise ConduitError(f"--out {path}: cannot write ({exc.strerror})") from None
        self.writer = csv.DictWriter(self.handle, fieldnames=columns, lineterminator="\n")
        if new:
            self.writer.writeheader()
            self.handle.flush()

    def write(self, row: Mapping[str, Any]) -> None:
        self.writer.writerow(row)
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()
