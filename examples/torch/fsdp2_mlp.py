"""A small MLP under FSDP2 ``fully_shard`` (torch's own FSDPParamGroup hooks), for `tvcert trace`.

    tvcert trace examples/torch/fsdp2_mlp.py --verify                                # FSDP2, dp 2: VERIFIED
    tvcert trace examples/torch/fsdp2_mlp.py --set mode=hybrid_shard --verify        # HSDP, rep 2 x dp 2: VERIFIED
    tvcert trace examples/torch/fsdp2_mlp.py --set optimizer=adamw --verify          # + AdamW step on the shards
    tvcert trace examples/torch/fsdp2_mlp.py --set bug=double_avg --verify           # REFUTED
    tvcert trace examples/torch/fsdp2_mlp.py --set mode=hybrid_shard --set bug=wrong_mesh_dim --verify  # REFUTED
    tvcert trace examples/torch/fsdp2_mlp.py --set bug=left_out --verify             # REFUTED
    tvcert trace examples/torch/fsdp2_mlp.py --set mode=fsdp_tp --set optimizer=adamw --verify  # FSDP2 x TP
    tvcert trace examples/torch/fsdp2_mlp.py --set mode=fsdp_tp --set bug=left_out --verify     # REFUTED
    tvcert trace examples/torch/fsdp2_mlp.py --set mode=hsdp_tp --verify     # HSDP x TP, tp 2 x rep 2 x dp 2

FSDP2 keeps each parameter as a ``Shard(0)`` DTensor over the mesh it is given; its pre-forward hook
all-gathers a layer group's parameters as one flat buffer, its post-backward hook reduce-scatters the
gradients with ``ReduceOp.AVG`` (HSDP: then all-reduces them over the replicate dim).  Each rank's loss is the
mean over its local batch; FSDP2's average over the ranks makes it the global mean.  Bugs, each a line here:

* ``double_avg``: the loss is divided by the data-parallel size by hand, on top of FSDP2's averaging.
* ``wrong_mesh_dim`` (HSDP): ``fully_shard`` is given the shard dim of the 2-D mesh only, so the gradients are
  reduce-scattered over it and never averaged over the replicate dim the batch is also split over.
* ``left_out``: ``fully_shard`` wraps ``up`` only; ``down`` stays a plain parameter whose gradient a hook
  divides by the world size -- but nothing sums it over the ranks.

``mode=fsdp_tp`` (tp 2 x dp 2): ``parallelize_module`` makes ``up`` colwise and ``down`` rowwise on the tp
slice, then ``fully_shard`` shards those DTensor parameters over dp (FSDP2 + TP, as torchtitan composes them);
each tp pair of ranks reads the same batch.  ``double_avg`` and ``left_out`` (``down`` then a TP-only
parameter whose gradient is never reduced over dp) are the same lines.  ``mode=hsdp_tp``: the same over a 2-D
(rep, dp) FSDP2 mesh (tp 2 x rep 2 x dp 2); ``wrong_mesh_dim`` there too.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

B, H, FF = 8, 4, 8


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(H, FF)
        self.down = nn.Linear(FF, H)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


# fsdp_tp: tp listed first -- FSDP2 shards up's TP-sharded rows inside TP's blocks (_StridedShard), which the
# plan nests as Shard(0) on tp outside Shard(0) on dp
MESHES = {"fully_shard": {"dp": 2}, "hybrid_shard": {"rep": 2, "dp": 2}, "fsdp_tp": {"tp": 2, "dp": 2},
          "hsdp_tp": {"tp": 2, "rep": 2, "dp": 2}}
OPTIMIZERS = {  # run per tensor (foreach=False): one optimizer step on the sharded parameters
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01, foreach=False),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False),
}
BUGS = ("", "double_avg", "wrong_mesh_dim", "left_out")


def tvcert_trace(mode: str = "fully_shard", bug: str = "", optimizer: str = ""):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from tvcert.frontends.fsdp2 import trace_fully_shard_plan

    if mode not in MESHES or bug not in BUGS or (optimizer and optimizer not in OPTIMIZERS) or \
            (bug == "wrong_mesh_dim" and mode not in ("hybrid_shard", "hsdp_tp")):
        raise ValueError(f"mode must be one of {sorted(MESHES)}, bug one of {BUGS} (wrong_mesh_dim: HSDP), "
                         f"optimizer '' or one of {sorted(OPTIMIZERS)}")
    mesh = MESHES[mode]
    world = 1  # the data-parallel ranks (tp ranks share a batch)
    for a, s in mesh.items():
        world *= s if a != "tp" else 1

    def make():
        torch.manual_seed(0)
        return MLP()

    def shard(model, ctx):
        dm = ctx.device_mesh
        if mode in ("fsdp_tp", "hsdp_tp"):  # TP first (DTensor parameters on tp), then FSDP2 on the same mesh
            parallelize_module(model, dm["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        if bug == "left_out":
            fully_shard(model.up, mesh=dm["dp"])  # BUG left_out: down is not sharded, and its gradient is
            for p in model.down.parameters():     # divided by the world size but never summed over the ranks
                p.register_hook(lambda g: g / world)
            return model
        if mode in ("hybrid_shard", "hsdp_tp"):
            # BUG wrong_mesh_dim: the shard dim only
            return fully_shard(model, mesh=dm["dp"] if bug == "wrong_mesh_dim" else dm["rep", "dp"])
        return fully_shard(model, mesh=dm["dp"])

    def loss_fn(out, x, target):  # the single-device model's loss
        return F.mse_loss(out, target)

    def rank_loss_fn(out, x, target):  # each rank's training step
        loss = F.mse_loss(out, target)
        return loss / world if bug == "double_avg" else loss  # BUG double_avg: FSDP2 averages already

    spec = {"shape": [B, H], "placement": {a: "Shard(0)" for a in mesh if a != "tp"}}
    return trace_fully_shard_plan(make, shard, loss_fn, data={"x": spec, "target": spec}, mesh=mesh,
                                  rank_loss_fn=rank_loss_fn, optimizer=OPTIMIZERS[optimizer] if optimizer else None,
                                  name=f"fsdp2_mlp_{mode}{'_' + optimizer if optimizer else ''}"
                                       f"{'_' + bug if bug else ''}")
