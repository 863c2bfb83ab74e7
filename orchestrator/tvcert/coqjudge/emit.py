"""Plan -> Coq term of ``Rules/IR`` (the trusted printer) and the untrusted fact search.

``translate`` maps a loaded plan onto ``JMesh.mplan`` (``Rules/IR/Mesh.v``): the mesh is the
plan's axes in mesh order (axis 0 outermost, as the interpreter distributes inputs), node ids
are positions (inputs first), shapes are the plan's declared dims, each local op becomes one
``Syntax.op`` (``GO``) or ``LayoutOps.lop`` (``GL``, see ``lops.py``) constructor and each
collective a ``PColl`` over one axis.  It refuses (returns the uncovered steps) whatever the
fragment lacks: several programs, binding layouts other than reshape / permute (those it appends to
the logical graph, one node per step, and binds the local tensor to the last), zig-zag shards, integer tensors where an op is not
exact on them (``INT_OK``), collectives over several axes, reduce_scatter other than sum, ops
without a Coq denotation.  As a cross-check of the printer, the shapes Coq's ``op_shape`` /
``coll_shape`` give (mirrored here by ``_shape``) must equal the shapes the IR infers, node by
node; the emitted file proves the same equalities in Coq (``the_shapes``).

``search`` finds the certificate: one fact ``(logical id, placements)`` per parallel node, by
the rules of ``MeshCheck.mderive`` (``Check.rule`` / ``LayoutRule.lrule`` on every axis;
collectives by ``coll_ok``), appending ZeRO's flat views as auxiliary logical nodes (``_Search``).  It is
search, not trust: Coq's ``mcheck`` re-derives every fact and the theorem
exists only when it returns true.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from ..graph import Graph
from ..ops import REGISTRY, resolve_attrs
from ..plan import Plan
from .lops import LOPS, _bin_shard, coq_lop, lop_of, lop_shape, lrule, op_key, relocal
from .terms import BIG, _nat, _num, _rat, _seq

# pointwise unary ops denoted by an uninterpreted function [Fn k]
FN_OPS = ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "silu", "relu", "abs",
          "reciprocal", "gelu")
COLLS = ("AllReduce", "AllGather", "ReduceScatter", "SliceRank")  # PColl nodes (SliceRank: Mesh.CSliceRank)
_RED = {"sum": "RSum", "avg": "RAvg", "max": "RMax"}


@dataclass(frozen=True)
class Pl:
    """A placement on one mesh axis: R, S (dim), P (reduce)."""
    kind: str
    dim: int = -1
    reduce: str = "sum"

    def coq(self) -> str:
        if self.kind == "R":
            return "Replicate"
        if self.kind == "S":
            return f"(Shard {_nat(self.dim)})"
        return f"(Partial {_RED[self.reduce]})"

    def __str__(self) -> str:
        return {"R": "Replicate", "S": f"Shard({self.dim})"}.get(self.kind, f"Partial({self.reduce})")


R_ = Pl("R")
PSUM = Pl("P", reduce="sum")
Pls = tuple  # one Pl per mesh axis


def pls_str(pls: Pls) -> str:
    return "(" + ", ".join(map(str, pls)) + ")"


@dataclass
class CNode:
    op: tuple           # ("Add",) ("Scale", Fraction) ("Fn", k) ("Const", Fraction, shape) ("MM",) ("Sum", dims)
                        # ("Transpose", d0, d1), a lops.LOPS tuple; collectives: ("AllReduce", reduce, axis)
                        # ("AllGather", dim, axis) ("ReduceScatter", dim, axis) ("SliceRank", dim, block, axis)
    args: list[int]
    name: str
    id: int = -1        # its id in the program (= its position, except in a probe translation)
    src: str | None = None  # the IR node's source tag (the search prefers a logical node with the same)
    hint: str | None = None  # a const's value as written (an axis name: the search's dedup axis first)


@dataclass
class CoqPlan:
    name: str
    mesh: list[tuple[str, int]]                  # (axis name, size), axis 0 outermost
    l_inputs: list[tuple[str, tuple[int, ...]]]
    l_nodes: list[CNode]
    p_inputs: list[tuple[str, int, Pls]]         # (local name, logical input id, placements)
    p_nodes: list[CNode]
    p_outputs: list[tuple[str, int, int, Pls]]   # (logical name, logical id, parallel id, placements)
    fns: list[str] = field(default_factory=list)  # Fn k -> op name
    l_shapes: list[tuple[int, ...]] = field(default_factory=list)
    p_shapes: list[tuple[int, ...]] = field(default_factory=list)
    p_input_ids: list[int] = field(default_factory=list)  # ids of p_inputs (positions, except in a probe)
    x_nodes: list[CNode] = field(default_factory=list)    # auxiliary logical nodes (search): MeshCheck.mcheckx

    @property
    def sizes(self) -> list[int]:
        return [p for _, p in self.mesh]


@dataclass
class Uncovered:
    where: str   # "logical" / program name / "plan"
    node: str    # node or tensor name ("" for the plan)
    op: str      # op, rule or feature name
    why: str

    def __str__(self) -> str:
        loc = f"{self.where}:{self.node}" if self.node else self.where
        return f"{loc} ({self.op}): {self.why}"


class NotCovered(Exception):
    def __init__(self, items: list[Uncovered], coverage: str = ""):
        super().__init__("; ".join(map(str, items)))
        self.items = items
        self.coverage = coverage  # how much of the plan has a Coq term (translation only)


# ----------------------------------------------------------------- shapes (mirror of Denote.op_shape)
def _bshape(a, b):
    ra, rb = list(reversed(a)), list(reversed(b))
    out = []
    for i in range(max(len(ra), len(rb))):
        if i >= len(ra):
            out.append(rb[i])
        elif i >= len(rb):
            out.append(ra[i])
        else:
            out.append(rb[i] if ra[i] == 1 else ra[i])
    return tuple(reversed(out))


def _shape(op: tuple, ss: list[tuple[int, ...]], sizes: list[int] | None = None) -> tuple[int, ...]:
    """Denote.op_shape 1 / LayoutOps.lop_shape (local ops), Mesh.coll_shape (collectives, on the axis sizes)."""
    k = op[0]
    if k in LOPS:
        return lop_shape(op, ss)
    s0 = ss[0] if ss else ()
    if k in ("Add", "Sub", "Mul", "Div"):
        return _bshape(s0, ss[1])
    if k in ("Neg", "Square", "Scale", "Fn", "AllReduce"):
        return s0
    if k == "Const":
        return tuple(op[2])
    if k == "MM":
        return (s0[0], ss[1][1])
    if k == "Sum":
        s = list(s0)
        for e in sorted(op[1], reverse=True):
            del s[e]
        return tuple(s)
    if k == "Transpose":
        s = list(s0)
        s[op[1]], s[op[2]] = s0[op[2]], s0[op[1]]
        return tuple(s)
    if k == "SliceRank":
        s = list(s0)
        s[op[1]] = op[2]
        return tuple(s)
    if k in ("AllGather", "ReduceScatter"):
        assert sizes is not None
        s = list(s0)
        p = sizes[op[2]]
        s[op[1]] = s[op[1]] * p if k == "AllGather" else s[op[1]] // p
        return tuple(s)
    raise AssertionError(k)


def _local_shape(s, pl: Pl, p: int):
    if pl.kind == "S":
        s = list(s)
        s[pl.dim] //= p
        return tuple(s)
    return tuple(s)


def _mlocal_shape(s, pls: Pls, sizes: list[int]):
    for pl, p in zip(pls, sizes):
        s = _local_shape(s, pl, p)
    return tuple(s)


LAYOUT_BIND = ("reshape", "view", "flatten", "permute")  # binding layout steps with a Coq term


def _prod(s) -> int:
    out = 1
    for x in s:
        out *= x
    return out


# ----------------------------------------------------------------- translation
def _op(n, ra: dict, in_shapes: list[tuple[int, ...]], axes: list[str], fns: list[str]) -> tuple:
    """The Coq op of an IR node, or raise ValueError(why)."""
    op = n.op
    nd = lambda d, r: d + r if d < 0 else d  # noqa: E731
    if op in ("add", "sub", "mul", "div"):
        return (op.capitalize(),)
    if op in ("neg", "square"):
        return (op.capitalize(),)
    if op == "scale":
        c = _num(ra["value"])
        if c is None:
            raise ValueError(f"scale value {ra['value']!r} is not a rational literal")
        return ("Scale", c)
    if op in FN_OPS:
        key = op + ("" if not ra else ":" + ",".join(f"{k}={v}" for k, v in sorted(ra.items())))
        if key not in fns:
            fns.append(key)
        return ("Fn", fns.index(key))
    if op == "const":
        c = _num(ra["value"])
        if c is None or ra.get("dtype", "float") != "float":
            raise ValueError("only float constants filled with one number are covered")
        return ("Const", c, tuple(ra.get("shape") or ()))
    if op == "matmul":
        if len(in_shapes[0]) == 2 and len(in_shapes[1]) == 2:
            return ("MM",)
        return _bmm_einsum(in_shapes)
    if op == "sum":
        if ra.get("keepdim"):
            return lop_of(op, ra, in_shapes, fns)  # LayoutOps' Reduce RdSum with keepdim
        r = len(in_shapes[0])
        dims = [nd(int(d), r) for d in ra["dims"]]
        if len(set(dims)) != len(dims):
            raise ValueError("duplicate dims")
        return ("Sum", tuple(dims))
    if op == "transpose":
        r = len(in_shapes[0])
        return ("Transpose", nd(int(ra["dim0"]), r), nd(int(ra["dim1"]), r))
    if op not in ("all_reduce", "all_gather", "reduce_scatter"):
        return lop_of(op, ra, in_shapes, fns)
    ax = ra["axis"]
    ax = (ax,) if isinstance(ax, str) else tuple(ax)
    if len(ax) != 1 or ax[0] not in axes:
        raise ValueError(f"collective over {list(ax)}: only collectives over one mesh axis are covered")
    k = axes.index(ax[0])
    if op == "all_reduce":
        return ("AllReduce", ra.get("reduce", "sum"), k)
    if op == "reduce_scatter" and ra.get("reduce", "sum") != "sum":
        raise ValueError(f"reduce_scatter({ra.get('reduce')}) is not covered (sum only)")
    return ("AllGather" if op == "all_gather" else "ReduceScatter", nd(int(ra["dim"]), len(in_shapes[0])), k)


# Integer / boolean tensors are field values (LayoutOps.v's header): an op may read or produce one only where
# its denotation is exact on integers.  op -> (operand positions that may be integer, result may be integer).
_INT_LAYOUT = ("reshape", "view", "flatten", "permute", "unsqueeze", "squeeze", "expand", "slice", "concat")
INT_OK: dict[str, tuple[tuple[int, ...] | None, bool]] = {
    "iota": ((), True), "cast": ((0,), False), "one_hot": ((0,), False), "masked_fill": ((1,), False),
    "where": ((0,), False), **{c: (None, True) for c in ("eq", "ne", "lt", "le", "gt", "ge")},
    **{op: (None, True) for op in _INT_LAYOUT}}


def _int_ok(n, inferred: dict) -> bool:
    """Every integer operand / result of node n is one its Coq op denotes exactly (None: any operand)."""
    dt = lambda x: inferred.get(x, ((), "float"))[1]  # noqa: E731
    pos, out = INT_OK.get(n.op, ((), False))
    if dt(n.outputs[0]) != "float" and not out:
        return False
    return all(dt(x) == "float" or pos is None or j in pos for j, x in enumerate(n.inputs))


def _bmm_einsum(in_shapes) -> tuple:
    """torch.matmul of [B.., m, k] @ [k, n] or @ [B.., k, n] (same batch dims) as LayoutOps' Einsum: letters
    0..nb-1 the batch dims, nb = m, nb+1 = k, nb+2 = n (raise ValueError for other operand ranks)."""
    ra, rb = len(in_shapes[0]), len(in_shapes[1])
    nb = ra - 2
    if ra < 3 or rb not in (2, ra) or (rb == ra and tuple(in_shapes[0][:nb]) != tuple(in_shapes[1][:nb])):
        raise ValueError("matmul is covered for 2-D operands and for [B.., m, k] @ [k, n] / [B.., k, n] "
                         "(no broadcast batch dims)")
    bt = tuple(range(nb))
    rhs = (bt if rb == ra else ()) + (nb + 1, nb + 2)
    return ("Einsum", (bt + (nb, nb + 1), rhs), bt + (nb, nb + 2))


def _mentions_rank(attrs: Any) -> bool:
    return "rank." in repr(attrs)


def _slice_rank(n, env: dict, axes: list[str], sizes: list[int], in_shapes) -> tuple:
    """A slice whose bounds depend on one axis' rank r as ``Mesh.CSliceRank d m``: at every r < p the
    resolved attrs must be ``x[r*m : r*m+m]`` along one dim d (or raise ValueError(why))."""
    names = sorted(set(re.findall(r"rank\.([A-Za-z_][A-Za-z0-9_]*)", repr(n.attrs))))
    if len(names) != 1 or names[0] not in axes:
        raise ValueError(f"a slice whose bounds depend on the ranks of {names} (one mesh axis is covered)")
    k = axes.index(names[0])
    spec = REGISTRY[n.op]
    rows = [dict(resolve_attrs(spec, n.attrs, {**env, f"rank.{names[0]}": r})) for r in range(sizes[k])]
    r0 = rows[0]
    rank = len(in_shapes[0])
    d = r0["dim"] + rank if r0["dim"] < 0 else r0["dim"]
    m = r0["end"] - r0["start"]
    for r, ra in enumerate(rows):
        dr = ra["dim"] + rank if ra["dim"] < 0 else ra["dim"]
        if ra.get("step", 1) != 1 or dr != d or ra["start"] != r * m or ra["end"] != r * m + m:
            raise ValueError(f"rank-dependent slice bounds at {names[0]} = {r} are not block {r} of size {m} "
                             f"along one dim")
    return ("SliceRank", d, m, k)


def _hole(probe: bool, name: str, ids: dict, shapes: list, inferred: dict) -> None:
    """Probe mode (diagnostics only, never emitted): an uncovered value gets an id and the IR's shape, so
    the steps that read it are examined too."""
    if probe and name in inferred:
        ids[name] = len(shapes)
        shapes.append(tuple(inferred[name][0]))


def _graph(g: Graph, where: str, env: dict, axes: list[str], sizes: list[int], fns: list[str],
           ids: dict[str, int], shapes: list, inferred: dict, unc: list[Uncovered], probe: bool = False) -> list[CNode]:
    out = []
    for n in g.nodes:
        name = n.outputs[0] if n.outputs else n.path
        if len(n.outputs) != 1:
            unc.append(Uncovered(where, name, n.op, "ops with several outputs are not covered"))
            for x in n.outputs:
                _hole(probe, x, ids, shapes, inferred)
            continue
        if any(x not in ids for x in n.inputs):
            continue  # follows from an uncovered step already listed
        in_shapes = [shapes[ids[x]] for x in n.inputs]
        if _mentions_rank(n.attrs) and (n.op != "slice" or where == "logical"):
            unc.append(Uncovered(where, name, n.op, "rank-dependent attributes are not covered"))
            _hole(probe, name, ids, shapes, inferred)
            continue
        spec = REGISTRY[n.op]
        try:
            if _mentions_rank(n.attrs):
                op = _slice_rank(n, env, axes, sizes, in_shapes)
            else:
                op = _op(n, dict(resolve_attrs(spec, n.attrs, env)), in_shapes, axes, fns)
        except ValueError as exc:
            unc.append(Uncovered(where, name, n.op, str(exc)))
            _hole(probe, name, ids, shapes, inferred)
            continue
        if where == "logical" and op[0] in COLLS:
            unc.append(Uncovered(where, name, n.op, "a collective in the logical graph"))
            _hole(probe, name, ids, shapes, inferred)
            continue
        if not _int_ok(n, inferred):
            unc.append(Uncovered(where, name, n.op, "integer tensors are not covered here"))
            _hole(probe, name, ids, shapes, inferred)
            continue
        s = _shape(op, in_shapes, sizes)
        if name in inferred and tuple(inferred[name][0]) != s:
            unc.append(Uncovered(where, name, n.op, f"Coq shape {list(s)} differs from the IR's "
                                                  f"{list(inferred[name][0])}"))
            _hole(probe, name, ids, shapes, inferred)
            continue
        ids[name] = len(shapes)
        shapes.append(s)
        out.append(CNode(op, [ids[x] for x in n.inputs], name, ids[name], n.src,
                         str(n.attrs.get("value")) if op[0] == "Const" else None))
    return out


def _placement(b, axes: list[str], shape: tuple[int, ...]) -> Pls:
    """A binding's placements on the mesh axes, on the shape after its layout (``shape``)."""
    out = []
    for axis in axes:
        pl = b.placement.get(axis)
        if pl is None or pl.kind == "R":
            out.append(R_)
        elif pl.kind == "S":
            out.append(Pl("S", pl.dim + len(shape) if pl.dim < 0 else pl.dim))
        elif pl.kind == "P":
            out.append(Pl("P", reduce=pl.reduce))
        else:
            raise ValueError(f"placement {pl} is not covered")
    return tuple(out)


def translate(plan: Plan, probe: bool = False) -> CoqPlan:
    """The plan as a Coq IR term (raises NotCovered with every step outside the fragment).

    ``probe``: also examine the steps that read an uncovered value (for the diagnostics of
    ``probe_uncovered``; a probe translation is never printed)."""
    unc: list[Uncovered] = []
    mesh = plan.mesh()
    axes, sizes = list(mesh), list(mesh.values())
    if len(plan.programs) != 1:
        raise NotCovered([Uncovered("plan", "", "programs", f"{len(plan.programs)} programs (pipeline "
                                                            "stages); the Coq judge covers one")])
    (pname, prog), = plan.programs.items()
    if plan.program_axes(pname) != axes:
        raise NotCovered([Uncovered("plan", "", "programs", "a program fixed to a pipeline stage is not covered")])
    if not axes or any(p <= 0 for p in sizes):
        raise NotCovered([Uncovered("plan", "", "mesh", "the mesh needs at least one axis, every size positive")])
    env = dict(plan.dims)
    fns: list[str] = []
    linf = plan.logical.infer(env, mesh, key="coq_shape")
    penv = dict(env)
    for a in axes:
        penv[f"rank.{a}"] = 0
    pinf = prog.infer(penv, mesh, key="coq_shape")

    l_ids: dict[str, int] = {}
    l_shapes: list = []
    l_inputs = []
    for t in plan.logical.inputs:
        s, _ = linf[t.name]   # an integer input is a field value too (LayoutOps.v)
        l_ids[t.name] = len(l_shapes)
        l_shapes.append(tuple(s))
        l_inputs.append((t.name, tuple(s)))
    l_nodes = _graph(plan.logical, "logical", env, axes, sizes, fns, l_ids, l_shapes, linf, unc, probe)
    lay_ids: dict[tuple, int] = {}

    def laid(b, lid: int) -> int:
        """The logical id of binding b's value: its logical tensor, or the layout nodes appended for it
        (``Mesh.mp_inputs``: a local input / output is the piece of a layout of its logical tensor)."""
        for j, (op, attrs) in enumerate(b.layout):
            if op not in LAYOUT_BIND:
                raise ValueError(f"layout step {op!r} is not covered (reshape / view / flatten / permute are)")
            lop = lop_of(op, dict(resolve_attrs(REGISTRY[op], attrs, env)), [l_shapes[lid]], fns)
            key = (lop, lid)
            if key not in lay_ids:
                s = _shape(lop, [l_shapes[lid]])
                if lop[0] == "Reshape" and _prod(s) != _prod(l_shapes[lid]):
                    raise ValueError(f"layout step {j} reshapes {list(l_shapes[lid])} to {list(s)}")
                lay_ids[key] = len(l_shapes)
                l_nodes.append(CNode(lop, [lid], f"binding layout of {b.logical}: {op}", len(l_shapes), "layout"))
                l_shapes.append(s)
            lid = lay_ids[key]
        return lid

    p_ids: dict[str, int] = {}
    p_shapes: list = []
    p_inputs = []
    p_input_ids: list[int] = []
    by_local = {b.local: b for b in plan.inputs.values()}
    for t in prog.inputs:
        b = by_local.get(t.name)
        if b is None or b.logical not in l_ids:
            unc.append(Uncovered(pname, t.name, "input", "not bound to a covered logical input"))
            _hole(probe, t.name, p_ids, p_shapes, pinf)
            continue
        try:
            lid = laid(b, l_ids[b.logical])
            pls = _placement(b, axes, l_shapes[lid])
        except ValueError as exc:
            unc.append(Uncovered(pname, t.name, "input", str(exc)))
            _hole(probe, t.name, p_ids, p_shapes, pinf)
            continue
        ls = _mlocal_shape(l_shapes[lid], pls, sizes)
        if tuple(pinf[t.name][0]) != ls:
            unc.append(Uncovered(pname, t.name, "input", f"declared local shape {list(pinf[t.name][0])} is not "
                                                       f"the placements' {list(ls)}"))
            _hole(probe, t.name, p_ids, p_shapes, pinf)
            continue
        p_ids[t.name] = len(p_shapes)
        p_shapes.append(ls)
        p_inputs.append((t.name, lid, pls))
        p_input_ids.append(p_ids[t.name])
    p_nodes = _graph(prog, pname, penv, axes, sizes, fns, p_ids, p_shapes, pinf, unc, probe)

    p_outputs = []
    for lname in plan.logical.outputs:
        if lname not in plan.outputs:
            unc.append(Uncovered("plan", lname, "output", "logical output without a binding"))
    for lname, b in plan.outputs.items():
        if lname not in l_ids or b.local not in p_ids:
            if not unc:
                unc.append(Uncovered(pname, b.local, "output", f"output {lname!r} is outside the covered fragment"))
            continue
        try:
            lid = laid(b, l_ids[lname])
            pls = _placement(b, axes, l_shapes[lid])
        except ValueError as exc:
            unc.append(Uncovered(pname, b.local, "output", str(exc)))
            continue
        p_outputs.append((lname, lid, p_ids[b.local], pls))
    cp = CoqPlan(plan.name, list(mesh.items()), l_inputs, l_nodes, p_inputs, p_nodes, p_outputs, fns,
                 l_shapes, p_shapes, p_input_ids)
    if unc or probe:
        nl, np_ = len(plan.logical.nodes), len(prog.nodes)
        exc = NotCovered(unc, f"{len(l_nodes)} of {nl} logical and {len(p_nodes)} of {np_} program nodes have a "
                              "Coq term; the others are listed or read a listed step")
        exc.partial = cp if probe else None  # diagnostics only (probe_rules): never printed
        raise exc
    return cp


# ----------------------------------------------------------------- fact search (mirror of Check.rule)
def _shard_ok(p, s, d) -> bool:
    return d < len(s) and (s[d] // p) * p == s[d]


def _rule(op: tuple, ss: list, pls: list[Pl], p: int) -> Pl | None:
    """A placement Check.rule accepts for the result, or None."""
    k = op[0]
    so = _shape(op, ss)
    if all(x.kind == "R" for x in pls):
        return R_
    if k in LOPS:
        c = lrule(op, ss, pls, p, Pl)
        return c if c is not None and (c.kind != "S" or _shard_ok(p, so, c.dim)) else None
    cands: list[Pl] = []
    if len(pls) == 1:
        a = pls[0]
        if k in ("Neg", "Scale", "Square", "Fn") and a.kind == "S":
            cands.append(a)
        if k in ("Neg", "Scale") and a == PSUM:
            cands.append(PSUM)
        if k == "Transpose" and a.kind == "S":
            d0, d1 = op[1], op[2]
            d = d1 if a.dim == d0 else d0 if a.dim == d1 else a.dim
            cands.append(Pl("S", d))
        if k == "Sum" and (a.kind == "S" or a == PSUM) and len(set(op[1])) == len(op[1]) \
                and all(e < len(ss[0]) for e in op[1]):
            pl = a   # Check.sum_pl over the dims largest first
            for e in sorted(op[1], reverse=True):
                if pl.kind == "S":
                    pl = PSUM if e == pl.dim else Pl("S", pl.dim - 1 if e < pl.dim else pl.dim)
            cands.append(pl)
    elif len(pls) == 2:
        a, b = pls
        if k in ("Add", "Sub", "Mul", "Div"):
            for j, x in enumerate((a, b)):
                if x.kind == "S":
                    d = x.dim + len(so) - len(ss[j])
                    if _bin_shard(so, ss[0], a, d) and _bin_shard(so, ss[1], b, d):
                        cands.append(Pl("S", d))
            if k in ("Add", "Sub") and a == PSUM and b == PSUM and tuple(ss[0]) == so and tuple(ss[1]) == so:
                cands.append(PSUM)
            if k in ("Mul", "Div") and a == PSUM and b.kind == "R" or k == "Mul" and a.kind == "R" and b == PSUM:
                cands.append(PSUM)  # SoundOps.binary_partial_rep / binary_rep_partial
        if k == "MM" and len(ss[0]) == 2 and len(ss[1]) == 2 and ss[0][1] == ss[1][0]:
            if a.kind == "R" and b == Pl("S", 1):
                cands.append(Pl("S", 1))
            if a == Pl("S", 0) and b.kind == "R":
                cands.append(Pl("S", 0))
            if a == Pl("S", 1) and b == Pl("S", 0):
                cands.append(PSUM)
            if (a == PSUM and b.kind == "R") or (a.kind == "R" and b == PSUM):
                cands.append(PSUM)
    for c in cands:
        if c.kind != "S" or _shard_ok(p, so, c.dim):
            return c
    return None


def _mpl_ok(s, pls: Pls, sizes: list[int]) -> bool:
    """Mirror of MeshCheck.mpl_ok."""
    if len(pls) != len(sizes):
        return False
    for pl, p in zip(pls, sizes):
        if pl.kind == "S" and not _shard_ok(p, s, pl.dim):
            return False
        s = _local_shape(s, pl, p)
    return True


def _mrule(op: tuple, ss: list, plss: list[Pls], sizes: list[int]) -> Pls | None:
    """Mirror of MeshCheck.mrule: Check.rule on every axis, operand shapes local to the outer axes, the op
    at the outer axes' local shapes (``relocal``)."""
    out = []
    for k, p in enumerate(sizes):
        hs = [x[k] for x in plss]
        c = _rule(op, ss, hs, p)
        if c is None:
            return None
        out.append(c)
        op = relocal(op, _local_shape(_shape(op, ss), c, p))
        ss = [_local_shape(s, h, p) for s, h in zip(ss, hs)]
    return tuple(out)


def _coll(op: tuple, pls: Pls, s, sizes: list[int]) -> tuple[Pls | None, str]:
    """Mirror of MeshCheck.coll_ok: the result's placements, or None and why."""
    kind, k = op[0], op[-1]
    need = (Pl("P", reduce=op[1]) if kind == "AllReduce" else Pl("S", op[1]) if kind == "AllGather" else
            R_ if kind == "SliceRank" else PSUM)
    name = _ir_name(op)
    if pls[k] != need:
        return None, f"{name} over axis {k} of a {pls_str(pls)} operand (needs {need} on axis {k})"
    for pl in pls[k + 1:]:
        partial_ok = pl.kind == "P" and pl.reduce != "max" and op[:2] != ("AllReduce", "max")
        if not (pl.kind == "R" or partial_ok or (pl.kind == "S" and (kind == "AllReduce" or pl.dim != op[1]))):
            return None, (f"{name} over axis {k} of a {pls_str(pls)} operand: an axis inside it is {pl}, "
                          "which the Coq checker does not commute with the collective")
    out = pls[:k] + ((Pl("S", op[1]) if kind in ("ReduceScatter", "SliceRank") else R_),) + pls[k + 1:]
    if not _mpl_ok(s, out, sizes):
        return None, f"{name}: result placements {pls_str(out)} do not divide the shape {list(s)}"
    if kind == "SliceRank" and op[2] != _mlocal_shape(s, pls, sizes)[op[1]] // sizes[k]:
        return None, f"{name}: block size {op[2]} is not the shard size of dim {op[1]} over axis {k}"
    return out, ""


def _derive(S: "_Search", n: CNode, af: list) -> tuple[tuple[int, Pls] | None, str]:
    """The fact mderive accepts for parallel node n whose operands hold the facts af, or None and why."""
    cp, sizes = S.cp, S.cp.sizes
    if n.op[0] in COLLS:
        out, why = _coll(n.op, af[0][1], cp.l_shapes[af[0][0]], sizes)
        return ((af[0][0], out) if out is not None else None), why
    ni = len(cp.l_inputs)
    ids = [x[0] for x in af]
    cands = S.by_key.get((op_key(n.op), tuple(S.canon.get(x, x) for x in ids)), [])
    # a logical graph may compute one value twice (two iotas of one size): prefer the node of the same name,
    # so that the steps reading it find theirs (any choice is re-checked by Coq)
    cands = sorted(cands, key=lambda c: (cp.l_nodes[c - ni].name != n.name,
                                         n.src is None or cp.l_nodes[c - ni].src != n.src))
    why = ""
    for l in cands:
        lop = cp.l_nodes[l - ni].op
        pls = _mrule(lop, [cp.l_shapes[x] for x in ids], [x[1] for x in af], sizes)
        if pls is None or not _mpl_ok(cp.l_shapes[l], pls, sizes):
            why = why or "no covered rule for operand placements " + ", ".join(pls_str(x[1]) for x in af)
        elif relocal(lop, _mlocal_shape(cp.l_shapes[l], pls, sizes)) != n.op:
            why = why or (f"the local op's target shape {list(n.op[1])} is not the local shape "
                          f"{list(_mlocal_shape(cp.l_shapes[l], pls, sizes))} of the result held as {pls_str(pls)}")
        else:
            return (l, pls), ""
    if not cands:
        f = S.commute(n, af) or S.view_step(n, af) or _dedup(cp, n, af)
        if f:
            return f, ""
        why = "no logical node applies this op to the logical values of its operands"
    return None, why


EW = {"Add": 2, "Sub": 2, "Mul": 2, "Div": 2, "Neg": 1, "Square": 1, "Scale": 1, "Fn": 1, "AddScalar": 1,
      "CastF": 1}  # MeshCheck.ew_arity


class _Search:
    """The search's logical graph: the plan's nodes, then the auxiliary ones the certificate appends
    (``MeshCheck.mcheckx``'s xs): scalar consts (``_augment``) and ZeRO's flat views of logical values
    (layout ops with no logical counterpart, ``view_step``; elementwise ops on them, ``commute``).
    ``canon`` maps a view that is a logical value by ``MeshCheck.veq`` to that value."""

    def __init__(self, cp: CoqPlan):
        self.cp = _augment(cp)
        self.by_key = _by_key(self.cp)
        self.ni = len(cp.l_inputs)
        self.exact = {(m.op, tuple(m.args)): self.ni + j for j, m in enumerate(self.cp.l_nodes)}
        self.canon: dict[int, int] = {}

    def node(self, l: int) -> CNode | None:
        return self.cp.l_nodes[l - self.ni] if l >= self.ni else None

    def shape(self, l: int) -> tuple[int, ...]:
        return tuple(self.cp.l_shapes[l])

    def add(self, op: tuple, args: list[int]) -> int:
        """The node computing op from args (appended as an auxiliary node if the graph has none)."""
        key = (op, tuple(args))
        if key in self.exact:
            return self.exact[key]
        l = len(self.cp.l_shapes)
        m = CNode(op, list(args), f"flat view: {_ir_name(op)} of {list(args)}", l, "aux")
        self.cp.l_nodes.append(m)
        self.cp.l_shapes.append(_shape(op, [self.shape(a) for a in args]))
        self.cp.x_nodes.append(m)
        self.exact[key] = l
        self.by_key.setdefault((op_key(op), tuple(args)), []).append(l)
        c = self._veq_base(l)
        if c is not None:
            self.canon[l] = c
        return l

    def _rr_base(self, a: int) -> int | None:
        """Mirror of MeshCheck.rr_back: a = reshape(reshape(b, s1), shape of b) -> b."""
        n = self.node(a)
        m = self.node(n.args[0]) if n and n.op[0] == "Reshape" and len(n.args) == 1 else None
        if m and m.op[0] == "Reshape" and len(m.args) == 1:
            b = m.args[0]
            if tuple(n.op[1]) == self.shape(b) and _prod(m.op[1]) == _prod(self.shape(b)):
                return b
        return None

    def _veq_base(self, a: int) -> int | None:
        """The logical value MeshCheck.veq says a is (rr_back, pp_back, sum_flat), or None."""
        b = self._rr_base(a)
        if b is not None:
            return b
        n = self.node(a)
        if n.op == ("Permute", (1, 0)) and len(n.args) == 1:
            a3 = self._rr_base(n.args[0])
            m = self.node(a3) if a3 is not None else None
            if m and m.op == ("Permute", (1, 0)) and len(m.args) == 1 and len(self.shape(m.args[0])) == 2:
                return m.args[0]
        if n.op == ("Sum", (0,)) and len(n.args) == 1:
            a1 = self.node(n.args[0])
            if a1 and a1.op[0] == "Reshape" and len(a1.args) == 1:
                d = a1.args[0]
                pm = self.node(d)
                if pm and pm.op == ("Permute", (1, 0)) and len(pm.args) == 1 and len(self.shape(pm.args[0])) == 2:
                    d = pm.args[0]
                sd = self.shape(d)
                if len(sd) in (1, 2) and tuple(a1.op[1]) == (_prod(sd),):
                    return self.exact.get((("Sum", tuple(range(len(sd)))), (d,)))
        return None

    def _commute(self, op: tuple, xs: list[int], k: int) -> int | None:
        """Mirror of MeshCheck.comm_ok: the node that is op of xs, through up to k layout ops of the
        non-scalar xs (appended), or None."""
        l = self.exact.get((op, tuple(xs)))
        if l is not None or k == 0:
            return l
        big = [x for x in xs if self.shape(x) != ()]
        n0 = self.node(big[0]) if big else None
        if n0 is None or n0.op[0] not in ("Reshape", "Permute") or len(n0.args) != 1:
            return None
        lo, s = n0.op, self.shape(n0.args[0])
        sub = []
        for x in xs:
            m = self.node(x)
            if self.shape(x) == ():
                sub.append(x)
            elif m is not None and m.op == lo and len(m.args) == 1 and self.shape(m.args[0]) == s:
                sub.append(m.args[0])
            else:
                return None
        ok = _prod(lo[1]) == _prod(s) if lo[0] == "Reshape" else sorted(lo[1]) == list(range(len(s)))
        l2 = self._commute(op, sub, k - 1) if ok and s != () else None
        return self.add(lo, [l2]) if l2 is not None and self.shape(l2) == s else None

    def commute(self, n: CNode, af: list) -> tuple[int, Pls] | None:
        """An elementwise op of flat views: the flat view of the logical op's result."""
        if EW.get(n.op[0]) != len(af):
            return None
        ids = [x[0] for x in af]
        pls = _mrule(n.op, [self.shape(x) for x in ids], [x[1] for x in af], self.cp.sizes)
        if pls is None:
            return None
        l = self._commute(n.op, ids, 4)
        return (l, pls) if l is not None and _mpl_ok(self.shape(l), pls, self.cp.sizes) else None

    def view_step(self, n: CNode, af: list) -> tuple[int, Pls] | None:
        """A program reshape / permute / sum with no logical counterpart: that op of the operand's
        logical value (a flat view, appended); a reshape's logical target is the whole flat size or the
        shape the operand's view came from."""
        if len(af) != 1 or n.op[0] not in ("Reshape", "Permute", "Sum"):
            return None
        (a, apls), = af
        ops = [n.op]
        if n.op[0] == "Reshape":
            m = self.node(a)
            ops = ([("Reshape", (_prod(self.shape(a)),))] if len(n.op[1]) == 1 else []) + \
                  ([("Reshape", self.shape(m.args[0]))] if m and m.op[0] == "Reshape" and len(m.args) == 1 else [])
        sizes = self.cp.sizes
        for op in ops:
            pls = _mrule(op, [self.shape(a)], [apls], sizes)
            so = _shape(op, [self.shape(a)])
            if pls is None or not _mpl_ok(so, pls, sizes) or relocal(op, _mlocal_shape(so, pls, sizes)) != n.op:
                continue
            return self.add(op, [a]), pls
        return None


def _dedup(cp: CoqPlan, n: CNode, af: list) -> tuple[int, Pls] | None:
    """Mirror of MeshCheck.dedup_ok: x / p with x replicated on an axis of size p and p a logical (or
    auxiliary) replicated scalar const: x's logical value as a Partial(sum) on that axis."""
    ni, sizes = len(cp.l_inputs), cp.sizes
    if n.op != ("Div",) or len(af) != 2 or af[1][0] < ni:
        return None
    (l1, pls1), (lk, plsk) = af
    c = cp.l_nodes[lk - ni]
    if c.args or c.op[0] != "Const" or tuple(c.op[2]) != () or any(x != R_ for x in plsk) or len(pls1) != len(sizes):
        return None
    axes = [a for a, _ in cp.mesh]
    for k in sorted(range(len(sizes)), key=lambda k: axes[k] != c.hint):
        if pls1[k] == R_ and 0 < sizes[k] == c.op[1]:
            return l1, pls1[:k] + (PSUM,) + pls1[k + 1:]
    return None


def _augment(cp: CoqPlan) -> CoqPlan:
    """cp with the auxiliary logical consts appended (the program's scalar consts equal to an axis size that
    no logical node computes), as MeshCheck.mcheckx checks it; sets cp.x_nodes."""
    have = {(op_key(n.op), tuple(n.args)) for n in cp.l_nodes}
    xs: list[CNode] = []
    for n in cp.p_nodes:
        if (n.op[0] == "Const" and not n.args and tuple(n.op[2]) == () and n.op[1] in cp.sizes and n.op[1] > 0
                and (n.op, ()) not in have and all(x.op != n.op for x in xs)):
            xs.append(CNode(n.op, [], f"aux const {n.op[1]}", len(cp.l_inputs) + len(cp.l_nodes) + len(xs),
                            hint=n.hint))
    cp.x_nodes = xs
    return replace(cp, l_nodes=cp.l_nodes + xs, l_shapes=cp.l_shapes + [()] * len(xs))


def _by_key(cp: CoqPlan) -> dict:
    ni = len(cp.l_inputs)
    by_key: dict[tuple, list[int]] = {}
    for j, n in enumerate(cp.l_nodes):
        by_key.setdefault((op_key(n.op), tuple(n.args)), []).append(ni + j)
    return by_key


def search(cp: CoqPlan) -> list[tuple[int, Pls]]:
    """The certificate: one fact per parallel node (raises NotCovered at the first node without one);
    sets cp.x_nodes, the auxiliary logical consts the facts may name."""
    S = _Search(cp)
    facts: list[tuple[int, Pls]] = [(li, pls) for _, li, pls in cp.p_inputs]
    cert = []
    for n in cp.p_nodes:
        f, why = _derive(S, n, [facts[a] for a in n.args])
        if f is None:
            raise NotCovered([Uncovered("parallel", n.name, _ir_name(n.op), why)])
        facts.append(f)
        cert.append(f)
    bad = [Uncovered("parallel", cp.p_nodes[po - len(cp.p_inputs)].name if po >= len(cp.p_inputs) else
                     cp.p_inputs[po][0], "output",
                     f"holds logical node {facts[po][0]} as {pls_str(facts[po][1])}, declared logical {lname!r} "
                     f"as {pls_str(pls)}")
           for lname, lo, po, pls in cp.p_outputs if facts[po] != (lo, pls)]
    if bad:
        raise NotCovered(bad)
    return cert


def probe_facts(plan: Plan) -> tuple[dict[str, tuple[int, Pls]], list[Uncovered], CoqPlan | None]:
    """Diagnostics: the fact the search finds for each program node (by name) over the probe translation,
    the nodes without one whose operands have facts (a node reading a node without a fact is skipped),
    and the probe translation."""
    try:
        cp = translate(plan, probe=True)
    except NotCovered as exc:
        cp = getattr(exc, "partial", None)
    if cp is None:
        return {}, [], None
    S = _Search(cp)
    cp = S.cp
    facts = {i: (li, pls) for i, (_, li, pls) in zip(cp.p_input_ids, cp.p_inputs)}
    named, missing = {}, []
    for n in cp.p_nodes:
        if all(a in facts for a in n.args):
            f, why = _derive(S, n, [facts[a] for a in n.args])
            if f is None:
                missing.append(Uncovered("parallel", n.name, _ir_name(n.op), why))
            else:
                facts[n.id] = named[n.name] = f
    return named, missing, cp


def probe_rules(plan: Plan) -> tuple[int, int, list[Uncovered]]:
    """Diagnostics: (parallel nodes with a fact, program nodes, the nodes without one whose operands have
    facts); see ``probe_facts``."""
    named, missing, cp = probe_facts(plan)
    if cp is None:
        return 0, 0, []
    return len(named), len(plan.programs[next(iter(plan.programs))].nodes), missing


def _ir_name(op: tuple) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", op[0]).lower()


# ----------------------------------------------------------------- printing
def coq_op(op: tuple) -> str:
    k = op[0]
    if k in LOPS:
        return coq_lop(op)
    if k in ("Add", "Sub", "Mul", "Div", "Neg", "Square", "MM"):
        return k
    if k == "Scale":
        return f"(Scale {_rat(op[1])})"
    if k == "Fn":
        return f"(Fn {_nat(op[1])})"
    if k == "Const":
        return f"(Const {_rat(op[1])} {_seq(op[2])})"
    if k == "Sum":
        return f"(Sum {_seq(op[1])})"
    if k == "Transpose":
        return f"(Transpose {_nat(op[1])} {_nat(op[2])})"
    if k == "AllReduce":
        return f"(CAllReduce {_RED[op[1]]})"
    if k == "AllGather":
        return f"(CAllGather {_nat(op[1])})"
    if k == "ReduceScatter":
        return f"(CReduceScatter {_nat(op[1])})"
    if k == "SliceRank":
        return f"(CSliceRank {_nat(op[1])} {_nat(op[2])})"
    raise AssertionError(k)


def _pnode(n: CNode) -> str:
    if n.op[0] in COLLS:
        return f"PColl {coq_op(n.op)} {_nat(n.op[-1])} {_nat(n.args[0])}"
    return f"PLocal {coq_gop(n.op)} {_seq(n.args)}"


def coq_gop(op: tuple) -> str:
    """A local op as a ``JMesh.gop``."""
    return f"(GL {coq_op(op)})" if op[0] in LOPS else f"(GO {coq_op(op)})"


def _rows(rows: list[str]) -> str:
    return "[::\n" + ";\n".join(rows) + "\n  ]" if rows else "[::]"


def _cmt(s: str) -> str:
    return s.replace("(*", "( *").replace("*)", "* )")


def coq_pls(pls: Pls) -> str:
    return _seq([pl.coq() for pl in pls])


_BIG_NAT = re.compile(r"\(Pos\.to_nat (\d+)%positive\)")


def render(cp: CoqPlan, cert: list[tuple[int, Pls]], header: str = "") -> str:
    ni, pi = len(cp.l_inputs), len(cp.p_inputs)
    lin = [f"    {_seq(s)}  (* {i}: {_cmt(n)} *)" for i, (n, s) in enumerate(cp.l_inputs)]
    lno = [f"    GNode {coq_gop(n.op)} {_seq(n.args)}  (* {ni + i}: {_cmt(n.name)} *)" for i, n in enumerate(cp.l_nodes)]
    pin = [f"    ({_nat(li)}, {coq_pls(pls)})  (* {i}: {_cmt(n)} *)" for i, (n, li, pls) in enumerate(cp.p_inputs)]
    pno = [f"    {_pnode(n)}  (* {pi + i}: {_cmt(n.name)} *)" for i, n in enumerate(cp.p_nodes)]
    pout = [f"    ({_nat(lo)}, {_nat(po)}, {coq_pls(pls)})  (* {_cmt(n)} *)" for n, lo, po, pls in cp.p_outputs]
    facts = [f"    ({_nat(l)}, {coq_pls(pls)})  (* {pi + i}: {_cmt(cp.p_nodes[i].name)} *)" for i, (l, pls) in enumerate(cert)]
    nl = ni + len(cp.l_nodes)
    xno = [f"    GNode {coq_gop(n.op)} {_seq(n.args)}  (* {nl + i}: {_cmt(n.name)} *)" for i, n in enumerate(cp.x_nodes)]
    fns = "".join(f"   Fn {k} = {_cmt(name)}\n" for k, name in enumerate(cp.fns))
    axes = ", ".join(f"{_cmt(a)} = {p}" for a, p in cp.mesh)
    plan = f"""{{|
  mesh := {_seq(cp.sizes)};
  ml_inputs := {_rows(lin)};
  ml_nodes := {_rows(lno)};
  mp_inputs := {_rows(pin)};
  mp_nodes := {_rows(pno)};
  mp_outputs := {_rows(pout)}
|}}"""
    cert, xs = _rows(facts), _rows(xno)
    big = [int(m) for s in (plan, cert, xs) for m in _BIG_NAT.findall(s)]
    k = max(big, default=0)
    at = lambda s: s.replace("(Pos.to_nat ", "(pn ")  # noqa: E731
    return f"""(* Generated by tvcert (coqjudge) for plan {_cmt(cp.name)}.{(' ' + _cmt(header)) if header else ''}
   Mesh axes (axis 0 outermost): {axes}.  Uninterpreted pointwise functions:
{fns or '   (none)' + chr(10)}   The theorem quantifies over every interpretation of them (Rules/IR/Mesh.v). *)
From mathcomp Require Import all_ssreflect.
From Coq Require Import BinPosDef.  (* Pos.to_nat: large numbers are written in binary *)
From TVCert Require Import IR.Syntax IR.Denote IR.LayoutOps IR.Check IR.Mesh IR.MeshCheck IR.MeshSound IR.NatTable.
Import JSyntax JDenote JLayout JCheck JMesh JMeshCheck JMeshSound JNatTable.

(* The plan, its numbers >= {BIG} written [pn p] (p in binary): [the_plan] reads them with [Pos.to_nat]. *)
Definition the_plan_at (pn : positive -> nat) : mplan := {at(plan)}.
Definition the_plan : mplan := the_plan_at Pos.to_nat.

(* The certificate and the check read the numbers from [fast_nat k], k = {k} (= [Pos.to_nat], [NatTable.fast_natE]):
   one shared table instead of one unary chain per literal. *)
Definition the_nat : positive -> nat := fast_nat {_nat(k)}.
Definition the_cert_at (pn : positive -> nat) : seq mfact := {at(cert)}.
Definition the_cert : seq mfact := the_cert_at the_nat.

(* Printer check: the shapes Coq's denotation gives every node are the shapes tvcert's IR infers. *)
Definition the_lshapes : seq (seq nat) := {_seq([_seq(x) for x in cp.l_shapes])}.
Definition the_pshapes : seq (seq nat) := {_seq([_seq(x) for x in cp.p_shapes])}.
Definition shapes_ok (P : mplan) : Prop :=
  lrun_s (ml_inputs P) (ml_nodes P) = the_lshapes /\\
  mrun_s (mesh P) (map (fun b => mlocal_shape (mesh P) (nth [::] the_lshapes b.1) b.2) (mp_inputs P))
    (mp_nodes P) = the_pshapes.
Lemma the_shapes_at : shapes_ok (the_plan_at the_nat).
Proof. split; match goal with |- _ = ?b => vm_cast_no_check (erefl b) end. Qed.
Lemma the_shapes : shapes_ok the_plan.
Proof. by have := the_shapes_at; rewrite /the_nat fast_natE. Qed.

(* Auxiliary logical values the certificate names (appended to the logical graph; outputs read the plan's own). *)
Definition the_xs_at (pn : positive -> nat) : seq gnode := {at(xs)}.
Definition the_xs : seq gnode := the_xs_at the_nat.

(* vm_cast_no_check: the kernel runs the check once, at Qed (a tactic-time vm_compute would run it twice). *)
Lemma the_check : mcheckx (the_plan_at the_nat) the_xs the_cert = true.
Proof. vm_cast_no_check (erefl true). Qed.

Theorem plan_verified : mplan_equiv the_plan.
Proof. have := mcheckx_sound the_check; rewrite /the_nat fast_natE; exact. Qed.
"""


def probe_uncovered(plan: Plan) -> list[Uncovered]:
    """Every step outside the fragment, including those behind an uncovered step (diagnostics)."""
    try:
        translate(plan, probe=True)
    except NotCovered as exc:
        return exc.items
    return []


def emit(plan: Plan) -> tuple[str, CoqPlan, list]:
    """The .v text for a plan; raises NotCovered with the steps outside the fragment."""
    cp = translate(plan)
    cert = search(cp)
    return render(cp, cert), cp, cert
