"""Conformance generator for ``int_range_count`` (kernel/int_range.py): a loss scaled by a count of labels that
pass a comparison with a constant, against the loss scaled by a number.

The labels are an int leaf with a declared range [lo, R) (lo 0, or -100 / -1: padded labels; the plan contract), seen through a
reshape / permute / expand / slice; compared (eq, ne, lt, le, gt, ge, either side) with a constant inside or
outside [0, R) (-100, -1, R, R + 1, a fraction, or an in-range value: a near miss, not constant); counted by a sum
over all dims (or a mean, or without the cast); the other side is the loss times N, 0, N - 1 or another number.
Near misses also drop the declared range.  A proved pair is evaluated on labels drawn in range (eqgen._check_pair).
"""
from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING

from ..kernel.int_range import RULE

if TYPE_CHECKING:
    from .gens import Draw

__all__ = ["INT_RANGE_GENERATORS", "gen_int_range"]


def gen_int_range(dr: Draw, seed: int):
    from ..kernel.expr import ExprError, Exprs
    from .core import Result
    from .eqgen import _check_pair

    X = Exprs()
    R = dr.int(1, 5)
    shape = tuple(dr.int(1, 4) for _ in range(dr.int(1, 2)))
    lo = dr.pick([0, 0, 0, -100, -1])  # a padded domain [lo, R): a count against lo must not fold
    ranges = {"labels": (lo, R)} if dr.coin(0.9) else {}
    try:
        x = X.leaf("labels", shape, "int")
        view = dr.pick(["none", "reshape", "permute", "expand", "slice"])
        if view == "reshape":
            x = X.mk("reshape", {"shape": (prod(shape),)}, [x])
        elif view == "permute" and len(shape) == 2:
            x = X.mk("permute", {"dims": (1, 0)}, [x])
        elif view == "expand":
            x = X.mk("expand", {"shape": (2, *shape)}, [X.mk("reshape", {"shape": (1, *shape)}, [x])])
        elif view == "slice" and shape[0] > 1:
            x = X.mk("slice", {"dim": 0, "start": 1, "end": shape[0], "step": 1}, [x])
        n = prod(X[x].shape)
        cv = dr.pick([-100, -1, R, R + 1, 0.5, -0.5, 0, R - 1, dr.int(0, max(R - 1, 0))])
        c = X.mk("const", {"value": cv, "shape": (), "dtype": "int" if float(cv).is_integer() else "float"}, [])
        op = dr.pick(["ne", "ne", "eq", "lt", "le", "gt", "ge"])
        cmp = X.mk(op, {}, [x, c] if dr.coin(0.7) else [c, x])
        red = dr.pick(["sum", "sum", "mean"])
        dims = tuple(range(len(X[cmp].shape)))
        cnt = X.mk(red, {"dims": dims, "keepdim": False}, [X.mk("cast", {"dtype": "float"}, [cmp]) if red == "mean"
                                                          else cmp])
        if red == "sum" and dr.coin(0.85):
            cnt = X.mk("cast", {"dtype": "float"}, [cnt])
        loss = X.leaf("loss", (), "float")
        a = X.mk("mul", {}, [loss, cnt])
        v = dr.pick([n, n, 0, n - 1, 1, 2 * n]) if red == "sum" else dr.pick([1, 0, 0.5])
        b = X.mk("scale", {"value": v}, [loss])
    except ExprError as exc:
        return Result("skip", detail=str(exc)), ""
    note = f" (labels in [{lo}, {R}){'' if ranges else ', undeclared'})"
    return _check_pair(X, a, b, seed, ranges), f"{X.show(a, 6)} vs {X.show(b, 3)}{note}"


INT_RANGE_GENERATORS = {RULE: gen_int_range}
