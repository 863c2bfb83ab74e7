"""Conformance generators for rank-reversed blocks (kernel/reversed_blocks.py).

``slice_reversed_block_to_shard``: rank r slices block p-1-r of a replicated tensor, the bounds spelled as real code
traces them (``(p-1-r)*n``, ``rank*-n+(p-1)*n``, ``(p-r)*n`` or ``start+n`` for the end), over any mesh axis, of
a tensor of 1-3 dims with other axes Replicate or sharding other dims; near misses: the block size off by one,
the reversal of another axis's rank, an end one row short, the reversal's dim sharded again on another axis, a
Partial or a zig-zag shard on another axis, a rotation written affinely (``(p-r)*n``, off the end for rank 0).

``reversed_blocks_commute``: one side a row-wise computation (matmul with a replicated weight, pointwise ops,
transposes, a reshape keeping the dim) of the reversed tensor, its stack flipped back over the ranks (or a
contraction whose dim is reversed in both operands: the weight gradient), the other the same computation of
the plain tensor; near misses: the flip over another dim, no flip, another block count, one operand of the
contraction reversed only, the reversal of one operand of a pointwise op only.  Whatever the prover calls equal
is evaluated on random inputs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..kernel.expr import ExprError, Exprs
from ..kernel.reversed_blocks import build
from .core import OpCase, P, R, S, TIn, Z

if TYPE_CHECKING:
    from .gens import Draw

__all__ = ["REVERSED_BLOCKS_GENERATORS", "REVERSED_BLOCKS_EQ_GENERATORS"]


def gen_reversed_slice(dr: Draw) -> OpCase:
    axes, sizes = dr.mesh()
    fi = dr.int(0, len(axes) - 1)
    a = axes[fi]
    p = sizes[a]
    rank = dr.int(1, 3)
    d = dr.int(0, rank - 1)
    others = [k for k in range(rank) if k != d]
    pl = []
    for j in range(len(axes)):
        u = dr.rng.random()
        if j == fi or u < 0.5 or not others and u < 0.9:
            pl.append(R)
        elif others and u < 0.85:
            pl.append(S(dr.pick(others)))
        elif u < 0.92:
            pl.append(P(dr.pick(["sum", "avg", "max"])))
        elif u < 0.96 and others:
            pl.append(Z(dr.pick(others)))
        else:
            pl.append(S(d))  # the dim sharded again elsewhere: refused
    shape = [dr.int(1, 3) for _ in range(rank)]
    for b, q in zip(axes, pl):
        if q.kind in ("S", "Z"):
            shape[q.dim] *= sizes[b] * (2 if q.kind == "Z" else 1)
    n = dr.int(1, 3)
    outer = 1
    for b, q in zip(axes, pl):
        if q.kind == "S" and q.dim == d:
            outer *= sizes[b]
    shape[d] = outer * p * n
    r = f"rank.{a}"
    start = dr.pick([f"({p - 1}-{r})*{n}", f"{r}*-{n}+{(p - 1) * n}", f"{(p - 1) * n}-{n}*{r}"])
    end = dr.pick([f"({p}-{r})*{n}", f"{start}+{n}", f"{r}*-{n}+{p * n}"])
    u = dr.rng.random()
    if u < 0.06 and n > 1:
        start, end = f"({p - 1}-{r})*{n - 1}", f"({p - 1}-{r})*{n - 1}+{n - 1}"  # block size off by one
    elif u < 0.12 and len(axes) > 1:
        b = dr.pick([x for x in axes if x != a])
        start, end = f"({sizes[b] - 1}-rank.{b})*{n}", f"({sizes[b]}-rank.{b})*{n}"  # another axis's rank
    elif u < 0.16:
        end = f"({p}-{r})*{n}-1"  # one row short
    elif u < 0.2:
        start, end = f"({p}-{r})*{n}", f"({p + 1}-{r})*{n}"  # shifted by a block: off the end for rank 0
    return OpCase("slice", {"dim": d - rank if dr.coin(0.3) else d, "start": start, "end": end},
                  [TIn(tuple(shape), tuple(pl))], axes, sizes, note="rank-reversed block")


def _rowwise(X: Exprs, dr: Draw, t: int, w: int | None, fns: list) -> int:
    """A row-wise computation of t (rows = dim 0): the same random ops for both sides, recorded in ``fns``."""
    if not fns:
        for _ in range(dr.int(1, 3)):
            fns.append(dr.pick(["matmul", "tanh", "exp", "scale", "mul_self", "double_t"]))
    for k in fns:
        if k == "matmul" and w is not None and X[t].shape[-1] == X[w].shape[0]:
            t = X.mk("matmul", {}, [t, w])
        elif k == "tanh":
            t = X.mk("tanh", {}, [t])
        elif k == "exp":
            t = X.mk("exp", {}, [t])
        elif k == "scale":
            t = X.mk("scale", {"value": 1.5}, [t])
        elif k == "mul_self":
            t = X.mk("mul", {}, [t, X.mk("tanh", {}, [t])])
        elif k == "double_t" and len(X[t].shape) == 2:
            t = X.mk("permute", {"dims": (1, 0)}, [X.mk("permute", {"dims": (1, 0)}, [t])])
    return t


def gen_reversed_commute(dr: Draw, seed: int):
    from .core import Result
    from .eqgen import _check_pair, _leaf

    X = Exprs()
    try:
        p, n, h, f = dr.int(2, 4), dr.int(1, 3), dr.int(1, 3), dr.int(1, 3)
        T = p * n
        x = _leaf(X, dr, (T, h))
        w = _leaf(X, dr, (h, f))
        q = p if dr.coin(0.85) else dr.pick([k for k in (1, 2, 3, 4, 6) if T % k == 0 and k != p] or [p])
        fns: list = []
        u = dr.rng.random()
        if u < 0.55:  # forward: f(RB(x)) gathered as a stack [p, n, F] and flipped over the ranks
            y = _rowwise(X, dr, build(X, x, 0, p), w, fns)
            s = list(X[y].shape)
            st = X.mk("reshape", {"shape": tuple([q, T // q] + s[1:])}, [y])
            k = dr.rng.random()
            fl = st if k < 0.08 else X.mk("flip", {"dims": (1 if k < 0.16 else 0,)}, [st])
            a = X.mk("reshape", {"shape": tuple(s)}, [fl])
            b = _rowwise(X, dr, x, w, fns)
        elif u < 0.85:  # backward: a contraction over the reversed dim (x^T g, both reversed)
            g = _leaf(X, dr, (T, f))
            both = dr.rng.random() > 0.1
            lhs = X.mk("permute", {"dims": (1, 0)}, [build(X, x, 0, p)])
            rhs = build(X, g, 0, q) if both else g
            rhs = X.mk("mul", {}, [rhs, X.mk("tanh", {}, [build(X, x, 0, p) if dr.coin(0.3) and h == f else rhs])])
            a = X.mk("matmul", {}, [lhs, rhs])
            b = X.mk("matmul", {}, [X.mk("permute", {"dims": (1, 0)}, [x]),
                                    X.mk("mul", {}, [g, X.mk("tanh", {}, [g])])])
        else:  # a pointwise op of a reversed operand and a plain one: only when both are reversed
            y2 = _leaf(X, dr, (T, h))
            rev2 = dr.coin(0.6)
            a = X.mk("add", {}, [build(X, x, 0, p), build(X, y2, 0, q) if rev2 else y2])
            b = build(X, X.mk("add", {}, [x, y2]), 0, p)
        if dr.coin(0.5):
            a, b = b, a
    except (ExprError, ValueError, KeyError, IndexError) as exc:
        return Result("skip", detail=str(exc)), ""
    return _check_pair(X, a, b, seed), f"{X.show(a, 8)} vs {X.show(b, 8)}"


#: rule id -> generator, merged into ``gens.SINGLE_OP`` / ``eqgen.EQUALITY``
REVERSED_BLOCKS_GENERATORS = {"slice_reversed_block_to_shard": gen_reversed_slice}
REVERSED_BLOCKS_EQ_GENERATORS = {"reversed_blocks_commute": gen_reversed_commute}
