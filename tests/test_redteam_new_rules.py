"""Red-team plans against the engine rules added for real code (reductions, broadcasts, partial reads, mixed
all_reduces, common factors, rank-block pads, all_gather along another dim).  Each plan here is WRONG: the
interpreter (exact mode) shows its outputs differ from the logical graph, and the engine must not say VERIFIED.
A false VERIFIED is the worst bug tvcert can have, so every case asserts both halves."""
from __future__ import annotations

import copy

import pytest

from tvcert.engine.verify import verify
from tvcert.interp import run_plan
from tvcert.plan import load_plan

F = "float"


def _plan(dims, mesh, lin, lnodes, pin, pnodes, inpl, outpl, outs=("y",)):
    return {"tvcert_plan": 1, "name": "redteam", "dims": dims, "mesh": {a: a for a in mesh},
            "logical": {"inputs": [{"name": k, "shape": s, "dtype": d} for k, (s, d) in lin.items()],
                        "nodes": lnodes, "outputs": list(outs)},
            "parallel": [{"name": "spmd", "inputs": [{"name": k, "shape": s, "dtype": d} for k, (s, d) in pin.items()],
                          "nodes": pnodes, "outputs": list(outs)}],
            "inputs": {k: {"local": k, "placement": v} for k, v in inpl.items()},
            "outputs": {k: {"local": k, "placement": outpl.get(k, {})} for k in outs}}


def _n(name, op, inputs, **attrs):
    return {"name": name, "op": op, "inputs": inputs, **({"attrs": attrs} if attrs else {})}


def _assert_wrong_and_not_verified(p):
    assert not run_plan(load_plan(copy.deepcopy(p)), exact=True).equal, "the plan is meant to be wrong"
    res = verify(load_plan(copy.deepcopy(p)))
    assert res.verdict != "VERIFIED", "a wrong plan VERIFIED"
    return res


# ------------------------------------------------------------------ all_reduce over an axis named twice
# The interpreter reduces over the ranks the group spans (a set: dp named twice is still the 2 dp ranks); the
# multi-axis all_reduce rules multiplied the factor once per listed name (p^2 instead of p).
DUP = [  # (axes, reduce, input placement on dp, logical factor the kernel used to conclude)
    (["dp", "dp"], "sum", "Replicate", 4),  # allreduce_mixed_axes (all Replicate): 4x, the ranks give 2x
    (["dp", "tp", "dp"], "sum", "Replicate", 12),  # allreduce_mixed_axes over three Replicate names: 12x, truly 6x
    (["dp", "dp"], "avg", "Partial(sum)", 0.25),  # allreduce_avg_partial_sum_axes: E/4, truly E/2
    (["dp", "dp"], "sum", "Partial(avg)", 4),  # allreduce_mixed_axes (Partial(avg) twice): 4x, truly 2x
]


@pytest.mark.parametrize("axes,red,pl,factor", DUP, ids=[f"{'-'.join(a)}-{r}-{p}" for a, r, p, _ in DUP])
def test_all_reduce_over_an_axis_named_twice(axes, red, pl, factor):
    p = _plan({"n": 4, "dp": 2, "tp": 3}, ["dp", "tp"], {"x": (["n"], F)}, [_n("y", "scale", ["x"], value=factor)],
              {"x": (["n"], F)}, [_n("y", "all_reduce", ["x"], axis=axes, reduce=red)], {"x": {"dp": pl}}, {})
    _assert_wrong_and_not_verified(p)
