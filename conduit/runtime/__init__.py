"""Conduit's real runtime: memory tiers that hold real bytes, a transfer engine that moves them, and
the :class:`ExperiencePlane` that runs the same placement and scheduling policies as the simulator.

Usable in-process with no Ray at all, and as Ray actors (one per node) through
:mod:`conduit.runtime.ray_plane`. ``conduit calibrate`` (:mod:`conduit.runtime.calibrate`) measures
the machine and writes a topology the simulator loads.
"""
