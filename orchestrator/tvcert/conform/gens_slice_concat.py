"""Conformance generator for the equality step ``slice_concat_operand`` (kernel/slice_concat.py).

Draws a concat of 1-4 operands along a random dim (sometimes written negative), operands of different sizes
along it (size 1 and 0 included), and a slice of it compared with an operand: the exact bounds of operand k
(Megatron's coalesced gradient buffer), and near misses -- the start or end one row off, step 2, the slice along
another dim, bounds of the right size that straddle two operands, the bounds of operand k compared with operand
j, a slice nested under an elementwise op.  Whatever the prover calls equal is evaluated on random inputs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..kernel.expr import ExprError, Exprs
from ..ops import REGISTRY

if TYPE_CHECKING:  # eqgen imports this module at its end
    from .gens import Draw

__all__ = ["SLICE_CONCAT_GENERATORS", "gen_slice_concat"]


def gen_slice_concat(dr: Draw, seed: int):
    from .eqgen import _check_pair, _leaf

    X = Exprs()
    rank = dr.int(1, 3)
    base = [dr.int(1, 3) for _ in range(rank)]
    d = dr.int(0, rank - 1)
    m = dr.int(1, 4)
    sizes = [dr.pick([0, 1, 1, 2, 3]) for _ in range(m)]
    ops = []
    for n in sizes:
        s = list(base)
        s[d] = n
        ops.append(_leaf(X, dr, s))
    if dr.coin(0.2):  # an operand appearing twice (the same gradient buffer read twice)
        ops.append(ops[0])
        sizes.append(sizes[0])
    try:
        cat = X.mk("concat", {"dim": d - rank if dr.coin(0.3) else d}, ops)
        k = dr.int(0, len(ops) - 1)
        j = k
        start = sum(sizes[:k])
        end = start + sizes[k]
        step, sd = 1, d
        u = dr.rng.random()
        if u < 0.12:
            start += dr.pick([-1, 1])
        elif u < 0.24:
            end += dr.pick([-1, 1])
        elif u < 0.32:
            step = 2
        elif u < 0.42 and rank > 1:
            sd = dr.pick([x for x in range(rank) if x != d])  # another dim, bounds in range of it
            start, end = 0, X[cat].shape[sd]
        elif u < 0.52 and k + 1 < len(ops) and sizes[k] > 0:
            start, end = start + 1, end + 1  # the right size, straddling operands k and k+1
        elif u < 0.62 and len(ops) > 1:
            j = dr.pick([x for x in range(len(ops)) if x != k])  # operand k's rows against operand j
        start, end = max(start, 0), max(end, 0)
        total = X[cat].shape[d]
        if sd == d and (end > total or start > end):
            end = min(end, total)
            start = min(start, end)
        ra = {"dim": sd - rank if dr.coin(0.3) else sd, "start": start, "end": end, "step": step}
        REGISTRY["slice"].infer([X[cat].shape], dict(ra))
        a = X.mk("slice", ra, [cat])
        b = ops[j]
        if dr.coin(0.2):  # under an elementwise op on both sides (congruence first)
            a, b = X.mk("exp", {}, [a]), X.mk("exp", {}, [b])
        if dr.coin(0.5):
            a, b = b, a
    except (ExprError, ValueError, KeyError, IndexError) as exc:
        from .core import Result

        return Result("skip", detail=str(exc)), ""
    return _check_pair(X, a, b, seed), f"{X.show(a, 6)} vs {X.show(b, 6)}"


#: rule id -> generator, merged into ``eqgen.EQUALITY``
SLICE_CONCAT_GENERATORS = {"slice_concat_operand": gen_slice_concat}
