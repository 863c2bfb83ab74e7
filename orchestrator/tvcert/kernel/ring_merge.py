"""Torch's unrolled ring attention: flash (out, lse) pairs per key block merged in sigmoid form (Coq: RingMerge.v).

``_templated_ring_attention`` runs no loop the ring rules (kernel/ring.py) could match: rank r attends its
queries to the key blocks that visit it (its own, then blocks read from an all-gathered or ppermuted buffer of
K and V packed flat), one flash call per block, and merges each block's pair into the running one as
``out - sigmoid(lse_b - lse) * (out - out_b)``, ``lse - logsigmoid(lse - lse_b)``.  The backward recomputes
``P = exp(S - lse)`` per block from the merged lse, adds ``dS K`` into dQ locally and ``dSᵀ Q``, ``Pᵀ dO`` into
dK / dV buffers that travel with ``ppermute`` until they are back at the block's owner.

This module follows what every op of that region holds, per cp rank, as an abstract value (block indices and
contribution sets are tuples over the ring axis' coordinates, computed exactly for the concrete mesh):

* ``Blk``: block ``idx[c]`` (along ``d``) of a logical tensor -- a fact Shard(d) is the identity schedule;
  a packed buffer's slice read back into the shape it was flattened from is its source block; an all-gather's
  chunk ``start / L`` is that rank's buffer; ``ppermute(shift)`` reindexes by ``c - shift``;
* ``B2``: block (``rows[c]``, ``cols[c]``) of a score-like matrix (queries x keys);
* ``Att``: the flash pair of a set of key blocks (``sets[c]``), merged pairs the union of disjoint sets;
* ``Part``: rows ``rows[c]`` of a contraction over the key (or query) blocks, summed over ``sets[c]``;
* ``Flat`` / ``Pack`` / ``Gathered``: flattened, concatenated and gathered buffers of those.

A conclusion is drawn only when every rank's set is every block exactly once (disjoint unions), which is the
premise of ``ring_sigmoid_merge`` (forward: the schedule visits each block once) and of
``ring_sigmoid_merge_backward`` (each gradient holds every block's term once).  Layout steps (flatten, concat,
slice, reshape back, all-gather, ppermute) are exact index bookkeeping; unary layout / scale ops on a block
are the engine's own Shard rules (true for every block index, so for ``idx[c]``).  Causal / load-balanced rings
(per-rank programs merged, frontends/mpmd) are kernel/ring_causal.py's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from ..graph import Graph, Node
from ..ops import REGISTRY, resolve_attrs
from ..shapes import rank_axes_in
from .producers import ProducersBefore, out_shape
from .rules import Derivation, Fact, KCtx, R, RuleFailure, S, derive, local_shape
from .ring import RingMismatch

RULE = "ring_sigmoid_merge"
RULE_BWD = "ring_sigmoid_merge_backward"


class MergeMismatch(RingMismatch):
    """The ops are torch's merge, but a side condition fails (reported as a near miss)."""


@dataclass(frozen=True)
class Blk:
    e: int
    d: int
    idx: tuple
    pl: tuple  # the fact's placement (the ring axis' entry is S(d))


@dataclass(frozen=True)
class B2:
    e: int
    rows: tuple
    cols: tuple
    pl: tuple
    kind: str = "scores"  # scores | prob | ds
    a: int = -1  # matmul(a, b) = e for kind scores
    b: int = -1


@dataclass(frozen=True)
class Att:
    which: str  # out | lse
    eS: int
    eV: int | None
    sets: tuple
    pl: tuple


@dataclass(frozen=True)
class Part:
    e: int
    d: int
    rows: tuple
    sets: tuple
    pl: tuple


@dataclass(frozen=True)
class Flat:
    src: Any  # Blk | Part
    shape: tuple


@dataclass(frozen=True)
class Pack:
    segs: tuple  # Flat, ...


@dataclass(frozen=True)
class Gathered:
    pack: Pack


@dataclass(frozen=True)
class Zero:
    pass



def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def slice_packed(segs, a, path: str, mismatch):
    """A 1-D slice ``a`` (resolved attrs) of packed segments ``segs``: the segments it covers whole (one, or a
    Pack of them); ``mismatch`` (a near miss) when it cuts a segment or covers none."""
    if a["dim"] != 0 or a.get("step", 1) != 1:
        raise RuleFailure("not a 1-D slice")
    off, out = 0, []
    for s in segs:
        k = _numel(s.shape)
        if a["start"] <= off and off + k <= a["end"]:
            out.append(s)
        elif off < a["end"] and a["start"] < off + k:
            raise mismatch(f"the slice at {path} cuts a packed tensor")
        off += k
    if sum(_numel(s.shape) for s in out) != a["end"] - a["start"] or not out:
        raise mismatch(f"the slice at {path} does not cover whole packed tensors")
    return out[0] if len(out) == 1 else Pack(tuple(out))


def _reindex(v, perm: tuple):
    """The value each rank c holds after receiving rank perm[c]'s."""
    if isinstance(v, Blk):
        return replace(v, idx=tuple(v.idx[j] for j in perm))
    if isinstance(v, Part):
        return replace(v, rows=tuple(v.rows[j] for j in perm), sets=tuple(v.sets[j] for j in perm))
    if isinstance(v, Flat):
        return replace(v, src=_reindex(v.src, perm))
    if isinstance(v, Pack):
        return Pack(tuple(_reindex(s, perm) for s in v.segs))
    raise RuleFailure(f"cannot pass {type(v).__name__} around the ring")


class _Walk:
    """Abstract values of the tensors before op ``index``, per ring-axis coordinate."""

    def __init__(self, g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx, A: str):
        self.g, self.facts, self.kc, self.A, self.index = g, facts, kc, A, index
        self.fw: dict[int, Att] | None = None
        self.ai = kc.axes.index(A)
        self.p = kc.sizes[A]
        self.prod = ProducersBefore(g, index)
        self.memo: dict[str, Any] = {}
        self.visited: set[int] = set()
        self.X = kc.exprs
        self.ident = tuple(range(self.p))
        self.all = tuple(frozenset(range(self.p)) for _ in range(self.p))

    # ------------------------------------------------------------------ helpers
    def node(self, t: str) -> Node | None:
        got = self.prod.get(t)
        if got is None:
            return None
        self.visited.add(got[0])
        return got[1]

    def shape(self, t: str) -> tuple:
        got = self.prod.get(t)
        if got is None:
            f = self.facts.get(t)
            if f is None:
                raise RuleFailure(f"no shape for {t!r}")
            return local_shape(self.X[f.expr].shape, self.kc.axes, f.pl, self.kc.sizes)
        n = got[1]
        return tuple(n.meta["shape@dims"][n.outputs.index(t)][0])

    def attrs(self, n: Node, rank_ok: tuple = ()) -> dict:
        for k, v in n.attrs.items():
            if k not in rank_ok and rank_axes_in(v):
                raise RuleFailure(f"{n.op} at {n.path}: attribute {k!r} depends on the rank")
        return resolve_attrs(REGISTRY[n.op], n.attrs, self.kc.env0())

    def at_rank(self, n: Node, c: int) -> dict:
        """Attributes at ring coordinate c (they may mention only the ring axis' coordinate)."""
        if any(rank_axes_in(v) - {self.A} for v in n.attrs.values()):
            raise RuleFailure(f"{n.op} at {n.path}: an attribute depends on another axis' coordinate")
        env = self.kc.env0()
        env[f"rank.{self.A}"] = c
        return resolve_attrs(REGISTRY[n.op], n.attrs, env)

    def const(self, t: str):
        n = self.node(t)
        if n is None or n.op != "const":
            return None
        v = self.attrs(n).get("value")
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def other_pl_ok(self, pl: tuple, nd: int) -> None:
        for j, q in enumerate(pl):
            if j != self.ai and not (q == R or (q.kind == "S" and q.dim < nd - 2)):
                raise RuleFailure(f"over {self.kc.axes[j]!r} a ring tensor is {q}: only Replicate or a batch / head "
                                  f"shard keeps each rank's attention its own")

    def same_other(self, nd: int, *pls: tuple) -> None:
        """Over the other axes every tensor of the block product shares Replicate or a shard of a batch / head dim
        (before the rows and columns): each rank's attention is then its own (batch, head) rows'."""
        strip = {tuple(q for j, q in enumerate(pl) if j != self.ai) for pl in pls}
        if len(strip) != 1:
            raise RuleFailure("the ring's tensors are placed differently over the other axes")
        for pl in pls:
            self.other_pl_ok(pl, nd)

    # ------------------------------------------------------------------ the abstract value of a tensor
    def val(self, t: str):
        if t not in self.memo:
            self.memo[t] = self._val(t)
        return self.memo[t]

    def _val(self, t: str):
        if self.const(t) in (0, 0.0):
            return Zero()  # zeros_like(...): the accumulators' start (a rank-free constant 0)
        f = self.facts.get(t)
        if f is not None:
            q = f.pl[self.ai]
            if q.kind == "S":
                return Blk(f.expr, q.dim, self.ident, f.pl)
            return f
        n = self.node(t)
        if n is None:
            raise RuleFailure(f"{t!r} has no fact")
        op = n.op
        if op == "const":
            if self.const(t) in (0, 0.0):
                return Zero()
            raise RuleFailure("a non-zero constant")
        if op in ("reshape", "view"):
            return self._reshape(n, t)
        if op == "concat":
            return self._concat(n)
        if op == "all_gather":
            a = self.attrs(n)
            v = self.val(n.inputs[0])
            if a["axis"] != self.A or a.get("dim", 0) != 0 or not isinstance(v, (Pack, Flat)):
                raise RuleFailure("not an all-gather of a packed buffer over the ring axis")
            return Gathered(v if isinstance(v, Pack) else Pack((v,)))
        if op == "ppermute":
            a = self.attrs(n)
            if a["axis"] != self.A:
                raise RuleFailure("a ppermute over another axis")
            s = a["shift"]
            return _reindex(self.val(n.inputs[0]), tuple((c - s) % self.p for c in range(self.p)))
        if op == "slice":
            return self._slice(n, t)
        if op in ("scale", "transpose", "permute", "unsqueeze", "squeeze"):
            return self._unary(n, t)
        if op == "matmul":
            return self._matmul(n, t)
        if op == "add":
            return self._add(n, t)
        if op == "exp":
            return self._prob(n, t)
        if op == "mul":
            return self._ds(n, t)
        if op == "sub":
            return self._merge(n, t)
        raise RuleFailure(f"{op} at {n.path} is not a step of the unrolled ring")

    # ------------------------------------------------------------------ layout
    def _reshape(self, n: Node, t: str):
        v = self.val(n.inputs[0])
        shp = self.shape(t)
        if isinstance(v, (Blk, Part)) and len(shp) == 1:
            return Flat(v, self.shape(n.inputs[0]))
        if isinstance(v, Flat) and shp == v.shape:
            return v.src  # flattened and read back in the same row-major shape
        if isinstance(v, Pack) and len(v.segs) == 1 and shp == v.segs[0].shape:
            return v.segs[0].src
        if isinstance(v, Blk):
            return self._unary(n, t)
        raise RuleFailure(f"reshape at {n.path} of {type(v).__name__}")

    def _concat(self, n: Node):
        if self.attrs(n)["dim"] not in (0, -1) or len(self.shape(n.outputs[0])) != 1:
            raise RuleFailure("not a 1-D packing")
        segs = []
        for x in n.inputs:
            v = self.val(x)
            if isinstance(v, Flat):
                segs.append(v)
            elif isinstance(v, Pack):
                segs.extend(v.segs)
            else:
                raise RuleFailure(f"concat at {n.path} of {type(v).__name__}")
        return Pack(tuple(segs))

    def _slice(self, n: Node, t: str):
        v = self.val(n.inputs[0])
        if isinstance(v, Gathered):
            L = sum(_numel(s.shape) for s in v.pack.segs)
            src = []
            for c in range(self.p):
                a = self.at_rank(n, c)
                if a["dim"] != 0 or a.get("step", 1) != 1 or a["end"] - a["start"] != L or a["start"] % L:
                    raise MergeMismatch(f"the slice at {n.path} is not one rank's whole buffer of the all-gather")
                b = a["start"] // L
                if not 0 <= b < self.p:
                    raise MergeMismatch(f"the slice at {n.path} reads past the all-gathered ranks on rank {c}")
                src.append(b)
            return _reindex(v.pack, tuple(src))
        if isinstance(v, (Pack, Flat)):
            segs = v.segs if isinstance(v, Pack) else (v,)
            return slice_packed(segs, self.attrs(n), n.path, MergeMismatch)
        raise RuleFailure(f"slice at {n.path} of {type(v).__name__}")

    def _unary(self, n: Node, t: str):
        if n.op == "unsqueeze":
            src = self.node(n.inputs[0])
            if src is not None and src.op == "squeeze":
                try:
                    inner = self.val(src.inputs[0])
                except RuleFailure:
                    inner = None
                ds = self.attrs(src)["dims"]
                if isinstance(inner, Att) and self.shape(src.inputs[0]) == self.shape(t) and \
                        list(ds) == [self.attrs(n)["dim"] % len(self.shape(t))]:
                    return inner  # unsqueeze(squeeze(x, d), d) of a size-1 dim d is x
        v = self.val(n.inputs[0])
        if isinstance(v, Att):
            raise RuleFailure(f"{n.op} at {n.path} of a log-sum-exp")
        if isinstance(v, Part) and n.op == "scale":
            return replace(v, e=self.X.mk("scale", self.attrs(n), [v.e]))
        if isinstance(v, B2) and n.op in ("transpose", "permute"):
            a = self.attrs(n)
            r = len(self.shape(n.inputs[0]))
            swap = (tuple(a["dims"]) == tuple(range(r - 2)) + (r - 1, r - 2)) if n.op == "permute" else \
                ({a["dim0"] % r, a["dim1"] % r} == {r - 2, r - 1})
            if not swap:
                raise RuleFailure("a transpose of a block matrix that is not of its last two dims")
            e = self.X.mk("permute", {"dims": tuple(range(r - 2)) + (r - 1, r - 2)}, [v.e])
            return B2(e, v.cols, v.rows, v.pl, v.kind + "T")
        if not isinstance(v, Blk):
            raise RuleFailure(f"{n.op} at {n.path} of {type(v).__name__}")
        pl = tuple(S(v.d) if j == self.ai else q for j, q in enumerate(v.pl))
        d = derive(self.kc, n.op, self.attrs(n), n.attrs, [Fact(v.e, pl)], [self.shape(t)])
        f = d.facts[0]
        q = f.pl[self.ai]
        if q.kind != "S":
            raise RuleFailure(f"{n.op} at {n.path} does not keep the block a shard")
        return Blk(f.expr, q.dim, v.idx, f.pl)

    # ------------------------------------------------------------------ products
    def _matmul(self, n: Node, t: str):
        a, b = self.val(n.inputs[0]), self.val(n.inputs[1])
        nd = len(self.shape(t))
        X = self.X
        if isinstance(a, Blk) and isinstance(b, Blk):
            if a.d != nd - 2 or b.d != nd - 1:
                raise RuleFailure("not rows x columns blocks")
            self.same_other(nd, a.pl, b.pl)
            return B2(X.mk("matmul", {}, [a.e, b.e]), a.idx, b.idx, a.pl, "scores", a.e, b.e)
        if isinstance(a, B2) and isinstance(b, Blk) and a.kind in ("probT", "dsT", "ds"):
            if b.d != nd - 2 or b.idx != a.cols:
                raise MergeMismatch(f"the product at {n.path} pairs a block with another block's rows")
            self.same_other(nd, a.pl, b.pl)
            e = X.mk("matmul", {}, [a.e, b.e])
            if a.kind == "dsT":  # dK = dSᵀ Q spelled as autograd spells it, (Qᵀ dS)ᵀ (RingMerge.matmul_transposed)
                tr = {"dims": tuple(range(nd - 2)) + (nd - 1, nd - 2)}
                e = X.mk("permute", tr, [X.mk("matmul", {}, [X.mk("permute", tr, [b.e]), X[a.e].args[0]])])
            return Part(e, nd - 2, a.rows, tuple(frozenset([k]) for k in a.cols), a.pl)
        raise RuleFailure(f"matmul at {n.path} of {type(a).__name__} x {type(b).__name__}")

    def _add(self, n: Node, t: str):
        if any((self.node(x) is not None and self.node(x).op == "log") for x in n.inputs):
            return self._lse_block(n, t)
        a, b = self.val(n.inputs[0]), self.val(n.inputs[1])
        if isinstance(a, Zero) and isinstance(b, Part):
            a, b = b, a
        if isinstance(a, Part) and isinstance(b, Zero):
            if self.shape(t) != self.shape(n.inputs[0] if a is self.val(n.inputs[0]) else n.inputs[1]):
                raise RuleFailure("adding a zero constant changes the shape")
            return a
        if isinstance(a, Part) and isinstance(b, Part):
            if (a.e, a.d, a.rows, a.pl) != (b.e, b.d, b.rows, b.pl):
                raise MergeMismatch(f"the accumulation at {n.path} adds terms of different gradients or blocks")
            if any(x & y for x, y in zip(a.sets, b.sets)):
                raise MergeMismatch(f"the accumulation at {n.path} adds a block's term twice")
            return replace(a, sets=tuple(x | y for x, y in zip(a.sets, b.sets)))
        raise RuleFailure(f"add at {n.path} of {type(a).__name__} + {type(b).__name__}")

    # ------------------------------------------------------------------ forward: the flash block and the merge
    def _flash(self, out_t: str):
        """out = matmul(div(e, z), V), e = exp(s - m), z = sum(e, -1, keepdim), m = amax(s, -1, keepdim)."""
        mm = self.node(out_t)
        if mm is None or mm.op != "matmul":
            raise RuleFailure("not a block output")
        dv = self.node(mm.inputs[0])
        if dv is None or dv.op != "div":
            raise RuleFailure("not softmax(s) @ V")
        e_t, z_t = dv.inputs
        en = self.node(e_t)
        if en is not None and en.op == "mul":
            raise RuleFailure(f"the block at {mm.path} is causally masked (exp(s - m) * mask): torch's causal ring, "
                              f"ring_masked_merge's (kernel/ring_causal.py)")
        s_t, m_t = self._exp_minus(e_t)
        self._rowsum_of(z_t, e_t)
        self._rowmax_of(m_t, s_t)
        sc = self.val(s_t)
        v = self.val(mm.inputs[1])
        if not isinstance(sc, B2) or sc.kind != "scores" or sc.rows != self.ident:
            raise RuleFailure("the block scores are not this rank's queries against one key block")
        nd = len(self.shape(out_t))
        if not isinstance(v, Blk) or v.d != nd - 2 or v.idx != sc.cols:
            raise MergeMismatch(f"the values at {mm.path} are not the block the keys came from")
        self.same_other(nd, sc.pl, v.pl)
        return Att("out", sc.e, v.e, tuple(frozenset([k]) for k in sc.cols), sc.pl), (s_t, m_t, z_t)

    def _exp_minus(self, t: str) -> tuple[str, str]:
        e = self.node(t)
        if e is None or e.op != "exp":
            raise RuleFailure("not exp")
        s = self.node(e.inputs[0])
        if s is None or s.op != "sub":
            raise RuleFailure("not exp(s - m)")
        return s.inputs[0], s.inputs[1]

    def _rowsum_of(self, z_t: str, e_t: str) -> None:
        z = self.node(z_t)
        nd = len(self.shape(e_t))
        if z is None or z.op != "sum" or z.inputs[0] != e_t:
            raise RuleFailure("the normalizer is not sum(e)")
        a = self.attrs(z)
        if [d % nd for d in a["dims"]] != [nd - 1] or not a["keepdim"]:
            raise MergeMismatch(f"the normalizer at {z.path} is not sum(e, dims=[-1], keepdim=True)")

    def _rowmax_of(self, m_t: str, s_t: str) -> None:
        """Any reference is right over the reals (RingMerge.flash_out_eq); only the row max keeps exp(s - m) <= 1."""
        m = self.node(m_t)
        nd = len(self.shape(s_t))
        if m is None or m.op != "amax" or m.inputs[0] != s_t or \
                [d % nd for d in self.attrs(m)["dims"]] != [nd - 1] or not self.attrs(m)["keepdim"]:
            raise MergeMismatch("the block's reference is not its row max amax(s, dims=[-1], keepdim=True)")

    def _lse_block(self, n: Node, t: str):
        """lse = add(m, log(z)) of a flash block (z = sum(exp(s - m)), the same m)."""
        for m_t, lg_t in (n.inputs, n.inputs[::-1]):
            lg = self.node(lg_t)
            if lg is not None and lg.op == "log":
                z = self.node(lg.inputs[0])
                if z is None or z.op != "sum":
                    continue
                s_t, m2 = self._exp_minus(z.inputs[0])
                if m2 != m_t:
                    raise MergeMismatch(f"the log-sum-exp at {n.path} adds a different reference than its exponent's")
                self._rowsum_of(lg.inputs[0], z.inputs[0])
                self._rowmax_of(m_t, s_t)
                sc = self.val(s_t)
                if not isinstance(sc, B2) or sc.kind != "scores" or sc.rows != self.ident:
                    raise RuleFailure("not a block's scores")
                return Att("lse", sc.e, None, tuple(frozenset([k]) for k in sc.cols), sc.pl)
        raise RuleFailure("not a block log-sum-exp")

    def out_val(self, t: str):
        """A block's output, or a merge of outputs."""
        if t in self.memo and isinstance(self.memo[t], Att):
            return self.memo[t]
        n = self.node(t)
        if n is not None and n.op == "matmul":
            v, _ = self._flash(t)
            self.memo[t] = v
            return v
        return self.val(t)

    def _merge(self, n: Node, t: str):
        """out' = out - sigmoid(lse_b - lse) * (out - out_b); lse' = lse - logsigmoid(lse - lse_b)."""
        o_t, rhs = n.inputs
        r = self.node(rhs)
        if r is not None and r.op == "mul":
            for sg_t, df_t in (r.inputs, r.inputs[::-1]):
                sg, df = self.node(sg_t), self.node(df_t)
                if sg is not None and sg.op == "sigmoid" and df is not None and df.op == "sub":
                    return self._merge_out(n, o_t, sg, df)
        if r is not None and r.op == "sub":
            return self._merge_lse(n, o_t, r)
        raise RuleFailure("not a merge")

    def _lse(self, t: str):
        v = self.val(t)
        if not isinstance(v, Att) or v.which != "lse":
            raise MergeMismatch(f"{t!r} is not a block's (or the merged) log-sum-exp")
        return v

    def _merge_out(self, n: Node, o_t: str, sg: Node, df: Node):
        if df.inputs[0] != o_t:
            raise MergeMismatch(f"the merge at {n.path} subtracts from a different output than it corrects")
        o, ob = self.out_val(o_t), self.out_val(df.inputs[1])
        d = self.node(sg.inputs[0])
        if d is None or d.op != "sub":
            raise MergeMismatch(f"the merge weight at {sg.path} is not sigmoid(lse_b - lse)")
        lb, la = self._lse(d.inputs[0]), self._lse(d.inputs[1])
        return self._union(n, o, ob, la, lb, "out")

    def _merge_lse(self, n: Node, l_t: str, ls: Node):
        """ls = logsigmoid(x) spelled min(0, x) - log(exp(-|x|) + 1), x = lse - lse_b."""
        mn, lg = self.node(ls.inputs[0]), self.node(ls.inputs[1])
        if mn is None or mn.op != "minimum" or lg is None or lg.op != "log":
            raise RuleFailure("not logsigmoid")
        zs = [x for x in mn.inputs if self.const(x) in (0, 0.0)]
        if len(zs) != 1:
            raise MergeMismatch(f"logsigmoid at {mn.path} is not min(0, x)")
        x_t = mn.inputs[1] if mn.inputs[0] == zs[0] else mn.inputs[0]
        a1 = self.node(lg.inputs[0])
        ex = self.node(a1.inputs[0]) if a1 is not None and a1.op == "add_scalar" else None
        ng = self.node(ex.inputs[0]) if ex is not None and ex.op == "exp" else None
        ab = self.node(ng.inputs[0]) if ng is not None and ng.op == "neg" else None
        if ab is None or ab.op != "abs" or ab.inputs[0] != x_t or self.attrs(a1)["value"] != 1:
            raise MergeMismatch(f"logsigmoid at {ls.path} is not min(0, x) - log(exp(-|x|) + 1)")
        x = self.node(x_t)
        if x is None or x.op != "sub" or x.inputs[0] != l_t:
            raise MergeMismatch(f"the log-sum-exp merge at {n.path} is not lse - logsigmoid(lse - lse_b)")
        la, lb = self._lse(l_t), self._lse(x.inputs[1])
        return self._union(n, None, None, la, lb, "lse")

    def _union(self, n: Node, o, ob, la: Att, lb: Att, which: str):
        if which == "out":
            for v, l_, what in ((o, la, "running"), (ob, lb, "block")):
                if not isinstance(v, Att) or v.which != "out":
                    raise MergeMismatch(f"the merge at {n.path}: the {what} output is not a flash output")
                if (v.eS, v.sets) != (l_.eS, l_.sets):
                    raise MergeMismatch(f"the merge at {n.path} weighs the {what} output by another block's "
                                        f"log-sum-exp")
            if o.eV != ob.eV:
                raise MergeMismatch(f"the merge at {n.path} merges attention over different values")
        if la.eS != lb.eS or la.pl != lb.pl:
            raise MergeMismatch(f"the merge at {n.path} merges attention of different scores")
        if any(x & y for x, y in zip(la.sets, lb.sets)):
            raise MergeMismatch(f"the merge at {n.path} merges a key block twice")
        sets = tuple(x | y for x, y in zip(la.sets, lb.sets))
        return Att(which, la.eS, o.eV if which == "out" else None, sets, la.pl)

    # ------------------------------------------------------------------ backward
    def _prob(self, n: Node, t: str):
        """P = exp(s - lse) with lse the merged (whole-row) log-sum-exp of the same scores."""
        s_t, l_t = self._exp_minus(t)
        sc = self.val(s_t)
        if not isinstance(sc, B2) or sc.kind != "scores" or sc.rows != self.ident:
            raise RuleFailure("not a block of scores")
        lv = self._lse(l_t)
        if self.shape(l_t) != self.shape(s_t)[:-1] + (1,):
            raise MergeMismatch(f"the log-sum-exp at {n.path} is not one value per query row")
        if not self.whole_row(lv, sc):
            raise MergeMismatch(f"the probabilities at {n.path} are not recomputed from the merged log-sum-exp of "
                                f"these scores over every key block")
        nd = len(self.shape(t))
        return B2(self.X.mk("softmax", {"dim": nd - 1}, [sc.e]), sc.rows, sc.cols, sc.pl, "prob", sc.e)

    def whole_row(self, lv: Att, sc: B2) -> bool:
        """The premise of RingMerge.probability_from_lse: the lse is ln of the sum over every key of these scores."""
        return lv.eS == sc.e and lv.sets == self.all

    def _ds(self, n: Node, t: str):
        """dS = P * (dP - D), dP = dO Vᵀ (V the forward's values), D = sum(dO * O, -1, keepdim)."""
        for p_t, d_t in (n.inputs, n.inputs[::-1]):
            pn = self.node(p_t)
            if pn is None or pn.op != "exp":
                continue
            pv = self.val(p_t)
            if isinstance(pv, B2) and pv.kind == "prob":
                break
        else:
            raise RuleFailure("not P * (dP - D)")
        dn = self.node(d_t)
        if dn is None or dn.op != "sub":
            raise RuleFailure("not P * (dP - D)")
        dp, D = self.val(dn.inputs[0]), self.facts.get(dn.inputs[1])
        if not isinstance(dp, B2) or dp.kind != "scores" or (dp.rows, dp.cols) != (pv.rows, pv.cols) or D is None:
            raise MergeMismatch(f"dS at {n.path} is not P * (dO Vᵀ - D) on the same block")
        X = self.X
        nd = len(self.shape(t))
        fw = self.forward(pv.a)
        want_b = X.mk("permute", {"dims": tuple(range(nd - 2)) + (nd - 1, nd - 2)}, [fw.eV])
        if dp.b != want_b:
            raise MergeMismatch(f"dP at {n.path} is not dO times the forward's values transposed")
        e_out = X.mk("matmul", {}, [pv.e, fw.eV])
        want_d = {X.mk("sum", {"dims": (nd - 1,), "keepdim": True}, [X.mk("mul", {}, pair)])
                  for pair in ([dp.a, e_out], [e_out, dp.a])}
        if D.expr not in want_d or D.pl != pv.pl:
            raise MergeMismatch(f"D at {dn.path} is not sum(dO * O, dims=[-1], keepdim=True) with O the forward output")
        e = X.mk("softmax_backward", {"dim": nd - 1}, [dp.e, pv.e])
        return B2(e, pv.rows, pv.cols, pv.pl, "ds")

    def forward(self, eS: int) -> Att:
        if self.fw is None:  # scanned once, only when a backward reaches dS
            self.fw = _forwards(self.g, self.index, self.facts, self.kc)
        got = self.fw.get(eS)
        if got is None:
            raise MergeMismatch("the forward attention of these scores is not proved")
        return got


def _ring_axis(kc: KCtx) -> list[str]:
    return [a for a in kc.axes if kc.sizes.get(a, 1) > 1]


def _conclude(w: _Walk, expr: int, pl: tuple, d: int, rule: str, local) -> Derivation:
    out_pl = tuple(S(d) if j == w.ai else q for j, q in enumerate(pl))
    rules = [rule if j == w.ai else ("replicate_any" if q == R else "rowwise_shard") for j, q in enumerate(out_pl)]
    if local_shape(w.X[expr].shape, w.kc.axes, out_pl, w.kc.sizes) != tuple(local):
        raise MergeMismatch("the concluded placement does not give the op's local shape")
    return Derivation([Fact(expr, out_pl)], rules)


def _walks(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx):
    """(walk, value of node ``index``'s output) over each candidate ring axis; the value is the RuleFailure that
    stopped that axis's walk (a MergeMismatch, a near miss naming its reason, is raised at once)."""
    for A in _ring_axis(kc):
        w = _Walk(g, index + 1, facts, kc, A)
        try:
            yield w, w.val(g.nodes[index].outputs[0])
        except MergeMismatch:
            raise
        except RuleFailure as exc:
            yield w, exc


def match_merge(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    """The merged output of every key block: softmax(S) V over all keys (Coq: ring_sigmoid_merge)."""
    n = g.nodes[index]
    if n.op != "sub" or len(n.inputs) != 2:
        raise RuleFailure("not a merge")
    r = ProducersBefore(g, index).get(n.inputs[1])
    if r is None or r[1].op != "mul":
        raise RuleFailure("not an output merge")
    last = None
    for w, v in _walks(g, index, facts, kc):
        if isinstance(v, RuleFailure):
            last = v
            continue
        if not isinstance(v, Att) or v.which != "out":
            continue
        if v.sets != w.all:
            raise MergeMismatch(f"the merged output on some rank misses key blocks: rank c attends blocks "
                                f"{[sorted(s) for s in v.sets]} of {w.p}")
        nd = len(w.X[v.eS].shape)
        e = w.X.mk("matmul", {}, [w.X.mk("softmax", {"dim": nd - 1}, [v.eS]), v.eV])
        d = _conclude(w, e, v.pl, nd - 2, RULE, out_shape(n))
        return d, sorted(w.visited - {index})
    raise RuleFailure(str(last) if last else "not a merge")


def _forwards(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx) -> dict[int, Att]:
    """The proved forward merges before ``index``: scores expression -> the merged pair."""
    out = {}
    for j in range(index):
        m = g.nodes[j]
        if m.op != "sub" or not m.outputs or m.outputs[0] not in facts:
            continue
        f = facts[m.outputs[0]]
        X = kc.exprs
        e = X[f.expr]
        if e.op != "matmul":
            continue
        sm = X[e.args[0]]
        if sm.op == "softmax":
            out[sm.args[0]] = Att("out", sm.args[0], e.args[1], (), f.pl)
    return out


def match_merge_backward(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx) -> tuple[Derivation, list[int]]:
    """dQ, dK or dV complete on its owner: every key (query) block's term once (Coq: ring_sigmoid_merge_backward)."""
    n = g.nodes[index]
    if n.op not in ("add", "reshape", "view", "scale"):
        raise RuleFailure("not a ring gradient")
    last = None
    for w, v in _walks(g, index, facts, kc):
        if isinstance(v, RuleFailure):
            last = v
            continue
        if not isinstance(v, Part):
            raise RuleFailure("not a ring gradient")
        if v.rows != w.ident:
            raise RuleFailure(f"the gradient at {n.path} is not back at its owner: rank c holds block "
                                f"{list(v.rows)}")
        if v.sets != w.all:
            raise RuleFailure(f"the gradient at {n.path} misses blocks' terms: {[sorted(s) for s in v.sets]}")
        d = _conclude(w, v.e, v.pl, v.d, RULE_BWD, out_shape(n))
        return d, sorted(w.visited - {index})
    raise RuleFailure(str(last) if last else "not a ring gradient")
