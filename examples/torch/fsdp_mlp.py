"""A small MLP under FSDP in torchtitan's SimpleFSDP form (FSDP, HSDP, FSDP + TP), for `tvcert trace`.

    tvcert trace examples/torch/fsdp_mlp.py --verify                               # FSDP, dp 2: VERIFIED
    tvcert trace examples/torch/fsdp_mlp.py --set mode=hybrid_shard --verify       # HSDP, rep 2 x dp 2: VERIFIED
    tvcert trace examples/torch/fsdp_mlp.py --set mode=fsdp_tp --verify            # FSDP + TP, tp 2 x dp 2: VERIFIED
    tvcert trace examples/torch/fsdp_mlp.py --set bug=local_mean --verify          # REFUTED (any mode)
    tvcert trace examples/torch/fsdp_mlp.py --set optimizer=adamw --verify         # + AdamW step on the shards
    tvcert trace examples/torch/fsdp_mlp.py --set fully_shard=true --verify        # UNKNOWN: see fsdp2_mlp.py

SimpleFSDP (``torchtitan.experiments.graph_trainer.simple_fsdp.data_parallel``) keeps each parameter as a
``Shard(0)`` DTensor over the data-parallel mesh; using it all-gathers it, and its gradient is reduce-scattered
as a sum over the data-parallel ranks (HSDP: all-reduced over the replicate axis too).  The loss each rank
computes is therefore normalised by the *global* batch, as torchtitan's trainer does.

* ``bug=local_mean``: each rank averages its loss over its local batch (``F.mse_loss`` default), so the summed
  gradients are dp times the single-device ones.
* ``bug=replica_same_batch`` (HSDP): the batch is split over the shard axis only, so both replica groups train on
  the same samples (a sampler given the rank within the shard group instead of the data-parallel rank).
* ``optimizer=sgd_momentum|adamw``: one step of that torch.optim optimizer on the sharded parameters after the
  backward; the plan's outputs are the loss and the updated parameter shards (``new.<p>``).
* ``fully_shard=true``: FSDP2's ``fully_shard`` inside this SimpleFSDP spec: UNKNOWN naming the parameters (this
  tracer does not run FSDP2's hooks; ``examples/torch/fsdp2_mlp.py`` traces ``fully_shard`` itself).
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


MESHES = {"fully_shard": {"dp": 2}, "hybrid_shard": {"rep": 2, "dp": 2},
          # FSDP shards dim 0 inside TP's shard of it (DTensor's _StridedShard): tp nests outside dp
          "fsdp_tp": {"tp": 2, "dp": 2}}


OPTIMIZERS = {  # run per tensor (foreach=False): one optimizer step on the sharded parameters
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01, foreach=False),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False),
}


def tvcert_trace(mode: str = "fully_shard", bug: str = "", fully_shard: bool = False, optimizer: str = ""):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torchtitan.experiments.graph_trainer.simple_fsdp import data_parallel

    from tvcert.frontends.dataparallel import optimizer_step, trace_simple_fsdp_plan

    if mode not in MESHES or bug not in ("", "local_mean", "replica_same_batch") or \
            (optimizer and optimizer not in OPTIMIZERS) or (bug == "replica_same_batch" and mode != "hybrid_shard"):
        raise ValueError(f"mode must be one of {sorted(MESHES)}, bug '', 'local_mean' or (hybrid_shard) "
                         f"'replica_same_batch', optimizer '' or one of {sorted(OPTIMIZERS)}")
    mesh = MESHES[mode]

    def make():
        torch.manual_seed(0)
        return MLP()

    def parallelize(model, dm):
        if fully_shard:
            from torch.distributed.fsdp import fully_shard as fsdp2

            return fsdp2(model, mesh=dm["dp"])
        if mode == "fsdp_tp":
            parallelize_module(model, dm["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
            return data_parallel(model, dm["dp"], mode="fully_shard")
        if mode == "hybrid_shard":
            return data_parallel(model, dm["rep", "dp"], mode="hybrid_shard")
        return data_parallel(model, dm["dp"], mode="fully_shard")

    def loss_fn(out, x, target):
        if bug == "local_mean":
            return F.mse_loss(out, target)  # BUG local_mean: normalised by the local batch
        return F.mse_loss(out, target, reduction="sum") / (B * H)  # normalised by the global batch

    dp_axes = [a for a in mesh if a != "tp" and not (bug == "replica_same_batch" and a == "rep")]  # BUG replica_same_batch
    spec = {"shape": [B, H], "placement": {a: "Shard(0)" for a in dp_axes}}
    step = optimizer_step(OPTIMIZERS[optimizer]) if optimizer else None
    return trace_simple_fsdp_plan(make, parallelize, loss_fn, data={"x": spec, "target": spec}, mesh=mesh,
                                  train_step=step, name=f"fsdp_mlp_{mode}{'_' + optimizer if optimizer else ''}"
                                                        f"{'_' + bug if bug else ''}")
