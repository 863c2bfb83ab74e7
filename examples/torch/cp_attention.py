"""Context-parallel causal attention through PyTorch's own ring attention, for `tvcert trace`.

The sequence is sharded over ``cp``; with ``lb=true`` (torch's default ``enable_load_balance``) in
head-tail order (rank r holds chunks r and 2cp-1-r of 2cp: ``ZigzagShard``), else in contiguous blocks.
Attention is ``torch.distributed.tensor.experimental._context_parallel._attention``'s
``_templated_ring_attention`` / ``_templated_ring_attention_backward``, which is what ``context_parallel()``'s
SDPA dispatch runs (``_sdpa_handler`` -> ``_scaled_dot_product_ring_flash_attention``); the dispatch itself
needs a CUDA flash kernel, so it is entered at the function it calls (``tvcert.frontends.context_parallel``).

    tvcert trace examples/torch/cp_attention.py --set cp=2 --verify      # UNKNOWN: the ranks differ

Verdict today: UNKNOWN naming torch's lines: its ring runs a different program on every cp rank (no SPMD form).
``bug=lb_order``: the load-balanced ring on contiguously sharded data (chunks never put in head-tail order).
``tp=2``: TP + CP on a cp x tp mesh, Wq / Wk / Wv column-parallel (each tp rank holds its heads).
"""
import torch.nn.functional as F

B, NH, HD = 1, 2, 4
H = NH * HD


def heads(t):
    b, s, h = t.shape
    return t.view(b, s, h // HD, HD).transpose(1, 2)


def logical(x, wq, wk, wv, target):
    q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return ((o - target) ** 2).sum()


def make_parallel(lb: bool):
    from tvcert.frontends.context_parallel import ring_sdpa

    def parallel(ctx, x, wq, wk, wv, target):
        q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
        o = ring_sdpa(q, k, v, ctx.group("cp"), is_causal=True, load_balance=lb)
        return ((o - target) ** 2).sum()
    return parallel


def tvcert_trace(cp: int = 2, lb: bool = True, bug: str = "", seq: int = 0, tp: int = 1):
    from tvcert.frontends.context_parallel import trace_cp

    if bug not in ("", "lb_order"):
        raise ValueError(f"unknown bug {bug!r}")
    s = seq or 4 * cp
    zig = lb and bug != "lb_order"  # how the data is sharded
    seq_pl = lambda d: {"cp": f"ZigzagShard({d})" if zig else f"Shard({d})"}  # noqa: E731
    mesh, col, heads_pl = {"cp": cp}, {}, {}
    if tp > 1:
        mesh, col, heads_pl = {"cp": cp, "tp": tp}, {"tp": "Shard(1)"}, {"tp": "Shard(1)"}
    w = {"shape": [H, H], "param": True, "placement": col}
    # each rank's loss is its tokens' (and heads') share; weight gradients: its tokens' share of its columns
    out_pl = {"loss": {a: "Partial(sum)" for a in mesh}}
    out_pl |= {f"grad_{p}": {"cp": "Partial(sum)", **col} for p in ("wq", "wk", "wv")}
    return trace_cp(load_balance=lb, logical=logical, parallel=make_parallel(lb), mesh=mesh, output_placements=out_pl,
                    inputs={"x": {"shape": [B, s, H], "placement": seq_pl(1)}, "wq": w, "wk": w, "wv": w,
                            "target": {"shape": [B, NH, s, HD], "placement": {**seq_pl(2), **heads_pl}}},
                    name=f"cp_attention_cp{cp}{'_tp' + str(tp) if tp > 1 else ''}{'_lb' if lb else ''}"
                         f"{'_' + bug if bug else ''}")
