"""Tuned-parameter files: what ``conduit tune`` writes and ``conduit sim``/the runtime load.

A small JSON object: ``{"policy": NAME, "params": {...}, ...}``. Loading checks that the file is for
the policy it is used with, so parameters tuned for one policy never silently configure another.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conduit.errors import ConduitError


def load_params(path: str | Path, policy: str | None = None) -> dict[str, Any]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConduitError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ConduitError(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
        raise ConduitError(f"{path}: params: missing (expected an object with 'policy' and 'params')")
    if policy is not None and data.get("policy") not in (None, policy):
        raise ConduitError(f"{path}: policy: tuned for {data.get('policy')!r}, used with {policy!r}")
    return dict(data["params"])


def resolve_params(policy: str | None, params: dict[str, Any] | None = None,
                   params_file: str | Path | None = None) -> dict[str, Any]:
    """The values a policy is built with: a tuned file's (checked to be for ``policy``), then
    ``params`` on top."""
    values = load_params(params_file, policy) if params_file is not None else {}
    values.update(params or {})
    return values


def save_params(path: str | Path, policy: str, params: dict[str, Any], **extra: Any) -> Path:
    path = Path(path)
    path.write_text(json.dumps({"policy": policy, "params": params, **extra}, indent=2) + "\n")
    return path
