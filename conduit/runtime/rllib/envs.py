"""Environments for measuring RLlib's experience path.

:class:`LargeObsEnv` stands in for an Atari-sized workload without the cost of an emulator: its
observations are 84x84x4 ``uint8`` frames (28,224 bytes a step, like a stacked Atari frame), so the
bytes that move through EnvRunner -> driver -> learner are realistic, while a step costs well
under a microsecond of Python (a lookup into a small bank of precomputed random frames, no
rendering, no copies of the frame data).

The reward is learnable but trivial: each frame carries a "cue" (one of the four actions), written
as a bright block in a fixed corner of the frame; choosing the cued action pays +1, anything else
0. A policy that reads the corner earns ``episode_len`` per episode; a random one earns a quarter of
that. Episodes are truncated after ``episode_len`` steps (about 200 by default, jittered by up to 10%
so that episodes from parallel environments do not all end on the same step).

Use it by name after :func:`register_envs` (``config.environment(LARGE_OBS_ENV, env_config={...})``)
or pass the class itself (``config.environment(LargeObsEnv, ...)``); RLlib's EnvRunners import this
module, so no registration is needed on remote workers when the class is passed.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

__all__ = ["CNN_FILTERS", "LARGE_OBS_ENV", "LargeObsEnv", "register_envs", "uint8_cnn", "uint8_obs_module_class"]

#: Name under which :func:`register_envs` registers :class:`LargeObsEnv` with Ray Tune's registry
#: (what ``config.environment("...")`` looks up) and with gymnasium (``gym.make``).
LARGE_OBS_ENV = "ConduitLargeObs-v0"

#: The reference's CNN for 84x84x4 frames, in RLlib 2.60's ``[num_filters, kernel, stride]`` form.
CNN_FILTERS = [[16, 8, 4], [32, 4, 2], [64, 3, 2]]

_DEFAULTS: dict[str, Any] = {
    "obs_shape": (84, 84, 4),
    "episode_len": 200,
    "seed": 0,
    "num_frames": 64,
    "cue_size": 8,
}


class LargeObsEnv(gym.Env):
    """84x84x4 ``uint8`` observations, ``Discrete(4)`` actions, cheap steps, ~200-step episodes.

    ``config`` (a dict, or RLlib's ``EnvContext``, which is one) may set:

    - ``obs_shape`` (default ``(84, 84, 4)``): the observation shape; the last axis is channels;
    - ``episode_len`` (default 200): nominal episode length; each episode is truncated after
      ``episode_len`` +/- 10% steps (``episode_len`` exactly when ``jitter`` is False);
    - ``seed`` (default 0): seeds the frame bank and the cue sequence; RLlib's ``worker_index`` and
      ``vector_index`` (when present) are mixed in so parallel copies differ;
    - ``num_frames`` (default 64): size of the precomputed frame bank (memory: ``num_frames`` x 4
      cues x frame bytes, 7.2 MB at the defaults);
    - ``cue_size`` (default 8): side of the square block that encodes the cued action;
    - ``jitter`` (default True): vary the episode length by up to 10%.
    """

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, config: dict | None = None):
        cfg = dict(_DEFAULTS)
        cfg.update(dict(config or {}))
        self.obs_shape = tuple(int(x) for x in cfg["obs_shape"])
        if len(self.obs_shape) != 3 or min(self.obs_shape) <= 0:
            raise ValueError(f"LargeObsEnv: obs_shape must be (H, W, C) with positive sizes, got {self.obs_shape}")
        self.episode_len = int(cfg["episode_len"])
        if self.episode_len <= 0:
            raise ValueError(f"LargeObsEnv: episode_len must be positive, got {self.episode_len}")
        self.jitter = bool(cfg.get("jitter", True))
        num_frames = int(cfg["num_frames"])
        cue = int(cfg["cue_size"])
        h, w, _ = self.obs_shape
        cue = max(1, min(cue, h, w))
        seed = int(cfg["seed"])
        # RLlib's EnvContext carries the worker and vector index; mix them in so copies differ.
        worker = int(getattr(config, "worker_index", 0) or 0)
        vector = int(getattr(config, "vector_index", 0) or 0)
        self._base_seed = seed * 1_000_003 + worker * 1_009 + vector

        self.observation_space = gym.spaces.Box(0, 255, shape=self.obs_shape, dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(4)

        # Frame bank: bank[k, a] is random frame k with the cue for action a painted in the corner
        # (a block of value 64 * a + 32 in every channel), so the cue is the only signal.
        rng = np.random.default_rng(seed)
        noise = rng.integers(0, 256, size=(num_frames, *self.obs_shape), dtype=np.uint8)
        self._bank = np.repeat(noise[:, None], 4, axis=1)
        for a in range(4):
            self._bank[:, a, :cue, :cue, :] = np.uint8(64 * a + 32)
        self._bank.setflags(write=False)

        self._rng = np.random.default_rng(self._base_seed)
        self._t = 0
        self._limit = self.episode_len
        self._cue = 0

    # -- gymnasium API ---------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        if self.jitter:
            spread = max(1, self.episode_len // 10)
            self._limit = int(self.episode_len + self._rng.integers(-spread, spread + 1))
            self._limit = max(1, self._limit)
        else:
            self._limit = self.episode_len
        return self._observe(), {}

    def step(self, action):
        reward = 1.0 if int(action) == self._cue else 0.0
        self._t += 1
        truncated = self._t >= self._limit
        return self._observe(), reward, False, truncated, {}

    # -- internals -------------------------------------------------------------------------------
    def _observe(self) -> np.ndarray:
        self._cue = int(self._rng.integers(0, 4))
        k = int(self._rng.integers(0, self._bank.shape[0]))
        # A read-only view into the bank: no per-step copy. RLlib copies into its episode buffers.
        return self._bank[k, self._cue]


def register_envs() -> str:
    """Registers :class:`LargeObsEnv` as :data:`LARGE_OBS_ENV` with Ray Tune and gymnasium.

    Idempotent. Returns the name. Call it in the driver before building a config that names the
    env; remote EnvRunners receive the registration through Ray's function store.
    """
    from ray.tune.registry import register_env

    register_env(LARGE_OBS_ENV, lambda cfg: LargeObsEnv(cfg))
    if LARGE_OBS_ENV not in gym.registry:
        gym.register(id=LARGE_OBS_ENV, entry_point=f"{__name__}:LargeObsEnv")
    return LARGE_OBS_ENV


# ------------------------------------------------------------------------------------------------
# uint8 observations in RLlib's default CNN
# ------------------------------------------------------------------------------------------------
def _cast_uint8_input(module, args):
    """Forward pre-hook: ``uint8`` input -> ``float32`` in [0, 1] (other inputs pass untouched)."""
    x = args[0] if args else None
    if x is not None and getattr(x, "dtype", None) is not None and str(x.dtype) == "torch.uint8":
        return (x.float().mul_(1.0 / 255.0), *args[1:])
    return None


_MODULE_CLASSES: dict[type, type] = {}


def uint8_obs_module_class(base: type) -> type:
    """``base`` (an RLlib torch RLModule class) whose CNN stacks accept ``uint8`` observations.

    RLlib 2.60's default CNN encoder (``TorchCNNEncoder``) feeds observations to ``nn.Conv2d`` as
    they come, so ``uint8`` frames fail ("Input type (unsigned char) and bias type (float) should be
    the same"). The subclass registers a forward pre-hook on every ``TorchCNN`` block after
    ``setup()`` that casts ``uint8`` input to ``float32`` (scaled to [0, 1]) *inside the model*, so the
    EnvRunner -> driver -> learner path and the learner batch stay ``uint8`` (4x fewer bytes).
    """
    cls = _MODULE_CLASSES.get(base)
    if cls is None:

        def setup(self):
            base.setup(self)
            for m in self.modules():
                if type(m).__name__ == "TorchCNN":
                    m.register_forward_pre_hook(_cast_uint8_input)

        name = f"Uint8Obs{base.__name__}"
        cls = type(base)(name, (base,), {"setup": setup, "__module__": __name__, "__qualname__": name})
        _MODULE_CLASSES[base] = cls
    return cls


def uint8_cnn(config, conv_filters=None, **model_config):
    """Configures ``config`` (an RLlib ``AlgorithmConfig``) for uint8 image observations.

    Sets the default model's ``conv_filters`` (default :data:`CNN_FILTERS`) plus any other
    ``DefaultModelConfig`` fields given, and swaps the algorithm's default RLModule class for
    :func:`uint8_obs_module_class` of it. Returns ``config``.
    """
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    base = config.get_default_rl_module_spec().module_class
    model = DefaultModelConfig(conv_filters=conv_filters or CNN_FILTERS, **model_config)
    return config.rl_module(model_config=model, rl_module_spec=RLModuleSpec(module_class=uint8_obs_module_class(base)))
