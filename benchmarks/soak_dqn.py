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

The plane's memory is bounded by design, not constant from the first step: the Replay table fills up
to its capacity, and the auditor remembers the last ``audit_window`` retired chunks
(``conduit/audit.py``) to classify late events exactly. Both are growth until their bound, and a leak
is growth *after* it. So the run uses a table and a window that reach their bounds early (by default
``--capacity 5000`` steps, full after about 5,000 env steps, and ``--audit-window 2048`` retired
chunks; RLlib's default table of 50,000 steps and the audit's default 65,536 chunks fill only after
hours of CartPole on this machine, and report their bound rather than their steady state). The CSV
records the table's steps and the chunks the auditor remembers and has retired; **steady state**
starts at the first sample where the table is full and the window has filled.

At the end it fits a line to each memory series over the **steady part of the second half** (from the
later of half-time and steady state) and reports the slope in MiB per hour, writes ``<out>/soak.png``
(the memory curves, steady state and the fitted window marked) and ``<out>/summary.json``, and exits
non-zero when the final audit has a violation; when steady state is not reached by half-time (the
run proves nothing: lengthen it or lower the bounds); or when, over the fitted window, the plane's RSS
grows faster than ``--max-plane-slope`` (default 32 MiB/h) or the auditor's faster than
``--max-auditor-slope`` (default 4 MiB/h); or when the auditor ever remembers more retired chunks than
its window. ``--trace-top N`` traces the plane actor's Python allocations from steady state and lists
the N source lines that grew most between the middle and the end of the fitted window (both
snapshots in steady state, so chunks merely replacing older ones cancel out).

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
          "table_steps", "driver_rss_mib", "tier_used_mib", "violations")


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
        table_steps, capacity = plane._table_steps, plane.contract.capacity
    return {"pid": os.getpid(), "auditor_bytes": size, "tier_used_bytes": used, "auditor_chunks": remembered,
            "auditor_retired": retired, "retired_window": window, "table_steps": table_steps,
            "capacity": capacity}


def _trace_start(plane_self) -> bool:
    """Inside the plane actor: start tracemalloc (at steady state)."""
    import tracemalloc

    tracemalloc.start(1)
    return True


def _trace_mark(plane_self) -> bool:
    """Inside the plane actor: the snapshot the end is compared with (taken in steady state, after
    tracing started, so allocations that merely replace older ones appear in both)."""
    import tracemalloc

    plane_self._soak_snapshot = tracemalloc.take_snapshot()
    return True


def _trace_top(plane_self, n: int) -> list[str]:
    """Inside the plane actor: the ``n`` source lines whose traced memory grew most since the mark."""
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


def is_steady(row: dict, capacity: int, window: int, margin: int = 64) -> bool:
    """The table is full (within ``margin`` steps: chunks are whole) and the auditor's window has filled."""
    return row["table_steps"] >= capacity - margin and row["auditor_retired"] >= window


def steady_start(rows: list[dict], capacity: int, window: int) -> float | None:
    """Seconds into the run at which steady state began (None if it never did)."""
    return next((r["t_s"] for r in rows if is_steady(r, capacity, window)), None)


def fitted(rows: list[dict], steady_t: float) -> list[dict]:
    """The rows the slopes are fitted to: from the later of half-time and steady state."""
    begin = max(rows[-1]["t_s"] / 2, steady_t)
    return [r for r in rows if r["t_s"] >= begin]


def plot(rows: list[dict], path: Path, slopes: dict[str, float], fit_from_s: float, steady_t: float | None) -> None:
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
        if steady_t is not None:
            ax.axvline(steady_t / 60.0, color="k", ls=":", lw=1, label="steady state (table and audit window full)")
        ax.axvspan(fit_from_s / 60.0, t[-1], color="grey", alpha=0.1, label="fitted window")
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
    ap.add_argument("--capacity", type=int, default=5000,
                    help="replay capacity in steps (default 5,000: full within minutes; RLlib's default is 50,000)")
    ap.add_argument("--audit-window", type=int, default=2048,
                    help="enable(audit_window=): retired chunks the audit remembers (default 2,048: full within "
                         "minutes; the plane's default is 65,536)")
    ap.add_argument("--trace-top", type=int, default=0,
                    help="trace the plane actor's Python allocations (tracemalloc) in steady state and report "
                         "the N source lines that grew most (slows the plane; default off)")
    ap.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray instance (default 2)")
    ap.add_argument("--max-plane-slope", type=float, default=32.0,
                    help="MiB/h the plane actor's RSS may grow in the fitted window (default 32)")
    ap.add_argument("--max-auditor-slope", type=float, default=4.0,
                    help="MiB/h the auditor's object graph may grow in the fitted window (default 4)")
    args = ap.parse_args(argv)
    if args.minutes <= 0 or args.interval <= 0:
        ap.error("--minutes and --interval must be positive")
    if args.capacity <= 0 or args.audit_window < 0:
        ap.error("--capacity must be positive and --audit-window non-negative")

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
        algo = enable(build_config(0.5, args.capacity), audit_window=args.audit_window).build_algo()
        try:
            cluster = cluster_of(algo)
            actor = next(iter(cluster._actors.values()))
            first = _probe(actor)
            plane_pid, window, capacity = first["pid"], first["retired_window"], first["capacity"]
            t0 = time.monotonic()
            deadline = t0 + args.minutes * 60.0
            state = {"iteration": 0, "env_steps": 0}
            stop = threading.Event()
            errors: list[BaseException] = []
            traced: list[str] = []  # "started", then "marked"

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
                                "table_steps": probe["table_steps"],
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
                        if args.trace_top and now - t0 >= args.minutes * 30.0:
                            # trace from steady state; mark halfway through what is left of the run
                            if not traced and is_steady(row, capacity, window):
                                ray.get(actor.__ray_call__.remote(_trace_start), timeout=120)
                                traced.append("started")
                                mark_at = now + (deadline - now) / 2
                            elif len(traced) == 1 and now >= mark_at:
                                ray.get(actor.__ray_call__.remote(_trace_mark), timeout=300)
                                traced.append("marked")
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
            if len(traced) == 2:
                top = ray.get(actor.__ray_call__.remote(_trace_top, args.trace_top), timeout=300)
        finally:
            algo.stop()
            final = shutdown(algo) or {}
    finally:
        ray.shutdown()

    steady_t = steady_start(rows, capacity, window)
    fit = fitted(rows, steady_t if steady_t is not None else rows[-1]["t_s"])
    fit_from = fit[0]["t_s"]
    t = np.array([r["t_s"] for r in fit])
    slopes = {k: slope_mib_per_hour(t, np.array([r[k] for r in fit], dtype=float))
              for k in ("plane_rss_mib", "auditor_mib", "driver_rss_mib")}
    violations = int(final.get("violations", -1))
    summary = {
        "minutes": args.minutes, "samples": len(rows), "iterations": rows[-1]["iteration"],
        "env_steps": rows[-1]["env_steps"],
        "bounds": {"replay_capacity_steps": capacity, "audit_window_chunks": window},
        "steady_state_from_min": None if steady_t is None else steady_t / 60.0,
        "fitted_from_min": fit_from / 60.0, "fitted_samples": len(fit),
        "plane_rss_mib": {"first": rows[0]["plane_rss_mib"], "at_fit_start": fit[0]["plane_rss_mib"],
                          "last": rows[-1]["plane_rss_mib"], "slope_fitted_mib_per_h": slopes["plane_rss_mib"],
                          "max_slope": args.max_plane_slope},
        "auditor_mib": {"first": rows[0]["auditor_mib"], "at_fit_start": fit[0]["auditor_mib"],
                        "last": rows[-1]["auditor_mib"], "slope_fitted_mib_per_h": slopes["auditor_mib"],
                        "max_slope": args.max_auditor_slope, "retired_last": rows[-1]["auditor_retired"],
                        "bytes_per_remembered_chunk_last": rows[-1]["auditor_mib"] * MiB
                        / max(1, rows[-1]["auditor_chunks"])},
        "driver_rss_slope_fitted_mib_per_h": slopes["driver_rss_mib"],
        "violations": violations,
        "final_audit": {k: final.get(k) for k in ("ingested_samples", "delivered_samples", "dropped_samples",
                                                  "finished")},
    }
    failures = []
    if violations != 0:
        failures.append(f"final audit: {violations} violations (or no final audit)")
    if steady_t is None or steady_t > rows[-1]["t_s"] / 2:
        failures.append("steady state (replay table full and audit window filled) not reached by half-time: the "
                        "slopes would measure the fill, not a leak; lengthen --minutes or lower --capacity / "
                        "--audit-window")
    if slopes["plane_rss_mib"] > args.max_plane_slope:
        failures.append(f"plane RSS grows {slopes['plane_rss_mib']:.1f} MiB/h > {args.max_plane_slope} in steady state")
    if slopes["auditor_mib"] > args.max_auditor_slope:
        failures.append(f"auditor grows {slopes['auditor_mib']:.2f} MiB/h > {args.max_auditor_slope} in steady state")
    if any(r["auditor_retired"] > window for r in rows):
        failures.append(f"auditor remembers more than its window of {window} retired chunks")
    if top:
        summary["plane_tracemalloc_growth_in_steady_state"] = top
    summary["failures"] = failures
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(rows, out / "soak.png", slopes, fit_from, steady_t)
    print(json.dumps(summary, indent=2))
    print(f"[soak] wrote {out / 'soak.csv'}, {out / 'soak.png'}, {out / 'summary.json'}")
    if failures:
        print("[soak] FAIL: " + "; ".join(failures))
        return 1
    print("[soak] PASS: 0 violations; in steady state the plane's RSS and the auditor's memory stay flat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
