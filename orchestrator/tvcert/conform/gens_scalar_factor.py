"""Conformance generator for the equality step ``scalar_factor_commutes`` (kernel/scalar_factor.py).

Draws a 0-d factor -- a scalar leaf, a full sum, a count ``cast(sum(labels != c))``, ``p / count`` (DDP's seed of
a global-token-count loss), a product of two -- and a pair that moves it: ``f(s*x)`` or ``f(x/s)`` against
``s*f(x)`` / ``f(x)/s`` through a random op (homogeneous or not: ``eqgen._linear_fn``), ``where(m, s*x, 0)``,
a matmul of two scaled operands, the whole DDP gradient chain (``log_softmax_backward`` of a masked seed, summed,
divided by p against the logical gradient divided by the count), and near misses: the factor only on one side,
another factor, a factor of the tensor's shape or per row (not 0-d: a value that differs per index, what a per-rank
count would be), a nonzero else branch, the wrong p, a divisor that is itself a quotient.  Whatever the prover
calls equal is evaluated on random inputs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..kernel.expr import ExprError, Exprs

if TYPE_CHECKING:  # eqgen imports this module at its end
    from .gens import Draw

__all__ = ["SCALAR_FACTOR_GENERATORS", "gen_scalar_factor"]


def _const(X: Exprs, v, shape=()):
    return X.mk("const", {"value": v, "shape": tuple(shape), "dtype": "float"}, [])


def _real(X: Exprs, lab):
    """labels != 0 (0 the padding here)"""
    return X.mk("ne", {}, [lab, X.mk("const", {"value": 0, "shape": (), "dtype": "int"}, [])])


def _count(X: Exprs, dr: Draw, leaf):
    lab = leaf(X, dr, (dr.int(2, 4),), "int")
    return X.mk("cast", {"dtype": "float"}, [X.mk("sum", {"dims": (0,), "keepdim": False}, [_real(X, lab)])])


def _factor(X: Exprs, dr: Draw, leaf):
    k = dr.int(0, 4)
    if k == 0:
        return leaf(X, dr, ())
    if k == 1:
        return X.mk("sum", {"dims": (0, 1), "keepdim": False}, [leaf(X, dr, (2, 2))])
    if k == 2:
        return _count(X, dr, leaf)
    if k == 3:
        return X.mk("div", {}, [X.mk("scale", {"value": dr.pick([2, 4])}, [_const(X, 1)]), _count(X, dr, leaf)])
    return X.mk("mul", {}, [leaf(X, dr, ()), leaf(X, dr, ())])


def _times(X, x, s, div=False):
    return X.mk("div" if div else "mul", {}, [x, s])


def _ddp_chain(X: Exprs, dr: Draw, leaf):
    """DDP's gradient of sum(ce) / n * p, all-reduce averaged, against the logical gradient of sum(ce) / n."""
    b, c = dr.int(2, 3), dr.int(2, 3)
    lab = leaf(X, dr, (b,), "int")
    keep = X.mk("reshape", {"shape": (b, 1)}, [_real(X, lab)])
    n = X.mk("cast", {"dtype": "float"}, [X.mk("sum", {"dims": (0,), "keepdim": False}, [_real(X, lab)])])
    a, lsm = leaf(X, dr, (b, c)), X.mk("log_softmax", {"dim": 1}, [leaf(X, dr, (b, c))])
    p = dr.pick([2, 4])
    u = dr.rng.random()
    q = p if u > 0.15 else dr.pick([1, 2 * p])  # near miss: seed scaled by another p
    n_par = n if u < 0.15 or u > 0.3 else _count(X, dr, leaf)  # near miss: another count
    seed = X.mk("div", {}, [X.mk("scale", {"value": q}, [_const(X, 1)]), n_par])
    seed_par = X.mk("where", {}, [keep, seed, _const(X, 0)])
    grad = lambda t: X.mk("reshape", {"shape": (c,)}, [X.mk("sum", {"dims": (0,), "keepdim": True}, [
        X.mk("log_softmax_backward", {"dim": 1}, [t, lsm])])])
    par = X.mk("div", {}, [grad(X.mk("mul", {}, [a, seed_par])), _const(X, p)])
    log = grad(X.mk("div", {}, [X.mk("mul", {}, [a, X.mk("where", {}, [keep, _const(X, 1), _const(X, 0)])]), n]))
    return par, log


def gen_scalar_factor(dr: Draw, seed: int):
    from .eqgen import _check_pair, _leaf, _linear_fn

    X = Exprs()
    try:
        kind = dr.pick([0, 0, 1, 1, 2, 3, 4])
        if kind == 4:
            a, b = _ddp_chain(X, dr, _leaf)
        else:
            shape = tuple(dr.int(2, 3) for _ in range(2))
            x = _leaf(X, dr, shape)
            s = _factor(X, dr, _leaf)
            div = dr.coin(0.3)
            u = dr.rng.random()
            t = s  # the factor on the other side
            if u < 0.1:
                t = _factor(X, dr, _leaf)  # another factor
            elif u < 0.2:
                s = t = _leaf(X, dr, shape)  # a "factor" of the tensor's shape (one value per index)
            elif u < 0.32:
                s = t = _leaf(X, dr, (shape[0], 1))  # one value per row (what a per-rank value would be)
            elif u < 0.36:
                t = X.mk("scale", {"value": 2}, [s])
            if kind == 0:  # through one or two random ops
                fns = [_linear_fn(X, dr, shape)]
                a0 = _times(X, x, s, div)
                a, b = fns[0](a0), fns[0](x)
                if dr.coin(0.3):
                    g = _linear_fn(X, dr, X[a].shape)
                    a, b = g(a), g(b)
                b = _times(X, b, t, div)
            elif kind == 1:  # where(m, s*x, 0) against where(m, x, 0) * s
                m = _leaf(X, dr, shape, "int")
                z = _const(X, 0 if dr.coin(0.65) else dr.pick([1, -2]))
                first = dr.coin()
                br = _times(X, x, s, div)
                a = X.mk("where", {}, [m, br, z] if first else [m, z, br])
                b = _times(X, X.mk("where", {}, [m, x, z] if first else [m, z, x]), t, div)
            elif kind == 2 and X[s].shape != ():  # a per-row / per-index "factor" of the right operand: no factor
                x = _leaf(X, dr, (shape[0], shape[0]))
                w = _leaf(X, dr, (shape[0], shape[0]))
                t = _leaf(X, dr, (shape[0], 1 if X[s].shape[1] == 1 else shape[0]))
                a = X.mk("matmul", {}, [x, _times(X, w, t, div)])
                b = _times(X, X.mk("matmul", {}, [x, w]), t, div)
            elif kind == 2:  # matmul of two scaled operands
                w = _leaf(X, dr, (shape[1], 2))
                s2 = _factor(X, dr, _leaf)
                a = X.mk("matmul", {}, [_times(X, x, s, div), _times(X, w, s2)])
                b = _times(X, _times(X, X.mk("matmul", {}, [x, w]), t, div), s2)
            else:  # a divisor that is a quotient, a shared factor of an add, a scalar broadcast by expand
                y = _leaf(X, dr, shape)
                v = dr.int(0, 2)
                if v == 0:
                    r = _factor(X, dr, _leaf)
                    a = X.mk("div", {}, [x, X.mk("div", {}, [s, r])])
                    b = X.mk("mul", {}, [X.mk("div", {}, [x, t]), r])
                elif v == 1:
                    a = X.mk("add", {}, [_times(X, x, s, div), _times(X, y, t, div)])
                    b = _times(X, X.mk("add", {}, [x, y]), s, div)
                else:
                    a = X.mk("mul", {}, [x, X.mk("expand", {"shape": shape}, [_times(X, _const(X, 1), s, div)])])
                    b = _times(X, x, t, div)
        if dr.coin(0.2):  # under the same elementwise op on both sides
            a, b = X.mk("exp", {}, [a]), X.mk("exp", {}, [b])
        if dr.coin(0.5):
            a, b = b, a
    except (ExprError, ValueError, KeyError, IndexError) as exc:
        from .core import Result

        return Result("skip", detail=str(exc)), ""
    return _check_pair(X, a, b, seed), f"{X.show(a, 6)} vs {X.show(b, 6)}"


#: rule id -> generator, merged into ``eqgen.EQUALITY``
SCALAR_FACTOR_GENERATORS = {"scalar_factor_commutes": gen_scalar_factor}
