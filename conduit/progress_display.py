"""Progress display for ``progress=True`` (``conduit.simulate``, ``conduit.sweep``).

A progress argument is ``None``/``False`` (none), ``True`` (a tqdm bar on stderr) or a callable
``(done, total)``; :func:`resolve_progress` turns it into a
callable or ``None``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from conduit.errors import ConduitError

Progress = Callable[[int, int], None]


class ProgressBar:
    """A ``progress(done, total)`` callback drawing one tqdm bar on stderr, whether or not stderr is a
    terminal (``progress=True`` asked for it; the CLI asks only on a terminal). A new total, or ``done``
    going back (``janus-best`` searches, then runs), restarts the bar. The CLI's bars are these too
    (:func:`conduit.cli.conventions.progress_bar`)."""

    def __init__(self, label: str, unit: str = "it", close_when_done: bool = False):
        self.label, self.unit, self.close_when_done = label, unit, close_when_done
        self.bar = self._new()

    def _new(self):
        from tqdm import tqdm

        return tqdm(desc=self.label, unit=self.unit, file=sys.stderr, disable=False, leave=True, dynamic_ncols=True)

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:  # closed when the previous phase finished
            self.bar = self._new()
        bar = self.bar
        if bar.total != total or done < bar.n:
            bar.reset(total=total)
        bar.update(done - bar.n)
        if done >= total and self.close_when_done:
            self.close()

    def step(self, line: str) -> None:
        """One more step of unknown total, with a line of text printed above the bar."""
        if self.bar is None:
            self.bar = self._new()
        self.bar.write(line, file=sys.stderr)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def resolve_progress(progress: Any, label: str = "simulating") -> Progress | None:
    """``None``/``False``: none; ``True``: the default display; a callable ``(done, total)``: itself."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return ProgressBar(label, close_when_done=True)  # nobody else closes a library-made bar
    if callable(progress):
        return progress
    raise ConduitError(f"progress must be True, False, None or a callable(done, total); "
                       f"got {type(progress).__name__}")
