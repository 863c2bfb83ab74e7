r"""One spelling for sums and means, so that equal reductions written differently compare equal.

Real code writes the same loss several ways: ``x.mean()``, ``x.sum() / x.numel()``, ``x.mean(1).mean(0)``,
``x.sum(0).sum(0)``.  :func:`reduction_normal_form` rewrites a float ``sum`` / ``mean`` into
``c * sum(x, D)`` with ``D`` the union of the reduced dims (as dims of ``x``) and ``c`` an exact rational:

* a mean over dims ``D`` is the sum over ``D`` divided by the number of reduced elements
  (``NormaliseReductions.mean_as_scaled_sum``);
* a sum of a sum is one sum over the union of the dims, the inner dims mapped back to the input's
  (``NormaliseReductions.sum_of_sum``, Fubini over a product of index ranges); merged only when both keep
  their dims or neither does (otherwise the result's shape is not a single sum's);
* a scalar factor leaves a sum (``NormaliseReductions.sum_scale``; the factor itself is read by
  :meth:`Prover.norm`, whose steps are ``scale_commutes_linear``'s);
* a chain of expands and reshapes over a scalar is one expand of the scalar (the backward of a sum of sums
  broadcasts its seed several times).

* a sum or mean over unit dims only is a reshape (``\sum_(0 <= k < 1) F k = F 0``).

The rule id is ``reduction_normal_form``; its Coq theorem is the conjunction of these.  Int sums are merged
but get no scalar factor or count (an int sum divided by a float constant is not the int sum's dtype).
"""
from __future__ import annotations

from fractions import Fraction
from typing import Callable

from .expr import Exprs
from .smt import scalar_const

SCALAR_WRAPPERS = ("scale", "neg", "mul", "div")


def _const(X: Exprs, v: int) -> int:
    return X.mk("const", {"value": v, "shape": (), "dtype": "float"}, [])


def scaled(X: Exprs, c: Fraction, e: int) -> int:
    """``c * e`` with ``c`` exact: ``(e / den) * num`` (each constant an integer, so no rounding)."""
    if c == 1:
        return e
    out = e if c.denominator == 1 else X.mk("div", {}, [e, _const(X, c.denominator)])
    return out if c.numerator == 1 else X.mk("mul", {}, [out, _const(X, c.numerator)])


def merged_sum(X: Exprs, core: int, dims: tuple[int, ...], keepdim: bool) -> int:
    """``sum(core, dims, keepdim)``, folded into ``core`` when it is itself a sum and the shapes allow it."""
    c = X[core]
    if not dims and not keepdim:
        return core  # a sum over no dims is the identity (ops/reduce.py)
    if c.op == "sum":
        at = c.attr_dict()
        inner, k1 = tuple(at["dims"]), bool(at["keepdim"])
        x = c.args[0]
        n = len(X[x].shape)
        if not k1 and not keepdim:
            rest = [d for d in range(n) if d not in inner]
            return X.mk("sum", {"dims": tuple(sorted(set(inner) | {rest[d] for d in dims})), "keepdim": False}, [x])
        if k1 and keepdim:
            return X.mk("sum", {"dims": tuple(sorted(set(inner) | set(dims))), "keepdim": True}, [x])
    return X.mk("sum", {"dims": tuple(dims), "keepdim": keepdim}, [core])


def reduction_normal_form(X: Exprs, i: int, rnorm: Callable[[int], int],
                          norm: Callable[[int], tuple[Fraction, int]]) -> int:
    """``i`` with every float sum / mean at its top (and under scalar factors) in normal form."""
    e = X[i]
    if not e.args:
        return i
    if e.op in SCALAR_WRAPPERS:
        if e.dtype != "float":
            return i
        # c * r(x): only the tensor operand is rewritten; the scalar is read by norm afterwards
        big = [k for k, a in enumerate(e.args) if X[a].shape == e.shape and scalar_const(X, a) is None]
        if len(big) != 1 or any(X[a].shape != () for k, a in enumerate(e.args) if k != big[0]):
            return i
        k = big[0]
        new = rnorm(e.args[k])
        if new == e.args[k]:
            return i
        args = list(e.args)
        args[k] = new
        return X.mk(e.op, e.attr_dict(), args)
    if e.op in ("expand", "reshape"):
        return _scalar_broadcast(X, i)
    if e.op not in ("sum", "mean"):
        return i
    a = e.args[0]
    at = e.attr_dict()
    dims, keepdim = tuple(at["dims"]), bool(at["keepdim"])
    if all(X[a].shape[d] == 1 for d in dims):  # a reduction over unit dims only is a reshape
        x = rnorm(a)
        n = _numel(X[a].shape)
        while X[x].op in ("reshape", "expand") and _numel(X[X[x].args[0]].shape) == n:
            x = X[x].args[0]  # same element count: the layers only insert / drop unit dims
        out = X.mk("reshape", {"shape": e.shape}, [x])
        return i if out == i or X[out].dtype != e.dtype else out
    if X[a].dtype != "float":  # int sums: merged only (no scalar factor, no count)
        if e.op != "sum":
            return i
        out = merged_sum(X, rnorm(a), dims, keepdim)
        return i if out == i else out
    c, core = norm(rnorm(a))
    if e.op == "mean":
        n = 1
        for d in dims:
            n *= X[a].shape[d]
        if n == 0:
            return i  # a mean over an empty dim is undefined; not rewritten
        c = c / n
    out = scaled(X, c, merged_sum(X, core, dims, keepdim))
    return i if out == i else out


def _scalar_broadcast(X: Exprs, i: int) -> int:
    """A chain of expands and reshapes over a scalar ``s`` is ``expand(s, shape)``: every entry is ``s``
    (``NormaliseReductions.broadcast_of_scalar``)."""
    e = X[i]
    j = i
    while X[j].op in ("expand", "reshape"):
        j = X[j].args[0]
    if X[j].shape != () or j == e.args[0] and e.op == "expand":
        return i
    return X.mk("expand", {"shape": e.shape}, [j])


def _numel(shape) -> int:
    n = 1
    for v in shape:
        n *= v
    return n


COMMON_FACTOR = "scale_common_factor"
COMMON_FACTOR_OPS = ("add", "sub", "concat")  # jointly homogeneous in all operands (Normalise2.scale_common_factor)


def common_factor(X: Exprs, i: int, norm: Callable[[int], tuple[Fraction, int]]) -> tuple[Fraction, int] | None:
    """``(c1, op(A1, (c2/c1) A2, ..))`` for ``op(c1 A1, c2 A2, ..)`` a float add / sub / concat, or None.

    A data-parallel mean loss carries its local ``1/count`` through the whole backward; where two paths meet
    (the residual add, the complex RoPE's ``ac - bd``, a concat of halves) their factors differ, so the
    equal-factor step of :meth:`Prover.norm` stops there.  Only the first factor moves out (``c1 != 0``); the
    ratios stay inside as exact constants, so two spellings compare equal only when their ratios agree
    (``Normalise2.scale_common_factor``)."""
    e = X[i]
    if e.op not in COMMON_FACTOR_OPS or not e.args or any(X[a].dtype != "float" for a in (i, *e.args)):
        return None
    if e.op != "concat" and (len(e.args) != 2 or any(X[a].shape != e.shape for a in e.args)):
        return None
    ns = [norm(a) for a in e.args]
    c0 = ns[0][0]
    if c0 == 0 or all(c == 1 for c, _ in ns):
        return None
    return c0, X.mk(e.op, e.attr_dict(), [scaled(X, c / c0, core) for c, core in ns])
