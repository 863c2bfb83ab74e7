"""Progress on stderr for long runs (loading, tracing ranks and layers, verifying, refuting).

``Progress(quiet)`` is a callable taking one line of text: the line is printed as ``[tvcert] <text>
(<elapsed> s)`` on stderr, and on a terminal a rich spinner shows the step in progress with its
elapsed time.  ``quiet`` (``-q``, ``--json``) prints nothing.  Stdout is never touched, so verdicts and
``--json`` stay clean.
"""
from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, quiet: bool = False):
        self.on = not quiet
        self.t0 = time.perf_counter()
        self._console: Any = None
        self._status: Any = None
        self._last = 0.0
        self._transient = ""
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
        line = f"[tvcert] {text} ({time.perf_counter() - self.t0:.1f} s)"
        if self._console is not None:
            self._console.print(line, markup=False, highlight=False)
            if self._status is not None:
                self._status.update(f"[tvcert] {text}")
        else:
            print(line, file=sys.stderr, flush=True)

    def tick(self, text: str) -> None:
        """A frequent step (a rank, a layer): shown on the spinner; as a line at most every 2 s off a terminal."""
        if not self.on:
            return
        if self._status is not None:
            self._status.update(f"[tvcert] {text} ({time.perf_counter() - self.t0:.1f} s)")
            return
        now = time.perf_counter()
        if now - self._last >= 2.0:
            self._last = now
            self(text)

    # ------------------------------------------------------------------ spinner
    def __enter__(self) -> "Progress":
        if self.on and self._console is not None and self._console.is_terminal:
            self._status = self._console.status("[tvcert] working", spinner="dots")
            self._status.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
