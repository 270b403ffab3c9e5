"""Study part: TorchRL DQN on CartPole-v1 with TorchRL's replay buffer (stock) and with Conduit's.

:func:`run_dqn` is one run, one function per algorithm as ``studies/torchrl_convergence.py`` expects
(``run(side, seed, threshold, budget, log)`` returning the run as plain data: its curve, whether and when
it reached the threshold, the audit's violations). Both sides run the same loop, networks, seeds and
env-step budget; only the buffer line differs::

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(BUFFER), batch_size=BATCH)   # stock
    rb = ConduitReplayBuffer(storage=LazyTensorStorage(BUFFER), batch_size=BATCH)      # Conduit

The recipe is rl-baselines3-zoo's CartPole DQN (``hyperparams/dqn.yml``: lr 2.3e-3, batch 64, 256x256
MLP, train every 256 steps with 128 gradient steps, target network synced every 10 env steps - which
stable-baselines3 counts during collection, so once per training phase -, gradients clipped at norm 10,
exploration 1.0 -> 0.04 over the first 16% of 50k steps, learning starts after 1,000 steps), in TorchRL's own pieces:
``Collector``, ``QValueActor`` + ``EGreedyModule``, ``DQNLoss`` and ``HardUpdate``. The return is the
mean of the last 20 finished training episodes, as in the PPO study and RLlib's
``episode_return_mean``; a run stops when it reaches the threshold (DQN 400, as the RLlib tests).

    python studies/torchrl_dqn.py [--seeds 0] [--sides stock,conduit] [--out results/torchrl_dqn]

writes ``summary.json``, ``curves.csv``, ``report.md`` and ``learning_curves.png`` (drawn by
``studies/rllib_convergence.py``) under ``--out``. ``tests/test_torchrl_dqn_e2e.py`` (``make test-e2e``)
runs both sides for seed 0.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

THRESHOLD = 400.0
BUDGET = 100_000
BUFFER = 100_000
BATCH = 64
FRAMES_PER_BATCH = 256
UPDATES_PER_BATCH = 128
LEARNING_STARTS = 1_000
TARGET_EVERY = UPDATES_PER_BATCH  # zoo's target_update_interval=10 counts env steps: once per training phase
MAX_GRAD_NORM = 10.0
EPS_STEPS = 8_000


def run_dqn(side: str, seed: int, threshold: float = THRESHOLD, budget: int = BUDGET,
            log: Any = print) -> dict[str, Any]:
    """One DQN run, ``side`` ``"stock"`` or ``"conduit"``; returns its curve and whether it reached ``threshold``."""
    import torch
    from tensordict.nn import TensorDictSequential
    from torch import nn
    from torchrl.collectors import Collector
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.envs import GymEnv, RewardSum, TransformedEnv
    from torchrl.modules import MLP, EGreedyModule, QValueActor
    from torchrl.objectives import DQNLoss, HardUpdate

    torch.manual_seed(seed)
    env = TransformedEnv(GymEnv("CartPole-v1"), RewardSum())
    env.set_seed(seed)
    net = MLP(in_features=4, out_features=2, num_cells=[256, 256], activation_class=nn.ReLU)
    actor = QValueActor(net, in_keys=["observation"], spec=env.action_spec)
    greedy = EGreedyModule(env.action_spec, eps_init=1.0, eps_end=0.04, annealing_num_steps=EPS_STEPS)
    explore = TensorDictSequential(actor, greedy)
    loss = DQNLoss(actor, action_space=env.action_spec, delay_value=True, loss_function="smooth_l1")
    loss.make_value_estimator(gamma=0.99)
    target = HardUpdate(loss, value_network_update_interval=TARGET_EVERY)
    opt = torch.optim.Adam(loss.parameters(), lr=2.3e-3)
    if side == "conduit":
        from conduit.runtime.torchrl import ConduitReplayBuffer

        rb = ConduitReplayBuffer(storage=LazyTensorStorage(BUFFER), batch_size=BATCH, seed=seed)
    elif side == "stock":
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(BUFFER), batch_size=BATCH)
    else:
        raise ValueError(f"side must be 'stock' or 'conduit', got {side!r}")
    collector = Collector(env, explore, frames_per_batch=FRAMES_PER_BATCH, total_frames=budget)
    episodes: deque[float] = deque(maxlen=20)
    curve: list[dict] = []
    reached_at = None
    steps = 0
    t0 = time.time()
    audit = None
    try:
        for data in collector:
            flat = data.reshape(-1)
            steps += flat.numel()
            greedy.step(flat.numel())
            done = flat["next", "done"].reshape(-1)
            episodes.extend(flat["next", "episode_reward"].reshape(-1)[done].tolist())
            rb.extend(flat)
            if steps >= LEARNING_STARTS:
                for _ in range(UPDATES_PER_BATCH):
                    sample = rb.sample()
                    value = loss(sample)["loss"]
                    opt.zero_grad()
                    value.backward()
                    torch.nn.utils.clip_grad_norm_(loss.parameters(), MAX_GRAD_NORM)
                    opt.step()
                    target.step()
                    del sample
            collector.update_policy_weights_()
            ret = sum(episodes) / len(episodes) if episodes else float("nan")
            point = {"steps": steps, "return_mean": ret, "wall_s": time.time() - t0}
            if side == "conduit":
                point["violations"] = rb.audit().violations
            curve.append(point)
            if len(curve) % 20 == 0:
                log(f"  dqn [{side}] seed {seed}: {steps} env steps, return {ret:.0f} ({point['wall_s']:.0f} s)")
            if reached_at is None and len(episodes) >= 5 and ret >= threshold:
                reached_at = steps
                log(f"  dqn [{side}] seed {seed}: return {ret:.0f} >= {threshold:.0f} at {steps} env steps "
                    f"({point['wall_s']:.0f} s)")
                break
    finally:
        collector.shutdown()
        if side == "conduit":
            audit = rb.close()
    if reached_at is None:
        log(f"  dqn [{side}] seed {seed}: threshold not reached within {budget} env steps "
            f"(last return {curve[-1]['return_mean'] if curve else float('nan'):.0f})")
    return {"algo": "dqn", "side": side, "seed": seed, "threshold": threshold, "budget": budget,
            "reached_at": reached_at, "reached": reached_at is not None and reached_at <= budget,
            "wall_s": curve[-1]["wall_s"] if curve else 0.0,
            "violations": None if audit is None else int(audit.violations), "curve": curve}


def _rllib_study() -> Any:
    """``studies/rllib_convergence.py`` (its figure and report), loaded by path: studies are scripts."""
    if "rllib_convergence" in sys.modules:
        return sys.modules["rllib_convergence"]
    spec = importlib.util.spec_from_file_location("rllib_convergence", HERE / "rllib_convergence.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0")
    p.add_argument("--sides", default="stock,conduit")
    p.add_argument("--budget", type=int, default=BUDGET)
    p.add_argument("--out", type=Path, default=Path("results/torchrl_dqn"))
    args = p.parse_args(argv)
    study = _rllib_study()
    try:
        sides, seeds = study.sides_and_seeds(args.sides, args.seeds)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    t0 = time.time()
    for seed in seeds:
        for side in sides:
            print(f"dqn [{side}] seed {seed} ...", flush=True)
            runs.append(run_dqn(side, seed, THRESHOLD, args.budget))
            (args.out / "summary.json").write_text(json.dumps({"runs": runs, "wall_s": time.time() - t0},
                                                              indent=1, default=float))
    with open(args.out / "curves.csv", "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(["algo", "side", "seed", "steps", "return_mean", "wall_s"])
        for r in runs:
            for pt in r["curve"]:
                wr.writerow([r["algo"], r["side"], r["seed"], pt["steps"], pt["return_mean"], f"{pt['wall_s']:.2f}"])
    plotted = study.plot(runs, args.out / "learning_curves.png")
    table = study.report(runs)
    (args.out / "report.md").write_text(
        "# Convergence: TorchRL DQN, stock buffer vs Conduit (CartPole-v1)\n\n"
        f"Command: `python studies/torchrl_dqn.py --seeds {','.join(map(str, seeds))} --sides {','.join(sides)}`"
        f"\n\n{table}\n\n" + ("![learning curves](learning_curves.png)\n" if plotted else ""))
    print()
    print(table)
    return 0 if all(r["reached"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
