"""Megatron's batch x heads merge as an interleaved shard (kernel/interleave.py's ``interleave``).

Megatron's core attention views ``[sq, b, np, hn] -> [sq, b*np, hn]`` with the heads split over tp
(dot_product_attention.py:184): rank r's merged dim holds, for each of the b samples, its block of heads, so it is
block r of ``interleave(reshape(E, [sq, b*np, hn]), 1, k=b, p=tp)``, not of the plain reshape.  Two rules:

* ``merge_interleaved_shard``: a local reshape merging dims (d-1, d) -- d sharded on one axis, d-1 of logical size
  k > 1 unsharded -- is Shard(d-1) of the interleave of the logical merge (``Interleave.concat_interleaved_shard``:
  the k rows of dim d-1 are the parts, the row-major merge reads part i at ``i*(p*n) + u``);
* ``split_interleaved_reshape``: a local reshape splitting Shard(d) of local size k*n into (k, n), where the input
  is ``interleave(Y, d, k, p)`` by ``interleave_commutes`` (:func:`.interleave.pull`: through the batched matmuls,
  permutes, scales), is Shard(d+1) of ``reshape(Y)`` splitting d into (k, p*n) (``Interleave.split_interleaved_shard``:
  part i of rank r's block is block r of part i).

Side conditions, checked at every use: exactly one mesh axis shards anything (the one axis on dim d), every other
axis Replicate; the local reshape changes only dims d-1, d (merge) or d (split), with the sizes above; for the
split, the pulled interleave has the same k and the axis's size as p.  Otherwise None (reshape_shard_block's path).
"""
from __future__ import annotations

from .interleave import build, pull, pulled_cites

MERGE_RULE = "merge_interleaved_shard"
SPLIT_RULE = "split_interleaved_reshape"
STATEMENTS = {
    MERGE_RULE: "merging an unsharded dim of size k with the next, Shard(d) dim on the ranks is Shard of the interleave "
                "(k parts, p ranks) of the logical merge",
    SPLIT_RULE: "splitting the rank's block of interleave(Y, d, k, p) into (k, n) is Shard(d+1) of Y's dim d split into "
                "(k, p*n)",
}


def _has_interleave(X, e: int) -> bool:
    """Whether an interleave occurs below ``e`` (memoized on the table, each entry tied to its node object since a
    rollback reuses ids: pull is only worth trying then)."""
    from .interleave import match

    memo = X.__dict__.setdefault("_has_interleave", {})

    def known(i):
        got = memo.get(i)
        return got is not None and got[0] is X[i]
    stack = [e]
    while stack:
        i = stack[-1]
        if known(i):
            stack.pop()
            continue
        todo = [a for a in X[i].args if not known(a)]
        if todo:
            stack.extend(todo)
            continue
        stack.pop()
        memo[i] = (X[i], match(X, i) is not None or any(memo[a][1] for a in X[i].args))
    return memo[e][1]


def _one_axis(pl) -> int | None:
    sh = [j for j, q in enumerate(pl) if q.kind != "R"]
    return sh[0] if len(sh) == 1 and pl[sh[0]].kind == "S" else None


def _logical_merges(kc, e: int, s: list, d: int) -> bool:
    """One head per rank (local dim d of size 1): reshape_shard_block also reads the merge (heads x hn), so the
    logical program decides, as for every choice between true readings: the shapes it reshapes this expression (or
    one with its head op) into (KCtx.reshaped_into), else those it reshapes any tensor of this shape into
    (KCtx.hints).  A choice of completeness only: both conclusions are proved facts."""
    merged = tuple(s[:d - 1] + [s[d - 1] * s[d]] + s[d + 1:])
    into = kc.reshaped_into(e)
    return merged in into if into else (tuple(s), merged) in kc.hints


def derive_reshape(kc, f, shape, local_in, local_out):
    """The Derivation of a merge / split across an interleaved shard, or None when neither applies."""
    from .rules import Derivation, Fact, Placement

    ai = _one_axis(f.pl)
    if ai is None or local_in is None:
        return None
    d, p, X = f.pl[ai].dim, kc.sizes[kc.axes[ai]], kc.exprs
    li, lo, s = list(local_in), list(local_out), list(shape)
    rules = ["replicate_any"] * len(kc.axes)
    if (d >= 1 and len(lo) == len(li) - 1 and lo[:d - 1] == li[:d - 1] and lo[d - 1] == li[d - 1] * li[d]
            and lo[d:] == li[d + 1:] and s[d - 1] > 1 and (li[d] > 1 or _logical_merges(kc, f.expr, s, d))):
        k = s[d - 1]
        merged = X.mk("reshape", {"shape": tuple(s[:d - 1] + [k * s[d]] + s[d + 1:])}, [f.expr])
        rules[ai] = MERGE_RULE
        pl = tuple(Placement("S", d - 1) if j == ai else q for j, q in enumerate(f.pl))
        return Derivation([Fact(build(X, merged, d - 1, k, p), pl)], rules)
    if (len(lo) == len(li) + 1 and lo[:d] == li[:d] and lo[d + 2:] == li[d + 1:] and lo[d] * lo[d + 1] == li[d]
            and lo[d] > 1):
        got = pull(X, f.expr, d, p) if _has_interleave(X, f.expr) else None
        if got is None or got[1] != lo[d] or s[d] != lo[d] * p * lo[d + 1]:
            return None
        y, k = got
        out = X.mk("reshape", {"shape": tuple(s[:d] + [k, p * lo[d + 1]] + s[d + 1:])}, [y])
        rules[ai] = SPLIT_RULE
        pl = tuple(Placement("S", d + 1) if j == ai else q for j, q in enumerate(f.pl))
        return Derivation([Fact(out, pl)], rules + pulled_cites(X, f.expr, d, p))
    return None
