"""TorchRL's multi-process collectors writing into ConduitReplayBuffer: each worker writes through its own
shared-memory ring (the main process only samples), and TorchRL's installed files are untouched."""

import base64
import hashlib
import time
from importlib import metadata

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("torchrl")
pytest.importorskip("gymnasium")

from torchrl.collectors import MultiSyncCollector
from torchrl.envs import GymEnv

from conduit.runtime.torchrl import ConduitReplayBuffer


def make_env():
    return GymEnv("CartPole-v1")


@pytest.mark.slow
def test_multisync_collector_workers_write_through_their_own_rings():
    torch.set_num_threads(1)
    rb = ConduitReplayBuffer(capacity=5_000, batch_size=32, alpha=0.6, beta=0.4, seed=0)
    collector = MultiSyncCollector([make_env, make_env], policy=None, frames_per_batch=64, total_frames=640,
                                   replay_buffer=rb)
    try:
        # the collector wrote one fake frame (building the plane) and emptied it before pickling the buffer
        assert rb.layout is not None and len(rb) == 0
        for _ in collector:
            pass
    finally:
        collector.shutdown()
    assert rb.write_count == 640  # counted by the workers, in shared memory
    deadline = time.monotonic() + 60
    while len(rb) < 640 and time.monotonic() < deadline:  # the plane's ring thread ingests asynchronously
        time.sleep(0.05)
    assert len(rb) == 640
    metrics = rb.metrics()
    assert len(metrics["rings"]) == 2 and rb.stats()["conduit"]["workers"] == 2  # one ring per worker
    audit = rb.audit()
    assert audit.ingested_samples == 641  # 640 through the rings, plus the fake frame the main process wrote
    s = rb.sample()
    assert s["observation"].shape == (32, 4) and s["observation"].dtype == torch.float32
    assert s["next", "reward"].eq(1).all()  # CartPole pays 1 per step
    assert torch.isin(s["collector", "traj_ids"], torch.arange(0, 1000)).all()
    s["td_error"] = torch.rand(32)
    rb.update_tensordict_priority(s)
    del s
    report = rb.close()
    assert report.violations == 0


def _record_mismatches(dist_name: str) -> tuple[int, list[str]]:
    dist = metadata.distribution(dist_name)
    checked, bad = 0, []
    for f in dist.files or []:
        if f.hash is None:  # RECORD itself, .pyc files compiled after install
            continue
        algo, expected = f.hash.mode, f.hash.value
        data = f.locate().read_bytes()
        digest = base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode()
        checked += 1
        if digest != expected or (f.size is not None and len(data) != f.size):
            bad.append(str(f))
    return checked, bad


@pytest.mark.parametrize("dist_name", ["torchrl", "tensordict"])
def test_torchrl_files_match_their_wheel_record(dist_name):
    """Public APIs only: nothing of TorchRL or tensordict is patched or rewritten in place."""
    checked, bad = _record_mismatches(dist_name)
    assert checked > 50
    assert bad == [], f"{dist_name} files differ from the wheel's RECORD: {bad[:10]}"
