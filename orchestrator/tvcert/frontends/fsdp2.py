"""FSDP2 ``fully_shard`` traced from torch's own ``FSDPParamGroup`` code on the fake process group (issue 16).

What runs is FSDP2's: ``fully_shard(...)`` (the user's call, on each rank's mesh), its lazy init, its pre-forward
all-gather (``foreach_all_gather``: ``all_gather_copy_in`` into a ``torch.empty`` buffer, ``dist.all_gather_into_
tensor``, ``split_with_sizes_copy`` into the unsharded parameters), its post-backward reduce-scatter
(``foreach_reduce``: ``chunk_cat`` of the unsharded gradients, ``dist.reduce_scatter_tensor(avg)``, HSDP's
``dist.all_reduce`` over the replicate axis) and the sharded gradients it leaves in ``sharded_param.grad``.  Ours:

* **Inputs.** Each sharded parameter is a plan input (its placement: FSDP2's DTensor placements on the mesh it
  was given); before the forward its ``sharded_param`` (and the flat ``_sharded_param_data`` FSDP reads) is
  rebuilt on the traced input.  Parameters outside every ``fully_shard`` are inputs too, Replicate, trained as
  the module holds them (their gradient is what the program leaves in ``.grad``).
* **Collectives** are the tracer's traceable remaps of ``torch.distributed`` (:func:`.trace._traceable_collectives`);
  the joint program is functionalized (:mod:`.functional`), so FSDP's writes into views of its buffers are exact,
  and partly written buffers are tracked per element (:mod:`.buffers`).
* **Freeing.** ``free_storage`` (``storage.resize_(0)`` after the reshard) makes the buffer's values
  uninitialised (a copy of ``torch.empty``): a later read that no all-gather rewrote is refused.
  ``alloc_storage`` allocates nothing new (the values stay uninitialised until written).
* **Optimizer.** ``optimizer(params)`` builds a ``torch.optim`` optimizer over the sharded parameters after the
  backward; its ``step()`` runs on FSDP2's sharded gradients (outputs ``new.<p>``).

* **FSDP2 + TP.** A parameter TP made a DTensor (``parallelize_module`` / torchtitan's ``apply_tp`` before
  ``fully_shard``) is FSDP2's DTensor on dp x tp: its placement there is the plan input's (``_StridedShard`` of
  a TP-sharded dim as nested ``Shard(d)``, :func:`.dtensor.param_placements`); FSDP2 all-gathers and
  reduce-scatters its tp-local tensor over dp, and the unsharded parameter is TP's DTensor again.

What the trace cannot see is UNKNOWN naming the parameters: uneven sharding (padded shards), tensor-subclass
all-gather extensions (``fsdp_pre_all_gather``), a parameter left with no gradient (``set_requires_gradient_sync
(False)``, an unused parameter), DTensors of a 2-D TP / EP mesh or of a full SPMD mesh (``dp_mesh_dims``).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Mapping

from .trace import MeshCtx, TraceError, coords_of, fake_world, trace_plan


def _safe(name: str) -> str:
    return name.replace(".", "__")


def fsdp_params(model) -> list:
    """(fqn, FSDPParam) of every ``fully_shard`` module's parameters, in module order."""
    from torch.distributed.fsdp import FSDPModule

    fqn = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    out = []
    for mod in model.modules():
        if not isinstance(mod, FSDPModule):
            continue
        pg = mod._get_fsdp_state()._fsdp_param_group
        for fp in (pg.fsdp_params if pg is not None else ()):
            out.append((fqn[id(fp.sharded_param)], fp))
    return out


def _unsupported(fqn: str, fp) -> str | None:
    from torch.distributed.tensor.placement_types import Shard

    if hasattr(fp._sharded_local_tensor, "fsdp_pre_all_gather"):
        return "its tensor subclass all-gathers through fsdp_pre_all_gather / fsdp_post_all_gather"
    d, n = fp.fsdp_placement.dim, fp.mesh_info.shard_mesh_size
    if fp._orig_size[d] % n:
        size = fp._orig_size[d]
        chunk = -(-size // n)
        rows = [min(chunk, max(size - r * chunk, 0)) for r in range(n)]
        return (f"it is sharded unevenly ({list(fp._orig_size)} over {n} ranks on dim {d}: FSDP2 pads every shard to "
                f"{chunk} and the ranks keep {rows} of them, shards of different shapes, which the plan's even "
                f"Shard({d}) cannot express)")
    if fp.offload_to_cpu:
        return "it is offloaded to the CPU (CPUOffloadPolicy)"
    if fp.mesh_info.is_spmd_mesh:
        return "fully_shard was given dp_mesh_dims of a full SPMD mesh (distribute_module parameters)"
    if fp.is_dtensor and len(fp._unsharded_dtensor_spec.placements) != 1:
        return f"it is a DTensor of a {len(fp._unsharded_dtensor_spec.placements)}-D TP / EP mesh (1-D TP only)"
    names = fp.sharded_param.device_mesh.mesh_dim_names
    pls = fp.sharded_param.placements
    if names is None or len(names) != len(pls) or len(set(names)) != len(names):
        return "its mesh has no distinct dim names"
    if not any(isinstance(p, Shard) for p in pls):
        return "it is not sharded (replicate-only fully_shard)"
    return None


def _placements(fqn: str, fp, order) -> dict[str, str]:
    """The sharded parameter's placement per mesh axis (its DTensor on FSDP2's mesh, or on dp x tp when the
    parameter was TP's DTensor: FSDP2's ``_StridedShard`` of a TP-sharded dim is ``Shard(d)`` on each axis of a
    plan that nests tp outside dp, else TraceError -- :func:`.dtensor.param_placements`)."""
    from torch.distributed.tensor.placement_types import Replicate, Shard, _StridedShard

    p = fp.sharded_param
    for a, pl in zip(p.device_mesh.mesh_dim_names, p.placements):
        if not isinstance(pl, (Shard, _StridedShard, Replicate)):
            raise TraceError(f"FSDP2 parameter placement {pl} on {a!r} is not traced", "unsupported", "fully_shard")
    return _dtensor_placements(fqn, p, order)


def _dtensor_placements(fqn: str, p, order) -> dict[str, str]:
    """:func:`.dtensor.param_placements` of DTensor parameter ``fqn``, without its Replicate axes."""
    from .dtensor import param_placements

    try:
        pls = param_placements(p, list(order))
    except TraceError as exc:
        raise TraceError(f"FSDP2 parameter {fqn!r}: {exc}", exc.kind, "fully_shard") from None
    return {a: t for a, t in pls.items() if t != "Replicate"}


def _tp_rest(model, rest, order) -> dict[str, dict[str, str]]:
    """The placements of TP's DTensor parameters left outside every fully_shard."""
    from torch.distributed.tensor import DTensor

    return {n: _dtensor_placements(n, p, order) for n, p in model.named_parameters()
            if n in rest and isinstance(p, DTensor)}


@contextlib.contextmanager
def fsdp2_tracing():
    """While tracing: the joint program functionalized, and FSDP2's storage free / alloc as values (see above)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.fsdp._fully_shard._fsdp_collectives as FC
    import torch.distributed.fsdp._fully_shard._fsdp_param as FP
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as FPG

    from . import trace
    from .functional import functionalized

    def free(t):  # the buffer's storage is released: its values are gone (no version bump, as resize_(0))
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(t):
            t.copy_(torch.empty_like(t))

    def alloc(t):  # new storage holds no values; until written, reads are refused as uninitialised memory
        return None

    orig_factors = FC._get_gradient_divide_factors

    def factors(*a, **k):
        """``ReduceOp.PREMUL_SUM(1/f)`` (a gradient divide factor f other than the shard group's size, e.g.
        torchtitan's 1.0) as ``SUM`` with FSDP2's own post-division by f: the same values over the reals."""
        pre, post, rs_op, ar_op = orig_factors(*a, **k)
        if not isinstance(rs_op, dist.ReduceOp.RedOpType):
            f = a[4] if len(a) > 4 else k.get("factor")
            if pre is not None or post is not None or f is None:
                raise TraceError(f"FSDP2 reduce-scatter op {rs_op} with pre / post factors {pre} / {post}: not "
                                 f"traced", "unsupported", "fully_shard")
            return None, float(f), dist.ReduceOp.SUM, ar_op
        return pre, post, rs_op, ar_op

    patches = [(FP, "free_storage", free), (FP, "alloc_storage", alloc), (FPG, "alloc_storage", alloc),
               (FC, "_get_gradient_divide_factors", factors), (trace, "joint_transform", functionalized)]
    old = [(o, k, getattr(o, k)) for o, k, _ in patches]
    for o, k, v in patches:
        setattr(o, k, v)
    try:
        yield
    finally:
        for o, k, v in reversed(old):
            setattr(o, k, v)


def _probe(model_factory, shard, mesh: Mapping[str, int]) -> tuple[dict[str, dict], list[str], set, set[str]]:
    """Rank 0's build: the placement of every FSDP2 parameter, the parameters left outside fully_shard, the
    gradient divide factors and the mesh axes FSDP2 reduces over."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    axes, sizes = tuple(mesh), tuple(mesh.values())
    world = 1
    for s in sizes:
        world *= s
    with fake_world(0, world):
        dm = init_device_mesh("cpu", sizes, mesh_dim_names=axes)
        ctx = MeshCtx(axes, sizes, 0, dict(zip(axes, coords_of(0, sizes))), dm)
        model = model_factory()
        try:
            res = shard(model, ctx)
        except TraceError:
            raise
        except Exception as exc:  # noqa: BLE001 - FSDP2 / TP refusing the sharding (e.g. uneven on a dim > 0)
            _fsdp_failure(exc)
        model = model if res is None else res
        fps = fsdp_params(model)
        if not fps:
            raise TraceError("the model has no fully_shard module (FSDP2): nothing to trace here", "input")
        bad = [(n, why) for n, fp in fps if (why := _unsupported(n, fp))]
        if bad:
            raise TraceError("FSDP2 fully_shard: " + "; ".join(f"parameter {n!r}: {w}" for n, w in bad) +
                             ": not traced", "unsupported", "fully_shard")
        pl = {n: _placements(n, fp, axes) for n, fp in fps}
        rest = [n for n, _ in model.named_parameters() if n not in pl]
        pl.update(_tp_rest(model, rest, axes))  # outside fully_shard but TP's DTensor: its TP placement
        divide = {m._get_fsdp_state()._fsdp_param_group.gradient_divide_factor for m in model.modules()
                  if isinstance(m, FSDPModule) and m._get_fsdp_state()._fsdp_param_group is not None}
        dp_axes = {a for _, fp in fps for a in fp.mesh_info.mesh.mesh_dim_names}
    return pl, rest, divide, dp_axes


def _fsdp_failure(exc: BaseException) -> None:
    """A failure while FSDP2's hooks run around the model is UNKNOWN, never REFUTED: its code runs on the fake
    process group with our seams (the collectives' remaps, free / alloc, the rebuilt parameters), so a crash is
    not shown to be the program's.  Names FSDP2's innermost frame, if any."""
    import os
    import traceback

    import torch.distributed.fsdp as fsdp_pkg

    fsdp_dir = os.path.dirname(os.path.abspath(fsdp_pkg.__file__))
    frames = traceback.extract_tb(exc.__traceback__)
    at = next((f for f in reversed(frames) if os.path.abspath(f.filename).startswith(fsdp_dir)), None)
    where = f" (in FSDP2 at {os.path.basename(at.filename)}:{at.lineno} {at.name})" if at is not None else ""
    raise TraceError(f"the program under FSDP2 fails while traced{where}: {type(exc).__name__}: "
                     f"{' '.join(str(exc).split())[:300]}; not confirmed to be the program's own failure",
                     "unsupported", "fully_shard") from exc


def trace_fully_shard_plan(model_factory: Callable[[], Any], shard: Callable[[Any, MeshCtx], Any],
                           loss_fn: Callable[..., Any], *, data: Mapping[str, Mapping[str, Any]],
                           mesh: Mapping[str, int], name: str = "fsdp2",
                           batch: Callable[..., Mapping[str, Any]] | None = None,
                           rank_loss_fn: Callable[..., Any] | None = None,
                           optimizer: Callable[[list], Any] | None = None, **kw) -> dict:
    """``model_factory()`` builds the single-device module; ``shard(module, ctx)`` applies ``fully_shard`` (FSDP2,
    on ``ctx.device_mesh`` or a slice of it; HSDP: a 2-D ``(replicate, shard)`` slice) and returns the module;
    ``loss_fn(output, **data)`` is the single-device loss, and each rank's loss unless ``rank_loss_fn`` says
    otherwise; ``data`` / ``batch`` as in :func:`.dataparallel.trace_ddp_plan`.  The loss is ``Partial(avg)``
    over FSDP2's mesh axes and the axes a data input is sharded on (FSDP2 averages gradients over the
    data-parallel ranks), Replicate on the others (TP's); gradients (or, with ``optimizer(params) ->
    torch.optim.Optimizer``, the parameters after one step) are read back with FSDP2's placements.

    FSDP2 + TP: ``shard`` applies TP first (``parallelize_module`` on ``ctx.device_mesh["tp"]``) and then
    ``fully_shard`` on the dp slice of the same mesh; the mesh must list tp before dp, since FSDP2 shards a dim
    TP already shards inside TP's blocks (``_StridedShard``), which the plan's nested ``Shard(d)`` on both axes
    expresses only in that order (else UNKNOWN)."""
    import torch
    import torch.nn as nn
    from torch.distributed.tensor import DTensor

    from .dataparallel import optimizer_step

    logical_model = model_factory()
    pnames = [n for n, _ in logical_model.named_parameters()]
    if any(b.dtype.is_floating_point for b in logical_model.buffers()):
        raise TraceError("floating-point buffers (batch-norm statistics, ...) are not traced under FSDP2",
                         "unsupported", "buffer")
    # complex buffers (a RoPE cache, never written) are inputs as their real view [..., 2], the same on every rank
    cbufs = {n: b for n, b in logical_model.named_buffers() if b.is_complex()}
    placements, rest, divide, dp_axes = _probe(model_factory, shard, mesh)
    missing = [n for n in pnames if n not in placements and n not in rest]
    tp_rest = {n for n in rest if n in placements}  # TP's DTensors outside fully_shard
    for n in tp_rest:
        if not placements[n]:
            placements.pop(n)
    if missing:
        raise TraceError(f"the sharded module does not train parameters {missing} of the model", "input")
    shapes = {n: list(p.shape) for n, p in logical_model.named_parameters()}
    dtypes = {n: str(p.dtype).removeprefix("torch.") for n, p in logical_model.named_parameters()}
    dnames = list(data)
    inputs: dict[str, dict] = {_safe(n): {"shape": shapes[n], "param": True, "dtype": dtypes[n],
                                          **({"placement": placements[n]} if placements.get(n) else {})}
                               for n in pnames}
    for n, b in cbufs.items():
        inputs[_safe(n)] = {"shape": list(b.shape) + [2],
                            "dtype": {torch.complex64: "float32", torch.complex128: "float64"}[b.dtype]}
    inputs.update({n: dict(data[n]) for n in dnames})
    step = optimizer_step(optimizer) if optimizer is not None else None

    def buffers(kw_):
        return {n: torch.view_as_complex(kw_[_safe(n)]) for n in cbufs}

    def logical(**kw_):
        st = {n: kw_[_safe(n)] for n in pnames}
        st.update(buffers(kw_))
        out = torch.func.functional_call(logical_model, st, (kw_[dnames[0]],))
        loss = loss_fn(out, **{n: kw_[n] for n in dnames})
        return step(loss, {_safe(n): st[n] for n in pnames}) if step is not None else loss

    def setup(ctx):
        model = model_factory()
        res = shard(model, ctx)
        model = model if res is None else res
        fps = fsdp_params(model)
        got = {n: _placements(n, fp, tuple(mesh)) for n, fp in fps}
        got.update({n: v for n, v in _tp_rest(model, rest, tuple(mesh)).items() if v})
        if got != placements:
            raise TraceError(f"FSDP2 places the parameters differently on rank {ctx.rank}: {got} vs rank 0's "
                             f"{placements}", "spmd", "fully_shard")
        for mod in model.modules():  # FSDP2's lazy init (outside the trace: it compares real storages)
            st = getattr(mod, "_get_fsdp_state", None)
            if st is not None and st()._is_root is None:
                st()._lazy_init()
                break
        return model, fps

    def parallel(ctx, **kw_):
        from torch.distributed.fsdp._fully_shard._fsdp_param import unsafe_setattr_param

        model, fps = ctx.state
        sharded = {}
        for n, fp in fps:  # FSDP2 all-gathers from _sharded_param_data: both rebuilt on the traced input
            old = fp.sharded_param
            local = kw_[_safe(n)].detach().clone()  # the optimizer steps it in place: not the input itself
            new = nn.Parameter(DTensor.from_local(local, old.device_mesh, old.placements, run_check=False,
                                                  shape=old.shape, stride=old.stride()),
                               requires_grad=old.requires_grad)
            fp.sharded_param = new
            fp._sharded_param_data = new._local_tensor.view(-1)
            fp._sharding_spec = new._spec
            fp._setattr_on_modules(new)
            sharded[n] = new
        plain = {}
        for n in rest:
            mod_name, _, pn = n.rpartition(".")
            mod = model.get_submodule(mod_name) if mod_name else model
            real = mod._parameters[pn]
            leaf = kw_[_safe(n)].detach().clone()  # stepped in place: not the input
            if isinstance(real, DTensor):  # TP's DTensor outside fully_shard: rebuilt as a DTensor leaf
                leaf = DTensor.from_local(leaf, real.device_mesh, real.placements, run_check=False,
                                          shape=real.shape, stride=real.stride())
            leaf = nn.Parameter(leaf, requires_grad=True) if isinstance(real, DTensor) else leaf.requires_grad_(True)
            for h in list((getattr(real, "_post_accumulate_grad_hooks", None) or {}).values()):
                leaf.register_post_accumulate_grad_hook(h)
            for h in list((getattr(real, "_backward_hooks", None) or {}).values()):
                leaf.register_hook(h)
            unsafe_setattr_param(mod, pn, leaf)
            plain[n] = leaf
        for n, t in buffers(kw_).items():
            mod_name, _, bn = n.rpartition(".")
            bmod = model.get_submodule(mod_name) if mod_name else model
            old = bmod._buffers[bn]
            if isinstance(old, DTensor):  # TP's replicated buffer (a RoPE cache): the same values on every rank
                if any(not pl.is_replicate() for pl in old.placements):
                    raise TraceError(f"buffer {n!r} is a DTensor placed {list(old.placements)}: not traced",
                                     "unsupported", "buffer")
                t = DTensor.from_local(t, old.device_mesh, old.placements, run_check=False)
            bmod._buffers[bn] = t
        d = {k: kw_[k] for k in dnames}
        if batch is not None:
            d = dict(batch(ctx, **d))
        try:
            out = model(d[dnames[0]])
            loss = (rank_loss_fn or loss_fn)(out, **d)
            loss.backward()
        except TraceError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure under FSDP2's hooks
            _fsdp_failure(exc)
        grads = {}
        for n in pnames:
            p = sharded.get(n, plain.get(n))
            if p.grad is None:
                raise TraceError(f"FSDP2 left parameter {n!r} without a gradient after the backward (gradient "
                                 f"sync off, or the parameter unused): not traced", "unsupported", "fully_shard")
            g = p.grad
            if isinstance(g, DTensor) and isinstance(p, DTensor) and tuple(g.placements) != tuple(p.placements):
                raise TraceError(f"parameter {n!r} (TP's DTensor outside fully_shard) is left a gradient placed "
                                 f"{list(g.placements)}, not its own {list(p.placements)}: not traced",
                                 "unsupported", "fully_shard")
            grads[n] = g.to_local() if isinstance(g, DTensor) else g
        if optimizer is None:
            return {"loss": loss.detach(), **{f"grad_{_safe(n)}": grads[n] for n in pnames}}
        params = [sharded.get(n, plain.get(n)) for n in pnames]
        opt = optimizer(params)
        opt.step()
        res = {"loss": loss.detach()}
        for n, p in zip(pnames, params):
            t = p.detach()
            res[f"new.{_safe(n)}"] = t.to_local() if isinstance(t, DTensor) else t
        return res

    outs = dict(kw.pop("output_placements", None) or {})
    if "loss" not in outs:  # FSDP2 averages the gradients; with a divide factor of 1 (torchtitan's) it sums them
        if divide not in ({None}, {1.0}):
            raise TraceError(f"FSDP2 gradient divide factors {sorted(map(str, divide))}: give the loss's placement "
                             f"(output_placements)", "input")
        # over FSDP2's mesh axes and those the batch is split over; on the others (TP's) every rank holds it
        split = dp_axes | {a for d in data.values() for a, t in (d.get("placement") or {}).items()
                           if str(t).startswith("Shard")}
        outs["loss"] = {a: "Partial(avg)" if divide == {None} else "Partial(sum)" for a in mesh if a in split}
    with fsdp2_tracing():
        return trace_plan(logical, parallel, inputs=inputs, mesh=mesh, name=name, parallel_setup=setup,
                          parallel_backward=True, output_placements=outs, **kw)
