"""Rank-reversed blocks: rank r works on block p-1-r of a replicated tensor (a ring walked backwards, "last rank
first" splits).

The rank's slice ``x[(p-1-r)*n : (p-r)*n]`` of Replicate E is the plain Shard(d) of the *block-reversed* tensor
``reverse_blocks(E, d, p)``: dim d (size p*n) read as (p, n), the p factor flipped, read back -- spelled as the
layout chain ``reshape [.., p, n, ..] -> flip(d) -> reshape`` (``Rules/ReversedBlocks.v``:
``rev_blocks E (r*n + t) = E ((p-1-r)*n + t)``).  Two certified pieces read it:

* ``slice_reversed_block_to_shard`` (a rule of :func:`.rules._slice_block`): start ``(p-1-r)*n``, end
  ``(p-r)*n`` over one mesh axis, affine in its rank exactly so, of a replicated tensor; no other axis shards
  dim d, none holds a Partial or a zig-zag shard.  Conclusion: Shard(d) of ``reverse_blocks(E, d, p)``.
* ``reversed_blocks_commute`` (an equality step, :func:`reversed_equal`): a block reversal is a reindexing of
  one dim, so it commutes with every op that reads the dim index by index (:func:`.interleave.pull` with the
  reversal as its base case: a matmul's row or column, pointwise ops, permutes, reshapes keeping the dim whole);
  a side that pulls to ``reverse_blocks(Y)`` is rewritten so, and then compared by ``layout_map_equal``
  (gathering the stack and flipping it over the ranks composes with the reversal to the identity map, computed
  at every index); and a contraction whose dim is reversed the same way in both operands is the contraction of
  the unreversed operands (a sum is invariant under a bijection of its index).

Anything else is a RuleFailure (UNKNOWN) or "not proved".
"""
from __future__ import annotations

import weakref
from math import prod

import numpy as np

from .expr import ExprError, Exprs
from .interleave import pull
from .layout_map import LAYOUT, index_map, layout_map_equal

SLICE_RULE = "slice_reversed_block_to_shard"
EQ_RULE = "reversed_blocks_commute"
STATEMENTS = {
    SLICE_RULE: "rank r slicing block p-1-r of a replicated tensor, [(p-1-r)*n, (p-r)*n) of a size-p*n dim, is "
                "Shard(d) of the block-reversed tensor (reshape to (p, n), flip the p factor, reshape back)",
    EQ_RULE: "a block reversal of one dim commutes with ops reading that dim index by index (matmul row / column, "
             "permute, a reshape keeping it whole, pointwise ops), and a contraction over a dim reversed in both "
             "operands is the contraction of the unreversed operands",
}
KEY = "reversed"


def build(X: Exprs, e: int, d: int, p: int) -> int:
    """``reverse_blocks(e, d, p)`` spelled as a layout chain (reshape, flip, reshape)."""
    s = list(X[e].shape)
    if p < 1 or not 0 <= d < len(s) or s[d] % p:
        raise ExprError(f"reverse_blocks: dim {d} of shape {s} does not split into {p} blocks")
    s1 = s[:d] + [p, s[d] // p] + s[d + 1:]
    a = X.mk("reshape", {"shape": tuple(s1)}, [e])
    f = X.mk("flip", {"dims": (d,)}, [a])
    return X.mk("reshape", {"shape": tuple(s)}, [f])


def match(X: Exprs, e: int) -> tuple[int, int, int] | None:
    """``e`` read as ``reverse_blocks(E, d, p)`` (exactly :func:`build`'s spelling): (E, d, p), or None."""
    x = X[e]
    if x.op != "reshape" or len(x.args) != 1:
        return None
    f = X[x.args[0]]
    if f.op != "flip" or len(f.args) != 1:
        return None
    dims = list(f.attr_dict().get("dims", ()))
    a = X[f.args[0]]
    if len(dims) != 1 or a.op != "reshape" or len(a.args) != 1:
        return None
    d = dims[0]
    core = a.args[0]
    s, s1 = list(x.shape), list(a.shape)
    if X[core].shape != x.shape or len(s1) != len(s) + 1 or not 0 <= d < len(s):
        return None
    p, n = s1[d], s1[d + 1]
    if s1[:d] != s[:d] or s1[d + 2:] != s[d + 1:] or p * n != s[d]:
        return None
    return core, d, p


def _find(X: Exprs, e: int, d: int, p: int):
    m = match(X, e)
    return (m[0], KEY) if m is not None and m[1] == d and m[2] == p else None


_COUNTS: "weakref.WeakKeyDictionary[Exprs, dict[int, frozenset]]" = weakref.WeakKeyDictionary()


def _block_counts(X: Exprs, e: int) -> list[int]:
    """The block counts p of the reversals spelled inside ``e`` (where a pull could end), sorted.  Memoized per
    expression table (expressions are interned and never change), so the step costs little on plans without any."""
    memo = _COUNTS.setdefault(X, {})
    stack = [e]
    while stack:  # iterative post-order: expressions can be deep
        i = stack[-1]
        if i in memo:
            stack.pop()
            continue
        todo = [a for a in X[i].args if a not in memo]
        if todo:
            stack.extend(todo)
            continue
        stack.pop()
        m = match(X, i)
        got = frozenset().union(*(memo[a] for a in X[i].args)) if X[i].args else frozenset()
        memo[i] = got | {m[2]} if m is not None else got
    return sorted(memo[e])


def unreversed(X: Exprs, e: int) -> int | None:
    """``e`` rewritten as a layout chain over ``reverse_blocks(Y, d, p)`` when its base (below its own layout
    chain) pulls to that reversal by commuting steps, else None."""
    chain, base = [], e
    while X[base].op in LAYOUT and len(X[base].args) == 1:
        chain.append(base)
        base = X[base].args[0]
    ps = _block_counts(X, base)
    if not ps or match(X, base) is not None:
        return None
    for p in ps:
        for d in range(len(X[base].shape)):
            got = pull(X, base, d, p, find=_find)
            if got is None or got[1] != KEY:
                continue
            try:
                out = build(X, got[0], d, p)
                for c in reversed(chain):
                    out = X.mk(X[c].op, X[c].attr_dict(), [out])
            except ExprError:
                continue
            return out
    return None


def uncontracted(X: Exprs, e: int) -> int | None:
    """A matmul whose contraction dim is the same block reversal in both operands, as the matmul of the
    unreversed operands, else None."""
    x = X[e]
    if x.op != "matmul" or len(x.args) != 2:
        return None
    a, b = x.args
    ra, rb = len(X[a].shape), len(X[b].shape)
    if ra < 2 or rb < 2:
        return None
    for p in sorted(set(_block_counts(X, a)) & set(_block_counts(X, b))):
        ga, gb = pull(X, a, ra - 1, p, find=_find), pull(X, b, rb - 2, p, find=_find)
        if ga is None or gb is None or ga[1] != KEY or gb[1] != KEY:
            continue
        try:
            return X.mk("matmul", x.attr_dict(), [ga[0], gb[0]])
        except ExprError:
            continue
    return None


_FLIPS: "weakref.WeakKeyDictionary[Exprs, tuple[int, bool]]" = weakref.WeakKeyDictionary()


def _table_has_flip(X: Exprs) -> bool:
    """Whether any expression of the table is a flip (every reversal is spelled with one, :func:`build`), scanning
    only what was interned since the last call: most plans have none, and walking both sides' cones for block
    counts on every equality (:func:`_block_counts`) doubled a 3-layer llama's verify time."""
    n0, found = _FLIPS.get(X, (0, False))
    if len(X) < n0:  # rolled back: scan again
        n0, found = 0, False
    if not found:
        found = any(X[i].op == "flip" for i in range(n0, len(X)))
    _FLIPS[X] = (len(X), found)
    return found


def reversed_equal(X: Exprs, a: int, b: int, equal, cache: dict | None = None) -> bool:
    """``reversed_blocks_commute`` as an equality step: one side rewritten (:func:`unreversed`, then compared by
    its index map; or :func:`uncontracted`) and compared with the other."""
    if not _table_has_flip(X):
        return False
    for s, o in ((a, b), (b, a)):
        u = unreversed(X, s)
        if u is not None and layout_map_equal(X, o, u, equal, cache):
            return True
        c = uncontracted(X, s)
        if c is not None and c != s and equal(o, c):
            return True
    return False


def derive_slice(kc, f, dim: int, ai: int, outer: int, failure):
    """``slice_reversed_block_to_shard``: the rank-affine bounds were checked by the caller (start (p-1-r)*n, end
    (p-r)*n over axis ``ai``, step 1, n = size / p); here the placements: Replicate on that axis, no axis sharding
    ``dim`` (``outer`` is the outer axes' shard factor of it), no Partial, no zig-zag shard."""
    from ..plan import Placement
    from .rules import Derivation, Fact

    a = kc.axes[ai]
    if f.pl[ai].kind != "R":
        raise failure(f"{SLICE_RULE} needs a replicated input on axis {a!r}, got {f.pl[ai]}")
    if outer != 1 or any(q.kind in ("S", "Z") and q.dim == dim for q in f.pl):
        raise failure(f"{SLICE_RULE} over {a!r}: dim {dim} is also sharded on another axis")
    rules = []
    for j, q in enumerate(f.pl):
        if q.kind in ("P", "Z"):
            raise failure(f"{SLICE_RULE}: axis {kc.axes[j]!r} holds {q}; only Replicate or Shard of other dims")
        rules.append("replicate_any" if q.kind == "R" else "slice_other_dim")
    rules[ai] = SLICE_RULE
    pl = list(f.pl)
    pl[ai] = Placement("S", dim)
    return Derivation([Fact(build(kc.exprs, f.expr, dim, kc.sizes[a]), tuple(pl))], rules)



def _reversed_along(X: Exprs, e: int, d: int, p: int) -> int | None:
    """Y with ``e`` = reverse_blocks(Y, d, p) (spelled, or pulled through row-wise ops), else None."""
    m = match(X, e)
    if m is not None:
        return m[0] if m[1:] == (d, p) else None
    got = pull(X, e, d, p, find=_find)
    return got[0] if got is not None and got[1] == KEY and got[0] != e else None


def _rb_map(shape: list[int], d: int, p: int) -> np.ndarray:
    """The flat index of ``shape`` that reverse_blocks(., d, p) reads at each position, flat."""
    s1 = shape[:d] + [p, shape[d] // p] + shape[d + 1:]
    return np.flip(np.arange(prod(shape)).reshape(s1), d).ravel()


def explained(X: Exprs, e: int, pl, axes, sizes, grounded) -> bool:
    """For the localizer: a fact ``e`` under ``pl`` is a rank's permuted block of a value ``grounded`` accepts --
    Shard(d) over an axis of size p of reverse_blocks(Y, d, p) -- or, on any placement, a layout chain over Y
    (spelled, or once the reversal is pulled out) that reads Y in order (the stack flipped back over the ranks),
    or in the ranks' order (dim d of reverse_blocks(Y, d, p) split into (p, n): what all_gather of that shard
    stacks, and its gradient).  A whole reversed value read as Replicate is not explained (its rows are out of
    order)."""
    for q, a in zip(pl, axes):
        if q.kind == "S":
            y = _reversed_along(X, e, q.dim, sizes[a])
            if y is not None and grounded(y):
                return True
    t = list(X[e].shape)
    u = unreversed(X, e)
    for c in ([e] if u is None else [e, u]):
        got = index_map(X, c)
        if got is None or got[1] is None or got[1].size != prod(X[got[0]].shape):
            continue
        base, idx = got[0], got[1].ravel()
        s = list(X[base].shape)
        ok = np.array_equal(idx, np.arange(idx.size))
        for d in range(len(s)):
            if not ok and len(t) == len(s) + 1 and t[:d] == s[:d] and t[d + 2:] == s[d + 1:] \
                    and t[d] * t[d + 1] == s[d] and t[d] > 1:
                ok = np.array_equal(idx, _rb_map(s, d, t[d]))
        if ok and grounded(base):
            return True
    return False
