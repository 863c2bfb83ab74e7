"""Load-balanced ("zig-zag") context parallelism: the rules for ``ZigzagShard(d)``.

Causal attention gives the last sequence block the most work, so context parallel training cuts the
sequence into 2p chunks and gives rank r chunks r and 2p-1-r (Megatron-CP, torchtitan's head-tail
load balancer).  Rank r's local row i is logical row

    zz(r, i) = r*c + i               for i < c
               (2p-1-r)*c + (i - c)  for c <= i < 2c          (c = n / 2p)

``ZigzagShard(d)`` of E is therefore ``Shard(d)`` of E read through the bijection zz of dim d
(Coq: ``Zigzag.shard_zigzag``).  Any rule whose Shard(d) case only uses that the op acts on each index
of d independently (pointwise and row-wise ops, batch dims of matmul / einsum, permutes, reshapes
that leave d alone or merge / split whole chunks) or that it sums / maxes over all of d (reductions and
contractions, which do not care about the order of the summands) holds for the zig-zag order too;
rules that rely on the blocks being contiguous (slicing a rank's block, all_gather / reduce_scatter /
all_to_all along d over the same axis) do not, and a Zigzag operand makes them fail.

:func:`derive_zigzag` reuses the Shard rules: it reads Zigzag as Shard on the axes that hold it,
runs the ordinary rule, and accepts the conclusion only if the rule used on each such axis is one of
:data:`ZIGZAG_OF`, which maps it to the zig-zag theorem that proves the same step.  Collectives are
accepted only over other axes (a zig-zag axis is then context, unchanged).  Everything else fails.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..ops import REGISTRY, resolve_attrs
from ..ops.collectives import axes_of
from ..plan import Placement
from ..shapes import affine_in_rank, rank_axes_in
from ..graph import Node
from .producers import ProducersBefore, out_shape, producer, rank_free_attrs, single_axis
from .rules import R, Derivation, Fact, KCtx, RuleFailure, _groups, _prod, conclude, local_shape

# the Shard rule used on a zig-zag axis -> the zig-zag theorem covering that step (proofs/manifest.json)
ZIGZAG_OF: dict[str, str] = {
    "ew_unary_shard": "zigzag_ew_unary",
    "ew_binary_shard": "zigzag_ew_binary",
    "ew_binary_shard_broadcast": "zigzag_ew_binary_broadcast",
    "rowwise_shard": "zigzag_rowwise",
    "softmax_other_dim": "zigzag_rowwise",
    "reduce_other_dim": "zigzag_rowwise",
    "permute_shard": "zigzag_rowwise",
    "slice_other_dim": "zigzag_rowwise",
    "matmul_col_parallel": "zigzag_rowwise",
    "matmul_batch_shard": "zigzag_rowwise2",
    "einsum_shard_free_index": "zigzag_rowwise2",
    "concat_other_dim": "zigzag_rowwise2",
    "reshape_shard_block": "zigzag_reshape",  # or zigzag_rowwise; the chunks must line up (_reshape_rule)
    "reduce_sum_sharded_dim": "zigzag_reduce_sum",
    "reduce_max_sharded_dim": "zigzag_reduce_max",
    "reduce_mean_sharded_dim": "zigzag_reduce_mean",
    "matmul_row_parallel": "zigzag_contraction",
    "einsum_shard_contracted_index": "zigzag_contraction",
}

RULES: dict[str, str] = {
    "zigzag_ew_unary": "a pointwise function commutes with ZigzagShard(d)",
    "zigzag_ew_binary": "a pointwise function of operands zig-zag sharded on the same dim is zig-zag sharded on it",
    "zigzag_ew_binary_broadcast": "a zig-zag sharded operand combined pointwise with a replicated operand broadcast "
                                  "along the shard dim stays zig-zag sharded",
    "zigzag_rowwise": "an op computed independently for each index of a dim commutes with zig-zag sharding that dim",
    "zigzag_rowwise2": "a two-operand op computed independently for each index of a dim commutes with zig-zag "
                       "sharding that dim in both operands",
    "zigzag_reduce_sum": "summing over the zig-zag sharded dim gives Partial(sum)",
    "zigzag_reduce_max": "max over the zig-zag sharded dim gives Partial(max)",
    "zigzag_reduce_mean": "averaging over the zig-zag sharded dim gives Partial(avg)",
    "zigzag_contraction": "contracting the zig-zag sharded dim of two operands sharded alike gives Partial(sum)",
    "zigzag_reshape": "a reshape merging trailing elements into the zig-zag dim, or splitting them off, keeps the "
                      "zig-zag order when a chunk fills whole rows of the result",
    "zigzag_from_slices": "rank r concatenating chunks r and 2p-1-r of 2p chunks of a replicated tensor holds "
                          "its ZigzagShard (pattern, kernel/zigzag.py)",
    "zigzag_all_gather": "all_gather of ZigzagShard(d) put back in natural order (heads, then the flipped tails) is "
                         "Replicate (pattern, kernel/zigzag.py)",
    "zigzag_reduce_scatter": "reduce_scatter of Partial(sum) rows put in zig-zag order (chunks r and 2p-1-r side by "
                             "side) is ZigzagShard(d) (pattern, kernel/zigzag.py)",
    "ring_attention_zigzag": "ring attention over zig-zag key blocks is softmax attention over all keys; query "
                             "blocks in zig-zag order cover every query once",
}


def Z(d: int) -> Placement:
    return Placement("Z", d)


def zigzag_axes(facts: Sequence[Fact]) -> list[int]:
    return sorted({j for f in facts for j, p in enumerate(f.pl) if p.kind == "Z"})


def derive_zigzag(kc: KCtx, op: str, ra: Mapping[str, Any], raw: Mapping[str, Any], facts: Sequence[Fact],
                  fam: Callable, zax: Sequence[int]) -> Derivation:
    """The Shard rule of ``op`` read on zig-zag axes ``zax``, accepted only where a zig-zag theorem covers it."""
    for j in zax:
        bad = [str(f.pl[j]) for f in facts if f.pl[j].kind not in ("Z", "R")]
        if bad:
            raise RuleFailure(f"{op} over {kc.axes[j]!r}: a ZigzagShard operand with {bad[0]}: no rule mixes the "
                              f"zig-zag order with another placement on one axis")
    as_shard = [Fact(f.expr, tuple(Placement("S", p.dim) if p.kind == "Z" else p for p in f.pl)) for f in facts]
    d = fam(kc, op, ra, raw, as_shard)
    category = REGISTRY[op].category
    if category == "collective":
        over = {kc.axes.index(a) for a in axes_of(ra) if a in kc.axes}
        if over & set(zax):
            raise RuleFailure(f"{op} over {kc.axes[min(over & set(zax))]!r}, which holds a ZigzagShard: the "
                              f"collective's rules assume contiguous blocks")
        rules = list(d.rules)
    else:
        if len(d.rules) != len(kc.axes):
            raise RuleFailure(f"{op}: no zig-zag reading of its rule")
        rules = list(d.rules)
        for j in zax:
            got = ZIGZAG_OF.get(rules[j])
            if got is None:
                raise RuleFailure(f"{op} over {kc.axes[j]!r}: {rules[j]} relies on contiguous blocks; it has no "
                                  f"zig-zag counterpart")
            rules[j] = _reshape_rule(kc, facts[0], d.facts[0], j) if rules[j] == "reshape_shard_block" else got
    out = []
    for f in d.facts:
        pl = list(f.pl)
        for j in zax:
            if pl[j].kind == "S":
                pl[j] = Z(pl[j].dim)
            elif pl[j].kind == "R":
                raise RuleFailure(f"{op} over {kc.axes[j]!r}: a zig-zag operand gave a replicated result")
        out.append(Fact(f.expr, tuple(pl)))
    return Derivation(out, rules)


def _reshape_rule(kc: KCtx, fin: Fact, fout: Fact, j: int) -> str:
    """The Shard rule already found the zig-zag dim leading its reshape group on both sides.  Merging T_in
    trailing elements into a row and splitting T_out off again keeps the zig-zag order when the rows of
    one chunk (size/2p of them, T_in elements each) fill whole output rows: (size/2p * T_in) % T_out == 0
    (Coq: Zigzag.zigzag_reshape, chunk c*m of the merged dim <-> chunk c of the rows)."""
    X = kc.exprs
    a, b = X[fin.expr].shape, X[fout.expr].shape
    d_in, d_out = fin.pl[j].dim, fout.pl[j].dim
    ga, gb = next((ga, gb) for ga, gb in _groups(list(a), list(b)) if d_in in ga)
    t_in = _prod(a[x] for x in ga if x > d_in)
    t_out = _prod(b[y] for y in gb if y > d_out)
    if d_out not in gb or _prod(a[x] for x in ga) != _prod(b[y] for y in gb):
        raise RuleFailure(f"reshape {list(a)} -> {list(b)}: the zig-zag dim {d_in} is not carried by dim {d_out}")
    if t_in == 1 and t_out == 1:
        return "zigzag_rowwise"
    # this axis sees the dim as its outer axes left it (nested shards of the same dim)
    outer = _prod(kc.sizes[kc.axes[k]] for k in range(j) if fin.pl[k].kind in ("S", "Z") and fin.pl[k].dim == d_in)
    chunk = a[d_in] // outer // (2 * kc.sizes[kc.axes[j]])
    if (chunk * t_in) % t_out:
        raise RuleFailure(f"reshape {list(a)} -> {list(b)}: a zig-zag chunk of {chunk} rows of dim {d_in} does not "
                          f"fill whole rows of output dim {d_out}: the chunks would no longer line up")
    return "zigzag_reshape"


def zigzag_from_slices(g, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    """``concat(slice(X, d, r*c, r*c+c), slice(X, d, (2p-1-r)*c, (2p-r)*c), dim=d)`` on rank r of axis a, with X
    replicated over a and c = size/2p, is ZigzagShard(d) of X over a (Coq: Zigzag.zigzag_from_slices).
    This is how a program builds its zig-zag positions (RoPE angles, causal-mask rows) from a full iota."""

    producers = ProducersBefore(g, index)
    n = g.nodes[index]
    if n.op != "concat" or len(n.inputs) != 2:
        raise RuleFailure("not a concatenation of two tensors")
    env = kc.env0()
    dim = rank_free_attrs(n, kc)["dim"]
    sl = []
    for t in n.inputs:
        got = producers.get(t)
        if got is None or got[1].op != "slice":
            raise RuleFailure("the concatenated tensors are not both slices")
        sl.append(got)
    (i1, s1), (i2, s2) = sl
    if s1.inputs[0] != s2.inputs[0]:
        raise RuleFailure("the two chunks are sliced from different tensors")
    x_t = s1.inputs[0]
    if x_t not in facts:
        raise RuleFailure("the sliced tensor has no fact")
    f = facts[x_t]
    shape = kc.exprs[f.expr].shape
    dim %= len(shape)
    ra1, ra2 = (rank_free_attrs(s, kc, allowed=("start", "end")) for s in (s1, s2))
    if any(ra["dim"] % len(shape) != dim or ra.get("step", 1) != 1 for ra in (ra1, ra2)):
        raise RuleFailure(f"the chunks must be unit-step slices along the concatenation dim {dim}")
    for s in (s1, s2, n):
        other = {k: v for k, v in s.attrs.items() if not (s is not n and k in ("start", "end"))}
        if rank_axes_in(other):
            raise RuleFailure(f"{s.op} at {s.path}: only the chunk bounds may depend on the rank")
    names = set(rank_axes_in([s.attrs.get(k) for s in (s1, s2) for k in ("start", "end")]))
    if len(names) != 1 or next(iter(names)) not in kc.axes:
        raise RuleFailure("the chunk bounds must depend on exactly one mesh axis of the program")
    a = names.pop()
    j = kc.axes.index(a)
    p = kc.sizes[a]
    size = shape[dim]
    if size % (2 * p):
        raise RuleFailure(f"dim {dim} of size {size} does not split into 2 x {p} chunks")
    c = size // (2 * p)
    want = {"start": [(0, c), ((2 * p - 1) * c, -c)], "end": [(c, c), (2 * p * c, -c)]}
    for k, s in enumerate((s1, s2)):
        for key in ("start", "end"):
            got = affine_in_rank(s.attrs.get(key), env, a) if isinstance(s.attrs.get(key), (str, int)) else None
            if got != want[key][k]:
                raise RuleFailure(f"zig-zag chunk {k}: rank r slices {key}={s.attrs.get(key)!r}; rank r must take "
                                  f"chunks r and {2 * p - 1}-r of size {c}")
    if f.pl[j].kind != "R":
        raise RuleFailure(f"the zig-zag chunks must come from a tensor replicated over {a!r}, got {f.pl[j]}")
    per_axis = _carry_other_axes(kc, f, j, dim, Z(dim), "zigzag_from_slices")
    return conclude(kc, f.expr, per_axis, out_shape(n)), sorted({i1, i2})


# ---------------------------------------------------------------------------------------------- all-gather CP
# With all-gather context parallelism (Llama 3's) over zig-zag chunks, K and V are all-gathered (rank order:
# chunk r, chunk 2p-1-r per rank) and put back in natural order; their gradients are put in zig-zag order
# and reduce-scattered.  With dim d of the gathered tensor split as (p, 2, c) (rank, half, row):
#
#     forward:  natural = reshape(concat(G3[:, 0:1], flip(G3[:, 1:2], rank dim), dim=rank dim))
#     backward: zigzag  = reshape(swap(concat(D3[0:1], flip(D3[1:2], chunk dim)), half, chunk)), D3 = (2, p, c)
#
# (Coq: Zigzag.zigzag_all_gather_natural, zigzag_reduce_scatter_order.)

def _node(producers, t: str, ops: tuple[str, ...], what: str) -> tuple[int, Node]:
    got = producers.get(t)
    if got is None or got[1].op not in ops:
        raise RuleFailure(f"{what}: expected {' or '.join(ops)}")
    return got


def _attrs(n: Node, kc: KCtx) -> dict:
    return rank_free_attrs(n, kc)


def _carry_other_axes(kc: KCtx, f: Fact, j: int, dim: int, on_j: Placement, rule: str) -> list:
    """Placements of the result: ``on_j`` over axis j; elsewhere unchanged (replicated; sharded on another
    dim, since every op of the chain acts on each index of the other dims independently; or a partial sum,
    since the chain and the collective are linear)."""
    out = []
    for k, q in enumerate(f.pl):
        if k == j:
            out.append((on_j, rule))
        elif q.kind == "R":
            out.append((q, "replicate_any"))
        elif q.kind == "S" and q.dim != dim:
            out.append((q, "rowwise_shard"))
        elif q.kind == "P" and q.reduce in ("sum", "avg"):
            out.append((q, "partial_linear_map"))
        else:
            raise RuleFailure(f"axis {kc.axes[k]!r} holds {q}: only replicated, other-dim shards and partial sums "
                              f"are covered")
    return out


def _halves(producers, cat_t: str, kc: KCtx, split_dim: int, flip_dim: int) -> tuple[Node, list[int]]:
    """``concat(X3[k=0], flip(X3[k=1], flip_dim), dim=split_dim)`` with ``X3 = reshape(x)`` and ``X3[k=h]`` the
    unit slice h of the halves dim: ``split_dim + 1`` when the ranks lead (forward), else ``split_dim``
    (backward, where the halves lead).  Returns (the reshape X3, the matched op indices); the caller checks
    X3's shape."""
    ic, cat = _node(producers, cat_t, ("concat",), "the chunk order")
    if len(cat.inputs) != 2:
        raise RuleFailure("the chunk order: expected the first chunks and the flipped second chunks")
    i0, h0 = _node(producers, cat.inputs[0], ("slice",), "first chunks")
    i1f, h1f = _node(producers, cat.inputs[1], ("flip",), "second chunks reordered")
    i1, h1 = _node(producers, h1f.inputs[0], ("slice",), "second chunks")
    if h0.inputs[0] != h1.inputs[0]:
        raise RuleFailure("both chunk slices must read the same split tensor")
    i3, x3 = _node(producers, h0.inputs[0], ("reshape", "view"), "split of the rows")
    n = len(out_shape(x3))
    half_dim = split_dim + 1 if flip_dim == split_dim else split_dim
    for k, h in enumerate((h0, h1)):
        a = _attrs(h, kc)
        if a["dim"] % n != half_dim or (a["start"], a["end"], a.get("step", 1)) != (k, k + 1, 1):
            raise RuleFailure(f"chunk slice {k}: expected [{k}, {k + 1}) of dim {half_dim}")
    if sorted(x % n for x in _attrs(h1f, kc)["dims"]) != [flip_dim]:
        raise RuleFailure(f"the second chunks must be flipped along dim {flip_dim} (and nothing else)")
    if _attrs(cat, kc)["dim"] % n != split_dim:
        raise RuleFailure(f"the chunks must be concatenated along dim {split_dim}")
    return x3, [ic, i0, i1f, i1, i3]


def _axis_of(n: Node, kc: KCtx) -> tuple[str, int]:
    a = single_axis(n)
    if a is None or a not in kc.axes:
        raise RuleFailure("the collective must run over one mesh axis of the program")
    return a, kc.axes.index(a)


def zigzag_all_gather(g, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    """all_gather over a of ZigzagShard(d), split (ranks, 2, rows) and put back in natural order (first chunks,
    then the second chunks flipped over the ranks), is Replicate over a."""
    producers = ProducersBefore(g, index)
    out = g.nodes[index]
    if out.op not in ("reshape", "view"):
        raise RuleFailure("not a reshape")
    gs = out_shape(out)  # the gathered rows, back in natural order
    cat = producer(producers, out.inputs[0])
    if cat is None or cat.op != "concat":
        raise RuleFailure("not the end of a chunk reorder")
    d = _attrs(cat, kc)["dim"] % (len(gs) + 2)  # the ranks' dim of the split is the gathered dim
    x3, matched = _halves(producers, out.inputs[0], kc, d, d)
    ig, gat = _node(producers, x3.inputs[0], ("all_gather",), "the gathered tensor")
    a, j = _axis_of(gat, kc)
    p = kc.sizes[a]
    if gat.inputs[0] not in facts or _attrs(gat, kc)["dim"] % len(gs) != d or out_shape(gat) != gs:
        raise RuleFailure("the reorder must split the gathered dim and merge back to the gathered shape")
    f = facts[gat.inputs[0]]
    if f.pl[j] != Z(d) or gs[d] % (2 * p) or out_shape(x3) != gs[:d] + (p, 2, gs[d] // (2 * p)) + gs[d + 1:]:
        raise RuleFailure(f"the gathered tensor must be ZigzagShard({d}) over {a!r}, split (ranks {p}, 2, rows)")
    return conclude(kc, f.expr, _carry_other_axes(kc, f, j, d, R, "zigzag_all_gather"), gs), sorted([ig, *matched])


def zigzag_reduce_scatter(g, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    """reduce_scatter(sum) over a of Partial(sum) rows split (2, chunks, rows), with the second half flipped
    over the chunks and paired with the first (chunks r and 2p-1-r side by side), is ZigzagShard(d) over a."""
    producers = ProducersBefore(g, index)
    out = g.nodes[index]
    if out.op != "reduce_scatter":
        raise RuleFailure("not a reduce_scatter")
    # tried at every reduce_scatter (a priority pattern): the cheap structural checks first
    iz, zf = _node(producers, out.inputs[0], ("reshape", "view"), "zig-zag rows")
    it, tr = _node(producers, zf.inputs[0], ("permute", "transpose"), "chunks before halves")
    if _attrs(out, kc).get("reduce", "sum") != "sum":
        raise RuleFailure("not a reduce_scatter(sum)")
    a, j = _axis_of(out, kc)
    ys = out_shape(zf)
    d = _attrs(out, kc)["dim"] % len(ys)
    p = kc.sizes[a]
    n = len(ys) + 2
    swap = list(range(n))
    swap[d], swap[d + 1] = d + 1, d
    ta = _attrs(tr, kc)
    got = [x % n for x in ta["dims"]] if tr.op == "permute" else \
        (swap if {ta["dim0"] % n, ta["dim1"] % n} == {d, d + 1} else None)
    if got != swap:
        raise RuleFailure("halves and chunks must be swapped before the rows are merged")
    x3, matched = _halves(producers, tr.inputs[0], kc, d, d + 1)
    if x3.inputs[0] not in facts:
        raise RuleFailure("the split rows have no fact")
    f = facts[x3.inputs[0]]
    if f.pl[j] != Placement("P", reduce="sum") or ys[d] % (2 * p):
        raise RuleFailure(f"the rows must be Partial(sum) over {a!r} in 2 x {p} chunks")
    if out_shape(x3) != ys[:d] + (2, p, ys[d] // (2 * p)) + ys[d + 1:] or \
            local_shape(kc.exprs[f.expr].shape, kc.axes, f.pl, kc.sizes) != ys:
        raise RuleFailure(f"the rows must be split as (2, chunks {p}, rows) and merged back to their own shape")
    per_axis = _carry_other_axes(kc, f, j, d, Z(d), "zigzag_reduce_scatter")
    return conclude(kc, f.expr, per_axis, out_shape(out)), sorted([iz, it, *matched])
