"""Context parallelism through PyTorch's public ``context_parallel()`` API, for `tvcert trace`.

The training step is written as PyTorch's CP tutorial writes it: full-length tokens, targets and positions are given
to ``context_parallel(mesh, buffers=..., buffer_seq_dims=...)``, which shards them in place with torch's own
head-tail load balancer (``_HeadTailLoadBalancer``; ``lb=false``: contiguous blocks) and patches
``F.scaled_dot_product_attention`` so that q / k / v become sequence-sharded DTensors; attention then runs torch's
ring (``_templated_ring_attention`` and its backward).  On CPU DTensor's CP dispatch has no entry for the CPU flash
kernel, so ``tvcert.frontends.context_parallel.dtensor_ring`` routes those DTensors to the same ring, per block with
the flash kernel's semantics.  The ranks run different programs (causal attention); the trace merges them
(``tvcert.frontends.mpmd``).

    tvcert trace examples/torch/cp_context_parallel.py --set cp=2 --set tp=2 --verify   # VERIFIED
    tvcert trace examples/torch/cp_context_parallel.py --set cp=2 --set tp=2 --set bug=positions_not_offset --verify

``bug``: ``positions_not_offset`` (RoPE positions ``arange(local length)`` made inside the context instead of the
sharded position buffer: REFUTED in the cache read), ``last_rank_unmasked`` (torch's ``_is_causal_behavior`` patched:
the last cp rank attends its own block unmasked).  ``tp=2``: Wq / Wk / Wv column-parallel on a cp x tp mesh.
"""
import torch
import torch.nn.functional as F

from cp_attention import HD, NH, H, heads, injected, rope


def make_logical(causal: bool = True):
    def logical(x, wq, wk, wv, target, cos, sin):
        q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
        pos = torch.arange(x.shape[0])
        q, k = rope(q, pos, cos, sin), rope(k, pos, cos, sin)
        return ((F.scaled_dot_product_attention(q, k, v, is_causal=causal) - target) ** 2).sum()
    return logical


def make_parallel(bug: str, causal: bool = True):
    from torch.distributed.tensor.experimental import context_parallel

    def parallel(ctx, x, wq, wk, wv, target, cos, sin):
        pos = torch.arange(x.shape[0])
        x, target = x.clone(), target.clone()  # context_parallel shards its buffers in place
        bufs = [x, target] + ([] if bug == "positions_not_offset" else [pos])
        with context_parallel(ctx.device_mesh["cp"], buffers=bufs, buffer_seq_dims=[0, 2, 0][:len(bufs)],
                              no_restore_buffers=set(bufs)):
            if bug == "positions_not_offset":
                pos = torch.arange(x.shape[0])
            q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
            q, k = rope(q, pos, cos, sin), rope(k, pos, cos, sin)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return ((o - target) ** 2).sum()
    return parallel


def tvcert_trace(cp: int = 2, tp: int = 1, lb: bool = True, bug: str = "", seq: int = 0, causal: bool = True):
    from torch.distributed.tensor.experimental._context_parallel import _attention as A

    from tvcert.frontends.context_parallel import trace_cp

    if bug not in ("", "positions_not_offset", "last_rank_unmasked"):
        raise ValueError(f"unknown bug {bug!r}")
    s = seq or 4 * cp
    mesh, col = ({"cp": cp, "tp": tp}, {"tp": "Shard(1)"}) if tp > 1 else ({"cp": cp}, {})
    w = {"shape": [H, H], "param": True, "placement": col}
    out_pl = {"loss": {a: "Partial(sum)" for a in mesh}}
    out_pl |= {f"grad_{p}": {"cp": "Partial(sum)", **col} for p in ("wq", "wk", "wv")}
    saved = A._cp_options.enable_load_balance
    A._cp_options.enable_load_balance = lb  # what context_parallel() reads to pick the head-tail load balancer
    try:
        with injected(bug):
            return trace_cp(logical=make_logical(causal), parallel=make_parallel(bug, causal), mesh=mesh, output_placements=out_pl,
                            inputs={"x": {"shape": [s, H]}, "wq": w, "wk": w, "wv": w,
                                    "target": {"shape": [1, NH, s, HD], "placement": dict(col)},
                                    "cos": {"shape": [s, HD]}, "sin": {"shape": [s, HD]}},
                            name=f"cp_context_parallel_cp{cp}{'_tp' + str(tp) if tp > 1 else ''}"
                                 f"{'_lb' if lb else ''}{'_' + bug if bug else ''}")
    finally:
        A._cp_options.enable_load_balance = saved
