"""Conformance generators for Megatron's batch x heads merge (kernel/interleave_reshape.py).

* ``merge_interleaved_shard``: a Shard(d) tensor viewed with dims (d-1, d) merged, d-1 of size k (often > 1, 1
  too), the rank holding n >= 1 rows of d; near misses: dims (d, d+1) merged instead, an outer axis sharding d
  again or another dim, a Partial elsewhere; logical-shape hints that name the merge or not.
* ``split_interleaved_reshape``: an input laid out as ``interleave(Y, d, k, p)`` -- plain, permuted, scaled, or
  through a batched matmul of two interleaved operands (Megatron's ``baddbmm`` / ``bmm``) -- viewed with the
  rank's dim d split into (k', n); near misses: k' != k, the interleave over another p, the batched matmul with
  one operand not interleaved, the dim sharded on a second axis.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..kernel import interleave as il
from .core import OpCase, P, R, S, TIn

if TYPE_CHECKING:  # gens imports this module at its end
    from .gens import Draw

__all__ = ["INTERLEAVE_RESHAPE_GENERATORS", "gen_merge_interleaved", "gen_split_interleaved_reshape"]


def _others(dr: Draw, axes, fi: int, d: int, rank: int) -> tuple:
    pl = []
    for j in range(len(axes)):
        if j == fi:
            pl.append(S(d))
        elif dr.coin(0.25):
            pl.append(dr.pick([S(d), S(dr.int(0, rank - 1)), P("sum")]))
        else:
            pl.append(R)
    return tuple(pl)


def _local(shape, axes, sizes, pl):
    loc = list(shape)
    for a, q in zip(axes, pl):
        if q.kind == "S":
            if loc[q.dim] % sizes[a]:
                raise ValueError("not divisible")
            loc[q.dim] //= sizes[a]
    return loc


def gen_merge_interleaved(dr: Draw) -> OpCase:
    axes, sizes = dr.mesh(max_axes=2)
    fi = dr.int(0, len(axes) - 1)
    p = sizes[axes[fi]]
    rank = dr.int(2, 4)
    d = dr.int(1, rank - 1)
    pl = _others(dr, axes, fi, d, rank)
    shape = [dr.int(1, 3) for _ in range(rank)]
    f = 1
    for a, q in zip(axes, pl):
        if q.kind == "S":
            shape[q.dim] *= sizes[a] if q.dim != d else 1
            if q.dim == d:
                f *= sizes[a]
    shape[d] = f * dr.pick([1, 1, 2, 3])  # rows of d per rank: often one head
    shape[d - 1] = dr.pick([1, 2, 2, 3])  # the micro-batch
    loc = _local(shape, axes, sizes, pl)
    lo = d - 1 if dr.coin(0.85) or d + 1 >= rank else d  # near miss: merge d with the next dim
    target = loc[:lo] + [loc[lo] * loc[lo + 1]] + loc[lo + 2:]
    hints = []
    if dr.coin(0.6):
        h = list(shape[:lo]) + [shape[lo] * shape[lo + 1]] + list(shape[lo + 2:])
        hints.append((tuple(shape), tuple(h)))
    return OpCase("reshape", {"shape": target}, [TIn(tuple(shape), pl)], axes, sizes,
                  note="batch x heads merge" + ("" if lo == d - 1 else " (next dim)"), hints=tuple(hints))


def gen_split_interleaved_reshape(dr: Draw) -> OpCase:
    axes, sizes = dr.mesh(max_axes=2)
    fi = dr.int(0, len(axes) - 1)
    p = sizes[axes[fi]]
    k, n = dr.int(1, 3), dr.int(1, 2)
    near = dr.coin(0.35)
    kk, pp = k, p
    if near and dr.coin(0.4):
        kk, pp = dr.pick([(k + 1, p), (k, p + 1), (k * p, 1)])
    kind = dr.pick(["plain", "permute", "scale", "bmm", "bmm"])
    rest = [dr.int(1, 3) for _ in range(dr.int(1, 2))]
    if kind == "bmm":  # [k*p*n, m, c] @ [k*p*n, c, m2]: the batch dim interleaved on both operands
        m, c, m2 = dr.int(1, 3), dr.int(1, 2), dr.int(1, 3)
        B = k * p * n
        leaf = [B, m * c + c * m2]  # one leaf holds both operands' values
        plain_b = near and dr.coin(0.3)

        def lay(X, y):
            a = X.mk("reshape", {"shape": (B, m, c)}, [X.mk("slice", {"dim": 1, "start": 0, "end": m * c, "step": 1}, [y])])
            b = X.mk("reshape", {"shape": (B, c, m2)},
                     [X.mk("slice", {"dim": 1, "start": m * c, "end": m * c + c * m2, "step": 1}, [y])])
            ia = il.build(X, a, 0, kk, pp)
            ib = b if plain_b else il.build(X, b, 0, kk, pp)
            return X.mk("matmul", {}, [ia, ib])
        d = 0
    elif kind == "permute":
        leaf = rest + [k * p * n]
        perm = tuple([len(leaf) - 1] + list(range(len(leaf) - 1)))

        def lay(X, y):
            return X.mk("permute", {"dims": perm}, [il.build(X, y, len(leaf) - 1, kk, pp)])
        d = 0
    else:
        d = dr.int(0, len(rest))
        leaf = rest[:d] + [k * p * n] + rest[d:]

        def lay(X, y):
            e = il.build(X, y, d, kk, pp)
            return X.mk("scale", {"value": 0.5}, [e]) if kind == "scale" else e
    from ..kernel.expr import Exprs

    X = Exprs()
    try:
        out_shape = list(X[lay(X, X.leaf("x0", tuple(leaf), "float"))].shape)
    except Exception as exc:
        raise ValueError(f"layout: {exc}")
    pl = tuple(S(d) if j == fi else (S(d) if near and dr.coin(0.3) else R) for j in range(len(axes)))
    loc = _local(out_shape, axes, sizes, pl)
    ks = k if not (near and dr.coin(0.4)) else dr.pick([x for x in (1, 2, 3, 4) if x != k and loc[d] % x == 0] or [k])
    if loc[d] % ks:
        raise ValueError("split does not divide")
    target = loc[:d] + [ks, loc[d] // ks] + loc[d + 1:]
    return OpCase("reshape", {"shape": target}, [TIn(tuple(leaf), pl, layout=lay)], axes, sizes,
                  note=f"interleaved {kind} k={k}" + (" near" if near else ""))


#: rule id -> generator, merged into ``gens.SINGLE_OP``
INTERLEAVE_RESHAPE_GENERATORS = {"merge_interleaved_shard": gen_merge_interleaved,
                                 "split_interleaved_reshape": gen_split_interleaved_reshape}
