"""Conformance generator for reshapes that insert or remove size-1 dims beside a shard, with logical-shape hints.

A traced Megatron program writes ``_unsafe_view [S*b, 3H/tp] -> [S, b, 3H/tp]`` with local literals; at b = 1 the
local target ``[S, 1, 3H/tp]`` reads as logical ``[S, 1, 3H]`` (Shard on the last dim) or ``[S, tp, 3H/tp]``
(Shard on the size-1 dim), both true, and the kernel picks by the logical program's reshape shapes
(``KCtx.hints``).  This draws size-1 dims on both sides of the sharded dim, in the input and in the target, and
hints that are right, wrong (a size-1 dim scaled where the shard would interleave ranks), or absent: whatever
the hints say, every conclusion must hold on every rank.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .core import OpCase, P, R, S, TIn

if TYPE_CHECKING:  # gens imports this module at its end
    from .gens import Draw

__all__ = ["UNITDIM_GENERATORS", "gen_reshape_unit_dims"]


def _units(dr: Draw) -> list[int]:
    return [1] * dr.pick([0, 0, 1, 1, 2])


def gen_reshape_unit_dims(dr: Draw) -> OpCase:
    axes, sizes = dr.mesh(max_axes=2)
    fi = dr.int(0, len(axes) - 1)
    a = axes[fi]
    f = sizes[a]
    n = f * dr.pick([1, 1, 2, 3, 4])  # the sharded dim: local size n / f, often 1 (one head / one sample)
    pre = [dr.pick([1, 2, 3]) for _ in range(dr.int(0, 2))]
    post = [dr.pick([1, 2]) for _ in range(dr.int(0, 1))]
    left, right = _units(dr), _units(dr)
    shape = pre + left + [n] + right + post
    d = len(pre) + len(left)
    pl = tuple(S(d) if j == fi else dr.pick([R, R, P("sum")]) for j in range(len(axes)))
    # local target: the same dims with the size-1 dims beside the shard redrawn (inserted, removed, moved),
    # sometimes the sharded dim split into (unit, rest) or merged with a neighbour of size 1
    mid = [n // f]
    if dr.coin(0.3) and n // f > 1:
        k = dr.pick([x for x in range(1, n // f + 1) if (n // f) % x == 0])
        mid = [k, n // f // k]
    target = pre + _units(dr) + mid + _units(dr) + post
    if dr.coin(0.15) and post:
        target = target[:-len(post)] + [math.prod(post)]
    hints = []
    for _ in range(dr.int(0, 3)):  # each target dim scaled by the shard factor: the readings the kernel weighs
        h = list(target)
        h[dr.int(0, len(h) - 1)] *= f
        hints.append((tuple(shape), tuple(h)))
    return OpCase(dr.pick(["reshape", "view"]), {"shape": target}, [TIn(tuple(shape), pl)], axes, sizes,
                  note="size-1 dims beside a shard, hinted", hints=tuple(hints))


#: rule id -> generator, merged into ``gens.SINGLE_OP``
UNITDIM_GENERATORS = {"reshape_shard_block": gen_reshape_unit_dims}
