"""pad_block_to_partial: a rank's block of a shard padded with zeros back to its place is Partial(sum).

Real code meets it as the backward of a rank slicing its block of a replicated tensor (autograd's
``slice_backward`` is a pad whose pads depend on the rank: ``[rank*L, (p-1-rank)*L]``), and as a shard padded
to the full size before an all_reduce.  Rank r's local, zero outside block r, summed over the ranks, is the
logical tensor (``LayoutReal.pad_block_to_partial``).  Side conditions, all checked here at every use: the
pads of exactly one dim depend on exactly one mesh axis, affinely and exactly as block r's offsets of the
local size; the fill value is 0; that axis holds Shard of that dim and no inner axis shards it again; the
other axes hold Replicate, Shard of a dim padded by nothing, or Partial(sum|avg) (a pad with 0 is additive:
OpFlags.pad_zero_linear), never Partial(max).  A zig-zag shard is refused by kernel/zigzag.py (the rule has no
zig-zag counterpart: the block is not contiguous).
"""
from __future__ import annotations

from fractions import Fraction

from ..plan import Placement
from ..shapes import affine_in_rank, rank_axes_in

RULE = "pad_block_to_partial"
STATEMENT = ("rank r's block of Shard(d) padded with zeros by [r*L, (p-1-r)*L] along d (slice_backward of the "
             "rank's block) is Partial(sum) of the logical tensor")


def rank_dependent(raw) -> bool:
    return bool(rank_axes_in(raw.get("pads")))


def derive_pad_block(kc, ra, raw, f, failure):
    """The conclusion for ``pad`` with rank-dependent pads, or ``failure(msg)`` raised."""
    from .rules import R, Derivation, Fact, shard_factor

    X = kc.exprs
    shape = X[f.expr].shape
    pads = raw["pads"]
    if not isinstance(pads, list) or len(pads) != 2 * len(shape):
        raise failure(f"pad: pads {pads!r} is not one (before, after) pair per dim")
    if Fraction(str(ra.get("value", 0))) != 0:
        raise failure("pad with rank-dependent pads and a nonzero fill value: no rule (only zeros sum away)")
    dep = [i for i in range(len(shape)) if rank_axes_in([pads[2 * i], pads[2 * i + 1]])]
    if len(dep) != 1:
        raise failure(f"pad: the pads of dims {dep} depend on the rank; {RULE} covers one dim")
    d = dep[0]
    axes = set(rank_axes_in([pads[2 * d], pads[2 * d + 1]]))
    if len(axes) != 1:
        raise failure(f"pad: the pads of dim {d} depend on several rank axes {sorted(axes)}")
    a = axes.pop()
    if a not in kc.axes:
        raise failure(f"pad: the pads depend on rank.{a}, but the program does not span axis {a!r}")
    ai = kc.axes.index(a)
    if f.pl[ai] != Placement("S", d):
        raise failure(f"{RULE} over {a!r} needs Shard({d}) there, got {f.pl[ai]}")
    p = kc.sizes[a]
    for aj, b in enumerate(kc.axes):
        q = f.pl[aj]
        if aj != ai and q.kind == "S" and q.dim == d:
            raise failure(f"{RULE} over {a!r}: dim {d} is also sharded on axis {b!r}")
    L = shape[d] // (shard_factor(kc.axes, f.pl, d, kc.sizes))
    env = kc.env0()
    before, after = affine_in_rank(pads[2 * d], env, a), affine_in_rank(pads[2 * d + 1], env, a)
    if before != (0, L) or after != ((p - 1) * L, -L):
        raise failure(f"{RULE}: rank r pads dim {d} by [{_aff(before)}, {_aff(after)}], not block r's "
                      f"[{L}r, {(p - 1) * L}-{L}r] of a size-{p * L} dim split {p} ways")
    other = list(ra["pads"])
    other[2 * d] = other[2 * d + 1] = 0
    expr = f.expr if not any(other) else X.mk("pad", {"pads": tuple(other), "value": 0}, [f.expr])
    per_axis = []
    for aj, b in enumerate(kc.axes):
        q = f.pl[aj]
        if aj == ai:
            per_axis.append((Placement("P", reduce="sum"), RULE))
        elif q.kind == "R":
            per_axis.append((R, "replicate_any"))
        elif q.kind == "S" and other[2 * q.dim] == 0 and other[2 * q.dim + 1] == 0:
            per_axis.append((q, "rowwise_shard"))
        elif q.kind == "P" and q.reduce in ("sum", "avg"):
            per_axis.append((q, "partial_linear_map"))
        else:
            raise failure(f"{RULE}: axis {b!r} holds {q}, which a pad of the block does not keep")
    return Derivation([Fact(expr, tuple(pl for pl, _ in per_axis))], [r for _, r in per_axis])


def _aff(c) -> str:
    if c is None:
        return "not affine"
    return f"{c[0]}+{c[1]}r"
