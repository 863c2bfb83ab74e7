"""An equality step: two chains of layout ops over equal tensors are equal when they read the same index at every
output index.

With one attention head per rank (Megatron-core at tp = number of heads, micro-batch 1) the reshape rule places a
rank's ``[1, 1, sq, hn]`` view as a shard of the logical ``[np, 1, sq, hn]`` or ``[1, np, sq, hn]``: both are true,
and the program's next permute and merge then spell the same logical tensor through different unit dims
(``reshape[4, 1, 4, 2] -> permute -> reshape[4, 4, 2] -> reshape[4, 8]`` against ``reshape[1, 4, 4, 2] -> permute
-> reshape[4, 1, 8] -> reshape[4, 8]``), or leave a reshape pair that is the identity.  A reshape, permute, expand,
slice or flip reads its operand through an index map; a chain of them reads its base through the composed map
(``Rules/LayoutMap.v``: ``layout_map_equal``).  The maps are computed exactly, at every index, by running the
chain's own ops (the interpreter's semantics, ``tvcert.ops``) on the array of the base's flat indices, and compared
elementwise; the bases must have the same shape and be proved equal.  Chains over more than ``MAX_ELEMS`` base
elements are not compared (not proved).
"""
from __future__ import annotations

from math import prod
from typing import Callable

import numpy as np

from ..ops import REGISTRY, Ctx, concrete_attrs
from .expr import Exprs

RULE = "layout_map_equal"
STATEMENT = ("two chains of reshape / permute / expand / slice / flip over equal tensors of one shape that read the "
             "same base index at every output index (computed at every index) are equal")
LAYOUT = frozenset({"reshape", "permute", "expand", "slice", "flip"})
MAX_ELEMS = 1 << 20


def index_map(X: Exprs, i: int, cache: dict | None = None) -> tuple[int, np.ndarray | None] | None:
    """(base, map): ``i`` reads ``base`` at flat index ``map[j]`` for every index j (map None: ``i`` is no layout
    chain); None when the base is too large to enumerate.  ``cache``: expression id -> answer (one table)."""
    if cache is not None:
        if i not in cache:
            cache[i] = index_map(X, i)
        return cache[i]
    ops = []
    j = i
    while X[j].op in LAYOUT and len(X[j].args) == 1:
        ops.append(j)
        j = X[j].args[0]
    if not ops:
        return i, None
    n = prod(X[j].shape)
    if n > MAX_ELEMS:
        return None
    idx = np.arange(n, dtype=np.int64).reshape(X[j].shape)
    ctx = Ctx()
    for k in reversed(ops):
        e = X[k]
        idx = np.asarray(REGISTRY[e.op].eval([idx], concrete_attrs(e.op, e.attr_dict()), ctx)[0])
        if idx.shape != e.shape or idx.dtype.kind not in "iu":
            return None
    return j, idx


def layout_map_equal(X: Exprs, a: int, b: int, equal: Callable[[int, int], bool], cache: dict | None = None) -> bool:
    ma, mb = index_map(X, a, cache), index_map(X, b, cache)
    if ma is None or mb is None or (ma[1] is None and mb[1] is None):
        return False
    (ba, ia), (bb, ib) = ma, mb
    if X[ba].shape != X[bb].shape or X[ba].dtype != X[bb].dtype or X[a].shape != X[b].shape:
        return False
    ident = np.arange(prod(X[ba].shape), dtype=np.int64).reshape(X[ba].shape)
    ia = ident if ia is None else ia
    ib = ident if ib is None else ib
    if ia.shape != ib.shape or not np.array_equal(ia, ib):
        return False
    return equal(ba, bb)
