"""Conformance generator for FSDP2's gradient reduce-scatter (``reduce_scatter_avg_partial_sum``).

``reduce_scatter(avg)`` of a Partial(sum) tensor over a random axis of a random mesh, along a random dim; the
other axes hold Replicate, a Shard of another dim, or a Partial (sum mostly; avg / max and a Shard of the same
dim are near misses the kernel must refuse), and now and then the focus axis holds Partial(avg) or Replicate
instead (other rules, or none).  The runner checks every conclusion on every rank.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .core import OpCase, P, R, S, TIn

if TYPE_CHECKING:  # gens imports this module at its end to register the generator below
    from .gens import Draw

__all__ = ["FSDP_GENERATORS", "gen_reduce_scatter_avg"]


def gen_reduce_scatter_avg(dr: "Draw") -> OpCase:
    from .gens import _shard_factor, fill, fit, focus_axis, neg_dim

    axes, sizes = dr.mesh(min_axes=1)
    fi = focus_axis(dr, axes)
    a = axes[fi]
    rank = dr.int(1, 3)
    d = dr.int(0, rank - 1)
    on = P("sum") if dr.coin(0.85) else dr.pick([P("avg"), R])
    pl = list(fill(dr, axes, fi, on, rank, allow_p=dr.coin(0.4), p_kinds=("sum", "sum", "avg", "max")))
    if dr.coin(0.1) and len(axes) > 1:  # a near miss: another axis shards the scattered dim
        j = dr.pick([j for j in range(len(axes)) if j != fi])
        pl[j] = S(d)
    pl = tuple(pl)
    shape = fit(dr, rank, axes, sizes, [pl])
    f = _shard_factor(axes, sizes, pl, d, ("S", "Z"))
    if (shape[d] // max(f, 1)) % sizes[a]:
        shape[d] *= sizes[a]
    return OpCase("reduce_scatter", {"axis": a, "dim": neg_dim(dr, d, rank), "reduce": "avg"},
                  [TIn(tuple(shape), pl)], axes, sizes)


FSDP_GENERATORS = {"reduce_scatter_avg_partial_sum": gen_reduce_scatter_avg}
