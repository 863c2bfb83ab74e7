"""Context-parallel causal attention through PyTorch's own ring attention, for `tvcert trace`.

The sequence is sharded over ``cp``; with ``lb=true`` (torch's default ``enable_load_balance``) in
head-tail order (rank r holds chunks r and 2cp-1-r of 2cp: ``ZigzagShard``), else in contiguous blocks.
Attention is ``torch.distributed.tensor.experimental._context_parallel._attention``'s
``_templated_ring_attention`` / ``_templated_ring_attention_backward``, which is what ``context_parallel()``'s
SDPA dispatch runs (``_sdpa_handler`` -> ``_scaled_dot_product_ring_flash_attention``); the dispatch itself
needs a CUDA flash kernel, so it is entered at the function it calls (``tvcert.frontends.context_parallel``).

    tvcert trace examples/torch/cp_attention.py --set cp=2 --set tp=2 --verify                      # VERIFIED

Verdict today: non-causal attention on contiguous blocks is VERIFIED (forward and backward; cp 2 with either
rotater, cp 3 / 4 / 8 with ``rotate=alltoall``, cp x tp) by ``ring_sigmoid_merge`` / ``ring_sigmoid_merge_backward``
(``tvcert.kernel.ring_merge``, Coq ``RingMerge``):

    tvcert trace examples/torch/cp_attention.py --set causal=false --set lb=false --set tp=2 --verify   # VERIFIED

With causal attention torch's ring runs a different program on every cp rank; the trace merges them into one program
in which every rank runs its own (``tvcert.frontends.mpmd``), which the interpreter runs (it agrees with SDPA), and
``ring_masked_merge`` / ``ring_masked_merge_backward`` (``tvcert.kernel.ring_causal``, Coq ``RingMasked``) follow every
rank's own copy: the masked diagonal block, the skipped future blocks and the load balancer's half blocks, contiguous
(``lb=false``) or head-tail, cp 2 / 4 / 8, with ``tp=2``: VERIFIED, with ``rope=true`` too (each rank's positions cut
from the sequence's position buffer as the sequence is: ``slice_block_to_shard``, ``zigzag_from_slices``; the caches
read there: ``rowwise_shard``).
The bugs below are REFUTED (causal or not, cp 2 / 4, with ``tp=2`` too):

    tvcert trace examples/torch/cp_attention.py --set cp=2 --set tp=2 --set bug=positions_not_offset --verify
    tvcert trace examples/torch/cp_attention.py --set lb=false --set bug=lse_not_updated --verify
    tvcert trace examples/torch/cp_attention.py --set lb=false --set causal=false --set bug=plain_average --verify

``bug``: ``lse_not_updated`` (the merged log-sum-exp left at the first block's), ``plain_average`` (blocks averaged
without their log-sum-exp weights), ``dkv_backwards`` (cp >= 3, ``rotate=alltoall``: dK / dV sent to rank - 1 while K / V go to rank + 1),
``lb_order`` (the load-balanced ring on contiguously sharded data: chunks never put in head-tail order),
``positions_not_offset`` (RoPE at positions ``arange(local length)`` on every rank: REFUTED in the cache read),
``last_rank_unmasked`` (``_is_causal_behavior`` patched: the last cp rank attends its own block without the causal
mask; the other ranks' programs are right, so it is seen only if every rank's program is checked),
``future_block_attended`` (``_is_causal_behavior`` patched: a key block entirely in a rank's future attended in full,
not skipped), ``mask_diagonal_shifted`` (the block kernel's causal mask ``tril(1)``: every query sees the next key).
``rope=true``: rotary embeddings of q / k at each rank's positions (its block, or its two head-tail chunks), from
cos / sin caches given as inputs.
``tp=2``: TP + CP on a cp x tp mesh, Wq / Wk / Wv column-parallel (each tp rank holds its heads).
"""
import contextlib

import torch.nn.functional as F

NH, HD = 2, 4
H = NH * HD


def heads(t):
    """[s, h] -> [1, heads, s, hd] (torch's ring takes [b, h, s, d]; tokens are 2-D so that no reshape merges the
    batch with a sharded sequence)."""
    s, h = t.shape
    return t.view(s, h // HD, HD).transpose(0, 1).unsqueeze(0)


def rope(t, pos, cos, sin):
    """Rotary embedding of [1, heads, s, hd] at integer positions ``pos`` [s] (rotate-half form), read from the
    cos / sin caches [max_pos, hd] at the positions, as models do (inputs here: any cache values)."""
    import torch

    half = torch.cat([-t[..., HD // 2:], t[..., :HD // 2]], -1)
    return t * cos[pos] + half * sin[pos]


def make_logical(causal: bool, with_rope: bool):
    def logical(x, wq, wk, wv, target, cos=None, sin=None):
        import torch

        q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
        if with_rope:
            pos = torch.arange(x.shape[0])
            q, k = rope(q, pos, cos, sin), rope(k, pos, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return ((o - target) ** 2).sum()
    return logical


@contextlib.contextmanager
def injected(bug: str):
    """A bug put into torch's ring while it is traced (restored after)."""
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental._context_parallel import _attention as A

    saved = []

    def patch(obj, name, fn):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, fn)

    if bug in ("lse_not_updated", "plain_average"):
        def merge_one(self, block_out, block_lse, partial):  # _SDPAMerger._merge_one without load balancing
            block_lse = block_lse.unsqueeze(-1)
            self._should_lse_squeeze = True
            if self._lse is None:
                self._lse, self._out = block_lse, block_out
            elif bug == "plain_average":  # no log-sum-exp weighting of the blocks
                self._out = (self._out + block_out) / 2
                self._lse = self._lse - F.logsigmoid(self._lse - block_lse)
            else:  # the output merged, the log-sum-exp the backward reads left at the first block's
                self._out = self._out - F.sigmoid(block_lse - self._lse) * (self._out - block_out)
        patch(A._SDPAMerger, "_merge_one", merge_one)
    elif bug == "last_rank_unmasked":  # the last cp rank attends its own block without the causal mask
        orig_behavior = A._is_causal_behavior

        def behavior(rank, world_size, i, is_causal):
            if is_causal and i == 0 and rank == world_size - 1:
                return A._CausalBehavior.NOT_IS_CAUSAL
            return orig_behavior(rank=rank, world_size=world_size, i=i, is_causal=is_causal)
        patch(A, "_is_causal_behavior", behavior)
    elif bug == "future_block_attended":  # a block entirely in the future attended in full instead of skipped
        orig_behavior = A._is_causal_behavior

        def behavior(rank, world_size, i, is_causal):
            b = orig_behavior(rank=rank, world_size=world_size, i=i, is_causal=is_causal)
            return A._CausalBehavior.NOT_IS_CAUSAL if b == A._CausalBehavior.SKIP else b
        patch(A, "_is_causal_behavior", behavior)
    elif bug == "mask_diagonal_shifted":  # the block kernel's causal mask one key too far: tril(diagonal=1)
        import math

        import torch
        from tvcert.frontends import context_parallel as C

        orig_scores = C._scores

        def scores(q, k, is_causal, scale):
            if not is_causal:
                return orig_scores(q, k, is_causal, scale)
            r = math.sqrt((1.0 / math.sqrt(q.shape[-1])) if scale is None else float(scale))
            s = torch.matmul(q * r, (k * r).transpose(-2, -1))
            keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(1)
            return torch.where(keep, s, s.amin(-1, keepdim=True)), keep.to(s.dtype), r
        patch(C, "_scores", scores)
    elif bug == "dkv_backwards":  # K/V gradients sent to rank - 1 while K/V travel to rank + 1
        orig = A._create_rotater

        def create(pg, seq_dim, method=None):
            r = orig(pg, seq_dim, method)
            if method == A._RotateMethod.ALL_TO_ALL:
                import torch.distributed as dist
                import torch.distributed._functional_collectives as ft_c

                def exchange(buf):
                    n = dist.get_world_size(pg)
                    r._buffer = ft_c.permute_tensor(buf.contiguous(), [n - 1] + list(range(n - 1)), pg)
                r.exchange_buffers = exchange
            return r
        patch(A, "_create_rotater", create)
    try:
        yield
    finally:
        for obj, name, fn in reversed(saved):
            setattr(obj, name, fn)


def make_parallel(lb: bool, causal: bool, rotate: str, with_rope: bool, bug: str):
    from tvcert.frontends.context_parallel import ring_sdpa

    def parallel(ctx, x, wq, wk, wv, target, cos=None, sin=None):
        import torch

        q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
        if with_rope:  # this rank's positions: its block (or its two head-tail chunks) of the sequence
            n, r, p = x.shape[0], ctx.coord("cp"), ctx.size("cp")
            full = torch.arange(n * p)  # the sequence's positions, cut as the sequence is (a slice of the buffer)
            if bug == "positions_not_offset":
                pos = torch.arange(n)
            elif lb:
                c = n // 2
                pos = torch.cat([full[r * c:(r + 1) * c], full[(2 * p - 1 - r) * c:(2 * p - r) * c]])
            else:
                pos = full[r * n:(r + 1) * n]
            q, k = rope(q, pos, cos, sin), rope(k, pos, cos, sin)
        o = ring_sdpa(q, k, v, ctx.group("cp"), is_causal=causal, load_balance=lb, rotate=rotate)
        return ((o - target) ** 2).sum()
    return parallel


def tvcert_trace(cp: int = 2, lb: bool = True, bug: str = "", seq: int = 0, tp: int = 1, causal: bool = True,
                 rotate: str = "allgather", rope: bool = False):
    from tvcert.frontends.context_parallel import trace_cp

    if bug not in ("", "lb_order", "lse_not_updated", "plain_average", "dkv_backwards", "positions_not_offset",
                   "last_rank_unmasked", "future_block_attended", "mask_diagonal_shifted"):
        raise ValueError(f"unknown bug {bug!r}")
    if lb and bug in ("lse_not_updated", "plain_average", "future_block_attended"):
        raise ValueError(f"bug={bug} patches torch's ring without load balancing (lb=false; the load-balanced ring "
                         f"skips no block)")
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
    with injected(bug):  # the whole trace: the backward ring runs after the parallel function returns
        with_rope = rope or bug == "positions_not_offset"
        caches = {"cos": {"shape": [s, HD]}, "sin": {"shape": [s, HD]}} if with_rope else {}
        return trace_cp(logical=make_logical(causal, with_rope),
                        parallel=make_parallel(lb, causal, rotate, with_rope, bug), mesh=mesh, output_placements=out_pl,
                        inputs={"x": {"shape": [s, H], "placement": seq_pl(0)}, "wq": w, "wk": w, "wv": w,
                                "target": {"shape": [1, NH, s, HD], "placement": {**seq_pl(2), **heads_pl}}, **caches},
                        name=f"cp_attention_cp{cp}{'_tp' + str(tp) if tp > 1 else ''}{'_lb' if lb else ''}"
                             f"{'_' + bug if bug else ''}")
