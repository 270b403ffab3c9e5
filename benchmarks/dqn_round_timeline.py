"""Where a real stock DQN round's time goes, part by part, both sides of the sample call, beside the simulator's
prediction of the same parts (issue 13: on the AMD EPYC host ``dqn-cartpole-1r`` rounds take 23-24 ms
against 13 ms predicted).

Runs ``studies/rllib_experience_path.py``'s ``dqn-cartpole-1r`` stock config (one EnvRunner, one env step per
``sample()`` call, a local learner; ``--dqn-steps`` env steps per iteration) for ``--iters`` iterations in this
interpreter, with

* the driver's parts timed in place (wall and the driver thread's CPU): ``EnvRunnerGroup.foreach_env_runner``
  (DQN's ``synchronous_parallel_sample`` call), the prioritized buffer's ``add`` and ``sample``,
  ``LearnerGroup.update``, ``EnvRunnerGroup.sync_weights``;
* the EnvRunner's side timed inside its process (an ``env_runner_cls`` that subclasses RLlib's
  ``SingleAgentEnvRunner`` and stamps ``sample()`` and ``set_state()``, wall and thread CPU; Linux's monotonic
  clock is one clock for every process of the machine, so the stamps line up with the driver's).

Printed: each part's median start and end within a round (from the start of the round's sample call), its
wall and CPU time, and the sample call split into submission -> the EnvRunner starting ``sample()``, the
EnvRunner's ``sample()``, and ``sample()`` returning -> the reply back in the driver. The first ``--warmup``
iterations are left out (learning starts after the first ``--dqn-steps`` steps).

With ``--window DIR`` (a validation window: ``calibration.json``, ``stock_primitives.json``,
``plane_primitives.json``; ``--contention FILE``, the file its validation run was given, else the window's own
``contention.json`` where it has one) it also simulates the same workload from that
window's microbenchmarks, as ``studies/validation.py`` predicts it, and prints the simulator's span per part
beside the measured one.

2026-12-07 12:27-12:35 UTC, on the 2-core VM (AMD EPYC host, otherwise idle), two runs (with and without the
study's instrumentation hooks), against ``results/validation/run-1021``'s prediction:

| part | measured (wall) | simulated |
|---|---:|---:|
| sample call | 8.3-8.9 ms | 4.3 ms (sampling 2.7 + reply 1.6) |
| of which submission -> ``sample()`` starts (``set_state`` queued, 0.53-0.58 ms, runs first) | 3.1-3.3 ms | |
| of which the EnvRunner's ``sample()`` | 2.3-2.4 ms (2.0-2.2 ms thread CPU) | |
| of which ``sample()`` returned -> reply in the driver (``get_metrics()``, pickling, reply) | 2.5-2.8 ms | |
| buffer add / sample | 0.72-0.77 / 2.0-2.1 ms | 0.39 / 1.9 ms |
| ``LearnerGroup.update`` | 6.3-7.2 ms | 3.9 ms (connector 0.75, update 3.0, ...) |
| weight sync | 3.4-3.7 ms | 1.8 ms |
| round | 24.2-26.7 ms | 13.3 ms |

The same ``sample()`` in one process costs 1.0 ms of thread CPU back to back and 2.2-2.4 ms right after a 16 ms
sleep (``benchmarks/wake_debt.py``): the EnvRunner, which sleeps about 16 ms of every round, pays that warm-up
debt on every call. Against ``results/validation/run-1249`` (a window that measured that debt, section ``wake`` of
``benchmarks/stock_primitives.py``: :mod:`conduit.sim.coldwork`), 13:26: sample call 7.80 ms measured / 6.91 ms
simulated, buffer add 0.66 / 1.01, buffer sample 1.95 / 2.89, update 6.06 / 6.03, weight sync 3.31 / 3.09, round
23.65 / 20.96 ms.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/dqn_round_timeline.py [--iters 6] [--warmup 2]
        [--dqn-steps 250] [--window results/validation/run-1021 [--contention results/validation/contention.json]]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "studies"))

#: the driver's parts timed in place: (class path, method, label)
DRIVER_PARTS = (
    ("ray.rllib.env.env_runner_group.EnvRunnerGroup", "foreach_env_runner", "sample call"),
    ("ray.rllib.utils.replay_buffers.prioritized_episode_buffer.PrioritizedEpisodeReplayBuffer", "add", "buffer add"),
    ("ray.rllib.utils.replay_buffers.prioritized_episode_buffer.PrioritizedEpisodeReplayBuffer", "sample",
     "buffer sample"),
    ("ray.rllib.core.learner.learner_group.LearnerGroup", "update", "learner update"),
    ("ray.rllib.env.env_runner_group.EnvRunnerGroup", "sync_weights", "weight sync"),
)
#: the simulator's spans (``SimResult.segments``) that make up each measured part
SIM_PARTS = {
    "sample call": ("sampling", "a"),
    "buffer add": ("buffer_add",),
    "buffer sample": ("buffer_sample",),
    "learner update": ("b", "c", "d", "update"),
    "learner results, priorities": ("learner_results", "buffer_update_prios"),
    "weight sync": ("weight_sync",),
}


def _resolve(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(__import__(module, fromlist=[name]), name)


def probe_runner_class() -> type:
    """A ``SingleAgentEnvRunner`` that stamps its ``sample()`` and ``set_state()`` calls (monotonic clock, wall
    and thread CPU) and hands the stamps back from ``probe()``."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    class ProbeEnvRunner(SingleAgentEnvRunner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._stamps: list[tuple[str, float, float, float]] = []

        def _stamped(self, label, fn, *args, **kwargs):
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self._stamps.append((label, start, time.perf_counter(), time.thread_time() - cpu))

        def sample(self, *args, **kwargs):
            return self._stamped("runner sample()", super().sample, *args, **kwargs)

        def set_state(self, *args, **kwargs):
            return self._stamped("runner set_state()", super().set_state, *args, **kwargs)

        def probe(self) -> list[tuple[str, float, float, float]]:
            return list(self._stamps)

    return ProbeEnvRunner


def _wrap(cls: type, method: str, label: str, log: list) -> None:
    original = getattr(cls, method)

    def stamped(self, *args, **kwargs):
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return original(self, *args, **kwargs)
        finally:
            log.append((label, start, time.perf_counter(), time.thread_time() - cpu))

    setattr(cls, method, stamped)


def measure(iters: int, dqn_steps: int) -> tuple[list, list[float]]:
    """Runs the workload; returns ``(stamps, train_starts)``: every ``(label, start, end, thread CPU)`` of the
    driver and the EnvRunner, and when each ``train()`` started."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    import rllib_experience_path as study

    log: list = []
    for path, method, label in DRIVER_PARTS:
        _wrap(_resolve(path), method, label, log)
    workload = next(w for w in study.WORKLOADS if w.name == "dqn-cartpole-1r")
    cfg = workload.build(argparse.Namespace(dqn_steps=dqn_steps, appo_iter_s=1.0))
    cfg = cfg.env_runners(env_runner_cls=probe_runner_class())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="dqnround-"))
    algo = None
    starts = []
    try:
        algo = cfg.build_algo()
        for _ in range(iters):
            starts.append(time.perf_counter())
            algo.train()
        runner = algo.env_runner_group.foreach_env_runner(lambda r: r.probe(), local_env_runner=False)[0]
        log.extend(tuple(s) for s in runner)
    finally:
        if algo is not None:
            algo.stop()
        ray.shutdown()
    return log, starts


def timeline(stamps: Sequence[tuple], since: float) -> dict:
    """Per label, the medians of its start and end within the round (seconds from the round's sample call's
    start), of its wall and thread CPU, and the count; rounds from ``since`` on. A round runs from one sample
    call's start to the next's."""
    calls = sorted(s[1] for s in stamps if s[0] == "sample call" and s[1] >= since)
    if len(calls) < 2:
        raise ValueError("fewer than two sample calls after the warm-up: run more iterations")
    per: dict[str, list[tuple[float, float, float, float]]] = {}
    events = sorted(s for s in stamps if s[1] >= since)
    for label, start, end, cpu in events:
        i = bisect.bisect_right(calls, start) - 1
        if i < 0 or i + 1 >= len(calls):
            continue
        t0 = calls[i]
        per.setdefault(label, []).append((start - t0, end - t0, end - start, cpu))
    out = {"round_s": statistics.median(b - a for a, b in itertools.pairwise(calls)), "parts": {}}
    for label, rows in per.items():
        out["parts"][label] = {key: statistics.median(r[i] for r in rows)
                               for i, key in enumerate(("start_s", "end_s", "wall_s", "cpu_s"))}
        out["parts"][label]["count"] = len(rows)
    parts = out["parts"]
    if "runner sample()" in parts and "sample call" in parts:
        sample = parts["runner sample()"]
        out["sample_call_split"] = {"submission to sample() start": sample["start_s"],
                                    "sample()": sample["wall_s"],
                                    "sample() end to reply in the driver": parts["sample call"]["wall_s"] - sample["end_s"]}
    return out


def simulate(window: Path, dqn_steps: int, contention: Path | None = None) -> dict:
    """The simulator's ``dqn-cartpole-1r`` stock prediction from ``window``'s files, as ``studies/validation.py``
    makes it: ``{iteration_s, spans: {span: seconds per update}}``. ``contention``: the file the window's
    validation run was given as ``--contention`` (default: the window's own ``contention.json``, if it has one)."""
    import validation

    from conduit.sim.cost_file import load_plane_costs
    from conduit.sim.run import simulate as run

    study = validation.experience_path_study()
    configs = validation.study_configs(study, study.parse_args(["--dqn-steps", str(dqn_steps)]), ["dqn-cartpole-1r"])
    calibration = json.loads((window / "calibration.json").read_text())
    if contention is None and (window / "contention.json").exists():
        contention = window / "contention.json"
    if contention is not None:
        calibration = validation.with_contention(calibration, contention)
    stock = validation.stock_costs_from_primitives(window / "stock_primitives.json")
    plane = load_plane_costs(window / "plane_primitives.json")[0]
    topology, _ = validation.topology_from_calibration(calibration)
    workloads, stocks = validation.build_workloads(configs, calibration, stock)
    name, workload = next(iter(workloads.items()))
    result = run(topology, workload, validation.SIM_POLICY["stock"], iterations=validation.SIM_ITERATIONS["dqn"],
                 seed=validation.SIM_SEED, stock_costs=stocks[name], plane_costs=plane)
    return {"iteration_s": result.metrics["iteration_time_s"], "spans": dict(result.segments)}


def format_report(measured: dict, simulated: dict | None) -> str:
    ms = 1e3
    lines = [f"round (sample call to sample call): {measured['round_s'] * ms:.2f} ms measured"
             + (f", {simulated['iteration_s'] * ms:.2f} ms simulated" if simulated else ""), "",
             f"{'part':<28} {'start':>7} {'end':>7} {'wall':>7} {'CPU':>7} {'n':>5}" + ("  simulated" if simulated else "")]
    for label, p in sorted(measured["parts"].items(), key=lambda kv: kv[1]["start_s"]):
        sim = ""
        if simulated and label in SIM_PARTS:
            spans = SIM_PARTS[label]
            sim = f"  {sum(simulated['spans'].get(s, 0.0) for s in spans) * ms:7.2f} ({' + '.join(spans)})"
        lines.append(f"{label:<28} {p['start_s'] * ms:7.2f} {p['end_s'] * ms:7.2f} {p['wall_s'] * ms:7.2f} "
                     f"{p['cpu_s'] * ms:7.2f} {p['count']:5d}{sim}")
    if simulated:
        spans = SIM_PARTS["learner results, priorities"]
        lines.append(f"{'learner results, priorities':<28} {'':>7} {'':>7} {'':>7} {'':>7} {'':>5}  "
                     f"{sum(simulated['spans'].get(s, 0.0) for s in spans) * ms:7.2f} ({' + '.join(spans)})")
    if "sample_call_split" in measured:
        lines += ["", "the sample call, split (ms, medians):"]
        lines += [f"  {k:<40} {v * ms:7.2f}" for k, v in measured["sample_call_split"].items()]
    lines += ["", "times in ms from the start of the round's sample call; CPU: the calling thread's"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out (default 2)")
    parser.add_argument("--dqn-steps", type=int, default=250, help="env steps per iteration (the study's default)")
    parser.add_argument("--window", type=Path, default=None, help="a validation window to simulate from")
    parser.add_argument("--contention", type=Path, default=None,
                        help="with --window: the --contention file the window's validation run was given (default: "
                             "the window's own contention.json, if any)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.iters <= args.warmup or args.warmup < 0:
        parser.error(f"--iters must exceed --warmup (>= 0), got {args.iters} and {args.warmup}")
    if args.dqn_steps < 2:
        parser.error(f"--dqn-steps must be at least 2, got {args.dqn_steps}")
    if args.window is not None:
        missing = [f for f in ("calibration.json", "stock_primitives.json", "plane_primitives.json")
                   if not (args.window / f).is_file()]
        if missing:
            parser.error(f"--window {args.window}: missing {', '.join(missing)}")
    if args.contention is not None and (args.window is None or not args.contention.is_file()):
        parser.error(f"--contention {args.contention}: needs --window and an existing file")
    simulated = simulate(args.window, args.dqn_steps, args.contention) if args.window is not None else None
    stamps, starts = measure(args.iters, args.dqn_steps)
    measured = timeline(stamps, starts[args.warmup])
    print(format_report(measured, simulated))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"measured": measured, "simulated": simulated, "stamps": stamps}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
