"""Sequence parallelism with the shards gathered as a stack, functional collectives, for `tvcert trace`.

The sequence [T, H] is sharded over tp (each rank holds T/tp tokens).  Before a token-mixing layer the code
gathers the shards by stacking them -- ``all_gather_tensor(x.unsqueeze(0), 0)`` gives [tp, T/tp, H] -- and
flattens the stack back to the sequence: an all_gather along a dim other than the sharded one, read as a
layout of the logical tensor.  The layer mixes tokens (``m @ x``: every output token reads every input token),
so a wrong order of tokens changes the result.

    tvcert trace examples/torch/realcode/layout_gather_stack.py --verify                         # VERIFIED
    tvcert trace examples/torch/realcode/layout_gather_stack.py --set bug=stack_inner --verify   # REFUTED

``bug``: ``stack_inner`` (stacked along dim 1, ``x.unsqueeze(1)`` gathered along 1, then flattened: the
tokens of the ranks interleave), ``reversed`` (the stack flipped over the ranks before flattening).
"""
import torch
import torch.distributed._functional_collectives as funcol

T, H, F = 8, 4, 6


class _Gather(torch.autograd.Function):
    """Stack the ranks' shards along dim ``dim`` of ``x.unsqueeze(dim)``; backward: the rank's own slice."""

    @staticmethod
    def forward(ctx, x, dim, group, rank):
        ctx.dim, ctx.rank = dim, rank
        return funcol.all_gather_tensor(x.unsqueeze(dim).contiguous(), dim, group)

    @staticmethod
    def backward(ctx, g):
        return g.select(ctx.dim, ctx.rank), None, None, None


def layer(x, m, w):
    return torch.tanh(m @ x @ w)


def logical(x, m, w, target):
    return ((layer(x, m, w) - target) ** 2).sum()


def make_sp(bug=""):
    def parallel(ctx, x, m, w, target):
        tp, r = ctx.group("tp"), ctx.coord("tp")
        if bug == "stack_inner":
            full = _Gather.apply(x, 1, tp, r).flatten(0, 1)
        else:
            st = _Gather.apply(x, 0, tp, r)
            full = (st.flip(0) if bug == "reversed" else st).flatten(0, 1)
        return ((layer(full, m, w) - target) ** 2).sum()
    return parallel


def tvcert_trace(tp: int = 2, bug: str = "", dtype: str = "float64"):
    if bug not in ("", "stack_inner", "reversed"):
        raise ValueError(f"unknown bug {bug!r}")
    f = {"dtype": dtype}
    inputs = {"x": {"shape": [T, H], "placement": {"tp": "Shard(0)"}, **f}, "m": {"shape": [T, T], **f},
              "w": {"shape": [H, F], "param": True, **f}, "target": {"shape": [T, F], **f}}
    return dict(logical=logical, parallel=make_sp(bug), inputs=inputs, mesh={"tp": tp},
                name=f"layout_gather_stack_tp{tp}{'_' + bug if bug else ''}")
