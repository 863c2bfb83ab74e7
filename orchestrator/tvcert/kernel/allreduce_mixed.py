"""all_reduce(sum | avg) over several mesh axes of a tensor that is Replicate, Partial(sum) or Partial(avg) on
each axis of the group, in any mixture.

Real code reduces a loss or a statistic over (dp, cp) or (dp, tp) at once while it is, say, Partial(avg) over
dp and Replicate over tp.  Over the flattened group the sum of the ranks' pieces is ``prod_i f_i * E`` with
``f_i = p_i`` on a Replicate or Partial(avg) axis and ``1`` on a Partial(sum) axis; the average divides by
``prod_i p_i`` (``Normalise2.allreduce_mixed_axes``, two axes; a group of Replicate axes is again a Replicate
axis, so all-Replicate groups nest to any number of axes).  Side conditions, checked here: every axis of the
group has a positive size and one of the three kinds; a group of more than two axes is all Replicate; no
Partial on an axis outside the group.  The factor is an exact rational, so a wrong one is never accepted.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Sequence

from ..plan import Placement
from .reductions import scaled

RULE = "allreduce_mixed_axes"


def allreduce_mixed(kc, reduce: str, idx: Sequence[int], pl: Sequence, expr: int):
    """``(expr', placements)`` after the all_reduce, or None when the rule does not apply (the caller's
    other rules then decide)."""
    if reduce not in ("sum", "avg") or len(idx) < 2 or kc.exprs[expr].dtype != "float":
        return None
    kinds = [pl[i] for i in idx]
    if any(q.kind not in ("R", "P") or q.kind == "P" and q.reduce not in ("sum", "avg") for q in kinds):
        return None
    if len(idx) > 2 and any(q.kind != "R" for q in kinds):
        return None
    if any(q.kind == "P" for j, q in enumerate(pl) if j not in idx):
        return None
    c = Fraction(1)
    for i, q in zip(idx, kinds):
        p = kc.sizes[kc.axes[i]]
        if p <= 0:
            return None
        f = 1 if q.kind == "P" and q.reduce == "sum" else p
        c *= f if reduce == "sum" else Fraction(f, p)
    out = list(pl)
    for i in idx:
        out[i] = Placement("R")
    return scaled(kc.exprs, c, expr), tuple(out)
