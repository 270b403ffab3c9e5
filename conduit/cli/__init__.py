"""The ``conduit`` command line.

One module per command or command group — :mod:`~conduit.cli.topology`, :mod:`~conduit.cli.policies`,
:mod:`~conduit.cli.calibrate`, :mod:`~conduit.cli.sim`, :mod:`~conduit.cli.tune`, :mod:`~conduit.cli.workload`,
:mod:`~conduit.cli.sweep` — each with a
``register(sub)`` that adds its sub-parser and handlers. The CLI imports the backends, never the
reverse; backends are imported when a command runs, so ``conduit --help`` stays fast.

A handler takes parsed arguments and returns an exit code. A :class:`ConduitError` (a user mistake)
becomes one line on stderr and exit status 2; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from conduit.cli import calibrate, policies, sim, sweep, topology, tune, workload
from conduit.errors import ConduitError

Handler = Callable[[argparse.Namespace], int]

#: command modules, in the order ``conduit --help`` lists them
COMMANDS = (topology, policies, calibrate, sim, tune, workload, sweep)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return handler(args)
    except ConduitError as exc:
        print(f"conduit: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into e.g. `head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("conduit: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conduit", description="Conduit: an experience data plane for distributed RL."
    )
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser
