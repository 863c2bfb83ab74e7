"""int_range_count: a count of labels that are not ``ignore_index`` is the token count when no input can equal it.

DTensor's ``loss_parallel()`` (and any cross-entropy decomposed with ``reduction="mean"``) divides the summed loss
by ``sum(labels != ignore_index)``.  The plan contract says an int input lies in ``[0, range)``, so against a
constant outside that interval a comparison is constant -- ``labels != -100`` is 1 everywhere -- and the count is
the element count.  A range ``[lo, hi]`` means ``[lo, hi)``: padded labels (lo = -100, inferred by the tracer from
the ignore index or a ``labels != -100`` mask) keep the comparison undecided, so such a count is never folded: ``cast(sum(ne(reshape(labels), -100)))`` is the constant N (``Rules/IntRange.v``).

:func:`const_value` folds such an expression to its one value, or None.  It reads: a constant fill; a comparison
(eq, ne, lt, le, gt, ge) of an int expression whose values lie in a known interval with a constant that the
interval decides; a cast; a sum (value times the element count of the summed dims) or mean of a fill.  The
interval of an int expression: an int input with a declared range is in ``[0, range - 1]`` (``[lo, hi - 1]``); a reshape, permute,
expand or slice of it keeps its values.  Used by the prover on a scalar divisor or factor only (kernel/equality.py).
"""
from __future__ import annotations

from fractions import Fraction
from math import prod
from typing import Mapping

from .expr import Exprs

RULE = "int_range_count"
STATEMENT = ("an int input in [lo, hi) (range R: [0, R)) compared with a constant the interval decides is a "
             "constant; a sum of a constant "
             "fill is its value times the element count; a cast or mean of a fill is a fill")
SAME_VALUES = {"reshape", "permute", "expand", "slice"}
COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
MAX_DEPTH = 12


def input_ranges(plan) -> dict[str, tuple[int, int]]:
    """Logical int input name -> its declared values [lo, hi) (``range`` R is [0, R)), bound at the plan's dims."""
    from ..graph import int_bounds

    return {t.name: int_bounds(t, plan.dims, f"{t.name}.range") for t in plan.logical.inputs
            if t.dtype == "int" and t.range is not None}


def interval(X: Exprs, i: int, ranges: Mapping[str, tuple[int, int] | int], depth: int = MAX_DEPTH) -> tuple[int, int] | None:
    e = X[i]
    if e.dtype != "int" or depth <= 0:
        return None
    if e.op == "input":
        r = ranges.get(e.attr_dict()["name"])
        lo, hi = (0, r) if isinstance(r, int) else r if r is not None else (0, 0)  # R is [0, R)
        return (lo, hi - 1) if lo < hi else None
    if e.op in SAME_VALUES and e.args:
        return interval(X, e.args[0], ranges, depth - 1)
    return None


def _decide(op: str, lo: int, hi: int, c: Fraction, flipped: bool) -> int | None:
    """x op c for every x in [lo, hi] (``flipped``: c op x), as 1 / 0, or None when the interval does not decide."""
    if flipped:
        op = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}.get(op, op)
    if op in ("eq", "ne"):
        if lo <= c <= hi and c.denominator == 1:
            return None
        return int(op == "ne")
    always = {"lt": hi < c, "le": hi <= c, "gt": lo > c, "ge": lo >= c}[op]
    never = {"lt": lo >= c, "le": lo > c, "gt": hi <= c, "ge": hi < c}[op]
    return 1 if always else 0 if never else None


def const_value(X: Exprs, i: int, ranges: Mapping[str, tuple[int, int] | int], depth: int = MAX_DEPTH) -> Fraction | None:
    """The one value every element of ``i`` has, or None.  An int value past int64 is None: the int tensor wraps
    there (a sum of four 3 * 2**61 is -2**63, not 3 * 2**63)."""
    v = _const_value(X, i, ranges, depth)
    if v is not None and X[i].dtype == "int" and not -(1 << 63) <= v < (1 << 63):
        return None
    return v


def _const_value(X: Exprs, i: int, ranges: Mapping[str, tuple[int, int] | int], depth: int) -> Fraction | None:
    if depth <= 0:
        return None
    e = X[i]
    at = e.attr_dict()
    if e.op == "const":
        v = at.get("value")
        return Fraction(str(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    if e.op == "cast" and e.args:
        v = const_value(X, e.args[0], ranges, depth - 1)
        if v is None:
            return None
        if at.get("dtype", "float") == "int":
            return v if v.denominator == 1 else None
        return v
    if e.op in ("sum", "mean") and e.args and e.dtype == X[e.args[0]].dtype:
        v = const_value(X, e.args[0], ranges, depth - 1)
        if v is None:
            return None
        if e.op == "mean" or not at.get("dims"):
            return v if e.op == "mean" and at.get("dims") else None
        shape = X[e.args[0]].shape
        return v * prod(shape[d] for d in at["dims"])
    if e.op in COMPARE and len(e.args) == 2:
        for k in (0, 1):
            x, c = e.args[k], e.args[1 - k]
            if X[c].shape != ():
                continue
            cv = const_value(X, c, ranges, depth - 1)
            iv = interval(X, x, ranges, depth - 1)
            if cv is not None and iv is not None:
                got = _decide(e.op, iv[0], iv[1], cv, k == 1)
                if got is not None:
                    return Fraction(got)
    return None


_SUM_BOUND = {"add": lambda a, b: a + b, "sub": lambda a, b: a + b, "mul": lambda a, b: a * b,
              "maximum": max, "minimum": max}


def abs_bound(X: Exprs, i: int, ranges: Mapping[str, tuple[int, int] | int], depth: int = MAX_DEPTH) -> int | None:
    """A bound on |v| for every value v of the int expression ``i`` computed over the integers (a declared input
    range, constants, comparisons 0 / 1, +, -, *, where, max / min, and a sum: its operand's bound times the summed
    element count), or None.  What lets an int Partial(sum) be read as a real: its pieces and their sum stay inside
    int64 (rules._int_pieces_to_float)."""
    e = X[i]
    if e.dtype != "int" or depth <= 0:
        return None
    at = e.attr_dict()
    sub = lambda j: abs_bound(X, j, ranges, depth - 1)  # noqa: E731
    if e.op == "const":
        v = at.get("value")
        vals = v if isinstance(v, list) else [v]
        while any(isinstance(x, list) for x in vals):
            vals = [y for x in vals for y in (x if isinstance(x, list) else [x])]
        return max((abs(int(x)) for x in vals), default=0) if all(isinstance(x, int) for x in vals) else None
    if e.op in COMPARE or e.op in ("logical_and", "logical_or", "logical_not"):
        return 1
    if e.op == "input" or e.op in SAME_VALUES:
        iv = interval(X, i, ranges, depth)
        if iv is not None:
            return max(abs(iv[0]), abs(iv[1]))
        return sub(e.args[0]) if e.op in SAME_VALUES and e.args else None
    if e.op in ("neg", "abs", "cast") and e.args:
        return sub(e.args[0]) if X[e.args[0]].dtype == "int" else None
    if e.op in _SUM_BOUND and len(e.args) == 2:
        a, b = sub(e.args[0]), sub(e.args[1])
        return None if a is None or b is None else _SUM_BOUND[e.op](a, b)
    if e.op == "where" and len(e.args) == 3:
        a, b = sub(e.args[1]), sub(e.args[2])
        return None if a is None or b is None else max(a, b)
    if e.op == "sum" and e.args:
        a = sub(e.args[0])
        shape = X[e.args[0]].shape
        dims = at.get("dims") or range(len(shape))
        return None if a is None else a * prod(shape[d] for d in dims)
    return None
