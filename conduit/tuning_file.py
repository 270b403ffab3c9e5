"""Tuned-parameter files: what ``conduit tune`` writes and ``conduit sim``/the runtime load.

A small JSON object: ``{"policy": NAME, "params": {...}, ...}``. Loading checks that the file is for
the policy it is used with, so parameters tuned for one policy never silently configure another.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conduit.errors import ConduitError, UnknownNameError, shown

#: the largest tuned-parameter file read (what ``conduit tune`` writes is well under a kilobyte)
MAX_PARAMS_FILE_BYTES = 1 << 20


def load_params(path: str | Path, policy: str | None = None) -> dict[str, Any]:
    """The ``params`` of a tuned-parameter file. With ``policy``, the file must be for that policy and
    the policy must accept the values (a wrong type or an out-of-range value names the file and the
    parameter here, not deep inside a run)."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_PARAMS_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConduitError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConduitError(f"{path}: is a directory, not a tuned-parameter file") from None
    except OSError as exc:
        raise ConduitError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_PARAMS_FILE_BYTES:
        raise ConduitError(f"{path}: larger than {MAX_PARAMS_FILE_BYTES} bytes; not a tuned-parameter file")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConduitError(f"{path}: not UTF-8 text (byte {exc.start}); not a tuned-parameter file") from None
    except json.JSONDecodeError as exc:
        raise ConduitError(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None
    except RecursionError:
        raise ConduitError(f"{path}: JSON nested too deeply; not a tuned-parameter file") from None
    if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
        raise ConduitError(f"{path}: params: missing (expected an object with 'policy' and 'params')")
    if policy is not None and data.get("policy") not in (None, policy):
        raise ConduitError(f"{path}: policy: tuned for {shown(data.get('policy'))}, used with {policy!r}")
    params = dict(data["params"])
    if policy is not None and params:
        _check_values(path, policy, params)
    return params


def _check_values(path: Path, policy: str, params: dict[str, Any]) -> None:
    """Build the policy with ``params`` once, so a bad value is reported against this file."""
    from conduit.registry import create_policy

    try:
        create_policy(policy, **params)
    except UnknownNameError:
        return  # an unknown policy name is the caller's error to report, with the known names
    except ConduitError as exc:
        raise ConduitError(f"{path}: params: {exc}") from None


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
