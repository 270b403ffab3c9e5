"""Conduit under TorchRL 0.14: the plane behind TorchRL's replay buffer and collectors.

>>> from conduit.runtime.torchrl import ConduitReplayBuffer
>>> rb = ConduitReplayBuffer(capacity=100_000, batch_size=256)   # instead of TensorDictReplayBuffer(...)
>>> rb.extend(td); batch = rb.sample()                           # batch["index"]: opaque sample ids

* :mod:`conduit.runtime.torchrl.columns` maps a TensorDict to the plane's columnar schema and back
  (nested keys flattened to column names, zero-copy views where the layout allows);
* :mod:`conduit.runtime.torchrl.replay` is :class:`ConduitReplayBuffer`, a ``TensorDictReplayBuffer``
  whose storage, sampler and priorities are the plane's Replay table (see docs/torchrl.md);
* :mod:`conduit.runtime.torchrl.onpolicy` is :class:`OnPolicyFeed`, the plane between TorchRL's
  multi-process collectors and PPO's loss (OnPolicy / BoundedStaleness batches, GAE's value pass per chunk).

Needs torchrl and tensordict (and torch): ``pip install 'conduit-rl[torchrl]'``. Importing this package
checks that they are installed, without importing them (TorchRL takes seconds to import), and raises a
:class:`~conduit._extras.MissingExtraError` naming the ``[torchrl]`` extra when one is missing; the
submodules are imported on first use of a name.
"""

from __future__ import annotations

import importlib
from typing import Any

from conduit._extras import MissingExtraError, installed

_FEATURE = "Conduit's TorchRL integration (conduit.runtime.torchrl)"
for _module in ("torch", "tensordict", "torchrl"):
    if not installed(_module):
        raise MissingExtraError(_module, _FEATURE, extra="torchrl")

#: public name -> the submodule that defines it (imported on first access)
_LAZY = {
    "TensorDictLayout": "columns",
    "flatten_key": "columns",
    "unflatten_key": "columns",
    "SEPARATOR": "columns",
    "ConduitReplayBuffer": "replay",
    "PlaneStorage": "replay",
    "TorchRLSettingError": "replay",
    "OnPolicyFeed": "onpolicy",
    "FeedError": "onpolicy",
    "example_batch": "onpolicy",
}

__all__ = ["SEPARATOR", "ConduitReplayBuffer", "FeedError", "OnPolicyFeed", "PlaneStorage", "TensorDictLayout",
           "TorchRLSettingError", "example_batch", "flatten_key",
           "unflatten_key"]


def __getattr__(name: str) -> Any:
    sub = _LAZY.get(name)
    if sub is None:
        raise AttributeError(f"module 'conduit.runtime.torchrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"conduit.runtime.torchrl.{sub}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
