"""Study: does Conduit preserve convergence? Learning curves of stock RLlib and Conduit, side by side.

PPO and DQN on CartPole-v1, the same hyperparameters and seeds on both sides; each run trains until
its mean episode return reaches the threshold (PPO 450, DQN 400) or the env-step budget is spent.
Writes per-iteration curves (CSV), a summary (JSON: env steps to the threshold per run, and whether
it was reached within the budget), a plot of the curves (PNG) and a short markdown report.

    python studies/rllib_convergence.py [--algos ppo,dqn] [--seeds 0,1,2] [--sides stock,conduit]
        [--out results/rllib_convergence] [--full] [--resume] [--replot]

Everything goes under ``--out`` (default ``results/rllib_convergence/``): ``summary.json``,
``curves.csv``, ``report.md`` and the figure ``learning_curves.png`` (one colour per side, one line
style per seed, the threshold as a labelled line). ``--replot`` redraws the figure from an existing
``summary.json`` without training; :func:`draw` takes the runs as plain dicts, so it also draws
synthetic curves (``tests/test_study_plots.py``).

``--full`` keeps training to the budget after the threshold (longer; nicer curves). The end-to-end
tests (``make test-e2e``, tests/test_rllib_e2e.py) run this script for Conduit with one seed and
check the summary.

The budgets are the env steps stock RLlib needs with these settings and seeds on this machine
(measured with this script for seeds 0-2: PPO 40-56k), with headroom: PPO 100k, DQN 100k.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@dataclass(frozen=True)
class Setting:
    """One algorithm's convergence setting: how to build its config, the threshold and the budget."""

    name: str
    threshold: float
    budget: int  # env steps
    build: object


def _ppo(seed: int):
    from ray.rllib.algorithms.ppo import PPOConfig

    return (PPOConfig().environment("CartPole-v1").debugging(seed=seed)
            .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
            .learners(num_learners=0)
            .training(lr=3e-4, num_epochs=6, vf_loss_coeff=0.01, train_batch_size_per_learner=4000,
                      minibatch_size=128))


def _dqn(seed: int):
    from ray.rllib.algorithms.dqn import DQNConfig

    return (DQNConfig().environment("CartPole-v1").debugging(seed=seed)
            .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5, num_envs_per_env_runner=2,
                         rollout_fragment_length=4)
            .reporting(min_sample_timesteps_per_iteration=1000)
            .rl_module(model_config={"fcnet_hiddens": [256], "fcnet_activation": "tanh",
                                     "epsilon": [(0, 1.0), (10_000, 0.02)]})
            .training(lr=5e-4, train_batch_size_per_learner=64, n_step=3, double_q=True, dueling=True,
                      training_intensity=32, num_steps_sampled_before_learning_starts=1000,
                      target_network_update_freq=500,
                      replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 50_000}))


SETTINGS = {
    "ppo": Setting("ppo", 450.0, 100_000, _ppo),
    "dqn": Setting("dqn", 400.0, 100_000, _dqn),
}


def run(setting: Setting, side: str, seed: int, *, full: bool = False, log=print) -> dict:
    """Train one run; returns its curve and whether (and when) it reached the threshold."""
    cfg = setting.build(seed)
    if side == "conduit":
        from conduit.runtime.rllib import enable

        cfg = enable(cfg)
    algo = cfg.build_algo()
    curve: list[dict] = []
    reached_at = None
    audit = None
    t0 = time.time()
    try:
        while True:
            r = algo.train()
            env = r.get("env_runners", {})
            steps = int(env.get("num_env_steps_sampled_lifetime", 0) or 0)
            ret = env.get("episode_return_mean")
            point = {"steps": steps, "return_mean": float(ret) if ret is not None else float("nan"),
                     "wall_s": time.time() - t0}
            if "conduit" in r:
                point["violations"] = int(r["conduit"]["violations"])
            curve.append(point)
            if reached_at is None and ret is not None and ret >= setting.threshold:
                reached_at = steps
                log(f"  {setting.name} [{side}] seed {seed}: return {ret:.0f} >= {setting.threshold:.0f} "
                    f"at {steps} env steps ({point['wall_s']:.0f} s)")
            if (reached_at is not None and not full) or steps >= setting.budget:
                break
    finally:
        algo.stop()
        if side == "conduit":
            from conduit.runtime.rllib import shutdown

            audit = shutdown(algo)
    if reached_at is None:
        log(f"  {setting.name} [{side}] seed {seed}: threshold not reached within {setting.budget} env steps "
            f"(last return {curve[-1]['return_mean']:.0f})")
    return {"algo": setting.name, "side": side, "seed": seed, "threshold": setting.threshold,
            "budget": setting.budget, "reached_at": reached_at,
            "reached": reached_at is not None and reached_at <= setting.budget,
            "wall_s": curve[-1]["wall_s"] if curve else 0.0,
            "violations": None if audit is None else int(audit["violations"]), "curve": curve}


#: one colour per side, one line style per seed (cycled beyond four seeds)
SIDE_COLORS = {"stock": "tab:blue", "conduit": "tab:orange"}
SEED_STYLES = ("-", "--", ":", "-.")
THRESHOLD_STYLE = {"color": "black", "linestyle": (0, (6, 2, 1, 2)), "linewidth": 1.0}


def draw(runs: list[dict]):
    """The learning-curve figure for ``runs`` (dicts as :func:`run` returns them: ``algo``, ``side``,
    ``seed``, ``threshold``, ``reached_at`` and ``curve`` points with ``steps`` and ``return_mean``).

    One panel per algorithm; the colour says the side (stock or Conduit), the line style the seed, and
    the threshold is a labelled horizontal line, with a dot where each run first reached it. Needs
    matplotlib only (no RLlib), so it can be drawn from synthetic or saved curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    algos = sorted({r["algo"] for r in runs})
    seeds = sorted({r["seed"] for r in runs})
    sides = [s for s in SIDE_COLORS if any(r["side"] == s for r in runs)]
    style = {seed: SEED_STYLES[i % len(SEED_STYLES)] for i, seed in enumerate(seeds)}
    fig, axes = plt.subplots(1, len(algos), figsize=(6.5 * len(algos), 4.3), squeeze=False)
    for ax, algo in zip(axes[0], algos, strict=True):
        mine = [r for r in runs if r["algo"] == algo]
        for r in sorted(mine, key=lambda r: (r["side"], r["seed"])):
            color = SIDE_COLORS.get(r["side"], "gray")
            ax.plot([p["steps"] for p in r["curve"]], [p["return_mean"] for p in r["curve"]], color=color,
                    linestyle=style[r["seed"]], linewidth=1.4, alpha=0.9, gid=f"{r['side']}/seed{r['seed']}")
            if r.get("reached_at") is not None:
                ax.plot([r["reached_at"]], [r["threshold"]], "o", color=color, markersize=4)
        thr = mine[0]["threshold"]
        ax.axhline(thr, gid="threshold", **THRESHOLD_STYLE)
        ax.annotate(f"threshold {thr:g}", xy=(0.01, thr), xycoords=("axes fraction", "data"),
                    xytext=(0, 3), textcoords="offset points", fontsize=8)
        ax.set_title(f"{algo.upper()} CartPole-v1: stock vs Conduit")
        ax.set_xlabel("env steps sampled")
        ax.set_ylabel("mean episode return")
        handles = [Line2D([], [], color=SIDE_COLORS[s], linewidth=2, label=s) for s in sides]
        handles += [Line2D([], [], color="dimgray", linestyle=style[seed], label=f"seed {seed}") for seed in seeds]
        handles.append(Line2D([], [], label=f"threshold ({thr:g})", **THRESHOLD_STYLE))
        handles.append(Line2D([], [], marker="o", linestyle="", color="dimgray", markersize=4,
                              label="first reached"))
        ax.legend(handles=handles, fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot(runs: list[dict], path: Path) -> bool:
    """Draw :func:`draw`'s figure into ``path``; False when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    import matplotlib.pyplot as plt

    fig = draw(runs)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def report(runs: list[dict]) -> str:
    lines = ["| algo | side | seed | env steps to threshold | within budget | wall s | audit violations |",
             "|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['algo']} | {r['side']} | {r['seed']} | {r['reached_at'] or '-'} | "
                     f"{'yes' if r['reached'] else 'NO'} (budget {r['budget']}) | {r['wall_s']:.0f} | "
                     f"{'-' if r['violations'] is None else r['violations']} |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algos", default="ppo,dqn")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--sides", default="stock,conduit")
    p.add_argument("--full", action="store_true", help="train to the budget even after the threshold")
    p.add_argument("--out", type=Path, default=Path("results/rllib_convergence"))
    p.add_argument("--resume", action="store_true",
                   help="keep the runs already in OUT/summary.json (same algo, side, seed, budget) and run the rest")
    p.add_argument("--replot", action="store_true",
                   help="only redraw OUT/learning_curves.png from OUT/summary.json (no training, no Ray)")
    return p.parse_args(argv)


def sides_and_seeds(sides_arg: str, seeds_arg: str) -> tuple[list[str], list[int]]:
    """``--sides`` and ``--seeds`` (comma-separated) as lists; ValueError naming the option when bad.
    Shared by the convergence studies of every framework."""
    sides = [s.strip() for s in sides_arg.split(",") if s.strip()]
    if any(s not in ("stock", "conduit") for s in sides):
        raise ValueError(f"--sides must be from stock, conduit; got {sides}")
    try:
        seeds = [int(s) for s in seeds_arg.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {seeds_arg!r}") from None
    return sides, seeds


def main(argv=None) -> int:
    args = parse_args(argv)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    bad = [a for a in algos if a not in SETTINGS]
    if bad:
        print(f"error: --algos: unknown {bad}; known: {sorted(SETTINGS)}", file=sys.stderr)
        return 2
    try:
        sides, seeds = sides_and_seeds(args.sides, args.seeds)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    if args.replot:
        summary = args.out / "summary.json"
        if not summary.exists():
            print(f"error: --replot: no {summary}; run the study first", file=sys.stderr)
            return 2
        if not plot(json.loads(summary.read_text())["runs"], args.out / "learning_curves.png"):
            print("error: --replot needs matplotlib", file=sys.stderr)
            return 2
        print(f"written {args.out / 'learning_curves.png'}")
        return 0

    import ray

    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    if args.resume and (args.out / "summary.json").exists():
        kept = json.loads((args.out / "summary.json").read_text())["runs"]
        runs = [r for r in kept if r["algo"] in SETTINGS and r["budget"] == SETTINGS[r["algo"]].budget]
        print(f"resuming: {len(runs)} runs kept from {args.out / 'summary.json'}")
    done = {(r["algo"], r["side"], r["seed"]) for r in runs}
    t0 = time.time()
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir="/tmp/ray-cconv", log_to_driver=False)
    try:
        for algo in algos:
            for seed in seeds:
                for side in sides:
                    if (algo, side, seed) in done:
                        continue
                    print(f"{algo} [{side}] seed {seed} ...", flush=True)
                    runs.append(run(SETTINGS[algo], side, seed, full=args.full))
                    with open(args.out / "summary.json", "w") as fh:  # after every run: partial results survive
                        json.dump({"runs": runs, "wall_s": time.time() - t0}, fh, indent=1, default=float)
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
    with open(args.out / "curves.csv", "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(["algo", "side", "seed", "steps", "return_mean", "wall_s"])
        for r in runs:
            for p in r["curve"]:
                wr.writerow([r["algo"], r["side"], r["seed"], p["steps"], p["return_mean"], f"{p['wall_s']:.2f}"])
    plotted = plot(runs, args.out / "learning_curves.png")
    table = report(runs)
    (args.out / "report.md").write_text(
        "# Convergence: stock RLlib vs Conduit (CartPole-v1)\n\n"
        f"Command: `python studies/rllib_convergence.py --algos {','.join(algos)} --seeds "
        f"{','.join(map(str, seeds))} --sides {','.join(sides)}`\n\n{table}\n\n"
        + ("![learning curves](learning_curves.png)\n" if plotted else ""))
    print()
    print(table)
    print(f"\nwall time {time.time() - t0:.0f} s; written {args.out}/summary.json, curves.csv, report.md"
          + (", learning_curves.png" if plotted else ""))
    return 0 if all(r["reached"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
