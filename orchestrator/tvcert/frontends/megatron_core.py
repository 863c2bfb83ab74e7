"""Megatron-core traced from its own, unmodified code on the fake process group.

Pinned: ``megatron-core==0.16.1`` (CPU, no Transformer Engine / Apex: the local layer spec), torch 2.13.0.

What is Megatron's and what is ours
-----------------------------------
* **Modules and parallel state.** Megatron's own ``parallel_state.initialize_model_parallel`` runs on every
  rank of the tracer's fake process group (no gloo groups), and Megatron's modules are built from a
  ``TransformerConfig`` with ``use_cpu_initialization`` (``ColumnParallelLinear``, ``RowParallelLinear``,
  ``VocabParallelEmbedding``, a ``TransformerLayer`` from ``get_gpt_layer_local_spec``, ...).  The logical
  model is the same builder at ``tensor_model_parallel_size=1`` (sequence parallelism off).
* **Weights.** Parameters are inputs of the traced function (``torch.func.functional_call``).  Each one's
  placement is Megatron's own declaration on the tensor-parallel module: ``tensor_model_parallel`` with
  ``partition_dim`` is ``Shard(partition_dim)`` on ``tp`` (``partition_stride`` must be 1), anything else is
  replicated; the local shapes are checked against it.
* **Gradient finalisation.** Megatron's own ``finalize_model_grads([chunk])`` runs inside the trace after
  autograd, as ``grad_sync``: it all-reduces over ``tp`` the gradients of parameters marked
  ``sequence_parallel`` (layer norms, row-parallel biases under SP) and qk-layernorms.  What Megatron's
  ``DistributedDataParallel`` contributes before it -- its grad-accumulation hook adds ``param.grad`` into a
  zeroed ``main_grad`` -- is done here (``main_grad`` = the gradient); its ``finish_grad_sync`` (the
  data-parallel bucket all-reduce) is a reduction over a group of one rank: only ``dp = 1`` is traced.
* **Collectives.** Megatron issues classic in-place collectives (``torch.distributed.all_reduce(t)``,
  ``all_gather_into_tensor(out, t)`` into ``torch.empty`` or global-memory-buffer views, asynchronous ones
  with ``handle.wait()``).  While tracing, those ``torch.distributed`` functions (and the aliases Megatron
  captured at import) perform the functional collective of the same semantics and copy the result into the
  output buffer, the remapping ``torch.compile`` applies (``traceable_collective_remaps``); an asynchronous
  one completes at issue (Megatron reads no buffer before its ``wait``; a read before it is not detected).
  The joint program is functionalized (:mod:`.functional`), so every write through an alias -- a view of
  the shared buffer, ``buf.copy_(synced)`` on a gradient's ``.data`` -- is exact in the graph.
* **Layer norm.** Megatron's local spec builds ``FusedLayerNorm`` when Apex is installed and otherwise
  ``WrappedTorchNorm``, which refuses sequence parallelism.  While tracing, the spec's norm is Megatron's own
  ``FusedLayerNorm`` (it marks its weight and bias ``sequence_parallel``, the attribute
  ``finalize_model_grads`` reads), with Apex's CUDA ``FusedLayerNormAffineFunction`` replaced by what it
  computes, ``F.layer_norm``.
* **CPU and RNG.** ``torch.cuda.current_device()`` is the CPU while tracing (Megatron allocates every buffer
  there), and so is the default causal mask (``get_default_causal_mask`` hard-codes ``device="cuda"``).  Megatron's CUDA RNG tracker is replaced by one whose ``fork()`` runs its body unchanged: dropout
  must be off (``hidden_dropout = attention_dropout = 0``), and a random op is UNKNOWN in any case.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from .trace import TraceError, fake_world, trace_plan

PINNED = "0.16.1"


def prepare() -> None:
    """Import megatron-core (quietly: it warns that Apex / Transformer Engine are absent) and check its version."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import megatron.core  # noqa: F401
            import megatron.core.distributed.finalize_model_grads  # noqa: F401
            import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401
            import megatron.core.tensor_parallel  # noqa: F401
        except ImportError as exc:
            raise TraceError(f"megatron-core is not importable ({exc}); pip install megatron-core=={PINNED}",
                             "input") from None
    from importlib.metadata import version

    if version("megatron-core") != PINNED:
        raise TraceError(f"megatron-core {version('megatron-core')} is installed; tvcert traces {PINNED}", "input")


# ====================================================================== collectives seam
class _Done:
    """The work handle of a collective that completed when it was issued."""

    def wait(self, *a, **k):
        return True

    def is_completed(self):
        return True


def _reduce_op(op) -> str:
    import torch.distributed as dist

    for name, v in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG), ("max", dist.ReduceOp.MAX)):
        if op is None and name == "sum" or op == v:
            return name
    raise TraceError(f"a collective with reduce op {op!r} (sum, avg and max are converted)", "unsupported",
                     "all_reduce")


def _group(group):
    import torch.distributed as dist

    return dist.group.WORLD if group is None else group


def _done(async_op: bool):
    return _Done() if async_op else None


def all_reduce(tensor, op=None, group=None, async_op=False):
    import torch.distributed._functional_collectives as funcol

    g = _group(group)
    if g.size() > 1:
        tensor.copy_(funcol.all_reduce(tensor, _reduce_op(op), g))
    return _done(async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    import torch.distributed._functional_collectives as funcol

    g = _group(group)
    output_tensor.copy_(funcol.all_gather_single(input_tensor, 0, g) if g.size() > 1 else input_tensor)
    return _done(async_op)


def reduce_scatter_tensor(output, input, op=None, group=None, async_op=False):
    import torch.distributed._functional_collectives as funcol

    g = _group(group)
    output.copy_(funcol.reduce_scatter_single(input, _reduce_op(op), 0, g) if g.size() > 1 else input)
    return _done(async_op)


def _refused(name: str):
    def f(*a, **k):
        raise TraceError(f"torch.distributed.{name} (a classic collective tvcert does not remap while tracing "
                         f"Megatron)", "unsupported", name)
    return f


_SEAM = {"all_reduce": all_reduce, "all_gather_into_tensor": all_gather_into_tensor,
         "_all_gather_base": all_gather_into_tensor, "reduce_scatter_tensor": reduce_scatter_tensor,
         "_reduce_scatter_base": reduce_scatter_tensor}
_REFUSED = ("all_gather", "reduce_scatter", "all_to_all", "all_to_all_single", "broadcast", "send", "recv",
            "isend", "irecv", "batch_isend_irecv")


class _TraceRng:
    """Megatron's CUDA RNG tracker, CPU-only: seeds are recorded, ``fork()`` runs its body unchanged."""

    def __init__(self):
        self.states_: dict[str, int] = {}
        self.seeds_: set[int] = set()
        self._is_initialized = True

    def is_initialized(self):
        return True

    def reset(self):
        self.states_, self.seeds_ = {}, set()

    def get_states(self):
        return dict(self.states_)

    def set_states(self, states):
        self.states_ = dict(states)

    def add(self, name, seed):
        if seed in self.seeds_ or name in self.states_:
            raise Exception(f"rng state {name} / seed {seed} already exists")
        self.seeds_.add(seed)
        self.states_[name] = seed

    @contextlib.contextmanager
    def fork(self, name="model-parallel-rng"):
        if name not in self.states_:
            raise Exception(f"cuda rng state {name} is not added")
        yield


class _LayerNormAffine:
    """Apex's ``FusedLayerNormAffineFunction`` (a CUDA kernel) as what it computes: ``F.layer_norm``."""

    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps):  # the signature Megatron inspects
        raise NotImplementedError

    @staticmethod
    def apply(input, weight, bias, normalized_shape, eps):
        import torch.nn.functional as F

        return F.layer_norm(input, tuple(normalized_shape), weight, bias, eps)


def _causal_mask_cpu(sq: int):
    """``megatron.core.transformer.utils.get_default_causal_mask`` with its hard-coded ``device="cuda"`` on the CPU."""
    import torch

    return torch.triu(torch.ones(sq, sq), diagonal=1).bool()


@contextlib.contextmanager
def megatron_tracing():
    """While tracing Megatron: the collectives seam, buffers on the CPU, the CPU RNG tracker, and the joint
    program functionalized."""
    import torch
    import torch.distributed as dist
    from megatron.core.fusions import fused_layer_norm as FLN
    from megatron.core.fusions import fused_softmax as FS
    from megatron.core.models import backends
    from megatron.core.tensor_parallel import layers as L
    from megatron.core.tensor_parallel import mappings as M
    from megatron.core.tensor_parallel import random as R

    from . import trace
    from .functional import functionalized

    patches = [(dist, k, v) for k, v in _SEAM.items()] + [(dist, k, _refused(k)) for k in _REFUSED]
    for mod in (L, M):
        patches += [(mod, "dist_all_gather_func", all_gather_into_tensor),
                    (mod, "dist_reduce_scatter_func", reduce_scatter_tensor)]
    patches += [(torch.cuda, "current_device", lambda: torch.device("cpu")),
                (FS, "get_default_causal_mask", _causal_mask_cpu),
                (FLN, "HAVE_FUSED_LAYER_NORM", True), (FLN, "FusedLayerNormAffineFunction", _LayerNormAffine),
                (backends, "LNImpl", FLN.FusedLayerNorm),
                (R, "_CUDA_RNG_STATE_TRACKER", _TraceRng()), (R, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", True),
                (trace, "joint_transform", functionalized)]
    missing = object()
    old = [(o, k, getattr(o, k, missing)) for o, k, _ in patches]
    for o, k, v in patches:
        setattr(o, k, v)
    try:
        yield
    finally:
        for o, k, v in reversed(old):
            if v is missing:
                delattr(o, k)
            else:
                setattr(o, k, v)


# ====================================================================== parallel state and config
def initialize(tp: int, seed: int = 1234) -> None:
    """Megatron's ``initialize_model_parallel`` (tensor parallel ``tp``, everything else 1) on the current
    (fake) world, and its model-parallel RNG seeding."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, create_gloo_process_groups=False)
    model_parallel_cuda_manual_seed(seed)


def config(tp: int, sp: bool, **kw):
    """A CPU ``TransformerConfig``: fp32, CPU initialization, no dropout, no fused kernels."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = dict(num_layers=1, hidden_size=8, num_attention_heads=2, use_cpu_initialization=True,
                perform_initialization=True, params_dtype=torch.float32, hidden_dropout=0.0, attention_dropout=0.0,
                gradient_accumulation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
                masked_softmax_fusion=False, persist_layer_norm=False)
    base.update(kw)
    return TransformerConfig(tensor_model_parallel_size=tp, sequence_parallel=sp and tp > 1, **base)


def _safe(name: str) -> str:
    return name.replace(".", "__")


@dataclass
class _Decl:
    """What a parameter of the tensor-parallel model declares on one rank."""

    shape: list[int]
    parallel: bool
    dim: int
    stride: int


def declarations(model) -> dict[str, _Decl]:
    return {n: _Decl(list(p.shape), bool(getattr(p, "tensor_model_parallel", False)),
                     int(getattr(p, "partition_dim", -1)), int(getattr(p, "partition_stride", 1)))
            for n, p in model.named_parameters()}


def placements(decl: Mapping[str, _Decl], full: Mapping[str, list[int]], tp: int) -> dict[str, dict[str, str]]:
    """Each parameter's placement from Megatron's own tensor-parallel attributes (``tensor_model_parallel``,
    ``partition_dim``, ``partition_stride``), checked against its local shape and its full (tp=1) shape."""
    out = {}
    for n, d in decl.items():
        if n not in full:
            raise TraceError(f"parameter {n} exists at tp={tp} but not in the tp=1 model", "input")
        whole = list(full[n])
        if d.parallel:
            if d.stride != 1:
                raise TraceError(f"parameter {n}: partition_stride {d.stride} (an interleaved shard, not Shard)",
                                 "unsupported", "partition_stride")
            k = d.dim
            if not 0 <= k < len(whole) or whole[k] % tp or d.shape != whole[:k] + [whole[k] // tp] + whole[k + 1:]:
                raise TraceError(f"parameter {n}: local shape {d.shape} is not Shard({k}) of {whole} over tp={tp}",
                                 "input")
            out[n] = {"tp": f"Shard({k})"} if tp > 1 else {}
        else:
            if d.shape != whole:
                raise TraceError(f"parameter {n}: local shape {d.shape} differs from {whole} but it carries no "
                                 f"tensor_model_parallel attribute", "input")
            out[n] = {}
    missing = sorted(set(full) - set(out))
    if missing:
        raise TraceError(f"parameters {missing} of the tp=1 model do not exist at tp={tp}", "input")
    return out


# ====================================================================== the trace
class _Chunk:
    """The model chunk ``finalize_model_grads`` expects (Megatron DDP's interface): ``module``, ``ddp_config``,
    and ``finish_grad_sync``, the data-parallel bucket reduction -- over a group of one rank here."""

    def __init__(self, module):
        from megatron.core.distributed import DistributedDataParallelConfig

        self.module = module
        self.ddp_config = DistributedDataParallelConfig()

    def finish_grad_sync(self, force_all_reduce: bool = False):
        from megatron.core import parallel_state as ps

        if ps.get_data_parallel_world_size() != 1:
            raise TraceError("data-parallel degree > 1: Megatron DDP's bucket all-reduce is not traced", "unsupported",
                             "finish_grad_sync")


def finalize_grads(ctx, grads: dict) -> dict:
    """``grad_sync``: Megatron's ``finalize_model_grads([chunk])`` on the rank's model, each parameter's
    ``main_grad`` set to its gradient first (what DDP's grad-accumulation hook leaves for one micro-batch)."""
    import torch
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    if getattr(ctx.state, "config", None) is None:
        raise TraceError("finalize_model_grads reads the model's .config: build a MegatronModule (or pass "
                         "finalize=False)", "input")
    named = dict(ctx.state.named_parameters())
    for n, p in named.items():
        p.main_grad = grads[_safe(n)]
    try:
        with torch.no_grad():
            finalize_model_grads([_Chunk(ctx.state)])
        return {_safe(n): p.main_grad for n, p in named.items()}
    finally:
        for p in named.values():
            del p.main_grad


class _WithLoss:
    """``loss(model, **data)`` as a module call, so ``torch.func.functional_call`` can swap the parameters."""

    def __new__(cls, model, loss):
        import torch

        class WithLoss(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, **data):
                return loss(self.model, **data)

        return WithLoss()


def trace_megatron(build: Callable[[Any], Any], loss: Callable[..., Any], *, data: Mapping[str, Mapping[str, Any]],
                   tp: int, sp: bool = False, config_kw: Mapping[str, Any] | None = None, finalize: bool = True,
                   edit: Optional[Callable[[Any], None]] = None, name: str = "megatron_core", **kw) -> dict:
    """Trace ``build(config)`` (Megatron modules) at tp=1 (logical) and at ``tp`` on every rank (parallel).

    ``loss(model, **data)`` -> scalar loss, run on both (under SP its local sum must be reduced over tp, e.g.
    with Megatron's ``reduce_from_tensor_model_parallel_region``).  ``data``: input specs as in
    :func:`tvcert.frontends.trace.trace_plan` (placements over ``tp``).  ``finalize``: run Megatron's
    ``finalize_model_grads`` on each rank (the default, as Megatron's training step does).  ``edit(model)`` may
    change the parallel model after it is built (a negative: e.g. forget a ``sequence_parallel`` mark)."""
    prepare()
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if tp < 1:
        raise TraceError(f"tp = {tp} must be at least 1", "input")
    ckw = dict(config_kw or {})

    def make(t: int, edited: bool):
        initialize(t)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                m = build(config(t, sp, **ckw))
            except (ValueError, AssertionError, TypeError) as exc:  # Megatron's own configuration checks
                msg = " ".join(str(exc).split())[:400]
                raise TraceError(f"megatron-core refuses the model at tp={t}: {type(exc).__name__}: {msg}",
                                 "input") from None
        if edited and edit is not None:
            edit(m)
        return m

    with megatron_tracing(), warnings.catch_warnings():
        # Megatron's advice for GPUs (CUDA_DEVICE_MAX_CONNECTIONS), given at the first sequence-parallel linear
        warnings.filterwarnings("ignore", message="When using sequence parallelism")
        try:
            with fake_world(0, tp):  # rank 0's declarations
                decl = declarations(make(tp, True))
            dist.init_process_group("fake", rank=0, world_size=1, store=FakeStore())  # the logical model's world
            lm = make(1, False)
            full = {n: list(p.shape) for n, p in lm.named_parameters()}
            pl = placements(decl, full, tp)
            inputs = {_safe(n): {"shape": full[n], "placement": pl[n], "param": True} for n in full}
            clash = sorted(set(inputs) & set(data))
            if clash:
                raise TraceError(f"data inputs {clash} clash with parameter names", "input")
            inputs.update({k: dict(v) for k, v in data.items()})
            dnames = list(data)
            lwrap = _WithLoss(lm, loss)

            def run(wrapper, kw_):
                params = {f"model.{n}": kw_[_safe(n)] for n in full}
                return torch.func.functional_call(wrapper, params, (), {k: kw_[k] for k in dnames})

            def setup(ctx):  # every rank must declare what rank 0 declared (the placements come from it)
                m = make(ctx.size("tp"), True)
                if declarations(m) != decl:
                    raise TraceError(f"rank {ctx.rank} declares other tensor-parallel attributes or shapes than "
                                     f"rank 0", "spmd")
                return m

            def parallel(ctx, **kw_):
                return run(_WithLoss(ctx.state, loss), kw_)

            return trace_plan(lambda **kw_: run(lwrap, kw_), parallel, inputs=inputs, mesh={"tp": tp}, name=name,
                              parallel_setup=setup, grad_sync=finalize_grads if finalize else None, **kw)
        finally:
            ps.destroy_model_parallel()
            if dist.is_initialized():
                dist.destroy_process_group()
