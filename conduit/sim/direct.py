"""The plane's route in the simulator: what every algorithm's direct path shares.

With ``route="direct"`` each chunk (or group of ``granularity`` chunks) is written once into a
staging slot on the producer's node (:meth:`DirectRoute.direct_group`), placed in the tier the plane
core's :class:`~conduit.plane.Arbiter` accepts (the policy's choice, checked, or the safe default),
given room by the policy's checked spill moves when the tier is full (:meth:`DirectRoute.make_room`),
and moved towards its consumer when the plane core starts the move
(:meth:`DirectRoute.scheduled_move`). With ``batch_build="per-chunk"`` the learner connector (batch
building, to-tensor, PPO's value pass) runs per chunk as it arrives; with ``"per-batch"`` the learner
builds the whole batch once it has arrived (:meth:`DirectRoute._build_batch_on_learner`).

This module only moves simulated time; every decision comes from :mod:`conduit.plane`.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from conduit.sim.cluster import LearnerRole, RunnerRole
from conduit.topology import TierKind


class DirectRoute:
    """The plane's direct route, shared by the algorithm loops (a mixin of :class:`~conduit.sim.engine.Simulation`)."""

    # ---- the plane's direct path
    def direct_group(self, runner: RunnerRole, learner: LearnerRole, group: list, state: Any) -> Generator:
        """Ingest a group of chunks on the producer's node, place, move, build and ready them."""
        w, p = self.workload, self.plane
        if not self.path.overlap_collection and state is not None:
            yield state.sampling_done
        nbytes = sum(c.nbytes for c, _ in group)
        samples = sum(c.steps for c, _ in group)
        per_chunk = self.path.batch_build == "per-chunk"
        work = p.ingest_per_call + nbytes / p.ingest_copy_bandwidth
        if per_chunk:
            work += self.stock.connector(samples / w.steps_per_row, len(group) * w.chunk_episodes, nbytes * w.frame_stack)
        yield from self.cpu(runner.node, work)
        tier = self.decide_tier(group[0][0], runner, learner)
        if not self.ledger.fits(tier, nbytes):
            yield from self.make_room(tier, nbytes)
        for chunk, _ in group:
            if not self.place_now(chunk.id, tier):
                yield from self.place_in(chunk.id, tier)
        placed = self.topology.tier(tier)
        if placed.kind is TierKind.HBM:
            yield from self.copy_into_gpu(placed.device, runner.node, nbytes, self.path.pinned, runner.memory)
        else:
            yield from self.transfer(runner.memory, placed.device, nbytes)
        if not per_chunk:  # the learner builds the batch once all of it has arrived
            if state is not None:
                state.host_arrived(learner, len(group))
            return
        if tier != learner.device_tier and self.workload.algorithm != "dqn":  # replay samples in place
            yield from self.scheduled_move(learner, [c.id for c, _ in group], nbytes, state)
        if w.value_pass_per_sample > 0 or w.advantage_per_sample > 0:
            yield from self.gae_pass(learner, samples)
        for chunk, trace in group:
            trace.t_ready = self.env.now
        if state is not None:
            state.chunks_ready(learner, len(group))

    def make_room(self, tier: str, nbytes: float) -> Generator:
        """Ask the placement policy to spill from a full tier, validate and execute its moves.

        A move of a chunk that is not in the tier, to an unknown tier, or to one without room is
        rejected (counted) and skipped; if the tier is still full the placement then waits for room."""
        need = self.ledger.used[tier] + nbytes - self.ledger.capacity[tier]
        moves = self.arbiter.spill(tier, need, self.view,
                                   size_in=lambda cid: self.chunk_ledger.size_in(cid, tier))
        for move in moves:
            cid = move.chunk_id
            size = self._chunks[cid].nbytes
            yield from self.transfer(self.topology.tier(tier).device, self.topology.tier(move.dst_tier).device, size)
            if self.chunk_ledger.location(cid) == tier:  # still there (not consumed meanwhile)
                if not self.move_now(cid, move.dst_tier):
                    yield from self.move_to(cid, move.dst_tier)
                self.rec.spilled += 1

    def scheduled_move(self, learner: LearnerRole, cids: list[int], nbytes: float, state: Any) -> Generator:
        """Wait until the plane core starts the move into the learner's tier (the scheduling
        policy's plan, a CPU learner's free run, or the learner waiting), then do it."""
        gate = self.view.enqueue(learner, cids, nbytes)
        yield gate
        source = self.topology.tier(self.chunk_ledger.location(cids[0]))
        yield from self.copy_to_device(learner, nbytes, pinned=source.kind is not TierKind.PAGEABLE,
                                       src_device=source.device)
        for cid in cids:
            if not self.move_now(cid, learner.device_tier):
                yield from self.move_to(cid, learner.device_tier)
        self.view.move_finished(learner, cids)

    def _build_batch_on_learner(self, lr: LearnerRole, batch: list[int]) -> Generator:
        """Per-batch building (the framework's connector on the learner's CPU over the whole batch),
        then one copy of whatever the placement left off the device."""
        w, s = self.workload, self.stock
        built = len(batch) * w.chunk_bytes * w.frame_stack  # the learner connector stacks frames
        yield from self.cpu(lr.node, self.connector_work(lr, len(batch) * w.chunk_steps / w.steps_per_row,
                                                         len(batch) * w.chunk_episodes, built) + s.to_tensor(built))
        by_tier: dict[str, list[int]] = {}
        for cid in batch:
            tier = self.chunk_ledger.location(cid)
            if tier is not None and tier != lr.device_tier:
                by_tier.setdefault(tier, []).append(cid)
        yield from self._copy_in(lr, {tier: len(cids) * w.chunk_bytes for tier, cids in by_tier.items()})
        for cids in by_tier.values():
            for cid in cids:
                if not self.move_now(cid, lr.device_tier):
                    yield from self.move_to(cid, lr.device_tier)

    def _copy_in(self, lr: LearnerRole, bytes_by_tier: dict[str, float]) -> Generator:
        """Copy into the learner's device what lies in other tiers, one copy per source tier
        (pinned DMA unless the source is pageable memory)."""
        for tier, nbytes in sorted(bytes_by_tier.items()):
            source = self.topology.tier(tier)
            yield from self.copy_to_device(lr, nbytes, pinned=source.kind is not TierKind.PAGEABLE,
                                           src_device=source.device)
