"""SPMD compression: rank-dependent constants become `rank.<axis>` expressions; ranks must agree."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "torch"))
from megatron_mlp import ReduceFromTP  # noqa: E402

from tvcert.engine.verify import verify  # noqa: E402
from tvcert.frontends.trace import TraceError, _affine, trace_plan  # noqa: E402
from tvcert.interp import run_plan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

B, H, F = 4, 8, 16


def logical(x, w, w2):
    return (torch.tanh(x @ w) @ w2).square().sum()


def sliced(ctx, x, w, w2):
    """Every rank slices its own column block of a replicated weight (rank-dependent slice bounds)."""
    r, L = ctx.coord("tp"), w.shape[1] // ctx.size("tp")
    h = torch.tanh(x @ w[:, r * L:(r + 1) * L])
    y = ReduceFromTP.apply(h @ w2, ctx.group("tp"))
    return y.square().sum()


INPUTS = {"x": {"shape": [B, H]}, "w": {"shape": [H, F]},
          "w2": {"shape": [F, H], "placement": {"tp": "Shard(0)"}, "param": True}}


def test_rank_dependent_slice_becomes_rank_expression():
    raw = trace_plan(logical, sliced, inputs=INPUTS, mesh={"tp": 2})
    sl = [n for n in raw["parallel"][0]["nodes"] if n["op"] == "slice"]
    assert sl and sl[0]["attrs"]["start"] == "rank.tp*8" and sl[0]["attrs"]["end"] == "rank.tp*8+8"
    plan = load_plan(raw)
    assert run_plan(plan).equal
    res = verify(plan)
    assert res.verdict == "VERIFIED", res.reasons


def test_two_axis_mesh_affine_fit():
    vals = {(a, b): 3 + 5 * a + 7 * b for a in range(2) for b in range(4)}
    assert _affine(vals, ("dp", "tp"), (2, 4)) == "rank.dp*5+rank.tp*7+3"
    vals[(1, 3)] += 1
    assert _affine(vals, ("dp", "tp"), (2, 4)) is None


def test_plain_functional_all_reduce_in_forward_double_counts_the_gradient():
    """funcol.all_reduce is differentiable (its backward all-reduces again): with a loss computed on
    every rank that doubles the weight gradient -- the trace shows it, the verdict refutes it."""
    import torch.distributed._functional_collectives as funcol

    def naive(ctx, x, w, w2):
        r, L = ctx.coord("tp"), w.shape[1] // ctx.size("tp")
        h = torch.tanh(x @ w[:, r * L:(r + 1) * L])
        return funcol.all_reduce(h @ w2, "sum", ctx.group("tp")).square().sum()

    plan = load_plan(trace_plan(logical, naive, inputs=INPUTS, mesh={"tp": 2}))
    res = verify(plan)
    assert res.verdict == "REFUTED"
    assert [o["name"] for o in res.counterexample["outputs"] if not o["equal"]] == ["grad_w2"]


def test_ranks_running_different_programs_are_rejected():
    def diverging(ctx, x, w, w2):
        h = torch.tanh(x @ w[:, :8])
        if ctx.coord("tp") == 1:
            h = h * 2
        return (h @ w2).square().sum()

    with pytest.raises(TraceError) as ei:
        trace_plan(logical, diverging, inputs=INPUTS, mesh={"tp": 2})
    assert ei.value.kind == "spmd"


def test_collective_axis_resolved_on_a_2d_mesh():
    def par(ctx, x, w, w2):
        return sliced(ctx, x, w, w2)

    raw = trace_plan(logical, par, inputs=INPUTS, mesh={"dp": 2, "tp": 2})
    ar = [n for n in raw["parallel"][0]["nodes"] if n["op"] == "all_reduce"]
    assert ar and all(n["attrs"]["axis"] == "tp" for n in ar)
    assert run_plan(load_plan(raw)).equal
