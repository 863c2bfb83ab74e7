"""A prefix scan (cumsum) over a sequence sharded across ranks, as real code computes it, for `tvcert trace`.

The sequence [S, D] is sharded over ``sp`` (each rank holds a block of S/sp rows).  The cumsum along the sequence is
each rank's local cumsum plus a carried offset: the sum of the totals of the ranks *before* it, from an all_gather
of the per-rank totals and a masked sum over the gathered dim.

    tvcert trace examples/torch/realcode/cumsum_sp.py --verify                       # VERIFIED
    tvcert trace examples/torch/realcode/cumsum_sp.py --set bug=self --verify        # REFUTED

``variant``: ``masked`` (mask ``arange(p) < r``, a product and a sum), ``where`` (the totals selected with
``where(mask, tots, 0)``), ``matmul`` (the row ``r`` of a strictly lower-triangular mask times the totals),
``gcumsum`` (the cumsum of the gathered totals read at row ``r``, minus row ``r``: ``torch.cumsum(tots, 0)[r] -
tots[r]``), ``lastrow`` (each rank's total read off its own local scan, ``y[-1:]``, before the gather),
``exclusive`` (the exclusive prefix ``cumsum(x) - x``), ``reverse`` (the suffix sums ``flip(cumsum(flip(x)))``,
carrying the totals of the ranks after it), ``dim1`` (a [B, S, D] batch sharded over ``dp`` on dim 0 and the
sequence over ``sp`` on dim 1, cumsum along dim 1), ``flat`` (totals reduced without keepdim and unsqueezed before
the gather).  ``bug``: ``self`` (offset from the ranks up to and including its own), ``after`` (offset from the
ranks on the wrong side: after it, or before it for ``reverse``), ``global_rank`` (the global rank instead of the
``sp`` coordinate, on the 2-D mesh of ``dim1``), ``no_offset`` (the local cumsum alone).  Each bug is wrong in
float64 by torch's own run (``python examples/torch/realcode/cumsum_sp.py`` checks every variant and bug at sp 2, 3
and 4)."""
import torch
import torch.distributed._functional_collectives as funcol

D = 3
VARIANTS = ("masked", "where", "matmul", "gcumsum", "lastrow", "exclusive", "reverse", "dim1", "flat")
BUGS = ("", "self", "after", "global_rank", "no_offset")


def scan(x, dim, reverse=False):
    """cumsum along ``dim``; ``reverse``: the suffix sums, as people write them (flip, cumsum, flip back)."""
    return torch.cumsum(x.flip(dim), dim).flip(dim) if reverse else torch.cumsum(x, dim)


def head(y, w):
    return ((torch.tanh(y) * w) ** 2).sum()


def make_logical(variant):
    dim = 1 if variant == "dim1" else 0

    def logical(x, w):
        y = scan(x, dim, variant == "reverse")
        if variant == "exclusive":
            y = y - x
        return head(y, w)
    return logical


def prefix_mask(p, r, bug, reverse=False):
    """1 for the ranks whose totals rank ``r`` carries (the ranks before it; after it for a reversed scan)."""
    j = torch.arange(p)
    if reverse:
        return j >= r if bug == "self" else j < r if bug == "after" else j > r
    return j <= r if bug == "self" else j > r if bug == "after" else j < r


def carried(x, dim, gather, p, r, variant, bug):
    """The sum of the totals of the ranks before ``r`` along ``dim`` (keepdim), from ``gather`` (an all_gather
    along ``dim`` over the sequence axis)."""
    tots = gather(x.sum(dim).unsqueeze(dim) if variant == "flat" else x.sum(dim, keepdim=True))
    m = prefix_mask(p, r, bug, variant == "reverse")
    shape = [1] * x.dim()
    shape[dim] = p
    if variant == "where":
        return torch.where(m.view(shape), tots, 0.0).sum(dim, keepdim=True)
    if variant == "gcumsum":  # dim 0 only: the exclusive prefix of the gathered totals, read at row r
        pref = torch.cumsum(tots, 0)
        if bug in ("self", "after"):
            return pref[r] if bug == "self" else pref[p - 1] - pref[r]
        return pref[r] - tots[r]
    if variant == "matmul":  # dim 0 only: row r of tril(ones(p, p), -1) is the mask
        tri = torch.tril(torch.ones(p, p, dtype=x.dtype), -1)
        if bug:
            tri = m.to(x.dtype).expand(p, p)
        return (tri[r] @ tots).unsqueeze(0)
    return (m.to(x.dtype).view(shape) * tots).sum(dim, keepdim=True)


def carry_from_last_row(y, gather, p, r, bug):
    """The offset of dim 0 from the gathered last rows of the ranks' local scans, masked."""
    tots = gather(y[-1:])
    return (prefix_mask(p, r, bug).to(y.dtype).view(p, 1) * tots).sum(0, keepdim=True)


def local_scan(x, dim, gather, p, r, variant, bug):
    """What one rank computes: its block of the (inclusive or exclusive) cumsum."""
    y = scan(x, dim, variant == "reverse")
    if variant == "lastrow":  # the block's total read off its own scan (its last row), as scan kernels carry it
        return y + carry_from_last_row(y, gather, p, r, bug) if bug != "no_offset" else y
    if bug != "no_offset":
        y = y + carried(x, dim, gather, p, r, variant, bug)
    return y - x if variant == "exclusive" else y


def make_parallel(variant, bug):
    dim = 1 if variant == "dim1" else 0

    def parallel(ctx, x, w):
        sp = ctx.group("sp")
        r = ctx.rank if bug == "global_rank" else ctx.coord("sp")
        y = local_scan(x, dim, lambda t: funcol.all_gather_tensor(t, dim, sp), ctx.size("sp"), r, variant, bug)
        return head(y, w)  # this rank's share of the loss: Partial(sum) over the sharded axes
    return parallel


def grad_sync(ctx, grads):
    out = dict(grads)
    for a in ctx.axes:
        out = {k: funcol.all_reduce(g, "sum", ctx.group(a)) for k, g in out.items()}
    return out


def tvcert_trace(variant: str = "masked", bug: str = "", sp: int = 2, block: int = 3, dtype: str = "float64"):
    if variant not in VARIANTS or bug not in BUGS:
        raise ValueError(f"unknown variant {variant!r} or bug {bug!r}")
    f = {"dtype": dtype}
    mesh = {"dp": 2, "sp": sp} if variant == "dim1" or bug == "global_rank" else {"sp": sp}
    if variant == "dim1":
        x = {"shape": [4, sp * block, D], "placement": {"dp": "Shard(0)", "sp": "Shard(1)"}, **f}
    else:
        x = {"shape": [sp * block, D], "placement": {"sp": "Shard(0)"}, **f}
        if "dp" in mesh:
            x["placement"]["dp"] = "Replicate()"
    inputs = {"x": x, "w": {"shape": [D], "param": True, **f}}
    out = {"loss": {a: "Partial(sum)" for a in mesh}}
    return dict(logical=make_logical(variant), parallel=make_parallel(variant, bug), grad_sync=grad_sync,
                inputs=inputs, output_placements=out, mesh=mesh,
                name=f"cumsum_sp_{variant}_sp{sp}{'_' + bug if bug else ''}")


def torch_check(variant: str, bug: str, sp: int = 2, block: int = 3) -> bool:
    """Run every rank's code in float64 with the all_gather done by hand (the totals of the blocks of the same dp
    coordinate concatenated in sp order) and compare with torch.cumsum: True when they agree."""
    dim = 1 if variant == "dim1" else 0
    dp = 2 if variant == "dim1" or bug == "global_rank" else 1
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*([4, sp * block, D] if variant == "dim1" else [sp * block, D]), generator=g, dtype=torch.float64)
    want = scan(x, dim, variant == "reverse")
    want = want - x if variant == "exclusive" else want
    ok = True
    for c in range(dp):  # x replicated over dp, or its dim 0 sharded there (dim1)
        xc, wc = (x.chunk(dp, 0)[c], want.chunk(dp, 0)[c]) if variant == "dim1" else (x, want)
        blocks = xc.chunk(sp, dim)
        tots = torch.cat([b.sum(dim, keepdim=True) for b in blocks], dim)
        r = [c * sp + s if bug == "global_rank" else s for s in range(sp)]
        got = torch.cat([local_scan(blocks[s], dim, lambda t: tots, sp, r[s], variant, bug) for s in range(sp)], dim)
        ok = ok and torch.allclose(got, wc)
    return ok


if __name__ == "__main__":
    for v in VARIANTS:
        for bug in BUGS:
            if bug == "global_rank" and v not in ("masked", "dim1"):
                continue
            for sp in (2, 3, 4):
                ok = torch_check(v, bug, sp)
                print(f"{v:10s} {bug or 'correct':12s} sp={sp}: {'agrees with' if ok else 'DIFFERS from'} torch.cumsum")
                assert ok == (bug == ""), (v, bug, sp)
