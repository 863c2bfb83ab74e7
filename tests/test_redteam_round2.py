"""Red team, round 2: wrong plans an outsider would write to get a false VERIFIED, one family per class an outside
review found (flags on ops that are not linear, pattern rank offsets read on one mesh axis, stage replay through
an aliased boundary, rank-dependent values hidden in attributes, p2p pairing games), plus the size-coincidence
proofs an auditor replays with ``tvcert check``.  Every plan here is WRONG (the interpreter shows it at a size
where rounding cannot explain it) and must be neither VERIFIED by the engine nor accepted by the checker."""
from __future__ import annotations

import copy
import json

import pytest

import tvcert.engine.verify as V
from tvcert.certificate.check import Invalid, check_certificate
from tvcert.certificate.emit import build_certificate
from tvcert.certificate.format import Certificate
from tvcert.interp import run_plan
from tvcert.kernel.sizes import candidates
from tvcert.plan import PlanError, load_plan

F = "float"


def _n(name, op, inputs, **attrs):
    return {"name": name, "op": op, "inputs": inputs, **({"attrs": attrs} if attrs else {})}


def _cert(res) -> Certificate:
    return Certificate.model_validate(json.loads(json.dumps(build_certificate(res))))


def _forged(p: dict) -> Certificate:
    """The certificate ``verify`` would write if it skipped the second instantiation (an attacker's engine)."""
    res = V.verify(load_plan(copy.deepcopy(p)), refute=False, size_check=False)
    assert res.verdict == "VERIFIED", res.reasons
    return _cert(res)


# ------------------------------------------------------------------ 1. size coincidences, replayed by the auditor
def _mean_vs_rank_avg(run_dims=None):
    """Fuzz pair 984: mean over d0 vs the Partial(avg) over dp x tp of local sums: right at d0 = 4 on 4 ranks."""
    p = {"tvcert_plan": 1, "name": "mean_count_coincidence", "dims": {"d0": 4, "dp": 2, "tp": 2},
         "mesh": [["dp", "dp"], ["tp", "tp"]],
         "logical": {"inputs": [{"name": "x", "shape": ["d0"], "dtype": F}],
                     "nodes": [_n("l1", "sin", ["x"]), _n("l2", "mean", ["l1"], dims=[0])], "outputs": ["l2"]},
         "parallel": [{"name": "spmd", "inputs": [{"name": "x", "shape": ["(d0)/(dp*tp)"], "dtype": F}],
                       "nodes": [_n("p1", "sin", ["x"]), _n("p2", "sum", ["p1"], dims=[0])], "outputs": ["p2"]}],
         "inputs": {"x": {"local": "x", "placement": {"dp": "Shard(0)", "tp": "Shard(0)"}}},
         "outputs": {"l2": {"local": "p2", "placement": {"dp": "Partial(avg)", "tp": "Partial(avg)"}}}}
    if run_dims:
        p["run_dims"] = run_dims
    return p


def _ddp_mean_of_means():
    """A correct size-counting proof: mean over (d0, d1) as the dp average of local means of means."""
    return {"tvcert_plan": 1, "name": "ddp_mean", "dims": {"d0": 4, "d1": 3, "dp": 2}, "mesh": [["dp", "dp"]],
            "logical": {"inputs": [{"name": "x", "shape": ["d0", "d1"], "dtype": F}],
                        "nodes": [_n("l1", "sin", ["x"]), _n("l2", "mean", ["l1"], dims=[0, 1])], "outputs": ["l2"]},
            "parallel": [{"name": "spmd", "inputs": [{"name": "x", "shape": ["d0/dp", "d1"], "dtype": F}],
                          "nodes": [_n("p1", "sin", ["x"]), _n("p2", "mean", ["p1"], dims=[0]),
                                    _n("p3", "mean", ["p2"], dims=[0])], "outputs": ["p3"]}],
            "inputs": {"x": {"local": "x", "placement": {"dp": "Shard(0)"}}},
            "outputs": {"l2": {"local": "p3", "placement": {"dp": "Partial(avg)"}}}}


def test_size_coincidence_certificate_is_not_accepted_by_the_checker():
    p = _mean_vs_rank_avg()
    at8 = copy.deepcopy(p)
    at8["dims"]["d0"] = 8
    assert not run_plan(load_plan(at8), exact=True).equal  # wrong as a shape-polymorphic plan
    assert V.verify(load_plan(copy.deepcopy(p)), refute=False).verdict != "VERIFIED"
    with pytest.raises(Invalid, match="coincidence of sizes"):
        check_certificate(_forged(p))
    # a forged certificate for the plan at the second dims cannot be made: the plan is wrong there
    assert V.verify(load_plan(at8), refute=False, size_check=False).verdict != "VERIFIED"


def test_size_check_dims_are_not_the_authors_run_dims():
    """run_dims that keep the coincidence (d0 = 8 on 4 x 2 ranks) are not the second instantiation."""
    p = _mean_vs_rank_avg(run_dims={"d0": 8, "dp": 4, "tp": 2})
    assert run_plan(load_plan(copy.deepcopy(p)), exact=True).equal  # right at those run_dims: they hide it
    res = V.verify(load_plan(copy.deepcopy(p)), refute=False)
    # run_dims size dp otherwise: the second instantiation is at their mesh, d0 times 8 ranks and a prime no mesh
    # size has (H48)
    assert res.verdict != "VERIFIED" and res.stats["size_check"]["dims"] == {"d0": 96, "dp": 4, "tp": 2}
    with pytest.raises(Invalid, match="coincidence of sizes"):
        check_certificate(_forged(p))


def test_size_check_breaks_linear_relations_between_dims():
    """Each non-mesh dim gets its own prime: uniform scaling would keep d1 = 2 * d0."""
    alt = candidates({"dims": {"a": 2, "b": 4, "dp": 2}, "mesh": [["dp", "dp"]]})[0]
    assert alt == {"a": 4, "b": 12, "dp": 2}


def test_size_counting_certificate_carries_and_replays_its_second_instantiation():
    res = V.verify(load_plan(_ddp_mean_of_means()), refute=False)
    assert res.verdict == "VERIFIED" and res.stats["size_check"]["verdict"] == "VERIFIED"
    cert = _cert(res)
    assert len(cert.size_checks) == 1 and cert.size_checks[0].plan.content["dims"] == {"d0": 8, "d1": 9, "dp": 2}
    assert "re-proved at dims" in check_certificate(cert).size_check
    bad = cert.model_copy(update={"size_checks": []})
    with pytest.raises(Invalid, match="must also hold at dims"):
        check_certificate(bad)
    other = copy.deepcopy(cert.size_checks[0])
    other.steps[0].out[0] = (other.steps[0].out[0][0] + 1, other.steps[0].out[0][1])
    with pytest.raises(Invalid, match="second instantiation"):
        check_certificate(cert.model_copy(update={"size_checks": [other]}))


# ------------------------------------------------------------------ 2. rank dependence spelled so the text scan missed it
# ``rank_axes_in`` read ``rank\.<axis>`` off the text, while the evaluator parses with Python's ``ast``: ``rank . dp``,
# ``(rank).tp`` and a full-width ``ｒａｎｋ.tp`` (identifiers are NFKC-normalised) evaluate to the coordinate and were
# taken as rank-free, so the kernel read rank 0's value on every rank (all twelve of these VERIFIED before the fix).
def _mesh2(lnodes, pnodes, xpl=None, outpl=None, xshape=("n/tp", "h")):
    xpl = {"tp": "Shard(0)"} if xpl is None else xpl
    outpl = {"tp": "Shard(0)"} if outpl is None else outpl
    return {"tvcert_plan": 1, "name": "rt2", "dims": {"n": 6, "h": 4, "dp": 2, "tp": 3},
            "mesh": [["dp", "dp"], ["tp", "tp"]],
            "logical": {"inputs": [{"name": "x", "shape": ["n", "h"], "dtype": F}], "nodes": lnodes, "outputs": ["y"]},
            "parallel": [{"name": "m", "inputs": [{"name": "x", "shape": list(xshape), "dtype": F}], "nodes": pnodes,
                          "outputs": ["y"]}],
            "inputs": {"x": {"local": "x", "placement": xpl}}, "outputs": {"y": {"local": "y", "placement": outpl}}}


def _assert_wrong_not_verified(p, exact=True):
    assert not run_plan(load_plan(copy.deepcopy(p)), exact=exact).equal, "the plan is meant to be wrong"
    res = V.verify(load_plan(copy.deepcopy(p)), refute=False)
    assert res.verdict != "VERIFIED", "a wrong plan VERIFIED"
    return res


DISGUISES = ["rank . dp", "(rank).tp", "ｒａｎｋ.tp", "(rank . dp)+0"]
RANK_POSITIONS = {
    "scale_value": lambda r: ([_n("y", "scale", ["x"], value=0)], [_n("y", "scale", ["x"], value=r)]),
    "slice_bounds": lambda r: ([_n("y", "slice", ["x"], dim=1, start=0, end=2)],
                               [_n("y", "slice", ["x"], dim=1, start=r, end=f"{r}+2")]),
    "pad_amounts": lambda r: ([_n("y", "pad", ["x"], pads=[0, 0, 0, 2])],
                              [_n("y", "pad", ["x"], pads=[0, 0, r, f"2-{r}"])]),
    "nested_literal": lambda r: ([_n("c", "const", [], value=[[0, 0, 0, 0]]), _n("y", "add", ["x", "c"])],
                                 [_n("c", "const", [], value=[[0, r, 0, 0]]), _n("y", "add", ["x", "c"])]),
}


@pytest.mark.parametrize("where", sorted(RANK_POSITIONS))
@pytest.mark.parametrize("spelling", DISGUISES)
def test_rank_coordinate_in_another_spelling_is_rank_dependent(where, spelling):
    lnodes, pnodes = RANK_POSITIONS[where](spelling)
    p = _mesh2(lnodes, pnodes)
    _assert_wrong_not_verified(p)


def test_stage_key_resolves_attributes_with_a_rank_in_any_spelling():
    """Two stages whose attributes are written alike but resolve differently on their programs' ranks (a pipeline
    stage coordinate) must not share a canonical form: the key's rank test reads the spelling the evaluator reads."""
    from tvcert.kernel.memo import _mentions_rank

    assert all(_mentions_rank({"start": [s]}) for s in ("ｒａｎｋ.pp*2", "(rank).pp", "rank . pp"))
    assert not _mentions_rank({"start": ["n/2", 3]})


# ------------------------------------------------------------------ 1b. sizes that agree at the declared dims only
# Not only the counting rules: attributes are resolved at dims before expressions are compared, and side conditions
# compare sizes computed there, so a literal can stand for a dim's value (both VERIFIED, and their certificates
# accepted, before every plan with non-mesh dims was re-proved at a second instantiation).
def test_literal_standing_for_a_dim_is_not_verified():
    p = _mesh2([_n("y", "scale", ["x"], value="n")], [_n("y", "scale", ["x"], value=6)], xpl={}, outpl={},
               xshape=("n", "h"))
    at = copy.deepcopy(p)
    at["dims"]["n"] = 12
    assert run_plan(load_plan(copy.deepcopy(p)), exact=True).equal and not run_plan(load_plan(at), exact=True).equal
    res = V.verify(load_plan(copy.deepcopy(p)), refute=False)
    assert res.verdict != "VERIFIED" and "n = 6 (a literal)" in res.reasons[0], res.reasons
    with pytest.raises(Invalid, match="must also hold at dims"):
        check_certificate(_forged(p))


def test_vocab_block_written_as_a_literal_is_not_verified():
    """Offsets rank.tp*4 are the vocab block v/tp at v = 8 only: the pattern's side condition compares them with
    the block computed from the table's shape at the declared dims."""
    p = {"tvcert_plan": 1, "name": "vpe_literal_block", "dims": {"n": 16, "v": 8, "h": 3, "tp": 2},
         "mesh": [["tp", "tp"]],
         "logical": {"inputs": [{"name": "ids", "shape": ["n"], "dtype": "int", "range": "v"},
                                {"name": "w", "shape": ["v", "h"], "dtype": F}],
                     "nodes": [_n("y", "embedding", ["w", "ids"])], "outputs": ["y"]},
         "parallel": [{"name": "tp", "inputs": [{"name": "ids", "shape": ["n"], "dtype": "int", "range": "v"},
                                                {"name": "w", "shape": ["v/tp", "h"], "dtype": F}],
                       "nodes": [_n("lo", "const", [], value="rank.tp*4", dtype="int"),
                                 _n("hi", "const", [], value="rank.tp*4+4", dtype="int"),
                                 _n("below", "lt", ["ids", "lo"]), _n("above", "ge", ["ids", "hi"]),
                                 _n("outside", "logical_or", ["below", "above"]),
                                 _n("shifted", "sub", ["ids", "lo"]),
                                 _n("lid", "masked_fill", ["shifted", "outside"], value=0),
                                 _n("rows", "embedding", ["w", "lid"]),
                                 _n("outside3", "unsqueeze", ["outside"], dim=-1),
                                 _n("masked", "masked_fill", ["rows", "outside3"], value=0),
                                 _n("y", "all_reduce", ["masked"], axis="tp", reduce="sum")], "outputs": ["y"]}],
         "inputs": {"ids": {"local": "ids"}, "w": {"local": "w", "placement": {"tp": "Shard(0)"}}},
         "outputs": {"y": {"local": "y", "placement": {"tp": "Replicate"}}}}
    at16 = copy.deepcopy(p)
    at16["dims"]["v"] = 16
    assert not run_plan(load_plan(at16), exact=True).equal
    assert V.verify(load_plan(copy.deepcopy(p)), refute=False).verdict != "VERIFIED"
    with pytest.raises(Invalid, match="must also hold at dims"):
        check_certificate(_forged(p))
    ok = copy.deepcopy(p)  # the positive control: the block written as v/tp verifies (at both instantiations)
    for nd in ok["parallel"][0]["nodes"][:2]:
        nd["attrs"]["value"] = nd["attrs"]["value"].replace("4", "(v/tp)")
    res = V.verify(load_plan(ok), refute=False)
    assert res.verdict == "VERIFIED" and res.stats["size_check"]["verdict"] == "VERIFIED", res.reasons
    assert check_certificate(_cert(res)).size_check.startswith("rests on sizes")


# ------------------------------------------------------------------ 3. ops that are linear only for sum, or not at all
# A 3-D mesh (dp of size 1, tp of 3, cp of 2); each plan moves a Partial input through an op and reduces after it.
M3, D3 = ["dp", "tp", "cp"], {"n": 6, "h": 5, "dp": 1, "tp": 3, "cp": 2}


def _m3(lin, lnodes, pnodes, inpl, out="y"):
    return {"tvcert_plan": 1, "name": "rt3", "dims": dict(D3), "mesh": [[a, a] for a in M3],
            "logical": {"inputs": [{"name": k, "shape": s, "dtype": F} for k, s in lin.items()], "nodes": lnodes,
                        "outputs": [out]},
            "parallel": [{"name": "m", "inputs": [{"name": k, "shape": s, "dtype": F} for k, s in lin.items()],
                          "nodes": pnodes, "outputs": [out]}],
            "inputs": {k: {"local": k, "placement": inpl.get(k, {})} for k in lin},
            "outputs": {out: {"local": out, "placement": {}}}}


def _through(op, attrs, red="sum", pl="Partial(sum)", axis="cp"):
    return _m3({"x": ["n", "h"]}, [_n("y", op, ["x"], **attrs)],
               [_n("u", op, ["x"], **attrs), _n("y", "all_reduce", ["u"], axis=axis, reduce=red)], {"x": {axis: pl}})


_TWO = {"x": ["n", "h"], "w": ["n", "h"]}
_MASK = [_n("z", "const", [], value=0), _n("c", "gt", ["w", "z"])]
FLAG_CASES = {
    "softmax_of_partial_on_cp": lambda: _through("softmax", {"dim": 1}),
    "log_softmax_of_partial_on_tp": lambda: _through("log_softmax", {"dim": 0}, axis="tp"),
    "pad_with_one": lambda: _through("pad", {"pads": [0, 0, 0, 1], "value": 1}),
    "pad_with_tiny_nonzero": lambda: _through("pad", {"pads": [0, 0, 1, 0], "value": 1e-30}),
    "cast_to_int": lambda: _through("cast", {"dtype": "int"}),
    "square": lambda: _through("square", {}),
    "add_scalar": lambda: _through("add_scalar", {"value": 1}),
    "relu_of_partial_avg": lambda: _through("relu", {}, red="avg", pl="Partial(avg)"),
    "neg_of_partial_max": lambda: _through("neg", {}, red="max", pl="Partial(max)"),
    "scale_minus_one_of_partial_max": lambda: _through("scale", {"value": -1}, red="max", pl="Partial(max)"),
    "mean_of_partial_max_then_sum": lambda: _through("mean", {"dims": [1], "keepdim": False}, pl="Partial(max)"),
    "amax_of_partial_sum": lambda: _through("amax", {"dims": [1], "keepdim": False}),
    "masked_fill_nonzero_of_partial": lambda: _m3(
        _TWO, _MASK + [_n("y", "masked_fill", ["x", "c"], value=0.5)],
        _MASK + [_n("u", "masked_fill", ["x", "c"], value=0.5), _n("y", "all_reduce", ["u"], axis="cp", reduce="sum")],
        {"x": {"cp": "Partial(sum)"}}),
    "where_with_nonzero_other_branch": lambda: _m3(
        _TWO, _MASK + [_n("o", "const", [], value=1), _n("y", "where", ["c", "x", "o"])],
        _MASK + [_n("o", "const", [], value=1), _n("u", "where", ["c", "x", "o"]),
                 _n("y", "all_reduce", ["u"], axis="cp", reduce="sum")], {"x": {"cp": "Partial(sum)"}}),
    "mul_of_two_partials_same_axis": lambda: _m3(
        _TWO, [_n("y", "mul", ["x", "w"])],
        [_n("u", "mul", ["x", "w"]), _n("y", "all_reduce", ["u"], axis="tp", reduce="sum")],
        {"x": {"tp": "Partial(sum)"}, "w": {"tp": "Partial(sum)"}}),
    "partial_in_the_denominator": lambda: _m3(
        _TWO, [_n("e", "exp", ["w"]), _n("y", "div", ["e", "x"])],
        [_n("e", "exp", ["w"]), _n("u", "div", ["e", "x"]), _n("y", "all_reduce", ["u"], axis="tp", reduce="sum")],
        {"x": {"tp": "Partial(sum)"}}),
    "softmax_backward_linear_flag_on_out": lambda: _m3(
        _TWO, [_n("y", "softmax_backward", ["x", "w"], dim=1)],
        [_n("u", "softmax_backward", ["x", "w"], dim=1), _n("y", "all_reduce", ["u"], axis="cp", reduce="sum")],
        {"w": {"cp": "Partial(sum)"}}),
    "matmul_of_two_partial_avg": lambda: _m3(
        {"x": ["n", "h"], "w": ["h", "n"]}, [_n("y", "matmul", ["x", "w"])],
        [_n("u", "matmul", ["x", "w"]), _n("y", "all_reduce", ["u"], axis="cp", reduce="avg")],
        {"x": {"cp": "Partial(avg)"}, "w": {"cp": "Partial(avg)"}}),
    "partial_avg_scaled_by_the_wrong_p": lambda: _m3(
        {"x": ["n", "h"]}, [_n("y", "scale", ["x"], value=1)],
        [_n("u", "scale", ["x"], value=0.5), _n("y", "all_reduce", ["u"], axis="tp", reduce="sum")],
        {"x": {"tp": "Partial(avg)"}}),
    "partial_avg_on_two_axes_summed": lambda: _m3(
        {"x": ["n", "h"]}, [_n("y", "scale", ["x"], value=1)],
        [_n("y", "all_reduce", ["x"], axis=["tp", "cp"], reduce="sum")],
        {"x": {"tp": "Partial(avg)", "cp": "Partial(avg)"}}),
}


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_partial_through_an_op_that_does_not_commute(case):
    _assert_wrong_not_verified(FLAG_CASES[case](), exact=case not in ("softmax_of_partial_on_cp",
                                                                      "log_softmax_of_partial_on_tp"))


def test_partials_on_different_axes_multiply_positive_control():
    """x Partial(sum) over tp times w Partial(sum) over cp is bilinear across the two axes: right, and VERIFIED."""
    p = _m3(_TWO, [_n("y", "mul", ["x", "w"])],
            [_n("u", "mul", ["x", "w"]), _n("v", "all_reduce", ["u"], axis="tp", reduce="sum"),
             _n("y", "all_reduce", ["v"], axis="cp", reduce="sum")], {"x": {"tp": "Partial(sum)"}, "w": {"cp": "Partial(sum)"}})
    assert run_plan(load_plan(copy.deepcopy(p)), exact=True).equal
    assert V.verify(load_plan(p), refute=False).verdict == "VERIFIED"


# ------------------------------------------------------------------ 4. stage replay with an aliased boundary
def _memo_base():
    """Stage L2 repeats L1's ops; its internal exp(w) is what the output reads, while the boundary carries -w."""
    n = lambda name, op, ins, layer=None: {"op": op, "inputs": ins, "name": name, **({"layer": layer} if layer else {})}
    return {"tvcert_plan": 1, "name": "memo_alias", "dims": {"b": 4, "h": 8, "tp": 2}, "run_dims": {"b": 2, "h": 4, "tp": 2},
            "mesh": [["tp", "tp"]],
            "logical": {"inputs": [{"name": "x", "shape": ["b", "h"], "dtype": F}, {"name": "w", "shape": ["b", "h"], "dtype": F}],
                        "nodes": [n("ex", "exp", ["x"]), n("g", "neg", ["w"]), n("o", "neg", ["w"])], "outputs": ["o", "ex"]},
            "parallel": [{"name": "main", "inputs": [{"name": "x", "shape": ["b", "h"], "dtype": F},
                                                     {"name": "w", "shape": ["b", "h"], "dtype": F}],
                          "nodes": [n("e", "exp", ["x"]), n("g", "neg", ["w"]), n("c1", "exp", ["x"], "L1"),
                                    n("z1", "add", ["c1", "e"], "L1"), n("c2", "exp", ["w"], "L2"),
                                    n("z2", "add", ["c2", "g"], "L2")], "outputs": ["c2", "e"]}],
            "inputs": {"x": {"local": "x"}, "w": {"local": "w"}}, "outputs": {"o": {"local": "c2"}, "ex": {"local": "e"}}}


def _memo_3d():
    p = _memo_base()
    p["dims"] = p["run_dims"] = {"b": 6, "h": 4, "dp": 1, "tp": 3, "cp": 2}
    p["mesh"] = [["dp", "dp"], ["tp", "tp"], ["cp", "cp"]]
    for i in p["parallel"][0]["inputs"]:
        i["shape"] = ["b/tp", "h"]
    p["inputs"] = {k: {"local": k, "placement": {"tp": "Shard(0)"}} for k in ("x", "w")}
    p["outputs"] = {"o": {"local": "c2", "placement": {"tp": "Shard(0)"}}, "ex": {"local": "e", "placement": {"tp": "Shard(0)"}}}
    return p


def _memo_edit(fn):
    def make():
        p = _memo_base()
        fn(p["parallel"][0]["nodes"])
        return p
    return make


MEMO_CASES = {
    "alias_3d_mesh_sharded_odd": _memo_3d,
    "alias_boundary_order_swapped": _memo_edit(lambda ns: ns[5].update(inputs=["g", "c2"])),
    "alias_third_copy": _memo_edit(lambda ns: ns.extend([{"op": "exp", "inputs": ["x"], "name": "c3", "layer": "L3"},
                                                        {"op": "add", "inputs": ["c3", "e"], "name": "z3", "layer": "L3"}])),
    "copy_with_another_op": _memo_edit(lambda ns: ns[4].update(op="neg", inputs=["x"])),
}


@pytest.mark.parametrize("case", sorted(MEMO_CASES))
def test_stage_copy_whose_internal_result_aliases_a_boundary(case):
    _assert_wrong_not_verified(MEMO_CASES[case](), exact=False)


# ------------------------------------------------------------------ 5. send / recv pairing games
def _pp(progs, lin, lnodes, outs, dims):
    return {"tvcert_plan": 1, "name": "p2p_rt", "dims": dims, "mesh": [["pp", "pp"]],
            "logical": {"inputs": [{"name": k, "shape": ["n"], "dtype": F} for k in lin], "nodes": lnodes, "outputs": outs},
            "parallel": progs, "inputs": {k: {"program": "s0", "local": k} for k in lin},
            "outputs": {o: {"program": progs[-1]["name"], "local": o} for o in outs}}


def _snd(x, to, tag):
    return {"op": "send", "inputs": [x], "attrs": {"axis": "pp", "to": to, "tag": tag}}


def _rcv(name, src, tag):
    return _n(name, "recv", [], axis="pp", src=src, tag=tag, shape=["n"])


_S0IN = [{"name": "x", "shape": ["n"], "dtype": F}, {"name": "y", "shape": ["n"], "dtype": F}]
_LXY = [_n("o1", "neg", ["x"]), _n("o2", "exp", ["y"])]
P2P_CASES = {
    "recv_tags_used_crosswise": lambda: _pp(
        [{"name": "s0", "stage": {"pp": 0}, "inputs": _S0IN, "nodes": [_snd("x", 1, "a"), _snd("y", 1, "b")], "outputs": []},
         {"name": "s1", "stage": {"pp": 1}, "inputs": [], "outputs": ["o1", "o2"],
          "nodes": [_rcv("rb", 0, "b"), _rcv("ra", 0, "a"), _n("o1", "neg", ["rb"]), _n("o2", "exp", ["ra"])]}],
        ["x", "y"], _LXY, ["o1", "o2"], {"n": 4, "pp": 2}),
    "one_tag_on_two_stage_pairs_crossed": lambda: _pp(
        [{"name": "s0", "stage": {"pp": 0}, "inputs": _S0IN, "nodes": [_snd("x", 1, "t"), _snd("y", 2, "t")], "outputs": []},
         {"name": "s1", "stage": {"pp": 1}, "inputs": [], "nodes": [_rcv("r", 0, "t"), _snd("r", 2, "t")], "outputs": []},
         {"name": "s2", "stage": {"pp": 2}, "inputs": [], "outputs": ["o1", "o2"],
          "nodes": [_rcv("r1", 1, "t"), _rcv("r2", 0, "t"), _n("o1", "neg", ["r2"]), _n("o2", "exp", ["r1"])]}],
        ["x", "y"], _LXY, ["o1", "o2"], {"n": 4, "pp": 3}),
    "tags_differing_by_a_space": lambda: _pp(
        [{"name": "s0", "stage": {"pp": 0}, "inputs": _S0IN, "nodes": [_snd("x", 1, "t"), _snd("y", 1, "t ")], "outputs": []},
         {"name": "s1", "stage": {"pp": 1}, "inputs": [], "outputs": ["o1", "o2"],
          "nodes": [_rcv("ra", 0, "t "), _rcv("rb", 0, "t"), _n("o1", "neg", ["ra"]), _n("o2", "exp", ["rb"])]}],
        ["x", "y"], _LXY, ["o1", "o2"], {"n": 4, "pp": 2}),
}


@pytest.mark.parametrize("case", sorted(P2P_CASES))
def test_p2p_pairing_games(case):
    p = P2P_CASES[case]()
    _assert_wrong_not_verified(p, exact=False)


# ------------------------------------------------------------------ 6. vocab-parallel offsets from the wrong axis
def _vocab(lo, hi, lo_off=None, mesh=(("dp", "dp"), ("tp", "tp")), dims=None):
    p = json.loads(json.dumps(_VOCAB))
    p["mesh"] = [list(m) for m in mesh]
    if dims:
        p["dims"] = dims
    for nd in p["parallel"][0]["nodes"]:
        if nd["name"] in ("lo", "lo_off"):
            nd["attrs"]["value"] = lo_off if nd["name"] == "lo_off" and lo_off else lo
        if nd["name"] == "hi":
            nd["attrs"]["value"] = hi
    return p


_VOCAB = {"tvcert_plan": 1, "name": "vpe", "dims": {"n": 16, "v": 8, "h": 3, "tp": 2, "dp": 2},
          "logical": {"inputs": [{"name": "ids", "shape": ["n"], "dtype": "int", "range": "v"},
                                 {"name": "w", "shape": ["v", "h"], "dtype": F}],
                      "nodes": [_n("y", "embedding", ["w", "ids"])], "outputs": ["y"]},
          "parallel": [{"name": "tp", "inputs": [{"name": "ids", "shape": ["n"], "dtype": "int", "range": "v"},
                                                 {"name": "w", "shape": ["v/tp", "h"], "dtype": F}],
                        "nodes": [_n("lo", "const", [], value="", dtype="int"), _n("hi", "const", [], value="", dtype="int"),
                                  _n("below", "lt", ["ids", "lo"]), _n("above", "ge", ["ids", "hi"]),
                                  _n("outside", "logical_or", ["below", "above"]),
                                  _n("lo_off", "const", [], value="", dtype="int"), _n("shifted", "sub", ["ids", "lo_off"]),
                                  _n("lid", "masked_fill", ["shifted", "outside"], value=0),
                                  _n("rows", "embedding", ["w", "lid"]), _n("outside3", "unsqueeze", ["outside"], dim=-1),
                                  _n("masked", "masked_fill", ["rows", "outside3"], value=0),
                                  _n("y", "all_reduce", ["masked"], axis="tp", reduce="sum")], "outputs": ["y"]}],
          "inputs": {"ids": {"local": "ids"}, "w": {"local": "w", "placement": {"tp": "Shard(0)"}}},
          "outputs": {"y": {"local": "y", "placement": {"tp": "Replicate"}}}}
_B = "(v/tp)"
VOCAB_CASES = {
    "offsets_over_dp": lambda: _vocab(f"rank.dp*{_B}", f"rank.dp*{_B}+{_B}"),
    "global_rank_tp_outer_mesh": lambda: _vocab(f"(rank.tp*dp+rank.dp)*{_B}", f"(rank.tp*dp+rank.dp)*{_B}+{_B}",
                                                mesh=(("tp", "tp"), ("dp", "dp"))),
    "offsets_over_a_size_one_axis": lambda: _vocab(f"rank.cp*{_B}", f"rank.cp*{_B}+{_B}",
                                                   mesh=(("dp", "dp"), ("cp", "cp"), ("tp", "tp")),
                                                   dims={"n": 16, "v": 8, "h": 3, "tp": 2, "dp": 2, "cp": 1}),
    "global_rank_in_disguise": lambda: _vocab(f"((rank).dp*tp+rank.tp)*{_B}", f"((rank).dp*tp+rank.tp)*{_B}+{_B}"),
    "upper_bound_off_by_one": lambda: _vocab(f"rank.tp*{_B}", f"rank.tp*{_B}+{_B}-1"),
    "blocks_reversed_odd_sizes": lambda: _vocab(f"(tp-1-rank.tp)*{_B}", f"(tp-1-rank.tp)*{_B}+{_B}",
                                                dims={"n": 16, "v": 9, "h": 3, "tp": 3, "dp": 2}),
}


@pytest.mark.parametrize("case", sorted(VOCAB_CASES))
def test_vocab_parallel_offsets_from_the_wrong_axis(case):
    _assert_wrong_not_verified(VOCAB_CASES[case]())


def test_vocab_parallel_positive_control_odd_sizes():
    p = _vocab(f"rank.tp*{_B}", f"rank.tp*{_B}+{_B}", dims={"n": 16, "v": 9, "h": 3, "tp": 3, "dp": 2})
    assert run_plan(load_plan(copy.deepcopy(p)), exact=True).equal
    res = V.verify(load_plan(p), refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    check_certificate(_cert(res))


# ------------------------------------------------------------------ 7. negative shard dims (DTensor's Shard(-1))
# The rules compare shard dims as indices; Shard(-1) reached them as -1 (the interpreter splits the last dim), so a
# transpose crashed the engine (exit 4) and a sum over the last dim found no rule.  Bindings now count it from the end.
def _neg(lnodes, pnodes, inpl, outpl, lin=None, pin=None):
    lin = lin or {"x": ["n", "k"]}
    pin = pin or {"x": ["n", "k/tp"]}
    return {"tvcert_plan": 1, "name": "neg_dim", "dims": {"n": 4, "k": 4, "tp": 2}, "mesh": [["tp", "tp"]],
            "logical": {"inputs": [{"name": k, "shape": s, "dtype": F} for k, s in lin.items()], "nodes": lnodes,
                        "outputs": ["y"]},
            "parallel": [{"name": "m", "inputs": [{"name": k, "shape": s, "dtype": F} for k, s in pin.items()],
                          "nodes": pnodes, "outputs": ["y"]}],
            "inputs": {k: {"local": k, "placement": inpl.get(k, {})} for k in lin},
            "outputs": {"y": {"local": "y", "placement": outpl}}}


_S = {"x": {"tp": "Shard(-1)"}}
NEG_OK = {
    "transpose": lambda: _neg([_n("y", "transpose", ["x"], dim0=0, dim1=1)], [_n("y", "transpose", ["x"], dim0=0, dim1=1)],
                              _S, {"tp": "Shard(0)"}),
    "sum_over_the_sharded_dim": lambda: _neg([_n("y", "sum", ["x"], dims=[1])], [_n("y", "sum", ["x"], dims=[1])], _S,
                                             {"tp": "Partial(sum)"}),
    "row_parallel_matmul": lambda: _neg([_n("y", "matmul", ["x", "w"])], [_n("y", "matmul", ["x", "w"])],
                                        {"x": {"tp": "Shard(-1)"}, "w": {"tp": "Shard(-2)"}}, {"tp": "Partial(sum)"},
                                        lin={"x": ["n", "k"], "w": ["k", "n"]}, pin={"x": ["n", "k/tp"], "w": ["k/tp", "n"]}),
    "all_gather_last_dim": lambda: _neg([_n("y", "neg", ["x"])],
                                        [_n("g", "all_gather", ["x"], axis="tp", dim=1), _n("y", "neg", ["g"])], _S, {}),
}
NEG_WRONG = {
    "softmax_along_the_sharded_dim": lambda: _neg([_n("y", "softmax", ["x"], dim=1)], [_n("y", "softmax", ["x"], dim=-1)],
                                                  _S, {"tp": "Shard(-1)"}),
    "flip_of_the_sharded_dim": lambda: _neg([_n("y", "flip", ["x"], dims=[1])], [_n("y", "flip", ["x"], dims=[1])], _S,
                                            {"tp": "Shard(-1)"}),
    "all_gather_along_0_read_as_a_plain_reshape": lambda: _neg(
        [_n("y", "reshape", ["x"], shape=["tp*n", "k/tp"])], [_n("y", "all_gather", ["x"], axis="tp", dim=0)], _S, {}),
}


@pytest.mark.parametrize("case", sorted(NEG_OK))
def test_negative_shard_dim_positive_controls(case):
    p = NEG_OK[case]()
    assert run_plan(load_plan(copy.deepcopy(p)), exact=True).equal
    res = V.verify(load_plan(p), refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    check_certificate(_cert(res))


@pytest.mark.parametrize("case", sorted(NEG_WRONG))
def test_negative_shard_dim_wrong_plans(case):
    _assert_wrong_not_verified(NEG_WRONG[case](), exact=case != "softmax_along_the_sharded_dim")


# ------------------------------------------------------------------ 8. a generated Llama 3 plan with one op mutated
@pytest.fixture(scope="module")
def llama_tp2_dp2():
    from tvcert.generators.plans import generate_plan

    return generate_plan("llama3-8b", tp=2, dp=2, layers=1)


@pytest.mark.parametrize("spelling", ["rank.dp", "(rank).dp"])
def test_generated_llama_vocab_block_sliced_by_the_dp_rank(llama_tp2_dp2, spelling):
    """The embedding's vocab block (a slice of the replicated table by rank.tp) taken by the dp coordinate
    instead (same axis size): wrong on dp rank 1; in disguise it was read as rank-free before the fix."""
    p = copy.deepcopy(llama_tp2_dp2)
    hits = [n for g in p["parallel"] for n in g["nodes"] if n.get("src") == "embed.vocab_block"]
    assert hits
    for n in hits:
        n["attrs"]["start"], n["attrs"]["end"] = f"{spelling}*(v/tp)", f"({spelling}+1)*(v/tp)"
    assert not run_plan(load_plan(copy.deepcopy(p))).equal
    assert V.verify(load_plan(p), refute=False).verdict != "VERIFIED"
