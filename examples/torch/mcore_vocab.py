"""Megatron-core's VocabParallelEmbedding -> ColumnParallelLinear output layer -> vocab_parallel_cross_entropy.

The embedding table and the output layer are split over the vocabulary; each rank looks up the ids in its own
vocabulary range (masking the others) and all-reduces, and the cross-entropy works on vocabulary-sharded logits
(all-reduced max, sum of exps and target logit), all from megatron-core's own code.

    tvcert trace examples/torch/mcore_vocab.py --set head=embedding --verify   # VERIFIED
    tvcert trace examples/torch/mcore_vocab.py --verify                        # UNKNOWN (see tvcert_trace)
"""
S, B, H, V = 4, 2, 8, 16


def build(config):
    import torch
    from megatron.core.tensor_parallel import ColumnParallelLinear, VocabParallelEmbedding
    from megatron.core.transformer.module import MegatronModule

    class LM(MegatronModule):
        def __init__(self):
            super().__init__(config)
            self.embedding = VocabParallelEmbedding(V, H, init_method=config.init_method, config=config)
            self.output_layer = ColumnParallelLinear(H, V, config=config, init_method=config.init_method,
                                                     bias=False, gather_output=False)

        def forward(self, ids):
            h = self.embedding(ids)                    # [b, s, h]
            logits, _ = self.output_layer(torch.tanh(h))
            return logits

    return LM()


def loss(model, ids, target):
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    return vocab_parallel_cross_entropy(model(ids), target).sum()


def build_embedding(config):
    from megatron.core.tensor_parallel import VocabParallelEmbedding
    from megatron.core.transformer.module import MegatronModule

    class Emb(MegatronModule):
        def __init__(self):
            super().__init__(config)
            self.embedding = VocabParallelEmbedding(V, H, init_method=config.init_method, config=config)

    return Emb()


def embedding_loss(model, ids):
    """The embedding alone: a squared loss of the looked-up rows."""
    y = model.embedding(ids)
    return 0.5 * (y * y).sum()


def _off_by_one(model):
    """A bug: each rank's vocabulary range ends one id early (its last row is masked out)."""
    model.embedding.vocab_end_index -= 1


def tvcert_trace(tp: int = 2, head: str = "cross_entropy", bug: str = ""):
    """head: "cross_entropy" (Megatron's vocab_parallel_cross_entropy on the output layer's logits) or
    "embedding" (a squared loss on the VocabParallelEmbedding's output alone).  bug: "" | "off_by_one".

    The cross-entropy is UNKNOWN today: Megatron picks the target logit as ``logits.view(-1, V/tp)[arange(N),
    target_1d]`` on flattened tokens, which the converter lowers to an index_select on the logits flattened to
    one dim (cross_entropy.py:59, a vocab-sharded dim merged into it, no Shard placement), and the engine's
    ``vocab_parallel_embedding`` pattern knows the picked logit only as a ``gather`` on the token shape."""
    from tvcert.frontends.megatron_core import trace_megatron

    if head not in ("cross_entropy", "embedding"):
        raise ValueError(f"head {head!r}: cross_entropy or embedding")
    data = {"ids": {"shape": [B, S], "dtype": "int", "range": V}, "target": {"shape": [B, S], "dtype": "int", "range": V}}
    if head == "embedding":
        data.pop("target")
    return trace_megatron(*((build, loss) if head == "cross_entropy" else (build_embedding, embedding_loss)),
                          data=data, tp=tp, edit=_off_by_one if bug == "off_by_one" else None,
                          config_kw={"hidden_size": H}, name=f"mcore_vocab_{head}_tp{tp}{'_' + bug if bug else ''}")
