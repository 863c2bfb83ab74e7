"""Reading an output fact with the Partial kind the plan declares: Partial(sum) of E is Partial(avg) of E / p.

A data-parallel loss divided on each rank by its *local* count is, over the ranks, a Partial(sum) of the
global sum divided by the local count; the user declares the local losses as Partial(avg) of the global mean
(what DDP logs).  Both describe the same local tensors (``CollectivesReal.partial_sum_as_avg``, ``p > 0``):
the fact is re-read axis by axis, the expression scaled by exactly ``1/p`` (sum -> avg) or ``p`` (avg ->
sum), and the scaled expression must still be proved equal to the logical output -- so a wrong factor is
never accepted.  Used by output matching in the engine and in the certificate checker alike.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Mapping, Sequence

from .expr import Exprs
from .reductions import scaled

RULE = "partial_sum_as_avg"


def read_as(X: Exprs, axes: Sequence[str], sizes: Mapping[str, int], expr: int, pl: Sequence, want: Sequence):
    """The expression the same local tensors have under placements ``want``, or None when ``pl`` and ``want``
    differ other than by Partial(sum) <-> Partial(avg) on some axes (returns ``expr`` itself when equal)."""
    if tuple(pl) == tuple(want):
        return expr
    if len(pl) != len(want):
        return None
    c = Fraction(1)
    for a, p, q in zip(axes, pl, want):
        if p == q:
            continue
        if p.kind != "P" or q.kind != "P" or {p.reduce, q.reduce} != {"sum", "avg"} or sizes[a] <= 0:
            return None
        c = c / sizes[a] if p.reduce == "sum" else c * sizes[a]
    if X[expr].dtype != "float":
        return None
    return scaled(X, c, expr)
