"""Conventions every ``conduit`` command shares: the progress bar and its flag, ``-v``/``--verbose``
logging, ``--version``, help for a command group given no action, and the choices ``--workload`` /
``--policy`` list in their help.

* **Progress**: one implementation, :mod:`tqdm`, on stderr, off when stderr is not a terminal; one flag,
  ``--no-progress``, on every command that shows progress (``--quiet`` is a hidden, deprecated alias).
* **Diagnostics**: the library logs to ``logging.getLogger("conduit")`` and its children
  (``conduit.runtime.ingestion``, ...) and never installs a handler; the CLI installs one on stderr
  (WARNING; ``-v`` INFO, ``-vv`` DEBUG).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import sys
from collections.abc import Callable, Iterator

from conduit.progress_display import ProgressBar

#: the 60 fixed Janus configurations, shown as one name in help
_JANUS_CONFIGURATION = re.compile(r"^janus-(pageable|pinned|gpu)-(co|nco)-(so|nso)-g\d+$")
_JANUS_PATTERN = "janus-<placement>-<co|nco>-<so|nso>-g<g>"

Progress = Callable[[int, int], None]


# --- version ---------------------------------------------------------------------------------------------


def version() -> str:
    """``conduit.__version__`` when set, else the installed distribution's version."""
    import conduit

    found = getattr(conduit, "__version__", None)
    if found:
        return str(found)
    from importlib import metadata

    try:
        return metadata.version("conduit-rl")
    except metadata.PackageNotFoundError:
        return "unknown"


# --- progress --------------------------------------------------------------------------------------------


class _DeprecatedAlias(argparse.Action):
    """``--quiet``: sets ``no_progress`` as ``--no-progress`` does, with a one-line notice."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"conduit: warning: {option_string} is deprecated; use --no-progress", file=sys.stderr)
        setattr(namespace, self.dest, True)


def add_progress_flag(parser: argparse.ArgumentParser, what: str = "progress bar") -> None:
    """``--no-progress`` (``args.no_progress``), plus ``--quiet`` as a hidden deprecated alias."""
    parser.add_argument("--no-progress", dest="no_progress", action="store_true",
                        help=f"no {what} on stderr (it is off anyway when stderr is not a terminal)")
    parser.add_argument("--quiet", dest="no_progress", action=_DeprecatedAlias, default=False,
                        help=argparse.SUPPRESS)


def progress_enabled(args: argparse.Namespace, json_silences: bool = True) -> bool:
    """Whether to show progress: not ``--no-progress``, not ``--json`` (when ``json_silences``), and
    stderr is a terminal."""
    if getattr(args, "no_progress", False) or (json_silences and getattr(args, "json", False)):
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


@contextlib.contextmanager
def progress_bar(label: str, enabled: bool, unit: str = "it") -> Iterator[ProgressBar | None]:
    """A progress callback for the library's ``progress=`` argument, or None when ``enabled`` is False."""
    if not enabled:
        yield None
        return
    bar = ProgressBar(label, unit)
    try:
        yield bar
    finally:
        bar.close()


# --- logging ---------------------------------------------------------------------------------------------


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record arrives (tests swap it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


_handler: _StderrHandler | None = None


def add_verbose_flag(parser: argparse.ArgumentParser, top: bool) -> None:
    """``-v``/``--verbose`` (count); on a sub-command its default leaves the top-level count alone."""
    parser.add_argument("-v", "--verbose", action="count", default=0 if top else argparse.SUPPRESS,
                        help="more diagnostics on stderr: -v INFO, -vv DEBUG (default WARNING)")


def setup_logging(args: argparse.Namespace) -> None:
    """One stderr handler on the ``conduit`` logger (the library itself installs none)."""
    global _handler
    verbose = getattr(args, "verbose", 0) or 0
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logger = logging.getLogger("conduit")
    if _handler is None:
        _handler = _StderrHandler()
        logger.addHandler(_handler)
    _handler.setLevel(level)
    logger.setLevel(level if verbose > 0 else logging.NOTSET)


# --- help ------------------------------------------------------------------------------------------------


def help_handler(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """A handler for a command group run without an action: its help on stdout, exit 0."""
    def show_help(args: argparse.Namespace) -> int:
        parser.print_help(sys.stdout)
        return 0
    return show_help


def add_verbose_everywhere(parser: argparse.ArgumentParser) -> None:
    """``-v`` on every sub-command too, so ``conduit sim -v`` works as ``conduit -v sim`` does."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                if not any("-v" in a.option_strings for a in child._actions):
                    add_verbose_flag(child, top=False)
                add_verbose_everywhere(child)


def workload_choices() -> str:
    """The workload presets, for ``--workload`` help."""
    try:
        from conduit.sim.workload import PRESETS
    except Exception:  # noqa: BLE001 - help must never fail
        return ""
    return ", ".join(PRESETS)


def policy_choices() -> str:
    """The registered policies (whole policies, not placement- or scheduling-only pieces), the Janus
    configurations as one pattern, for ``--policy`` help."""
    try:
        from conduit.registry import policy_registry

        rows = policy_registry().describe()
    except Exception:  # noqa: BLE001 - help must never fail
        return ""
    names: list[str] = []
    for row in rows:
        if row.get("role") != "policy":
            continue
        name = row["name"]
        if _JANUS_CONFIGURATION.match(name):
            name = _JANUS_PATTERN
        if name not in names:
            names.append(name)
    return ", ".join(names)
