"""Issue 13, classes 6 and 7 and "REFUTED must be right": the plan contract, one arithmetic, confirmed
counterexamples and internal errors.

* Plan contract (exit 3, naming the JSON path): a local tensor bound to two logical inputs, an output layout
  that reads back only part of the logical output, Partial(max) nested with Partial(sum|avg), NaN / Infinity.
  The interpreter distributes partial inputs at random (the holder of the value drawn per element) and
  compares whole logical tensors.
* One arithmetic: the reals, a division (log, rsqrt, sqrt) proved only where its argument is proved inside
  its domain; float literals are the decimals they are written as, in exact runs too; a float tensor is not
  equal to an int tensor.
* REFUTED only with a difference rounding cannot explain; an internal error exits 4 and names the op.
"""
from __future__ import annotations

import copy
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tvcert.cli import main
from tvcert.engine.verify import verify
from tvcert.interp import DecimalCtx, Mesh, RunError, _check_reads_all, distribute, run_plan
from tvcert.kernel.equality import Prover
from tvcert.kernel.expr import Exprs
from tvcert.ops.base import Ctx
from tvcert.plan import Binding, Placement, PlanError, load_plan

EX = Path(__file__).resolve().parents[1] / "examples"


# ---------------------------------------------------------------- small plans
def T(name, shape, dtype="float"):
    return {"name": name, "shape": shape, "dtype": dtype}


def N(op, name, inputs, **attrs):
    return {"op": op, "name": name, "inputs": inputs, "attrs": attrs}


def B(local, layout=None, **placement):
    out = {"local": local, "placement": placement}
    if layout:
        out["layout"] = layout
    return out


def plan(lin, lnodes, louts, pin, pnodes, pouts, inputs, outputs, dims=None, mesh=None, name="p"):
    return {"tvcert_plan": 1, "name": name, "dims": dims or {"n": 4, "tp": 2}, "mesh": mesh or [["tp", "tp"]],
            "logical": {"inputs": lin, "nodes": lnodes, "outputs": louts},
            "parallel": [{"inputs": pin, "nodes": pnodes, "outputs": pouts}],
            "inputs": inputs, "outputs": outputs}


def unary_plan(logical_nodes, parallel_nodes, shape=("n",), name="p"):
    """Logical x -> y, the same on one replicated program with other ops."""
    return plan([T("x", list(shape))], logical_nodes, ["y"], [T("x", list(shape))], parallel_nodes, ["y"],
                {"x": B("x")}, {"y": B("y")}, name=name)


def cli(tmp_path, obj, *args, cmd="verify"):
    p = tmp_path / "plan.json"
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return CliRunner().invoke(main, [cmd, str(p), *args])


def mlp():
    return json.loads((EX / "mlp_tp2.json").read_text())


def assert_bad(tmp_path, obj, path, words):
    r = cli(tmp_path, obj, "-q")
    assert r.exit_code == 3, r.output
    assert path in r.output, r.output
    assert words in r.output, r.output
    assert "Traceback" not in r.output
    with pytest.raises(PlanError) as ei:
        load_plan(obj if isinstance(obj, dict) else json.loads(obj))
    assert ei.value.path.startswith(path.split(":")[0])


# ================================================================ class 6: plan contract
def _dup_small():
    return plan([T("a", ["n"]), T("b", ["n"])], [N("add", "y", ["a", "b"])], ["y"],
                [T("x", ["n"])], [N("add", "y", ["x", "x"])], ["y"], {"a": B("x"), "b": B("x")}, {"y": B("y")})


def _dup_mlp():  # target and x have one shape: binding both to x made the loss (x - x) look right
    p = mlp()
    p["inputs"]["target"]["local"] = p["inputs"]["x"]["local"]
    return p


def _dup_sharded():  # the same local under two placements of two logical inputs
    return plan([T("a", ["n"]), T("b", ["n"])], [N("add", "y", ["a", "b"])], ["y"],
                [T("x", ["n/tp"]), T("z", ["n/tp"])], [N("add", "y", ["x", "x"])], ["y"],
                {"a": B("x", tp="Shard(0)"), "b": B("x", tp="Shard(0)")}, {"y": B("y", tp="Shard(0)")})


@pytest.mark.parametrize("make,path", [(_dup_small, "$.inputs.b.local"), (_dup_mlp, "$.inputs.target.local"),
                                       (_dup_sharded, "$.inputs.b.local")])
def test_a_local_bound_to_two_logical_inputs_is_rejected(tmp_path, make, path):
    assert_bad(tmp_path, make(), path, "already bound to logical input")


def _sliced_output(layout, local_shape, pnodes):
    return plan([T("a", ["n", "n"])], [N("scale", "y", ["a"], value=2)], ["y"],
                [T("a", ["n", "n"])], [N("scale", "y0", ["a"], value=2)] + pnodes, ["y"],
                {"a": B("a")}, {"y": B("y", layout=layout)})


SLICED = {
    # only the first two rows compared; the program computes them right and the rest not at all
    "prefix": ([{"op": "slice", "attrs": {"dim": 0, "start": 0, "end": 2}}],
               [N("slice", "y", ["y0"], dim=0, start=0, end=2)]),
    "strided": ([{"op": "slice", "attrs": {"dim": 1, "start": 0, "end": "n", "step": 2}}],
                [N("slice", "y", ["y0"], dim=1, start=0, end="n", step=2)]),
    "after_reshape": ([{"op": "reshape", "attrs": {"shape": ["n*n"]}}, {"op": "slice", "attrs": {"dim": 0, "start": 1, "end": "n*n"}}],
                      [N("reshape", "y1", ["y0"], shape=["n*n"]), N("slice", "y", ["y1"], dim=0, start=1, end="n*n")]),
}


@pytest.mark.parametrize("case", sorted(SLICED))
def test_an_output_layout_that_reads_back_part_of_the_output_is_rejected(tmp_path, case):
    layout, pnodes = SLICED[case]
    idx = len(layout) - 1
    assert_bad(tmp_path, _sliced_output(layout, None, pnodes), f"$.outputs.y.layout[{idx}]", "read back every element")


def test_lossless_output_layouts_are_accepted_and_compared_whole(tmp_path):
    full = [{"op": "slice", "attrs": {"dim": 0, "start": 0, "end": "n"}}]
    p = _sliced_output(full, None, [N("slice", "y", ["y0"], dim=0, start=0, end="n")])
    assert verify(load_plan(p)).verdict == "VERIFIED"
    padded = [{"op": "pad", "attrs": {"pads": [0, 2, 0, 0]}}]
    p = _sliced_output(padded, None, [N("pad", "y", ["y0"], pads=[0, 2, 0, 0])])
    assert verify(load_plan(p)).verdict == "VERIFIED"
    # the interpreter's own check (the loader's second line): a lossy layout never reaches a comparison
    lossy = Binding("y", "main", "y", {}, [("slice", {"dim": 0, "start": 0, "end": 2})], "$.outputs.y")
    with pytest.raises(RunError, match="reads back only part"):
        _check_reads_all(lossy, (4, 4), {})
    _check_reads_all(Binding("y", "main", "y", {}, [("pad", {"pads": [1, 1, 0, 0]}), ("reshape", {"shape": [24]})],
                             "$.outputs.y"), (4, 4), {})


def _mixed(inputs_pl, outputs_pl=None, pnodes=None):
    pnodes = pnodes or [N("all_reduce", "m", ["a"], axis="tp", reduce="max"),
                        N("all_reduce", "y", ["m"], axis="dp", reduce="sum")]
    return plan([T("a", ["n"])], [N("scale", "y", ["a"], value=1)], ["y"], [T("a", ["n"])], pnodes, ["y"],
                {"a": B("a", **inputs_pl)}, {"y": B("y", **(outputs_pl or {}))},
                dims={"n": 4, "dp": 2, "tp": 2}, mesh=[["dp", "dp"], ["tp", "tp"]])


MIXED = {
    "max_inside_sum": (_mixed({"dp": "Partial(sum)", "tp": "Partial(max)"}), "$.inputs.a.placement.tp"),
    "sum_inside_max": (_mixed({"dp": "Partial(max)", "tp": "Partial(sum)"},
                              pnodes=[N("all_reduce", "m", ["a"], axis="dp", reduce="max"),
                                      N("all_reduce", "y", ["m"], axis="tp", reduce="sum")]), "$.inputs.a.placement.tp"),
    "max_inside_avg": (_mixed({"dp": "Partial(avg)", "tp": "Partial(max)"}), "$.inputs.a.placement.tp"),
    "in_an_output": (_mixed({"dp": "Partial(sum)"}, {"dp": "Partial(sum)", "tp": "Partial(max)"},
                            [N("scale", "y", ["a"], value=1)]), "$.outputs.y.placement.tp"),
}


@pytest.mark.parametrize("case", sorted(MIXED))
def test_partial_max_nested_with_a_sum_is_rejected(tmp_path, case):
    p, path = MIXED[case]
    assert_bad(tmp_path, p, path, "do not commute")


def test_partials_that_commute_are_accepted():
    p = _mixed({"dp": "Partial(max)", "tp": "Partial(max)"},
               pnodes=[N("all_reduce", "m", ["a"], axis="tp", reduce="max"),
                       N("all_reduce", "y", ["m"], axis="dp", reduce="max")])
    assert verify(load_plan(p)).verdict == "VERIFIED"
    p = _mixed({"dp": "Partial(sum)", "tp": "Partial(avg)"},
               pnodes=[N("all_reduce", "m", ["a"], axis="tp", reduce="avg"),
                       N("all_reduce", "y", ["m"], axis="dp", reduce="sum")])
    assert verify(load_plan(p)).verdict == "VERIFIED"


@pytest.mark.parametrize("p2", [2, 3])
@pytest.mark.parametrize("reduce", ["sum", "avg", "max"])
def test_partial_inputs_are_distributed_at_random_and_add_up(reduce, p2):
    mesh = Mesh(["dp", "tp"], {"dp": 2, "tp": p2})
    ranks = mesh.ranks()
    v = np.arange(1.0, 13.0).reshape(3, 4)
    holders = set()
    for seed in range(4):
        for ctx in (Ctx(seed=seed), Ctx(exact=True, seed=seed)):
            val = ctx.asarray(v.tolist()) if ctx.exact else v
            b = Binding("a", "main", "a", {"dp": Placement("R"), "tp": Placement("P", reduce=reduce)}, [], "$.inputs.a")
            pieces = distribute(b, val, mesh, ranks, np.random.default_rng(seed), ctx)
            for d in range(2):
                group = [pieces[(d, c)] for c in range(p2)]
                if reduce == "max":
                    got = np.maximum.reduce(group)
                    assert np.array_equal(np.asarray(got, dtype=object), np.asarray(val, dtype=object))
                    holders |= {int(np.argmax([g[i] for g in group])) for i in np.ndindex(*v.shape)}
                else:
                    tot = sum(group[1:], group[0])
                    want = val * (p2 if reduce == "avg" else 1)
                    if ctx.exact:
                        assert np.array_equal(tot, want)
                    else:
                        assert np.allclose(tot, want)
                    assert not any(np.array_equal(g, want) for g in group)  # no coordinate holds the whole value
            # replicas on dp hold the same piece
            assert all(np.array_equal(pieces[(0, c)], pieces[(1, c)]) for c in range(p2))
    if reduce == "max":
        assert holders == set(range(p2))  # the value is not always on coordinate 0


def test_reading_a_partial_max_from_one_coordinate_is_refuted():
    """y = all_reduce(sum, a * [rank == 0]) reads rank 0's piece of a Partial(max) input: right only if the
    maximum always sat on coordinate 0, as the interpreter used to place it."""
    p = plan([T("a", ["n"])], [N("scale", "y", ["a"], value=1)], ["y"],
             [T("a", ["n"])], [N("scale", "a0", ["a"], value="1 - rank.tp"),
                               N("all_reduce", "y", ["a0"], axis="tp", reduce="sum")], ["y"],
             {"a": B("a", tp="Partial(max)")}, {"y": B("y")})
    res = verify(load_plan(p))
    assert res.verdict == "REFUTED", res.reasons


# ---------------------------------------------------------------- non-finite literals
NONFINITE = {
    "nan_scalar": (lambda p: p["parallel"][0]["nodes"][0]["attrs"].update(value=float("nan")),
                   "$.parallel[0].nodes[0].attrs.value"),
    "inf_in_literal": (lambda p: p["logical"]["nodes"].insert(0, N("const", "c", [], value=[1.0, float("inf")])),
                       "$.logical.nodes[0].attrs.value[1]"),
    "neg_inf_fill": (lambda p: p["logical"]["nodes"].__setitem__(0, N("add_scalar", "y", ["x"], value=float("-inf"))),
                     "$.logical.nodes[0].attrs.value"),
}


@pytest.mark.parametrize("case", sorted(NONFINITE))
def test_non_finite_literals_are_rejected(tmp_path, case):
    p = unary_plan([N("add_scalar", "y", ["x"], value=1.5)], [N("add_scalar", "y", ["x"], value=1.5)])
    fn, path = NONFINITE[case]
    fn(p)
    text = json.dumps(p)  # Python writes NaN / Infinity / -Infinity tokens, as other tools do
    assert_bad(tmp_path, text, path, "not a finite number")


# ================================================================ class 7: one arithmetic
ZERO_DIV = {
    "div_relu": [N("relu", "r", ["x"]), N("div", "q", ["x", "r"]), N("scale", "y", ["q"], value=0)],
    "mul_const_zero": [N("relu", "r", ["x"]), N("div", "q", ["x", "r"]), N("const", "z", [], value=0),
                       N("mul", "y", ["q", "z"])],
    "reciprocal": [N("relu", "r", ["x"]), N("reciprocal", "q", ["r"]), N("scale", "y", ["q"], value=0)],
    "log": [N("relu", "r", ["x"]), N("log", "q", ["r"]), N("scale", "y", ["q"], value=0)],
    "rsqrt_of_difference": [N("sub", "d", ["x", "x"]), N("rsqrt", "q", ["d"]), N("scale", "y", ["q"], value=0)],
}


@pytest.mark.parametrize("case", sorted(ZERO_DIV))
def test_an_identity_that_needs_a_division_by_zero_is_not_verified(case):
    p = unary_plan([N("scale", "y", ["x"], value=0)], ZERO_DIV[case])
    res = verify(load_plan(p), refute=False)
    assert res.verdict == "UNKNOWN"
    assert any("not proved inside its domain" in r for r in res.reasons), res.reasons
    assert verify(load_plan(p)).verdict != "VERIFIED"


def test_x_over_relu_x_times_zero_is_refuted_by_the_division_by_zero():
    p = unary_plan([N("scale", "y", ["x"], value=0)], ZERO_DIV["div_relu"])
    res = verify(load_plan(p))
    assert res.verdict == "REFUTED", res.reasons
    assert "domain" in res.counterexample["confirmed"]


POSITIVE_DIVISORS = {
    # a softmax-style normalizer: a sum of exp is a leaf the SMT solver knows nothing of but its sign
    "sum_of_exp": ([N("exp", "e", ["x"]), N("sum", "s", ["e"], dims=[0], keepdim=True), N("add", "x2", ["x", "x"]),
                    N("div", "y", ["x2", "s"])],
                   [N("exp", "e", ["x"]), N("sum", "s", ["e"], dims=[0], keepdim=True), N("div", "q", ["x", "s"]),
                    N("add", "y", ["q", "q"])]),
    "square_plus_one": ([N("scale", "y", ["x"], value=0)],
                        [N("square", "s", ["x"]), N("add_scalar", "s1", ["s"], value=1), N("div", "q", ["x", "s1"]),
                         N("scale", "y", ["q"], value=0)]),
    "mean_square_plus_eps": ([N("square", "s", ["x"]), N("mean", "m", ["s"], dims=[0], keepdim=True),
                              N("add_scalar", "v", ["m"], value=1e-5), N("rsqrt", "r", ["v"]), N("mul", "y", ["x", "r"])],
                             [N("square", "s", ["x"]), N("mean", "m", ["s"], dims=[0], keepdim=True),
                              N("add_scalar", "v", ["m"], value=1e-5), N("rsqrt", "r", ["v"]), N("div", "one", ["v", "v"]),
                              N("mul", "xr", ["x", "r"]), N("mul", "y", ["xr", "one"])]),
}


@pytest.mark.parametrize("case", sorted(POSITIVE_DIVISORS))
def test_a_division_by_a_provably_positive_value_is_verified(case):
    logical, parallel = POSITIVE_DIVISORS[case]
    res = verify(load_plan(unary_plan(logical, parallel)), refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    assert res.prover.obligations and "(assert (not (and" in res.prover.obligations[-1].smt


def test_the_sign_of_a_normalizer_is_what_proves_the_division(monkeypatch):
    """Without the checked sign premise (sum of exp > 0) the same obligation is not proved."""
    import tvcert.kernel.smt as smt

    logical, parallel = POSITIVE_DIVISORS["sum_of_exp"]
    assert "(assert (> v" in verify(load_plan(unary_plan(logical, parallel)), refute=False).prover.obligations[-1].smt
    monkeypatch.setattr(smt, "sign", lambda exprs, i, depth=0: None)
    res = verify(load_plan(unary_plan(logical, parallel)), refute=False)
    assert res.verdict == "UNKNOWN", res.reasons  # (z3's x/0 is any value: the two sides may differ there)


def test_float_literals_are_decimals_in_exact_runs():
    assert Ctx(exact=True).const(0.1) == Fraction(1, 10)
    assert list(Ctx(exact=True).asarray([0.1, 0.2])) == [Fraction(1, 10), Fraction(1, 5)]
    # 0.1 * x . w + 0.2 * x . w = 0.3 * x . w: no proof (matmul leaves), and in binary (Fraction(0.1) + ...)
    # the exact run would "refute" it; read as the decimals they are written as, it is equal
    p = plan([T("x", ["n", "n"]), T("w", ["n", "n"])], [N("scale", "x3", ["x"], value=0.3), N("matmul", "y", ["x3", "w"])],
             ["y"], [T("x", ["n", "n"]), T("w", ["n", "n"])],
             [N("scale", "x1", ["x"], value=0.1), N("scale", "x2", ["x"], value=0.2), N("matmul", "y1", ["x1", "w"]),
              N("matmul", "y2", ["x2", "w"]), N("add", "y", ["y1", "y2"])], ["y"],
             {"x": B("x"), "w": B("w")}, {"y": B("y")})
    assert run_plan(load_plan(p), exact=True).equal
    assert verify(load_plan(p)).verdict == "UNKNOWN"
    # ten scalings by 0.1 and one by 1e10 are the identity: proved, and equal in the exact run
    nodes = [N("scale", f"s{i + 1}", [f"s{i}" if i else "x"], value=0.1) for i in range(10)]
    p = unary_plan([N("scale", "y", ["x"], value=1)], nodes + [N("scale", "y", ["s10"], value=1e10)])
    assert verify(load_plan(p)).verdict == "VERIFIED"
    assert run_plan(load_plan(p), exact=True).equal
    # a different decimal (0.3 vs 0.30000000000000004, neighbouring binary floats) differs in the exact run, but by
    # 1.5e-16 relative: the rounding of a float64 literal explains that, so it is no counterexample (CONFIRM_RTOL)
    p = unary_plan([N("scale", "y", ["x"], value=0.3)], [N("scale", "y", ["x"], value=0.30000000000000004)])
    assert not run_plan(load_plan(p), exact=True).equal
    res = verify(load_plan(p))
    assert res.verdict == "UNKNOWN" and any("float64 literals" in r for r in res.reasons), res.reasons
    # while a literal off by 1e-6 relative is a counterexample
    p = unary_plan([N("scale", "y", ["x"], value=0.3)], [N("scale", "y", ["x"], value=0.3000003)])
    assert verify(load_plan(p)).verdict == "REFUTED"


def test_a_float_tensor_is_not_equal_to_an_int_tensor():
    X = Exprs()
    ids = X.leaf("ids", (4,), "int")
    as_float = X.mk("cast", {"dtype": "float"}, [ids])
    assert X[as_float].dtype == "float"
    assert not Prover(X).equal(ids, as_float)
    assert Prover(X).equal(as_float, X.mk("cast", {"dtype": "float"}, [ids]))


# ================================================================ REFUTED must be right
def _layernorm_variance(offset: float):
    """Hidden-sharded LayerNorm whose variance is E[x^2] - E[x]^2 (correct over the reals)."""
    pre = [N("add_scalar", "x0", ["x"], value=offset)]
    lnodes = pre + [N("mean", "mu", ["x0"], dims=[1], keepdim=True), N("sub", "xc", ["x0", "mu"]),
                    N("square", "xc2", ["xc"]), N("mean", "var", ["xc2"], dims=[1], keepdim=True),
                    N("add_scalar", "ve", ["var"], value=1e-5), N("rsqrt", "rs", ["ve"]), N("mul", "y", ["xc", "rs"])]
    pnodes = pre + [N("sum", "s1", ["x0"], dims=[1], keepdim=True), N("all_reduce", "S1", ["s1"], axis="tp", reduce="sum"),
                    N("scale", "mu", ["S1"], value=0.125), N("square", "x2", ["x0"]),
                    N("sum", "s2", ["x2"], dims=[1], keepdim=True), N("all_reduce", "S2", ["s2"], axis="tp", reduce="sum"),
                    N("scale", "m2", ["S2"], value=0.125), N("square", "mu2", ["mu"]), N("sub", "var", ["m2", "mu2"]),
                    N("add_scalar", "ve", ["var"], value=1e-5), N("rsqrt", "rs", ["ve"]), N("sub", "xc", ["x0", "mu"]),
                    N("mul", "y", ["xc", "rs"])]
    return plan([T("x", ["b", "h"])], lnodes, ["y"], [T("x", ["b", "h/tp"])], pnodes, ["y"],
                {"x": B("x", tp="Shard(1)")}, {"y": B("y", tp="Shard(1)")}, dims={"b": 4, "h": 8, "tp": 2})


@pytest.mark.parametrize("offset", [30000.0, 1e5])
def test_layernorm_variance_by_cancellation_is_not_refuted(offset):
    p = load_plan(_layernorm_variance(offset))
    assert not run_plan(p, seed=0).equal  # float64 cancellation alone makes the outputs differ ...
    assert run_plan(p, seed=0, inputs=run_plan(p, seed=0).inputs, decimal=True).equal  # ... the reals do not
    res = verify(p)
    assert res.verdict in ("VERIFIED", "UNKNOWN"), res.counterexample
    assert any("rounding, not a counterexample" in r for r in res.reasons), res.reasons


def test_variance_by_cancellation_is_not_refuted_by_the_exact_path_either():
    """Without rsqrt the exact run applies: it says equal, so the float64 difference is not a counterexample."""
    p = _layernorm_variance(1e5)
    for nodes in (p["logical"]["nodes"], p["parallel"][0]["nodes"]):
        names = [x["name"] for x in nodes]
        del nodes[names.index("ve"):]
    p["logical"]["outputs"] = p["parallel"][0]["outputs"] = ["var"]
    p["outputs"] = {"var": B("var")}
    plan_ = load_plan(p)
    assert not run_plan(plan_, seed=0).equal and run_plan(plan_, seed=0, exact=True).equal
    res = verify(plan_)
    assert res.verdict in ("VERIFIED", "UNKNOWN"), res.counterexample
    if res.verdict == "UNKNOWN":
        assert any("the exact run of that seed is equal too" in r for r in res.reasons), res.reasons


def test_a_masked_division_float64_agrees_on_is_not_refuted():
    """where(x > 0, x / relu(x), 1) = 1: undefined branches are never selected, float64 agrees; the exact run
    divides by zero in the unselected branch, which alone is no counterexample (and no proof: UNKNOWN)."""
    one = [N("scale", "z", ["x"], value=0), N("add_scalar", "one", ["z"], value=1)]
    p = unary_plan(one + [N("scale", "y", ["one"], value=1)],
                   one + [N("relu", "r", ["x"]), N("div", "q", ["x", "r"]), N("const", "c0", [], value=0),
                          N("gt", "m", ["x", "c0"]), N("where", "y", ["m", "q", "one"])])
    assert run_plan(load_plan(p)).equal
    res = verify(load_plan(p))
    assert res.verdict == "UNKNOWN", res.counterexample


def test_the_same_layernorm_with_a_real_bug_is_still_refuted():
    p = _layernorm_variance(30000.0)
    p["parallel"][0]["nodes"][3]["attrs"]["value"] = 0.25  # mean over the local half only: wrong
    res = verify(load_plan(p))
    assert res.verdict == "REFUTED", res.reasons
    assert "60-digit" in res.counterexample["confirmed"]


def test_decimal_mode_computes_functions_not_tables():
    from tvcert.interp import decimal_context

    with decimal_context():
        ctx = DecimalCtx()
        a = ctx.asarray([0.3, -1.25])
        b = ctx.asarray([1.5, 2.0])
        lhs = ctx.fn("exp", a + b)
        rhs = ctx.fn("exp", a) * ctx.fn("exp", b)
        assert all(abs(x - y) < 1e-50 for x, y in zip(lhs, rhs))
        assert abs(ctx.fn("erf", ctx.asarray([0.5]))[0] - ctx.const(0.5204998778130465)) < 1e-15
        assert abs(ctx.fn("sin", ctx.asarray([1.0]))[0] ** 2 + ctx.fn("cos", ctx.asarray([1.0]))[0] ** 2 - 1) < 1e-50


WRONG_EXAMPLES = sorted(p.stem for p in EX.glob("*bug*.json")) + [
    "mlp_tp2_no_allreduce", "mlp_tp2_bias_before_allreduce", "heads_reshape_transpose_swap", "trainverify_c12",
    "vocab_parallel_loss_local_max", "vocab_parallel_loss_no_target_all_reduce",
    "vocab_parallel_embedding_clamped_no_row_mask", "ring_attention_cp2_no_max_correction"]


@pytest.mark.parametrize("name", WRONG_EXAMPLES)
def test_wrong_examples_are_still_refuted_with_a_confirmed_difference(name):
    res = verify(load_plan(EX / f"{name}.json"))
    assert res.verdict == "REFUTED", res.reasons
    assert res.counterexample["confirmed"]


# ---------------------------------------------------------------- internal errors: exit 4, the op named
def test_an_internal_error_in_the_engine_exits_4_with_the_op(tmp_path):
    p = plan([T("a", ["n", "n"]), T("b", ["n", "n"])], [N("einsum", "y", ["a", "b"], equation="ij,jk->ik")], ["y"],
             [T("a", ["n", "n"]), T("b", ["n", "n"])], [N("einsum", "y", ["a", "b"], equation="ij,jk")], ["y"],
             {"a": B("a"), "b": B("b")}, {"y": B("y")})
    try:
        verified = verify(load_plan(p)).verdict
    except Exception:  # noqa: BLE001 - the engine may not handle it yet; then the CLI must say so, exit 4
        verified = None
    r = cli(tmp_path, p, "-q")
    if verified is None:
        assert r.exit_code == 4, r.output
        assert "internal error" in r.output and "einsum" in r.output and "$.parallel[0].nodes[0]" in r.output
    else:  # handled by a rule: then it is a verdict, and 0 / 1 / 2 follow it
        assert r.exit_code in (0, 2), r.output


def test_a_crashing_rule_or_op_exits_4_never_0_or_1(tmp_path, monkeypatch):
    import tvcert.engine.propagate as propagate
    from tvcert.ops import REGISTRY

    p = unary_plan([N("scale", "y", ["x"], value=2)], [N("scale", "y", ["x"], value=2)])

    def boom(*a, **k):
        raise KeyError("simulated bug")

    monkeypatch.setattr(propagate, "derive", boom)
    for args in ((), ("--json",)):
        r = cli(tmp_path, p, "-q", *args)
        assert r.exit_code == 4, r.output
        assert "$.parallel[0].nodes[0]" in r.output and "'scale'" in r.output and "KeyError" in r.output
    monkeypatch.undo()
    monkeypatch.setattr(type(REGISTRY["scale"]), "eval", boom)
    r = cli(tmp_path, p, cmd="run")
    assert r.exit_code == 4, r.output
    assert "$.logical.nodes[0]" in r.output and "'scale'" in r.output
