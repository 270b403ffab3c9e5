"""The plane in RLlib checkpoints: a ``Checkpointable`` component of the Conduit learner.

RLlib 2.60's new API stack saves an algorithm as a tree of ``Checkpointable`` components
(``ray/rllib/utils/checkpoints.py``: ``Checkpointable.save_to_path`` writes each component of
``get_checkpointable_components()`` into its own sub-directory, ``restore_from_path`` reads them
back; ``Algorithm.save()``/``save_to_path()``, ``Algorithm.from_checkpoint()`` and
``restore()``/``restore_from_path()`` all go through it). The driver-side replay buffer is *not*
one of those components on the new stack: ``store_buffer_in_checkpoints`` is read only by the old
stack's ``Algorithm.__getstate__``/``__setstate__`` (``algorithms/algorithm.py``), so stock RLlib
2.60 checkpoints no replay data on the new stack.

Conduit's learner class (:mod:`conduit.runtime.rllib.learner`) adds one component,
:data:`COMPONENT` (``learner_group/learner/conduit_plane/``), a :class:`PlaneState`. Its state is
the plane's snapshot (:meth:`PlaneCluster.snapshot <conduit.runtime.ray_plane.PlaneCluster.snapshot>`):
the Replay table when the config's ``store_buffer_in_checkpoints`` is True (DQN/SAC; the table's
samples are counted as dropped at the checkpoint otherwise), the rate limiter, the audit and the
policy version. On disk each table column is one ``.npy`` file (the tiers' bytes as they are) and
the rest one pickle. Restoring loads it into the new algorithm's plane (which must be fresh:
build the algorithm, then restore, or use ``Algorithm.from_checkpoint``).
"""

from __future__ import annotations

import io
import json
import pathlib
import pickle
from typing import Any

import numpy as np
from ray.rllib.utils.checkpoints import Checkpointable

COMPONENT = "conduit_plane"
STATE_FILE = "plane_state.pkl"
COLUMNS_DIR = "columns"
#: seconds a checkpoint that carries the Replay table may take to leave or reach the plane (the whole table
#: crosses Ray's object store: far longer than a control call's ``call_timeout``)
TABLE_TIMEOUT_S = 3600.0


class PlaneState(Checkpointable):
    """The plane's checkpoint component, owned by a Conduit learner (see the module doc)."""

    def __init__(self, learner: Any):
        self._learner = learner

    def get_state(self, components: Any = None, *, not_components: Any = None, **kwargs: Any) -> dict[str, Any]:
        learner = self._learner
        cluster = getattr(learner, "_cd_cluster", None)
        if cluster is None:
            return {}
        table = bool(getattr(learner.config, "store_buffer_in_checkpoints", False))
        return {"planes": cluster.snapshot(table=table, timeout=TABLE_TIMEOUT_S if table else None), "table": table}

    def set_state(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self._learner.conduit_restore(state)

    def get_ctor_args_and_kwargs(self) -> tuple[tuple, dict[str, Any]]:
        return (), {}

    def get_checkpointable_components(self) -> list:
        return []

    # ------------------------------------------------------------------ files: columns as .npy, the rest pickled
    def save_to_path(self, path: Any = None, *, state: dict[str, Any] | None = None, filesystem: Any = None,
                     use_msgpack: bool = False) -> str:
        import pyarrow.fs

        state = self.get_state() if state is None else state
        path = path if isinstance(path, str) else pathlib.Path(path).as_posix()
        if filesystem is None:
            filesystem, path = pyarrow.fs.FileSystem.from_uri(path)
        root = pathlib.Path(path)
        filesystem.create_dir(root.as_posix(), recursive=True)
        rest = {"table": state.get("table"), "planes": {}}
        for key, snap in (state.get("planes") or {}).items():
            snap = dict(snap)
            tab = snap.get("table")
            if tab is not None:
                d = root / COLUMNS_DIR / _safe(key)
                filesystem.create_dir(d.as_posix(), recursive=True)
                for name, arr in tab["columns"].items():
                    buf = io.BytesIO()
                    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
                    with filesystem.open_output_stream((d / f"{name}.npy").as_posix()) as f:
                        f.write(buf.getvalue())
                snap["table"] = {"chunks": tab["chunks"], "columns": sorted(tab["columns"])}
            rest["planes"][key] = snap
        with filesystem.open_output_stream((root / STATE_FILE).as_posix()) as f:
            pickle.dump(rest, f)
        with filesystem.open_output_stream((root / self.METADATA_FILE_NAME).as_posix()) as f:
            f.write(json.dumps({"type": "ConduitPlaneState", "table": rest["table"]}).encode())
        return str(root)

    @staticmethod
    def load(path: Any, filesystem: Any = None) -> dict[str, Any]:
        """The state :meth:`save_to_path` wrote under ``path``."""
        import pyarrow.fs

        path = path if isinstance(path, str) else pathlib.Path(path).as_posix()
        if filesystem is None:
            filesystem, path = pyarrow.fs.FileSystem.from_uri(path)
        root = pathlib.Path(path)
        with filesystem.open_input_stream((root / STATE_FILE).as_posix()) as f:
            state = pickle.load(f)
        for key, snap in state["planes"].items():
            tab = snap.get("table")
            if tab is not None:
                cols = {}
                for name in tab["columns"]:
                    with filesystem.open_input_stream((root / COLUMNS_DIR / _safe(key) / f"{name}.npy").as_posix()) as f:
                        cols[name] = np.load(io.BytesIO(f.read()), allow_pickle=False)
                snap["table"] = {"chunks": tab["chunks"], "columns": cols}
        return state

    def restore_from_path(self, path: Any, *, component: str | None = None, filesystem: Any = None,
                          **kwargs: Any) -> None:
        self.set_state(self.load(path, filesystem))


def _safe(key: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in key) or "plane"
