"""A multi-op rule: cumsum over a sharded dim as each rank's local cumsum plus the carried offset.

Real code scans a sequence sharded over axis ``a`` (blocks of B rows along dim d) as

    tots = all_gather_a(sum(t, d, keepdim))            (or unsqueeze(sum(t, d), d): one row per rank)
    off  = sum(M * tots, d, keepdim)                    (or where(M, tots, 0), or M @ tots for a 2-D t, d = 0)
    y    = cumsum_local(t, d) + off

with ``M`` a rank-dependent coefficient row built from constants (``arange(p) < r`` cast to reals, row ``r`` of
``tril(ones(p, p), -1)``).  The IR spells cumsum as ``x @ triu(ones(B, B))`` along d (transposed there and back
when d is not last: frontends/aten.py's conversion), so ``cumsum_local`` is that spelling with a [B, B] mask.
``y`` is then Shard(d) over ``a`` of the logical cumsum spelled with the [p*B, p*B] mask
(``Rules/PrefixScan.v``: ``block_prefix_sum``).  The offset may also be read off a cumsum of the gathered totals,
``off = cumsum(tots, d)[rank] - tots[rank]`` (rows read as ``slice(., d, rank.a, rank.a + 1)``, maybe squeezed):
rule ``block_prefix_sum_scanned``, no coefficient row.  The gathered totals may be each rank's last row of its
own local scan (``y[-1:]``, the first row of a reversed scan) instead of ``sum(t, d)``: ``scan_last_row_total``
is cited beside the form's rule.  A reversed scan ``flip(cumsum_local(flip(t)))`` (both flips
along d) with a row ``[j > rank.a]`` (the ranks after it) is block r of ``flip(cumsum(flip(T)))``: ``block_suffix_sum``.

Side conditions, checked here: ``t`` is Shard(d) over exactly ``a`` and Replicate or Shard of another dim on every
other axis (no Partial); the local mask is ``triu(const 1 [B, B], 0)`` and p*B is the logical size; the totals are
of ``t`` itself (its fact), summed over exactly d, gathered over exactly ``a`` along d; the offset sums over exactly
the gathered dim and broadcasts as one row per block (shape t's with 1 at d, up to leading unit dims, through
reshapes that keep the row-major order); ``M`` is computed from constants alone, and evaluated exactly on every rank
of the mesh it is ``[j < rank.a]`` at every position along the gathered dim (or both rows of the scanned form are
read at exactly ``rank.a`` of the same gathered tensor, scanned with a [p, p] mask).  Every other matched op is
rank-free.
"""
from __future__ import annotations

import itertools
from typing import Mapping

import numpy as np

RULE = "block_prefix_sum"  # before the rules import: kernel/rules.py reads these at its end
RULE_SCANNED = "block_prefix_sum_scanned"
RULE_SUFFIX = "block_suffix_sum"
RULE_LAST_ROW = "scan_last_row_total"  # cited beside the others when the totals are read off the local scan
RULE_SUFFIX_SCATTERED = "block_suffix_sum_scattered"  # autograd's backward of block_prefix_sum
RULE_PREFIX_SCATTERED = "block_prefix_sum_scattered"  # autograd's backward of block_suffix_sum
RULE_FLIP_PAIRS = "scan_flip_pairs"  # cited beside the others when the scan sits inside pairs of flips
STATEMENTS = {
    RULE: "cumsum over a sharded dim: a block's local cumsum plus the sum of the earlier blocks' totals (an "
          "all_gather of the per-rank totals weighted by a coefficient row [j < rank]) is that block of the logical "
          "cumsum",
    RULE_SCANNED: "the same with the offset read off a cumsum of the gathered totals: cumsum(G)[rank] - G[rank]",
    RULE_SUFFIX: "a reversed scan flip(cumsum(flip(x))) over a sharded dim: a block's local reversed scan plus the "
                 "totals of the later blocks (coefficient row [j > rank]) is that block of the logical reversed scan",
    RULE_LAST_ROW: "a block's total is the last row of its cumsum (the first row of its reversed scan)",
    RULE_SUFFIX_SCATTERED: "a reversed scan over a sharded dim with the offset through a reduce_scatter: a block's "
                           "local reversed scan plus reduce_scatter of M[s] * (rank s's total), M[s][j] = [j < s], is that "
                           "block of the logical reversed scan (autograd's backward of the carried offset)",
    RULE_PREFIX_SCATTERED: "the same for a cumsum: the local cumsum plus reduce_scatter of M[s] * (rank s's total), "
                           "M[s][j] = [j > s], is that block of the logical cumsum",
    RULE_FLIP_PAIRS: "flipping twice along a dim is the identity (a scan inside pairs of flips is that scan)",
}

from ..graph import Graph, Node  # noqa: E402
from ..ops import REGISTRY, Ctx  # noqa: E402
from ..shapes import affine_in_rank  # noqa: E402
from .producers import ProducersBefore, out_shape, producer, rank_free_attrs, shape_of, single_axis  # noqa: E402
from .rules import Fact, KCtx, RuleFailure, conclude  # noqa: E402

# ops a coefficient row may be computed with (from constants only; evaluated exactly on every rank)
_COEF_OPS = frozenset({"const", "iota", "lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or",
                       "logical_not", "cast", "reshape", "view", "unsqueeze", "squeeze", "expand", "select", "slice",
                       "tril", "triu", "where", "add", "sub", "mul", "neg", "add_scalar", "transpose", "permute",
                       "flip"}) & frozenset(REGISTRY)
_REORDER_FREE = ("reshape", "view", "unsqueeze", "squeeze")  # keep the row-major order of the elements


def _node(producers, t: str, what: str) -> Node:
    n = producer(producers, t)
    if n is None:
        raise RuleFailure(f"{what} is not computed by an op before the scan")
    return n


def _transposes(n: Node, kc: KCtx, d: int, r: int) -> bool:
    if n.op != "transpose":
        return False
    at = rank_free_attrs(n, kc)
    return {at["dim0"] % r, at["dim1"] % r} == {d, r - 1}


def _scan_spelling(producers, lc_t: str, kc: KCtx):
    """The IR's cumsum ending at ``lc_t``: returns (scanned tensor, dim, [transpose in, matmul, triu, const,
    transpose out] with None where absent, the mask's shape)."""
    lc = _node(producers, lc_t, "the scan")
    outer = None
    if lc.op == "transpose":
        outer, mm = lc, _node(producers, lc.inputs[0], "the scan's product")
    else:
        mm = lc
    if mm.op != "matmul" or len(mm.inputs) != 2:
        raise RuleFailure("the scanned term is not the IR's cumsum (a matmul with triu(ones))")
    inner = None
    x_t = mm.inputs[0]
    r = len(out_shape(mm))
    if outer is None:
        d = r - 1
    else:
        inner = _node(producers, x_t, "the scan's transposed input")
        x_t = inner.inputs[0]
        if inner.op != "transpose" or r < 2:
            raise RuleFailure("the scan's input is not transposed to the last dim")
        at = rank_free_attrs(inner, kc)
        ds = {at["dim0"] % r, at["dim1"] % r}
        if r - 1 not in ds or len(ds) != 2:
            raise RuleFailure("the scan's input is not transposed with its last dim")
        d = min(ds)
        if not _transposes(outer, kc, d, r):
            raise RuleFailure("the scan's result is not transposed back")
    tri = _node(producers, mm.inputs[1], "the scan's mask")
    if tri.op != "triu" or rank_free_attrs(tri, kc).get("diagonal", 0) != 0:
        raise RuleFailure("the scan's mask is not triu(., 0)")
    one = _node(producers, tri.inputs[0], "the scan's ones")
    oat = rank_free_attrs(one, kc)
    if one.op != "const" or oat.get("value") not in (1, 1.0) or isinstance(oat.get("value"), bool):
        raise RuleFailure("the scan's mask is not of ones")
    rank_free_attrs(mm, kc)
    return x_t, d, (inner, mm, tri, one, outer), list(out_shape(one))


def _flips(n: Node | None, kc: KCtx, d: int, r: int) -> bool:
    return n is not None and n.op == "flip" and sorted({x % r for x in rank_free_attrs(n, kc)["dims"]}) == [d]


def _local_cumsum(producers, lc_t: str, facts: Mapping[str, Fact], kc: KCtx):
    """The IR's cumsum of a tensor with a fact, or its reversed scan ``flip(cumsum(flip(t)))`` along the same dim,
    maybe inside further pairs of flips along it (autograd's backward of a reversed scan flips twice on each side):
    (t, its fact, dim, the spelling's nodes, the mask's shape, None or the (inner, outer) flips)."""
    tops = []  # the flips above the scan (nearest first once reversed)
    top = _node(producers, lc_t, "the local scan")
    while top.op == "flip" and len(tops) < 8:
        tops.append(top)
        top = _node(producers, top.inputs[0], "the local scan")
    tops.reverse()
    x_t, d, nodes, B = _scan_spelling(producers, top.outputs[0], kc)
    r = len(out_shape(nodes[1]))
    ins = []  # the flips below it, nearest first
    fin = producer(producers, x_t)
    while fin is not None and fin.op == "flip" and x_t not in facts and len(ins) < 8:
        ins.append(fin)
        x_t = fin.inputs[0]
        fin = producer(producers, x_t)
    if not all(_flips(f, kc, d, r) for f in (*tops, *ins)):
        raise RuleFailure("the scan is flipped along another dim than the scanned one")
    if len(tops) % 2 != len(ins) % 2:
        raise RuleFailure("the reversed scan is not flipped along the scanned dim on both sides")
    tf = facts.get(x_t)
    if tf is None:
        raise RuleFailure("the scanned tensor has no fact")
    if len(kc.exprs[tf.expr].shape) != r:
        raise RuleFailure("the scanned tensor's rank differs from the scan's")
    rev = (ins, tops) if len(tops) % 2 else None
    return x_t, tf, d, nodes, B, rev, (ins, tops)


def _rank_row(producers, t: str, kc: KCtx, a: str, d: int) -> tuple[str, list[Node]]:
    """``t`` (up to reshapes) is ``slice(src, d, rank.a, rank.a + 1)``, exactly over every rank: (src, nodes)."""
    top, chain = _rows(producers, t, kc)
    sl = _node(producers, top, "the row read at the rank")
    if sl.op != "slice":
        raise RuleFailure("the offset's term is not a row read at the rank")
    at = rank_free_attrs(sl, kc, ("start", "end"))
    env = kc.env0()
    try:
        lo, hi = affine_in_rank(sl.attrs.get("start"), env, a), affine_in_rank(sl.attrs.get("end"), env, a)
    except ValueError:
        lo = hi = None
    r = len(out_shape(sl))
    if at["dim"] % r != d or at.get("step", 1) != 1 or lo != (0, 1) or hi != (1, 1):
        raise RuleFailure(f"the offset's row is not [rank.{a}, rank.{a} + 1) along dim {d}")
    return sl.inputs[0], [*chain, sl]


def _rows(producers, o_t: str, kc: KCtx) -> tuple[str, list[Node]]:
    """Strip the reshapes between the offset's reduction and the add (the row-major order is kept)."""
    chain = []
    while True:
        n = producer(producers, o_t)
        if n is None or n.op not in _REORDER_FREE:
            return o_t, chain
        rank_free_attrs(n, kc)
        chain.append(n)
        o_t = n.inputs[0]


def _coef_graph(producers, m_t: str) -> list[Node]:
    """The ops computing the coefficient row, in program order; every leaf is a constant."""
    seen: dict[str, Node] = {}
    stack = [m_t]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        got = producers.get(t)
        if got is None:
            raise RuleFailure("the coefficient row reads a tensor no constant op computes (an input)")
        n = got[1]
        if n.op not in _COEF_OPS or len(n.outputs) != 1:
            raise RuleFailure(f"the coefficient row is computed with {n.op}, which a constant row may not use")
        seen[t] = n
        stack.extend(n.inputs)
    return sorted(seen.values(), key=lambda n: producers[n.outputs[0]][0])


def _coef_values(nodes: list[Node], m_t: str, kc: KCtx):
    """The coefficient row on every rank of the mesh: {rank coordinates: exact array}."""
    from ..interp import RunError, eval_node

    out = {}
    ctx = Ctx(exact=True)
    for coords in itertools.product(*(range(kc.sizes[a]) for a in kc.axes)):
        env = dict(kc.dims)
        env.update({f"rank.{a}": c for a, c in zip(kc.axes, coords)})
        vals: dict[str, np.ndarray] = {}
        try:
            for n in nodes:
                vals[n.outputs[0]] = eval_node(n, vals, env, ctx)[0]
        except (RunError, ValueError, KeyError) as exc:
            raise RuleFailure(f"the coefficient row does not evaluate on rank {coords}: {exc}") from None
        out[coords] = np.asarray(vals[m_t], dtype=object)
    return out


def _check_prefix_row(vals, gshape: tuple[int, ...], g: int, ai: int, suffix: bool) -> None:
    """Every rank's row is [j < rank.a] ([j > rank.a] for a reversed scan) at every position of the gathered dim g
    (broadcast over the rest)."""
    for coords, v in vals.items():
        try:
            if tuple(np.broadcast_shapes(v.shape, gshape)) != tuple(gshape):
                raise ValueError
            full = np.broadcast_to(v, gshape)
        except ValueError:
            raise RuleFailure(f"the coefficient row of shape {list(v.shape)} does not broadcast into the gathered "
                              f"totals {list(gshape)}") from None
        r = coords[ai]
        for j in range(gshape[g]):
            want = 1 if (j > r if suffix else j < r) else 0
            for e in np.take(full, j, axis=g).reshape(-1):
                if not e == want:  # exact values (a bool condition is 0 / 1 there)
                    raise RuleFailure(f"on rank {coords} the coefficient of the totals of rank {j} is {e!r}, not "
                                      f"{want} (the carried offset must sum the ranks "
                                      f"{'after' if suffix else 'before'} it)")


def _matcher(want: str):
    def match(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx):
        n = g.nodes[index]
        if n.op != "add" or len(n.inputs) != 2:
            raise RuleFailure("not an add")
        producers = ProducersBefore(g, index)
        rank_free_attrs(n, kc)
        last = None
        for lc_t, o_t in (n.inputs, n.inputs[::-1]):
            try:
                return _conclude(g, index, producers, _local_cumsum(producers, lc_t, facts, kc), o_t, facts, kc, want)
            except RuleFailure as exc:
                last = exc
        raise last
    match.__name__ = match.__qualname__ = want
    match.__doc__ = (f"Match ``cumsum_local(t) + offset`` ending at the add ``index`` in the form of rule {want}; "
                     "returns the derivation and the matched nodes.")
    return match


# one entry per rule id (the certificate checker replays the pattern its step cites)
block_prefix_sum = _matcher(RULE)
block_prefix_sum_scanned = _matcher(RULE_SCANNED)
block_suffix_sum = _matcher(RULE_SUFFIX)
block_suffix_sum_scattered = _matcher(RULE_SUFFIX_SCATTERED)
block_prefix_sum_scattered = _matcher(RULE_PREFIX_SCATTERED)
MATCHERS = {RULE: block_prefix_sum, RULE_SCANNED: block_prefix_sum_scanned, RULE_SUFFIX: block_suffix_sum,
            RULE_SUFFIX_SCATTERED: block_suffix_sum_scattered, RULE_PREFIX_SCATTERED: block_prefix_sum_scattered}


def _weighted(producers, core: Node, kc: KCtx, p: int, d: int, r: int) -> tuple[str, str, list[Node]]:
    """``sum(M * G, d)`` / ``sum(G * M, d)`` / ``sum(where(M, G, 0), d)``, or ``M @ G`` for a 2-D scan along dim 0:
    (G, the coefficient row M, nodes)."""
    if core.op == "sum":
        sat = rank_free_attrs(core, kc)
        wm = _node(producers, core.inputs[0], "the weighted totals")
        gs = out_shape(wm)
        if len(gs) != r or sorted({x % r for x in sat["dims"]}) != [d]:
            raise RuleFailure(f"the offset does not sum over exactly the gathered dim {d}")
        rank_free_attrs(wm, kc)
        if wm.op == "mul" and len(wm.inputs) == 2:
            ops = [getattr(producer(producers, x), "op", None) for x in wm.inputs]
            if "all_gather" not in ops:
                raise RuleFailure("no factor of the weighted totals is an all_gather")
            gi = ops.index("all_gather")
            g_t, m_t = wm.inputs[gi], wm.inputs[1 - gi]
        elif wm.op == "where" and len(wm.inputs) == 3:
            z = producer(producers, wm.inputs[2])
            zat = rank_free_attrs(z, kc) if z is not None else {}
            if z is None or z.op != "const" or zat.get("value") not in (0, 0.0) or zat.get("shape"):
                raise RuleFailure("the masked totals are not where(mask, totals, 0)")
            g_t, m_t = wm.inputs[1], wm.inputs[0]
        else:
            raise RuleFailure("the offset is not a sum of masked gathered totals")
        if out_shape(wm) != shape_of(producers, g_t):
            raise RuleFailure("the coefficient row broadcasts the gathered totals to another shape")
        return g_t, m_t, [core, wm]
    if core.op == "matmul" and len(core.inputs) == 2 and r == 2 and d == 0:
        rank_free_attrs(core, kc)
        ms = shape_of(producers, core.inputs[0])
        if ms not in ((p,), (1, p)):
            raise RuleFailure(f"the coefficient row of a product with the totals has shape {ms}, not [{p}]")
        return core.inputs[1], core.inputs[0], [core]
    raise RuleFailure("the offset is not a sum of masked gathered totals")


def _scanned(producers, core: Node, kc: KCtx, a: str, p: int, d: int) -> tuple[str, list[Node]]:
    """``cumsum(G, d)[rank.a] - G[rank.a]`` (rows read as slices, maybe squeezed): (G, nodes)."""
    if len(core.inputs) != 2 or not (shape_of(producers, core.inputs[0]) == shape_of(producers, core.inputs[1])
                                     == out_shape(core)):
        raise RuleFailure("the offset's difference broadcasts")
    rank_free_attrs(core, kc)
    cs_t, an = _rank_row(producers, core.inputs[0], kc, a, d)
    g_t, bn = _rank_row(producers, core.inputs[1], kc, a, d)
    x_t, sd, nodes, ms = _scan_spelling(producers, cs_t, kc)
    if x_t != g_t or sd != d or ms != [p, p]:
        raise RuleFailure("the offset is not the cumsum of the gathered totals along the gathered dim read at the "
                          "rank, minus their row at the rank")
    return g_t, [core, *an, *bn, *(q for q in nodes if q is not None)]


def _scattered(producers, core: Node, facts, tf: Fact, kc: KCtx, a: str, d: int, r: int, tsh: list[int], p: int
               ) -> tuple[str, list[Node], tuple[int, ...]]:
    """``reduce_scatter_a(T * M)`` along d (either factor order, maybe through an expand), ``T = sum(t, d, keepdim)``
    of the scanned tensor itself: (the coefficient row M, nodes, the scattered shape)."""
    if single_axis(core) != a:
        raise RuleFailure(f"the offset is not reduce-scattered over exactly {a!r}")
    at = rank_free_attrs(core, kc)
    if at["dim"] % r != d or at.get("reduce", "sum") != "sum":
        raise RuleFailure(f"the offset is not a sum reduce-scattered along the scanned dim {d}")
    gshape = tuple(tsh[:d] + [p] + tsh[d + 1:])
    wm = _node(producers, core.inputs[0], "the weighted totals")
    nodes = [core]
    if wm.op == "expand":  # an explicit broadcast of the product before the scatter
        rank_free_attrs(wm, kc)
        if tuple(out_shape(wm)) != gshape:
            raise RuleFailure(f"the scattered offset is not broadcast to {list(gshape)} (one row per rank)")
        nodes.append(wm)
        wm = _node(producers, wm.inputs[0], "the weighted totals")
    if wm.op != "mul" or len(wm.inputs) != 2 or tuple(out_shape(wm)) != gshape:
        raise RuleFailure(f"the scattered offset is not a product of shape {list(gshape)} (one row per rank)")
    rank_free_attrs(wm, kc)
    nodes.append(wm)
    for t_t, m_t in (wm.inputs, wm.inputs[::-1]):
        tot = producer(producers, t_t)
        if tot is not None and tot.op == "sum" and facts.get(tot.inputs[0]) == tf:
            break
    else:
        raise RuleFailure("no factor of the scattered offset is the scanned tensor summed over the scanned dim")
    tat = rank_free_attrs(tot, kc)
    if sorted({x % r for x in tat["dims"]}) != [d] or tat.get("keepdim") is not True or \
            list(out_shape(tot)) != tsh:
        raise RuleFailure("the scattered totals are not the scanned tensor summed over the scanned dim (keepdim)")
    nodes.append(tot)
    return m_t, nodes, gshape


def _conclude(g, index, producers, found, o_t, facts, kc, want: str):
    X = kc.exprs
    n = g.nodes[index]
    t, tf, d, (inner, mm, tri, one, outer), Bs, rev, flips = found
    E = X[tf.expr]
    shape = E.shape
    r = len(shape)
    axes = [a for a, q in zip(kc.axes, tf.pl) if q.kind in ("S", "Z") and q.dim == d]
    if len(axes) != 1 or tf.pl[kc.axes.index(axes[0])].kind != "S":
        raise RuleFailure(f"the scanned dim {d} is not Shard({d}) over exactly one axis")
    a = axes[0]
    ai = kc.axes.index(a)
    p = kc.sizes[a]
    for b, q in zip(kc.axes, tf.pl):
        if q.kind not in ("R", "S"):
            raise RuleFailure(f"the scanned tensor is {q} on axis {b!r}: only Replicate or Shard are covered")
    L = shape[d]
    if L % p or Bs != [L // p, L // p]:
        raise RuleFailure(f"the local mask is {Bs}, not [{L // p}, {L // p}] (block {L} / {p})")
    tl = list(out_shape(mm))  # local shape after the inner transpose
    local_t = list(tl)
    if outer is not None:
        local_t[d], local_t[r - 1] = tl[r - 1], tl[d]
    if out_shape(n) != tuple(local_t):
        raise RuleFailure("the offset broadcasts the scan to another shape")
    tsh = list(local_t)
    tsh[d] = 1
    # the offset: reshapes of a reduction of the weighted gathered totals
    core_t, chain = _rows(producers, o_t, kc)
    core = _node(producers, core_t, "the carried offset")
    want_pad = [1] * (r - len(out_shape(chain[0] if chain else core))) + list(out_shape(chain[0] if chain else core))
    if want_pad != tsh:
        raise RuleFailure(f"the offset of shape {list(out_shape(chain[0] if chain else core))} is not one row per "
                          f"block {tsh}")
    if core.op == "reduce_scatter":  # the offset of autograd's backward: the row transposed, from the other side
        m_t, onodes, gshape = _scattered(producers, core, facts, tf, kc, a, d, r, tsh, p)
        rule = RULE_SUFFIX_SCATTERED if rev is not None else RULE_PREFIX_SCATTERED
        if rule != want:
            raise RuleFailure(f"the scan has the form of {rule}, not {want}")
        cnodes = _coef_graph(producers, m_t)
        # rank s sends M_s * T_s; rank r receives sum_s M_s[r] * T_s: the ranks after r when M_s[j] = [j < s]
        _check_prefix_row(_coef_values(cnodes, m_t, kc), gshape, d, ai, rev is None)
        return _finish(kc, n, tf, rule, (inner, mm, tri, one, outer), flips, L, shape, producers,
                       (*chain, *onodes, *cnodes), False)
    if core.op == "sub" and rev is None:
        g_t, onodes = _scanned(producers, core, kc, a, p, d)
        m_t, rule = None, RULE_SCANNED
    else:
        g_t, m_t, onodes = _weighted(producers, core, kc, p, d, r)
        rule = RULE if rev is None else RULE_SUFFIX
    if rule != want:
        raise RuleFailure(f"the scan has the form of {rule}, not {want}")
    ag = _node(producers, g_t, "the gathered totals")
    if ag.op != "all_gather" or single_axis(ag) != a:
        raise RuleFailure(f"the totals are not all_gathered over exactly {a!r}")
    gat = rank_free_attrs(ag, kc)
    gshape = out_shape(ag)
    if gat["dim"] % r != d or list(gshape) != tsh[:d] + [p] + tsh[d + 1:]:
        raise RuleFailure(f"the totals are not gathered along the scanned dim {d}")
    tot_t, tchain = _rows(producers, ag.inputs[0], kc)
    tot = _node(producers, tot_t, "the totals")
    scan_out = (flips[1][-1] if flips[1] else outer or mm).outputs[0]
    whole = tot_t == scan_out and Bs[0] == 1  # a block of one row is its own last row (the slice traced away)
    last_row = whole or tot.op == "slice" and tot.inputs[0] == scan_out
    if not last_row:
        tat = rank_free_attrs(tot, kc) if tot.op == "sum" else {}
        if tot.op != "sum" or sorted({x % r for x in tat["dims"]}) != [d] or facts.get(tot.inputs[0]) != tf:
            raise RuleFailure("the gathered totals are not the scanned tensor summed over the scanned dim")
    elif not whole:  # the block's total read off its own scan: the last row (the first of a reversed scan)
        sat_ = rank_free_attrs(tot, kc)
        lo = 0 if rev else Bs[0] - 1
        bounds = (sat_["start"], sat_["end"], sat_.get("step", 1))
        if Bs[0] < 1 or sat_["dim"] % r != d or bounds != (lo, lo + 1, 1):
            raise RuleFailure(f"the gathered row of the local scan is not its {'first' if rev else 'last'} row")
    if list(shape_of(producers, ag.inputs[0])) != tsh:
        raise RuleFailure("the gathered totals are not one row per rank")
    cnodes = _coef_graph(producers, m_t) if m_t is not None else []
    if m_t is not None:
        vals = _coef_values(cnodes, m_t, kc)
        if core.op == "matmul":
            vals = {c: v.reshape(p, 1) for c, v in vals.items()}
            _check_prefix_row(vals, (p, gshape[1]), 0, ai, rev is not None)
        else:
            _check_prefix_row(vals, tuple(gshape), d, ai, rev is not None)
    return _finish(kc, n, tf, rule, (inner, mm, tri, one, outer), flips, L, shape, producers,
                   (ag, tot, *chain, *tchain, *onodes, *cnodes), last_row)


def _finish(kc, n, tf, rule, spelling, flips, L, shape, producers, more, last_row):
    """The conclusion: the logical cumsum (or reversed scan), spelled as frontends/aten.py spells it at the
    logical size L, with the matched flips; returns (derivation, matched node indices)."""
    X = kc.exprs
    inner, mm, tri, one, outer = spelling
    ins, tops = flips
    e = tf.expr
    for f in reversed(ins):
        e = X.mk("flip", rank_free_attrs(f, kc), [e])
    if inner is not None:
        e = X.mk("transpose", rank_free_attrs(inner, kc), [e])
    oat = rank_free_attrs(one, kc)
    ones = X.mk("const", {**oat, "shape": [L, L]}, [])
    U = X.mk("triu", rank_free_attrs(tri, kc), [ones])
    e = X.mk("matmul", rank_free_attrs(mm, kc), [e, U])
    if outer is not None:
        e = X.mk("transpose", rank_free_attrs(outer, kc), [e])
    for f in tops:
        e = X.mk("flip", rank_free_attrs(f, kc), [e])
    if X[e].shape != shape:
        raise RuleFailure("the concluded cumsum has another shape")
    d_ = conclude(kc, e, [(q, rule) for q in tf.pl], out_shape(n))
    if last_row:
        d_.rules.append(RULE_LAST_ROW)
    if len(ins) > 1 or len(tops) > 1:  # pairs of flips beyond the reversed scan's own
        d_.rules.append(RULE_FLIP_PAIRS)
    matched = [x for x in (inner, mm, tri, one, outer, *ins, *tops, *more) if x is not None]
    idx = sorted({producers[m.outputs[0]][0] for m in matched})
    return d_, idx
