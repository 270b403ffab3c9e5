"""Study: does Conduit preserve convergence under TorchRL? Learning curves of stock TorchRL and Conduit.

TorchRL on CartPole-v1, the same hyperparameters, seeds and env-step budget on both sides; each run trains
until its mean episode return (the last 20 finished episodes) reaches the threshold (PPO 450, as the RLlib
study) or the budget is spent. Writes per-batch curves (CSV), a summary (JSON), the learning curves (PNG,
drawn by ``studies/rllib_convergence.py``'s :func:`draw`: one colour per side, one line style per seed)
and a short markdown report.

* **DQN** (:func:`run_dqn`): ``studies/torchrl_dqn.py`` (TorchRL's replay buffer vs ``ConduitReplayBuffer``,
  threshold 400, budget 100k env steps).
* **PPO** (:func:`run_ppo`): a ``MultiSyncCollector`` with 2 spawned workers, an actor and a critic
  (64x64 tanh MLPs), TorchRL's ``GAE`` (gamma 0.99, lambda 0.95, standardised) and ``ClipPPOLoss``, 10
  epochs of minibatches of 64 over batches of 2,048 frames, Adam 3e-4. Stock: TorchRL's tutorial loop
  (``for data in collector: gae(data)``, train, ``update_policy_weights_()``). Conduit: the same loop with
  :class:`conduit.runtime.torchrl.OnPolicyFeed` as the collector's ``replay_buffer=`` (OnPolicy, the
  value pass per chunk); its audit must count 0 violations.

    python studies/torchrl_convergence.py [--algos ppo] [--seeds 0] [--sides stock,conduit]
        [--out results/torchrl_convergence] [--replot]

The end-to-end test (``make test-e2e``, tests/test_torchrl_e2e.py) runs this for both sides with one seed.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conduit.studies import load_script

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Setting:
    """One algorithm's convergence setting: its run function, the threshold and the env-step budget."""

    name: str
    threshold: float
    budget: int
    run: Any


def make_cartpole() -> Any:
    from torchrl.envs import GymEnv, RewardSum, TransformedEnv

    return TransformedEnv(GymEnv("CartPole-v1"), RewardSum())


PPO_FRAMES = 2048
PPO_WORKERS = 2


def _ppo_modules(seed: int) -> tuple[Any, Any, Any]:
    import torch
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    torch.manual_seed(seed)
    env = make_cartpole()
    actor = ProbabilisticActor(
        TensorDictModule(nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2)),
                         ["observation"], ["logits"]),
        in_keys=["logits"], spec=env.action_spec, distribution_class=OneHotCategorical, return_log_prob=True)
    env.close()
    value = ValueOperator(nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)),
                          in_keys=["observation"])
    gae = GAE(gamma=0.99, lmbda=0.95, value_network=value, average_gae=True)
    loss = ClipPPOLoss(actor, value, clip_epsilon=0.2, entropy_coeff=0.0, critic_coeff=0.5)
    return actor, gae, loss


def run_ppo(side: str, seed: int, threshold: float, budget: int, log: Any = print) -> dict[str, Any]:
    """One PPO run, stock or Conduit; returns its curve and whether (and when) it reached the threshold."""
    import torch
    from torchrl.collectors import MultiSyncCollector

    actor, gae, loss = _ppo_modules(seed)
    feed = None
    if side == "conduit":
        from conduit.runtime.torchrl import OnPolicyFeed

        feed = OnPolicyFeed(make_cartpole, actor, advantage=gae, frames_per_batch=PPO_FRAMES, num_workers=PPO_WORKERS)
        per_iteration = feed.collector_frames_per_batch
    else:
        per_iteration = PPO_FRAMES
    collector = MultiSyncCollector([make_cartpole] * PPO_WORKERS, actor, frames_per_batch=per_iteration,
                                   total_frames=budget, replay_buffer=feed, track_policy_version=feed is not None)
    collector.set_seed(seed)
    torch.manual_seed(seed + 1)  # minibatch order: the same stream on both sides
    opt = torch.optim.Adam(loss.parameters(), lr=3e-4)
    episodes: deque[float] = deque(maxlen=20)
    curve: list[dict] = []
    reached_at = None
    steps = 0
    t0 = time.time()

    def batches() -> Any:
        if feed is not None:
            yield from feed.iterate(collector)
            return
        for data in collector:
            with torch.no_grad():
                gae(data)
            yield data
            collector.update_policy_weights_()

    try:
        for data in batches():
            flat = data.reshape(-1).contiguous()
            steps += flat.numel()
            done = flat["next", "done"].reshape(-1)
            episodes.extend(flat["next", "episode_reward"].reshape(-1)[done].tolist())
            ret = sum(episodes) / len(episodes) if episodes else float("nan")
            for _ in range(10):
                for idx in torch.randperm(flat.numel()).split(64):
                    lv = loss(flat[idx])
                    total = lv["loss_objective"] + lv["loss_critic"] + lv["loss_entropy"]
                    opt.zero_grad()
                    total.backward()
                    opt.step()
            point = {"steps": steps, "return_mean": ret, "wall_s": time.time() - t0}
            if feed is not None:
                point["violations"] = feed.report()["violations"]
            curve.append(point)
            if reached_at is None and episodes and ret >= threshold:
                reached_at = steps
                log(f"  ppo [{side}] seed {seed}: return {ret:.0f} >= {threshold:.0f} at {steps} env steps "
                    f"({point['wall_s']:.0f} s)")
                break
    finally:
        collector.shutdown()
        audit = feed.close() if feed is not None else None
    if reached_at is None:
        log(f"  ppo [{side}] seed {seed}: threshold not reached within {budget} env steps "
            f"(last return {curve[-1]['return_mean'] if curve else float('nan'):.0f})")
    return {"algo": "ppo", "side": side, "seed": seed, "threshold": threshold, "budget": budget,
            "reached_at": reached_at, "reached": reached_at is not None and reached_at <= budget,
            "wall_s": curve[-1]["wall_s"] if curve else 0.0,
            "violations": None if audit is None else int(audit.violations), "curve": curve}


def _study(name: str) -> Any:
    """Another study script (``studies/<name>.py``), loaded by path: studies are scripts, not a package."""
    return load_script(HERE / f"{name}.py")


def _rllib_study() -> Any:
    """``studies/rllib_convergence.py``: its figure (:func:`draw`/:func:`plot`) and report table."""
    return _study("rllib_convergence")


def run_dqn(side: str, seed: int, threshold: float, budget: int, log: Any = print) -> dict[str, Any]:
    """TorchRL DQN, stock replay buffer vs ``ConduitReplayBuffer`` (``studies/torchrl_dqn.py``)."""
    return _study("torchrl_dqn").run_dqn(side, seed, threshold, budget)


SETTINGS = {"ppo": Setting("ppo", 450.0, 300_000, run_ppo), "dqn": Setting("dqn", 400.0, 100_000, run_dqn)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algos", default="ppo", help=f"comma-separated, from {sorted(SETTINGS)}")
    p.add_argument("--seeds", default="0")
    p.add_argument("--sides", default="stock,conduit")
    p.add_argument("--out", type=Path, default=Path("results/torchrl_convergence"))
    p.add_argument("--replot", action="store_true", help="only redraw the figure from OUT/summary.json")
    args = p.parse_args(argv)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    if bad := [a for a in algos if a not in SETTINGS]:
        print(f"error: --algos: unknown {bad}; known: {sorted(SETTINGS)}", file=sys.stderr)
        return 2
    study = _rllib_study()
    try:
        sides, seeds = study.sides_and_seeds(args.sides, args.seeds)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.replot:
        runs = json.loads((args.out / "summary.json").read_text())["runs"]
        study.plot(runs, args.out / "learning_curves.png")
        return 0
    import torch

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    t0 = time.time()
    for algo in algos:
        s = SETTINGS[algo]
        for seed in seeds:
            for side in sides:
                print(f"{algo} [{side}] seed {seed} ...", flush=True)
                runs.append(s.run(side, seed, s.threshold, s.budget))
                with open(args.out / "summary.json", "w") as fh:
                    json.dump({"runs": runs, "wall_s": time.time() - t0}, fh, indent=1, default=float)
    with open(args.out / "curves.csv", "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(["algo", "side", "seed", "steps", "return_mean", "wall_s"])
        for r in runs:
            for pt in r["curve"]:
                wr.writerow([r["algo"], r["side"], r["seed"], pt["steps"], pt["return_mean"], f"{pt['wall_s']:.2f}"])
    plotted = study.plot(runs, args.out / "learning_curves.png")
    table = study.report(runs)
    (args.out / "report.md").write_text(
        "# Convergence: stock TorchRL vs Conduit (CartPole-v1)\n\n"
        f"Command: `python studies/torchrl_convergence.py --algos {','.join(algos)} --seeds "
        f"{','.join(map(str, seeds))} --sides {','.join(sides)}`\n\n{table}\n\n"
        + ("![learning curves](learning_curves.png)\n" if plotted else ""))
    print()
    print(table)
    return 0 if all(r["reached"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
