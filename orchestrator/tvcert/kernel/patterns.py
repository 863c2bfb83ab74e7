"""Rules whose premises span several ops: recognized on the program graph, concluded at the last op.

``vocab_parallel_embedding`` (Megatron, DTensor MaskPartial): with the embedding table sharded
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

from typing import Any, Mapping

from ..graph import Graph, Node
from ..ops import REGISTRY, resolve_attrs
from ..shapes import affine_in_rank
from .rules import Derivation, Fact, KCtx, P, R, RuleFailure, S, local_shape

Producers = Mapping[str, tuple[int, Node]]


def _prod(producers: Producers, t: str) -> Node | None:
    got = producers.get(t)
    return got[1] if got else None


def _zero_const(n: Node | None) -> bool:
    return n is not None and n.op == "const" and n.attrs.get("value") in (0, 0.0) and not n.attrs.get("shape")


def _masked(n: Node, producers: Producers) -> tuple[str, str] | None:
    """(value tensor, mask tensor) of ``where(mask, 0, value)`` or ``masked_fill(value, mask, 0)``."""
    if n.op == "where" and _zero_const(_prod(producers, n.inputs[1])):
        return n.inputs[2], n.inputs[0]
    if n.op == "masked_fill" and n.attrs.get("value") in (0, 0.0):
        return n.inputs[0], n.inputs[1]
    return None


def _rank_affine(value: Any, kc: KCtx, axis: str) -> tuple[int, int] | None:
    env = dict(kc.dims)
    for a in kc.axes:
        env[f"rank.{a}"] = 0
    try:
        return affine_in_rank(value, env, axis)
    except ValueError:
        return None


def _const_value(n: Node | None) -> Any:
    return n.attrs.get("value") if n is not None and n.op == "const" and not n.attrs.get("shape") else None


def vocab_parallel_embedding(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    """Match the masked vocab-parallel lookup ending at node ``index``; returns the derivation and matched nodes."""
    producers: Producers = {o: (i, n) for i, n in enumerate(g.nodes[:index]) for o in n.outputs}
    out = g.nodes[index]
    got = _masked(out, producers)
    if got is None:
        raise RuleFailure("not a masked embedding result")
    emb_t, outer_mask = got
    emb = _prod(producers, emb_t)
    um = _prod(producers, outer_mask)
    if emb is None or emb.op != "embedding":
        raise RuleFailure("the masked value is not an embedding lookup")
    if um is None or um.op not in ("unsqueeze", "reshape", "view"):
        raise RuleFailure("the output mask is not the token mask with a trailing unit dim")
    m_t = um.inputs[0]
    w_t, lid_t = emb.inputs
    if w_t not in facts:
        raise RuleFailure("the embedding table has no fact")
    wf = facts[w_t]
    axes = [a for a, p in zip(kc.axes, wf.pl) if p == S(0)]
    if len(axes) != 1:
        raise RuleFailure("the embedding table is not Shard(0) on exactly one axis")
    a = axes[0]
    ai = kc.axes.index(a)
    V = kc.exprs[wf.expr].shape[0]
    p = kc.sizes[a]
    if V % p:
        raise RuleFailure(f"vocabulary {V} does not split evenly over {a!r}")
    B = V // p
    lid = _prod(producers, lid_t)
    inner = _masked(lid, producers) if lid is not None else None
    if inner is None or inner[1] != m_t:
        raise RuleFailure("local ids are not zeroed with the same token mask")
    off = _prod(producers, inner[0])
    if off is None:
        raise RuleFailure("local ids are not an offset of the token ids")
    if off.op == "add_scalar" and _rank_affine(off.attrs.get("value"), kc, a) == (0, -B):
        ids_t = off.inputs[0]
    elif off.op == "sub" and _rank_affine(_const_value(_prod(producers, off.inputs[1])), kc, a) == (0, B):
        ids_t = off.inputs[0]
    else:
        raise RuleFailure(f"local ids are not ids - rank.{a}*{B}")
    m = _prod(producers, m_t)
    if m is None or m.op != "logical_or":
        raise RuleFailure("the token mask is not (ids < lo) | (ids >= hi)")
    sides = {}
    for t in m.inputs:
        c = _prod(producers, t)
        if c is None or c.op not in ("lt", "ge") or c.inputs[0] != ids_t:
            raise RuleFailure("the token mask does not compare the same ids")
        sides[c.op] = _rank_affine(_const_value(_prod(producers, c.inputs[1])), kc, a)
    if sides != {"lt": (0, B), "ge": (B, B)}:
        raise RuleFailure(f"the token mask is not the block [rank.{a}*{B}, rank.{a}*{B}+{B})")
    if ids_t not in facts:
        raise RuleFailure("the token ids have no fact")
    idf = facts[ids_t]
    per_axis: list[tuple[Any, str]] = []
    for j, b in enumerate(kc.axes):
        wp, ip = wf.pl[j], idf.pl[j]
        if j == ai:
            if ip.kind != "R":
                raise RuleFailure(f"token ids must be replicated over {a!r}")
            per_axis.append((P("sum"), "vocab_parallel_embedding"))
        elif wp.kind == "R" and ip.kind == "R":
            per_axis.append((R, "replicate_any"))
        elif wp.kind == "R" and ip.kind == "S":
            per_axis.append((ip, "rowwise_shard"))
        else:
            raise RuleFailure(f"axis {b!r}: table {wp}, ids {ip}: not covered")
    ra = resolve_attrs(REGISTRY["embedding"], emb.attrs, {})
    expr = kc.exprs.mk("embedding", ra, [wf.expr, idf.expr])
    pl = tuple(pl for pl, _ in per_axis)
    have = out.meta["shape@dims"][0][0]
    if local_shape(kc.exprs[expr].shape, kc.axes, pl, kc.sizes) != tuple(have):
        raise RuleFailure(f"the concluded placement does not give the op's local shape {list(have)}")
    matched = [producers[t][0] for t in (emb_t, outer_mask, m_t, lid_t, inner[0]) + tuple(m.inputs)]
    return Derivation([Fact(expr, pl)], [r for _, r in per_axis]), sorted(set(matched))


PATTERNS = {"vocab_parallel_embedding": vocab_parallel_embedding}
PATTERN_OPS = {"where", "masked_fill"}
