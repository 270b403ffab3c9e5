"""Conduit: an experience data plane for distributed reinforcement learning.

Experience moves from actors to learners through three control points — **ingestion**, **placement**
and **delivery** — decided by pluggable policies that read a :class:`~conduit.view.ClusterView` and
run unchanged in the SimPy simulator (:mod:`conduit.sim`) and the real runtime (:mod:`conduit.runtime`).

Studies from Python: ``conduit.simulate(topology, workload, policy, ...)`` runs one simulation and
``conduit.sweep(..., grid={...}, policies=[...], seeds=[...])`` a grid of them (:mod:`conduit.studies`).
Both are imported on first use, so ``import conduit`` stays light.
"""

from importlib import metadata as _metadata

try:
    #: the installed distribution's version; written once, in pyproject.toml
    __version__: str = _metadata.version("conduit-rl")
except _metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"

_LAZY = {"simulate": ("conduit.sim.run", "simulate"), "sweep": ("conduit.studies", "sweep"),
         "Table": ("conduit.results", "Table")}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'conduit' has no attribute {name!r}")

