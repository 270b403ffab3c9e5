"""Bad input: every user mistake or hostile file ends with a non-zero exit, a message naming the culprit
(argument, file or field), no traceback, bounded memory and no hang.

Most cases call the CLI's ``main()`` in this process (an uncaught exception fails the test, so "no
traceback" holds); the ones that are about memory, pipes or child processes run ``python -m conduit``
in a subprocess, under an address-space limit where memory is the point.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.cli import main
from conduit.errors import ConduitError, shown
from conduit.sim.workload import WorkloadError, workload_from_dict
from conduit.topology import topology_from_dict
from conduit.topology.parse import COMMON_DEVICE_FIELDS, DEVICE_FIELDS
from conduit.tuning_file import load_params

ROOT = Path(__file__).resolve().parents[1]
AS_LIMIT = 2 << 30  # bytes of address space for the subprocess cases about memory


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``conduit ARGS`` run in this process."""
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *args: str, names: tuple[str, ...]) -> str:
    """Run ``conduit ARGS``; assert a non-zero exit whose message names each of ``names``."""
    code, _, err = cli(capsys, *args)
    assert code not in (0, None), f"conduit {' '.join(args)} exited 0; stderr: {err}"
    assert "Traceback" not in err
    for name in names:
        assert name in err, f"{name!r} not in the message: {err}"
    return err


def subprocess_conduit(*args: str, limit_as: int | None = None, timeout: float = 120, cwd: Path | None = None,
                       prelude: str = "") -> subprocess.CompletedProcess:
    """``python -m conduit ARGS`` (through ``main()``), optionally under RLIMIT_AS and after ``prelude``."""
    code = textwrap.dedent(f"""
        import resource, sys
        if {limit_as!r} is not None:
            resource.setrlimit(resource.RLIMIT_AS, ({limit_as!r}, {limit_as!r}))
        {prelude}
        from conduit.cli import main
        sys.exit(main({list(args)!r}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env, check=False)


def params_file(tmp_path: Path, params: object, policy: str = "conduit", name: str = "params.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"policy": policy, "params": params}))
    return path


# -- arguments -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, culprit", [
    (("sim", "--seed", "-1"), "--seed"),
    (("sim", "--seed", "1.5"), "--seed"),
    (("sim", "--seed", str(2**64)), "--seed"),
    (("sim", "--iterations", str(10**15)), "--iterations"),
    (("sim", "--iterations", "0"), "--iterations"),
    (("tune", "--topology", "dgx-h100", "--workload", "ppo", "--policy", "conduit", "--seed", "-1"), "--seed"),
    (("tune", "--topology", "dgx-h100", "--workload", "ppo", "--policy", "conduit", "--iterations", str(10**15)),
     "--iterations"),
])
def test_out_of_range_arguments_are_usage_errors(capsys, args, culprit):
    code, _, err = cli(capsys, *args)
    assert code == 2 and culprit in err and "Traceback" not in err


def test_simulate_refuses_a_negative_seed_and_unbounded_iterations():
    from conduit.sim.run import MAX_ITERATIONS, simulate

    with pytest.raises(ConduitError, match="seed"):
        simulate("dgx-h100", "ppo", seed=-1, iterations=1)
    with pytest.raises(ConduitError, match="iterations"):
        simulate("dgx-h100", "ppo", iterations=MAX_ITERATIONS + 1)


def test_trace_into_a_missing_directory_is_refused_before_the_run(capsys, tmp_path):
    target = tmp_path / "nowhere" / "trace.csv"
    refused(capsys, "sim", "--topology", "dgx-h100", "--trace", str(target), names=("--trace", "does not exist"))


def test_trace_onto_a_directory_is_refused_before_the_run(capsys, tmp_path, monkeypatch):
    import conduit.cli.sim as sim_cli

    def no_run(*args, **kwargs):
        raise AssertionError("the simulation ran before the trace path was checked")

    monkeypatch.setattr(sim_cli, "simulate", no_run)
    refused(capsys, "sim", "--trace", str(tmp_path), names=("--trace", str(tmp_path), "directory"))
    (tmp_path / "t.updates.csv").mkdir()
    refused(capsys, "sim", "--trace", str(tmp_path / "t.csv"), names=("t.updates.csv", "directory"))


# -- tuned-parameter files --------------------------------------------------------------------------------

@pytest.mark.parametrize("params, culprit", [
    ({"target_chunk_bytes": "big"}, "target_chunk_bytes"),
    ({"target_chunk_bytes": float("inf")}, "target_chunk_bytes"),
    ({"target_chunk_bytes": -1}, "target_chunk_bytes"),
    ({"headroom": "x"}, "headroom"),
    ({"headroom": 5}, "headroom"),
    ({"headroom": -3}, "headroom"),
    ({"headroom": float("nan")}, "headroom"),
    ({"depth": "2"}, "depth"),
    ({"granularity": 0}, "granularity"),
    ({"no_such_param": 1}, "no_such_param"),
])
def test_params_file_with_bad_values(capsys, tmp_path, params, culprit):
    path = params_file(tmp_path, params)
    refused(capsys, "sim", "--policy", "conduit", "--params", str(path), names=(str(path), culprit))


def test_params_path_that_is_a_directory(capsys, tmp_path):
    refused(capsys, "sim", "--policy", "conduit", "--params", str(tmp_path), names=(str(tmp_path), "directory"))


def test_params_file_not_utf8(capsys, tmp_path):
    path = tmp_path / "p.json"
    path.write_bytes(b"\xff\xfe{\x00}")
    refused(capsys, "sim", "--policy", "conduit", "--params", str(path), names=(str(path), "UTF-8"))


def test_params_file_nested_deeply(capsys, tmp_path):
    path = tmp_path / "p.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    refused(capsys, "sim", "--policy", "conduit", "--params", str(path), names=(str(path), "nested"))


def test_params_file_too_large(capsys, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"policy": "conduit", "params": {}, "pad": "x" * (2 << 20)}))
    refused(capsys, "sim", "--policy", "conduit", "--params", str(path), names=(str(path), "larger"))


def test_good_params_file_still_loads(tmp_path):
    path = params_file(tmp_path, {"target_chunk_bytes": 4e6, "depth": 3, "granularity": 2, "headroom": 0.1})
    assert load_params(path, "conduit")["depth"] == 3


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**30, 10**30) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["target_chunk_bytes", "depth", "granularity", "headroom"]), value=json_values)
def test_params_values_are_accepted_or_refused_by_name(tmp_path, name, value):
    """Whatever JSON value a parameter holds, loading either accepts it (and the policy builds) or
    refuses it naming the file and the parameter; never another exception."""
    path = params_file(tmp_path, {name: value})
    try:
        load_params(path, "conduit")
    except ConduitError as exc:
        assert str(path) in str(exc) and name in str(exc)
        assert len(str(exc)) < 600
    else:
        from conduit.policies.conduit_policy import conduit

        policy = conduit(**{name: value})
        if name == "headroom":
            assert 0 <= value < 1
        if name == "target_chunk_bytes":
            assert 0 < policy.path.target_chunk_bytes < math.inf


def test_policy_factory_refuses_bad_values_directly():
    from conduit.policies.conduit_policy import conduit
    from conduit.policy import PathSettings

    for bad in (5, -3, float("nan"), 1.0, True, "0.1"):
        with pytest.raises(ConduitError, match="headroom"):
            conduit(headroom=bad)
    for bad in (float("inf"), float("nan"), 0, "big", [1]):
        with pytest.raises(ConduitError, match="target_chunk_bytes"):
            conduit(target_chunk_bytes=bad)
        with pytest.raises(ConduitError, match="target_chunk_bytes"):
            PathSettings(target_chunk_bytes=bad)
    assert conduit(target_chunk_bytes="4 MB").path.target_chunk_bytes == 4e6


# -- workloads ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, culprit", [
    ("base: ppo\nname: [1, 2]\n", "name"),
    ("base: ppo\nlocal_learner: 'yes please'\n", "local_learner"),
    ("base: ppo\nepochs: .nan\n", "epochs"),
    ("base: ppo\nepochs: .inf\n", "epochs"),
    ("base: ppo\nfragment_length: -.inf\n", "fragment_length"),
    ("base: ppo\nenvs_per_runner: .NaN\n", "envs_per_runner"),
    ("base: ppo\nepoch: 4\n", "did you mean 'epochs'"),
    ("base: [ppo]\n", "base"),
    ("name: x\nalgorithm: [ppo]\n", "algorithm"),
])
def test_bad_workload_files(capsys, tmp_path, text, culprit):
    path = tmp_path / "w.yaml"
    path.write_text(text)
    refused(capsys, "sim", "--workload", str(path), names=(str(path), culprit))


INTEGER_FIELDS = ["envs_per_runner", "fragment_length", "epochs", "train_batch_per_learner", "max_lag",
                  "max_reuse", "chunks_per_batch", "broadcast_interval", "replay_capacity", "min_size",
                  "batch_size", "steps_per_train", "env_runners", "learners"]


malformed_numbers = (st.sampled_from([math.nan, math.inf, -math.inf]) | st.floats(max_value=-1e-9)
                     | st.integers(-10**40, -1) | st.text(max_size=10) | st.booleans()
                     | st.lists(st.integers(), max_size=3))


@settings(max_examples=150, deadline=None)
@given(field=st.sampled_from(INTEGER_FIELDS + ["runners_per_gpu", "replay_ratio", "episode_length"]),
       data=st.data())
def test_malformed_numbers_in_workloads_name_the_field(field, data):
    """NaN, infinity, negatives, strings, booleans, lists, and fractions in integer fields: each is
    refused with a WorkloadError naming the field (never a ValueError or OverflowError)."""
    wrong = malformed_numbers
    if field in INTEGER_FIELDS:
        wrong = wrong | st.floats(0.01, 1e6).filter(lambda x: not x.is_integer())
    value = data.draw(wrong)
    base = "dqn" if field in ("replay_capacity", "min_size", "batch_size") else "ppo"
    with pytest.raises(WorkloadError) as info:
        workload_from_dict({"base": base, field: value}, "w.yaml")
    assert info.value.field == field, str(info.value)
    assert len(str(info.value)) < 800


# -- topologies --------------------------------------------------------------------------------------------

NODE = """\
devices:
  - {id: gpu0, kind: gpu, memory: 80 GiB, FIELD}
  - {id: cpu0, kind: cpu}
links:
  - {src: gpu0, dst: cpu0, bandwidth: 25 GB/s, latency: 1 us}
"""


@pytest.mark.parametrize("field, suggestion", [
    ("memory_bandwith: 3 TB/s", "memory_bandwidth"),
    ("copy_launch_overhed: 8 us", "copy_launch_overhead"),
    ("memroy_bandwidth: 3 TB/s", "memory_bandwidth"),
])
def test_misspelt_topology_field_is_refused_with_did_you_mean(capsys, tmp_path, field, suggestion):
    path = tmp_path / "t.yaml"
    path.write_text(NODE.replace("FIELD", field))
    err = refused(capsys, "topology", "validate", str(path), names=(str(path), field.split(":")[0]))
    assert f"did you mean {suggestion!r}" in err


def test_user_fields_with_x_prefix_are_kept(tmp_path):
    topology = topology_from_dict({"devices": [{"id": "gpu0", "kind": "gpu", "memory": 1e9, "x_rack": "B7"},
                                               {"id": "cpu0", "kind": "cpu"}],
                                   "links": [{"src": "gpu0", "dst": "cpu0", "bandwidth": 1e9, "latency": 0,
                                              "x_cable": "DAC"}]})
    assert topology.devices["gpu0"].get("x_rack") == "B7"


@pytest.mark.parametrize("data, culprit", [
    ({"devics": []}, "devics"),
    ({"cluster": {"nodes": [{"type": "dgx-h100", "cuont": 2}]}}, "cuont"),
    ({"cluster": {"nodes": [{"type": "dgx-h100", "count": 2}], "fabric": {"kind": "single-switch", "leafs": 2}}},
     "leafs"),
    ({"cluster": {"nodes": [{"type": "dgx-h100", "count": 2}],
                  "fabric": {"kind": "single-switch", "host_link": {"bandwith": 1e9}}}}, "bandwith"),
    ({"devices": [{"id": "n", "kind": "nic", "memory": 1e9, "bandwidth": 1e9}], "links": []}, "memory"),
])
def test_unknown_fields_anywhere_in_a_topology(data, culprit):
    with pytest.raises(ConduitError, match=culprit):
        topology_from_dict(data)


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from(sorted(DEVICE_FIELDS)), data=st.data())
def test_misspellings_of_device_fields_never_pass_silently(kind, data):
    known = COMMON_DEVICE_FIELDS + DEVICE_FIELDS[kind]
    if not DEVICE_FIELDS[kind]:
        return
    field = data.draw(st.sampled_from(DEVICE_FIELDS[kind]))
    i = data.draw(st.integers(0, len(field) - 1))
    typo = data.draw(st.sampled_from([field[:i] + field[i + 1:], field[:i] + "x" + field[i:],
                                      field[:i] + field[i + 1:i + 2] + field[i:i + 1] + field[i + 2:]]))
    if typo in known or typo.startswith("x_") or not typo:
        return
    device = {"id": "d", "kind": kind, typo: 1, "memory": 1e9, "capacity": 1e9, "bandwidth": 1e9}
    device = {k: v for k, v in device.items() if k in (typo, "id", "kind") or k in known}
    with pytest.raises(ConduitError, match="unknown field"):
        topology_from_dict({"devices": [device], "links": []})


def test_required_fields_and_kinds(capsys, tmp_path):
    for device, culprit in (("{id: g, kind: gpu}", "memory"), ("{id: n, kind: nic}", "bandwidth"),
                            ("{id: q, kind: tpu}", "kind")):
        path = tmp_path / "t.yaml"
        path.write_text(f"devices:\n  - {device}\nlinks: []\n")
        refused(capsys, "topology", "validate", str(path), names=(str(path), culprit))


BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize("tail, command", [
    ("base: ppo\nalgorithm: *i\n", ("sim", "--workload")),
    ("base: ppo\nname: *i\n", ("sim", "--workload")),
    ("devices: [{id: x, kind: *i}]\nlinks: []\n", ("topology", "validate")),
])
def test_yaml_alias_bomb_is_refused_in_bounded_memory(tmp_path, tail, command):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB + tail)
    result = subprocess_conduit(*command, str(path), limit_as=AS_LIMIT, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert str(path) in result.stderr and "aliases" in result.stderr and "Traceback" not in result.stderr


def test_errors_show_values_bounded():
    big = ["lol"] * 9
    for _ in range(9):
        big = [big] * 9
    assert len(shown(big)) <= 200 and len(shown("x" * 10**6)) <= 200 and "digits" in shown(10**5000)
    with pytest.raises(ConduitError) as info:
        topology_from_dict({"devices": [{"id": "x", "kind": big}], "links": []})
    assert len(str(info.value)) < 600


@pytest.mark.parametrize("group, culprit", [
    ("{type: dgx-h100, count: 1000000000}", "count"),
    ("{type: dgx-h100, count: 20000}", "16,384 nodes"),
    ("{type: dgx-h100, count: 8000}", "250,000 devices"),
])
def test_huge_cluster_count_is_refused_in_bounded_memory(tmp_path, group, culprit):
    path = tmp_path / "big.yaml"
    path.write_text(f"cluster:\n  nodes:\n    - {group}\n  fabric: {{kind: single-switch}}\n")
    result = subprocess_conduit("topology", "validate", str(path), limit_as=AS_LIMIT, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert str(path) in result.stderr and culprit in result.stderr and "Traceback" not in result.stderr


def test_huge_fabric_is_refused(capsys, tmp_path):
    path = tmp_path / "ft.yaml"
    path.write_text("cluster:\n  nodes: [{type: dgx-h100, count: 2}]\n"
                    "  fabric: {kind: fat-tree, leaves: 1000000000, spines: 2, uplink: {bandwidth: 1e9}}\n")
    refused(capsys, "topology", "validate", str(path), names=(str(path), "leaves"))


# -- pipes and child processes -----------------------------------------------------------------------------

@pytest.mark.parametrize("args", [("topology", "list"), ("policies", "list", "--all", "--json")])
def test_closed_stdout_exits_quietly_with_sigpipe_status(args):
    """``conduit ... | head -1`` where the reader has gone before the output is written (a short
    output, flushed at the end, and a long one): exit 141, nothing on stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "conduit", *args], stdout=write_end,
                                stderr=subprocess.PIPE, env=env, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert result.returncode == 141 and result.stderr == b"", result


def test_other_broken_pipes_are_not_a_success(capsys, monkeypatch):
    import conduit.cli.topology as topology_cli

    def broken(args):
        raise BrokenPipeError(32, "a helper's pipe")

    monkeypatch.setattr(topology_cli, "cmd_topology_list", broken)
    with pytest.raises(BrokenPipeError):  # stdout is fine: this is not a reader going away
        main(["topology", "list"])


#: the resource tracker's pipe breaks on every write (as when the tracker cannot start or died):
#: deterministic, where a tracker executable that exits at once races with the writes (Python
#: relaunches a dead tracker, and a write before the exit succeeds)
_BROKEN_TRACKER = """
import errno, os, types
from multiprocessing import resource_tracker as rt
def _write(fd, data):
    raise BrokenPipeError(errno.EPIPE, "Broken pipe")
rt.os = types.SimpleNamespace(**{**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")}, "write": _write})
"""


def test_calibrate_without_a_resource_tracker_is_an_error(tmp_path):
    out = tmp_path / "machine.yaml"
    result = subprocess_conduit("calibrate", "--quick", "--no-ray", "--no-disk", "--out", str(out),
                                prelude=f"exec({_BROKEN_TRACKER!r})", timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "resource tracker" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


# -- exit status on audit violations -----------------------------------------------------------------------

@pytest.mark.parametrize("extra", [(), ("--json",)])
def test_sim_exits_3_when_the_audit_counts_violations(capsys, monkeypatch, extra):
    import conduit.cli.sim as sim_cli

    real = sim_cli.simulate

    def with_violations(*args, **kwargs):
        result = real(*args, **kwargs)
        audit = dataclasses.replace(result.audit, violations=2, by_kind={**result.audit.by_kind, "stale": 2})
        return dataclasses.replace(result, audit=audit)

    monkeypatch.setattr(sim_cli, "simulate", with_violations)
    code, out, err = cli(capsys, "sim", "--topology", "dgx-h100", "--iterations", "1", *extra)
    assert code == sim_cli.EXIT_VIOLATIONS == 3
    assert out  # the results are still printed
    if not extra:
        assert "violation" in err
    monkeypatch.setattr(sim_cli, "simulate", real)
    code, _, _ = cli(capsys, "sim", "--topology", "dgx-h100", "--iterations", "1", *extra)
    assert code == 0


def test_sim_help_documents_the_exit_status(capsys):
    code, out, _ = cli(capsys, "sim", "--help")
    assert code == 0 and "Exit status" in out and "3" in out
