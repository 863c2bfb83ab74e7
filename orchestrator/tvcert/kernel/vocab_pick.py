"""Megatron's target-logit pick of vocab-parallel cross-entropy, and its own backward: two multi-op rules.

Megatron-core's ``calculate_predicted_logits`` (cross_entropy.py:48-64) on logits sharded by vocabulary blocks over
axis ``a`` (block B = V/p), as frontends/aten.py converts it (``x[arange(N), j]`` is the row-wise gather
``reshape(gather(x, 1, j[:, None]), [N])``):

    m   = (t < rank*B) | (t >= rank*B + B)               (t the targets, token shape)
    lid = where(m, 0, t - rank*B)                        (the masked target; ``lid1 = reshape(lid, [N])``)
    out = where(m, 0, R(gather(L2, 1, lid1[:, None])))   (L2 the logits viewed [N, B]; R reshapes [N, 1] back)

and ``_VocabParallelCrossEntropy.backward``'s ``grad_2d[arange(N), lid1] -= 1 - float(m)``:

    upd = where(one_hot(lid1, B), (pick(G2, lid1) - (1 - float(reshape(m, [N]))))[:, None], G2)

The logical program is the same code at degree 1 (vocab_start 0, vocab_end V), so each rule concludes that
spelling: the matched ops re-spelled with the rank's bounds 0 and V, its offset 0 and the one-hot width V, over the
logical tensors of the logits and the targets.  ``out`` is then Partial(sum) over a of the degree-1 pick
(``Rules/VocabPick.v``: vocab_parallel_target_logit) and ``upd`` Shard(1) over a of the degree-1 update
(vocab_parallel_target_logit_backward), for every integer target (one outside [0, V) is masked on every rank and at
degree 1 alike).  Side conditions, checked here: the logits are Shard(last) over exactly ``a`` and the targets
Replicate there, every other axis Replicate for both; the mask and the offset are exactly the block [rank.a*B,
rank.a*B + B) (kernel/patterns.py's checks, ``affine_in_rank`` over every mesh axis); the mask, the masked target
and the picked values share the token shape, flattened row-major to the N rows of the logits and back; the gather
reads the logits' last dim at the masked target; the backward's update reads the same logits, the same flattened
masked target and the same mask; every other matched attribute is rank-free.
"""
from __future__ import annotations

from math import prod
from typing import Any, Mapping

RULE = "vocab_parallel_target_logit"  # before the rules import: kernel/rules.py reads these at its end
RULE_BWD = "vocab_parallel_target_logit_backward"
STATEMENTS = {
    RULE: "Megatron's target-logit pick on vocab-sharded logits (targets masked to the rank's block, the row-wise "
          "pick at the local id, zeroed where masked) is Partial(sum) of the same pick at degree 1 (one block "
          "[0, V))",
    RULE_BWD: "Megatron's backward update of the picked column (grad_2d[arange, masked_target] -= 1 - mask) on "
              "vocab-sharded values is Shard(last) of the same update at degree 1",
}

from ..graph import Graph, Node  # noqa: E402
from .producers import ProducersBefore, out_shape, producer, rank_free_attrs, shape_of  # noqa: E402
from .rules import Derivation, Fact, KCtx, P, R, RuleFailure, S, conclude, local_shape  # noqa: E402

_RESHAPES = ("reshape", "view")


def _node(producers, t: str, what: str) -> Node:
    n = producer(producers, t)
    if n is None:
        raise RuleFailure(f"{what} is not computed by an op before the pick")
    return n


def _local(producers, facts, kc: KCtx, t: str) -> tuple[int, ...] | None:
    """The rank-local shape of ``t``: its producer's, or (an input) its fact's."""
    got = shape_of(producers, t)
    if got is None and t in facts:
        f = facts[t]
        got = local_shape(kc.exprs[f.expr].shape, kc.axes, f.pl, kc.sizes)
    return None if got is None else tuple(got)


def _pick(producers, facts, v_t: str, kc: KCtx) -> tuple[str, str, list[Node]]:
    """``reshape(gather(T, 1, unsqueeze(lid1, 1)), [N])`` (or ``squeeze``): (T, lid1, nodes)."""
    r = _node(producers, v_t, "the picked value")
    g = _node(producers, r.inputs[0], "the gather") if r.op in (*_RESHAPES, "squeeze") and r.inputs else None
    if g is None or g.op != "gather" or len(g.inputs) != 2:
        raise RuleFailure("the picked value is not a row-wise gather read back to one value per row")
    t_t, j_t = g.inputs
    ts, js = _local(producers, facts, kc, t_t), shape_of(producers, j_t)
    j = _node(producers, j_t, "the gather index")
    if ts is None or len(ts) != 2 or js != (ts[0], 1) or j.op not in ("unsqueeze", *_RESHAPES) or \
            shape_of(producers, j.inputs[0]) != (ts[0],) or out_shape(r) != (ts[0],):
        raise RuleFailure("the pick is not gather(T [N, B], 1, lid1[:, None]) back to [N]")
    if rank_free_attrs(g, kc)["dim"] % 2 != 1:
        raise RuleFailure("the gather does not read the last (vocab) dim")
    for q in (r, j):
        rank_free_attrs(q, kc)
    return t_t, j.inputs[0], [r, g, j]


def _flat_of(producers, lid1_t: str, lid_t_shape: tuple[int, ...], kc: KCtx) -> tuple[str, list[Node]]:
    """``lid1`` is the token-shaped masked target flattened row-major to [N] (or is it, when 1-D): (lid, nodes)."""
    n = producer(producers, lid1_t)
    if n is not None and n.op in _RESHAPES and shape_of(producers, n.inputs[0]) is not None and \
            len(shape_of(producers, n.inputs[0])) > 1:
        rank_free_attrs(n, kc)
        return n.inputs[0], [n]
    return lid1_t, []


def _masked_target(producers, lid1_t: str, kc: KCtx, a: str, B: int, N: int):
    """The masked target behind ``lid1``: (ids, mask tensor, lid, nodes); ``lid = where(m, 0, ids - rank.a*B)``."""
    from .patterns import _block_mask, _masked, _offset_ids

    lid_t, flat = _flat_of(producers, lid1_t, (), kc)
    lid = _node(producers, lid_t, "the masked target")
    got = _masked(lid, producers)
    if got is None:
        raise RuleFailure("the gathered column is not a masked target where(m, 0, t - rank*B)")
    off_t, m_t = got
    ids_t, extra = _offset_ids(producers, off_t, kc, a, B)
    m = _node(producers, m_t, "the target mask")
    bounds = _block_mask(producers, m, ids_t, kc, a, B, inside=False)
    tok = shape_of(producers, lid_t)
    if tok is None or prod(tok) != N or shape_of(producers, m_t) != tok or \
            shape_of(producers, ids_t) not in (None, tok):
        raise RuleFailure("the mask, the masked target and the targets do not share the token shape of N rows")
    zero = [producer(producers, lid.inputs[1])] if lid.op == "where" else []
    nodes = [*flat, lid, *zero, _node(producers, off_t, "the offset"), m, *(producer(producers, c) for c in m.inputs),
             *(producer(producers, x) for x in bounds), *(producer(producers, x) for x in extra)]
    return ids_t, m_t, lid_t, [q for q in nodes if q is not None]


def _respell(kc: KCtx, producers, top: Node, leaves: Mapping[str, int], over: Mapping[str, Mapping[str, Any]],
             allowed: set[str]) -> int:
    """The expression the matched ops ending at ``top`` compute at degree 1: each op again, with the logical tensors
    ``leaves`` for its inputs and the attributes ``over`` replacing the rank's (every other attribute rank-free)."""
    from .patterns import _mk

    memo: dict[str, int] = {}

    def go(x: str) -> int:
        if x in leaves:
            return leaves[x]
        if x in memo:
            return memo[x]
        n = top if x in top.outputs else producer(producers, x)
        if n is None or (n is not top and x not in allowed) or len(n.outputs) != 1:
            raise RuleFailure(f"the pick reads {x!r}, which the rule did not match")
        ov = over.get(x, {})
        rank_free_attrs(n, kc, tuple(ov))
        memo[x] = _mk(kc, n.op, {**n.attrs, **ov}, [go(i) for i in n.inputs])
        return memo[x]

    return go(top.outputs[0])


def _axes(kc: KCtx, a: str, tf: Fact, idf: Fact | None, rule: str, on_a) -> list[tuple[Any, str]]:
    out = []
    for j, b in enumerate(kc.axes):
        if b == a:
            if idf is not None and idf.pl[j].kind != "R":
                raise RuleFailure(f"the targets must be replicated over {a!r}")
            out.append((on_a, rule))
        elif tf.pl[j].kind == "R" and (idf is None or idf.pl[j].kind == "R"):
            out.append((R, "replicate_any"))
        else:
            raise RuleFailure(f"axis {b!r}: logits {tf.pl[j]}: only Replicate is covered off the vocab axis")
    return out


def _targets(kc: KCtx, facts, ids_t: str) -> Fact:
    if ids_t not in facts:
        raise RuleFailure("the targets have no fact")
    idf = facts[ids_t]
    if kc.exprs[idf.expr].dtype != "int":
        raise RuleFailure("the targets are not integers")
    return idf


def _vocab(kc: KCtx, facts, t_t: str) -> tuple[Fact, str, int]:
    from .patterns import _vocab_axis

    tf = facts.get(t_t)
    if tf is None or len(kc.exprs[tf.expr].shape) != 2:
        raise RuleFailure("the picked logits [N, B] have no fact")
    a, B = _vocab_axis(tf, 1, kc)
    return tf, a, B


def _degree_one(kc: KCtx, a: str, B: int, ids_t: str, m_node: Node, lid_nodes: list[Node], producers) -> dict:
    """Attribute overrides for the degree-1 spelling: the block's bounds 0 and V, the offset 0."""
    V = B * kc.sizes[a]
    over: dict[str, dict] = {}
    for c_t in m_node.inputs:
        cmp = producer(producers, c_t)
        bound = producer(producers, cmp.inputs[1])
        over[bound.outputs[0]] = {"value": 0 if cmp.op == "lt" else V}
    for q in lid_nodes:
        if q.op == "add_scalar" and q.inputs[0] == ids_t:
            over[q.outputs[0]] = {"value": 0}
        elif q.op == "sub" and q.inputs[0] == ids_t:
            over[q.inputs[1]] = {"value": 0}
    return over


def vocab_parallel_target_logit(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx
                                ) -> tuple[Derivation, list[int]]:
    """``where(m, 0, R(gather(L2, 1, lid1[:, None])))`` (module docstring) ending at node ``index``."""
    from .patterns import _masked

    producers = ProducersBefore(g, index)
    out = g.nodes[index]
    got = _masked(out, producers)
    if got is None:
        raise RuleFailure("not a masked pick")
    val_t, m_t = got
    chain, v_t = [], val_t
    while True:  # R: reshapes back from the [N] picks to the token shape
        n = _node(producers, v_t, "the picked value")
        if n.op not in _RESHAPES or producer(producers, n.inputs[0]) is None or \
                producer(producers, n.inputs[0]).op == "gather":
            break
        rank_free_attrs(n, kc)
        chain.append(n)
        v_t = n.inputs[0]
    t_t, lid1_t, pnodes = _pick(producers, facts, v_t, kc)
    tf, a, B = _vocab(kc, facts, t_t)
    N = _local(producers, facts, kc, t_t)[0]
    ids_t, m2_t, lid_t, mnodes = _masked_target(producers, lid1_t, kc, a, B, N)
    if m2_t != m_t or out_shape(out) != shape_of(producers, lid_t) or shape_of(producers, val_t) != out_shape(out):
        raise RuleFailure("the pick is not zeroed with the target mask, in the token shape")
    idf = _targets(kc, facts, ids_t)
    per_axis = _axes(kc, a, tf, idf, RULE, P("sum"))
    m = producer(producers, m_t)
    over = _degree_one(kc, a, B, ids_t, m, mnodes, producers)
    matched = [*chain, *pnodes, *mnodes, *([producer(producers, out.inputs[1])] if out.op == "where" else [])]
    allowed = {q.outputs[0] for q in matched} | set(over)
    leaves = {t_t: tf.expr, ids_t: idf.expr}
    expr = _respell(kc, producers, out, leaves, over, allowed)
    idx = sorted({producers[q.outputs[0]][0] for q in matched} | {producers[x][0] for x in over if x in producers})
    return conclude(kc, expr, per_axis, out_shape(out)), idx


def vocab_parallel_target_logit_backward(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx
                                         ) -> tuple[Derivation, list[int]]:
    """``where(one_hot(lid1, B), (pick(G2, lid1) - (1 - float(reshape(m, [N]))))[:, None], G2)`` (module
    docstring) ending at node ``index``."""
    producers = ProducersBefore(g, index)
    out = g.nodes[index]
    if out.op != "where" or len(out.inputs) != 3:
        raise RuleFailure("not where(one_hot, update, values)")
    oh_t, v_t, t_t = out.inputs
    oh = _node(producers, oh_t, "the one-hot")
    vv = _node(producers, v_t, "the update")
    if oh.op != "one_hot" or vv.op not in ("unsqueeze", *_RESHAPES):
        raise RuleFailure("not where(one_hot(lid1), v[:, None], values)")
    tf, a, B = _vocab(kc, facts, t_t)
    N = _local(producers, facts, kc, t_t)[0]
    if rank_free_attrs(oh, kc)["num_classes"] != B or out_shape(oh) != (N, B) or out_shape(vv) != (N, 1) or \
            out_shape(out) != (N, B):
        raise RuleFailure(f"the one-hot is not {B} wide over the {N} rows, or the update not one per row")
    rank_free_attrs(vv, kc)
    sb = _node(producers, vv.inputs[0], "the updated value")
    if sb.op != "sub" or out_shape(sb) != (N,):
        raise RuleFailure("the update is not pick - (1 - float(mask))")
    rank_free_attrs(sb, kc)
    p_t, u_t = sb.inputs
    t2_t, lid1_t, pnodes = _pick(producers, facts, p_t, kc)
    if t2_t != t_t or lid1_t != oh.inputs[0]:
        raise RuleFailure("the update reads other values or another column than the one-hot")
    ids_t, m_t, lid_t, mnodes = _masked_target(producers, lid1_t, kc, a, B, N)
    u = _node(producers, u_t, "the update's subtrahend")
    one = producer(producers, u.inputs[0]) if u.op == "sub" else None
    cast = producer(producers, u.inputs[1]) if u.op == "sub" else None
    flat = producer(producers, cast.inputs[0]) if cast is not None and cast.op == "cast" else None
    if one is None or one.op != "const" or one.attrs.get("value") not in (1, 1.0) or one.attrs.get("shape") or \
            cast is None or cast.op != "cast" or rank_free_attrs(cast, kc).get("dtype") != "float" or \
            flat is None or flat.op not in _RESHAPES or flat.inputs[0] != m_t or out_shape(flat) != (N,) or \
            out_shape(u) != (N,):
        raise RuleFailure("the update's subtrahend is not 1 - float(reshape(mask, [N])) of the target mask")
    for q in (u, one, flat):
        rank_free_attrs(q, kc)
    idf = _targets(kc, facts, ids_t)
    per_axis = _axes(kc, a, tf, idf, RULE_BWD, S(1))
    m = producer(producers, m_t)
    over = _degree_one(kc, a, B, ids_t, m, mnodes, producers)
    over[oh_t] = {"num_classes": B * kc.sizes[a]}
    matched = [oh, vv, sb, *pnodes, *mnodes, u, one, cast, flat]
    allowed = {q.outputs[0] for q in matched} | set(over)
    leaves = {t_t: tf.expr, ids_t: idf.expr}
    expr = _respell(kc, producers, out, leaves, over, allowed)
    idx = sorted({producers[q.outputs[0]][0] for q in matched} | {producers[x][0] for x in over if x in producers})
    return conclude(kc, expr, per_axis, out_shape(out)), idx
