"""Fused projections under tensor parallelism: a fused ``w_qkv`` (attention) or a merged gate/up weight (SwiGLU
MLP), each rank holding its block of every part, for `tvcert trace`.

Code written for TP with a fused weight computes ``x @ w_qkv.t()`` on the rank's rows of the fused weight and
splits the result with ``chunk(3, -1)``: that is right only if the rank's rows are ``[Wq_r; Wk_r; Wv_r]`` (its
heads of each part), not rows ``r*3N/p ..`` of ``[Wq; Wk; Wv]``.  The spec says so with the input's layout, the
interleave ``reshape [3, tp, N/tp, H] -> transpose(0, 1) -> reshape [3N, H]`` then ``Shard(0)``; the kernel reads
the chunks as Shard of Q, K and V (``split_interleaved_shard``), their gradients' concat back
(``concat_interleaved_shard``) and the weight's gradient through the matmuls (``interleave_commutes``).

    tvcert trace examples/torch/realcode/fused_qkv.py --verify                         # VERIFIED (tp=2)
    tvcert trace examples/torch/realcode/fused_qkv.py --set tp=4 --verify              # VERIFIED
    tvcert trace examples/torch/realcode/fused_qkv.py --set part=gate_up --verify      # VERIFIED (SwiGLU)
    tvcert trace examples/torch/realcode/fused_qkv.py --set slices=true --verify       # VERIFIED (Phi-3's slices)
    tvcert trace examples/torch/realcode/fused_qkv.py --set bug=swap_parts --verify    # REFUTED

``bug``: ``swap_parts`` (the rank takes its chunks in the wrong order: k, q, v / up, gate), ``head_major``
(the rank reads its fused output per head, ``[q_h, k_h, v_h]`` for each head as Megatron lays its weight out,
while the weight holds the rank's Q block, then K, then V), ``plain_shard`` (a plan bug: the fused weight
declared plain ``Shard(0)``, so rank r's rows are rows ``r*3N/p ..`` of ``[Wq; Wk; Wv]``), ``no_allreduce``
(the output projection's partial sums never reduced).  ``part``: ``qkv`` (causal attention) or ``gate_up``;
``slices``: the parts sliced out by offset instead of ``chunk``.
"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/torch: megatron_mlp's f and g
from megatron_mlp import CopyToTP, ReduceFromTP  # noqa: E402

B, S, H, NH, HD, FF = 2, 4, 8, 4, 2, 8
BUGS = ("", "swap_parts", "head_major", "plain_shard", "no_allreduce")


def attention(x, w_qkv, wo, order="qkv", head_major=False, slices=False):
    b, s, _ = x.shape
    y = x @ w_qkv.t()
    if head_major:  # [b, s, heads, 3, hd]: each head's q, k, v side by side
        q, k, v = y.view(b, s, -1, 3, HD).unbind(3)
    elif slices:  # Phi-3's spelling: qkv[..., :n], qkv[..., n:2n], qkv[..., 2n:]
        n = y.shape[-1] // 3
        q, k, v = y[..., :n], y[..., n:2 * n], y[..., 2 * n:]
    else:
        q, k, v = y.chunk(3, dim=-1)
    if order == "kqv":
        q, k = k, q
    q, k, v = (t.reshape(b, s, -1, HD).transpose(1, 2) for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(b, s, -1) @ wo.t()


def swiglu(x, w_gate_up, w_down, order="gu"):
    gate, up = (x @ w_gate_up.t()).chunk(2, dim=-1)
    if order == "ug":
        gate, up = up, gate
    return (F.silu(gate) * up) @ w_down.t()


def make(part, bug="", slices=False):
    block = attention if part == "qkv" else swiglu
    kw = {"slices": True} if slices else {}
    if bug == "swap_parts":
        kw.update({"order": "kqv"} if part == "qkv" else {"order": "ug"})
    if bug == "head_major":
        kw = {"head_major": True}

    def logical(x, w_fused, w_out, target):
        return ((block(x, w_fused, w_out, **({"slices": True} if slices else {})) - target) ** 2).sum()

    def parallel(ctx, x, w_fused, w_out, target):
        tp = ctx.group("tp")
        y = block(CopyToTP.apply(x, tp), w_fused, w_out, **kw)
        y = y if bug == "no_allreduce" else ReduceFromTP.apply(y, tp)
        return ((y - target) ** 2).sum()
    return logical, parallel


def fused_layout(parts: int, rows: int, cols: int, tp: int) -> list:
    """The rank's block of each part, in part order: interleave of dim 0 over (parts, tp)."""
    return [{"op": "reshape", "attrs": {"shape": [parts, tp, rows // tp, cols]}},
            {"op": "transpose", "attrs": {"dim0": 0, "dim1": 1}},
            {"op": "reshape", "attrs": {"shape": [parts * rows, cols]}}]


def tvcert_trace(tp: int = 2, part: str = "qkv", bug: str = "", dtype: str = "float64", slices: bool = False):
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r} (one of {', '.join(b for b in BUGS if b)})")
    if part not in ("qkv", "gate_up"):
        raise ValueError(f"unknown part {part!r} (qkv or gate_up)")
    if (bug == "head_major" or slices) and part != "qkv":
        raise ValueError("head_major and slices apply to the fused qkv")
    k, n = (3, NH * HD) if part == "qkv" else (2, FF)
    if n % tp or (part == "qkv" and NH % tp):
        raise ValueError(f"tp={tp} must divide the heads ({NH}) and the part size ({n})")
    f = {"dtype": dtype}
    fused = {"shape": [k * n, H], "param": True, "placement": {"tp": "Shard(0)"}, **f}
    if bug != "plain_shard":
        fused["layout"] = fused_layout(k, n, H, tp)
    inputs = {"x": {"shape": [B, S, H], **f}, "w_fused": fused,
              "w_out": {"shape": [H, n], "param": True, "placement": {"tp": "Shard(1)"}, **f},
              "target": {"shape": [B, S, H], **f}}
    logical, parallel = make(part, bug, slices)
    return dict(logical=logical, parallel=parallel, inputs=inputs, mesh={"tp": tp},
                name=f"fused_{part}_tp{tp}{'_' + bug if bug else ''}")
