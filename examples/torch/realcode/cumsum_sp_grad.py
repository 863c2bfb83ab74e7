"""A training step through a cumsum over a sequence sharded across ranks, for `tvcert trace` (issue 15 §2).

The input ``inp`` [S, D] is sharded over ``sp`` by rows; a weight ``w0`` [D] (replicated) scales it before the scan,
``x = inp * w0``, and the scan ``y = cumsum(x, 0)`` is each rank's local cumsum plus the carried offset (the totals
of the ranks before it, all-gathered and masked, as in ``cumsum_sp.py``); the loss ``sum((tanh(y) * w)^2)`` is
differentiated to ``inp`` (Shard(0)), ``w0`` and ``w`` (both all-reduced over sp).  The backward of a prefix scan is
a reversed scan (a suffix sum) whose offset carries the gradient totals of the ranks *after* it.

    tvcert trace examples/torch/realcode/cumsum_sp_grad.py --verify                      # VERIFIED
    tvcert trace examples/torch/realcode/cumsum_sp_grad.py --set grad=custom --verify    # VERIFIED
    tvcert trace examples/torch/realcode/cumsum_sp_grad.py --set bug=bwd_after --set grad=custom --verify  # REFUTED

``grad``: ``autograd`` (torch differentiates the forward: the all_gather's backward is a reduce_scatter of the
masked gradient totals, so the offset of the gradient comes through a reduce_scatter), ``custom`` (an
``autograd.Function`` whose hand-written backward scans the gradient in reverse and adds the gradient totals of the
later ranks from an all_gather, the way scan kernels carry it), ``reverse`` (autograd through the reversed scan
``flip(cumsum(flip(x)))`` carrying the later ranks' totals: its backward is a cumsum inside two pairs of flips whose
offset, the earlier ranks' gradient totals, comes through the reduce_scatter).  ``bug``: ``bwd_after`` (custom: the backward's offset
from the ranks before it, the forward's side), ``bwd_self`` (custom: from the ranks from its own on), ``bwd_no_offset``
(custom: the local reversed scan alone), ``global_rank`` (the global rank instead of the ``sp`` coordinate on a
dp x sp mesh: in the forward's mask for ``autograd``, in the backward's for ``custom``), ``no_grad_sync`` (``w0``'s
gradient left a partial sum: the reduction over sp missing), ``fwd_self`` (autograd / reverse: the forward's offset
includes the rank's own total; the backward autograd derives is then wrong too).  Each bug is wrong in float64 by torch's own
run (``python examples/torch/realcode/cumsum_sp_grad.py`` checks every case at sp 2, 3 and 4 against
``torch.autograd`` on one device)."""
import torch
import torch.distributed._functional_collectives as funcol

D = 3
GRADS = ("autograd", "custom", "reverse")
BUGS = ("", "bwd_after", "bwd_self", "bwd_no_offset", "global_rank", "no_grad_sync", "fwd_self")


def head(y, w):
    return ((torch.tanh(y) * w) ** 2).sum()


def scan(x, reverse=False):
    """cumsum along the rows; ``reverse``: the suffix sums, as people write them (flip, cumsum, flip back)."""
    return torch.cumsum(x.flip(0), 0).flip(0) if reverse else torch.cumsum(x, 0)


def make_logical(reverse=False):
    def logical(inp, w0, w):
        return head(scan(inp * w0, reverse), w)
    return logical


logical = make_logical()


def _mask(p, r, side):
    """Coefficients of the gathered totals: the ranks before r (``before``), after it, up to it, from it on."""
    j = torch.arange(p)
    return {"before": j < r, "after": j > r, "upto": j <= r, "from": j >= r}[side]


def _offset(x, gather, p, r, side):
    tots = gather(x.sum(0, keepdim=True))  # [p, D]: one row per rank
    return (_mask(p, r, side).to(x.dtype).view(p, 1) * tots).sum(0, keepdim=True)


def _suffix(g):
    """The local reversed scan (the suffix sums of the rows), as people write it."""
    return torch.cumsum(g.flip(0), 0).flip(0)


def make_scan(gather, p, r_fwd, r_bwd, bug):
    """The sharded cumsum as an autograd.Function with a hand-written backward."""

    class ShardedCumsum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.cumsum(x, 0) + _offset(x, gather, p, r_fwd, "before")

        @staticmethod
        def backward(ctx, g):
            dx = _suffix(g)
            if bug == "bwd_no_offset":
                return dx
            side = {"bwd_after": "before", "bwd_self": "from"}.get(bug, "after")
            return dx + _offset(g, gather, p, r_bwd, side)

    return ShardedCumsum.apply


def make_parallel(grad, bug):
    def parallel(ctx, inp, w0, w):
        sp = ctx.group("sp")
        p, r = ctx.size("sp"), ctx.coord("sp")
        rg = ctx.rank if bug == "global_rank" else r
        x = inp * w0
        if grad == "custom":
            y = make_scan(lambda t: funcol.all_gather_tensor(t, 0, sp), p, r, rg, bug)(x)
        else:  # autograd differentiates through the all_gather (its backward: a reduce_scatter)
            side = {(False, False): "before", (False, True): "upto", (True, False): "after",
                    (True, True): "from"}[grad == "reverse", bug == "fwd_self"]
            y = scan(x, grad == "reverse") + _offset(x, lambda t: funcol.all_gather_tensor_autograd(t, 0, sp), p, rg,
                                                     side)
        return head(y, w)  # this rank's share of the loss: Partial(sum) over sp
    return parallel


def make_grad_sync(bug):
    def grad_sync(ctx, grads):
        out = dict(grads)
        for k in ("w0", "w"):  # the replicated weights' gradients are partial sums over sp
            if not (bug == "no_grad_sync" and k == "w0"):
                out[k] = funcol.all_reduce(out[k], "sum", ctx.group("sp"))
        return out
    return grad_sync


def tvcert_trace(grad: str = "autograd", bug: str = "", sp: int = 2, block: int = 3, dtype: str = "float64",
                 dp: int = 1):
    """``dp`` > 1: a dp x sp mesh, the data replicated over dp (each dp rank computes the whole step); the bug
    ``global_rank`` takes dp = 2."""
    if grad not in GRADS or bug not in BUGS:
        raise ValueError(f"unknown grad {grad!r} or bug {bug!r}")
    f = {"dtype": dtype}
    dp = max(dp, 2) if bug == "global_rank" else dp
    mesh = {"dp": dp, "sp": sp} if dp > 1 else {"sp": sp}
    pl = {"sp": "Shard(0)", **({"dp": "Replicate()"} if "dp" in mesh else {})}
    inputs = {"inp": {"shape": [sp * block, D], "placement": pl, "param": True, **f},
              "w0": {"shape": [D], "param": True, **f}, "w": {"shape": [D], "param": True, **f}}
    out = {"loss": {"sp": "Partial(sum)", **({"dp": "Replicate()"} if "dp" in mesh else {})}}
    return dict(logical=make_logical(grad == "reverse"), parallel=make_parallel(grad, bug), grad_sync=make_grad_sync(bug), inputs=inputs,
                output_placements=out, mesh=mesh, name=f"cumsum_sp_grad_{grad}_sp{sp}{'_' + bug if bug else ''}")


def torch_check(grad: str, bug: str, sp: int = 2, block: int = 3) -> bool:
    """Every rank's forward and backward in float64 with the collectives done by hand, against torch.autograd on
    one device: True when the loss and the three gradients agree."""
    dp = 2 if bug == "global_rank" else 1  # the dp ranks compute the same step: each is compared
    g = torch.Generator().manual_seed(0)
    inp, w0, w = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ([sp * block, D], [D], [D]))
    ref = [t.detach().requires_grad_() for t in (inp, w0, w)]
    loss = make_logical(grad == "reverse")(*ref)
    want = [loss.detach(), *torch.autograd.grad(loss, ref)]
    ok = True
    for c in range(dp):
        ls = []
        xs = [(inp.chunk(sp, 0)[s].clone().requires_grad_(), w0.clone().requires_grad_(), w.clone().requires_grad_())
              for s in range(sp)]
        # the forward's gathered totals of every rank (the by-hand all_gather), built first
        x_loc = [a * b for a, b, _ in xs]
        tots = torch.cat([x.sum(0, keepdim=True) for x in x_loc], 0)
        gtots: dict[str, torch.Tensor] = {}
        rk = [c * sp + s if bug == "global_rank" else s for s in range(sp)]
        ys = []
        for s in range(sp):
            if grad == "custom":
                ys.append(_HandScan.apply(x_loc[s], tots, gtots, sp, s, rk[s], bug))
            else:
                rev = grad == "reverse"
                side = {(False, False): "before", (False, True): "upto", (True, False): "after",
                        (True, True): "from"}[rev, bug == "fwd_self"]
                ys.append(scan(x_loc[s], rev) + (_mask(sp, rk[s], side).to(x_loc[s].dtype).view(sp, 1)
                                                  * tots).sum(0, keepdim=True))
            ls.append(head(ys[-1], xs[s][2]))
        total = sum(ls)
        if grad == "custom":  # the backward's gathered gradient totals need every rank's dy first
            dys = torch.autograd.grad(total, ys, retain_graph=True)
            gtots["g"] = torch.cat([d.sum(0, keepdim=True) for d in dys], 0)
        gr = torch.autograd.grad(total, [q for t in xs for q in t])
        ginp = torch.cat([gr[3 * s] for s in range(sp)], 0)
        gw0 = sum(gr[3 * s + 1] for s in range(sp)) if bug != "no_grad_sync" else gr[1]
        gw = sum(gr[3 * s + 2] for s in range(sp))
        ok = ok and all(torch.allclose(a, b) for a, b in zip((total.detach(), ginp, gw0, gw), want))
    return ok


class _HandScan(torch.autograd.Function):
    """The custom scan of one rank with the all_gathers done by hand (``tots``: the forward's totals; ``gtots["g"]``:
    the gradient totals, filled in before the backward runs)."""

    @staticmethod
    def forward(ctx, x, tots, gtots, p, r, rb, bug):
        ctx.k = (gtots, p, rb, bug)
        return torch.cumsum(x, 0) + (_mask(p, r, "before").to(x.dtype).view(p, 1) * tots).sum(0, keepdim=True)

    @staticmethod
    def backward(ctx, g):
        gtots, p, rb, bug = ctx.k
        dx = _suffix(g)
        if bug != "bwd_no_offset" and "g" in gtots:
            side = {"bwd_after": "before", "bwd_self": "from"}.get(bug, "after")
            dx = dx + (_mask(p, rb, side).to(g.dtype).view(p, 1) * gtots["g"]).sum(0, keepdim=True)
        return dx, None, None, None, None, None, None


if __name__ == "__main__":
    for grad in GRADS:
        for bug in BUGS:
            if (grad != "custom" and bug.startswith("bwd_")) or (grad == "custom" and bug == "fwd_self"):
                continue
            for sp in (2, 3, 4):
                ok = torch_check(grad, bug, sp)
                print(f"{grad:9s} {bug or 'correct':14s} sp={sp}: {'agrees with' if ok else 'DIFFERS from'} autograd")
                assert ok == (bug == ""), (grad, bug, sp)
