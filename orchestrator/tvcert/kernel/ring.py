"""Ring attention: a ``ring_loop`` folding online-softmax merges over key blocks (Coq: Ring.v).

Recognized at the division that normalizes the loop's result, ``out = acc / l``.  Rank r of mesh
axis A starts with its own key block and at every step passes K, V (and the key positions) to
rank r+1 with ``ppermute(shift=1)``, so step t sees key block (r - t) mod p.  One step is::

    s    = scale(matmul(q, permute(k, [.., -1, -2])), c)              (scale optional; or a sum of two
           such products, as MLA's no-rope and rope parts, each key block travelling)
    s    = masked_fill(s, gt(unsqueeze(kpos, 0), unsqueeze(qpos, 1)), value)   (optional causal mask)
    m'   = maximum(m, amax(s, -1, keepdim))
    c_   = exp(m - m');   e = exp(s - m')
    l'   = l * c_ + sum(e, -1, keepdim)
    acc' = acc * c_ + matmul(e, v)
    k', v', kpos' = ppermute(k), ppermute(v), ppermute(kpos)

With l and acc starting at zero, ``acc / l`` after p steps is softmax attention of q over all
keys (Coq: ``ring_attention_online_softmax``: any references m', any mask values, since the
masked scores are just real scores).  The matcher still demands the running max as m': other
references are right over the reals but overflow in floating point, and a certificate for a
plan that produces inf/NaN would be no help.  The score of query i against key j is computed from
the rows i and j of the blocks; the matcher checks that the score ops are exactly the ones
above, so the block of the full score matrix is the op applied to the blocks.  The conclusion
is the same ops applied to the full logical tensors, then softmax and the value product.

The backward ring (``ring_attention_backward``, matched at its own loop) passes the same key and
value blocks, recomputes ``P = exp(s - m) / l`` from the forward ring's *final* m and l (proved
forward, same scores), takes ``D = sum(dO * O)`` with O the forward's output, and accumulates
``dS = [scale]([mask](P * (dP - D)))`` into dQ_i (locally) and dK_i, dV (travelling with their
blocks, home after p steps).  Its conclusions are the logical ``softmax_backward`` gradients.

Every check below is a side condition; a failure names the body op that breaks the template.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..graph import Graph, Node, loop_body
from ..ops import REGISTRY, resolve_attrs
from ..shapes import rank_axes_in
from ..plan import Placement
from .producers import ProducersBefore, out_shape
from .rules import Derivation, Fact, KCtx, P, R, RuleFailure, S, conclude, local_shape
from .zigzag import Z

RULE = "ring_attention_online_softmax"


class RingMismatch(RuleFailure):
    """The ops are a ring loop, but one side condition of the ring-attention rule fails."""


class _Body:
    """Producers and resolved attributes of the body ops."""

    def __init__(self, loop: Node, body: Graph, env: Mapping[str, int]):
        self.g = body
        self.in_types = dict(zip(body.input_names(), loop.meta["body_inputs@shape@dims"]))
        self.prod: dict[str, Node] = {o: n for n in body.nodes for o in n.outputs}
        self.env = env
        for n in body.nodes:  # the template is one program for every rank: no op of it may read the rank
            if rank_axes_in(n.attrs):
                raise RingMismatch(f"{n.op} at {n.path}: an attribute depends on the rank; the ring template's ops "
                                   f"must be the same on every rank")

    def node(self, t: str, op: str | tuple[str, ...], what: str) -> Node:
        n = self.prod.get(t)
        ops = (op,) if isinstance(op, str) else op
        if n is None or n.op not in ops:
            got = "a loop input" if n is None else f"{n.op!r} at {n.path}"
            raise RingMismatch(f"{what}: expected {' or '.join(ops)}, got {got}")
        return n

    def attrs(self, n: Node) -> dict[str, Any]:
        """Attributes read once for every rank: they must be rank-free at every nesting level."""
        if n.op != "ring_loop" and rank_axes_in(n.attrs):
            raise RingMismatch(f"{n.op} at {n.path}: an attribute depends on the rank; the ring template's ops "
                               f"must be the same on every rank")
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
            corr = m.inputs[1] if m.inputs[0] == carried else m.inputs[0]
            return corr, new
    raise RingMismatch(f"{what}: the running value {carried!r} is not rescaled by the correction exp(m - m') "
                       f"before the new block is added (at {add.path})")


def _exp_minus(b: _Body, t: str, what: str) -> tuple[str, str]:
    e = b.node(t, "exp", what)
    s = b.node(e.inputs[0], "sub", what)
    return s.inputs[0], s.inputs[1]


@dataclass
class _Scores:
    """The score template of a ring body: scale(Σ_i matmul(q_i, k_iᵀ)) (one term, or two as in MLA's
    nope + rope parts), optionally masked by key / query positions."""

    terms: list[tuple[str, str, Node]]  # (queries, keys, the transpose node), in the order of the body's adds
    core: str  # the (summed) product tensor
    chain: list[Node]  # masked_fill / scale, outermost first
    mask: str | None = None  # the gt(...) tensor
    kpos: str | None = None
    qpos: str | None = None

    @property
    def queries(self) -> list[str]:
        return [q for q, _, _ in self.terms]

    @property
    def keys(self) -> list[str]:
        return [k for _, k, _ in self.terms]


def _scores(b: _Body, s: str) -> _Scores:
    chain, mask, kpos, qpos = [], None, None, None
    sn = b.prod.get(s)
    if sn is not None and sn.op == "masked_fill":
        chain.append(sn)
        gt = b.node(sn.inputs[1], "gt", "the causal mask")
        mask = sn.inputs[1]
        ucols = b.node(gt.inputs[0], "unsqueeze", "the mask's key positions")
        urows = b.node(gt.inputs[1], "unsqueeze", "the mask's query positions")
        if b.attrs(ucols)["dim"] != 0 or b.attrs(urows)["dim"] != 1:
            raise RingMismatch("the causal mask is gt(unsqueeze(key positions, 0), unsqueeze(query positions, 1))")
        kpos, qpos = ucols.inputs[0], urows.inputs[0]
        s = sn.inputs[0]
        sn = b.prod.get(s)
    if sn is not None and sn.op == "scale":
        chain.append(sn)
        s = sn.inputs[0]
        sn = b.prod.get(s)
    parts = sn.inputs if sn is not None and sn.op == "add" else [s]
    terms = []
    for t in parts:
        mm = b.node(t, "matmul", "the scores")
        kt = _transposed(b, mm.inputs[1], "the transposed keys")
        terms.append((mm.inputs[0], kt.inputs[0], kt))
    if len({k for _, k, _ in terms}) != len(terms):
        raise RingMismatch("the score terms must use distinct key tensors")
    return _Scores(terms, s, chain, mask, kpos, qpos)


def _transposed(b: _Body, t: str, what: str) -> Node:
    """A permute / transpose swapping the last two dims."""
    kt = b.node(t, ("permute", "transpose"), what)
    a = b.attrs(kt)
    r = len(b.shape(kt.inputs[0]))
    swap = (a["dims"] == tuple(range(r - 2)) + (r - 1, r - 2)) if kt.op == "permute" else \
        ({a["dim0"] % r, a["dim1"] % r} == {r - 2, r - 1})
    if r < 2 or not swap:
        raise RingMismatch(f"{what}: expected the last two dims swapped, got {kt.op} {a} at {kt.path}")
    return kt


def _score_expr(X, b: _Body, sc: _Scores, eqs: list[int], eks: list[int], pos: tuple) -> tuple[int, int | None]:
    """The full logical scores (and mask): the body's score ops applied to the full tensors."""
    prods = [X.mk("matmul", {}, [eq, X.mk(kt.op, b.attrs(kt), [ek])]) for (_, _, kt), eq, ek in zip(sc.terms, eqs, eks)]
    e = prods[0] if len(prods) == 1 else X.mk("add", {}, prods)
    emask = None
    for cn in reversed(sc.chain):
        if cn.op == "scale":
            e = X.mk("scale", b.attrs(cn), [e])
        else:
            emask = X.mk("gt", {}, [X.mk("unsqueeze", {"dim": 0}, [pos[0]]), X.mk("unsqueeze", {"dim": 1}, [pos[1]])])
            e = X.mk("masked_fill", b.attrs(cn), [e, emask])
    return e, emask


def _passed_on(b: _Body, t: str, new: str, A: str, what: str, body_value: str | None = None) -> None:
    """``new`` = ppermute(body_value or t, axis=A, shift=1)."""
    pn = b.node(new, "ppermute", f"the {what} passed on")
    pa = b.attrs(pn)
    src = body_value or t
    if pn.inputs[0] != src or pa["axis"] != A or pa["shift"] != 1:
        raise RingMismatch(f"the {what} must be passed on with ppermute(axis={A!r}, shift=1) each step, got "
                           f"{pn.op}({pn.inputs[0]}) axis={pa['axis']!r} shift={pa['shift']} at {pn.path}")


def _start_value(producers, b: _Body, outer: str, what: str) -> Any:
    """The one value a loop state starts at: a rank-free constant (every element the same number)."""
    z = producers.get(outer)
    zn = z[1] if z else None
    if zn is None or zn.op != "const":
        raise RingMismatch(f"the {what} must start at a constant")
    if rank_axes_in(zn.attrs):
        raise RingMismatch(f"the {what} starts at a rank-dependent constant ({zn.path}); every rank must start alike")
    v = resolve_attrs(REGISTRY["const"], zn.attrs, b.env)["value"]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RingMismatch(f"the {what} must start at one number, not a tensor literal ({zn.path})")
    return v


def _zero_start(producers, b: _Body, outer: str, what: str) -> None:
    if _start_value(producers, b, outer, what) not in (0, 0.0):
        raise RingMismatch(f"the {what} must start at a zero constant")


# The IR has no infinities; a start at or below this stands in for -inf (no training score is below it).
MAX_START_BOUND = -1e30


def _max_start(producers, b: _Body, outer: str, fill: Any) -> None:
    """The running max starts no larger than any score: at most MAX_START_BOUND and at most the mask's fill
    value (masked scores equal it).  Over the reals any start is right (Ring.ring_attention_online_softmax),
    but a start above the scores makes exp(s - m') underflow to 0 and acc / l NaN in floating point."""
    v = _start_value(producers, b, outer, "running max")
    bound = MAX_START_BOUND if fill is None else min(MAX_START_BOUND, fill)
    if not v <= bound:
        raise RingMismatch(f"the running max starts at {v}; it must start no larger than any score (at most "
                           f"{bound}{', the mask fill value' if fill is not None and fill < MAX_START_BOUND else ''})")


def _per_axis(kc: KCtx, A: str, seq: int, data: list[Fact], pos: list[Fact]) -> list[tuple[Placement, str]]:
    """Ring axis: data Shard(seq), positions Shard(0).  Other axes: data share Replicate or a batch/head shard
    (a tensor of size 1 on that dim, broadcast like MLA's shared rope key, may stay replicated)."""
    out = []
    X = kc.exprs
    for j, a in enumerate(kc.axes):
        pls = {f.pl[j] for f in data}
        if a == A:
            # contiguous blocks, or the load-balanced zig-zag chunks (the fold holds for any partition of the keys
            # into the p blocks the ring visits: Coq Zigzag.ring_attention_zigzag)
            for sh in (S, Z):
                if pls == {sh(seq)} and all(f.pl[j] == sh(0) for f in pos):
                    out.append((sh(seq), RULE))
                    break
            else:
                raise RingMismatch(f"over {A!r} the ring's tensors must be Shard({seq}) (the sequence) and the "
                                   f"positions Shard(0), or all ZigzagShard alike")
            continue
        sharded = pls - {R}
        if len(sharded) == 1 and next(iter(sharded)) in (S(0), S(1)):
            pl = next(iter(sharded))
            if any(f.pl[j] == R and X[f.expr].shape[pl.dim] != 1 for f in data):
                raise RingMismatch(f"over {a!r}: a ring tensor is replicated where the others are {pl}")
        elif pls == {R}:
            pl = R
        else:
            raise RingMismatch(f"over {a!r}: the ring's tensors must share Replicate or a batch/head Shard")
        if any(f.pl[j] != R for f in pos):
            raise RingMismatch(f"over {a!r}: the positions must be replicated")
        out.append((pl, "replicate_any" if pl == R else "rowwise_shard"))
    return out


def _loop(producers, t: str) -> tuple[int, Node] | None:
    got = producers.get(t)
    return got if got is not None and got[1].op == "ring_loop" else None


@dataclass
class _Forward:
    index: int  # the ring_loop node
    loop: Node
    axis: str
    m_out: str  # the loop's outputs holding the final reference and sum
    l_out: str
    e_q: list[int]
    e_k: list[int]
    e_v: int
    e_s: int  # full masked scaled scores
    e_mask: int | None
    e_out: int  # softmax(e_s) @ e_v
    per_axis: list
    matched: list[int]


def analyze_forward(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx) -> _Forward:
    """Check the forward ring ending at the division ``acc / l`` at node ``index``."""
    producers = ProducersBefore(g, index)
    out = g.nodes[index]
    if out.op != "div" or len(out.inputs) != 2:
        raise RuleFailure("not a division")
    got = _loop(producers, out.inputs[0]), _loop(producers, out.inputs[1])
    if got[0] is None or got[1] is None or got[0][1] is not got[1][1]:
        raise RuleFailure("not acc / l of one ring_loop")
    li, loop = got[0]
    body = loop_body(loop)
    b = _Body(loop, body, kc.env0())
    la = b.attrs(loop)
    A, k = la["axis"], la["carry"]
    if A not in kc.axes:
        raise RingMismatch(f"the loop runs over {A!r}, which is not an axis of this program")
    names = body.input_names()
    acc, l = names[loop.outputs.index(out.inputs[0])], names[loop.outputs.index(out.inputs[1])]
    upd = dict(zip(names[:k], body.outputs))  # carried input -> its value after one step

    corr, pv = _rescaled(b, upd[acc], acc, "the accumulator update")
    corr_l, rs = _rescaled(b, upd[l], l, "the normalizer update")
    if corr_l != corr:
        raise RingMismatch("the accumulator and the normalizer are rescaled by different corrections")
    m, mn = _exp_minus(b, corr, "the correction")
    if m not in names[:k] or upd[m] != mn:
        raise RingMismatch("the correction is not exp(m - m') with m a carried value replaced by m' each step")
    rsn = b.node(rs, "sum", "the normalizer's new term")
    ra = b.attrs(rsn)
    pe = rsn.inputs[0]
    nd = len(b.shape(pe))
    if [d % nd for d in ra["dims"]] != [nd - 1] or not ra["keepdim"]:
        raise RingMismatch(f"the normalizer adds sum(e, dims=[-1], keepdim=True), got dims={list(ra['dims'])} "
                           f"keepdim={ra['keepdim']} at {rsn.path}")
    pvn = b.node(pv, "matmul", "the accumulator's new term")
    if pvn.inputs[0] != pe:
        raise RingMismatch("the accumulator's new term is not matmul(e, v) with the same e as the normalizer")
    vb = pvn.inputs[1]
    s, mn2 = _exp_minus(b, pe, "the block weights e")
    if mn2 != mn:
        raise RingMismatch("the block weights e = exp(s - m') use a different reference than the correction")
    ms = b.shape(mn)
    if ms[-1] != 1 or ms[:-1] != b.shape(s)[:-1] or b.shape(m) != ms:
        raise RingMismatch(f"the reference m' must be one value per query row (shape {list(b.shape(s)[:-1]) + [1]}), "
                           f"got {list(ms)}")
    # the reference is the running max: any reference is right over the reals (the theorem), but only the
    # max keeps exp(s - m') <= 1, so a plan that would overflow in floating point is not certified
    mx = b.node(mn, "maximum", "the new reference m'")
    bm = mx.inputs[1] if mx.inputs[0] == m else mx.inputs[0] if mx.inputs[1] == m else None
    bmn = b.prod.get(bm) if bm is not None else None
    if bmn is None or bmn.op != "amax" or bmn.inputs[0] != s or [d % nd for d in b.attrs(bmn)["dims"]] != [nd - 1]:
        raise RingMismatch(f"the new reference must be the running max maximum(m, amax(s, dims=[-1], keepdim=True)) "
                           f"(at {mx.path})")
    sc = _scores(b, s)
    rotating = {f"keys {i}": k for i, k in enumerate(sc.keys)} | {"values": vb}
    invariant = {f"queries {i}": q for i, q in enumerate(sc.queries)}
    if len(set(invariant.values())) != len(invariant):
        raise RingMismatch("the score terms must use distinct query tensors")
    if sc.mask is not None:
        rotating["key positions"], invariant["query positions"] = sc.kpos, sc.qpos
    for what, t in rotating.items():
        if t not in names[:k]:
            raise RingMismatch(f"the {what} {t!r} are not carried by the loop")
        _passed_on(b, t, upd[t], A, what)
    for what, t in invariant.items():
        if t not in names[k:]:
            raise RingMismatch(f"the {what} {t!r} must be a read-only loop input")
    roles = {acc, l, m, *rotating.values()}
    if len(roles) != 3 + len(rotating) or set(names[:k]) != roles:
        raise RingMismatch(f"the loop carries {list(names[:k])}; ring attention carries exactly m, l, acc and the "
                           f"rotating {', '.join(rotating)}")
    outer = dict(zip(names, loop.inputs))
    _zero_start(producers, b, outer[acc], "accumulator")
    _zero_start(producers, b, outer[l], "normalizer")
    fill = next((b.attrs(cn)["value"] for cn in sc.chain if cn.op == "masked_fill"), None)
    _max_start(producers, b, outer[m], fill)
    for t in [*rotating.values(), *invariant.values()]:
        if outer[t] not in facts:
            raise RingMismatch(f"the loop input {outer[t]!r} has no fact")
    fqs, fks, fv = [facts[outer[q]] for q in sc.queries], [facts[outer[k_]] for k_ in sc.keys], facts[outer[vb]]
    X = kc.exprs
    nq = len(X[fqs[0].expr].shape)
    pos = [facts[outer[sc.kpos]], facts[outer[sc.qpos]]] if sc.mask else []
    if pos and any(len(X[f.expr].shape) != 1 for f in pos):
        raise RingMismatch("the key and query positions must be vectors (one position per sequence index): the "
                           "causal mask gt(kpos[None, :], qpos[:, None]) is a function of the two block positions")
    if pos and X[pos[0].expr].shape[0] != X[fks[0].expr].shape[nq - 2]:
        raise RingMismatch("the key positions and the keys have different lengths")
    if pos and X[pos[1].expr].shape[0] != X[fqs[0].expr].shape[nq - 2]:
        raise RingMismatch("the query positions and the queries have different lengths")
    per_axis = _per_axis(kc, A, nq - 2, fqs + fks + [fv], pos)
    e_s, e_mask = _score_expr(X, b, sc, [f.expr for f in fqs], [f.expr for f in fks], tuple(f.expr for f in pos))
    e_out = X.mk("matmul", {}, [X.mk("softmax", {"dim": -1}, [e_s]), fv.expr])
    m_out = loop.outputs[names.index(m)]
    l_out = loop.outputs[names.index(l)]
    matched = sorted({li} | {producers[outer[t]][0] for t in (acc, l) if outer[t] in producers})
    return _Forward(li, loop, A, m_out, l_out, [f.expr for f in fqs], [f.expr for f in fks], fv.expr, e_s, e_mask,
                    e_out, per_axis, matched)


def match_ring(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    fw = analyze_forward(g, index, facts, kc)
    try:
        d = conclude(kc, fw.e_out, fw.per_axis, out_shape(g.nodes[index]))
    except RuleFailure as exc:
        raise RingMismatch(f"at the division: {exc}") from None
    return Derivation(d.facts, d.rules + _zigzag_rule(d.facts[0].pl)), fw.matched


# ---------------------------------------------------------------------------------------------- backward
RULE_BWD = "ring_attention_backward"


def _added(b: _Body, new: str, carried: str, what: str) -> str:
    """``new = add(carried, term)`` (either order): the term."""
    add = b.node(new, "add", what)
    if carried not in add.inputs:
        raise RingMismatch(f"{what}: {carried!r} is not accumulated (add(acc, term)) at {add.path}")
    return add.inputs[1] if add.inputs[0] == carried else add.inputs[0]


def _forward_of(g: Graph, index: int, loop: int, facts, kc) -> _Forward:
    """The forward ring (loop node ``loop``) whose normalizing division precedes ``index`` and is proved."""
    why = "no division acc / l normalizes the forward loop"
    for j in range(loop + 1, index):
        n = g.nodes[j]
        if n.op == "div" and n.outputs and n.outputs[0] in facts:
            try:
                fw = analyze_forward(g, j, facts, kc)
            except RuleFailure as exc:
                why = str(exc)
                continue
            if fw.index == loop:
                return fw
    raise RingMismatch(f"the forward ring attention is not proved: {why}")


def _key_grad_term(b: _Body, term: str, what: str) -> tuple[str, str, bool]:
    """``matmul(xᵀ, y)``, optionally summed over the heads dim (dim 1, keepdim) for a head-broadcast key:
    returns (x, y, summed over heads)."""
    n = b.prod.get(term)
    heads = False
    if n is not None and n.op == "sum":
        a = b.attrs(n)
        if list(a["dims"]) != [1] or not a["keepdim"]:
            raise RingMismatch(f"{what}: a head-broadcast key's gradient sums over dims=[1] with keepdim")
        heads, term = True, n.inputs[0]
    tm = b.node(term, "matmul", what)
    xt = _transposed(b, tm.inputs[0], what)
    return xt.inputs[0], tm.inputs[1], heads


def match_ring_backward(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    """The backward ring: probabilities recomputed from the forward's final (m, l); dQ_i accumulated locally;
    dK_i, dV accumulated while travelling with their K_i, V blocks (Coq: ring_attention_backward)."""
    producers = ProducersBefore(g, index)
    loop = g.nodes[index]
    if loop.op != "ring_loop":
        raise RuleFailure("not a ring loop")
    body = loop_body(loop)
    b = _Body(loop, body, kc.env0())
    la = b.attrs(loop)
    A, k = la["axis"], la["carry"]
    names = body.input_names()
    upd = dict(zip(names[:k], body.outputs))
    outer = dict(zip(names, loop.inputs))
    rot, travel, local = [], {}, {}
    for t in names[:k]:
        pn = b.prod.get(upd[t])
        if pn is not None and pn.op == "ppermute":
            if pn.inputs[0] == t:
                rot.append(t)
            else:
                travel[t] = _added(b, pn.inputs[0], t, f"the travelling accumulator {t!r}")
            _passed_on(b, t, upd[t], A, f"carried {t!r}", body_value=pn.inputs[0])
        else:
            local[t] = _added(b, upd[t], t, f"the local accumulator {t!r}")
    if not local or len(travel) != len(local) + 1:
        raise RuleFailure("not a ring backward (local dQ accumulators and travelling dK, dV accumulators)")
    if A not in kc.axes:
        raise RingMismatch(f"the loop runs over {A!r}, which is not an axis of this program")
    dq_of: dict[str, str] = {}  # key block -> its local dQ accumulator
    ds = None
    for t, term in local.items():
        mm = b.node(term, "matmul", f"the term of {t!r}")
        if ds is not None and mm.inputs[0] != ds:
            raise RingMismatch("every dQ term must use the same dS")
        ds = mm.inputs[0]
        dq_of[mm.inputs[1]] = t
    dk_of: dict[str, tuple[str, bool]] = {}  # queries -> (travelling dK accumulator, summed over heads)
    dv = None
    for t, term in travel.items():
        x, y, heads = _key_grad_term(b, term, f"the term of {t!r}")
        if x == ds:
            dk_of[y] = (t, heads)
        elif dv is None and not heads:
            dv, p_dv, do_dv = t, x, y
        else:
            raise RingMismatch(f"the travelling accumulator {t!r} is neither dK += dSᵀ·q nor dV += Pᵀ·dO")
    if dv is None:
        raise RingMismatch("expected dV += matmul(Pᵀ, dO) among the travelling accumulators")
    # dS = [scale]( [masked_fill]( P * (dP - D) ) )
    chain, t = [], ds
    sn = b.prod.get(t)
    if sn is not None and sn.op == "scale":
        chain.append(sn)
        t = sn.inputs[0]
        sn = b.prod.get(t)
    ds_mask = None
    if sn is not None and sn.op == "masked_fill":
        chain.append(sn)
        ds_mask = sn.inputs[1]
        if b.attrs(sn)["value"] not in (0, 0.0):
            raise RingMismatch(f"masked score gradients must be zeroed, got value {b.attrs(sn)['value']} at {sn.path}")
        t = sn.inputs[0]
    mul = b.node(t, "mul", "dS = P * (dP - D)")
    for pb, diff in (mul.inputs, mul.inputs[::-1]):
        dn = b.prod.get(diff)
        if dn is not None and dn.op == "sub":
            break
    else:
        raise RingMismatch(f"dS is not P * (dP - D) at {mul.path}")
    dp, db = dn.inputs
    dpn = b.node(dp, "matmul", "dP = matmul(dO, Vᵀ)")
    do_b = dpn.inputs[0]
    vt = _transposed(b, dpn.inputs[1], "dP's transposed values")
    vb = vt.inputs[0]
    if pb != p_dv or do_b != do_dv:
        raise RingMismatch("dV's term must use the same P and dO as dS")
    pdiv = b.node(pb, "div", "P = exp(s - m) / l")
    s, mb = _exp_minus(b, pdiv.inputs[0], "P's numerator")
    lb = pdiv.inputs[1]
    sc = _scores(b, s)
    if sorted(dq_of) != sorted(sc.keys) or sorted(dk_of) != sorted(sc.queries):
        raise RingMismatch("each score term needs dQ += dS·K and dK += dSᵀ·Q with its own K block and queries")
    if (ds_mask is None) != (sc.mask is None) or (ds_mask is not None and ds_mask != sc.mask):
        raise RingMismatch("dS must be masked with the scores' causal mask (and only then)")
    rotating = sc.keys + [vb] + ([sc.kpos] if sc.mask else [])
    if sorted(rotating) != sorted(rot):
        raise RingMismatch(f"the loop passes on {rot} unchanged; the ring backward passes exactly the keys, V"
                           f"{' and the key positions' if sc.mask else ''}")
    invariant = sc.queries + [do_b, mb, lb, db] + ([sc.qpos] if sc.mask else [])
    for t in invariant:
        if t not in names[k:]:
            raise RingMismatch(f"{t!r} must be a read-only loop input")
    for t in [*local, *travel]:
        _zero_start(producers, b, outer[t], f"accumulator {t!r}")
    # the forward ring whose final (m, l) recompute the probabilities
    fm, fl = _loop(producers, outer[mb]), _loop(producers, outer[lb])
    if fm is None or fl is None or fm[1] is not fl[1]:
        raise RingMismatch("m and l must be the final reference and sum of one forward ring_loop")
    fw = _forward_of(g, index, fm[0], facts, kc)
    if (outer[mb], outer[lb]) != (fw.m_out, fw.l_out) or fw.axis != A:
        raise RingMismatch("P must use the forward ring's final reference m and sum l, over the same axis")
    for t in rotating + sc.queries + [do_b, db] + ([sc.qpos] if sc.mask else []):
        if outer[t] not in facts:
            raise RingMismatch(f"the loop input {outer[t]!r} has no fact")
    X = kc.exprs
    fqs, fks = [facts[outer[q]] for q in sc.queries], [facts[outer[k_]] for k_ in sc.keys]
    fv, fdo, fd = (facts[outer[t]] for t in (vb, do_b, db))
    pos = [facts[outer[sc.kpos]], facts[outer[sc.qpos]]] if sc.mask else []
    e_s, e_mask = _score_expr(X, b, sc, [f.expr for f in fqs], [f.expr for f in fks], tuple(f.expr for f in pos))
    if e_s != fw.e_s or fv.expr != fw.e_v:
        raise RingMismatch("the backward's scores or values are not the forward ring's")
    nq = len(X[fqs[0].expr].shape)
    last = len(X[fw.e_out].shape) - 1
    want_d = {X.mk("sum", {"dims": (last,), "keepdim": True}, [X.mk("mul", {}, pair)])
              for pair in ([fdo.expr, fw.e_out], [fw.e_out, fdo.expr])}
    if fd.expr not in want_d:
        raise RingMismatch("D must be sum(dO * O, dims=[-1], keepdim=True) with O the forward ring's output")
    per_axis = _per_axis(kc, A, nq - 2, fqs + fks + [fv, fdo, fd], pos)
    if [p for p, _ in per_axis] != [p for p, _ in fw.per_axis]:
        raise RingMismatch("the backward's placements differ from the forward ring's")
    e_p = X.mk("softmax", {"dim": -1}, [e_s])
    e_ds = X.mk("softmax_backward", {"dim": -1}, [X.mk("matmul", {}, [fdo.expr, X.mk(vt.op, b.attrs(vt), [fv.expr])]),
                                                  e_p])
    for cn in reversed(chain):
        e_ds = X.mk(cn.op, b.attrs(cn), [e_ds] + ([e_mask] if cn.op == "masked_fill" else []))
    tr = lambda e: X.mk("permute", {"dims": tuple(range(nq - 2)) + (nq - 1, nq - 2)}, [e])  # noqa: E731
    concl: dict[str, int] = {dv: X.mk("matmul", {}, [tr(e_p), fdo.expr])}
    for kb_, fk in zip(sc.keys, fks):
        concl[dq_of[kb_]] = X.mk("matmul", {}, [e_ds, fk.expr])
    for qb, fq in zip(sc.queries, fqs):
        t, heads = dk_of[qb]
        e = X.mk("matmul", {}, [tr(e_ds), fq.expr])
        concl[t] = X.mk("sum", {"dims": (1,), "keepdim": True}, [e]) if heads else e
    out, extra = [], []
    summed = {dk_of[q][0] for q in sc.queries if dk_of[q][1]}
    for j, t in enumerate(names[:k]):
        if t in concl:
            # an accumulator is placed like the tensor it is the gradient of
            src = {dq_of[kb_]: q for kb_, q in zip(sc.keys, sc.queries)}.get(t) or \
                {dk_of[q][0]: kb_ for q, kb_ in zip(sc.queries, sc.keys)}.get(t) or vb
            pl = _placement_like(facts[outer[src]], per_axis, t in summed)
            if P("sum") in pl:
                extra = ["reduce_sum_sharded_dim"]
            f = Fact(concl[t], pl)
        else:
            f = facts[outer[t]]  # K, V, positions: back at their owner
        have = loop.meta["shape@dims"][j][0]
        if local_shape(X[f.expr].shape, kc.axes, f.pl, kc.sizes) != tuple(have):
            raise RingMismatch(f"the concluded placement of {t!r} does not give its local shape {list(have)}")
        out.append(f)
    rules = [RULE_BWD if r == RULE else r for _, r in per_axis] + extra + _zigzag_rule([p for p, _ in per_axis])
    matched = sorted({index} | {producers[outer[t]][0] for t in [*local, *travel] if outer[t] in producers})
    return Derivation(out, rules), matched


def _zigzag_rule(pl) -> list[str]:
    """Ring blocks in zig-zag order: the reindexing theorem joins the ring's own."""
    return ["ring_attention_zigzag"] if any(p.kind == "Z" for p in pl) else []


def _placement_like(f: Fact, per_axis: list, head_summed: bool) -> tuple:
    """A gradient is placed like its tensor: the shared placement, except on an axis where that tensor is
    replicated because it broadcasts over the heads: there a head-summed gradient of a rank's heads is a
    partial sum over the axis (Partial(sum)), and with the heads not sharded it is whole (Replicate)."""
    out = []
    for j, (p, _) in enumerate(per_axis):
        if f.pl[j] == R and p != R:
            if not (head_summed and p == S(1)):
                raise RingMismatch("a replicated (broadcast) key needs its gradient summed over the sharded heads")
            out.append(P("sum"))
        else:
            out.append(p)
    return tuple(out)
