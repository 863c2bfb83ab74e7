"""torchtitan Llama 3 debug under PP 2 x DP 2 (replicate) x TP 2 + SP (examples/torchtitan/llama3_debug_pp2_tp2_dp2.toml),
with data-parallel bugs, for `tvcert trace`:

    tvcert trace examples/torch/pp_titan_tp_dp.py --verify                          # VERIFIED
    tvcert trace examples/torch/pp_titan_tp_dp.py --set bug=local_tokens --verify   # REFUTED
    tvcert trace examples/torch/pp_titan_tp_dp.py --set bug=no_loss_scale --verify  # REFUTED
    tvcert trace examples/torch/pp_titan_tp_dp.py --set bug=fsdp_divide --verify    # REFUTED

The job is traced as ``tvcert trace --torchtitan llama3-debug --config`` traces it (``frontends/pipelining.
trace_titan_pp_job``: torchtitan's ``pipeline_llm`` on the pp x dp_replicate x tp ``ParallelDims``, each replica's
schedule splitting its shard of the batch into micro-batches, the loss normalised by the step's global token count,
FSDP's gradient reduction over the replicas a sum after the step); the bugs replace a piece of it here:

* ``local_tokens``: the trainer's token count not summed over the batch mesh (``dist_sum_tensor`` skipped): each
  replica normalises by its own tokens, so the summed gradients are dp times the model's.
* ``no_loss_scale``: torchtitan's ``CrossEntropyLoss`` normalising each micro-batch by its own tokens
  (``examples/torch/pp_titan_tp.py``'s patch): loss and gradients n_microbatches x dp times the model's.
* ``fsdp_divide``: FSDP's default gradient division left on (torchtitan's ``disable_fsdp_gradient_division`` not
  applied): the replicas' gradients averaged although the loss is already over the global count -- averaged twice.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

JOB = Path(__file__).resolve().parents[1] / "torchtitan" / "llama3_debug_pp2_tp2_dp2.toml"
BUGS = ("", "local_tokens", "no_loss_scale", "fsdp_divide")


def _local_tokens_step(tokens_per_replica: int):
    """Trainer.pp_forward_backward_step with ``global_valid_tokens`` the replica's own count."""
    import torch

    def step(sch, ctx, tokens, labels):
        stages = getattr(sch, "_stages", None) or [sch._stage]
        first, last = any(x.is_first for x in stages), any(x.is_last for x in stages)
        losses = [] if last else None
        local_valid_tokens = tokens_per_replica  # BUG local_tokens: not dist_sum_tensor'd over the batch mesh
        sch.step(*(tokens,) if first else (), target=labels if last else None, losses=losses,
                 loss_kwargs={"global_valid_tokens": local_valid_tokens}, return_outputs=False)
        return torch.sum(torch.stack(losses)) if last else None
    return step


def _fsdp_divide(group, grads):
    """FSDP2's reduction over the replicas with its default divide factor (the replica count): an average."""
    import torch.distributed._functional_collectives as funcol

    return {n: funcol.all_reduce(g, "avg", group) for n, g in grads.items()}  # BUG fsdp_divide: division left on


def tvcert_trace(bug: str = "", layers: int = 2):
    from tvcert.frontends.pipelining import trace_titan_pp_job
    from tvcert.frontends.titan_config import load_job
    from tvcert.frontends.torchtitan import MODELS

    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r} (one of {BUGS})")
    job = load_job(str(JOB), "llama3-debug")
    model = MODELS[job.model](layers=layers)
    name = f"pp_titan_tp_dp{'_' + bug if bug else ''}"
    step = _local_tokens_step(job.training.local_batch_size * job.training.seq_len) if bug == "local_tokens" else None
    patch = contextlib.nullcontext()
    if bug == "no_loss_scale":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from pp_titan_tp import _per_microbatch_mean

        patch = _per_microbatch_mean()
    with patch:
        return trace_titan_pp_job(job, model, f"torchtitan {model.name} from {JOB.name}" + (f", bug {bug}" if bug else ""),
                                  name=name, step=step, dp_reduce=_fsdp_divide if bug == "fsdp_divide" else None)
