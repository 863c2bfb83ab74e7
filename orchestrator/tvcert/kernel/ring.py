"""Ring attention: a ``ring_loop`` folding online-softmax merges over key blocks (Coq: Ring.v).

Recognized at the division that normalizes the loop's result, ``out = acc / l``.  Rank r of mesh
axis A starts with its own key block and at every step passes K, V (and the key positions) to
rank r+1 with ``ppermute(shift=1)``, so step t sees key block (r - t) mod p.  One step is::

    s    = scale(matmul(q, permute(k, [.., -1, -2])), c)              (scale optional)
    s    = masked_fill(s, gt(unsqueeze(kpos, 0), unsqueeze(qpos, 1)), value)   (optional causal mask)
    m'   = any per-row value (in practice max(m, amax(s)))
    c_   = exp(m - m');   e = exp(s - m')
    l'   = l * c_ + sum(e, -1, keepdim)
    acc' = acc * c_ + matmul(e, v)
    k', v', kpos' = ppermute(k), ppermute(v), ppermute(kpos)

With l and acc starting at zero, ``acc / l`` after p steps is softmax attention of q over all
keys (Coq: ``ring_attention_online_softmax``: any references m', any mask values, since the
masked scores are just real scores).  The score of query i against key j is computed from
the rows i and j of the blocks; the matcher checks that the score ops are exactly the ones
above, so the block of the full score matrix is the op applied to the blocks.  The conclusion
is the same ops applied to the full logical tensors, then softmax and the value product.

Every check below is a side condition; a failure names the body op that breaks the template.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..graph import Graph, Node, loop_body
from ..ops import REGISTRY, resolve_attrs
from .rules import Derivation, Fact, KCtx, R, RuleFailure, S, local_shape

RULE = "ring_attention_online_softmax"


class RingMismatch(RuleFailure):
    """The ops are a ring loop, but one side condition of the ring-attention rule fails."""


def _env(kc: KCtx) -> dict[str, int]:
    env = dict(kc.dims)
    for a in kc.axes:
        env[f"rank.{a}"] = 0
    return env


class _Body:
    """Producers and resolved attributes of the body ops."""

    def __init__(self, loop: Node, body: Graph, env: Mapping[str, int]):
        self.g = body
        self.in_types = dict(zip(body.input_names(), loop.meta["body_inputs@shape@dims"]))
        self.prod: dict[str, Node] = {o: n for n in body.nodes for o in n.outputs}
        self.env = env
        self.used: list[int] = []

    def node(self, t: str, op: str | tuple[str, ...], what: str) -> Node:
        n = self.prod.get(t)
        ops = (op,) if isinstance(op, str) else op
        if n is None or n.op not in ops:
            got = "a loop input" if n is None else f"{n.op!r} at {n.path}"
            raise RingMismatch(f"{what}: expected {' or '.join(ops)}, got {got}")
        self.used.append(self.g.nodes.index(n))
        return n

    def attrs(self, n: Node) -> dict[str, Any]:
        return resolve_attrs(REGISTRY[n.op], n.attrs, self.env)

    def shape(self, t: str) -> tuple[int, ...]:
        n = self.prod.get(t)
        if n is None:
            return tuple(self.in_types[t][0])
        return tuple(n.meta["shape@dims"][n.outputs.index(t)][0])


def _pair(b: _Body, n: Node, op: str, what: str) -> tuple[str, str]:
    """The operands of a commutative op, as written."""
    if n.op != op:
        raise RingMismatch(f"{what}: expected {op}, got {n.op!r} at {n.path}")
    return n.inputs[0], n.inputs[1]


def _rescaled(b: _Body, t: str, carried: str, what: str) -> tuple[str, str]:
    """``add(mul(carried, corr), new)`` in either operand order: returns (corr, new)."""
    add = b.node(t, "add", what)
    for old, new in (add.inputs, add.inputs[::-1]):
        m = b.prod.get(old)
        if m is not None and m.op == "mul" and carried in m.inputs:
            b.used.append(b.g.nodes.index(m))
            corr = m.inputs[1] if m.inputs[0] == carried else m.inputs[0]
            return corr, new
    raise RingMismatch(f"{what}: the running value {carried!r} is not rescaled by the correction exp(m - m') "
                       f"before the new block is added (at {add.path})")


def _exp_minus(b: _Body, t: str, what: str) -> tuple[str, str]:
    e = b.node(t, "exp", what)
    s = b.node(e.inputs[0], "sub", what)
    return s.inputs[0], s.inputs[1]


def match_ring(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    producers = {o: (i, n) for i, n in enumerate(g.nodes[:index]) for o in n.outputs}
    out = g.nodes[index]
    if out.op != "div" or len(out.inputs) != 2:
        raise RuleFailure("not a division")
    got = producers.get(out.inputs[0]), producers.get(out.inputs[1])
    if got[0] is None or got[1] is None or got[0][1].op != "ring_loop" or got[0][1] is not got[1][1]:
        raise RuleFailure("not acc / l of one ring_loop")
    li, loop = got[0]
    body = loop_body(loop)
    b = _Body(loop, body, _env(kc))
    la = b.attrs(loop)
    A, k = la["axis"], la["carry"]
    if A not in kc.axes:
        raise RingMismatch(f"the loop runs over {A!r}, which is not an axis of this program")
    names = body.input_names()
    j_acc, j_l = loop.outputs.index(out.inputs[0]), loop.outputs.index(out.inputs[1])
    acc, l = names[j_acc], names[j_l]
    upd = dict(zip(names[:k], body.outputs))  # carried input -> its value after one step

    corr, pv = _rescaled(b, upd[acc], acc, "the accumulator update")
    corr_l, rs = _rescaled(b, upd[l], l, "the normalizer update")
    if corr_l != corr:
        raise RingMismatch("the accumulator and the normalizer are rescaled by different corrections")
    m, mn = _exp_minus(b, corr, "the correction")
    if m not in names[:k] or upd[m] != mn:
        raise RingMismatch(f"the correction is not exp(m - m') with m a carried value replaced by m' each step")
    rsn = b.node(rs, "sum", "the normalizer's new term")
    ra = b.attrs(rsn)
    pe = rsn.inputs[0]
    nd = len(b.shape(pe))
    if [d % nd for d in ra["dims"]] != [nd - 1] or not ra["keepdim"]:
        raise RingMismatch(f"the normalizer adds sum(e, dims=[-1], keepdim=True), got dims={list(ra['dims'])} "
                           f"keepdim={ra['keepdim']} at {rsn.path}")
    pvn = b.node(pv, "matmul", "the accumulator's new term")
    if pvn.inputs[0] != pe:
        raise RingMismatch(f"the accumulator's new term is not matmul(e, v) with the same e as the normalizer")
    vb = pvn.inputs[1]
    s, mn2 = _exp_minus(b, pe, "the block weights e")
    if mn2 != mn:
        raise RingMismatch("the block weights e = exp(s - m') use a different reference than the correction")
    ms = b.shape(mn)
    if ms[-1] != 1 or ms[:-1] != b.shape(s)[:-1] or b.shape(m) != ms:
        raise RingMismatch(f"the reference m' must be one value per query row (shape {list(b.shape(s)[:-1]) + [1]}), "
                           f"got {list(ms)}")
    # the scores
    mask = None
    sn = b.prod.get(s)
    chain = []
    if sn is not None and sn.op == "masked_fill":
        b.used.append(body.nodes.index(sn))
        chain.append(sn)
        mask = b.node(sn.inputs[1], "gt", "the causal mask")
        s = sn.inputs[0]
        sn = b.prod.get(s)
    if sn is not None and sn.op == "scale":
        b.used.append(body.nodes.index(sn))
        chain.append(sn)
        s = sn.inputs[0]
    mm = b.node(s, "matmul", "the scores")
    qb = mm.inputs[0]
    kt = b.node(mm.inputs[1], ("permute", "transpose"), "the transposed keys")
    kta = b.attrs(kt)
    kb = kt.inputs[0]
    r = len(b.shape(kb))
    swap = (kta["dims"] == tuple(range(r - 2)) + (r - 1, r - 2)) if kt.op == "permute" else \
        ({kta["dim0"] % r, kta["dim1"] % r} == {r - 2, r - 1})
    if r < 2 or not swap:
        raise RingMismatch(f"the scores use K with its last two dims swapped, got {kt.op} {kta} at {kt.path}")
    rotating = {"keys": kb, "values": vb}
    invariant = {"queries": qb}
    if mask is not None:
        rows, cols = mask.inputs[1], mask.inputs[0]
        ucols, urows = b.node(cols, "unsqueeze", "the mask's key positions"), b.node(rows, "unsqueeze", "the mask's query positions")
        if b.attrs(ucols)["dim"] != 0 or b.attrs(urows)["dim"] != 1:
            raise RingMismatch("the causal mask is gt(unsqueeze(key positions, 0), unsqueeze(query positions, 1))")
        rotating["key positions"] = ucols.inputs[0]
        invariant["query positions"] = urows.inputs[0]
    for what, t in rotating.items():
        if t not in names[:k]:
            raise RingMismatch(f"the {what} {t!r} are not carried by the loop")
        pn = b.node(upd[t], "ppermute", f"the {what} passed on")
        pa = b.attrs(pn)
        if pn.inputs[0] != t or pa["axis"] != A or pa["shift"] != 1:
            raise RingMismatch(f"the {what} must be passed on unchanged with ppermute(axis={A!r}, shift=1) each step, "
                               f"got {pn.op}({pn.inputs[0]}) axis={pa['axis']!r} shift={pa['shift']} at {pn.path}")
    for what, t in invariant.items():
        if t not in names[k:]:
            raise RingMismatch(f"the {what} {t!r} must be a read-only loop input")
    roles = {acc, l, m, *rotating.values()}
    if len(roles) != 3 + len(rotating) or set(names[:k]) != roles:
        raise RingMismatch(f"the loop carries {list(names[:k])}; ring attention carries exactly m, l, acc and the "
                           f"rotating {', '.join(rotating)}")
    # the loop's initial values
    outer = {nm: loop.inputs[i] for i, nm in enumerate(names)}
    for t, what in ((acc, "accumulator"), (l, "normalizer")):
        z = producers.get(outer[t])
        zn = z[1] if z else None
        if zn is None or zn.op != "const" or resolve_attrs(REGISTRY["const"], zn.attrs, b.env)["value"] not in (0, 0.0):
            raise RingMismatch(f"the {what} must start at a zero constant")
    for t in [*rotating.values(), *invariant.values()]:
        if outer[t] not in facts:
            raise RingMismatch(f"the loop input {outer[t]!r} has no fact")
    fq, fk, fv = facts[outer[qb]], facts[outer[kb]], facts[outer[vb]]
    X = kc.exprs
    nq = len(X[fq.expr].shape)
    pos = (facts[outer[rotating["key positions"]]], facts[outer[invariant["query positions"]]]) if mask else ()
    per_axis = []
    for j, a in enumerate(kc.axes):
        if a == A:
            if not (fq.pl[j] == fk.pl[j] == fv.pl[j] == S(nq - 2)) or any(f.pl[j] != S(0) for f in pos):
                raise RingMismatch(f"over {A!r} the queries, keys and values must be Shard({nq - 2}) (the sequence) "
                                   f"and the positions Shard(0)")
            per_axis.append((S(nq - 2), RULE))
        elif fq.pl[j] == fk.pl[j] == fv.pl[j] and fq.pl[j] in (R, S(0), S(1)) and all(f.pl[j] == R for f in pos):
            per_axis.append((fq.pl[j], "replicate_any" if fq.pl[j] == R else "rowwise_shard"))
        else:
            raise RingMismatch(f"over {a!r}: queries, keys and values must share Replicate or a batch/head Shard, "
                               f"positions Replicate")
    # conclusion: the score ops on the full tensors, softmax over the keys, times the values
    if mask is not None and X[pos[0].expr].shape[0] != X[fk.expr].shape[nq - 2]:
        raise RingMismatch("the key positions and the keys have different lengths")
    ek = X.mk(kt.op, kta, [fk.expr])
    e = X.mk("matmul", {}, [fq.expr, ek])
    for cn in reversed(chain):
        if cn.op == "scale":
            e = X.mk("scale", b.attrs(cn), [e])
        else:
            ca = X.mk("unsqueeze", {"dim": 0}, [pos[0].expr])
            ra_ = X.mk("unsqueeze", {"dim": 1}, [pos[1].expr])
            e = X.mk("masked_fill", b.attrs(cn), [e, X.mk("gt", {}, [ca, ra_])])
    e = X.mk("matmul", {}, [X.mk("softmax", {"dim": -1}, [e]), fv.expr])
    pl = tuple(p for p, _ in per_axis)
    have = out.meta["shape@dims"][0][0]
    if local_shape(X[e].shape, kc.axes, pl, kc.sizes) != tuple(have):
        raise RingMismatch(f"the concluded placement does not give the division's local shape {list(have)}")
    matched = sorted({li} | {producers[loop.inputs[names.index(t)]][0] for t in (acc, l) if loop.inputs[names.index(t)] in producers})
    return Derivation([Fact(e, pl)], [r for _, r in per_axis]), matched
