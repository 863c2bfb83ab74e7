"""Plan -> Coq term of ``Rules/IR`` (the trusted printer) and the untrusted fact search.

``translate`` maps a loaded plan onto the Coq IR of ``Rules/IR/Syntax.v``: node ids are
positions (inputs first), shapes are the plan's declared dims, each op becomes one
constructor.  It refuses (returns the uncovered steps) whatever the stage-1 fragment lacks:
several mesh axes or programs, layouts, zig-zag shards, integer tensors, ops without a Coq
denotation.  As a cross-check of the printer, the shapes Coq's ``op_shape`` gives (mirrored
here by ``_shape``) must equal the shapes the IR infers, node by node.

``search`` finds the certificate: one fact ``(logical id, placement)`` per parallel node,
by the same rules as ``Check.rule`` (``Rules/IR/Check.v``).  It is search, not trust: Coq's
``check`` re-derives every fact and the theorem only exists when it returns true.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..graph import Graph
from ..ops import REGISTRY, resolve_attrs
from ..plan import Plan

# pointwise unary ops denoted by an uninterpreted function [Fn k]
FN_OPS = ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "silu", "relu", "abs",
          "reciprocal", "gelu")


@dataclass(frozen=True)
class Pl:
    """A placement on the single mesh axis: R, S (dim), P (reduce)."""
    kind: str
    dim: int = -1
    reduce: str = "sum"

    def coq(self) -> str:
        if self.kind == "R":
            return "Replicate"
        if self.kind == "S":
            return f"(Shard {self.dim})"
        return "(Partial " + {"sum": "RSum", "avg": "RAvg", "max": "RMax"}[self.reduce] + ")"

    def __str__(self) -> str:
        return {"R": "Replicate", "S": f"Shard({self.dim})"}.get(self.kind, f"Partial({self.reduce})")


R_ = Pl("R")
PSUM = Pl("P", reduce="sum")


@dataclass
class CNode:
    op: tuple           # ("Add",) ("Scale", Fraction) ("Fn", k) ("Const", Fraction, shape) ("MM",)
                        # ("Sum", dims) ("Transpose", d0, d1) ("AllReduce", r) ("AllGather", d) ...
    args: list[int]
    name: str


@dataclass
class CoqPlan:
    name: str
    p: int
    axis: str
    l_inputs: list[tuple[str, tuple[int, ...]]]
    l_nodes: list[CNode]
    p_inputs: list[tuple[str, int, Pl]]          # (local name, logical input id, placement)
    p_nodes: list[CNode]
    p_outputs: list[tuple[str, int, int, Pl]]    # (logical name, logical id, parallel id, placement)
    fns: list[str] = field(default_factory=list)  # Fn k -> op name
    l_shapes: list[tuple[int, ...]] = field(default_factory=list)
    p_shapes: list[tuple[int, ...]] = field(default_factory=list)


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
    def __init__(self, items: list[Uncovered]):
        super().__init__("; ".join(map(str, items)))
        self.items = items


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


def _shape(op: tuple, ss: list[tuple[int, ...]], p: int) -> tuple[int, ...]:
    k = op[0]
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
    if k == "AllGather":
        s = list(s0)
        s[op[1]] *= p
        return tuple(s)
    raise AssertionError(k)


def _local_shape(s, pl: Pl, p: int):
    if pl.kind == "S":
        s = list(s)
        s[pl.dim] //= p
        return tuple(s)
    return tuple(s)


# ----------------------------------------------------------------- translation
def _num(v: Any) -> Fraction | None:
    if isinstance(v, bool) or not isinstance(v, (int, float, Fraction)):
        return None
    if isinstance(v, float):  # the decimal it is written as (0.1 is 1/10), as the exact interpreter reads it
        if v != v or v in (float("inf"), float("-inf")):
            return None
        return Fraction(str(v))
    return Fraction(v)


def _op(n, ra: dict, in_shapes: list[tuple[int, ...]], axis: str, fns: list[str]) -> tuple:
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
        if len(in_shapes[0]) != 2 or len(in_shapes[1]) != 2:
            raise ValueError("matmul is covered for 2-D operands only (torch.mm)")
        return ("MM",)
    if op == "sum":
        if ra.get("keepdim"):
            raise ValueError("sum with keepdim=True is not covered")
        r = len(in_shapes[0])
        dims = [nd(int(d), r) for d in ra["dims"]]
        if len(set(dims)) != len(dims):
            raise ValueError("duplicate dims")
        return ("Sum", tuple(dims))
    if op == "transpose":
        r = len(in_shapes[0])
        return ("Transpose", nd(int(ra["dim0"]), r), nd(int(ra["dim1"]), r))
    if op in ("all_reduce", "all_gather"):
        ax = ra["axis"]
        if (ax if isinstance(ax, str) else tuple(ax)) not in (axis, (axis,)):
            raise ValueError(f"collective over {ax!r}, not the mesh axis {axis!r}")
        if op == "all_reduce":
            return ("AllReduce", ra.get("reduce", "sum"))
        return ("AllGather", nd(int(ra["dim"]), len(in_shapes[0])))
    raise ValueError("op has no denotation in Rules/IR/Denote.v yet")


def _mentions_rank(attrs: Any) -> bool:
    return "rank." in repr(attrs)


def _graph(g: Graph, where: str, env: dict, axis: str, p: int, fns: list[str], ids: dict[str, int],
           shapes: list, inferred: dict, unc: list[Uncovered]) -> list[CNode]:
    out = []
    for n in g.nodes:
        name = n.outputs[0] if n.outputs else n.path
        if len(n.outputs) != 1:
            unc.append(Uncovered(where, name, n.op, "ops with several outputs are not covered"))
            continue
        if any(x not in ids for x in n.inputs):
            continue  # follows from an uncovered step already listed
        if _mentions_rank(n.attrs):
            unc.append(Uncovered(where, name, n.op, "rank-dependent attributes are not covered"))
            continue
        spec = REGISTRY[n.op]
        ra = dict(resolve_attrs(spec, n.attrs, env))
        in_shapes = [shapes[ids[x]] for x in n.inputs]
        try:
            op = _op(n, ra, in_shapes, axis, fns)
        except ValueError as exc:
            unc.append(Uncovered(where, name, n.op, str(exc)))
            continue
        dt = inferred.get(name, ((), "float"))[1]
        if dt != "float" or any(inferred.get(x, ((), "float"))[1] != "float" for x in n.inputs):
            unc.append(Uncovered(where, name, n.op, "integer tensors are not covered"))
            continue
        s = _shape(op, in_shapes, p)
        if name in inferred and tuple(inferred[name][0]) != s:
            unc.append(Uncovered(where, name, n.op, f"Coq shape {list(s)} differs from the IR's "
                                                  f"{list(inferred[name][0])}"))
            continue
        ids[name] = len(shapes)
        shapes.append(s)
        out.append(CNode(op, [ids[x] for x in n.inputs], name))
    return out


def _placement(b, axis: str, shape: tuple[int, ...]) -> Pl:
    if b.layout:
        raise ValueError("layout transforms are not covered")
    pl = b.placement.get(axis)
    if pl is None or pl.kind == "R":
        return R_
    if pl.kind == "S":
        return Pl("S", pl.dim + len(shape) if pl.dim < 0 else pl.dim)
    if pl.kind == "P":
        return Pl("P", reduce=pl.reduce)
    raise ValueError(f"placement {pl} is not covered")


def translate(plan: Plan) -> CoqPlan:
    """The plan as a Coq IR term (raises NotCovered with every step outside the fragment)."""
    unc: list[Uncovered] = []
    mesh = plan.mesh()
    if len(mesh) != 1:
        raise NotCovered([Uncovered("plan", "", "mesh", f"{len(mesh)} mesh axes; stage 1 covers one")])
    (axis, p), = mesh.items()
    if len(plan.programs) != 1:
        raise NotCovered([Uncovered("plan", "", "programs", f"{len(plan.programs)} programs (pipeline "
                                                            "stages); stage 1 covers one")])
    (pname, prog), = plan.programs.items()
    env = dict(plan.dims)
    fns: list[str] = []
    linf = plan.logical.infer(env, mesh, key="coq_shape")
    penv = dict(env)
    penv[f"rank.{axis}"] = 0
    pinf = prog.infer(penv, mesh, key="coq_shape")

    l_ids: dict[str, int] = {}
    l_shapes: list = []
    l_inputs = []
    for t in plan.logical.inputs:
        s, dt = linf[t.name]
        if dt != "float":
            unc.append(Uncovered("logical", t.name, "input", "integer tensors are not covered"))
            continue
        l_ids[t.name] = len(l_shapes)
        l_shapes.append(tuple(s))
        l_inputs.append((t.name, tuple(s)))
    l_nodes = _graph(plan.logical, "logical", env, axis, p, fns, l_ids, l_shapes, linf, unc)

    p_ids: dict[str, int] = {}
    p_shapes: list = []
    p_inputs = []
    by_local = {b.local: b for b in plan.inputs.values()}
    for t in prog.inputs:
        b = by_local.get(t.name)
        if b is None or b.logical not in l_ids:
            unc.append(Uncovered(pname, t.name, "input", "not bound to a covered logical input"))
            continue
        try:
            pl = _placement(b, axis, l_shapes[l_ids[b.logical]])
        except ValueError as exc:
            unc.append(Uncovered(pname, t.name, "input", str(exc)))
            continue
        ls = _local_shape(l_shapes[l_ids[b.logical]], pl, p)
        if tuple(pinf[t.name][0]) != ls:
            unc.append(Uncovered(pname, t.name, "input", f"declared local shape {list(pinf[t.name][0])} is not "
                                                       f"the placement's {list(ls)}"))
            continue
        p_ids[t.name] = len(p_shapes)
        p_shapes.append(ls)
        p_inputs.append((t.name, l_ids[b.logical], pl))
    p_nodes = _graph(prog, pname, penv, axis, p, fns, p_ids, p_shapes, pinf, unc)

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
            pl = _placement(b, axis, l_shapes[l_ids[lname]])
        except ValueError as exc:
            unc.append(Uncovered(pname, b.local, "output", str(exc)))
            continue
        p_outputs.append((lname, l_ids[lname], p_ids[b.local], pl))
    if unc:
        raise NotCovered(unc)
    return CoqPlan(plan.name, p, axis, l_inputs, l_nodes, p_inputs, p_nodes, p_outputs, fns, l_shapes, p_shapes)


# ----------------------------------------------------------------- fact search (mirror of Check.rule)
def _bin_shard(so, s, a: Pl, d: int) -> bool:
    off = len(so) - len(s)
    if off < 0 or tuple(s) != tuple(so[off:]):
        return False
    if a.kind == "R":
        return d < off
    return a.kind == "S" and off <= d and a.dim == d - off


def _shard_ok(p, s, d) -> bool:
    return d < len(s) and (s[d] // p) * p == s[d]


def _rule(op: tuple, ss: list, pls: list[Pl], p: int) -> Pl | None:
    """A placement Check.rule accepts for the result, or None."""
    k = op[0]
    so = _shape(op, ss, 1)
    if all(x.kind == "R" for x in pls):
        return R_
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
        if k == "Sum" and len(op[1]) == 1 and a.kind == "S":
            e = op[1][0]
            cands.append(PSUM if e == a.dim else Pl("S", a.dim - 1 if e < a.dim else a.dim))
    elif len(pls) == 2:
        a, b = pls
        if k in ("Add", "Sub", "Mul", "Div"):
            for x in (a, b):
                if x.kind == "S":
                    d = x.dim + len(so) - len(ss[pls.index(x)])
                    if _bin_shard(so, ss[0], a, d) and _bin_shard(so, ss[1], b, d):
                        cands.append(Pl("S", d))
            if k in ("Add", "Sub") and a == PSUM and b == PSUM and tuple(ss[0]) == so and tuple(ss[1]) == so:
                cands.append(PSUM)
        if k == "MM" and len(ss[0]) == 2 and len(ss[1]) == 2 and ss[0][1] == ss[1][0]:
            if a.kind == "R" and b == Pl("S", 1):
                cands.append(Pl("S", 1))
            if a == Pl("S", 0) and b.kind == "R":
                cands.append(Pl("S", 0))
            if a == Pl("S", 1) and b == Pl("S", 0):
                cands.append(PSUM)
    for c in cands:
        if c.kind != "S" or _shard_ok(p, so, c.dim):
            return c
    return None


def search(cp: CoqPlan) -> list[tuple[int, Pl]]:
    """The certificate: one fact per parallel node (raises NotCovered at the first node without one)."""
    ni = len(cp.l_inputs)
    by_key: dict[tuple, int] = {}
    for j, n in enumerate(cp.l_nodes):
        by_key.setdefault((n.op, tuple(n.args)), ni + j)
    facts: list[tuple[int, Pl]] = [(li, pl) for _, li, pl in cp.p_inputs]
    cert = []
    for n in cp.p_nodes:
        af = [facts[a] for a in n.args]
        k = n.op[0]
        f = None
        why = ""
        if k == "AllReduce":
            if n.op[1] == "sum" and af[0][1] == PSUM:
                f = (af[0][0], R_)
            else:
                why = f"all_reduce({n.op[1]}) of a {af[0][1]} operand"
        elif k == "AllGather":
            if af[0][1] == Pl("S", n.op[1]):
                f = (af[0][0], R_)
            else:
                why = f"all_gather along dim {n.op[1]} of a {af[0][1]} operand"
        else:
            l = by_key.get((n.op, tuple(x[0] for x in af)))
            if l is None:
                why = "no logical node applies this op to the logical values of its operands"
            else:
                pl = _rule(n.op, [cp.l_shapes[x[0]] for x in af], [x[1] for x in af], cp.p)
                if pl is None:
                    why = "no covered rule for operand placements " + ", ".join(str(x[1]) for x in af)
                else:
                    f = (l, pl)
        if f is None:
            raise NotCovered([Uncovered("parallel", n.name, _ir_name(n.op), why)])
        facts.append(f)
        cert.append(f)
    bad = [Uncovered("parallel", cp.p_nodes[po - len(cp.p_inputs)].name if po >= len(cp.p_inputs) else
                     cp.p_inputs[po][0], "output",
                     f"holds logical node {facts[po][0]} as {facts[po][1]}, declared logical {lname!r} as {pl}")
           for lname, lo, po, pl in cp.p_outputs if facts[po] != (lo, pl)]
    if bad:
        raise NotCovered(bad)
    return cert


def _ir_name(op: tuple) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", op[0]).lower()


# ----------------------------------------------------------------- printing
def _rat(c: Fraction) -> str:
    return f"({'true' if c < 0 else 'false'}, {abs(c.numerator)}, {c.denominator})"


def _seq(xs) -> str:
    return "[:: " + "; ".join(str(x) for x in xs) + "]" if xs else "[::]"


def coq_op(op: tuple) -> str:
    k = op[0]
    if k in ("Add", "Sub", "Mul", "Div", "Neg", "Square", "MM"):
        return k
    if k == "Scale":
        return f"(Scale {_rat(op[1])})"
    if k == "Fn":
        return f"(Fn {op[1]})"
    if k == "Const":
        return f"(Const {_rat(op[1])} {_seq(op[2])})"
    if k == "Sum":
        return f"(Sum {_seq(op[1])})"
    if k == "Transpose":
        return f"(Transpose {op[1]} {op[2]})"
    if k == "AllReduce":
        return "(AllReduce " + {"sum": "RSum", "avg": "RAvg", "max": "RMax"}[op[1]] + ")"
    if k == "AllGather":
        return f"(AllGather {op[1]})"
    raise AssertionError(k)


def _nodes(ns: list[CNode], first: int) -> str:
    if not ns:
        return "[::]"
    rows = [f"    Node {coq_op(n.op)} {_seq(n.args)}  (* {first + i}: {_cmt(n.name)} *)" for i, n in enumerate(ns)]
    return "[::\n" + ";\n".join(rows) + "\n  ]"


def _cmt(s: str) -> str:
    return s.replace("(*", "( *").replace("*)", "* )")


def render(cp: CoqPlan, cert: list[tuple[int, Pl]], header: str = "") -> str:
    ni = len(cp.l_inputs)
    pi = len(cp.p_inputs)
    lin = ";\n".join(f"    {_seq(s)}  (* {i}: {_cmt(n)} *)" for i, (n, s) in enumerate(cp.l_inputs))
    pin = ";\n".join(f"    ({li}, {pl.coq()})  (* {i}: {_cmt(n)} *)" for i, (n, li, pl) in enumerate(cp.p_inputs))
    pout = ";\n".join(f"    ({lo}, {po}, {pl.coq()})  (* {_cmt(n)} *)" for n, lo, po, pl in cp.p_outputs)
    facts = ";\n".join(f"    ({l}, {pl.coq()})  (* {pi + i}: {_cmt(cp.p_nodes[i].name)} *)"
                       for i, (l, pl) in enumerate(cert))
    fns = "".join(f"   Fn {k} = {_cmt(name)}\n" for k, name in enumerate(cp.fns))
    return f"""(* Generated by tvcert (coqjudge) for plan {_cmt(cp.name)}.{(' ' + _cmt(header)) if header else ''}
   Mesh axis {_cmt(cp.axis)} of {cp.p} ranks.  Uninterpreted pointwise functions:
{fns or '   (none)' + chr(10)}   The theorem quantifies over every interpretation of them (Rules/IR/Denote.v). *)
From mathcomp Require Import all_ssreflect.
From TVCert Require Import IR.Syntax IR.Denote IR.Check IR.Sound.
Import JSyntax JDenote JCheck JSound.

Definition the_plan : plan := {{|
  mesh_size := {cp.p};
  l_inputs := {'[::' + chr(10) + lin + chr(10) + '  ]' if cp.l_inputs else '[::]'};
  l_nodes := {_nodes(cp.l_nodes, ni)};
  p_inputs := {'[::' + chr(10) + pin + chr(10) + '  ]' if cp.p_inputs else '[::]'};
  p_nodes := {_nodes(cp.p_nodes, pi)};
  p_outputs := {'[::' + chr(10) + pout + chr(10) + '  ]' if cp.p_outputs else '[::]'}
|}}.

Definition the_cert : seq fact := {'[::' + chr(10) + facts + chr(10) + '  ]' if cert else '[::]'}.

(* Printer check: the shapes Coq's op_shape gives every node are the shapes tvcert's IR infers. *)
Lemma the_shapes :
  run_s 1 (l_inputs the_plan) (l_nodes the_plan) = {_seq([_seq(x) for x in cp.l_shapes])} /\\
  run_s (mesh_size the_plan)
    (map (fun b => local_shape (mesh_size the_plan) (nth [::] (l_inputs the_plan) b.1) b.2) (p_inputs the_plan))
    (p_nodes the_plan) = {_seq([_seq(x) for x in cp.p_shapes])}.
Proof. split; vm_compute; reflexivity. Qed.

Lemma the_check : check the_plan the_cert = true.
Proof. vm_compute. reflexivity. Qed.

Theorem plan_verified : plan_equiv the_plan.
Proof. exact: (check_sound the_check). Qed.
"""


def emit(plan: Plan) -> tuple[str, CoqPlan, list]:
    """The .v text for a plan; raises NotCovered with the steps outside the fragment."""
    cp = translate(plan)
    cert = search(cp)
    return render(cp, cert), cp, cert
