"""An equality step: a slice of a concatenation that is exactly one operand's rows is that operand.

Megatron's ``finalize_model_grads`` all-reduces the sequence-parallel gradients as one coalesced buffer
(``_flatten_dense_tensors``: a concat of the flattened gradients, ``all_reduce``, then ``_unflatten_dense_tensors``:
slices of the reduced buffer), so each gradient arrives as ``slice(concat(g_1 .. g_n), o_k, o_k + n_k)``; this
reads it as ``g_k`` (``Rules/SliceConcat.v``: ``slice_concat_operand``).

Side conditions, checked at every use: the slice is along the concat's dim (both normalised against the rank),
step 1, with literal bounds ``start = n_1 + .. + n_{k-1}`` and ``end = start + n_k`` where ``n_j`` are the operands'
sizes along that dim.  Anything else is not this step.
"""
from __future__ import annotations

from .expr import Exprs

RULE = "slice_concat_operand"
STATEMENT = ("a slice along a concat's dim, step 1, from the sizes of operands 1..k-1 to that plus operand k's size, "
             "is operand k")


def slice_operand(X: Exprs, i: int) -> int | None:
    """The operand ``i`` (a slice of a concat) selects exactly, or None."""
    e = X[i]
    if e.op != "slice" or len(e.args) != 1:
        return None
    c = X[e.args[0]]
    if c.op != "concat" or not c.args:
        return None
    nd = len(c.shape)
    at, cat = e.attr_dict(), c.attr_dict()
    if not nd or not all(isinstance(at.get(k), int) and not isinstance(at.get(k), bool)
                         for k in ("dim", "start", "end", "step")) or not isinstance(cat.get("dim"), int):
        return None
    d = at["dim"]
    if not -nd <= d < nd or d % nd != cat["dim"] % nd or at["step"] != 1:
        return None
    d %= nd
    off = 0
    for a in c.args:
        n = X[a].shape[d]
        if at["start"] == off and at["end"] == off + n and X[a].shape == e.shape:
            return a
        off += n
    return None
