"""Progress on stderr for long runs (loading, tracing ranks and layers, verifying, refuting).

``Progress(quiet)`` is a callable taking one line of text: the line is printed as ``[tvcert] <text>
(<elapsed> s)`` on stderr, and on a terminal a rich spinner shows the step in progress with its
elapsed time.  ``tick(text)`` announces a frequent step (loading, a rank, a layer): on a terminal it
goes to the spinner; elsewhere (a CI log) its line is printed once the next step starts, so a step
that fails leaves only its error message (a broken spec is still one line), and ticks closer than
a second apart are thinned out.  ``quiet`` (``-q``, ``--json``) prints nothing.  Stdout is never
touched, so verdicts and ``--json`` stay clean.
"""
from __future__ import annotations

import sys
import time
from typing import Any


def _plain(text: str):
    """Text for rich that is not read as markup (``[tvcert]`` would be a style tag)."""
    from rich.text import Text

    return Text(text)


class Progress:
    def __init__(self, quiet: bool = False):
        self.on = not quiet
        self.t0 = time.perf_counter()
        self._console: Any = None
        self._status: Any = None
        self._last = 0.0
        self._pending: str | None = None  # the last tick's line (printed once the next step starts)
        if self.on:
            try:
                from rich.console import Console

                self._console = Console(stderr=True, highlight=False, soft_wrap=True)
            except ImportError:  # rich is a dependency; without it, plain lines
                self._console = None

    # ------------------------------------------------------------------ lines
    def __call__(self, text: str) -> None:
        """A step worth a line of its own."""
        if not self.on:
            return
        self._flush()
        self._emit(f"[tvcert] {text} ({time.perf_counter() - self.t0:.1f} s)")
        if self._status is not None:
            self._status.update(_plain(f"[tvcert] {text}"))

    def _emit(self, line: str) -> None:
        self._last = time.perf_counter()
        if self._console is not None:
            self._console.print(line, markup=False, highlight=False)
        else:
            print(line, file=sys.stderr, flush=True)

    def _flush(self) -> None:
        if self._pending is not None:
            line, self._pending = self._pending, None
            self._emit(line)

    def tick(self, text: str) -> None:
        """A frequent step (loading, a rank, a layer): on the spinner; off a terminal, a line once the next step
        starts (so the previous one is done), at most about one a second."""
        if not self.on:
            return
        now = time.perf_counter()
        if self._status is not None:
            self._status.update(_plain(f"[tvcert] {text} ({now - self.t0:.1f} s)"))
            return
        if self._pending is not None and now - self._last >= 1.0:
            self._flush()
        self._pending = f"[tvcert] {text} ({now - self.t0:.1f} s)"

    # ------------------------------------------------------------------ spinner
    def __enter__(self) -> "Progress":
        if self.on and self._console is not None and self._console.is_terminal:
            self._status = self._console.status(_plain("[tvcert] working"), spinner="dots")
            self._status.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
