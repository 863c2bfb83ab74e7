"""torchtitan's own ``parallelize_llama`` on its DTensor backend -- TP, then FSDP2 ``fully_shard`` -- traced by
:func:`.fsdp2.trace_fully_shard_plan` (issue 16).

A job config with ``[parallelism] spmd_backend = "partial_dtensor"`` and data_parallel_shard_degree > 1 is what
torchtitan 0.3.0 runs as: on every rank the job's ``ParallelDims`` (its ``dp_replicate`` / ``fsdp`` / ``tp``
meshes on the fake process group), ``parallelize_llama`` (``Module.parallelize`` for TP + SP when tp > 1, then
``apply_fsdp_to_decoder`` on the ``fsdp`` (HSDP: ``dp_replicate x fsdp``) mesh with the job's mixed precision).
FSDP2 shards each TP DTensor's tp-local tensor over the data-parallel mesh (``_StridedShard`` of a TP-sharded
dim), so the plan lists tp outside the data-parallel axes and the world mesh numbers the ranks to match
(:func:`.torchtitan._plan_order_world`).  The loss is torchtitan's ``cross_entropy_loss`` (a sum) over the
global token count; torchtitan's gradient divide factor 1 makes FSDP2 sum, read back ``Partial(sum)``.
"""
from __future__ import annotations

import os
from typing import Mapping

from .trace import TraceError


def plan_mesh(rep: int, shard: int, tp: int) -> dict[str, int]:
    """The plan's mesh: tp outermost (FSDP2 shards inside TP's blocks), then dp_replicate, fsdp."""
    return {a: n for a, n in (("tp", tp), ("dp_replicate", rep), ("fsdp", shard)) if n > 1}


def parallelize(model, mesh: Mapping[str, int], parallelism, training):
    """This rank's model as torchtitan's ``parallelize_llama`` leaves it, for the job's ``parallelism`` /
    ``training`` configs (``model``: a :class:`.torchtitan.TitanModel`)."""
    from torchtitan.config import CompileConfig
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.models.llama3.parallelize import parallelize_llama

    from .torchtitan import _build, _plan_order_world

    rep, shard, tp = (mesh.get(a, 1) for a in ("dp_replicate", "fsdp", "tp"))
    pd = ParallelDims(dp_replicate=rep, dp_shard=shard, cp=1, tp=tp, pp=1, ep=1, world_size=rep * shard * tp,
                      spmd_backend="partial_dtensor")
    with _plan_order_world(dict(mesh), {"dp_replicate": rep, "fsdp": shard, "tp": tp}):
        pd.build_mesh()
    m = _build(model.config(tp, parallelism.enable_sequence_parallel and tp > 1, True)).to_empty(device="cpu")
    return parallelize_llama(m, parallel_dims=pd, training=training, parallelism=parallelism,
                             compile_config=CompileConfig(enable=False), ac_config=None, dump_folder="/tmp")


def trace_titan_fsdp2(model, mesh: Mapping[str, int], parallelism, training, *, loss_fn=None, batch: int,
                      seq: int, **kw) -> dict:
    """:func:`.fsdp2.trace_fully_shard_plan` of torchtitan's ``parallelize_llama`` on ``mesh``
    (:func:`plan_mesh`); ``loss_fn(pred, tokens, labels)`` defaults to torchtitan's over the global batch."""
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.distributed import utils as du

    from .fsdp2 import trace_fully_shard_plan
    from .torchtitan import _build, prepare

    prepare()

    def make():
        return _build(model.config(1, False, True)).to_empty(device="cpu")

    def default_loss(pred, tokens, labels):
        return cross_entropy_loss(pred, labels, global_vocab_size=model.vocab) / (batch * seq)

    ids = {"shape": [batch, seq], "dtype": "int", "range": model.vocab,
           "placement": {a: "Shard(0)" for a in mesh if a != "tp"}}
    old = du.get_spmd_backend()
    du.set_spmd_backend("partial_dtensor")  # TP's DTensors (cross_entropy_loss asserts it for a DTensor pred)
    try:
        return trace_fully_shard_plan(make, lambda m, ctx: parallelize(model, mesh, parallelism, training),
                                      loss_fn or default_loss, data={"tokens": ids, "labels": ids}, mesh=mesh, **kw)
    finally:
        du.set_spmd_backend(old)


def trace_titan_fsdp2_job(job, model, desc: str, **kw) -> dict:
    """A job config on torchtitan's DTensor backend with data parallelism (see the module docstring)."""
    d = job.degrees
    why = ("model" if job.model != "llama3-debug" else
           "activation_checkpoint" if job.ac is not None else
           "expert_parallel_degree" if d["ep"] > 1 else None)
    if why:
        raise TraceError(f"{job.path}: spmd_backend = \"partial_dtensor\" with data parallelism is traced for "
                         f"llama3 (torchtitan's parallelize_llama) without activation checkpointing or experts; "
                         f"this job has {why} set", "unsupported", why)
    if d["dp_shard"] == 1:
        raise TraceError(f"{job.path}: spmd_backend = \"partial_dtensor\" with data_parallel_replicate_degree only "
                         f"(FSDP2's replicate mode) is not traced", "unsupported", "data_parallel_replicate_degree")
    mesh = plan_mesh(d["dp_replicate"], d["dp_shard"], d["tp"])
    b = job.training.local_batch_size * d["dp_replicate"] * d["dp_shard"]
    name = kw.pop("name", None) or f"{model.name}_{os.path.splitext(os.path.basename(job.path))[0]}"
    return trace_titan_fsdp2(model, mesh, job.parallelism, job.training, batch=b, seq=job.training.seq_len,
                             name=name, description=desc, **kw)


__all__ = ["plan_mesh", "parallelize", "trace_titan_fsdp2", "trace_titan_fsdp2_job"]
