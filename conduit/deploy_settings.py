"""What ``enable()`` takes from a policy's parameters: PPO's stream chunk size and the prefetch depth.

One function per setting, used by **both** the RLlib runtime (``conduit/runtime/rllib/plan.py``,
``env_runner.py``, ``learner.py``) and the simulator's deployed model (``conduit/sim/engine.py:
deployed_pieces``, ``conduit/sim/deployed.py``), so the two cannot disagree on what a tuned-parameter
file changes.

**Which parameters count.** A policy parameter configures the deployment only when the user *gave* it
(``enable(params=...)``, ``enable(params_file=...)``, ``conduit sim --params/--params-file``, the
output of ``conduit tune``): :attr:`conduit.policy.Policy.given` records those names. A policy built
with its defaults leaves enable()'s own defaults in force (one sub-chunk per eighth of a fragment; a
prefetch depth of one batch, two for a uniform replay buffer), which are what the runtime was
validated with. An explicit ``enable()`` option wins over both.

**PPO's stream chunk** (:func:`stream_chunk_steps`): an EnvRunner streams each ``sample()`` call in
sub-chunks of ``chunk_steps`` env steps, each a full call of the stock sampler. Given a policy's
``target_chunk_bytes``, the fragment (``fragment_steps`` x ``bytes_per_step``, the bytes one step
occupies in the plane's layout) is cut into as many equal sub-chunks as keep each at most that size,
rounded up to a multiple of ``num_envs`` (a vector step is indivisible), at least one vector step and
at most the fragment. Otherwise :data:`DEFAULT_STREAM_PIECES` sub-chunks.

**Prefetch depth** (:func:`prefetch_depth`): batches a learner's prefetch thread keeps fetched ahead
of its update (``delivery.py: Prefetcher``): the ``prefetch_depth`` option, else a given ``depth``,
else one batch; a uniform replay buffer two (a plane round trip can outlast one idle gap of the
learner), a prioritized one one (each draw then sees the previous update's priorities, RLlib's order).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

#: enable()'s default: sub-chunks per PPO fragment when no chunk size is asked for
DEFAULT_STREAM_PIECES = 8
#: the policy parameters the deployment reads (when given)
CHUNK_PARAM = "target_chunk_bytes"
DEPTH_PARAM = "depth"


def given_params(params: Mapping[str, Any], given: Collection[str]) -> dict[str, Any]:
    """The parameters of ``params`` the user gave (names in ``given``)."""
    return {k: v for k, v in params.items() if k in given}


def stream_chunk_steps(fragment_steps: int, num_envs: int = 1, bytes_per_step: float | None = None,
                       target_chunk_bytes: float | None = None, chunk_steps: int | None = None) -> int:
    """Env steps per sub-chunk an EnvRunner streams a PPO fragment of ``fragment_steps`` in.

    ``chunk_steps`` (``enable(chunk_steps=...)``) wins as given. Else ``target_chunk_bytes`` (a given
    policy parameter) with ``bytes_per_step`` cuts the fragment into ``ceil(fragment bytes / target)``
    sub-chunks; without them, :data:`DEFAULT_STREAM_PIECES`. The size is rounded up to a multiple of
    ``num_envs`` and kept within ``[num_envs, fragment_steps]``."""
    if fragment_steps < 1 or num_envs < 1:
        raise ValueError(f"fragment_steps and num_envs must be >= 1, got {fragment_steps}, {num_envs}")
    if chunk_steps is not None:
        return int(chunk_steps)
    if target_chunk_bytes is not None and bytes_per_step is not None and bytes_per_step > 0:
        if not 0 < float(target_chunk_bytes) < math.inf:
            raise ValueError(f"target_chunk_bytes must be a finite number > 0, got {target_chunk_bytes!r}")
        pieces = max(1, math.ceil(fragment_steps * float(bytes_per_step) / float(target_chunk_bytes)))
    else:
        pieces = DEFAULT_STREAM_PIECES
    size = max(num_envs, math.ceil(fragment_steps / pieces / num_envs) * num_envs)
    return max(1, min(size, fragment_steps))


def target_chunk_bytes(params: Mapping[str, Any], given: Collection[str]) -> float | None:
    """The policy's ``target_chunk_bytes`` in bytes when given (``"8 MB"`` accepted), else ``None``."""
    if CHUNK_PARAM not in given or params.get(CHUNK_PARAM) is None:
        return None
    from conduit.units import Kind, parse_quantity

    return float(parse_quantity(params[CHUNK_PARAM], Kind.BYTES))


def prefetch_depth(family: str, prioritized: bool = False, option: int | None = None,
                   depth: int | None = None) -> int:
    """Batches fetched ahead of a learner's update: ``option`` (``enable(prefetch_depth=...)``), else
    ``depth`` (a given policy parameter), else enable()'s default for the algorithm family
    (``"replay"``: 2, 1 with a prioritized buffer; ``"on_policy"``/``"async"``: 1)."""
    if option is not None:
        return int(option)
    if depth is not None:
        return int(depth)
    if family == "replay":
        return 1 if prioritized else 2
    return 1


def policy_depth(params: Mapping[str, Any], given: Collection[str]) -> int | None:
    """The policy's ``depth`` when given, else ``None``."""
    if DEPTH_PARAM not in given or params.get(DEPTH_PARAM) is None:
        return None
    return int(params[DEPTH_PARAM])
