"""Random single-op instances, one generator per kernel rule id.

Every generator draws a whole instance: a mesh of 1-3 axes in a random nesting order with sizes that are
not only powers of two (1..5), logical shapes divisible as the placements need, a placement on every axis
(the rule's own premise on a focus axis, random placements -- Replicate, Shard of another dim, ZigzagShard,
sometimes Partial -- on the others), attributes (dims written as expressions over the mesh axes, negative
dims, keepdim, fill values, dtypes).  A few instances break a premise on purpose (a nonlinear op on a
Partial, a fill value that is not 0, a cast into int, rank expressions over the wrong or several axes, a
block size that is off by one): the kernel must refuse them or conclude something that still holds.

For every op flagged linear (``linear_in``) the generators include "Partial through the op, then reduce"
(the reassembly of a Partial conclusion sums the ranks' results); "scale through the op" is the
``scale_commutes_linear`` generator of :mod:`.eqgen`.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Callable

import numpy as np

from .core import OpCase, P, R, S, TIn, Z
from ..plan import Placement

AXIS_NAMES = ("tp", "dp", "cp", "ep")
SIZES = (1, 2, 2, 3, 3, 4, 5)


# ------------------------------------------------------------------ helpers
class Draw:
    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:  # inclusive
        return int(self.rng.integers(lo, hi + 1))

    def pick(self, xs):
        return xs[int(self.rng.integers(0, len(xs)))]

    def coin(self, p: float = 0.5) -> bool:
        return bool(self.rng.random() < p)

    def mesh(self, max_axes: int = 3, min_axes: int = 1, max_ranks: int = 30):
        n = self.pick([k for k in (1, 1, 2, 2, 2, 3) if min_axes <= k <= max_axes] or [min_axes])
        names = list(self.rng.permutation(AXIS_NAMES))[:n]
        while True:
            sizes = {a: int(self.pick(SIZES)) for a in names}
            if int(np.prod(list(sizes.values()))) <= max_ranks:
                return tuple(names), sizes

    def other_pl(self, rank: int, allow_p: bool = False, allow_z: bool = True, p_kinds=("sum", "avg")) -> Placement:
        u = self.rng.random()
        if rank == 0 or u < 0.45:
            return R
        if u < 0.8:
            return S(self.int(0, rank - 1))
        if u < 0.9 and allow_z:
            return Z(self.int(0, rank - 1))
        if allow_p:
            return P(self.pick(list(p_kinds)))
        return S(self.int(0, rank - 1))


def need(shape_rank: int, axes, sizes, pl) -> list[int]:
    f = [1] * shape_rank
    for a, p in zip(axes, pl):
        if p.kind == "S" and p.dim < shape_rank:
            f[p.dim] *= sizes[a]
        elif p.kind == "Z" and p.dim < shape_rank:
            f[p.dim] *= 2 * sizes[a]
    return f


def fit(dr: Draw, rank: int, axes, sizes, pls: list[tuple], base=None) -> list[int]:
    """Dim sizes divisible by what every placement in ``pls`` needs (lcm of the factors), times 1..2."""
    from math import lcm

    f = [1] * rank
    for pl in pls:
        for i, x in enumerate(need(rank, axes, sizes, pl)):
            f[i] = lcm(f[i], x)
    return [f[i] * (base[i] if base else dr.int(1, 2)) for i in range(rank)]


def focus_axis(dr: Draw, axes) -> int:
    return dr.int(0, len(axes) - 1)


def fill(dr: Draw, axes, fi: int, on_focus: Placement, rank: int, allow_p=False, allow_z=True,
         p_kinds=("sum", "avg")) -> tuple:
    return tuple(on_focus if j == fi else dr.other_pl(rank, allow_p, allow_z, p_kinds) for j in range(len(axes)))


def neg_dim(dr: Draw, d: int, rank: int) -> int:
    return d - rank if dr.coin(0.3) else d


# ------------------------------------------------------------------ elementwise
UNARY_LINEAR = ["neg", "scale", "cast"]
UNARY_OTHER = ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "silu", "relu", "abs", "reciprocal",
               "square", "gelu", "pow", "add_scalar", "logical_not"]


def _unary_attrs(dr: Draw, op: str, axes, sizes, fi):
    a = axes[fi]
    if op == "scale":
        return {"value": dr.pick([2, -3, 0.5, 1.5, f"{a}", f"2*{a}", Fraction(1, sizes[a]).__float__(), -1])}
    if op == "add_scalar":
        return {"value": dr.pick([1, -2, 0.25, 0])}
    if op == "pow":
        return {"exponent": dr.pick([2, 3, -1, 0.5, -0.5, 0])}
    if op == "gelu":
        return {"approximate": dr.pick(["none", "tanh"])}
    if op == "cast":
        return {"dtype": dr.pick(["float", "int"])}
    return {}


def gen_unary(focus: str, ops=None):
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh()
        fi = focus_axis(dr, axes)
        rank = dr.int(1, 3)
        if focus == "P":
            op = dr.pick(ops or (UNARY_LINEAR * 3 + UNARY_OTHER))
            on = P(dr.pick(["sum", "avg", "sum", "max"]))
        elif focus == "avgdiv":
            op, on = "scale", P("avg")
        else:
            op = dr.pick(UNARY_LINEAR + UNARY_OTHER)
            on = {"R": R, "S": S(dr.int(0, rank - 1)), "Z": Z(dr.int(0, rank - 1))}[focus]
        pl = fill(dr, axes, fi, on, rank, allow_p=dr.coin(0.2))
        shape = fit(dr, rank, axes, sizes, [pl])
        attrs = _unary_attrs(dr, op, axes, sizes, fi)
        if focus == "avgdiv":
            attrs = {"value": dr.pick([1 / sizes[axes[fi]], f"1/{axes[fi]}", 0.5, 1 / 3])}
        dtype = "float"
        if op == "cast" or (op in ("neg", "abs", "relu", "square", "scale") and dr.coin(0.25)):
            dtype = dr.pick(["int", "float"])
        if dtype == "int" and op in ("log", "sqrt", "rsqrt", "reciprocal", "pow"):
            dtype = "float"
        return OpCase(op, attrs, [TIn(tuple(shape), pl, dtype, hi=9)], axes, sizes)
    return g


def _bshapes(dr: Draw, rank: int, out: list[int], shard_dims: set[int]):
    """A second operand's shape broadcasting against ``out``: a suffix, with size-1 dims off the shard dims."""
    k = dr.int(0, rank) if dr.coin(0.4) else rank
    s = list(out[rank - k:]) if k else []
    for i in range(len(s)):
        d = i + rank - k
        if d not in shard_dims and dr.coin(0.3):
            s[i] = 1
    return s


BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "eq", "lt", "ge", "logical_and", "logical_or"]


def gen_binary(focus: str):
    """focus: R | S | Sb (shard + broadcast replicated) | Z | Zb | PP (P op P) | PR (P op R) | avgdiv | mf0 | where0"""
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh()
        fi = focus_axis(dr, axes)
        rank = dr.int(1, 3)
        op = dr.pick(BINARY)
        d = dr.int(0, rank - 1)
        # placements of the two operands on the focus axis
        if focus == "R":
            on = (R, R)
        elif focus in ("S", "Z"):
            k = S(d) if focus == "S" else Z(d)
            on = (k, k)
        elif focus in ("Sb", "Zb"):
            k = S(d) if focus == "Sb" else Z(d)
            on = (k, R) if dr.coin() else (R, k)
        elif focus == "PP":
            op = dr.pick(["add", "sub", "add", "sub", "mul", "maximum"])
            r = dr.pick(["sum", "avg", "sum", "max"])
            on = (P(r), P(r) if dr.coin(0.85) else P(dr.pick(["sum", "avg"])))
        elif focus == "PR":
            op = dr.pick(["add", "sub", "mul", "div", "mul", "div", "maximum"])
            r = dr.pick(["sum", "avg", "sum"])
            on = (P(r), R) if dr.coin(0.7) else (R, P(r))
        elif focus == "avgdiv":
            op = "div"
            on = (P("avg"), R)
        elif focus in ("mf0", "where0"):
            on = None
        else:
            raise ValueError(focus)
        if focus == "mf0":
            pl0 = fill(dr, axes, fi, P(dr.pick(["sum", "avg"])), rank)
            plm = tuple(R if j == fi else (p if p.kind != "P" else R) for j, p in enumerate(pl0))
            shape = fit(dr, rank, axes, sizes, [pl0])
            value = dr.pick([0, 0, 0.0, -1e9, 1, "tp" if "tp" in axes else 2])
            mshape = [n if (plm[j].kind in ("S", "Z") and plm[j].dim == i) or dr.coin(0.6) else 1
                      for i, n in enumerate(shape) for j in [0]]
            mshape = [shape[i] if any(p.kind in ("S", "Z") and p.dim == i for p in plm) else mshape[i] for i in range(rank)]
            return OpCase("masked_fill", {"value": value}, [TIn(tuple(shape), pl0), TIn(tuple(mshape), plm, "int", hi=2)],
                          axes, sizes)
        if focus == "where0":
            plx = fill(dr, axes, fi, P(dr.pick(["sum", "avg"])), rank)
            plc = tuple(R if p.kind == "P" else p for p in plx)
            shape = fit(dr, rank, axes, sizes, [plx])
            z = dr.pick([0, 0, 0, 1.0, -2])
            third = TIn((), tuple(R for _ in axes), const=z) if dr.coin(0.8) else \
                TIn(tuple(shape), tuple(R if p.kind == "P" else p for p in plx))
            return OpCase("where", {}, [TIn(tuple(shape), plc, "int", hi=2), TIn(tuple(shape), plx), third], axes, sizes)
        pls = [[None] * len(axes), [None] * len(axes)]
        for j in range(len(axes)):
            if j == fi:
                pls[0][j], pls[1][j] = on
            else:
                u = dr.rng.random()
                if u < 0.5:
                    pls[0][j] = pls[1][j] = R
                elif u < 0.85:
                    dd = dr.int(0, rank - 1)
                    pls[0][j] = pls[1][j] = S(dd)
                else:
                    pls[0][j] = pls[1][j] = Z(dr.int(0, rank - 1))
        pl0, pl1 = tuple(pls[0]), tuple(pls[1])
        out = fit(dr, rank, axes, sizes, [pl0, pl1])
        shard_dims = {p.dim for p in pl1 if p.kind in ("S", "Z")}
        s1 = list(out)
        if focus in ("Sb", "Zb", "R", "PR") or dr.coin(0.3):
            # the replicated side may broadcast (along the focus shard dim too: that is the _broadcast rule)
            rep_side = 1 if on[1] == R else 0
            other = pl1 if rep_side == 1 else pl0
            sd = {p.dim for p in other if p.kind in ("S", "Z")}
            s1 = _bshapes(dr, rank, out, sd)
            if rep_side == 0:
                # operand 0 is the replicated one: swap roles so that operand 1 has the full shape
                return OpCase(op, {}, [TIn(tuple(_align(s1, pl0, rank)), _shift(pl0, rank, len(s1))),
                                       TIn(tuple(out), pl1)], axes, sizes)
        return OpCase(op, {}, [TIn(tuple(out), pl0), TIn(tuple(s1), _shift(pl1, rank, len(s1)))], axes, sizes)
    return g


def _shift(pl, rank, k):
    """Placements of a rank-k suffix operand: shard dims move left by rank-k; a dim it lacks becomes Replicate."""
    out = []
    for p in pl:
        if p.kind in ("S", "Z"):
            d = p.dim - (rank - k)
            out.append(Placement(p.kind, d) if d >= 0 else R)
        else:
            out.append(p)
    return tuple(out)


def _align(s, pl, rank):
    return s


# ------------------------------------------------------------------ matmul / einsum
def gen_matmul(focus: str):
    """focus: R | col | row | batch | Plhs | Prhs | Zbatch | Zrow | vec"""
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh()
        fi = focus_axis(dr, axes)
        nb = dr.pick([0, 0, 1, 2])
        vec = focus == "vec" or dr.coin(0.1)
        ra_, rb_ = nb + 2, nb + 2
        if vec:
            nb = 0
            ra_, rb_ = dr.pick([(1, 2), (2, 1)])
        on = {"R": (R, R), "col": (R, S(rb_ - 1)), "row": (S(ra_ - 1), S(max(rb_ - 2, 0))),
              "batch": (S(ra_ - 2), R) if dr.coin() or nb == 0 else (S(0), S(0)),
              "Plhs": (P(dr.pick(["sum", "avg", "max"])), R), "Prhs": (R, P(dr.pick(["sum", "avg"]))),
              "Zbatch": (Z(ra_ - 2), R) if dr.coin() or nb == 0 else (Z(0), Z(0)),
              "Zrow": (Z(ra_ - 1), Z(max(rb_ - 2, 0))),
              "vec": (dr.pick([R, S(0), S(ra_ - 1)]), dr.pick([R, S(0), S(rb_ - 1)]))}[focus]
        if vec and focus != "vec":
            on = (dr.pick([R, S(0), S(ra_ - 1), P()]), dr.pick([R, S(0), S(rb_ - 1)]))
        pla, plb = [], []
        for j in range(len(axes)):
            if j == fi:
                pla.append(on[0]); plb.append(on[1])
            else:
                u = dr.rng.random()
                if u < 0.45 or ra_ < 2 or rb_ < 2:
                    pla.append(R); plb.append(R)
                elif u < 0.65:
                    pla.append(S(ra_ - 2)); plb.append(R)  # rows of the lhs
                elif u < 0.8:
                    pla.append(R); plb.append(S(rb_ - 1))  # columns of the rhs
                elif u < 0.9 and nb:
                    pla.append(S(0)); plb.append(S(0))
                else:
                    pla.append(S(ra_ - 1)); plb.append(S(rb_ - 2))
        pla, plb = tuple(pla), tuple(plb)
        fa = need(ra_, axes, sizes, pla)
        fb = need(rb_, axes, sizes, plb)
        from math import lcm

        M = fa[ra_ - 2] * dr.int(1, 2) if ra_ >= 2 else 1
        K = lcm(fa[ra_ - 1], fb[rb_ - 2] if rb_ >= 2 else fb[0]) * dr.int(1, 2)
        N = fb[rb_ - 1] * dr.int(1, 2) if rb_ >= 2 else 1
        batch = [lcm(fa[i], fb[i]) * dr.int(1, 2) for i in range(nb)]
        sa = batch + [M, K] if ra_ >= 2 else [K]
        sb = batch + [K, N] if rb_ >= 2 else [K]
        if nb and dr.coin(0.25):  # broadcast batch dim of size 1 in one operand (replicated there)
            i = dr.int(0, nb - 1)
            if all(p.kind != "S" or p.dim != i for p in plb):
                sb[i] = 1
        return OpCase("matmul", {}, [TIn(tuple(sa), pla), TIn(tuple(sb), plb)], axes, sizes)
    return g


EINSUMS = ["ij,jk->ik", "bij,bjk->bik", "bsh,hf->bsf", "ij,ij->i", "ij->ji", "i,i->", "bhqd,bhkd->bhqk",
           "abc,cd,de->abe", "ij,j->i", "ijk->ik", "ab,ab,ab->b",
           # implicit outputs (the letters used once, sorted) and letters repeated inside an operand
           "ij,jk", "ba,ac", "ii->i", "iij->ij", "ij,ji->i", "ijk,kj"]


def gen_einsum(focus: str):
    """focus: free | contracted | partial | Zfree | Zcontracted"""
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh()
        fi = focus_axis(dr, axes)
        eq = dr.pick(EINSUMS)
        # rename letters
        letters = sorted(set(eq) - set(",->"))
        new = list(dr.rng.permutation(list("abcdefghijkmnopq")))[:len(letters)]
        tr = dict(zip(letters, new))
        eq = "".join(tr.get(c, c) for c in eq)
        lhs, _, rhs = eq.partition("->")
        terms = lhs.split(",")
        if "->" not in eq:
            cnt = {c: "".join(terms).count(c) for c in set("".join(terms))}
            rhs = "".join(sorted(c for c, k in cnt.items() if k == 1))
        allletters = sorted(set("".join(terms)))
        free = [c for c in allletters if c in rhs]
        contracted = [c for c in allletters if c not in rhs]

        def shard_letter(l, kind):
            return tuple(Placement(kind, t.index(l)) if l in t else R for t in terms)

        if focus in ("free", "Zfree") and free:
            on = shard_letter(dr.pick(free), "S" if focus == "free" else "Z")
        elif focus in ("contracted", "Zcontracted") and contracted:
            on = shard_letter(dr.pick(contracted), "S" if focus == "contracted" else "Z")
        elif focus == "partial" or not (free or contracted):
            k = dr.int(0, len(terms) - 1)
            on = tuple(P(dr.pick(["sum", "avg"])) if i == k else R for i in range(len(terms)))
            if dr.coin(0.1):
                on = tuple(P() for _ in terms)
        else:
            on = tuple(R for _ in terms)
        pls = [[None] * len(axes) for _ in terms]
        for j in range(len(axes)):
            if j == fi:
                col = on
            elif dr.coin(0.5):
                col = tuple(R for _ in terms)
            else:
                col = shard_letter(dr.pick(allletters), "S")
            for i in range(len(terms)):
                pls[i][j] = col[i]
        from math import lcm

        size = {}
        for l in allletters:
            f = 1
            for i, t in enumerate(terms):
                if l in t:
                    for a, p in zip(axes, pls[i]):
                        if p.kind in ("S", "Z") and t[p.dim] == l:
                            f = lcm(f, sizes[a] * (2 if p.kind == "Z" else 1))
            size[l] = f * dr.int(1, 2)
        # several axes sharding one letter must nest: use the product
        for l in allletters:
            for i, t in enumerate(terms):
                if l in t:
                    prod = 1
                    for a, p in zip(axes, pls[i]):
                        if p.kind in ("S", "Z") and t[p.dim] == l:
                            prod *= sizes[a] * (2 if p.kind == "Z" else 1)
                    size[l] = lcm(size[l], prod)
        ins = [TIn(tuple(size[c] for c in t), tuple(pls[i])) for i, t in enumerate(terms)]
        return OpCase("einsum", {"equation": eq if dr.coin(0.8) else eq.replace(",", ", ")}, ins, axes, sizes)
    return g


# ------------------------------------------------------------------ reductions
def gen_reduce(focus: str):
    """focus: Ssum | Smean | Smax | Smin | other | P | R | Zsum | Zmax | Zmean"""
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh()
        fi = focus_axis(dr, axes)
        rank = dr.int(1, 3)
        op = {"Ssum": "sum", "Smean": "mean", "Smax": "amax", "Smin": "amin", "Zsum": "sum", "Zmax": "amax",
              "Zmean": "mean"}.get(focus) or dr.pick(["sum", "mean", "amax", "amin"])
        dims = sorted(set(int(x) for x in dr.rng.choice(rank, size=dr.int(1, rank), replace=False)))
        if focus == "other" and len(dims) == rank:
            dims = dims[:-1] or []
        d_red = dr.pick(dims) if dims else 0
        if focus.startswith("S"):
            on = S(d_red)
        elif focus.startswith("Z"):
            on = Z(d_red)
        elif focus == "other":
            rest = [i for i in range(rank) if i not in dims]
            on = S(dr.pick(rest)) if rest else R
        elif focus == "P":
            on = P(dr.pick(["sum", "avg", "max"]))
        else:
            on = R
        pl = fill(dr, axes, fi, on, rank, allow_p=dr.coin(0.15))
        shape = fit(dr, rank, axes, sizes, [pl])
        wd = [neg_dim(dr, d, rank) for d in dims]
        return OpCase(op, {"dims": wd, "keepdim": dr.coin()}, [TIn(tuple(shape), pl)], axes, sizes)
    return g


# ------------------------------------------------------------------ row-wise ops
def gen_rowwise(focus: str):
    """focus: softmax | softmaxP | smbwd | smbwdP | ce | cebwd | one_hot | topk | embedding | index_select | tri | pad |
    flip | expand | Zrow (a zig-zag shard through a row-wise op)"""
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh()
        fi = focus_axis(dr, axes)
        kind = focus
        zig = False
        if focus == "Zrow":
            kind = dr.pick(["softmax", "smbwd", "ce", "topk", "tri", "flip", "one_hot", "embedding", "index_select"])
            zig = True
        sh = Z if zig else S
        if kind in ("softmax", "softmaxP"):
            op = dr.pick(["softmax", "log_softmax"])
            rank = dr.int(1, 3)
            d = dr.int(0, rank - 1)
            others = [i for i in range(rank) if i != d]
            on = P(dr.pick(["sum", "avg"])) if kind == "softmaxP" else (sh(dr.pick(others)) if others else R)
            pl = fill(dr, axes, fi, on, rank)
            shape = fit(dr, rank, axes, sizes, [pl])
            return OpCase(op, {"dim": neg_dim(dr, d, rank)}, [TIn(tuple(shape), pl)], axes, sizes)
        if kind in ("smbwd", "smbwdP"):
            op = dr.pick(["softmax_backward", "log_softmax_backward"])
            rank = dr.int(1, 3)
            d = dr.int(0, rank - 1)
            others = [i for i in range(rank) if i != d]
            if kind == "smbwdP":
                ong, ono = (P(dr.pick(["sum", "avg"])), R) if dr.coin(0.8) else (R, P())
            else:
                s_ = sh(dr.pick(others)) if others else R
                ong, ono = s_, s_
            plg = fill(dr, axes, fi, ong, rank)
            plo = tuple(ono if j == fi else (plg[j] if plg[j].kind != "P" else R) for j in range(len(axes)))
            shape = fit(dr, rank, axes, sizes, [plg, plo])
            return OpCase(op, {"dim": neg_dim(dr, d, rank)}, [TIn(tuple(shape), plg), TIn(tuple(shape), plo)], axes, sizes)
        if kind in ("ce", "cebwd"):
            rank = dr.int(1, 3)  # target rank; logits rank + 1
            red = dr.pick(["none", "sum", "mean"])
            d = dr.int(0, rank - 1)
            on = sh(d)
            pll = fill(dr, axes, fi, on, rank + 1)
            pll = tuple(p if p.kind == "R" or p.dim < rank else R for p in pll)
            plt = tuple(p if p.kind != "P" else R for p in pll)
            shape = fit(dr, rank + 1, axes, sizes, [pll])
            C = shape[-1] + dr.int(0, 2)
            shape[-1] = C
            logits = TIn(tuple(shape), pll)
            tgt = TIn(tuple(shape[:-1]), plt, "int", hi=C)
            if kind == "ce":
                return OpCase("cross_entropy", {"reduction": red}, [logits, tgt], axes, sizes)
            gshape = tuple(shape[:-1]) if red == "none" else ()
            plg = plt if red == "none" else tuple(R for _ in axes)
            return OpCase("cross_entropy_backward", {"reduction": red}, [TIn(gshape, plg), logits, tgt], axes, sizes)
        if kind == "one_hot":
            rank = dr.int(1, 2)
            pl = fill(dr, axes, fi, sh(dr.int(0, rank - 1)), rank)
            shape = fit(dr, rank, axes, sizes, [pl])
            C = dr.int(2, 5)
            return OpCase("one_hot", {"num_classes": C}, [TIn(tuple(shape), pl, "int", hi=C)], axes, sizes)
        if kind == "topk":
            rank = dr.int(1, 3)
            d = dr.int(0, rank - 1)
            others = [i for i in range(rank) if i != d]
            pl = fill(dr, axes, fi, sh(dr.pick(others)) if others else (S(d) if dr.coin() else R), rank)
            shape = fit(dr, rank, axes, sizes, [pl])
            return OpCase("topk", {"k": dr.int(0, shape[d]), "dim": neg_dim(dr, d, rank)}, [TIn(tuple(shape), pl)],
                          axes, sizes)
        if kind == "embedding":
            rid = dr.int(1, 2)
            V, H = dr.int(2, 6), None
            u = dr.rng.random()
            if u < 0.5:
                onw, oni = R, sh(dr.int(0, rid - 1))
            elif u < 0.8:
                onw, oni = S(1), R
            else:
                onw, oni = (P(dr.pick(["sum", "avg"])), R) if dr.coin() else (S(0), R)
            plw, pli = [], []
            for j in range(len(axes)):
                if j == fi:
                    plw.append(onw); pli.append(oni)
                elif dr.coin():
                    plw.append(R); pli.append(R)
                else:
                    plw.append(R); pli.append(S(dr.int(0, rid - 1)))
            plw, pli = tuple(plw), tuple(pli)
            ws = fit(dr, 2, axes, sizes, [plw])
            ws[0] = max(ws[0], V) if plw[fi].kind != "S" or plw[fi].dim != 0 else ws[0]
            ids = fit(dr, rid, axes, sizes, [pli])
            return OpCase("embedding", {}, [TIn(tuple(ws), plw), TIn(tuple(ids), pli, "int", hi=ws[0])], axes, sizes)
        if kind == "index_select":  # a replicated table read at sharded indices (RoPE caches at a rank's positions)
            rank = dr.int(1, 3)
            d = dr.int(0, rank - 1)
            u = dr.rng.random()
            onw, oni = (R, sh(0)) if u < 0.6 else (sh(dr.pick([i for i in range(rank) if i != d])), R) \
                if rank > 1 and u < 0.8 else (sh(d), R) if u < 0.9 else (R, P("sum"))  # last two: near misses
            plw, pli = fill(dr, axes, fi, onw, rank), fill(dr, axes, fi, oni, 1)
            ws = fit(dr, rank, axes, sizes, [plw])
            ids = fit(dr, 1, axes, sizes, [pli])
            return OpCase("index_select", {"dim": neg_dim(dr, d, rank)},
                          [TIn(tuple(ws), plw), TIn(tuple(ids), pli, "int", hi=ws[d])], axes, sizes)
        if kind == "tri":
            rank = dr.int(2, 3)
            on = dr.pick([sh(0), P(dr.pick(["sum", "avg"])), S(rank - 1), R]) if rank == 3 else \
                dr.pick([P(), S(0), R])
            if zig and rank == 3:
                on = Z(0)
            pl = fill(dr, axes, fi, on, rank)
            shape = fit(dr, rank, axes, sizes, [pl])
            return OpCase(dr.pick(["triu", "tril"]), {"diagonal": dr.int(-2, 2)}, [TIn(tuple(shape), pl)], axes, sizes)
        if kind == "pad":
            rank = dr.int(1, 3)
            pads = []
            for i in range(rank):
                pads += [dr.pick([0, 0, 1, 2]), dr.pick([0, 0, 1])]
            nz = [i for i in range(rank) if pads[2 * i] == 0 and pads[2 * i + 1] == 0]
            on = dr.pick([P(dr.pick(["sum", "avg"])), S(dr.pick(nz)) if nz else R, S(dr.int(0, rank - 1)), R])
            pl = fill(dr, axes, fi, on, rank)
            shape = fit(dr, rank, axes, sizes, [pl])
            return OpCase("pad", {"pads": pads, "value": dr.pick([0, 0, 0.0, 1, -1e9])}, [TIn(tuple(shape), pl)], axes, sizes)
        if kind == "flip":
            rank = dr.int(1, 3)
            fd = sorted(set(int(x) for x in dr.rng.choice(rank, size=dr.int(1, rank), replace=False)))
            rest = [i for i in range(rank) if i not in fd]
            on = dr.pick([P(dr.pick(["sum", "avg"])), sh(dr.pick(rest)) if rest else R, S(dr.pick(fd)), R])
            if zig:
                on = Z(dr.pick(rest)) if rest else Z(fd[0])
            pl = fill(dr, axes, fi, on, rank)
            shape = fit(dr, rank, axes, sizes, [pl])
            return OpCase("flip", {"dims": [neg_dim(dr, d, rank) for d in fd]}, [TIn(tuple(shape), pl)], axes, sizes)
        if kind == "expand":
            rank = dr.int(1, 3)
            pl = fill(dr, axes, fi, dr.pick([S(dr.int(0, rank - 1)), P(dr.pick(["sum", "avg"])), R]), rank)
            shape = fit(dr, rank, axes, sizes, [pl])
            sharded = {p.dim for p in pl if p.kind in ("S", "Z")}
            ins = [n if (i in sharded or dr.coin(0.5)) else 1 for i, n in enumerate(shape)]
            target = []
            extra = dr.int(0, 1)
            target += [dr.int(1, 3) for _ in range(extra)]
            for i, n in enumerate(ins):
                if n == 1 and i not in sharded:
                    target.append(dr.pick([dr.int(1, 4), -1]))
                else:
                    from math import prod

                    f = prod(sizes[a] for a, p in zip(axes, pl) if p.kind == "S" and p.dim == i)
                    target.append(dr.pick([-1, n // f if f > 1 else n]))
            return OpCase("expand", {"shape": target}, [TIn(tuple(ins), pl)], axes, sizes)
        raise ValueError(kind)
    return g


# ------------------------------------------------------------------ layout
def gen_permute(focus: str):
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh()
        fi = focus_axis(dr, axes)
        rank = dr.int(1, 4)
        on = {"S": S(dr.int(0, rank - 1)), "P": P(dr.pick(["sum", "avg", "max"])), "Z": Z(dr.int(0, rank - 1)),
              "R": R}[focus]
        pl = fill(dr, axes, fi, on, rank)
        shape = fit(dr, rank, axes, sizes, [pl])
        if rank >= 2 and dr.coin(0.4):
            d0, d1 = (int(x) for x in dr.rng.choice(rank, size=2, replace=False))
            return OpCase("transpose", {"dim0": neg_dim(dr, d0, rank), "dim1": d1}, [TIn(tuple(shape), pl)], axes, sizes)
        perm = [int(x) for x in dr.rng.permutation(rank)]
        return OpCase("permute", {"dims": [neg_dim(dr, d, rank) for d in perm]}, [TIn(tuple(shape), pl)], axes, sizes)
    return g


def _shard_factor(axes, sizes, pl, d, kinds=("S",)):
    f = 1
    for a, p in zip(axes, pl):
        if p.kind in kinds and p.dim == d:
            f *= sizes[a] * (2 if p.kind == "Z" else 1)
    return f


def gen_reshape(focus: str):
    """A logical shape, a random regrouping (merge / split adjacent dims, insert / drop 1s), sharded dims."""
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh()
        fi = focus_axis(dr, axes)
        rank = dr.int(1, 3)
        on = {"S": S(dr.int(0, rank - 1)), "P": P(dr.pick(["sum", "avg"])), "Z": Z(dr.int(0, rank - 1)),
              "R": R}[focus]
        pl = fill(dr, axes, fi, on, rank, allow_z=focus == "Z")
        shape = fit(dr, rank, axes, sizes, [pl])
        # target: regroup the logical shape
        groups, i = [], 0
        while i < rank:
            k = dr.int(1, min(2, rank - i))
            groups.append(list(range(i, i + k)))
            i += k
        target: list = []
        for gr in groups:
            tot = int(np.prod([shape[x] for x in gr]))
            if dr.coin(0.3) and tot > 1:
                # split into two factors
                divs = [d for d in range(2, tot + 1) if tot % d == 0]
                a = dr.pick(divs)
                target += [a, tot // a]
            else:
                target.append(tot)
            if dr.coin(0.15):
                target.append(1)
        if dr.coin(0.1):
            target.insert(0, 1)
        logical_target = list(target)
        # the attribute as written: local sizes, with the shard factor written over the axis names
        local_in = list(shape)
        for a, p in zip(axes, pl):
            if p.kind in ("S", "Z"):
                local_in[p.dim] //= sizes[a]
        # choose the output dims carrying each sharded input dim: the first target dim of its group
        written = [str(x) for x in logical_target]
        pos = 0
        starts = {}
        for gr in groups:
            starts[gr[0]] = pos
            tot = int(np.prod([shape[x] for x in gr]))
            acc = 1
            while pos < len(logical_target) and acc < tot:
                acc *= logical_target[pos]
                pos += 1
            while pos < len(logical_target) and logical_target[pos] == 1 and acc == tot:
                pos += 1
                break
        for a, p in zip(axes, pl):
            if p.kind in ("S", "Z"):
                e = min(starts.get(p.dim, 0), len(logical_target) - 1)
                while e < len(logical_target) - 1 and logical_target[e] == 1:
                    e += 1
                written[e] = f"({written[e]})/{a}"
        op = dr.pick(["reshape", "reshape", "view"])
        if dr.coin(0.2) and rank >= 1:
            # unsqueeze / flatten / squeeze forms
            u = dr.rng.random()
            if u < 0.4:
                return OpCase("unsqueeze", {"dim": dr.int(-rank - 1, rank)}, [TIn(tuple(shape), pl)], axes, sizes)
            if u < 0.7 and rank >= 2:
                st = dr.int(0, rank - 2)
                return OpCase("flatten", {"start": st, "end": dr.int(st, rank - 1)}, [TIn(tuple(shape), pl)], axes, sizes)
            ones = [i for i, n in enumerate(shape) if n == 1]
            return OpCase("squeeze", {"dims": ones[:1]}, [TIn(tuple(shape), pl)], axes, sizes)
        attr = [_num_or_expr(w) for w in written]
        if dr.coin(0.2):
            j = dr.int(0, len(attr) - 1)
            attr[j] = -1
        return OpCase(op, {"shape": attr}, [TIn(tuple(shape), pl)], axes, sizes)
    return g


def _num_or_expr(w: str):
    try:
        return int(w)
    except ValueError:
        return w


# ------------------------------------------------------------------ slice / split / concat
def gen_slice(focus: str):
    """focus: other | P | block (rank-dependent block of a replicated tensor) | badblock (near misses)"""
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh()
        fi = focus_axis(dr, axes)
        a = axes[fi]
        rank = dr.int(1, 3)
        d = dr.int(0, rank - 1)
        if focus in ("block", "badblock"):
            pl = list(fill(dr, axes, fi, R, rank, allow_z=True))
            pl = [R if (p.kind in ("S", "Z") and p.dim == d and j > fi) else p for j, p in enumerate(pl)]
            pl = tuple(pl)
            shape = fit(dr, rank, axes, sizes, [pl])
            outer = _shard_factor(axes[:fi], sizes, pl[:fi], d, ("S", "Z"))
            shape[d] = shape[d] * sizes[a] * dr.int(1, 2) if shape[d] % (outer * sizes[a]) else shape[d]
            shape[d] = shape[d] if shape[d] % (outer * sizes[a]) == 0 else outer * sizes[a]
            local = shape[d] // outer
            L = local // sizes[a]
            Ls = dr.pick([str(L), f"({local}/{a})"])
            start, end = f"rank.{a}*{Ls}", f"(rank.{a}+1)*{Ls}"
            if dr.coin(0.2):
                end = f"rank.{a}*{Ls}+{Ls}"
            if focus == "badblock":
                others = [b for b in axes if b != a]
                u = dr.rng.random()
                if u < 0.3 and others:
                    b = dr.pick(others)
                    start = f"(rank.{a}+rank.{b})*{Ls}"
                    end = f"(rank.{a}+rank.{b}+1)*{Ls}"
                elif u < 0.5 and others:
                    b = dr.pick(others)
                    start, end = f"rank.{b}*{Ls}", f"(rank.{b}+1)*{Ls}"
                elif u < 0.7 and L > 1:
                    start, end = f"rank.{a}*{L - 1}", f"rank.{a}*{L - 1}+{L - 1}"
                elif u < 0.85:
                    start, end = f"rank.{a}*{Ls}", f"rank.{a}*{Ls}+{max(L - 1, 0)}"
                else:
                    start, end = f"({sizes[a] - 1}-rank.{a})*{Ls}", f"({sizes[a]}-rank.{a})*{Ls}"
            return OpCase("slice", {"dim": neg_dim(dr, d, rank), "start": start, "end": end}, [TIn(tuple(shape), pl)],
                          axes, sizes)
        on = {"other": S(dr.pick([i for i in range(rank) if i != d] or [d])), "P": P(dr.pick(["sum", "avg", "max"])),
              "Z": Z(dr.pick([i for i in range(rank) if i != d] or [d])), "R": R}[focus]
        pl = fill(dr, axes, fi, on, rank)
        shape = fit(dr, rank, axes, sizes, [pl])
        if shape[d] < 2:
            shape[d] *= 2 if _shard_factor(axes, sizes, pl, d, ("S", "Z")) == 1 else 1
        n = shape[d]
        if dr.coin(0.3):
            k = dr.int(1, max(1, n))
            ss = [max(1, n // k)] * k
            ss[-1] += n - sum(ss)
            ss = [x for x in ss if x > 0]
            return OpCase("split", {"dim": neg_dim(dr, d, rank), "sizes": ss}, [TIn(tuple(shape), pl)], axes, sizes)
        st = dr.int(0, n - 1)
        en = dr.int(st, n)
        return OpCase("slice", {"dim": neg_dim(dr, d, rank), "start": st, "end": en, "step": dr.pick([1, 1, 2])},
                      [TIn(tuple(shape), pl)], axes, sizes)
    return g


def gen_concat(focus: str):
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh()
        fi = focus_axis(dr, axes)
        rank = dr.int(1, 3)
        d = dr.int(0, rank - 1)
        others = [i for i in range(rank) if i != d] or [d]
        on = {"other": S(dr.pick(others)), "P": P(dr.pick(["sum", "avg"])), "Z": Z(dr.pick(others)), "R": R}[focus]
        pl = fill(dr, axes, fi, on, rank)
        k = dr.int(1, 3)
        base = fit(dr, rank, axes, sizes, [pl])
        ins = []
        f = _shard_factor(axes, sizes, pl, d, ("S", "Z"))
        for _ in range(k):
            s = list(base)
            s[d] = f * dr.int(1, 3)
            q = pl if dr.coin(0.9) else tuple(dr.other_pl(rank) for _ in axes)
            ins.append(TIn(tuple(s), q))
        return OpCase("concat", {"dim": neg_dim(dr, d, rank)}, ins, axes, sizes)
    return g


# ------------------------------------------------------------------ collectives
def gen_collective(focus: str):
    """focus: ar_sum_P | ar_avg_Pavg | ar_max_Pmax | ar_avg_Psum | ar_sum_R | ar_avg_R | ar_max_R | ar_nested |
    allgather | reduce_scatter | all_to_all | broadcast"""
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh(min_axes=2 if focus == "ar_nested" else 1)
        fi = focus_axis(dr, axes)
        a = axes[fi]
        rank = dr.int(1, 3)
        if focus.startswith("ar_"):
            red = {"ar_sum_P": "sum", "ar_avg_Pavg": "avg", "ar_max_Pmax": "max", "ar_avg_Psum": "avg",
                   "ar_sum_R": "sum", "ar_avg_R": "avg", "ar_max_R": "max"}.get(focus) or dr.pick(["sum", "avg", "max"])
            on = {"ar_sum_P": P("sum"), "ar_avg_Pavg": P("avg"), "ar_max_Pmax": P("max"), "ar_avg_Psum": P("sum"),
                  "ar_sum_R": R, "ar_avg_R": R, "ar_max_R": R}.get(focus) or P(red)
            if dr.coin(0.1):
                on = dr.pick([P("sum"), P("avg"), P("max"), R, S(0)])
            pl = list(fill(dr, axes, fi, on, rank, allow_p=dr.coin(0.2), p_kinds=("sum", "avg", "max")))
            over: object = a
            if focus == "ar_nested":
                k = dr.int(2, len(axes))
                chosen = sorted(int(x) for x in dr.rng.choice(len(axes), size=k, replace=False))
                for j in chosen:
                    pl[j] = P(red) if dr.coin(0.9) else P(dr.pick(["sum", "avg", "max"]))
                over = [axes[j] for j in chosen]
                if dr.coin(0.3):
                    over = list(reversed(over))
            pl = tuple(pl)
            shape = fit(dr, rank, axes, sizes, [pl])
            return OpCase("all_reduce", {"axis": over, "reduce": red}, [TIn(tuple(shape), pl)], axes, sizes)
        if focus == "allgather":
            d = dr.int(0, rank - 1)
            pl = list(fill(dr, axes, fi, S(d) if dr.coin(0.9) else dr.pick([Z(d), R, S((d + 1) % rank)]), rank))
            pl = tuple(pl)
            shape = fit(dr, rank, axes, sizes, [pl])
            return OpCase("all_gather", {"axis": a, "dim": neg_dim(dr, d, rank)}, [TIn(tuple(shape), pl)], axes, sizes)
        if focus == "reduce_scatter":
            d = dr.int(0, rank - 1)
            pl = fill(dr, axes, fi, P("sum") if dr.coin(0.9) else P("avg"), rank)
            shape = fit(dr, rank, axes, sizes, [pl])
            f = _shard_factor(axes, sizes, pl, d, ("S", "Z"))
            shape[d] = shape[d] * sizes[a] if (shape[d] // max(f, 1)) % sizes[a] else shape[d]
            return OpCase("reduce_scatter", {"axis": a, "dim": neg_dim(dr, d, rank), "reduce": dr.pick(["sum"] * 5 + ["avg"])},
                          [TIn(tuple(shape), pl)], axes, sizes)
        if focus == "all_to_all":
            rank = dr.int(2, 3)
            sd, cd = (int(x) for x in dr.rng.choice(rank, size=2, replace=False))
            pl = fill(dr, axes, fi, S(cd) if dr.coin(0.9) else S(sd), rank)
            shape = fit(dr, rank, axes, sizes, [pl])
            f = _shard_factor(axes, sizes, pl, sd, ("S", "Z"))
            if (shape[sd] // f) % sizes[a]:
                shape[sd] *= sizes[a]
            return OpCase("all_to_all", {"axis": a, "split_dim": sd, "concat_dim": neg_dim(dr, cd, rank)},
                          [TIn(tuple(shape), pl)], axes, sizes)
        if focus == "broadcast":
            pl = fill(dr, axes, fi, R if dr.coin(0.85) else dr.pick([S(0), P()]), rank)
            shape = fit(dr, rank, axes, sizes, [pl])
            return OpCase("broadcast", {"axis": a, "root": dr.int(0, sizes[a] - 1)}, [TIn(tuple(shape), pl)], axes, sizes)
        raise ValueError(focus)
    return g


# ------------------------------------------------------------------ sources, indexing, embedding backward
def _literal(dr: Draw, shape, axes, rank_exprs: bool):
    if not shape:
        if rank_exprs and dr.coin(0.3):
            a = dr.pick(list(axes))
            return dr.pick([f"rank.{a}", f"rank.{a}*2+1", f"{a}-rank.{a}"])
        return dr.pick([1, -2, 3, 0.5, 7])
    return [_literal(dr, shape[1:], axes, rank_exprs) for _ in range(shape[0])]


def gen_source(focus: str):
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh()
        if focus == "iota":
            a = dr.pick(list(axes))
            return OpCase("iota", {"size": dr.pick([3, f"2*{a}", 4]), "start": dr.pick([0, 1, f"{a}", f"rank.{a}"])
                                   if dr.coin(0.5) else 0, "dtype": dr.pick(["int", "float"])}, [], axes, sizes)
        rank = dr.int(0, 3)
        shape = [dr.int(1, 3) for _ in range(rank)]
        if dr.coin(0.5):
            v = _literal(dr, shape, axes, rank_exprs=True)
            return OpCase("const", {"value": v}, [], axes, sizes)
        a = dr.pick(list(axes))
        return OpCase("const", {"value": dr.pick([1.5, f"{a}", f"rank.{a}", 0]), "shape": shape}, [], axes, sizes)
    return g


def gen_indexing(focus: str):
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh()
        op = dr.pick(["gather", "index_select", "scatter_add", "index_add"])
        allr = tuple(R for _ in axes)

        def maybe(pl):
            return pl if dr.coin(0.8) else tuple(dr.other_pl(1, allow_p=True) if j == 0 else p for j, p in enumerate(pl))
        rank = dr.int(1, 3)
        xs = [dr.int(1, 4) for _ in range(rank)]
        d = dr.int(0, rank - 1)
        if op == "gather":
            ix = [dr.int(1, n) for n in xs]
            ix[d] = dr.int(1, 4)
            return OpCase(op, {"dim": d}, [TIn(tuple(xs), maybe(allr)), TIn(tuple(ix), allr, "int", hi=xs[d])], axes, sizes)
        if op == "index_select":
            return OpCase(op, {"dim": d}, [TIn(tuple(xs), maybe(allr)), TIn((dr.int(1, 4),), allr, "int", hi=xs[d])],
                          axes, sizes)
        if op == "scatter_add":
            src = [dr.int(n, n + 1) for n in xs]
            ix = [dr.int(1, min(n, m)) for n, m in zip(xs, src)]
            ix[d] = dr.int(1, src[d])
            return OpCase(op, {"dim": d}, [TIn(tuple(xs), maybe(allr)), TIn(tuple(ix), allr, "int", hi=xs[d]),
                                           TIn(tuple(src), allr)], axes, sizes)
        k = dr.int(1, 4)
        src = list(xs)
        src[d] = k
        return OpCase(op, {"dim": d}, [TIn(tuple(xs), maybe(allr)), TIn((k,), allr, "int", hi=xs[d]),
                                       TIn(tuple(src), allr)], axes, sizes)
    return g


def gen_embedding_backward(focus: str):
    """focus: P (grad Partial, ids replicated) | tokens (grad and ids sharded on a token dim) | H (hidden dim) |
    Z (zig-zag tokens)"""
    def g(dr: Draw) -> OpCase:
        axes, sizes = dr.mesh()
        fi = focus_axis(dr, axes)
        rid = dr.int(1, 2)
        t = dr.int(0, rid - 1)
        ong, oni = {"P": (P(dr.pick(["sum", "avg", "max"])), R), "tokens": (S(t), S(t)), "H": (S(rid), R),
                    "Z": (Z(t), Z(t))}[focus]
        plg, pli = [], []
        for j in range(len(axes)):
            if j == fi:
                plg.append(ong); pli.append(oni)
            elif dr.coin(0.5):
                plg.append(R); pli.append(R)
            else:
                tt = dr.int(0, rid - 1)
                plg.append(S(tt)); pli.append(S(tt))
        plg, pli = tuple(plg), tuple(pli)
        gs = fit(dr, rid + 1, axes, sizes, [plg, pli + (R,)])
        V = dr.int(2, 6)
        return OpCase("embedding_backward", {"num_weights": V},
                      [TIn(tuple(gs), plg), TIn(tuple(gs[:-1]), pli, "int", hi=V)], axes, sizes)
    return g


# ------------------------------------------------------------------ the table
def _mix(*gens):
    def g(dr: Draw) -> OpCase:
        return dr.pick(list(gens))(dr)
    return g


SINGLE_OP: dict[str, Callable[[Draw], OpCase]] = {
    "replicate_any": _mix(gen_reduce("R"), gen_source("const"), gen_source("iota"), gen_indexing("R"),
                          gen_permute("R"), gen_slice("R"), gen_einsum("R"), gen_concat("R")),
    "ew_unary_replicate": gen_unary("R"),
    "ew_unary_shard": gen_unary("S"),
    "ew_binary_replicate": gen_binary("R"),
    "ew_binary_shard": gen_binary("S"),
    "ew_binary_shard_broadcast": gen_binary("Sb"),
    "partial_neg": _mix(gen_unary("P", ["neg"]), gen_unary("P")),
    "partial_scale": _mix(gen_unary("P", ["scale"]), gen_binary("PR")),
    "partial_div": gen_binary("PR"),
    "partial_add": gen_binary("PP"),
    "partial_sub": gen_binary("PP"),
    "partial_linear_map": _mix(gen_unary("P"), gen_permute("P"), gen_reshape("P"), gen_slice("P"), gen_concat("P"),
                               gen_reduce("P"), gen_rowwise("softmaxP"), gen_rowwise("smbwdP"), gen_rowwise("tri"),
                               gen_rowwise("pad"), gen_rowwise("flip"), gen_rowwise("expand"), gen_binary("mf0"),
                               gen_binary("where0"), gen_embedding_backward("P"), gen_rowwise("embedding")),
    "partial_plus_replicate_not_partial": gen_binary("PR"),
    "partial_avg_div_p_to_sum": _mix(gen_unary("avgdiv"), gen_binary("avgdiv")),
    "matmul_replicate": gen_matmul("R"),
    "matmul_col_parallel": gen_matmul("col"),
    "matmul_row_parallel": gen_matmul("row"),
    "matmul_batch_shard": _mix(gen_matmul("batch"), gen_matmul("vec")),
    "matmul_partial_lhs": gen_matmul("Plhs"),
    "matmul_partial_rhs": gen_matmul("Prhs"),
    "einsum_shard_free_index": _mix(gen_einsum("free"), gen_embedding_backward("H")),
    "einsum_shard_contracted_index": _mix(gen_einsum("contracted"), gen_embedding_backward("tokens")),
    "einsum_partial_operand": gen_einsum("partial"),
    "allreduce_sum_partial": gen_collective("ar_sum_P"),
    "allreduce_avg_partial_avg": gen_collective("ar_avg_Pavg"),
    "allreduce_max_partial_max": gen_collective("ar_max_Pmax"),
    "allreduce_avg_partial_sum": gen_collective("ar_avg_Psum"),
    "allreduce_sum_replicate": gen_collective("ar_sum_R"),
    "allreduce_avg_replicate": gen_collective("ar_avg_R"),
    "allreduce_max_replicate": gen_collective("ar_max_R"),
    "allreduce_nested_axes": gen_collective("ar_nested"),
    "allgather_shard": gen_collective("allgather"),
    "reduce_scatter_partial": gen_collective("reduce_scatter"),
    "all_to_all_reshard": gen_collective("all_to_all"),
    "broadcast_replicate": gen_collective("broadcast"),
    "reduce_sum_sharded_dim": _mix(gen_reduce("Ssum"), gen_rowwise("ce")),
    "reduce_mean_sharded_dim": _mix(gen_reduce("Smean"), gen_rowwise("ce")),
    "reduce_max_sharded_dim": gen_reduce("Smax"),
    "reduce_other_dim": gen_reduce("other"),
    "softmax_other_dim": _mix(gen_rowwise("softmax"), gen_rowwise("smbwd")),
    "rowwise_shard": _mix(*(gen_rowwise(k) for k in ("ce", "cebwd", "one_hot", "topk", "embedding", "index_select",
                                                     "tri", "pad", "flip", "expand"))),
    "permute_shard": gen_permute("S"),
    "reshape_shard_block": gen_reshape("S"),
    "slice_other_dim": _mix(gen_slice("other"), gen_slice("block")),
    "slice_block_to_shard": _mix(gen_slice("block"), gen_slice("badblock")),
    "concat_other_dim": gen_concat("other"),
    "zigzag_ew_unary": gen_unary("Z"),
    "zigzag_ew_binary": gen_binary("Z"),
    "zigzag_ew_binary_broadcast": gen_binary("Zb"),
    "zigzag_rowwise": _mix(gen_rowwise("Zrow"), gen_permute("Z"), gen_slice("Z"), gen_reduce("other"),
                           gen_matmul("Zbatch")),
    "zigzag_rowwise2": _mix(gen_matmul("Zbatch"), gen_einsum("Zfree"), gen_concat("Z")),
    "zigzag_reduce_sum": gen_reduce("Zsum"),
    "zigzag_reduce_max": gen_reduce("Zmax"),
    "zigzag_reduce_mean": gen_reduce("Zmean"),
    "zigzag_contraction": _mix(gen_matmul("Zrow"), gen_einsum("Zcontracted"), gen_embedding_backward("Z")),
    "zigzag_reshape": gen_reshape("Z"),
}

def _rankify(gen: Callable[[Draw], OpCase], p: float = 0.08) -> Callable[[Draw], OpCase]:
    """With probability p, make one numeric attribute depend on the rank, over any mesh axis, possibly inside a
    list (``dims`` entries, nested literals): ``v + rank.b``, ``v * (1 + rank.b)``, or the rank-free spelling
    ``v + rank.b - rank.b``.  The kernel must refuse a rank-dependent attribute it has no rule for (every rank
    runs the op with its own value, so a conclusion drawn from rank 0's value shows up as a disagreement)."""
    from ..ops import REGISTRY

    def g(dr: Draw) -> OpCase:
        case = gen(dr)
        if not dr.coin(p) or case.op in ("slice",):
            return case
        spec = REGISTRY[case.op]
        keys = [k for k, v in case.attrs.items() if k in spec.attrs and spec.attrs[k].kind in ("num", "dim", "dims", "tensor")
                and (isinstance(v, (int, float)) and not isinstance(v, bool) or isinstance(v, list))]
        if not keys:
            return case
        k = dr.pick(keys)
        b = dr.pick(list(case.axes))
        form = dr.pick(["{v}+rank.{b}", "({v})*(1+rank.{b})", "{v}+rank.{b}-rank.{b}"])

        def rk(v):
            if isinstance(v, list):
                if not v:
                    return v
                i = dr.int(0, len(v) - 1)
                return [rk(x) if j == i else x for j, x in enumerate(v)]
            if isinstance(v, float) and not v.is_integer():
                return v
            return form.format(v=int(v), b=b) if isinstance(v, (int, float)) else v
        attrs = dict(case.attrs)
        attrs[k] = rk(attrs[k])
        case.attrs = attrs
        case.note = f"rank-dependent {k}"
        return case
    return g


from .gens_layout import LAYOUT_GENERATORS  # noqa: E402  (layout rules real code needs; they import Draw, fit)

from .gens_unitdims import UNITDIM_GENERATORS  # noqa: E402  (size-1 dims beside a shard, logical-shape hints)
from .gens_interleave_reshape import INTERLEAVE_RESHAPE_GENERATORS  # noqa: E402  (Megatron's batch x heads merge)

from .gens_fsdp import FSDP_GENERATORS  # noqa: E402  (FSDP2's reduce-scatter(avg) of partial sums)
from .gens_fsdp_nested import FSDP_NESTED_GENERATORS  # noqa: E402  (the same inside TP's shards)

from .gens_interleave import INTERLEAVE_GENERATORS  # noqa: E402  (fused tensors sharded per part)
from .gens_concat_groups import CONCAT_GROUPS_GENERATORS  # noqa: E402  (the same, parts of different sizes)
from .gens_reversed_blocks import REVERSED_BLOCKS_GENERATORS  # noqa: E402  (rank r slicing block p-1-r)
from .gens_microbatch import MICROBATCH_GENERATORS  # noqa: E402  (micro-batches of a data-parallel shard)

for _k, _g in [*LAYOUT_GENERATORS.items(), *UNITDIM_GENERATORS.items(), *INTERLEAVE_RESHAPE_GENERATORS.items(), *FSDP_GENERATORS.items(),
               *INTERLEAVE_GENERATORS.items(), *FSDP_NESTED_GENERATORS.items(), *CONCAT_GROUPS_GENERATORS.items(),
               *REVERSED_BLOCKS_GENERATORS.items(), *MICROBATCH_GENERATORS.items()]:
    SINGLE_OP[_k] = _mix(SINGLE_OP[_k], _g) if _k in SINGLE_OP else _g

SINGLE_OP = {k: _rankify(v) for k, v in SINGLE_OP.items()}
SINGLE_OP["replicate_any"] = _rankify(SINGLE_OP["replicate_any"], 0.3)

#: every single-op generator, to draw from the whole space at once (``--rule any``)
ALL_SINGLE = list(SINGLE_OP.values())
