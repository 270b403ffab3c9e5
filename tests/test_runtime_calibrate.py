"""``conduit calibrate``: real (quick) measurements of this machine, the YAML they make, the CLI."""

import glob
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conduit.cli import main
from conduit.runtime import calibrate as cal
from conduit.runtime.calibrate import Measurement, Measurements, fit_latency_bandwidth, measure_machine, topology_yaml
from conduit.sim.cost_file import plane_costs_from_calibration
from conduit.topology import load_topology

HOST_NAMES = {"memcpy", "shm", "shm_create", "pickle", "pickle_oob"}
DISK_NAMES = {"disk_write", "disk_read", "disk_read_4k"}


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def assert_sane(m: Measurement) -> None:
    assert m.ok, m
    assert math.isfinite(m.bandwidth) and m.bandwidth > 0, m
    assert math.isfinite(m.latency) and m.latency >= 0, m
    assert m.samples > 0 and m.note
    assert len(m.sizes) == len(m.medians) >= 1 and all(t > 0 for t in m.medians)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One quick measurement (no Ray) shared by the tests that only read it."""
    tmp = tmp_path_factory.mktemp("cal")
    lines: list[str] = []
    ms = measure_machine(quick=True, ray=False, progress=lines.append, tmpdir=str(tmp))
    return ms, lines, tmp


# --- the fit -------------------------------------------------------------------------------------------------


def test_fit_recovers_exact_latency_and_bandwidth():
    sizes = [4096 * 4**i for i in range(9)]
    times = [7e-6 + s / 12.5e9 for s in sizes]
    lat, bw, how = fit_latency_bandwidth(sizes, times)
    assert lat == pytest.approx(7e-6, rel=1e-9)
    assert bw == pytest.approx(12.5e9, rel=1e-9)
    assert "least-squares" in how


def test_fit_ignores_order_clamps_latency_and_handles_zero_copy():
    sizes = [4096 * 4**i for i in range(6)]
    times = [s / 2e9 for s in sizes]
    lat, bw, _ = fit_latency_bandwidth(sizes[::-1], times[::-1])
    assert lat == pytest.approx(0, abs=1e-15) and bw == pytest.approx(2e9, rel=1e-9)
    # small copies faster than the large-copy line predicts (caches): latency clamps to 0, not below
    fast_small = [t * (0.3 if s < 65536 else 1.0) for s, t in zip(sizes, times, strict=True)]
    lat, bw, how = fit_latency_bandwidth(sizes, fast_small)
    assert lat == 0.0 and bw == pytest.approx(2e9, rel=1e-6) and "clamped" in how
    # zero-copy: the same time at every size says nothing about a bandwidth
    lat, bw, how = fit_latency_bandwidth(sizes, [8e-6] * len(sizes))
    assert lat == pytest.approx(8e-6) and bw == pytest.approx(max(sizes) / 8e-6) and "zero-copy" in how
    # one size: bandwidth = size / time
    assert fit_latency_bandwidth([4096], [1e-6])[:2] == (0.0, pytest.approx(4.096e9))
    with pytest.raises(ValueError):
        fit_latency_bandwidth([4096, 8192], [1e-6, 0.0])


@settings(max_examples=60, deadline=None)
@given(latency=st.floats(0, 1e-2), bandwidth=st.floats(1e6, 1e12), top=st.integers(3, 10))
def test_fit_is_exact_on_linear_timings(latency, bandwidth, top):
    sizes = np.array([4096 * 4**i for i in range(top)], dtype=float)
    times = latency + sizes / bandwidth
    assume(times[0] > 0 and sizes[-1] / bandwidth >= 0.2 * times[-1])  # a resolvable bandwidth term
    lat, bw, _ = fit_latency_bandwidth(sizes, times)
    assert bw == pytest.approx(bandwidth, rel=1e-6)
    assert lat == pytest.approx(latency, rel=1e-6, abs=1e-9 * times[-1])


@settings(max_examples=60, deadline=None)
@given(times=st.lists(st.floats(1e-4, 10.0), min_size=2, max_size=3), step=st.floats(1.01, 8.0))
def test_a_fit_anchored_on_the_largest_size_reproduces_its_time(times, step):
    """A sweep that reaches the size the workload runs at (a whole train batch): anchored on the largest
    size, the fitted line gives that size's measured time back whatever the smaller sizes did (it is the
    line through the two largest, up to three sizes) and its slope is the unanchored fit's; where that line's
    intercept is negative (the time grows faster than the size) it is the line through the origin and the
    largest size, still exact there, never a clamped intercept that overstates it."""
    times = sorted(times)
    sizes = [500 * step**i for i in range(len(times))]
    lat, bw, how = fit_latency_bandwidth(sizes, times, anchor="largest")
    _, bw0, _ = fit_latency_bandwidth(sizes, times)
    assert lat >= 0
    if "zero-copy" in how:
        return
    assert lat + sizes[-1] / bw == pytest.approx(times[-1], rel=1e-9)
    if lat > 0:
        assert bw == pytest.approx(bw0, rel=1e-9)
        assert lat + sizes[-2] / bw == pytest.approx(times[-2], rel=1e-9)
    else:
        assert "negative latency" in how or lat == pytest.approx(0, abs=1e-12 * times[-1])


def test_a_superlinear_cost_anchored_on_the_largest_size_is_not_overstated_there():
    """The GAE piece of ``ppo-largeobs``: 0.10 s at 500 samples, 0.30 s at 1,000, 0.80 s at 2,000 (the line
    through the two largest has intercept -0.2 s). A clamped intercept with that slope gave 1.0 s at 2,000."""
    lat, bw, how = fit_latency_bandwidth([500, 1000, 2000], [0.10, 0.30, 0.80], anchor="largest")
    assert lat == 0.0 and 2000 / bw == pytest.approx(0.80) and "exact there" in how


def test_fit_anchor_is_checked():
    with pytest.raises(ValueError, match="anchor"):
        fit_latency_bandwidth([1, 2], [1.0, 2.0], anchor="middle")


# --- measuring this machine ----------------------------------------------------------------------------------


def test_quick_measurement_is_positive_and_finite(quick):
    ms, lines, tmp = quick
    assert isinstance(ms, Measurements)
    assert HOST_NAMES | DISK_NAMES <= set(ms)
    assert not any(name.startswith("object_store") for name in ms)  # ray=False
    for name in HOST_NAMES | DISK_NAMES:
        assert_sane(ms[name])
    # one progress line per measurement, each with its figure
    for name in HOST_NAMES | DISK_NAMES:
        assert any(name in line and "/s" in line for line in lines), lines
    # the host facts come along; the disk test cleaned up after itself
    assert ms.host["cores"] >= 1 and ms.host["dram_capacity"] > 0 and ms.host["disk"]["capacity"] > 0
    assert list(tmp.iterdir()) == []
    if not has_cuda():
        assert not any(name.startswith(("h2d", "d2h", "d2d")) for name in ms)
        assert ms.host["cuda"] is False


def test_yaml_of_measurements_loads_and_says_what_was_not_measured(quick, tmp_path):
    ms, _, _ = quick
    text = topology_yaml(ms, name="unit-test")
    path = tmp_path / "t.yaml"
    path.write_text(text)
    topo = load_topology(path)
    assert topo.name == "unit-test"
    kinds = {d.kind for d in topo.devices.values()}
    assert {"cpu", "memory", "nvme"} <= kinds
    dram = topo.devices["dram0"]
    assert dram.get("bandwidth") == pytest.approx(ms["memcpy"].bandwidth, rel=1e-3)
    assert dram.get("shm_bandwidth") == pytest.approx(ms["shm"].bandwidth, rel=1e-3)
    assert dram.get("pickle_bandwidth") == pytest.approx(ms["pickle"].bandwidth, rel=1e-3)
    assert "--no-ray" in text  # the object store was skipped, and the file says so
    if not has_cuda():
        assert "gpu" not in kinds
        assert "pinned memory" in text and "no CUDA" in text


def test_calibrated_yaml_with_cuda_figures_gets_a_gpu(quick, tmp_path):
    """topology_yaml alone (no GPU needed): given CUDA measurements, it writes gpu0 and its link."""
    ms, _, _ = quick
    fake = Measurements(dict(ms), host={**ms.host, "gpu": {"name": "Test GPU", "memory": 80 * 2**30, "count": 1},
                                        "torch_cuda": "12.x"})
    for name, bw, lat in (("h2d_pinned", 25e9, 9e-6), ("h2d_pageable", 8e9, 12e-6), ("d2h_pinned", 24e9, 9e-6),
                          ("d2d", 1.5e12, 6e-6)):
        fake[name] = Measurement(name, bw, lat, 10, "synthetic", [4096], [lat])
    path = tmp_path / "gpu.yaml"
    path.write_text(topology_yaml(fake))
    topo = load_topology(path)
    gpu = topo.devices["gpu0"]
    assert gpu.kind == "gpu" and gpu.get("memory") == 80 * 2**30
    assert gpu.get("copy_launch_overhead") == pytest.approx(9e-6)
    assert gpu.get("memory_bandwidth") == pytest.approx(3e12, rel=1e-3)
    # pageable = staging memcpy then the pinned DMA: 1/8 - 1/25 -> 11.76 GB/s staging
    assert topo.devices["dram0"].get("pageable_copy_bandwidth") == pytest.approx(1 / (1 / 8e9 - 1 / 25e9), rel=1e-3)
    link = [lk for lk in topo.links if {lk.src, lk.dst} == {"gpu0", "dram0"}]
    assert link and link[0].bandwidth == pytest.approx(25e9, rel=1e-3)


def test_ray_failing_to_start_is_recorded_not_fatal(monkeypatch):
    ray = pytest.importorskip("ray", reason="ray is not installed: nothing to fail")

    def boom(*args, **kwargs):
        raise RuntimeError("no raylet for you")

    monkeypatch.setattr(ray, "init", boom)
    ms = measure_machine(quick=True, ray=True, disk=False)
    assert not ms["object_store_put"].ok and "no raylet for you" in ms["object_store_put"].note
    text = topology_yaml(ms)
    assert "no raylet for you" in text
    assert "object_store_put_bandwidth" not in text
    load_topology(cal_yaml_dict(text))
    assert json.loads(cal.to_json(ms))["measurements"]["object_store_put"]["bandwidth"] is None


def cal_yaml_dict(text: str):
    import yaml

    return yaml.safe_load(text)


@pytest.mark.slow
def test_object_store_measured_and_ray_shut_down(no_ray):  # it starts and stops a Ray of its own
    ray = pytest.importorskip("ray", reason="ray is not installed: cannot measure the object store")
    before = set(glob.glob("/tmp/rcal-*"))
    try:
        ms = measure_machine(quick=True, ray=True, disk=False)
        for name in ("object_store_put", "object_store_get"):
            assert name in ms
            assert_sane(ms[name])
        assert not ray.is_initialized()
        assert set(glob.glob("/tmp/rcal-*")) <= before  # its temp dir is gone
        assert "object_store_put_bandwidth" in topology_yaml(ms)
    finally:
        if ray.is_initialized():
            ray.shutdown()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc: the actor's CPU per call")
def test_plane_actor_round_trip_and_its_cpu_per_call(no_ray):  # a Ray of its own, stopped after
    ray = pytest.importorskip("ray", reason="ray is not installed: no plane actor to call")
    try:
        ms = cal.measure_plane(quick=True, ray=True)
        call, callee = ms["plane_actor_call"], ms["plane_actor_callee"]
        assert call.ok and callee.ok, (call.note, callee.note)
        # the actor's CPU per call is part of what a caller waits for: positive, and not beyond the round trip
        # by more than the actor's background threads could add (Ray's io threads run on the other core)
        assert 0 < callee.latency < 5 * call.latency
        assert "less its idle burn" in callee.note
        # a replay draw and a priority update, each a whole call on the actor: dearer than a control call
        for name in ("plane_replay_draw", "plane_replay_priorities"):
            m = ms[name]
            assert m.ok, m.note
            assert m.sizes == [16, 64] and "rows/s" in m.note  # sizes are rows in a quick run
            assert all(t > 0.5 * callee.latency for t in m.medians)
        costs, taken = plane_costs_from_calibration(json.loads(cal.to_json(ms)), "<calibration>")
        draw = ms["plane_replay_draw"]
        assert costs.replay_draw(32) == pytest.approx(draw.latency + 32 / draw.bandwidth)
        assert costs.actor_callee_cpu == callee.latency
        assert {"replay_draw_per_call", "replay_draw_rows_per_s", "priorities_per_call", "priorities_rows_per_s",
                "actor_callee_cpu", "call_round_trip"} <= set(taken)
        assert not ray.is_initialized()
    finally:
        if ray.is_initialized():
            ray.shutdown()


@settings(max_examples=10, deadline=None)
@given(runs=st.integers(1, 40), steps=st.integers(1, 60))
def test_the_rebuild_benchmark_batch_rebuilds_into_its_episodes(runs, steps):
    """``plane_rebuild`` times ``rebuild_trajectories`` on a batch of ``runs`` whole episodes: the batch it
    builds is one the learner accepts, and it rebuilds into exactly that many episodes of that length."""
    pytest.importorskip("ray.rllib", reason="rebuild_trajectories builds RLlib episodes")
    from conduit.runtime.rllib.layout import rebuild_trajectories

    episodes, found = rebuild_trajectories(*cal._trajectory_batch(runs, steps))
    assert len(episodes) == len(found) == runs and all(len(e) == steps for e in episodes)


def test_the_rebuild_is_measured_per_episode_run_and_read_by_the_plane_costs():
    pytest.importorskip("ray.rllib", reason="rebuild_trajectories builds RLlib episodes")
    m = cal._measure_rebuild(cal._plan(True))
    assert m.ok, m.note
    assert m.sizes == [8, 64] and "runs/s" in m.note and m.bandwidth > 0 and m.latency >= 0
    assert m.medians[1] > m.medians[0]  # more runs, more episode objects
    costs, taken = plane_costs_from_calibration(json.loads(cal.to_json(Measurements({"plane_rebuild": m}, host={}))),
                                                "<calibration>")
    assert costs.rebuild(10, 0.0) == pytest.approx(m.latency + 10 / m.bandwidth)
    assert set(taken) == {"rebuild_per_call", "rebuild_runs_per_s"}


@pytest.mark.skipif(not has_cuda(), reason="needs CUDA: pinned vs pageable host<->device copies")
def test_cuda_pinned_vs_pageable(tmp_path):
    ms = measure_machine(quick=True, ray=False, disk=False)
    for name in ("h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable", "d2d"):
        assert_sane(ms[name])
    assert ms.host["gpu"]["memory"] > 0
    path = tmp_path / "cuda.yaml"
    path.write_text(topology_yaml(ms))
    topo = load_topology(path)
    assert topo.devices["gpu0"].kind == "gpu"
    assert topo.devices["gpu0"].get("memory") == pytest.approx(ms.host["gpu"]["memory"], rel=1e-3)


# --- the command ---------------------------------------------------------------------------------------------


def test_cli_writes_a_topology_that_validates_and_simulates(tmp_path, capsys):
    from conduit.sim import simulate

    out = tmp_path / "m.yaml"
    assert main(["calibrate", "--quick", "--no-ray", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # the YAML went to --out
    assert "memcpy" in captured.err and "disk_read" in captured.err and str(out) in captured.err
    topo = load_topology(out)
    assert topo.name.startswith("calibrated-")
    assert main(["topology", "validate", str(out)]) == 0
    assert "ok" in capsys.readouterr().out
    result = simulate(str(out), "ref-ppo-atari", "rllib-stock", iterations=2, seed=0)
    assert result.metrics["updates"] == 2 and result.audit.violations == 0
    assert result.metrics["iteration_time_s"] > 0


def test_cli_prints_yaml_without_out(capsys):
    assert main(["calibrate", "--quick", "--no-ray", "--no-disk"]) == 0
    text = capsys.readouterr().out
    topo = load_topology(cal_yaml_dict(text))
    assert "nvme" not in {d.kind for d in topo.devices.values()}  # --no-disk


def test_cli_json(tmp_path, capsys):
    out = tmp_path / "j.yaml"
    assert main(["calibrate", "--quick", "--no-ray", "--no-disk", "--json", "--out", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert HOST_NAMES <= set(data["measurements"])
    for name in HOST_NAMES:
        entry = data["measurements"][name]
        assert entry["name"] == name and entry["bandwidth"] > 0 and entry["latency"] >= 0
    assert data["host"]["cores"] >= 1
    load_topology(out)  # with --json the YAML still goes to --out


def test_cli_bad_out_dir_fails_before_measuring(tmp_path, capsys):
    bad = tmp_path / "missing" / "m.yaml"
    assert main(["calibrate", "--quick", "--no-ray", "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "missing") in err and "Traceback" not in err
    assert "memcpy" not in err  # nothing was measured
    assert main(["calibrate", "--quick", "--out", str(tmp_path)]) == 2  # a directory is not a file
    assert str(tmp_path) in capsys.readouterr().err
    with pytest.raises(cal.ConduitError, match="missing"):
        cal.calibrate(bad, quick=True, ray=False)


def test_a_summary_names_the_unit_of_its_rate():
    """Bytes per second for a copy, rows per second for a replay table's call, none for a call's fixed cost."""
    copy = Measurement("memcpy", 1e10, 1e-6, 9, "a copy", [4096, 8192], [1e-6, 2e-6])
    rows = Measurement("plane_replay_draw", 2e5, 1e-3, 9, f"a draw; {cal.ROWS_PER_S}", [16, 64], [1e-3, 1.3e-3])
    call = Measurement("plane_actor_callee", 1e18, 5e-4, 9, "a control call", [0], [5e-4])
    assert "B/s" in copy.summary() and "200k rows/s" in rows.summary() and "per call" in call.summary()
    assert "TB/s" not in call.summary() and "B/s" not in rows.summary()

