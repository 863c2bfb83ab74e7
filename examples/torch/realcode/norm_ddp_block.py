"""A mean loss over a batch shard through a transformer-like block (RMSNorm, rotate-half RoPE, softmax
attention, residual), gradients all_reduce-averaged over dp as DDP does, for `tvcert trace`.

The minimal form of torchtitan's Llama 3 under DDP (``examples/torch/ddp_titan_llama3.py``): the local
``1/n_local`` of the mean travels through the whole backward, and where two paths meet their scalar factors
differ -- the residual add (``c`` against ``c/D`` from the RMSNorm's mean over the hidden dim), RoPE's
``concat`` of the rotated halves, the attention's ``1/sqrt(d)``.  The engine moves the first factor out of
such an add / sub / concat and keeps the exact ratios inside (rule ``scale_common_factor``), so the averaged
gradient is proved equal to the single-device one.

Bugs: ``sum_grads`` (all_reduce sum: p times too large), ``avg_twice`` (divided by dp again: p^2),
``off_by_one`` (sum / (numel + 1)), ``no_residual_scale`` (the residual branch scaled by 1/dp on each rank:
one path's factor off, the ratio between the paths wrong).  Run:
    tvcert trace examples/torch/realcode/norm_ddp_block.py -o plan.json --verify --set bug=avg_twice
"""
import torch
import torch.distributed._functional_collectives as funcol

B, S, D = 4, 4, 4  # global batch, sequence, hidden width


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def rotate(x, cos, sin):  # rotate-half RoPE: a concat of the negated upper half and the lower half
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], dim=-1) * sin


def block(x, wn, wq, wk, wv, wo, cos, sin, res_scale=1.0):
    h = rms_norm(x, wn)
    q, k, v = rotate(h @ wq, cos, sin), rotate(h @ wk, cos, sin), h @ wv
    att = torch.softmax(q @ k.transpose(-2, -1) / D ** 0.5, dim=-1)
    return x * res_scale + (att @ v) @ wo


def logical(x, wn, wq, wk, wv, wo, cos, sin, t):
    return ((block(x, wn, wq, wk, wv, wo, cos, sin) - t) ** 2).mean()


def make_parallel(bug: str, dp: int):
    def parallel(ctx, x, wn, wq, wk, wv, wo, cos, sin, t):
        err = (block(x, wn, wq, wk, wv, wo, cos, sin, 1.0 / dp if bug == "no_residual_scale" else 1.0) - t) ** 2
        if bug == "off_by_one":
            return err.sum() / (err.numel() + 1)
        return err.mean()

    return parallel


def make_sync(bug: str):
    def grad_sync(ctx, grads):
        dp = ctx.group("dp")
        out = {}
        for k, g in grads.items():
            out[k] = funcol.all_reduce(g, "sum" if bug == "sum_grads" else "avg", dp)
            if bug == "avg_twice":
                out[k] = out[k] / ctx.sizes[ctx.axes.index("dp")]
        return out

    return grad_sync


def tvcert_trace(bug: str = "", dp: int = 2):
    if bug not in ("", "sum_grads", "avg_twice", "off_by_one", "no_residual_scale"):
        raise ValueError(f"unknown bug {bug!r}")
    rows = {"placement": {"dp": "Shard(0)"}}
    inputs = {
        "x": {"shape": [B, S, D], **rows},
        "wn": {"shape": [D], "param": True},
        **{w: {"shape": [D, D], "param": True} for w in ("wq", "wk", "wv", "wo")},
        "cos": {"shape": [S, D]},
        "sin": {"shape": [S, D]},
        "t": {"shape": [B, S, D], **rows},
    }
    return dict(logical=logical, parallel=make_parallel(bug, dp), grad_sync=make_sync(bug), inputs=inputs,
                mesh={"dp": dp}, output_placements={"loss": {"dp": "Partial(avg)"}},
                name=f"norm_ddp_block{'_' + bug if bug else ''}")
