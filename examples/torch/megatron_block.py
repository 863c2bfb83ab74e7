"""A pre-norm attention block in Megatron style (hand-written TP and sequence parallelism).

Layout is Megatron's [seq, batch, hidden], so sequence parallelism shards dim 0 and the
all-gather / reduce-scatter run along dim 0.  `block` is the single-device model; `block_tp`
the tensor-parallel version (heads split across ranks); `block_sp` adds sequence parallelism
(norm and residual on sequence shards; the norm weight's gradient is a partial sum that needs an
all_reduce outside autograd -- `sp_grad_sync`, Megatron's allreduce of sequence-parallel grads).
"""
import torch
import torch.distributed._functional_collectives as funcol

from megatron_mlp import CopyToTP, ReduceFromTP

S, B, NH, HD = 4, 2, 4, 2
H = NH * HD
EPS = 1e-5


class GatherFromSP(torch.autograd.Function):
    """all_gather along seq forward, reduce_scatter backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return funcol.all_gather_tensor(x, 0, group)

    @staticmethod
    def backward(ctx, g):
        return funcol.reduce_scatter_tensor(g, "sum", 0, ctx.group), None


class ReduceScatterToSP(torch.autograd.Function):
    """reduce_scatter along seq forward, all_gather backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return funcol.reduce_scatter_tensor(x, "sum", 0, group)

    @staticmethod
    def backward(ctx, g):
        return funcol.all_gather_tensor(g, 0, ctx.group), None


def rmsnorm(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * w


def attention(h, wq, wk, wv, wo_part):
    s, b, _ = h.shape
    nh = wq.shape[1] // HD                        # local heads
    q = (h @ wq).view(s, b, nh, HD).permute(1, 2, 0, 3)
    k = (h @ wk).view(s, b, nh, HD).permute(1, 2, 0, 3)
    v = (h @ wv).view(s, b, nh, HD).permute(1, 2, 0, 3)
    scores = q @ k.transpose(-1, -2) / 2.0        # 1/sqrt(HD)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
    p = torch.softmax(scores.masked_fill(mask, -1e4), -1)
    o = (p @ v).permute(2, 0, 1, 3).reshape(s, b, nh * HD)
    return o @ wo_part


def block(x, norm_w, wq, wk, wv, wo, target):
    y = x + attention(rmsnorm(x, norm_w), wq, wk, wv, wo)
    return 0.5 * ((y - target) ** 2).sum()


def block_tp(ctx, x, norm_w, wq, wk, wv, wo, target, bug=""):
    tp = ctx.group("tp")
    hn = rmsnorm(x, norm_w)
    hn = hn if bug == "no_copy" else CopyToTP.apply(hn, tp)
    o = attention(hn, wq, wk, wv, wo)                          # partial sums of the output projection
    o = o if bug == "no_allreduce" else ReduceFromTP.apply(o, tp)
    y = x + o
    return 0.5 * ((y - target) ** 2).sum()


def block_sp(ctx, x, norm_w, wq, wk, wv, wo, target, bug=""):
    tp = ctx.group("tp")
    hn = rmsnorm(x, norm_w)                                    # on the local sequence shard
    full = GatherFromSP.apply(hn, tp)
    o = attention(full, wq, wk, wv, wo)
    y = x + ReduceScatterToSP.apply(o, tp)
    local = 0.5 * ((y - target) ** 2).sum()
    return ReduceFromTP.apply(local, tp)


def sp_grad_sync(ctx, grads):
    """Megatron all-reduces the gradients of parameters replicated under sequence parallelism."""
    grads = dict(grads)
    grads["norm_w"] = funcol.all_reduce(grads["norm_w"], "sum", ctx.group("tp"))
    return grads


def inputs(sp: bool):
    seq = {"tp": "Shard(0)"} if sp else {}
    return {
        "x": {"shape": [S, B, H], "placement": seq},
        "norm_w": {"shape": [H], "param": True},
        "wq": {"shape": [H, H], "placement": {"tp": "Shard(1)"}, "param": True},
        "wk": {"shape": [H, H], "placement": {"tp": "Shard(1)"}, "param": True},
        "wv": {"shape": [H, H], "placement": {"tp": "Shard(1)"}, "param": True},
        "wo": {"shape": [H, H], "placement": {"tp": "Shard(0)"}, "param": True},
        "target": {"shape": [S, B, H], "placement": seq},
    }


def tvcert_trace(sp: bool = False, bug: str = ""):
    """bug: "" | "no_allreduce" (forward all_reduce dropped) | "no_copy" (backward all_reduce dropped)
    | "no_norm_grad_sync" (sequence parallel without the norm-weight gradient all_reduce)."""
    if sp:
        fn = lambda ctx, **kw: block_sp(ctx, **kw, bug=bug)  # noqa: E731
        sync = None if bug == "no_norm_grad_sync" else sp_grad_sync
    else:
        fn = lambda ctx, **kw: block_tp(ctx, **kw, bug=bug)  # noqa: E731
        sync = None
    return dict(logical=block, parallel=fn, inputs=inputs(sp), mesh={"tp": 2}, grad_sync=sync,
                name=f"megatron_block{'_sp' if sp else ''}{'_' + bug if bug else ''}")
