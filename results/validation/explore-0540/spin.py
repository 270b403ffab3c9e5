"""Does a syscall-heavy, context-switching neighbour (like APPO's never-sleeping driver polling Ray)
inflate a compute thread's CPU per item more than a compute neighbour does? Paired windows, as
conduit.runtime.contention, with two kinds of neighbour."""
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[3]))
from conduit.runtime.contention import _learner_like, _learner_like_update, quartiles


def _pingpong(go, stop, r, w):
    # half of a pipe ping-pong: block on a byte, send one back (two of these: constant context switches)
    while not stop.is_set():
        if not go.wait(0.05):
            continue
        b = os.read(r, 1)
        os.write(w, b)

def _spin(go, stop):
    # a poller: tiny syscalls in a tight loop (select with timeout 0), like ray.wait(timeout=0)
    import select
    while not stop.is_set():
        if go.wait(0.05):
            for _ in range(1000):
                select.select([], [], [], 0)

def run(kind, pairs=10, window=0.5):
    import torch
    torch.set_num_threads(1)
    ctx = mp.get_context('fork')
    go, stop = ctx.Event(), ctx.Event()
    procs = []
    if kind == 'compute2':
        procs = [ctx.Process(target=_learner_like, args=(go, stop), daemon=True) for _ in range(2)]
    elif kind == 'compute1+poller':
        procs = [ctx.Process(target=_learner_like, args=(go, stop), daemon=True),
                 ctx.Process(target=_spin, args=(go, stop), daemon=True)]
    elif kind == 'compute1+pingpong':
        a_r, a_w = os.pipe(); b_r, b_w = os.pipe()
        procs = [ctx.Process(target=_learner_like, args=(go, stop), daemon=True),
                 ctx.Process(target=_pingpong, args=(go, stop, a_r, b_w), daemon=True),
                 ctx.Process(target=_pingpong, args=(go, stop, b_r, a_w), daemon=True)]
    for p in procs: p.start()
    if kind == 'compute1+pingpong':
        go.set(); time.sleep(0.2); os.write(a_w, b'x')  # start the ball
    go.set(); time.sleep(3)
    work = _learner_like_update()
    for _ in range(4): work()
    def timed():
        c0, w0, n = time.process_time(), time.perf_counter(), 0
        while time.perf_counter() - w0 < window:
            n += work()
        return (time.process_time() - c0) / n
    ratios = []
    for i in range(pairs):
        got = {}
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            (go.set if on else go.clear)(); time.sleep(0.1)
            got[on] = timed()
        ratios.append(got[True] / got[False])
    stop.set(); go.set()
    for p in procs:
        p.join(timeout=3)
        if p.is_alive(): p.terminate()
    q = quartiles(ratios)
    print(f"{kind:20s} cpu per update busy/idle: median {q[1]:.3f} (quartiles {q[0]:.3f}, {q[2]:.3f}), {pairs} pairs", flush=True)

if __name__ == '__main__':
    for kind in ('compute2', 'compute1+poller', 'compute1+pingpong', 'compute2', 'compute1+poller', 'compute1+pingpong'):
        run(kind)
