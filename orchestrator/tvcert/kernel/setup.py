"""The fixed points of every proof: logical expressions, input facts, output obligations.

Both the engine and the certificate checker start here, so both build the same expression
table in the same order (ids are assigned by construction order).
"""
from __future__ import annotations

from typing import Mapping

from ..graph import bind_shape
from ..ops import REGISTRY, resolve_attrs
from ..plan import Binding, Plan
from .concat_groups import NAME as CONCAT_GROUPS, build_expr as build_concat_groups, layout_spec
from .expr import RESHAPE_LIKE, Exprs
from .rules import Fact, KCtx


def rank0_env(plan: Plan, program: str | None = None) -> dict[str, int]:
    env = dict(plan.dims)
    for a in plan.mesh_spec:
        env[f"rank.{a}"] = 0
    if program is not None:
        for a, c in plan.programs[program].stage.items():
            env[f"rank.{a}"] = c
    return env


def logical_exprs(plan: Plan, exprs: Exprs) -> dict[str, int]:
    """Intern the logical graph: every logical tensor name -> expression id."""
    env = rank0_env(plan)
    out: dict[str, int] = {}
    for i, t in enumerate(plan.logical.inputs):
        out[t.name] = exprs.leaf(t.name, bind_shape(t.shape, plan.dims, f"$.logical.inputs[{i}].shape"), t.dtype)
    for n in plan.logical.nodes:
        ra = resolve_attrs(REGISTRY[n.op], n.attrs, env)
        args = [out[x] for x in n.inputs]
        if len(n.outputs) == 1:
            out[n.outputs[0]] = exprs.mk(n.op, ra, args)
        else:
            for o, e in zip(n.outputs, exprs.mk_multi(n.op, ra, args)):
                out[o] = e
    into: dict = {}  # KCtx.reshape_into: which shapes the logical program reshapes each expression (and each
    for n in plan.logical.nodes:  # expression of that head op, attributes and shape) into
        if n.op in RESHAPE_LIKE and n.inputs:
            x, shp = exprs[out[n.inputs[0]]], tuple(exprs[out[n.outputs[0]]].shape)
            for key in (out[n.inputs[0]], (x.op, x.attrs, tuple(x.shape))):
                into.setdefault(key, set()).add(shp)
    exprs.__dict__["reshape_into"] = {e: frozenset(v) for e, v in into.items()}
    return out


def kctx(plan: Plan, program: str, exprs: Exprs) -> KCtx:
    from .int_range import input_ranges

    return KCtx(exprs, tuple(plan.program_axes(program)), plan.mesh(), plan.dims, reshape_hints(plan),
                input_ranges(plan), exprs.__dict__.get("reshape_into", {}), groupings(plan))


def groupings(plan: Plan) -> frozenset:
    """(sizes, groups) of every concat_groups layout the plan's bindings declare (KCtx.groupings)."""
    env = rank0_env(plan)
    out = set()
    for b in list(plan.inputs.values()) + list(plan.outputs.values()):
        for op, attrs in b.layout:
            if op == CONCAT_GROUPS:
                ra = resolve_attrs(layout_spec(op), attrs, env)
                out.add((tuple(int(n) for n in ra["sizes"]), int(ra["groups"])))
    return frozenset(out)


def reshape_hints(plan: Plan) -> frozenset:
    """(input shape, output shape) of the logical program's reshapes (KCtx.hints), once per plan and dims."""
    key = tuple(sorted(plan.dims.items()))
    got = plan.__dict__.get("_reshape_hints")
    if got is None or got[0] != key:
        of = {t.name: bind_shape(t.shape, plan.dims, "") for t in plan.logical.inputs}
        for n in plan.logical.nodes:
            of.update(zip(n.outputs, (tuple(s) for s, _ in (n.meta or {}).get("shape@dims", ()))))
        shapes = frozenset((tuple(of[n.inputs[0]]), tuple(of[n.outputs[0]])) for n in plan.logical.nodes
                           if n.op in RESHAPE_LIKE and n.inputs and n.inputs[0] in of and n.outputs[0] in of)
        got = plan.__dict__["_reshape_hints"] = (key, shapes)
    return got[1]


def laid_out(plan: Plan, b: Binding, exprs: Exprs, e: int) -> int:
    """The logical expression a binding places: its layout ops applied to ``e``."""
    env = rank0_env(plan)
    for op, attrs in b.layout:
        ra = resolve_attrs(layout_spec(op), attrs, env)
        e = build_concat_groups(exprs, e, ra) if op == CONCAT_GROUPS else exprs.mk(op, ra, [e])
    return e


def placements(plan: Plan, b: Binding, exprs: Exprs, e: int) -> tuple:
    """The binding's placement per program axis, a negative shard dim counted from the end of ``e``'s shape as
    the interpreter splits it (``Shard(-1)`` of a matrix is ``Shard(1)``: the rules compare dims as indices)."""
    from ..plan import Placement

    nd = len(exprs[e].shape)
    pls = []
    for a in plan.program_axes(b.program):
        q = b.placement[a]
        if q.kind in ("S", "Z") and q.dim < 0 and nd:
            q = Placement(q.kind, q.dim % nd) if q.dim >= -nd else q
        pls.append(q)
    return tuple(pls)


def input_facts(plan: Plan, exprs: Exprs, lexpr: Mapping[str, int]) -> dict[str, dict[str, Fact]]:
    """program -> local input name -> its fact, from the input placements."""
    out: dict[str, dict[str, Fact]] = {p: {} for p in plan.programs}
    for name in plan.logical.input_names():
        b = plan.inputs[name]
        e = laid_out(plan, b, exprs, lexpr[name])
        out[b.program][b.local] = Fact(e, placements(plan, b, exprs, e))
    return out


def output_targets(plan: Plan, exprs: Exprs, lexpr: Mapping[str, int]) -> dict[str, Fact]:
    """logical output -> the fact its local tensor must have."""
    out = {}
    for name in plan.logical.outputs:
        e = laid_out(plan, plan.outputs[name], exprs, lexpr[name])
        out[name] = Fact(e, placements(plan, plan.outputs[name], exprs, e))
    return out
