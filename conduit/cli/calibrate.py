"""``conduit calibrate``: the command around :mod:`conduit.runtime.calibrate`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from conduit.cli import conventions
from conduit.errors import ConduitError


def register(sub: argparse._SubParsersAction) -> None:
    cal = sub.add_parser("calibrate", help="measure this machine and write a topology file the simulator loads",
                         description="Measure memcpy, shared memory, pickle, disk, Ray's object store and (with "
                                     "CUDA) host<->device copies, and write an explicit-form topology YAML. "
                                     "One line per measurement goes to stderr (above a progress bar on a "
                                     "terminal; with --no-progress, only with -v).")
    cal.add_argument("--out", help="write the topology YAML here (default: print it on stdout)")
    cal.add_argument("--quick", action="store_true", help="small sizes and few repeats: a few seconds, rougher")
    cal.add_argument("--no-ray", action="store_true", help="skip the Ray object store")
    cal.add_argument("--no-disk", action="store_true", help="skip the disk")
    cal.add_argument("--workloads", action="store_true",
                     help="also measure workload primitives (needs the rllib extra): RLlib EnvRunner sampling per "
                          "step, RLModule update and value pass per sample, weight get/set, for stock PPO, APPO "
                          "and DQN on CartPole-v1 and the 84x84x4 uint8 LargeObsEnv (in --json's 'workload'), each "
                          "timed attached to a running Ray as a real run's pieces run (a local Ray is started for "
                          "them, --no-ray included, unless one is running); and "
                          "what that compute costs while every core is taken (the topology CPU's "
                          "oversubscribed_cpu_cost, in --json's host.contention)")
    cal.add_argument("--json", action="store_true",
                     help="print the raw measurements as one JSON object on stdout (YAML only to --out)")
    cal.add_argument("--plane-json", metavar="FILE",
                     help="also measure the plane's primitives (in-process ingest/deliver per call and per byte, "
                          "a Ray PlaneActor round trip, memcpy) and write them as JSON to FILE: the simulator "
                          "reads it with `conduit sim --plane-costs FILE`")
    conventions.add_progress_flag(cal, "progress bar or per-measurement lines")
    cal.set_defaults(handler=cmd_calibrate)


def _helper_died(exc: BaseException) -> str:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if any(f.filename.endswith("resource_tracker.py") for f in frames):
        return ("calibrate: Python's multiprocessing resource tracker (which shared-memory measurements need) "
                "could not start or died; nothing was written. Check that this Python can start "
                "subprocesses, or run where /dev/shm is usable")
    return f"calibrate: a helper process's pipe broke ({exc}); nothing was written"


def cmd_calibrate(args: argparse.Namespace) -> int:
    from conduit.runtime import calibrate as cal

    if args.out is not None:
        cal.check_out_path(args.out)  # before minutes of measuring
    if getattr(args, "plane_json", None) is not None:
        cal.check_out_path(args.plane_json)

    log = logging.getLogger("conduit.calibrate")
    with conventions.progress_bar("calibrating", conventions.progress_enabled(args, json_silences=False),
                                  unit="step") as bar:
        def progress(line: str) -> None:
            if bar is not None:
                bar.step(line)
            elif args.no_progress:
                log.info(line)
            else:  # not a terminal: the lines alone, no bar
                print(line, file=sys.stderr, flush=True)

        try:
            workloads = cal.default_workload_configs() if args.workloads else None
            text, measurements = cal.calibrate(args.out, quick=args.quick, ray=not args.no_ray,
                                               disk=not args.no_disk, progress=progress, workloads=workloads)
            if getattr(args, "plane_json", None) is not None:
                plane = cal.measure_plane(quick=args.quick, ray=not args.no_ray, progress=progress)
                Path(args.plane_json).write_text(cal.to_json(plane) + "\n")
        except BrokenPipeError as exc:  # stdout is written below, so this is a helper process's pipe
            raise ConduitError(_helper_died(exc)) from None
    if args.json:
        print(cal.to_json(measurements))
    elif args.out is None:
        sys.stdout.write(text)
    if args.out is not None:
        print(f"calibrate: wrote {args.out}", file=sys.stderr)
    if getattr(args, "plane_json", None) is not None:
        print(f"calibrate: wrote {args.plane_json} (the plane's primitives)", file=sys.stderr)
    return 0
