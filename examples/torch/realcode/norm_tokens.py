"""Token-count normalisation across data-parallel ranks, for `tvcert trace`.

A language-model loss is the sum of the per-token losses over the non-padding tokens divided by the number
of those tokens.  With the batch sharded over dp, the ranks hold different numbers of real tokens, so each
rank divides its loss sum by the *global* token count (all_reduce-summed), and the gradients are then
all_reduce-*summed* (what torchtitan and Megatron do with a global token count).  The local losses are a
Partial(sum) of the single-device loss.  Bugs:

* ``local_count``: each rank divides by its own token count and the gradients are averaged -- the mean of
  per-rank means, wrong whenever the ranks hold different numbers of real tokens (unequal shards);
* ``avg_grads``: global count, but the gradients averaged instead of summed (p times too small);
* ``no_count_reduce``: the local count used as if it were global, gradients summed;
* ``gather_mean`` (with ``count_by=gather``): the gathered per-rank counts averaged instead of summed.

``count_by=gather``: the global count is built from an all_gather of the per-rank counts and a sum (partial
statistics gathered, then combined) instead of an all_reduce.

Run:  tvcert trace examples/torch/realcode/norm_tokens.py -o plan.json --verify --set bug=local_count
"""
import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

B, S, D, V = 4, 3, 4, 6  # batch, sequence, hidden, vocab; label 0 is padding
PAD = 0


def token_loss_sum(h, w, labels):
    logits = h @ w
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum", ignore_index=PAD)


def count(labels):
    return (labels != PAD).sum()


def logical(h, w, labels):
    return token_loss_sum(h, w, labels) / count(labels)


def make_parallel(bug: str, gather: bool):
    def parallel(ctx, h, w, labels):
        dp = ctx.group("dp")
        n = count(labels)
        if gather:  # every rank's count gathered into a [dp] vector, then summed (or, the bug, averaged)
            counts = funcol.all_gather_tensor(n.unsqueeze(0), 0, dp)
            n = counts.float().mean() if bug == "gather_mean" else counts.sum()
        elif bug not in ("local_count", "no_count_reduce"):
            n = funcol.all_reduce(n, "sum", dp)
        return token_loss_sum(h, w, labels) / n

    return parallel


def make_sync(bug: str):
    def grad_sync(ctx, grads):
        how = "avg" if bug in ("local_count", "avg_grads") else "sum"
        return {k: funcol.all_reduce(g, how, ctx.group("dp")) for k, g in grads.items()}

    return grad_sync


def tvcert_trace(bug: str = "", dp: int = 2, count_by: str = "all_reduce"):
    inputs = {
        "h": {"shape": [B, S, D], "placement": {"dp": "Shard(0)"}},
        "w": {"shape": [D, V], "param": True},
        "labels": {"shape": [B, S], "dtype": "int", "range": V, "placement": {"dp": "Shard(0)"}},
    }
    placement = "Partial(avg)" if bug == "local_count" else "Partial(sum)"
    return dict(logical=logical, parallel=make_parallel(bug, count_by == "gather"), grad_sync=make_sync(bug), inputs=inputs,
                mesh={"dp": dp}, output_placements={"loss": {"dp": placement}},
                name=f"norm_tokens_{count_by}{'_' + bug if bug else ''}")
