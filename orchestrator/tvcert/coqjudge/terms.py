"""Coq literals shared by the printers: rationals and sequences (part of the trusted printer)."""
from __future__ import annotations

from fractions import Fraction
from typing import Any


def _num(v: Any) -> Fraction | None:
    """A plan attribute as the rational the exact interpreter reads, or None if it is not a number."""
    if isinstance(v, bool) or not isinstance(v, (int, float, Fraction)):
        return None
    if isinstance(v, float):  # the decimal it is written as (0.1 is 1/10), as the exact interpreter reads it
        if v != v or v in (float("inf"), float("-inf")):
            return None
        return Fraction(str(v))
    return Fraction(v)


def _rat(c: Fraction) -> str:
    """A ``Syntax.rat_lit``: (negative?, numerator, denominator)."""
    return f"({'true' if c < 0 else 'false'}, {abs(c.numerator)}, {c.denominator})"


def _seq(xs) -> str:
    return "[:: " + "; ".join(str(x) for x in xs) + "]" if xs else "[::]"
