"""DP + PP on a (pp x dp) mesh with hand-built pipeline groups, for `tvcert trace`: a stage sending to the wrong peer.

    tvcert trace examples/torch/pp_dp_mlp.py --verify                       # VERIFIED (one micro-batch per replica)
    tvcert trace examples/torch/pp_dp_mlp.py --set microbatches=2 --verify  # VERIFIED (1F1B over 2 micro-batches)
    tvcert trace examples/torch/pp_dp_mlp.py --set bug=wrong_peer --verify  # REFUTED: activations cross dp replicas
    tvcert trace examples/torch/pp_dp_mlp.py --set microbatches=2 --set bug=no_scale --verify    # REFUTED
    tvcert trace examples/torch/pp_dp_mlp.py --set microbatches=2 --set bug=double_avg --verify  # REFUTED
    tvcert trace examples/torch/pp_dp_mlp.py --set microbatches=2 --set bug=no_dp_reduce --verify  # REFUTED

Each data-parallel replica d runs its own 2-stage pipeline (1F1B) on its shard of the batch; the code builds
the pipeline process groups itself (``dist.new_group``, one per replica, as code without a DeviceMesh does)
and averages the gradients over the replicas after the step (``p.grad / dp``, then ``dist.all_reduce``).
``wrong_peer``: the groups pair stage 0 of replica d with stage 1 of replica dp-1-d (rank list
``[d, world-1-d]`` instead of ``[d, dp+d]``), so each replica's activations are trained against the other
replica's targets (blamed at the ``dist.new_group`` line building the group).  ``--set microbatches=2``: each
replica's schedule splits its shard into micro-batches, so rank d's micro-batch m is logical block (d, m) of the batch
(the engine's ``slice_shard_microbatch``); the logical model is the unsplit model's gradient accumulation over those
micro-batches (every replica's m-th assembled, tested against the full batch).  ``no_scale``: the schedule built with
``scale_grads=False`` (the micro-batch gradients summed, not averaged) and the step reporting the micro-batch losses'
sum; ``double_avg``: the gradient divided by dp and then all-reduced with AVG; ``no_dp_reduce``: no all-reduce over
the replicas (each holds its own shard's gradient).
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

B, H, L = 8, 4, 2


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


def tvcert_trace(bug: str = "", dp: int = 2, microbatches: int = 1):
    from tvcert.frontends.pipelining import trace_pipeline_plan

    if bug not in ("", "wrong_peer", "no_scale", "double_avg", "no_dp_reduce"):
        raise ValueError(f"unknown bug {bug!r}")
    pp = 2
    mb = B // dp // microbatches

    def make():
        torch.manual_seed(0)
        return MLP()

    def stage(model, ctx):
        s, d = ctx.coord("pp"), ctx.coord("dp")
        world = pp * dp
        mine = None
        for r in range(dp):  # every rank creates every group, in the same order
            ranks = [r, world - 1 - r] if bug == "wrong_peer" else [r, dp + r]  # BUG wrong_peer: mirrored replica
            g = dist.new_group(ranks)
            if dist.get_rank() in ranks:
                mine = g
        mod = nn.Sequential(*list(model.layers)[s * (L // pp):(s + 1) * (L // pp)])
        x_in = torch.empty(mb, H, device="meta", requires_grad=s > 0)
        out = torch.empty(mb, H, device="meta", requires_grad=True)
        return PipelineStage(mod, s, pp, torch.device("cpu"), input_args=x_in, output_args=out, group=mine)

    def loss_fn(out, target):
        return F.mse_loss(out, target)

    def sched(st, ctx):
        cls = ScheduleGPipe if microbatches < pp else Schedule1F1B  # 1F1B needs at least pp micro-batches
        return cls(st, n_microbatches=microbatches, loss_fn=loss_fn,
                   scale_grads=bug != "no_scale")  # BUG no_scale: the micro-batch gradients summed

    def step(sch, ctx, x, target):
        s = ctx.coord("pp")
        last = s == pp - 1
        losses = []
        sch.step(*(x,) if s == 0 else (), target=target if last else None, losses=losses if last else None)
        for p in sch._stage.submod.parameters():  # the data-parallel gradient average
            p.grad.div_(dp)
            if bug == "no_dp_reduce":  # BUG no_dp_reduce: the replicas' gradients never summed
                continue
            op = dist.ReduceOp.AVG if bug == "double_avg" else dist.ReduceOp.SUM  # BUG double_avg: AVG after / dp
            dist.all_reduce(p.grad, op=op, group=ctx.group("dp"))
        if last and bug == "no_scale":
            return torch.stack(losses).sum()  # BUG no_scale: the sum of the micro-batch means
        return torch.stack(losses).mean() if last else None

    spec = {"shape": [B, H], "placement": {"dp": "Shard(0)"}}
    return trace_pipeline_plan(make, stage, sched, loss_fn, data={"x": spec, "target": spec},
                               mesh={"pp": pp, "dp": dp}, step=step,
                               output_placements={"loss": {"dp": "Partial(avg)"}},
                               name=f"pp_dp_mlp{'_' + bug if bug else ''}")
