"""DTensor's ``loss_parallel()`` over labels padded with -100, for `tvcert trace`.

The model and plan of ``loss_parallel_dtensor.py`` (embedding -> tanh -> ColwiseParallel vocabulary projection,
``F.cross_entropy`` and its backward inside ``loss_parallel()``), but the labels' range is not declared, as a
user's collator pads them with cross-entropy's ignore index: tvcert infers [-100, V) and draws padded witnesses.
DTensor masks the ignored rows (``where(l != -100, -pick, 0)``, the gradient filtered the same way) and, with the
default mean, divides by ``sum(labels != -100)`` -- not a constant now; the vocab-parallel loss patterns conclude
the masked form the logical graph has (kernel/patterns.py), and ``1 / count`` reaches the gradients as a 0-d factor
(``scalar_factor_commutes``).  Bugs: ``loss_div_tp`` (the replicated loss divided by tp), ``ignore_minus_one``
(the parallel side ignores -1 while the data is padded with -100, so padded rows are counted and picked).

    tvcert trace examples/torch/realcode/loss_parallel_padded.py --verify
    tvcert trace examples/torch/realcode/loss_parallel_padded.py --set bug=ignore_minus_one --verify
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loss_parallel_dtensor import B, S, Head  # noqa: E402  (the same model)


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
        parallel = isinstance(logits, DTensor)
        ignore = -1 if bug == "ignore_minus_one" and parallel else -100
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction=reduction, ignore_index=ignore)
        if bug == "loss_div_tp" and parallel:
            loss = loss / tp  # BUG: every rank already holds the whole (replicated) loss
        return loss

    from loss_parallel_dtensor import V

    return trace_module_plan(make, parallelize, loss_fn, loss_context=loss_parallel,
                             data={"ids": {"shape": [B, S], "dtype": "int", "range": V},
                                   "labels": {"shape": [B, S], "dtype": "int"}}, mesh={"tp": tp},
                             name=f"loss_parallel_padded_{reduction}{'_' + bug if bug else ''}")
