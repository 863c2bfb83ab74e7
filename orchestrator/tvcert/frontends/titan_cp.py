"""A torchtitan job with ``context_parallel_degree`` > 1 (x ``tensor_parallel_degree``): torchtitan's SDPA context
parallelism as its legacy DTensor backend runs it (issue 16).

What is torchtitan's: on ``spmd_backend = "partial_dtensor"`` (the backend ``apply_cp_to_forward`` is for),
``parallelize_llama`` calls ``apply_cp_to_forward`` on every block's inner ``ScaledDotProductAttention`` (q / k / v
wrapped as DTensors ``Shard(1)`` on the cp mesh, so that ``F.scaled_dot_product_attention`` dispatches to torch's
ring attention), then ``Module.parallelize`` (DTensor TP + SP on the tp mesh); the job's ``ParallelDims`` builds the
``cp`` x ``tp`` meshes on the fake process group.  The batch the data loader yields (tokens, labels and the RoPE
``positions``) is the same on every rank, and the trainer's input step, torchtitan's ``prepare_context_parallel_input``
(torch's head-tail load balancer: rank r keeps chunks r and 2cp-1-r), is traced (its index read:
``kernel/zigzag_index.py``).  On CPU DTensor's
CP dispatch has no entry for the CPU flash kernel, so :func:`.context_parallel.dtensor_ring` routes the sharded
SDPA to the same ring torch runs, per block with the flash kernel's semantics.

What is left out (and why it is sound to): ``parallelize_llama``'s FSDP2 ``fully_shard`` on the ``fsdp`` mesh
(which folds cp: ``dp_shard * cp``) sums the cp ranks' gradients in hooks outside autograd; the plan reads each rank's
gradient back ``Partial(sum)`` over cp, i.e. it claims the sum the reduce-scatter forms is the single-device
gradient.  The logical model is torchtitan's at degree 1 with the same batch (positions included) and its SDPA on
the math backend (``sdpa_backends``, torchtitan's own knob; the CPU flash kernel is the same function), whose
spelling (q and k each scaled by sqrt(scale), ``_safe_softmax`` under the causal mask) the ring's blocks and
``kernel/ring_causal.py`` follow.

``bug="positions_not_offset"``: the trainer does not pass the sharded positions (``positions=None``), so every cp
rank's RoPE reads the cache at its local positions ``0..seq/cp-1`` (torchtitan's ``_reshape_for_broadcast``
prefix read), the classic CP bug.
"""
from __future__ import annotations

import os

from .trace import TraceError

BUGS = ("", "positions_not_offset")


def _dtensor_placement(p) -> dict[str, str]:
    """The plan placement of a TP DTensor parameter on the tp mesh."""
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return {}
    (pl,) = p.placements
    if pl.is_replicate():
        return {}
    if pl.is_shard():
        return {"tp": f"Shard({pl.dim})"}
    raise TraceError(f"a TP parameter placed {pl}: not traced", "unsupported", "tensor_parallel_degree")


def _math_backend(m) -> None:
    """Every inner ``ScaledDotProductAttention`` of ``m`` on SDPA's math backend (the logical reference; its
    ``sdpa_backends`` is torchtitan's own per-module knob)."""
    from torch.nn.attention import SDPBackend
    from torchtitan.models.common.attention import ScaledDotProductAttention

    for x in m.modules():
        if isinstance(x, ScaledDotProductAttention):
            x.sdpa_backends = [SDPBackend.MATH]


def trace_titan_cp(model, *, cp: int, tp: int, sp: bool, batch: int, seq: int, load_balance: bool = True,
                   bug: str = "", name: str = "titan_cp", description: str | None = None, **kw) -> dict:
    """Trace torchtitan's ``model`` (a :class:`.torchtitan.TitanModel`) under CP ``cp`` x TP ``tp`` (see the module
    docstring) against the same model at degree 1."""
    if bug not in BUGS:
        raise TraceError(f"bug={bug!r}: one of {BUGS}", "input")
    if seq % (2 * cp if load_balance else cp):
        raise TraceError(f"training.seq_len = {seq}: context parallelism splits it into "
                         f"{2 * cp if load_balance else cp} chunks", "input")
    if sp and (seq // cp) % tp:
        raise TraceError(f"sequence parallelism needs a cp rank's seq_len ({seq // cp}) divisible by tp ({tp})",
                         "input")
    from .torchtitan import prepare

    prepare()
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental._attention import _disable_context_parallel_dispatcher
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.distributed import utils as du
    from torchtitan.distributed.context_parallel import apply_cp_to_forward, prepare_context_parallel_input
    from torchtitan.distributed.parallel_dims import ParallelDims

    from .context_parallel import trace_cp

    def build(tp_, sp_):
        with torch.device("meta"):
            return model.config(tp_, sp_, True).build()

    logical_model = build(1, False)
    _math_backend(logical_model)
    pnames = [n for n, _ in logical_model.named_parameters()]
    shapes = {n: list(p.shape) for n, p in logical_model.named_parameters()}
    cbufs = {n: b for n, b in logical_model.named_buffers()}
    if any(not b.is_complex() for b in cbufs.values()):
        raise TraceError(f"buffers {[n for n, b in cbufs.items() if not b.is_complex()]}: only complex RoPE caches "
                         f"are traced", "unsupported", "buffer")
    mesh = {"cp": cp, "tp": tp} if tp > 1 else {"cp": cp}
    # the batch as the data loader yields it, the same on every rank: the trainer's input step shards it
    seq_pl: dict = {}

    def parallelize():
        pd = ParallelDims(dp_replicate=1, dp_shard=1, cp=cp, tp=tp, pp=1, ep=1, world_size=cp * tp,
                          spmd_backend="partial_dtensor")
        pd.build_mesh()
        m = build(tp, sp)
        # parallelize_llama's legacy branch: CP's forward wrapping first, then TP (its FSDP2 step: module docstring)
        apply_cp_to_forward([b.attention.inner_attention for b in m.layers.values()], pd.get_mesh("cp"))
        if tp > 1:
            m.parallelize(pd)
        return m, pd

    # placements as torchtitan's TP left them on rank 0
    from .trace import fake_world

    old_backend = du.get_spmd_backend()
    du.set_spmd_backend("partial_dtensor")
    try:
        with fake_world(0, cp * tp):
            m0, _ = parallelize()
            placements = {n: _dtensor_placement(p) for n, p in m0.named_parameters()}
            bufpl = {n: _dtensor_placement(b) for n, b in m0.named_buffers()}
        _disable_context_parallel_dispatcher()
    finally:
        du.set_spmd_backend(old_backend)
    if set(placements) != set(pnames):
        raise TraceError(f"torchtitan's parallelize renamed parameters: {sorted(set(placements) ^ set(pnames))}",
                         "input")
    if any(bufpl.values()):
        raise TraceError(f"a RoPE cache sharded by TP ({bufpl}): not traced", "unsupported", "buffer")

    def safe(n):
        return n.replace(".", "__")

    inputs: dict[str, dict] = {safe(n): {"shape": shapes[n], "param": True,
                                         **({"placement": placements[n]} if placements[n] else {})} for n in pnames}
    for n, b in cbufs.items():  # complex RoPE caches travel as their real view [..., 2], the same on every rank
        inputs[safe(n)] = {"shape": list(b.shape) + [2]}
    ids = {"shape": [batch, seq], "dtype": "int", "range": model.vocab, "placement": dict(seq_pl)}
    max_pos = next(iter(cbufs.values())).shape[0]
    inputs.update(tokens=dict(ids), labels=dict(ids),
                  positions={"shape": [batch, seq], "dtype": "int", "range": max_pos, "placement": dict(seq_pl)})

    def state(m, kw_, wrap=None):
        st = {n: kw_[safe(n)] for n in pnames}
        for n in cbufs:
            st[n] = torch.view_as_complex(kw_[safe(n)])
        return {n: wrap(n, t) for n, t in st.items()} if wrap else st

    def logical(**kw_):
        pred = torch.func.functional_call(logical_model, state(logical_model, kw_), (kw_["tokens"],),
                                          {"positions": kw_["positions"]})
        return cross_entropy_loss(pred, kw_["labels"], global_vocab_size=model.vocab)

    def setup(ctx):
        du.set_spmd_backend("partial_dtensor")
        try:
            m, pd = parallelize()
        finally:
            du.set_spmd_backend(old_backend)
        real = {**dict(m.named_parameters()), **dict(m.named_buffers())}
        return m, pd, real

    def parallel(ctx, **kw_):
        m, pd, real = ctx.state

        def wrap(n, t):
            p = real[n]
            if not isinstance(p, DTensor):
                return t
            return DTensor.from_local(t, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                      stride=p.stride())

        du.set_spmd_backend("partial_dtensor")
        try:
            # the trainer's post_dataloading_process: torch's head-tail balancer (or none) on tokens, labels, positions
            tokens, labels, extra = prepare_context_parallel_input(
                kw_["tokens"], kw_["labels"], {"positions": kw_["positions"]}, pd.get_mesh("cp"), torch.device("cpu"),
                "headtail" if load_balance else None)
            if bug == "positions_not_offset":
                extra = {}
            pred = torch.func.functional_call(m, state(m, kw_, wrap), (tokens,), extra)
            loss = cross_entropy_loss(pred, labels, global_vocab_size=model.vocab)
        finally:
            du.set_spmd_backend(old_backend)
        return loss.to_local() if isinstance(loss, DTensor) else loss

    outs = {"loss": {"cp": "Partial(sum)"}}
    for n in pnames:
        outs[f"grad_{safe(n)}"] = {"cp": "Partial(sum)", **placements[n]}
    from torch.distributed.tensor.experimental._context_parallel import _attention as A

    saved = (A._cp_options.enable_load_balance, A._cp_options.rotate_method)
    # what prepare_context_parallel_input's _context_parallel_shard sets (a load balancer given or not); torch's
    # default rotater (all-gather), which torchtitan 0.3.0 does not configure
    A._cp_options.enable_load_balance = load_balance
    A._cp_options.rotate_method = A._RotateMethod.ALL_GATHER
    try:
        return trace_cp(logical=logical, parallel=parallel, inputs=inputs, mesh=mesh, name=name,
                        description=description or f"torchtitan {model.name} {model.dims}, CP={cp} x TP={tp}"
                                                   f"{' + SP' if sp else ''}{', bug=' + bug if bug else ''}",
                        parallel_setup=setup, output_placements=outs, **kw)
    finally:
        _disable_context_parallel_dispatcher()
        A._cp_options.enable_load_balance, A._cp_options.rotate_method = saved


def check_cp_job(job) -> None:
    """What the CP route does not trace: UNKNOWN (TraceError kind ``unsupported``) naming the field."""
    p, d = job.parallelism, job.degrees
    field_of = {"dp_replicate": "data_parallel_replicate_degree", "dp_shard": "data_parallel_shard_degree",
                "pp": "pipeline_parallel_degree", "ep": "expert_parallel_degree"}
    others = [f"{field_of[k]} = {v}" for k, v in d.items() if k not in ("cp", "tp") and v > 1]
    why = (f"with {', '.join(others)}" if others else
           f"with activation_checkpoint.mode = {job.ac_mode!r}" if job.ac is not None else
           f"with spmd_backend = {p.spmd_backend!r} (torchtitan's apply_cp_to_forward is its \"partial_dtensor\" "
           f"backend's; on \"spmd_types\" the attention's K / V all-gather is declared in its sharding config)"
           if p.spmd_backend != "partial_dtensor" else
           f"with context_parallel_load_balancer = {p.context_parallel_load_balancer!r}"
           if p.context_parallel_load_balancer not in ("headtail", None) else
           f"with model {job.model}" if job.model != "llama3-debug" else
           f"with local_batch_size = {job.training.local_batch_size} (RoPE's per-batch positions gather has no "
           f"conversion yet)" if job.training.local_batch_size != 1 else None)
    if why:
        raise TraceError(f"{job.path}: parallelism.context_parallel_degree = {d['cp']} {why}: context parallelism "
                         f"is traced from a job on spmd_backend = \"partial_dtensor\" for llama3 at local_batch_size = "
                         f"1, alone or with tensor_parallel_degree, head-tail or no load balancing, without "
                         f"activation checkpointing", "unsupported", "context_parallel_degree")


def trace_titan_cp_job(job, model, desc: str, **kw) -> dict:
    """A job config with ``context_parallel_degree`` > 1 (see the module docstring)."""
    check_cp_job(job)
    p, d = job.parallelism, job.degrees
    name = kw.pop("name", None) or f"{model.name}_{os.path.splitext(os.path.basename(job.path))[0]}"
    if kw.get("bug"):
        desc += f", bug={kw['bug']}"
    return trace_titan_cp(model, cp=d["cp"], tp=d["tp"], sp=p.enable_sequence_parallel and d["tp"] > 1,
                          batch=job.training.local_batch_size, seq=job.training.seq_len,
                          load_balance=p.context_parallel_load_balancer == "headtail", name=name, description=desc,
                          **kw)


__all__ = ["BUGS", "check_cp_job", "trace_titan_cp", "trace_titan_cp_job"]
