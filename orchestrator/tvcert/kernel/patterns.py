"""Rules whose premises span several ops: recognized on the program graph, concluded at the last op.

``vocab_parallel_embedding`` (Megatron, DTensor MaskPartial; also the target-logit pick of Megatron's
vocab-parallel cross-entropy, a gather along the vocab dim, where the theorem applies per token): with the embedding table sharded
by vocabulary rows over axis a (block B = V/p), every rank looks up ``ids - rank*B`` in its
rows, zeroing tokens outside its block:

    m   = (ids < rank*B) | (ids >= rank*B + B)
    lid = where(m, 0, ids - rank*B)          (or masked_fill(ids - rank*B, m, 0))
    out = where(m[..., None], 0, embedding(W_local, lid))   (or masked_fill)

Then ``out`` is Partial(sum) over a of ``embedding(W, ids)`` (Coq: vocab_parallel_embedding).
The intermediate ops carry rank-dependent values and get no fact of their own; the match
checks every one of them, including that the offsets are exactly ``rank*B``.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from ..graph import Graph, Node
from ..ops import REGISTRY, resolve_attrs
from ..shapes import affine_in_rank, rank_axes_in
from .producers import ProducersBefore, appends_unit_dim, out_shape, producer, rank_free_attrs, shape_of, single_axis
from .rules import Derivation, Fact, KCtx, P, R, RuleFailure, S, conclude, embedding_backward_axis

Producers = Mapping[str, tuple[int, Node]]


def _zero_const(n: Node | None) -> bool:
    return n is not None and n.op == "const" and n.attrs.get("value") in (0, 0.0) and not n.attrs.get("shape")


def _masked(n: Node, producers: Producers) -> tuple[str, str] | None:
    """(value tensor, mask tensor) of ``where(mask, 0, value)`` or ``masked_fill(value, mask, 0)``."""
    if n.op == "where" and _zero_const(producer(producers, n.inputs[1])):
        return n.inputs[2], n.inputs[0]
    if n.op == "masked_fill" and n.attrs.get("value") in (0, 0.0):
        return n.inputs[0], n.inputs[1]
    return None


def _rank_affine(value: Any, kc: KCtx, axis: str) -> tuple[int, int] | None:
    try:
        return affine_in_rank(value, kc.env0(), axis)
    except ValueError:
        return None


def _const_value(n: Node | None) -> Any:
    return n.attrs.get("value") if n is not None and n.op == "const" and not n.attrs.get("shape") else None


def _lookup(producers: Producers, val_t: str, outer_mask: str, facts, kc: KCtx):
    """The masked lookup: embedding rows of a vocab-sharded table, or the target logit picked (gather) from
    vocab-sharded logits.  Returns (kind, table, local ids, token mask, axis, block, table fact, axis index,
    tensors matched)."""
    val = producer(producers, val_t)
    if val is not None and val.op == "embedding":
        um = producer(producers, outer_mask)
        if not appends_unit_dim(producers, um, outer_mask):
            raise RuleFailure("the output mask is not the token mask with a trailing unit dim")
        table_t, lid_t, m_t, sdim, kind, pick = val.inputs[0], val.inputs[1], um.inputs[0], 0, "embedding", (outer_mask,)
    elif val is not None and val.op in ("reshape", "view", "squeeze"):
        gat = producer(producers, val.inputs[0])
        if gat is None or gat.op != "gather":
            raise RuleFailure("the masked value is not an embedding lookup or a picked logit")
        table_t, idx_t = gat.inputs
        ui = producer(producers, idx_t)
        if not appends_unit_dim(producers, ui, idx_t):
            raise RuleFailure("the gather index is not the local ids with a trailing unit dim")
        lid_t, m_t, kind, pick = ui.inputs[0], outer_mask, "gather", (val.inputs[0], idx_t)
        rows = shape_of(producers, lid_t)
        if rows is None or shape_of(producers, val.inputs[0]) != rows + (1,) or shape_of(producers, val_t) != rows \
                or shape_of(producers, m_t) != rows:
            raise RuleFailure("the picked logits, the mask and the local ids do not share the token shape")
        if table_t not in facts:
            raise RuleFailure("the logits have no fact")
        sdim = len(kc.exprs[facts[table_t].expr].shape) - 1
        if gat.attrs.get("dim") not in (-1, sdim):
            raise RuleFailure("the gather does not pick along the vocab (last) dim")
    else:
        raise RuleFailure("the masked value is not an embedding lookup or a picked logit")
    if table_t not in facts:
        raise RuleFailure("the vocab-sharded table has no fact")
    wf = facts[table_t]
    a, B = _vocab_axis(wf, sdim, kc)
    return kind, table_t, lid_t, m_t, a, B, wf, pick


def _vocab_axis(wf: Fact, sdim: int, kc: KCtx) -> tuple[str, int]:
    """The one axis sharding the table's vocab dim, and the block each rank holds."""
    axes = [a for a, p in zip(kc.axes, wf.pl) if p == S(sdim)]
    if len(axes) != 1:
        raise RuleFailure(f"the table is not Shard({sdim}) on exactly one axis")
    a = axes[0]
    V = kc.exprs[wf.expr].shape[sdim]
    if V % kc.sizes[a]:
        raise RuleFailure(f"vocabulary {V} does not split evenly over {a!r}")
    return a, V // kc.sizes[a]


def _local_ids(producers: Producers, lid_t: str, m_t: str, kc: KCtx, a: str, B: int) -> tuple[str, str, Node]:
    """``lid = where(m, 0, ids - rank.a*B)`` with ``m = (ids < rank.a*B) | (ids >= rank.a*B + B)``:
    returns (ids, the offset tensor, the mask node)."""
    lid = producer(producers, lid_t)
    inner = _masked(lid, producers) if lid is not None else None
    if inner is None or inner[1] != m_t:
        raise RuleFailure("local ids are not zeroed with the same token mask")
    ids_t, _ = _offset_ids(producers, inner[0], kc, a, B)
    m = producer(producers, m_t)
    _block_mask(producers, m, ids_t, kc, a, B, inside=False)
    return ids_t, inner[0], m


def _offset_ids(producers: Producers, off_t: str, kc: KCtx, a: str, B: int) -> tuple[str, list[str]]:
    """``ids - rank.a*B`` (add_scalar, or sub of a constant): returns (ids, the offset constant if any)."""
    off = producer(producers, off_t)
    if off is not None and off.op == "add_scalar" and _rank_affine(off.attrs.get("value"), kc, a) == (0, -B):
        return off.inputs[0], []
    if off is not None and off.op == "sub" and \
            _rank_affine(_const_value(producer(producers, off.inputs[1])), kc, a) == (0, B):
        return off.inputs[0], [off.inputs[1]]
    raise RuleFailure(f"local ids are not ids - rank.{a}*{B}")


def _block_mask(producers: Producers, m: Node | None, ids_t: str, kc: KCtx, a: str, B: int, inside: bool
                ) -> list[str]:
    """The token mask of rank a's block [rank.a*B, rank.a*B + B): ``(ids >= lo) & (ids < hi)`` when ``inside``,
    else ``(ids < lo) | (ids >= hi)``.  Returns the bound tensors."""
    join, want = ("logical_and", {"ge": (0, B), "lt": (B, B)}) if inside else ("logical_or", {"lt": (0, B), "ge": (B, B)})
    if m is None or m.op != join:
        raise RuleFailure(f"the token mask is not a {join} of two comparisons")
    sides, bounds = {}, []
    for t in m.inputs:
        c = producer(producers, t)
        if c is None or c.op not in want or c.inputs[0] != ids_t:
            raise RuleFailure("the token mask does not compare the same ids")
        sides[c.op] = _rank_affine(_const_value(producer(producers, c.inputs[1])), kc, a)
        bounds.append(c.inputs[1])
    if sides != want:
        raise RuleFailure(f"the token mask is not the block [rank.{a}*{B}, rank.{a}*{B}+{B})")
    return bounds


def _lookup_axes(kc: KCtx, a: str, wf: Fact, idf: Fact, rule: str, kind: str) -> list[tuple[Any, str]]:
    """Per axis of a masked lookup: Partial(sum) over the vocab axis ``a`` (ids replicated there); elsewhere
    replicated, or sharded by token (embedding rows: ids sharded; picked logits: both on the same dim)."""
    out: list[tuple[Any, str]] = []
    for j, b in enumerate(kc.axes):
        wp, ip = wf.pl[j], idf.pl[j]
        if b == a:
            if ip.kind != "R":
                raise RuleFailure(f"token ids must be replicated over {a!r}")
            out.append((P("sum"), rule))
        elif wp.kind == "R" and ip.kind == "R":
            out.append((R, "replicate_any"))
        elif ip.kind == "S" and (wp.kind == "R" if kind == "embedding" else wp == ip):
            out.append((ip, "rowwise_shard"))
        elif ip.kind == "Z" and (wp.kind == "R" if kind == "embedding" else wp == ip):  # load-balanced tokens
            out.append((ip, "zigzag_rowwise" if kind == "embedding" else "zigzag_rowwise2"))
        else:
            raise RuleFailure(f"axis {b!r}: table {wp}, ids {ip}: not covered")
    return out


def vocab_parallel_embedding(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    """Match the masked vocab-parallel lookup ending at node ``index``; returns the derivation and matched nodes."""
    producers: Producers = ProducersBefore(g, index)
    out = g.nodes[index]
    got = _masked(out, producers)
    if got is None:
        raise RuleFailure("not a masked embedding result")
    val_t, outer_mask = got
    look = _lookup(producers, val_t, outer_mask, facts, kc)
    kind, table_t, lid_t, m_t, a, B, wf, pick = look
    ids_t, inner_t, m = _local_ids(producers, lid_t, m_t, kc, a, B)
    if ids_t not in facts:
        raise RuleFailure("the token ids have no fact")
    idf = facts[ids_t]
    per_axis = _lookup_axes(kc, a, wf, idf, "vocab_parallel_embedding", kind)
    if kind == "embedding":
        expr = kc.exprs.mk("embedding", {}, [wf.expr, idf.expr])
    else:  # the target logit: gather along the last (vocab) dim at the ids, back to the ids' shape
        X = kc.exprs
        idx = X.mk("unsqueeze", {"dim": len(X[idf.expr].shape)}, [idf.expr])
        expr = X.mk("reshape", {"shape": X[idf.expr].shape}, [X.mk("gather", {"dim": len(X[wf.expr].shape) - 1},
                                                                      [wf.expr, idx])])
    matched = [producers[t][0] for t in (val_t, lid_t, inner_t) + tuple(m.inputs) + pick if t in producers]
    return conclude(kc, expr, per_axis, out_shape(out)), sorted(set(matched))


def _const_int(n: Node | None, kc: KCtx) -> Any:
    """A rank-independent integer constant (a literal, or a dim expression such as ``v/tp-1``)."""
    v = _const_value(n)
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and kc.axes:
        got = _rank_affine(v, kc, kc.axes[0])
        if got is not None and got[1] == 0 and all(_rank_affine(v, kc, a) == got for a in kc.axes):
            return got[0]
    return None


def _clamped_ids(producers: Producers, lid_t: str, kc: KCtx, a: str, B: int) -> tuple[str, list[str]]:
    """``lid = minimum(maximum(ids - rank.a*B, 0), B - 1)`` (torch's clamp): returns (ids, tensors matched)."""
    mn = producer(producers, lid_t)
    if mn is None or mn.op != "minimum":
        raise RuleFailure("the local ids are not clamped from above (minimum)")
    inner, hi = (mn.inputs if _const_int(producer(producers, mn.inputs[1]), kc) is not None else mn.inputs[::-1])
    if _const_int(producer(producers, hi), kc) != B - 1:
        raise RuleFailure(f"the local ids are not clamped to {B - 1}")
    mx = producer(producers, inner)
    if mx is None or mx.op != "maximum":
        raise RuleFailure("the local ids are not clamped from below (maximum)")
    off, lo = (mx.inputs if _const_int(producer(producers, mx.inputs[1]), kc) is not None else mx.inputs[::-1])
    if _const_int(producer(producers, lo), kc) != 0:
        raise RuleFailure("the local ids are not clamped at 0")
    ids_t, extra = _offset_ids(producers, off, kc, a, B)
    return ids_t, [lid_t, inner, off, hi, lo, *extra]


def vocab_parallel_embedding_clamped(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx
                                     ) -> tuple[Derivation, list[int]]:
    """torchtitan's vocab-parallel embedding: ``embedding(W_local, clamp(ids - rank*B, 0, B-1))`` times the
    float in-block mask ``(ids >= rank*B) & (ids < rank*B + B)`` is Partial(sum) over the vocab axis of
    ``embedding(W, ids)`` (Coq: vocab_parallel_embedding_clamped)."""
    producers: Producers = ProducersBefore(g, index)
    out = g.nodes[index]
    if out.op != "mul":
        raise RuleFailure("not a product")
    for e_t, m_t in (out.inputs, out.inputs[::-1]):
        emb = producer(producers, e_t)
        if emb is not None and emb.op == "embedding":
            break
    else:
        raise RuleFailure("not an embedding times a mask")
    cast = producer(producers, m_t)  # cast(unsqueeze(in_block, -1), float), as torch writes it
    um = producer(producers, cast.inputs[0]) if cast is not None and cast.op == "cast" else None
    nd = len(out_shape(out))
    if um is None or um.op != "unsqueeze" or um.attrs.get("dim") not in (-1, nd - 1):
        raise RuleFailure("the row mask is not the float in-block mask with a trailing unit dim")
    mask_chain = [m_t, cast.inputs[0], um.inputs[0]]
    n = producer(producers, um.inputs[0])
    table_t, lid_t = emb.inputs
    if table_t not in facts:
        raise RuleFailure("the vocab-sharded table has no fact")
    wf = facts[table_t]
    a, B = _vocab_axis(wf, 0, kc)
    ids_t, clamp_ts = _clamped_ids(producers, lid_t, kc, a, B)
    bounds = _block_mask(producers, n, ids_t, kc, a, B, inside=True)
    if ids_t not in facts:
        raise RuleFailure("the token ids have no fact")
    idf = facts[ids_t]
    per_axis = _lookup_axes(kc, a, wf, idf, "vocab_parallel_embedding_clamped", "embedding")
    expr = kc.exprs.mk("embedding", {}, [wf.expr, idf.expr])
    matched = [producers[x][0] for x in [e_t, *mask_chain, *clamp_ts, *n.inputs, *bounds] if x in producers]
    return conclude(kc, expr, per_axis, out_shape(out)), sorted(set(matched))


def _the_vocab_axis(kc: KCtx, match: Callable[[str], Any]) -> tuple[str, Any]:
    """The one mesh axis whose rank offsets ``match`` accepts (the axis sharding the vocabulary), with its match."""
    cands, last = [], RuleFailure("the program has no mesh axis")
    for a in kc.axes:
        try:
            cands.append((a, match(a)))
        except RuleFailure as exc:
            last = exc
    if len(cands) != 1:
        raise RuleFailure(str(last) if not cands else "the vocab block depends on several axes")
    return cands[0]


def vocab_parallel_embedding_backward(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx
                                      ) -> tuple[Derivation, list[int]]:
    """Megatron's VocabParallelEmbedding backward: ``embedding_backward(where(m[..., None], 0, dy), lid, B)``
    with the forward's local ids ``lid`` and token mask ``m`` is rank a's block of rows (Shard(0) over a) of
    the logical ``embedding_backward(dy, ids, p*B)`` (Coq: vocab_parallel_embedding_backward)."""
    producers: Producers = ProducersBefore(g, index)
    out = g.nodes[index]
    if out.op != "embedding_backward":
        raise RuleFailure("not an embedding backward")
    gm_t, lid_t = out.inputs
    got = _masked(producer(producers, gm_t), producers) if producer(producers, gm_t) is not None else None
    if got is None:
        raise RuleFailure("the gradient is not masked")
    dy_t, um_t = got
    um = producer(producers, um_t)
    if not appends_unit_dim(producers, um, um_t):
        raise RuleFailure("the gradient mask is not the token mask with a trailing unit dim")
    m_t = um.inputs[0]
    B = rank_free_attrs(out, kc)["num_weights"]
    a, (ids_t, inner_t, m) = _the_vocab_axis(kc, lambda a: _local_ids(producers, lid_t, m_t, kc, a, B))
    d = _embedding_backward_block(out, facts, kc, a, B, dy_t, ids_t, "vocab_parallel_embedding_backward")
    matched = [producers[t][0] for t in (gm_t, um_t, lid_t, inner_t) + tuple(m.inputs) if t in producers]
    return d, sorted(set(matched))


def _embedding_backward_block(out: Node, facts: Mapping[str, Fact], kc: KCtx, a: str, B: int, dy_t: str,
                              ids_t: str, rule: str) -> Derivation:
    """Shard(0) over ``a`` (rank a's block of B rows) of ``embedding_backward(dy, ids, p*B)``."""
    if dy_t not in facts or ids_t not in facts:
        raise RuleFailure("the output gradient or the token ids have no fact")
    fg, fi = facts[dy_t], facts[ids_t]
    X = kc.exprs
    V = B * kc.sizes[a]
    expr = X.mk("embedding_backward", {"num_weights": V}, [fg.expr, fi.expr])
    rank = len(X[fg.expr].shape)
    per_axis: list[tuple[Any, str]] = []
    for j, b in enumerate(kc.axes):
        pg, pi = fg.pl[j], fi.pl[j]
        if b == a:
            if pg.kind != "R" or pi.kind != "R":
                raise RuleFailure(f"the output gradient and the ids must be replicated over {a!r}")
            per_axis.append((S(0), rule))
            continue
        got = embedding_backward_axis(pg, pi, rank)
        if got is None or got[0] == S(1):  # the gradient's hidden dim sharded: not with a vocab-sharded result
            raise RuleFailure(f"axis {b!r}: gradient {pg}, ids {pi}: not covered")
        per_axis.append(got)
    return conclude(kc, expr, per_axis, out_shape(out))


def vocab_parallel_embedding_clamped_backward(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx
                                              ) -> tuple[Derivation, list[int]]:
    """torchtitan's vocab-parallel embedding backward: ``embedding_backward(dy * float(in_block[..., None]),
    clamp(ids - rank*B, 0, B-1), B)`` with the in-block mask ``(ids >= rank*B) & (ids < rank*B + B)`` is rank
    a's block of rows (Shard(0) over a) of ``embedding_backward(dy, ids, p*B)`` (Coq:
    vocab_parallel_embedding_clamped_backward)."""
    producers: Producers = ProducersBefore(g, index)
    out = g.nodes[index]
    if out.op != "embedding_backward":
        raise RuleFailure("not an embedding backward")
    gm_t, lid_t = out.inputs
    gm = producer(producers, gm_t)
    if gm is None or gm.op != "mul":
        raise RuleFailure("the gradient is not multiplied by a mask")
    for dy_t, c_t in (gm.inputs, gm.inputs[::-1]):
        cast = producer(producers, c_t)
        if cast is not None and cast.op == "cast":
            break
    else:
        raise RuleFailure("the gradient is not multiplied by a float mask")
    um = producer(producers, cast.inputs[0])
    n = producer(producers, um.inputs[0]) if um is not None and um.op in ("unsqueeze", "reshape", "view") else None
    if n is None or out_shape(um) != out_shape(n) + (1,) or out_shape(gm) != out_shape(producer(producers, dy_t) or gm):
        raise RuleFailure("the gradient mask is not the float in-block mask with a trailing unit dim")
    B = rank_free_attrs(out, kc)["num_weights"]
    def clamped(a):
        ids_t, clamp_ts = _clamped_ids(producers, lid_t, kc, a, B)
        return ids_t, clamp_ts + _block_mask(producers, n, ids_t, kc, a, B, inside=True)

    a, (ids_t, ts) = _the_vocab_axis(kc, clamped)
    d = _embedding_backward_block(out, facts, kc, a, B, dy_t, ids_t, "vocab_parallel_embedding_clamped_backward")
    matched = [producers[t][0] for t in (gm_t, c_t, cast.inputs[0], um.inputs[0], *n.inputs, *ts) if t in producers]
    return d, sorted(set(matched))


# ---------------------------------------------------------------------------------------------- loss parallel
# torchtitan's ``_LossParallelCrossEntropy`` (sum reduction, ignore_index) on logits x sharded by vocabulary
# blocks (Shard(last) over axis a, block B = V/p), as the ATen trace spells it:
#
#     m  = all_reduce_max_a(amax(x, -1, keepdim))          ls = (x - m) - log(all_reduce_sum_a(sum(exp(x - m), -1, keepdim)))
#     t' = where(l != ig, l, 0)                             out = (t' < rank*B) | (t' >= rank*B + B)
#     lid = where(out, 0, t' - rank*B)
#     loss_tok = where(l != ig, -squeeze(all_reduce_sum_a(where(out[:, None], 0, gather(ls, lid[:, None])))), 0)
#     dx = (where(one_hot(lid, B), (float(out) - 1)[:, None], 0) + exp(ls)) * where((l != ig)[:, None], g, 0)
#
# The logical graph (the same code at degree 1, aten.py) is log_softmax(x), neg(sum(mul(ls, one_hot(l, V)), -1))
# and log_softmax_backward(mul(neg(one_hot(l, V)), g), ls).  Each pattern concludes that logical form
# (Coq: LossParallel.vocab_parallel_log_softmax / vocab_parallel_nll_loss / vocab_parallel_nll_backward).
# The logical one_hot is defined for labels in [0, V) only, so the ignore index must lie outside [0, V).
# Labels whose range admits the ignore index (padded with -100) get the masked form the logical graph has
# (aten.py keeps cross-entropy's mask then): with t' = where(l != ig, l, 0), where(l != ig, neg(sum(mul(ls,
# one_hot(t', V)))), 0) and log_softmax_backward(mul(neg(one_hot(t', V)), where((l != ig)[..., None], g, 0)), ls)
# -- the Coq theorems' one_hot_keep (keep = l != ig, t = t'), whose plain form is the keep = true case.

def _keeps_ignored(kc: KCtx, lf: Fact, ig: int) -> bool:
    """The labels may hold the ignore index: their interval (the plan's int ranges) does not exclude it."""
    from .int_range import interval

    iv = interval(kc.exprs, lf.expr, kc.ranges)
    return iv is None or iv[0] <= ig <= iv[1]


def _safe_target(kc: KCtx, lf: Fact, ig: int) -> tuple[int, int]:
    """(keep, t') = (l != ig, where(l != ig, l, 0)), spelled as the logical graph's cross-entropy spells them."""
    X = kc.exprs
    keep = X.mk("ne", {}, [lf.expr, X.mk("const", {"value": ig, "shape": (), "dtype": "int"}, [])])
    return keep, X.mk("where", {}, [keep, lf.expr, X.mk("const", {"value": 0, "shape": (), "dtype": "int"}, [])])


def _all_reduce_over(n: Node | None, reduce: str) -> str | None:
    """The one axis of ``all_reduce(reduce)``, else None."""
    if n is None or n.op != "all_reduce" or n.attrs.get("reduce", "sum") != reduce:
        return None
    return single_axis(n)


def _reduce_dims(n: Node, nd: int) -> list[int] | None:
    dims = n.attrs.get("dims")
    if not isinstance(dims, list) or not all(isinstance(d, int) for d in dims):
        return None
    return sorted({d % nd for d in dims})


def _mk(kc: KCtx, op: str, attrs: Mapping[str, Any], args: list[int]) -> int:
    try:
        return kc.exprs.mk(op, resolve_attrs(REGISTRY[op], attrs, kc.env0()), args)
    except (ValueError, KeyError) as exc:
        raise RuleFailure(f"the concluded expression is ill-formed: {exc}") from None


def _row_axes(kc: KCtx, a: str, xf: Fact, lf: Fact | None, rule: str, on_a: Any) -> list[tuple[Any, str]]:
    """Per axis of a row-wise (last-dim) vocab-parallel result: ``on_a`` over the vocab axis ``a`` (labels
    replicated there); elsewhere replicated, or sharded on the same non-vocab dim as the labels."""
    nd = len(kc.exprs[xf.expr].shape)
    out: list[tuple[Any, str]] = []
    for j, b in enumerate(kc.axes):
        xp, lp = xf.pl[j], (lf.pl[j] if lf is not None else None)
        if b == a:
            if lp is not None and lp.kind != "R":
                raise RuleFailure(f"the labels must be replicated over {a!r}")
            out.append((on_a, rule))
        elif xp.kind == "R" and (lp is None or lp.kind == "R"):
            out.append((R, "replicate_any"))
        elif xp.kind == "S" and xp.dim < nd - 1 and (lp is None or lp == xp):
            out.append((xp, "rowwise_shard"))
        elif xp.kind == "Z" and xp.dim < nd - 1 and (lp is None or lp == xp):  # load-balanced (CP) rows
            out.append((xp, "zigzag_rowwise" if lp is None else "zigzag_rowwise2"))
        else:
            raise RuleFailure(f"axis {b!r}: logits {xp}, labels {lp}: not covered")
    return out


def vocab_parallel_log_softmax(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx
                               ) -> tuple[Derivation, list[int]]:
    """``(x - m) - log(all_reduce_sum_a(sum(exp(x - m), d, keepdim)))`` with ``m = all_reduce_max_a(amax(x, d,
    keepdim))`` and x Shard(d) over a (d the last dim) is Shard(d) over a of ``log_softmax(x, d)``."""
    producers: Producers = ProducersBefore(g, index)
    out = g.nodes[index]
    if out.op != "sub":
        raise RuleFailure("not a difference")
    s1_t, lg_t = out.inputs
    lg = producer(producers, lg_t)
    if lg is None or lg.op != "log":
        raise RuleFailure("the subtrahend is not a log")
    ar = producer(producers, lg.inputs[0])
    a_sum = _all_reduce_over(ar, "sum")
    sm = producer(producers, ar.inputs[0]) if a_sum else None
    ex = producer(producers, sm.inputs[0]) if sm is not None and sm.op == "sum" else None
    if ex is None or ex.op != "exp" or ex.inputs[0] != s1_t:
        raise RuleFailure("the log is not of an all_reduce(sum) of sum(exp(the shifted logits))")
    s1 = producer(producers, s1_t)
    if s1 is None or s1.op != "sub":
        raise RuleFailure("the shifted logits are not x - m")
    x_t, m_t = s1.inputs
    arm = producer(producers, m_t)
    a_max = _all_reduce_over(arm, "max")
    am = producer(producers, arm.inputs[0]) if a_max else None
    if am is None or am.op != "amax" or am.inputs[0] != x_t:
        raise RuleFailure("the shift is not an all_reduce(max) of amax of the same logits")
    if x_t not in facts:
        raise RuleFailure("the logits have no fact")
    xf = facts[x_t]
    nd = len(kc.exprs[xf.expr].shape)
    d = nd - 1
    for red in (am, sm):
        if _reduce_dims(red, nd) != [d] or red.attrs.get("keepdim") is not True:
            raise RuleFailure(f"{red.op} is not over the last dim with keepdim")
    a, _ = _vocab_axis(xf, d, kc)
    if a_max != a or a_sum != a:
        raise RuleFailure(f"the max and the sum are not all-reduced over the vocab axis {a!r}")
    expr = _mk(kc, "log_softmax", {"dim": d}, [xf.expr])
    d_ = conclude(kc, expr, _row_axes(kc, a, xf, None, "vocab_parallel_log_softmax", S(d)), out_shape(out))
    matched = [producers[t][0] for t in (s1_t, m_t, arm.inputs[0], ex.outputs[0], sm.outputs[0],
                                        lg.inputs[0], lg_t) if t in producers]
    return d_, sorted(set(matched))


def _ignore_test(producers: Producers, keep_t: str, kc: KCtx) -> tuple[str, int]:
    """``labels != ig`` with a constant integer ``ig``: (labels, ig)."""
    ne = producer(producers, keep_t)
    if ne is None or ne.op != "ne":
        raise RuleFailure("the token filter is not labels != ignore_index")
    ig = _const_int(producer(producers, ne.inputs[1]), kc)
    if ig is None:
        raise RuleFailure("the ignore index is not an integer constant")
    return ne.inputs[0], ig


def _safe_target_local_ids(producers: Producers, lid_t: str, m_t: str, kc: KCtx, a: str, B: int,
                           lbl_t: str, ig: int) -> list[str]:
    """``lid = where(m, 0, t' - rank.a*B)``, ``m`` the out-of-block mask of ``t'``, and
    ``t' = where(labels != ig, labels, 0)`` with the same labels and ignore index.  Returns the tensors matched."""
    lid = producer(producers, lid_t)
    inner = _masked(lid, producers) if lid is not None else None
    if inner is None or inner[1] != m_t:
        raise RuleFailure("the local ids are not zeroed with the same out-of-block mask")
    ids_t, extra = _offset_ids(producers, inner[0], kc, a, B)
    bounds = _block_mask(producers, producer(producers, m_t), ids_t, kc, a, B, inside=False)
    st, lb, units = _unit_safe_target(producers, ids_t, lbl_t)
    if st is None or st.op != "where" or st.inputs[1] != lb or _const_int(producer(producers, st.inputs[2]), kc) != 0:
        raise RuleFailure("the target is not where(labels != ignore_index, labels, 0) of the same labels")
    if _ignore_test(producers, st.inputs[0], kc) != (lb, ig):
        raise RuleFailure("the target's ignore test differs from the loss's")
    m = producer(producers, m_t)
    return [lid_t, inner[0], m_t, *m.inputs, *bounds, *extra, *units]


def _drops_unit_dim(producers: Producers, n: Node | None, t: str) -> bool:
    """``t`` is ``n``'s input with its trailing unit dim removed (``x[..., 0]`` as squeeze / reshape / view)."""
    if n is None or n.op not in ("squeeze", "reshape", "view") or not n.inputs:
        return False
    src, dst = shape_of(producers, n.inputs[0]), shape_of(producers, t)
    return src is not None and dst is not None and src == dst + (1,)


def _unit_safe_target(producers: Producers, ids_t: str, lbl_t: str) -> tuple[Node | None, str, list[str]]:
    """The op computing the safe target ``t' = where(l != ig, l, 0)`` behind ``ids_t``, the labels it must read
    and the unit-dim tensors passed.  torchtitan: ``ids_t`` is t'.  DTensor's loss_parallel carries a trailing
    unit dim through the elementwise id chain, which changes no token's value: ``ids_t = t'[:, None]`` (forward),
    or ``ids_t = squeeze(where(l[:, None] != ig, l[:, None], 0))`` (backward)."""
    st = producer(producers, ids_t)
    if appends_unit_dim(producers, st, ids_t):
        return producer(producers, st.inputs[0]), lbl_t, [st.inputs[0]]
    if _drops_unit_dim(producers, st, ids_t):
        w = producer(producers, st.inputs[0])
        u_t = w.inputs[1] if w is not None and w.op == "where" else None
        u = producer(producers, u_t) if u_t else None
        if u is None or not appends_unit_dim(producers, u, u_t) or u.inputs[0] != lbl_t:
            raise RuleFailure("the squeezed target is not where(l[:, None] != ig, l[:, None], 0) of the same labels")
        return w, u_t, [st.inputs[0], u_t]
    return st, lbl_t, []


def _check_labels(lbl_t: str, ig: int, facts: Mapping[str, Fact], kc: KCtx, lsf: Fact, V: int) -> Fact:
    if ig in range(V):
        raise RuleFailure(f"the ignore index {ig} is a class of the {V}-way vocabulary")
    if lbl_t not in facts:
        raise RuleFailure("the labels have no fact")
    lf = facts[lbl_t]
    X = kc.exprs
    if X[lf.expr].dtype != "int" or X[lf.expr].shape != X[lsf.expr].shape[:-1]:
        raise RuleFailure("the labels are not integers of the logits' row shape")
    return lf


def vocab_parallel_nll_loss(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx
                            ) -> tuple[Derivation, list[int]]:
    """``where(l != ig, -squeeze(all_reduce_sum_a(where(out[:, None], 0, gather(ls, lid[:, None])))), 0)`` with
    ``lid``, ``out`` the block-local id and out-of-block mask of ``t' = where(l != ig, l, 0)`` and ls Shard(last)
    over a is Replicate over a of ``neg(sum(mul(ls, one_hot(l, V)), last))``."""
    producers: Producers = ProducersBefore(g, index)
    out = g.nodes[index]
    if out.op != "where" or not _zero_const(producer(producers, out.inputs[2])):
        raise RuleFailure("not where(keep, ., 0)")
    lbl_t, ig = _ignore_test(producers, out.inputs[0], kc)
    neg = producer(producers, out.inputs[1])
    sq = producer(producers, neg.inputs[0]) if neg is not None and neg.op == "neg" else None
    if sq is None or sq.op not in ("squeeze", "reshape", "view"):
        raise RuleFailure("the kept value is not minus the picked target logit")
    ar = producer(producers, sq.inputs[0])
    a0 = _all_reduce_over(ar, "sum")
    mk = producer(producers, ar.inputs[0]) if a0 else None
    got = _masked(mk, producers) if mk is not None else None
    if got is None:
        raise RuleFailure("the picked target logit is not an all_reduce(sum) of a masked pick")
    val_t, um_t = got
    gat, um = producer(producers, val_t), producer(producers, um_t)
    if gat is None or gat.op != "gather" or um is None:
        raise RuleFailure("the masked value is not a gather masked by the out-of-block mask")
    ls_t, idx_t = gat.inputs
    ui = producer(producers, idx_t)
    if ui is None:
        raise RuleFailure("the gather index is not the local ids")
    # torchtitan: lid[:, None] and out[:, None]; DTensor's loss_parallel: both already carry the unit dim
    unit_first = ui.op not in ("unsqueeze", "reshape", "view") and um.op not in ("unsqueeze", "reshape", "view")
    if not unit_first and (ui.op not in ("unsqueeze", "reshape", "view") or um.op not in ("unsqueeze", "reshape", "view")):
        raise RuleFailure("the gather index and the mask do not both get their trailing unit dim at the pick")
    if ls_t not in facts:
        raise RuleFailure("the log-probabilities have no fact")
    lsf = facts[ls_t]
    X = kc.exprs
    nd = len(X[lsf.expr].shape)
    if gat.attrs.get("dim") not in (-1, nd - 1):
        raise RuleFailure("the gather does not pick along the vocab (last) dim")
    a, B = _vocab_axis(lsf, nd - 1, kc)
    if a0 != a:
        raise RuleFailure(f"the picked logit is not all-reduced over the vocab axis {a!r}")
    if unit_first:
        lid_t, m_t = idx_t, um_t
        rows = out_shape(sq)
        ok = out_shape(ui) == rows + (1,) and out_shape(um) == rows + (1,)
    else:
        lid_t, m_t = ui.inputs[0], um.inputs[0]
        rows = out_shape(producer(producers, lid_t)) if lid_t in producers else None
        ok = rows is not None and out_shape(ui) == rows + (1,) and out_shape(um) == rows + (1,)
    if not ok or out_shape(gat) != rows + (1,) or out_shape(sq) != rows:
        raise RuleFailure("the unit dims are not the trailing dim of the token shape")
    chain = _safe_target_local_ids(producers, lid_t, m_t, kc, a, B, lbl_t, ig)
    V = B * kc.sizes[a]
    lf = _check_labels(lbl_t, ig, facts, kc, lsf, V)
    masked = _keeps_ignored(kc, lf, ig)
    keep, tgt = _safe_target(kc, lf, ig) if masked else (None, lf.expr)
    oh = _mk(kc, "one_hot", {"num_classes": V}, [tgt])
    expr = _mk(kc, "neg", {}, [_mk(kc, "sum", {"dims": [nd - 1]}, [_mk(kc, "mul", {}, [lsf.expr, oh])])])
    if masked:
        expr = _mk(kc, "where", {}, [keep, expr, _mk(kc, "const", {"value": 0, "shape": [], "dtype": "float"}, [])])
    d_ = conclude(kc, expr, _row_axes(kc, a, lsf, lf, "vocab_parallel_nll_loss", R), out_shape(out))
    matched = [producers[t][0] for t in (out.inputs[1], neg.inputs[0], sq.inputs[0], ar.inputs[0], val_t, um_t,
                                        idx_t, *chain) if t in producers]
    return d_, sorted(set(matched))


def vocab_parallel_nll_backward(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx
                                ) -> tuple[Derivation, list[int]]:
    """``(where(one_hot(lid, B), (float(out) - 1)[:, None], 0) + exp(ls)) * where((l != ig)[:, None], g, 0)``
    with ``lid``, ``out`` as in the forward, ls Shard(last) over a and g a replicated scalar is Shard(last)
    over a of ``log_softmax_backward(mul(neg(one_hot(l, V)), g), ls)``."""
    producers: Producers = ProducersBefore(g, index)
    out = g.nodes[index]
    if out.op != "mul":
        raise RuleFailure("not a product")
    for s_t, w_t in (out.inputs, out.inputs[::-1]):
        s, w = producer(producers, s_t), producer(producers, w_t)
        if s is not None and s.op == "add" and w is not None and w.op == "where":
            break
    else:
        raise RuleFailure("not a sum times a filtered gradient")
    if not _zero_const(producer(producers, w.inputs[2])):
        raise RuleFailure("the gradient filter is not where(keep, g, 0)")
    uk = producer(producers, w.inputs[0])
    if uk is not None and uk.op == "ne":  # DTensor's loss_parallel: the test of the labels with a unit dim
        lu_t, ig = _ignore_test(producers, w.inputs[0], kc)
        lu = producer(producers, lu_t)
        if not appends_unit_dim(producers, lu, lu_t):
            raise RuleFailure("the gradient filter does not test the labels with a trailing unit dim")
        lbl_t = lu.inputs[0]
    elif uk is not None and uk.op in ("unsqueeze", "reshape", "view"):
        lbl_t, ig = _ignore_test(producers, uk.inputs[0], kc)
    else:
        raise RuleFailure("the gradient filter is not the token filter with a unit dim")
    g_t = w.inputs[1]
    for e_t, h_t in (s.inputs, s.inputs[::-1]):
        e, h = producer(producers, e_t), producer(producers, h_t)
        if e is not None and e.op == "exp" and h is not None and h.op == "where":
            break
    else:
        raise RuleFailure("the sum is not exp(log-probabilities) plus a masked one-hot")
    zz = producer(producers, h.inputs[2])
    if zz is None or zz.op != "const" or zz.attrs.get("value") not in (0, 0.0):
        raise RuleFailure("the one-hot term is not where(one_hot, v, 0)")
    oh, vv = producer(producers, h.inputs[0]), producer(producers, h.inputs[1])
    if oh is None or oh.op != "one_hot" or vv is None or vv.op not in ("unsqueeze", "reshape", "view"):
        raise RuleFailure("the one-hot term is not where(one_hot(lid), v[:, None], 0)")
    sv = producer(producers, vv.inputs[0])
    cast = producer(producers, sv.inputs[0]) if sv is not None and sv.op == "add_scalar" else None
    if cast is None or sv.attrs.get("value") not in (-1, -1.0) or cast.op != "cast" or \
            cast.attrs.get("dtype") != "float":
        raise RuleFailure("the one-hot value is not float(out) - 1")
    ls_t = e.inputs[0]
    if ls_t not in facts or g_t not in facts:
        raise RuleFailure("the log-probabilities or the gradient have no fact")
    lsf, gf = facts[ls_t], facts[g_t]
    X = kc.exprs
    nd = len(X[lsf.expr].shape)
    a, B = _vocab_axis(lsf, nd - 1, kc)
    if rank_free_attrs(oh, kc)["num_classes"] != B:
        raise RuleFailure(f"the local one-hot is not {B} wide")
    if X[gf.expr].shape != () or any(q.kind != "R" for q in gf.pl):
        raise RuleFailure("the gradient is not a replicated scalar (sum reduction)")
    lid_t, m_t = oh.inputs[0], cast.inputs[0]
    rows = out_shape(producer(producers, lid_t)) if lid_t in producers else None
    if rows is None or out_shape(vv) != rows + (1,) or out_shape(uk) != rows + (1,) or out_shape(h) != out_shape(out) \
            or shape_of(producers, lbl_t) not in (None, rows):
        raise RuleFailure("the unit dims are not the trailing dim of the token shape")
    chain = _safe_target_local_ids(producers, lid_t, m_t, kc, a, B, lbl_t, ig)
    V = B * kc.sizes[a]
    lf = _check_labels(lbl_t, ig, facts, kc, lsf, V)
    g = gf.expr
    tgt = lf.expr
    if _keeps_ignored(kc, lf, ig):  # the rows of ignored labels get no gradient
        keep, tgt = _safe_target(kc, lf, ig)
        keep1 = _mk(kc, "reshape", {"shape": list(X[keep].shape) + [1]}, [keep])
        g = _mk(kc, "where", {}, [keep1, g, _mk(kc, "const", {"value": 0, "shape": [], "dtype": "float"}, [])])
    go = _mk(kc, "mul", {}, [_mk(kc, "neg", {}, [_mk(kc, "one_hot", {"num_classes": V}, [tgt])]), g])
    expr = _mk(kc, "log_softmax_backward", {"dim": nd - 1}, [go, lsf.expr])
    d_ = conclude(kc, expr, _row_axes(kc, a, lsf, lf, "vocab_parallel_nll_backward", S(nd - 1)), out_shape(out))
    matched = [producers[t][0] for t in (s_t, h_t, h.inputs[0], h.inputs[1], vv.inputs[0], sv.inputs[0], w.inputs[0],
                                        *uk.inputs, *chain) if t in producers]
    return d_, sorted(set(matched))


from .ring import RULE as _RING, RULE_BWD as _RING_BWD, match_ring, match_ring_backward  # noqa: E402
from .zigzag import zigzag_all_gather, zigzag_from_slices, zigzag_reduce_scatter  # noqa: E402

def _rank_checked(fn: Callable, allowed: frozenset[tuple[str, str]]) -> Callable:
    """``fn`` with one more side condition, checked on every op it matched: every attribute is rank-free at
    every nesting level, except those in ``allowed`` (op, attribute), whose rank dependence ``fn`` checks
    exactly (offsets and bounds ``rank.a*B`` through :func:`shapes.affine_in_rank`, over every mesh axis)."""
    def run(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
        d, matched = fn(g, index, facts, kc)
        for i in (index, *matched):
            n = g.nodes[i]
            for k, v in n.attrs.items():
                if (n.op, k) not in allowed and rank_axes_in(v):
                    raise RuleFailure(f"{n.op} at {n.path}: attribute {k!r} depends on the rank, which "
                                      f"{fn.__name__} does not allow there")
        return d, matched
    run.__name__ = run.__qualname__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


_OFFSETS = frozenset({("const", "value"), ("add_scalar", "value")})  # checked exactly by _rank_affine
_NONE: frozenset[tuple[str, str]] = frozenset()

vocab_parallel_embedding = _rank_checked(vocab_parallel_embedding, _OFFSETS)
vocab_parallel_embedding_clamped = _rank_checked(vocab_parallel_embedding_clamped, _OFFSETS)
vocab_parallel_embedding_backward = _rank_checked(vocab_parallel_embedding_backward, _OFFSETS)
vocab_parallel_embedding_clamped_backward = _rank_checked(vocab_parallel_embedding_clamped_backward, _OFFSETS)
vocab_parallel_nll_loss = _rank_checked(vocab_parallel_nll_loss, _OFFSETS)
vocab_parallel_nll_backward = _rank_checked(vocab_parallel_nll_backward, _OFFSETS)
vocab_parallel_log_softmax = _rank_checked(vocab_parallel_log_softmax, _NONE)
match_ring = _rank_checked(match_ring, _NONE)
match_ring_backward = _rank_checked(match_ring_backward, _NONE)
zigzag_from_slices = _rank_checked(zigzag_from_slices, frozenset({("slice", "start"), ("slice", "end")}))
zigzag_all_gather = _rank_checked(zigzag_all_gather, _NONE)
zigzag_reduce_scatter = _rank_checked(zigzag_reduce_scatter, _NONE)

PATTERNS = {"vocab_parallel_embedding": vocab_parallel_embedding,
            "vocab_parallel_embedding_clamped": vocab_parallel_embedding_clamped,
            "vocab_parallel_embedding_backward": vocab_parallel_embedding_backward,
            "vocab_parallel_embedding_clamped_backward": vocab_parallel_embedding_clamped_backward,
            "vocab_parallel_nll_loss": vocab_parallel_nll_loss,
            "vocab_parallel_nll_backward": vocab_parallel_nll_backward,
            "vocab_parallel_log_softmax": vocab_parallel_log_softmax,
            _RING: match_ring, _RING_BWD: match_ring_backward,
            "zigzag_from_slices": zigzag_from_slices, "zigzag_all_gather": zigzag_all_gather,
            "zigzag_reduce_scatter": zigzag_reduce_scatter}
PATTERN_OPS = {"where", "masked_fill", "mul", "embedding_backward", "div", "ring_loop", "concat", "reshape", "view",
               "reduce_scatter"}
# Patterns tried even when every input has a fact: their conclusion (the logical form) replaces the op-by-op
# one, which is true but spelled differently from the logical graph.
PRIORITY_PATTERNS = {"vocab_parallel_log_softmax": vocab_parallel_log_softmax,
                     "zigzag_reduce_scatter": zigzag_reduce_scatter}
PRIORITY_OPS = {"sub", "reduce_scatter"}


from .gathered import RULE as _GATHERED, allgather_partial_sum  # noqa: E402  (all_gather of partial statistics, summed)

PATTERNS[_GATHERED] = allgather_partial_sum
PATTERN_OPS.add("sum")

from .ring_merge import RULE as _MERGE, RULE_BWD as _MERGE_BWD, match_merge, match_merge_backward  # noqa: E402

# torch's unrolled ring (kernel/ring_merge.py): slice offsets into the all-gathered K / V are rank-dependent,
# checked there exactly per ring coordinate
PATTERNS[_MERGE] = _rank_checked(match_merge, frozenset({("slice", "start"), ("slice", "end")}))
PATTERNS[_MERGE_BWD] = _rank_checked(match_merge_backward, frozenset({("slice", "start"), ("slice", "end")}))
PATTERN_OPS.update({"sub", "add"})

from .prefix_scan import MATCHERS as _SCANS  # noqa: E402

# cumsum over a sharded dim with a carried offset (kernel/prefix_scan.py): the coefficient row's rank-dependent
# attributes are evaluated there on every rank; every other matched op is checked rank-free there
PATTERNS.update(_SCANS)

from .vocab_pick import RULE as _PICK, RULE_BWD as _PICK_BWD  # noqa: E402
from .vocab_pick import vocab_parallel_target_logit, vocab_parallel_target_logit_backward  # noqa: E402

# Megatron's target-logit pick and its backward (kernel/vocab_pick.py): the block bounds and the offset are checked
# exactly by _block_mask / _offset_ids, as for vocab_parallel_embedding
PATTERNS[_PICK] = _rank_checked(vocab_parallel_target_logit, _OFFSETS)
PATTERNS[_PICK_BWD] = _rank_checked(vocab_parallel_target_logit_backward, _OFFSETS)

from .ring_causal import RULE as _CAUSAL, RULE_BWD as _CAUSAL_BWD, match_causal, match_causal_backward  # noqa: E402

# torch's causal ring over per-rank programs (kernel/ring_causal.py): the all-gather offsets and the mpmd selects'
# rank-indexed slices are rank-dependent, each resolved exactly per ring coordinate there
PATTERNS[_CAUSAL] = _rank_checked(match_causal, frozenset({("slice", "start"), ("slice", "end")}))
PATTERNS[_CAUSAL_BWD] = _rank_checked(match_causal_backward, frozenset({("slice", "start"), ("slice", "end")}))
PATTERN_OPS.update({"squeeze", "scale"})

from .zigzag_index import RULE as _ZZ_INDEX, zigzag_from_index_block  # noqa: E402

# torch's head-tail load balancer: rank r's block of a replica read at the balancer's permutation is its zig-zag
# shard (kernel/zigzag_index.py); tried before the slice's own rule (which reads it as a contiguous Shard of the
# permuted tensor: true, but not the layout the ring's rules take), the block bounds checked there exactly
_zz_index = _rank_checked(zigzag_from_index_block, frozenset({("slice", "start"), ("slice", "end")}))
PATTERNS[_ZZ_INDEX] = _zz_index
PRIORITY_PATTERNS[_ZZ_INDEX] = _zz_index
PATTERN_OPS.add("slice")
PRIORITY_OPS.add("slice")

from .iota_block import RULE as _IOTA_BLOCK, iota_rank_block  # noqa: E402

# a rank's positions written arange(r*n, (r+1)*n): its start checked exactly there (kernel/iota_block.py)
PRIORITY_PATTERNS[_IOTA_BLOCK] = _rank_checked(iota_rank_block, frozenset({("iota", "start")}))
PRIORITY_OPS.add("iota")
