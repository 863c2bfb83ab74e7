"""Rank-reversed blocks (issue 15 §2): rank r works on block tp-1-r of the sequence, for `tvcert trace`.

Code that lays the ranks out in reverse (a ring walked backwards, a pipeline-style "last rank first" split) takes
rank r's rows at ``(tp-1-r)*n`` -- a slice at a rank-dependent offset of a replicated input -- computes a row-wise
layer on its block and gathers the blocks as a stack (``all_gather_tensor(y.unsqueeze(0), 0)``: [tp, n, F]);
flipping the stack over the ranks puts the blocks back in sequence order.  A token-mixing layer (``m @ y``) after
it makes the order observable.

    tvcert trace examples/torch/realcode/layout_reversed.py --verify                      # VERIFIED (the flip)
    tvcert trace examples/torch/realcode/layout_reversed.py --set bug=no_flip --verify    # REFUTED

``bug``: ``no_flip`` (the gathered stack flattened in rank order: the blocks come out reversed), ``own_block``
(the flip kept but each rank slices its own block r: the flip then reverses a correct order), ``no_grad_sum``
(w's gradient not all-reduced: each rank's covers its block only; the loss is right), ``flip_inner`` (the stack
flipped along the rows of each block instead of over the ranks), ``overlap`` (blocks at ``(tp-1-r)*(n-1)``: a
rank-reversed offset with the wrong block size, so blocks overlap), ``rotated`` (rank r takes block ``(r+1) % tp``,
a rotation, not the reversal the flip undoes; at tp = 2 the two coincide and the program is correct, use tp >= 3).
"""
import sys
from pathlib import Path

import torch
import torch.distributed._functional_collectives as funcol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/torch: megatron_mlp's f (CopyToTP)
from megatron_mlp import CopyToTP  # noqa: E402

T, H, F = 8, 4, 6
BUGS = ("", "no_flip", "own_block", "no_grad_sum", "flip_inner", "overlap", "rotated")


class _Gather(torch.autograd.Function):
    """Stack the ranks' blocks along a new dim 0; backward: the rank's own slice of the stack."""

    @staticmethod
    def forward(ctx, y, group, rank):
        ctx.rank = rank
        return funcol.all_gather_tensor(y.unsqueeze(0).contiguous(), 0, group)

    @staticmethod
    def backward(ctx, g):
        return g.select(0, ctx.rank), None, None


def logical(x, w, m, target):
    return ((m @ torch.tanh(x @ w) - target) ** 2).sum()


def make(bug=""):
    def parallel(ctx, x, w, m, target):
        tp, r, p = ctx.group("tp"), ctx.coord("tp"), ctx.size("tp")
        n = T // p
        b = r if bug == "own_block" else (r + 1) % p if bug == "rotated" else p - 1 - r
        start = b * (n - 1) if bug == "overlap" else b * n
        w = w if bug == "no_grad_sum" else CopyToTP.apply(w, tp)  # each rank's dW covers its block: summed
        y = torch.tanh(x[start:start + n] @ w)
        st = _Gather.apply(y, tp, r)
        full = (st if bug == "no_flip" else st.flip(1) if bug == "flip_inner" else st.flip(0)).flatten(0, 1)
        return ((m @ full - target) ** 2).sum()
    return parallel


def tvcert_trace(tp: int = 2, bug: str = "", dtype: str = "float64"):
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r} (one of {', '.join(b for b in BUGS if b)})")
    f = {"dtype": dtype}
    inputs = {"x": {"shape": [T, H], **f}, "w": {"shape": [H, F], "param": True, **f},
              "m": {"shape": [T, T], **f}, "target": {"shape": [T, F], **f}}
    return dict(logical=logical, parallel=make(bug), inputs=inputs, mesh={"tp": tp},
                name=f"layout_reversed_tp{tp}{'_' + bug if bug else ''}")
