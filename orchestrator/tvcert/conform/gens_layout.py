"""Conformance generators for the layout rules real code needs (issue 15 §2): reshapes written as traced
code writes them.

A traced program spells a reshape with the rank's LOCAL sizes as literals (``view(b, s, -1, HD)`` on a shard
holding one head is ``reshape [2, 4, 1, 2]``), so the kernel cannot read the logical target from the
attribute and must place the shard from the logical input shape, the placement and the mesh sizes alone.
These draw that: a logical shape, a shard on a focus axis (sometimes nested with a second axis on the same
dim, sometimes holding exactly one head / sample / row per rank), random placements of the other dims on
the other axes (Replicate, Shard, Partial), and a local target obtained by splitting dims (heads x head
size, with unit factors), merging neighbours (also across the sharded dim from the wrong side), and
inserting / dropping size-1 dims around it; the literal is sometimes written with a -1.  Many of them have no
valid placement (a shard that does not head its group, a merge that interleaves ranks): the kernel must
refuse them or conclude a fact that holds on every rank.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .core import OpCase, P, R, S, TIn

if TYPE_CHECKING:  # gens imports this module at its end to register the generators below
    from .gens import Draw

__all__ = ["LAYOUT_GENERATORS", "gen_allgather_other_dim", "gen_pad_block", "gen_reshape_local", "gen_squeeze_local"]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _regroup_local(dr: Draw, local: list[int], sharded: set[int]) -> list[int]:
    """A random row-major regrouping of the local shape: per dim keep / split / merge with the next /
    surround with size-1 dims; size-1 dims may also be dropped."""
    out: list[int] = []
    i = 0
    while i < len(local):
        n = local[i]
        u = dr.rng.random()
        bias = 0.25 if i in sharded else 0.0  # split the sharded dim more often (heads x head size)
        if u < 0.3 + bias and n >= 1:
            f = dr.pick(_divisors(n))
            if dr.coin(0.3):
                f = 1  # a unit dim heading the split: one head per rank
            out += [f, n // f]
        elif u < 0.55 + bias / 2 and i + 1 < len(local):
            out.append(n * local[i + 1])
            i += 1
        elif u < 0.65 and n == 1:
            pass  # drop a size-1 dim
        else:
            out.append(n)
        if dr.coin(0.12):
            out.insert(len(out) - dr.int(0, 1) if out else 0, 1)
        i += 1
    if not out:
        out = [1]
    return out


def gen_reshape_local(dr: Draw) -> OpCase:
    from .gens import fit

    axes, sizes = dr.mesh()
    fi = dr.int(0, len(axes) - 1)
    a = axes[fi]
    rank = dr.int(1, 4)
    d = dr.int(0, rank - 1)
    pl = []
    for j, b in enumerate(axes):
        if j == fi:
            pl.append(S(d))
            continue
        u = dr.rng.random()
        if u < 0.25:
            pl.append(S(d))  # nested shards of the same dim over two axes
        elif u < 0.5 and rank > 1:
            pl.append(S(dr.pick([k for k in range(rank) if k != d])))
        elif u < 0.6:
            pl.append(P(dr.pick(["sum", "avg"])))
        else:
            pl.append(R)
    pl = tuple(pl)
    shape = fit(dr, rank, axes, sizes, [pl])
    if dr.coin(0.35):
        # exactly one head / sample / row per rank on the sharded dim (the size is its shard factor)
        f = 1
        for b, p in zip(axes, pl):
            if p.kind == "S" and p.dim == d:
                f *= sizes[b]
        shape[d] = f
    if dr.coin(0.3):
        k = dr.int(0, rank)  # a size-1 logical dim somewhere (a batch of one, a unit head dim)
        shape.insert(k, 1)
        pl = tuple(S(p.dim + 1) if p.kind == "S" and p.dim >= k else p for p in pl)
    local = list(shape)
    for b, p in zip(axes, pl):
        if p.kind == "S":
            local[p.dim] //= sizes[b]
    sharded = {p.dim for p in pl if p.kind == "S"}
    target: list = _regroup_local(dr, local, sharded)
    if dr.coin(0.2):
        target[dr.int(0, len(target) - 1)] = -1
    op = dr.pick(["reshape", "view"])
    return OpCase(op, {"shape": target}, [TIn(tuple(shape), pl)], axes, sizes, note="local literal target")


def gen_squeeze_local(dr: Draw) -> OpCase:
    """squeeze / unsqueeze at a dim next to (or at) a shard holding one block per rank of local size 1."""
    from .gens import fit

    axes, sizes = dr.mesh()
    fi = dr.int(0, len(axes) - 1)
    a = axes[fi]
    rank = dr.int(1, 4)
    d = dr.int(0, rank - 1)
    pl = tuple(S(d) if j == fi else (R if dr.coin(0.6) else P("sum")) for j in range(len(axes)))
    shape = fit(dr, rank, axes, sizes, [pl])
    if dr.coin(0.6):
        shape[d] = sizes[a]  # local size 1
    if dr.coin(0.5):
        dim = dr.int(-rank - 1, rank)
        return OpCase("unsqueeze", {"dim": dim}, [TIn(tuple(shape), pl)], axes, sizes)
    ones = [i for i, n in enumerate(shape) if n == 1 or (i == d and n == sizes[a])]
    return OpCase("squeeze", {"dims": ones[:1] if ones else []}, [TIn(tuple(shape), pl)], axes, sizes)


def gen_allgather_other_dim(dr: Draw) -> OpCase:
    """all_gather along a dim other than the sharded one (per-rank pieces stacked: often a unit dim), other axes
    Replicate or sharding other dims, near misses: another axis sharding d or g again, Partial, zig-zag."""
    from .core import Z
    from .gens import fit

    axes, sizes = dr.mesh()
    fi = dr.int(0, len(axes) - 1)
    a = axes[fi]
    rank = dr.int(2, 4)
    d, g = dr.pick([(x, y) for x in range(rank) for y in range(rank) if x != y])
    rest = [k for k in range(rank) if k not in (d, g)]
    pl = []
    for j in range(len(axes)):
        u = dr.rng.random()
        if j == fi:
            pl.append(S(d))
        elif u < 0.45 or (u < 0.75 and not rest):
            pl.append(R)
        elif u < 0.75:
            pl.append(S(dr.pick(rest)))
        else:
            pl.append(dr.pick([S(d), S(g), P("sum"), Z(d)]))
    pl = tuple(pl)
    shape = fit(dr, rank, axes, sizes, [pl])
    if dr.coin(0.4):
        shape[g] = 1  # stacking per-rank pieces along a unit dim (x.unsqueeze(g) then gathered)
        pl = tuple(R if (q.kind in ("S", "Z") and q.dim == g) else q for q in pl)
    dim = g - rank if dr.coin(0.3) else g
    return OpCase("all_gather", {"axis": a, "dim": dim}, [TIn(tuple(shape), pl)], axes, sizes, note="gather other dim")


def _mix(*gens):
    def g(dr: Draw) -> OpCase:
        return dr.pick(list(gens))(dr)
    return g




def gen_pad_block(dr: Draw) -> OpCase:
    """A rank's block padded back to its place, pads written as autograd's slice_backward traces them, with
    near misses: rank-reversed blocks, another axis's rank, an off-by-one block size, a nonzero fill, the
    dim sharded again on another axis, Partial(max) elsewhere, rank-free pads on other (sharded) dims."""
    from .gens import fit

    axes, sizes = dr.mesh()
    fi = dr.int(0, len(axes) - 1)
    a = axes[fi]
    rank = dr.int(1, 3)
    d = dr.int(0, rank - 1)
    others = [k for k in range(rank) if k != d]
    pl = []
    for j in range(len(axes)):
        u = dr.rng.random()
        if j == fi:
            pl.append(S(d))
        elif u < 0.35 or not others and u < 0.5:
            pl.append(R)
        elif u < 0.6 and others:
            pl.append(S(dr.pick(others)))
        elif u < 0.8:
            pl.append(P(dr.pick(["sum", "avg", "sum", "max"])))
        else:
            pl.append(S(d) if dr.coin(0.3) else R)
    pl = tuple(pl)
    shape = fit(dr, rank, axes, sizes, [pl])
    f = 1
    for b, q in zip(axes, pl):
        if q.kind == "S" and q.dim == d:
            f *= sizes[b]
    L = shape[d] // f
    p = sizes[a]
    r = f"rank.{a}"
    before, after = f"{r}*{L}", dr.pick([f"{r}*-{L}+{(p - 1) * L}", f"({p - 1}-{r})*{L}", f"{(p - 1) * L}-{L}*{r}"])
    u = dr.rng.random()
    if u < 0.08:
        before, after = after, before  # rank-reversed blocks
    elif u < 0.14 and len(axes) > 1:
        b = dr.pick([x for x in axes if x != a])
        before, after = f"rank.{b}*{L}", f"({sizes[b] - 1}-rank.{b})*{L}"  # another axis's rank
    elif u < 0.18:
        before, after = f"{r}*{L + 1}", f"({p - 1}-{r})*{L + 1}"  # off by one
    pads: list = [0] * (2 * rank)
    pads[2 * d], pads[2 * d + 1] = before, after
    if others and dr.coin(0.25):
        k = dr.pick(others)
        pads[2 * k + dr.int(0, 1)] = dr.int(1, 2)
    value = 0 if dr.coin(0.9) else dr.pick([1, -0.5])
    return OpCase("pad", {"pads": pads, "value": value}, [TIn(tuple(shape), pl)], axes, sizes, note="rank block pad")


#: rule id -> generator, merged into ``gens.SINGLE_OP`` next to the generators drawn there
LAYOUT_GENERATORS = {
    "reshape_shard_block": _mix(gen_reshape_local, gen_reshape_local, gen_squeeze_local),
    "pad_block_to_partial": gen_pad_block,
    "allgather_other_dim": gen_allgather_other_dim,
}
