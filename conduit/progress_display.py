"""Progress display for ``progress=True`` (``conduit.simulate``, ``conduit.sweep``).

A progress argument is ``None``/``False`` (none), ``True`` (a tqdm bar when tqdm is installed, else one
line rewritten on stderr) or a callable ``(done, total)``; :func:`resolve_progress` turns it into a
callable or ``None``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from conduit.errors import ConduitError

Progress = Callable[[int, int], None]


class _DefaultProgress:
    """``progress=True``: a tqdm bar when tqdm is installed, else one line rewritten on stderr."""

    def __init__(self, label: str):
        self.label, self.bar, self.total, self.last = label, None, None, -1

    def __call__(self, done: int, total: int) -> None:
        if total != self.total or done < self.last:  # a new phase (janus-best: search, then the run)
            self.close()
            self.total, self.last = total, 0
        if self.bar is None:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                self.bar = False
            else:
                self.bar = tqdm(total=total, desc=self.label, leave=True)
        if self.bar:
            self.bar.update(done - self.last)
        else:
            sys.stderr.write(f"\r{self.label}: {done}/{total}")
            sys.stderr.flush()
        self.last = done
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.bar:
            self.bar.close()
        elif self.bar is False and self.last >= 0:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self.bar, self.last = None, -1


def resolve_progress(progress: Any, label: str = "simulating") -> Progress | None:
    """``None``/``False``: none; ``True``: the default display; a callable ``(done, total)``: itself."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return _DefaultProgress(label)
    if callable(progress):
        return progress
    raise ConduitError(f"progress must be True, False, None or a callable(done, total); "
                       f"got {type(progress).__name__}")
