"""Progress on stderr for long runs (loading, tracing ranks and layers, verifying, refuting).

``Progress(quiet)`` is a callable taking one line of text: the line is printed as ``[tvcert] <text>
(<elapsed> s)`` on stderr, and on a terminal a rich spinner shows the step in progress with its
elapsed time -- and a bar of the ranks traced so far when a tick says ``tracing rank K/N`` (the tracer's
sequential loop: K - 1 done) or ``traced K/N ranks`` (its worker processes).  ``tick(text)`` announces a
frequent step (loading, a rank, a layer): on a terminal it goes to the spinner; elsewhere (a CI log) its line is printed once the next step starts, so a step
that fails leaves only its error message (a broken spec is still one line), and ticks closer than
a second apart are thinned out.  ``quiet`` (``-q``, ``--json``) prints nothing.  Stdout is never
touched, so verdicts and ``--json`` stay clean.
"""
from __future__ import annotations

import re
import sys
import time
from typing import Any

_RANKS = (re.compile(r"^tracing rank (\d+)/(\d+)\b"), re.compile(r"^traced (\d+)/(\d+) ranks\b"))


def ranks_done(text: str) -> tuple[int, int] | None:
    """(ranks done, ranks in all) that a tick announces, or None."""
    for k, rx in enumerate(_RANKS):
        m = rx.match(text)
        if m:
            return int(m.group(1)) - (1 if k == 0 else 0), int(m.group(2))
    return None


class Progress:
    def __init__(self, quiet: bool = False):
        self.on = not quiet
        self.t0 = time.perf_counter()
        self._console: Any = None
        self._status: Any = None  # the rich live bar on a terminal
        self._task: Any = None
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
            self._show(text, step=True)

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
            self._show(text)
            return
        if self._pending is not None and now - self._last >= 1.0:
            self._flush()
        self._pending = f"[tvcert] {text} ({now - self.t0:.1f} s)"

    # ------------------------------------------------------------------ spinner
    def __enter__(self) -> "Progress":
        if self.on and self._console is not None and self._console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, SpinnerColumn, TextColumn, \
                TimeElapsedColumn

            self._status = Bar(SpinnerColumn("dots"), TextColumn("{task.description}", markup=False), BarColumn(),
                               MofNCompleteColumn(), TimeElapsedColumn(), console=self._console, transient=True)
            self._task = self._status.add_task("[tvcert] working", total=None)
            self._status.start()
        return self

    def _show(self, text: str, step: bool = False) -> None:
        """The bar's line: the text; the ranks done of all when it says, else (a new step) the bar pulses."""
        done = ranks_done(text)
        kw: dict = {"completed": done[0], "total": done[1]} if done else {"completed": 0, "total": None} if step else {}
        self._status.update(self._task, description=f"[tvcert] {text}"[:160], **kw)

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
