"""Tensor-parallel causal self-attention with `F.scaled_dot_product_attention`, for `tvcert trace`.

The heads are split over tp (Megatron): Wq / Wk / Wv column-parallel (each rank holds NH/tp heads), the
output projection Wo row-parallel followed by an all_reduce.  Attention is PyTorch's own SDPA (traced on its
math backend: the causal mask is a -inf fill, which the converter eliminates exactly), or, with
``attn=manual``, the textbook form ``softmax(q k^T / sqrt(d)).masked_fill(causal, -inf)``.

    tvcert trace examples/torch/tp_attention_sdpa.py --verify                         # VERIFIED
    tvcert trace examples/torch/tp_attention_sdpa.py --set bug=no_allreduce --verify   # REFUTED

``bug``: ``no_allreduce`` (Wo's partial sums never reduced), ``not_causal`` (the ranks forget the causal mask),
``local_scale`` (the scale computed from the rank's hidden size, not the head size).
"""
import math

import torch
import torch.nn.functional as F

from megatron_mlp import CopyToTP, ReduceFromTP

B, S, H, NH = 2, 4, 8, 4
HD = H // NH


def attend(q, k, v, attn: str, causal: bool = True, scale=None):
    if attn == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:
        L = q.shape[-2]
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def heads(t, b, s):
    return t.view(b, s, -1, HD).transpose(1, 2)


def make_logical(attn="sdpa"):
    def logical(x, wq, wk, wv, wo, target):
        b, s, _ = x.shape
        q, k, v = heads(x @ wq, b, s), heads(x @ wk, b, s), heads(x @ wv, b, s)
        o = attend(q, k, v, attn).transpose(1, 2).reshape(b, s, -1)
        return ((o @ wo - target) ** 2).sum()
    return logical


def make_tp(bug: str = "", attn: str = "sdpa"):
    def parallel(ctx, x, wq, wk, wv, wo, target):
        tp = ctx.group("tp")
        b, s, _ = x.shape
        xi = CopyToTP.apply(x, tp)
        q, k, v = heads(xi @ wq, b, s), heads(xi @ wk, b, s), heads(xi @ wv, b, s)
        scale = 1 / math.sqrt(wq.shape[1]) if bug == "local_scale" else None
        o = attend(q, k, v, attn, causal=bug != "not_causal", scale=scale).transpose(1, 2).reshape(b, s, -1)
        y = o @ wo if bug == "no_allreduce" else ReduceFromTP.apply(o @ wo, tp)
        return ((y - target) ** 2).sum()
    return parallel


def inputs(dtype="float32"):
    f = {} if dtype == "float32" else {"dtype": dtype}  # float32 is the default
    col = {"placement": {"tp": "Shard(1)"}, "param": True, **f}
    return {"x": {"shape": [B, S, H], **f}, "wq": {"shape": [H, H], **col}, "wk": {"shape": [H, H], **col},
            "wv": {"shape": [H, H], **col}, "wo": {"shape": [H, H], "placement": {"tp": "Shard(0)"}, "param": True, **f},
            "target": {"shape": [B, S, H], **f}}


def tvcert_trace(bug: str = "", attn: str = "sdpa", tp: int = 2, dtype: str = "float32"):
    return dict(logical=make_logical(attn), parallel=make_tp(bug, attn), inputs=inputs(dtype), mesh={"tp": tp},
                name=f"tp_attention_{attn}{'_' + bug if bug else ''}")
