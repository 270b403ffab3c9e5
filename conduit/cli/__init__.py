"""The ``conduit`` command line.

One module per command or command group — :mod:`~conduit.cli.topology`, :mod:`~conduit.cli.policies`,
:mod:`~conduit.cli.calibrate`, :mod:`~conduit.cli.sim`, :mod:`~conduit.cli.tune` — each with a
``register(sub)`` that adds its sub-parser and handlers. The CLI imports the backends, never the
reverse; backends are imported when a command runs, so ``conduit --help`` stays fast.

What every command shares (``--version``, ``-v``, one ``--no-progress`` flag and tqdm bar, help for a
group without an action) is in :mod:`~conduit.cli.conventions`; ``docs/cli.md`` documents it.

A handler takes parsed arguments and returns an exit code. A :class:`ConduitError` (a user mistake)
becomes one line on stderr and exit status 2; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from conduit.cli import calibrate, conventions, policies, sim, topology, tune
from conduit.errors import ConduitError

Handler = Callable[[argparse.Namespace], int]

#: command modules, in the order ``conduit --help`` lists them
COMMANDS = (topology, policies, calibrate, sim, tune)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    conventions.setup_logging(args)  # -v/--verbose: the CLI's stderr handler on the "conduit" logger
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
    parser.add_argument("--version", action="version", version=f"%(prog)s {conventions.version()}")
    conventions.add_verbose_flag(parser, top=True)
    parser.set_defaults(handler=conventions.help_handler(parser))  # no command: help on stdout, exit 0
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    conventions.add_verbose_everywhere(parser)
    return parser
