"""APPO large-obs Learner.update (500 samples, one torch thread, process CPU) alone vs beside a one-thread torch
conv loop in another process (the other vCPU busy, as in a real run): paired, interleaved."""
import multiprocessing as mp, statistics, sys, time
sys.path.insert(0, "studies")


def spin(stop):
    import torch
    torch.set_num_threads(1)
    x = torch.randn(8, 4, 84, 84); conv = torch.nn.Conv2d(4, 32, 8, stride=4)
    while not stop.is_set():
        conv(x).sum()


def main():
    import validation as val
    from conduit.runtime import calibrate as cal
    from ray.rllib.core.learner.training_data import TrainingData
    from ray.rllib.core.learner.learner import Learner
    from ray.rllib.policy.sample_batch import MultiAgentBatch
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME
    study = val.experience_path_study()
    name = "appo-largeobs-2r-1l"
    w, cfg = val.study_configs(study, study.parse_args([]), [name])[name]
    cfg = cfg.copy(copy_frozen=False).learners(num_learners=0)
    with cal._torch_threads(1):
        runner = cal._local_env_runner(cfg)
        learner = cfg.build_learner(env=runner.env)
        ts = {NUM_ENV_STEPS_SAMPLED_LIFETIME: 10**6}
        eps = runner.sample(num_timesteps=500, random_actions=False)
        full = learner._make_batch_if_necessary(TrainingData(episodes=eps))
        b = MultiAgentBatch({k: v[:500] for k, v in full.policy_batches.items()}, env_steps=500)

        def timed(reps=3):
            out = []
            for _ in range(reps):
                c0 = time.process_time()
                Learner.update(learner, training_data=TrainingData(batch=b), timesteps=ts, _no_metrics_reduce=True)
                out.append(time.process_time() - c0)
            return statistics.median(out)
        timed(1)
        alone, busy = [], []
        for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 8):
            alone.append(timed())
            stop = mp.Event(); p = mp.Process(target=spin, args=(stop,)); p.start(); time.sleep(0.5)
            busy.append(timed())
            stop.set(); p.join()
            print(f"pair {i}: alone {alone[-1]*1e3:.0f} ms, beside a conv loop {busy[-1]*1e3:.0f} ms", flush=True)
        print(f"median alone {statistics.median(alone)*1e3:.0f} ms, busy {statistics.median(busy)*1e3:.0f} ms, "
              f"ratio {statistics.median(x / y for x, y in zip(busy, alone)):.3f}")
        learner.shutdown()


if __name__ == "__main__":
    main()
