"""The link from the Coq denotation to what runs (issue 14): Coq's op values = the exact interpreter's.

Every op of ``Denote.op_val`` / ``Denote.step`` and of ``LayoutOps.lop_val`` is evaluated by ``vm_compute`` at
MathComp's rationals on random small tensors (odd sizes, broadcasting, several dims), with ``fn`` the table of
the function values the interpreter used, and compared element by element with ``tvcert.interp``'s exact mode;
then whole small graphs (mlp_tp2's logical graph through ``Mesh.lrun``, heads_ok's, an attention block) node by
node; and, so the comparison is known to discriminate, a few ops whose Coq value is taken from a different op
(same output shape) must disagree.  All of it is one coqc run.
"""
from __future__ import annotations

import copy
import json
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from tvcert import proofkit
from tvcert.coqjudge.denote_eval import CoqEval, fn_id, lop_term
from tvcert.coqjudge.emit import _op, _seq, coq_gop, coq_op, translate
from tvcert.coqjudge.lops import LOPS, coq_lop
from tvcert.interp import run_graph
from tvcert.ops import REGISTRY, Ctx, resolve_attrs
from tvcert.ops.base import norm_dim
from tvcert.plan import load_plan

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"

pytestmark = pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc not installed")

I = "int"  # an integer (mask / condition) operand
IDS = "ids"  # an integer operand in [0, 3) (token ids for one_hot)

STAGE1 = [  # ops of Denote.op_val
    ("add", {}, [(2, 3), (2, 3)]), ("add", {}, [(3, 1), (2,)]), ("add", {}, [(), (2, 2)]),
    ("sub", {}, [(2, 3), (3,)]), ("mul", {}, [(1, 3), (2, 1)]), ("div", {}, [(2, 3), (3,)]),
    ("neg", {}, [(2, 3)]), ("square", {}, [(3,)]), ("scale", {"value": 0.5}, [(2, 2)]),
    ("scale", {"value": -3}, [(3,)]), ("tanh", {}, [(2, 3)]), ("exp", {}, [(3,)]), ("relu", {}, [(5,)]),
("const", {"value": 0.25, "shape": [2, 3]}, []),
    ("matmul", {}, [(2, 3), (3, 5)]), ("matmul", {}, [(2, 2, 3), (3, 2)]), ("matmul", {}, [(2, 1, 2, 3), (2, 1, 3, 2)]), ("sum", {"dims": [0]}, [(2, 3)]), ("sum", {"dims": [1]}, [(3, 2)]),
    ("sum", {"dims": [0, 1]}, [(2, 3)]), ("sum", {"dims": [-1, 0]}, [(2, 3, 3)]),
    ("transpose", {"dim0": 0, "dim1": 1}, [(2, 3)]), ("transpose", {"dim0": 0, "dim1": 2}, [(2, 1, 3)]),
]

LAYOUT = [  # ops of LayoutOps.lop_val
    ("reshape", {"shape": [3, 2]}, [(2, 3)]), ("reshape", {"shape": [-1]}, [(2, 3)]),
    ("reshape", {"shape": [2, 2, 3]}, [(4, 3)]), ("view", {"shape": [5, 3]}, [(3, 5)]),
    ("flatten", {"start": 1, "end": 2}, [(2, 3, 2)]), ("reshape", {"shape": [2, 3]}, [(6,)]),
    ("permute", {"dims": [2, 0, 1]}, [(2, 3, 2)]), ("permute", {"dims": [1, 0]}, [(3, 2)]),
    ("unsqueeze", {"dim": 1}, [(2, 3)]), ("unsqueeze", {"dim": -1}, [(3,)]),
    ("squeeze", {"dims": [1]}, [(2, 1, 3)]), ("squeeze", {"dims": [0, 2]}, [(1, 3, 1)]),
    ("expand", {"shape": [2, 3]}, [(1, 3)]), ("expand", {"shape": [2, 3, 2]}, [(3, 1)]),
    ("expand", {"shape": [2, -1]}, [(1, 5)]),
    ("slice", {"dim": 1, "start": 1, "end": 4}, [(2, 5)]), ("slice", {"dim": 0, "start": 0, "end": 2}, [(3, 2)]),
    ("concat", {"dim": 0}, [(2, 3), (1, 3)]), ("concat", {"dim": 1}, [(2, 1), (2, 3), (2, 2)]),
    ("sum", {"dims": [1], "keepdim": True}, [(2, 3)]), ("mean", {"dims": [0]}, [(3, 2)]),
    ("mean", {"dims": [0, 2], "keepdim": True}, [(2, 3, 3)]), ("mean", {"dims": [-1]}, [(2, 5)]),
    ("amax", {"dims": [1]}, [(2, 3)]), ("amax", {"dims": [0, 2], "keepdim": True}, [(2, 3, 3)]),
    ("amin", {"dims": [0]}, [(3, 2)]),
    ("minimum", {}, [(2, 3), (3,)]), ("maximum", {}, [(2, 1), (1, 3)]),
    ("add_scalar", {"value": 0.5}, [(2, 3)]), ("add_scalar", {"value": -2}, [(3,)]),
    ("cast", {"dtype": "float"}, [(2, 3)]),
    ("softmax", {"dim": -1}, [(2, 3)]), ("softmax", {"dim": 0}, [(3, 2)]), ("log_softmax", {"dim": 1}, [(2, 3)]),
    ("softmax_backward", {"dim": 1}, [(2, 3), (2, 3)]), ("log_softmax_backward", {"dim": 0}, [(3, 2), (3, 2)]),
    ("einsum", {"equation": "ij,jk->ik"}, [(2, 3), (3, 2)]), ("einsum", {"equation": "bij,bjk->bik"}, [(2, 2, 3), (2, 3, 1)]),
    ("einsum", {"equation": "ij->ji"}, [(2, 3)]), ("einsum", {"equation": "ij,ij->"}, [(2, 3), (2, 3)]),
    ("einsum", {"equation": "i,j->ij"}, [(3,), (2,)]), ("einsum", {"equation": "ij,jk"}, [(2, 3), (3, 2)]),
    ("einsum", {"equation": "ij,jk,kl->il"}, [(2, 3), (3, 2), (2, 3)]), ("einsum", {"equation": "ii->i"}, [(3, 3)]),
    ("where", {}, [((2, 3), I), (2, 3), (3,)]), ("where", {}, [((3,), I), (2, 1), ()]),
    ("masked_fill", {"value": -1.5}, [(2, 3), ((1, 3), I)]),
    ("iota", {"size": 4}, []), ("iota", {"size": 3, "start": 2, "step": 3}, []),
    ("gt", {}, [(2, 3), (3,)]), ("gt", {}, [((2, 3), I), ((2, 1), I)]), ("lt", {}, [(3,), (2, 3)]),
    ("ge", {}, [((2, 2), I), (2, 2)]), ("le", {}, [(1, 3), (2, 1)]), ("eq", {}, [((2, 3), I), ((3,), I)]),
    ("ne", {}, [((3,), I), ((3,), I)]), ("one_hot", {"num_classes": 4}, [((2, 3), IDS)]),
    ("one_hot", {"num_classes": 3}, [((4,), IDS)]), ("cast", {"dtype": "float"}, [((2, 3), I)]),
]

MUTANTS = [  # (op, attrs, shapes, wrong op, wrong attrs): same output shape, another meaning; Coq must disagree
    ("permute", {"dims": [0, 2, 1]}, [(2, 3, 3)], "permute", {"dims": [0, 1, 2]}),
    ("slice", {"dim": 1, "start": 1, "end": 3}, [(2, 5)], "slice", {"dim": 1, "start": 2, "end": 4}),
    ("mean", {"dims": [1]}, [(2, 3)], "sum", {"dims": [1]}),
    ("log_softmax", {"dim": 1}, [(2, 3)], "softmax", {"dim": 1}),
    ("softmax", {"dim": 0}, [(3, 3)], "softmax", {"dim": 1}),
    ("einsum", {"equation": "ij,jk->ik"}, [(2, 2), (2, 2)], "einsum", {"equation": "ij,jk->ki"}),
    ("reshape", {"shape": [3, 2]}, [(2, 3)], "permute", {"dims": [1, 0]}),
    ("amax", {"dims": [0]}, [(3, 2)], "amin", {"dims": [0]}),
    ("softmax_backward", {"dim": 1}, [(2, 3), (2, 3)], "log_softmax_backward", {"dim": 1}),
    ("gt", {}, [(2, 3), (2, 3)], "lt", {}), ("ge", {}, [(3, 3), (3, 3)], "lt", {}),
    ("iota", {"size": 3, "start": 1}, [], "iota", {"size": 3}),
]

COLLECTIVES = [("all_reduce", {"axis": "tp", "reduce": "sum"}, (2, 3)), ("all_reduce", {"axis": "tp", "reduce": "avg"}, (3,)),
               ("all_reduce", {"axis": "tp", "reduce": "max"}, (2, 2)), ("all_gather", {"axis": "tp", "dim": 0}, (2, 3)),
               ("all_gather", {"axis": "tp", "dim": 1}, (2, 3))]

ATTENTION = {  # a small attention block with a causal mask, mostly layout / row-wise ops
    "inputs": [{"name": "x", "shape": [2, 3, 4], "values": "small"}, {"name": "wq", "shape": [4, 4], "values": "small"},
               {"name": "wk", "shape": [4, 4], "values": "small"},
               {"name": "mask", "shape": [3, 3], "dtype": "int"}],
    "nodes": [
        {"name": "q", "op": "einsum", "inputs": ["x", "wq"], "attrs": {"equation": "bsh,hf->bsf"}},
        {"name": "k", "op": "einsum", "inputs": ["x", "wk"], "attrs": {"equation": "bsh,hf->bsf"}},
        {"name": "qh", "op": "reshape", "inputs": ["q"], "attrs": {"shape": [2, 3, 2, 2]}},
        {"name": "kh", "op": "reshape", "inputs": ["k"], "attrs": {"shape": [2, 3, 2, 2]}},
        {"name": "qt", "op": "permute", "inputs": ["qh"], "attrs": {"dims": [0, 2, 1, 3]}},
        {"name": "kt", "op": "permute", "inputs": ["kh"], "attrs": {"dims": [0, 2, 1, 3]}},
        {"name": "sc", "op": "einsum", "inputs": ["qt", "kt"], "attrs": {"equation": "bnsd,bntd->bnst"}},
        {"name": "scm", "op": "masked_fill", "inputs": ["sc", "mask"], "attrs": {"value": -9}},
        {"name": "p", "op": "softmax", "inputs": ["scm"], "attrs": {"dim": -1}},
        {"name": "lp", "op": "log_softmax", "inputs": ["scm"], "attrs": {"dim": -1}},
        {"name": "o", "op": "einsum", "inputs": ["p", "kt"], "attrs": {"equation": "bnst,bntd->bnsd"}},
        {"name": "ot", "op": "permute", "inputs": ["o"], "attrs": {"dims": [0, 2, 1, 3]}},
        {"name": "of", "op": "reshape", "inputs": ["ot"], "attrs": {"shape": [2, 3, 4]}},
        {"name": "ms", "op": "mean", "inputs": ["of"], "attrs": {"dims": [-1], "keepdim": True}},
        {"name": "r", "op": "add", "inputs": ["of", "ms"]},
        {"name": "rl", "op": "slice", "inputs": ["r"], "attrs": {"dim": 1, "start": 1, "end": 3}},
        {"name": "m", "op": "amax", "inputs": ["lp"], "attrs": {"dims": [1, 3]}},
    ],
}


def _rand(shape, rng, kind=None):
    """Small rationals (MathComp's are unary underneath: keep numbers small); integers for I and "small"."""
    if kind == I:
        return rng.integers(-1, 3, size=shape).astype(np.int64)
    if kind == IDS:
        return rng.integers(0, 3, size=shape).astype(np.int64)
    if kind == "small":  # for deep graphs, whose values grow fast
        return np.vectorize(Fraction, otypes=[object])(rng.integers(-1, 2, size=shape)).reshape(shape)
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        out[idx] = Fraction(int(rng.integers(-5, 6)) or 1, int(rng.choice([1, 2, 3])))
    return out


def _decl(name: str, s) -> dict:
    """A graph input from a case's shape: (shape) or ((shape), I) for an integer operand."""
    if len(s) == 2 and s[1] in (I, IDS):
        return {"name": name, "shape": list(s[0]), "dtype": "int", **({"values": IDS} if s[1] == IDS else {})}
    return {"name": name, "shape": list(s)}


def _term(ev: CoqEval, op: str, ra: dict, shapes, args: list[str], xs) -> str:
    """Coq term of the op applied to the named tensors: Denote.op_val if stage 1 covers it, else lop_val."""
    ss = "[:: " + "; ".join("[:: " + "; ".join(map(str, s)) + "]" for s in shapes) + "]" if shapes else "[::]"
    ts = "[:: " + "; ".join(args) + "]" if args else "[::]"

    class N:  # the emitter's view of a node
        pass
    n = N()
    n.op = op
    try:
        cop = _op(n, dict(ra), [tuple(s) for s in shapes], "tp", ev.fns)
    except ValueError:
        cop = None
    if cop is None:
        return f"lop_val fnT {lop_term(op, ra, [tuple(s) for s in shapes], ev.fns)} {ss} {ts}"
    if cop[0] in LOPS:  # the emitter's own layout op (a batched matmul is its Einsum)
        return f"lop_val fnT {coq_lop(cop)} {ss} {ts}"
    if cop[0] == "Fn":  # uninterpreted: fn k is the interpreter's op itself, on each input it meets
        spec = REGISTRY[op]
        ev.learn_pointwise(ev.fns[cop[1]], lambda v: spec.eval([np.array(v, dtype=object)], ra, ev.ctx)[0][()],
                           set(np.asarray(xs[0], dtype=object).ravel()))
    return f"op_val fnT {coq_op(cop)} {ss} {ts}"


def _mutants(ev: CoqEval, rng, wrong: list) -> None:
    """The interpreter's value of each op next to Coq's value of a different op on the same inputs."""
    for op, attrs, shapes, wop, wattrs in MUTANTS:
        xs = [_rand(sh, rng) for sh in shapes]
        want = REGISTRY[op].eval(xs, dict(resolve_attrs(REGISTRY[op], attrs, {})), ev.ctx)[0]
        wra = dict(resolve_attrs(REGISTRY[wop], wattrs, {}))
        REGISTRY[wop].eval(xs, wra, ev.ctx)  # so fn's table holds the arguments the wrong op reads
        names = [ev.tensor(x) for x in xs]
        ev.value(_term(ev, wop, wra, [x.shape for x in xs], names, xs), want.shape)
        wrong.append((f"{op}{attrs} read as {wop}{wattrs}", want))


def _graph(ev: CoqEval, g: dict, rng, expect: list, where: str) -> None:
    """Every node of a small graph (JSON form, concrete shapes) evaluated both ways, node by node."""
    vals, names = {}, {}
    for t in g["inputs"]:
        vals[t["name"]] = _rand(tuple(t["shape"]), rng, t.get("values") or (I if t.get("dtype") == "int" else None))
        names[t["name"]] = ev.tensor(vals[t["name"]])
    for n in g["nodes"]:
        spec = REGISTRY[n["op"]]
        ra = dict(resolve_attrs(spec, n.get("attrs", {}), {}))
        xs = [vals[a] for a in n["inputs"]]
        vals[n["name"]] = spec.eval(xs, ra, ev.ctx)[0]
        term = _term(ev, n["op"], ra, [x.shape for x in xs], [names[a] for a in n["inputs"]], xs)
        names[n["name"]] = ev.value(term, vals[n["name"]].shape)
        expect.append((f"{where}:{n['name']} ({n['op']})", vals[n["name"]]))


def _mlp_logical(ev: CoqEval, expect: list) -> None:
    """mlp_tp2's logical graph (small dims) as Mesh.lrun evaluates it: the emitter's nodes, ids and operand order."""
    d = json.loads((EX / "mlp_tp2.json").read_text())
    d["dims"].update(b=2, h=2, f=2)
    plan = load_plan(d)
    cp = translate(plan)
    rng = np.random.default_rng(3)
    ins = {name: _rand(s, rng, "small") for name, s in cp.l_inputs}
    env = "; ".join(f"({_seq(s)}, {ev.tensor(ins[name])})" for name, s in cp.l_inputs)
    nodes = "; ".join(f"GNode {coq_gop(n.op)} {_seq(n.args)}" for n in cp.l_nodes)
    ren = "; ".join(f"{fn_id(ev.fns, f)}%N" for f in cp.fns)  # the plan's Fn k is the test's fn (ren k)
    ev.body.append(f"Definition mlp_le := lrun (fun f => fnT (nth 0%N [:: {ren}] f)) [:: {env}] [:: {nodes}].")
    vals = run_graph(plan.logical, ins, plan.dims, ev.ctx)
    assert cp.fns == ["tanh"]  # through ev.ctx's table
    for k, n in enumerate(cp.l_nodes):
        v = vals[n.name]
        ev.value(f"(nth (@ldflt Q) mlp_le {len(cp.l_inputs) + k}).2", v.shape)
        expect.append((f"mlp_tp2 logical:{n.name}", v))


def _collectives(ev: CoqEval, rng, expect: list) -> None:
    """Mesh.coll_step on a one-axis mesh of 2 ranks, rank by rank, against the interpreter's collective
    (or, for CSliceRank, its slice at that rank's bounds)."""
    ctx = Ctx(exact=True, seed=0)
    for op, attrs, shape in COLLECTIVES:
        spec = REGISTRY[op]
        ra = dict(resolve_attrs(spec, attrs, {}))
        ra["_p"] = 2
        xs = [_rand(shape, rng) for _ in range(2)]
        want = spec.simulate([x.copy() for x in xs], ra, ctx)
        fam = ev.family(xs)
        cop = (f"(CAllReduce {dict(sum='RSum', avg='RAvg', max='RMax')[ra['reduce']]})" if op == "all_reduce"
               else f"(CAllGather {norm_dim(ra['dim'], len(shape))})")
        for r in range(2):
            ev.value(f"coll_step [:: 2] {cop} 0 {_seq(shape)} (fun c => {fam} (nth 0%N c 0)) [:: {r}]", want[r].shape)
            expect.append((f"{op}{attrs} rank {r}", want[r]))
    for shape, d, m in (((4, 3), 0, 2), ((2, 6), 1, 3)):  # x[r*m : r*m+m] along d at rank r
        xs = [_rand(shape, rng) for _ in range(2)]
        fam = ev.family(xs)
        for r in range(2):
            sra = dict(resolve_attrs(REGISTRY["slice"], {"dim": d, "start": r * m, "end": r * m + m}, {}))
            want = REGISTRY["slice"].eval([xs[r]], sra, ctx)[0]
            ev.value(f"coll_step [:: 2] (CSliceRank {d} {m}) 0 {_seq(shape)} (fun c => {fam} (nth 0%N c 0)) [:: {r}]",
                     want.shape)
            expect.append((f"slice_rank dim {d} block {m} rank {r}", want))


def build(seed: int = 11) -> tuple[CoqEval, list, list]:
    rng = np.random.default_rng(seed)
    ev, expect, wrong = CoqEval(), [], []
    for op, attrs, shapes in STAGE1 + LAYOUT:
        g = {"inputs": [_decl(f"in{k}", s) for k, s in enumerate(shapes)],
             "nodes": [{"name": "out", "op": op, "inputs": [f"in{k}" for k in range(len(shapes))], "attrs": attrs}]}
        _graph(ev, g, rng, expect, f"{op}{attrs}{shapes}")
    _collectives(ev, rng, expect)
    _mlp_logical(ev, expect)
    heads = json.loads((EX / "heads_ok.json").read_text())
    dims = heads["dims"]
    lg = copy.deepcopy(heads["logical"])
    hp = load_plan(heads)
    types = hp.logical.infer(dims, hp.mesh(dims), key="shape@coqtest")
    for t in lg["inputs"]:
        t["shape"] = list(types[t["name"]][0])
    for n in lg["nodes"]:
        if n["op"] == "reshape":
            n["attrs"] = {"shape": list(types[n["name"]][0])}
    _graph(ev, lg, rng, expect, "heads_ok logical")
    _graph(ev, ATTENTION, rng, expect, "attention")
    _mutants(ev, rng, wrong)  # read last, after every value that must agree
    return ev, expect, wrong


@pytest.fixture(scope="module")
def built():
    proofkit.build(ROOT)


def test_denotation_matches_exact_interpreter(built):
    ev, expect, wrong = build()
    got = ev.run(ROOT)
    assert len(got) == len(expect) + len(wrong)

    def same(want, g):
        want = np.asarray(want, dtype=object)
        return g.shape == want.shape and all(Fraction(a) == Fraction(b) for a, b in zip(g.ravel(), want.ravel()))

    bad = [f"{what}: Coq {g.tolist()} != interpreter {want.tolist()}"
           for (what, want), g in zip(expect, got) if not same(want, g)]
    assert not bad, "\n".join(bad[:10])
    # the comparison discriminates: a wrong denotation of each of these ops is caught
    agreed = [what for (what, want), g in zip(wrong, got[len(expect):]) if same(want, g)]
    assert not agreed, agreed
    covered = {w.split("{")[0] for w, _ in expect}
    assert {op for op, _, _ in LAYOUT} <= covered and {op for op, _, _ in STAGE1} <= covered
