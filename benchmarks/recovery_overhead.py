"""What the plane's recovery log costs (``ExperiencePlane(recovery_dir=...)``, on by default under RLlib).

Two figures, in one process on this machine:

* per ingest + replay sample + release of a small (CartPole-sized) chunk, with and without the log
  (every audit event is pickled and written before it applies);
* one compaction (the snapshot, ``fsync``'ed, that replaces the log every ``snapshot_every`` records)
  with the auditor holding its full retired-chunk window (65,536 chunks), the largest state a long
  run reaches.

Run: ``.venv/bin/python benchmarks/recovery_overhead.py``.
"""

from __future__ import annotations

import shutil
import tempfile
import time

import numpy as np

from conduit.chunk import Chunk
from conduit.contracts import Replay
from conduit.plane.recovery import JournaledAuditor, RecoveryLog
from conduit.runtime.plane import ExperiencePlane
from conduit.runtime.schema import Schema

SCHEMA = Schema.of({"obs": ((4,), "float32"), "next_obs": ((4,), "float32"), "a": ((), "int64"),
                    "r": ((), "float32")})
CONTRACT = Replay(capacity=20000, replay_ratio=1.0, min_size=32, error_buffer=1e9)
N = 3000


def per_step(journaled: bool) -> float:
    d = tempfile.mkdtemp() if journaled else None
    plane = ExperiencePlane(SCHEMA, CONTRACT, batch_steps=32, capacities={"pageable": "64 MiB"}, recovery_dir=d,
                            seed=0)
    chunk = {k: np.zeros((32, *c.shape), c.dtype) for k, c in zip(SCHEMA.names, SCHEMA.columns, strict=True)}
    t = time.perf_counter()
    for i in range(N):
        plane.ingest(chunk, policy_version=0, chunk_id=f"c{i}")
        plane.next_batch(timeout=5).release()
    dt = (time.perf_counter() - t) / N
    plane.close()
    if d:
        shutil.rmtree(d, ignore_errors=True)
    return dt


def compaction() -> float:
    d = tempfile.mkdtemp()
    log = RecoveryLog(d)
    log.load()
    aud = JournaledAuditor(CONTRACT)
    for i in range(JournaledAuditor.RETIRED_WINDOW + 1000):
        aud.ingested(Chunk(f"c{i}", "p", "n0", 32, 1280, 0, float(i)), float(i))
        aud.evicted(f"c{i}", float(i))
    t = time.perf_counter()
    log.compact({"auditor": aud.state()})
    dt = time.perf_counter() - t
    log.close(remove=True)
    shutil.rmtree(d, ignore_errors=True)
    return dt


def main() -> None:
    for _ in range(2):  # alternate, twice: the machine is shared
        plain, logged = per_step(False), per_step(True)
        print(f"ingest+sample+release: {plain * 1e6:.0f} us plain, {logged * 1e6:.0f} us with the recovery log "
              f"(+{(logged - plain) * 1e6:.0f} us)")
    print(f"one compaction with a full retired window: {compaction() * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
