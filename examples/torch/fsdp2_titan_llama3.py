"""torchtitan's Llama 3 debug model under FSDP2 ``fully_shard``, applied by torchtitan's own
``apply_fsdp_to_decoder``, for `tvcert trace`.

    tvcert trace examples/torch/fsdp2_titan_llama3.py --verify                        # FSDP2, dp 2, 1 layer
    tvcert trace examples/torch/fsdp2_titan_llama3.py --set mode=hybrid_shard --verify  # HSDP, rep 2 x dp 2
    tvcert trace examples/torch/fsdp2_titan_llama3.py --set bug=local_mean --verify   # REFUTED

The model is torchtitan 0.3.0's ``llama3`` debug flavour at small dimensions, built by
:mod:`tvcert.frontends.torchtitan` and materialised on the CPU; torchtitan's ``apply_fsdp_to_decoder`` wraps the
embedding, each block and the norm + head with ``fully_shard`` (float32 parameters and reductions), and its
model sets FSDP2's gradient divide factor to 1: the reduce-scatter sums (``ReduceOp.PREMUL_SUM(1.0)``), and the
loss is torchtitan's ``cross_entropy_loss`` (a sum) over the *global* token count, as its trainer normalises it.
``bug=local_mean``: each rank divides by its own token count (a mean over its local batch).
"""
import torch

B, S = 4, 8


def tvcert_trace(mode: str = "fully_shard", bug: str = "", layers: int = 1):
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    from tvcert.frontends.fsdp2 import trace_fully_shard_plan
    from tvcert.frontends.torchtitan import _build, llama3_debug, prepare

    meshes = {"fully_shard": {"dp": 2}, "hybrid_shard": {"rep": 2, "dp": 2}}
    if mode not in meshes or bug not in ("", "local_mean"):
        raise ValueError(f"mode must be one of {sorted(meshes)} and bug '' or 'local_mean'")
    prepare()
    model = llama3_debug(layers=layers)
    mesh = meshes[mode]

    def make():
        return _build(model.config(1, False, True)).to_empty(device="cpu")

    def shard(m, ctx):
        dm = ctx.device_mesh
        apply_fsdp_to_decoder(m, dm[tuple(mesh)] if len(mesh) > 1 else dm["dp"], param_dtype=torch.float32,
                              reduce_dtype=torch.float32, pp_enabled=False)
        return m

    def loss_fn(pred, tokens, labels):
        total = cross_entropy_loss(pred, labels, global_vocab_size=model.vocab)
        count = labels.numel() if bug == "local_mean" else B * S  # BUG local_mean: the rank's own token count
        return total / count

    ids = {"shape": [B, S], "dtype": "int", "range": model.vocab, "placement": {a: "Shard(0)" for a in mesh}}
    return trace_fully_shard_plan(make, shard, loss_fn, data={"tokens": ids, "labels": ids}, mesh=mesh,
                                  name=f"fsdp2_titan_llama3_{mode}{'_' + bug if bug else ''}")
