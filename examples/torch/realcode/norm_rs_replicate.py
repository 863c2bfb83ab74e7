"""reduce_scatter of a replicated gradient into per-rank shards (ZeRO-2 style), for `tvcert trace`.

Every dp rank computes the same gradient (here the ranks see the same batch, as tensor-parallel replicas or a
replicated micro-batch do) and keeps only its shard of it for the optimizer: a reduce_scatter over dp.  The
gradient of a Replicate input through ``reduce_scatter(sum)`` is ``dp`` times the gradient, Shard(0); with
``avg`` (or a sum divided by dp) it is the gradient's shard.  Bugs: ``sum`` (no division: dp times too
large), ``div_twice`` (averaged and then divided by dp again).

    tvcert trace examples/torch/realcode/norm_rs_replicate.py --verify --set how=sum_div
"""
import torch
import torch.distributed._functional_collectives as funcol

B, D, H = 4, 3, 8  # H divisible by dp


def logical(x, w, t):
    return ((torch.tanh(x @ w) - t) ** 2).mean()


def parallel(ctx, x, w, t):
    return ((torch.tanh(x @ w) - t) ** 2).mean()


def make_sync(how: str, bug: str):
    def grad_sync(ctx, grads):
        dp = ctx.group("dp")
        p = dict(zip(ctx.axes, ctx.sizes))["dp"]
        out = {}
        for k, g in grads.items():
            gt = g.t().contiguous()  # shard the output dim (H) of w: dim 0 of its transpose
            if bug == "sum":
                s = funcol.reduce_scatter_tensor(gt, "sum", 0, dp)
            elif how == "sum_div":
                s = funcol.reduce_scatter_tensor(gt, "sum", 0, dp) / p
            else:
                s = funcol.reduce_scatter_tensor(gt, "avg", 0, dp)
            if bug == "div_twice":
                s = s / p
            out[k] = s.t()
        return out

    return grad_sync


def tvcert_trace(how: str = "avg", bug: str = "", dp: int = 2):
    inputs = {"x": {"shape": [B, D]}, "w": {"shape": [D, H], "param": True}, "t": {"shape": [B, H]}}
    return dict(logical=logical, parallel=parallel, grad_sync=make_sync(how, bug), inputs=inputs, mesh={"dp": dp},
                output_placements={"grad_w": {"dp": "Shard(1)"}}, name=f"norm_rs_replicate_{how}{'_' + bug if bug else ''}")
