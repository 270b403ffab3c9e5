"""``conduit.runtime.proccpu``: a process's CPU time from ``/proc``, and the callee's CPU per call (against a
process whose CPU per request is known)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conduit.runtime import proccpu

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")


def test_thread_times_of_a_gone_process_is_none():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert proccpu.thread_times(gone.pid) is None
    run, wait = proccpu.thread_times(os.getpid())
    assert run > 0 and wait >= 0
    assert proccpu.process_cpu_s(os.getpid()) >= run  # on a CPU since, never less
    with pytest.raises(RuntimeError, match=f"process {gone.pid} is gone"):
        proccpu.process_cpu_s(gone.pid)


def _serve(conn, burn_s: float) -> None:
    """A callee that spends ``burn_s`` of its own CPU time on each request, then replies."""
    while True:
        if conn.recv() is None:
            return
        t = time.thread_time()
        while time.thread_time() - t < burn_s:
            pass
        conn.send(b"")


@pytest.mark.parametrize("burn_ms", [0.5, 2.0])
def test_callee_cpu_per_call_recovers_what_the_callee_spends(burn_ms):
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_serve, args=(theirs, burn_ms / 1e3), daemon=True)
    child.start()
    try:
        def call() -> None:
            ours.send(1)
            if not ours.poll(10.0):
                raise TimeoutError("the callee did not reply within 10 s")
            ours.recv()

        call()  # the child is up and serving
        per_call = proccpu.callee_cpu_per_call(call, child.pid, calls=40, blocks=3, idle_s=0.05)
        # the burn plus a pipe round trip's own CPU on the callee (tens of microseconds)
        assert burn_ms / 1e3 * 0.95 <= per_call <= burn_ms / 1e3 + 0.5e-3
    finally:
        ours.send(None)
        child.join(10)
        if child.is_alive():
            child.kill()


def test_callee_cpu_of_a_gone_process_is_an_error():
    proc = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
    proc.start()
    proc.join(10)
    with pytest.raises(RuntimeError, match=str(proc.pid)):
        proccpu.callee_cpu_per_call(lambda: None, proc.pid, calls=1, blocks=1, idle_s=0.0)


def test_callee_cpu_needs_a_call_and_a_block():
    with pytest.raises(ValueError, match="calls and blocks"):
        proccpu.callee_cpu_per_call(lambda: None, os.getpid(), calls=0)


def test_threads_cpu_names_each_thread_and_is_empty_for_a_gone_process():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert proccpu.threads_cpu(gone.pid) == {}
    mine = proccpu.threads_cpu(os.getpid())
    name, run = mine[os.getpid()]  # the main thread's tid is the pid
    assert name and run > 0
    assert sum(r for _, r in mine.values()) <= proccpu.process_cpu_s(os.getpid()) + 1e-3
