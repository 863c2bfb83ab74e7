"""Elementwise ops (unary, binary with numpy broadcasting, comparisons, where/masked_fill).

Also holds small helpers shared by the other op modules (``is_int``, ``as_float``, ``fin``,
``need_int``, ``check_arity``).

Dtypes: a tensor is "float" or "int".  Arithmetic ops that are closed over the integers
(neg, abs, relu, square, add, sub, mul, maximum, minimum, where, masked_fill, and scale /
add_scalar with an integer value) keep "int" when every data input is int; every other op
returns "float".  Comparisons and logical ops return int 0/1 tensors.

Irrational constants (1/sqrt(2) and sqrt(2/pi) in gelu, 0.044715) are taken as their float64
values; in exact mode that float64 value is converted exactly to a Fraction.  So

* gelu(approximate="none") = x/2 * (1 + erf(x * c1)),  c1 = float64(1/sqrt(2))
* gelu(approximate="tanh") = x/2 * (1 + tanh(c2 * (x + c3 * x^3))),
  c2 = float64(sqrt(2/pi)), c3 = float64(0.044715)
* silu x = x * sigmoid(x)
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .base import (
    Attr,
    Ctx,
    OpSpec,
    Shape,
    ShapeError,
    broadcast_shapes,
    identity_dep,
    register,
)

# ---------------------------------------------------------------- shared helpers


def is_int(a: np.ndarray) -> bool:
    """True for an index (int) tensor."""
    return np.asarray(a).dtype.kind in "iub"


def as_float(a: np.ndarray, ctx: Ctx) -> np.ndarray:
    """Convert an int tensor to the context's float type; float tensors pass through."""
    a = np.asarray(a) if not isinstance(a, np.ndarray) else a
    if is_int(a):
        return ctx.asarray(a.astype(np.int64).tolist() if a.ndim else int(a))
    return a


def fin(v: Any, ctx: Ctx, dtype: str = "float") -> np.ndarray:
    """Wrap an eval result as an ndarray of the right kind (ufuncs on 0-d give scalars)."""
    if dtype == "int":
        return np.asarray(v, dtype=np.int64)
    if ctx.exact:
        a = np.asarray(v, dtype=object) if not isinstance(v, np.ndarray) else v
        if a.dtype != object:
            return ctx.asarray(a.tolist() if a.ndim else a.item())
        return a
    return np.asarray(v, dtype=np.float64)


def need_int(op: str, i: int, in_dtypes: Sequence[str]) -> None:
    if i < len(in_dtypes) and in_dtypes[i] != "int":
        raise ShapeError(f"input {i} of {op} must be an int (index) tensor, got {in_dtypes[i]}")


def check_arity(spec: OpSpec, shapes: Sequence[Shape]) -> None:
    lo, hi = spec.arity
    n = len(shapes)
    if n < lo or (hi is not None and n > hi):
        want = f"{lo}" if lo == hi else f"{lo}..{'n' if hi is None else hi}"
        raise ShapeError(f"{spec.name} takes {want} input(s), got {n}")


def _int_value(v: Any) -> bool:
    return isinstance(v, int) or (isinstance(v, float) and v.is_integer())


# ---------------------------------------------------------------- unary ops


class Unary(OpSpec):
    category = "elementwise"
    arity = (1, 1)
    keeps_int = False  # result stays int for int input

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        return [tuple(shapes[0])]

    def deps(self, shapes, attrs):
        return [identity_dep(tuple(shapes[0]), tuple(shapes[0]))]

    def out_dtypes(self, in_dtypes, attrs):
        if self.keeps_int and in_dtypes and in_dtypes[0] == "int":
            return ["int"]
        return ["float"]

    def eval(self, xs, attrs, ctx):
        x = xs[0]
        if is_int(x) and self.keeps_int:
            return [fin(self.f_int(x, attrs), ctx, "int")]
        x = as_float(x, ctx)
        with np.errstate(all="ignore"):
            return [fin(self.f(x, attrs, ctx), ctx)]

    def f_int(self, x, attrs):
        return self.f(x, attrs, None)

    def f(self, x, attrs, ctx):  # pragma: no cover - overridden
        raise NotImplementedError


def _fn_op(opname: str, fname: str, doc: str) -> type:
    cls = type(
        opname.capitalize() + "Op",
        (Unary,),
        {"name": opname, "doc": doc, "f": lambda self, x, attrs, ctx: ctx.fn(fname, x)},
    )
    return register(cls)


for _n, _d in [
    ("exp", "e^x"),
    ("log", "natural log"),
    ("sqrt", "square root"),
    ("rsqrt", "1/sqrt(x)"),
    ("tanh", "hyperbolic tangent"),
    ("sigmoid", "1/(1+e^-x)"),
    ("sin", "sine"),
    ("cos", "cosine"),
]:
    _fn_op(_n, _n, _d)


@register
class Neg(Unary):
    name = "neg"
    linear = True
    keeps_int = True
    doc = "-x"

    def linear_in(self, attrs):
        return (0,)  # OpFlags.neg_linear, neg_homogeneous

    def f(self, x, attrs, ctx):
        return -x


@register
class Silu(Unary):
    name = "silu"
    doc = "x * sigmoid(x)"

    def f(self, x, attrs, ctx):
        return x * ctx.fn("sigmoid", x)


@register
class Relu(Unary):
    name = "relu"
    keeps_int = True
    doc = "max(x, 0) (x where x > 0 else 0)"

    def f(self, x, attrs, ctx):
        zero = 0 if ctx is None else ctx.const(0)
        return np.where(x > 0, x, zero)


@register
class Abs(Unary):
    name = "abs"
    keeps_int = True
    doc = "|x|"

    def f(self, x, attrs, ctx):
        return np.abs(x)


@register
class Reciprocal(Unary):
    name = "reciprocal"
    doc = "1/x"

    def f(self, x, attrs, ctx):
        try:
            return ctx.const(1) / x
        except ZeroDivisionError:
            raise ValueError("reciprocal: division by zero in exact mode") from None


@register
class Square(Unary):
    name = "square"
    keeps_int = True
    doc = "x*x"

    def f(self, x, attrs, ctx):
        return x * x


@register
class Cast(Unary):
    name = "cast"
    linear = False  # only into float: see linear_in
    attrs = {"dtype": Attr("str", False, "float", ("float", "int"))}
    doc = "int->float conversion; float->float identity; float->int truncates toward zero"

    def linear_in(self, attrs):
        # into float: the embedding of the integers into the reals is additive (OpFlags.cast_float_linear) and
        # the identity on floats; into int it truncates, which is neither additive nor homogeneous
        # (OpFlags.cast_int_not_additive: trunc(1/2) + trunc(1/2) = 0 <> 1 = trunc(1))
        return (0,) if attrs.get("dtype", "float") == "float" else ()

    def homogeneous_in(self, attrs):
        # into float, for integer factors of an int operand (OpFlags.cast_float_homogeneous); the equality
        # prover checks that the factor it moves is an integer
        return self.linear_in(attrs)

    def out_dtypes(self, in_dtypes, attrs):
        return [attrs["dtype"]]

    def eval(self, xs, attrs, ctx):
        x = xs[0]
        if attrs["dtype"] == "float":
            return [fin(as_float(x, ctx), ctx)]
        if is_int(x):
            return [fin(x, ctx, "int")]
        if ctx.exact:
            return [np.vectorize(lambda v: int(v), otypes=[np.int64])(x).astype(np.int64)
                    if x.size else np.zeros(x.shape, np.int64)]
        return [np.trunc(x).astype(np.int64)]


@register
class Gelu(Unary):
    name = "gelu"
    attrs = {"approximate": Attr("str", False, "none", ("none", "tanh"))}
    doc = "x/2*(1+erf(x*c1)) or x/2*(1+tanh(c2*(x+c3*x^3))); constants are float64 values"

    def f(self, x, attrs, ctx):
        half = ctx.const(0.5)
        one = ctx.const(1)
        if attrs["approximate"] == "none":
            c1 = ctx.const(1.0 / math.sqrt(2.0))
            return x * half * (one + ctx.fn("erf", x * c1))
        c2 = ctx.const(math.sqrt(2.0 / math.pi))
        c3 = ctx.const(0.044715)
        return x * half * (one + ctx.fn("tanh", c2 * (x + c3 * x * x * x)))


@register
class Pow(Unary):
    name = "pow"
    attrs = {"exponent": Attr("num")}
    doc = ("x ** exponent; integer exponents by exact repeated multiplication, 0.5 -> sqrt, "
           "-0.5 -> rsqrt (via ctx.fn); other non-integer exponents are float-mode only")

    def f(self, x, attrs, ctx):
        e = attrs["exponent"]
        if _int_value(e):
            e = int(e)
            if not ctx.exact:
                return np.power(x, float(e))
            try:
                return x ** e
            except ZeroDivisionError:
                raise ValueError("pow: division by zero in exact mode") from None
        if e == 0.5:
            return ctx.fn("sqrt", x)
        if e == -0.5:
            return ctx.fn("rsqrt", x)
        if ctx.exact:
            raise ValueError(f"pow with non-integer exponent {e!r} has no exact-mode semantics "
                             "(only integers, 0.5 and -0.5 are supported)")
        return np.power(x, float(e))


@register
class Scale(Unary):
    name = "scale"
    linear = True
    attrs = {"value": Attr("num")}
    doc = "x * value"

    def linear_in(self, attrs):
        return (0,)  # OpFlags.scale_linear, scale_homogeneous

    def out_dtypes(self, in_dtypes, attrs):
        return ["int" if in_dtypes and in_dtypes[0] == "int" and isinstance(attrs["value"], int)
                else "float"]

    def eval(self, xs, attrs, ctx):
        x, v = xs[0], attrs["value"]
        if is_int(x) and isinstance(v, int):
            return [fin(x * v, ctx, "int")]
        x = as_float(x, ctx)
        return [fin(x * ctx.const(v), ctx)]


@register
class AddScalar(Unary):
    name = "add_scalar"
    attrs = {"value": Attr("num")}
    doc = "x + value"

    out_dtypes = Scale.out_dtypes

    def eval(self, xs, attrs, ctx):
        x, v = xs[0], attrs["value"]
        if is_int(x) and isinstance(v, int):
            return [fin(x + v, ctx, "int")]
        x = as_float(x, ctx)
        return [fin(x + ctx.const(v), ctx)]


@register
class LogicalNot(Unary):
    name = "logical_not"
    doc = "1 where x == 0 else 0 (int)"

    def out_dtypes(self, in_dtypes, attrs):
        return ["int"]

    def eval(self, xs, attrs, ctx):
        return [fin(xs[0] == 0, ctx, "int")]


# ---------------------------------------------------------------- binary / n-ary ops


class Nary(OpSpec):
    category = "elementwise"
    arity = (2, 2)
    keeps_int = False
    result = "float"  # "float" | "int" (comparisons)

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        try:
            return [broadcast_shapes(*[tuple(s) for s in shapes])]
        except ShapeError:
            desc = ", ".join(f"input {i} has shape {list(s)}" for i, s in enumerate(shapes))
            raise ShapeError(f"{self.name}: inputs do not broadcast ({desc})") from None

    def deps(self, shapes, attrs):
        out = self.infer(shapes, attrs)[0]
        return [identity_dep(tuple(s), out) for s in shapes]

    def data_inputs(self, n: int) -> range:
        return range(n)

    def out_dtypes(self, in_dtypes, attrs):
        if self.result == "int":
            return ["int"]
        data = [in_dtypes[i] for i in self.data_inputs(len(in_dtypes))]
        return ["int" if self.keeps_int and all(d == "int" for d in data) else "float"]

    def eval(self, xs, attrs, ctx):
        idx = self.data_inputs(len(xs))
        all_int = all(is_int(xs[i]) for i in idx)
        if self.result == "int":
            if not all_int:
                xs = [as_float(x, ctx) for x in xs]
            return [fin(self.f(xs, attrs, ctx), ctx, "int")]
        if all_int and self.keeps_int:
            return [fin(self.f(list(xs), attrs, ctx), ctx, "int")]
        xs = [as_float(x, ctx) if i in idx else x for i, x in enumerate(xs)]
        with np.errstate(all="ignore"):
            return [fin(self.f(xs, attrs, ctx), ctx)]


def _binop(opname, fn, keeps_int=True, result="float", linear=False, doc="", linear_in=()):
    def f(self, xs, attrs, ctx):
        return fn(xs[0], xs[1])

    cls = type(opname.title().replace("_", "") + "Op", (Nary,),
               {"name": opname, "f": f, "keeps_int": keeps_int, "result": result,
                "linear": linear, "doc": doc, "linear_in": lambda self, attrs: linear_in})
    return register(cls)


def _div(a, b):
    try:
        return a / b
    except ZeroDivisionError:
        raise ValueError("div: division by zero in exact mode") from None


# add / sub are additive jointly in (a, b) (partial_add / partial_sub), not in one operand with the other
# fixed (a + b is affine in a); mul is additive in each operand separately (OpFlags.mul_linear_l / _r), div
# in its numerator (OpFlags.div_linear_num)
_binop("add", lambda a, b: a + b, linear=True, doc="a + b (broadcasting)")
_binop("sub", lambda a, b: a - b, linear=True, doc="a - b (broadcasting)")
_binop("mul", lambda a, b: a * b, doc="a * b (broadcasting; bilinear)", linear_in=(0, 1))
_binop("div", _div, keeps_int=False, doc="a / b (true division; float result)", linear_in=(0,))
_binop("maximum", lambda a, b: np.where(a >= b, a, b), doc="max(a, b)")
_binop("minimum", lambda a, b: np.where(a <= b, a, b), doc="min(a, b)")
_binop("eq", lambda a, b: a == b, result="int", doc="1 where a == b else 0")
_binop("ne", lambda a, b: a != b, result="int", doc="1 where a != b else 0")
_binop("lt", lambda a, b: a < b, result="int", doc="1 where a < b else 0")
_binop("le", lambda a, b: a <= b, result="int", doc="1 where a <= b else 0")
_binop("gt", lambda a, b: a > b, result="int", doc="1 where a > b else 0")
_binop("ge", lambda a, b: a >= b, result="int", doc="1 where a >= b else 0")
_binop("logical_and", lambda a, b: (a != 0) & (b != 0), result="int", doc="a != 0 and b != 0")
_binop("logical_or", lambda a, b: (a != 0) | (b != 0), result="int", doc="a != 0 or b != 0")


@register
class Where(Nary):
    name = "where"
    arity = (3, 3)
    keeps_int = True
    doc = "a where cond != 0 else b (cond an int tensor; all three broadcast)"

    def data_inputs(self, n):
        return range(1, n)

    def out_dtypes(self, in_dtypes, attrs):
        return ["int" if all(d == "int" for d in in_dtypes[1:]) else "float"]

    def f(self, xs, attrs, ctx):
        c, a, b = xs
        return np.where(np.asarray(c != 0, dtype=bool), a, b)


@register
class MaskedFill(Nary):
    name = "masked_fill"
    arity = (2, 2)
    keeps_int = True
    attrs = {"value": Attr("num")}
    doc = "value where mask != 0 else x; the output has the broadcast shape of x and mask"

    def data_inputs(self, n):
        return range(0, 1)

    def linear_in(self, attrs):
        # additive in x (mask fixed) only when the fill value is 0 (OpFlags.masked_fill_zero_linear); any other
        # value makes it affine (OpFlags.masked_fill_nonzero_not_additive)
        from fractions import Fraction

        return (0,) if Fraction(str(attrs["value"])) == 0 else ()

    def out_dtypes(self, in_dtypes, attrs):
        return ["int" if in_dtypes[0] == "int" and isinstance(attrs["value"], int) else "float"]

    def eval(self, xs, attrs, ctx):
        x, m = xs
        v = attrs["value"]
        if is_int(x) and isinstance(v, int):
            return [fin(np.where(np.asarray(m != 0, dtype=bool), np.int64(v), x), ctx, "int")]
        x = as_float(x, ctx)
        fill = ctx.full((), v)
        return [fin(np.where(np.asarray(m != 0, dtype=bool), fill, x), ctx)]
