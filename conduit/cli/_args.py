"""Argument types shared by the commands: bounded integers that argparse reports as usage errors
(``conduit sim: error: argument --seed: ...``, exit 2) instead of failing deep inside a run."""

from __future__ import annotations

import argparse

from conduit.sim.run import MAX_ITERATIONS, MAX_SEED


def _int(text: str, wanted: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be {wanted}, got {text[:40]!r}")
    return value


def iterations(text: str) -> int:
    """``--iterations``: learner updates, 1 to :data:`~conduit.sim.run.MAX_ITERATIONS`."""
    return _int(text, f"an integer from 1 to {MAX_ITERATIONS:,} (learner updates)", 1, MAX_ITERATIONS)


def seed(text: str) -> int:
    """``--seed``: a non-negative integer below 2**64."""
    return _int(text, "a non-negative integer below 2**64", 0, MAX_SEED)
