"""allgather_other_dim: all_gather along dim g of Shard(d), g != d, is a layout transform of the logical tensor.

Rank r holds block r of dim d; gathering along g stacks the blocks along g, so the result is, on every rank,
E with dim d split into (p, d/p), the p factor moved next to g and merged into it: G[.., r*n + j (g), .., i (d)]
= E[.., r*b + i (d), .., j (g)] (``LayoutReal.allgather_other_dim``).  Real code meets it when per-rank pieces
are stacked (``x.unsqueeze(0)`` then gathered along 0: ``E.view(p, b)``) or gathered along the wrong dim.
Side conditions, checked at every use: the gathered axis holds Shard(d); no other axis shards d or g (the
blocks are then plain blocks of the logical dims) and no axis holds a Partial or a zig-zag shard.
"""
from __future__ import annotations

RULE = "allgather_other_dim"
STATEMENT = ("all_gather along g of Shard(d), g != d, is Replicate of E with d split into (p, d/p) and the p factor "
             "merged in front of g (blocks stacked along g)")


def gathered_layout(X, e: int, d: int, g: int, p: int) -> int:
    """The expression of E's blocks along d stacked along g (reshape, permute, reshape; a permute that keeps the
    order of the non-unit dims is a reshape, row-major)."""
    s = list(X[e].shape)
    s1 = s[:d] + [p, s[d] // p] + s[d + 1:]
    g1 = g if g < d else g + 1
    order = [k for k in range(len(s1)) if k != d]
    order.insert(order.index(g1), d)
    s2 = [s1[k] for k in order]
    q = order.index(d)
    final = tuple(s2[:q] + [s2[q] * s2[q + 1]] + s2[q + 2:])
    moved = [k for k in order if s1[k] != 1]
    if moved == sorted(moved):
        return X.mk("reshape", {"shape": final}, [e])
    split = X.mk("reshape", {"shape": tuple(s1)}, [e])
    perm = X.mk("permute", {"dims": tuple(order)}, [split])
    return X.mk("reshape", {"shape": final}, [perm])


def derive_allgather_other_dim(kc, f, i: int, g: int, failure):
    """(expression, placements) for all_gather along g over axis index i of fact f, or failure raised."""
    from ..plan import Placement

    d = f.pl[i].dim
    a = kc.axes[i]
    for j, q in enumerate(f.pl):
        if j == i:
            continue
        if q.kind in ("P", "Z"):
            raise failure(f"{RULE} over {a!r}: axis {kc.axes[j]!r} holds {q}; only Replicate or Shard of other dims "
                          f"are covered")
        if q.kind == "S" and q.dim in (d, g):
            raise failure(f"{RULE} over {a!r}: axis {kc.axes[j]!r} also shards dim {q.dim}")
    expr = gathered_layout(kc.exprs, f.expr, d, g, kc.sizes[a])
    pl = list(f.pl)
    pl[i] = Placement("R")
    return expr, tuple(pl)
