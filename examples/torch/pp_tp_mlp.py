"""TP + PP on a 2-D (pp x tp) mesh: a stack of Megatron MLP blocks split into pipeline stages with
torch.distributed.pipelining, each stage tensor-parallel with DTensor's parallelize_module, for `tvcert trace`.

    tvcert trace examples/torch/pp_tp_mlp.py --verify                        # VERIFIED (1F1B, pp 2 x tp 2)
    tvcert trace examples/torch/pp_tp_mlp.py --set schedule=gpipe --verify   # VERIFIED (GPipe)
    tvcert trace examples/torch/pp_tp_mlp.py --set bug=no_scale --verify     # REFUTED: micro-batch losses summed
    tvcert trace examples/torch/pp_tp_mlp.py --set bug=rowwise_up --verify   # REFUTED: up-projection sharded rowwise

Each rank builds the whole model, keeps its stage's blocks (``nn.Sequential`` of the model's own blocks) and
parallelizes them over the ``tp`` sub-mesh as torchtitan does (``ColwiseParallel`` up-projection,
``RowwiseParallel`` down-projection: the activations between blocks, and between stages, are replicated
over tp), then wraps them in a ``PipelineStage`` on the ``pp`` sub-mesh's group.  The schedule splits the
batch into micro-batches, sends activations forward and gradients back between the stages' ranks with the
same tp coordinate, accumulates and scales the gradients.  The logical model is the unsplit, unsharded model.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

B, H, FF, L = 8, 4, 8, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(H, FF)
        self.down = nn.Linear(FF, H)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[Block() for _ in range(L)])

    def forward(self, x):
        return self.layers(x)


def tvcert_trace(schedule: str = "1f1b", pp: int = 2, tp: int = 2, microbatches: int = 2, bug: str = ""):
    from tvcert.frontends.pipelining import trace_pipeline_plan

    if bug not in ("", "no_scale", "rowwise_up"):
        raise ValueError(f"unknown bug {bug!r}")
    if schedule not in ("1f1b", "gpipe"):
        raise ValueError(f"unknown schedule {schedule!r}")
    mb = B // microbatches

    def make():
        torch.manual_seed(0)
        return Model()

    def stage(model, ctx):
        s, k = ctx.coord("pp"), L // pp
        mod = nn.Sequential(*list(model.layers)[s * k:(s + 1) * k])
        up = RowwiseParallel() if bug == "rowwise_up" else ColwiseParallel()  # BUG rowwise_up
        for blk in mod:
            parallelize_module(blk, ctx.device_mesh["tp"], {"up": up, "down": RowwiseParallel()})
        x_in = torch.empty(mb, H, device="meta", requires_grad=s > 0)
        out = torch.empty(mb, H, device="meta", requires_grad=True)
        return PipelineStage(mod, s, pp, torch.device("cpu"), input_args=x_in, output_args=out,
                             group=ctx.device_mesh.get_group("pp"))

    def loss_fn(out, target):
        return F.mse_loss(out, target)

    def sched(st, ctx):
        cls = Schedule1F1B if schedule == "1f1b" else ScheduleGPipe
        return cls(st, n_microbatches=microbatches, loss_fn=loss_fn, scale_grads=bug != "no_scale")

    def step(sch, ctx, x, target):
        s = ctx.coord("pp")
        last = s == pp - 1
        losses = []
        sch.step(*(x,) if s == 0 else (), target=target if last else None, losses=losses if last else None)
        if not last:
            return None
        return torch.stack(losses).sum() if bug == "no_scale" else torch.stack(losses).mean()  # BUG no_scale: sum

    spec = {"shape": [B, H]}
    return trace_pipeline_plan(make, stage, sched, loss_fn, data={"x": spec, "target": spec},
                               mesh={"pp": pp, "tp": tp}, step=step,
                               name=f"pp_tp_mlp_{schedule}{'_' + bug if bug else ''}")
