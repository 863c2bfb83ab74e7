"""A fused GQA ``w_qkv`` under tensor parallelism: Q, K and V of different row counts, each rank holding its
heads of each, for `tvcert trace` (issue 15 §3).

With grouped-query attention (4 query heads sharing 2 key / value heads here) the fused weight ``[Wq; Wk; Wv]``
has ``NH*HD`` query rows but ``NKV*HD`` key and value rows.  TP code gives rank r the rows
``[Wq_r; Wk_r; Wv_r]`` (its query heads, then its kv heads) and splits ``x @ w_qkv.t()`` with
``split([nh_r*HD, nkv_r*HD, nkv_r*HD])``.  The spec says so with the input's layout
``concat_groups(dim=0, sizes=[NH*HD, NKV*HD, NKV*HD], groups=tp)`` then ``Shard(0)`` (kernel/concat_groups.py).

    tvcert trace examples/torch/realcode/fused_qkv_gqa.py --verify                         # VERIFIED (tp=2)
    tvcert trace examples/torch/realcode/fused_qkv_gqa.py --set tp=4 --set nh=8 --set nkv=4 --verify   # VERIFIED
    tvcert trace examples/torch/realcode/fused_qkv_gqa.py --set bug=qk_boundary --verify   # REFUTED
    tvcert trace examples/torch/realcode/fused_qkv_gqa.py --set bug=kv_swap --verify       # REFUTED
    tvcert trace examples/torch/realcode/fused_qkv_gqa.py --set bug=plain_shard --verify   # REFUTED
    tvcert trace examples/torch/realcode/fused_qkv_gqa.py --set bug=plan_boundary --verify # REFUTED

``bug``: ``qk_boundary`` (the rank's query slice starts a head late, reading its first key head as a query
head), ``kv_swap`` (keys and values taken in the wrong order), ``plain_shard`` (a plan bug: the fused weight
declared plain ``Shard(0)``, so rank r's rows are rows ``r*R/p ..`` of ``[Wq; Wk; Wv]``), ``plan_boundary`` (a
plan bug: the layout's sizes put the q / k boundary a head late, ``[(NH+1)*HD, (NKV-1)*HD, NKV*HD]``).
"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/torch: megatron_mlp's f and g
from megatron_mlp import CopyToTP, ReduceFromTP  # noqa: E402

B, S, H, NH, NKV, HD = 2, 4, 8, 4, 2, 2
BUGS = ("", "qk_boundary", "kv_swap", "plain_shard", "plan_boundary")


def attention(x, w_qkv, wo, nh, nkv, bug=""):
    """GQA over ``nh`` query and ``nkv`` kv heads (the rank's, or all of them)."""
    b, s, _ = x.shape
    y = x @ w_qkv.t()
    a, c = nh * HD, nkv * HD
    if bug == "qk_boundary":
        q, k, v = y[..., HD:a + HD], y[..., a:a + c], y[..., a + c:]
    else:
        q, k, v = y.split([a, c, c], dim=-1)
    if bug == "kv_swap":
        k, v = v, k
    q = q.reshape(b, s, nh, HD).transpose(1, 2)
    k, v = (t.reshape(b, s, nkv, 1, HD).expand(b, s, nkv, nh // nkv, HD).reshape(b, s, nh, HD).transpose(1, 2)
            for t in (k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(b, s, -1) @ wo.t()


def make(tp, bug="", nh=NH, nkv=NKV):
    def logical(x, w_qkv, wo, target):
        return ((attention(x, w_qkv, wo, nh, nkv) - target) ** 2).sum()

    def parallel(ctx, x, w_qkv, wo, target):
        g = ctx.group("tp")
        y = attention(CopyToTP.apply(x, g), w_qkv, wo, nh // tp, nkv // tp, bug)
        return ((ReduceFromTP.apply(y, g) - target) ** 2).sum()
    return logical, parallel


def gqa_layout(tp: int, sizes) -> list:
    """Rank r's rows: its query heads, then its key heads, then its value heads."""
    return [{"op": "concat_groups", "attrs": {"dim": 0, "sizes": list(sizes), "groups": tp}}]


def tvcert_trace(tp: int = 2, bug: str = "", dtype: str = "float64", nh: int = NH, nkv: int = NKV):
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r} (one of {', '.join(b for b in BUGS if b)})")
    if nkv % tp or nh % nkv or nkv < 2:
        raise ValueError(f"tp={tp} must divide the kv heads ({nkv}), at least 2, which divide the heads ({nh})")
    rows = (nh + 2 * nkv) * HD
    f = {"dtype": dtype}
    fused = {"shape": [rows, H], "param": True, "placement": {"tp": "Shard(0)"}, **f}
    if bug == "plan_boundary":
        fused["layout"] = gqa_layout(tp, ((nh + 1) * HD, (nkv - 1) * HD, nkv * HD))
    elif bug != "plain_shard":
        fused["layout"] = gqa_layout(tp, (nh * HD, nkv * HD, nkv * HD))
    inputs = {"x": {"shape": [B, S, H], **f}, "w_qkv": fused,
              "wo": {"shape": [H, nh * HD], "param": True, "placement": {"tp": "Shard(1)"}, **f},
              "target": {"shape": [B, S, H], **f}}
    logical, parallel = make(tp, bug if bug in ("qk_boundary", "kv_swap") else "", nh, nkv)
    return dict(logical=logical, parallel=parallel, inputs=inputs, mesh={"tp": tp},
                name=f"fused_qkv_gqa_tp{tp}{'_' + bug if bug else ''}")
