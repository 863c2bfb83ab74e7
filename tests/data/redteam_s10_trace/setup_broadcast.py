"""Red team s10 (H49): Python values a rank's setup exchanges through an object collective.  The fake process group
the ranks are traced on moves no data, so ``dist.broadcast_object_list(cfg, src=0)`` left each traced rank its own
``cfg``; on a real group every rank gets rank 0's.  ``bug="broadcast_start"``: a vocab-parallel embedding whose
per-rank vocab start is "synchronised" from rank 0 (every rank then looks up rank 0's rows: torch on gloo differs);
the trace kept each rank's own start and the plan VERIFIED.  ``bug=""``: each rank keeps its own start (VERIFIED)."""
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

V, H, B, S = 8, 4, 2, 3


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return funcol.all_reduce(x, "sum", group)

    @staticmethod
    def backward(ctx, g):
        return g, None


def logical(ids, w, target):
    return 0.5 * ((F.embedding(ids, w) - target) ** 2).sum()


def make_setup(bug: str):
    def setup(ctx):
        cfg = [{"start": ctx.coord("tp") * (V // ctx.size("tp"))}]
        if bug == "broadcast_start":
            dist.broadcast_object_list(cfg, src=0, group=ctx.group("tp"))  # BUG: rank 0's start on every rank
        if bug == "broadcast_tensor":
            t = torch.tensor([cfg[0]["start"]])
            dist.broadcast(t, src=0, group=ctx.group("tp"))  # BUG: rank 0's start on every rank
            cfg[0]["start"] = int(t)
        return cfg[0]
    return setup


def make_parallel(bug: str):
    def parallel(ctx, ids, w, target):
        start = ctx.state["start"]
        out = (ids < start) | (ids >= start + w.shape[0])
        e = torch.where(out.unsqueeze(-1), 0.0, F.embedding(torch.where(out, 0, ids - start), w))
        return 0.5 * ((ReduceFromTP.apply(e, ctx.group("tp")) - target) ** 2).sum()
    return parallel


INPUTS = {
    "ids": {"shape": [B, S], "dtype": "int", "range": V},
    "w": {"shape": [V, H], "placement": {"tp": "Shard(0)"}, "param": True},
    "target": {"shape": [B, S, H]},
}


def tvcert_trace(bug: str = ""):
    return dict(logical=logical, parallel=make_parallel(bug), parallel_setup=make_setup(bug), inputs=INPUTS,
                mesh={"tp": 2}, name=f"redteam_s10_setup_broadcast{'_' + bug if bug else ''}")
