"""Generators for the equality steps (kernel/equality.py): pairs of logical expressions, a proof attempt, and
a numeric check of every proved pair.

* ``scale_commutes_linear``: for every op with a flag (and ops without one), ``op(c*x, ...)`` against
  ``c*op(x, ...)`` (and nested, and with the wrong factor): "scale through the op".
* ``layout_commutes_pointwise``: a reshape / permute of a pointwise op against the pointwise op of the
  laid-out operands, full reductions of laid-out operands, and near misses (another permutation, a non-
  pointwise op in between).
* ``elementwise_smt``: algebraic identities and non-identities of pointwise ops (random trees, rewritten).
* ``congruence``: an op applied to arguments proved equal by another step, or to arguments that differ.

A pair the prover calls equal is evaluated on random inputs (exact rationals with function tables; float64 when
an exact run divides by zero, where a NaN on one side only is a disagreement); any difference is a soundness bug.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Callable

import numpy as np

from ..kernel.equality import Prover
from ..kernel.expr import ExprError, Exprs
from ..ops import Ctx
from ..interp import random_value
from .core import Result, _close, eval_expr, rand_values
from .gens import Draw


def _check_pair(X: Exprs, a: int, b: int, seed: int, ranges: dict | None = None) -> Result:
    """``ranges``: int leaf name -> (lo, hi), the plan contract (values in [lo, hi)), given to the prover and drawn
    from as the interpreter draws plan inputs (interp.random_value: lo < 0 is a padding value among [0, hi))."""
    ranges = ranges or {}
    pv = Prover(X, ranges=ranges)
    try:
        ok = pv.equal(a, b)
    except Exception as exc:  # a prover crash is reported
        import traceback

        return Result("crash", detail=f"prover: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")
    if not ok:
        return Result("refused", sorted(pv.used), "not proved")
    rules = sorted(pv.used)
    leaves = [i for i, e in enumerate(X.nodes) if e.op == "input"]
    for exact in (True, False):
        rng = np.random.default_rng(seed)
        ctx = Ctx(exact=exact, seed=seed)
        vals = {}
        for i in leaves:
            e = X[i]
            r = ranges.get(e.attr_dict()["name"]) if e.dtype == "int" else None
            vals[i] = random_value(e.shape, "int", rng, ctx, r[1], r[0]) if r else \
                rand_values(e.shape, e.dtype, rng, exact, hi=4)
        outside = []
        for side in (a, b):
            try:
                outside.append(eval_expr(X, side, vals, ctx))
            except (ValueError, ZeroDivisionError, ArithmeticError) as exc:
                outside.append(exc)
        if exact and all(isinstance(v, Exception) for v in outside):  # both undefined (where is strict: both
            return Result("skip", rules, f"eval: outside both domains: {outside[0]}")  # branches are evaluated)
        if any(isinstance(v, Exception) for v in outside):
            if exact:
                continue  # outside exact semantics on one side (a division by zero): judge by float64
            return Result("skip", rules, f"eval: {next(v for v in outside if isinstance(v, Exception))}")
        va, vb = outside
        if not _close(np.asarray(va), np.asarray(vb), exact):
            return Result("DISAGREE", rules, f"proved {X.show(a, 5)} = {X.show(b, 5)}, but they differ "
                                             f"({'exact' if exact else 'float64'})")
        return Result("ok", rules)
    return Result("skip", rules, "not executable")


# ------------------------------------------------------------------ building blocks
def _leaf(X, dr: Draw, shape, dtype="float"):
    _leaf.k = getattr(_leaf, "k", 0) + 1
    return X.leaf(f"v{_leaf.k}", tuple(shape), dtype)


def _c(dr: Draw):
    return dr.pick([2, 3, -1, 0.5, -0.25, 4, 1.5, 0.75])


def _linear_fn(X: Exprs, dr: Draw, s: tuple) -> Callable[[int], int]:
    """One op applied to its first argument (flagged homogeneous or not), with random attributes and the other
    operands fixed: the same function for both sides of a pair."""
    n = len(s)
    choices = ["reshape", "permute", "slice", "sum", "mean", "expand", "triu", "tril", "pad", "softmax_backward",
               "log_softmax_backward", "matmul", "einsum", "embedding_backward", "softmax", "log_softmax", "exp",
               "add_scalar", "amax", "relu", "square", "cast_int", "pad_nonzero", "neg", "masked_fill", "flip"]
    op = dr.pick(choices)
    if op == "reshape":
        return lambda t: X.mk("reshape", {"shape": (int(np.prod(s)),)}, [t])
    if op == "permute" and n >= 2:
        perm = tuple(int(v) for v in dr.rng.permutation(n))
        return lambda t: X.mk("permute", {"dims": perm}, [t])
    if op == "slice" and n >= 1 and s[0] >= 2:
        return lambda t: X.mk("slice", {"dim": 0, "start": 1, "end": s[0], "step": 1}, [t])
    if op == "sum" and n:
        at = {"dims": (dr.int(0, n - 1),), "keepdim": dr.coin()}
        return lambda t: X.mk("sum", at, [t])
    if op == "mean" and n:
        return lambda t: X.mk("mean", {"dims": (0,), "keepdim": False}, [t])
    if op == "expand":
        return lambda t: X.mk("expand", {"shape": (2,) + tuple(s)}, [t])
    if op in ("triu", "tril") and n >= 2:
        at = {"diagonal": dr.int(-1, 1)}
        return lambda t: X.mk(op, at, [t])
    if op == "pad":
        return lambda t: X.mk("pad", {"pads": tuple([1, 0] * n), "value": 0}, [t])
    if op == "pad_nonzero":
        at = {"pads": tuple([0, 1] * n), "value": dr.pick([1, -2])}
        return lambda t: X.mk("pad", at, [t])
    if op in ("softmax_backward", "log_softmax_backward") and n:
        o = _leaf(X, dr, s)
        return lambda t: X.mk(op, {"dim": n - 1}, [t, o])
    if op in ("softmax", "log_softmax") and n:
        return lambda t: X.mk(op, {"dim": n - 1}, [t])
    if op == "matmul" and n == 2:
        w = _leaf(X, dr, (s[1], 2))
        if dr.coin():
            return lambda t: X.mk("matmul", {}, [t, w])
        w2 = _leaf(X, dr, (2, s[0]))
        return lambda t: X.mk("matmul", {}, [w2, t])
    if op == "einsum" and n == 2:
        w = _leaf(X, dr, (s[1], 3))
        return lambda t: X.mk("einsum", {"equation": "ij,jk->ik"}, [t, w])
    if op == "embedding_backward" and n == 2:
        ids = _leaf(X, dr, (s[0],), "int")
        return lambda t: X.mk("embedding_backward", {"num_weights": 4}, [t, ids])
    if op == "amax" and n:
        return lambda t: X.mk("amax", {"dims": (0,), "keepdim": False}, [t])
    if op == "add_scalar":
        return lambda t: X.mk("add_scalar", {"value": 1}, [t])
    if op == "masked_fill":
        m = _leaf(X, dr, s, "int")
        at = {"value": dr.pick([0, 0, 1])}
        return lambda t: X.mk("masked_fill", at, [t, m])
    if op == "cast_int":
        return lambda t: X.mk("cast", {"dtype": "int"}, [t])
    if op == "flip" and n:
        return lambda t: X.mk("flip", {"dims": (0,)}, [t])
    if op in ("exp", "relu", "square", "neg"):
        return lambda t: X.mk(op, {}, [t])
    return lambda t: X.mk("neg", {}, [t])


def _scaled(X, x, c, how):
    if how == 0:
        return X.mk("scale", {"value": c}, [x])
    if how == 1:
        return X.mk("mul", {}, [x, X.mk("const", {"value": c, "shape": (), "dtype": "float"}, [])])
    return X.mk("div", {}, [x, X.mk("const", {"value": 1 / c if c not in (3, 0.75, 1.5) else c, "shape": (),
                                               "dtype": "float"}, [])])


def gen_scale(dr: Draw, seed: int):
    X = Exprs()
    shape = tuple(dr.int(2, 3) for _ in range(dr.int(1, 2)))
    if dr.coin(0.15):  # the cast bug: c*int(x/c) against int(x), and into float from int
        c = dr.pick([4, 2, 3])
        x = _leaf(X, dr, shape)
        if dr.coin():
            a = X.mk("scale", {"value": c}, [X.mk("cast", {"dtype": "int"}, [X.mk("scale", {"value": 1 / c}, [x])])])
            b = X.mk("cast", {"dtype": "int"}, [x])
        else:
            xi = _leaf(X, dr, shape, "int")
            k = dr.pick([3, -2, 0.5])
            a = X.mk("cast", {"dtype": "float"}, [X.mk("scale", {"value": k}, [xi])])
            b = X.mk("scale", {"value": k}, [X.mk("cast", {"dtype": "float"}, [xi])])
        return _check_pair(X, a, b, seed), f"{X.show(a, 6)} vs {X.show(b, 6)}"
    x = _leaf(X, dr, shape)
    c = _c(dr)
    depth = dr.int(1, 2)
    inner = _scaled(X, x, c, dr.int(0, 2))
    try:
        a = inner
        b = x
        for _ in range(depth):
            fn = _linear_fn(X, dr, X[a].shape)
            a, b = fn(a), fn(b)
        c2 = c if dr.coin(0.8) else dr.pick([c * 2, -c, 1])
        b = _scaled(X, b, c2, dr.int(0, 1))
    except ExprError as exc:
        return Result("skip", detail=str(exc)), ""
    if dr.coin():
        a, b = b, a
    return _check_pair(X, a, b, seed), f"{X.show(a, 6)} vs {X.show(b, 6)}"


POINTWISE = ["add", "sub", "mul", "maximum", "div"]
UNARY_PW = ["exp", "neg", "relu", "tanh", "square", "abs"]


def gen_layout(dr: Draw, seed: int):
    X = Exprs()
    shape = tuple(dr.int(2, 3) for _ in range(dr.int(2, 3)))
    x, y = _leaf(X, dr, shape), _leaf(X, dr, shape)
    f = dr.pick(POINTWISE)
    u = dr.pick(UNARY_PW)
    n = len(shape)
    try:
        if dr.coin(0.5):
            perm = tuple(int(v) for v in dr.rng.permutation(n))
            perm2 = perm if dr.coin(0.8) else tuple(int(v) for v in dr.rng.permutation(n))
            L = lambda t, p=perm: X.mk("permute", {"dims": p}, [t])
            L2 = lambda t, p=perm2: X.mk("permute", {"dims": p}, [t])
        else:
            tgt = (int(np.prod(shape)),) if dr.coin() else (shape[0], int(np.prod(shape[1:])))
            tgt2 = tgt if dr.coin(0.8) else tuple(reversed(tgt))
            L = lambda t, s=tgt: X.mk("reshape", {"shape": s}, [t])
            L2 = lambda t, s=tgt2: X.mk("reshape", {"shape": s}, [t])
        if dr.coin(0.2):
            mid = lambda t: X.mk("softmax", {"dim": n - 1}, [t])  # not pointwise: must not be pushed through
        else:
            mid = lambda t: X.mk(u, {}, [t])
        a = L(mid(X.mk(f, {}, [x, y])))
        b = mid(X.mk(f, {}, [L2(x), L2(y)])) if dr.coin(0.6) else X.mk(f, {}, [mid(L2(x)), L2(y)])
        if dr.coin(0.3):  # a full reduction does not see a layout
            red = dr.pick(["sum", "amax", "mean"])
            a = X.mk(red, {"dims": tuple(range(len(X[a].shape))), "keepdim": False}, [a])
            b0 = mid(X.mk(f, {}, [x, y])) if dr.coin(0.8) else mid(X.mk(f, {}, [y, x]))
            b = X.mk(red, {"dims": tuple(range(n)), "keepdim": False}, [b0])
    except ExprError as exc:
        return Result("skip", detail=str(exc)), ""
    return _check_pair(X, a, b, seed), f"{X.show(a, 6)} vs {X.show(b, 6)}"


def _tree(X, dr: Draw, leaves, depth):
    if depth == 0 or dr.coin(0.25):
        return dr.pick(leaves)
    k = dr.rng.random()
    if k < 0.55:
        op = dr.pick(["add", "sub", "mul", "maximum", "minimum", "div"])
        return X.mk(op, {}, [_tree(X, dr, leaves, depth - 1), _tree(X, dr, leaves, depth - 1)])
    if k < 0.85:
        op = dr.pick(["neg", "exp", "relu", "abs", "square", "tanh", "sigmoid"])
        return X.mk(op, {}, [_tree(X, dr, leaves, depth - 1)])
    op = dr.pick(["scale", "add_scalar"])
    return X.mk(op, {"value": _c(dr)}, [_tree(X, dr, leaves, depth - 1)])


IDENTITIES = [
    lambda X, a, b, c: (X.mk("mul", {}, [X.mk("add", {}, [a, b]), c]),
                        X.mk("add", {}, [X.mk("mul", {}, [a, c]), X.mk("mul", {}, [b, c])])),
    lambda X, a, b, c: (X.mk("add", {}, [X.mk("maximum", {}, [a, b]), X.mk("minimum", {}, [a, b])]), X.mk("add", {}, [a, b])),
    lambda X, a, b, c: (X.mk("sub", {}, [X.mk("relu", {}, [a]), X.mk("relu", {}, [X.mk("neg", {}, [a])])]), a),
    lambda X, a, b, c: (X.mk("sub", {}, [a, X.mk("neg", {}, [b])]), X.mk("add", {}, [b, a])),
    lambda X, a, b, c: (X.mk("mul", {}, [X.mk("exp", {}, [a]), X.mk("exp", {}, [b])]), X.mk("exp", {}, [X.mk("add", {}, [a, b])])),
    lambda X, a, b, c: (X.mk("abs", {}, [X.mk("neg", {}, [a])]), X.mk("abs", {}, [a])),
    lambda X, a, b, c: (X.mk("scale", {"value": 2}, [a]), X.mk("add", {}, [a, a])),
    lambda X, a, b, c: (X.mk("square", {}, [a]), X.mk("mul", {}, [a, X.mk("abs", {}, [a])])),
    lambda X, a, b, c: (X.mk("div", {}, [X.mk("mul", {}, [a, b]), b]), a),
    lambda X, a, b, c: (X.mk("mul", {}, [X.mk("div", {}, [a, X.mk("relu", {}, [a])]), X.mk("const", {"value": 0, "shape": (), "dtype": "float"}, [])]),
                        X.mk("const", {"value": 0, "shape": (), "dtype": "float"}, [])),
    lambda X, a, b, c: (X.mk("maximum", {}, [a, b]), X.mk("where", {}, [X.mk("ge", {}, [a, b]), a, b])),
    lambda X, a, b, c: (X.mk("masked_fill", {"value": 0}, [a, X.mk("gt", {}, [a, b])]),
                        X.mk("where", {}, [X.mk("le", {}, [a, b]), a, X.mk("const", {"value": 0, "shape": (), "dtype": "float"}, [])])),
]


def gen_smt(dr: Draw, seed: int):
    X = Exprs()
    shape = tuple(dr.int(1, 3) for _ in range(dr.int(0, 2)))
    leaves = [_leaf(X, dr, shape) for _ in range(3)]
    try:
        if dr.coin(0.6):
            a0, b0, c0 = (_tree(X, dr, leaves, 1) for _ in range(3))
            lhs, rhs = dr.pick(IDENTITIES)(X, a0, b0, c0)
            if dr.coin(0.3):  # break it: swap an operand
                rhs = X.mk("add", {}, [rhs, X.mk("scale", {"value": dr.pick([1e-3, 1, -1])}, [b0])])
        else:
            lhs, rhs = _tree(X, dr, leaves, 3), _tree(X, dr, leaves, 3)
    except ExprError as exc:
        return Result("skip", detail=str(exc)), ""
    return _check_pair(X, lhs, rhs, seed), f"{X.show(lhs, 6)} vs {X.show(rhs, 6)}"


def gen_congruence(dr: Draw, seed: int):
    X = Exprs()
    shape = (dr.int(2, 3), dr.int(2, 3))
    x, w = _leaf(X, dr, shape), _leaf(X, dr, (shape[1], 2))
    try:
        u = dr.rng.random()
        if u < 0.5:  # equal arguments by another step (SMT), under a non-elementwise op
            a1, b1 = X.mk("scale", {"value": 2}, [x]), X.mk("add", {}, [x, x])
        elif u < 0.8:  # different arguments
            a1, b1 = X.mk("scale", {"value": 2}, [x]), X.mk("scale", {"value": 3}, [x])
        else:
            a1 = b1 = x
        wrap = dr.pick(["matmul", "softmax", "sum", "amax", "transpose", "embedding_backward", "topk"])
        if wrap == "matmul":
            a, b = X.mk("matmul", {}, [a1, w]), X.mk("matmul", {}, [b1, w])
        elif wrap == "softmax":
            a, b = X.mk("softmax", {"dim": 1}, [a1]), X.mk("softmax", {"dim": 1}, [b1])
        elif wrap in ("sum", "amax"):
            a, b = X.mk(wrap, {"dims": (1,), "keepdim": False}, [a1]), X.mk(wrap, {"dims": (1,), "keepdim": False}, [b1])
        elif wrap == "transpose":
            a, b = X.mk("permute", {"dims": (1, 0)}, [a1]), X.mk("permute", {"dims": (1, 0)}, [b1])
        elif wrap == "topk":
            a, b = X.mk_multi("topk", {"k": 1, "dim": -1}, [a1])[0], X.mk_multi("topk", {"k": 1, "dim": -1}, [b1])[0]
        else:
            ids = _leaf(X, dr, (shape[0],), "int")
            a = X.mk("embedding_backward", {"num_weights": 4}, [a1, ids])
            b = X.mk("embedding_backward", {"num_weights": 4}, [b1, ids])
        if dr.coin(0.3):  # and once more under an elementwise op
            a, b = X.mk("exp", {}, [a]), X.mk("exp", {}, [b])
    except ExprError as exc:
        return Result("skip", detail=str(exc)), ""
    return _check_pair(X, a, b, seed), f"{X.show(a, 6)} vs {X.show(b, 6)}"


EQUALITY: dict[str, Callable] = {
    "scale_commutes_linear": gen_scale,
    "layout_commutes_pointwise": gen_layout,
    "elementwise_smt": gen_smt,
    "congruence": gen_congruence,
}


from .gens_norm import NORM_GENERATORS  # noqa: E402  (reduction / broadcast rules; they reuse _check_pair)

EQUALITY.update(NORM_GENERATORS)

from .gens_interleave import INTERLEAVE_EQ_GENERATORS  # noqa: E402  (interleave_commutes)

EQUALITY.update(INTERLEAVE_EQ_GENERATORS)

from .gens_concat_groups import CONCAT_GROUPS_EQ_GENERATORS  # noqa: E402  (concat_groups_commutes)

EQUALITY.update(CONCAT_GROUPS_EQ_GENERATORS)

from .gens_int_range import INT_RANGE_GENERATORS  # noqa: E402  (int_range_count)

EQUALITY.update(INT_RANGE_GENERATORS)

from .gens_slice_concat import SLICE_CONCAT_GENERATORS  # noqa: E402  (Megatron's coalesced gradient buffer)

EQUALITY.update(SLICE_CONCAT_GENERATORS)

from .gens_scalar_factor import SCALAR_FACTOR_GENERATORS  # noqa: E402  (0-d factors: a global token count)

EQUALITY.update(SCALAR_FACTOR_GENERATORS)

from .gens_layout_map import LAYOUT_MAP_GENERATORS  # noqa: E402  (layout chains by their index maps)

EQUALITY.update(LAYOUT_MAP_GENERATORS)

from .gens_reversed_blocks import REVERSED_BLOCKS_EQ_GENERATORS  # noqa: E402  (rank-reversed blocks)

EQUALITY.update(REVERSED_BLOCKS_EQ_GENERATORS)
