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


def seeds(text: str) -> int:
    """``--seeds``: runs, one per seed, 1 to :data:`~conduit.sim.seeds.MAX_SEEDS`."""
    from conduit.sim.seeds import MAX_SEEDS

    return _int(text, f"an integer from 1 to {MAX_SEEDS} (runs, one per seed)", 1, MAX_SEEDS)


def fold(text: str) -> int:
    """``--fold``: nodes per simulated representative, an integer from 1 (exact) to 4,096."""
    return _int(text, "an integer from 1 (no folding) to 4096", 1, 4096)


def sim_time(text: str) -> float:
    """``--sim-time``: simulated seconds > 0, a number or a time with a unit (``"30 s"``, ``"500 ms"``)."""
    import math

    from conduit.errors import UnitError
    from conduit.units import Kind, parse_quantity

    try:
        value = parse_quantity(text.strip(), Kind.TIME)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(f"must be simulated seconds > 0 (e.g. 30 or '500 ms'): {exc}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be simulated seconds > 0, got {text[:40]!r}")
    return value
