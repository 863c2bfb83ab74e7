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
    assert res.verdict != "VERIFIED" and res.stats["size_check"]["dims"] == {"d0": 8, "dp": 2, "tp": 2}
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
