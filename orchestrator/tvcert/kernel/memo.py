"""Stages and memoization: a repeated layer is derived once and replayed for its copies.

A *stage* is a maximal run of consecutive ops of one program carrying the same ``layer``
label.  Its *canonical form* is everything the single-op rules look at when deriving its facts:
each op, its attributes as written and as resolved in the program's rank-0 environment, its
local shapes, where its inputs come from (an earlier op of the stage, or the k-th boundary
input), and for each boundary input the placement, logical shape and dtype of its fact, which
boundary inputs share one expression, and the content of boundary constants (the only
expressions whose content a rule reads).

A :class:`Template` is the stage derived once *over slots*: every boundary input that is not a
constant gets a fresh opaque expression (one per group of boundary inputs sharing an
expression), the stage's ops are derived by the single-op rules (:func:`derive`), and each
concluded expression is recorded as a term over those slots (a self-contained recipe of
``(op, attrs, args, shape, dtype)`` nodes).  :func:`replay` rebuilds every expression of an
instance from that recipe, substituting the instance's boundary expressions *at the slots only*
(``Rules/Stage.v``: ``stage_repeat``, a derivation over slots with the slots substituted is the
derivation over the instance).  Nothing is substituted by hash: an internal result that happens
to equal a boundary expression in one stage stays the result of its own ops in every copy.

Trusted: the engine and the checker both build templates with :func:`derive_template` and
replay them with :func:`replay`; nothing else fills in an instance's facts.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..graph import Graph
from ..ops import REGISTRY, resolve_attrs
from ..plan import Plan
from ..shapes import rank_axes_in
from .expr import Expr, Exprs, canon_attrs
from .rules import Fact, RuleFailure, derive
from .setup import kctx, rank0_env

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


def _is_const(e: Expr) -> bool:
    return e.op == "const"


def canonical_key(plan: Plan, program: str, start: int, end: int, facts: Mapping[str, Fact], X: Exprs) -> str | None:
    """The canonical form's hash (including the mesh axes the program spans, with their sizes, and every
    op's attributes resolved in the program's rank-0 environment), or None when a boundary input has no
    fact."""
    g = plan.programs[program]
    bnd = boundary(g, start, end)
    if any(b not in facts for b in bnd):
        return None
    mesh = plan.mesh()
    axes = [(a, mesh[a]) for a in plan.program_axes(program)]
    env = rank0_env(plan, program)
    slot = {b: k for k, b in enumerate(bnd)}
    first_of: dict[int, int] = {}
    bspec = []
    for k, b in enumerate(bnd):
        f = facts[b]
        e = X[f.expr]
        same = first_of.setdefault(f.expr, k)
        content = [e.op, e.attrs] if _is_const(e) else None
        bspec.append([[str(p) for p in f.pl], list(e.shape), e.dtype, same, content])
    where: dict[str, list] = {}
    ops = []
    for i, n in enumerate(g.nodes[start:end]):
        refs = [where.get(x, ["b", slot.get(x)]) for x in n.inputs]
        ops.append([n.op, n.attrs, _resolved(n, env), refs, [[list(s), d] for s, d in n.meta["shape@dims"]]])
        for o_i, o in enumerate(n.outputs):
            where[o] = ["n", i, o_i]
    body = json.dumps([axes, bspec, ops], sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def _resolved(n, env) -> str | None:
    """The attributes as the rules see them on this program's ranks.  Without a rank coordinate they are a function
    of the attributes as written and the plan's dims (the same for every stage of a plan): None."""
    return canon_attrs(resolve_attrs(REGISTRY[n.op], n.attrs, env)) if _mentions_rank(n.attrs) else None


def _mentions_rank(v) -> bool:
    """Whether any string inside ``v`` contains ``rank`` or a rank coordinate however spelled (``shapes.rank_axes_in``:
    a full-width ``ｒａｎｋ.pp`` has no ASCII ``rank`` but evaluates to the coordinate)."""
    if isinstance(v, str):
        return "rank" in v or bool(rank_axes_in(v))
    if isinstance(v, dict):
        return any(_mentions_rank(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return any(_mentions_rank(x) for x in v)
    return False


SLOT_OP = "stage_slot"  # the opaque expression standing for a boundary input while a template is derived


@dataclass
class Template:
    """A stage derived once over slots.

    ``recipe`` is a topologically ordered list of nodes, each ``["slot", k]`` (the k-th group of boundary
    inputs sharing one expression) or ``[op, attrs, [arg node indices], shape, dtype]``; ``out[j]`` holds,
    for each output of the stage's j-th op, the recipe node of its expression and its placement;
    ``rules[j]`` the rule ids that justified that op.  ``groups[k]`` is the slot of the k-th boundary input,
    or for a boundary constant (part of the canonical form, in the recipe as itself) its
    ``[op, attrs, shape, dtype]``."""

    program: str
    start: int
    end: int
    key: str
    groups: list[int | list]
    slots: list[list] = field(default_factory=list)  # [shape, dtype] of each slot
    recipe: list[list] = field(default_factory=list)
    rules: list[list[str]] = field(default_factory=list)
    out: list[list[tuple[int, tuple]]] = field(default_factory=list)


class TemplateFailure(Exception):
    """The stage cannot be derived over slots by single-op rules (the message says where)."""


def derive_template(plan: Plan, program: str, start: int, end: int, facts: Mapping[str, Fact], X: Exprs) -> Template:
    """Derive the stage ``[start, end)`` of ``program`` once over slots, op by op with :func:`derive` only
    (no multi-op pattern, no send/recv, no loop), and record it as a :class:`Template`.  ``facts`` gives the
    boundary inputs' facts (their placements, shapes, dtypes, sharing and constants are what the slots keep).
    The expression table is left exactly as it was.  Raises TemplateFailure."""
    g = plan.programs[program]
    key = canonical_key(plan, program, start, end, facts, X)
    if key is None:
        raise TemplateFailure("a boundary input of the stage has no fact")
    bnd = boundary(g, start, end)
    mark = X.mark()
    try:
        return _derive_template(plan, program, g, start, end, key, bnd, facts, X, mark)
    finally:
        X.rollback(mark)


def _derive_template(plan, program, g, start, end, key, bnd, facts, X, mark) -> Template:
    kc = kctx(plan, program, X)
    env = rank0_env(plan, program)
    slot_of_expr: dict[int, int] = {}
    slot_ids: dict[int, int] = {}  # placeholder expression id -> slot
    groups: list[int | list] = []
    slots: list[list] = []
    local: dict[str, Fact] = {}
    for b in bnd:
        f = facts[b]
        e = X[f.expr]
        if _is_const(e):
            groups.append([e.op, e.attrs, list(e.shape), e.dtype])
            local[b] = f
            continue
        k = slot_of_expr.setdefault(f.expr, len(slot_of_expr))
        if k == len(slots):
            slots.append([list(e.shape), e.dtype])
        groups.append(k)
        pid = X._intern(Expr(SLOT_OP, canon_attrs({"slot": k}), (), e.shape, e.dtype))
        if pid < mark:
            raise TemplateFailure("a slot expression exists outside template derivation")  # cannot happen
        slot_ids[pid] = k
        local[b] = Fact(pid, f.pl)
    rules: list[list[str]] = []
    outs: list[list[Fact]] = []
    for i in range(start, end):
        n = g.nodes[i]
        if n.op in NOT_MEMOIZED_OPS or n.op == "ring_loop":
            raise TemplateFailure(f"{n.path}: {n.op} is not derived by a single-op rule")
        missing = [x for x in n.inputs if x not in local]
        if missing:
            raise TemplateFailure(f"{n.path}: input {missing[0]!r} has no fact")
        ra = resolve_attrs(REGISTRY[n.op], n.attrs, env)
        try:
            d = derive(kc, n.op, ra, n.attrs, [local[x] for x in n.inputs], [s for s, _ in n.meta["shape@dims"]])
        except RuleFailure as exc:
            raise TemplateFailure(f"{n.path}: {exc}") from None
        for o, f in zip(n.outputs, d.facts):
            local[o] = f
        rules.append(list(d.rules))
        outs.append(list(d.facts))
    recipe: list[list] = []
    index: dict[int, int] = {}

    def node(e0: int) -> int:
        stack = [(e0, False)]
        while stack:
            e, expanded = stack.pop()
            if e in index:
                continue
            ex = X[e]
            if e in slot_ids:
                index[e] = len(recipe)
                recipe.append(["slot", slot_ids[e]])
            elif expanded:
                index[e] = len(recipe)
                recipe.append([ex.op, ex.attrs, [index[a] for a in ex.args], list(ex.shape), ex.dtype])
            else:
                if ex.op == SLOT_OP:
                    raise TemplateFailure("a slot expression of another template")  # cannot happen
                stack.append((e, True))
                stack.extend((a, False) for a in reversed(ex.args) if a not in index)
        return index[e0]

    out = [[(node(f.expr), f.pl) for f in fs] for fs in outs]
    return Template(program, start, end, key, groups, slots, recipe, rules, out)


def replay(t: Template, X: Exprs, boundary_exprs: Sequence[int]) -> list[list[Fact]]:
    """The instance's facts: every expression of the template rebuilt from its recipe, with the instance's
    boundary expressions at the slots (and nowhere else).  The instance must share boundary expressions
    exactly where the template's slots do (its canonical form says so; checked again here)."""
    if len(boundary_exprs) != len(t.groups):
        raise ValueError(f"the instance has {len(boundary_exprs)} boundary inputs, the template {len(t.groups)}")
    slot_expr: dict[int, int] = {}
    for k, e in zip(t.groups, boundary_exprs):
        ex = X[e]
        if not isinstance(k, int):  # a boundary constant: the recipe holds it, the instance must have the same
            if [ex.op, ex.attrs, list(ex.shape), ex.dtype] != k:
                raise ValueError("a boundary constant of the template differs in the instance")
            continue
        if slot_expr.setdefault(k, e) != e:
            raise ValueError("boundary inputs that share a slot in the template differ in the instance")
        if _is_const(ex) or [list(ex.shape), ex.dtype] != t.slots[k]:
            raise ValueError("a boundary input differs in kind, shape or dtype from the template's slot")
    if len(set(slot_expr.values())) != len(slot_expr):
        raise ValueError("boundary inputs with different slots in the template share an expression in the instance")
    ids: list[int] = []
    for r in t.recipe:
        if r[0] == "slot":
            ids.append(slot_expr[r[1]])
            continue
        op, attrs, args, shape, dtype = r
        ids.append(X._intern(Expr(op, attrs, tuple(ids[j] for j in args), tuple(shape), dtype)))
    return [[Fact(ids[j], pl) for j, pl in fs] for fs in t.out]
