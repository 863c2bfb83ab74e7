"""A Megatron-core TransformerLayer built from megatron-core's own local (non-Transformer-Engine) GPT layer spec.

Pre-norm attention (fused QKV ColumnParallelLinear, causal DotProductAttention, RowParallelLinear projection) and
MLP (ColumnParallelLinear fc1 -> GeLU -> RowParallelLinear fc2) with residuals, Megatron's [seq, batch, hidden]
layout; under sequence parallelism the norms and residuals run on sequence shards and Megatron's
`finalize_model_grads` all-reduces the layer-norm gradients (parameters marked `sequence_parallel`).

    tvcert trace examples/torch/mcore_layer.py --verify                     # TP=2: VERIFIED
    tvcert trace examples/torch/mcore_layer.py --set sp=true --verify       # TP=2 + SP: VERIFIED
    tvcert trace examples/torch/mcore_layer.py --set sp=true --set bug=ln_not_marked --verify   # REFUTED
    tvcert trace examples/torch/mcore_layer.py --set sp=true --set bug=no_finalize --verify     # REFUTED
    tvcert trace examples/torch/mcore_layer.py --set b=2 [--set sp=true] --verify   # micro-batch 2: VERIFIED
    tvcert trace examples/torch/mcore_layer.py --set tp=4 [--set sp=true] --verify  # one head per rank: VERIFIED

Under SP the layer-norm gradients reach ``finalize_model_grads`` as one coalesced buffer (concat, all_reduce,
slices), read back by the equality step ``slice_concat_operand``; the refuted bugs are named by the outputs that
differ (the layer-norm gradients, and under no_finalize also the row-parallel biases' gradients).
"""
S, H, NH, F = 4, 8, 4, 16


def build(config):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module

    return build_module(get_gpt_layer_local_spec(), config=config, layer_number=1)


def loss(layer, x, target):
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    y, _ = layer(x, attention_mask=None)
    local = 0.5 * ((y - target) ** 2).sum()
    return reduce_from_tensor_model_parallel_region(local) if layer.config.sequence_parallel else local


def _unmark_layernorms(layer):
    """The historical bug: layer-norm weights under SP not marked `sequence_parallel`, so finalize_model_grads
    leaves their gradients as per-rank partial sums."""
    for n, p in layer.named_parameters():
        if "layernorm" in n and hasattr(p, "sequence_parallel"):
            del p.sequence_parallel


def tvcert_trace(tp: int = 2, sp: bool = False, bug: str = "", b: int = 1):
    """bug: "" | "ln_not_marked" (see _unmark_layernorms) | "no_finalize" (finalize_model_grads not run).

    b: micro-batch size.  At b = 1 the QKV projection's ``_unsafe_view [S*1, 3H/tp] -> [S, 1, 3H/tp]``
    (layers.py:488) is read on the logical program's shape [S, 1, 3H], not as a shard of the size-1 batch dim.  At
    b > 1 Megatron's core attention merges batch and heads ([sq, b, np, hn] -> [sq, b*np, hn],
    dot_product_attention.py:184) with the heads split over tp: each rank's part of the merged dim is b blocks,
    the shard of an interleave of the logical merge (kernel/interleave_reshape.py), followed through the batched
    matmuls and split back.  tp = 4 (one head per rank at these sizes, b = 1): VERIFIED, with and without SP -- the
    rank's [1, 1, sq, hn] context is placed as a shard of [np, 1, sq, hn] where the logical graph views [1, np, sq,
    hn], and the merge that follows reads the same index everywhere (equality step layout_map_equal)."""
    from tvcert.frontends.megatron_core import trace_megatron

    if bug not in ("", "ln_not_marked", "no_finalize"):
        raise ValueError(f"unknown bug {bug!r}")
    seq = {"tp": "Shard(0)"} if sp else {}
    data = {"x": {"shape": [S, b, H], "placement": seq}, "target": {"shape": [S, b, H], "placement": seq}}
    return trace_megatron(build, loss, data=data, tp=tp, sp=sp, finalize=bug != "no_finalize",
                          edit=_unmark_layernorms if bug == "ln_not_marked" else None,
                          config_kw={"hidden_size": H, "num_attention_heads": NH, "ffn_hidden_size": F},
                          name=f"mcore_layer_tp{tp}_b{b}{'_sp' if sp else ''}{'_' + bug if bug else ''}")
