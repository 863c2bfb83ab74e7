"""torchtitan's Llama 3 debug model under FSDP2 ``fully_shard``, applied by torchtitan's own
``apply_fsdp_to_decoder``, for `tvcert trace`.

    tvcert trace examples/torch/fsdp2_titan_llama3.py --verify                        # FSDP2, dp 2, 1 layer
    tvcert trace examples/torch/fsdp2_titan_llama3.py --set mode=hybrid_shard --verify  # HSDP, rep 2 x dp 2
    tvcert trace examples/torch/fsdp2_titan_llama3.py --set bug=local_mean --verify   # REFUTED
    tvcert trace examples/torch/fsdp2_titan_llama3.py --set mode=fsdp_tp --verify     # FSDP2 x TP 2 (+ SP)
    tvcert trace examples/torch/fsdp2_titan_llama3.py --set mode=fsdp_tp --set optimizer=adamw --verify
    tvcert trace examples/torch/fsdp2_titan_llama3.py --set mode=fsdp_tp --set bug=local_mean --verify  # REFUTED

The model is torchtitan 0.3.0's ``llama3`` debug flavour at small dimensions, built by
:mod:`tvcert.frontends.torchtitan` and materialised on the CPU; torchtitan's ``apply_fsdp_to_decoder`` wraps the
embedding, each block and the norm + head with ``fully_shard`` (float32 parameters and reductions), and its
model sets FSDP2's gradient divide factor to 1: the reduce-scatter sums (``ReduceOp.PREMUL_SUM(1.0)``), and the
loss is torchtitan's ``cross_entropy_loss`` (a sum) over the *global* token count, as its trainer normalises it.
``bug=local_mean``: each rank divides by its own token count (a mean over its local batch).

``mode=fsdp_tp`` is torchtitan's own ``parallelize_llama`` for data_parallel_shard_degree 2 x
tensor_parallel_degree 2 (+ sequence parallel) on its DTensor backend (``spmd_backend = "partial_dtensor"``),
traced by :mod:`tvcert.frontends.titan_fsdp2`: ``Module.parallelize`` (TP), then ``apply_fsdp_to_decoder`` on
the ``fsdp`` mesh, so FSDP2 all-gathers and reduce-scatters the tp-local shards of TP's DTensor parameters over
fsdp (the same as ``--config examples/torchtitan/llama3_debug_fsdp2_tp2_dtensor.toml``, plus the bug and the
optimizer step).
"""
import torch

B, S = 4, 8
OPTIMIZERS = {"adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False)}


def tvcert_trace(mode: str = "fully_shard", bug: str = "", layers: int = 1, optimizer: str = ""):
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    from tvcert.frontends.fsdp2 import trace_fully_shard_plan
    from tvcert.frontends.titan_fsdp2 import plan_mesh, trace_titan_fsdp2
    from tvcert.frontends.torchtitan import _build, llama3_debug, prepare

    meshes = {"fully_shard": {"dp": 2}, "hybrid_shard": {"rep": 2, "dp": 2}, "fsdp_tp": plan_mesh(1, 2, 2)}
    if mode not in meshes or bug not in ("", "local_mean") or (optimizer and optimizer not in OPTIMIZERS):
        raise ValueError(f"mode must be one of {sorted(meshes)}, bug '' or 'local_mean', optimizer '' or "
                         f"{sorted(OPTIMIZERS)}")
    prepare()
    model = llama3_debug(layers=layers)
    mesh = meshes[mode]

    def loss_fn(pred, tokens, labels):
        total = cross_entropy_loss(pred, labels, global_vocab_size=model.vocab)
        count = labels.numel() if bug == "local_mean" else B * S  # BUG local_mean: the rank's own token count
        return total / count

    name = f"fsdp2_titan_llama3_{mode}{'_' + optimizer if optimizer else ''}{'_' + bug if bug else ''}"
    opt = OPTIMIZERS[optimizer] if optimizer else None
    if mode == "fsdp_tp":
        par = ParallelismConfig(tensor_parallel_degree=2, data_parallel_shard_degree=2, enable_sequence_parallel=True,
                                spmd_backend="partial_dtensor")
        return trace_titan_fsdp2(model, mesh, par, TrainingConfig(mixed_precision_param="float32"), loss_fn=loss_fn,
                                 batch=B, seq=S, optimizer=opt, name=name)

    def make():
        return _build(model.config(1, False, True)).to_empty(device="cpu")

    def shard(m, ctx):
        dm = ctx.device_mesh
        apply_fsdp_to_decoder(m, dm[tuple(mesh)] if len(mesh) > 1 else dm["dp"], param_dtype=torch.float32,
                              reduce_dtype=torch.float32, pp_enabled=False)
        return m

    ids = {"shape": [B, S], "dtype": "int", "range": model.vocab, "placement": {a: "Shard(0)" for a in mesh}}
    return trace_fully_shard_plan(make, shard, loss_fn, data={"tokens": ids, "labels": ids}, mesh=mesh,
                                  optimizer=opt, name=name)
