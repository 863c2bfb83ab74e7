"""Seeded random program generator: logical graphs paired with parallel SPMD programs.

A pair is built *in tandem*: every generated tensor is a :class:`PT` (paired tensor) that
knows its logical name, its rank-local name in the parallel program, its logical shape (each
dim a product of named factor dims) and its placement on every mesh axis.  A *transform*
picks paired tensors whose placements it accepts and emits the logical op together with the
parallel op(s) that a correct parallelization would run (column/row-parallel matmul, partial
sums and their all_reduce / reduce_scatter, all_gather, all_to_all, rank-block slicing, DP
means with Partial(avg), ...).  The result is an *equal* pair by construction; the oracle
still decides equality (a generator mistake shows up as an unexpected unequal pair, never
as a soundness verdict).  :mod:`tvcert.fuzz.mutate` then perturbs pairs.

Two further families are built directly, because the issue requires them in the mutation
set: TrainVerify's C.12 counterexample family (agreement at one index, difference elsewhere)
and Scalify's reshape/transpose falsifier.

Every generated dim is a named factor whose value is a multiple of the product of the mesh
sizes, so any dim may be sharded on any axis; a second instantiation (``alt_dims``) uses
other multiples, which the oracle runs too.
"""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Callable, Optional

Pl = tuple  # ("R",) | ("S", d) | ("P", "sum"|"avg"|"max")
R_: Pl = ("R",)

UNARY_NONLIN = ["tanh", "exp", "sigmoid", "silu", "relu", "square", "abs", "gelu", "sin", "add_scalar", "reciprocal"]
UNARY_LIN = ["neg", "scale"]


def pl_text(p: Pl) -> str:
    if p[0] == "R":
        return "Replicate"
    if p[0] == "S":
        return f"Shard({p[1]})"
    return f"Partial({p[1]})"


@dataclass
class PT:
    lname: str
    pname: str
    shape: list  # list of tuples of factor names
    pl: dict  # axis -> Pl
    pmax_pending: bool = False


@dataclass
class Pair:
    """One generated (logical, parallel) pair, as a plan dict plus metadata."""

    plan: dict
    family: str  # "compose" | "c12" | "reshape_transpose" | "ring"
    tags: list  # transforms used
    perturbed: bool = False
    mutation: str | None = None
    alt_dims: Optional[dict] = None
    seed: int = 0

    def to_json(self) -> dict:
        return {"plan": self.plan, "family": self.family, "tags": self.tags, "perturbed": self.perturbed,
                "mutation": self.mutation, "alt_dims": self.alt_dims, "seed": self.seed}


class Builder:
    def __init__(self, rng: random.Random, axes: list[tuple[str, int]]):
        self.rng = rng
        self.axes = [a for a, _ in axes]
        self.sizes = dict(axes)
        self.M = 1
        for _, s in axes:
            self.M *= s
        self.syms: dict[str, int] = {}
        self.alt: dict[str, int] = {}
        self.lin: list[dict] = []
        self.pin: list[dict] = []
        self.lnodes: list[dict] = []
        self.pnodes: list[dict] = []
        self.bind_in: dict[str, dict] = {}
        self.pts: list[PT] = []
        self.tags: list[str] = []
        self.k = 0

    # ---------------------------------------------------------- names, dims
    def fresh(self, base: str) -> str:
        self.k += 1
        return f"{base}{self.k}"

    def sym(self) -> str:
        name = f"d{len(self.syms)}"
        cs = [1, 2, 3] if self.M <= 3 else [1, 2]
        c = self.rng.choice(cs)
        self.syms[name] = self.M * c
        alt = {1: 2, 2: 1, 3: 1}[c] if self.M > 2 else {1: 3, 2: 1, 3: 2}[c]
        self.alt[name] = self.M * alt
        return name

    @staticmethod
    def dexpr(dim: tuple) -> str:
        return "*".join(dim)

    def local_dim(self, pt_shape: list, pl: dict, i: int) -> str:
        axes = [a for a in self.axes if pl[a] == ("S", i)]
        e = self.dexpr(pt_shape[i])
        if not axes:
            return e
        return f"({e})/({'*'.join(axes)})"

    def local_shape(self, shape: list, pl: dict) -> list[str]:
        return [self.local_dim(shape, pl, i) for i in range(len(shape))]

    def numel(self, shape: list) -> int:
        n = 1
        for d in shape:
            for f in d:
                n *= max(self.syms[f], self.alt[f])
        return n

    # ---------------------------------------------------------- emission
    def new_input(self, shape: list, pl: dict, dtype: str = "float", rng_dim: str | None = None, base="x") -> PT:
        ln = self.fresh(base)
        pn = ln
        spec = {"name": ln, "shape": [self.dexpr(d) for d in shape], "dtype": dtype}
        pspec = {"name": pn, "shape": self.local_shape(shape, pl), "dtype": dtype}
        if rng_dim:
            spec["range"] = rng_dim
            pspec["range"] = rng_dim
        self.lin.append(spec)
        self.pin.append(pspec)
        self.bind_in[ln] = {"local": pn, "placement": {a: pl_text(p) for a, p in pl.items()}}
        pt = PT(ln, pn, list(shape), dict(pl))
        return pt

    def lnode(self, op, inputs, **attrs) -> str:
        name = self.fresh("l")
        d = {"name": name, "op": op, "inputs": list(inputs)}
        if attrs:
            d["attrs"] = attrs
        self.lnodes.append(d)
        return name

    def pnode(self, op, inputs, **attrs) -> str:
        name = self.fresh("p")
        d = {"name": name, "op": op, "inputs": list(inputs)}
        if attrs:
            d["attrs"] = attrs
        self.pnodes.append(d)
        return name

    def both(self, op, lin, pin, shape, pl, lattrs=None, pattrs=None, tag=None) -> PT:
        lattrs = lattrs or {}
        pattrs = lattrs if pattrs is None else pattrs
        ln = self.lnode(op, lin, **lattrs)
        pn = self.pnode(op, pin, **pattrs)
        pt = PT(ln, pn, list(shape), dict(pl))
        self.pts.append(pt)
        if tag:
            self.tags.append(tag)
        return pt

    # ---------------------------------------------------------- placement helpers
    def has_p(self, pt: PT) -> bool:
        return any(p[0] == "P" for p in pt.pl.values())

    def has_pmax(self, pt: PT) -> bool:
        return any(p == ("P", "max") for p in pt.pl.values())

    def sharded(self, pt: PT, i: int) -> list[str]:
        return [a for a in self.axes if pt.pl[a] == ("S", i)]

    def random_pl(self, shape: list, allow_p: bool = True) -> dict:
        pl = {}
        for a in self.axes:
            r = self.rng.random()
            if shape and r < 0.55:
                pl[a] = ("S", self.rng.randrange(len(shape)))
            elif allow_p and r < 0.65:
                pl[a] = ("P", self.rng.choice(["sum", "sum", "avg"]))
            else:
                pl[a] = R_
        return pl

    def random_shape(self, lo=1, hi=3) -> list:
        return [(self.sym(),) for _ in range(self.rng.randint(lo, hi))]

    def pick(self, pred: Callable[[PT], bool]) -> PT | None:
        c = [p for p in self.pts if pred(p)]
        if not c:
            return None
        # prefer recent tensors: programs are chains with occasional side branches
        w = [1 + 3 * (i == len(c) - 1) for i in range(len(c))]
        return self.rng.choices(c, weights=w)[0]

    def alias(self, pt: PT, pname: str, pl: dict, tag: str) -> PT:
        """A parallel-only op: same logical tensor, new local tensor / placement."""
        q = PT(pt.lname, pname, list(pt.shape), dict(pl))
        self.pts.append(q)
        self.tags.append(tag)
        return q

    # ---------------------------------------------------------- transforms
    def t_unary(self) -> bool:
        pt = self.pick(lambda p: not self.has_pmax(p))
        if pt is None:
            return False
        if self.has_p(pt):
            op = self.rng.choice(UNARY_LIN)
        else:
            op = self.rng.choice(UNARY_NONLIN + UNARY_LIN)
        attrs = {}
        if op == "scale":
            attrs = {"value": self.rng.choice([2, -3, 0.5, -1.5])}
        elif op == "add_scalar":
            attrs = {"value": self.rng.choice([1, -2, 0.5])}
        if op == "reciprocal":
            # keep away from zero: reciprocal of (x*x + 1)
            sq = self.both("square", [pt.lname], [pt.pname], pt.shape, pt.pl)
            pt = self.both("add_scalar", [sq.lname], [sq.pname], pt.shape, pt.pl, {"value": 1})
        self.both(op, [pt.lname], [pt.pname], pt.shape, pt.pl, attrs, tag="elementwise_nonlinear" if op in UNARY_NONLIN else "elementwise_linear")
        return True

    def t_binary(self) -> bool:
        pt = self.pick(lambda p: not self.has_pmax(p))
        if pt is None:
            return False
        # partner: an existing tensor with the same shape and placement, else a fresh input
        mates = [q for q in self.pts if q is not pt and q.shape == pt.shape and q.pl == pt.pl and q.lname != pt.lname]
        if self.has_p(pt):
            op = self.rng.choice(["add", "sub"])
        else:
            op = self.rng.choice(["add", "sub", "mul", "maximum", "minimum", "div"])
        if mates and op != "div" and self.rng.random() < 0.5:
            q = self.rng.choice(mates)
        else:
            q = self.new_input(pt.shape, pt.pl)
        a, b = (pt, q) if self.rng.random() < 0.5 or op == "div" else (q, pt)
        if op == "div":
            a, b = pt, q
        self.both(op, [a.lname, b.lname], [a.pname, b.pname], pt.shape, pt.pl, tag="elementwise_binary")
        return True

    def t_bias(self) -> bool:
        pt = self.pick(lambda p: len(p.shape) >= 1 and not self.has_p(p))
        if pt is None:
            return False
        last = len(pt.shape) - 1
        bpl = {a: (("S", 0) if pt.pl[a] == ("S", last) else R_) for a in self.axes}
        b = self.new_input([pt.shape[-1]], bpl, base="b")
        op = self.rng.choice(["add", "mul"])
        self.both(op, [pt.lname, b.lname], [pt.pname, b.pname], pt.shape, pt.pl, tag="bias_broadcast")
        return True

    def t_matmul(self, einsum: bool = False) -> bool:
        pt = self.pick(lambda p: len(p.shape) in (2, 3) and not self.has_pmax(p)
                       and self.numel(p.shape) <= 600)
        if pt is None:
            return False
        r = len(pt.shape)
        n = (self.sym(),)
        wpl, opl, kinds = {}, {}, []
        for a in self.axes:
            p = pt.pl[a]
            if p == R_:
                if self.rng.random() < 0.5 and not any(wpl.get(b) == ("S", 1) for b in wpl):
                    wpl[a], opl[a] = ("S", 1), ("S", r - 1)
                    kinds.append("col_parallel")
                else:
                    wpl[a], opl[a] = R_, R_
            elif p == ("S", r - 1):
                wpl[a], opl[a] = ("S", 0), ("P", "sum")
                kinds.append("row_parallel")
            elif p[0] == "S":
                wpl[a], opl[a] = R_, p
                kinds.append("batch_shard")
            else:
                wpl[a], opl[a] = R_, p
                kinds.append("partial_matmul")
        w = self.new_input([pt.shape[-1], n], wpl, base="w")
        shape = pt.shape[:-1] + [n]
        if einsum:
            letters = "bij"[3 - r:]
            eq = f"{letters},{letters[-1]}k->{letters[:-1]}k"
            self.both("einsum", [pt.lname, w.lname], [pt.pname, w.pname], shape, opl, {"equation": eq},
                      tag="einsum_" + ("+".join(sorted(set(kinds))) or "replicated"))
        else:
            self.both("matmul", [pt.lname, w.lname], [pt.pname, w.pname], shape, opl,
                      tag="matmul_" + ("+".join(sorted(set(kinds))) or "replicated"))
        return True

    def t_reduce(self) -> bool:
        pt = self.pick(lambda p: len(p.shape) >= 1 and not self.has_pmax(p))
        if pt is None:
            return False
        ops = ["sum", "mean"] if self.has_p(pt) else ["sum", "mean", "amax"]
        op = self.rng.choice(ops)
        d = self.rng.randrange(len(pt.shape))
        keep = self.rng.random() < 0.3
        if keep:
            return False  # keepdim output dim of size 1 is not a factor dim; keep shapes factor-only
        pl = {}
        for a in self.axes:
            p = pt.pl[a]
            if p == ("S", d):
                pl[a] = ("P", {"sum": "sum", "mean": "avg", "amax": "max"}[op])
            elif p[0] == "S":
                pl[a] = ("S", p[1] - (1 if p[1] > d else 0))
            else:
                pl[a] = p
        if op == "amax" and sum(1 for p in pl.values() if p[0] == "P") > 1:
            return False
        shape = pt.shape[:d] + pt.shape[d + 1:]
        self.both(op, [pt.lname], [pt.pname], shape, pl, {"dims": [d]},
                      tag="reduce_sharded_dim" if any(pt.pl[a] == ("S", d) for a in self.axes) else "reduce")
        return True

    def t_resolve(self) -> bool:
        pt = self.pick(lambda p: self.has_p(p))
        if pt is None:
            return False
        paxes = [a for a in self.axes if pt.pl[a][0] == "P"]
        a = self.rng.choice(paxes)
        red = pt.pl[a][1]
        pl = dict(pt.pl)
        # reduce_scatter for Partial(sum): sequence-parallel style
        free = [i for i in range(len(pt.shape)) if not self.sharded(pt, i)]
        if red == "sum" and free and self.rng.random() < 0.35 and len(paxes) == 1:
            d = self.rng.choice(free)
            pl[a] = ("S", d)
            pn = self.pnode("reduce_scatter", [pt.pname], axis=a, dim=d, reduce="sum")
            self.alias(pt, pn, pl, "reduce_scatter")
            return True
        same = [b for b in paxes if pt.pl[b] == pt.pl[a]]
        if len(same) > 1 and self.rng.random() < 0.5:
            for b in same:
                pl[b] = R_
            pn = self.pnode("all_reduce", [pt.pname], axis=same, reduce=red)
        else:
            pl[a] = R_
            pn = self.pnode("all_reduce", [pt.pname], axis=a, reduce=red)
        self.alias(pt, pn, pl, f"all_reduce_{red}")
        return True

    def t_avg_to_sum(self) -> bool:
        pt = self.pick(lambda p: sum(1 for q in p.pl.values() if q[0] == "P") == 1
                       and any(q == ("P", "avg") for q in p.pl.values()))
        if pt is None:
            return False
        a = next(a for a in self.axes if pt.pl[a] == ("P", "avg"))
        p = self.sizes[a]
        if p == 2 and self.rng.random() < 0.5:
            pn = self.pnode("scale", [pt.pname], value=0.5)
        else:
            c = self.pnode("const", [], value=p)
            pn = self.pnode("div", [pt.pname, c])
        pl = dict(pt.pl)
        pl[a] = ("P", "sum")
        self.alias(pt, pn, pl, "dp_avg_to_sum")
        return True

    def t_partial_bias(self) -> bool:
        pt = self.pick(lambda p: sum(1 for q in p.pl.values() if q[0] == "P") == 1
                       and any(q == ("P", "sum") for q in p.pl.values()) and len(p.shape) >= 1
                       and not self.sharded(p, len(p.shape) - 1))
        if pt is None:
            return False
        a = next(a for a in self.axes if pt.pl[a] == ("P", "sum"))
        p = self.sizes[a]
        b = self.new_input([pt.shape[-1]], {x: R_ for x in self.axes}, base="b")
        if p == 2:
            bs = self.pnode("scale", [b.pname], value=0.5)
        else:
            c = self.pnode("const", [], value=p)
            bs = self.pnode("div", [b.pname, c])
        ln = self.lnode("add", [pt.lname, b.lname])
        pn = self.pnode("add", [pt.pname, bs])
        self.pts.append(PT(ln, pn, list(pt.shape), dict(pt.pl)))
        self.tags.append("partial_plus_scaled_bias")
        return True

    def t_all_gather(self) -> bool:
        cands = []
        for pt in self.pts:
            for i, a in enumerate(self.axes):
                p = pt.pl[a]
                if p[0] == "S" and not any(pt.pl[b] == p for b in self.axes[i + 1:]):
                    cands.append((pt, a))
        if not cands:
            return False
        pt, a = self.rng.choice(cands)
        d = pt.pl[a][1]
        pn = self.pnode("all_gather", [pt.pname], axis=a, dim=d)
        pl = dict(pt.pl)
        pl[a] = R_
        self.alias(pt, pn, pl, "all_gather")
        return True

    def t_all_to_all(self) -> bool:
        cands = []
        for pt in self.pts:
            if len(pt.shape) < 2:
                continue
            for a in self.axes:
                p = pt.pl[a]
                if p[0] != "S":
                    continue
                others = [pt.pl[b] for b in self.axes if b != a]
                if any(q[0] == "P" for q in others) or any(q == p for q in others):
                    continue
                for s in range(len(pt.shape)):
                    if s != p[1] and not any(q == ("S", s) for q in others):
                        cands.append((pt, a, s))
        if not cands:
            return False
        pt, a, s = self.rng.choice(cands)
        pn = self.pnode("all_to_all", [pt.pname], axis=a, split_dim=s, concat_dim=pt.pl[a][1])
        pl = dict(pt.pl)
        pl[a] = ("S", s)
        self.alias(pt, pn, pl, "all_to_all")
        return True

    def t_softmax(self) -> bool:
        pt = self.pick(lambda p: len(p.shape) >= 1 and not self.has_p(p)
                       and any(not self.sharded(p, i) for i in range(len(p.shape))))
        if pt is None:
            return False
        d = self.rng.choice([i for i in range(len(pt.shape)) if not self.sharded(pt, i)])
        op = self.rng.choice(["softmax", "log_softmax"])
        self.both(op, [pt.lname], [pt.pname], pt.shape, pt.pl, {"dim": d}, tag="softmax")
        return True

    def t_permute(self) -> bool:
        pt = self.pick(lambda p: len(p.shape) >= 2)
        if pt is None:
            return False
        r = len(pt.shape)
        perm = list(range(r))
        while perm == list(range(r)):
            self.rng.shuffle(perm)
        shape = [pt.shape[i] for i in perm]
        pl = {a: (("S", perm.index(p[1])) if p[0] == "S" else p) for a, p in pt.pl.items()}
        if self.rng.random() < 0.5 and r >= 2:
            d0, d1 = self.rng.sample(range(r), 2)
            perm = list(range(r))
            perm[d0], perm[d1] = perm[d1], perm[d0]
            shape = [pt.shape[i] for i in perm]
            pl = {a: (("S", perm.index(p[1])) if p[0] == "S" else p) for a, p in pt.pl.items()}
            self.both("transpose", [pt.lname], [pt.pname], shape, pl, {"dim0": d0, "dim1": d1}, tag="permute")
        else:
            self.both("permute", [pt.lname], [pt.pname], shape, pl, {"dims": perm}, tag="permute")
        return True

    def t_reshape(self) -> bool:
        pt = self.pick(lambda p: len(p.shape) >= 1)
        if pt is None:
            return False
        r = len(pt.shape)
        split = [i for i in range(r) if len(pt.shape[i]) >= 2]
        merge = [i for i in range(r - 1) if not self.sharded(pt, i + 1)]
        if split and (not merge or self.rng.random() < 0.5):
            i = self.rng.choice(split)
            shape = pt.shape[:i] + [pt.shape[i][:1], pt.shape[i][1:]] + pt.shape[i + 1:]
            pl = {a: (("S", p[1] + (1 if p[1] > i else 0)) if p[0] == "S" else p) for a, p in pt.pl.items()}
        elif merge:
            i = self.rng.choice(merge)
            shape = pt.shape[:i] + [pt.shape[i] + pt.shape[i + 1]] + pt.shape[i + 2:]
            pl = {a: (("S", p[1] - (1 if p[1] > i else 0)) if p[0] == "S" else p) for a, p in pt.pl.items()}
        else:
            return False
        op = self.rng.choice(["reshape", "reshape", "view"])
        self.both(op, [pt.lname], [pt.pname], shape, pl, {"shape": [self.dexpr(d) for d in shape]},
                  {"shape": self.local_shape(shape, pl)}, tag="reshape")
        return True

    def t_rank_slice(self) -> bool:
        cands = []
        for pt in self.pts:
            if self.has_p(pt):
                continue
            for a in self.axes:
                if pt.pl[a] != R_:
                    continue
                for d in range(len(pt.shape)):
                    if not self.sharded(pt, d):
                        cands.append((pt, a, d))
        if not cands:
            return False
        pt, a, d = self.rng.choice(cands)
        E = self.dexpr(pt.shape[d])
        pn = self.pnode("slice", [pt.pname], dim=d, start=f"rank.{a}*(({E})/{a})", end=f"(rank.{a}+1)*(({E})/{a})")
        pl = dict(pt.pl)
        pl[a] = ("S", d)
        self.alias(pt, pn, pl, "rank_block_slice")
        return True

    def t_mask(self) -> bool:
        kind = self.rng.choice(["tri", "masked_fill", "where"])
        if kind == "tri":
            pt = self.pick(lambda p: len(p.shape) >= 2 and not self.has_pmax(p)
                           and not self.sharded(p, len(p.shape) - 1) and not self.sharded(p, len(p.shape) - 2))
            if pt is None:
                return False
            op = self.rng.choice(["triu", "tril"])
            self.both(op, [pt.lname], [pt.pname], pt.shape, pt.pl, {"diagonal": self.rng.choice([-1, 0, 1])}, tag="mask")
            return True
        pt = self.pick(lambda p: len(p.shape) >= 1 and not self.has_pmax(p))
        if pt is None:
            return False
        mpl = {a: (R_ if p[0] == "P" else p) for a, p in pt.pl.items()}
        m = self.new_input(pt.shape, mpl, dtype="int", rng_dim="2", base="m")
        if kind == "masked_fill":
            v = 0 if self.has_p(pt) else self.rng.choice([0, -5, 2.5])
            self.both("masked_fill", [pt.lname, m.lname], [pt.pname, m.pname], pt.shape, pt.pl, {"value": v}, tag="mask")
            return True
        if self.has_p(pt):
            return False
        y = self.new_input(pt.shape, pt.pl)
        self.both("where", [m.lname, pt.lname, y.lname], [m.pname, pt.pname, y.pname], pt.shape, pt.pl, tag="mask")
        return True

    def t_embedding(self) -> bool:
        V, H, B = self.sym(), self.sym(), self.sym()
        choice = self.rng.choice(["ids_shard", "vocab_col", "replicated"])
        wpl, ipl, opl = {}, {}, {}
        for a in self.axes:
            wpl[a], ipl[a], opl[a] = R_, R_, R_
        a = self.rng.choice(self.axes)
        if choice == "ids_shard":
            ipl[a], opl[a] = ("S", 0), ("S", 0)
        elif choice == "vocab_col":
            wpl[a], opl[a] = ("S", 1), ("S", 1)
        w = self.new_input([(V,), (H,)], wpl, base="emb")
        ids = self.new_input([(B,)], ipl, dtype="int", rng_dim=V, base="ids")
        self.both("embedding", [w.lname, ids.lname], [w.pname, ids.pname], [(B,), (H,)], opl, tag="gather_embedding")
        return True

    def t_index_select(self) -> bool:
        pt = self.pick(lambda p: len(p.shape) >= 1 and all(q == R_ for q in p.pl.values()))
        if pt is None:
            return False
        d = self.rng.randrange(len(pt.shape))
        K = self.sym()
        idx = self.new_input([(K,)], {a: R_ for a in self.axes}, dtype="int", rng_dim=self.dexpr(pt.shape[d]), base="idx")
        shape = pt.shape[:d] + [(K,)] + pt.shape[d + 1:]
        self.both("index_select", [pt.lname, idx.lname], [pt.pname, idx.pname], shape, pt.pl, {"dim": d}, tag="gather_index_select")
        return True

    def t_concat(self) -> bool:
        pt = self.pick(lambda p: len(p.shape) >= 1 and not self.has_pmax(p)
                       and any(not self.sharded(p, i) for i in range(len(p.shape))))
        if pt is None:
            return False
        d = self.rng.choice([i for i in range(len(pt.shape)) if not self.sharded(pt, i)])
        mates = [q for q in self.pts if q is not pt and q.shape == pt.shape and q.pl == pt.pl]
        q = self.rng.choice(mates) if mates and self.rng.random() < 0.5 else self.new_input(pt.shape, pt.pl)
        ops = [pt, q] if self.rng.random() < 0.5 else [q, pt]
        shape = list(pt.shape)
        shape[d] = pt.shape[d] + q.shape[d] if False else shape[d]
        # concat doubles dim d: represent the result dim as a new factor tuple (d, "2")-free: use a split back
        out_dim = pt.shape[d]
        ln = self.lnode("concat", [o.lname for o in ops], dim=d)
        pn = self.pnode("concat", [o.pname for o in ops], dim=d)
        # split it back into the two halves and keep one (split_other_dim / slice_other_dim rules)
        which = self.rng.randrange(2)
        E = self.dexpr(out_dim)
        ln2 = self.lnode("slice", [ln], dim=d, start=f"{which}*({E})", end=f"{which + 1}*({E})")
        pn2 = self.pnode("slice", [pn], dim=d, start=f"{which}*({E})", end=f"{which + 1}*({E})")
        self.pts.append(PT(ln2, pn2, list(pt.shape), dict(pt.pl)))
        self.tags.append("concat_slice")
        return True

    def t_unsqueeze_expand(self) -> bool:
        pt = self.pick(lambda p: 1 <= len(p.shape) <= 2 and not self.has_pmax(p))
        if pt is None:
            return False
        K = self.sym()
        ln = self.lnode("unsqueeze", [pt.lname], dim=0)
        pn = self.pnode("unsqueeze", [pt.pname], dim=0)
        shape = [(K,)] + pt.shape
        pl = {a: (("S", p[1] + 1) if p[0] == "S" else p) for a, p in pt.pl.items()}
        ln2 = self.lnode("expand", [ln], shape=[self.dexpr(d) if i == 0 else -1 for i, d in enumerate(shape)])
        pn2 = self.pnode("expand", [pn], shape=[self.dexpr(d) if i == 0 else -1 for i, d in enumerate(shape)])
        self.pts.append(PT(ln2, pn2, shape, pl))
        self.tags.append("unsqueeze_expand")
        return True

    def t_cross_entropy(self) -> bool:
        pt = self.pick(lambda p: len(p.shape) == 2 and not self.has_p(p) and not self.sharded(p, 1))
        if pt is None:
            return False
        red = self.rng.choice(["none", "sum", "mean"])
        tpl = {a: pt.pl[a] for a in self.axes}
        t = self.new_input([pt.shape[0]], tpl, dtype="int", rng_dim=self.dexpr(pt.shape[1]), base="tgt")
        if red == "none":
            shape, pl = [pt.shape[0]], dict(pt.pl)
        else:
            shape = []
            pl = {a: (("P", "sum" if red == "sum" else "avg") if pt.pl[a] == ("S", 0) else R_) for a in self.axes}
        self.both("cross_entropy", [pt.lname, t.lname], [pt.pname, t.pname], shape, pl, {"reduction": red},
                  tag="cross_entropy")
        return True

    TRANSFORMS = [
        ("unary", 4), ("binary", 3), ("bias", 2), ("matmul", 4), ("einsum", 1), ("reduce", 3), ("resolve", 4),
        ("avg_to_sum", 1), ("partial_bias", 1), ("all_gather", 2), ("all_to_all", 1), ("softmax", 2),
        ("permute", 2), ("reshape", 2), ("rank_slice", 2), ("mask", 2), ("embedding", 1), ("index_select", 1),
        ("concat", 1), ("unsqueeze_expand", 1), ("cross_entropy", 1),
    ]

    def step(self) -> bool:
        names, weights = zip(*self.TRANSFORMS)
        name = self.rng.choices(names, weights=weights)[0]
        if name == "einsum":
            return self.t_matmul(einsum=True)
        return getattr(self, f"t_{name}")()

    # ---------------------------------------------------------- assembling the plan
    def plan(self, outs: list[PT], name: str) -> dict:
        dims = dict(self.syms)
        dims.update(self.sizes)
        louts = []
        pouts = []
        bind_out = {}
        for pt in outs:
            if pt.lname in bind_out:
                continue
            louts.append(pt.lname)
            if pt.pname not in pouts:
                pouts.append(pt.pname)
            bind_out[pt.lname] = {"local": pt.pname, "placement": {a: pl_text(p) for a, p in pt.pl.items()}}
        return {
            "tvcert_plan": 1,
            "name": name,
            "dims": dims,
            "mesh": {a: a for a in self.axes},
            "logical": {"inputs": self.lin, "nodes": self.lnodes, "outputs": louts},
            "parallel": [{"name": "spmd", "inputs": self.pin, "nodes": self.pnodes, "outputs": pouts}],
            "inputs": self.bind_in,
            "outputs": bind_out,
        }


def random_axes(rng: random.Random) -> list[tuple[str, int]]:
    if rng.random() < 0.7:
        return [("tp", rng.choice([2, 2, 3]))]
    axes = [("dp", 2), ("tp", rng.choice([2, 3]))]
    rng.shuffle(axes)
    return axes


def gen_compose(rng: random.Random, name: str) -> Pair:
    axes = random_axes(rng)
    b = Builder(rng, axes)
    first = rng.random()
    if first < 0.15:
        b.t_embedding()
    else:
        shape = b.random_shape(1, 3 if b.M <= 3 else 2)
        pt = b.new_input(shape, b.random_pl(shape, allow_p=rng.random() < 0.3))
        b.pts.append(pt)
    n = rng.randint(2, 7)
    tries = 0
    while n > 0 and tries < 40:
        tries += 1
        if b.step():
            n -= 1
    # sometimes resolve all partials before reading back
    last = b.pts[-1]
    if b.has_pmax(last) or (b.has_p(last) and rng.random() < 0.5):
        while b.has_p(b.pts[-1]):
            pt = b.pts[-1]
            a = next(a for a in b.axes if pt.pl[a][0] == "P")
            pl = dict(pt.pl)
            pl[a] = R_
            pn = b.pnode("all_reduce", [pt.pname], axis=a, reduce=pt.pl[a][1])
            b.alias(pt, pn, pl, f"all_reduce_{pt.pl[a][1]}")
    outs = [b.pts[-1]]
    extra = [p for p in b.pts[:-1] if p.lname != outs[0].lname and not b.has_pmax(p)]
    if extra and rng.random() < 0.4:
        outs.append(rng.choice(extra))
    # outputs must be float tensors with logical producers: PTs always are
    plan = b.plan(outs, name)
    alt = dict(plan["dims"])
    alt.update(b.alt)
    return Pair(plan, "compose", sorted(set(b.tags)), alt_dims=alt)


# ============================================================== TrainVerify C.12 family
def _mat_plan(name, A, B, n, p, rows_sliced: bool, extra_op: str | None, desc: str) -> dict:
    lnodes = [{"name": "A", "op": "const", "inputs": [], "attrs": {"value": A, "shape": ["n", "n"]}},
              {"name": "y", "op": "matmul", "inputs": ["A", "x"]}]
    pnodes = [{"name": "B", "op": "const", "inputs": [], "attrs": {"value": B, "shape": ["n", "n"]}}]
    if rows_sliced:
        pnodes.append({"name": "Bs", "op": "slice", "inputs": ["B"],
                       "attrs": {"dim": 0, "start": "rank.tp*(n/tp)", "end": "(rank.tp+1)*(n/tp)"}})
        pnodes.append({"name": "y", "op": "matmul", "inputs": ["Bs", "x"]})
        opl = "Shard(0)"
    else:
        pnodes.append({"name": "y", "op": "matmul", "inputs": ["B", "x"]})
        opl = "Replicate"
    out = "y"
    if extra_op:
        lnodes.append({"name": "z", "op": extra_op, "inputs": ["y"]})
        pnodes.append({"name": "z", "op": extra_op, "inputs": ["y"]})
        out = "z"
    return {
        "tvcert_plan": 1, "name": name, "description": desc,
        "dims": {"n": n, "tp": p}, "mesh": {"tp": "tp"},
        "logical": {"inputs": [{"name": "x", "shape": ["n"]}], "nodes": lnodes, "outputs": [out]},
        "parallel": [{"name": "rows", "inputs": [{"name": "x", "shape": ["n"]}], "nodes": pnodes, "outputs": [out]}],
        "inputs": {"x": {"local": "x", "placement": {"tp": "Replicate"}}},
        "outputs": {out: {"local": out, "placement": {"tp": opl}}},
    }


def gen_c12(rng: random.Random, name: str, bug: bool) -> Pair:
    p = rng.choice([2, 3])
    n = p * rng.choice([1, 2])
    kind = rng.choice(["x0x0_vs_x0x1", "matrix_row", "matrix_one_entry", "index_select"])
    sliced = rng.random() < 0.6
    extra = rng.choice([None, None, "tanh", "exp", "square"])
    if kind == "index_select":
        idx_l = [0] * n
        idx_p = list(range(n)) if bug else [0] * n
        if bug and n == 1:
            idx_p = [0]
        plan = {
            "tvcert_plan": 1, "name": name,
            "description": "C.12 family: f(x)=[x0,x0,..] vs g(x)=[x0,x1,..] via index_select (agree at index 0)",
            "dims": {"n": n, "tp": p}, "mesh": {"tp": "tp"},
            "logical": {"inputs": [{"name": "x", "shape": ["n"]}],
                        "nodes": [{"name": "i", "op": "const", "inputs": [], "attrs": {"value": idx_l, "shape": ["n"], "dtype": "int"}},
                                  {"name": "y", "op": "index_select", "inputs": ["x", "i"], "attrs": {"dim": 0}}],
                        "outputs": ["y"]},
            "parallel": [{"name": "spmd", "inputs": [{"name": "x", "shape": ["n"]}],
                          "nodes": [{"name": "i", "op": "const", "inputs": [], "attrs": {"value": idx_p, "shape": ["n"], "dtype": "int"}},
                                    {"name": "y", "op": "index_select", "inputs": ["x", "i"], "attrs": {"dim": 0}}],
                          "outputs": ["y"]}],
            "inputs": {"x": {"local": "x", "placement": {"tp": "Replicate"}}},
            "outputs": {"y": {"local": "y", "placement": {"tp": "Replicate"}}},
        }
        return Pair(plan, "c12", ["c12_" + kind], perturbed=bug, mutation="c12" if bug else None)
    if kind == "x0x0_vs_x0x1":
        A = [[1 if j == 0 else 0 for j in range(n)] for i in range(n)]
        B = [[1 if j == i else 0 for j in range(n)] for i in range(n)] if bug else copy.deepcopy(A)
    else:
        A = [[rng.randint(-2, 2) for _ in range(n)] for _ in range(n)]
        B = copy.deepcopy(A)
        if bug:
            L = n // p
            i = rng.randrange(L, n) if sliced or n > 1 else 0  # a row outside rank 0's block
            if kind == "matrix_row":
                B[i] = [B[i][j] + rng.choice([-1, 1]) * (j + 1) for j in range(n)]
            else:
                j = rng.randrange(n)
                B[i][j] += rng.choice([-2, -1, 1, 2])
    desc = ("C.12 family: logical A x vs parallel B x, A and B agree on rank 0's rows" +
            (" and differ elsewhere" if bug else " (and everywhere: equal)"))
    plan = _mat_plan(name, A, B, n, p, sliced, extra, desc)
    return Pair(plan, "c12", ["c12_" + kind], perturbed=bug, mutation="c12" if bug else None)


# ============================================================== Scalify reshape/transpose falsifier
def gen_reshape_transpose(rng: random.Random, name: str, bug: bool) -> Pair:
    p = rng.choice([2, 3])
    b = rng.choice([1, 2])
    s = rng.choice([2, 3])
    nh = p * rng.choice([1, 2])
    hd = rng.choice([2, 3])
    variant = rng.choice(["transpose_first", "factor_order"])
    sharded_in = rng.random() < 0.5
    extra = rng.choice([None, "tanh", "exp"])
    L = [{"name": "xr", "op": "reshape", "inputs": ["x"], "attrs": {"shape": ["b", "s", "nh", "hd"]}},
         {"name": "xh", "op": "transpose", "inputs": ["xr"], "attrs": {"dim0": 1, "dim1": 2}}]
    nhl = "nh/tp" if sharded_in else "nh"
    if not bug:
        P_ = [{"name": "xr", "op": "reshape", "inputs": ["x"], "attrs": {"shape": ["b", "s", nhl, "hd"]}},
              {"name": "xh", "op": "transpose", "inputs": ["xr"], "attrs": {"dim0": 1, "dim1": 2}}]
    elif variant == "transpose_first":
        P_ = [{"name": "xt", "op": "transpose", "inputs": ["x"], "attrs": {"dim0": 1, "dim1": 2}},
              {"name": "xh", "op": "reshape", "inputs": ["xt"], "attrs": {"shape": ["b", nhl, "s", "hd"]}}]
    else:
        P_ = [{"name": "xr", "op": "reshape", "inputs": ["x"], "attrs": {"shape": ["b", "s", "hd", nhl]}},
              {"name": "xh", "op": "permute", "inputs": ["xr"], "attrs": {"dims": [0, 3, 1, 2]}}]
    last = "xh"
    if not sharded_in:
        P_.append({"name": "mine", "op": "slice", "inputs": ["xh"],
                   "attrs": {"dim": 1, "start": "rank.tp*(nh/tp)", "end": "(rank.tp+1)*(nh/tp)"}})
        last = "mine"
    out = "xh"
    if extra:
        L.append({"name": "z", "op": extra, "inputs": ["xh"]})
        P_.append({"name": "z", "op": extra, "inputs": [last]})
        out, last = "z", "z"
    plan = {
        "tvcert_plan": 1, "name": name,
        "description": "Scalify reshape/transpose falsifier: split heads " + ("with the order swapped (BUG)" if bug else "correctly"),
        "dims": {"b": b, "s": s, "nh": nh, "hd": hd, "tp": p}, "mesh": {"tp": "tp"},
        "logical": {"inputs": [{"name": "x", "shape": ["b", "s", "nh*hd"]}], "nodes": L, "outputs": [out]},
        "parallel": [{"name": "tp", "inputs": [{"name": "x", "shape": ["b", "s", "(nh*hd)/tp" if sharded_in else "nh*hd"]}],
                      "nodes": P_, "outputs": [last]}],
        "inputs": {"x": {"local": "x", "placement": {"tp": "Shard(2)" if sharded_in else "Replicate"}}},
        "outputs": {out: {"local": last, "placement": {"tp": "Shard(1)"}}},
    }
    alt = {"b": 2 if b == 1 else 1, "s": 5 - s, "nh": nh, "hd": 5 - hd, "tp": p}
    return Pair(plan, "reshape_transpose", ["reshape_transpose_" + variant if bug else "reshape_transpose_ok"],
                perturbed=bug, mutation="reshape_transpose" if bug else None, alt_dims=alt)


def as_zigzag(pair: Pair, rng: random.Random) -> None:
    """Read every Shard(d) of one mesh axis as ZigzagShard(d), inputs and outputs alike.  The program is
    unchanged, so the result is right only where every op it runs is indifferent to the order of the rows
    (the zig-zag rules' premise); the oracle decides, and the verifier must never certify a wrong one."""
    binds = list(pair.plan["inputs"].values()) + list(pair.plan["outputs"].values())
    axes = sorted({a for b in binds for a, t in b.get("placement", {}).items() if t.startswith("Shard(")})
    if not axes:
        return
    a = rng.choice(axes)
    for b in binds:
        t = b.get("placement", {}).get(a, "")
        if t.startswith("Shard("):
            b["placement"][a] = "Zigzag" + t
    pair.tags.append("zigzag_reading")
    pair.perturbed = True
    pair.mutation = "+".join(x for x in (pair.mutation, "zigzag_reading") if x)


# ============================================================== stages whose internal results alias a boundary
STAGE_OPS = ["exp", "neg", "tanh", "square", "sin", "abs", "sigmoid"]


def gen_stage_alias(rng: random.Random, name: str, perturb_rate: float = 0.5) -> Pair:
    """Two or three labelled stages of one canonical form.  In the first (the template), the internal result
    ``s1_c.. = f^d(x)`` is hash-equal to the boundary input ``b1 = f^d(x)``; in the copies the same ops compute
    ``f^d(w)`` while the boundary is ``g(w)``.  A replay that substitutes by hash would conclude ``g(w)`` for the
    copy's result.  Unperturbed pairs are equal; the stage mutations (fuzz/mutate.py STAGE_MUTATIONS) declare
    the boundary's value for the copy's result, or move the alias into the copy."""
    from .mutate import STAGE_MUTATIONS

    p = rng.choice([2, 3])
    cb, ch = rng.choice([1, 2]), rng.choice([1, 2])
    dims = {"b": p * cb, "h": p * ch, "tp": p}
    alt = {"b": p * (3 - cb), "h": p * (3 - ch), "tp": p}
    plc = rng.choice(["Replicate", "Shard(0)", "Shard(1)"])
    local = ["b", "h"]
    if plc != "Replicate":
        d = int(plc[6])
        local[d] = f"{local[d]}/tp"
    f = rng.choice(STAGE_OPS)
    g = rng.choice([o for o in STAGE_OPS if o != f])
    depth = rng.choice([1, 1, 2])
    copies = rng.choice([2, 2, 3])
    srcs = ["x", "w", "v"][:copies]
    pnodes: list[dict] = []
    lnodes: list[dict] = []

    def chain(nodes, src, base, op, n):
        cur = src
        for j in range(n):
            nm = base if j == n - 1 else f"{base}_{j}"
            nodes.append({"op": op, "inputs": [cur], "name": nm})
            cur = nm
        return cur

    # boundaries: b1 = f^d(x) (the alias in the template), b_k = g(src_k) in the copies
    chain(pnodes, "x", "b1", f, depth)
    for k in range(2, copies + 1):
        pnodes.append({"op": g, "inputs": [srcs[k - 1]], "name": f"b{k}"})
    swap = rng.random() < 0.5
    results = {}
    for k in range(1, copies + 1):
        lab = f"L{k}"
        cur = srcs[k - 1]
        names = [f"s{k}_c"] + [f"s{k}_c{j}" for j in range(2, depth + 1)]
        for nm in names:
            pnodes.append({"op": f, "inputs": [cur], "name": nm, "layer": lab})
            cur = nm
        results[k] = cur
        ins = [cur, f"b{k}"]
        pnodes.append({"op": "add", "inputs": ins[::-1] if swap else ins, "name": f"s{k}_z", "layer": lab})
    # logical: ex = f^d(x); o = f^d(w) (the copy's result); z = o + g(w) in the copy's operand order
    chain(lnodes, "x", "ex", f, depth)
    chain(lnodes, "w", "o", f, depth)
    outs = {"ex": "b1", "o": results[2]}
    if rng.random() < 0.5:
        lnodes.append({"op": g, "inputs": ["w"], "name": "gw"})
        ins = ["o", "gw"]
        lnodes.append({"op": "add", "inputs": ins[::-1] if swap else ins, "name": "z"})
        outs["z"] = "s2_z"
    plan = {"tvcert_plan": 1, "name": name, "dims": dims, "mesh": [["tp", "tp"]],
            "description": f"stage alias: f={f} g={g} depth={depth} copies={copies} placement={plc}",
            "logical": {"inputs": [{"name": x, "shape": ["b", "h"]} for x in srcs], "nodes": lnodes,
                        "outputs": list(outs)},
            "parallel": [{"name": "spmd", "inputs": [{"name": x, "shape": local} for x in srcs], "nodes": pnodes,
                          "outputs": list(dict.fromkeys(outs.values()))}],
            "inputs": {x: {"local": x, "placement": {"tp": plc}} for x in srcs},
            "outputs": {o: {"local": t, "placement": {"tp": plc}} for o, t in outs.items()}}
    pair = Pair(plan, "stage_alias", ["stage_alias", f"depth{depth}", f"copies{copies}"], alt_dims=alt)
    if rng.random() < perturb_rate:
        k = rng.choice(sorted(STAGE_MUTATIONS))
        out = STAGE_MUTATIONS[k](copy.deepcopy(plan), rng)
        if out is not None:
            pair.plan, pair.mutation, pair.perturbed = out, k, True
    return pair


# ============================================================== sends sharing a tag
def gen_p2p(rng: random.Random, name: str, perturb_rate: float = 0.5) -> Pair:
    """Two pipeline stages exchanging 2 or 3 messages (received in a random order), sometimes with a message back
    (a recv before the sender's later ops) and an unpinned tp axis.  Unperturbed pairs are equal; the p2p
    mutations (fuzz/mutate.py P2P_MUTATIONS) make sends share a tag or duplicate a message (the loader must
    refuse: exit 3), or swap two recvs' tags (the plan loads, each recv gets the other tensor)."""
    from .mutate import P2P_MUTATIONS

    k = rng.choice([2, 3])
    mesh = [["pp", "pp"]] + ([["tp", "tp"]] if rng.random() < 0.3 else [])
    if len(mesh) == 2 and rng.random() < 0.5:
        mesh.reverse()
    n = rng.choice([2, 4])
    dims = {"n": n, "pp": 2, **({"tp": 2} if len(mesh) == 2 else {})}
    alt = dict(dims, n=n + 2)
    ops = [rng.choice(STAGE_OPS) for _ in range(k)]
    xs = [f"x{i}" for i in range(k)]
    s0 = [{"op": "send", "inputs": [x], "attrs": {"axis": "pp", "to": 1, "tag": f"m{i}"}} for i, x in enumerate(xs)]
    order = list(range(k))
    rng.shuffle(order)
    s1 = [{"op": "recv", "inputs": [], "name": f"r{i}", "attrs": {"axis": "pp", "src": 0, "tag": f"m{i}", "shape": ["n"]}}
          for i in order]
    s1 += [{"op": ops[i], "inputs": [f"r{i}"], "name": f"y{i}"} for i in range(k)]
    lnodes = [{"op": ops[i], "inputs": [xs[i]], "name": f"y{i}"} for i in range(k)]
    outs = {f"y{i}": {"program": "s1", "local": f"y{i}"} for i in range(k)}
    s0_out: list[str] = []
    if rng.random() < 0.4:  # a message back: stage 0 waits for stage 1
        s1.append({"op": "send", "inputs": ["y0"], "attrs": {"axis": "pp", "to": 0, "tag": "back"}})
        s0.append({"op": "recv", "inputs": [], "name": "rb", "attrs": {"axis": "pp", "src": 1, "tag": "back", "shape": ["n"]}})
        s0.append({"op": "neg", "inputs": ["rb"], "name": "q"})
        lnodes.append({"op": "neg", "inputs": ["y0"], "name": "q"})
        outs["q"] = {"program": "s0", "local": "q"}
        s0_out = ["q"]
    plan = {"tvcert_plan": 1, "name": name, "dims": dims, "mesh": mesh,
            "description": f"p2p: {k} messages, recv order {order}",
            "logical": {"inputs": [{"name": x, "shape": ["n"]} for x in xs], "nodes": lnodes, "outputs": list(outs)},
            "parallel": [{"name": "s0", "stage": {"pp": 0}, "inputs": [{"name": x, "shape": ["n"]} for x in xs],
                          "nodes": s0, "outputs": s0_out},
                         {"name": "s1", "stage": {"pp": 1}, "inputs": [], "nodes": s1,
                          "outputs": [f"y{i}" for i in range(k)]}],
            "inputs": {x: {"program": "s0", "local": x} for x in xs},
            "outputs": outs}
    pair = Pair(plan, "p2p", ["p2p", f"messages{k}"] + (["tp"] if len(mesh) == 2 else []), alt_dims=alt)
    if rng.random() < perturb_rate:
        m = rng.choice(sorted(P2P_MUTATIONS))
        out = P2P_MUTATIONS[m](copy.deepcopy(plan), rng)
        if out is not None:
            pair.plan, pair.mutation, pair.perturbed = out, m, True
    return pair


def generate(seed: int, index: int, perturb_rate: float = 0.5) -> Pair:
    """The ``index``-th pair of the stream with this seed (deterministic)."""
    from .mutate import mutate

    rng = random.Random(f"tvcert-fuzz/{seed}/{index}")
    name = f"fuzz_{seed}_{index}"
    r = rng.random()
    if r < 0.06:
        from .ring import gen_ring

        pair = gen_ring(rng, name, perturb_rate)
    elif r < 0.12:
        pair = gen_c12(rng, name, bug=rng.random() < 0.75)
    elif r < 0.20:
        pair = gen_reshape_transpose(rng, name, bug=rng.random() < 0.75)
    elif r < 0.23:
        pair = gen_stage_alias(rng, name, perturb_rate)
    elif r < 0.26:
        pair = gen_p2p(rng, name, perturb_rate)
    else:
        pair = gen_compose(rng, name)
        if rng.random() < perturb_rate:
            m = mutate(pair.plan, rng)
            if m is not None:
                pair.plan, pair.mutation = m
                pair.perturbed = True
        if rng.random() < 0.15:
            as_zigzag(pair, rng)
    pair.seed = seed
    return pair
