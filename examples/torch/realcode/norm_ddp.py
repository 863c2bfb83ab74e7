"""Data parallelism with a mean loss, as DDP computes it (functional collectives), for `tvcert trace`.

Every rank holds the whole model and a shard of the batch, computes the *mean* loss over its own samples and
backpropagates it; the gradients are then all_reduce-averaged over dp (what DDP's reducer does).  The local
losses are a Partial(avg) of the single-device mean loss (`output_placements`), and the averaged gradients
are the single-device gradients.  `loss` picks how the mean is spelled:

* ``mean``: ``((y - t) ** 2).mean()``;  ``sum_div``: ``.sum() / numel`` (the local numel);
* ``means``: ``.mean(dim=1).mean(dim=0)`` (a mean of row means);  ``global``: ``.sum() / N_global`` with the
  gradients all_reduce-*summed* (Megatron-style: divide by the global count, then sum).

Bugs: ``sum_grads`` (all_reduce sum where avg was needed: p times too large), ``avg_twice`` (the averaged
gradient divided by dp again: p^2), ``off_by_one`` (sum / (numel + 1)), ``global_avg`` (divided by the global
count and then averaged: p times too small).  Run:
    tvcert trace examples/torch/realcode/norm_ddp.py -o plan.json --verify --set loss=means
"""
import torch
import torch.distributed._functional_collectives as funcol

B, D, H = 8, 6, 4  # global batch, input and output width


def model(x, w1, w2):
    return torch.tanh(x @ w1) @ w2


def logical(x, w1, w2, t):
    return ((model(x, w1, w2) - t) ** 2).mean()


def make_parallel(loss: str, bug: str):
    def parallel(ctx, x, w1, w2, t):
        err = (model(x, w1, w2) - t) ** 2
        if bug == "off_by_one":
            return err.sum() / (err.numel() + 1)
        if loss == "sum_div":
            return err.sum() / err.numel()
        if loss == "means":
            return err.mean(dim=1).mean(dim=0)
        if loss == "global":
            return err.sum() / (B * H)
        return err.mean()

    return parallel


def make_sync(loss: str, bug: str):
    def grad_sync(ctx, grads):
        dp = ctx.group("dp")
        out = {}
        for k, g in grads.items():
            if bug == "sum_grads" or (loss == "global" and bug != "global_avg"):
                out[k] = funcol.all_reduce(g, "sum", dp)
            else:
                out[k] = funcol.all_reduce(g, "avg", dp)
            if bug == "avg_twice":
                out[k] = out[k] / ctx.sizes[ctx.axes.index("dp")]
        return out

    return grad_sync


def tvcert_trace(loss: str = "mean", bug: str = "", dp: int = 2):
    inputs = {
        "x": {"shape": [B, D], "placement": {"dp": "Shard(0)"}},
        "w1": {"shape": [D, H], "param": True},
        "w2": {"shape": [H, H], "param": True},
        "t": {"shape": [B, H], "placement": {"dp": "Shard(0)"}},
    }
    # the local losses: their mean over dp is the global mean (a global-count loss: their sum is)
    placement = "Partial(sum)" if loss == "global" else "Partial(avg)"
    return dict(logical=logical, parallel=make_parallel(loss, bug), grad_sync=make_sync(loss, bug), inputs=inputs,
                mesh={"dp": dp}, output_placements={"loss": {"dp": placement}},
                name=f"norm_ddp_{loss}{'_' + bug if bug else ''}")
