"""TorchRL PPO, stock loop vs the Conduit loop, with the same collectors, side by side in one run.

Both loops use a ``MultiSyncCollector`` with ``--workers`` spawned workers, the same seeded actor and
critic, TorchRL's ``GAE`` (``average_gae=True``) and ``ClipPPOLoss``, ``--epochs`` epochs of minibatches of
``--minibatch`` frames over each batch of ``--frames`` frames, and ``torch.set_num_threads(1)`` (two torch
threads on this 2-core machine made small writes 40x slower, issue 17):

* ``stock``: TorchRL's PPO tutorial loop: ``for data in collector: gae(data)``, train, then
  ``collector.update_policy_weights_()``. Each worker's batch reaches the main process through the
  collector's shared-memory buffers; the main process runs GAE over the gathered batch.
* ``conduit``: :class:`conduit.runtime.torchrl.OnPolicyFeed` as the collector's ``replay_buffer=``: each
  worker writes its batch (``--rounds`` collector iterations per batch) straight into the plane through its
  own shared-memory ring, and the feed runs the value pass on each chunk as it lands (OnPolicy).

Two workloads: ``pixels`` (84x84x4 uint8 observations, a small Atari-style CNN actor and critic, a
synthetic env that replays a bank of random frames) and ``cartpole`` (``CartPole-v1``, MLPs).

Per update, with docs/metrics.md's definitions, measured the same way on both sides:

* **exposed experience-path latency** = ``t_batch_ready - max(t_learner_free, t_last_needed_chunk_created)``:
  ``t_batch_ready`` when the loop holds the batch with its advantages (after GAE), ``t_learner_free`` when
  the previous update's last optimizer step ended, ``t_last_needed_chunk_created`` the wall-clock time of
  the batch's last env step (a ``StepClock`` transform stamps every step, in the workers);
* **iteration time** = between the starts of consecutive updates (consecutive ``t_batch_ready``).

Medians over the updates after the first (warm-up), and the ratio conduit / stock. The target
(issue 17): exposed latency with large observations <= 0.3x of stock. The Conduit side's audit must
count 0 violations.

    .venv/bin/python benchmarks/torchrl_ppo.py [--workloads pixels cartpole] [--updates 6] [--out FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from typing import Any

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import MultiSyncCollector
from torchrl.data import Bounded, Composite, OneHot, Unbounded
from torchrl.envs import EnvBase, GymEnv, Transform, TransformedEnv
from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from conduit.runtime.torchrl import OnPolicyFeed


class StepClock(Transform):
    """Stamps every reset and step with the wall clock (``"t_step"``, float64): when each frame was made."""

    def __init__(self) -> None:
        super().__init__(in_keys=[], out_keys=["t_step"])

    def _call(self, next_tensordict: Any) -> Any:
        next_tensordict.set("t_step", torch.tensor([time.time()], dtype=torch.float64))
        return next_tensordict

    def _reset(self, tensordict: Any, tensordict_reset: Any) -> Any:
        return self._call(tensordict_reset)

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        observation_spec["t_step"] = Unbounded(shape=(1,), dtype=torch.float64)
        return observation_spec


class PixelEnv(EnvBase):
    """84x84x4 uint8 frames from a bank of random frames, 4 actions, reward 1, episodes of 50-300 steps."""

    def __init__(self, seed: int = 0):
        super().__init__(batch_size=torch.Size([]))
        self.observation_spec = Composite(pixels=Bounded(0, 255, shape=(4, 84, 84), dtype=torch.uint8))
        self.action_spec = OneHot(4)
        self.reward_spec = Unbounded(shape=(1,))
        self._gen = torch.Generator().manual_seed(seed)
        self._bank = torch.randint(0, 256, (32, 4, 84, 84), dtype=torch.uint8, generator=self._gen)
        self._t = 0
        self._len = 100

    def _frame(self) -> torch.Tensor:
        return self._bank[self._t % len(self._bank)].clone()

    def _reset(self, tensordict: Any = None, **kwargs: Any) -> TensorDict:
        self._t = 0
        self._len = int(torch.randint(50, 300, (1,), generator=self._gen))
        false = torch.zeros(1, dtype=torch.bool)
        return TensorDict({"pixels": self._frame(), "done": false, "terminated": false.clone()}, [])

    def _step(self, tensordict: TensorDict) -> TensorDict:
        self._t += 1
        end = torch.tensor([self._t >= self._len])
        return TensorDict({"pixels": self._frame(), "reward": torch.ones(1), "done": end, "terminated": end.clone()},
                          [])

    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            self._gen.manual_seed(seed)


def make_pixels() -> TransformedEnv:
    return TransformedEnv(PixelEnv(), StepClock())


def make_cartpole() -> TransformedEnv:
    return TransformedEnv(GymEnv("CartPole-v1"), StepClock())


class _Pixels(nn.Module):
    """uint8 frames -> the small Atari CNN's features (Mnih et al. 2013)."""

    def __init__(self, out: int):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(4, 16, 8, 4), nn.ReLU(), nn.Conv2d(16, 32, 4, 2), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(2592, 256), nn.ReLU(), nn.Linear(256, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-3]
        y = self.net(x.reshape(-1, *x.shape[-3:]).float() / 255.0)
        return y.reshape(*lead, -1)


WORKLOADS = {
    "pixels": {"make_env": make_pixels, "obs": "pixels", "frames": 1024, "minibatch": 256},
    "cartpole": {"make_env": make_cartpole, "obs": "observation", "frames": 2048, "minibatch": 512},
}


def _modules(workload: str, seed: int) -> tuple[Any, Any, Any, Any]:
    torch.manual_seed(seed)
    spec = WORKLOADS[workload]
    env = spec["make_env"]()
    n_act = env.action_spec.shape[-1]
    if workload == "pixels":
        pol, val = _Pixels(n_act), _Pixels(1)
    else:
        pol = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_act))
        val = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    actor = ProbabilisticActor(TensorDictModule(pol, [spec["obs"]], ["logits"]), in_keys=["logits"],
                               spec=env.action_spec, distribution_class=OneHotCategorical, return_log_prob=True)
    env.close()
    value = ValueOperator(val, in_keys=[spec["obs"]])
    gae = GAE(gamma=0.99, lmbda=0.95, value_network=value, average_gae=True)
    loss = ClipPPOLoss(actor, value, clip_epsilon=0.2, entropy_coeff=0.01)
    return actor, value, gae, loss


def _update(loss: Any, opt: Any, data: Any, epochs: int, minibatch: int) -> None:
    """The same PPO update on both sides: epochs of shuffled minibatches of one contiguous flat batch (the
    stock collector's gathered batch is materialised here, as the tutorial's extend into a storage does)."""
    flat = data.reshape(-1).contiguous()
    for _ in range(epochs):
        for idx in torch.randperm(flat.numel()).split(minibatch):
            lv = loss(flat[idx])
            total = lv["loss_objective"] + lv["loss_critic"] + lv["loss_entropy"]
            opt.zero_grad()
            total.backward()
            opt.step()


def _record(rows: list[dict], data: Any, t_free: float, t_ready: float) -> None:
    rows.append({"t_ready": t_ready, "t_free": t_free, "t_last_created": float(data["next", "t_step"].max())})


def run_stock(workload: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = WORKLOADS[workload]
    actor, _value, gae, loss = _modules(workload, args.seed)
    opt = torch.optim.Adam(loss.parameters(), 3e-4)
    frames = args.frames or spec["frames"]
    collector = MultiSyncCollector([spec["make_env"]] * args.workers, actor, frames_per_batch=frames,
                                   total_frames=frames * (args.updates + 1))
    rows: list[dict] = []
    try:
        t_free = time.time()
        for data in collector:
            with torch.no_grad():
                gae(data)
            _record(rows, data, t_free, time.time())
            _update(loss, opt, data, args.epochs, args.minibatch or spec["minibatch"])
            t_free = time.time()
            collector.update_policy_weights_()
    finally:
        collector.shutdown()
    return {"rows": rows}


def run_conduit(workload: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = WORKLOADS[workload]
    actor, _value, gae, loss = _modules(workload, args.seed)
    opt = torch.optim.Adam(loss.parameters(), 3e-4)
    frames = args.frames or spec["frames"]
    feed = OnPolicyFeed(spec["make_env"], actor, advantage=gae, frames_per_batch=frames, num_workers=args.workers,
                        rounds=args.rounds)
    collector = MultiSyncCollector([spec["make_env"]] * args.workers, actor,
                                   frames_per_batch=feed.collector_frames_per_batch,
                                   total_frames=frames * (args.updates + 1), replay_buffer=feed,
                                   track_policy_version=True)
    rows: list[dict] = []
    try:
        t_free = time.time()
        for data in feed.iterate(collector):
            _record(rows, data, t_free, time.time())
            _update(loss, opt, data, args.epochs, args.minibatch or spec["minibatch"])
            t_free = time.time()
    finally:
        collector.shutdown()
    report = feed.report()
    audit = feed.close()
    return {"rows": rows, "violations": audit.violations, "feed": report["feed"],
            "plane_exposed_s": report["metrics"]["exposed_experience_path_p50_s"]}


def _summary(rows: list[dict]) -> dict[str, float]:
    rows = rows[1:]  # the first update fills empty pipelines (warm-up)
    exposed = [max(0.0, r["t_ready"] - max(r["t_free"], r["t_last_created"])) for r in rows]
    iteration = [b["t_ready"] - a["t_ready"] for a, b in itertools.pairwise(rows)]
    return {"exposed_p50_s": statistics.median(exposed), "iteration_p50_s": statistics.median(iteration),
            "updates": len(rows)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", default=["pixels", "cartpole"], choices=sorted(WORKLOADS))
    ap.add_argument("--updates", type=int, default=6, help="measured updates per side (after one warm-up)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4, help="Conduit: collector iterations per batch")
    ap.add_argument("--frames", type=int, default=None, help="frames per batch (default per workload)")
    ap.add_argument("--minibatch", type=int, default=None)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.updates < 3:
        ap.error("--updates must be >= 3 (medians of iteration times need two intervals after the warm-up)")
    torch.set_num_threads(1)
    out: dict[str, Any] = {"args": vars(args), "workloads": {}}
    print(f"{'workload':9} {'side':8} {'exposed p50 s':>14} {'iteration p50 s':>16} {'violations':>10}")
    for workload in args.workloads:
        res = {"stock": run_stock(workload, args), "conduit": run_conduit(workload, args)}
        for side, r in res.items():
            r.update(_summary(r["rows"]))
            print(f"{workload:9} {side:8} {r['exposed_p50_s']:14.4f} {r['iteration_p50_s']:16.3f} "
                  f"{r.get('violations', '-'):>10}")
        ratio = {"exposed": res["conduit"]["exposed_p50_s"] / max(res["stock"]["exposed_p50_s"], 1e-9),
                 "iteration": res["conduit"]["iteration_p50_s"] / res["stock"]["iteration_p50_s"]}
        print(f"{workload:9} {'ratio':8} {ratio['exposed']:14.3f} {ratio['iteration']:16.3f}   (conduit / stock)")
        out["workloads"][workload] = {**res, "ratio": ratio}
        sys.stdout.flush()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
