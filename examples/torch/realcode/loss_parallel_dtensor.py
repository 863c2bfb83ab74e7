"""DTensor's ``loss_parallel()`` used as PyTorch documents it: the vocabulary-sharded logits (``ColwiseParallel``
with ``output_layouts=Shard(-1)``, ``use_local_output=False``) go into ``F.cross_entropy`` and the backward runs
inside the context too (``tvcert.frontends.dtensor.trace_module_plan(loss_context=loss_parallel)``), for
`tvcert trace`.

The model: embedding -> tanh -> vocabulary projection; the mean next-token cross-entropy over ``labels``.
``bug="loss_div_tp"``: the parallel loss divided by the tp degree (a DDP habit carried over to TP; the ranks
hold the whole loss already) -- REFUTED.  ``reduction="sum"``: VERIFIED (the vocab-parallel loss patterns in
DTensor's spelling).  The default mean: VERIFIED -- DTensor divides by the count of labels that are not
``ignore_index`` (-100), and the labels lie in their declared range [0, V), so that count is the token count
(``int_range_count``).

    tvcert trace examples/torch/realcode/loss_parallel_dtensor.py --verify
    tvcert trace examples/torch/realcode/loss_parallel_dtensor.py --set reduction=sum --verify
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

V, H, B, S = 8, 4, 2, 3


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.out = nn.Linear(H, V, bias=False)

    def forward(self, ids):
        return self.out(torch.tanh(self.emb(ids)))


def tvcert_trace(bug: str = "", tp: int = 2, reduction: str = "mean"):
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module

    from tvcert.frontends.dtensor import trace_module_plan

    def make():
        torch.manual_seed(0)
        return Head()

    def parallelize(m, mesh):
        return parallelize_module(m, mesh, {"out": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})

    def loss_fn(logits, ids, labels):
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction=reduction)
        if bug == "loss_div_tp" and isinstance(logits, DTensor):
            loss = loss / tp  # BUG: every rank already holds the whole (replicated) loss
        return loss

    tok = {"shape": [B, S], "dtype": "int", "range": V}
    return trace_module_plan(make, parallelize, loss_fn, loss_context=loss_parallel,
                             data={"ids": tok, "labels": dict(tok)}, mesh={"tp": tp},
                             name=f"loss_parallel_dtensor_{reduction}{'_' + bug if bug else ''}")
