"""Micro-batches of a data-parallel shard: a pipeline schedule splitting each rank's Shard(d) batch into k parts.

Rank r of p holds rows ``[r*k*n, (r+1)*k*n)`` of the logical batch E (a plain ``Shard(d)``); the schedule's
``tensor_split`` into k micro-batches gives it rows ``r*k*n + i*n + t`` as micro-batch i: the nested split (rank r,
micro-batch i) is logical block (r, i).  That is the Shard(d) of part i of ``interleave(E, d, p, k)`` -- E's dim read
as (p, k, n), the first two swapped (:func:`.interleave.build` with the parts and ranks exchanged), so that micro-batch
i of every rank lies contiguous, rank-major: ``interleave(E, d, p, k)[i*p*n + r*n + t] = E[r*k*n + i*n + t]``
(``Rules/Microbatch.v``: ``slice_shard_microbatch``).

Rule ``slice_shard_microbatch``: a literal slice ``[i*n, (i+1)*n)`` (step 1) or an equal split into k parts of a
rank's local dim d (size k*n) of a plain Shard(d) is Shard(d) of ``slice(interleave(E, d, p, k), i*p*n,
(i+1)*p*n)`` (resp. the split of the interleave into k parts of p*n).  The logical program reads its micro-batches
the same way (``pipelining._shard_microbatches``), so the parallel and logical micro-batches are one expression.

Side conditions, checked at every use: exactly one mesh axis shards dim d (Shard, not zig-zag), every other axis is
Replicate or shards another dim (no Partial); the slice's bounds are literal, step 1, one of k equal parts of the
local dim; a split's sizes are k equal parts.  Anything else is a RuleFailure (UNKNOWN).  Applied only where the
input is not an interleave already read by ``split_interleaved_shard`` (a fused weight's parts; both are true, the
fused reading is what the logical program spells).
"""
from __future__ import annotations

from .interleave import _axis, build

RULE = "slice_shard_microbatch"
STATEMENT = ("part i of k of rank r's block of a Shard(d) tensor E (rows r*k*n + i*n + t) is block r of part i of "
             "interleave(E, d, p, k): a micro-batch of a data-parallel shard is the shard of the logical micro-batch")


def _parts(kc, f, dim: int, failure):
    ai = _axis(kc, f, dim, failure, RULE)
    p = kc.sizes[kc.axes[ai]]
    size = kc.exprs[f.expr].shape[dim]
    if size % p:
        raise failure(f"{RULE}: dim {dim} of size {size} is not split evenly over {kc.axes[ai]!r} = {p}")
    return ai, p, size // p


def _rules(f, ai: int) -> list[str]:
    rules = ["replicate_any" if q.kind == "R" else "slice_other_dim" for q in f.pl]
    rules[ai] = RULE
    return rules


def derive_slice(kc, ra, f, dim: int, failure):
    """Fact of ``slice(dim, i*n, (i+1)*n)`` of a rank's Shard(dim) block of k*n rows: micro-batch i."""
    from .rules import Derivation, Fact

    X = kc.exprs
    ai, p, local = _parts(kc, f, dim, failure)
    st, en, step = ra["start"], ra["end"], ra["step"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (st, en, step)):
        raise failure(f"{RULE}: the slice bounds are not literal")
    n = en - st
    if step != 1 or n <= 0 or local % n or st % n or not 0 <= st < local:
        raise failure(f"{RULE}: slice [{st}:{en}:{step}] of a local dim of {local} rows is not one of equal parts")
    k, i = local // n, st // n
    y = build(X, f.expr, dim, p, k)
    out = X.mk("slice", {"dim": dim, "start": i * p * n, "end": (i + 1) * p * n, "step": 1}, [y])
    return Derivation([Fact(out, f.pl)], _rules(f, ai))


def derive_split(kc, ra, f, dim: int, failure):
    """Facts of ``split(dim, [n]*k)`` of a rank's Shard(dim) block of k*n rows: its k micro-batches."""
    from .rules import Derivation, Fact

    X = kc.exprs
    ai, p, local = _parts(kc, f, dim, failure)
    sizes = list(ra["sizes"])
    if not sizes or len(set(sizes)) != 1 or sizes[0] <= 0 or sizes[0] * len(sizes) != local:
        raise failure(f"{RULE}: split sizes {sizes} are not equal parts of a local dim of {local} rows")
    k, n = len(sizes), sizes[0]
    y = build(X, f.expr, dim, p, k)
    outs = X.mk_multi("split", {"dim": dim, "sizes": tuple([p * n] * k)}, [y])
    return Derivation([Fact(o, f.pl) for o in outs], _rules(f, ai))


def fused(kc, f, dim: int) -> bool:
    """Whether ``split_interleaved_shard`` reads the input (an interleave along ``dim`` over the one axis sharding
    it, :func:`.interleave.pull`): a fused tensor's parts, not micro-batches.  A choice between true facts."""
    from .interleave import pull

    sh = [i for i, q in enumerate(f.pl) if q.kind in ("S", "Z") and q.dim == dim]
    if len(sh) != 1 or f.pl[sh[0]].kind != "S":
        return True  # neither rule applies; the interleave rule says why
    return pull(kc.exprs, f.expr, dim, kc.sizes[kc.axes[sh[0]]]) is not None
