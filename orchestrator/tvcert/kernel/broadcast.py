"""A replicated tensor that is a broadcast along a dim is also the Shard of its broadcast to the full size.

Data parallelism needs this everywhere: the backward of ``x.mean()`` on a batch shard starts from
``expand(1, local_shape) / n_local``, a tensor every rank builds alike (Replicate) with the *local* batch size,
which is then multiplied with batch-sharded activations.  Each rank's block of ``expand(1, full_shape)`` is
the same local tensor, so the operand may be read as ``Shard(d)`` of the widened expression
(``NormaliseReductions.replicate_broadcast_as_shard``: a local tensor whose value does not depend on the
index along ``d`` is every rank's block of the tensor with that value at every index).

:func:`widen` rebuilds an expression with dim ``j`` of size ``N`` when its value provably does not depend on
the index along ``j``: an ``expand`` from size 1 (or from a missing dim, or of a source that widens), a constant fill, a reshape that only
inserts or drops size-1 dims of an operand that widens, or a pointwise op whose operands are each broadcast
along ``j`` or widen.  Anything else (a leaf, a reduction, a layout op) is
refused, so the premise "constant along ``j``" is read from the expression's structure, never assumed.
"""
from __future__ import annotations

from typing import Sequence

from ..ops import REGISTRY
from .expr import Exprs
from .smt import scalar_const

RULE = "replicate_broadcast_as_shard"


def widen(X: Exprs, e: int, j: int, N: int) -> int | None:
    """``e`` with dim ``j`` of size ``N`` (same value at every index along it), or None when ``e`` is not
    structurally constant along ``j``."""
    x = X[e]
    if not 0 <= j < len(x.shape) or x.shape[j] == 1:
        return None
    new = x.shape[:j] + (N,) + x.shape[j + 1:]
    at = x.attr_dict()
    if x.op == "expand":
        zs = X[x.args[0]].shape
        jz = j - (len(x.shape) - len(zs))
        if jz < 0 or zs[jz] == 1:
            return X.mk("expand", {"shape": new}, [x.args[0]])
        w = widen(X, x.args[0], jz, N)  # expanded along other dims only: the source must widen
        return None if w is None else X.mk("expand", {"shape": new}, [w])
    if x.op == "reshape":  # only size-1 dims inserted / removed: dim j is one of the source's dims
        src = X[x.args[0]].shape
        big_out = [d for d, v in enumerate(x.shape) if v != 1]
        big_in = [d for d, v in enumerate(src) if v != 1]
        if [x.shape[d] for d in big_out] != [src[d] for d in big_in]:
            return None
        w = widen(X, x.args[0], big_in[big_out.index(j)], N)
        return None if w is None else X.mk("reshape", {"shape": new}, [w])
    if x.op == "const":
        if scalar_const(X, e) is None or not isinstance(at.get("shape"), list):
            return None  # a literal tensor may differ along j
        return X.mk("const", {**at, "shape": new}, [])
    spec = REGISTRY.get(x.op)  # a leaf ("input") or anything not pointwise is refused
    if spec is None or spec.category != "elementwise" or not x.args:
        return None
    args = []
    for a in x.args:
        sa = X[a].shape
        ja = j - (len(x.shape) - len(sa))
        if ja < 0 or sa[ja] == 1:
            args.append(a)  # broadcast along j already
            continue
        w = widen(X, a, ja, N)
        if w is None:
            return None
        args.append(w)
    return X.mk(x.op, at, args)


def promote_broadcasts(kc, facts: Sequence) -> tuple[list, list[str]]:
    """For a pointwise op: every replicated operand that is a broadcast along a dim another operand shards
    becomes Shard of its widened expression on the axes sharding that dim.  Returns the facts and the rule ids
    used (``[RULE]`` or ``[]``).  Operands that do not qualify are left as they are (the elementwise rules
    then decide, and refuse a replicated operand that is not broadcast along the shard dim)."""
    from .rules import Fact, S, shard_factor

    X = kc.exprs
    shapes = [X[f.expr].shape for f in facts]
    n = max((len(s) for s in shapes), default=0)
    out = list(facts)
    used = False
    for D in range(n):
        ref = None  # (fact index, placements) of the first operand sharding output dim D
        for k, (f, s) in enumerate(zip(facts, shapes)):
            if any(p.kind == "S" and p.dim + (n - len(s)) == D for p in f.pl):
                ref = k
                break
        if ref is None:
            continue
        sr, fr = shapes[ref], facts[ref]
        jr = D - (n - len(sr))
        N = sr[jr]
        axes_on_D = [ai for ai, p in enumerate(fr.pl) if p.kind == "S" and p.dim == jr]
        F = shard_factor(kc.axes, fr.pl, jr, kc.sizes)
        for k, f in enumerate(out):
            s = X[f.expr].shape
            j = D - (n - len(s))
            if k == ref or j < 0 or s[j] in (1, N) or s[j] * F != N:
                continue
            # replicated on the axes sharding D, not sharded on j elsewhere, and no Partial on any axis (a Partial's
            # pieces need not be constant along j even when their combination is)
            if any(f.pl[ai].kind != "R" for ai in axes_on_D) or any(p.kind == "P" or (p.kind == "S" and p.dim == j)
                                                                     for p in f.pl):
                continue
            w = widen(X, f.expr, j, N)
            if w is None:
                continue
            pl = list(f.pl)
            for ai in axes_on_D:
                pl[ai] = S(j)
            out[k] = Fact(w, tuple(pl))
            used = True
    return out, ([RULE] if used else [])
