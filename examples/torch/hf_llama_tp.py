"""Hugging Face transformers tiny Llama with its built-in tensor-parallel plan (`tp_plan`), for `tvcert trace`.

The model is `LlamaForCausalLM(LlamaConfig(...))` with small dimensions and random weights (no hub
download).  The parallel version is what `from_pretrained(..., distributed_config=DistributedConfig(tp_size=W))`
applies after model init: the model's own plan (`base_model_tp_plan` + `lm_head: colwise_gather_output`
+ `embed_tokens: embedding_rowwise`), resolved per layer by `model._resolve_parallel_plans` and applied
by `transformers.distributed.tensor_parallel.apply_tensor_parallelism` on the "tp" mesh.

    tvcert trace examples/torch/hf_llama_tp.py --verify
    tvcert trace examples/torch/hf_llama_tp.py --set tp_plan='{"model.layers.*.mlp.down_proj": "colwise"}' --verify
    tvcert trace examples/torch/hf_llama_tp.py --set vocab_parallel=true --verify   # UNKNOWN, see tvcert_trace

Tested with transformers==5.24.0 (torch 2.13.0).
"""
import torch

V, H, F, NH, NKV, L = 32, 16, 32, 4, 4, 2
B, S = 2, 4


def config(layers: int = L):
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=F, num_attention_heads=NH,
                      num_key_value_heads=NKV, num_hidden_layers=layers, max_position_embeddings=64,
                      tie_word_embeddings=False, use_cache=False)
    cfg._attn_implementation = "eager"
    return cfg


def make_model(layers: int = L):
    from transformers import LlamaForCausalLM

    class CausalLlama(LlamaForCausalLM):
        """`LlamaForCausalLM` called with a ready 4-D causal mask.  With no mask, transformers' training
        path probes `position_ids` for packed sequences (a `cumsum` and indexing the tracer has no IR
        for); a 4-D mask is used as-is.  Same numbers: -1e4 vanishes in the softmax like -inf."""

        def forward(self, input_ids):
            b, s = input_ids.shape
            mask = torch.full((s, s), -1e4).triu(1)[None, None].expand(b, 1, s, s)
            return super().forward(input_ids=input_ids, attention_mask=mask)

    torch.manual_seed(0)
    return CausalLlama(config(layers)).float()


def parallelize(model, device_mesh, tp_plan=None):
    """What `from_pretrained(distributed_config=DistributedConfig(tp_size=...))` does to the model."""
    from transformers.distributed import DistributedConfig
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    tp = device_mesh.size()
    dc = DistributedConfig(tp_size=tp, tp_plan=tp_plan) if tp_plan else DistributedConfig(tp_size=tp)
    plan, _, _ = model._resolve_parallel_plans(dc)
    return apply_tensor_parallelism(model, device_mesh, plan)


def loss_fn(out, input_ids, labels):
    logits = out.logits if hasattr(out, "logits") else out[0]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1))


def tvcert_trace(tp: int = 2, layers: int = L, tp_plan=None, vocab_parallel: bool = False):
    """``vocab_parallel=False`` overrides the one rule transformers adds on its own (``embed_tokens:
    embedding_rowwise``) with ``replicate``: the vocab-parallel embedding traces and the reference
    interpreter agrees, but its rank-dependent shard offsets (const / add_scalar = rank.tp*V/tp) have
    no engine rule yet, so that plan is UNKNOWN."""
    from tvcert.frontends.dtensor import trace_module_plan

    if not vocab_parallel:
        tp_plan = {"model.embed_tokens": "replicate", **(tp_plan or {})}

    return trace_module_plan(lambda: make_model(layers), lambda m, mesh: parallelize(m, mesh, tp_plan), loss_fn,
                             data={"input_ids": {"shape": [B, S], "dtype": "int", "range": V},
                                   "labels": {"shape": [B, S], "dtype": "int", "range": V}},
                             mesh={"tp": tp}, name="hf_llama_tp")
