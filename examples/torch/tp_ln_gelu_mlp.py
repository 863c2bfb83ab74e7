"""A Megatron-style tensor-parallel MLP block with LayerNorm and GELU (functional collectives), for `tvcert trace`.

`block` is the single-device model: ``x + W2 gelu(W1 layer_norm(x) + b1) + b2``; `block_tp` the same on every
rank of tp: the LayerNorm replicated, W1 / b1 column-parallel, W2 row-parallel followed by an all_reduce (and
Megatron's `f`: the input gradient all-reduced).  The loss is a mean (``F.mse_loss``).

    tvcert trace examples/torch/tp_ln_gelu_mlp.py --verify                       # VERIFIED
    tvcert trace examples/torch/tp_ln_gelu_mlp.py --set bug=no_allreduce --verify  # REFUTED
    tvcert trace examples/torch/tp_ln_gelu_mlp.py --set approximate=tanh --set dtype=float64 --verify

``checkpoint=nonreentrant|reentrant`` runs the parallel block under activation checkpointing.
``bug``: ``no_allreduce`` (the row-parallel partial sums are never reduced), ``bias_every_rank`` (b2 added
before the all_reduce, so tp times), ``no_input_grad_reduce`` (Megatron's `f` without its backward all_reduce:
the LayerNorm's gradients see only this rank's half of the MLP).
"""
import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

from megatron_mlp import CopyToTP, ReduceFromTP


class NoReduce(torch.autograd.Function):
    """`f` without the backward all_reduce (a bug)."""

    @staticmethod
    def forward(ctx, x, group):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g, None


B, S, H, FF = 2, 4, 8, 16


def block(x, ln_w, ln_b, w1, b1, w2, b2, target, approximate="none"):
    h = F.layer_norm(x, (H,), ln_w, ln_b, eps=1e-5)
    y = x + F.gelu(h @ w1 + b1, approximate=approximate) @ w2 + b2
    return F.mse_loss(y, target)


def make_tp(bug: str = "", approximate: str = "none", checkpoint: str = ""):
    def mlp(x, ln_w, ln_b, w1, b1, w2, b2, tp):
        h = F.layer_norm(x, (H,), ln_w, ln_b, eps=1e-5)
        h = (NoReduce if bug == "no_input_grad_reduce" else CopyToTP).apply(h, tp)
        a = F.gelu(h @ w1 + b1, approximate=approximate)           # column parallel
        if bug == "no_allreduce":
            return x + a @ w2 + b2                                 # BUG: partial sums
        if bug == "bias_every_rank":
            return x + ReduceFromTP.apply(a @ w2 + b2, tp)         # BUG: b2 added tp times
        return x + ReduceFromTP.apply(a @ w2, tp) + b2             # row parallel

    def block_tp(ctx, x, ln_w, ln_b, w1, b1, w2, b2, target):
        tp = ctx.group("tp")
        if checkpoint:  # activation checkpointing: the block is recomputed in the backward (collectives too)
            from torch.utils.checkpoint import checkpoint as ckpt

            y = ckpt(lambda *a: mlp(*a, tp), x, ln_w, ln_b, w1, b1, w2, b2, use_reentrant=checkpoint == "reentrant")
        else:
            y = mlp(x, ln_w, ln_b, w1, b1, w2, b2, tp)
        return F.mse_loss(y, target)
    return block_tp


def inputs(dtype="float32"):
    f = {} if dtype == "float32" else {"dtype": dtype}  # float32 is the default
    return {
        "x": {"shape": [B, S, H], **f},
        "ln_w": {"shape": [H], "param": True, **f},
        "ln_b": {"shape": [H], "param": True, **f},
        "w1": {"shape": [H, FF], "placement": {"tp": "Shard(1)"}, "param": True, **f},
        "b1": {"shape": [FF], "placement": {"tp": "Shard(0)"}, "param": True, **f},
        "w2": {"shape": [FF, H], "placement": {"tp": "Shard(0)"}, "param": True, **f},
        "b2": {"shape": [H], "param": True, **f},
        "target": {"shape": [B, S, H], **f},
    }


def tvcert_trace(bug: str = "", approximate: str = "none", tp: int = 2, dtype: str = "float32", checkpoint: str = ""):
    """``checkpoint``: "" | "nonreentrant" | "reentrant" (the parallel block under torch.utils.checkpoint)."""
    def logical(**kw):
        return block(**kw, approximate=approximate)

    return dict(logical=logical, parallel=make_tp(bug, approximate, checkpoint), inputs=inputs(dtype), mesh={"tp": tp},
                name=f"tp_ln_gelu_mlp{'_' + bug if bug else ''}")
