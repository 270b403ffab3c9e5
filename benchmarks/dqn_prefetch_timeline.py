"""When a DQN learner's prefetched replay draw lands, against the update that takes it (a real run)

Under ``enable()`` a DQN learner draws its next replay batch from the plane in a prefetch thread
(``conduit/runtime/rllib/delivery.py: Prefetcher``): the draw is requested when an update ends and first waits
for that update's priorities to land on the plane (``learner.py: _cd_flush_priorities``), then calls
``next_batch``. The next update takes the batch (``Prefetcher.get``), waiting if it is not there yet: that
wait is part of the exposed experience-path latency (segment *get*). This runs the study's
``dqn-cartpole-1r`` Conduit side in this interpreter (``studies/rllib_experience_path.py --in-process``) with
timers around those calls and the driver's own (``sync_weights``, the sample round, the replay ticket and the
update call), and prints, over the run's last two thirds: how long updates waited for their batch and how
often, how long a draw took from its request, its two parts, and the driver's calls beside it.

2026-12-07 on the 2-core VM, three runs (as ``/work/runs`` probes, the same timers): the draw took a median
12.2-12.6 ms from its request (the priorities' landing 4.9-5.0 ms, then ``next_batch``), 32-39% of updates waited
for it, 0.78-1.04 ms on average; with ``OMP_WAIT_POLICY=PASSIVE`` in the environment (the local learner's torch
threads sleep at once instead of spinning) the draw took 7.3 ms, 2% of updates waited, 0.04 ms on average. The
simulator's draw on the same workload: 3.2 ms, never late (``results/validation/NOTES.md``, 2026-12-07 03:56-).
In process the study runs 21-24 ms per update, against 16.5 ms in fresh interpreters (the reference window).

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/dqn_prefetch_timeline.py [--iters 5]      # ~40 s
    OMP_WAIT_POLICY=PASSIVE RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/dqn_prefetch_timeline.py
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: one timed call: (kind, start, end), perf_counter seconds
Span = tuple[str, float, float]


@contextlib.contextmanager
def timed_calls(log: list[Span]) -> Iterator[None]:
    """Timers around the learner's prefetch calls and the driver's, appending to ``log``; restored on exit."""
    from ray.rllib.core.learner.learner_group import LearnerGroup
    from ray.rllib.env.env_runner_group import EnvRunnerGroup

    from conduit.runtime.rllib.delivery import Prefetcher
    from conduit.runtime.rllib.learner import ConduitLearnerMixin
    from conduit.runtime.rllib.replay_buffer import ConduitEpisodeReplayBuffer

    targets = [(Prefetcher, "get", "get"), (ConduitLearnerMixin, "_cd_draw", "draw"),
               (ConduitLearnerMixin, "_cd_flush_priorities", "flush"),
               (ConduitLearnerMixin, "_cd_send_priorities", "send"), (EnvRunnerGroup, "sync_weights", "sync"),
               (EnvRunnerGroup, "foreach_env_runner", "sample_round"), (ConduitEpisodeReplayBuffer, "sample", "ticket"),
               (LearnerGroup, "update", "update_call")]
    originals = [(cls, name, getattr(cls, name)) for cls, name, _ in targets]

    def timer(method, kind):
        def timed(self, *args, **kwargs):
            start = time.perf_counter()
            result = method(self, *args, **kwargs)  # a call that raised is not logged: a draw that timed out
            log.append((kind, start, time.perf_counter()))  # in the warm-up fed no update
            return result
        return timed

    for (cls, name, kind), (_, _, method) in zip(targets, originals, strict=True):
        setattr(cls, name, timer(method, kind))
    try:
        yield
    finally:
        for cls, name, method in originals:
            setattr(cls, name, method)


def _stats(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"n": len(ordered), "median_ms": 1e3 * statistics.median(ordered), "mean_ms": 1e3 * statistics.fmean(ordered),
            "p90_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]}


def summarize(log: Sequence[Span], skip: float = 1 / 3) -> dict[str, dict[str, float]]:
    """The figures of a run's ``log``, leaving out its first ``skip`` of each kind (warm-up and the replay
    table filling). The k-th draw feeds the k-th ``get`` (the prefetch queue is FIFO): a draw is *late* when it
    ends after its ``get`` began. Raises ValueError when the log holds no update that took a drawn batch."""
    by_kind: dict[str, list[Span]] = {}
    for span in sorted(log, key=lambda s: s[1]):
        by_kind.setdefault(span[0], []).append(span)
    gets, draws = by_kind.get("get", []), by_kind.get("draw", [])
    pairs = list(zip(draws, gets, strict=False))
    pairs = pairs[int(len(pairs) * skip):]
    if not pairs:
        raise ValueError("no update took a drawn batch: is this a DQN run under enable()?")
    out = {"update_wait": _stats([g[2] - g[1] for _, g in pairs]),
           "draw_from_request": _stats([d[2] - d[1] for d, _ in pairs]),
           "late_share": {"n": len(pairs), "share": sum(d[2] > g[1] for d, g in pairs) / len(pairs)}}
    for kind in ("flush", "send", "sync", "sample_round"):
        spans = by_kind.get(kind, [])[int(len(by_kind.get(kind, [])) * skip):]
        if spans:
            out[kind] = _stats([b - a for _, a, b in spans])
    tickets, calls = by_kind.get("ticket", []), by_kind.get("update_call", [])
    gaps = [c[1] - t[2] for t, c in zip(tickets, calls, strict=False)]
    if gaps := gaps[int(len(gaps) * skip):]:
        out["ticket_to_update_call"] = _stats(gaps)
    return out


LABELS = {"update_wait": "an update's wait for its batch (Prefetcher.get)",
          "draw_from_request": "a draw, from its request to the batch",
          "flush": "  of which: the previous update's priorities landing",
          "send": "the update's priorities sent (on the learner's thread)",
          "sync": "weight sync (EnvRunnerGroup.sync_weights)",
          "sample_round": "sample round (foreach_env_runner)",
          "ticket_to_update_call": "replay ticket -> LearnerGroup.update call"}


def report(figures: dict[str, dict[str, float]]) -> str:
    late = figures["late_share"]
    lines = [f"updates late for their batch: {100 * late['share']:.0f}% of {late['n']}"]
    for key, label in LABELS.items():
        if key in figures:
            f = figures[key]
            lines.append(f"{label:<56} median {f['median_ms']:7.3f} ms  mean {f['mean_ms']:7.3f}  "
                         f"p90 {f['p90_ms']:7.3f}  (n {f['n']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=5, help="training iterations (250 updates each)")
    p.add_argument("--warmup", type=int, default=1, help="leading iterations the study leaves out of its medians")
    p.add_argument("--out", type=Path, default=None, help="directory for the study's own output (default: a temp dir)")
    a = p.parse_args(argv)
    if a.iters < 2:
        p.error(f"--iters must be at least 2, got {a.iters}")
    if not 0 <= a.warmup < a.iters:
        p.error(f"--warmup must be within [0, --iters), got {a.warmup}")
    sys.path.insert(0, str(ROOT / "studies"))
    import rllib_experience_path as study

    out = a.out or Path(tempfile.mkdtemp(prefix="dqn_prefetch_"))
    log: list[Span] = []
    with timed_calls(log):
        rc = study.main(["--workloads", "dqn-cartpole-1r", "--sides", "conduit", "--iters", str(a.iters),
                         "--warmup", str(a.warmup), "--in-process", "--out", str(out)])
    if rc:
        print(f"dqn_prefetch_timeline: the study failed (exit status {rc})", file=sys.stderr)
        return rc
    print(report(summarize(log)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
