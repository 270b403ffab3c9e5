"""The ``conduit`` command line as a user runs it: exit codes, messages, no tracebacks."""

import json
import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conduit", *args], capture_output=True, text=True, timeout=120, check=False)


def test_validate_good_library_file():
    result = run("topology", "validate", "conduit/topologies/dgx-h100.yaml")
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


def test_validate_bad_file_exits_nonzero_naming_file_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices: [{id: a, kind: cpu}, {id: b, kind: cpu}]\n"
                   "links: [{src: a, dst: b, bandwidth: '400 Gb', latency: 1 us}]\n")
    result = run("topology", "validate", str(bad))
    assert result.returncode != 0
    assert str(bad) in result.stderr and "links[0].bandwidth" in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_missing_file():
    result = run("topology", "validate", "nowhere.yaml")
    assert result.returncode != 0 and "nowhere.yaml" in result.stderr and "Traceback" not in result.stderr


def test_show_prints_devices_tiers_and_paths():
    result = run("topology", "show", "dgx-h100-x2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for word in ("gpu", "hbm", "pinned", "pageable", "nvme", "GPU-GPU in a node", "GPU-GPU across nodes"):
        assert word in out, out


def test_show_json():
    result = run("topology", "show", "dgx-h100", "--json")
    summary = json.loads(result.stdout)
    assert summary["devices_by_kind"]["gpu"] == 8


def test_policies_list():
    result = run("policies", "list")
    assert result.returncode == 0
    assert "all-gpu" in result.stdout and "built-in" in result.stdout
