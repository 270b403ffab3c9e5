"""What the runtime benchmarks feed the plane: a PPO-like sample layout and distinct random chunks,
plus the JSON writer they share. Imported as ``_plane_workload`` (``python benchmarks/X.py`` puts
this directory on ``sys.path``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from conduit.runtime.schema import Schema


def make_schema(obs_dim: int) -> Schema:
    """A PPO-like sample: an observation vector and the usual per-step scalars."""
    return Schema.of({
        "obs": ((obs_dim,), np.float32),
        "actions": np.int64,
        "rewards": np.float32,
        "dones": np.uint8,
        "logp": np.float32,
        "values": np.float32,
    })


def make_payloads(schema: Schema, steps: int, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``count`` distinct chunks of ``steps`` samples (distinct memory: no chunk is served from cache
    because the previous one warmed it)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        payload = {}
        for c in schema.columns:
            shape = (steps, *c.shape)
            if c.dtype.kind == "f":
                payload[c.name] = rng.standard_normal(shape, dtype=np.float32).astype(c.dtype, copy=False)
            else:
                payload[c.name] = rng.integers(0, 100, size=shape).astype(c.dtype)
        out.append(payload)
    return out


def write_json(path: str | Path, args: Any, rows: list[dict[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print(f"wrote {path}")
    return path


def pick_device(script: str, dry_run_cpu: bool, device: str, torch: Any) -> str | None:
    """The device a GPU script runs on: ``"cpu"`` for a dry run, else ``device`` when CUDA is there;
    None (after saying why on stderr) when it is not - the script then exits with status 2."""
    import sys

    if dry_run_cpu:
        return "cpu"
    if not torch.cuda.is_available():
        print(f"{script}: no CUDA device (torch.cuda.is_available() is False; torch {torch.__version__}, built with "
              f"CUDA {torch.version.cuda}). Run it on the GPU machine (PYTHONPATH=. python benchmarks/{script}.py), "
              "or use --dry-run-cpu to check the logic.", file=sys.stderr)
        return None
    return device
