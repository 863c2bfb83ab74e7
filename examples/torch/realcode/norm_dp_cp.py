"""A mean loss over tokens sharded two ways -- the batch over dp, the sequence over cp -- with the gradients
averaged over both axes, for `tvcert trace`.

Each rank holds a (batch block, sequence block) of the tokens and computes the mean loss over its own
tokens; every rank holds the same number of tokens, so the mean over all ranks of the local means is the
global mean (the local losses are Partial(avg) over dp and cp), and averaging the local gradients over both
axes gives the single-device gradients.  ``sync`` picks how the average is written:

* ``nested``: ``all_reduce(avg)`` over dp, then over cp (either order, ``order=cp_dp``);
* ``sum_div``: ``all_reduce(sum)`` over each axis, then a division by dp * cp.

Bugs: ``dp_only`` (the cp average forgotten: cp partial gradients read as replicated), ``div_dp`` (summed
over both, divided by dp only: cp times too large), ``avg_then_sum`` (averaged over dp, summed over cp).

    tvcert trace examples/torch/realcode/norm_dp_cp.py --verify --set sync=sum_div
"""
import torch
import torch.distributed._functional_collectives as funcol

B, S, D = 4, 6, 3


def predict(x, w):
    return torch.tanh(x * w).sum(-1)  # [B, S]: a per-token score (the model acts on the last dim only)


def logical(x, w, t):
    return ((predict(x, w) - t) ** 2).mean()


def parallel(ctx, x, w, t):
    return ((predict(x, w) - t) ** 2).mean()


def make_sync(sync: str, order: str, bug: str):
    def grad_sync(ctx, grads):
        first, second = ("dp", "cp") if order == "dp_cp" else ("cp", "dp")
        out = {}
        for k, g in grads.items():
            if bug == "dp_only":
                g = funcol.all_reduce(g, "avg", ctx.group("dp"))
            elif bug == "avg_then_sum":
                g = funcol.all_reduce(funcol.all_reduce(g, "avg", ctx.group("dp")), "sum", ctx.group("cp"))
            elif sync == "sum_div" or bug == "div_dp":
                g = funcol.all_reduce(funcol.all_reduce(g, "sum", ctx.group(first)), "sum", ctx.group(second))
                sizes = dict(zip(ctx.axes, ctx.sizes))
                g = g / (sizes["dp"] if bug == "div_dp" else sizes["dp"] * sizes["cp"])
            else:
                g = funcol.all_reduce(funcol.all_reduce(g, "avg", ctx.group(first)), "avg", ctx.group(second))
            out[k] = g
        return out

    return grad_sync


def tvcert_trace(sync: str = "nested", order: str = "dp_cp", bug: str = "", dp: int = 2, cp: int = 3):
    tok = {"dp": "Shard(0)", "cp": "Shard(1)"}
    inputs = {"x": {"shape": [B, S, D], "placement": tok}, "w": {"shape": [D], "param": True},
              "t": {"shape": [B, S], "placement": tok}}
    return dict(logical=logical, parallel=parallel, grad_sync=make_sync(sync, order, bug), inputs=inputs,
                mesh={"dp": dp, "cp": cp}, output_placements={"loss": {"dp": "Partial(avg)", "cp": "Partial(avg)"}},
                name=f"norm_dp_cp_{sync}_{order}{'_' + bug if bug else ''}")
