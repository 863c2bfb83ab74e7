"""Red team s10 (H49): an int input without a declared ``range`` whose range the tracer infers from the logical model's
uses. The logical model maps out-of-vocabulary ids (>= V) to the UNK row 0 (``where(ids < V, ids, 0)``) and so is
defined for every id >= 0; the vocab-parallel rank program forgets that mapping (an OOV id is outside every rank's
shard, so its embedding is the zero vector, not row 0). torch: the two differ on any OOV id (gloo_run.py). The range
is inferred as [0, V) through the ``where`` arm (the embedding's table rows), which excludes exactly the ids where
the programs differ; the plan is not VERIFIED only because no rule decides ``ids < V`` over that range (UNKNOWN; the
interpreter draws ids in [0, V) and finds no difference). A doubt, not a fix: the inference reads a bound through a
``where`` whose condition may redirect the out-of-range values. ``bug=""``: the rank program maps OOV ids to row 0
too (VERIFIED); ``bug="forgot_unk"``: the wrong one (not VERIFIED)."""
import torch
import torch.nn.functional as F
import torch.distributed._functional_collectives as funcol

V, H, B, S = 8, 4, 2, 3
GLOO_INT_HIGH = 2 * V  # (gloo_run.py draws ids in [0, 2V): out-of-vocabulary ids too)


class ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: all_reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return funcol.all_reduce(x, "sum", group)

    @staticmethod
    def backward(ctx, g):
        return g, None


def logical(ids, w, target):
    e = F.embedding(torch.where(ids < V, ids, 0), w)
    return 0.5 * ((e - target) ** 2).sum()


def make_parallel(bug: str):
    def parallel(ctx, ids, w, target):
        tp, r = ctx.group("tp"), ctx.coord("tp")
        n = w.shape[0]
        if bug != "forgot_unk":
            ids = torch.where(ids < V, ids, 0)
        start, end = r * n, (r + 1) * n
        out = (ids < start) | (ids >= end)
        local = torch.where(out, 0, ids - start)
        e = torch.where(out.unsqueeze(-1), 0.0, F.embedding(local, w))
        e = ReduceFromTP.apply(e, tp)
        return 0.5 * ((e - target) ** 2).sum()
    return parallel


INPUTS = {
    "ids": {"shape": [B, S], "dtype": "int"},  # no range: inferred from the logical model's uses
    "w": {"shape": [V, H], "placement": {"tp": "Shard(0)"}, "param": True},
    "target": {"shape": [B, S, H]},
}


def tvcert_trace(bug: str = ""):
    return dict(logical=logical, parallel=make_parallel(bug), inputs=INPUTS, mesh={"tp": 2},
                name=f"redteam_s10_oov_embedding{'_' + bug if bug else ''}")
