"""The topology library: named YAML files shipped inside the package (``conduit/topologies/``).

A name (``dgx-h100-x128``) resolves to ``<library>/<name>.yaml``. The built-in library is package
data, found with :mod:`importlib.resources`, so it is there in an installed wheel as well as in a
checkout. Extra folders can be put in front with the ``CONDUIT_TOPOLOGY_PATH`` environment variable
(``os.pathsep``-separated), so users keep their own library next to the built-in one.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
from importlib import resources
from pathlib import Path

from conduit.errors import TopologyError

#: the package whose data folder ``topologies/`` holds the built-in library
LIBRARY_PACKAGE = "conduit"
LIBRARY_FOLDER = "topologies"
DEFAULT_TOPOLOGY = "dgx-h100-x2"


@functools.cache
def builtin_dir() -> Path:
    """The built-in library's folder on the file system.

    A normal install (wheel, editable or a checkout on ``sys.path``) gives the package's own folder.
    A package imported from a zip archive is extracted once, for the life of the process, because
    a topology file may name its node files by path relative to itself."""
    folder = resources.files(LIBRARY_PACKAGE) / LIBRARY_FOLDER
    if isinstance(folder, Path):
        return folder
    stack = contextlib.ExitStack()  # pragma: no cover - zip imports only
    atexit.register(stack.close)
    return Path(stack.enter_context(resources.as_file(folder)))


def search_path() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("CONDUIT_TOPOLOGY_PATH", "").split(os.pathsep) if p]
    return [*extra, builtin_dir()]


def library_names() -> list[str]:
    """Every topology name the library offers, first folder winning."""
    names: set[str] = set()
    for folder in search_path():
        if folder.is_dir():
            names.update(p.stem for p in folder.glob("*.yaml"))
    return sorted(names)


def resolve(spec: str | Path) -> Path:
    """A path to an existing file, or the library file of that name."""
    path = Path(spec)
    if path.is_file():
        return path
    if path.suffix in (".yaml", ".yml") or os.sep in str(spec):
        raise TopologyError(str(spec), None, "no such file")
    for folder in search_path():
        candidate = folder / f"{spec}.yaml"
        if candidate.is_file():
            return candidate
    known = ", ".join(library_names()) or "none found"
    raise TopologyError(str(spec), None, f"not a file and not a library topology (library: {known})")
