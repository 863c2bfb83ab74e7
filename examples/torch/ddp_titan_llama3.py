"""torchtitan's Llama 3 debug model trained with torch.nn.parallel.DistributedDataParallel, for `tvcert trace`.

    tvcert trace examples/torch/ddp_titan_llama3.py --verify                          # dp 2, 1 layer: VERIFIED
    tvcert trace examples/torch/ddp_titan_llama3.py --set bug=loss_div_world --verify # REFUTED: averaged twice
    tvcert trace examples/torch/ddp_titan_llama3.py --set bug=off_by_one --verify     # REFUTED: count + 1

It traces with DDP's all-reduce of every gradient, divided by the world size.  Each rank's mean carries its
1/local-count through the whole backward; where two paths meet (the residual adds, RoPE's real / imaginary
products, the concat of the rotated halves, the RMSNorm's mean over the hidden dim) their scalar factors differ,
and the engine moves the first factor out keeping the exact ratios inside (rule ``scale_common_factor``,
Rules/Normalise2.v), so the averaged gradients are proved equal to the single-device ones (1/global-count).
The same model under SimpleFSDP (``fsdp_titan_llama3.py``, summed gradients, loss over the global count) VERIFIES.

The model is torchtitan 0.3.0's ``llama3`` debug flavour (fused QKV, complex RoPE, SwiGLU, untied lm_head) at
small dimensions, built by :mod:`tvcert.frontends.torchtitan` (torchtitan's config and builders; its SDPA
attention with the causal mask written as a finite additive mask) and materialised on the CPU; each rank wraps it
in DDP and trains on its block of the batch with a mean cross-entropy.  ``bug=loss_div_world`` divides that loss
by the world size by hand, on top of DDP's averaging; ``bug=off_by_one`` divides by the local count plus one.
"""
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

B, S = 4, 8


def tvcert_trace(bug: str = "", dp: int = 2, layers: int = 1):
    from tvcert.frontends.dataparallel import trace_ddp_plan
    from tvcert.frontends.torchtitan import _build, llama3_debug, prepare

    if bug not in ("", "loss_div_world", "off_by_one"):
        raise ValueError(f"unknown bug {bug!r}")
    prepare()
    model = llama3_debug(layers=layers)

    def make():
        return _build(model.config(1, False, True)).to_empty(device="cpu")

    def wrap(m, ctx):
        return DDP(m, process_group=ctx.group("dp"))

    def loss_fn(pred, tokens, labels):  # mean over the tokens, as torchtitan spells it: a sum over the count
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum") / labels.numel()

    def rank_loss_fn(pred, tokens, labels):
        loss = loss_fn(pred, tokens, labels)
        if bug == "off_by_one":  # BUG off_by_one: the local token count plus one
            loss = loss * labels.numel() / (labels.numel() + 1)
        if bug == "loss_div_world":
            loss = loss / dp  # BUG loss_div_world: DDP averages the gradients already
        return loss

    ids = {"shape": [B, S], "dtype": "int", "range": model.vocab, "placement": {"dp": "Shard(0)"}}
    return trace_ddp_plan(make, wrap, loss_fn, data={"tokens": ids, "labels": ids}, mesh={"dp": dp},
                          rank_loss_fn=rank_loss_fn, name=f"ddp_titan_llama3{'_' + bug if bug else ''}")
