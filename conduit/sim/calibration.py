"""The anchor of the ``rllib-stock`` baseline: stock RLlib's measured experience path.

``REFERENCE`` restates the segment medians of ``shared/reference/rllib-2.60-stock-cpu.md`` (2-core
VM, ray 2.60.0, torch 2.13.0, new API stack) for the two runs the simulator must reproduce: PPO with
84x84x4 uint8 observations (2 runners, 1 remote learner; ms per iteration) and DQN on CartPole (1
runner, local learner; ms per ~1,082-step iteration). The machine is ``conduit/topologies/reference-2core.yaml``,
the runs are the ``ref-ppo-atari`` and ``ref-dqn-cartpole`` workloads, and :func:`compare` simulates
them under ``rllib-stock`` and puts each segment's share of the iteration beside the measured one.

**This is not validation.** The ``ref-*`` workloads copy measured segments (sampling, update, GAE,
weight sync), so those rows are *in-sample*: they only check that the simulator executes the copied
figures as intended (:data:`IN_SAMPLE`, held to :data:`TOLERANCE`). The other rows -- segments *a*,
*a2*, *b*, *c*, *d*, the replay buffer's add and sample, and the experience-path total -- come from
microbenchmarks of primitives (:mod:`conduit.sim.params`; *c*, *d* and *a2* did restate this table
until the learner connector, ``NumpyToTensor`` and the driver's bookkeeping were measured) and are
*out of sample*: their error is a finding, reported, never tuned away. Validation against real runs is ``studies/validation.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

REFERENCE_SOURCE = "shared/reference/rllib-2.60-stock-cpu.md"

#: segment -> ms per iteration, as measured. Segment names follow the reference (a, a2, b, c, d, gae)
#: and the simulator's spans (sampling, update, weight_sync, buffer_add, buffer_sample).
REFERENCE: dict[str, dict[str, float]] = {
    "ref-ppo-atari": {
        "iteration": 6178, "sampling": 1382, "a": 12.0, "a2": 0.8, "b": 13.6, "c": 21.1, "d": 0.3,
        "gae": 1510, "update": 3103, "weight_sync": 7.3,
    },
    "ref-dqn-cartpole": {
        "iteration": 19039, "sampling": 4712, "a": 1757, "b": 63, "c": 1095, "d": 139,
        "buffer_add": 490, "buffer_sample": 1882, "update": 3303, "weight_sync": 2372,
    },
}
#: env steps (= updates) per measured DQN iteration: 1,882 ms of buffer sampling at 1.739 ms a call
DQN_STEPS_PER_ITERATION = 1082
TOLERANCE = 0.25
#: segments the simulation takes from the reference itself (workload fields or borrowed costs)
IN_SAMPLE = frozenset({"sampling", "gae", "update", "weight_sync"})


@dataclass(frozen=True)
class SegmentComparison:
    workload: str
    segment: str
    measured_share: float
    simulated_share: float

    @property
    def relative_error(self) -> float:
        return self.simulated_share / self.measured_share - 1.0

    @property
    def in_sample(self) -> bool:
        """Whether the simulation takes this segment from the reference (see the module docstring)."""
        return self.segment in IN_SAMPLE

    @property
    def ok(self) -> bool:
        return abs(self.relative_error) <= TOLERANCE


def compare(iterations: int = 6, seed: int = 0) -> list[SegmentComparison]:
    """Simulate both reference runs and compare every measured segment's share of the iteration.

    The cold-call law (:mod:`conduit.sim.raycalls`) and the warm-up debt (:mod:`conduit.sim.coldwork`) are off
    here: the ``ref-*`` presets copy whole measured calls and pieces (``runner_call_overhead``,
    ``weight_sync_time``), which already hold whatever the reference runs paid for calls made cold and for work
    done right after a sleep; charging either on top would count it twice."""
    from conduit.sim.params import StockCosts
    from conduit.sim.run import simulate

    no_law = StockCosts().without_cold_calls().without_warm_up_debt()
    rows = []
    for workload, measured in REFERENCE.items():
        its = iterations if workload == "ref-ppo-atari" else iterations * 10
        result = simulate("reference-2core", workload, "rllib-stock", iterations=its, seed=seed, stock_costs=no_law)
        iteration = result.metrics["iteration_time_s"]
        for segment, ms in measured.items():
            if segment == "iteration":
                continue
            sim_share = result.segments.get(segment, 0.0) / iteration
            rows.append(SegmentComparison(workload, segment, ms / measured["iteration"], sim_share))
        exp = ("a", "a2", "b", "c", "d", "buffer_add", "buffer_sample")
        measured_exp = sum(measured.get(k, 0.0) for k in exp) / measured["iteration"]
        rows.append(SegmentComparison(workload, "EXP (a..d + buffer)", measured_exp,
                                      sum(result.segments.get(k, 0.0) for k in exp) / iteration))
    return rows


def format_table(rows: list[SegmentComparison]) -> str:
    lines = [f"{'workload':<18} {'segment':<20} {'measured':>9} {'simulated':>10} {'error':>8}  {'source':<13} ok"]
    for r in rows:
        lines.append(f"{r.workload:<18} {r.segment:<20} {100 * r.measured_share:>8.3f}% "
                     f"{100 * r.simulated_share:>9.3f}% {100 * r.relative_error:>+7.1f}%  "
                     f"{'in-sample' if r.in_sample else 'out-of-sample':<13} {'yes' if r.ok else 'NO'}")
    return "\n".join(lines)
