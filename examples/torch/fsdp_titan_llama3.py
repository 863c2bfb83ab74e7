"""torchtitan's Llama 3 debug model under SimpleFSDP (torchtitan's own FSDP in DTensor form), for `tvcert trace`.

    tvcert trace examples/torch/fsdp_titan_llama3.py --verify                        # FSDP, dp 2, 1 layer
    tvcert trace examples/torch/fsdp_titan_llama3.py --set mode=hybrid_shard --verify
    tvcert trace examples/torch/fsdp_titan_llama3.py --set bug=local_mean --verify   # REFUTED

The model is torchtitan 0.3.0's ``llama3`` debug flavour at small dimensions, built by
:mod:`tvcert.frontends.torchtitan` and materialised on the CPU, then parallelized by torchtitan's
``graph_trainer.simple_fsdp.data_parallel``.  The loss is torchtitan's ``cross_entropy_loss`` (a sum) over the
global token count, so the reduce-scattered (summed) gradients are the single-device ones.
``bug=local_mean``: each rank divides by its own token count (a mean over its local batch).
"""
import torch

B, S = 4, 8


def tvcert_trace(mode: str = "fully_shard", bug: str = "", layers: int = 1):
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.experiments.graph_trainer.simple_fsdp import data_parallel

    from tvcert.frontends.dataparallel import trace_simple_fsdp_plan
    from tvcert.frontends.torchtitan import _build, llama3_debug, prepare

    meshes = {"fully_shard": {"dp": 2}, "hybrid_shard": {"rep": 2, "dp": 2}}
    if mode not in meshes or bug not in ("", "local_mean"):
        raise ValueError(f"mode must be one of {sorted(meshes)} and bug '' or 'local_mean'")
    prepare()
    model = llama3_debug(layers=layers)
    mesh = meshes[mode]
    dp = 1
    for s in mesh.values():
        dp *= s

    def make():
        return _build(model.config(1, False, True)).to_empty(device="cpu")

    def parallelize(m, dm):
        return data_parallel(m, dm[tuple(mesh)] if len(mesh) > 1 else dm["dp"], mode=mode)

    def loss_fn(pred, tokens, labels):
        total = cross_entropy_loss(pred, labels, global_vocab_size=model.vocab)
        count = labels.numel() if bug == "local_mean" else B * S  # BUG local_mean: the rank's own token count
        return total / count

    ids = {"shape": [B, S], "dtype": "int", "range": model.vocab, "placement": {a: "Shard(0)" for a in mesh}}
    return trace_simple_fsdp_plan(make, parallelize, loss_fn, data={"tokens": ids, "labels": ids}, mesh=mesh,
                                  name=f"fsdp_titan_llama3_{mode}{'_' + bug if bug else ''}")
