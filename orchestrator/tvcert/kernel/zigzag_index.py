"""Head-tail load balancing by an index: rank r's block of a replica read at the balancer's permutation.

torch's ``_HeadTailLoadBalancer`` (``context_parallel()``'s buffer sharding, torchtitan's
``prepare_context_parallel_input``) builds one index P over the n = 2pc rows -- chunks 0, 2p-1, 1, 2p-2, ... of c
rows -- reads the buffer at it and keeps block r of 2c rows on rank r:

    slice(index_select(X, d, P), d, r*2c, (r+1)*2c)          (1-D buffers, seq dim 0)
    slice(gather(X, d, G), d, r*2c, (r+1)*2c)                 G = P along d, broadcast over the other dims

With P the head-tail permutation this is ZigzagShard(d) of X (Coq ``ZigzagIndex.zigzag_from_index_block``).  Side
conditions, at every use: the slice bounds are exactly ``rank.a*2c`` / ``rank.a*2c+2c`` on one mesh axis a of size p,
step 1, along d (checked by :func:`.shapes.affine_in_rank` over every axis); X is replicated over a; every op
computing the index has rank-free attributes and only constants / iotas as leaves, and its values, computed with
the reference semantics, are P exactly (a gather's index also constant along every other dim, of X's local shape
there, so that the gather reads whole rows); the other axes keep X's placement (replicated, or sharded on another
dim: index_select / gather along d act on each index of the other dims alike).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..ops import REGISTRY
from ..ops.base import Ctx, TablesNeeded
from ..shapes import affine_in_rank, rank_axes_in
from .producers import ProducersBefore, out_shape, rank_free_attrs
from .rules import Derivation, Fact, KCtx, RuleFailure, conclude, local_shape

RULE = "zigzag_from_index_block"
STATEMENT = ("rank r's block of 2c rows of a replicated tensor read at the head-tail permutation (chunks r and "
             "2p-1-r of c rows, for every r) holds its ZigzagShard (pattern, kernel/zigzag_index.py)")
MAX_CONST = 1 << 16  # elements of an index evaluated here


def head_tail(p: int, c: int) -> np.ndarray:
    """The head-tail permutation of 2pc rows: block r of 2c is chunk r, then chunk 2p-1-r."""
    return np.array([(r * c + i) if i < c else ((2 * p - 1 - r) * c + i - c) for r in range(p) for i in range(2 * c)],
                    dtype=np.int64)


def _const_value(producers, t: str, kc: KCtx, seen: set, depth: int = 0) -> np.ndarray:
    """The values of ``t`` when every op computing it has rank-free attributes and constants / iotas as leaves."""
    got = producers.get(t)
    if got is None:
        raise RuleFailure(f"the index {t!r} is not computed from constants (a program input)")
    i, n = got
    if depth > 64:
        raise RuleFailure("the index is computed by too long a chain of ops")
    if n.op not in REGISTRY or n.op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "ppermute",
                                         "send", "recv", "broadcast"):
        raise RuleFailure(f"{n.op} at {n.path} in the index's computation")
    ra = rank_free_attrs(n, kc)
    ins = [_const_value(producers, x, kc, seen, depth + 1) for x in n.inputs]
    seen.add(i)
    try:  # exactly, as the reals do (float64 rounds cast(P - 1e-17) to P; it is P - 1 below every nonzero entry)
        out = REGISTRY[n.op].eval(ins, ra, Ctx(exact=True, no_tables=True))[n.outputs.index(t)]
    except TablesNeeded:
        raise RuleFailure(f"{n.op} at {n.path}: the index is computed with a nonlinear function") from None
    out = np.asarray(out)
    if out.size > MAX_CONST:
        raise RuleFailure("the index is too large to evaluate")
    return out


def zigzag_from_index_block(g, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    """See the module docstring."""
    producers = ProducersBefore(g, index)
    n = g.nodes[index]
    if n.op != "slice":
        raise RuleFailure("not a slice")
    src = producers.get(n.inputs[0])
    if src is None or src[1].op not in ("index_select", "gather"):
        raise RuleFailure("not a slice of an index_select / gather")
    si, sel = src
    x_t, idx_t = sel.inputs
    if x_t not in facts:
        raise RuleFailure("the indexed tensor has no fact")
    f = facts[x_t]
    X = kc.exprs
    shape = X[f.expr].shape
    nd = len(shape)
    sa = rank_free_attrs(sel, kc)
    ra = rank_free_attrs(n, kc, allowed=("start", "end"))
    d = sa["dim"] % nd
    if ra["dim"] % nd != d or ra.get("step", 1) != 1:
        raise RuleFailure("the slice is not a unit-step slice along the indexed dim")
    names = set(rank_axes_in([n.attrs.get("start"), n.attrs.get("end")]))
    if len(names) != 1 or next(iter(names)) not in kc.axes:
        raise RuleFailure("the block bounds must depend on exactly one mesh axis of the program")
    a = names.pop()
    j, p = kc.axes.index(a), kc.sizes[a]
    N = shape[d]
    if N % (2 * p):
        raise RuleFailure(f"dim {d} of size {N} does not split into 2 x {p} chunks")
    c = N // (2 * p)
    env = kc.env0()
    for key, want in (("start", (0, 2 * c)), ("end", (2 * c, 2 * c))):
        v = n.attrs.get(key)
        got = affine_in_rank(v, env, a) if isinstance(v, (str, int)) else None
        if got != want:
            raise RuleFailure(f"rank r's block {key}={v!r}: rank r must keep rows [r*{2 * c}, (r+1)*{2 * c})")
    if f.pl[j].kind != "R":
        raise RuleFailure(f"the indexed tensor must be replicated over {a!r}, got {f.pl[j]}")
    seen: set[int] = set()
    iv = _const_value(producers, idx_t, kc, seen)
    if sel.op == "index_select":
        if iv.ndim != 1:
            raise RuleFailure("the index_select index is not 1-D")
        perm = iv
    else:
        if iv.ndim != nd:
            raise RuleFailure("the gather index does not have the read tensor's rank")
        lx = local_shape(shape, kc.axes, f.pl, kc.sizes)
        if any(iv.shape[k] != lx[k] for k in range(nd) if k != d) or iv.shape[d] != N:
            raise RuleFailure("the gather index does not cover the read tensor's other dims exactly")
        perm = np.moveaxis(iv, d, 0).reshape(N, -1)
        if not (perm == perm[:, :1]).all():
            raise RuleFailure("the gather index is not constant along the other dims")
        perm = perm[:, 0]
    if perm.shape == (N,) and any(v != int(v) for v in perm.tolist()):  # exact values: a fraction is no index
        raise RuleFailure("the index holds a value that is not an integer")
    if perm.shape != (N,) or not np.array_equal(np.array([int(v) for v in perm.tolist()], dtype=np.int64),
                                                head_tail(p, c)):
        raise RuleFailure(f"the index is not the head-tail permutation of {2 * p} chunks of {c} rows")
    from .zigzag import Z, _carry_other_axes

    per_axis = _carry_other_axes(kc, f, j, d, Z(d), RULE)
    return conclude(kc, f.expr, per_axis, out_shape(n)), sorted(seen | {si})


__all__ = ["RULE", "STATEMENT", "head_tail", "zigzag_from_index_block"]
