"""Soak: DQN on CartPole through the plane for a long time; the plane's and the auditor's memory must stay flat.

RLlib's DQN (its default config, CartPole-v1, one EnvRunner, a local learner) runs under
:func:`conduit.runtime.rllib.enable` for ``--minutes`` (30 by default). Every ``--interval`` seconds it
records, in ``<out>/soak.csv``:

* ``plane_rss_mib``: the resident set size of the plane actor's process (``/proc/<pid>/statm``, by the
  pid the actor reports of itself; the plane actor runs on this node);
* ``auditor_mib``: the auditor's object graph inside the plane actor, measured as
  ``benchmarks/audit_memory.py`` measures it (``_graph_size``: ``sys.getsizeof`` of every object
  reachable from it, each counted once), taken under the plane's lock;
* ``driver_rss_mib``, the env steps sampled, the iteration, the bytes the plane's tiers hold
  (``tier_used_mib``: the replay table's data) and the live audit's violations.

At the end it fits a line to each memory series over the **second half** of the run (the first half
includes the replay table filling up to its capacity, which is expected growth) and reports the
slope in MiB per hour, writes ``<out>/soak.png`` (the memory curves, the fitted window marked) and
``<out>/summary.json``, and exits non-zero when the final audit has a violation, or when the plane's
RSS grows faster than ``--max-plane-slope`` (default 32 MiB/h) over the second half, or the auditor's
faster than ``--max-auditor-slope`` (default 4 MiB/h) once it is at its designed bound. The auditor
holds O(chunks not yet retired + ``RETIRED_WINDOW``) chunk records (``conduit/audit.py``; the window is
65,536 retired chunks): while that window fills it grows by design, so the CSV also records the
chunks it remembers (``auditor_chunks``, ``auditor_retired``), the summary the bytes per remembered
chunk, and the run fails if it ever remembers more retired chunks than the window.

    make soak                                          # 30 minutes
    .venv/bin/python benchmarks/soak_dqn.py --minutes 3 --interval 5 --out results/soak_short
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # audit_memory, run as a script from the repository root

import audit_memory  # benchmarks/audit_memory.py: the auditor's object-graph measure

MiB = 2**20
FIELDS = ("t_s", "iteration", "env_steps", "plane_rss_mib", "auditor_mib", "auditor_chunks", "auditor_retired",
          "driver_rss_mib", "tier_used_mib", "violations")


def _plane_probe(actor, plane_self) -> dict:
    """Runs inside the plane actor (``__ray_call__``): its pid and the auditor's object-graph size."""
    plane = plane_self._plane
    with plane._cond:  # the auditor is not mutated while it is walked
        aud = plane.auditor
        # a recoverable plane's auditor journals through a sink bound to the plane: walking it would
        # count the whole plane (tiers included); the auditor's own state is what is measured
        sink = getattr(aud, "_sink", None)
        if sink is not None:
            aud._sink = None
        try:
            size = audit_memory._graph_size(aud)
        finally:
            if sink is not None:
                aud._sink = sink
        used = sum(t.used for t in plane.tiers.values())
        remembered, retired, window = len(aud._chunks), len(aud._retired), aud.RETIRED_WINDOW
    return {"pid": os.getpid(), "auditor_bytes": size, "tier_used_bytes": used, "auditor_chunks": remembered,
            "auditor_retired": retired, "retired_window": window}


def _trace_start(plane_self) -> bool:
    """Inside the plane actor: start tracemalloc and keep a first snapshot."""
    import tracemalloc

    tracemalloc.start(1)
    plane_self._soak_snapshot = tracemalloc.take_snapshot()
    return True


def _trace_top(plane_self, n: int) -> list[str]:
    """Inside the plane actor: the ``n`` source lines whose traced memory grew most since the first snapshot."""
    import tracemalloc

    stats = tracemalloc.take_snapshot().compare_to(plane_self._soak_snapshot, "lineno")
    tracemalloc.stop()
    return [str(s) for s in stats[:n]]


def _probe(actor) -> dict:
    import ray

    return ray.get(actor.__ray_call__.remote(lambda self: _plane_probe(actor, self)), timeout=120)


def rss_mib(pid: int) -> float:
    """Resident set size of a process on this node, in MiB (Linux ``/proc/<pid>/statm``)."""
    with open(f"/proc/{pid}/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / MiB


def slope_mib_per_hour(t_s: np.ndarray, mib: np.ndarray) -> float:
    """Least-squares slope of ``mib`` over ``t_s``, in MiB per hour (0 with fewer than 3 points)."""
    if len(t_s) < 3 or np.ptp(t_s) == 0:
        return 0.0
    return float(np.polyfit(t_s, mib, 1)[0] * 3600.0)


def second_half(rows: list[dict]) -> list[dict]:
    end = rows[-1]["t_s"]
    return [r for r in rows if r["t_s"] >= end / 2]


def plot(rows: list[dict], path: Path, slopes: dict[str, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([r["t_s"] for r in rows]) / 60.0
    fig, axes = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    axes[0].plot(t, [r["plane_rss_mib"] for r in rows], label=f"plane actor RSS ({slopes['plane_rss_mib']:+.1f} MiB/h)")
    axes[0].plot(t, [r["driver_rss_mib"] for r in rows], label=f"driver RSS ({slopes['driver_rss_mib']:+.1f} MiB/h)",
                 alpha=0.6)
    axes[0].set_ylabel("MiB")
    axes[1].plot(t, [r["auditor_mib"] for r in rows], color="C2",
                 label=f"auditor object graph ({slopes['auditor_mib']:+.2f} MiB/h)")
    axes[1].set_ylabel("MiB")
    axes[1].set_xlabel("minutes")
    for ax in axes:
        ax.axvspan(t[-1] / 2, t[-1], color="grey", alpha=0.1, label="fitted window (second half)")
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("DQN CartPole through the Conduit plane: memory over time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_config(num_cpus_per_env_runner: float, capacity: int | None):
    """RLlib's default DQN on CartPole-v1, one EnvRunner (``capacity``: the replay buffer's, if given)."""
    from ray.rllib.algorithms.dqn import DQNConfig

    cfg = (DQNConfig().environment("CartPole-v1")
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=num_cpus_per_env_runner)
           # train() returns every 100 env steps (not 1,000), so the run ends within seconds of --minutes;
           # this is reporting only: DQN's training_step, and so its learning, is unchanged
           .reporting(min_sample_timesteps_per_iteration=100)
           .debugging(seed=0))
    if capacity is not None:
        cfg.training(replay_buffer_config={**cfg.replay_buffer_config, "capacity": capacity})
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="how long to train (default 30)")
    ap.add_argument("--interval", type=float, default=15.0, help="seconds between memory samples (default 15)")
    ap.add_argument("--out", default="results/soak", help="folder for soak.csv, soak.png, summary.json")
    ap.add_argument("--capacity", type=int, default=None,
                    help="replay capacity in steps (default: RLlib's, 50,000); smaller reaches steady state sooner")
    ap.add_argument("--trace-top", type=int, default=0,
                    help="trace the plane actor's Python allocations (tracemalloc) over the second half and report "
                         "the N source lines that grew most (slows the plane; default off)")
    ap.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray instance (default 2)")
    ap.add_argument("--max-plane-slope", type=float, default=32.0,
                    help="MiB/h the plane actor's RSS may grow over the second half (default 32)")
    ap.add_argument("--max-auditor-slope", type=float, default=4.0,
                    help="MiB/h the auditor's object graph may grow over the second half (default 4)")
    args = ap.parse_args(argv)
    if args.minutes <= 0 or args.interval <= 0:
        ap.error("--minutes and --interval must be positive")

    import ray
    from ray import cloudpickle

    from conduit.runtime.rllib import cluster_of, enable, shutdown

    cloudpickle.register_pickle_by_value(audit_memory)  # the actor's process cannot import benchmarks/
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="conduit-soak-"), object_store_memory=256 * MiB)
    rows: list[dict] = []
    final: dict = {}
    top: list[str] = []
    try:
        algo = enable(build_config(0.5, args.capacity)).build_algo()
        try:
            cluster = cluster_of(algo)
            actor = next(iter(cluster._actors.values()))
            first = _probe(actor)
            plane_pid, window = first["pid"], first["retired_window"]
            t0 = time.monotonic()
            deadline = t0 + args.minutes * 60.0
            state = {"iteration": 0, "env_steps": 0}
            stop = threading.Event()
            errors: list[BaseException] = []
            traced: list[bool] = []

            def sample() -> None:  # a thread: one row per interval, while train() runs
                with open(out / "soak.csv", "w", newline="") as f:
                    w = csv.DictWriter(f, fieldnames=FIELDS)
                    w.writeheader()
                    while True:
                        now = time.monotonic()
                        try:
                            probe = _probe(actor)
                            row = {
                                "t_s": round(now - t0, 2),
                                "iteration": state["iteration"],
                                "env_steps": state["env_steps"],
                                "plane_rss_mib": rss_mib(plane_pid),
                                "auditor_mib": probe["auditor_bytes"] / MiB,
                                "auditor_chunks": probe["auditor_chunks"],
                                "auditor_retired": probe["auditor_retired"],
                                "driver_rss_mib": rss_mib(os.getpid()),
                                "tier_used_mib": probe["tier_used_bytes"] / MiB,
                                "violations": int(cluster.audit().get("violations", 0)),
                            }
                        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                            errors.append(exc)
                            return
                        rows.append(row)
                        w.writerow(row)
                        f.flush()
                        print(f"[soak] {row['t_s'] / 60:5.1f} min  it {row['iteration']:5d}  steps "
                              f"{row['env_steps']:>8}  plane {row['plane_rss_mib']:7.1f} MiB  auditor "
                              f"{row['auditor_mib']:6.2f} MiB  tiers {row['tier_used_mib']:6.2f} MiB  violations "
                              f"{row['violations']}", flush=True)
                        if args.trace_top and not traced and now - t0 >= args.minutes * 30.0:
                            traced.append(ray.get(actor.__ray_call__.remote(_trace_start), timeout=120))
                        if stop.wait(args.interval):
                            return

            sampler = threading.Thread(target=sample, name="soak-sampler", daemon=True)
            sampler.start()
            try:
                while time.monotonic() < deadline and not errors:
                    result = algo.train()
                    state["iteration"] += 1
                    state["env_steps"] = int(result["env_runners"].get("num_env_steps_sampled_lifetime", 0))
            finally:
                stop.set()
                sampler.join(timeout=180)
            if errors:
                raise errors[0]
            if traced:
                top = ray.get(actor.__ray_call__.remote(_trace_top, args.trace_top), timeout=300)
        finally:
            algo.stop()
            final = shutdown(algo) or {}
    finally:
        ray.shutdown()

    half = second_half(rows)
    t = np.array([r["t_s"] for r in half])
    slopes = {k: slope_mib_per_hour(t, np.array([r[k] for r in half], dtype=float))
              for k in ("plane_rss_mib", "auditor_mib", "driver_rss_mib")}
    violations = int(final.get("violations", -1))
    summary = {
        "minutes": args.minutes, "samples": len(rows), "iterations": rows[-1]["iteration"],
        "env_steps": rows[-1]["env_steps"],
        "plane_rss_mib": {"first": rows[0]["plane_rss_mib"], "last": rows[-1]["plane_rss_mib"],
                          "slope_second_half_mib_per_h": slopes["plane_rss_mib"], "max_slope": args.max_plane_slope},
        "auditor_mib": {"first": rows[0]["auditor_mib"], "last": rows[-1]["auditor_mib"],
                        "slope_second_half_mib_per_h": slopes["auditor_mib"], "max_slope": args.max_auditor_slope},
        "driver_rss_slope_second_half_mib_per_h": slopes["driver_rss_mib"],
        "violations": violations,
        "final_audit": {k: final.get(k) for k in ("ingested_samples", "delivered_samples", "dropped_samples",
                                                  "finished")},
    }
    failures = []
    if violations != 0:
        failures.append(f"final audit: {violations} violations (or no final audit)")
    if slopes["plane_rss_mib"] > args.max_plane_slope:
        failures.append(f"plane RSS grows {slopes['plane_rss_mib']:.1f} MiB/h > {args.max_plane_slope}")
    # The auditor is bounded by design (conduit/audit.py: O(chunks not retired + RETIRED_WINDOW)): it
    # grows while its window of retired chunks fills. Growth beyond the threshold counts once the
    # window is full over the whole fitted half; before that it is reported, and the bound is checked.
    window_full = all(r["auditor_retired"] >= window for r in half)
    summary["auditor_mib"]["retired_window"] = window
    summary["auditor_mib"]["retired_last"] = rows[-1]["auditor_retired"]
    summary["auditor_mib"]["window_full_in_second_half"] = window_full
    summary["auditor_mib"]["bytes_per_remembered_chunk_last"] = (
        rows[-1]["auditor_mib"] * MiB / max(1, rows[-1]["auditor_chunks"]))
    if any(r["auditor_retired"] > window for r in rows):
        failures.append(f"auditor remembers more than its RETIRED_WINDOW={window} retired chunks")
    if window_full and slopes["auditor_mib"] > args.max_auditor_slope:
        failures.append(f"auditor grows {slopes['auditor_mib']:.2f} MiB/h > {args.max_auditor_slope} with its "
                        "retired-chunk window full")
    if top:
        summary["plane_tracemalloc_growth_second_half"] = top
    summary["failures"] = failures
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(rows, out / "soak.png", slopes)
    print(json.dumps(summary, indent=2))
    print(f"[soak] wrote {out / 'soak.csv'}, {out / 'soak.png'}, {out / 'summary.json'}")
    if failures:
        print("[soak] FAIL: " + "; ".join(failures))
        return 1
    print("[soak] PASS: 0 violations; plane RSS slope within bounds; auditor within its designed bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
