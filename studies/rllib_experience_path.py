"""Study: stock RLlib 2.60's experience path, measured with Conduit's non-invasive hooks.

Runs PPO / APPO / DQN on CartPole-v1 and on :class:`~conduit.runtime.rllib.envs.LargeObsEnv`
(84x84x4 uint8) with :func:`conduit.runtime.rllib.instrument.instrument`, for a few iterations each,
writes per-iteration segments (JSON + CSV) and medians (CSV), and prints a table of medians to
compare with ``shared/reference/rllib-2.60-stock-cpu.md``.

Each workload can run on several *sides*: ``stock`` (RLlib as configured) and, once it exists,
``conduit`` (``conduit.runtime.rllib.enable(config, **options)``). The instrument is applied after
the side, so both are measured by the same hooks.

    python studies/rllib_experience_path.py [--algos ppo,appo,dqn] [--envs cartpole,largeobs]
        [--iters 4] [--warmup 1] [--sides stock] [--workloads NAME,...]
        [--out results/rllib_experience_path]

Workloads (``--workloads`` picks by name; otherwise every default workload matching ``--algos`` and
``--envs``):

- ``ppo-cartpole-2r-local``: PPO stock defaults (batch 4000, 30 epochs x minibatch 128),
  2 EnvRunners, local learner (reference column 1);
- ``ppo-largeobs-2r-1l``: PPO on 84x84x4 uint8, CNN [16,8,4],[32,4,2],[64,3,2], batch 2000,
  2 epochs x minibatch 500, 2 EnvRunners, 1 remote learner (reference column 3);
- ``ppo-largeobs-1r-1l``: the same with 1 EnvRunner;
- ``appo-cartpole-2r-1l`` / ``appo-largeobs-2r-1l``: APPO stock defaults (2 EnvRunners, 1 learner,
  circular buffer 8 x 2), except ``min_time_s_per_iteration`` (``--appo-iter-s``, default 5 s,
  stock 10 s);
- ``dqn-cartpole-1r``: DQN, 1 EnvRunner, one env step per sample call and one update per step
  (stock defaults), with ``--dqn-steps`` (default 250, stock 1000) env steps per iteration and
  learning starting after as many steps, so the first iteration only fills the buffer;
- ``dqn-largeobs-1r`` (not run unless named in ``--workloads``): DQN with the CNN, replay capacity
  10,000.

Isolation: every (workload, side) runs in a fresh interpreter with its own Ray instance
(``--in-process`` runs them all in this one). Measured here: in one shared driver process the side
that runs second was up to 30% slower on DQN (whichever side it was: the driver is DQN's learner and
carries the first run's heap), so a ratio from one process mostly measured the order.

Resources: Ray gets ``num_cpus=2``; EnvRunners get fractional CPUs (``(2 - learners) / runners``) so
that 2 EnvRunners and 1 remote learner fit (the actual cores are shared anyway). Timings on a
shared 2-core machine are noisy: compare medians, and rerun before trusting a difference.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from conduit.runtime.rllib.envs import CNN_FILTERS


def _stock(cfg, **_options):
    return cfg


def _conduit(cfg, **options):
    from conduit.runtime.rllib import enable

    return enable(cfg, **options)


#: How each side turns a stock config into the config it runs. Add a side here.
SIDES: dict[str, Callable] = {"stock": _stock, "conduit": _conduit}


def side_available(name: str) -> str | None:
    """``None`` when side ``name`` can run, else the reason it cannot."""
    if name not in SIDES:
        return f"unknown side '{name}' (known: {', '.join(SIDES)})"
    if name == "conduit":
        try:
            from conduit.runtime.rllib import enable  # noqa: F401
        except ImportError as exc:
            return f"conduit.runtime.rllib.enable is not importable ({exc}); the Conduit side does not exist yet"
    return None


# ------------------------------------------------------------------------------------------------
# Workloads
# ------------------------------------------------------------------------------------------------
@dataclass
class Workload:
    name: str
    algo: str
    env: str
    build: Callable[[argparse.Namespace], object]
    default: bool = True
    notes: str = ""
    extra: dict = field(default_factory=dict)


def _cpus_per_runner(runners: int, learners: int) -> float:
    if runners <= 0:
        return 1.0
    return max(0.25, min(1.0, (2 - max(learners, 0)) / runners))


def _largeobs_env(cfg, seed: int = 0):
    from conduit.runtime.rllib.envs import LARGE_OBS_ENV, register_envs

    register_envs()
    return cfg.environment(LARGE_OBS_ENV, env_config={"obs_shape": (84, 84, 4), "episode_len": 200, "seed": seed})


def _cnn(cfg):
    from conduit.runtime.rllib.envs import uint8_cnn

    return uint8_cnn(cfg, conv_filters=CNN_FILTERS)


def _ppo(env: str, runners: int, learners: int):
    def build(args):
        from ray.rllib.algorithms.ppo import PPOConfig

        cfg = PPOConfig().env_runners(
            num_env_runners=runners, num_cpus_per_env_runner=_cpus_per_runner(runners, learners)
        )
        cfg = cfg.learners(num_learners=learners)
        if env == "cartpole":
            return cfg.environment("CartPole-v1")  # stock defaults: batch 4000, 30 x 128
        cfg = _cnn(_largeobs_env(cfg))
        return cfg.training(train_batch_size_per_learner=2000, minibatch_size=500, num_epochs=2)

    return build


def _appo(env: str):
    def build(args):
        from ray.rllib.algorithms.appo import APPOConfig

        cfg = APPOConfig().env_runners(num_env_runners=2, num_cpus_per_env_runner=_cpus_per_runner(2, 1))
        cfg = cfg.learners(num_learners=1).reporting(min_time_s_per_iteration=args.appo_iter_s)
        if env == "cartpole":
            return cfg.environment("CartPole-v1")
        return _cnn(_largeobs_env(cfg))

    return build


def _dqn(env: str):
    def build(args):
        from ray.rllib.algorithms.dqn import DQNConfig

        steps = args.dqn_steps
        cfg = DQNConfig().env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        cfg = cfg.reporting(min_sample_timesteps_per_iteration=steps)
        cfg = cfg.training(num_steps_sampled_before_learning_starts=steps)
        if env == "cartpole":
            return cfg.environment("CartPole-v1")
        cfg = _cnn(_largeobs_env(cfg))
        return cfg.training(replay_buffer_config={"capacity": 10_000})

    return build


WORKLOADS: list[Workload] = [
    Workload("ppo-cartpole-2r-local", "ppo", "cartpole", _ppo("cartpole", 2, 0), notes="reference column 1"),
    Workload("ppo-largeobs-2r-1l", "ppo", "largeobs", _ppo("largeobs", 2, 1), notes="reference column 3"),
    Workload("ppo-largeobs-1r-1l", "ppo", "largeobs", _ppo("largeobs", 1, 1)),
    Workload("appo-cartpole-2r-1l", "appo", "cartpole", _appo("cartpole"), notes="reference APPO section"),
    Workload("appo-largeobs-2r-1l", "appo", "largeobs", _appo("largeobs")),
    Workload("dqn-cartpole-1r", "dqn", "cartpole", _dqn("cartpole"), notes="reference column 4 (per env step)"),
    Workload("dqn-largeobs-1r", "dqn", "largeobs", _dqn("largeobs"), default=False),
]


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------
class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raises :class:`_Timeout` in the main thread after ``seconds`` (0: no deadline)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def handler(signum, frame):
        raise _Timeout(f"workload exceeded {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def enable_options(args) -> dict:
    """``--enable-options`` (a JSON object) as keyword arguments of ``enable()`` (e.g. ``params_file``)."""
    text = getattr(args, "enable_options", "") or ""
    if not text:
        return {}
    options = json.loads(text)
    if not isinstance(options, dict):
        raise SystemExit(f"--enable-options must be a JSON object, got {text!r}")
    return options


def run_workload(w: Workload, side: str, args) -> list[dict]:
    from conduit.runtime.rllib.instrument import instrument, segments

    options = enable_options(args) if side == "conduit" else {}
    cfg = SIDES[side](w.build(args), **options)
    cfg = instrument(cfg)
    rows: list[dict] = []
    algo = None
    t0 = time.time()
    try:
        with _deadline(args.workload_timeout):
            algo = cfg.build_algo()
            build_s = time.time() - t0
            for i in range(args.iters):
                result = algo.train()
                seg = segments(result)
                meta = result["conduit_instrument"]["meta"]
                row = {
                    "workload": w.name,
                    "side": side,
                    "algo": w.algo,
                    "env": w.env,
                    "iteration": i + 1,
                    "warmup": i < args.warmup,
                    "mode": meta.get("mode"),
                    "build_s": build_s,
                    **seg,
                }
                rows.append(row)
                if "conduit" in result:
                    row["plane_violations"] = float(result["conduit"]["violations"])
                print(
                    f"  {w.name} [{side}] iter {i + 1}/{args.iters}: "
                    f"train {seg['train_iteration_ms']:.0f} ms, EXP {seg['exp_ms']:.1f} ms "
                    f"({seg['exp_share']:.2%}), exposed {seg['exposed_ms']:.1f} ms, "
                    f"experience share {seg['experience_share']:.2%}",
                    flush=True,
                )
    except _Timeout as exc:
        print(f"  {w.name} [{side}]: {exc}; keeping {len(rows)} iterations", flush=True)
    finally:
        if algo is not None:
            # APPO/IMPALA's EnvRunnerStateServer (a threaded actor) was seen to outlive
            # ray.shutdown() as an orphan process now and then: kill it explicitly.
            server = getattr(algo, "_env_runner_state_server", None)
            with contextlib.suppress(Exception):
                algo.stop()
            if side == "conduit":
                from conduit.runtime.rllib import shutdown

                final = shutdown(algo)
                print(f"  {w.name} [{side}]: final audit: {final['violations']} violations, "
                      f"{final['delivered_samples']} samples delivered", flush=True)
                for row in rows:
                    row["audit_violations"] = float(final["violations"])
            if server is not None:
                import ray

                with contextlib.suppress(Exception):
                    ray.kill(server, no_restart=True)
    return rows


# ------------------------------------------------------------------------------------------------
# Reporting
# ------------------------------------------------------------------------------------------------
TABLE = [
    ("train_iteration_ms", "iter", 0),
    ("iteration_ms", "upd.period", 1),
    ("sampling_ms", "sampling", 0),
    ("a_ms", "a", 1),
    ("a2_ms", "a2", 1),
    ("b_ms", "b", 1),
    ("learner_queue_ms", "b.queue", 1),
    ("get_ms", "get", 1),
    ("c_ms", "c", 1),
    ("d_ms", "d", 1),
    ("gae_ms", "GAE", 1),
    ("buffer_add_ms", "buf.add", 0),
    ("buffer_sample_ms", "buf.smpl", 0),
    ("learner_update_ms", "lrn.upd", 0),
    ("weight_sync_ms", "w.sync", 1),
    ("exp_ms", "EXP", 1),
    ("exp_share", "EXP%", None),
    ("exp_share_with_gae", "+GAE%", None),
    ("exposed_per_update_ms", "exposed/upd", 1),
    ("chunk_path_ms", "chunk.path", 1),
    ("experience_share", "exp.share", None),
    ("batch_mb", "batchMB", 2),
    ("env_steps_sampled", "steps", 0),
]


def medians(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["workload"], r["side"]), []).append(r)
    out = []
    for (wl, side), rs in groups.items():
        measured = [r for r in rs if not r["warmup"]] or rs
        med = {"workload": wl, "side": side, "mode": rs[0]["mode"], "iterations": len(measured)}
        for key in rs[0]:
            if isinstance(rs[0][key], float) and key != "build_s":
                vals = [r[key] for r in measured if isinstance(r[key], float) and math.isfinite(r[key])]
                med[key] = statistics.median(vals) if vals else float("nan")
        out.append(med)
    return out


def format_table(meds: list[dict]) -> str:
    header = ["workload", "side", "n"] + [h for _, h, _ in TABLE]
    lines = []
    for m in meds:
        cells = [m["workload"], m["side"], str(m["iterations"])]
        for key, _, nd in TABLE:
            v = m.get(key, float("nan"))
            cells.append(f"{v:.2%}" if nd is None else f"{v:.{nd}f}")
        lines.append(cells)
    widths = [max(len(header[i]), *(len(row[i]) for row in lines)) for i in range(len(header))]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(row) for row in lines])


RATIOS = [
    ("exposed_per_update_ms", "exposed/upd"),
    ("iteration_ms", "iteration"),
    ("train_iteration_ms", "train() wall"),
    ("chunk_path_ms", "chunk path"),
    ("experience_share", "exp.share"),
]

#: Targets (conduit / stock, medians) from the RLlib integration issue; other workloads: iteration <= 1.05x.
TARGETS = {
    "ppo-largeobs-1r-1l": {"exposed_per_update_ms": 0.2, "iteration_ms": 0.9},
    "dqn-cartpole-1r": {"exposed_per_update_ms": 0.3, "iteration_ms": 0.85},
}


def ratios(meds: list[dict]) -> list[dict]:
    """conduit / stock for every workload that ran on both sides, with the targets checked."""
    by = {(m["workload"], m["side"]): m for m in meds}
    out = []
    for (wl, side), m in by.items():
        stock = by.get((wl, "stock"))
        if side != "conduit" or stock is None:
            continue
        row = {"workload": wl}
        for key, _ in RATIOS:
            s, c = stock.get(key, float("nan")), m.get(key, float("nan"))
            row[key] = c / s if s and math.isfinite(s) and math.isfinite(c) else float("nan")
        targets = TARGETS.get(wl, {"iteration_ms": 1.05})
        row["targets"] = {k: (t, bool(row[k] <= t)) for k, t in targets.items()}
        out.append(row)
    return out


def format_ratios(rows: list[dict]) -> str:
    lines = ["workload".ljust(24) + "".join(h.rjust(14) for _, h in RATIOS) + "  targets"]
    for r in rows:
        cells = "".join(f"{r[k]:14.3f}" for k, _ in RATIOS)
        tgt = ", ".join(f"{k.replace('_ms', '').replace('_per_update', '')} <= {t}x "
                        f"{'PASS' if ok else 'MISS'}" for k, (t, ok) in r["targets"].items())
        lines.append(r["workload"].ljust(24) + cells + "  " + tgt)
    return "\n".join(lines)


def write_outputs(rows: list[dict], meds: list[dict], out: Path, args, wall_s: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if rows:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(out / "per_iteration.csv", "w", newline="") as fh:
            wr = csv.DictWriter(fh, fieldnames=keys, restval="")
            wr.writeheader()
            wr.writerows(rows)
    if meds:
        keys = list(dict.fromkeys(k for m in meds for k in m))
        with open(out / "medians.csv", "w", newline="") as fh:
            wr = csv.DictWriter(fh, fieldnames=keys)
            wr.writeheader()
            wr.writerows(meds)
    summary = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "wall_s": wall_s,
        "units": "ms per training iteration (sync: sums over the iteration; async: a..GAE are means per "
        "sample result / learner batch); shares are fractions",
        "reference": "shared/reference/rllib-2.60-stock-cpu.md",
        "medians": meds,
        "iterations": rows,
    }
    with open(out / "per_iteration.json", "w") as fh:
        json.dump(summary, fh, indent=1, default=float)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algos", default="ppo,appo,dqn")
    p.add_argument("--envs", default="cartpole,largeobs")
    p.add_argument("--workloads", default="", help="comma-separated workload names (overrides --algos/--envs)")
    p.add_argument("--sides", default="stock", help=f"comma-separated, from: {', '.join(SIDES)}")
    p.add_argument("--iters", type=int, default=4, help="training iterations per workload and side")
    p.add_argument("--warmup", type=int, default=1, help="leading iterations left out of the medians")
    p.add_argument("--appo-iter-s", type=float, default=5.0, help="APPO min_time_s_per_iteration (stock: 10)")
    p.add_argument("--dqn-steps", type=int, default=250, help="DQN env steps per iteration (stock: 1000)")
    p.add_argument("--workload-timeout", type=float, default=600.0, help="seconds per workload and side (0: none)")
    p.add_argument("--out", type=Path, default=Path("results/rllib_experience_path"))
    p.add_argument("--enable-options", default="",
                   help='JSON object of keyword arguments for enable() on the conduit side, e.g. '
                        '\'{"params_file": "tuned.json"}\'')
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("--ray-logs", action="store_true", help="forward Ray worker logs to this terminal")
    p.add_argument("--quiet-summary", action="store_true", help=argparse.SUPPRESS)  # a child of run_isolated
    p.add_argument("--in-process", action="store_true",
                   help="run every workload and side in this interpreter and one Ray instance (default: a fresh "
                        "interpreter per workload and side, so no run inherits another's driver state)")
    return p.parse_args(argv)


def select(args) -> list[Workload]:
    if args.workloads:
        names = [n.strip() for n in args.workloads.split(",") if n.strip()]
        known = {w.name: w for w in WORKLOADS}
        bad = [n for n in names if n not in known]
        if bad:
            raise SystemExit(f"unknown workload(s): {', '.join(bad)}; known: {', '.join(known)}")
        return [known[n] for n in names]
    algos = {a.strip() for a in args.algos.split(",") if a.strip()}
    envs = {e.strip() for e in args.envs.split(",") if e.strip()}
    return [w for w in WORKLOADS if w.default and w.algo in algos and w.env in envs]


def run_isolated(w: Workload, side: str, args) -> list[dict]:
    """``run_workload`` in a fresh interpreter (its own driver and Ray instance); its rows."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="cstudy-") as tmp:
        cmd = [sys.executable, os.path.abspath(__file__), "--workloads", w.name, "--sides", side,
               "--iters", str(args.iters), "--warmup", str(args.warmup), "--appo-iter-s", str(args.appo_iter_s),
               "--dqn-steps", str(args.dqn_steps), "--workload-timeout", str(args.workload_timeout),
               "--out", tmp, "--quiet-summary"] + (["--ray-logs"] if args.ray_logs else []) \
            + (["--enable-options", args.enable_options] if getattr(args, "enable_options", "") else [])
        rc = subprocess.run(cmd, check=False).returncode
        path = Path(tmp) / "per_iteration.json"
        if rc != 0 or not path.exists():
            print(f"  {w.name} [{side}]: the run failed (exit {rc}); no rows", flush=True)
            return []
        return json.loads(path.read_text())["iterations"]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for w in WORKLOADS:
            print(f"{w.name:24s} {'default' if w.default else 'on request':10s} {w.notes}")
        return 0
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    for s in sides:
        why = side_available(s)
        if why:
            print(f"error: side '{s}' cannot run: {why}", file=sys.stderr)
            return 2
    workloads = select(args)
    if not workloads:
        print("error: no workload matches --algos/--envs/--workloads", file=sys.stderr)
        return 2

    import ray

    t_start = time.time()
    rows: list[dict] = []
    if args.in_process or len(workloads) * len(sides) == 1:
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir="/tmp/ray-cstudy", log_to_driver=args.ray_logs)
        try:
            for w in workloads:
                for s in sides:
                    print(f"{w.name} [{s}] ...", flush=True)
                    rows.extend(run_workload(w, s, args))
        finally:
            ray.shutdown()
    else:
        for w in workloads:
            for s in sides:
                rows.extend(run_isolated(w, s, args))
    wall = time.time() - t_start
    meds = medians(rows)
    write_outputs(rows, meds, args.out, args, wall)
    if args.quiet_summary:
        return 0
    print()
    print(f"Medians over iterations after {args.warmup} warm-up (ms per training iteration; see --help):")
    print(format_table(meds))
    rat = ratios(meds)
    if rat:
        print("\nConduit / stock (medians; < 1 is better):")
        print(format_ratios(rat))
        with open(args.out / "ratios.json", "w") as fh:
            json.dump(rat, fh, indent=1, default=float)
    print(f"\nwall time {wall:.0f} s; written {args.out}/per_iteration.csv, medians.csv, per_iteration.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
