"""Red team s10 (H49): a Megatron MLP (tp 2) whose rank program writes values in ways a plain make_fx graph does
not show, and numerics the IR's reals misread.  Each ``bug`` is wrong in torch (the test shows it on the real gloo
group or eagerly) and must not come out VERIFIED; ``bug=""`` is the correct control (VERIFIED).

* ``data_resync``: ``y.data = all_reduce(y.data)`` after the row-parallel all-reduce (a "resync" through
  ``.data``): the forward value is reduced twice; make_fx records no op for a ``.data`` assignment.
* ``out_view``: a reduction written with ``out=`` into a view of a buffer read later through the buffer
  (``torch.sum(..., out=buf[:, :1])``): the write lands in ``buf``; the converter dropped ``out``.
* ``nan_guard``: ``where(isnan(sqrt(b)), 0, b)``, a NaN guard around a partial op: torch zeroes the negative
  entries, the converter read ``isnan`` of any value as the constant 0.
* ``int32_offset``: an index offset computed in int32 (``ids * 4096`` wraps past 2**31 for ids >= 2**19); the IR's
  integers do not wrap.  ``int32_cast``: the int64 offset cast to int32 and back (wraps the same way).
"""
import torch
import torch.distributed._functional_collectives as funcol


class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return funcol.all_reduce(g, "sum", ctx.group), None


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return funcol.all_reduce(x, "sum", group)

    @staticmethod
    def backward(ctx, g):
        return g, None


def _head(y, b2, target, ids, bug):
    scale = torch.ones(target.shape[0], 2, dtype=target.dtype)
    if bug == "out_view":
        torch.sum(target.detach(), 1, keepdim=True, out=scale[:, :1])  # BUG: overwrites the buffer's column 0
    if bug == "nan_guard":
        b2 = torch.where(torch.isnan(torch.sqrt(b2)), 0.0, b2)  # BUG: zeroes the negative entries
    off = (ids.to(torch.int32) if bug == "int32_offset" else ids) * 4096
    if bug == "int32_cast":
        off = off.to(torch.int32).long()  # BUG: the int64 offset narrowed to int32 (wraps past 2**31)
    r = (y + b2) * scale[:, :1] + off.to(target.dtype) * 1e-9
    return 0.5 * ((r - target) ** 2).sum()


def mlp(x, w1, b1, w2, b2, target, ids):
    h = torch.tanh(x @ w1 + b1)
    return _head(h @ w2, b2, target, ids, "")


def make_parallel(bug: str):
    def mlp_tp(ctx, x, w1, b1, w2, b2, target, ids):
        tp = ctx.group("tp")
        h = torch.tanh(CopyToTP.apply(x, tp) @ w1 + b1)
        y = ReduceFromTP.apply(h @ w2, tp)
        if bug == "data_resync":
            y = y.clone()  # (a plain tensor: funcol's AsyncCollectiveTensor ignores a .data assignment)
            y.data = funcol.all_reduce(y.data, "sum", tp) * 1  # BUG: reduced a second time
        return _head(y, b2, target, ids, bug)
    return mlp_tp


B, H, F = 2, 4, 8
GLOO_INT_LOW = 1 << 19  # (gloo_run.py's ids: an int32 offset wraps)
INPUTS = {
    "x": {"shape": [B, H]},
    "w1": {"shape": [H, F], "placement": {"tp": "Shard(1)"}, "param": True},
    "b1": {"shape": [F], "placement": {"tp": "Shard(0)"}, "param": True},
    "w2": {"shape": [F, H], "placement": {"tp": "Shard(0)"}, "param": True},
    "b2": {"shape": [H], "param": True},
    "target": {"shape": [B, H]},
    "ids": {"shape": [B, H], "dtype": "int", "range": 1 << 20},
}


def tvcert_trace(bug: str = ""):
    return dict(logical=mlp, parallel=make_parallel(bug), inputs=INPUTS, mesh={"tp": 2},
                name=f"redteam_s10_mlp_writes{'_' + bug if bug else ''}")
