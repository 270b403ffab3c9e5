"""YAML reading that remembers where each field came from.

Error messages about a topology or workload file name the file, the field path
(``links[3].bandwidth``) and, when known, the line. PyYAML throws positions away once it has
built plain dicts, so this loader builds :class:`LineDict` and :class:`LineList`, which keep the
line of each key or item next to the data.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from conduit.errors import TopologyError


class LineDict(dict):
    """A dict that knows the (1-based) line of itself and of each of its keys."""

    line: int | None = None
    key_lines: dict[str, int]


class LineList(list):
    """A list that knows the (1-based) line of itself and of each item."""

    line: int | None = None
    item_lines: list[int]


@functools.cache
def _line_loader() -> type:
    """The line-keeping loader, built on first use: PyYAML is needed to read files, not to build
    topologies from dicts (a GPU machine without PyYAML still runs the runtime)."""
    import yaml

    class _LineLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            mapping = LineDict(super().construct_mapping(node, deep=True))
            mapping.line = node.start_mark.line + 1
            mapping.key_lines = {
                key_node.value: key_node.start_mark.line + 1 for key_node, _ in node.value
            }
            return mapping

        def construct_sequence(self, node, deep=False):
            items = LineList(super().construct_sequence(node, deep=True))
            items.line = node.start_mark.line + 1
            items.item_lines = [child.start_mark.line + 1 for child in node.value]
            return items

    _LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _LineLoader.construct_mapping)
    _LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _LineLoader.construct_sequence)
    return _LineLoader


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file; a missing file or a syntax error becomes a :class:`TopologyError`."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TopologyError(str(path), None, "no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise TopologyError(str(path), None, f"cannot read: {exc}") from None
    return parse_yaml(text, str(path))


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text; ``source`` names it in errors."""
    import yaml

    try:
        return yaml.load(text, Loader=_line_loader())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown line"
        problem = exc.problem or exc.context or "syntax error"
        raise TopologyError(source, None, f"YAML syntax error at {where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise TopologyError(source, None, f"YAML error: {exc}") from None


def line_of(container: Any, key: str | int | None = None) -> int | None:
    """The line of ``container[key]`` (or of the container), when the loader recorded it."""
    if key is None:
        return getattr(container, "line", None)
    if isinstance(container, LineDict):
        return container.key_lines.get(key, container.line)
    if isinstance(container, LineList) and isinstance(key, int) and key < len(container.item_lines):
        return container.item_lines[key]
    return getattr(container, "line", None)
