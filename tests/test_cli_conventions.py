"""Conventions every ``conduit`` command shares (conduit/cli/conventions.py): ``--version``, help for a
command group without an action, ``--json`` objects with documented keys, one tqdm progress bar that
is off when stderr is not a terminal and one ``--no-progress`` flag, and diagnostics logged through
``logging.getLogger("conduit")`` (the library installs no handler; the CLI's ``-v`` raises the level)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import conduit
from conduit.cli import build_parser, main
from conduit.cli.tune import JSON_KEYS as TUNE_KEYS

FAST_SIM = ("--topology", "reference-2core", "--workload", "ref-ppo-atari", "--iterations", "2")
VALIDATE_KEYS = {"ok", "file", "source", "name", "nodes", "gpus", "devices", "links"}


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conduit", *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=cwd)


# --- --version and help -----------------------------------------------------------------------------------


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"conduit {conduit.__version__}"


@pytest.mark.parametrize("group, actions", [([], ("topology", "policies", "sim", "tune", "calibrate")),
                                            (["topology"], ("validate", "show", "list")),
                                            (["policies"], ("list",))])
def test_a_command_group_without_an_action_prints_its_help_and_exits_0(capsys, group, actions):
    assert main(group) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: conduit {' '.join(group)}".rstrip()) and err == ""
    for action in actions:
        assert action in out


def test_workload_and_policy_help_list_the_choices(monkeypatch):
    from conduit.sim.workload import PRESETS

    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens otherwise

    for command in ("sim", "tune"):
        text = " ".join(build_parser()._subparsers._group_actions[0].choices[command].format_help().split())
        for name in PRESETS:
            assert name in text, (command, name)
        for name in ("rllib-stock", "conduit", "all-gpu", "janus-<placement>-<co|nco>-<so|nso>-g<g>"):
            assert name in text, (command, name)
        assert "janus-gpu-co-so-g4" not in text  # the 60 fixed configurations, shown as one pattern


# --- --json -----------------------------------------------------------------------------------------------


def test_topology_list_json(capsys):
    assert main(["topology", "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"topologies"} and "dgx-h100" in data["topologies"]
    assert all(isinstance(name, str) for name in data["topologies"])


def test_topology_validate_json(capsys, tmp_path):
    assert main(["topology", "validate", "dgx-h100", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == VALIDATE_KEYS and data["ok"] is True and data["name"] == "dgx-h100"
    assert data["gpus"] == 8 and data["nodes"] == 1 and data["devices"] > 0 and data["links"] > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices: [{id: a, kind: cpu}]\nlinks: [{src: a, dst: b, bandwidth: 1 GB/s, latency: 1 us}]\n")
    assert main(["topology", "validate", str(bad), "--json"]) == 2  # the exit status of the plain form
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert set(data) == {"ok", "file", "error"} and data["ok"] is False and data["file"] == str(bad)
    assert data["error"] and str(bad) in err  # the usual one-line message on stderr too


def test_tune_json(tmp_path):
    out = tmp_path / "tuned.json"
    proc = run("tune", "--topology", "reference-2core", "--workload", "ref-ppo-atari", "--policy", "conduit",
               "--budget", "1", "--iterations", "2", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert tuple(data) == TUNE_KEYS
    assert data["policy"] == "conduit" and data["simulations"] == 1 and data["written"] == str(out)
    assert data["improved"] is False and data["best_params"] == data["default_params"]  # budget 1: the defaults
    assert set(data["gains"]) == {"exposed_experience_path_s", "iteration_time_s"}
    assert set(data["gains"]["iteration_time_s"]) == {"ratio", "reduction_percent"}
    assert data["best_metrics"]["iteration_time_s"] > 0 and out.is_file()


# --- progress ---------------------------------------------------------------------------------------------


def _on_a_terminal(*args: str) -> str:
    """Run ``conduit ARGS`` with stderr (and stdout) on a pseudo-terminal of 100 columns; what it wrote."""
    pty = pytest.importorskip("pty")
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "conduit", *args], stdout=slave, stderr=slave,
                            stdin=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # the other side closed
            break
        if not data:
            break
        out += data
    os.close(master)
    assert proc.wait(60) == 0, out
    return out.decode(errors="replace")


def test_progress_is_off_when_stderr_is_not_a_terminal():
    for args in (("sim", *FAST_SIM),
                 ("tune", "--topology", "reference-2core", "--workload", "ref-ppo-atari", "--policy", "conduit",
                  "--budget", "2", "--iterations", "2", "--out", os.devnull)):
        proc = run(*args)
        assert proc.returncode == 0, proc.stderr
        assert "\r" not in proc.stderr and "%|" not in proc.stderr and "it/s" not in proc.stderr, proc.stderr


def test_progress_bar_on_a_terminal_and_no_progress_turns_it_off():
    shown = _on_a_terminal("sim", *FAST_SIM)
    assert "simulating ref-ppo-atari on reference-2core" in shown and "2/2" in shown and "\r" in shown
    hidden = _on_a_terminal("sim", *FAST_SIM, "--no-progress")
    assert "simulating" not in hidden and "conduit sim:" in hidden


@pytest.mark.parametrize("argv", [["sim"],
                                  ["tune", "--topology", "t", "--workload", "w", "--policy", "p"],
                                  ["calibrate"]])
def test_one_progress_flag_on_every_command_that_shows_progress(argv, capsys):
    parser = build_parser()
    assert parser.parse_args(argv).no_progress is False
    assert parser.parse_args([*argv, "--no-progress"]).no_progress is True
    assert parser.parse_args([*argv, "--quiet"]).no_progress is True  # the old spelling still works
    assert "--quiet is deprecated; use --no-progress" in capsys.readouterr().err
    help_text = parser._subparsers._group_actions[0].choices[argv[0]].format_help()
    assert "--no-progress" in help_text and "--quiet" not in help_text  # one flag documented


# --- logging ----------------------------------------------------------------------------------------------


def test_the_library_installs_no_logging_handler():
    code = ("import logging, conduit.runtime.plane, conduit.sim.run, conduit.registry;"
            "conduit.registry.policy_registry().names();"
            "print(len(logging.getLogger('conduit').handlers), len(logging.getLogger().handlers))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.split() == ["0", "0"]


def test_verbose_raises_the_cli_log_level(capsys):
    log = logging.getLogger("conduit.test")
    try:
        assert main(["-v", "topology", "list"]) == 0
        log.info("an info record")
        assert main(["topology", "list", "-vv"]) == 0  # after the command too
        log.debug("a debug record")
        err = capsys.readouterr().err
        assert "conduit.test: INFO: an info record" in err and "conduit.test: DEBUG: a debug record" in err
        assert main(["topology", "list"]) == 0  # default: WARNING and above
        log.info("hidden")
        log.warning("shown")
        err = capsys.readouterr().err
        assert "hidden" not in err and "conduit.test: WARNING: shown" in err
    finally:
        logging.getLogger("conduit").setLevel(logging.NOTSET)


SCHEMA_SPEC = {"obs": ((4,), "float32"), "act": "int64"}


def _rows(n: int, value: float, schema) -> dict[str, np.ndarray]:
    return {c.name: np.full((n, *c.shape), value, c.dtype) for c in schema.columns}


def _records(caplog, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.levelno == logging.WARNING]


def test_a_ring_error_and_a_refused_ring_record_are_logged(caplog):
    from conduit.contracts import OnPolicy
    from conduit.runtime.plane import ExperiencePlane
    from conduit.runtime.schema import Schema
    from conduit.runtime.shm_ring import RingProducer

    schema = Schema.of(SCHEMA_SPEC)
    caplog.set_level(logging.WARNING, logger="conduit")
    with ExperiencePlane(schema, OnPolicy(), batch_steps=4, capacities={"pageable": "8 MiB", "nvme": "8 MiB", "pinned": 0}) as plane:
        spec = plane.attach_producer("p", ring_bytes=64 << 10)
        ring = plane._rings[0]
        poll, broken = ring.poll, [True]

        def flaky(timeout=0.0):
            if broken and broken.pop():
                raise OSError("ring header torn")
            return poll(timeout)

        ring.poll = flaky
        with RingProducer(spec) as producer:
            producer.write(_rows(2, 0, schema), chunk_id="a", policy_version=0)
            producer.write(_rows(2, 1, schema), chunk_id="a", policy_version=0)  # the same id again: refused
            producer.write(_rows(2, 2, schema), chunk_id="b", policy_version=0)
            with plane.next_batch(timeout=10):
                pass
        m = plane.metrics()
    assert m["ring_errors"] == 1 and m["ring_rejected_chunks"] == 1  # the counters stay
    messages = [r.getMessage() for r in _records(caplog, "conduit.runtime.ingestion")]
    assert any("ring 'p'" in s and "ring header torn" in s for s in messages), messages
    assert any("ring 'p'" in s and "'a'" in s and "already in the plane" in s for s in messages), messages


def test_a_failed_spill_is_logged(caplog, monkeypatch):
    from conduit.contracts import OnPolicy
    from conduit.policy import Move
    from conduit.runtime.plane import ExperiencePlane
    from conduit.runtime.schema import Schema
    from conduit.runtime.tiers import RuntimeTier

    schema = Schema.of(SCHEMA_SPEC)
    caplog.set_level(logging.WARNING, logger="conduit")
    with ExperiencePlane(schema, OnPolicy(), batch_steps=4, policy="host-only", prefetch_depth=0,
                         capacities={"pageable": "8 MiB", "nvme": "8 MiB", "pinned": 0}) as plane:
        plane.ingest(_rows(4, 0, schema), policy_version=0, chunk_id="a")
        src = next(t for t in plane.tiers.values() if t.used > 0)
        dst = next(t for t in plane.tiers.values() if t is not src)
        allocate = RuntimeTier.allocate
        monkeypatch.setattr(RuntimeTier, "allocate",
                            lambda self, steps: None if self is dst else allocate(self, steps))
        with plane._cond:
            plane._spill_move(src, Move("a", dst.id))
        monkeypatch.undo()
        m = plane.metrics()
    assert m["failed_spills"] == 1 and "no contiguous room" in m["last_spill_error"]
    messages = [r.getMessage() for r in _records(caplog, "conduit.runtime.ingestion")]
    assert any("spill of chunk 'a'" in s and dst.id in s and src.id in s for s in messages), messages
