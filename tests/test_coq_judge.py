"""Coq as the judge (issue 14): Rules/IR mesh checker, emitted theorems, link to the interpreter.

Needs coqc and the MathComp libraries (``make test`` installs them).  Every coqc run here is one
file; the negative cases share one file in which Coq evaluates ``check`` on every forged pair.
"""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tvcert import proofkit
from tvcert.cli import main
from tvcert.coqjudge.coq import check_text
from tvcert.coqjudge.emit import PSUM, R_, NotCovered, Pl, coq_op, emit, render, search, translate
from tvcert.coqjudge.terms import _rat
from tvcert.interp import run_plan
from tvcert.ops import REGISTRY, Ctx, resolve_attrs
from tvcert.ops.base import table_value
from tvcert.plan import load_plan

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"

pytestmark = pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc not installed")


@pytest.fixture(scope="module", autouse=True)
def _built():
    proofkit.build(ROOT)


def _coqc(text: str) -> str:
    """Run coqc on text against Rules/ and return its output (asserting success)."""
    with tempfile.TemporaryDirectory() as td:
        f = Path(td) / "TVCertTest.v"
        f.write_text(text)
        p = subprocess.run(["coqc", "-q", "-w", proofkit.COQ_WARNINGS, "-Q", str(ROOT / "Rules"), "TVCert", str(f)],
                           capture_output=True, text=True, cwd=td, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


# ------------------------------------------------------------------ end to end
def test_mlp_tp2_coq_checked_end_to_end(tmp_path):
    out = tmp_path / "mlp_tp2.v"
    r = CliRunner().invoke(main, ["verify", str(EX / "mlp_tp2.json"), "--emit-coq", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert "VERIFIED (Coq-checked)" in r.output
    text = out.read_text()
    assert "Theorem plan_verified : mplan_equiv the_plan." in text
    assert "Definition the_plan : mplan := the_plan_at Pos.to_nat." in text  # the theorem's plan reads Pos.to_nat
    # the written file checks on its own, with only allowed axioms
    res = check_text(text)
    assert res.ok, res.message
    assert set(res.axioms) <= proofkit.ALLOWED_AXIOMS


def test_check_cert_coq_and_json(tmp_path):
    cert = tmp_path / "c.json"
    r = CliRunner().invoke(main, ["verify", str(EX / "mlp_tp2.json"), "--emit-cert", str(cert), "-q"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["check", str(cert), "--coq", "--json"])
    assert r.exit_code == 0, r.output
    j = json.loads(r.output.strip().splitlines()[-1])
    assert j["valid"] and j["coq"]["status"] == "coq-checked"


def test_outside_fragment_is_python_checked(tmp_path):
    out = tmp_path / "r.v"
    r = CliRunner().invoke(main, ["verify", str(EX / "ring_attention_cp2.json"), "--emit-coq", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert "VERIFIED (Python-checked)" in r.output and "VERIFIED (Coq-checked)" not in r.output
    assert "ring_loop" in r.output and "11 of 11 logical and 6 of 8 program nodes" in r.output
    assert not out.exists()


def test_wrong_plans_get_no_theorem(tmp_path):
    for name in ("mlp_tp2_no_allreduce", "mlp_tp2_bias_before_allreduce"):
        out = tmp_path / f"{name}.v"
        r = CliRunner().invoke(main, ["verify", str(EX / f"{name}.json"), "--emit-coq", str(out), "-q"])
        assert r.exit_code == 1, r.output
        assert "Coq-checked" not in r.output and not out.exists()
        with pytest.raises(NotCovered) as ei:
            emit(load_plan(EX / f"{name}.json"))
        assert any("(Partial(sum)), (Replicate)" in str(u) for u in ei.value.items)


def test_bad_output_path_is_bad_input(tmp_path):
    (tmp_path / "f").write_text("x")
    r = CliRunner().invoke(main, ["verify", str(EX / "mlp_tp2.json"), "--emit-coq", str(tmp_path / "f" / "o.v"), "-q"])
    assert r.exit_code == 3 and "o.v" in r.output and "Traceback" not in r.output


# ------------------------------------------------------------------ plans on a (dp, tp) mesh
def _mlp_dp_tp() -> dict:
    """mlp_tp2 on a (dp, tp) mesh: batch sharded over dp; the loss all_reduced over dp, gw2 / gb2 / gb1
    all_reduced over dp with a tp Shard inside, gw1 reduce_scattered then all_gathered over dp."""
    d = json.loads((EX / "mlp_tp2.json").read_text())
    d["name"] = "mlp_dp2_tp2"
    d["dims"]["dp"] = 2
    d["mesh"] = {"dp": "dp", "tp": "tp"}
    lg = d["logical"]["nodes"]
    i = [n["name"] for n in lg].index("ssum")
    lg[i:i + 1] = [{"name": "ssum0", "op": "sum", "inputs": ["sq"], "attrs": {"dims": [0]}},
                   {"name": "ssum", "op": "sum", "inputs": ["ssum0"], "attrs": {"dims": [0]}}]
    prog = d["parallel"][0]
    for t in prog["inputs"]:
        if t["name"] in ("x", "target"):
            t["shape"] = ["b/dp"] + t["shape"][1:]
            d["inputs"][t["name"]]["placement"]["dp"] = "Shard(0)"
    ar = lambda name, x, axis: {"name": name, "op": "all_reduce", "inputs": [x], "attrs": {"axis": axis, "reduce": "sum"}}  # noqa: E731
    nodes = []
    for n in prog["nodes"]:
        if n["name"] == "ssum":
            nodes += [{"name": "ssum0", "op": "sum", "inputs": ["sq"], "attrs": {"dims": [0]}}, ar("ssum0r", "ssum0", "dp"),
                      {"name": "ssum", "op": "sum", "inputs": ["ssum0r"], "attrs": {"dims": [0]}}]
        elif n["name"] in ("gw2", "gb2", "gb1"):
            nodes += [dict(n, name=n["name"] + "_p"), ar(n["name"], n["name"] + "_p", "dp")]
        elif n["name"] == "gw1":
            nodes += [dict(n, name="gw1_p"),
                      {"name": "gw1_rs", "op": "reduce_scatter", "inputs": ["gw1_p"], "attrs": {"axis": "dp", "dim": 0}},
                      {"name": "gw1", "op": "all_gather", "inputs": ["gw1_rs"], "attrs": {"axis": "dp", "dim": 0}}]
        else:
            nodes.append(n)
    prog["nodes"] = nodes
    return d


def _partials() -> dict:
    """Partial(max) / Partial(avg) / Partial(sum) inputs on a (dp, tp) mesh, consumed by their collectives;
    a Partial(sum) through a matmul with a replicated operand; an all_reduce over dp with a tp Partial inside."""
    sh = ["n", "n"]
    return {
        "tvcert_plan": 1, "name": "partials_dp2_tp2", "dims": {"n": 4, "dp": 2, "tp": 2},
        "mesh": {"dp": "dp", "tp": "tp"},
        "logical": {"inputs": [{"name": k, "shape": sh, "dtype": "float"} for k in ("u", "v", "w", "s", "m", "wm", "g")],
                    "nodes": [{"name": "y", "op": "neg", "inputs": ["u"]},
                              {"name": "z", "op": "scale", "inputs": ["v"], "attrs": {"value": 2}},
                              {"name": "q", "op": "neg", "inputs": ["w"]},
                              {"name": "t", "op": "tanh", "inputs": ["s"]},
                              {"name": "mm", "op": "matmul", "inputs": ["m", "wm"]},
                              {"name": "gg", "op": "scale", "inputs": ["g"], "attrs": {"value": 3}}],
                    "outputs": ["y", "z", "q", "t", "mm", "gg"]},
        "parallel": [{"name": "spmd",
                      "inputs": [{"name": "u", "shape": sh, "dtype": "float"}, {"name": "v", "shape": sh, "dtype": "float"},
                                 {"name": "w", "shape": ["n/dp", "n"], "dtype": "float"},
                                 {"name": "s", "shape": ["n/dp", "n/tp"], "dtype": "float"},
                                 {"name": "m", "shape": sh, "dtype": "float"}, {"name": "wm", "shape": sh, "dtype": "float"},
                                 {"name": "g", "shape": sh, "dtype": "float"}],
                      "nodes": [{"name": "ur", "op": "all_reduce", "inputs": ["u"], "attrs": {"axis": "dp", "reduce": "max"}},
                                {"name": "y", "op": "neg", "inputs": ["ur"]},
                                {"name": "vr", "op": "all_reduce", "inputs": ["v"], "attrs": {"axis": "tp", "reduce": "avg"}},
                                {"name": "z", "op": "scale", "inputs": ["vr"], "attrs": {"value": 2}},
                                {"name": "wq", "op": "neg", "inputs": ["w"]},
                                {"name": "wr", "op": "all_reduce", "inputs": ["wq"], "attrs": {"axis": "tp", "reduce": "sum"}},
                                {"name": "q", "op": "all_gather", "inputs": ["wr"], "attrs": {"axis": "dp", "dim": 0}},
                                {"name": "t", "op": "tanh", "inputs": ["s"]},
                                {"name": "mp", "op": "matmul", "inputs": ["m", "wm"]},
                                {"name": "mm", "op": "all_reduce", "inputs": ["mp"], "attrs": {"axis": "tp", "reduce": "sum"}},
                                {"name": "gs", "op": "scale", "inputs": ["g"], "attrs": {"value": 3}},
                                {"name": "gd", "op": "all_reduce", "inputs": ["gs"], "attrs": {"axis": "dp", "reduce": "sum"}},
                                {"name": "gg", "op": "all_reduce", "inputs": ["gd"], "attrs": {"axis": "tp", "reduce": "sum"}}],
                      "outputs": ["y", "z", "q", "t", "mm", "gg"]}],
        "inputs": {"u": {"local": "u", "placement": {"dp": "Partial(max)"}},
                   "v": {"local": "v", "placement": {"tp": "Partial(avg)"}},
                   "w": {"local": "w", "placement": {"dp": "Shard(0)", "tp": "Partial(sum)"}},
                   "s": {"local": "s", "placement": {"dp": "Shard(0)", "tp": "Shard(1)"}},
                   "m": {"local": "m", "placement": {"tp": "Partial(sum)"}}, "wm": {"local": "wm", "placement": {}},
                   "g": {"local": "g", "placement": {"dp": "Partial(sum)", "tp": "Partial(sum)"}}},
        "outputs": {"y": {"local": "y", "placement": {}}, "z": {"local": "z", "placement": {}},
                    "q": {"local": "q", "placement": {}},
                    "t": {"local": "t", "placement": {"dp": "Shard(0)", "tp": "Shard(1)"}},
                    "mm": {"local": "mm", "placement": {}}, "gg": {"local": "gg", "placement": {}}},
    }


def _layouts() -> dict:
    """Layout, reduction and row-wise ops on a (dp, tp) mesh, one node per LayoutRule line."""
    f = lambda name, shape: {"name": name, "shape": shape, "dtype": "float"}  # noqa: E731
    N = lambda name, op, ins, **attrs: {"name": name, "op": op, "inputs": ins, "attrs": attrs}  # noqa: E731
    ar = lambda name, x, axis, red: N(name, "all_reduce", [x], axis=axis, reduce=red)  # noqa: E731
    common = [
        N("xp", "permute", ["x"], dims=[1, 0, 2]),                 # [b, a, c]: dp S(1), tp S(0)
        N("xs", "slice", ["xp"], dim=2, start=1, end=5),           # slice_other_dim
        N("sm", "softmax", ["xs"], dim=2),                         # softmax_other_dim
        N("ls", "log_softmax", ["xs"], dim=-1),
        N("sb", "softmax_backward", ["xs", "sm"], dim=2),          # softmax_bwd_other_dim
        N("lb", "log_softmax_backward", ["xs", "ls"], dim=2),
        N("cat", "concat", ["sm", "ls"], dim=2),                   # concat_other_dim
        N("as", "add_scalar", ["cat"], value=0.5),
        N("cf", "cast", ["as"], dtype="float"),
        N("mx1", "amax", ["cf"], dims=[2], keepdim=True),          # reduce_other_dim (keepdim)
        N("ssk", "sum", ["cf"], dims=[1], keepdim=True),           # reduce_sum_sharded_dim (dp)
        N("zc", "cast", ["z"], dtype="float"),
        N("mn", "minimum", ["sm", "ls"]),                          # pointwise op of shards
        N("xu", "unsqueeze", ["xs"], dim=0),                       # unsqueeze_shard: [1, b, a, 4]
        N("mx2", "maximum", ["xp", "w"]),                          # broadcasting: w [a, c] is Shard(0) over dp
        N("oh", "one_hot", ["tok"], num_classes="c"),              # one_hot_shard of integer ids: [a, b, c]
        N("io", "iota", [], size="c"),                             # congruence (no operand)
        N("iof", "cast", ["io"], dtype="float"),
        N("g", "gt", ["oh", "iof"]),                               # comparison of shards, broadcasting
        N("mf", "masked_fill", ["x", "g"], value=-2),              # masked_fill with an integer mask
        N("bm", "matmul", ["x", "wm"]),                            # einsum_free_letter: batch (dp), rows (tp)
        N("ux", "mul", ["x", "u"]),                                # u [a, 1, c]: replicated over tp, size 1 on b
        N("tq", "permute", ["x"], dims=[0, 2, 1]),                 # [a, c, b]: dp S(0), tp S(2)
        N("tq2", "square", ["tq"]),
        N("k4", "const", [], value=4),
    ]
    rms = [N("rs", "add_scalar", ["ms"], value=0.5), N("rr", "rsqrt", ["rs"]),
           N("nx", "mul", ["tq", "rr"])]                           # RMSNorm: [a, c, b] * [a, c, 1] (size-1 broadcast)
    logical = common + [N("ms", "mean", ["tq2"], dims=[-1], keepdim=True)] + rms + [
        N("xr", "reshape", ["x"], shape=["a", 24]),                # reshape_shard: merged dims after the shard
        N("xe", "expand", ["u"], shape=["a", "b", "c"]),           # expand_shard (u is Shard(0) over dp)
        N("xs2", "sum", ["x"], dims=[0, 2]),                       # sum over several dims of a shard
        N("xd", "div", ["xs2", "k4"]), N("xm", "mul", ["k4", "xs2"]),  # a partial sum over / times a replicated
        N("m1", "mean", ["cat"], dims=[0]),                        # reduce_mean_sharded_dim (tp)
        N("mx", "amax", ["xs"], dims=[1]),                         # reduce_max_sharded_dim (dp)
        N("s2", "sum", ["sm"], dims=[0]),
        N("s2p", "permute", ["s2"], dims=[1, 0]),                  # permute of a Partial(sum) (tp)
        N("yr", "reshape", ["y"], shape=[2, 8]),                   # reshape of a Partial(sum)
        N("wg", "einsum", ["x", "x"], equation="abc,abd->cd"),     # einsum_contracted_letter on both axes
        N("wsq", "square", ["wg"]), N("wss", "sum", ["wsq"], dims=[0, 1]), N("wn", "sqrt", ["wss"]),  # its norm
        N("dn", "add", ["wss", "wss"]),
    ]
    par = copy.deepcopy(common) + [N("msp", "mean", ["tq2"], dims=[-1], keepdim=True), ar("ms", "msp", "tp", "avg")] + \
        copy.deepcopy(rms) + [
        N("xr", "reshape", ["x"], shape=["a/dp", 12]),             # each rank reshapes to its local shape
        N("xe", "expand", ["u"], shape=["a/dp", "b", "c"]),
        N("xs2p", "sum", ["x"], dims=[0, 2]),                      # dp: Partial(sum), tp: Shard(0)
        N("xdp", "div", ["xs2p", "k4"]), ar("xd", "xdp", "dp", "sum"),
        N("xmp", "mul", ["k4", "xs2p"]), ar("xm", "xmp", "dp", "sum"),
        N("m1p", "mean", ["cat"], dims=[0]), ar("m1", "m1p", "tp", "avg"),
        ar("sskr", "ssk", "dp", "sum"),
        N("mxp", "amax", ["xs"], dims=[1]), ar("mx", "mxp", "dp", "max"),
        N("s2", "sum", ["sm"], dims=[0]),
        N("s2pp", "permute", ["s2"], dims=[1, 0]), ar("s2p", "s2pp", "tp", "sum"),
        N("yrp", "reshape", ["y"], shape=[2, 8]), ar("yr", "yrp", "tp", "sum"),
        N("zs1", "slice", ["zc"], dim=0, start="rank.tp*2", end="rank.tp*2+2"),   # slice_block_to_shard (tp)
        N("zs2", "slice", ["zs1"], dim=1, start="rank.dp*3", end="(rank.dp+1)*3"),  # then over dp, tp inside
        N("wgp", "einsum", ["x", "x"], equation="abc,abd->cd"), ar("wgt", "wgp", "tp", "sum"),
        ar("wg", "wgt", "dp", "sum"), N("wsq", "square", ["wg"]), N("wss", "sum", ["wsq"], dims=[0, 1]), N("wn", "sqrt", ["wss"]),
        # a replicated norm term over the tp size: a Partial(sum) on tp that the all_reduce counts once (dedup_ok)
        N("tpc", "const", [], value="tp"), N("wssd", "div", ["wss", "tpc"]), N("dnp", "add", ["wssd", "wssd"]),
        ar("dn", "dnp", "tp", "sum"),
    ]
    outs = ["xs", "sm", "ls", "sb", "lb", "cat", "cf", "mx1", "ssk", "m1", "mx", "s2p", "yr", "zc", "mn", "mx2", "xu",
            "oh", "g", "mf", "bm", "wg", "wn", "ux", "nx", "xr", "xe", "xd", "xm", "dn"]
    sh = {"dp": "Shard(1)", "tp": "Shard(0)"}
    place = {o: sh for o in ["xs", "sm", "ls", "sb", "lb", "cat", "cf", "mx1", "mn", "mx2"]}
    place.update({o: {"dp": "Shard(0)", "tp": "Shard(1)"} for o in ("oh", "g", "mf", "bm", "ux", "xr")})
    place.update(xe={"dp": "Shard(0)"}, xd={"tp": "Shard(0)"}, xm={"tp": "Shard(0)"})
    place.update(nx={"dp": "Shard(0)", "tp": "Shard(2)"})
    place.update(xu={"dp": "Shard(2)", "tp": "Shard(1)"}, ssk={"tp": "Shard(0)"}, m1={"dp": "Shard(0)"}, mx={"tp": "Shard(0)"}, s2p={"dp": "Shard(1)"}, yr={},
                 zc={"dp": "Shard(1)", "tp": "Shard(0)"}, wg={}, wn={}, dn={})
    local = {o: o for o in outs}
    local.update(zc="zs2", ssk="sskr")
    return {
        "tvcert_plan": 1, "name": "layouts_dp2_tp2", "dims": {"a": 4, "b": 4, "c": 6, "dp": 2, "tp": 2},
        "mesh": {"dp": "dp", "tp": "tp"},
        "logical": {"inputs": [f("x", ["a", "b", "c"]), f("y", [4, 4]), f("z", [4, 6]), f("w", ["a", "c"]),
                               {"name": "tok", "shape": ["a", "b"], "dtype": "int", "range": "c"}, f("wm", ["c", 2]),
                               f("u", ["a", 1, "c"])],
                    "nodes": logical,
                    "outputs": outs},
        "parallel": [{"name": "spmd", "inputs": [f("x", ["a/dp", "b/tp", "c"]), f("y", [4, 4]), f("z", [4, 6]),
                                                 f("w", ["a/dp", "c"]),
                                                 {"name": "tok", "shape": ["a/dp", "b/tp"], "dtype": "int"},
                                                 f("wm", ["c", 2]), f("u", ["a/dp", 1, "c"])],
                      "nodes": par, "outputs": [local[o] for o in outs]}],
        "inputs": {"x": {"local": "x", "placement": {"dp": "Shard(0)", "tp": "Shard(1)"}},
                   "y": {"local": "y", "placement": {"tp": "Partial(sum)"}},
                   "z": {"local": "z", "placement": {}}, "w": {"local": "w", "placement": {"dp": "Shard(0)"}},
                   "tok": {"local": "tok", "placement": {"dp": "Shard(0)", "tp": "Shard(1)"}},
                   "wm": {"local": "wm", "placement": {}}, "u": {"local": "u", "placement": {"dp": "Shard(0)"}}},
        "outputs": {o: {"local": local[o], "placement": place[o]} for o in outs},
    }


def test_layout_plans_coq_checked(tmp_path):
    """Every LayoutRule line and the rank-dependent slice on a (dp, tp) mesh, and examples/heads_ok.json
    (reshape, transpose, this rank's heads): VERIFIED, run equal, Coq-checked."""
    p = tmp_path / "layouts.json"
    p.write_text(json.dumps(_layouts()))
    plan = load_plan(p)
    assert run_plan(plan, plan.dims, seed=0, exact=True).equal
    out = tmp_path / "layouts.v"
    r = CliRunner().invoke(main, ["verify", str(p), "--emit-coq", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert "VERIFIED (Coq-checked)" in r.output and out.exists()
    text = out.read_text()
    for c in ("(GL (Permute [:: 1; 0; 2]))", "(GL (Slice 2 1 5))", "(GL (Softmax 2 0))", "(GL (LogSoftmax 2 0 1))",
              "(GL (SoftmaxBwd 2))", "(GL Minimum)", "(GL Maximum)", "(GL (Unsqueeze 0))", "(GL (LogSoftmaxBwd 2 0))", "(GL (Concat 2))", "(GL (Reduce RdMean [:: 0] false))",
              "(GL (Reduce RdMax [:: 1] false))", "(GL (Reduce RdSum [:: 1] true))", "(GL (Reshape [:: 2; 8]))",
              "PColl (CSliceRank 0 2) 1", "PColl (CSliceRank 1 3) 0", "[:: (Partial RMax); (Shard 0)]",
              "[:: (Shard 0); (Partial RAvg)]", "[:: Replicate; (Partial RSum)]", "(GL (OneHot 6))",
              "(GL (Iota 6 0 1))", "(GL (Cmp CGt))", "(GL (MaskedFill (true, (Npos 2%positive), (Npos 1%positive))))",
              "(GL (Einsum [:: [:: 0; 1; 2]; [:: 2; 3]] [:: 0; 1; 3]))", "(GL (Reshape [:: 2; 12]))",
              "(GL (Expand [:: 2; 4; 6]))"):
        assert c in text, c
    text, _, _ = emit(load_plan(EX / "heads_ok.json"))
    assert "PColl (CSliceRank 1 2) 0" in text
    res = check_text(text)
    assert res.ok, res.message


def test_rank_slice_printer_refuses_other_bounds():
    """The trusted printer writes CSliceRank d m only when, at every rank r of one axis, the slice is
    x[r*m : r*m+m] along one dim; anything else is outside the fragment (no Coq term)."""
    base = _layouts()
    bad = {
        "bounds naming two axes": dict(start="rank.tp*2+rank.dp*0", end="rank.tp*2+2+rank.dp*0"),
        "overlapping blocks (start r, not 2r)": dict(start="rank.tp", end="rank.tp+2"),
    }
    for what, attrs in bad.items():
        d = copy.deepcopy(base)
        _nodes(d)["zs1"]["attrs"].update(attrs)
        plan = load_plan(d)
        if "overlapping" in what:
            assert not run_plan(plan, plan.dims, seed=0, exact=False).equal
        with pytest.raises(NotCovered) as ei:
            translate(plan)
        assert any(u.node == "zs1" for u in ei.value.items), (what, ei.value.items)


def test_mesh_plans_coq_checked(tmp_path):
    """Both 2-axis plans verify in Python, run equal, and are Coq-checked (the CLI route for one of them)."""
    p2 = tmp_path / "mlp_dp2_tp2.json"
    p2.write_text(json.dumps(_mlp_dp_tp()))
    out = tmp_path / "mlp_dp2_tp2.v"
    r = CliRunner().invoke(main, ["verify", str(p2), "--emit-coq", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert "VERIFIED (Coq-checked)" in r.output and out.exists()
    text = out.read_text()
    for c in ("PColl (CAllReduce RSum) 1", "PColl (CAllReduce RSum) 0", "PColl (CReduceScatter 0) 0",
              "PColl (CAllGather 0) 0", "mesh := [:: 2; 2]"):
        assert c in text, c
    plan = load_plan(_partials())
    assert run_plan(plan, plan.dims, seed=0, exact=True).equal
    text, cp, cert = emit(plan)
    assert "(Partial RMax)" in text and "(CAllReduce RAvg)" in text
    res = check_text(text)
    assert res.ok, res.message


# ------------------------------------------------------------------ negatives: Coq's check says false
def _variant(base: dict, f) -> dict:
    d = copy.deepcopy(base)
    f(d)
    return d


def _nodes(d) -> dict:
    return {n["name"]: n for n in d["parallel"][0]["nodes"]}


def _mutations() -> list[tuple[str, dict, dict]]:
    """(name, wrong plan, the correct plan it mutates); each is shown wrong by the interpreter below."""
    one = json.loads((EX / "mlp_tp2.json").read_text())
    two = _mlp_dp_tp()
    par = _partials()
    out = []

    def v(name, base, f):
        out.append((name, _variant(base, f), base))

    def exp_of_partial(d):  # exp of a Partial(sum), then all_reduce (logical: exp of the matmul)
        for n in d["logical"]["nodes"]:
            if n["name"] == "o":
                n["name"] = "o_mm"
        d["logical"]["nodes"].insert(4, {"name": "o", "op": "exp", "inputs": ["o_mm"]})
        d["parallel"][0]["nodes"].insert(4, {"name": "o_exp", "op": "exp", "inputs": ["o_part"]})
        _nodes(d)["o"]["inputs"] = ["o_exp"]

    v("1d: no all_reduce", one, lambda d: _nodes(d)["o"].update(op="scale", attrs={"value": 1}))
    v("1d: all_reduce twice", one, lambda d: _nodes(d)["y"].update(inputs=["o2", "b2"]) or
      d["parallel"][0]["nodes"].insert(5, {"name": "o2", "op": "all_reduce", "inputs": ["o"],
                                           "attrs": {"axis": "tp", "reduce": "sum"}}))
    v("1d: gb2 read as partial", one, lambda d: d["outputs"]["gb2"]["placement"].update(tp="Partial(sum)"))
    v("1d: loss scale changed", one, lambda d: _nodes(d)["loss"]["attrs"].update(value=0.25))
    v("1d: tanh replaced by exp", one, lambda d: _nodes(d)["hid"].update(op="exp"))
    v("1d: dtanh sign", one, lambda d: _nodes(d)["dtanh"].update(inputs=["hsq", "one"]))
    v("2d: no tp all_reduce", two, lambda d: _nodes(d)["o"].update(op="scale", attrs={"value": 1}))
    v("2d: all_reduce over dp, not tp", two, lambda d: _nodes(d)["o"]["attrs"].update(axis="dp"))
    v("2d: loss all_reduce over tp, not dp", two, lambda d: _nodes(d)["ssum0r"]["attrs"].update(axis="tp"))
    v("2d: gw2 all_reduce over tp, not dp", two, lambda d: _nodes(d)["gw2"]["attrs"].update(axis="tp"))
    v("2d: gw1 all_gather over tp, not dp", two, lambda d: _nodes(d)["gw1"]["attrs"].update(axis="tp"))
    v("2d: x sharded on the tp axis, not dp", two, lambda d: d["inputs"]["x"].update(placement={"tp": "Shard(0)"}))
    v("2d: exp of a partial sum", two, exp_of_partial)
    v("2d: nested shard order swapped (reduce_scatter over the outer axis)", two,
      lambda d: _nodes(d)["gw2"].update(op="reduce_scatter", attrs={"axis": "dp", "dim": 0}) or
      d["outputs"]["gw2"].update(placement={"dp": "Shard(0)", "tp": "Shard(0)"}))
    v("partials: t read with the shard dims swapped", par,
      lambda d: d["outputs"]["t"].update(placement={"dp": "Shard(1)", "tp": "Shard(0)"}))
    v("partials: s placed on dim 1 over dp (wrong dim)", par,
      lambda d: d["inputs"]["s"].update(placement={"dp": "Shard(1)", "tp": "Shard(0)"}))
    v("partials: Partial(sum) @ Partial(sum)", par,
      lambda d: d["inputs"]["wm"].update(placement={"tp": "Partial(sum)"}))
    v("partials: the tp all_reduce of a Partial on both axes missing", par,
      lambda d: _nodes(d)["gg"].update(op="scale", attrs={"value": 1}))
    v("partials: Partial(max) all_reduced as sum", par, lambda d: _nodes(d)["ur"]["attrs"].update(reduce="sum"))
    v("partials: Partial(avg) all_reduced as sum", par, lambda d: _nodes(d)["vr"]["attrs"].update(reduce="sum"))
    v("partials: Partial(max) all_reduced over tp", par, lambda d: _nodes(d)["ur"]["attrs"].update(axis="tp"))
    v("partials: all_gather before the tp all_reduce's operand is summed", par,
      lambda d: _nodes(d)["wr"].update(op="neg", attrs={}))
    _layout_mutations(v)
    return out


def _layout_mutations(v) -> None:
    """Wrong plans through each new rule (LayoutRule.lrule, Mesh.CSliceRank)."""
    lay = _layouts()

    def both(d, name, **attrs):  # change a node of the logical graph and of the program alike
        for g in (d["logical"], d["parallel"][0]):
            for n in g["nodes"]:
                if n["name"] == name:
                    n["attrs"].update(attrs)

    def softmax_of_partial(d, op="softmax"):  # softmax of the Partial(sum) s2 before its all_reduce
        j = [n["name"] for n in d["logical"]["nodes"]].index("s2p")
        d["logical"]["nodes"].insert(j, {"name": "s2s", "op": op, "inputs": ["s2"], "attrs": {"dim": 1}})
        [n for n in d["logical"]["nodes"] if n["name"] == "s2p"][0]["inputs"] = ["s2s"]
        i = [n["name"] for n in d["parallel"][0]["nodes"]].index("s2pp")
        d["parallel"][0]["nodes"].insert(i, {"name": "s2s", "op": op, "inputs": ["s2"], "attrs": {"dim": 1}})
        _nodes(d)["s2pp"]["inputs"] = ["s2s"]

    v("layout: softmax of a partial sum", lay, softmax_of_partial)
    v("layout: log_softmax of a partial sum", lay, lambda d: softmax_of_partial(d, "log_softmax"))
    v("layout: permuted shard read with the old dims", lay,
      lambda d: d["outputs"]["xs"].update(placement={"dp": "Shard(0)", "tp": "Shard(1)"}))
    v("layout: slice across the dp shard boundary (local bounds)", lay,
      lambda d: [n for n in d["logical"]["nodes"] if n["name"] == "xs"][0]["attrs"].update(dim=1, start=1, end=3)
      or _nodes(d)["xs"]["attrs"].update(dim=1, start=1, end=2))
    v("layout: concat along the tp-sharded dim", lay, lambda d: both(d, "cat", dim=0))
    v("layout: softmax along the tp-sharded dim", lay, lambda d: both(d, "sm", dim=0))
    v("layout: mean over the tp-sharded dim without its all_reduce", lay,
      lambda d: d["outputs"]["m1"].update(local="m1p"))
    v("layout: mean's Partial(avg) all_reduced as sum", lay, lambda d: _nodes(d)["m1"]["attrs"].update(reduce="sum"))
    v("layout: amax's Partial(max) all_reduced as sum", lay, lambda d: _nodes(d)["mx"]["attrs"].update(reduce="sum"))
    v("layout: amax over the tp-sharded dim without an all_reduce", lay,
      lambda d: both(d, "mx1", dims=[0]) or d["outputs"]["mx1"].update(placement={"dp": "Shard(1)"}))
    v("layout: sum(keepdim) over the dp-sharded dim without its all_reduce", lay,
      lambda d: d["outputs"]["ssk"].update(local="ssk"))
    v("layout: reshaped Partial(sum) read as Replicate", lay, lambda d: d["outputs"]["yr"].update(local="yrp"))
    v("layout: softmax_backward operands swapped in the program", lay,
      lambda d: _nodes(d)["sb"].update(inputs=["sm", "xs"]))
    v("layout: rank slice over dp, read as a tp shard", lay,
      lambda d: _nodes(d)["zs1"]["attrs"].update(start="rank.dp*2", end="rank.dp*2+2"))
    v("layout: maximum's broadcast operand sharded over tp, not dp", lay,
      lambda d: d["inputs"]["w"].update(placement={"tp": "Shard(0)"}))
    v("layout: unsqueezed shard read with the dims swapped", lay,
      lambda d: d["outputs"]["xu"].update(placement={"dp": "Shard(1)", "tp": "Shard(2)"}))
    v("int: one_hot of ids read with the shard dims swapped", lay,
      lambda d: d["outputs"]["oh"].update(placement={"dp": "Shard(1)", "tp": "Shard(0)"}))
    v("int: ids given with the shard dims swapped (masked_fill's mask off x's blocks)", lay,
      lambda d: d["inputs"]["tok"].update(placement={"dp": "Shard(1)", "tp": "Shard(0)"}))
    v("int: gt operands swapped in the program", lay, lambda d: _nodes(d)["g"].update(inputs=["iof", "oh"]))
    v("int: iota starting at 1 in the program", lay, lambda d: _nodes(d)["io"]["attrs"].update(start=1))
    v("bmm: batched matmul read with the shard dims swapped", lay,
      lambda d: d["outputs"]["bm"].update(placement={"dp": "Shard(1)", "tp": "Shard(0)"}))
    v("einsum: weight gradient without its dp all_reduce", lay, lambda d: d["outputs"]["wg"].update(local="wgt"))
    v("einsum: weight gradient all_reduced over tp twice, never over dp", lay,
      lambda d: _nodes(d)["wg"]["attrs"].update(axis="tp"))
    def norm_of_partial(d):  # the gradient norm computed per dp rank from its partial sum, then summed
        _nodes(d)["wsq"]["inputs"] = ["wgt"]
        _nodes(d)["wn"]["name"] = "wnp"
        d["parallel"][0]["nodes"].append({"name": "wn", "op": "all_reduce", "inputs": ["wnp"],
                                          "attrs": {"axis": "dp", "reduce": "sum"}})

    v("einsum: gradient norm over a partial sum (clip norm before the dp all_reduce)", lay, norm_of_partial)
    v("bmm: the program's batched matmul reads x transposed (no logical node)", lay,
      lambda d: _nodes(d)["bm"].update(inputs=["xp", "wm"]))
    v("rmsnorm: rsqrt of a shard's partial mean-square (no tp all_reduce)", lay,
      lambda d: _nodes(d)["rs"].update(inputs=["msp"]))
    def reshape_inner(d):  # [a, b, c] -> [a*b, c] with b the tp-sharded dim: a rank's rows are not one block
        for n in (_nodes(d)["xr"], {m["name"]: m for m in d["logical"]["nodes"]}["xr"]):
            n["attrs"]["shape"] = [4, 6] if n in d["parallel"][0]["nodes"] else [16, 6]
        d["outputs"]["xr"]["placement"] = {"dp": "Shard(0)", "tp": "Shard(0)"}

    v("reshape: a tp shard merged with the dim outside it, read as a row block", lay, reshape_inner)
    v("sum: the dp partial sum over / times a constant read without its all_reduce", lay,
      lambda d: d["outputs"]["xd"].update(local="xdp"))
    v("norm: a replicated term all_reduced over tp without its division by tp", lay,
      lambda d: _nodes(d)["dnp"].update(inputs=["wss", "wss"]))
    v("sum: the dp partial sum times a constant all_reduced over tp instead of dp", lay,
      lambda d: _nodes(d)["xm"]["attrs"].update(axis="tp"))
    v("layout: rank slice blocks reversed", lay,
      lambda d: _nodes(d)["zs1"]["attrs"].update(start="(1-rank.tp)*2", end="(1-rank.tp)*2+2"))


def _forged_cert(cp, good: dict[str, tuple]) -> list[tuple]:
    """Reuse the correct plan's facts by node name (what a buggy search might claim)."""
    return [good.get(n.name, (len(cp.l_inputs), (R_,) * len(cp.mesh))) for n in cp.p_nodes]


def _body(text: str, k: int) -> str:
    """The plan, certificate and auxiliary consts of an emitted file, renamed for the k-th ``mcheckx``."""
    body = text[text.index("Definition the_plan"):text.index("(* Printer check")] + \
        text[text.index("Definition the_xs"):text.index("Lemma the_check")]
    return body.replace("the_plan", f"plan_{k}").replace("the_cert", f"cert_{k}").replace("the_xs", f"xs_{k}") \
        .replace("the_nat", f"nat_{k}")


def test_mutants_are_wrong_and_coq_check_is_false():
    goods: dict[str, dict] = {}
    lines, names = [], []
    for name, d, base in _mutations():
        plan = load_plan(d)
        res = run_plan(plan, plan.run_dims or plan.dims, seed=0, exact=False)
        assert not res.equal, f"mutation {name} is not wrong"
        try:
            cp = translate(plan)
        except NotCovered:
            continue
        with pytest.raises(NotCovered):
            search(cp)
        key = base["name"]
        if key not in goods:
            gcp = translate(load_plan(base))
            goods[key] = ({n.name: f for n, f in zip(gcp.p_nodes, search(gcp))}, gcp.x_nodes)
        cp.x_nodes = goods[key][1]  # the correct plan's auxiliary consts, as its facts name them
        lines.append(_body(render(cp, _forged_cert(cp, goods[key][0])), len(names)))
        lines.append(f"Eval vm_compute in mcheckx plan_{len(names)} xs_{len(names)} cert_{len(names)}.")
        names.append(name)
    assert len(names) >= 30, names
    # the correct 2-axis plan with tampered facts
    good_cp = translate(load_plan(_mlp_dp_tp()))
    good_cert = search(good_cp)
    idx = {n.name: i for i, n in enumerate(good_cp.p_nodes)}
    S = lambda d: Pl("S", d)  # noqa: E731
    tampers = {
        "o_part claimed (Shard(0), Replicate)": ("o_part", (S(0), R_)),
        "gw1_rs claimed (Shard(1), Shard(1))": ("gw1_rs", (S(1), S(1))),
        "gw2 claimed (Replicate, Replicate)": ("gw2", (R_, R_)),
        "ssum0 claimed (Replicate, Replicate)": ("ssum0", (R_, R_)),
        "hid claimed with the axes swapped": ("hid", (S(1), S(0))),
        "gb1_p claimed (Partial(max), Shard(0))": ("gb1_p", (Pl("P", reduce="max"), S(0))),
        "a claimed on one axis only": ("a", (S(0),)),
    }
    for what, (node, pls) in tampers.items():
        c = list(good_cert)
        c[idx[node]] = (c[idx[node]][0], pls)
        lines.append(_body(render(good_cp, c), len(names)))
        lines.append(f"Eval vm_compute in mcheckx plan_{len(names)} xs_{len(names)} cert_{len(names)}.")
        names.append(what)
    k = len(names)
    lines.append(_body(render(good_cp, good_cert), k))
    lines.append(f"Eval vm_compute in mcheckx plan_{k} xs_{k} cert_{k}.")
    # the control on the (dp, tp) layout plan too (its facts name an auxiliary const)
    lay_cp = translate(load_plan(_layouts()))
    lines.append(_body(render(lay_cp, search(lay_cp)), k + 1))
    lines.append(f"Eval vm_compute in mcheckx plan_{k + 1} xs_{k + 1} cert_{k + 1}.")
    head = ("From mathcomp Require Import all_ssreflect.\nFrom Coq Require Import BinPosDef.\n"
            "From TVCert Require Import IR.Syntax IR.Denote IR.LayoutOps IR.Check IR.Mesh IR.MeshCheck IR.NatTable.\n"
            "Import JSyntax JDenote JLayout JCheck JMesh JMeshCheck JNatTable.\n")
    out = _coqc(head + "\n".join(lines))
    verdicts = re.findall(r"=\s*(true|false)\s*:\s*bool", out)
    assert len(verdicts) == len(names) + 2, out
    for name, v in zip(names, verdicts):
        assert v == "false", f"Coq's check accepted {name}"
    assert verdicts[-2:] == ["true", "true"]  # the controls: the untampered certificates


def test_tampered_certificate_rejected_by_coqc():
    cp = translate(load_plan(EX / "mlp_tp2.json"))
    cert = search(cp)
    i = [n.name for n in cp.p_nodes].index("o_part")
    cert[i] = (cert[i][0], (R_,))
    res = check_text(render(cp, cert))
    assert not res.ok and "coqc rejected" in res.message


def test_soundness_plans_get_no_coq_theorem():
    """The held-out-style wrong plans of ../shared/soundness: no certificate can be emitted for them."""
    d = ROOT.parent / "shared" / "soundness"
    plans = sorted(p for p in d.glob("*.json") if not p.name.endswith(".cert.json")) if d.is_dir() else []
    if not plans:
        pytest.skip("../shared/soundness not present")
    for p in plans:
        try:
            plan = load_plan(p)
        except Exception:  # noqa: BLE001 - the loader refuses it: nothing to emit
            continue
        with pytest.raises(NotCovered):
            emit(plan)


# ------------------------------------------------------------------ link: Coq denotation = interpreter
def _frac_coq(x: Fraction) -> str:
    return f"(lit Q {_rat(x)})"


def _tensor_coq(a: np.ndarray) -> str:
    rows = [f"([:: {'; '.join(map(str, idx))}], {_frac_coq(Fraction(a[idx]))})" for idx in np.ndindex(*a.shape)]
    return f"(tab [:: {'; '.join(rows)}])"


def _rand(shape, rng):
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        out[idx] = Fraction(int(rng.integers(-9, 10)) or 1, int(rng.choice([1, 2, 3, 5])))
    return out


CASES = [  # (IR op, attrs, input shapes, covered Coq op)
    ("add", {}, [(2, 3), (2, 3)]), ("add", {}, [(2, 3), (3,)]), ("add", {}, [(), (2, 2)]),
    ("sub", {}, [(2, 3), (3,)]), ("mul", {}, [(3, 2), (3, 2)]), ("mul", {}, [(2, 1), (2, 3)]),
    ("div", {}, [(2, 3), (3,)]), ("div", {}, [(2, 2), ()]),
    ("neg", {}, [(2, 2)]), ("square", {}, [(3,)]), ("scale", {"value": 0.5}, [(2, 2)]),
    ("scale", {"value": -3}, [(3,)]), ("tanh", {}, [(2, 3)]), ("exp", {}, [(3,)]), ("relu", {}, [(4,)]),
    ("const", {"value": 0.25, "shape": [2, 2]}, []), ("matmul", {}, [(2, 3), (3, 2)]),
    ("sum", {"dims": [0]}, [(2, 3)]), ("sum", {"dims": [1]}, [(2, 3)]), ("sum", {"dims": [0, 1]}, [(2, 3)]),
    ("sum", {"dims": [-1, 0]}, [(2, 2, 3)]), ("transpose", {"dim0": 0, "dim1": 1}, [(2, 3)]),
    ("transpose", {"dim0": 0, "dim1": 2}, [(2, 1, 3)]),
]
COLLECTIVES = [  # (IR op, attrs without the axis, local shape, Coq coll) on a (2, 2) mesh, over either axis
    ("all_reduce", {"reduce": "sum"}, (2, 3), "(CAllReduce RSum)"), ("all_reduce", {"reduce": "avg"}, (2, 3), "(CAllReduce RAvg)"),
    ("all_reduce", {"reduce": "max"}, (3,), "(CAllReduce RMax)"), ("all_gather", {"dim": 0}, (2, 3), "(CAllGather 0)"),
    ("all_gather", {"dim": 1}, (2, 3), "(CAllGather 1)"), ("reduce_scatter", {"dim": 0}, (2, 3), "(CReduceScatter 0)"),
    ("reduce_scatter", {"dim": 1}, (3, 2), "(CReduceScatter 1)"),
]


def test_link_denotation_matches_exact_interpreter():
    from tvcert.coqjudge.emit import FN_OPS, _op

    rng = np.random.default_rng(7)
    ctx = Ctx(exact=True, seed=0)
    blocks, expect = [], []
    for op, attrs, shapes in CASES:
        spec = REGISTRY[op]
        ra = resolve_attrs(spec, attrs, {})
        xs = [_rand(s, rng) for s in shapes]
        want = spec.eval([x.copy() for x in xs], ra, ctx)[0]

        class N:  # the emitter's view of a node
            pass
        n = N()
        n.op = op
        fns: list[str] = []
        cop = _op(n, dict(ra), [tuple(s) for s in shapes], ["tp"], fns)
        table = ""
        decode = None
        if op in FN_OPS:
            # Fn is uninterpreted: Coq gets a table sending the k-th distinct input to k+1 (small numbers keep
            # vm_compute fast), and each Coq output is decoded back to the input it was applied to, which must be
            # the input the interpreter's function gave the value at that index.
            vals = sorted({Fraction(v) for v in xs[0].ravel()})
            rows = "; ".join(f"({_frac_coq(v)}, {_frac_coq(Fraction(k + 1))})" for k, v in enumerate(vals))
            table = f"[:: {rows}]"
            exact_fn = (lambda v: max(v, Fraction(0))) if op == "relu" else (lambda v, op=op: table_value(op, v, 0))
            decode = (vals, exact_fn)
        fn = f"(fun _ x => nth 0%R (map snd {table}) (seq.index x (map fst {table})))" if table else "(fun _ x => x)"
        idxs = [list(i) for i in np.ndindex(*want.shape)]
        ss = "[:: " + "; ".join("[:: " + "; ".join(map(str, s)) + "]" for s in shapes) + "]" if shapes else "[::]"
        ts = "[:: " + "; ".join(_tensor_coq(x) for x in xs) + "]" if xs else "[::]"
        ix = "[:: " + "; ".join("[:: " + "; ".join(map(str, i)) + "]" for i in idxs) + "]"
        blocks.append(f"Eval vm_compute in map (fun i => let v := op_val {fn} {coq_op(cop)} {ss} {ts} i in "
                      f"(numq v, denq v)) {ix}.")
        expect.append((f"{op}{attrs}{shapes}", [Fraction(want[tuple(i)]) for i in idxs], decode))
    ranks = [(0, 0), (0, 1), (1, 0), (1, 1)]
    for op, attrs, shape, ccoll in COLLECTIVES:
        spec = REGISTRY[op]
        xs = {r: _rand(shape, rng) for r in ranks}
        fam = ("(fun c => nth (zero_t Q) [:: " + "; ".join(_tensor_coq(xs[r]) for r in ranks) +
               "] (nth 0%N c 0 * 2 + nth 0%N c 1))")
        for k, axis in enumerate(("dp", "tp")):
            ra = dict(resolve_attrs(spec, dict(attrs, axis=axis), {}))
            ra["_p"] = 2
            want = {}
            for fixed in (0, 1):  # the group of ranks that differ only on axis k
                grp = [r for r in ranks if r[1 - k] == fixed]
                want.update(zip(grp, spec.simulate([xs[r].copy() for r in grp], ra, ctx)))
            for r in ranks:
                idxs = [list(i) for i in np.ndindex(*want[r].shape)]
                ix = "[:: " + "; ".join("[:: " + "; ".join(map(str, i)) + "]" for i in idxs) + "]"
                blocks.append(f"Eval vm_compute in map (fun i => let v := coll_step [:: 2; 2] {ccoll} {k} "
                              f"[:: {'; '.join(map(str, shape))}] {fam} [:: {r[0]}; {r[1]}] i in (numq v, denq v)) {ix}.")
                expect.append((f"{op}{attrs} axis {k} rank {r}", [Fraction(want[r][tuple(i)]) for i in idxs], None))
    head = ("From mathcomp Require Import all_ssreflect all_algebra.\nFrom Coq Require Import BinPosDef.\n"
            "From TVCert Require Import IR.Syntax IR.Denote IR.Mesh.\nImport JSyntax JDenote JMesh.\n"
            "Notation Q := rat_realFieldType.\n"
            "Definition tab (xs : seq (seq nat * rat)) : tensor Q :=\n"
            "  fun i => nth 0%R (map snd xs) (seq.index i (map fst xs)).\n")
    out = _coqc(head + "\n".join(blocks))
    results = re.findall(r"=\s*\[::(.*?)\]\s*:\s*seq", out, flags=re.S)
    assert len(results) == len(expect), out[:3000]
    for (what, want, decode), got in zip(expect, results):
        pairs = re.findall(r"\(\s*\(?(-?\d+)\)?%Z\s*,\s*\(?(-?\d+)\)?%Z\s*\)", got)
        vals = [Fraction(int(a), int(b)) for a, b in pairs]
        if decode is not None:
            inputs, f = decode
            assert all(v.denominator == 1 and 1 <= v <= len(inputs) for v in vals), (what, vals)
            vals = [f(inputs[int(v) - 1]) for v in vals]
        assert vals == want, f"{what}: Coq {vals} != interpreter {want}"


def test_div_plan_coq_checked():
    """A plan dividing a column shard by its sharded bias (broadcast) is Coq-checked too."""
    d = json.loads((EX / "mlp_tp2.json").read_text())
    for g in (d["logical"], d["parallel"][0]):
        for n in g["nodes"]:
            if n["name"] == "hid":
                n.update(op="div", inputs=["a1", "b1"])
    text, _, _ = emit(load_plan(d))
    assert "GNode (GO Div)" in text
    res = check_text(text)
    assert res.ok, res.message


def test_llama3_zero1_step_coq_checked(tmp_path):
    """The issue's first-stage plan: `tvcert plan llama3-8b --layers 2 --tp 2 --dp 2 --zero 1` at small dims
    (forward, backward, gradients flattened and reduce_scattered over dp, clipping, AdamW on the flat shards,
    parameters all_gathered and reshaped back; 42 flat optimizer-state inputs and outputs) gets a Coq theorem
    whose assumptions are within the allowlist (one coqc run, ~25 s of coqc CPU on an idle machine; its wrong
    variants are in bench/coq_judge_scaling.py llama)."""
    out = tmp_path / "llama.json"
    r = CliRunner().invoke(main, ["plan", "llama3-8b", "--layers", "2", "--tp", "2", "--dp", "2", "--zero", "1",
                                  "--dims", "h=8,f=16,v=16,s=4,hd=4,nh=4,nkv=2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    text, cp, _ = emit(load_plan(d, check_run_dims=False))
    steps = sum(len(b.get("layout", [])) for b in [*d["inputs"].values(), *d["outputs"].values()])
    assert steps > 84 and sum(1 for b in cp.l_nodes if b.src == "layout") == steps  # one node per layout step
    assert any(n.src == "aux" for n in cp.x_nodes)   # the certificate's flat views
    res = check_text(text)
    assert res.ok, res.message
    assert res.axioms and set(res.axioms) <= proofkit.ALLOWED_AXIOMS
