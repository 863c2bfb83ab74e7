"""Uneven shards padded to a common size before a collective (issue 15 §2 "pad whose pads depend on the rank",
§2 / §3 uneven shards), for `tvcert trace`.

A dim T not divisible by tp is split as ``torch.tensor_split`` does (the first ``T % tp`` ranks one row more);
each rank computes a row-wise layer on its rows, pads them to ``ceil(T / tp)`` rows (a pad that depends on the
rank) so that every rank sends the same shape, all-gathers the padded blocks as a stack and drops each block's
padding.  A token-mixing layer (``m @ y``) after it makes the row order observable.  w's gradient is summed over
tp (each rank's covers its rows).

    tvcert trace examples/torch/realcode/uneven_pad_gather.py --verify                       # T=7, tp=2
    tvcert trace examples/torch/realcode/uneven_pad_gather.py --set bug=keep_pad --verify    # REFUTED

``bug``: ``keep_pad`` (the padding rows kept, each block's first T/tp rows taken instead: a real row dropped,
a zero row kept), ``no_grad_sum`` (w's gradient not all-reduced), ``pad_before`` (the padding put before the rank's
rows, the blocks then read from their start: a zero row kept, a real one dropped), ``width_off`` (each rank pads
one row more than it needs and keeps one row less of the last block: the last real row dropped, a zero kept).

Not verified yet: the ranks' slices differ in length (rank r holds ``rows[r]`` rows), so until the pad the ranks'
programs have rank-dependent shapes and no SPMD form; see bench/issue15_audit.md for what the merge needs.
"""
import sys
from pathlib import Path

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/torch: megatron_mlp's f (CopyToTP)
from megatron_mlp import CopyToTP  # noqa: E402

H, FO = 4, 6
BUGS = ("", "keep_pad", "no_grad_sum", "pad_before", "width_off")


class _Gather(torch.autograd.Function):
    """Stack the ranks' padded blocks along a new dim 0; backward: the rank's own slice of the stack."""

    @staticmethod
    def forward(ctx, y, group, rank):
        ctx.rank = rank
        return funcol.all_gather_tensor(y.unsqueeze(0).contiguous(), 0, group)

    @staticmethod
    def backward(ctx, g):
        return g.select(0, ctx.rank), None, None


def logical(x, w, m, target):
    return ((m @ torch.tanh(x @ w) - target) ** 2).sum()


def make(T, bug=""):
    def parallel(ctx, x, w, m, target):
        tp, r, p = ctx.group("tp"), ctx.coord("tp"), ctx.size("tp")
        rows = [len(c) for c in torch.arange(T).tensor_split(p)]
        top = rows[0]
        start = sum(rows[:r])
        w = w if bug == "no_grad_sum" else CopyToTP.apply(w, tp)
        y = torch.tanh(x[start:start + rows[r]] @ w)
        extra = 1 if bug == "width_off" else 0
        pads = (0, 0, top - rows[r] + extra, 0) if bug == "pad_before" else (0, 0, 0, top - rows[r] + extra)
        st = _Gather.apply(F.pad(y, pads), tp, r)  # [p, top (+1), FO]
        keep = [T // p] * p if bug == "keep_pad" else rows
        if bug == "keep_pad":
            full = torch.cat([st[i, :keep[i]] for i in range(p)] + [st[p - 1, keep[-1]:keep[-1] + T - sum(keep)]], 0)
        elif bug == "width_off":
            full = torch.cat([st[i, :keep[i]] for i in range(p - 1)] + [st[p - 1, :keep[-1] - 1], st[0, top:]], 0)
        else:
            full = torch.cat([st[i, :keep[i]] for i in range(p)], 0)
        return ((m @ full - target) ** 2).sum()
    return parallel


def tvcert_trace(tp: int = 2, T: int = 7, bug: str = "", dtype: str = "float64"):
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r} (one of {', '.join(b for b in BUGS if b)})")
    f = {"dtype": dtype}
    inputs = {"x": {"shape": [T, H], **f}, "w": {"shape": [H, FO], "param": True, **f},
              "m": {"shape": [T, T], **f}, "target": {"shape": [T, FO], **f}}
    return dict(logical=logical, parallel=make(T, bug), inputs=inputs, mesh={"tp": tp},
                name=f"uneven_pad_gather_tp{tp}_T{T}{'_' + bug if bug else ''}")
