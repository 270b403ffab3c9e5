"""Conduit: an experience data plane for distributed reinforcement learning.

Experience moves from actors to learners through three control points — **ingestion**, **placement**
and **delivery** — decided by pluggable policies that read a :class:`~conduit.view.ClusterView` and
run unchanged in the SimPy simulator (:mod:`conduit.sim`) and the real runtime (:mod:`conduit.runtime`).
"""

__version__ = "0.1.0"
