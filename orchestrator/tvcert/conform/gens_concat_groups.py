"""Conformance generators for fused tensors of parts of different sizes (kernel/concat_groups.py): a GQA ``w_qkv``
laid out ``concat_groups`` and sharded, split on the rank into its parts, the parts' gradients concatenated back,
a part zero-padded back to its offset (a slice's backward), and the ``concat_groups_commutes`` equality step.

The split (or one part sliced out) reads the grouped layout of a leaf, pushed through an op real code applies before the split (the
projection matmul with the fused weight as rhs column or lhs row, a permute, a pointwise op), or a near miss:
the split sizes in another order or off by a row, the layout's parts in another order or over one group (a plain
shard), a plain leaf, a pointwise op of a laid-out and a plain operand, and on the other axes the fused dim
sharded again or a Partial.  The kernel must refuse them or conclude a fact that holds on every rank (:func:`.core.run_case`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..kernel import concat_groups as cg
from .core import OpCase, P, R, S, TIn

if TYPE_CHECKING:
    from .gens import Draw

__all__ = ["CONCAT_GROUPS_GENERATORS", "CONCAT_GROUPS_EQ_GENERATORS"]


def _parts(dr: Draw, p: int) -> list[int]:
    """Logical part sizes, multiples of p, not all equal (a GQA q, k, v)."""
    k = dr.int(2, 3)
    per = [dr.int(1, 3) for _ in range(k)]
    if len(set(per)) == 1:
        per[0] += 1
    return [p * n for n in per]


def _chain(dr: Draw, shape: list[int], d: int, parts: list[int], p: int, near: bool):
    """(leaf shape, layout(X, leaf, lay=True) -> expr, the fused dim of the result)."""
    kind = dr.pick(["plain", "pointwise", "permute", "matmul_col", "matmul_row"])
    sizes, groups, plain = list(parts), p, near and dr.coin(0.15)
    if near and dr.coin(0.4):
        u = dr.rng.random()
        if u < 0.4:
            groups = 1  # the layout over another group count than the axis (the identity: a plain shard)
        elif u < 0.8:
            sizes = list(reversed(parts))  # the parts in another order (k, v before q)
        else:
            plain = True

    def inter(X, e, dim, lay=True):
        if plain or not lay:
            return e
        return cg.build_expr(X, e, {"dim": dim, "sizes": sizes, "groups": groups})

    if kind in ("matmul_col", "matmul_row"):
        N, H, M = shape[d], dr.int(1, 3), dr.int(1, 3)
        col = kind == "matmul_col"

        def lay(X, w, lay=True):
            a = X.mk("slice", {"dim": 0, "start": 0, "end": M, "step": 1}, [X.mk("exp", {}, [w])])  # [M, H]
            wi = inter(X, w, 0, lay)
            if col:  # x @ w.t(): [M, H] @ [H, N]
                return X.mk("matmul", {}, [a, X.mk("permute", {"dims": (1, 0)}, [wi])])
            return X.mk("matmul", {}, [wi, X.mk("permute", {"dims": (1, 0)}, [a])])  # [N, H] @ [H, M]
        return [N, H], lay, (1 if col else 0), M
    if kind == "permute" and len(shape) >= 2:
        perm = [int(x) for x in dr.rng.permutation(len(shape))]
        src = [0] * len(shape)
        for j, q in enumerate(perm):
            src[q] = shape[j]

        def lay(X, y, lay=True):
            return X.mk("permute", {"dims": tuple(perm)}, [inter(X, y, perm[d], lay)])
        return src, lay, d, None
    if kind == "pointwise":
        mixed = near and dr.coin(0.4)

        def lay(X, y, lay=True):
            a = inter(X, y, d, lay)
            return X.mk("mul", {}, [a, X.mk("exp", {}, [y if mixed else a])])
        return list(shape), lay, d, None

    def lay(X, y, lay=True):
        return inter(X, y, d, lay)
    return list(shape), lay, d, None


def _placement(dr: Draw, axes, fi: int, d: int, rank: int, near: bool) -> tuple:
    pl = []
    for j in range(len(axes)):
        if j == fi:
            pl.append(S(d))
        elif near and dr.coin(0.3):
            pl.append(dr.pick([S(d), P("sum")]))
        elif rank > 1 and dr.coin(0.3):
            pl.append(S(dr.pick([k for k in range(rank) if k != d])))
        else:
            pl.append(R)
    return tuple(pl)


def _leaf_shape(dr: Draw, rank: int, axes, sizes, pl, d: int, total: int) -> list[int]:
    from .gens import fit

    shape = fit(dr, rank, axes, sizes, [tuple(q if q.dim != d or q.kind != "S" else R for q in pl)])
    shape[d] = total
    return shape


def gen_split_grouped(dr: Draw) -> OpCase:
    axes, sizes = dr.mesh(max_axes=2)
    fi = dr.int(0, len(axes) - 1)
    p = sizes[axes[fi]]
    near = dr.coin(0.35)
    parts = _parts(dr, p)
    rank = dr.int(1, 3)
    d = dr.int(0, rank - 1)
    pl = _placement(dr, axes, fi, d, rank, near)
    twice = sum(1 for q in pl if q.kind == "S" and q.dim == d)
    if twice > 1:
        parts = [n * 2 for n in parts]
    shape = _leaf_shape(dr, rank, axes, sizes, pl, d, sum(parts))
    leaf, lay, dd, m = _chain(dr, shape, d, parts, p, near)
    if m is not None:  # a matmul chain: the result is 2-D, fused on dd, its other dim (size m) replicated
        pl = tuple(S(dd) if j == fi else (q if q.kind == "P" or (q.kind == "S" and q.dim == d) else R)
                   for j, q in enumerate(pl))
        pl = tuple(S(dd) if q.kind == "S" else q for q in pl)
        d = dd
    local = [n // p // (2 if twice > 1 else 1) for n in parts]
    if near and dr.coin(0.3):
        if dr.coin(0.5):
            local = list(reversed(local))
        elif local[0] > 1:
            local[0] -= 1
            local[1] += 1
    dim = d - (2 if m is not None else rank) if dr.coin(0.3) else d
    if dr.coin(0.35):  # one part sliced out (Phi-3's qkv[..., :a]); near misses: off by one, across two parts
        i = dr.int(0, len(local) - 1)
        st = sum(local[:i])
        en = st + local[i]
        if near and dr.coin(0.5):
            if i + 1 < len(local) and dr.coin(0.5):
                en += local[i + 1]
            else:
                st, en = st + 1, en + 1
        return OpCase("slice", {"dim": dim, "start": st, "end": en, "step": 1}, [TIn(tuple(leaf), pl, layout=lay)],
                      axes, sizes, note=f"part {i} of grouped parts {parts} sliced" + (" near" if near else ""))
    return OpCase("split", {"dim": dim, "sizes": local}, [TIn(tuple(leaf), pl, layout=lay)], axes, sizes,
                  note=f"grouped parts {parts}" + (" near" if near else ""))


def gen_pad_grouped(dr: Draw) -> OpCase:
    """A Shard(d) part zero-padded back to its offset among declared grouped parts (its slice's backward), near
    misses: the pad off the part boundary or one row short, a nonzero fill, another dim padded too, the declared
    layout over another group count or with the part a row longer, the dim sharded again or a Partial elsewhere."""
    axes, sizes = dr.mesh(max_axes=2)
    fi = dr.int(0, len(axes) - 1)
    p = sizes[axes[fi]]
    near = dr.coin(0.4)
    rank = dr.int(1, 3)
    d = dr.int(0, rank - 1)
    pl = _placement(dr, axes, fi, d, rank, near)
    twice = any(q.kind == "S" and q.dim == d for j, q in enumerate(pl) if j != fi)
    parts = _parts(dr, p)
    local = [n // p for n in parts]
    i = dr.int(0, len(parts) - 1)
    shape = _leaf_shape(dr, rank, axes, sizes, pl, d, parts[i] * (2 if twice else 1))
    pads = [0] * (2 * rank)
    pads[2 * d], pads[2 * d + 1] = sum(local[:i]), sum(local[i + 1:])
    value, declared, groups = 0, list(parts), p
    if near:
        u = dr.rng.random()
        if u < 0.2:
            pads[2 * d + dr.int(0, 1)] += 1
        elif u < 0.35:
            value = 1.0
        elif u < 0.5 and rank > 1:
            pads[2 * ((d + 1) % rank)] = 1
        elif u < 0.65:
            groups = dr.pick([1, p + 1])
        elif u < 0.8:
            declared[i] += p
    return OpCase("pad", {"pads": pads, "value": value}, [TIn(tuple(shape), pl)], axes, sizes,
                  note=f"part {i} of grouped parts {parts} padded" + (" near" if near else ""),
                  groupings=((tuple(declared), groups),))


def gen_concat_grouped(dr: Draw) -> OpCase:
    """Shard(d) operands of different sizes concatenated along d, near misses: an operand placed differently,
    the dim sharded again or a Partial on another axis; or (a third of the draws) :func:`gen_pad_grouped`."""
    if dr.coin(0.35):
        return gen_pad_grouped(dr)
    axes, sizes = dr.mesh(max_axes=2)
    fi = dr.int(0, len(axes) - 1)
    p = sizes[axes[fi]]
    near = dr.coin(0.3)
    rank = dr.int(1, 3)
    d = dr.int(0, rank - 1)
    pl = _placement(dr, axes, fi, d, rank, near)
    extra = 2 if any(q.kind == "S" and q.dim == d for j, q in enumerate(pl) if j != fi) else 1
    parts = [n * extra for n in _parts(dr, p)]
    shape = _leaf_shape(dr, rank, axes, sizes, pl, d, parts[0])
    ins = [TIn(tuple(shape[:d] + [n] + shape[d + 1:]), pl) for n in parts]
    if near and dr.coin(0.4):
        ins[-1] = TIn(ins[-1].shape, tuple(R if j == fi else q for j, q in enumerate(pl)))
    dim = d - rank if dr.coin(0.3) else d
    return OpCase("concat", {"dim": dim}, ins, axes, sizes, note=f"grouped parts {parts}" + (" near" if near else ""))


def gen_concat_groups_eq(dr: Draw, seed: int):
    """``f(concat_groups(W))`` against ``concat_groups(f(W))`` for :func:`_chain`'s ops (each side built
    independently), near misses: the chain's own, or on the other side other sizes, groups or a negation."""
    from ..kernel.expr import ExprError, Exprs
    from .core import Result
    from .eqgen import _check_pair

    rank = dr.int(1, 3)
    d = dr.int(0, rank - 1)
    p = dr.int(2, 3)
    parts = _parts(dr, p)
    shape = [dr.int(1, 3) for _ in range(rank)]
    shape[d] = sum(parts)
    leaf, lay, dd, _ = _chain(dr, shape, d, parts, p, dr.coin(0.35))
    sizes, groups, neg = parts, p, False
    if dr.coin(0.2):
        sizes, groups, neg = dr.pick([(list(reversed(parts)), p, False), (parts, 1, False), (parts, p, True)])
    X = Exprs()
    try:
        w = X.leaf("w", tuple(leaf), "float")
        a = lay(X, w)
        core = lay(X, w, lay=False)
        b = cg.build_expr(X, X.mk("neg", {}, [core]) if neg else core, {"dim": dd, "sizes": sizes, "groups": groups})
    except (ExprError, ValueError) as exc:
        return Result("skip", detail=str(exc)), ""
    return _check_pair(X, a, b, seed), f"{X.show(a, 6)} vs {X.show(b, 6)}"


#: rule id -> generator for single-op rules (merged into ``gens.SINGLE_OP``)
CONCAT_GROUPS_GENERATORS = {cg.SPLIT_RULE: gen_split_grouped, cg.CONCAT_RULE: gen_concat_grouped}
#: equality step -> generator (merged into ``eqgen.EQUALITY``)
CONCAT_GROUPS_EQ_GENERATORS = {cg.EQ_RULE: gen_concat_groups_eq}
