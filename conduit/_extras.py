"""Optional dependencies, by extra: a clear error naming the extra to install when one is missing.

The simulator, the topology tools, the policies and the ``conduit`` command need none of them.
``conduit-rl[runtime]`` adds torch (tensors, CUDA and pinned tiers), ``conduit-rl[rllib]`` adds Ray
and RLlib (and torch), ``conduit-rl[plot]`` adds matplotlib (the studies' figures).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from conduit.errors import ConduitError

#: the extra that provides each optional top-level module
EXTRA_OF = {"torch": "runtime", "ray": "rllib", "matplotlib": "plot", "torchrl": "torchrl", "tensordict": "torchrl"}


def install_hint(extra: str) -> str:
    return f"pip install 'conduit-rl[{extra}]'"


class MissingExtraError(ConduitError, ImportError):
    """An optional dependency that is not installed; the message names the extra that provides it."""

    def __init__(self, module: str, feature: str, extra: str | None = None):
        self.module = module
        self.extra = extra or EXTRA_OF.get(module, module)
        super().__init__(f"{feature} needs {module}, which is not installed: {install_hint(self.extra)}")


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, feature: str, extra: str | None = None) -> ModuleType:
    """``import module``, or a :class:`MissingExtraError` saying that ``feature`` needs it and how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] != module.split(".")[0]:
            raise  # the module is there but one of its own imports is broken: keep that error
        raise MissingExtraError(module, feature, extra) from None
