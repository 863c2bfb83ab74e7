"""Red-team plans against the engine rules added for real code (reductions, broadcasts, partial reads, mixed
all_reduces, common factors, rank-block pads, all_gather along another dim).  Each plan here is WRONG: the
interpreter (exact mode) shows its outputs differ from the logical graph, and the engine must not say VERIFIED.
A false VERIFIED is the worst bug tvcert can have, so every case asserts both halves."""
from __future__ import annotations

import copy

import pytest

from tvcert.engine.verify import verify
from tvcert.interp import run_plan
from tvcert.plan import PlanError, load_plan

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
    # the loader now refuses the plan (bad input naming the attribute); the kernel's own refusal stays behind it
    with pytest.raises(PlanError) as exc:
        load_plan(copy.deepcopy(p))
    assert exc.value.path.endswith("nodes[0].attrs.axis") and "twice" in str(exc.value)


# ------------------------------------------------------------------ strongest attempts that are (rightly) refused
def _id():
    return [_n("y0", "neg", ["x"]), _n("y", "neg", ["y0"])]


def _sc(v):
    return [_n("y", "scale", ["x"], value=v)]


def _one(dims, mesh, xs, ps, inpl, pnodes, lnodes, outpl):
    return _plan(dims, mesh, {"x": (xs, F)}, lnodes, {"x": (ps, F)}, pnodes, {"x": inpl}, {"y": outpl})


_AG = {"a": 4, "b": 3, "tp": 2}
_D2 = {"n": 8, "m": 4, "dp": 2, "tp": 2}
_D3 = {"n": 12, "dp": 2, "tp": 2, "cp": 3}
WRONG = {
    # allgather_other_dim: blocks of dim 0 stacked along dim 1 are not a plain reshape of x (the p factor moves)
    "gather_other_dim_read_as_plain_reshape": _one(
        _AG, ["tp"], ["a", "b"], ["a/tp", "b"], {"tp": "Shard(0)"}, [_n("y", "all_gather", ["x"], axis="tp", dim=1)],
        [_n("y", "reshape", ["x"], shape=[2, 6])], {}),
    # allgather_other_dim: per-rank rows stacked on the inner dim are the transpose of the view, not the view
    "gather_stack_inner_read_as_view": _one(
        {"a": 6, "tp": 3}, ["tp"], ["a"], ["a/tp"], {"tp": "Shard(0)"},
        [_n("xu", "unsqueeze", ["x"], dim=1), _n("y", "all_gather", ["xu"], axis="tp", dim=1)],
        [_n("y", "reshape", ["x"], shape=[2, 3])], {}),
    # allgather_partial_sum: gathered Partial(avg) pieces summed are p * E, not E
    "gather_sum_of_partial_avg": _one(
        {"n": 4, "m": 6, "dp": 2, "tp": 3}, ["dp", "tp"], ["n", "m"], ["n", "m"], {"tp": "Partial(avg)"},
        [_n("xu", "unsqueeze", ["x"], dim=0), _n("g", "all_gather", ["xu"], axis="tp", dim=0),
         _n("y", "sum", ["g"], dims=[0])], _id(), {}),
    # allgather_partial_sum: the statistics of a dp shard summed are still Partial(sum) over dp, not Replicate
    "gather_sum_with_dp_shard_read_as_replicate": _one(
        {"n": 4, "m": 6, "dp": 2, "tp": 3}, ["dp", "tp"], ["n", "m"], ["n/dp", "m"],
        {"dp": "Shard(0)", "tp": "Partial(sum)"},
        [_n("g", "all_gather", ["x"], axis="tp", dim=0), _n("y", "sum", ["g"], dims=[0])],
        [_n("y", "sum", ["x"], dims=[0])], {}),
    # allgather_partial_sum: gathered over dp while the pieces are Partial(sum) over tp
    "gather_sum_over_the_wrong_axis": _one(
        {"n": 4, "m": 6, "dp": 2, "tp": 3}, ["dp", "tp"], ["n", "m"], ["n", "m"], {"tp": "Partial(sum)"},
        [_n("xu", "unsqueeze", ["x"], dim=0), _n("g", "all_gather", ["xu"], axis="dp", dim=0),
         _n("y", "sum", ["g"], dims=[0])], _id(), {}),
    # pad_block_to_partial: blocks put back in reverse rank order
    "pad_blocks_reversed": _one(
        {"n": 8, "m": 4, "tp": 2}, ["tp"], ["n", "m"], ["n/tp", "m"], {"tp": "Shard(0)"},
        [_n("yp", "pad", ["x"], pads=["(1-rank.tp)*4", "rank.tp*4", 0, 0], value=0),
         _n("y", "all_reduce", ["yp"], axis="tp", reduce="sum")], _id(), {}),
    # pad_block_to_partial on a zig-zag shard: the rank's two chunks are not block r
    "pad_block_of_a_zigzag_shard": _one(
        {"n": 8, "m": 4, "tp": 2}, ["tp"], ["n", "m"], ["n/tp", "m"], {"tp": "ZigzagShard(0)"},
        [_n("yp", "pad", ["x"], pads=["rank.tp*4", "(1-rank.tp)*4", 0, 0], value=0),
         _n("y", "all_reduce", ["yp"], axis="tp", reduce="sum")], _id(), {}),
    # pad_block_to_partial with Partial(avg) on dp: the fact is Partial(avg), declaring Partial(sum) is p off
    "pad_block_partial_avg_declared_sum": _one(
        _D2, ["dp", "tp"], ["n", "m"], ["n/tp", "m"], {"dp": "Partial(avg)", "tp": "Shard(0)"},
        [_n("yp", "pad", ["x"], pads=["rank.tp*4", "(1-rank.tp)*4", 0, 0], value=0),
         _n("y", "all_reduce", ["yp"], axis="tp", reduce="sum")], _id(), {"dp": "Partial(sum)"}),
    # reduce_scatter_replicate nested in an outer dp shard: tp * E, not tp^2 * E
    "reduce_scatter_replicate_nested_p_squared": _one(
        _D2, ["dp", "tp"], ["n"], ["n/dp"], {"dp": "Shard(0)"},
        [_n("y", "reduce_scatter", ["x"], axis="tp", dim=0, reduce="sum")], _sc(4),
        {"dp": "Shard(0)", "tp": "Shard(0)"}),
    # reduce_scatter_replicate (avg) of a zig-zag dp block read as a plain dp shard
    "reduce_scatter_in_zigzag_block_read_as_shard": _one(
        {"n": 16, "dp": 2, "tp": 2}, ["dp", "tp"], ["n"], ["n/dp"], {"dp": "ZigzagShard(0)"},
        [_n("y", "reduce_scatter", ["x"], axis="tp", dim=0, reduce="sum")], _sc(2),
        {"dp": "Shard(0)", "tp": "Shard(0)"}),
    # allreduce_avg_partial_sum_nested: avg over tp then avg over dp of (Partial(avg), Partial(sum)) is E / tp
    "nested_avg_read_as_E": _one(
        _D2, ["dp", "tp"], ["n"], ["n"], {"dp": "Partial(avg)", "tp": "Partial(sum)"},
        [_n("a", "all_reduce", ["x"], axis="tp", reduce="avg"), _n("y", "all_reduce", ["a"], axis="dp", reduce="avg")],
        _id(), {}),
    # allreduce_mixed_axes: (Partial(avg), Replicate) summed over both axes is dp * tp * E (not tp * E)
    "mixed_axes_factor_off_by_p": _one(
        {"n": 4, "dp": 2, "tp": 3}, ["dp", "tp"], ["n"], ["n"], {"dp": "Partial(avg)"},
        [_n("y", "all_reduce", ["x"], axis=["tp", "dp"], reduce="sum")], _sc(3), {}),
    # allreduce_mixed_axes with a zig-zag axis outside the group: E / 2, not E / 4
    "mixed_axes_zigzag_outside_p_squared": _one(
        _D3, ["dp", "tp", "cp"], ["n"], ["n/cp"], {"dp": "Partial(sum)", "cp": "ZigzagShard(0)"},
        [_n("y", "all_reduce", ["x"], axis=["dp", "tp"], reduce="avg")], _sc(0.25), {"cp": "ZigzagShard(0)"}),
    # allreduce_mixed_axes on a size-1 axis: Partial(avg) over dp of size 1 summed over (dp, tp) is 2 E, not E
    # reshape_shard_block (one head per rank on dp x tp): the heads of the two axes interleaved are another tensor
    "reshape_nested_heads_axes_swapped": _one(
        {"b": 2, "h": 16, "dp": 2, "tp": 4}, ["dp", "tp"], ["b", "h"], ["b", "h/dp/tp"],
        {"dp": "Shard(1)", "tp": "Shard(1)"},
        [_n("y", "reshape", ["x"], shape=[2, 1, 2])],
        [_n("x1", "reshape", ["x"], shape=[2, 2, 4, 2]), _n("x2", "permute", ["x1"], dims=[0, 2, 1, 3]),
         _n("y", "reshape", ["x2"], shape=[2, 8, 2])], {"dp": "Shard(1)", "tp": "Shard(1)"}),
    # reshape_shard_block keeps a Partial(sum) on a third axis: reading it back as Replicate drops the sum
    "reshape_heads_partial_read_as_replicate": _one(
        {"b": 2, "h": 16, "dp": 2, "tp": 4, "cp": 2}, ["dp", "tp", "cp"], ["b", "h"], ["b", "h/dp/tp"],
        {"dp": "Shard(1)", "tp": "Shard(1)", "cp": "Partial(sum)"}, [_n("y", "reshape", ["x"], shape=[2, 1, 2])],
        [_n("y", "reshape", ["x"], shape=[2, 8, 2])], {"dp": "Shard(1)", "tp": "Shard(1)"}),
    "mixed_axes_size_one_axis": _one(
        {"n": 4, "dp": 1, "tp": 2}, ["dp", "tp"], ["n"], ["n"], {"dp": "Partial(avg)"},
        [_n("y", "all_reduce", ["x"], axis=["dp", "tp"], reduce="sum")], _id(), {}),
}


def _ddp(count=12, red="avg", loss_red="mean", loss_pl=None):
    """DDP: a local mean loss on a batch shard, its backward seed expand(1) / count (replicate_broadcast_as_shard,
    reduction_normal_form), grads all_reduce(avg); the loss read back as Partial(avg) (partial_sum_as_avg)."""
    c = lambda name, v: _n(name, "const", [], value=v)  # noqa: E731
    p = _plan({"B": 8, "H": 3, "dp": 2}, ["dp"], {"x": (["B", "H"], F), "w": (["H"], F)},
              [_n("y", "mul", ["x", "w"]), _n("loss", "mean", ["y"], dims=[0, 1]), _n("sx", "sum", ["x"], dims=[0]),
               c("cnt", 24), _n("gw", "div", ["sx", "cnt"])],
              {"x": (["B/dp", "H"], F), "w": (["H"], F)},
              [_n("y", "mul", ["x", "w"]), _n("loss", loss_red, ["y"], dims=[0, 1]), c("one", 1),
               _n("e", "expand", ["one"], shape=["B/dp", "H"]), c("k", count), _n("seed", "div", ["e", "k"]),
               _n("g", "mul", ["x", "seed"]), _n("gl", "sum", ["g"], dims=[0]),
               _n("gw", "all_reduce", ["gl"], axis="dp", reduce=red)],
              {"x": {"dp": "Shard(0)"}, "w": {}}, {"loss": loss_pl or {"dp": "Partial(avg)"}}, outs=("loss", "gw"))
    return p


WRONG.update({
    "ddp_grads_summed": _ddp(red="sum"),
    "ddp_seed_global_count": _ddp(count=24),
    "ddp_seed_off_by_one": _ddp(count=11),
    "ddp_local_loss_declared_partial_sum": _ddp(loss_pl={"dp": "Partial(sum)"}),
    "ddp_local_loss_sum_declared_partial_avg": _ddp(loss_red="sum"),
})


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_plan_is_not_verified(name):
    _assert_wrong_and_not_verified(WRONG[name])


def test_the_ddp_plan_these_bugs_come_from_verifies():
    """So the ddp_* negatives above are near misses of a plan the rules do prove (not refused for another reason)."""
    p = _ddp()
    assert run_plan(load_plan(copy.deepcopy(p)), exact=True).equal
    assert verify(load_plan(p)).verdict == "VERIFIED"


def test_all_gather_or_reduce_scatter_of_a_scalar_is_bad_input():
    """A rank-0 input has no dim to gather or scatter along: bad input naming the node, not a loader crash."""
    for op, extra in (("all_gather", {}), ("reduce_scatter", {"reduce": "sum"})):
        p = _plan({"dp": 2}, ["dp"], {"x": ([], F)}, [_n("y", "neg", ["x"])], {"x": ([], F)},
                  [_n("y", op, ["x"], axis="dp", dim=0, **extra)], {"x": {}}, {})
        with pytest.raises(PlanError) as exc:
            load_plan(p)
        assert "nodes[0]" in exc.value.path and "scalar" in str(exc.value), str(exc.value)


def test_a_mean_whose_count_equals_the_rank_count_only_at_dims_is_not_verified():
    """Fuzz pair 984 (seed 20261130): mean over d0 vs the Partial(avg) over dp x tp of local sums.  At d0 = 4 on
    4 ranks the counts coincide (one element per rank) and the plan is right there; at d0 = 8 it is wrong.  The
    size-counting proof is re-checked at a second instantiation (engine/sizes.py) and must not VERIFY."""
    shard = "(d0)/(dp*tp)"
    p = {"tvcert_plan": 1, "name": "mean_count_coincidence", "dims": {"d0": 4, "dp": 2, "tp": 2},
         "mesh": [["dp", "dp"], ["tp", "tp"]],
         "logical": {"inputs": [{"name": "x", "shape": ["d0"], "dtype": "float"}],
                     "nodes": [_n("l1", "sin", ["x"]), _n("l2", "mean", ["l1"], dims=[0])], "outputs": ["l2"]},
         "parallel": [{"name": "spmd", "inputs": [{"name": "x", "shape": [shard], "dtype": "float"}],
                       "nodes": [_n("p1", "sin", ["x"]), _n("p2", "sum", ["p1"], dims=[0])], "outputs": ["p2"]}],
         "inputs": {"x": {"local": "x", "placement": {"dp": "Shard(0)", "tp": "Shard(0)"}}},
         "outputs": {"l2": {"local": "p2", "placement": {"dp": "Partial(avg)", "tp": "Partial(avg)"}}}}
    at8 = copy.deepcopy(p)
    at8["dims"]["d0"] = 8
    assert not run_plan(load_plan(at8)).equal  # wrong as a shape-polymorphic plan
    res = verify(load_plan(copy.deepcopy(p)), refute=False)
    assert res.verdict != "VERIFIED" and "coincidence of sizes" in res.reasons[0], res.reasons
    assert res.stats["size_check"]["dims"]["d0"] == 8
    # the honest spelling (a local mean, then the average over the ranks) verifies at every size
    ok = copy.deepcopy(p)
    ok["parallel"][0]["nodes"][1] = _n("p2", "mean", ["p1"], dims=[0])
    res = verify(load_plan(ok), refute=False)
    assert res.verdict == "VERIFIED", res.reasons
