"""A small MLP trained with torch.nn.parallel.DistributedDataParallel, for `tvcert trace`.

    tvcert trace examples/torch/ddp_mlp.py --verify                          # VERIFIED
    tvcert trace examples/torch/ddp_mlp.py --set bug=loss_div_world --verify # REFUTED: averaged twice
    tvcert trace examples/torch/ddp_mlp.py --set bug=sum_loss --verify       # REFUTED: summed, not averaged
    tvcert trace examples/torch/ddp_mlp.py --set bug=same_shard --verify     # REFUTED: a batch shard used twice

The logical model is the MLP on the full batch with a mean squared-error loss.  Each rank runs DDP on its share
of the global batch (``sharded=False``: the global batch, rank r reading rows [r*b, (r+1)*b) as a
DistributedSampler without shuffling would hand out contiguous blocks; ``sharded=True``: each rank is given its
block directly, ``Shard(0)``); DDP's reducer averages the gradients over the dp group.  Bugs, each a line here:

* ``loss_div_world``: the loss is divided by the world size by hand, on top of DDP's own averaging.
* ``sum_loss``: ``reduction="sum"`` on the local batch; DDP averages the sums, a gradient B/dp times too large.
* ``same_shard``: the batch is sliced with rank 0 on every rank, so every rank trains on the first block.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

B, H, FF = 8, 4, 8


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(H, FF)
        self.down = nn.Linear(FF, H)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


def tvcert_trace(bug: str = "", dp: int = 2, sharded: bool = False):
    from tvcert.frontends.dataparallel import trace_ddp_plan

    if bug not in ("", "loss_div_world", "sum_loss", "same_shard"):
        raise ValueError(f"unknown bug {bug!r}")
    if sharded and bug == "same_shard":
        raise ValueError("same_shard slices the global batch (sharded=false)")

    def make():
        torch.manual_seed(0)
        return MLP()

    def wrap(model, ctx):
        return DDP(model, process_group=ctx.group("dp"))

    def rows(ctx, x, target):
        b = B // dp
        r = ctx.coord("dp") if bug != "same_shard" else 0  # BUG same_shard: every rank reads block 0
        return {"x": x[r * b:(r + 1) * b], "target": target[r * b:(r + 1) * b]}  # the rank's rows

    def loss_fn(out, x, target):  # the single-device model's loss
        return F.mse_loss(out, target)

    def rank_loss_fn(out, x, target):  # each rank's training step
        if bug == "sum_loss":
            return F.mse_loss(out, target, reduction="sum")  # BUG sum_loss
        loss = F.mse_loss(out, target)
        if bug == "loss_div_world":
            loss = loss / dp  # BUG loss_div_world: DDP averages the gradients already
        return loss

    spec = {"shape": [B, H], **({"placement": {"dp": "Shard(0)"}} if sharded else {})}
    return trace_ddp_plan(make, wrap, loss_fn, data={"x": spec, "target": spec}, mesh={"dp": dp},
                          batch=None if sharded else rows, rank_loss_fn=rank_loss_fn, name=f"ddp_mlp{'_' + bug if bug else ''}")
