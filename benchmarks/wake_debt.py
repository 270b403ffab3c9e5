"""A thread's work right after it slept, against the same work back to back: the warm-up debt (issue 13).

Every compute figure the simulator reads is timed back to back, with the thread's caches hot. In a training
loop a thread sleeps between its pieces of work (DQN's EnvRunner about 16 ms per round, its driver while it
waits for the sample call) and the work after a sleep costs more. This prints, per kind of work and per sleep,
what a block of ``--units`` units run right after the sleep costs more than the same block run back to back
(thread CPU time, medians over ``--trials`` alternating blocks: :mod:`conduit.runtime.wakedebt`), how that extra
is spread over the block's units, and the figures it reduces to: the debt's plateau, the sleep from which a
thread pays it, and how much of its own work a thread does before half of it is paid.

The kinds of work (``--work``, default all):

* ``env-runner-sample``: one ``sample()`` of an RLlib ``SingleAgentEnvRunner`` with DQN's default config on
  CartPole (one env step: the call ``dqn-cartpole-1r`` makes every round);
* ``learner-like``: one update of a small CNN on a batch of 32 84x84x4 observations (forward, backward, Adam;
  :func:`conduit.runtime.contention._learner_like_update`), one torch thread;
* ``python-dict``: building and summing a 200-entry dict, 20 times (interpreter work, no torch).

2026-12-07, 12:30-13:00 UTC, on the 2-core VM (AMD EPYC host, otherwise idle), the EnvRunner's ``sample()``
(``/work/runs`` probes, before this script): 0.9-1.0 ms back to back; the first unit after a 16 ms sleep 2.3 ms,
the block of 8 paid +2.7 ms in all (+1.3 in the first unit, +0.5 in the second, +0.3 in the third); after 40 ms
+2.6 ms, after 5 ms +1.4 ms, after 2 ms +0.5 ms. The same after-sleep growth with the core kept busy by a
spinner: it is the thread's own state going cold, not an idle core clocking down. Its first unit after the
sleep preceded by a ``set_state`` of the module's weights: that ``set_state`` 0.3 -> 0.8 ms and the sample still
1.3 -> 2.4 ms. In the real ``dqn-cartpole-1r`` stock run on the same host the EnvRunner's ``sample()`` took 2.0-2.2 ms
of thread CPU (``benchmarks/dqn_round_timeline.py``).

    .venv/bin/python benchmarks/wake_debt.py [--work env-runner-sample learner-like python-dict]
        [--sleeps-ms 1 2 5 10 20 40] [--units N] [--trials 60] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conduit.runtime.wakedebt import DEFAULT_SLEEPS_S, debt_curve, debt_figures

WORK = ("env-runner-sample", "learner-like", "python-dict")
#: units per block by default: enough for the debt to be paid within the block (a learner-like update is
#: ~14 ms, so three cover it; more only add the machine's noise to the block's sum)
DEFAULT_UNITS = {"env-runner-sample": 8, "learner-like": 3, "python-dict": 8}


def _python_dict() -> Callable[[], int]:
    def unit() -> int:
        total = 0
        for _ in range(20):
            d = {str(i): i for i in range(200)}
            total += sum(d.values())
        return total

    return unit


def make_unit(name: str) -> Callable[[], object]:
    """One unit of the named kind of work, built (and its imports done) before any timing."""
    if name == "python-dict":
        return _python_dict()
    import torch

    torch.set_num_threads(1)
    if name == "learner-like":
        from conduit.runtime.contention import _learner_like_update

        return _learner_like_update()
    if name == "env-runner-sample":
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        from conduit.runtime.calibrate import _named_env_runner

        runner = _named_env_runner("dqn-cartpole")
        return runner.sample
    raise ValueError(f"unknown work {name!r}; known: {', '.join(WORK)}")


def format_report(name: str, rows: list[dict], figures: dict) -> str:
    ms = 1e3
    lines = [f"{name}: one unit back to back {figures['unit_s'] * ms:.3f} ms (thread CPU)",
             f"  {'sleep ms':>8}  {'debt ms':>8}  {'x unit':>6}  extra paid by unit 1, 2, 3, ... (cumulative, ms)"]
    for row, fig in zip(rows, figures["debt_by_sleep"], strict=True):
        cumulative = " ".join(f"{x * ms:.2f}" for x in row["extra_s"])
        ratio = fig["debt_s"] / figures["unit_s"] if figures["unit_s"] > 0 else float("nan")
        lines.append(f"  {row['sleep_s'] * ms:8.1f}  {fig['debt_s'] * ms:8.3f}  {ratio:6.2f}  {cumulative}")
    lines.append(f"  plateau {figures['debt_s'] * ms:.3f} ms from a {figures['plateau_after_s'] * ms:.0f} ms sleep on; "
                 f"half paid after {figures['half_paid_work_s'] * ms:.3f} ms of the thread's own work; the block's "
                 f"last unit still paid {figures['last_unit_extra_s'] * ms:+.3f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", nargs="+", choices=WORK, default=list(WORK))
    parser.add_argument("--sleeps-ms", nargs="+", type=float, default=[s * 1e3 for s in DEFAULT_SLEEPS_S])
    parser.add_argument("--units", type=int, default=None,
                        help="units timed per block (default: 8, a learner-like update's 3)")
    parser.add_argument("--trials", type=int, default=60, help="blocks of each kind per sleep (default 60)")
    parser.add_argument("--json", type=Path, default=None, help="also write the curves and figures here")
    args = parser.parse_args(argv)
    if (args.units is not None and args.units < 1) or args.trials < 1:
        parser.error(f"--units and --trials must be at least 1, got {args.units} and {args.trials}")
    if any(not s > 0 for s in args.sleeps_ms):
        parser.error(f"--sleeps-ms must all be > 0, got {args.sleeps_ms}")
    out = {}
    for name in args.work:
        unit = make_unit(name)
        units = args.units or DEFAULT_UNITS[name]
        rows = debt_curve(unit, [s / 1e3 for s in args.sleeps_ms], units=units, trials=args.trials)
        figures = debt_figures(rows)
        out[name] = {"curve": rows, **figures}
        print(format_report(name, rows, figures), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
