"""Megatron-core's VocabParallelEmbedding -> ColumnParallelLinear output layer -> vocab_parallel_cross_entropy.

The embedding table and the output layer are split over the vocabulary; each rank looks up the ids in its own
vocabulary range (masking the others) and all-reduces, and the cross-entropy works on vocabulary-sharded logits
(all-reduced max, sum of exps and target logit), all from megatron-core's own code.

    tvcert trace examples/torch/mcore_vocab.py --set head=embedding --verify   # VERIFIED
    tvcert trace examples/torch/mcore_vocab.py --verify                        # VERIFIED
    tvcert trace examples/torch/mcore_vocab.py --set bug=ce_wrong_rank --verify  # REFUTED
"""
import contextlib

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

    bug = getattr(model, "tvcert_ce_bug", "")
    with CE_BUGS[bug]() if bug else contextlib.nullcontext():
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


@contextlib.contextmanager
def _ce_wrong_rank():
    """A bug: the cross-entropy takes the vocabulary range of the next rank (its vocab_start_index is another
    rank's), while the output layer holds this rank's block."""
    from megatron.core.parallel_state import get_tensor_model_parallel_world_size
    from megatron.core.tensor_parallel import cross_entropy as ce

    rank = ce.get_tensor_model_parallel_rank
    ce.get_tensor_model_parallel_rank = lambda: (rank() + 1) % get_tensor_model_parallel_world_size()
    try:
        yield
    finally:
        ce.get_tensor_model_parallel_rank = rank


@contextlib.contextmanager
def _ce_no_allreduce():
    """A bug: the cross-entropy's all_reduce of the predicted (target) logits is left out (each rank keeps the
    logit of the targets in its own block, 0 for the others), the max's and the sum of exps' kept."""
    import torch
    from megatron.core.tensor_parallel import cross_entropy as ce

    class Dist:  # torch.distributed as cross_entropy.py sees it: the first SUM all_reduce of the forward dropped
        dropped = False

        def __getattr__(self, k):
            return getattr(torch.distributed, k)

        def all_reduce(self, t, op=None, group=None, async_op=False):
            if op == torch.distributed.ReduceOp.SUM and not self.dropped:
                self.dropped = True
                return None
            return torch.distributed.all_reduce(t, op=op, group=group, async_op=async_op)

    class Torch:
        distributed = Dist()

        def __getattr__(self, k):
            return getattr(torch, k)

    ce.torch = Torch()
    try:
        yield
    finally:
        ce.torch = torch


CE_BUGS = {"ce_wrong_rank": _ce_wrong_rank, "ce_no_allreduce": _ce_no_allreduce}


def _mark(bug):
    """Mark the parallel model with a cross-entropy bug, applied by :func:`loss` while the forward runs (so the
    logical model and other programs traced in this process keep Megatron's own code)."""
    def edit(model):
        model.tvcert_ce_bug = bug
    return edit


BUGS = {"off_by_one": _off_by_one, **{b: _mark(b) for b in CE_BUGS}}


def tvcert_trace(tp: int = 2, head: str = "cross_entropy", bug: str = ""):
    """head: "cross_entropy" (Megatron's vocab_parallel_cross_entropy on the output layer's logits) or
    "embedding" (a squared loss on the VocabParallelEmbedding's output alone).  bug: "" | "off_by_one" (the
    embedding) | "ce_wrong_rank" | "ce_no_allreduce" (the cross-entropy; see the functions above).

    Megatron picks the target logit as ``logits.view(-1, V/tp)[arange(N), masked_target_1d]`` (cross_entropy.py:59),
    a row-wise gather (frontends/aten.py ``_index_rows``), and its backward subtracts ``1 - mask`` there; the engine
    proves both against the same code at tp = 1 (kernel/vocab_pick.py, Rules/VocabPick.v)."""
    from tvcert.frontends.megatron_core import trace_megatron

    if head not in ("cross_entropy", "embedding"):
        raise ValueError(f"head {head!r}: cross_entropy or embedding")
    if bug and bug not in BUGS:
        raise ValueError(f"bug {bug!r}: one of {sorted(BUGS)}")
    data = {"ids": {"shape": [B, S], "dtype": "int", "range": V},
            "target": {"shape": [B, S], "dtype": "int", "range": V}}
    if head == "embedding":
        data.pop("target")
    return trace_megatron(*((build, loss) if head == "cross_entropy" else (build_embedding, embedding_loss)),
                          data=data, tp=tp, edit=BUGS.get(bug),
                          config_kw={"hidden_size": H}, name=f"mcore_vocab_{head}_tp{tp}{'_' + bug if bug else ''}")
