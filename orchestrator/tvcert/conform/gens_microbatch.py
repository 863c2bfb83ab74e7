"""Conformance generator for micro-batches of a data-parallel shard (kernel/microbatch.py,
``slice_shard_microbatch``): a rank's Shard(d) block split into k equal parts (a pipeline schedule's
``tensor_split``), or one part sliced out.

The input is a plain leaf or the leaf through an op real code applies before the split (a pointwise op, a permute
moving the sharded dim, an interleave that the fused-part rule reads instead); on the other mesh axes Replicate, a
Shard of another dim, or a near miss: the dim sharded again, a Partial, a zig-zag shard.  The split's parts are
equal or a near miss (unequal, another count), the slice one part or off by one / across two parts.  The kernel must
refuse them or conclude a fact that holds on every rank (:func:`.core.run_case` on the laid-out input).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..kernel import interleave as il
from ..kernel import microbatch as mb
from .core import OpCase, P, R, S, TIn, Z

if TYPE_CHECKING:
    from .gens import Draw

__all__ = ["MICROBATCH_GENERATORS", "gen_slice_shard_microbatch"]


def gen_slice_shard_microbatch(dr: Draw) -> OpCase:
    from .gens import fit

    axes, sizes = dr.mesh()
    fi = dr.int(0, len(axes) - 1)
    p = sizes[axes[fi]]
    rank = dr.int(1, 3)
    d = dr.int(0, rank - 1)
    near = dr.coin(0.3)
    others = [j for j in range(rank) if j != d]
    pl = []
    for j in range(len(axes)):
        if j == fi:
            pl.append(S(d))
        elif near and dr.coin(0.4):
            pl.append(dr.pick([S(d), P("sum"), P("avg"), Z(d)]))
        elif others and dr.coin(0.4):
            pl.append(S(dr.pick(others)))
        else:
            pl.append(R)
    pl = tuple(pl)
    shape = fit(dr, rank, axes, sizes, [tuple(q if q.kind != "Z" else R for q in pl)])
    k, n = dr.int(2, 4), dr.int(1, 3)
    again = 1
    for j, q in enumerate(pl):
        if j != fi and q.kind in ("S", "Z") and q.dim == d:
            again *= sizes[axes[j]] * (2 if q.kind == "Z" else 1)
    shape[d] = k * p * n * again
    kind = dr.pick(["plain", "plain", "pointwise", "permute", "interleave"])
    leaf = list(shape)
    if kind == "permute" and rank >= 2:
        perm = [int(x) for x in dr.rng.permutation(rank)]
        src = [0] * rank
        for j, q in enumerate(perm):
            src[q] = shape[j]
        leaf = src

        def lay(X, y):
            return X.mk("permute", {"dims": tuple(perm)}, [y])
    elif kind == "pointwise":
        op = dr.pick(["exp", "neg", "tanh"])

        def lay(X, y):
            return X.mk(op, {}, [y])
    elif kind == "interleave" and (shape[d] // (k * p)) >= 1 and shape[d] % (k * p) == 0:
        ik, ip = (k, p) if not (near and dr.coin(0.5)) else (p, k)

        def lay(X, y):  # a fused tensor: split_interleaved_shard reads it (or, (k, p) swapped, this rule)
            return il.build(X, y, d, ik, ip)
    else:
        lay = None
    local = shape[d] // (p * again)
    kk = k if not (near and dr.coin(0.3)) else dr.pick([x for x in (1, 2, 3, 5) if x != k])
    if local % kk:
        kk = k
    m = local // kk
    dim = d - rank if dr.coin(0.3) else d
    tin = TIn(tuple(leaf), pl, layout=lay) if lay is not None else TIn(tuple(shape), pl)
    note = f"{kind} k={kk} p={p}" + (" near" if near else "")
    if dr.coin(0.5):
        i = dr.int(0, kk - 1)
        st, en = i * m, (i + 1) * m
        if near and dr.coin(0.4):
            st, en = dr.pick([(st, min(en + 1, local)), (st + max(m // 2, 1), min(en + max(m // 2, 1), local)),
                              (max(st - 1, 0), max(en - 1, 1))])
        if en <= st:
            en = st + 1
        return OpCase("slice", {"dim": dim, "start": st, "end": en, "step": 1}, [tin], axes, sizes,
                      note=f"part {i} of " + note)
    parts = [m] * kk
    if near and dr.coin(0.3) and kk >= 2 and m > 1:
        parts[0] -= 1
        parts[1] += 1
    return OpCase("split", {"dim": dim, "sizes": parts}, [tin], axes, sizes, note=note)


#: rule id -> generator (merged into ``gens.SINGLE_OP``)
MICROBATCH_GENERATORS = {mb.RULE: gen_slice_shard_microbatch}
