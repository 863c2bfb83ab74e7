"""Grouped-query attention with one head per rank (tp = KV-head count), functional collectives, for `tvcert trace`.

Llama-style attention as it is written by hand for tensor parallelism: Wq / Wk / Wv column-parallel, so with
tp equal to the KV-head count each rank holds exactly one KV head (and NH/tp query heads); ``repeat_kv``
expands it to its query heads; the output projection Wo is row-parallel, followed by an all_reduce.  The
heads are split with ``view(b, s, -1, HD)`` -- traced, that is ``reshape [b, s, 1, HD]`` on a rank holding
one head, which the kernel must place from the logical shape and the mesh size, not from the local one.

    tvcert trace examples/torch/realcode/layout_heads.py --verify                      # VERIFIED (tp=2, 1 KV head per rank)
    tvcert trace examples/torch/realcode/layout_heads.py --set tp=4 --set nkv=4 --verify  # VERIFIED (1 head per rank)
    tvcert trace examples/torch/realcode/layout_heads.py --set bug=seq_first --verify  # REFUTED

``bug``: ``seq_first`` (the rank splits heads with ``view(s, b, -1, HD)``, batch and sequence confused),
``kv_block_reversed`` (the rank cuts its K / V block of a replicated weight at rank tp-1-r: its query heads
attend with another rank's KV head), ``no_allreduce`` (Wo's partial sums never reduced).
"""
import torch
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/torch: megatron_mlp's f and g
from megatron_mlp import CopyToTP, ReduceFromTP  # noqa: E402
import torch.nn.functional as F

B, S, H, NH, HD = 2, 4, 16, 4, 4


_Copy, _Reduce = CopyToTP, ReduceFromTP  # Megatron's f and g, defined once in examples/torch/megatron_mlp.py


def repeat_kv(t, n_rep):
    """[b, nkv, s, hd] -> [b, nkv * n_rep, s, hd] (Hugging Face's repeat_kv)."""
    b, nkv, s, hd = t.shape
    return t[:, :, None, :, :].expand(b, nkv, n_rep, s, hd).reshape(b, nkv * n_rep, s, hd)


def heads(t, b, s, seq_first=False):
    return (t.view(s, b, -1, HD) if seq_first else t.view(b, s, -1, HD)).transpose(1, 2)


def attention(x, wq, wk, wv, n_rep):
    b, s, _ = x.shape
    q, k, v = heads(x @ wq, b, s), heads(x @ wk, b, s), heads(x @ wv, b, s)
    o = F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), is_causal=True)
    return o.transpose(1, 2).reshape(b, s, -1)


def make_logical(nkv):
    def logical(x, wq, wk, wv, wo, target):
        return ((attention(x, wq, wk, wv, NH // nkv) @ wo - target) ** 2).sum()
    return logical


def make_tp(nkv, bug=""):
    def parallel(ctx, x, wq, wk, wv, wo, target):
        tp, p, r = ctx.group("tp"), ctx.size("tp"), ctx.coord("tp")
        b, s, _ = x.shape
        xi = _Copy.apply(x, tp)
        kv = nkv * HD // p  # this rank's K / V columns: its KV heads
        rr = p - 1 - r if bug == "kv_block_reversed" else r
        # K / V weights are replicated; each rank cuts its heads' block (its gradient: summed over the ranks)
        wk_r, wv_r = _Copy.apply(wk, tp)[:, rr * kv:(rr + 1) * kv], _Copy.apply(wv, tp)[:, rr * kv:(rr + 1) * kv]
        sf = bug == "seq_first"
        q, k, v = heads(xi @ wq, b, s, sf), heads(xi @ wk_r, b, s, sf), heads(xi @ wv_r, b, s, sf)
        n_rep = NH // nkv
        o = F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), is_causal=True)
        y = o.transpose(1, 2).reshape(b, s, -1) @ wo
        y = y if bug == "no_allreduce" else _Reduce.apply(y, tp)
        return ((y - target) ** 2).sum()
    return parallel


def tvcert_trace(tp: int = 2, nkv: int = 2, bug: str = "", dtype: str = "float64"):
    if bug not in ("", "seq_first", "kv_block_reversed", "no_allreduce"):
        raise ValueError(f"unknown bug {bug!r}")
    if NH % nkv or nkv % tp:
        raise ValueError(f"nkv={nkv} must divide NH={NH} and be a multiple of tp={tp}")
    f = {"dtype": dtype}
    col = {"placement": {"tp": "Shard(1)"}, "param": True, **f}
    inputs = {"x": {"shape": [B, S, H], **f}, "wq": {"shape": [H, NH * HD], **col},
              "wk": {"shape": [H, nkv * HD], "param": True, **f}, "wv": {"shape": [H, nkv * HD], "param": True, **f},
              "wo": {"shape": [NH * HD, H], "placement": {"tp": "Shard(0)"}, "param": True, **f},
              "target": {"shape": [B, S, H], **f}}
    return dict(logical=make_logical(nkv), parallel=make_tp(nkv, bug), inputs=inputs, mesh={"tp": tp},
                name=f"layout_heads_tp{tp}_nkv{nkv}{'_' + bug if bug else ''}")
