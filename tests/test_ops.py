"""Tests of the op library (tvcert.ops): shape inference, float/exact eval, deps, attrs.

Expected values are plain numpy expressions written independently of the op code; torch is
used only as an optional extra cross-check (skipped when torch is missing).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable

import numpy as np
import pytest

import tvcert.ops  # noqa: F401  (registers every op)
from tvcert.ops.base import (
    REGISTRY,
    AttrError,
    AxisDep,
    Ctx,
    InputDep,
    ShapeError,
    identity_dep,
    resolve_attrs,
)

RNG = np.random.default_rng(0)


def I(*shape, lo=-3, hi=4):
    """Integer-valued float tensor (exact-friendly)."""
    return RNG.integers(lo, hi, size=shape).astype(np.float64)


def R(*shape):
    return RNG.standard_normal(shape)


def P(*shape):
    return RNG.uniform(0.5, 2.0, size=shape)


def N(*shape, lo=0, hi=4):
    """Int (index) tensor."""
    return RNG.integers(lo, hi, size=shape).astype(np.int64)


def NZ(*shape):
    v = RNG.integers(1, 4, size=shape) * RNG.choice([-1, 1], size=shape)
    return v.astype(np.float64)


def to_exact(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "iub":
        return x
    return Ctx(exact=True).asarray(x.tolist() if x.ndim else float(x))


def dtype_of(x: np.ndarray) -> str:
    return "int" if x.dtype.kind in "iub" else "float"


def run(name, attrs, xs, exact=False, env=None):
    spec = REGISTRY[name]
    a = resolve_attrs(spec, attrs, env or {})
    ctx = Ctx(exact=exact)
    if exact:
        xs = [to_exact(x) for x in xs]
    return spec.eval(xs, a, ctx)


def infer(name, attrs, shapes, env=None):
    spec = REGISTRY[name]
    return spec.infer([tuple(s) for s in shapes], resolve_attrs(spec, attrs, env or {}))


@dataclass
class Case:
    attrs: dict
    inputs: list
    expected: Callable[..., Any]  # numpy expression -> array or list of arrays
    exact: bool = False  # rational op on integer-valued inputs: exact mode must agree
    tol: float = 1e-9
    exact_raises: type | None = None  # exact mode is expected to raise this


def erf(x):
    return np.vectorize(math.erf)(x)


def sig(x):
    return 1 / (1 + np.exp(-x))


def np_softmax(x, d):
    e = np.exp(x - x.max(axis=d, keepdims=True))
    return e / e.sum(axis=d, keepdims=True)


def np_log_softmax(x, d):
    return x - np.log(np.exp(x).sum(axis=d, keepdims=True))


def np_ce(lg, t):
    return -np.take_along_axis(np_log_softmax(lg, -1), t[..., None], -1)[..., 0]


def np_gather(x, ix, d):
    out = np.empty(ix.shape)
    for idx in itertools.product(*map(range, ix.shape)):
        j = list(idx)
        j[d] = ix[idx]
        out[idx] = x[tuple(j)]
    return out


def np_scatter_add(x, ix, src, d):
    out = x.copy()
    for idx in itertools.product(*map(range, ix.shape)):
        j = list(idx)
        j[d] = ix[idx]
        out[tuple(j)] += src[idx]
    return out


def np_topk(x, k, d):
    x = np.moveaxis(x, d, -1)
    vals = np.empty(x.shape[:-1] + (k,))
    idx = np.empty(x.shape[:-1] + (k,), dtype=np.int64)
    for b in itertools.product(*map(range, x.shape[:-1])):
        row = list(x[b])
        order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
        idx[b] = order
        vals[b] = [row[i] for i in order]
    return [np.moveaxis(vals, -1, d), np.moveaxis(idx, -1, d)]


A34, B34, B4, C14 = I(3, 4), I(3, 4), I(4), I(1, 4)
X234 = I(2, 3, 4)
L = R(5, 6)
T = N(5, hi=6)

CASES: dict[str, list[Case]] = {
    # ------------------------------------------------ elementwise unary
    "neg": [Case({}, [A34], lambda x: -x, exact=True), Case({}, [N(3)], lambda x: -x)],
    "exp": [Case({}, [R(3, 4)], np.exp)],
    "log": [Case({}, [P(3, 4)], np.log)],
    "sqrt": [Case({}, [P(3, 4)], np.sqrt)],
    "rsqrt": [Case({}, [P(3, 4)], lambda x: 1 / np.sqrt(x))],
    "tanh": [Case({}, [R(3, 4)], np.tanh)],
    "sigmoid": [Case({}, [R(3, 4)], sig)],
    "silu": [Case({}, [R(3, 4)], lambda x: x * sig(x))],
    "relu": [Case({}, [A34], lambda x: np.where(x > 0, x, 0.0), exact=True)],
    "abs": [Case({}, [A34], np.abs, exact=True)],
    "reciprocal": [Case({}, [NZ(3, 4)], lambda x: 1 / x, exact=True)],
    "square": [Case({}, [A34], lambda x: x * x, exact=True)],
    "sin": [Case({}, [R(3, 4)], np.sin)],
    "cos": [Case({}, [R(3, 4)], np.cos)],
    "cast": [Case({}, [N(3, 2)], lambda x: x.astype(np.float64), exact=True),
             Case({"dtype": "int"}, [np.array([1.7, -1.7, 2.0])], lambda x: np.array([1, -1, 2])),
             Case({"dtype": "float"}, [A34], lambda x: x, exact=True)],
    "gelu": [Case({}, [R(3, 4)], lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2)))),
             Case({"approximate": "tanh"}, [R(3, 4)],
                  lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))))],
    "pow": [Case({"exponent": 3}, [A34], lambda x: x ** 3, exact=True),
            Case({"exponent": -2}, [NZ(3)], lambda x: x ** -2.0, exact=True),
            Case({"exponent": 0.5}, [P(3)], np.sqrt),
            Case({"exponent": 1.5}, [P(3)], lambda x: x ** 1.5, exact_raises=ValueError)],
    "scale": [Case({"value": 3}, [A34], lambda x: 3 * x, exact=True),
              Case({"value": 0.5}, [A34], lambda x: 0.5 * x, exact=True)],
    "add_scalar": [Case({"value": 2}, [A34], lambda x: x + 2, exact=True),
                   Case({"value": "n*2"}, [A34], lambda x: x + 6, exact=True)],
    "logical_not": [Case({}, [N(5, hi=2)], lambda x: (x == 0).astype(np.int64))],
    # ------------------------------------------------ elementwise binary
    "add": [Case({}, [A34, B4], lambda a, b: a + b, exact=True),
            Case({}, [N(3), N(2, 1)], lambda a, b: a + b)],
    "sub": [Case({}, [A34, C14], lambda a, b: a - b, exact=True)],
    "mul": [Case({}, [A34, B34], lambda a, b: a * b, exact=True)],
    "div": [Case({}, [A34, NZ(4)], lambda a, b: a / b, exact=True),
            Case({}, [N(3), np.array([2, 2, 2])], lambda a, b: a / b, exact=True)],
    "maximum": [Case({}, [A34, B34], np.maximum, exact=True)],
    "minimum": [Case({}, [A34, B4], np.minimum, exact=True)],
    "eq": [Case({}, [A34, B34], lambda a, b: (a == b).astype(np.int64), exact=True)],
    "ne": [Case({}, [A34, B34], lambda a, b: (a != b).astype(np.int64), exact=True)],
    "lt": [Case({}, [A34, B4], lambda a, b: (a < b).astype(np.int64), exact=True)],
    "le": [Case({}, [A34, B34], lambda a, b: (a <= b).astype(np.int64), exact=True)],
    "gt": [Case({}, [A34, B34], lambda a, b: (a > b).astype(np.int64), exact=True)],
    "ge": [Case({}, [A34, B34], lambda a, b: (a >= b).astype(np.int64), exact=True)],
    "logical_and": [Case({}, [N(3, 4, hi=2), N(4, hi=2)],
                         lambda a, b: ((a != 0) & (b != 0)).astype(np.int64))],
    "logical_or": [Case({}, [N(3, 4, hi=2), N(4, hi=2)],
                        lambda a, b: ((a != 0) | (b != 0)).astype(np.int64))],
    "where": [Case({}, [N(3, 4, hi=2), A34, B4], lambda c, a, b: np.where(c != 0, a, b),
                   exact=True)],
    "masked_fill": [Case({"value": -1e9}, [A34, N(4, hi=2)],
                         lambda x, m: np.where(m != 0, -1e9, x), exact=True)],
    # ------------------------------------------------ linalg
    "matmul": [Case({}, [I(2, 3, 4), I(4, 5)], np.matmul, exact=True),
               Case({}, [I(2, 1, 3, 4), I(5, 4, 2)], np.matmul, exact=True),
               Case({}, [I(4), I(2, 4, 3)], np.matmul, exact=True),
               Case({}, [I(3, 4), I(4)], np.matmul, exact=True),
               Case({}, [I(4), I(4)], np.matmul, exact=True)],
    "einsum": [Case({"equation": "bsh,hf->bsf"}, [I(2, 3, 4), I(4, 5)],
                    lambda a, b: np.tensordot(a, b, axes=([2], [0])), exact=True),
               Case({"equation": "ij,jk,kl->li"}, [I(2, 3), I(3, 4), I(4, 2)],
                    lambda a, b, c: (a @ b @ c).T, exact=True),
               Case({"equation": "ij,ij"}, [A34, B34], lambda a, b: np.sum(a * b), exact=True),
               Case({"equation": "ij->ji"}, [A34], lambda a: a.T, exact=True)],
    # ------------------------------------------------ reductions
    "sum": [Case({"dims": [0, -1]}, [X234], lambda x: x.sum(axis=(0, 2)), exact=True),
            Case({"dims": [1], "keepdim": True}, [X234], lambda x: x.sum(axis=1, keepdims=True),
                 exact=True),
            Case({"dims": [0, 1]}, [A34], lambda x: np.array(x.sum()), exact=True)],
    "mean": [Case({"dims": [1]}, [X234], lambda x: x.mean(axis=1), exact=True)],
    "amax": [Case({"dims": [2], "keepdim": True}, [X234], lambda x: x.max(2, keepdims=True),
                  exact=True)],
    "amin": [Case({"dims": [0]}, [X234], lambda x: x.min(0), exact=True)],
    "topk": [Case({"k": 2}, [I(3, 5)], lambda x: np_topk(x, 2, 1), exact=True),
             Case({"k": 3, "dim": 0}, [I(4, 2)], lambda x: np_topk(x, 3, 0), exact=True)],
    # ------------------------------------------------ nn
    "softmax": [Case({"dim": -1}, [R(3, 5)], lambda x: np_softmax(x, -1)),
                Case({"dim": 0}, [R(3, 5)], lambda x: np_softmax(x, 0))],
    "log_softmax": [Case({"dim": 1}, [R(3, 5)], lambda x: np_log_softmax(x, 1))],
    "softmax_backward": [Case({"dim": -1}, [I(3, 4), I(3, 4)],
                              lambda g, o: o * (g - (g * o).sum(-1, keepdims=True)), exact=True)],
    "log_softmax_backward": [Case({"dim": -1}, [R(3, 4), R(3, 4)],
                                  lambda g, o: g - np.exp(o) * g.sum(-1, keepdims=True))],
    "cross_entropy": [Case({}, [L, T], lambda lg, t: np.array(np_ce(lg, t).mean())),
                      Case({"reduction": "sum"}, [L, T], lambda lg, t: np.array(np_ce(lg, t).sum())),
                      Case({"reduction": "none"}, [R(2, 3, 4), N(2, 3, hi=4)], np_ce)],
    "cross_entropy_backward": [
        Case({}, [np.array(2.0), L, T],
             lambda g, lg, t: (np_softmax(lg, -1) - np.eye(6)[t]) * g / 5),
        Case({"reduction": "sum"}, [np.array(2.0), L, T],
             lambda g, lg, t: (np_softmax(lg, -1) - np.eye(6)[t]) * g),
        Case({"reduction": "none"}, [R(5), L, T],
             lambda g, lg, t: (np_softmax(lg, -1) - np.eye(6)[t]) * g[:, None])],
    "one_hot": [Case({"num_classes": 5}, [N(2, 3, hi=5)], lambda x: np.eye(5)[x], exact=True)],
    # ------------------------------------------------ layout
    "reshape": [Case({"shape": [4, -1]}, [X234], lambda x: x.reshape(4, 6), exact=True),
                Case({"shape": ["a", "b*2"]}, [X234], lambda x: x.reshape(2, 12), exact=True)],
    "view": [Case({"shape": [24]}, [X234], lambda x: x.reshape(24), exact=True)],
    "permute": [Case({"dims": [2, 0, 1]}, [X234], lambda x: x.transpose(2, 0, 1), exact=True)],
    "flip": [Case({"dims": [1]}, [X234], lambda x: x[:, ::-1, :], exact=True),
             Case({"dims": [0, -1]}, [X234], lambda x: x[::-1, :, ::-1], exact=True)],
    "transpose": [Case({"dim0": 0, "dim1": -1}, [X234], lambda x: x.swapaxes(0, 2), exact=True)],
    "slice": [Case({"dim": 1, "start": 1, "end": 3}, [X234], lambda x: x[:, 1:3], exact=True),
              Case({"dim": -1, "start": 0, "end": 4, "step": 3}, [X234], lambda x: x[..., 0:4:3],
                   exact=True)],
    "concat": [Case({"dim": 1}, [A34, I(3, 2), I(3, 1)],
                    lambda *xs: np.concatenate(xs, axis=1), exact=True)],
    "split": [Case({"dim": 1, "sizes": [1, 3, 0]}, [A34],
                   lambda x: [x[:, :1], x[:, 1:4], x[:, 4:4]], exact=True)],
    "pad": [Case({"pads": [1, 0, 0, 2], "value": 7}, [A34],
                 lambda x: np.pad(x, ((1, 0), (0, 2)), constant_values=7), exact=True)],
    "expand": [Case({"shape": [2, 3, -1]}, [C14], lambda x: np.broadcast_to(x, (2, 3, 4)),
                    exact=True)],
    "squeeze": [Case({"dims": [0]}, [C14], lambda x: x[0], exact=True)],
    "unsqueeze": [Case({"dim": -1}, [A34], lambda x: x[..., None], exact=True)],
    "triu": [Case({}, [X234], lambda x: np.triu(x), exact=True),
             Case({"diagonal": 1}, [A34], lambda x: np.triu(x, 1), exact=True)],
    "tril": [Case({"diagonal": -1}, [X234], lambda x: np.tril(x, -1), exact=True)],
    "flatten": [Case({}, [X234], lambda x: x.reshape(-1), exact=True),
                Case({"start": 1}, [X234], lambda x: x.reshape(2, 12), exact=True)],
    # ------------------------------------------------ indexing
    "gather": [Case({"dim": 1}, [A34, N(2, 3, hi=4)], lambda x, i: np_gather(x, i, 1),
                    exact=True)],
    "index_select": [Case({"dim": 0}, [A34, np.array([2, 0, 2, 1])], lambda x, i: x[i],
                          exact=True)],
    "embedding": [Case({}, [I(6, 3), N(2, 4, hi=6)], lambda w, i: w[i], exact=True)],
    "embedding_backward": [Case({"num_weights": 6}, [I(2, 4, 3), N(2, 4, hi=6)],
                                lambda g, i: np_scatter_add(np.zeros((6, 3)),
                                                            np.repeat(i.reshape(-1, 1), 3, 1),
                                                            g.reshape(-1, 3), 0),
                                exact=True)],
    "scatter_add": [Case({"dim": 0}, [A34, N(2, 4, hi=3), I(3, 4)],
                         lambda x, i, s: np_scatter_add(x, i, s, 0), exact=True)],
    "index_add": [Case({"dim": 1}, [A34, np.array([3, 3, 0]), I(3, 3)],
                       lambda x, i, s: np_scatter_add(x, np.broadcast_to(i, (3, 3)), s, 1),
                       exact=True)],
    # ------------------------------------------------ sources
    "const": [Case({"value": 2.5, "shape": [2, 3]}, [], lambda: np.full((2, 3), 2.5), exact=True),
              Case({"value": 3, "dtype": "int"}, [], lambda: np.array(3)),
              Case({"value": [[1, 0.5], ["n", 2]]}, [], lambda: np.array([[1, 0.5], [3, 2]]),
                   exact=True),
              Case({"value": [[1, 2]], "shape": [1, 2], "dtype": "int"}, [],
                   lambda: np.array([[1, 2]]))],
    "iota": [Case({"size": 4, "start": 2, "step": 3}, [], lambda: np.array([2, 5, 8, 11])),
             Case({"size": "n", "dtype": "float"}, [], lambda: np.arange(3.0), exact=True)],
}

ENV = {"a": 2, "b": 6, "n": 3}
CASE_IDS = [(name, i) for name, cs in CASES.items() for i in range(len(cs))]


def as_list(v):
    return list(v) if isinstance(v, (list, tuple)) else [v]


def test_every_registered_op_has_cases():
    ops = sorted(n for n, s in REGISTRY.items() if s.category not in ("collective", "p2p", "loop"))
    missing = [n for n in ops if n not in CASES]
    assert not missing, f"ops without a test case: {missing}"
    missing = [n for n in ops if n not in ERRORS]
    assert not missing, f"ops without an error case: {missing}"


@pytest.mark.parametrize("name,i", CASE_IDS, ids=[f"{n}-{i}" for n, i in CASE_IDS])
def test_float_eval(name, i):
    c = CASES[name][i]
    spec = REGISTRY[name]
    attrs = resolve_attrs(spec, c.attrs, ENV)
    shapes = [x.shape for x in c.inputs]
    out_shapes = spec.infer(shapes, attrs)
    outs = spec.eval(list(c.inputs), attrs, Ctx())
    exp = as_list(c.expected(*c.inputs))
    dts = spec.out_dtypes([dtype_of(x) for x in c.inputs], attrs)
    assert len(outs) == len(out_shapes) == len(exp) == len(dts) == spec.n_outputs(attrs)
    lo, hi = spec.arity
    assert lo <= len(c.inputs) and (hi is None or len(c.inputs) <= hi)
    for o, s, e, dt in zip(outs, out_shapes, exp, dts):
        assert isinstance(o, np.ndarray)
        assert o.shape == tuple(s) == np.shape(e), (o.shape, s, np.shape(e))
        assert o.dtype == (np.int64 if dt == "int" else np.float64)
        np.testing.assert_allclose(o.astype(np.float64), np.asarray(e, dtype=np.float64),
                                   rtol=c.tol, atol=c.tol)
    # deps: one map per input, one axis per input dim
    deps = spec.deps(shapes, attrs)
    assert len(deps) == len(shapes)
    for d, s in zip(deps, shapes):
        assert isinstance(d, InputDep) and len(d.axes) == len(s)
        for ax in d.axes:
            assert ax.kind in ("affine", "all", "data", "other")
            for k, _ in ax.terms:
                assert 0 <= k < len(out_shapes[0])


@pytest.mark.parametrize("name,i", CASE_IDS, ids=[f"{n}-{i}" for n, i in CASE_IDS])
def test_exact_eval(name, i):
    c = CASES[name][i]
    spec = REGISTRY[name]
    attrs = resolve_attrs(spec, c.attrs, ENV)
    xs = [to_exact(x) for x in c.inputs]
    if c.exact_raises:
        with pytest.raises(c.exact_raises):
            spec.eval(xs, attrs, Ctx(exact=True))
        return
    outs = spec.eval(xs, attrs, Ctx(exact=True, seed=1))
    dts = spec.out_dtypes([dtype_of(x) for x in c.inputs], attrs)
    out_shapes = spec.infer([x.shape for x in c.inputs], attrs)
    exp = as_list(c.expected(*c.inputs))
    for o, s, e, dt in zip(outs, out_shapes, exp, dts):
        assert isinstance(o, np.ndarray) and o.shape == tuple(s)
        if dt == "int":
            assert o.dtype == np.int64
        else:
            assert o.dtype == object
            assert all(isinstance(v, Fraction) for v in o.flat)
        if c.exact:
            # rational op on integer inputs: the exact value rounds to the float answer
            got = np.vectorize(float, otypes=[np.float64])(o) if o.size else o.astype(float)
            np.testing.assert_allclose(got, np.asarray(e, dtype=np.float64), rtol=1e-12,
                                       atol=1e-12)


# ------------------------------------------------------------------ targeted exact checks


def test_exact_mean_and_div_are_rational():
    x = np.array([1.0, 2.0])
    assert run("mean", {"dims": [0]}, [x], exact=True)[0][()] == Fraction(3, 2)
    out = run("div", {}, [np.array([1.0]), np.array([3.0])], exact=True)[0]
    assert out[0] == Fraction(1, 3)
    out = run("scale", {"value": 0.1}, [np.array([1.0])], exact=True)[0]
    assert out[0] == Fraction(1, 10)  # the decimal 0.1 as written, as in SMT and the prover (issue 13, class 7)


def test_exact_softmax_rows_sum_to_one():
    x = I(4, 5)
    for name in ("softmax",):
        out = run(name, {"dim": -1}, [x], exact=True)[0]
        for row in out:
            assert sum(row) == 1
    out = run("softmax", {"dim": 0}, [x], exact=True)[0]
    assert all(sum(out[:, j]) == 1 for j in range(5))


def test_exact_log_softmax_consistent_with_cross_entropy():
    lg, t = I(3, 4), N(3, hi=4)
    ls = run("log_softmax", {"dim": -1}, [lg], exact=True)[0]
    ce = run("cross_entropy", {"reduction": "none"}, [lg, t], exact=True)[0]
    for r in range(3):
        assert ce[r] == -ls[r, t[r]]
    mean = run("cross_entropy", {}, [lg, t], exact=True)[0]
    assert mean[()] == sum(ce) / 3


def test_exact_cross_entropy_backward_rows_sum_to_zero():
    g = np.array(1.0)
    lg, t = I(3, 4), N(3, hi=4)
    out = run("cross_entropy_backward", {"reduction": "sum"}, [g, lg, t], exact=True)[0]
    assert all(sum(row) == 0 for row in out)


def test_exact_matmul_and_einsum():
    a, b = I(2, 3), I(3, 2)
    m = run("matmul", {}, [a, b], exact=True)[0]
    e = run("einsum", {"equation": "ij,jk->ik"}, [a, b], exact=True)[0]
    assert (m == e).all()
    assert m.dtype == object and m[0, 0] == Fraction(int(a[0] @ b[:, 0]))


def test_exact_uses_function_tables():
    # exp is replaced by a table: same input -> same output, and it is not e^x
    x = np.array([0.0, 0.0, 1.0])
    out = run("exp", {}, [x], exact=True)[0]
    assert out[0] == out[1] and isinstance(out[0], Fraction)
    # silu is x * sigmoid(x) through the table
    s = run("sigmoid", {}, [x], exact=True)[0]
    y = run("silu", {}, [x], exact=True)[0]
    assert (y == to_exact(x) * s).all()


def test_int_arithmetic_stays_int():
    a, b = N(3), N(3)
    assert run("add", {}, [a, b])[0].dtype == np.int64
    assert run("mul", {}, [a, b], exact=True)[0].dtype == np.int64
    assert run("div", {}, [a, b + 1])[0].dtype == np.float64
    assert REGISTRY["add"].out_dtypes(["int", "int"], {}) == ["int"]
    assert REGISTRY["add"].out_dtypes(["int", "float"], {}) == ["float"]
    assert REGISTRY["topk"].out_dtypes(["float"], {"k": 1, "dim": -1}) == ["float", "int"]
    assert REGISTRY["eq"].out_dtypes(["float", "float"], {}) == ["int"]


def test_topk_ties_lower_index_first():
    x = np.array([[1.0, 3.0, 3.0, 2.0, 3.0]])
    v, i = run("topk", {"k": 4}, [x])
    assert i.tolist() == [[1, 2, 4, 3]] and v.tolist() == [[3, 3, 3, 2]]
    v, i = run("topk", {"k": 4}, [x], exact=True)
    assert i.tolist() == [[1, 2, 4, 3]]


# ------------------------------------------------------------------ errors

ERRORS: dict[str, list[tuple[dict, list, type, str]]] = {}


def _err(names, attrs, shapes, exc, msg):
    for n in names.split():
        ERRORS.setdefault(n, []).append((attrs, shapes, exc, msg))


_UNARY = ("neg exp log sqrt rsqrt tanh sigmoid silu relu abs reciprocal square sin cos cast gelu "
          "logical_not")
_err(_UNARY, {}, [(3,), (3,)], ShapeError, "takes 1 input(s), got 2")
_err("cast", {"dtype": "double"}, [(3,)], AttrError, "must be one of")
_err("gelu", {"approximate": True}, [(3,)], AttrError, "must be a string")
_err("pow", {}, [(3,)], AttrError, "needs attribute 'exponent'")
_err("pow", {"exponent": [2]}, [(3,)], AttrError, "must be a number")
_err("scale", {"value": True}, [(3,)], AttrError, "must be a number")
_err("add_scalar", {"value": 1, "bogus": 2}, [(3,)], AttrError, "unknown attribute 'bogus'")
_err("add sub mul div maximum minimum eq ne lt le gt ge logical_and logical_or", {},
     [(3, 4), (3,)], ShapeError, "input 1 has shape [3]")
_err("where", {}, [(3,), (4,), (3,)], ShapeError, "do not broadcast")
_err("masked_fill", {"value": 0}, [(3, 4), (2, 4)], ShapeError, "do not broadcast")
_err("matmul", {}, [(4, 5), (4, 3)], ShapeError,
     "input 1 has shape [4, 3] but matmul needs its dim -2 to equal 5 (input 0's dim -1)")
_err("matmul", {}, [(2, 4, 5), (3, 5, 3)], ShapeError, "batch dims do not broadcast")
_err("matmul", {}, [(), (3,)], ShapeError, "input 0 of matmul is a scalar")
_err("einsum", {"equation": "ij,jk->ik"}, [(2, 3), (4, 5)], ShapeError, "letter 'j' is size 4")
_err("einsum", {"equation": "ij,jk->ik"}, [(2, 3)], ShapeError, "names 2 operands")
_err("einsum", {"equation": "ij->iz"}, [(2, 3)], ShapeError, "output letter 'z'")
_err("einsum", {"equation": "i1->i"}, [(2, 3)], ShapeError, "is not a letter")
_err("einsum", {"equation": "ijk->i"}, [(2, 3)], ShapeError, "needs rank 3")
_err("einsum", {"equation": "...i->i"}, [(2, 3)], ShapeError, "ellipsis")
_err("sum mean amax amin", {"dims": [3]}, [(2, 3)], ShapeError, "dim 3 is out of range")
_err("sum mean amax amin", {"dims": [0, -2]}, [(2, 3)], ShapeError, "listed twice")
_err("sum", {"dims": 0}, [(2, 3)], AttrError, "must be a list of integers")
_err("mean amax", {"dims": [0]}, [(0, 3)], ShapeError, "empty dim")
_err("topk", {"k": 6}, [(2, 5)], ShapeError, "k=6 must be between 0 and")
_err("topk", {"k": 1, "dim": 2}, [(2, 5)], ShapeError, "out of range")
_err("softmax log_softmax", {"dim": 2}, [(2, 5)], ShapeError, "dim 2 is out of range")
_err("softmax", {}, [(2, 5)], AttrError, "needs attribute 'dim'")
_err("softmax_backward log_softmax_backward", {"dim": -1}, [(2, 5), (2, 4)], ShapeError,
     "input 1 (out) has shape [2, 4]")
_err("cross_entropy", {}, [(4, 5), (3,)], ShapeError, "target has shape [3]")
_err("cross_entropy", {"reduction": "avg"}, [(4, 5), (4,)], AttrError, "must be one of")
_err("cross_entropy_backward", {}, [(4,), (4, 5), (4,)], ShapeError,
     "input 0 (grad_out) has shape [4]")
_err("cross_entropy_backward", {"reduction": "none"}, [(), (4, 5), (4,)], ShapeError,
     "input 0 (grad_out) has shape []")
_err("one_hot", {"num_classes": -1}, [(3,)], ShapeError, "negative")
_err("one_hot", {"num_classes": "nope+"}, [(3,)], AttrError, "num_classes")
_err("reshape view", {"shape": [5, -1]}, [(2, 3, 4)], ShapeError, "cannot be viewed as [5, -1]")
_err("reshape view", {"shape": [5, 5]}, [(2, 3, 4)], ShapeError, "has 25 elements")
_err("reshape", {"shape": [-1, -1]}, [(2, 3, 4)], ShapeError, "more than one -1")
_err("permute", {"dims": [0, 0, 1]}, [(2, 3, 4)], ShapeError, "not a permutation")
_err("flip", {"dims": [1, -2]}, [(2, 3, 4)], ShapeError, "repeats a dim")
_err("flip", {"dims": [3]}, [(2, 3, 4)], ShapeError, "out of range")
_err("permute", {"dims": [0, 1]}, [(2, 3, 4)], ShapeError, "has rank 3")
_err("transpose", {"dim0": 0, "dim1": 3}, [(2, 3, 4)], ShapeError, "dim1 3 is out of range")
_err("slice", {"dim": 0, "start": 1, "end": 5}, [(4,)], ShapeError,
     "0 <= start <= end <= 4")
_err("slice", {"dim": 0, "start": 3, "end": 2}, [(4,)], ShapeError, "start=3, end=2")
_err("slice", {"dim": 0, "start": 0, "end": 2, "step": 0}, [(4,)], ShapeError, "step")
_err("concat", {"dim": 0}, [(2, 3), (2, 4)], ShapeError,
     "input 1 has shape [2, 4] but its dim 1 must equal 3")
_err("concat", {"dim": 0}, [(2, 3), (3,)], ShapeError, "input 1 has shape [3] (rank 1)")
_err("split", {"dim": 0, "sizes": [1, 2]}, [(4, 2)], ShapeError, "sum to 3")
_err("pad", {"pads": [1, 1]}, [(4, 2)], ShapeError, "needs 4")
_err("pad", {"pads": [1, -1, 0, 0]}, [(4, 2)], ShapeError, "negative")
_err("expand", {"shape": [3, 4]}, [(2, 4)], ShapeError, "cannot be expanded to 3")
_err("expand", {"shape": [4]}, [(2, 4)], ShapeError, "fewer dims")
_err("squeeze", {"dims": [1]}, [(1, 4)], ShapeError, "has size 4, not 1")
_err("unsqueeze", {"dim": 3}, [(1, 4)], ShapeError, "out of range")
_err("triu tril", {}, [(4,)], ShapeError, "needs rank >= 2")
_err("flatten", {"start": 2, "end": 1}, [(2, 3, 4)], ShapeError, "comes after end")
_err("gather", {"dim": 0}, [(3, 4), (2,)], ShapeError, "input 1 (index) has shape [2]")
_err("gather", {"dim": 0}, [(3, 4), (2, 5)], ShapeError, "its dim 1 must be <= 4")
_err("index_select", {"dim": 0}, [(3, 4), (2, 2)], ShapeError, "must be 1-D")
_err("embedding", {}, [(3, 4, 5), (2,)], ShapeError, "input 0 (weight) has shape [3, 4, 5]")
_err("embedding_backward", {"num_weights": 5}, [(2, 3), (3,)], ShapeError,
     "input 0 (grad) has shape [2, 3]")
_err("scatter_add", {"dim": 0}, [(3, 4), (2, 4), (1, 4)], ShapeError, "must be <= 1 (input 2")
_err("index_add", {"dim": 1}, [(3, 4), (2,), (3, 3)], ShapeError, "input 2 (src) has shape [3, 3]")
_err("const", {"value": 1.5, "dtype": "int"}, [], ShapeError, "not an integer")
_err("const", {"value": 1, "shape": 3}, [], AttrError, "must be a list of dims")
_err("const", {"value": [[1, 2], [3]]}, [], ShapeError, "ragged")
_err("const", {"value": [[1, 2]], "shape": [2, 1]}, [], ShapeError, "literal of shape [1, 2]")
_err("const", {"value": [1, True]}, [], AttrError, "nested list of numbers")
_err("iota", {"size": -1}, [], ShapeError, "negative")
_err("iota", {"size": "undefined_dim"}, [], AttrError, "size")

ERR_IDS = [(n, i) for n, es in ERRORS.items() for i in range(len(es))]


@pytest.mark.parametrize("name,i", ERR_IDS, ids=[f"{n}-{i}" for n, i in ERR_IDS])
def test_errors(name, i):
    attrs, shapes, exc, msg = ERRORS[name][i]
    with pytest.raises(exc) as info:
        infer(name, attrs, shapes)
    assert msg in str(info.value), str(info.value)


def test_out_of_range_indices_raise_in_eval():
    cases = [
        ("gather", {"dim": 1}, [A34, np.array([[0, 4]] * 3)]),
        ("index_select", {"dim": 0}, [A34, np.array([-1])]),
        ("embedding", {}, [I(3, 2), np.array([3])]),
        ("embedding_backward", {"num_weights": 2}, [I(1, 2), np.array([2])]),
        ("scatter_add", {"dim": 0}, [A34, np.array([[3, 0, 0, 0]]), A34]),
        ("index_add", {"dim": 0}, [A34, np.array([5]), I(1, 4)]),
        ("cross_entropy", {}, [I(2, 3), np.array([0, 3])]),
        ("cross_entropy_backward", {}, [np.array(1.0), I(2, 3), np.array([0, 3])]),
        ("one_hot", {"num_classes": 3}, [np.array([3])]),
    ]
    for name, attrs, xs in cases:
        for exact in (False, True):
            with pytest.raises(ValueError, match="out of range"):
                run(name, attrs, xs, exact=exact)


def test_int_index_inputs_are_checked():
    with pytest.raises(ShapeError, match="must be an int"):
        REGISTRY["gather"].out_dtypes(["float", "float"], {"dim": 0})
    with pytest.raises(ShapeError, match="must be an int"):
        REGISTRY["cross_entropy"].out_dtypes(["float", "float"], {"reduction": "mean"})


def test_pow_non_integer_exact_raises_clearly():
    with pytest.raises(ValueError, match="non-integer exponent"):
        run("pow", {"exponent": 1.5}, [P(2)], exact=True)


# ------------------------------------------------------------------ dependency maps


def aff(k, coef=1, const=0):
    return AxisDep("affine", ((k, coef),), const)


def deps(name, attrs, shapes):
    spec = REGISTRY[name]
    return spec.deps([tuple(s) for s in shapes], resolve_attrs(spec, attrs, {}))


def test_deps_elementwise_broadcast():
    d = deps("add", {}, [(2, 3, 4), (3, 1)])
    assert d[0] == identity_dep((2, 3, 4), (2, 3, 4))
    assert d[0].axes == (aff(0), aff(1), aff(2))
    assert d[1].axes == (aff(1), AxisDep("affine", (), 0))
    assert d[0].affine and d[1].affine
    assert deps("exp", {}, [(5,)])[0].axes == (aff(0),)


def test_deps_permute_slice_concat():
    assert deps("permute", {"dims": [2, 0, 1]}, [(2, 3, 4)])[0].axes == (aff(1), aff(2), aff(0))
    assert deps("transpose", {"dim0": 0, "dim1": 1}, [(2, 3)])[0].axes == (aff(1), aff(0))
    d = deps("slice", {"dim": 1, "start": 2, "end": 8, "step": 2}, [(3, 9)])[0]
    assert d.axes == (aff(0), aff(1, 2, 2))
    d = deps("concat", {"dim": 0}, [(2, 3), (4, 3)])
    assert d[1].axes == (aff(0, 1, -2), aff(1))
    d = deps("pad", {"pads": [1, 0, 0, 2]}, [(2, 3)])[0]
    assert d.axes == (aff(0, 1, -1), aff(1))


def test_deps_matmul_contraction_is_all():
    da, db = deps("matmul", {}, [(5, 2, 3), (3, 4)])
    assert da.axes == (aff(0), aff(1), AxisDep("all"))
    assert db.axes == (AxisDep("all"), aff(2))
    da, db = deps("matmul", {}, [(1, 2, 3), (6, 3, 4)])
    assert da.axes[0] == AxisDep("affine", (), 0)
    assert db.axes == (aff(0), AxisDep("all"), aff(2))
    da, db = deps("matmul", {}, [(3,), (3, 4)])
    assert da.axes == (AxisDep("all"),) and db.axes == (AxisDep("all"), aff(0))
    da, db = deps("einsum", {"equation": "bsh,hf->bsf"}, [(2, 3, 4), (4, 5)])
    assert da.axes == (aff(0), aff(1), AxisDep("all"))
    assert db.axes == (AxisDep("all"), aff(2))


def test_deps_reduce_gather_reshape():
    assert deps("sum", {"dims": [1]}, [(2, 3, 4)])[0].axes == (aff(0), AxisDep("all"), aff(1))
    assert deps("sum", {"dims": [1], "keepdim": True}, [(2, 3, 4)])[0].axes == \
        (aff(0), AxisDep("all"), aff(2))
    d = deps("gather", {"dim": 1}, [(3, 4), (3, 2)])
    assert d[0].axes == (aff(0), AxisDep("data")) and not d[0].affine
    d = deps("embedding", {}, [(10, 4), (2, 3)])
    assert d[0].axes == (AxisDep("data"), aff(2)) and d[1].axes == (aff(0), aff(1))
    d = deps("reshape", {"shape": [2, 12]}, [(2, 3, 4)])[0]
    assert d.axes == (aff(0), AxisDep("other"), AxisDep("other"))
    d = deps("reshape", {"shape": [6, 4]}, [(2, 3, 4)])[0]
    assert d.axes == (AxisDep("other"), AxisDep("other"), aff(1))


COPY_OPS = [
    ("permute", {"dims": [2, 0, 1]}, (2, 3, 4)),
    ("transpose", {"dim0": -1, "dim1": 0}, (2, 3, 4)),
    ("slice", {"dim": 1, "start": 1, "end": 7, "step": 2}, (2, 8)),
    ("expand", {"shape": [3, 2, -1]}, (1, 4)),
    ("squeeze", {"dims": [1]}, (2, 1, 3)),
    ("unsqueeze", {"dim": 1}, (2, 3)),
    ("pad", {"pads": [1, 2, 0, 1]}, (2, 3)),
    ("reshape", {"shape": [2, 12]}, (2, 3, 4)),
    ("flatten", {"start": 0, "end": 1}, (2, 3, 4)),
    ("split", {"dim": 0, "sizes": [2, 1]}, (3, 2)),
]


@pytest.mark.parametrize("name,attrs,shape", COPY_OPS, ids=[c[0] for c in COPY_OPS])
def test_affine_deps_agree_with_eval(name, attrs, shape):
    """For copy-like ops, out[j] == x[deps(j)] wherever the affine map lands in bounds."""
    x = np.arange(1, int(np.prod(shape)) + 1, dtype=np.float64).reshape(shape)
    out = run(name, attrs, [x])[0]
    (dep,) = deps(name, attrs, [shape])
    for j in itertools.product(*map(range, out.shape)):
        if any(ax.kind != "affine" for ax in dep.axes):
            idx = None
        else:
            idx = tuple(ax.const + sum(c * j[k] for k, c in ax.terms) for ax in dep.axes)
        if idx is None:
            # non-affine dims: at least the affine ones must match the position of the value
            src = np.argwhere(x == out[j])[0]
            for i, ax in enumerate(dep.axes):
                if ax.kind == "affine":
                    assert src[i] == ax.const + sum(c * j[k] for k, c in ax.terms)
        elif all(0 <= v < n for v, n in zip(idx, shape)):
            assert out[j] == x[idx]
        else:
            assert out[j] == 0  # padding


def test_against_torch():
    torch = pytest.importorskip("torch")
    x = R(3, 5)
    np.testing.assert_allclose(run("softmax", {"dim": -1}, [x])[0],
                               torch.softmax(torch.tensor(x), -1).numpy(), rtol=1e-9)
    np.testing.assert_allclose(run("gelu", {}, [x])[0],
                               torch.nn.functional.gelu(torch.tensor(x)).numpy(), rtol=1e-7)
    a, b = R(2, 1, 3, 4), R(5, 4, 2)
    np.testing.assert_allclose(run("matmul", {}, [a, b])[0],
                               torch.matmul(torch.tensor(a), torch.tensor(b)).numpy(), rtol=1e-9)
    t = N(3, hi=5)
    np.testing.assert_allclose(
        run("cross_entropy", {}, [x, t])[0],
        torch.nn.functional.cross_entropy(torch.tensor(x), torch.tensor(t)).numpy(), rtol=1e-9)


def test_linear_flags():
    for n in ("neg scale reshape view permute transpose slice concat expand squeeze "
              "unsqueeze split sum mean gather index_select embedding embedding_backward "
              "scatter_add index_add add sub flatten triu tril").split():
        assert REGISTRY[n].linear, n
    for n in "matmul einsum exp mul softmax cast".split():
        assert not REGISTRY[n].linear, n
    # flags that depend on attributes: a cast is linear only into float, masked_fill / pad only with value 0
    assert REGISTRY["cast"].linear_in({"dtype": "float"}) == (0,)
    assert REGISTRY["cast"].linear_in({"dtype": "int"}) == ()
    assert REGISTRY["masked_fill"].linear_in({"value": 0}) == (0,)
    assert REGISTRY["masked_fill"].linear_in({"value": -1e9}) == ()
    assert REGISTRY["pad"].linear_in({"pads": (0, 1), "value": 0}) == (0,)
    assert REGISTRY["pad"].linear_in({"pads": (0, 1), "value": 2}) == ()
    for n in ("softmax", "log_softmax", "exp", "add_scalar", "relu", "amax", "cross_entropy"):
        assert REGISTRY[n].linear_in({"dim": -1, "value": 1, "dims": (0,)}) == (), n
    assert REGISTRY["add"].linear_in({}) == ()  # jointly additive only: a + b is affine in a


@pytest.mark.parametrize("name", ["add", "matmul", "sum", "slice", "gather", "softmax", "neg"])
def test_linearity_numerically(name):
    """Linear ops are additive in their float input; checked in exact mode."""
    cases = {
        "add": ({}, [I(2, 3), I(3)]),
        "matmul": ({}, [I(2, 3), I(3, 2)]),
        "sum": ({"dims": [0]}, [I(2, 3)]),
        "slice": ({"dim": 1, "start": 0, "end": 2}, [I(2, 3)]),
        "gather": ({"dim": 1}, [I(2, 3), N(2, 2, hi=3)]),
        "softmax": ({"dim": 0}, [I(2, 3)]),
        "neg": ({}, [I(2, 3)]),
    }
    attrs, xs = cases[name]
    spec = REGISTRY[name]
    ys = [I(*x.shape) if x.dtype.kind == "f" else x for x in xs]
    s = [x + y if x.dtype.kind == "f" else x for x, y in zip(xs, ys)]
    lhs = run(name, attrs, s, exact=True)[0]
    rhs = run(name, attrs, xs, exact=True)[0] + run(name, attrs, ys, exact=True)[0]
    if spec.linear:
        assert (lhs == rhs).all()
    elif name == "matmul":
        # bilinear: additive in each input separately
        a, b = xs
        a2 = I(*a.shape)
        l2 = run(name, attrs, [a + a2, b], exact=True)[0]
        r2 = run(name, attrs, [a, b], exact=True)[0] + run(name, attrs, [a2, b], exact=True)[0]
        assert (l2 == r2).all()


# ------------------------------------------------------------------ property tests

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

small_shape = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)


@settings(max_examples=60, deadline=None)
@given(small_shape, small_shape, st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))
def test_matmul_shapes_match_numpy(ba, bb, m, k, n):
    a, b = RNG.standard_normal(ba + (m, k)), RNG.standard_normal(bb + (k, n))
    try:
        want = np.matmul(a, b)
    except ValueError:
        with pytest.raises(ShapeError):
            infer("matmul", {}, [a.shape, b.shape])
        return
    assert infer("matmul", {}, [a.shape, b.shape]) == [want.shape]
    np.testing.assert_allclose(run("matmul", {}, [a, b])[0], want, rtol=1e-9, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(small_shape, small_shape)
def test_broadcast_shapes_match_numpy(s1, s2):
    a, b = np.ones(s1), np.ones(s2)
    try:
        want = (a + b).shape
    except ValueError:
        with pytest.raises(ShapeError):
            infer("mul", {}, [s1, s2])
        return
    assert infer("mul", {}, [s1, s2]) == [want]
    d = deps("mul", {}, [s1, s2])
    assert all(dep.affine for dep in d)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=4).map(tuple), st.data())
def test_permute_roundtrip(shape, data):
    perm = data.draw(st.permutations(range(len(shape))))
    x = RNG.standard_normal(shape)
    y = run("permute", {"dims": list(perm)}, [x])[0]
    np.testing.assert_array_equal(y, np.transpose(x, perm))
    inv = [perm.index(i) for i in range(len(perm))]
    np.testing.assert_array_equal(run("permute", {"dims": inv}, [y])[0], x)


def test_n_outputs_with_unresolved_attrs():
    # plan loading asks n_outputs({}) before attributes are resolved
    for name, spec in REGISTRY.items():
        if spec.category not in ("collective", "p2p", "loop"):
            assert spec.n_outputs({}) >= 1, name
    assert REGISTRY["split"].n_outputs({"sizes": ["a", "b", 1]}) == 3
