"""Data parallelism traced with the framework's own gradient synchronisation (issue 16).

* **DDP** (:func:`trace_ddp_plan`): the module is wrapped by the spec's own ``DistributedDataParallel(...)`` call,
  with DDP's Python reducer switched on (``torch._dynamo.config.optimize_ddp = "python_reducer"``, the reducer DDP
  uses under compiled autograd).  Its post-accumulate-grad hook per parameter (``grad / world_size``, then a
  functional ``all_reduce(sum)`` over DDP's process group, copied back into ``.grad``) is DDP's code, traced with
  ``loss.backward()`` on the traced parameters.  The C++ reducer computes the same average per bucket; what only the
  C++ reducer does (a registered comm hook, a built-in hook, mixed precision, delayed all-reduce) is not traced:
  UNKNOWN naming the parameters.  Plain post-accumulate-grad and tensor hooks on parameters (a hand-written
  gradient all-reduce) are traced the same way.
* **FSDP / HSDP / FSDP + TP** (:func:`trace_simple_fsdp_plan`): torchtitan's SimpleFSDP
  (``graph_trainer.simple_fsdp.data_parallel``), FSDP in DTensor form: each parameter is a ``Shard(0)`` DTensor
  whose access all-gathers it and whose gradient is reduce-scattered (``Partial(sum) -> Shard``), traced through
  :func:`.dtensor.trace_module_plan`.  Its gradients are *sums* over the data-parallel ranks, so the loss each rank
  computes must be normalised by the global batch (loss read back ``Partial(sum)``).
* **FSDP2 ``fully_shard``** is traced by :func:`.fsdp2.trace_fully_shard_plan` (its own hooks, collectives and
  flat buffers); inside a DDP or SimpleFSDP spec it is UNKNOWN naming the parameters (:func:`check_fully_shard`).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Mapping

from .trace import TraceError, trace_plan


def _safe(name: str) -> str:
    return name.replace(".", "__")


def check_fully_shard(model) -> None:
    """UNKNOWN (TraceError) naming the parameters of every ``fully_shard`` module in a DDP / SimpleFSDP spec: those
    tracers do not run FSDP2's hooks (its flat-buffer all-gather and reduce-scatter); :mod:`.fsdp2` does."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return
    names = []
    for mname, mod in model.named_modules():
        if isinstance(mod, FSDPModule):
            names += [f"{mname + '.' if mname else ''}{n}" for n, _ in mod.named_parameters()
                      if f"{mname + '.' if mname else ''}{n}" not in names]
    if names:
        raise TraceError(f"parameters {names} are managed by FSDP2 fully_shard, whose all-gather and reduce-scatter "
                         f"run in its pre/post-forward and post-backward hooks on flat in-place buffers, which this "
                         f"tracer does not run; trace it with tvcert.frontends.fsdp2.trace_fully_shard_plan "
                         f"(examples/torch/fsdp2_mlp.py)",
                         "unsupported", "fully_shard")


@contextlib.contextmanager
def _python_reducer():
    """DDP objects built inside use DDP's Python reducer (per-parameter post-accumulate-grad hooks with functional
    collectives); built-in comm hooks, which only the C++ reducer runs, are recorded on the module."""
    import torch._dynamo
    from torch.nn.parallel import DistributedDataParallel as DDP

    old, old_builtin = torch._dynamo.config.optimize_ddp, DDP._register_builtin_comm_hook

    def builtin(self, comm_hook_type):
        self._tvcert_builtin_hook = str(comm_hook_type)
        return old_builtin(self, comm_hook_type)

    torch._dynamo.config.optimize_ddp = "python_reducer"
    DDP._register_builtin_comm_hook = builtin
    try:
        yield
    finally:
        torch._dynamo.config.optimize_ddp = old
        DDP._register_builtin_comm_hook = old_builtin


def _check_ddp(ddp, pnames: list[str]) -> None:
    """What only DDP's C++ reducer would do is not traced: UNKNOWN naming the parameters."""
    why = None
    if not getattr(ddp, "_use_python_reducer", False):
        why = "it uses DDP's C++ reducer (built outside the trace's python_reducer mode)"
    elif getattr(ddp, "_tvcert_builtin_hook", None):
        why = f"it registers the built-in comm hook {ddp._tvcert_builtin_hook}, which only the C++ reducer runs"
    elif ddp._comm_hooks:
        why = (f"it registers the comm hook {ddp._comm_hooks[0][0].__qualname__}, which the C++ reducer calls with "
               f"GradBuckets and the traced Python reducer with (grad, param) pairs")
    elif getattr(ddp, "mixed_precision", None) is not None:
        why = "it uses DDP mixed precision, which the Python reducer does not model"
    elif getattr(ddp, "_delay_all_reduce_params", None):
        why = "it delays the all-reduce of some parameters (delay_all_reduce_named_params)"
    if why:
        raise TraceError(f"DistributedDataParallel: the gradient all-reduce of parameters {pnames} is not traced: {why}",
                         "unsupported", "DistributedDataParallel")


def _transplant_hooks(src, dst) -> int:
    """Register ``src``'s post-accumulate-grad and tensor (``register_hook``) hooks on ``dst``; returns how many."""
    n = 0
    for h in list((getattr(src, "_post_accumulate_grad_hooks", None) or {}).values()):
        dst.register_post_accumulate_grad_hook(h)
        n += 1
    for h in list((getattr(src, "_backward_hooks", None) or {}).values()):
        dst.register_hook(h)
        n += 1
    return n


def trace_ddp_plan(model_factory: Callable[[], Any], wrap: Callable[[Any, Any], Any], loss_fn: Callable[..., Any], *,
                   data: Mapping[str, Mapping[str, Any]], mesh: Mapping[str, int], name: str = "ddp",
                   batch: Callable[..., Mapping[str, Any]] | None = None,
                   rank_loss_fn: Callable[..., Any] | None = None, **kw) -> dict:
    """``model_factory()`` builds the single-device module; ``wrap(module, ctx)`` returns what each rank trains
    (``DistributedDataParallel(module, process_group=ctx.group("dp"))``, or the module with gradient hooks);
    ``loss_fn(output, **data) -> scalar`` is the single-device loss, and each rank's loss on its local batch unless
    ``rank_loss_fn(output, **data)`` says otherwise (the training step's own loss); the module is called with the
    first data input.
    ``data``: name -> input spec as in :func:`.trace.trace_plan`: local batches (``Shard(0)`` on the data axis), or
    the global batch with ``batch(ctx, **data) -> data`` picking the rank's share (what its DistributedSampler
    reads).  The plan's loss defaults to ``Partial(avg)`` over every mesh axis (each rank's mean loss; the logical
    loss is their average); gradients are read back with the parameters' placement (Replicate)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    logical_model = model_factory()
    pnames = [n for n, _ in logical_model.named_parameters()]
    shapes = {n: list(p.shape) for n, p in logical_model.named_parameters()}
    dtypes = {n: str(p.dtype).removeprefix("torch.") for n, p in logical_model.named_parameters()}
    if any(b.dtype.is_floating_point for _, b in logical_model.named_buffers()):
        raise TraceError("floating-point buffers (batch-norm statistics, ...) are not traced under data parallelism "
                         "(DDP broadcasts them from rank 0)", "unsupported", "buffer")
    # complex buffers (a RoPE cache, never written) are inputs as their real view [..., 2], the same on every rank
    cbufs = [n for n, b in logical_model.named_buffers() if b.is_complex()]
    dnames = list(data)
    inputs: dict[str, dict] = {_safe(n): {"shape": shapes[n], "param": True, "dtype": dtypes[n]} for n in pnames}
    for n, b in logical_model.named_buffers():
        if n in cbufs:
            inputs[_safe(n)] = {"shape": list(b.shape) + [2],
                                "dtype": {torch.complex64: "float32", torch.complex128: "float64"}[b.dtype]}
    inputs.update({n: dict(data[n]) for n in dnames})

    def buffers(kw_):
        return {n: torch.view_as_complex(kw_[_safe(n)]) for n in cbufs}

    def logical(**kw_):
        st = {**{n: kw_[_safe(n)] for n in pnames}, **buffers(kw_)}
        out = torch.func.functional_call(logical_model, st, (kw_[dnames[0]],))
        return loss_fn(out, **{n: kw_[n] for n in dnames})

    def setup(ctx):
        model = model_factory()
        with _python_reducer():
            wrapped = wrap(model, ctx)
        wrapped = model if wrapped is None else wrapped
        check_fully_shard(wrapped)
        if isinstance(wrapped, DDP):
            _check_ddp(wrapped, pnames)
        by_id = {id(p): n for n, p in [*model.named_parameters(), *model.named_buffers()]}
        path = {by_id[id(p)]: (n, p) for n, p in [*wrapped.named_parameters(), *wrapped.named_buffers()]
                if id(p) in by_id}
        missing = [n for n in pnames + cbufs if n not in path]
        if missing:
            raise TraceError(f"the wrapped module does not train parameters {missing} of the model", "input")
        return wrapped, path

    def parallel(ctx, **kw_):
        wrapped, path = ctx.state
        params = {}
        for n in pnames:
            wname, real = path[n]
            leaf = kw_[_safe(n)]
            _transplant_hooks(real, leaf)  # DDP's reducer hooks (and any hand-written ones) now fire on the leaf
            params[wname] = leaf
        params.update({path[n][0]: t for n, t in buffers(kw_).items()})
        d = {n: kw_[n] for n in dnames}
        if batch is not None:
            d = dict(batch(ctx, **d))
        out = torch.func.functional_call(wrapped, params, (d[dnames[0]],))
        return (rank_loss_fn or loss_fn)(out, **d)

    outs = dict(kw.pop("output_placements", None) or {})
    outs.setdefault("loss", {a: "Partial(avg)" for a in mesh})
    return trace_plan(logical, parallel, inputs=inputs, mesh=mesh, name=name, parallel_setup=setup,
                      parallel_backward=True, output_placements=outs, **kw)


def trace_simple_fsdp_plan(model_factory: Callable[[], Any], parallelize: Callable[[Any, Any], Any],
                           loss_fn: Callable[..., Any], *, data: Mapping[str, Mapping[str, Any]],
                           mesh: Mapping[str, int], name: str = "simple_fsdp", **kw) -> dict:
    """:func:`.dtensor.trace_module_plan` for a model parallelized with torchtitan's SimpleFSDP
    (``parallelize(module, device_mesh)`` calls ``data_parallel(module, mesh[...], mode=...)``, after TP if any).

    SimpleFSDP caches the class it swaps each module to, with the parametrization (and its DeviceMesh) of the first
    module built in the process baked into the class's properties; every rank here is a new process group, so the
    cache is emptied before each build (otherwise rank r would all-gather over rank 0's stale mesh).  The loss
    defaults to ``Partial(sum)`` over the axes the first data input is sharded on (SimpleFSDP sums gradients)."""
    from torchtitan.experiments.graph_trainer import simple_fsdp

    from .dtensor import trace_module_plan

    def par(module, dm):
        simple_fsdp._wrap_class_cache.clear()
        res = parallelize(module, dm)
        check_fully_shard(res if res is not None else module)
        return res

    first = dict(data[next(iter(data))])
    outs = dict(kw.pop("output_placements", None) or {})
    if "loss" not in outs:
        outs["loss"] = {a: "Partial(sum)" for a, t in first.get("placement", {}).items() if str(t).startswith("Shard")}
    return trace_module_plan(model_factory, par, loss_fn, data=data, mesh=mesh, name=name, output_placements=outs,
                             **kw)


def optimizer_step(make_optimizer: Callable[[list], Any], state: bool = False) -> Callable[..., dict]:
    """A ``train_step`` for :func:`.dtensor.trace_module_plan`: the gradients of the loss, then one ``step()`` of
    the real ``torch.optim`` optimizer ``make_optimizer(parameters)`` on copies of the parameters (DTensor
    shards on the ranks, so the update runs on the sharded parameters).  Outputs: ``loss`` and ``new.<p>`` per
    parameter (read back with the parameter's placement); the optimizer must run per tensor (``foreach=False``).
    ``state``: also every per-parameter state tensor after the step, ``<key>.<p>`` (AdamW's ``exp_avg.<p>`` and
    ``exp_avg_sq.<p>``, SGD's ``momentum_buffer.<p>``; sharded like the parameter); not the step counter."""
    import torch
    from torch.distributed.tensor import DTensor

    def step(loss, params: Mapping[str, Any]) -> dict:
        names = [n for n in params if params[n].requires_grad]  # not the buffers
        grads = torch.autograd.grad(loss, [params[n] for n in names])
        ps = []
        for n, g in zip(names, grads):
            p = torch.nn.Parameter(params[n].detach().clone())
            p.grad = g.detach()
            ps.append(p)
        opt = make_optimizer(ps)
        opt.step()
        out = {"loss": loss}
        for n, p in zip(names, ps):
            t = p.detach()
            out[f"new.{_safe(n)}"] = t.to_local() if isinstance(t, DTensor) else t
            for key, v in sorted(opt.state[p].items()) if state else ():
                if isinstance(v, torch.Tensor) and key != "step" and v.shape == p.shape:
                    out[f"{key}.{_safe(n)}"] = v.detach().to_local() if isinstance(v, DTensor) else v.detach()
        return out

    return step
