"""Conformance generators for fused tensors sharded per part (kernel/interleave.py): a fused ``w_qkv`` / gate-up
weight whose rank holds its block of each part, split on the rank, the parts' gradients concatenated back, and the
``interleave_commutes`` equality step.

The split's input is the interleave of a leaf pushed through the ops real code applies before the split -- the
projection matmul (the fused weight as its rhs column or lhs row), ``.t()`` / permutes, reshapes of the other
dims, pointwise ops -- or a near miss: the interleave's (k, p) swapped or over another divisor, a plain leaf, a
pointwise op of an interleaved and a plain operand, a reshape merging the fused dim with a neighbour, the
interleave on the contracted dim of the matmul, the split into another number of chunks, and on the other mesh
axes the fused dim sharded again, a Partial, a zig-zag shard.  The kernel must refuse them or conclude a fact
that holds on every rank (checked by :func:`.core.run_case` on the laid-out input).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..kernel import interleave as il
from .core import OpCase, P, R, S, TIn, Z

if TYPE_CHECKING:
    from .gens import Draw

__all__ = ["INTERLEAVE_GENERATORS", "gen_split_interleaved", "gen_concat_interleaved", "gen_interleave_eq"]


def _other_pls(dr: Draw, axes, fi: int, d: int, rank: int, sizes, near: bool) -> tuple:
    others = [k for k in range(rank) if k != d]
    pl = []
    for j in range(len(axes)):
        if j == fi:
            pl.append(S(d))
        elif near and dr.coin(0.4):
            pl.append(dr.pick([S(d), P("sum"), Z(d)]))
        elif others and dr.coin(0.4):
            pl.append(S(dr.pick(others)))
        else:
            pl.append(R)
    return tuple(pl)


def _chain(dr: Draw, shape: list[int], d: int, k: int, p: int, near: bool):
    """(leaf shape, layout(X, leaf) -> expr, the fused dim of the result): the interleave of the leaf along d,
    then one of the ops real code applies before the split (or a near miss)."""
    kind = dr.pick(["plain", "pointwise", "permute", "reshape", "matmul_col", "matmul_row"] + ["reshape"] * near)
    kk, pp = (k, p)
    if near and dr.coin(0.5):
        kk, pp = dr.pick([(p, k), (k * p, 1), (1, k * p), (k, p) if k * p % 2 else (k * p // 2, 2)])
    leaf = list(shape)

    plain = near and dr.coin(0.15)  # sometimes no interleave at all

    def inter(X, e, dim):
        return e if plain else il.build(X, e, dim, kk, pp)

    inter0 = inter

    if kind in ("matmul_col", "matmul_row"):
        N, H, M = shape[d], dr.int(1, 3), dr.int(1, shape[d])
        leaf = [N, H]
        col = kind == "matmul_col"
        wrong_dim = near and dr.coin(0.25)

        def lay(X, w, inter=inter0):
            a = X.mk("slice", {"dim": 0, "start": 0, "end": M, "step": 1}, [w])  # [M, H], a plain operand
            if wrong_dim:  # the interleave on the contracted dim (W^T interleaved on its rows = W's columns)
                wt = X.mk("permute", {"dims": (1, 0)}, [w])
                wi = inter(X, wt, 0)
                return X.mk("matmul", {}, [X.mk("permute", {"dims": (1, 0)}, [a]), wi]) if col else \
                    X.mk("matmul", {}, [X.mk("permute", {"dims": (1, 0)}, [wi]), a])
            wi = inter(X, w, 0)
            if col:  # x @ w.t(): [M, H] @ [H, N]
                return X.mk("matmul", {}, [a, X.mk("permute", {"dims": (1, 0)}, [wi])])
            return X.mk("matmul", {}, [wi, X.mk("permute", {"dims": (1, 0)}, [a])])  # [N, H] @ [H, M]
        return leaf, lay, (1 if col else 0)
    if kind == "permute":
        perm = [int(x) for x in dr.rng.permutation(len(shape))]
        # the result's dim j is the interleaved tensor's dim perm[j]: interleave on perm[d], its size shape[d]
        src = [0] * len(shape)
        for j, q in enumerate(perm):
            src[q] = shape[j]
        leaf = src

        def lay(X, y, inter=inter0):
            return X.mk("permute", {"dims": tuple(perm)}, [inter(X, y, perm[d])])
        return leaf, lay, d
    if kind == "reshape" and len(shape) >= 1:
        # the leaf has dim d and splits one other dim (or merges d with a neighbour: a near miss)
        if near and dr.coin(0.4) and len(shape) >= 2:  # the leaf's dims reversed, read back row-major: the
            src = list(reversed(shape))  # fused dim has its size but not its place (its index is mixed)
            dd = len(shape) - 1 - d
            leaf = src

            def lay(X, y, inter=inter0):
                return X.mk("reshape", {"shape": tuple(shape)}, [inter(X, y, dd)])
            return leaf, lay, d
        merge = near and dr.coin(0.4) and len(shape) >= 2
        if merge:
            j = d + 1 if d + 1 < len(shape) else d - 1
            lo, hi = min(d, j), max(d, j)
            src = shape[:lo] + [shape[lo] * shape[hi]] + shape[hi + 1:]
            dd = lo
            # the leaf holds the merged dim; the interleave is along it (size k*p*n*m): the rank's rows interleave
            leaf = src
            if src[dd] % (kk * pp):
                kk, pp = k, p

            def lay(X, y, inter=inter0):
                return X.mk("reshape", {"shape": tuple(shape)}, [inter(X, y, dd)])
            return leaf, lay, d
        others = [j for j in range(len(shape)) if j != d and shape[j] % 2 == 0]
        if others:
            j = dr.pick(others)
            src = shape[:j] + [2, shape[j] // 2] + shape[j + 1:]
            dd = d if d < j else d + 1
            leaf = src

            def lay(X, y, inter=inter0):
                return X.mk("reshape", {"shape": tuple(shape)}, [inter(X, y, dd)])
            return leaf, lay, d
    if kind == "pointwise":
        mixed = near and dr.coin(0.4)
        op = dr.pick(["exp", "neg", "mul", "add", "scale"])

        def lay(X, y, inter=inter0):
            a = inter(X, y, d)
            if op == "scale":
                return X.mk("scale", {"value": 3}, [a])
            if op in ("mul", "add"):
                b = y if mixed else a
                return X.mk(op, {}, [a, X.mk("exp", {}, [b])])
            return X.mk(op, {}, [a])
        return leaf, lay, d

    def lay(X, y, inter=inter0):
        return inter(X, y, d)
    return leaf, lay, d


def gen_split_interleaved(dr: Draw) -> OpCase:
    axes, sizes = dr.mesh()
    fi = dr.int(0, len(axes) - 1)
    p = sizes[axes[fi]]
    rank = dr.int(1, 3)
    d = dr.int(0, rank - 1)
    k, n = dr.int(2, 4), dr.int(1, 2)
    near = dr.coin(0.35)
    pl = _other_pls(dr, axes, fi, d, rank, sizes, near)
    from .gens import fit

    shape = fit(dr, rank, axes, sizes, [tuple(q if q.kind != "Z" else R for q in pl)])
    shape[d] = k * p * n * (2 if any(q.kind == "S" and q.dim == d for j, q in enumerate(pl) if j != fi) else 1)
    leaf, lay, dd = _chain(dr, list(shape), d, k, p, near)
    if dd != d:  # a matmul chain: its result is 2-D, fused on dd
        rank2 = 2
        pl = tuple(S(dd) if j == fi else (q if q.kind == "R" or (q.kind == "S" and q.dim < rank2 and q.dim != dd)
                                          else R) for j, q in enumerate(pl))
        d = dd
    from ..kernel.expr import Exprs

    X = Exprs()
    try:
        out_shape = X[lay(X, X.leaf("x0", tuple(leaf), "float"))].shape
    except Exception as exc:
        raise ValueError(f"chain: {exc}")
    pl = tuple(q for q in pl)
    if any(q.kind == "S" and q.dim >= len(out_shape) for q in pl):
        raise ValueError("placement out of range")
    local = out_shape[d]
    for j, q in enumerate(pl):
        if q.kind == "S" and q.dim == d:
            local //= sizes[axes[j]]
    kk = k if not (near and dr.coin(0.3)) else dr.pick([x for x in (1, 2, 3, 4, 6) if x != k])
    if local % kk:
        kk = k
    sizes_attr = [local // kk] * kk
    if near and dr.coin(0.2) and kk >= 2 and sizes_attr[0] > 1:
        sizes_attr[0] -= 1
        sizes_attr[1] += 1
    dim = d - len(out_shape) if dr.coin(0.3) else d
    if dr.coin(0.3):  # one part sliced out (x[..., i*n:(i+1)*n]), near misses: off by one, across two parts
        m = local // kk
        i = dr.int(0, kk - 1)
        st, en = i * m, (i + 1) * m
        if near and dr.coin(0.4):
            st, en = dr.pick([(st, min(en + 1, local)), (max(st - 1, 0), en - 1 if en - 1 > max(st - 1, 0) else en),
                              (st + m // 2, min(en + m // 2, local))])
        return OpCase("slice", {"dim": dim, "start": st, "end": en, "step": 1}, [TIn(tuple(leaf), pl, layout=lay)],
                      axes, sizes, note=f"fused k={k} part {i}" + (" near" if near else ""))
    return OpCase("split", {"dim": dim, "sizes": sizes_attr}, [TIn(tuple(leaf), pl, layout=lay)], axes, sizes,
                  note=f"fused k={k}" + (" near" if near else ""))


def gen_concat_interleaved(dr: Draw) -> OpCase:
    """k parts' Shard(d) operands concatenated along d (the split's backward), with near misses: an operand of
    another shape, operands placed differently, the dim sharded again or a Partial on another axis."""
    from .gens import fit

    axes, sizes = dr.mesh()
    fi = dr.int(0, len(axes) - 1)
    rank = dr.int(1, 3)
    d = dr.int(0, rank - 1)
    near = dr.coin(0.3)
    pl = _other_pls(dr, axes, fi, d, rank, sizes, near)
    shape = fit(dr, rank, axes, sizes, [tuple(q if q.kind != "Z" else R for q in pl)])
    k = dr.int(2, 4)
    if dr.coin(0.35):  # one part zero-padded to the k parts (a slice's backward), near misses: not whole parts,
        n = shape[d] // sizes[axes[fi]]  # a nonzero fill, another dim padded too
        i = dr.int(0, k - 1)
        pads = [0] * (2 * rank)
        pads[2 * d], pads[2 * d + 1] = i * n, (k - 1 - i) * n
        value = 0
        if near and dr.coin(0.5):
            u = dr.rng.random()
            if u < 0.4:
                pads[2 * d + dr.int(0, 1)] += 1
            elif u < 0.7:
                value = 1
            elif rank > 1:
                pads[2 * ((d + 1) % rank)] = 1
        return OpCase("pad", {"pads": pads, "value": value}, [TIn(tuple(shape), pl)], axes, sizes,
                      note=f"part {i} of {k} padded" + (" near" if near else ""))
    ins = [TIn(tuple(shape), pl) for _ in range(k)]
    if near and dr.coin(0.4):
        j = dr.int(0, k - 1)
        s2 = list(shape)
        s2[d] *= 2
        ins[j] = TIn(tuple(s2), pl)  # a part of another size (GQA's q next to k, v): no interleave states it
    elif near and dr.coin(0.4):
        ins[-1] = TIn(tuple(shape), tuple(R if j == fi else q for j, q in enumerate(pl)))
    dim = d - rank if dr.coin(0.3) else d
    return OpCase("concat", {"dim": dim}, ins, axes, sizes, note=f"fused parts k={k}" + (" near" if near else ""))


def gen_interleave_eq(dr: Draw, seed: int):
    """``f(interleave(W))`` against ``interleave(f(W))`` for the chain ops of :func:`_chain` (each side built
    independently), near misses: the chain's own (a wrong (k, p), no interleave, a mixed pointwise operand, the
    fused dim moved by a reshape, the interleave on the contracted dim), or on the other side another (k, p) or
    another op."""
    from ..kernel.expr import ExprError, Exprs
    from .core import Result
    from .eqgen import _check_pair

    rank = dr.int(1, 3)
    d = dr.int(0, rank - 1)
    k, p, n = dr.int(2, 3), dr.int(2, 3), dr.int(1, 2)
    shape = [dr.int(1, 3) for _ in range(rank)]
    shape[d] = k * p * n
    leaf, lay, dd = _chain(dr, shape, d, k, p, dr.coin(0.35))
    kk, pp, neg = k, p, False
    if dr.coin(0.2):
        kk, pp, neg = dr.pick([(p, k, False), (k * p, 1, False), (k, p, True)])
    X = Exprs()
    try:
        w = X.leaf("w", tuple(leaf), "float")
        a = lay(X, w)
        core = lay(X, w, inter=lambda X, e, dim: e)  # the same ops on the plain leaf
        b = il.build(X, X.mk("neg", {}, [core]) if neg else core, dd, kk, pp)
    except ExprError as exc:
        return Result("skip", detail=str(exc)), ""
    return _check_pair(X, a, b, seed), f"{X.show(a, 6)} vs {X.show(b, 6)}"


#: rule id -> generator for single-op rules (merged into ``gens.SINGLE_OP``)
INTERLEAVE_GENERATORS = {
    il.SPLIT_RULE: gen_split_interleaved,
    il.CONCAT_RULE: gen_concat_interleaved,
}
#: equality step -> generator (merged into ``eqgen.EQUALITY``)
INTERLEAVE_EQ_GENERATORS = {il.EQ_RULE: gen_interleave_eq}
