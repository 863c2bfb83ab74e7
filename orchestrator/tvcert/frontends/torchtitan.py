"""torchtitan loader: build a torchtitan model and torchtitan's own parallelization as inputs of
:func:`tvcert.frontends.trace.trace_plan`.

Pinned: ``torchtitan==0.3.0`` (installed ``--no-deps``, see the Makefile), ``spmd_types==0.2.3``,
torch 2.13.0 CPU.

What is torchtitan's and what is ours
-------------------------------------
* **Model.** torchtitan's config classes (``Llama3Model.Config`` built by torchtitan's own
  ``_build_llama3_layers``, the DeepSeek-V3 builders) with the debug flavour's structure and small
  dimensions, built on the meta device; nothing is materialised (parameters and buffers are inputs
  of the traced function; complex RoPE caches as their real view ``[..., 2]``).  One substitution,
  forced by CPU tracing and the IR: the inner attention is torchtitan's ``ScaledDotProductAttention``
  instead of FlexAttention (a compiled higher-order op with no CPU trace), with its ``is_causal`` mask
  written as an additive ``-1e4`` mask on SDPA's math backend (:func:`_causal_sdpa_forward`: the fused
  CPU kernel is one opaque op, and the math backend's ``-inf`` fill has no IR constant).
* **Sharding.** torchtitan's own sharding declarations (``set_llama3_sharding_config``: the same
  call ``Llama3Model.Config.update_from_config`` makes, without the trainer-only part that imports
  the data loaders) and torchtitan's ``Module.parallelize(parallel_dims)`` -- the TP/EP step of
  ``parallelize_llama`` / ``parallelize_deepseekv3``.  The rest of those functions (activation
  checkpointing, compile, FSDP at degree 1) changes no values or runs in hooks the trace cannot see,
  and is left out.
* **Backend.** torchtitan 0.3.0's default ``spmd_backend="spmd_types"``: parameters are plain local
  shards and every redistribution is an explicit ``spmd_types`` collective issued against the
  *current SPMD mesh* -- what the trainer's ``train_context`` sets
  (``dist_utils.get_spmd_context``).  ``mesh_context=False`` runs the very same parallelized model
  without it: ``spmd_redistribute_per_axis`` then returns its input, no collective happens and every
  rank computes on its local shards.  That is the negative of issue 7.
* **Collectives.** ``spmd_types`` issues classic in-place collectives
  (``dist.all_reduce(t)``, ``dist.all_gather_into_tensor(out, t)``), whose results alias their
  inputs and which the ATen converter refuses.  ``spmd_types`` has a documented seam for replacing
  its ``torch.distributed`` (``spmd_types._dist.set_dist``); while tracing it is pointed at
  :class:`_FuncolDist`, which performs each collective with the functional collective of the same
  semantics and copies the result into the output buffer.
* **Loss.** torchtitan's ``cross_entropy_loss`` (sum reduction): under TP it is the vocab-parallel
  ``_LossParallelCrossEntropy`` on the ``Shard(-1)`` logits of ``lm_head``.

Verdicts (tests/test_trace_torchtitan.py)
-----------------------------------------
* Llama 3 debug, 2 layers, TP=4 + SP, torchtitan's plan unchanged: traces (~600 parallel ops), the
  reference interpreter agrees, and VERIFIED (with a checked certificate).  The vocab-parallel
  embedding (``(ids - off).clamp(..)``, ``out * in_range``) and its backward are proved by
  ``vocab_parallel_embedding_clamped`` / ``vocab_parallel_embedding_clamped_backward``;
  ``_LossParallelCrossEntropy`` by three multi-op rules (kernel/patterns.py, Coq Rules/LossParallel.v)
  whose conclusions are the logical graph's own forms: ``vocab_parallel_log_softmax`` (the local
  log-softmax shifted by the all-reduced max, with the all-reduced sum of exps, is a vocab shard of
  ``log_softmax``), ``vocab_parallel_nll_loss`` (the target logit picked at ``t - rank*V/tp``, masked
  before the squeeze, all-reduced, negated, zeroed at ``ignore_index`` = -100, is
  ``-sum(ls * one_hot(t))``; the ignore index must lie outside the vocabulary) and
  ``vocab_parallel_nll_backward`` (``exp(ls)`` minus the masked local one-hot, times the filtered
  gradient, is a vocab shard of ``log_softmax_backward(-one_hot(t) * g, ls)``).  Mutations of the loss
  (local max in one use, mirrored block, no target all-reduce, no mask, avg instead of sum, unmasked
  backward one-hot) are REFUTED; an offset one block off is UNKNOWN (the interpreter cannot run an
  out-of-range gather).  ``vocab_parallel=False`` (replicated embedding, gathered-logits loss; every
  layer as torchtitan shards it): VERIFIED too.
* The same model without the mesh context: REFUTED with a float64 counterexample.
* DeepSeek-V3 debug with EP: UNKNOWN -- the MoE needs ops with no IR (``sort``, ``cumsum``,
  ``_grouped_mm`` with data-dependent offsets, torchtitan's ``deterministic_scatter_add``) and the EP
  all-to-all split sizes are data-dependent (``.tolist()`` of token counts: not traceable on fake
  tensors).
* Qwen3 debug (``qwen3-debug``; examples/torchtitan/qwen3_debug_*.toml): TP 2 + SP, FSDP 2 and FSDP 2 x TP 2 VERIFIED.
  Its lm_head is tied to the embedding; ``Module.parallelize`` and SimpleFSDP's ``data_parallel`` register a new
  parameter per module, which unties them, and torchtitan's ``Decoder.init_states`` ties them again after
  parallelization: so does :func:`_retie` (and the SimpleFSDP route, on the DTensor parameters).
* **Gradients.** Read back with the parameter's TP placement.  Norm weights under sequence
  parallelism are TP-Replicate whose gradient is a pending sum ("pending BWD AR handled by FSDP",
  torchtitan ``decoder_sharding.norm_config``); FSDP does that all-reduce in hooks, outside autograd,
  so it is passed to :func:`trace_plan` as ``grad_sync`` (an all_reduce over tp of exactly those
  gradients).  ``grad_sync=False`` leaves it out.

A job config (``tvcert trace --torchtitan llama3-debug --config JOB.toml``)
------------------------------------------------------------------------
:mod:`.titan_config` reads the TOML with torchtitan's own config dataclasses; :func:`trace_titan_job` routes it.
TP (+ SP) jobs run as above with the job's batch, sequence length and activation-checkpointing policy;
``data_parallel_shard_degree`` / ``data_parallel_replicate_degree`` > 1 go through torchtitan's SimpleFSDP
(graph_trainer's ``apply_simple_fsdp`` on the job's ``ParallelDims``) on the default ``spmd_types`` backend, whose
FSDP2 takes the full SPMD mesh (``dp_mesh_dims``, not traced); with ``spmd_backend = "partial_dtensor"``,
``parallelize_llama`` itself -- TP, then FSDP2 ``fully_shard`` -- is traced with FSDP2's hooks (:mod:`.titan_fsdp2`).
``context_parallel_degree`` > 1 on ``"partial_dtensor"``: ``parallelize_llama``'s ``apply_cp_to_forward`` and TP
(:mod:`.titan_cp`).  examples/torchtitan/*.toml: TP 2, FSDP 2, HSDP 2 x 2, FSDP 2 x TP 2 (both routes), TP 2 x CP 2
each VERIFIED; async TP, selective / memory-budget checkpointing, CP off its route are UNKNOWN naming the field
(tests/test_trace_torchtitan.py, tests/test_trace_cp.py).

Environment shims (only inside this process, nothing is written to site-packages)
--------------------------------------------------------------------------------
* ``triton`` is not installed (a 286 MB GPU wheel).  torchtitan imports it only for the kernels of
  the symmetric-memory EP backend (``torchtitan.distributed.minimal_async_ep.kernels``), imported
  unconditionally by ``models.common``.  When ``import triton`` fails, that one module is registered
  in ``sys.modules`` as a stand-in whose kernels raise; ``triton`` itself is never faked (torch probes
  for it).
* ``torchtitan.tools.utils.device_type`` falls back to "cuda" without a GPU;
  ``parallel_dims.device_type`` is set to "cpu" so the meshes are built on the fake process group.
"""
from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable

from .trace import TraceError, trace_plan

_KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"
_KERNEL_NAMES = ("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel",
                 "fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
                 "reduce_topk_slots_kernel", "topk_scores_grad_kernel")


def prepare() -> None:
    """Make torchtitan importable on a CPU-only machine and select its default SPMD backend."""
    if _KERNELS not in sys.modules:
        try:
            importlib.import_module("triton")
        except ImportError:
            stub = types.ModuleType(_KERNELS)
            stub.__doc__ = "tvcert stand-in: triton is not installed; these GPU kernels are never traced."

            def _kernel(name):
                def f(*a, **k):
                    raise RuntimeError(f"{name}: a triton kernel (torchtitan minimal_async_ep); triton is not installed")
                f.__name__ = name
                return f

            for n in _KERNEL_NAMES:
                setattr(stub, n, _kernel(n))
            sys.modules[_KERNELS] = stub
    import spmd_types
    import torchtitan.distributed.parallel_dims as pdm
    from torchtitan.distributed import utils as du

    from . import trace

    import torchtitan.protocols as protocols

    sd = os.path.dirname(os.path.abspath(spmd_types.__file__))
    # spmd_types' runtime and torchtitan's Module wrapper (protocols/module.py: forward_with_redistribution) wrap
    # every op: locate ops at the model's lines
    for d in (sd, os.path.dirname(os.path.abspath(protocols.__file__))):
        if d not in trace.SKIP_FRAME_DIRS:
            trace.SKIP_FRAME_DIRS.append(d)

    pdm.device_type = "cpu"
    du.set_spmd_backend("spmd_types")


# ====================================================================== collectives seam
class _FuncolDist:
    """``torch.distributed`` as ``spmd_types`` uses it, with the in-place collectives performed by
    functional collectives (same values; the output buffer receives a copy).  Everything else is
    ``torch.distributed``."""

    def __init__(self):
        import torch.distributed as dist

        self._dist = dist

    def __getattr__(self, name):
        return getattr(self._dist, name)

    @staticmethod
    def _op(op) -> str:
        import torch.distributed as dist

        if op is None or op == dist.ReduceOp.SUM:
            return "sum"
        if op == dist.ReduceOp.MAX:
            return "max"
        if op == dist.ReduceOp.AVG:
            return "avg"
        raise TraceError(f"spmd_types collective with reduce op {op!r}", "unsupported", "all_reduce")

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        import torch.distributed._functional_collectives as funcol

        tensor.copy_(funcol.all_reduce(tensor, self._op(op), group))
        return None

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        import torch.distributed._functional_collectives as funcol

        output_tensor.copy_(funcol.all_gather_single(input_tensor, 0, group))
        return None

    def reduce_scatter_tensor(self, output, input, op=None, group=None, async_op=False):
        import torch.distributed._functional_collectives as funcol

        output.copy_(funcol.reduce_scatter_single(input, self._op(op), 0, group))
        return None

    def all_to_all(self, output_tensor_list, input_tensor_list, group=None, async_op=False):
        import torch
        import torch.distributed._functional_collectives as funcol

        sizes_in = [int(t.shape[0]) for t in input_tensor_list]
        sizes_out = [int(t.shape[0]) for t in output_tensor_list]
        out = funcol.all_to_all_single(torch.cat([t.contiguous() for t in input_tensor_list], 0),
                                       sizes_out, sizes_in, group)
        for dst, piece in zip(output_tensor_list, torch.split(out, sizes_out, 0)):
            dst.copy_(piece)
        return None

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op=False):
        import torch.distributed._functional_collectives as funcol

        output.copy_(funcol.all_to_all_single(input, output_split_sizes, input_split_sizes, group))
        return None


@contextlib.contextmanager
def funcol_collectives():
    from spmd_types import _dist

    old = _dist.dist
    _dist.set_dist(_FuncolDist())
    try:
        yield
    finally:
        _dist.set_dist(old)


# ====================================================================== models
@dataclass
class TitanModel:
    """A torchtitan model flavour at small dimensions: ``config(tp, sp)`` -> a model config with
    torchtitan's sharding declarations."""

    name: str
    config: Callable[..., Any]
    vocab: int
    dims: dict = field(default_factory=dict)


def _sdpa_attention(cfg) -> None:
    from torchtitan.models.common.attention import ScaledDotProductAttention

    for layer in cfg.layers:
        if getattr(layer, "attention", None) is not None:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()


MASK_FILL = -1e4  # the finite causal-mask fill (the IR has no infinities); as in examples/torch/hf_llama_tp.py


def _causal_sdpa_forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, scale=None, enable_gqa=False,
                         is_causal=True, **kwargs):
    """torchtitan ``ScaledDotProductAttention.forward`` with ``is_causal=True`` written as an additive
    mask ``triu(full(-1e4), 1)``, on SDPA's math backend.

    Why: the fused CPU kernel (``_scaled_dot_product_flash_attention_for_cpu``) is one opaque ATen op,
    and SDPA's math backend implements ``is_causal`` with a ``-inf`` fill, which no IR constant can
    hold.  A finite fill changes the attention weights of masked positions from 0 to exp(-1e4 - m),
    identically in the logical and the parallel program."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if attention_masks is not None:
        raise ValueError("ScaledDotProductAttention does not support attention_masks")
    q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
    mask = None
    if is_causal:
        L, S = q.shape[-2], k.shape[-2]
        mask = torch.full((L, S), MASK_FILL, dtype=q.dtype, device=q.device).triu(1)
    with sdpa_kernel([SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
    return out.transpose(1, 2)


def _build(cfg):
    """Build on the meta device, with the CPU-traceable causal SDPA (:func:`_causal_sdpa_forward`)
    installed on every ``ScaledDotProductAttention`` before ``parallelize`` wraps it."""
    import types as _types

    import torch
    from torchtitan.models.common.attention import ScaledDotProductAttention

    with torch.device("meta"):
        m = cfg.build()
    for mod in m.modules():
        if isinstance(mod, ScaledDotProductAttention):
            mod.forward = _types.MethodType(_causal_sdpa_forward, mod)
    return m


def _retie(m):
    """Tie ``tok_embeddings.weight`` to ``lm_head.weight`` again, as torchtitan's ``Decoder.init_states`` does after
    ``parallelize`` (which distributes each module's parameter separately, so the tie made in ``__init__`` breaks):
    torchtitan trains the tied model.  A model without ``enable_weight_tying`` is returned unchanged."""
    if getattr(m, "enable_weight_tying", False):
        m.tok_embeddings.weight = m.lm_head.weight
    return m


def llama3_debug(layers: int = 2, dim: int = 64, n_heads: int = 8, vocab: int = 128, hidden: int = 128,
                 max_seq_len: int = 64) -> TitanModel:
    """torchtitan's ``llama3`` ``debugmodel`` flavour (fused QKV, complex RoPE with llama scaling,
    SwiGLU FFN, untied lm_head) at ``layers`` layers and small dimensions."""

    def config(tp: int = 1, sp: bool = False, vocab_parallel: bool = True, ep: int = 1):
        if ep > 1:
            raise TraceError("llama3 has no experts: ep must be 1", "input")
        import torchtitan.models.llama3 as L
        from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
        from torchtitan.models.llama3.sharding import set_llama3_sharding_config

        cfg = L.Llama3Model.Config(
            dim=dim, vocab_size=vocab,
            tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=L._EMBEDDING_INIT),
            norm=RMSNorm.Config(normalized_shape=dim, param_init=L._NORM_INIT),
            lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=L._output_linear_init(dim)),
            layers=L._build_llama3_layers(
                fuse_qkv=True, n_layers=layers, dim=dim, n_heads=n_heads, hidden_dim=hidden,
                rope=ComplexRoPE.Config(dim=dim // n_heads, max_seq_len=max_seq_len, theta=500000, scaling="llama"),
                attn_backend="flex"),
        )
        _sdpa_attention(cfg)
        set_llama3_sharding_config(cfg, enable_sp=sp)
        if not vocab_parallel:
            _replicated_embedding(cfg, sp)
        return cfg

    return TitanModel("llama3_debug", config, vocab, dict(layers=layers, dim=dim, n_heads=n_heads, hidden=hidden))


def _replicated_embedding(cfg, sp: bool) -> None:
    """Not torchtitan's plan: ``tok_embeddings`` TP-Replicate instead of torchtitan's vocab-parallel
    embedding (see ``vocab_parallel`` in :func:`trace_titan`).  Under SP the token ids are split along
    the sequence first (an int tensor, no gradient) and the lookup yields the SP activation directly;
    the weight's gradient is then a pending sum over tp like the SP norm weights' (without SP the
    weight is Invariant, like the norm weights: every rank computes the whole gradient)."""
    import spmd_types as spmd
    from torchtitan.models.common.decoder_sharding import (dense_activation_placement, dense_param_placement,
                                                           dense_sequence_parallel_placement)
    from torchtitan.protocols.sharding import ShardingConfig

    rep = dense_activation_placement(tp=spmd.R)
    act = dense_sequence_parallel_placement() if sp else dense_activation_placement(tp=spmd.I)
    cfg.tok_embeddings.sharding_config = ShardingConfig(
        state_shardings={"weight": dense_param_placement(tp=spmd.R if sp else spmd.I)},  # as norm_config
        in_src_shardings={"input": rep}, in_dst_shardings={"input": act if sp else rep}, out_src_shardings=act)


def deepseek_v3_debug(layers: int = 2, dim: int = 64, n_heads: int = 4, vocab: int = 128, num_experts: int = 8,
                      top_k: int = 3, max_seq_len: int = 64) -> TitanModel:
    """torchtitan's ``deepseek_v3`` ``debugmodel`` flavour (MLA attention with kv LoRA, complex RoPE with
    YaRN scaling, first layer dense, then MoE: softmax router top-3 of 8 experts + 2 shared experts,
    "standard" all-to-all token dispatch, no MTP) at ``layers`` layers and small dimensions."""

    def config(tp: int = 1, sp: bool = False, vocab_parallel: bool = True, ep: int = 1):
        import torchtitan.models.deepseek_v3 as D
        from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
        from torchtitan.models.deepseek_v3.sharding import set_deepseek_v3_sharding_config

        lay = D._build_dsv3_layers(
            n_layers=layers, n_dense_layers=1, dim=dim, n_heads=n_heads, q_lora_rank=0, kv_lora_rank=16,
            qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, mscale=0.70, dense_hidden_dim=128,
            moe_hidden_dim=16, num_experts=num_experts, num_shared_experts=2, router_top_k=top_k,
            router_score_func="softmax", attn_backend="flex", moe_comm_backend="standard",
            non_blocking_capacity_factor=None,
            rope=ComplexRoPE.Config(dim=8, max_seq_len=max_seq_len, theta=10000.0, scaling="yarn", rope_factor=40.0,
                                    beta_fast=32.0, beta_slow=1.0, original_seq_len=4096))
        cfg = D.DeepSeekV3Model.Config(
            vocab_size=vocab, dim=dim,
            tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=D._EMBEDDING_INIT),
            norm=RMSNorm.Config(normalized_shape=dim, param_init=D._NORM_INIT),
            lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=D._output_linear_init(dim)),
            layers=lay, mtp_layers=D._build_mtp_layers(lay[-1], dim=dim, num_mtp_layers=0))
        _sdpa_attention(cfg)
        set_deepseek_v3_sharding_config(cfg, enable_sp=sp, enable_ep=ep > 1)
        if not vocab_parallel:
            _replicated_embedding(cfg, sp)
        return cfg

    return TitanModel("deepseek_v3_debug", config, vocab,
                      dict(layers=layers, dim=dim, n_heads=n_heads, num_experts=num_experts, top_k=top_k))


def qwen3_debug(layers: int = 2, dim: int = 64, n_heads: int = 4, n_kv_heads: int = 2, head_dim: int = 16,
                vocab: int = 128, hidden: int = 128, max_seq_len: int = 64) -> TitanModel:
    """torchtitan's ``qwen3`` ``debugmodel`` flavour (fused QKV, grouped-query attention with per-head q/k
    RMSNorm, cos/sin RoPE, SwiGLU FFN, lm_head tied to the embedding) at ``layers`` layers and small
    dimensions (its own builder ``_build_qwen3_layers`` and sharding ``set_qwen3_sharding_config``)."""

    def config(tp: int = 1, sp: bool = False, vocab_parallel: bool = True, ep: int = 1):
        if ep > 1:
            raise TraceError("qwen3 debugmodel has no experts: ep must be 1", "input")
        import torchtitan.models.qwen3 as Q
        from torchtitan.models.common import CosSinRoPE, Embedding, Linear
        from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config

        cfg = Q.Qwen3Model.Config(
            vocab_size=vocab, dim=dim, norm=Q._qwen3_norm(dim), enable_weight_tying=True,
            tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,
                                            param_init=Q._EMBEDDING_SKIP_INIT),
            lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=Q._LINEAR_INIT),
            layers=Q._build_qwen3_layers(
                fuse_qkv=True, n_layers=layers, dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads,
                head_dim=head_dim, hidden_dim=hidden, attn_backend="flex",
                rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=max_seq_len, theta=1000000.0)))
        _sdpa_attention(cfg)
        set_qwen3_sharding_config(cfg, enable_sp=sp, enable_ep=False)
        if not vocab_parallel:
            _replicated_embedding(cfg, sp)
        return cfg

    return TitanModel("qwen3_debug", config, vocab,
                      dict(layers=layers, dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads, hidden=hidden))


MODELS: dict[str, Callable[..., TitanModel]] = {"llama3-debug": llama3_debug, "deepseek-v3-debug": deepseek_v3_debug,
                                                "qwen3-debug": qwen3_debug}


# ====================================================================== tracing
def _safe(name: str) -> str:
    return name.replace(".", "__")


_AC_WRAPPER = "_checkpoint_wrapped_module."  # the FQN part torchtitan's activation checkpointing inserts


def _clean(name: str) -> str:
    """A parameter's name in the unwrapped model (activation checkpointing wraps each block)."""
    return name.replace(_AC_WRAPPER, "")


def _bind(m, tensors: dict) -> None:
    """Make ``tensors`` the module's parameters and buffers for good (this rank's module is traced once).
    ``functional_call`` restores the originals when the forward returns, but activation checkpointing
    re-runs the block's forward during backward, which must see the traced tensors, not the meta ones."""
    for n, t in tensors.items():
        owner, _, leaf = n.rpartition(".")
        mod = m.get_submodule(owner) if owner else m
        (mod._parameters if leaf in mod._parameters else mod._buffers)[leaf] = t


def _placement(layout, rank: int) -> tuple[dict[str, str], bool]:
    """(plan placement, gradient pending) of a parameter from its torchtitan ``SpmdLayout``: ``Shard(d)``
    on tp or ep (they share the ranks here) -> ``{"tp": "Shard(d)"}``; spmd type R (Replicate) on tp or
    ep -> its gradient is a pending sum over the ranks (spmd_types: the gradient of R is P)."""
    import spmd_types as spmd
    from torchtitan.distributed.parallel_dims import MeshAxisName

    if layout is None:
        return {}, False
    types_ = layout.per_axis_spmd_types()
    ours = [types_.get(a) for a in (MeshAxisName.TP, MeshAxisName.EP) if a in types_]
    shards = [t for t in ours if isinstance(t, spmd.Shard)]
    if len(shards) > 1:
        raise TraceError(f"a parameter sharded over both tp and ep ({types_}): tp and ep share the ranks here", "input")
    pl = {"tp": f"Shard({shards[0].dim % rank})"} if shards else {}
    return pl, any(t is spmd.R for t in ours)


def layouts(m) -> dict:
    """{parameter / buffer name (without the checkpoint wrapper): its torchtitan ``SpmdLayout`` or None}, from the
    ``_sharding_config`` ``Module.parallelize`` applied (spmd_types parameters are plain local shards)."""
    out = {}
    for mn, mod in m.named_modules():
        sc = getattr(mod, "_sharding_config", None)
        if sc is None:
            continue
        for pn, _ in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False)):
            out[_clean(f"{mn}.{pn}" if mn else pn)] = sc.state_shardings.get(pn)
    return out


def trace_titan(model: TitanModel, *, tp: int = 4, sp: bool = True, mesh_context: bool = True, grad_sync: bool = True,
                vocab_parallel: bool = True, ep: int = 1, batch: int = 2, seq: int = 8, name: str | None = None,
                ac: Any = None, **kw) -> dict:
    """Trace ``model`` at degree 1 (logical) and under torchtitan's TP (``sp``: sequence parallel) on a
    ``tp``-rank fake process group into a plan.

    ``mesh_context=False``: the model's forward (and so its backward) runs on every rank without the
    SPMD mesh context -- no collective in the model; the loss still runs in it, and the pending
    gradients are still summed (``grad_sync``: FSDP's job, independent of the mesh context).
    ``ep``: expert parallelism on the same ranks as tp (``ep == tp``, torchtitan's EP borrowing TP).
    ``vocab_parallel=False`` departs from torchtitan's plan at the two vocabulary-sharded ends (a cross-check
    of the transformer layers without the vocab-parallel rules): ``tok_embeddings`` is TP-Replicate and the loss
    all-gathers the ``Shard(-1)`` logits of torchtitan's ``lm_head`` (``spmd_types.all_gather`` to
    Invariant) and takes the plain cross-entropy, instead of torchtitan's vocab-parallel embedding and
    ``_LossParallelCrossEntropy``.  Every transformer layer keeps torchtitan's TP/SP plan.
    ``ac``: a torchtitan activation-checkpointing policy config (``FullAC.Config()``, ...), applied to every
    transformer block after TP as ``parallelize_llama`` does (the backward recomputes the block's forward)."""
    if ep not in (1, tp):
        raise TraceError(f"ep={ep}: expert parallelism runs on the tp ranks here (ep must be 1 or tp={tp})", "input")
    if sp and seq % tp:
        raise TraceError(f"sequence parallelism needs seq ({seq}) divisible by tp ({tp})", "input")
    prepare()
    import spmd_types as spmd
    import torch
    import torch.distributed._functional_collectives as funcol
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.spmd_types import set_current_spmd_mesh, set_spmd_meshes

    from .trace import fake_world

    logical_model = _build(model.config(1, False, True))
    pnames = [n for n, _ in logical_model.named_parameters()]
    shapes = {n: list(p.shape) for n, p in logical_model.named_parameters()}
    bufs = {n: b for n, b in logical_model.named_buffers()}
    for n, b in bufs.items():  # complex RoPE caches travel as their real view [..., 2]
        shapes[n] = list(b.shape) + ([2] if b.is_complex() else [])
    bnames = list(bufs)
    complex_bufs = {n for n, b in bufs.items() if b.is_complex()}

    def build_parallel():
        """torchtitan's meshes (on the fake process group) and ``Module.parallelize``."""
        pd = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=tp, pp=1, ep=ep, world_size=tp,
                          spmd_backend="spmd_types")
        pd.build_mesh()
        m = _build(model.config(tp, sp, vocab_parallel, ep))
        m.parallelize(pd)
        _retie(m)
        if ac is not None:
            ac.build(dump_folder="").apply(m)
        if not vocab_parallel:
            m.tok_embeddings.tp_group = None  # Embedding.parallelize sets it whenever a tp mesh exists
        return m, pd

    # placements from torchtitan's sharding declarations as parallelize() applied them on rank 0,
    # checked against the local shapes it produced
    with fake_world(0, tp):
        m0, _ = build_parallel()
        lay = layouts(m0)
        local0 = {_clean(n): list(t.shape) for n, t in [*m0.named_parameters(), *m0.named_buffers()]}
    placements, pending = {}, []
    for n in pnames + bnames:
        full = shapes[n][:len(local0[n])]  # a complex buffer's real view has a trailing [2]
        pl, pend = _placement(lay.get(n), len(full))
        want = [s // tp if f"Shard({d})" == pl.get("tp") else s for d, s in enumerate(full)]
        if want != local0[n]:
            raise TraceError(f"{n}: local shape {local0[n]} after parallelize() is not {full} under {pl or 'Replicate'}",
                             "input")
        placements[n] = pl
        if pend and n in pnames:
            pending.append(n)

    inputs: dict[str, dict] = {}
    for n in pnames:
        inputs[_safe(n)] = {"shape": shapes[n], "placement": placements[n], "param": True}
    for n in bnames:
        inputs[_safe(n)] = {"shape": shapes[n], "placement": placements[n]}
    inputs["tokens"] = {"shape": [batch, seq], "dtype": "int", "range": model.vocab}
    inputs["labels"] = {"shape": [batch, seq], "dtype": "int", "range": model.vocab}

    def state(kw_):
        st = {n: kw_[_safe(n)] for n in pnames}
        for n in bnames:
            st[n] = torch.view_as_complex(kw_[_safe(n)]) if n in complex_bufs else kw_[_safe(n)]
        return st

    def logical(**kw_):
        pred = torch.func.functional_call(logical_model, state(kw_), (kw_["tokens"],))
        if not vocab_parallel:
            return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), kw_["labels"].flatten(0, 1),
                                                     reduction="sum")
        return cross_entropy_loss(pred, kw_["labels"], global_vocab_size=model.vocab)

    def setup(ctx):
        m, pd = build_parallel()
        real = {_clean(n): n for n, _ in [*m.named_parameters(), *m.named_buffers()]}
        return m, pd, real

    def parallel(ctx, **kw_):
        m, pd, real = ctx.state
        set_spmd_meshes(dense_mesh=pd.spmd_dense_mesh(), sparse_mesh=pd.spmd_sparse_mesh())
        with contextlib.ExitStack() as st:
            if mesh_context and ac is not None:
                # torchtitan's train_context spans forward and backward, and the backward re-runs each
                # checkpointed block's forward: hold the mesh until the next rank (or the end of the trace)
                held.close()
                held.enter_context(set_current_spmd_mesh(pd.spmd_dense_mesh()))
            elif mesh_context:
                st.enter_context(set_current_spmd_mesh(pd.spmd_dense_mesh()))
            if ac is not None:  # the recomputation in backward reads the module's own tensors: bind them
                _bind(m, {real[n]: t for n, t in state(kw_).items()})
                pred = m(kw_["tokens"])
            else:
                pred = torch.func.functional_call(m, state(kw_), (kw_["tokens"],))
        # the loss always runs in the mesh context (torchtitan's loss-parallel CE of the local vocab
        # shard): without it the plain CE would read labels >= V/tp out of range and crash
        with set_current_spmd_mesh(pd.spmd_dense_mesh()):
            if not vocab_parallel:
                full = spmd.all_gather(pred, pd.get_mesh("tp").get_group(), src=spmd.S(pred.dim() - 1), dst=spmd.I)
                return torch.nn.functional.cross_entropy(full.flatten(0, 1).float(), kw_["labels"].flatten(0, 1),
                                                         reduction="sum")
            return cross_entropy_loss(pred, kw_["labels"], global_vocab_size=model.vocab)

    def sync(ctx, grads):
        """What FSDP does for the pending gradients (outside autograd, so not in the trace otherwise)."""
        m, pd, _ = ctx.state
        group = pd.get_mesh("tp").get_group()
        out = dict(grads)
        for n in pending:
            out[_safe(n)] = funcol.all_reduce(grads[_safe(n)], "sum", group)
        return out

    held = contextlib.ExitStack()  # the current rank's mesh context under activation checkpointing
    with funcol_collectives(), held:  # forward and backward (autograd runs after ``parallel`` returns)
        return trace_plan(logical, parallel, inputs=inputs, mesh={"tp": tp}, name=name or model.name,
                          description=kw.pop("description", None) or
                          f"torchtitan {model.name} {model.dims}, TP={tp}{' + SP' if sp else ''}"
                          f"{'' if mesh_context else ', run WITHOUT the SPMD mesh context (no collectives)'}",
                          parallel_setup=setup, grad_sync=sync if (grad_sync and pending) else None, **kw)


# ====================================================================== a job config
def trace_titan_job(job, *, layers: int = 2, mesh_context: bool = True, vocab_parallel: bool = True,
                    model: TitanModel | None = None, **kw) -> dict:
    """Trace what a torchtitan job config (:class:`.titan_config.TitanJob`) asks for.

    * dp_replicate = dp_shard = 1: :func:`trace_titan` -- torchtitan's TP (+ SP, EP) on the ``spmd_types`` backend,
      ``[training] local_batch_size / seq_len`` as the batch, the activation-checkpointing policy applied.
    * dp_shard or dp_replicate > 1: torchtitan's FSDP2 ``fully_shard`` (what ``parallelize_llama`` applies) runs
      its collectives in hooks on flat buffers the trace cannot see (:func:`.dataparallel.check_fully_shard`), so
      the data-parallel axes go through torchtitan's SimpleFSDP instead: graph_trainer's ``apply_simple_fsdp``
      with the job's ``ParallelDims`` (fully_shard / hybrid_shard / replicate, the job's mixed precision) -- see
      :func:`_trace_simple_fsdp_job`.  With ``spmd_backend = "partial_dtensor"`` (torchtitan's DTensor backend),
      torchtitan's own ``parallelize_llama`` -- TP, then FSDP2 ``fully_shard`` -- is traced with FSDP2's hooks
      (:mod:`.titan_fsdp2`).

    ``model``: instead of ``MODELS[job.model](layers=layers)`` (examples/torch/tp_titan_qwen3.py: a mutated plan)."""
    from .titan_config import check_supported

    check_supported(job)
    d = job.degrees
    model = model or MODELS[job.model](layers=layers)
    note = "; ".join(job.notes)
    desc = (f"torchtitan {model.name} {model.dims} from {os.path.basename(job.path)}: "
            + ", ".join(f"{k}={v}" for k, v in d.items() if v > 1) + (f" ({note})" if note else ""))
    if all(n == 1 for n in d.values()):
        raise TraceError(f"{job.path}: every parallelism degree is 1 (one device): there is no parallel program to "
                         f"verify", "input")
    if d["pp"] > 1:  # torchtitan's pipeline_llm, traced by tvcert.frontends.pipelining (pp alone)
        if not (mesh_context and vocab_parallel) or kw.keys() - {"name"}:
            raise TraceError("--no-mesh-context / --replicated-vocab are options of the TP route", "input")
        from .pipelining import trace_titan_pp_job

        return trace_titan_pp_job(job, model, desc, name=kw.pop("name", None))
    if d["cp"] > 1:  # torchtitan's apply_cp_to_forward on its DTensor backend (frontends/titan_cp.py)
        if not (mesh_context and vocab_parallel):
            raise TraceError("--no-mesh-context / --replicated-vocab are options of the TP route", "input")
        from .titan_cp import trace_titan_cp_job

        return trace_titan_cp_job(job, model, desc, **kw)
    if d["dp_replicate"] == d["dp_shard"] == 1:
        tp = d["tp"]
        return trace_titan(model, tp=tp, sp=job.parallelism.enable_sequence_parallel and tp > 1, ep=d["ep"],
                           batch=job.training.local_batch_size, seq=job.training.seq_len, ac=job.ac,
                           mesh_context=mesh_context, vocab_parallel=vocab_parallel,
                           name=kw.pop("name", None) or f"{model.name}_{os.path.splitext(os.path.basename(job.path))[0]}",
                           description=desc, **kw)
    if not (mesh_context and vocab_parallel):
        raise TraceError("--no-mesh-context / --replicated-vocab are options of the TP route (data-parallel degrees "
                         "are 1)", "input")
    if job.parallelism.spmd_backend == "partial_dtensor":  # torchtitan's parallelize_llama: TP, then FSDP2
        from .titan_fsdp2 import trace_titan_fsdp2_job

        return trace_titan_fsdp2_job(job, model, desc, **kw)
    return _trace_simple_fsdp_job(job, model, desc, **kw)


@contextlib.contextmanager
def _plan_order_world(plan: dict, titan: dict):
    """While ``ParallelDims.build_mesh`` runs: its world mesh lists the ranks so that torchtitan's mesh coordinate
    (``titan``'s axes, row-major: dp_replicate, fsdp, tp) sits on the rank the plan (``plan``'s axes, row-major)
    gives the same coordinates.  Only the numbering of the ranks changes (torchtitan reaches ranks through its
    meshes only); it lets the plan nest tp outside fsdp, as FSDP's ``_StridedShard`` of a TP shard nests them."""
    import torch
    import torch.distributed.device_mesh as dmm
    import torchtitan.distributed.parallel_dims as pdm
    from torch.distributed._mesh_layout import _MeshLayout

    from .trace import coords_of, rank_of

    names, sizes = list(titan), list(titan.values())
    order = []
    for i in range(math.prod(sizes)):
        c = dict(zip(names, coords_of(i, sizes)))
        order.append(rank_of([c[a] for a in plan], list(plan.values())))

    def world_mesh(device_type, shape, mesh_dim_names=None):
        return dmm.DeviceMesh(device_type, _layout=_MeshLayout.from_sizes_strides(tuple(shape)),
                              _rank_map=torch.tensor(order, dtype=torch.int), mesh_dim_names=mesh_dim_names)

    old = pdm.init_device_mesh
    pdm.init_device_mesh = world_mesh
    try:
        yield
    finally:
        pdm.init_device_mesh = old


def _trace_simple_fsdp_job(job, model: TitanModel, desc: str, **kw) -> dict:
    """dp_replicate x dp_shard (x tp) through torchtitan's SimpleFSDP, traced by
    :func:`.dataparallel.trace_simple_fsdp_plan`.  On every rank: the job's ``ParallelDims`` (``partial_dtensor``
    backend: DTensor TP, the legacy ``dp_replicate`` / ``fsdp`` / ``tp`` meshes) built on the fake process group,
    torchtitan's ``Module.parallelize`` when tp > 1, then graph_trainer's ``apply_simple_fsdp``.  The loss is
    torchtitan's ``cross_entropy_loss`` (a sum) over the global token count, so the summed (reduce-scattered)
    gradients are the single-device ones; read back ``Partial(sum)`` over the data-parallel axes."""
    from .dataparallel import trace_simple_fsdp_plan

    d = job.degrees
    if job.ac is not None:
        raise TraceError(f"{job.path}: activation_checkpoint.mode = {job.ac_mode!r} with data parallelism: the "
                         f"SimpleFSDP route binds the traced parameters per call (functional_call), and a "
                         f"checkpointed block's recomputation in backward would read the module's own tensors",
                         "unsupported", "activation_checkpoint")
    if d["ep"] > 1:
        raise TraceError(f"{job.path}: expert_parallel_degree with data parallelism is not traced", "unsupported",
                         "expert_parallel_degree")
    prepare()
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.distributed import utils as du
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.experiments.graph_trainer.common_utils import apply_simple_fsdp

    rep, shard, tp = d["dp_replicate"], d["dp_shard"], d["tp"]
    # tp first: FSDP shards a TP-sharded dim inside TP's blocks (_StridedShard), which a plan expresses by
    # nesting tp outside fsdp (see _plan_order_world)
    mesh = {a: n for a, n in (("tp", tp), ("dp_replicate", rep), ("fsdp", shard)) if n > 1}
    b, s = job.training.local_batch_size * rep * shard, job.training.seq_len

    def make():
        return _retie(_build(model.config(1, False, True)).to_empty(device="cpu"))

    def parallelize(m, _dm):
        pd = ParallelDims(dp_replicate=rep, dp_shard=shard, cp=1, tp=tp, pp=1, ep=1, world_size=rep * shard * tp,
                          spmd_backend="partial_dtensor")
        with _plan_order_world(mesh, {"dp_replicate": rep, "fsdp": shard, "tp": tp}):
            pd.build_mesh()
        if tp > 1:
            m = _build(model.config(tp, job.parallelism.enable_sequence_parallel, True)).to_empty(device="cpu")
            m.parallelize(pd)
            _retie(m)
        m = apply_simple_fsdp(m, parallel_dims=pd, training=job.training)
        if getattr(m, "enable_weight_tying", False):  # data_parallel registers a new parameter per module: tie again
            emb, head = m.tok_embeddings._parameters["weight"], m.lm_head._parameters["weight"]
            if emb.shape != head.shape or emb.placements != head.placements:
                raise TraceError(f"{job.path}: tied tok_embeddings / lm_head weights sharded differently under "
                                 f"SimpleFSDP ({emb.placements} vs {head.placements})", "unsupported")
            m.tok_embeddings._parameters["weight"] = head
        return m

    def loss_fn(pred, tokens, labels):
        return cross_entropy_loss(pred, labels, global_vocab_size=model.vocab) / (b * s)

    ids = {"shape": [b, s], "dtype": "int", "range": model.vocab,
           "placement": {a: "Shard(0)" for a in mesh if a != "tp"}}
    du.set_spmd_backend("partial_dtensor")
    try:
        return trace_simple_fsdp_plan(make, parallelize, loss_fn, data={"tokens": ids, "labels": ids}, mesh=mesh,
                                      name=kw.pop("name", None) or f"{model.name}_"
                                      f"{os.path.splitext(os.path.basename(job.path))[0]}", description=desc, **kw)
    finally:
        du.set_spmd_backend("spmd_types")
