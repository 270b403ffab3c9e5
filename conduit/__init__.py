"""Conduit: an experience data plane for distributed reinforcement learning.

Experience moves from actors to learners through three control points — **ingestion**, **placement**
and **delivery** — decided by pluggable policies that read a :class:`~conduit.view.ClusterView` and
run unchanged in the SimPy simulator (:mod:`conduit.sim`) and the real runtime (:mod:`conduit.runtime`).
"""

from importlib import metadata as _metadata

try:
    #: the installed distribution's version; written once, in pyproject.toml
    __version__: str = _metadata.version("conduit-rl")
except _metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"
