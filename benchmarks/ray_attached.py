"""What attaching to a running Ray does to a workload primitive's cost, side by side with the same primitive
timed detached (issue 13: PPO large-obs' exposed latency predicted 39-46% short).

Every piece of a real run executes in a process attached to a running Ray: the EnvRunners and remote learners
are Ray actors, a local learner is the driver. The calibration used to time the workload primitives in a
process without Ray, and times them attached now. This times PPO's learner pieces the way the calibration does
(:func:`conduit.runtime.calibrate._ppo_learner_iteration`: fresh episodes of ``--steps`` env steps sampled
before each round, not timed; RLlib's ``GeneralAdvantageEstimation`` piece inside the learner's own connector
pipeline; then ``Learner.update`` on the batch it built, with the config's minibatches and epochs; one torch
thread) in one process, in alternating blocks of ``--rounds`` rounds detached and attached
(:func:`conduit.runtime.calibrate.attached_ray`, started and shut down around each attached block), plus a
control: a bare loop that faults in ``--touch-mb`` MB of fresh 4 KiB pages and unmaps them. Per piece: the
median wall time, thread CPU and system time, and the page faults, detached and attached, and their ratio.

On the 2-core VM (AMD EPYC host, otherwise idle), ``ppo-largeobs-1r-1l`` (2,000 steps of 84x84x4 uint8), 2026-12-07:

| when (UTC) | how | GAE piece detached | attached | update call detached / attached |
|---|---|---:|---:|---:|
| 15:20-15:30 | ``/work/runs`` probes, three experiments, alternating | 0.52-0.61 s | 0.71-1.34 s (median 0.82-0.95) | 1.89 / 1.82 s |
| 16:01 | this script, 2 x 3 rounds | 0.533 s | 0.533 s (1.00x) | 1.694 / 1.737 s |
| 16:03 | the 15:25 probe again | 0.53 s | 0.53 s | 1.73 / 1.71 s |

The control did not move in any of them (0.40 s per 512 MB). The real learner actor's GAE piece took 0.97-1.27 s in the
runs of four validation windows and 0.55-1.24 s in a probe at 16:04 (wall equal to its thread's CPU, the extra all
system time on the same ~190 thousand page faults; the same piece rerun in that actor after the run: 0.52-0.86 s). So
attachment is not, on its own, what makes the run's piece dearer. What does (found later that day): the VM hands freed
memory back to its host, and a call that faults in pages the host took back pays for them
(:mod:`conduit.runtime.pagereport`); a real run's other processes free much of it while its learner waits, which
``benchmarks/episode_source.py`` measures. The calibration times its workload primitives attached all the
same, as the run executes them; this script is the check.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/ray_attached.py [--workload ppo-largeobs-1r-1l]
        [--steps N] [--cycles 2] [--rounds 3] [--touch-mb 512] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT, ROOT / "studies"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

#: the pieces, in the order printed
PIECES = ("gae piece", "update call", "fresh pages (control)")
MODES = ("detached", "attached")


def _clock() -> tuple[float, float, float, int]:
    """(wall, thread CPU, thread system time, thread minor faults) now."""
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return time.perf_counter(), time.thread_time(), r.ru_stime, r.ru_minflt


def _since(t0: tuple[float, float, float, int]) -> dict[str, float]:
    t1 = _clock()
    return {"wall_s": t1[0] - t0[0], "cpu_s": t1[1] - t0[1], "sys_s": t1[2] - t0[2], "faults": float(t1[3] - t0[3])}


def touch_fresh_pages(mb: int) -> dict[str, float]:
    """Faults in ``mb`` MB of fresh anonymous 4 KiB pages (one write per page, eight mappings) and unmaps them:
    the control, a page fault with nothing else around it."""
    t0 = _clock()
    size = max(1, mb) * 2**20 // 8
    for _ in range(8):
        with mmap.mmap(-1, size) as m:
            pages = np.frombuffer(m, dtype=np.uint8)
            pages[::4096] = 1
            del pages  # the mapping cannot close while an array holds it
    return _since(t0)


class PpoPieces:
    """PPO's learner pieces on fresh episodes, as the calibration times them (one torch thread)."""

    def __init__(self, workload: str, steps: int | None):
        import argparse as _argparse

        import rllib_experience_path as study
        from ray.rllib.connectors.learner.general_advantage_estimation import GeneralAdvantageEstimation

        from conduit.runtime.calibrate import _local_env_runner

        found = [w for w in study.WORKLOADS if w.name == workload]
        if not found or found[0].algo != "ppo":
            names = ", ".join(w.name for w in study.WORKLOADS if w.algo == "ppo")
            raise SystemExit(f"--workload: {workload!r} is not one of the study's PPO workloads ({names})")
        cfg = found[0].build(_argparse.Namespace(dqn_steps=250, appo_iter_s=1.0))
        self.cfg = cfg.copy(copy_frozen=False).learners(num_learners=0)
        self.steps = int(steps or self.cfg.train_batch_size_per_learner)
        self.minibatch = min(self.steps, int(self.cfg.minibatch_size or self.steps))
        self.runner = _local_env_runner(self.cfg)
        self.learner = self.cfg.build_learner(env=self.runner.env)
        self._gae: list[dict[str, float]] = []
        original = GeneralAdvantageEstimation.__call__
        clocks = self._gae

        def timed(piece, **kwargs):
            t0 = _clock()
            try:
                return original(piece, **kwargs)
            finally:
                clocks.append(_since(t0))

        self._restore = lambda: setattr(GeneralAdvantageEstimation, "__call__", original)
        GeneralAdvantageEstimation.__call__ = timed

    def round(self) -> dict[str, dict[str, float]]:
        """The pieces on fresh episodes this process samples."""
        return self.round_on(self.runner.sample(num_timesteps=self.steps, random_actions=False))

    def round_on(self, episodes) -> dict[str, dict[str, float]]:
        """The GAE piece and the update call on ``episodes`` (wherever they were sampled)."""
        from ray.rllib.core.learner.training_data import TrainingData
        from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

        self._gae.clear()
        built = self.learner._make_batch_if_necessary(TrainingData(episodes=episodes))
        if len(self._gae) != 1:
            raise RuntimeError(f"the learner connector ran GeneralAdvantageEstimation {len(self._gae)} times")
        t0 = _clock()
        self.learner.update(batch=built, minibatch_size=self.minibatch, num_epochs=max(1, int(self.cfg.num_epochs)),
                            timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 10**6},
                            shuffle_batch_per_epoch=bool(getattr(self.cfg, "shuffle_batch_per_epoch", True)))
        return {"gae piece": self._gae[0], "update call": _since(t0)}

    def close(self) -> None:
        self._restore()
        self.runner.stop()


def summarise(rows: Sequence[Mapping[str, object]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{piece: {mode: {figure: median}, "ratio": {figure: attached / detached}}}`` from rows
    ``{"mode", "piece", "wall_s", "cpu_s", "sys_s", "faults"}``; a ratio over a zero median is NaN."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for piece in PIECES:
        mine = [r for r in rows if r["piece"] == piece]
        if not mine:
            continue
        entry: dict[str, dict[str, float]] = {}
        for mode in MODES:
            got = [r for r in mine if r["mode"] == mode]
            if got:
                entry[mode] = {k: statistics.median(float(r[k]) for r in got) for k in ("wall_s", "cpu_s", "sys_s",
                                                                                           "faults")}
                entry[mode]["n"] = float(len(got))
        if all(m in entry for m in MODES):
            entry["ratio"] = {k: (entry["attached"][k] / entry["detached"][k] if entry["detached"][k] > 0
                                  else float("nan")) for k in ("wall_s", "cpu_s", "sys_s")}
        out[piece] = entry
    return out


def format_report(summary: Mapping[str, Mapping[str, Mapping[str, float]]], head: str) -> str:
    lines = [head, "",
             "| piece | detached wall (CPU / sys) | attached wall (CPU / sys) | attached / detached | faults |",
             "|---|---:|---:|---:|---:|"]
    for piece, entry in summary.items():
        def cell(mode: str, entry: Mapping = entry) -> str:
            m = entry.get(mode)
            return "" if m is None else f"{m['wall_s']:.3f} s ({m['cpu_s']:.3f} / {m['sys_s']:.3f})"
        ratio = entry.get("ratio", {}).get("wall_s")
        faults = " / ".join(f"{entry[m]['faults']:.0f}" for m in MODES if m in entry)
        lines.append(f"| {piece} | {cell('detached')} | {cell('attached')} | "
                     f"{'' if ratio is None else f'{ratio:.2f}x'} | {faults} |")
    lines.append("")
    lines.append("Medians over the rounds; wall time of the piece, its thread's CPU and system time, its minor page "
                 "faults (detached / attached).")
    return "\n".join(lines)


def measure(pieces: Callable[[], dict[str, dict[str, float]]] | None, cycles: int, rounds: int, touch_mb: int,
            attached: Callable[[], object], log: Callable[[str], None] = print) -> list[dict[str, object]]:
    """``cycles`` x (a detached block, an attached block), each ``rounds`` rounds of ``pieces()`` (None: the
    control only) and one control; returns one row per piece per round."""
    rows: list[dict[str, object]] = []

    def block(mode: str) -> None:
        for _ in range(rounds):
            got = pieces() if pieces is not None else {}
            got["fresh pages (control)"] = touch_fresh_pages(touch_mb)
            for piece, fig in got.items():
                rows.append({"mode": mode, "piece": piece, **fig})
                log(f"  {mode:8s} {piece:22s} wall {fig['wall_s']:.3f} s  cpu {fig['cpu_s']:.3f}  sys "
                    f"{fig['sys_s']:.3f}  faults {fig['faults']:.0f}")

    for _ in range(cycles):
        block("detached")
        with attached():
            time.sleep(1.0)  # Ray's own start-up work over
            block("attached")
    return rows


def _positive(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, got {value}")
        return value
    return parse


def piece_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every PPO-piece benchmark takes (``--workload``, ``--steps``, ``--json``); a script adds
    its own and reads them with :func:`parse_piece_args`."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="ppo-largeobs-1r-1l", help="a PPO workload of the study")
    parser.add_argument("--steps", type=_positive("--steps"), default=None,
                        help="env steps per round (default: the workload's train batch)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows and the summary here")
    return parser


def parse_piece_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser``'s arguments, a ``--json`` whose directory does not exist refused by name; Ray's token auth off
    for the Ray the benchmark starts."""
    args = parser.parse_args(argv)
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json: directory {args.json.parent} does not exist")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    return args


def write_json(args: argparse.Namespace, started: str, rows: Sequence[Mapping[str, object]],
               summary: Mapping[str, object]) -> None:
    """The run's arguments, start, rows and summary to ``--json`` (nothing without it)."""
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "started_utc": started,
                                         "rows": list(rows), "summary": summary}, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = piece_parser(__doc__)
    parser.add_argument("--cycles", type=_positive("--cycles"), default=2, help="detached/attached block pairs")
    parser.add_argument("--rounds", type=_positive("--rounds"), default=3, help="rounds per block")
    parser.add_argument("--touch-mb", type=_positive("--touch-mb"), default=512, help="the control's fresh MB")
    parser.add_argument("--control-only", action="store_true", help="time the control alone (no RLlib)")
    args = parse_piece_args(parser, argv)

    import torch

    from conduit.runtime.calibrate import _torch_threads, attached_ray

    pieces = None if args.control_only else PpoPieces(args.workload, args.steps)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    try:
        with _torch_threads(1):
            if pieces is not None:
                pieces.round()  # first-call paths
            rows = measure(None if pieces is None else pieces.round, args.cycles, args.rounds, args.touch_mb,
                           lambda: attached_ray())
    finally:
        if pieces is not None:
            pieces.close()
    summary = summarise(rows)
    what = "control only" if pieces is None else f"{args.workload}, {pieces.steps} fresh steps a round"
    head = (f"# Attached to a running Ray vs detached ({what}; {args.cycles} x {args.rounds} rounds each; "
            f"torch {torch.__version__}, one thread; {os.cpu_count()} cores; {started} UTC)")
    print(format_report(summary, head))
    write_json(args, started, rows, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
