"""Failures of tvcert itself, kept apart from verdicts.

An internal error (an exception no rule, op or check anticipated) is never a verdict: not VERIFIED, not
REFUTED, not bad input.  The command line prints where it happened (the op and its JSON path) and exits
with its own code, ``EXIT_INTERNAL`` (4).
"""
from __future__ import annotations

EXIT_INTERNAL = 4


class InternalError(RuntimeError):
    """tvcert failed at ``where`` (e.g. "$.parallel[0].nodes[3] (einsum)") with ``exc``."""

    def __init__(self, where: str, exc: BaseException):
        self.where = where
        self.exc = exc
        super().__init__(f"{where}: {type(exc).__name__}: {exc}")
