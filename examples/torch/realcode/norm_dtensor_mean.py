"""A LayerNorm + GELU MLP block parallelized with DTensor (Colwise / Rowwise, optionally SequenceParallel) and
trained with a *mean* loss (``F.mse_loss``'s default reduction), for `tvcert trace`.

Without sequence parallelism every rank holds the full output and the mean loss is replicated.  ``loss``
picks the spelling: ``mse`` (``F.mse_loss``), ``mean`` (``((out - t) ** 2).mean()``), ``sum_div``
(``.sum() / out.numel()``, the local numel).

With sequence parallelism (``sp``) each rank holds a sequence shard of the output.  The right loss is the
local *sum* divided by the *global* element count (``loss=global_div``): a Partial(sum) of the global mean,
whose gradients DTensor's backward sums over tp.  A local mean (``loss=mse`` / ``mean`` with ``sp``) is a
real bug: the loss values still average to the global mean (declared Partial(avg)), but DTensor sums the
gradients of the local means, tp times the gradient of the global mean -- REFUTED.  Other bugs:
``no_sequence_parallel`` (the norm left out of the plan: its weight gradients stay partial), ``sum_as_mean``
(the local sum declared as the mean's Partial(avg)).

    tvcert trace examples/torch/realcode/norm_dtensor_mean.py --set sp=true --verify
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

B, S, H, FF = 2, 4, 8, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(H)
        self.up = nn.Linear(H, FF)
        self.act = nn.GELU()
        self.down = nn.Linear(FF, H)

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


def make_loss(loss: str, bug: str):
    def loss_fn(out, x, target):
        if bug == "sum_as_mean":
            return ((out - target) ** 2).sum()
        if loss == "mean":
            return ((out - target) ** 2).mean()
        if loss == "sum_div":
            return ((out - target) ** 2).sum() / out.numel()
        if loss == "global_div":
            return ((out - target) ** 2).sum() / (B * S * H)
        return F.mse_loss(out, target)

    return loss_fn


def tvcert_trace(sp: bool = False, loss: str = "mse", bug: str = "", tp: int = 2):
    from tvcert.frontends.dtensor import trace_module_plan

    def make():
        torch.manual_seed(0)
        return Block()

    if sp:
        pl = {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
              "down": RowwiseParallel(output_layouts=Shard(1))}
        if bug == "no_sequence_parallel":
            del pl["norm"]
    else:
        pl = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    seq = {"shape": [B, S, H], **({"placement": {"tp": "Shard(1)"}} if sp else {})}
    kw = {"output_placements": {"loss": {"tp": "Partial(sum)" if loss == "global_div" else "Partial(avg)"}}} if sp else {}
    return trace_module_plan(make, lambda m, mesh: parallelize_module(m, mesh, pl), make_loss(loss, bug),
                             data={"x": seq, "target": seq}, mesh={"tp": tp},
                             name=f"norm_dtensor_mean{'_sp' if sp else ''}_{loss}{'_' + bug if bug else ''}", **kw)
