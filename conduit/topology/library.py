"""The topology library: named YAML files shipped in the repository's ``topologies/`` folder.

A name (``dgx-h100-x128``) resolves to ``topologies/<name>.yaml``. Extra folders can be put in front
with the ``CONDUIT_TOPOLOGY_PATH`` environment variable (``os.pathsep``-separated), so users keep
their own library next to the built-in one.
"""

from __future__ import annotations

import os
from pathlib import Path

from conduit.errors import TopologyError

BUILTIN_DIR = Path(__file__).resolve().parents[2] / "topologies"
DEFAULT_TOPOLOGY = "dgx-h100-x2"


def search_path() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("CONDUIT_TOPOLOGY_PATH", "").split(os.pathsep) if p]
    return [*extra, BUILTIN_DIR]


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
