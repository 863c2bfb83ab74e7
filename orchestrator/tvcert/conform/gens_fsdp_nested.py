"""Conformance generator for FSDP2's reduce-scatter inside TP's shards (``reduce_scatter_avg_nested``).

``reduce_scatter(avg)`` of a Partial(sum) tensor over a random inner axis along a random dim that one or two
outer axes already shard (FSDP2's ``_StridedShard`` of a TP-sharded parameter's gradient); the remaining axes
hold Replicate, a Shard of another dim or a Partial(sum) (HSDP's replicate axis).  Near misses the kernel must
refuse: an inner axis shards the same dim, an outer ZigzagShard of it, a Partial(avg|max) elsewhere, a dim that
does not split evenly into p blocks inside each outer block.  The runner checks every conclusion on every rank.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .core import OpCase, P, R, S, TIn, Z

if TYPE_CHECKING:  # gens imports this module at its end to register the generator below
    from .gens import Draw

__all__ = ["FSDP_NESTED_GENERATORS", "gen_reduce_scatter_avg_nested"]


def gen_reduce_scatter_avg_nested(dr: "Draw") -> OpCase:
    from .gens import _shard_factor, fill, fit, neg_dim

    axes, sizes = dr.mesh(min_axes=2)
    fi = dr.int(1, len(axes) - 1)  # an axis with at least one axis outside it
    a = axes[fi]
    rank = dr.int(1, 3)
    d = dr.int(0, rank - 1)
    on = P("sum") if dr.coin(0.9) else dr.pick([P("avg"), R])
    pl = list(fill(dr, axes, fi, on, rank, allow_p=dr.coin(0.4), p_kinds=("sum", "sum", "sum", "avg", "max")))
    outer = [j for j in range(fi)]
    for j in dr.rng.permutation(outer)[:dr.int(1, len(outer))]:
        pl[int(j)] = S(d)
    if dr.coin(0.05):
        pl[int(dr.pick(outer))] = Z(d)  # near miss: a zigzag block order outside
    inner = [j for j in range(fi + 1, len(axes))]
    if inner and dr.coin(0.12):  # near miss: an inner axis shards the scattered dim
        pl[int(dr.pick(inner))] = S(d)
    pl = tuple(pl)
    shape = fit(dr, rank, axes, sizes, [pl])
    f = _shard_factor(axes, sizes, pl, d, ("S", "Z"))
    if (shape[d] // max(f, 1)) % sizes[a]:
        shape[d] *= sizes[a]
    if dr.coin(0.06) and sizes[a] > 1:  # near miss: p does not divide the outer blocks
        shape[d] = f * sizes[a] + max(f, 1)
    return OpCase("reduce_scatter", {"axis": a, "dim": neg_dim(dr, d, rank), "reduce": "avg"},
                  [TIn(tuple(shape), pl)], axes, sizes)


FSDP_NESTED_GENERATORS = {"reduce_scatter_avg_nested": gen_reduce_scatter_avg_nested}
