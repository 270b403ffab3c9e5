"""The ``conduit`` command line.

One module per command or command group — :mod:`~conduit.cli.topology`, :mod:`~conduit.cli.policies`,
:mod:`~conduit.cli.calibrate`, :mod:`~conduit.cli.sim`, :mod:`~conduit.cli.tune`, :mod:`~conduit.cli.workload`,
:mod:`~conduit.cli.sweep` — each with a
``register(sub)`` that adds its sub-parser and handlers. The CLI imports the backends, never the
reverse; backends are imported when a command runs, so ``conduit --help`` stays fast.

What every command shares (``--version``, ``-v``, one ``--no-progress`` flag and tqdm bar, help for a
group without an action) is in :mod:`~conduit.cli.conventions`; ``docs/cli.md`` documents it.

A handler takes parsed arguments and returns an exit code. A :class:`ConduitError` (a user mistake)
becomes one line on stderr and exit status 2; any other exception is a bug and keeps its traceback.
Output piped into a reader that stops early (``conduit topology list | head -1``) ends quietly with
status 141 (128 + SIGPIPE); any other broken pipe is a failure like any other exception.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from conduit.cli import calibrate, conventions, policies, sim, sweep, topology, tune, workload
from conduit.errors import ConduitError

Handler = Callable[[argparse.Namespace], int]

#: command modules, in the order ``conduit --help`` lists them
COMMANDS = (topology, policies, calibrate, sim, tune, workload, sweep)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    conventions.setup_logging(args)  # -v/--verbose: the CLI's stderr handler on the "conduit" logger
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        code = handler(args)
        sys.stdout.flush()  # a closed stdout shows here, not in the interpreter's exit flush
        return code
    except ConduitError as exc:
        print(f"conduit: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        if _stdout_closed():  # output piped into e.g. `head`, which stopped reading
            return EXIT_STDOUT_CLOSED
        raise  # another pipe (a helper process, a connection): not a quiet success
    except KeyboardInterrupt:
        print("conduit: interrupted", file=sys.stderr)
        return 130


#: exit status when the reader of stdout went away (``conduit ... | head``): 128 + SIGPIPE, what a
#: shell reports for a command killed by the signal
EXIT_STDOUT_CLOSED = 141


def _stdout_closed() -> bool:
    """Whether stdout's reader has gone away. If so, stdout is pointed at ``/dev/null`` so that
    the interpreter's final flush stays quiet."""
    try:
        sys.stdout.flush()
        closed = False
    except BrokenPipeError:
        closed = True
    except (OSError, ValueError):
        return False
    if not closed:  # nothing was pending: ask the pipe itself
        try:
            import select

            poller = select.poll()
            poller.register(sys.stdout.fileno(), select.POLLOUT)
            closed = any(events & select.POLLERR for _, events in poller.poll(0))
        except (AttributeError, OSError, ValueError):  # no poll() here, or stdout is not a file
            return False
    if closed:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
    return closed


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
