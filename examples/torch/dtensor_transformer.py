"""PyTorch's own DTensor test `Transformer` with its own `Transformer.parallelize`, unmodified.

`torch.testing._internal.distributed._tensor.common_dtensor` (needs `pip install expecttest`): token + position
embeddings (vocab-parallel `RowwiseParallel`), LayerNorm, causal SDPA attention, GELU MLP, weight-tied output
(`ColwiseParallel`, gathered).  Only the model arguments are chosen here: small sizes and dropout 0 (dropout is
random: UNKNOWN).  The loss is the mean cross-entropy of the (replicated) logits.

    tvcert trace examples/torch/dtensor_transformer.py --verify                      # tp=2, no SP
    tvcert trace examples/torch/dtensor_transformer.py --set tp=4 --set sp=true --verify
    tvcert trace examples/torch/dtensor_transformer.py --set sp=true --set bug=no_sequence_parallel --verify

``bug="no_sequence_parallel"`` is the plan with sequence parallelism but without the `SequenceParallel` style on
every block's `ffn_norm`: the norm then runs on the local sequence shard (the same numbers) but its weight's
gradient is only this rank's tokens' part and is never summed -- REFUTED at that gradient.
"""
import torch

ARGS = dict(n_layers=1, vocab_size=8, max_seq_len=8, dim=16, n_heads=4, dropout_p=0.0)
B, S = 2, 4


def make_model():
    from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer

    torch.manual_seed(0)
    return Transformer(ModelArgs(**ARGS))


def loss_fn(out, tokens, labels):
    return torch.nn.functional.cross_entropy(out.reshape(-1, ARGS["vocab_size"]), labels.reshape(-1))


def parallelize(model, mesh, sp: bool, bug: str | None = None):
    from torch.testing._internal.distributed._tensor.common_dtensor import Transformer

    if bug not in (None, "no_sequence_parallel") or (bug and not sp):
        raise ValueError(f"bug={bug!r}: the only bug is 'no_sequence_parallel' (with sp=True)")
    model = Transformer.parallelize(model, mesh, use_seq_parallel=sp)
    if bug:  # undo SequenceParallel on each ffn_norm: hooks removed, plain (replicated) parameters
        for layer in model.layers:
            norm = layer.ffn_norm
            norm._forward_pre_hooks.clear()
            norm._forward_hooks.clear()
            for n, p in list(norm.named_parameters(recurse=False)):
                norm.register_parameter(n, torch.nn.Parameter(p.to_local()))
    return model


def tvcert_trace(tp: int = 2, sp: bool = False, bug: str | None = None, optimizer: str | None = None):
    """``optimizer="adamw"``: one ``torch.optim.AdamW`` step after the backward, on both sides (the parallel one on
    the DTensor shards); outputs the loss, every parameter after the step and AdamW's ``exp_avg`` / ``exp_avg_sq``
    (sharded like their parameter)."""
    from tvcert.frontends.dtensor import trace_module_plan

    kw = {}
    if optimizer is not None:
        from tvcert.frontends.dataparallel import optimizer_step

        if optimizer != "adamw":
            raise ValueError(f"optimizer={optimizer!r}: only 'adamw'")
        kw["train_step"] = optimizer_step(lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=False),
                                          state=True)
    tok = {"shape": [B, S], "dtype": "int", "range": ARGS["vocab_size"]}
    return trace_module_plan(make_model, lambda m, mesh: parallelize(m, mesh, sp, bug), loss_fn,
                             data={"tokens": tok, "labels": dict(tok)}, mesh={"tp": tp},
                             name=f"dtensor_transformer_tp{tp}{'_sp' if sp else ''}{'_' + bug if bug else ''}"
                                  f"{'_' + optimizer if optimizer else ''}", **kw)
