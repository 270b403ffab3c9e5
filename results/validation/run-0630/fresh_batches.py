import sys, time, statistics
sys.path.insert(0, "studies")
import validation as val
from conduit.runtime import calibrate as cal
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.core.learner.learner import Learner
from ray.rllib.policy.sample_batch import MultiAgentBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME
study = val.experience_path_study()
name = "appo-largeobs-2r-1l"
configs = val.study_configs(study, study.parse_args([]), [name])
w, cfg = configs[name]
cfg = cfg.copy(copy_frozen=False).learners(num_learners=0)
with cal._torch_threads(1):
    runner = cal._local_env_runner(cfg)
    learner = cfg.build_learner(env=runner.env)
    ts = {NUM_ENV_STEPS_SAMPLED_LIFETIME: 10**6}
    n = 500
    def batch():
        eps = runner.sample(num_timesteps=n, random_actions=False)
        full = learner._make_batch_if_necessary(TrainingData(episodes=eps))
        return MultiAgentBatch({k: v[:n] for k, v in full.policy_batches.items()}, env_steps=n)
    def timed(b):
        c0, w0 = time.process_time(), time.perf_counter()
        Learner.update(learner, training_data=TrainingData(batch=b), timesteps=ts, _no_metrics_reduce=True)
        return time.process_time() - c0, time.perf_counter() - w0
    cached = batch()
    timed(cached)
    rep, fresh = [], []
    for i in range(6):
        rep.append(timed(cached))
        fresh.append(timed(batch()))
    print("repeated cpu", [round(c*1e3) for c, _ in rep], "median", round(statistics.median(c for c, _ in rep)*1e3))
    print("fresh    cpu", [round(c*1e3) for c, _ in fresh], "median", round(statistics.median(c for c, _ in fresh)*1e3))
    import resource
    learner.shutdown()
