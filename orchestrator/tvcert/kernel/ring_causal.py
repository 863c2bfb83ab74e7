"""Torch's causal ring attention, as every cp rank runs its own program (Coq: RingMasked.v).

With ``is_causal`` torch's ``_templated_ring_attention`` attends, depending on the rank and step
(``_is_causal_behavior``), a key block with the causal mask (its own), in full, not at all, or (load-balanced)
only some query or key chunks; the trace merges the ranks' programs into one in which every rank runs its own class's
copy and picks its class's tensors (``frontends/mpmd.py``: a ``select`` is squeeze(slice(concat(unsqueeze(t_g)),
rank.A)) over the classes' tensors).  This module follows the unrolled ring *at each ring coordinate c separately*:
a select at c is its class c's tensor, ``ppermute(shift)`` at c is its input at c - shift, an all-gather's rank-b
buffer is the input at b.  Values at one coordinate:

* ``Blk``: chunks ``chunks`` (in local order) of a logical tensor along ``d`` (Shard: chunk c of p; ZigzagShard:
  chunks c and 2p-1-c of 2p), narrowed by chunk-aligned slices, concatenated along ``d``;
* ``B2``: a block (query chunks ``rows`` x key chunks ``cols``) of scores, probabilities or score gradients, and the
  (query, key, kind) chunk pairs it keeps: a causally masked block (``where(tril, s, fill)``, ``exp(.) * tril``)
  keeps (q, k, "tril") at equal local positions, (q, k, "full") below them and nothing above; an unmasked one
  keeps every pair "full";
* ``Att``: a flash pair (out / lse) of query rows ``rows``, the pairs it merged (sigmoid-form merges of disjoint
  pair sets; row slices and row concatenations, the load balancer's half merges);
* ``Part``: a gradient block (rows ``rows`` of query or key chunks) and the pairs whose terms it sums.

A conclusion is drawn only when, on every coordinate, the rows are the rank's own chunks and the pairs are the causal
mask's exactly: for query chunk a, (a, b, "full") for every b < a and (a, a, "tril") (dK / dV of key chunk b: the
same pairs read by column).  That is ``RingMasked.ring_masked_merge``'s premise (each call a 0 / 1 mask keeping a key,
their sum the causal mask); the conclusion is the logical causal SDPA as its converter spells it
(``_safe_softmax``: ``RingMasked.safe_softmax_masked``), forward, and its ``softmax_backward`` gradients
(``ring_masked_merge_backward``).  Non-causal rings are ``kernel/ring_merge.py``'s.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from ..graph import Graph, Node
from ..ops import REGISTRY, resolve_attrs
from ..shapes import rank_axes_in
from .producers import ProducersBefore, out_shape
from .ring import RingMismatch
from .ring_merge import Flat, Pack, Zero, _numel, slice_packed
from .rules import Derivation, Fact, KCtx, R, RuleFailure, S, derive, local_shape
from .zigzag import Z

RULE = "ring_masked_merge"
RULE_BWD = "ring_masked_merge_backward"


class CausalMismatch(RingMismatch):
    """torch's causal ring, but a side condition fails on some rank (a near miss naming it)."""


@dataclass(frozen=True)
class Blk:
    e: int
    d: int
    chunks: tuple
    pl: tuple


@dataclass(frozen=True)
class B2:
    e: int
    rows: tuple
    cols: tuple
    pl: tuple
    kind: str = "scores"  # scores | filled | prob | ds, + "T" transposed
    a: int = -1
    b: int = -1
    pairs: frozenset = frozenset()  # kept (q chunk, k chunk, kind) pairs (prob / ds)


@dataclass(frozen=True)
class Att:
    which: str  # out | lse
    eS: int
    eV: int | None
    rows: tuple
    pairs: frozenset
    pl: tuple


@dataclass(frozen=True)
class Part:
    e: int
    d: int
    side: str  # q (rows are query chunks: dQ) | k (key chunks: dK, dV)
    rows: tuple
    pairs: frozenset
    pl: tuple


@dataclass(frozen=True)
class Gath:
    src: str  # the all-gathered tensor: rank b's buffer is its value at b


def _pairs_of(rows: tuple, cols: tuple, masked: bool) -> frozenset:
    if not masked:
        return frozenset((a, b, "full") for a in rows for b in cols)
    if len(rows) != len(cols):
        raise RuleFailure("a causally masked block of unequal query and key chunk counts")
    return frozenset((rows[u], cols[v], "tril" if u == v else "full")
                     for u in range(len(rows)) for v in range(len(cols)) if u >= v)


def _target(rows: tuple, side: str, nch: int) -> frozenset:
    if side == "q":
        return frozenset([(a, b, "full") for a in rows for b in range(a)] + [(a, a, "tril") for a in rows])
    return frozenset([(a, b, "full") for b in rows for a in range(b + 1, nch)] + [(b, b, "tril") for b in rows])


def _proj(pairs: frozenset, rows: tuple, side: str) -> frozenset:
    return frozenset(x for x in pairs if (x[0] if side == "q" else x[1]) in rows)


def _keys(pairs: frozenset) -> set:
    return {(a, b) for a, b, _ in pairs}


class _Walk:
    """Abstract values of the tensors before op ``index`` at each coordinate of the ring axis ``A``."""

    def __init__(self, g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx, A: str):
        self.g, self.facts, self.kc, self.A = g, facts, kc, A
        self.ai = kc.axes.index(A)
        self.p = kc.sizes[A]
        self.prod = ProducersBefore(g, index)
        self.memo: dict[tuple, Any] = {}
        self.visited: set[int] = set()
        self.X = kc.exprs
        self.nch: int | None = None  # chunks of the sequence: p (Shard) or 2p (ZigzagShard)
        self.fw: dict | None = None
        self.index = index

    # ------------------------------------------------------------------ graph access, selects resolved per rank
    def raw(self, t: str) -> Node | None:
        got = self.prod.get(t)
        if got is None:
            return None
        self.visited.add(got[0])
        return got[1]

    def res(self, t: str, c: int) -> str:
        """The tensor ``t`` is at coordinate c: through mpmd selects, its class's."""
        while True:
            n = self.raw(t)
            if n is None or n.op != "squeeze" or t in self.facts:
                return t
            sl = self.raw(n.inputs[0])
            if sl is None or sl.op != "slice" or sl.attrs.get("start") != f"rank.{self.A}" or \
                    sl.attrs.get("end") != f"rank.{self.A}+1" or sl.attrs.get("dim") != 0 or \
                    self.attrs(n)["dims"] not in ([0], (0,)):
                return t
            st = self.raw(sl.inputs[0])
            if st is None or st.op != "concat" or self.attrs(st)["dim"] != 0 or len(st.inputs) != self.p:
                raise RuleFailure("a rank-indexed slice of something other than one tensor per ring coordinate")
            u = self.raw(st.inputs[c])
            if u is None or u.op != "unsqueeze" or self.attrs(u)["dim"] != 0:
                raise RuleFailure("a rank-indexed slice of a stack not built from unsqueeze(t, 0)")
            t = u.inputs[0]

    def node(self, t: str, c: int) -> Node | None:
        return self.raw(self.res(t, c))

    def shape(self, t: str) -> tuple:
        got = self.prod.get(t)
        if got is None:
            f = self.facts.get(t)
            if f is None:
                raise RuleFailure(f"no shape for {t!r}")
            return local_shape(self.X[f.expr].shape, self.kc.axes, f.pl, self.kc.sizes)
        n = got[1]
        return tuple(n.meta["shape@dims"][n.outputs.index(t)][0])

    def attrs(self, n: Node) -> dict:
        for k, v in n.attrs.items():
            if rank_axes_in(v) and not (n.op == "slice" and k in ("start", "end")):
                raise RuleFailure(f"{n.op} at {n.path}: attribute {k!r} depends on the rank")
        return resolve_attrs(REGISTRY[n.op], {k: v for k, v in n.attrs.items() if not rank_axes_in(v)},
                             self.kc.env0()) | {k: v for k, v in n.attrs.items() if rank_axes_in(v)}

    def at_rank(self, n: Node, c: int) -> dict:
        if any(rank_axes_in(v) - {self.A} for v in n.attrs.values()):
            raise RuleFailure(f"{n.op} at {n.path}: an attribute depends on another axis' coordinate")
        env = self.kc.env0()
        env[f"rank.{self.A}"] = c
        return resolve_attrs(REGISTRY[n.op], n.attrs, env)

    def const(self, t: str, c: int):
        n = self.node(t, c)
        if n is None or n.op != "const":
            return None
        v = self.attrs(n).get("value")
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def same_other(self, nd: int, *pls: tuple) -> None:
        strip = {tuple(q for j, q in enumerate(pl) if j != self.ai) for pl in pls}
        if len(strip) != 1:
            raise RuleFailure("the ring's tensors are placed differently over the other axes")
        for pl in pls:
            for j, q in enumerate(pl):
                if j != self.ai and not (q == R or (q.kind == "S" and q.dim < nd - 2)):
                    raise RuleFailure(f"over {self.kc.axes[j]!r} a ring tensor is {q}")

    def own(self, c: int) -> tuple:
        """The chunks rank c owns: its block, or its head and tail chunks (load-balanced)."""
        return (c,) if (self.nch or self.p) == self.p else (c, 2 * self.p - 1 - c)

    # ------------------------------------------------------------------ values
    def val(self, t: str, c: int):
        t = self.res(t, c)
        key = (t, c)
        if key not in self.memo:
            self.memo[key] = self._val(t, c)
        return self.memo[key]

    def _leaf(self, f: Fact, c: int):
        q = f.pl[self.ai]
        if q.kind not in ("S", "Z"):
            return f
        nch = self.p if q.kind == "S" else 2 * self.p
        if self.nch not in (None, nch):
            raise RuleFailure("blocks and zig-zag chunks mixed in one ring")
        self.nch = nch
        return Blk(f.expr, q.dim, (c,) if q.kind == "S" else (c, 2 * self.p - 1 - c), self.strip(f.pl))

    def strip(self, pl: tuple) -> tuple:
        """A placement with the ring axis' entry dropped (R): a value's chunks say what each rank holds there."""
        return tuple(R if j == self.ai else q for j, q in enumerate(pl))

    def _val(self, t: str, c: int):
        if self.const(t, c) in (0, 0.0):
            return Zero()
        f = self.facts.get(t)
        if f is not None:
            return self._leaf(f, c)
        n = self.raw(t)
        if n is None:
            raise RuleFailure(f"{t!r} has no fact")
        op = n.op
        if op in ("reshape", "view"):
            return self._reshape(n, t, c)
        if op == "concat":
            return self._concat(n, t, c)
        if op == "all_gather":
            a = self.attrs(n)
            if a["axis"] != self.A or a.get("dim", 0) != 0:
                raise RuleFailure("not an all-gather over the ring axis")
            return Gath(n.inputs[0])
        if op == "ppermute":
            a = self.attrs(n)
            if a["axis"] != self.A:
                raise RuleFailure("a ppermute over another axis")
            return self.val(n.inputs[0], (c - a["shift"]) % self.p)
        if op == "slice":
            return self._slice(n, t, c)
        if op in ("scale", "transpose", "permute", "unsqueeze", "squeeze"):
            return self._unary(n, t, c)
        if op == "matmul":
            dv = self.node(n.inputs[0], c)
            return self._flash(t, c) if dv is not None and dv.op == "div" else self._matmul(n, t, c)
        if op == "add":
            return self._add(n, t, c)
        if op == "where":
            return self._filled(n, t, c)
        if op in ("exp", "mul"):
            return self._prob_or_ds(n, t, c)
        if op == "sub":
            return self._merge(n, t, c)
        raise RuleFailure(f"{op} at {n.path} is not a step of the unrolled causal ring")

    # ------------------------------------------------------------------ layout
    def _reshape(self, n: Node, t: str, c: int):
        v = self.val(n.inputs[0], c)
        shp = self.shape(t)
        if isinstance(v, (Blk, Part)) and len(shp) == 1:
            return Flat(v, self.shape(n.inputs[0]))
        if isinstance(v, Flat) and shp == v.shape:
            return v.src
        if isinstance(v, Pack) and len(v.segs) == 1 and shp == v.segs[0].shape:
            return v.segs[0].src
        if isinstance(v, Blk):
            return self._unary(n, t, c)
        if isinstance(v, Part) and shp == self.shape(n.inputs[0]):
            return v
        if isinstance(v, Part):
            return self._unary(n, t, c)
        raise RuleFailure(f"reshape at {n.path} of {type(v).__name__}")

    def _seq_dim(self, t: str) -> int:
        return len(self.shape(t)) - 2

    def _concat(self, n: Node, t: str, c: int):
        dim = self.attrs(n)["dim"]
        shp = self.shape(t)
        vs = [self.val(x, c) for x in n.inputs]
        if len(shp) == 1:
            segs = []
            for v in vs:
                if isinstance(v, Flat):
                    segs.append(v)
                elif isinstance(v, Pack):
                    segs.extend(v.segs)
                else:
                    raise RuleFailure(f"concat at {n.path} of {type(v).__name__}")
            return Pack(tuple(segs))
        if not vs:
            raise RuleFailure("an empty concat")
        if all(isinstance(v, Att) for v in vs):
            if dim % len(shp) != len(self.X[vs[0].eS].shape) - 2:
                raise RuleFailure("a concat of attention values not along the queries")
            v0 = vs[0]
            if any((v.which, v.eS, v.eV, v.pl) != (v0.which, v0.eS, v0.eV, v0.pl) for v in vs):
                raise CausalMismatch(f"the concat at {n.path} joins rows of different attentions")
            rows = sum((v.rows for v in vs), ())
            if len(set(rows)) != len(rows):
                raise CausalMismatch(f"the concat at {n.path} repeats query rows")
            return replace(v0, rows=rows, pairs=frozenset().union(*(v.pairs for v in vs)))
        if all(isinstance(v, Part) for v in vs) and len({(v.e, v.d, v.side, v.pl) for v in vs}) == 1 and \
                vs[0].d == dim % len(shp):
            rows = sum((v.rows for v in vs), ())
            if len(set(rows)) != len(rows):
                raise CausalMismatch(f"the concat at {n.path} repeats gradient rows")
            return replace(vs[0], rows=rows, pairs=frozenset().union(*(v.pairs for v in vs)))
        if all(isinstance(v, Blk) for v in vs) and len({(v.e, v.d, v.pl) for v in vs}) == 1 and \
                vs[0].d == dim % len(shp):
            return replace(vs[0], chunks=sum((v.chunks for v in vs), ()))
        raise RuleFailure(f"concat at {n.path} of {[type(v).__name__ for v in vs]}")

    def _chunk_slice(self, n: Node, t: str, rows: tuple, dim_ok: int, c: int) -> tuple:
        a = self.at_rank(n, c)
        L = self.shape(n.inputs[0])[dim_ok]
        k = len(rows)
        if a["dim"] % len(self.shape(t)) != dim_ok or a.get("step", 1) != 1 or L % k:
            raise RuleFailure(f"slice at {n.path} is not along the chunked dim")
        cs = L // k
        st, en = a["start"], min(a["end"], L)
        if st % cs or en % cs or not 0 <= st < en <= L:
            raise CausalMismatch(f"the slice at {n.path} cuts a sequence chunk")
        return rows[st // cs:en // cs]

    def _slice(self, n: Node, t: str, c: int):
        v = self.val(n.inputs[0], c)
        if isinstance(v, Gath):
            L = _numel(self.shape(v.src))
            a = self.at_rank(n, c)
            if a["dim"] != 0 or a.get("step", 1) != 1 or a["end"] - a["start"] != L or a["start"] % L:
                raise CausalMismatch(f"the slice at {n.path} is not one rank's whole buffer of the all-gather")
            b = a["start"] // L
            if not 0 <= b < self.p:
                raise CausalMismatch(f"the slice at {n.path} reads past the all-gathered ranks on rank {c}")
            return self.val(v.src, b)
        if isinstance(v, (Pack, Flat)):
            segs = v.segs if isinstance(v, Pack) else (v,)
            return slice_packed(segs, self.at_rank(n, c), n.path, CausalMismatch)
        if isinstance(v, Blk):
            return replace(v, chunks=self._chunk_slice(n, t, v.chunks, v.d, c))
        if isinstance(v, Att):
            rows = self._chunk_slice(n, t, v.rows, len(self.X[v.eS].shape) - 2, c)  # out [.., s, d], lse [.., s(, 1)]
            return replace(v, rows=rows, pairs=_proj(v.pairs, rows, "q"))
        if isinstance(v, Part):  # the rows of a gradient a partial call adds into (torch's slice_scatter)
            rows = self._chunk_slice(n, t, v.rows, v.d, c)
            return replace(v, rows=rows, pairs=_proj(v.pairs, rows, v.side))
        raise RuleFailure(f"slice at {n.path} of {type(v).__name__}")

    def _unary(self, n: Node, t: str, c: int):
        if n.op == "unsqueeze":
            src = self.node(n.inputs[0], c)
            if src is not None and src.op == "squeeze":
                try:
                    inner = self.val(src.inputs[0], c)
                except RuleFailure:
                    inner = None
                ds = self.attrs(src)["dims"]
                if isinstance(inner, Att) and self.shape(src.inputs[0]) == self.shape(t) and \
                        list(ds) == [self.attrs(n)["dim"] % len(self.shape(t))]:
                    return inner
        v = self.val(n.inputs[0], c)
        if isinstance(v, Att) and v.which == "lse" and n.op in ("squeeze", "unsqueeze"):
            si, so = self.shape(n.inputs[0]), self.shape(t)
            nq = len(self.X[v.eS].shape) - 1  # [.., s]: one value per query row
            a = self.attrs(n)
            if n.op == "squeeze" and len(si) == nq + 1 and si[-1] == 1 and [d % len(si) for d in a["dims"]] == [nq]:
                return v  # an lse's trailing size-1 dim dropped
            if n.op == "unsqueeze" and len(si) == nq and a["dim"] % len(so) == nq:
                return v  # and put back
        if isinstance(v, Att):
            raise RuleFailure(f"{n.op} at {n.path} of an attention value")
        if isinstance(v, Part) and n.op == "scale":
            return replace(v, e=self.X.mk("scale", self.attrs(n), [v.e]))
        if isinstance(v, Part):  # a layout op of a gradient block: the engine's Shard rules (rows unchanged)
            b = self._unary_blk(n, t, Blk(v.e, v.d, v.rows, v.pl))
            return replace(v, e=b.e, d=b.d, pl=b.pl)  # the other axes' placements move with the dims too
        if isinstance(v, B2) and n.op in ("transpose", "permute"):
            a = self.attrs(n)
            r = len(self.shape(n.inputs[0]))
            swap = (tuple(a["dims"]) == tuple(range(r - 2)) + (r - 1, r - 2)) if n.op == "permute" else \
                ({a["dim0"] % r, a["dim1"] % r} == {r - 2, r - 1})
            if not swap or v.kind not in ("prob", "ds"):
                raise RuleFailure("a transpose of a block matrix that is not of its last two dims")
            e = self.X.mk("permute", {"dims": tuple(range(r - 2)) + (r - 1, r - 2)}, [v.e])
            return replace(v, e=e, rows=v.cols, cols=v.rows, kind=v.kind + "T")
        if not isinstance(v, Blk):
            raise RuleFailure(f"{n.op} at {n.path} of {type(v).__name__}")
        return self._unary_blk(n, t, v)

    def _unary_blk(self, n: Node, t: str, v: Blk) -> Blk:
        # head-tail chunks are read as ZigzagShard, so a reshape must keep whole chunks (zigzag._reshape_rule)
        want = "Z" if (self.nch or self.p) != self.p else "S"
        pl = tuple((Z(v.d) if want == "Z" else S(v.d)) if j == self.ai else q for j, q in enumerate(v.pl))
        whole = local_shape(self.X[v.e].shape, self.kc.axes, pl, self.kc.sizes)  # the op on the block's full chunks
        if whole == self.shape(n.inputs[0]):
            local = self.shape(t)
        elif n.op in ("reshape", "view"):
            raise RuleFailure(f"a reshape at {n.path} of part of a block")
        else:
            local = tuple(REGISTRY[n.op].infer([whole], self.attrs(n))[0])
        d = derive(self.kc, n.op, self.attrs(n), n.attrs, [Fact(v.e, pl)], [local])
        f = d.facts[0]
        q = f.pl[self.ai]
        if q.kind != want:
            raise RuleFailure(f"{n.op} at {n.path} does not keep the block a shard")
        return Blk(f.expr, q.dim, v.chunks, self.strip(f.pl))

    # ------------------------------------------------------------------ scores, masks, probabilities
    def _matmul(self, n: Node, t: str, c: int):
        a, b = self.val(n.inputs[0], c), self.val(n.inputs[1], c)
        nd = len(self.shape(t))
        X = self.X
        if isinstance(a, Blk) and isinstance(b, Blk):
            if a.d != nd - 2 or b.d != nd - 1:
                raise RuleFailure("not rows x columns blocks")
            self.same_other(nd, a.pl, b.pl)
            return B2(X.mk("matmul", {}, [a.e, b.e]), a.chunks, b.chunks, a.pl, "scores", a.e, b.e)
        if isinstance(a, B2) and isinstance(b, Blk) and a.kind in ("probT", "dsT", "ds"):
            if b.d != nd - 2 or b.chunks != a.cols:
                raise CausalMismatch(f"the product at {n.path} pairs a block with another block's rows on rank {c}")
            self.same_other(nd, a.pl, b.pl)
            e = X.mk("matmul", {}, [a.e, b.e])
            if a.kind == "dsT":
                tr = {"dims": tuple(range(nd - 2)) + (nd - 1, nd - 2)}
                e = X.mk("permute", tr, [X.mk("matmul", {}, [X.mk("permute", tr, [b.e]), X[a.e].args[0]])])
            return Part(e, nd - 2, "q" if a.kind == "ds" else "k", a.rows, a.pairs, a.pl)
        if isinstance(a, B2) and a.kind == "prob" and isinstance(b, Blk):
            raise RuleFailure("a forward output (matched at its merge)")
        raise RuleFailure(f"matmul at {n.path} of {type(a).__name__} x {type(b).__name__}")

    def _tril(self, t: str, c: int, rows: tuple, cols: tuple, block: tuple) -> None:
        """``t`` is tril(ones [Lq, Lk]) (diagonal 0) of the local block, maybe cast: the kernel's causal mask."""
        n = self.node(t, c)
        if n is not None and n.op == "cast":
            n = self.node(n.inputs[0], c)
        if n is None or n.op != "tril" or self.attrs(n).get("diagonal", 0) != 0:
            raise CausalMismatch("the block's mask is not tril(ones) of the block")
        one = self.node(n.inputs[0], c)
        if one is None or one.op != "const" or self.attrs(one).get("value") != 1:
            raise CausalMismatch("the block's mask is not tril of ones")
        shp = self.shape(n.outputs[0])
        if len(rows) != len(cols) or len(shp) != 2 or shp[-1] != shp[-2] or tuple(shp) != tuple(block[-2:]):
            raise CausalMismatch("a causal mask on a block that is not square in chunks, or not the block's shape")

    def _scores_of(self, t: str, c: int) -> tuple[B2, bool]:
        """(scores, masked) of a block's scores or its filled form where(tril, s, fill)."""
        v = self.val(t, c)
        if isinstance(v, B2) and v.kind in ("scores", "filled"):
            return v, v.kind == "filled"
        raise RuleFailure("not a block of scores")

    def _filled(self, n: Node, t: str, c: int):
        """where(tril, s, amin(s)): masked scores filled (any fill is right over the reals: RingMasked.masked_fill_exp;
        the kernel's row min keeps every row's max a kept score)."""
        m_t, s_t, f_t = n.inputs
        sc = self.val(s_t, c)
        if not isinstance(sc, B2) or sc.kind != "scores":
            raise RuleFailure("where of something other than a block's scores")
        self._tril(m_t, c, sc.rows, sc.cols, self.shape(s_t))
        fn = self.node(f_t, c)
        if fn is None or fn.op != "amin" or self.res(fn.inputs[0], c) != self.res(s_t, c):
            raise CausalMismatch(f"the masked scores at {n.path} are not filled with the row's min")
        return replace(sc, kind="filled")

    def _masked_exp(self, t: str, c: int):
        """(exp node's input sub, masked) of e = exp(sub(s', ref)) or exp(...) * cast(tril)."""
        n = self.node(t, c)
        if n is not None and n.op == "mul":
            for e_t, k_t in (n.inputs, n.inputs[::-1]):
                en = self.node(e_t, c)
                if en is not None and en.op == "exp":
                    sub = self.node(en.inputs[0], c)
                    if sub is None or sub.op != "sub":
                        continue
                    kn = self.node(k_t, c)
                    if kn is None or kn.op not in ("cast", "tril"):
                        continue
                    sc, _ = self._scores_of(sub.inputs[0], c)  # filled or not: the mask zeroes the fill
                    self._tril(k_t, c, sc.rows, sc.cols, self.shape(sub.inputs[0]))
                    return sub, sc, True
            raise RuleFailure("not exp(s - m) * mask")
        if n is None or n.op != "exp":
            raise RuleFailure("not exp")
        sub = self.node(n.inputs[0], c)
        if sub is None or sub.op != "sub":
            raise RuleFailure("not exp(s - m)")
        sc, masked = self._scores_of(sub.inputs[0], c)
        if masked:
            raise CausalMismatch(f"the masked scores at {sub.path} are exponentiated without the mask")
        return sub, sc, False

    def _prob_or_ds(self, n: Node, t: str, c: int):
        if n.op == "mul":
            try:
                return self._prob(t, c)
            except RuleFailure:
                return self._ds(n, t, c)
        return self._prob(t, c)

    def _prob(self, t: str, c: int):
        """P = exp(s' - lse) [* tril], lse the merged log-sum-exp of these scores over every kept pair."""
        sub, sc, masked = self._masked_exp(t, c)
        lv = self.val(sub.inputs[1], c)
        if not isinstance(lv, Att) or lv.which != "lse":
            raise RuleFailure("not probabilities from a log-sum-exp")
        if self.shape(sub.inputs[1]) != self.shape(sub.inputs[0])[:-1] + (1,):
            raise CausalMismatch(f"the log-sum-exp at {sub.path} is not one value per query row")
        if lv.eS != sc.e or lv.rows != sc.rows or lv.pairs != _target(sc.rows, "q", self.nch or self.p):
            raise CausalMismatch(f"the probabilities at {sub.path} are not recomputed from the merged log-sum-exp "
                                 f"of these rows over every causally visible key on rank {c}")
        return replace(sc, e=self.safe_softmax(sc.e), kind="prob", a=sc.e, b=-1,
                       pairs=_pairs_of(sc.rows, sc.cols, masked))

    def _ds(self, n: Node, t: str, c: int):
        """dS = P * (dP - D), dP = dO Vᵀ (V the forward's values), D = sum(dO * O, -1, keepdim)."""
        for p_t, d_t in (n.inputs, n.inputs[::-1]):
            try:
                pv = self.val(p_t, c)
            except RuleFailure:
                continue
            if isinstance(pv, B2) and pv.kind == "prob":
                break
        else:
            raise RuleFailure("not P * (dP - D)")
        dn = self.node(d_t, c)
        if dn is None or dn.op != "sub":
            raise RuleFailure("not P * (dP - D)")
        dp = self.val(dn.inputs[0], c)
        if not isinstance(dp, B2) or dp.kind != "scores" or (dp.rows, dp.cols) != (pv.rows, pv.cols):
            raise CausalMismatch(f"dS at {n.path} is not P * (dO Vᵀ - D) on the same block")
        X = self.X
        nd = len(self.shape(t))
        fw = self.forward(pv.a)
        D = self.facts.get(self.res(dn.inputs[1], c))
        if D is not None:  # a fact of D: each rank's own query rows, which must be this block's
            q = D.pl[self.ai]
            if q not in (S(nd - 2), Z(nd - 2)) or self._leaf(Fact(D.expr, D.pl), c).chunks != pv.rows:
                raise CausalMismatch(f"D at {dn.path} is not of this block's query rows on rank {c}")
            D = Fact(D.expr, self.strip(D.pl))
        else:
            D = self._rowdot(dn.inputs[1], c, pv, fw)
        want_b = X.mk("permute", {"dims": tuple(range(nd - 2)) + (nd - 1, nd - 2)}, [fw])
        if dp.b != want_b:
            raise CausalMismatch(f"dP at {n.path} is not dO times the forward's values transposed")
        e_out = X.mk("matmul", {}, [pv.e, fw])
        want_d = {X.mk("sum", {"dims": (nd - 1,), "keepdim": True}, [X.mk("mul", {}, pair)])
                  for pair in ([dp.a, e_out], [e_out, dp.a])}
        if D is None or D.expr not in want_d or D.pl != pv.pl:
            raise CausalMismatch(f"D at {dn.path} is not sum(dO * O, dims=[-1], keepdim=True) with O the forward output")
        e = X.mk("softmax_backward", {"dim": nd - 1}, [dp.e, pv.e])
        return replace(pv, e=e, kind="ds")

    def _rowdot(self, t: str, c: int, pv: B2, eV: int) -> Fact | None:
        """D = sum(dO * O, -1, keepdim) of the rank's own copy of the merged output O (no fact: a class's tensor):
        O must be the complete causal attention of these rows at c."""
        sn = self.node(t, c)
        if sn is None or sn.op != "sum":
            return None
        nd = len(self.shape(t))
        a = self.attrs(sn)
        mn = self.node(sn.inputs[0], c)
        if [d % nd for d in a["dims"]] != [nd - 1] or not a["keepdim"] or mn is None or mn.op != "mul":
            return None
        for g_t, o_t in (mn.inputs, mn.inputs[::-1]):
            try:
                o, dO = self.out_val(o_t, c), self.val(g_t, c)
            except RuleFailure:
                continue
            if not isinstance(dO, Blk) or not isinstance(o, Att) or o.which != "out" or \
                    (o.eS, o.eV, o.pl) != (pv.a, eV, pv.pl):
                continue
            if o.rows != pv.rows or o.pairs != _target(o.rows, "q", self.nch or self.p):
                raise CausalMismatch(f"D at {sn.path} reads an output that is not the whole causal attention on "
                                     f"rank {c}")
            if dO.d != nd - 2 or dO.chunks != pv.rows:
                raise CausalMismatch(f"D at {sn.path} reads the output gradient of other rows on rank {c}")
            e_out = self.X.mk("matmul", {}, [self.safe_softmax(pv.a), eV])
            return Fact(self.X.mk("sum", {"dims": (nd - 1,), "keepdim": True}, [self.X.mk("mul", {}, [dO.e, e_out])]),
                        dO.pl)
        return None

    def forward(self, eS: int) -> int:
        """The values of the proved causal forward attention of scores ``eS``."""
        if self.fw is None:
            self.fw = {}
            for j in range(self.index):
                m = self.g.nodes[j]
                f = self.facts.get(m.outputs[0]) if m.outputs else None
                if f is None:
                    continue
                e = self.X[f.expr]
                if e.op == "matmul":
                    self.fw[e.args[0]] = e.args[1]
        got = self.fw.get(self.safe_softmax(eS))
        if got is None:
            raise CausalMismatch("the forward attention of these scores is not proved")
        return got

    def safe_softmax(self, eS: int) -> int:
        """The logical causal SDPA's probabilities of scores ``eS`` [.., n, n], as the converter spells
        ``_safe_softmax`` of the -inf-masked scores (RingMasked.safe_softmax_masked)."""
        X = self.X
        sh = X[eS].shape
        nd, n = len(sh), sh[-1]
        if sh[-2] != n:
            raise RuleFailure("causal attention of non-square scores")
        def k(v, dt="float", shape=()):
            return X.mk("const", {"value": v, "shape": shape, "dtype": dt}, [])

        tril = X.mk("tril", {"diagonal": 0}, [k(1, "int", (n, n))])
        z = k(0)
        F = X.mk("where", {}, [tril, z, z])
        M = X.mk("where", {}, [tril, k(0, "int"), k(1, "int")])
        s = X.mk("add", {}, [eS, F])
        lo = X.mk("amin", {"dims": (nd - 1,), "keepdim": True}, [s])
        p = X.mk("softmax", {"dim": nd - 1}, [X.mk("where", {}, [M, lo, s])])
        q = X.mk("where", {}, [M, z, p])
        tot = X.mk("sum", {"dims": (nd - 1,), "keepdim": True}, [q])
        s1 = X.mk("where", {}, [X.mk("eq", {}, [tot, z]), k(1), tot])
        return X.mk("div", {}, [q, s1])

    # ------------------------------------------------------------------ forward: flash calls and merges
    def _flash(self, out_t: str, c: int):
        """out = matmul(div(e, z), V), e = exp(s' - m) [* tril], z = sum(e, -1, keepdim), m = amax(s', -1, keepdim)."""
        mm = self.node(out_t, c)
        if mm is None or mm.op != "matmul":
            raise RuleFailure("not a block output")
        dv = self.node(mm.inputs[0], c)
        if dv is None or dv.op != "div":
            raise RuleFailure("not softmax(s) @ V")
        e_t, z_t = dv.inputs
        sub, sc, masked = self._masked_exp(e_t, c)
        self._rowsum_of(z_t, e_t, c)
        self._rowmax_of(sub.inputs[1], sub.inputs[0], c)
        v = self.val(mm.inputs[1], c)
        nd = len(self.shape(out_t))
        if not isinstance(v, Blk) or v.d != nd - 2 or v.chunks != sc.cols:
            raise CausalMismatch(f"the values at {mm.path} are not the chunks the keys came from on rank {c}")
        self.same_other(nd, sc.pl, v.pl)
        return Att("out", sc.e, v.e, sc.rows, _pairs_of(sc.rows, sc.cols, masked), sc.pl)

    def _rowsum_of(self, z_t: str, e_t: str, c: int) -> None:
        z = self.node(z_t, c)
        nd = len(self.shape(e_t))
        if z is None or z.op != "sum" or self.res(z.inputs[0], c) != self.res(e_t, c):
            raise RuleFailure("the normalizer is not sum(e)")
        a = self.attrs(z)
        if [d % nd for d in a["dims"]] != [nd - 1] or not a["keepdim"]:
            raise CausalMismatch(f"the normalizer at {z.path} is not sum(e, dims=[-1], keepdim=True)")

    def _rowmax_of(self, m_t: str, s_t: str, c: int) -> None:
        m = self.node(m_t, c)
        nd = len(self.shape(s_t))
        if m is None or m.op != "amax" or self.res(m.inputs[0], c) != self.res(s_t, c) or \
                [d % nd for d in self.attrs(m)["dims"]] != [nd - 1] or not self.attrs(m)["keepdim"]:
            raise CausalMismatch("the block's reference is not its row max amax(s, dims=[-1], keepdim=True)")

    def _lse_block(self, n: Node, t: str, c: int):
        for m_t, lg_t in (n.inputs, n.inputs[::-1]):
            lg = self.node(lg_t, c)
            if lg is not None and lg.op == "log":
                zn = self.node(lg.inputs[0], c)
                if zn is None or zn.op != "sum":
                    continue
                sub, sc, masked = self._masked_exp(zn.inputs[0], c)
                if self.res(sub.inputs[1], c) != self.res(m_t, c):
                    raise CausalMismatch(f"the log-sum-exp at {n.path} adds a different reference than its exponent's")
                self._rowsum_of(lg.inputs[0], zn.inputs[0], c)
                self._rowmax_of(m_t, sub.inputs[0], c)
                return Att("lse", sc.e, None, sc.rows, _pairs_of(sc.rows, sc.cols, masked), sc.pl)
        raise RuleFailure("not a block log-sum-exp")

    def out_val(self, t: str, c: int):
        n = self.node(t, c)
        if n is not None and n.op == "matmul":
            key = (self.res(t, c), c, "out")
            if key not in self.memo:
                self.memo[key] = self._flash(t, c)
            return self.memo[key]
        return self.val(t, c)

    def _merge(self, n: Node, t: str, c: int):
        o_t, rhs = n.inputs
        r = self.node(rhs, c)
        if r is not None and r.op == "mul":
            for sg_t, df_t in (r.inputs, r.inputs[::-1]):
                sg, df = self.node(sg_t, c), self.node(df_t, c)
                if sg is not None and sg.op == "sigmoid" and df is not None and df.op == "sub":
                    if self.res(df.inputs[0], c) != self.res(o_t, c):
                        raise CausalMismatch(f"the merge at {n.path} subtracts from a different output than it "
                                             f"corrects")
                    d = self.node(sg.inputs[0], c)
                    if d is None or d.op != "sub":
                        raise CausalMismatch(f"the merge weight at {sg.path} is not sigmoid(lse_b - lse)")
                    row = self.shape(o_t)[:-1] + (1,)
                    if any(self.shape(x) != row for x in d.inputs) or self.shape(t) != self.shape(o_t):
                        raise CausalMismatch(f"the merge weight at {sg.path} is not one value per query row")
                    return self._union(n, self.out_val(o_t, c), self.out_val(df.inputs[1], c),
                                       self._lse(d.inputs[1], c), self._lse(d.inputs[0], c), "out", c)
        if r is not None and r.op == "sub":
            return self._merge_lse(n, o_t, r, c)
        raise RuleFailure("not a merge")

    def _lse(self, t: str, c: int) -> Att:
        v = self.val(t, c)
        if not isinstance(v, Att) or v.which != "lse":
            raise CausalMismatch(f"{t!r} is not a block's (or the merged) log-sum-exp")
        return v

    def _merge_lse(self, n: Node, l_t: str, ls: Node, c: int):
        mn, lg = self.node(ls.inputs[0], c), self.node(ls.inputs[1], c)
        if mn is None or mn.op != "minimum" or lg is None or lg.op != "log":
            raise RuleFailure("not logsigmoid")
        zs = [x for x in mn.inputs if self.const(x, c) in (0, 0.0)]
        if len(zs) != 1:
            raise CausalMismatch(f"logsigmoid at {mn.path} is not min(0, x)")
        x_t = mn.inputs[1] if mn.inputs[0] == zs[0] else mn.inputs[0]
        a1 = self.node(lg.inputs[0], c)
        ex = self.node(a1.inputs[0], c) if a1 is not None and a1.op == "add_scalar" else None
        ng = self.node(ex.inputs[0], c) if ex is not None and ex.op == "exp" else None
        ab = self.node(ng.inputs[0], c) if ng is not None and ng.op == "neg" else None
        if ab is None or ab.op != "abs" or self.res(ab.inputs[0], c) != self.res(x_t, c) or \
                self.attrs(a1)["value"] != 1:
            raise CausalMismatch(f"logsigmoid at {ls.path} is not min(0, x) - log(exp(-|x|) + 1)")
        x = self.node(x_t, c)
        if x is None or x.op != "sub" or self.res(x.inputs[0], c) != self.res(l_t, c):
            raise CausalMismatch(f"the log-sum-exp merge at {n.path} is not lse - logsigmoid(lse - lse_b)")
        if len({self.shape(y) for y in (n.outputs[0], l_t, x.inputs[1], x_t)}) != 1:
            raise CausalMismatch(f"the log-sum-exp merge at {n.path} broadcasts")
        return self._union(n, None, None, self._lse(l_t, c), self._lse(x.inputs[1], c), "lse", c)

    def _union(self, n: Node, o, ob, la: Att, lb: Att, which: str, c: int):
        if which == "out":
            for v, l_, what in ((o, la, "running"), (ob, lb, "block")):
                if not isinstance(v, Att) or v.which != "out":
                    raise CausalMismatch(f"the merge at {n.path}: the {what} output is not a flash output")
                if (v.eS, v.rows, v.pairs) != (l_.eS, l_.rows, l_.pairs):
                    raise CausalMismatch(f"the merge at {n.path} weighs the {what} output by another block's "
                                         f"log-sum-exp on rank {c}")
            if o.eV != ob.eV:
                raise CausalMismatch(f"the merge at {n.path} merges attention over different values")
        if la.eS != lb.eS or la.pl != lb.pl or la.rows != lb.rows:
            raise CausalMismatch(f"the merge at {n.path} merges attention of different scores or rows")
        if _keys(la.pairs) & _keys(lb.pairs):
            raise CausalMismatch(f"the merge at {n.path} merges a query / key chunk pair twice on rank {c}")
        return Att(which, la.eS, o.eV if which == "out" else None, la.rows, la.pairs | lb.pairs, la.pl)

    def _add(self, n: Node, t: str, c: int):
        if any((self.node(x, c) is not None and self.node(x, c).op == "log") for x in n.inputs):
            return self._lse_block(n, t, c)
        a, b = self.val(n.inputs[0], c), self.val(n.inputs[1], c)
        if isinstance(a, Zero) and isinstance(b, Part):
            a, b = b, a
        if isinstance(a, Part) and isinstance(b, Zero):
            if self.shape(t) != self.shape(n.inputs[0]) or self.shape(t) != self.shape(n.inputs[1]):
                raise RuleFailure("adding a zero constant changes the shape")
            return a
        if isinstance(a, Part) and isinstance(b, Part):
            if (a.e, a.d, a.side, a.rows, a.pl) != (b.e, b.d, b.side, b.rows, b.pl):
                raise CausalMismatch(f"the accumulation at {n.path} adds terms of different gradients or blocks "
                                     f"on rank {c}")
            if _keys(a.pairs) & _keys(b.pairs):
                raise CausalMismatch(f"the accumulation at {n.path} adds a chunk pair's term twice on rank {c}")
            return replace(a, pairs=a.pairs | b.pairs)
        raise RuleFailure(f"add at {n.path} of {type(a).__name__} + {type(b).__name__}")


def _own(w: _Walk, c: int) -> tuple:
    return w.own(c)


def _conclude(w: _Walk, expr: int, pl: tuple, d: int, rule: str, local) -> Derivation:
    q = S(d) if (w.nch or w.p) == w.p else Z(d)
    out_pl = tuple(q if j == w.ai else x for j, x in enumerate(pl))
    rules = [rule if j == w.ai else ("replicate_any" if x == R else "rowwise_shard") for j, x in enumerate(out_pl)]
    if local_shape(w.X[expr].shape, w.kc.axes, out_pl, w.kc.sizes) != tuple(local):
        raise CausalMismatch("the concluded placement does not give the op's local shape")
    return Derivation([Fact(expr, out_pl)], rules)


def _values(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx):
    """(walk, [value at each coordinate]) over each candidate ring axis; RuleFailure values where a walk stopped.
    A side condition failing at some coordinate is no verdict on its own: a class's copy of the ring runs on every
    rank, meaningful only on its class's ranks (the select picks it there), so the near miss is reported only if no
    axis concludes."""
    for A in [a for a in kc.axes if kc.sizes.get(a, 1) > 1]:
        w = _Walk(g, index + 1, facts, kc, A)
        try:
            yield w, [w.val(g.nodes[index].outputs[0], c) for c in range(w.p)]
        except RuleFailure as exc:
            yield w, exc


def _check_all(w: _Walk, vs: list, side: str, what: str) -> None:
    for c, v in enumerate(vs):
        own = _own(w, c)
        if v.rows != own:  # not home yet (a travelling gradient), or part of the rows
            raise RuleFailure(f"the {what} on rank {c} holds chunks {list(v.rows)}, not its own {list(own)}")
        want = _target(own, side, w.nch or w.p)
        if v.pairs < want:  # an intermediate: not every term yet
            raise RuleFailure(f"the {what} on rank {c} misses chunk pairs {sorted(_keys(want) - _keys(v.pairs))}")
        if v.pairs != want:
            miss = sorted(_keys(want) - _keys(v.pairs))
            extra = sorted(_keys(v.pairs) - _keys(want))
            kinds = sorted((a, b) for a, b, k in v.pairs if (a, b) in _keys(want) and (a, b, k) not in want)
            raise CausalMismatch(f"the {what} on rank {c} is not causal attention: (query, key) chunk pairs missing "
                                 f"{miss}, not causally visible {extra}, masked the wrong way {kinds}")


def match_causal(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    """The causal attention of every rank's own rows (Coq: RingMasked.ring_masked_merge)."""
    n = g.nodes[index]
    if n.op not in ("sub", "squeeze", "concat"):
        raise RuleFailure("not a causal merge")
    last = None
    for w, vs in _values(g, index, facts, kc):
        if isinstance(vs, RuleFailure):
            last = vs
            continue
        if not all(isinstance(v, Att) and v.which == "out" for v in vs) or \
                not any(k == "tril" for v in vs for *_, k in v.pairs):
            raise RuleFailure("not a causal attention output")
        v0 = vs[0]
        if any((v.eS, v.eV, v.pl) != (v0.eS, v0.eV, v0.pl) for v in vs):
            raise CausalMismatch("the ranks' outputs are attention of different scores or values")
        _check_all(w, vs, "q", "merged output")
        nd = len(w.X[v0.eS].shape)
        e = w.X.mk("matmul", {}, [w.safe_softmax(v0.eS), v0.eV])
        return _conclude(w, e, v0.pl, nd - 2, RULE, out_shape(n)), sorted(w.visited - {index})
    raise RuleFailure(str(last) if last else "not a causal merge")


def match_causal_backward(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    """dQ, dK or dV of causal attention complete on its owner (Coq: RingMasked.ring_masked_merge_backward)."""
    n = g.nodes[index]
    if n.op not in ("add", "reshape", "view", "scale", "squeeze"):
        raise RuleFailure("not a causal ring gradient")
    last = None
    for w, vs in _values(g, index, facts, kc):
        if isinstance(vs, RuleFailure):
            last = vs
            continue
        if not all(isinstance(v, Part) for v in vs) or not any(k == "tril" for v in vs for *_, k in v.pairs):
            raise RuleFailure("not a causal ring gradient")
        v0 = vs[0]
        if any((v.e, v.d, v.side, v.pl) != (v0.e, v0.d, v0.side, v0.pl) for v in vs):
            raise CausalMismatch("the ranks' gradients are of different tensors")
        _check_all(w, vs, v0.side, "gradient")
        return _conclude(w, v0.e, v0.pl, v0.d, RULE_BWD, out_shape(n)), sorted(w.visited - {index})
    raise RuleFailure(str(last) if last else "not a causal ring gradient")
