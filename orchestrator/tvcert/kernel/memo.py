"""Stages and memoization: a repeated layer is derived once and replayed for its copies.

A *stage* is a maximal run of consecutive ops of one program carrying the same ``layer``
label.  Its *canonical form* is everything the rules look at when deriving its facts: each
op, its attributes as written, its local shapes, where its inputs come from (an earlier op of
the stage, or the k-th boundary input), and for each boundary input the placement, logical
shape and dtype of its fact, which boundary inputs share one expression, and the content of
boundary constants (the only expressions whose content a rule reads).  Two stages with equal
canonical forms get the same rule decisions, and their concluded expressions differ only by
the substitution of boundary expressions (stage_compose / stage_repeat in Rules/Stage.v).
:func:`replay` performs that substitution on the expressions the template stage created.

Trusted: the checker uses the same functions to replay instance stages of a certificate.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..graph import Graph
from .expr import Expr, Exprs
from .rules import Fact

NOT_MEMOIZED_OPS = {"send", "recv"}  # p2p crosses programs


def stages(g: Graph) -> list[tuple[int, int, str]]:
    """(start, end exclusive, label) of every labelled run of consecutive ops."""
    out = []
    i = 0
    while i < len(g.nodes):
        lab = g.nodes[i].layer
        j = i + 1
        while j < len(g.nodes) and lab is not None and g.nodes[j].layer == lab:
            j += 1
        if lab is not None:
            out.append((i, j, lab))
        i = j
    return out


def boundary(g: Graph, start: int, end: int) -> list[str]:
    """Tensors the stage reads but does not define, in first-use order."""
    inside: set[str] = set()
    out: list[str] = []
    for n in g.nodes[start:end]:
        for x in n.inputs:
            if x not in inside and x not in out:
                out.append(x)
        inside.update(n.outputs)
    return out


def memoizable(g: Graph, start: int, end: int) -> bool:
    return not any(n.op in NOT_MEMOIZED_OPS for n in g.nodes[start:end])


def canonical_key(g: Graph, start: int, end: int, facts: Mapping[str, Fact], X: Exprs,
                  axes: Sequence[tuple[str, int]] = ()) -> str | None:
    """The canonical form's hash (including the mesh axes the program spans, with their sizes), or None
    when a boundary input has no fact."""
    bnd = boundary(g, start, end)
    if any(b not in facts for b in bnd):
        return None
    slot = {b: k for k, b in enumerate(bnd)}
    first_of: dict[int, int] = {}
    bspec = []
    for k, b in enumerate(bnd):
        f = facts[b]
        e = X[f.expr]
        same = first_of.setdefault(f.expr, k)
        content = [e.op, e.attrs] if e.op == "const" else None
        bspec.append([[str(p) for p in f.pl], list(e.shape), e.dtype, same, content])
    where: dict[str, list] = {}
    ops = []
    for i, n in enumerate(g.nodes[start:end]):
        refs = [where.get(x, ["b", slot.get(x)]) for x in n.inputs]
        ops.append([n.op, n.attrs, refs, [[list(s), d] for s, d in n.meta["shape@dims"]]])
        for o_i, o in enumerate(n.outputs):
            where[o] = ["n", i, o_i]
    body = json.dumps([list(axes), bspec, ops], sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


@dataclass
class Template:
    """What deriving a stage once produced: its boundary expressions, and the rule ids and concluded facts
    of each op."""

    program: str
    start: int
    end: int
    key: str
    boundary_exprs: list[int]
    rules: list[list[str]] = field(default_factory=list)
    facts: list[list[Fact]] = field(default_factory=list)
    reach: dict[int, bool] = field(default_factory=dict)  # does an expression contain a boundary expression?


def replay(t: Template, X: Exprs, boundary_exprs: Sequence[int]) -> list[list[Fact]]:
    """The instance's facts: the template's, with the template's boundary expressions replaced by the
    instance's everywhere they occur (derived expressions are built only from boundary expressions and
    constants, so this rebuilds exactly what deriving the instance would)."""
    bmap: dict[int, int] = {}
    for a, b in zip(t.boundary_exprs, boundary_exprs):
        if bmap.setdefault(a, b) != b:
            raise ValueError("boundary inputs that share an expression in the template differ in the instance")
    bset = set(t.boundary_exprs)

    def reaches(e: int) -> bool:
        got = t.reach.get(e)
        if got is None:
            got = e in bset or any(reaches(a) for a in X[e].args)
            t.reach[e] = got
        return got

    memo: dict[int, int] = {}

    def subst(e: int) -> int:
        if e in bmap:
            return bmap[e]
        if not reaches(e):
            return e  # shared: constants, expressions made before the stage from other inputs
        got = memo.get(e)
        if got is None:
            ex = X[e]
            got = X._intern(Expr(ex.op, ex.attrs, tuple(subst(a) for a in ex.args), ex.shape, ex.dtype))
            memo[e] = got
        return got

    return [[Fact(subst(f.expr), f.pl) for f in fs] for fs in t.facts]
