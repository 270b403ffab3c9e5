"""What each :class:`~conduit.sim.workload.Workload` field means, its unit and its plausible range.

This module is the single source for ``docs/workload-format.md`` (its generated tables),
``conduit workload show`` and the ``--set`` / ``--grid`` overrides of ``conduit sim`` and ``conduit sweep``:

* :data:`FIELD_INFO`: unit and meaning of every field (a test checks it covers the dataclass);
* :data:`~conduit.sim.workload_bounds.BOUNDS` and :func:`~conduit.sim.workload_bounds.check_bounds`: values that are refused (the simulator cannot represent
  them in bounded memory and time) or merely warned about (``logging.getLogger("conduit")``);
* :func:`coerce_field` / :func:`apply_overrides`: ``key=value`` text typed by the field's type, unknown
  keys refused with a did-you-mean;
* :func:`preset_table` / :func:`field_table` / :func:`bounds_table`: the Markdown blocks of the doc.
  ``python -m conduit.sim.workload_fields docs/workload-format.md`` rewrites them in place.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import MISSING, fields, replace
from typing import Any

from conduit.errors import ConduitError
from conduit.sim.workload import _BYTE_FIELDS, _TIME_FIELDS, PRESETS, Workload, WorkloadError
from conduit.sim.workload_bounds import BOUNDS, show_bound
from conduit.units import Kind, format_quantity, parse_quantity

#: field -> (unit, meaning). Units: ``s`` seconds, ``B`` bytes (both also accept unit strings such
#: as ``"2 ms"`` or ``"28 KiB"``); a *sample* is one environment step of one environment.
FIELD_INFO: dict[str, tuple[str, str]] = {
    "name": ("text", "the workload's name, shown in results"),
    "algorithm": ("ppo / appo / dqn", ("which training loop and data contract: `ppo` OnPolicy (synchronous), "
                  "`appo` BoundedStaleness (asynchronous), `dqn` Replay")),
    # actors
    "envs_per_runner": ("environments", "environments one env runner steps together (one *vector step*)"),
    "runners_per_gpu": ("runners per GPU", ("env runners per GPU; a fraction means one runner per several GPUs "
                        "(`0.125`: one per 8-GPU node). Ignored when `env_runners` is set or the topology has no GPU")),
    "env_runners": ("runners", ("total env runners; overrides `runners_per_gpu`. Unset (`null`): "
                    "`runners_per_gpu` x GPUs, or one per node on a topology without GPUs")),
    "env_step_time": ("s per vector step", "mean time to step all of a runner's environments once (in series)"),
    "env_step_cv": ("ratio", "coefficient of variation of `env_step_time` (lognormal); 0 = deterministic"),
    "inference_time": ("s per vector step", "the runner's policy forward pass for one vector step"),
    "runner_call_overhead": ("s per fragment", "fixed cost of one `sample()` call on a runner (one fragment)"),
    "runner_metrics_time": ("s per sample() call", ("RLlib's work on the runner after `sample()` returns, before "
                            "the call's reply: `get_metrics()` (APPO: and `get_state`); on the experience path")),
    "fragment_length": ("vector steps", ("vector steps per fragment; a chunk holds "
                        "`fragment_length * envs_per_runner` samples")),
    "bytes_per_step": ("B per sample", ("size of one sample (observation, action, reward, ...); "
                       "the default is an Atari step: 84x84x4 uint8 frames + 17 B")),
    "episode_length": ("samples per episode", "sets the episodes per chunk, which (de)serialization pays for"),
    "steps_per_row": ("samples per row", ("samples per batch row; per-row batch building costs are per row "
                      "(1 for control tasks, a whole sequence for LLM post-training)")),
    "frame_stack": ("frames", ("frames stacked by the learner connector (RLlib `FrameStackingLearner`, as in "
                    "its Atari recipes): `bytes_per_step` crosses the wire, the batch built on the learner is "
                    "`frame_stack` times larger; 1 = no learner-side stacking")),
    # learners
    "learners": ("learners", "number of learners; unset (`null`): one per GPU, or 1 on a topology without GPUs"),
    "local_learner": ("true / false", "the learner runs in the driver process (RLlib `num_learners=0`)"),
    "learner_threads": ("threads", ("torch intra-op threads of a local learner (the driver's process: Ray sets "
                        "`OMP_NUM_THREADS=1` only in its workers); above 1 the extra threads take cores of the "
                        "driver's node (`conduit calibrate`: `torch_team`)")),
    "learner_spin_s": ("s per region", ("CPU time each extra torch thread of a local learner spin-waits after "
                       "an update before it sleeps (libgomp), unless the next update starts first")),
    "sync_spin_s": ("s per weight sync", ("DQN with a local learner's torch team: the extra threads' spin after the "
                    "weight sync's `set_state` on the driver's local EnvRunner (a parallel copy of the new weights); "
                    "0: that sync starts no region")),
    "learner_thread_share": ("ratio", "share of an update's wall time each extra torch thread is on a CPU"),
    "update_time_per_sample": ("s per sample per epoch", "learner compute for one sample in one epoch, on its device"),
    "update_overhead": ("s per update", "fixed learner cost per update"),
    "value_pass_per_sample": ("s per sample", ("PPO's GAE value forward pass (GRPO's reference log-prob pass) per "
                              "sample, on the learner's device; Conduit streams it while the runners sample")),
    "stream_value_pass_per_sample": ("s per sample", ("PPO under the deployed Conduit: the value forward pass per "
                                     "sample on the ValueStream's pieces (a few hundred rows, whose activations "
                                     "the allocator reuses instead of faulting in afresh as a whole batch's); unset "
                                     "(`null`): `value_pass_per_sample`")),
    "advantage_per_sample": ("s per sample", ("the rest of PPO's GAE piece per sample (bootstrap rows, value "
                             "targets, advantages), on the learner's CPU thread: stock right after the forward "
                             "pass, Conduit's streamed GAE at update start")),
    "epochs": ("passes", "passes over the train batch per update (PPO)"),
    "train_batch_per_learner": ("samples per learner", ("PPO: samples each learner trains on per update; "
                                "at least one chunk")),
    "weight_sync_time": ("s per broadcast", ("one weight broadcast from learners to runners; DQN: the driver's "
                         "work in `sync_weights` (the learner's `get_state`, `ray.put` of the state, the local "
                         "EnvRunner's `set_state`), on its thread")),
    "weight_set_time": ("s per broadcast", ("DQN: each EnvRunner's `set_state` of a broadcast state, on its own "
                        "thread before its next `sample()` (Ray runs an actor's calls in order); the call's "
                        "dispatch and the state's `ray.get` are added from the stock costs")),
    # appo
    "max_lag": ("policy versions", "APPO: largest policy-version lag a trained-on chunk may have (BoundedStaleness)"),
    "max_reuse": ("uses", "APPO: times one chunk may be trained on"),
    "chunks_per_batch": ("chunks", "APPO: chunks per learner update"),
    "broadcast_interval": ("updates", "APPO / DQN: learner updates between two weight broadcasts"),
    # dqn
    "replay_capacity": ("samples", "DQN: replay buffer capacity"),
    "replay_ratio": ("sampled / inserted", "DQN: samples trained on per sample inserted"),
    "min_size": ("samples", "DQN: samples in the buffer before training starts"),
    "batch_size": ("samples", "DQN: samples per learner update"),
    "steps_per_train": ("samples", ("kept for YAML compatibility; the simulator does not read it "
                        "(`replay_ratio` sets the training rate)")),
    "prioritized_replay": ("true / false", ("DQN: the buffer is prioritized (RLlib's `PrioritizedEpisodeReplayBuffer`, "
                           "DQN's default): stock updates priorities after each update; `enable()` deploys a "
                           "prioritized plane table, fetches one batch ahead and sends each update's TD errors "
                           "to the plane before the next draw")),
}

#: derived quantities ``conduit workload show`` prints, with their unit
DERIVED = {
    "chunk_steps": "samples per chunk (`fragment_length * envs_per_runner`)",
    "chunk_bytes": "B per chunk (`chunk_steps * bytes_per_step`)",
    "chunk_episodes": "episodes per chunk (`max(1, chunk_steps / episode_length)`)",
}


# -- overrides ---------------------------------------------------------------------------------------
FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Workload))
_TYPES = {f.name: f.type for f in fields(Workload)}


def unknown_field(key: str, source: str) -> WorkloadError:
    close = difflib.get_close_matches(key, FIELD_NAMES, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else "; see 'conduit workload show ppo' for the fields"
    return WorkloadError(source, _bounded(key), "unknown workload field" + hint)


def _bounded(text: Any, limit: int = 60) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


def coerce_field(key: str, value: Any, source: str = "--set") -> Any:
    """``value`` (text from a command line, or already typed) as the type of field ``key``."""
    if key not in _TYPES:
        raise unknown_field(key, source)
    if not isinstance(value, str):
        return value
    text = value.strip()
    kind = _TYPES[key]

    def bad(expected: str) -> WorkloadError:
        return WorkloadError(source, key, f"expected {expected}, got {_bounded(value)!r}")

    if "None" in kind and text.lower() in ("none", "null", ""):
        return None
    if key in _TIME_FIELDS or key in _BYTE_FIELDS:
        try:
            return parse_quantity(text, Kind.TIME if key in _TIME_FIELDS else Kind.BYTES)
        except ConduitError as exc:
            raise WorkloadError(source, key, str(exc)) from None
    if kind == "bool":
        lowered = text.lower()
        if lowered in ("true", "yes", "on", "1"):
            return True
        if lowered in ("false", "no", "off", "0"):
            return False
        raise bad("true or false")
    if kind == "str":
        return text
    if "None" in kind and text.lower() in ("none", "null", ""):
        return None
    try:
        number = float(text)
    except ValueError:
        raise bad("an integer" if kind.startswith("int") else "a number") from None
    if not math.isfinite(number):
        raise bad("a finite number")
    if kind.startswith("int"):
        if not number.is_integer():
            raise bad("an integer")
        return int(number)
    return number


def apply_overrides(workload: Workload, overrides: Mapping[str, Any] | None,
                    source: str = "--set", where: str | None = None) -> Workload:
    """``workload`` with fields replaced (values typed by :func:`coerce_field`), then validated;
    errors name ``where`` (default: the workload and the overrides)."""
    if not overrides:
        return workload
    values = {key: coerce_field(key, value, source) for key, value in overrides.items()}
    label = ", ".join(f"{k}={_bounded(v, 30)}" for k, v in overrides.items())
    return replace(workload, **values).validate(where or f"workload {workload.name} with {source} {label}")


def parse_assignments(items: list[str] | None, option: str = "--set") -> dict[str, str]:
    """``["key=value", ...]`` as a dict; a missing ``=`` or a repeated key is an error."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConduitError(f"{option} {_bounded(item)!r}: expected KEY=VALUE, e.g. {option} runners_per_gpu=4")
        if key in out:
            raise ConduitError(f"{option}: {key!r} given twice")
        out[key] = value
    return out


# -- describing workloads --------------------------------------------------------------------------
def default_of(name: str) -> Any:
    f = next(f for f in fields(Workload) if f.name == name)
    return None if f.default is MISSING else f.default


def resolved(workload: Workload) -> dict[str, Any]:
    """Every field's value, plus the derived chunk quantities."""
    out = workload.to_dict()
    out.update(chunk_steps=workload.chunk_steps, chunk_bytes=workload.chunk_bytes,
               chunk_episodes=workload.chunk_episodes)
    return out


def format_value(name: str, value: Any) -> str:
    """A field's value for people: exact bytes and times with a unit, integers with separators."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float | int) and name in _TIME_FIELDS:
        return _time(float(value))
    if isinstance(value, float | int) and (name in _BYTE_FIELDS or name == "chunk_bytes"):
        if value < 2**20:
            return f"{value:,.0f} B" if float(value).is_integer() else f"{value:g} B"
        return format_quantity(value, Kind.BYTES)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _time(seconds: float) -> str:
    if seconds == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds:g} s"


# -- the doc's generated tables --------------------------------------------------------------------
def field_table() -> str:
    rows = ["| field | unit | default | meaning |", "| --- | --- | --- | --- |"]
    for name in FIELD_NAMES:
        unit, meaning = FIELD_INFO[name]
        default = "required" if name in ("name", "algorithm") else f"`{format_value(name, default_of(name))}`"
        rows.append(f"| `{name}` | {unit} | {default} | {meaning} |")
    return "\n".join(rows)


def preset_table() -> str:
    names = list(PRESETS)
    rows = ["| field | " + " | ".join(f"`{n}`" for n in names) + " |", "| --- |" + " ---: |" * len(names)]
    for name in (*FIELD_NAMES[1:], *DERIVED):
        cells = []
        for preset in names:
            value = resolved(PRESETS[preset])[name]
            text = format_value(name, value)
            same = name in FIELD_NAMES and value == default_of(name)
            cells.append(text if same else f"**{text}**")
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def bounds_table() -> str:
    rows = ["| field | warned about | refused | why |", "| --- | --- | --- | --- |"]
    for b in BOUNDS:
        warn = []
        if b.warn_above is not None:
            warn.append(f"> {show_bound(b.field, b.warn_above)}")
        if b.warn_below is not None:
            warn.append(f"< {show_bound(b.field, b.warn_below)}")
        refuse = f"> {show_bound(b.field, b.refuse_above)}" if b.refuse_above is not None else "—"
        rows.append(f"| `{b.field}` | {' or '.join(warn)} | {refuse} | {b.why} |")
    return "\n".join(rows)


BLOCKS = {"fields": field_table, "presets": preset_table, "bounds": bounds_table}


def render_doc(text: str) -> str:
    """``text`` with each ``<!-- generated:NAME -->`` ... ``<!-- end:NAME -->`` block regenerated."""
    for name, make in BLOCKS.items():
        begin, end = f"<!-- generated:{name} -->", f"<!-- end:{name} -->"
        head, sep, rest = text.partition(begin)
        if not sep:
            raise ConduitError(f"marker {begin} missing")
        _, sep, tail = rest.partition(end)
        if not sep:
            raise ConduitError(f"marker {end} missing")
        text = f"{head}{begin}\n{make()}\n{end}{tail}"
    return text


if __name__ == "__main__":  # pragma: no cover - regenerate the doc's tables
    import sys
    from pathlib import Path

    doc = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/workload-format.md")
    doc.write_text(render_doc(doc.read_text()))
    print(f"rewrote the generated tables of {doc}")
