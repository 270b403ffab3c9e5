"""Where a learner's episodes come from, and what that does to PPO's learner pieces, side by side in one run
(issue 13: PPO large-obs' GAE piece costs the real learner 0.97-1.29 s where the calibration timed 0.45-0.59 s).

A real run's learner waits while EnvRunner actors sample in other processes, and gets the episodes through
Ray's object store (``ppo.py: PPO.training_step``). The calibration used to sample them in its own process
right before timing the learner pieces. On a VM that hands freed memory back to its host (free page reporting,
:mod:`conduit.runtime.pagereport`) the two are not the same condition: while another process samples, memory
is freed and reported, and the learner's next call faults in pages the host must supply again.

This alternates, in one process attached to a running Ray, rounds whose fresh episodes (``--steps`` env steps)
the process samples itself (``own``) and rounds an EnvRunner actor samples while it waits (``actor``:
:func:`conduit.runtime.calibrate._episode_source`, what the calibration does now), and times on each RLlib's
``GeneralAdvantageEstimation`` piece inside the learner's own connector pipeline and the whole update call (one
torch thread; :class:`ray_attached.PpoPieces`). Per source: medians of wall time, thread CPU, system time and
page faults, the memory the VM reported between the round's start and the GAE piece, and the ratio actor / own.

On the 2-core VM, ``ppo-largeobs-1r-1l`` (2,000 steps of 84x84x4 uint8), 2026-12-07, three earlier experiments
of this design (a plain child process sampling, episodes through a pipe): GAE piece median 1.11 / 1.53 s,
1.30 / 1.48 s, 1.04 / 1.25 s (own / other process), 42-338 MB reported before the other process's rounds and
mostly none before the own ones.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/episode_source.py [--workload ppo-largeobs-1r-1l]
        [--steps N] [--rounds 4] [--json OUT]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ray_attached import PpoPieces, _positive, parse_piece_args, piece_parser, write_json  # a sibling script

#: the episode sources, in the order each round runs them
SOURCES = ("own", "actor")
#: the pieces timed on each round's episodes
PIECES = ("gae piece", "update call")
FIGURES = ("wall_s", "cpu_s", "sys_s", "faults")


def summarise(rows: Sequence[Mapping[str, object]]) -> dict[str, dict[str, object]]:
    """``{piece: {source: {figure: median, "n"}, "ratio": {figure: actor / own}}}`` from rows ``{"source",
    "piece", figures...}``, and ``{"reported_mb_before": {source: {"median", "rounds_after_reporting", "known"}}}``
    from the GAE rows' ``reported_mb_before`` (None: the kernel does not say). A ratio over a zero median is
    NaN."""
    out: dict[str, dict[str, object]] = {}
    for piece in PIECES:
        entry: dict[str, object] = {}
        for source in SOURCES:
            got = [r for r in rows if r["piece"] == piece and r["source"] == source]
            if got:
                entry[source] = {k: statistics.median(float(r[k]) for r in got) for k in FIGURES}
                entry[source]["n"] = float(len(got))
        if all(s in entry for s in SOURCES):
            own, actor = entry["own"], entry["actor"]
            entry["ratio"] = {k: actor[k] / own[k] if own[k] > 0 else float("nan") for k in ("wall_s", "cpu_s",
                                                                                                "sys_s")}
        if entry:
            out[piece] = entry
    reported: dict[str, object] = {}
    for source in SOURCES:
        known = [float(r["reported_mb_before"]) for r in rows if r["piece"] == "gae piece" and r["source"] == source
                 and r.get("reported_mb_before") is not None]
        reported[source] = {"median": statistics.median(known) if known else None,
                            "rounds_after_reporting": sum(1 for mb in known if mb > 0), "known": len(known)}
    out["reported_mb_before"] = reported
    return out


def format_report(summary: Mapping[str, Mapping[str, object]], head: str) -> str:
    lines = [head, "", ("| piece | own episodes: wall (CPU / sys) | actor's episodes: wall (CPU / sys) | actor / own "
                        "| faults (own / actor) |"), "|---|---:|---:|---:|---:|"]
    for piece in PIECES:
        entry = summary.get(piece)
        if not entry:
            continue

        def cell(source: str, entry: Mapping = entry) -> str:
            m = entry.get(source)
            return "" if m is None else f"{m['wall_s']:.3f} s ({m['cpu_s']:.3f} / {m['sys_s']:.3f})"
        ratio = (entry.get("ratio") or {}).get("wall_s")
        faults = " / ".join(f"{entry[s]['faults']:.0f}" for s in SOURCES if s in entry)
        lines.append(f"| {piece} | {cell('own')} | {cell('actor')} | {'' if ratio is None else f'{ratio:.2f}x'} | "
                     f"{faults} |")
    lines.append("")
    rep = summary["reported_mb_before"]
    if any(rep[s]["known"] for s in SOURCES):
        lines.append("Memory the VM reported to its host between a round's start and its GAE piece (median MB; rounds "
                     "with any): " + "; ".join(f"{s} {rep[s]['median']:.0f} MB ({rep[s]['rounds_after_reporting']} "
                                               f"of {rep[s]['known']})" for s in SOURCES if rep[s]["known"]) + ".")
    else:
        lines.append("This kernel does not report free pages to its host (no /sys/module/page_reporting counter).")
    lines.append("Medians over the rounds: the piece's wall time, its thread's CPU and system time, its minor faults.")
    return "\n".join(lines)


def measure(pieces: PpoPieces, actor_sample: Callable[[int], object], rounds: int,
            log: Callable[[str], None] = print) -> list[dict[str, object]]:
    """``rounds`` x (a round on episodes this process samples, a round on the actor's), one row per piece."""
    from conduit.runtime import pagereport

    rows: list[dict[str, object]] = []
    for _ in range(rounds):
        for source in SOURCES:
            start = pagereport.snapshot()
            episodes = (pieces.runner.sample(num_timesteps=pieces.steps, random_actions=False) if source == "own"
                        else actor_sample(pieces.steps))
            before = pagereport.reported_between(start, pagereport.snapshot())
            got = pieces.round_on(episodes)
            for piece, fig in got.items():
                rows.append({"source": source, "piece": piece, **fig,
                             "reported_mb_before": None if before is None else before["mb"]})
            gae = got["gae piece"]
            reported = "-" if before is None else f"{before['mb']:.0f} MB"
            log(f"  {source:5s} GAE piece wall {gae['wall_s']:.3f} s  sys {gae['sys_s']:.3f}  faults "
                f"{gae['faults']:.0f}  reported before {reported}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = piece_parser(__doc__)
    parser.add_argument("--rounds", type=_positive("--rounds"), default=4, help="rounds per source")
    args = parse_piece_args(parser, argv)

    import torch

    from conduit.runtime.calibrate import _episode_source, _torch_threads, attached_ray

    pieces = PpoPieces(args.workload, args.steps)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    try:
        with (_torch_threads(1), attached_ray(),
              _episode_source(args.workload, pieces.cfg, pieces.runner) as (actor_sample, where)):
            if "actor" not in where:
                raise SystemExit(f"no EnvRunner actor: {where}")
            pieces.round_on(actor_sample(pieces.steps))  # first-call paths, and the actor's start
            rows = measure(pieces, actor_sample, args.rounds)
    finally:
        pieces.close()
    summary = summarise(rows)
    head = (f"# Episodes sampled by the learner's own process vs by an EnvRunner actor ({args.workload}, "
            f"{pieces.steps} fresh steps a round, {args.rounds} rounds each, alternating; torch {torch.__version__}, "
            f"one thread; {os.cpu_count()} cores; {started} UTC)")
    print(format_report(summary, head))
    write_json(args, started, rows, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
