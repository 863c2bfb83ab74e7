"""A rank's block of positions written as an iota with a rank-dependent start (H46).

A context-parallel program may make rank r's positions directly, ``arange(r*n, (r+1)*n)`` (``iota(size=n,
start=s0 + rank.a*n*t, step=t)``), instead of cutting them from the sequence's iota.  That iota is Shard(0) over a
of ``iota(size=p*n, start=s0, step=t)`` (Coq ``IotaBlock.iota_rank_block``), replicated over the other axes.
Side conditions, at every use: ``start`` is exactly ``s0 + rank.a * n*t`` on one mesh axis a of the program, by
:func:`.shapes.affine_in_rank` (no other rank coordinate, rank-free coefficients); ``size`` and ``step`` are
rank-free.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..ops import REGISTRY, resolve_attrs
from ..plan import Placement
from ..shapes import affine_in_rank, rank_axes_in
from .rules import R, Derivation, Fact, KCtx, RuleFailure, conclude

RULE = "iota_rank_block"
STATEMENT = ("rank r's iota of n elements starting at s0 + r*n*t (step t) is block r of the iota of p*n elements "
             "from s0: Shard(0) over that axis (pattern, kernel/iota_block.py)")


def iota_rank_block(g, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    """See the module docstring."""
    n = g.nodes[index]
    if n.op != "iota":
        raise RuleFailure("not an iota")
    start = n.attrs.get("start", 0)
    names = rank_axes_in(start)
    if len(names) != 1 or next(iter(names)) not in kc.axes:
        raise RuleFailure("the iota's start must depend on exactly one mesh axis of the program")
    for k, v in n.attrs.items():
        if k != "start" and rank_axes_in(v):
            raise RuleFailure(f"iota at {n.path}: attribute {k!r} depends on the rank")
    a = next(iter(names))
    env = kc.env0()
    rest = resolve_attrs(REGISTRY["iota"], {k: v for k, v in n.attrs.items() if k != "start"}, env)
    size, step = int(rest["size"]), int(rest.get("step", 1))
    got = affine_in_rank(start, env, a)
    if got is None or got[1] != size * step:
        raise RuleFailure(f"iota start {start!r} is not s0 + rank.{a} * {size * step} (size x step)")
    p = kc.sizes[a]
    full = {**rest, "size": size * p, "start": got[0], "step": step}
    expr = kc.exprs.mk("iota", resolve_attrs(REGISTRY["iota"], full, env), [])
    per_axis = [(Placement("S", 0), RULE) if b == a else (R, "replicate_any") for b in kc.axes]
    return conclude(kc, expr, per_axis, (size,)), []


__all__ = ["RULE", "STATEMENT", "iota_rank_block"]
