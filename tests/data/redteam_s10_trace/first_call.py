"""Red team s10 (H49): a program that refuses torch.autograd.grad (reentrant activation checkpointing) was traced
a second time, with loss.backward(), in the same process: a forward reading Python state it changes (a call
counter) was traced as its second call.  ``bug="first_call"``: the output doubled on the first call only (what a
real rank runs first; torch on gloo differs): VERIFIED before, now UNKNOWN.  ``bug=""``: VERIFIED."""
import torch
import torch.distributed._functional_collectives as funcol
from torch.utils.checkpoint import checkpoint

CALLS = [0]


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return funcol.all_reduce(x, "sum", group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return funcol.all_reduce(g, "sum", ctx.group), None


def mlp(x, w1, w2, target):
    return 0.5 * ((torch.tanh(x @ w1) @ w2 - target) ** 2).sum()


def make_parallel(bug):
    def par(ctx, x, w1, w2, target):
        CALLS[0] += 1
        tp = ctx.group("tp")
        h = checkpoint(lambda a, b: torch.tanh(a @ b), CopyToTP.apply(x, tp), w1, use_reentrant=True)
        y = ReduceFromTP.apply(h @ w2, tp)
        if bug == "first_call" and CALLS[0] == 1:
            y = y * 2  # BUG, on the first call only (what a real rank runs first)
        return 0.5 * ((y - target) ** 2).sum()
    return par


INPUTS = {"x": {"shape": [2, 4]}, "w1": {"shape": [4, 8], "placement": {"tp": "Shard(1)"}, "param": True},
          "w2": {"shape": [8, 4], "placement": {"tp": "Shard(0)"}, "param": True}, "target": {"shape": [2, 4]}}


def tvcert_trace(bug: str = ""):
    return dict(logical=mlp, parallel=make_parallel(bug), inputs=INPUTS, mesh={"tp": 2},
                name=f"redteam_s10_first_call{'_' + bug if bug else ''}")
