"""Conformance generator for the equality step ``layout_map_equal`` (kernel/layout_map.py).

Draws a base tensor with unit dims (one head, one sample), a random chain of reshape / permute / expand / slice /
flip over it, and a second chain: the same map spelled another way -- a round trip through a reshape that adds
unit dims and a permute that moves only them, two reshapes merged into one, two permutes composed -- or a near
miss: two non-unit dims swapped in a permute, a merge factored the other way ([a, b] for [b, a]), one more flip,
a slice one row off, another base of the same shape; or an independent random chain of the same output shape.
Whatever the prover calls equal is evaluated on random inputs.
"""
from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING

from ..kernel.expr import ExprError, Exprs

if TYPE_CHECKING:  # eqgen imports this module at its end
    from .gens import Draw

__all__ = ["LAYOUT_MAP_GENERATORS", "gen_layout_map"]


def _factor(n: int, dr: Draw) -> list[int]:
    """A random factorization of n, with unit dims sprinkled in."""
    out, m = [], n
    while m > 1:
        ds = [d for d in range(2, m + 1) if m % d == 0]
        d = dr.pick(ds)
        out.append(d)
        m //= d
    dr.rng.shuffle(out)
    for _ in range(dr.int(0, 2)):
        out.insert(dr.int(0, len(out)), 1)
    return out or [1]


def _step(X: Exprs, dr: Draw, t: int) -> int:
    s = X[t].shape
    k = dr.pick(["reshape", "reshape", "permute", "permute", "expand", "slice", "flip"])
    if k == "reshape":
        return X.mk("reshape", {"shape": tuple(_factor(prod(s), dr))}, [t])
    if k == "permute" and len(s) > 1:
        return X.mk("permute", {"dims": tuple(int(v) for v in dr.rng.permutation(len(s)))}, [t])
    if k == "expand" and 1 in s:
        i = s.index(1)
        return X.mk("expand", {"shape": tuple(2 if j == i else n for j, n in enumerate(s))}, [t])
    if k == "slice" and s and max(s) > 1:
        d = next(j for j, n in enumerate(s) if n > 1)
        return X.mk("slice", {"dim": d, "start": 1, "end": s[d], "step": 1}, [t])
    if k == "flip" and s:
        return X.mk("flip", {"dims": (dr.int(0, len(s) - 1),)}, [t])
    return t


def _unit_round_trip(X: Exprs, dr: Draw, t: int) -> int:
    """reshape adding unit dims, a permute moving only unit dims, reshape back: the same map."""
    s = list(X[t].shape)
    u = list(s)
    for _ in range(dr.int(1, 2)):
        u.insert(dr.int(0, len(u)), 1)
    y = X.mk("reshape", {"shape": tuple(u)}, [t])
    units = [j for j, n in enumerate(u) if n == 1]
    perm = list(range(len(u)))
    if len(units) > 1:
        moved = list(units)
        dr.rng.shuffle(moved)
        for a, b in zip(units, moved):
            perm[a] = b
        y = X.mk("permute", {"dims": tuple(perm)}, [y])
    return X.mk("reshape", {"shape": tuple(s)}, [y])


def gen_layout_map(dr: Draw, seed: int):
    from .eqgen import _check_pair, _leaf

    X = Exprs()
    try:
        base = _leaf(X, dr, tuple(dr.pick([1, 1, 2, 3, 4]) for _ in range(dr.int(2, 4))))
        chain = [base]
        for _ in range(dr.int(1, 4)):
            chain.append(_step(X, dr, chain[-1]))
        a = chain[-1]
        u = dr.rng.random()
        if u < 0.3:  # a unit-dim round trip inserted somewhere, then the rest of the chain replayed
            k = dr.int(0, len(chain) - 1)
            b = _unit_round_trip(X, dr, chain[k])
            for e in chain[k + 1:]:
                b = X.mk(X[e].op, X[e].attr_dict(), [b])
        elif u < 0.42:  # the whole chain as one reshape when it is one (else a near miss of a different map)
            b = X.mk("reshape", {"shape": X[a].shape}, [base]) if prod(X[a].shape) == prod(X[base].shape) else base
        elif u < 0.52:  # two reshapes merged, two permutes composed, or the last op dropped
            b = base
            ops = chain[1:]
            i = 0
            while i < len(ops):
                e = X[ops[i]]
                nxt = X[ops[i + 1]] if i + 1 < len(ops) else None
                if nxt is not None and e.op == nxt.op == "reshape":
                    b, i = X.mk("reshape", nxt.attr_dict(), [b]), i + 2
                elif nxt is not None and e.op == nxt.op == "permute":
                    p, q = e.attr_dict()["dims"], nxt.attr_dict()["dims"]
                    b, i = X.mk("permute", {"dims": tuple(p[j] for j in q)}, [b]), i + 2
                else:
                    b, i = X.mk(e.op, e.attr_dict(), [b]), i + 1
        elif u < 0.62:  # a permute with two non-unit dims swapped, or one more flip / a slice one row off
            s = X[a].shape
            big = [j for j, n in enumerate(s) if n > 1]
            if len(big) >= 2 and dr.coin():
                perm = list(range(len(s)))
                i, j = dr.pick(big), dr.pick(big)
                perm[i], perm[j] = perm[j], perm[i]
                b = X.mk("permute", {"dims": tuple(perm)}, [a])
            elif big:
                b = X.mk("flip", {"dims": (dr.pick(big),)}, [a])
            else:
                b = a
        elif u < 0.7:  # another base of the same shape, the same chain
            b = _leaf(X, dr, X[base].shape)
            for e in chain[1:]:
                b = X.mk(X[e].op, X[e].attr_dict(), [b])
        elif u < 0.78:  # a merge factored the other way, then reshaped to the same shape
            s = X[a].shape
            f = _factor(prod(s), dr)
            b = X.mk("reshape", {"shape": s}, [X.mk("permute", {"dims": tuple(reversed(range(len(f))))},
                                                     [X.mk("reshape", {"shape": tuple(f)}, [a])])])
        else:  # an independent random chain, reshaped to the same shape
            b = base
            for _ in range(dr.int(1, 4)):
                b = _step(X, dr, b)
            if prod(X[b].shape) != prod(X[a].shape):
                b = a if dr.coin(0.3) else base
            b = X.mk("reshape", {"shape": X[a].shape}, [b]) if prod(X[b].shape) == prod(X[a].shape) else b
        if dr.coin(0.2):  # under the same elementwise op on both sides
            a, b = X.mk("exp", {}, [a]), X.mk("exp", {}, [b])
        if dr.coin(0.5):
            a, b = b, a
    except (ExprError, ValueError, KeyError, IndexError) as exc:
        from .core import Result

        return Result("skip", detail=str(exc)), ""
    return _check_pair(X, a, b, seed), f"{X.show(a, 8)} vs {X.show(b, 8)}"


#: rule id -> generator, merged into ``eqgen.EQUALITY``
LAYOUT_MAP_GENERATORS = {"layout_map_equal": gen_layout_map}
