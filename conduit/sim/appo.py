"""APPO/IMPALA in the simulator: bounded staleness, by the stock route and by the plane's.

Stock RLlib 2.60 (``impala.py: IMPALA.training_step``): runners ``ray.put`` their episodes and return
references; the driver polls them (``foreach_env_runner_async``, *a*) and hands the references to the
learners (*b*); the learner resolves them with ``ray.get`` (transfer + deserialize), runs its
connector (*c*), and a GPU loader thread (``_GPULoaderThread``) does to-tensor plus the pageable copy
(*d*) into the learner thread's circular buffer (``CircularBuffer``), which trains.

The plane's route: chunks go to their learner's queue through
:class:`~conduit.sim.direct.DirectRoute`; each update gathers fresh chunks within the lag bound and
reuses buffered ones up to ``max_reuse`` (the contract's rules: :mod:`conduit.plane.rules`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator

import simpy

from conduit.chunk import Chunk
from conduit.sim.cluster import LearnerRole, RunnerRole
from conduit.sim.metrics import ChunkTrace, UpdateTrace


class AppoLoop:
    """APPO/IMPALA's loop (a mixin of :class:`~conduit.sim.engine.Simulation`)."""

    # ================================================================== APPO / IMPALA (bounded staleness)
    def appo_loop(self) -> Generator:
        w = self.workload
        learners = self.layout.learners
        queues = {lr.id: _ReadyQueue(self.env) for lr in learners}
        self._runner_version = {r.id: 0 for r in self.layout.runners}
        self._stop = False
        for r in self.layout.runners:
            self.env.process(self.appo_runner(r, queues))
        t_free = {lr.id: 0.0 for lr in learners}
        reuse: dict[str, deque] = {lr.id: deque() for lr in learners}
        uses: dict[int, int] = {}
        for k in range(self.iterations):
            self.version = k
            gathers = [self.env.process(self.appo_gather(lr, k, queues[lr.id], reuse[lr.id], uses)) for lr in learners]
            yield simpy.AllOf(self.env, gathers)
            t_start = self.env.now
            updates = []
            finished: list[int] = []
            for lr, g in zip(learners, gathers, strict=True):
                cids, last_created, ready, done = g.value
                finished.extend(done)
                updates.append(UpdateTrace(k, lr.id, len(cids) * w.chunk_steps, t_free[lr.id], last_created,
                                           ready, t_start, math.nan))
                self.auditor.delivered(k, [(c, range(w.chunk_steps)) for c in cids], t_start,
                                       checksums={c: self._checksum(c) for c in cids})
            for cid in finished:  # used max_reuse times: leaves the plane
                self.release(cid)
            yield simpy.AllOf(self.env, [self.env.process(self.compute[lr.device].run(
                w.update_overhead + u.samples * w.update_time_per_sample)) for lr, u in zip(learners, updates, strict=True)])
            for u in updates:
                u.t_end = t_free[u.learner] = self.env.now
            self.rec.updates.extend(updates)
            self.rec.span(k, "update", t_start, self.env.now)
            if (k + 1) % w.broadcast_interval == 0:
                self.env.process(self.broadcast(k + 1))
            self._tick(k)
        self._stop = True
        # retire what is left: still-queued chunks are dropped (counted), buffers released
        for lr in learners:
            for cid in list(queues[lr.id].items) + [c for c, _ in reuse[lr.id]]:
                if cid in self._chunks:
                    self.auditor.dropped(cid, self.env.now, "end-of-run")
                    self.release(cid)

    def broadcast(self, version: int) -> Generator:
        yield self.env.timeout(self.workload.weight_sync_time)
        for rid in self._runner_version:
            self._runner_version[rid] = max(self._runner_version[rid], version)

    def appo_runner(self, runner: RunnerRole, queues: dict) -> Generator:
        w = self.workload
        i = 0
        group: list[tuple[Chunk, ChunkTrace]] = []
        while not self._stop:
            yield self.env.timeout(self.sample_time(w.fragment_length))
            if self._stop:
                return
            if self.path.route == "driver":
                target = self.layout.learners[i % len(self.layout.learners)]
            else:
                target = self.layout.target(runner, i // self.path.granularity)
            i += 1
            chunk, trace = self.new_chunk(runner, target, self._runner_version[runner.id])
            queue = queues[target.id]
            if self.path.route == "driver":
                self.env.process(self.stock_appo_path(runner, target, chunk, queue))
            else:
                group.append((chunk, trace))
                queue.in_flight += 1  # counted from creation, so backpressure sees coalescing chunks
                if len(group) >= self.path.granularity:
                    handoff = self.env.process(self._direct_then_queue(runner, target, group, queue))
                    group = []
                    if not self.path.overlap_collection:  # the runner waits for its chunks to be collected
                        yield handoff
            # backpressure: a runner does not outrun its learner's queue by more than max_lag batches;
            # one about to wait first hands over what it is coalescing (its learner may need it)
            while len(queue.items) + queue.in_flight > (w.max_lag + 2) * w.chunks_per_batch and not self._stop:
                if group:
                    self.env.process(self._direct_then_queue(runner, target, group, queue))
                    group = []
                yield queue.changed()

    def _direct_then_queue(self, runner: RunnerRole, target: LearnerRole, group: list, queue) -> Generator:
        yield from self.direct_group(runner, target, group, None)
        for chunk, _ in group:
            queue.in_flight -= 1
            queue.put(chunk.id)

    def stock_appo_path(self, runner: RunnerRole, lr: LearnerRole, chunk: Chunk, queue) -> Generator:
        """ray.put on the runner; the driver polls the reference; the learner resolves it, builds and
        copies it (GPU loader thread) into the circular buffer."""
        s, w = self.stock, self.workload
        queue.in_flight += 1
        t0 = self.env.now
        yield from self.cpu(runner.node, s.sample_serialize(w.chunk_episodes, chunk.nbytes))
        yield from self.place_in(chunk.id, self.host_tier(runner.memory))
        yield from self.on_driver(s.rpc_overhead + s.driver_bookkeeping)
        t_b = self.env.now
        yield from self.on_driver(s.rpc_overhead / 4)  # hand the reference list to the learner actor
        t_get = self.env.now
        yield from self.transfer(runner.memory, lr.memory, chunk.nbytes)
        yield from self.cpu(lr.node, s.sample_deserialize(w.chunk_episodes, chunk.nbytes))
        yield from self.move_to(chunk.id, lr.pageable)
        t_c = self.env.now
        yield from self.cpu(lr.node, s.connector(chunk.steps / w.steps_per_row, chunk.nbytes))
        t_d = self.env.now
        yield from self.cpu(lr.node, s.to_tensor(chunk.nbytes))
        yield from self.copy_to_device(lr, chunk.nbytes, pinned=False)
        yield from self.move_to(chunk.id, lr.device_tier)
        self.rec.chunks[chunk.id].t_ready = self.env.now
        if lr.index == 0:
            k = self.version
            self.rec.span(k, "a", t0, t_b)
            self.rec.span(k, "b", t_b, t_get)
            self.rec.span(k, "get", t_get, t_c)
            self.rec.span(k, "c", t_c, t_d)
            self.rec.span(k, "d", t_d, self.env.now)
        queue.in_flight -= 1
        queue.put(chunk.id)

    def appo_gather(self, lr: LearnerRole, k: int, queue, reuse: deque, uses: dict) -> Generator:
        """Assemble update k's batch: fresh chunks within the lag bound first; when none is ready,
        reuse buffered chunks (circular buffer) up to ``max_reuse``; otherwise wait."""
        w = self.workload
        batch: list[int] = []
        waiting = False
        while len(batch) < w.chunks_per_batch:
            while queue.items and len(batch) < w.chunks_per_batch:
                cid = queue.items.popleft()
                queue.notify()
                if self.rules.stale_on_arrival(self._chunks[cid].policy_version, next_update=k, current=k):
                    self.auditor.dropped(cid, self.env.now, "stale")
                    self.release(cid)
                    continue
                batch.append(cid)
            if len(batch) >= w.chunks_per_batch:
                break
            # reuse from the circular buffer only what is still admissible
            while reuse and len(batch) < w.chunks_per_batch:
                cid, _ = reuse.popleft()
                if not self.rules.too_old((self._chunks[cid].policy_version,), k) and uses[cid] < w.max_reuse:
                    batch.append(cid)
                else:
                    self.release(cid)
            if len(batch) < w.chunks_per_batch:
                if not waiting:  # the learner asks once per batch; wake-ups are not new requests
                    self.view.learner_waiting(lr)
                    waiting = True
                yield queue.changed()
        if self.path.route == "direct" and self.path.batch_build == "per-batch":
            yield from self._build_batch_on_learner(lr, batch)
            for cid in batch:
                if math.isnan(self.rec.chunks[cid].t_ready):
                    self.rec.chunks[cid].t_ready = self.env.now
        self.view.learner_busy(lr)
        fresh = [self._chunks[c].t_created for c in batch if uses.get(c, 0) == 0]
        done = []
        for cid in batch:
            uses[cid] = uses.get(cid, 0) + 1
            if uses[cid] < w.max_reuse:
                reuse.append((cid, uses[cid]))
            else:
                done.append(cid)
        return batch, max(fresh, default=0.0), self.env.now, done


class _ReadyQueue:
    """Chunks ready for a learner (APPO), with an event that fires on every change."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.items: deque[int] = deque()
        self.in_flight = 0
        self._changed = env.event()

    def put(self, cid: int) -> None:
        self.items.append(cid)
        self.notify()

    def notify(self) -> None:
        event, self._changed = self._changed, self.env.event()
        event.succeed()

    def changed(self) -> simpy.Event:
        return self._changed
