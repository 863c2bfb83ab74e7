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


BIG = 64  # a nat literal is unary in Coq's terms: n costs n constructors to elaborate and store


def _nat(n) -> str:
    """A natural number literal: decimal when small, else ``Pos.to_nat n%positive`` (binary until
    ``vm_compute`` runs it), so a plan with ids and dims in the thousands stays small."""
    if isinstance(n, bool) or not isinstance(n, int):
        return str(n)
    return str(n) if n < BIG else f"(Pos.to_nat {n}%positive)"


def _bin(n: int) -> str:
    """A binary ``N`` literal (MathComp's ``%N`` is nat's scope, so the constructors are written)."""
    return "N0" if n == 0 else f"(Npos {n}%positive)"


def _rat(c: Fraction) -> str:
    """A ``Syntax.rat_lit``: (negative?, numerator, denominator) in binary."""
    return f"({'true' if c < 0 else 'false'}, {_bin(abs(c.numerator))}, {_bin(c.denominator)})"


def _seq(xs) -> str:
    return "[:: " + "; ".join(_nat(x) for x in xs) + "]" if xs else "[::]"
