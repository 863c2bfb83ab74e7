"""Data parallelism with one sample per rank (micro-batch 1), functional collectives, for `tvcert trace`.

A token-wise MLP applied to a [B, S, H] batch sharded over dp with B = dp: each rank holds one sample
[1, S, H], flattens it to tokens with ``view(-1, H)`` and restores it with ``view(b, S, H)`` -- traced, the
literal ``reshape [1, S, H]``, which reads both as "one sample of B" and as "a unit dim before the tokens";
the kernel must place the shard from the logical shape.  The loss is the sum over the batch (all_reduce of
the rank's sum), the weights' gradients are all-reduced (Megatron-style copy: identity forward, all_reduce
backward).

    tvcert trace examples/torch/realcode/layout_microbatch.py --verify                        # VERIFIED
    tvcert trace examples/torch/realcode/layout_microbatch.py --set bug=view_for_t --verify   # REFUTED

``bug``: ``view_for_t`` (``x.view(H, -1).t()`` for ``x.view(-1, H)``: a reshape taken for a transpose),
``no_grad_allreduce`` (the weights' gradients stay the rank's own).
"""
import torch
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/torch: megatron_mlp's f and g
from megatron_mlp import CopyToTP, ReduceFromTP  # noqa: E402

S, H, F = 4, 6, 8


_Copy, _Reduce = CopyToTP, ReduceFromTP  # Megatron's f and g, defined once in examples/torch/megatron_mlp.py


def mlp(x, w1, w2, bug=""):
    b = x.shape[0]
    t = x.view(H, -1).t() if bug == "view_for_t" else x.view(-1, H)
    return (torch.tanh(t @ w1) @ w2).view(b, S, H)


def logical(x, w1, w2, target):
    return ((mlp(x, w1, w2) - target) ** 2).sum()


def make_dp(bug=""):
    def parallel(ctx, x, w1, w2, target):
        dp = ctx.group("dp")
        if bug != "no_grad_allreduce":
            w1, w2 = _Copy.apply(w1, dp), _Copy.apply(w2, dp)
        return _Reduce.apply(((mlp(x, w1, w2, bug) - target) ** 2).sum(), dp)
    return parallel


def tvcert_trace(dp: int = 2, bug: str = "", dtype: str = "float64"):
    if bug not in ("", "view_for_t", "no_grad_allreduce"):
        raise ValueError(f"unknown bug {bug!r}")
    f = {"dtype": dtype}
    batch = {"shape": [dp, S, H], "placement": {"dp": "Shard(0)"}, **f}
    inputs = {"x": batch, "w1": {"shape": [H, F], "param": True, **f}, "w2": {"shape": [F, H], "param": True, **f},
              "target": dict(batch)}
    return dict(logical=logical, parallel=make_dp(bug), inputs=inputs, mesh={"dp": dp},
                name=f"layout_microbatch_dp{dp}{'_' + bug if bug else ''}")
