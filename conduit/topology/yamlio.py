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

#: the largest YAML file read (the biggest library file is a few kilobytes; an explicit-form file of
#: ten thousand devices is about a megabyte)
MAX_YAML_BYTES = 64 << 20
#: the most values (scalars, lists and mappings) a document may hold once its aliases are expanded:
#: ``*alias`` shares one object, so a few hundred bytes of nested aliases (a "billion laughs") stand for
#: billions of values that any walk over them would visit
MAX_YAML_VALUES = 1_000_000


class _TooLarge(Exception):
    """A document whose aliases expand to more than :data:`MAX_YAML_VALUES` values."""


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

        def construct_document(self, node):
            _check_expanded_size(node)
            return super().construct_document(node)

    _LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _LineLoader.construct_mapping)
    _LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _LineLoader.construct_sequence)
    return _LineLoader


def _check_expanded_size(root: Any) -> None:
    """Refuse a composed document that holds more than :data:`MAX_YAML_VALUES` values with its
    aliases expanded. Counts each distinct node once (memoised), so the check itself is cheap."""
    import yaml

    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:  # post-order without recursion: deep nesting must not overflow the stack
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[id(node)] = 1
            continue
        children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                    else list(node.value))
        if not children_done:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        total = 1 + sum(sizes[id(c)] for c in children)
        if total > MAX_YAML_VALUES:
            raise _TooLarge(node.start_mark.line + 1)
        sizes[id(node)] = total


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file; a missing, unreadable, oversized or malformed file becomes a
    :class:`TopologyError` naming it."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise TopologyError(str(path), None, "no such file") from None
    except IsADirectoryError:
        raise TopologyError(str(path), None, "is a directory, not a YAML file") from None
    except OSError as exc:
        raise TopologyError(str(path), None, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_YAML_BYTES:
        raise TopologyError(str(path), None, f"larger than {MAX_YAML_BYTES >> 20} MiB; refusing to read it")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TopologyError(str(path), None, f"not UTF-8 text (byte {exc.start})") from None
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
    except _TooLarge as exc:
        raise TopologyError(source, None, f"the document expands to more than {MAX_YAML_VALUES:,} values through "
                                          f"its aliases (*name), from line {exc.args[0]}; refusing to load it") from None
    except RecursionError:
        raise TopologyError(source, None, "YAML nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise TopologyError(source, None, f"YAML value error: {str(exc)[:200]}") from None


def line_of(container: Any, key: str | int | None = None) -> int | None:
    """The line of ``container[key]`` (or of the container), when the loader recorded it."""
    if key is None:
        return getattr(container, "line", None)
    if isinstance(container, LineDict):
        return container.key_lines.get(key, container.line)
    if isinstance(container, LineList) and isinstance(key, int) and key < len(container.item_lines):
        return container.item_lines[key]
    return getattr(container, "line", None)
