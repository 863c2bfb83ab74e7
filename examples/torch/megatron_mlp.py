"""Hand-written Megatron-style tensor parallelism (functional collectives), for `tvcert trace`.

`mlp` is the single-device model; `mlp_tp` the tensor-parallel version run on every rank:
column-parallel first linear (weight and bias sharded on the output dim), row-parallel second
linear (weight sharded on the input dim) followed by an all_reduce.  `mlp_tp_no_allreduce` forgets
the all_reduce (a classic bug).  Run:  tvcert trace examples/torch/megatron_mlp.py -o plan.json --verify
"""
import torch
import torch.distributed._functional_collectives as funcol


class CopyToTP(torch.autograd.Function):
    """Megatron's `f`: identity forward, all_reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return funcol.all_reduce(g, "sum", ctx.group), None


class ReduceFromTP(torch.autograd.Function):
    """Megatron's `g`: all_reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return funcol.all_reduce(x, "sum", group)

    @staticmethod
    def backward(ctx, g):
        return g, None


def mlp(x, w1, b1, w2, b2, target):
    h = torch.tanh(x @ w1 + b1)
    y = h @ w2 + b2
    return 0.5 * ((y - target) ** 2).sum()


def mlp_tp(ctx, x, w1, b1, w2, b2, target):
    tp = ctx.group("tp")
    h = torch.tanh(CopyToTP.apply(x, tp) @ w1 + b1)   # column parallel
    y = ReduceFromTP.apply(h @ w2, tp) + b2           # row parallel
    return 0.5 * ((y - target) ** 2).sum()


def mlp_tp_no_allreduce(ctx, x, w1, b1, w2, b2, target):
    tp = ctx.group("tp")
    h = torch.tanh(CopyToTP.apply(x, tp) @ w1 + b1)
    y = h @ w2 + b2                                   # BUG: partial sums never reduced
    return 0.5 * ((y - target) ** 2).sum()


B, H, F = 4, 8, 16
INPUTS = {
    "x": {"shape": [B, H]},
    "w1": {"shape": [H, F], "placement": {"tp": "Shard(1)"}, "param": True},
    "b1": {"shape": [F], "placement": {"tp": "Shard(0)"}, "param": True},
    "w2": {"shape": [F, H], "placement": {"tp": "Shard(0)"}, "param": True},
    "b2": {"shape": [H], "param": True},
    "target": {"shape": [B, H]},
}


def tvcert_trace(bug: str = ""):
    """The spec `tvcert trace` reads: keyword arguments of tvcert.frontends.trace.trace_plan."""
    par = {"": mlp_tp, "no_allreduce": mlp_tp_no_allreduce}[bug]
    return dict(logical=mlp, parallel=par, inputs=INPUTS, mesh={"tp": 2}, name=f"megatron_mlp{'_' + bug if bug else ''}")
