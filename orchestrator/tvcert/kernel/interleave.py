"""Block-interleaved shards: a fused weight (``w_qkv``, gate/up merged) whose rank holds its block of each part.

A fused projection ``[Wq; Wk; Wv]`` sharded so that rank r holds ``[Wq_r; Wk_r; Wv_r]`` is the plain Shard(d) of
the *interleaved* tensor ``interleave(E, d, k, p)``: dim d (size k*p*n) split into (k, p, n), the k and p factors
swapped, merged back -- the binding layout ``reshape [.., k, p, n, ..] -> transpose(d, d+1) -> reshape`` a trace
spec writes (``Rules/Interleave.v``: ``interleave(E)[r*k*n + i*n + t] = E[i*p*n + r*n + t]``).  Three rules read it:

* ``split_interleaved_shard``: splitting the rank's local dim d into k equal chunks (or slicing one of them out)
  gives chunk i = block r of chunk i of E, i.e. Shard(d) of ``split(E)[i]``;
* ``concat_interleaved_shard``: concatenating k equal Shard(d) operands along d (the backward of that split)
  is Shard(d) of ``interleave(concat(E_1..E_k), d, k, p)``; a zero pad of one part to the k parts (the backward
  of a slice) likewise, the other parts zero;
* ``interleave_commutes`` (an equality step and the first premise of both): a reindexing of one dim commutes
  with every op that reads that dim index by index -- a matmul's row (lhs) or column (rhs) dim, a permute (the
  dim moves), a reshape that keeps the dim whole with equal element counts before it, a pointwise op of
  same-shaped operands -- so ``f(interleave(W))`` is ``interleave(f(W))`` (:func:`pull`).

Side conditions, checked at every use: exactly one mesh axis shards dim d and its size is the p of the
interleave; every other axis is Replicate or shards another dim (no Partial, no zig-zag); the split's sizes are k
equal chunks, the concat's operands k facts of equal shapes.  Anything else is a RuleFailure (UNKNOWN).
"""
from __future__ import annotations

from math import prod
from typing import NamedTuple

from .expr import ExprError, Exprs

SPLIT_RULE = "split_interleaved_shard"
CONCAT_RULE = "concat_interleaved_shard"
EQ_RULE = "interleave_commutes"
STATEMENTS = {
    SPLIT_RULE: "chunk i of rank r's block of interleave(E, d, k, p) is block r of chunk i of E: splitting a "
                "Shard(d) of an interleaved tensor (read as one by interleave_commutes) into k equal chunks gives "
                "Shard(d) of E's chunks",
    CONCAT_RULE: "k equal Shard(d) operands concatenated along d are Shard(d) of the interleave of their logical "
                 "concatenation",
    EQ_RULE: "a reindexing of one dim commutes with ops reading it index by index (matmul row / column, permute, "
             "a reshape keeping it whole, pointwise ops): f(interleave(W)) = interleave(f(W))",
}
MAX_DEPTH = 16


class Inter(NamedTuple):
    core: int  # E
    dim: int  # d
    k: int  # parts (q, k, v: 3)
    p: int  # ranks
    n: int  # rows per part per rank


def build(X: Exprs, e: int, d: int, k: int, p: int) -> int:
    """``interleave(e, d, k, p)`` spelled as the trace spec's binding layout (reshape, permute, reshape)."""
    s = list(X[e].shape)
    if k < 1 or p < 1 or s[d] % (k * p):
        raise ExprError(f"interleave: dim {d} of size {s[d]} is not k*p*n for k={k}, p={p}")
    s1 = s[:d] + [k, p, s[d] // (k * p)] + s[d + 1:]
    perm = list(range(len(s1)))
    perm[d], perm[d + 1] = d + 1, d
    a = X.mk("reshape", {"shape": tuple(s1)}, [e])
    b = X.mk("permute", {"dims": tuple(perm)}, [a])
    return X.mk("reshape", {"shape": tuple(s)}, [b])


def match(X: Exprs, e: int) -> Inter | None:
    """``e`` read as ``interleave(E, d, k, p)`` (exactly :func:`build`'s spelling), or None."""
    x = X[e]
    if x.op != "reshape":
        return None
    b = X[x.args[0]]
    if b.op != "permute":
        return None
    a = X[b.args[0]]
    if a.op != "reshape":
        return None
    core = a.args[0]
    s, s1, perm = list(x.shape), list(a.shape), list(b.attr_dict()["dims"])
    if X[core].shape != x.shape or len(s1) != len(s) + 2:
        return None
    moved = [j for j in range(len(perm)) if perm[j] != j]
    if len(moved) != 2 or moved[1] != moved[0] + 1 or perm[moved[0]] != moved[1]:
        return None
    d = moved[0]
    if d + 3 > len(s1):  # the last two dims swapped: no (k, p, n) triple (crashed on such a chain before)
        return None
    k, p, n = s1[d:d + 3]
    if s1[:d] != s[:d] or s1[d + 3:] != s[d + 1:] or k * p * n != s[d]:
        return None
    return Inter(core, d, k, p, n)


def _find(X: Exprs, e: int, d: int, p: int):
    m = match(X, e)
    return (m.core, m.k) if m is not None and m.dim == d and m.p == p else None


def pull(X: Exprs, e: int, d: int, p: int, depth: int = MAX_DEPTH, find=None) -> tuple[int, int] | None:
    """(E, k) with ``e`` = interleave(E, d, k, p) by ``interleave_commutes`` steps, or None.  Deterministic,
    bounded by ``depth``; expressions made on a failed path are harmless (interned, unused).  ``find``: another
    reindexing of dim d as the base case (kernel/concat_groups.py), its key in place of k."""
    if depth <= 0:
        return None
    find = find or _find
    got = find(X, e, d, p)
    if got is not None:
        return got
    x = X[e]
    try:
        if x.op == "permute":
            perm = tuple(x.attr_dict()["dims"])
            got = pull(X, x.args[0], perm[d], p, depth - 1, find)
            return None if got is None else (X.mk("permute", {"dims": perm}, [got[0]]), got[1])
        if x.op == "matmul":
            a, b = x.args
            ra, rb, ro = len(X[a].shape), len(X[b].shape), len(x.shape)
            if ra < 2 or rb < 2:
                return None
            if d == ro - 1:  # a column of the product reads the same column of the rhs
                got = pull(X, b, rb - 1, p, depth - 1, find)
                return None if got is None else (X.mk("matmul", {}, [a, got[0]]), got[1])
            if d == ro - 2:  # a row reads the same row of the lhs
                got = pull(X, a, ra - 2, p, depth - 1, find)
                return None if got is None else (X.mk("matmul", {}, [got[0], b]), got[1])
            if ra == rb == ro and X[a].shape[d] == X[b].shape[d]:  # a batch dim: product j reads element j of
                ga, gb = pull(X, a, d, p, depth - 1, find), pull(X, b, d, p, depth - 1, find)  # both (the pointwise clause)
                if ga is not None and gb is not None and ga[1] == gb[1]:
                    return X.mk("matmul", {}, [ga[0], gb[0]]), ga[1]
            return None
        if x.op == "reshape":
            si, so = X[x.args[0]].shape, x.shape
            for di in range(len(si)):  # the input dim that is output dim d, kept whole
                if si[di] == so[d] and prod(si[:di]) == prod(so[:d]):
                    got = pull(X, x.args[0], di, p, depth - 1, find)
                    if got is not None:
                        return X.mk("reshape", {"shape": tuple(so)}, [got[0]]), got[1]
            return None
        from .smt import is_region_op

        if is_region_op(X, e) and x.args and all(X[a].shape in (x.shape, ()) for a in x.args) \
                and any(X[a].shape == x.shape for a in x.args):
            cores, ks = [], set()
            for a in x.args:
                if X[a].shape == ():
                    cores.append(a)
                    continue
                got = pull(X, a, d, p, depth - 1, find)
                if got is None:
                    return None
                cores.append(got[0])
                ks.add(got[1])
            if len(ks) != 1:
                return None
            return X.mk(x.op, x.attr_dict(), cores), ks.pop()
    except ExprError:
        return None
    return None


def interleaved_equal(X: Exprs, a: int, b: int, equal) -> bool:
    """``interleave_commutes`` as an equality step: ``b`` is interleave(G, d, k, p) and ``a`` pulls to
    interleave(Y, d, k, p) with ``equal(Y, G)`` (the interleave is a bijection of dim d)."""
    m = match(X, b)
    if m is None:
        return False
    got = pull(X, a, m.dim, m.p)
    return got is not None and got[1] == m.k and got[0] != a and equal(got[0], m.core)


def _axis(kc, f, dim: int, failure, rule: str) -> int:
    """The one axis sharding ``dim``; every other axis Replicate or sharding another dim."""
    sh = [i for i, q in enumerate(f.pl) if q.kind in ("S", "Z") and q.dim == dim]
    if len(sh) != 1 or f.pl[sh[0]].kind != "S":
        raise failure(f"{rule}: dim {dim} must be sharded (Shard, not zig-zag) on exactly one axis")
    for j, q in enumerate(f.pl):
        if j != sh[0] and q.kind not in ("R", "S"):
            raise failure(f"{rule}: axis {kc.axes[j]!r} holds {q}; only Replicate or Shard of other dims are covered")
    return sh[0]


def pulled_cites(X: Exprs, e: int, d: int, p: int) -> list[str]:
    """The rule ids a conclusion drawn from :func:`pull` must cite besides its own: ``interleave_commutes`` when
    ``e`` is not itself an interleave along ``d`` over ``p`` (the pull then took commuting steps)."""
    m = match(X, e)
    return [] if m is not None and m.dim == d and m.p == p else [EQ_RULE]


def derive_split(kc, ra, f, dim: int, failure):
    """Facts of ``split(dim, sizes)`` of Shard(dim) of an interleaved expression (rule ``split_interleaved_shard``)."""
    from .rules import Derivation, Fact

    X = kc.exprs
    ai = _axis(kc, f, dim, failure, SPLIT_RULE)
    p = kc.sizes[kc.axes[ai]]
    sizes = list(ra["sizes"])
    got = pull(X, f.expr, dim, p)
    if got is None:
        raise failure(f"split along dim {dim}, which is sharded on axis {kc.axes[ai]!r}: the input is not an "
                      f"interleave over that axis ({SPLIT_RULE} needs a fused tensor laid out per rank)")
    core, k = got
    n = X[f.expr].shape[dim] // (k * p)
    if sizes != [n] * k:
        raise failure(f"{SPLIT_RULE}: the split sizes {sizes} are not the {k} parts of {n} rows a rank holds")
    outs = X.mk_multi("split", {"dim": dim, "sizes": tuple([p * n] * k)}, [core])
    rules = ["replicate_any" if q.kind == "R" else "slice_other_dim" for q in f.pl]
    rules[ai] = SPLIT_RULE
    return Derivation([Fact(o, f.pl) for o in outs], rules + pulled_cites(X, f.expr, dim, p))


def derive_slice(kc, ra, f, dim: int, failure):
    """Fact of ``slice(dim, i*n, (i+1)*n)`` (step 1, literal bounds) of Shard(dim) of an interleaved expression: one
    part of the rank's block (``x[..., :n]``, Phi-3's qkv slices), rule ``split_interleaved_shard``."""
    from .rules import Derivation, Fact

    X = kc.exprs
    ai = _axis(kc, f, dim, failure, SPLIT_RULE)
    p = kc.sizes[kc.axes[ai]]
    got = pull(X, f.expr, dim, p)
    if got is None:
        raise failure(f"slice along dim {dim}, which is sharded on axis {kc.axes[ai]!r}: the input is not an "
                      f"interleave over that axis ({SPLIT_RULE} needs a fused tensor laid out per rank)")
    core, k = got
    n = X[f.expr].shape[dim] // (k * p)
    st, en, step = ra["start"], ra["end"], ra["step"]
    if step != 1 or n == 0 or st % n or en != st + n or not 0 <= st < k * n:
        raise failure(f"{SPLIT_RULE}: slice [{st}:{en}:{step}] is not one of the {k} parts of {n} rows a rank holds")
    i = st // n
    out = X.mk("slice", {"dim": dim, "start": i * p * n, "end": (i + 1) * p * n, "step": 1}, [core])
    rules = ["replicate_any" if q.kind == "R" else "slice_other_dim" for q in f.pl]
    rules[ai] = SPLIT_RULE
    return Derivation([Fact(out, f.pl)], rules + pulled_cites(X, f.expr, dim, p))


def derive_pad(kc, ra, f, failure):
    """Fact of a zero pad, literal on the one sharded dim d, of a Shard(d) operand of local size n by (i*n, j*n):
    the rank's part i of k = i + j + 1 parts, the others zero (autograd's slice_backward of a sliced-out part) is
    Shard(d) of the interleave of the logical pad by (i*p*n, j*p*n) -- ``concat_interleaved_shard`` with zero
    parts."""
    from .rules import Derivation, Fact

    X = kc.exprs
    shape = X[f.expr].shape
    pads, value = list(ra["pads"]), ra.get("value", 0)
    padded = [d for d in range(len(shape)) if pads[2 * d] or pads[2 * d + 1]]
    if len(padded) != 1 or value != 0:
        raise failure(f"{CONCAT_RULE}: a pad of a sharded dim is covered with zeros on that dim only")
    d = padded[0]
    ai = _axis(kc, f, d, failure, CONCAT_RULE)
    p = kc.sizes[kc.axes[ai]]
    n = shape[d] // p
    before, after = pads[2 * d], pads[2 * d + 1]
    if n == 0 or before < 0 or after < 0 or before % n or after % n:
        raise failure(f"{CONCAT_RULE}: pad ({before}, {after}) of a local part of {n} rows is not whole parts")
    i, j = before // n, after // n
    lp = [0] * len(pads)
    lp[2 * d], lp[2 * d + 1] = i * p * n, j * p * n
    expr = build(X, X.mk("pad", {"pads": tuple(lp), "value": 0}, [f.expr]), d, i + j + 1, p)
    rules = ["replicate_any" if q.kind == "R" else "concat_other_dim" for q in f.pl]
    rules[ai] = CONCAT_RULE
    return Derivation([Fact(expr, f.pl)], rules)


def derive_concat(kc, facts, dim: int, failure):
    """Fact of ``concat(dim)`` of k equal Shard(dim) operands (rule ``concat_interleaved_shard``)."""
    from .rules import Derivation, Fact

    X = kc.exprs
    pls = {f.pl for f in facts}
    if len(pls) != 1:
        raise failure(f"{CONCAT_RULE}: operands placed differently")
    ai = _axis(kc, facts[0], dim, failure, CONCAT_RULE)
    shapes = {X[f.expr].shape for f in facts}
    if len(shapes) != 1 or len(facts) < 2:
        raise failure(f"{CONCAT_RULE}: needs at least two operands of one shape, got {sorted(map(list, shapes))}")
    p = kc.sizes[kc.axes[ai]]
    cat = X.mk("concat", {"dim": dim}, [f.expr for f in facts])
    expr = build(X, cat, dim, len(facts), p)
    rules = ["replicate_any" if q.kind == "R" else "concat_other_dim" for q in facts[0].pl]
    rules[ai] = CONCAT_RULE
    return Derivation([Fact(expr, facts[0].pl)], rules)
