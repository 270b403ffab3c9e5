"""RLlib's work on an EnvRunner after ``sample()`` returns (``Workload.runner_metrics_time``: ``get_metrics()``)
lies after the sample-end, on the experience path.

``execution/rollout_ops.py: synchronous_parallel_sample`` with ``_return_metrics=True`` calls
``lambda w: (w.sample(...), w.get_metrics())``: the sample-end stamp (``on_sample_end``, inside ``sample()``)
comes before ``get_metrics()``, and the reply after it. So moving seconds of the remote call from before the
sample-end (``runner_call_overhead``) to after it (``runner_metrics_time``) leaves a stock call as long, and the
iteration as long, and makes the experience path from the newest chunk's creation that much longer; and on
every side the seconds delay the reply the driver waits for, for PPO and DQN, stock and Conduit as deployed.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim import tiny_topology_dict

from conduit.sim.params import StockCosts
from conduit.sim.run import simulate
from conduit.sim.workload import WorkloadError, load_workload
from conduit.topology import topology_from_dict

ITERATIONS = {"ppo": 3, "dqn": 40}


#: the built-in costs without the cold-call law (:mod:`conduit.sim.raycalls`): these properties move seconds
#: within a call, which moves the start of the calls after it, and the law charges a call by the time since each
#: side's previous one -- a shift of the spacing the law would price, not the metrics' seconds the tests measure;
#: the warm-up debt (:mod:`conduit.sim.coldwork`) prices the time since each piece's previous end the same way
NO_LAW = StockCosts().without_cold_calls().without_warm_up_debt()


def _metrics(algorithm: str, policy: str, call: float, after: float) -> dict:
    base = replace(load_workload(algorithm), env_step_cv=0.0)
    workload = replace(base, runner_call_overhead=base.runner_call_overhead + call, runner_metrics_time=after)
    return simulate(topology_from_dict(tiny_topology_dict(cores=64)), workload, policy, iterations=ITERATIONS[algorithm],
                    seed=0, stock_costs=NO_LAW).metrics


@settings(max_examples=8, deadline=None)
@given(seconds=st.floats(1e-4, 5e-3), algorithm=st.sampled_from(["ppo", "dqn"]))
def test_moving_seconds_after_the_sample_end_lengthens_only_the_experience_path(seconds, algorithm):
    """Stock: the call is as long, so is the iteration; the chunk is made that much before the reply."""
    before = _metrics(algorithm, "rllib-stock", seconds, 0.0)
    after = _metrics(algorithm, "rllib-stock", 0.0, seconds)
    assert after["iteration_time_s"] == pytest.approx(before["iteration_time_s"], rel=1e-9)
    grown = after["exposed_experience_path_s"] - before["exposed_experience_path_s"]
    assert grown == pytest.approx(seconds, rel=1e-6)


@settings(max_examples=8, deadline=None)
@given(seconds=st.floats(1e-4, 5e-3), algorithm=st.sampled_from(["ppo", "dqn"]),
       policy=st.sampled_from(["rllib-stock", "conduit"]))
def test_the_runners_metrics_delay_the_reply_the_driver_waits_for(seconds, algorithm, policy):
    """The driver calls the update only once every reply is in, and each reply comes after its runner's
    get_metrics(), so its seconds lengthen the experience path from the sample-end: stock by exactly as much; as
    deployed by at least as much (the EnvRunner's sender shares the runner's thread with get_metrics(), so the
    steps also reach the plane later, and PPO's last pieces wait for their in-flight slots)."""
    without = _metrics(algorithm, policy, 0.0, 0.0)
    with_metrics = _metrics(algorithm, policy, 0.0, seconds)
    grown = with_metrics["exposed_experience_path_s"] - without["exposed_experience_path_s"]
    if policy == "rllib-stock":
        assert grown == pytest.approx(seconds, rel=1e-6)
    else:
        assert grown >= seconds * (1 - 1e-6)


def test_a_bad_runner_metrics_time_names_the_field(caplog):
    for bad in (-1e-3, float("nan")):
        with pytest.raises(WorkloadError, match="runner_metrics_time"):
            replace(load_workload("dqn"), runner_metrics_time=bad).validate("w.yaml")
    replace(load_workload("dqn"), runner_metrics_time=11.0).validate("w.yaml")  # implausible: said, then run
    assert "runner_metrics_time" in caplog.text and "implausible" in caplog.text
