"""Global token count over -100-padded labels under data parallelism, for `tvcert trace`.

Real batches are padded: the collator fills short sequences with cross-entropy's ignore index (-100), and the loss
is the sum of the per-token losses over the real tokens divided by their number.  With the batch sharded over dp
the ranks hold different numbers of real tokens, so each rank divides its loss sum by the *global* count
``n = all_reduce(sum(labels != -100))`` (torchtitan's global token count, Megatron's ``num_tokens``): ``n`` is a
0-d tensor, the same real number on every rank, and autograd carries ``1/n`` into every gradient.  The gradients
are then all_reduce-summed (``sync=sum``), or, as with DDP, averaged after the loss is scaled by dp
(``sync=avg``).  The labels' range is not declared: tvcert infers [-100, V) from cross-entropy's ignore index,
so padded witnesses are drawn.  Bugs (each differs from single-device whenever the ranks hold different numbers of
real tokens, numerically confirmed in tests/test_scalar_factor.py):

* ``local_count``: each rank divides by its own count of real tokens and the gradients are averaged (the mean of
  per-rank means);
* ``no_count_reduce``: the local count used as if it were global, gradients summed;
* ``avg_grads``: the global count, but the gradients averaged without the dp scale (dp times too small).

Run:  tvcert trace examples/torch/realcode/norm_padded_tokens.py -o plan.json --verify --set bug=local_count
"""
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

B, S, D, V = 4, 3, 4, 5  # batch, sequence, hidden, vocab; -100 is padding


def token_loss_sum(h, w, labels):
    return F.cross_entropy((h @ w).flatten(0, 1), labels.flatten(), reduction="sum")


def count(labels):
    return (labels != -100).sum()


def logical(h, w, labels):
    return token_loss_sum(h, w, labels) / count(labels)


def make_parallel(bug: str, sync: str, dp: int):
    def parallel(ctx, h, w, labels):
        n = count(labels)
        if bug not in ("local_count", "no_count_reduce"):
            n = funcol.all_reduce(n, "sum", ctx.group("dp"))
        loss = token_loss_sum(h, w, labels) / n
        return loss * dp if sync == "avg" and bug != "avg_grads" else loss

    return parallel


def make_sync(bug: str, sync: str):
    how = "avg" if bug in ("local_count", "avg_grads") or sync == "avg" else "sum"

    def grad_sync(ctx, grads):
        return {k: funcol.all_reduce(g, how, ctx.group("dp")) for k, g in grads.items()}

    return grad_sync


def tvcert_trace(bug: str = "", dp: int = 2, sync: str = "sum"):
    inputs = {
        "h": {"shape": [B, S, D], "placement": {"dp": "Shard(0)"}},
        "w": {"shape": [D, V], "param": True},
        "labels": {"shape": [B, S], "dtype": "int", "placement": {"dp": "Shard(0)"}},
    }
    placement = "Partial(avg)" if bug == "local_count" or (sync == "avg" and bug != "avg_grads") else "Partial(sum)"
    return dict(logical=logical, parallel=make_parallel(bug, sync, dp), grad_sync=make_sync(bug, sync), inputs=inputs,
                mesh={"dp": dp}, output_placements={"loss": {"dp": placement}},
                name=f"norm_padded_tokens_{sync}{'_' + bug if bug else ''}")
