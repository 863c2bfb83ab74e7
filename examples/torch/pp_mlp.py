"""An MLP split into pipeline stages with torch.distributed.pipelining, for `tvcert trace`.

    tvcert trace examples/torch/pp_mlp.py --verify                          # VERIFIED (1F1B, 4 micro-batches)
    tvcert trace examples/torch/pp_mlp.py --set schedule=gpipe --verify     # VERIFIED (GPipe)
    tvcert trace examples/torch/pp_mlp.py --set bug=no_scale --verify       # REFUTED: micro-batch losses summed
    tvcert trace examples/torch/pp_mlp.py --set bug=wrong_layers --verify   # REFUTED: stages hold swapped layers
    tvcert trace examples/torch/pp_mlp.py --set bug=no_accumulate --verify  # REFUTED: gradients not accumulated

Each pipeline rank builds the whole model, keeps its stage's layers (``nn.Sequential`` of them, as the
PyTorch pipelining tutorial does by hand) and wraps them in a ``PipelineStage`` with static shapes; the
schedule (``Schedule1F1B`` or ``ScheduleGPipe``) splits the batch into micro-batches, sends activations
forward and gradients back, accumulates the gradients and divides them by the number of micro-batches
(``scale_grads``).  The logical model is the unsplit MLP on the whole batch.  Bugs, each a line here:

* ``no_scale``: ``scale_grads=False`` with a mean loss, and the step reports the sum of the micro-batch
  losses: the sum of micro-batch means instead of their mean (gradients n times too large).
* ``wrong_layers``: stage s keeps the layers of stage pp-1-s.
* ``no_accumulate``: ``zero_grad()`` in a forward pre-hook of the stage's module (zeroing per micro-batch
  instead of per step): the gradients of the micro-batches before the last forward are dropped.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

B, H, L = 8, 4, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[Block() for _ in range(L)])

    def forward(self, x):
        return self.layers(x)


def tvcert_trace(schedule: str = "1f1b", pp: int = 2, microbatches: int = 4, bug: str = ""):
    from tvcert.frontends.pipelining import trace_pipeline_plan

    if bug not in ("", "no_scale", "wrong_layers", "no_accumulate"):
        raise ValueError(f"unknown bug {bug!r}")
    if schedule not in ("1f1b", "gpipe"):
        raise ValueError(f"unknown schedule {schedule!r}")
    mb = B // microbatches

    def make():
        torch.manual_seed(0)
        return MLP()

    def stage(model, ctx):
        s = ctx.coord("pp")
        k = L // pp
        held = pp - 1 - s if bug == "wrong_layers" else s  # BUG wrong_layers: the mirrored stage's layers
        mod = nn.Sequential(*list(model.layers)[held * k:(held + 1) * k])
        x_in = torch.empty(mb, H, device="meta", requires_grad=s > 0)  # static shapes (a received activation
        out = torch.empty(mb, H, device="meta", requires_grad=True)     # needs its gradient sent back)
        return PipelineStage(mod, s, pp, torch.device("cpu"), input_args=x_in, output_args=out, group=ctx.group("pp"))

    def loss_fn(out, target):
        return F.mse_loss(out, target)

    def sched(st, ctx):
        cls = Schedule1F1B if schedule == "1f1b" else ScheduleGPipe
        return cls(st, n_microbatches=microbatches, loss_fn=loss_fn,
                   scale_grads=bug != "no_scale")  # BUG no_scale: mean micro-batch losses, gradients summed

    def step(sch, ctx, x, target):
        s = ctx.coord("pp")
        last = s == pp - 1
        if bug == "no_accumulate":  # BUG no_accumulate: gradients zeroed at every micro-batch's forward
            sch._stage.submod.register_forward_pre_hook(lambda mod, args: mod.zero_grad())
        losses = []
        sch.step(*(x,) if s == 0 else (), target=target if last else None, losses=losses if last else None)
        if not last:
            return None
        if bug == "no_scale":
            return torch.stack(losses).sum()  # BUG no_scale: the sum of the micro-batch means
        return torch.stack(losses).mean()

    spec = {"shape": [B, H]}
    return trace_pipeline_plan(make, stage, sched, loss_fn, data={"x": spec, "target": spec}, mesh={"pp": pp},
                               step=step, name=f"pp_mlp_{schedule}{'_' + bug if bug else ''}")
