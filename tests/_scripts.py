"""Loading a script that is not part of the package (``benchmarks/*.py``, ``studies/*.py``) as a module, so its
tests can call its functions and its ``main(argv)``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def load_script(path: Path, name: str) -> ModuleType:
    """``path`` executed as module ``name``, registered in ``sys.modules`` (dataclasses resolve their
    annotations through it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
