"""DTensor front end: an ``nn.Module`` + a ``parallelize_module`` plan -> tvcert plan.

The trap (issue 7): ``make_fx`` over a module whose parameters are DTensors bakes the local
weights in as constants.  So parameters are *inputs* of the traced function -- the local shard on
each rank -- and are rebuilt with ``DTensor.from_local(local, mesh, placements)`` inside it, then
the module runs through ``torch.func.functional_call``.  ``from_local``'s backward redistributes the
gradient to the parameter's placement, so gradient collectives DTensor would issue are in the graph.

Input placements come from the parallelized module's DTensor parameters (read on rank 0); data
inputs use the small user mapping.  Gradients are read back with the parameter's placement.

A parameter whose gradient DTensor leaves as ``Partial`` in metadata (sequence-parallel norm
weights) is redistributed by ``from_local``'s backward to the forward placement (Replicate), i.e.
the all_reduce is in the graph; code that reads ``.grad`` without that redistribution is the
hand-written case (``grad_sync`` in :func:`.trace.trace_plan`).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from .trace import TraceError, fake_world, trace_plan


def _pl_text(p) -> str:
    from torch.distributed.tensor import Partial, Replicate, Shard

    if isinstance(p, Shard):
        return f"Shard({p.dim})"
    if isinstance(p, Replicate):
        return "Replicate"
    if isinstance(p, Partial):
        return f"Partial({p.reduce_op})"
    raise TraceError(f"placement {p!r} is not Replicate / Shard / Partial", "unsupported")


def param_placements(p, order) -> dict[str, str]:
    """Per mesh axis placement text of a DTensor parameter, for a plan whose mesh nests ``order`` (outermost first).

    Several axes sharding one dim split it in nested blocks: DTensor nests them in its mesh's dim order, except
    that ``_StridedShard(d, sf)`` (FSDP's shard of a dim TP already shards) is split *inside* the plain shards of
    d, whose sizes multiply to ``sf``.  Either is the plan's ``Shard(d)`` on each axis only when the plan nests
    the axes the same way; otherwise TraceError (the blocks would be other blocks)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    names, sizes = list(p.device_mesh.mesh_dim_names), list(p.device_mesh.mesh.shape)
    out: dict[str, str] = {}
    plain: dict[int, list[str]] = {}
    for a, pl in zip(names, p.placements):
        if isinstance(pl, _StridedShard):
            continue
        out[a] = _pl_text(pl)
        if isinstance(pl, Shard):
            plain.setdefault(pl.dim, []).append(a)
    for d, axs in plain.items():
        if [a for a in order if a in axs] != axs:
            raise TraceError(f"parameter sharded on dim {d} by mesh axes {axs} in that order, but the plan nests "
                             f"{[a for a in order if a in axs]}", "unsupported", "DTensor placement")
    for a, pl in zip(names, p.placements):
        if not isinstance(pl, _StridedShard):
            continue
        outer = plain.get(pl.dim, [])
        sf = 1
        for b in outer:
            sf *= sizes[names.index(b)]
        if sf != pl.split_factor or any(order.index(b) > order.index(a) for b in outer) or a not in order:
            raise TraceError(f"placement {pl!r} on mesh axis {a!r} splits inside axes {outer} (sizes multiplying to "
                             f"{sf}), which the plan's mesh order {list(order)} does not nest outside it",
                             "unsupported", "DTensor placement")
        out[a] = f"Shard({pl.dim})"
    return out


def check_hidden_grad_sync(model) -> None:
    """Refuse (UNKNOWN) what the trace cannot see: gradient synchronisation in hooks.

    ``torch.autograd.grad`` fires neither post-accumulate-grad hooks (Hugging Face reduces Qwen3
    q_norm/k_norm gradients there) nor DDP's reducer or FSDP's reduce-scatter hooks; a plan traced
    without them would read back unsynchronised gradients with no warning."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        raise TraceError("the module is wrapped in DistributedDataParallel, whose gradient all_reduce runs in "
                         "autograd hooks the trace cannot see; trace the inner module and pass the reduction as "
                         "grad_sync", "unsupported", "DistributedDataParallel")
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        FSDPModule = ()  # type: ignore[assignment]
    for name, mod in model.named_modules():
        if FSDPModule and isinstance(mod, FSDPModule):
            raise TraceError(f"module {name or '<root>'!r} is FSDP-wrapped (fully_shard): its all-gather and "
                             f"reduce-scatter run in hooks the trace cannot see", "unsupported", "fully_shard")
    hooked = [n for n, p in model.named_parameters()
              if getattr(p, "_post_accumulate_grad_hooks", None) or getattr(p, "_backward_hooks", None)]
    if hooked:
        raise TraceError(f"parameters {hooked} have gradient hooks (e.g. register_post_accumulate_grad_hook) that "
                         f"torch.autograd.grad never fires, so their gradient synchronisation is invisible to the "
                         f"trace; pass it explicitly as grad_sync", "unsupported", "grad hook")


def _safe(name: str) -> str:
    return name.replace(".", "__")


def trace_module_plan(model_factory: Callable[[], Any], parallelize: Callable[[Any, Any], Any],
                      loss_fn: Callable[..., Any], *, data: Mapping[str, Mapping[str, Any]], mesh: Mapping[str, int],
                      name: str = "dtensor", train_step: Callable[..., Any] | None = None,
                      loss_context: Callable[[], Any] | None = None, **kw) -> dict:
    """``model_factory()`` builds the single-device module; ``parallelize(module, device_mesh)``
    applies the parallelization (e.g. ``parallelize_module``) in place or returns the module;
    ``loss_fn(module_output, **data) -> scalar``; the module is called as ``module(first data input)``.
    ``data``: name -> input spec as in :func:`trace_plan` (the first entry is the module's input).
    ``train_step(loss, params) -> {name: tensor}``: the program's own backward and update (an optimizer step),
    on the module's parameters as it sees them (DTensors on the ranks); its outputs are the plan's.
    ``loss_context()``: a context manager the ranks run the loss *and its backward* in, as PyTorch documents
    ``torch.distributed.tensor.parallel.loss_parallel`` (its backward needs the context too); the logical model
    runs the loss on plain tensors, where the context changes nothing."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    axes, sizes = tuple(mesh), tuple(mesh.values())
    world = 1
    for s in sizes:
        world *= s
    logical_model = model_factory()
    pnames = [n for n, _ in logical_model.named_parameters()]
    shapes = {n: list(p.shape) for n, p in logical_model.named_parameters()}
    # Floating-point buffers (rotary ``inv_freq``, ...) are inputs too: otherwise make_fx bakes their
    # values into the graph as tensor constants, which have no IR.  They are not differentiated.
    # Complex buffers (a RoPE cache) travel as their real view [..., 2] and are viewed back inside.
    bnames = [n for n, b in logical_model.named_buffers() if b.dtype.is_floating_point or b.is_complex()]
    cnames = {n for n, b in logical_model.named_buffers() if b.is_complex()}
    shapes.update({n: list(b.shape) + ([2] if n in cnames else []) for n, b in logical_model.named_buffers()
                   if n in bnames})
    # placements from the parallelized module on rank 0
    with fake_world(0, world):
        dm = init_device_mesh("cpu", sizes, mesh_dim_names=axes)
        built = model_factory()
        res = parallelize(built, dm)
        params0 = dict((res if res is not None else built).named_parameters())
        params0.update(dict((res if res is not None else built).named_buffers()))
        # read inside the fake world: a sub-mesh (mesh["tp"] of a dp x tp mesh) resolves its ranks lazily
        placements: dict[str, dict[str, str]] = {}
        for n in pnames + bnames:
            p = params0.get(n)
            placements[n] = param_placements(p, axes) if isinstance(p, DTensor) else {}
    dnames = list(data)
    # traced in the dtype the module uses (float64 / bfloat16 parameters stay so; all mean the reals)
    dtypes = {n: str(t.real.dtype if t.is_complex() else t.dtype).removeprefix("torch.")
              for n, t in [*logical_model.named_parameters(), *logical_model.named_buffers()]}
    inputs = {}
    for n in pnames:
        inputs[_safe(n)] = {"shape": shapes[n], "placement": placements[n], "param": True, "dtype": dtypes[n]}
    for n in bnames:
        inputs[_safe(n)] = {"shape": shapes[n], "placement": placements[n], "dtype": dtypes[n]}
    for n in dnames:
        inputs[n] = dict(data[n])

    def logical(**kw_):
        params = {n: torch.view_as_complex(kw_[_safe(n)]) if n in cnames else kw_[_safe(n)] for n in pnames + bnames}
        out = torch.func.functional_call(logical_model, params, (kw_[dnames[0]],))
        loss = loss_fn(out, **{n: kw_[n] for n in dnames})
        return train_step(loss, params) if train_step is not None else loss

    def setup(ctx):
        model = model_factory()
        res = parallelize(model, ctx.device_mesh)
        model = res if res is not None else model
        check_hidden_grad_sync(model)
        pls = {n: ((p.device_mesh, p.placements) if isinstance(p, DTensor) else None)  # a submesh's (SimpleFSDP + TP)
               for n, p in [*model.named_parameters(), *model.named_buffers()]}
        return model, pls

    def parallel(ctx, **kw_):
        model, pls = ctx.state
        params = {}
        for n in pnames + bnames:
            t = torch.view_as_complex(kw_[_safe(n)]) if n in cnames else kw_[_safe(n)]
            params[n] = DTensor.from_local(t, *pls[n], run_check=False) if pls[n] is not None else t
        out = torch.func.functional_call(model, params, (kw_[dnames[0]],))
        if loss_context is not None and train_step is None:
            with loss_context():  # the loss and its backward (the gradients land in the leaves' .grad)
                loss = loss_fn(out, **{n: kw_[n] for n in dnames})
                loss.backward()
            return (loss.full_tensor() if isinstance(loss, DTensor) else loss).detach()
        loss = loss_fn(out, **{n: kw_[n] for n in dnames})
        if isinstance(loss, DTensor):
            loss = loss.full_tensor()
        return train_step(loss, params) if train_step is not None else loss

    return trace_plan(logical, parallel, inputs=inputs, mesh=mesh, name=name, parallel_setup=setup, **kw)

