"""Phi-3's slice spelling on a fused GQA ``w_qkv`` (issue 15 §3): ``qkv[..., :a]``, ``qkv[..., a:a+c]``,
``qkv[..., a+c:]`` instead of ``split``, the weight laid out ``concat_groups`` as in ``fused_qkv_gqa.py``.

    tvcert trace examples/torch/realcode/fused_qkv_gqa_slices.py --verify                  # VERIFIED (tp=2)
    tvcert trace examples/torch/realcode/fused_qkv_gqa_slices.py --set tp=4 --set nh=8 --set nkv=4 --verify
    tvcert trace examples/torch/realcode/fused_qkv_gqa_slices.py --set bug=kv_swap --verify  # REFUTED

The rank's slice of part i is Shard of the logical part (``split_grouped_shard``, concat_groups.derive_slice);
its backward, each part's ``slice_backward`` zero pad, is Shard of the declared layout of the logical pad
(``concat_grouped_shard`` with the other parts zero, concat_groups.derive_pad), and the pads' sum pulls back to
the layout of the logical sum (``concat_groups_commutes``).

``bug``: ``kv_swap`` (k and v taken in the wrong order), ``plain_shard`` / ``plan_boundary`` (plan bugs, as in
``fused_qkv_gqa.py``: the weight declared plain ``Shard(0)``, the layout's q / k boundary a head late).
"""
import sys
from pathlib import Path

import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fused_qkv_gqa as gqa  # noqa: E402

BUGS = ("", "kv_swap", "plain_shard", "plan_boundary")  # the last two: plan bugs (fused_qkv_gqa.py)


def attention(x, w_qkv, wo, nh, nkv, bug=""):
    """fused_qkv_gqa.attention with the parts sliced out by offset."""
    b, s, _ = x.shape
    y = x @ w_qkv.t()
    a, c, hd = nh * gqa.HD, nkv * gqa.HD, gqa.HD
    q, k, v = y[..., :a], y[..., a:a + c], y[..., a + c:]
    if bug == "kv_swap":
        k, v = v, k
    q = q.reshape(b, s, nh, hd).transpose(1, 2)
    k, v = (t.reshape(b, s, nkv, 1, hd).expand(b, s, nkv, nh // nkv, hd).reshape(b, s, nh, hd).transpose(1, 2)
            for t in (k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(b, s, -1) @ wo.t()


def make(tp, bug="", nh=gqa.NH, nkv=gqa.NKV):
    """fused_qkv_gqa.make with this module's attention."""
    def logical(x, w_qkv, wo, target):
        return ((attention(x, w_qkv, wo, nh, nkv) - target) ** 2).sum()

    def parallel(ctx, x, w_qkv, wo, target):
        g = ctx.group("tp")
        y = attention(gqa.CopyToTP.apply(x, g), w_qkv, wo, nh // tp, nkv // tp, bug)
        return ((gqa.ReduceFromTP.apply(y, g) - target) ** 2).sum()
    return logical, parallel


def tvcert_trace(tp: int = 2, bug: str = "", nh: int = gqa.NH, nkv: int = gqa.NKV):
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r} (one of {', '.join(b for b in BUGS if b)})")
    spec = gqa.tvcert_trace(tp=tp, bug="" if bug == "kv_swap" else bug, nh=nh, nkv=nkv)  # inputs and layout
    spec["logical"], spec["parallel"] = make(tp, bug, nh, nkv)
    spec["name"] = spec["name"].replace("gqa", "gqa_slices") + ("_kv_swap" if bug == "kv_swap" else "")
    return spec
