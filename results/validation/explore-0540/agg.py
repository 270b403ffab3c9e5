"""APPO's learner thread after every update (broadcast_interval=1 -> BATCHES_PER_AGGREGATION=1,
impala_learner.py: _LearnerThread.step): get_state(inference_only) + ray.put of the module state,
then metrics.reduce(). Timed in process CPU next to the update itself, on the appo-largeobs config."""
import os
import statistics
import sys
import time

sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[3]))
os.environ.setdefault('RAY_AUTH_MODE', 'disabled')
import torch

torch.set_num_threads(1)
from ray.rllib.core import COMPONENT_RL_MODULE
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.policy.sample_batch import MultiAgentBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from conduit.runtime.calibrate import _local_env_runner, default_workload_configs

name = sys.argv[1] if len(sys.argv) > 1 else 'appo-largeobs'
cfg = default_workload_configs()[name][1].copy(copy_frozen=False).learners(num_learners=0)
runner = _local_env_runner(cfg)
learner = cfg.build_learner(env=runner.env)
n = int(cfg.train_batch_size_per_learner)
eps = runner.sample(num_timesteps=n, random_actions=False)
full = learner._make_batch_if_necessary(TrainingData(episodes=eps))
batch = MultiAgentBatch({k: v[:n] for k, v in full.policy_batches.items()}, env_steps=n)
ts = {NUM_ENV_STEPS_SAMPLED_LIFETIME: 10**6}
def cpu(f):
    c = time.process_time(); f(); return time.process_time() - c
up, st, red = [], [], []
for i in range(12):
    up.append(cpu(lambda: Learner.update(learner, training_data=TrainingData(batch=batch), timesteps=ts, _no_metrics_reduce=True)))
    def state():
        s = learner.get_state(components=[COMPONENT_RL_MODULE + "/" + mid for mid in learner.module.keys()], inference_only=True)  # noqa: SIM118
        return s
    st.append(cpu(state))
    red.append(cpu(lambda: learner.metrics.reduce()))
m = statistics.median
print(f"{name}: batch {n}: update {m(up[2:])*1e3:.1f} ms CPU; get_state {m(st[2:])*1e3:.2f} ms; metrics.reduce {m(red[2:])*1e3:.1f} ms (medians of 10)")
