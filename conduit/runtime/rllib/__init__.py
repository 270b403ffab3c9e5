"""Conduit under Ray RLlib 2.60 (new API stack): :func:`enable` one config, train as usual.

>>> from conduit.runtime.rllib import enable, shutdown
>>> algo = enable(PPOConfig().environment("CartPole-v1")).build_algo()
>>> result = algo.train()          # result["conduit"]: the plane's metrics and live audit
>>> final_audit = shutdown(algo)

See docs/rllib.md for the design, docs/deployment.md for a cluster, and
:mod:`conduit.runtime.rllib.instrument` for the measurement hooks used by the study.

Needs Ray (RLlib) and torch: ``pip install 'conduit-rl[rllib]'``. Without them, importing this
package raises a :class:`~conduit._extras.MissingExtraError` that says so.
"""

from conduit._extras import require

require("ray", "Conduit's RLlib integration (conduit.runtime.rllib)", extra="rllib")
require("torch", "Conduit's RLlib integration (conduit.runtime.rllib)", extra="rllib")

from conduit.runtime.rllib.callbacks import cluster_of, shutdown
from conduit.runtime.rllib.enable import OPTIONS, enable
from conduit.runtime.rllib.plan import EnableError

__all__ = ["OPTIONS", "EnableError", "cluster_of", "enable", "shutdown"]
