"""Reductions: sum, mean, amax, amin (over a list of dims) and topk.

``dims`` is a required list; an empty list reduces nothing (the op is then the identity,
unlike ``torch.sum(x, dim=[])``, which reduces everything).  Duplicate dims are an error.
"""
from __future__ import annotations

import numpy as np

from .base import Attr, AxisDep, InputDep, OpSpec, ShapeError, norm_dim, register
from .elementwise import as_float, check_arity, fin, is_int


def reduced_dims(op: str, shape, dims) -> tuple[int, ...]:
    r = len(shape)
    out = []
    for d in dims:
        try:
            nd = norm_dim(d, r, "dim")
        except ShapeError:
            raise ShapeError(f"{op}: dim {d} is out of range for input 0 of shape {list(shape)} "
                             f"(rank {r})") from None
        if r == 0:
            raise ShapeError(f"{op}: cannot reduce dim {d} of a rank-0 input")
        if nd in out:
            raise ShapeError(f"{op}: dim {d} is listed twice in dims {list(dims)}")
        out.append(nd)
    return tuple(sorted(out))


def reduced_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if i in dims else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in dims)


def reduce_dep(shape, dims, keepdim) -> InputDep:
    axes = []
    k = 0
    for i in range(len(shape)):
        if i in dims:
            axes.append(AxisDep("all"))
            if keepdim:
                k += 1
        else:
            axes.append(AxisDep("affine", ((k, 1),), 0))
            k += 1
    return InputDep(tuple(axes))


class Reduction(OpSpec):
    category = "reduce"
    arity = (1, 1)
    attrs = {"dims": Attr("ints"), "keepdim": Attr("bool", False, False)}
    needs_nonempty = False

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        dims = reduced_dims(self.name, s, attrs["dims"])
        if self.needs_nonempty:
            for d in dims:
                if s[d] == 0:
                    raise ShapeError(f"{self.name}: input 0 has shape {list(s)}; cannot reduce "
                                     f"its empty dim {d}")
        return [reduced_shape(s, dims, attrs["keepdim"])]

    def deps(self, shapes, attrs):
        s = tuple(shapes[0])
        return [reduce_dep(s, reduced_dims(self.name, s, attrs["dims"]), attrs["keepdim"])]

    def eval(self, xs, attrs, ctx):
        x = xs[0]
        dims = reduced_dims(self.name, x.shape, attrs["dims"])
        return [self.reduce(x, dims, attrs["keepdim"], ctx)]


@register
class Sum(Reduction):
    name = "sum"
    linear = True
    doc = "sum over dims"

    def linear_in(self, attrs):
        return (0,)  # OpFlags.sum_op_linear, sum_op_homogeneous

    def reduce(self, x, dims, keepdim, ctx):
        if is_int(x):
            return fin(np.sum(x, axis=dims, keepdims=keepdim), ctx, "int")
        if ctx.exact and x.size == 0:
            return ctx.zeros(reduced_shape(x.shape, dims, keepdim))
        return fin(np.sum(x, axis=dims, keepdims=keepdim), ctx)


@register
class Mean(Reduction):
    name = "mean"
    linear = True
    needs_nonempty = True

    def linear_in(self, attrs):
        return (0,)  # OpFlags.mean_op_linear, mean_op_homogeneous
    doc = "sum over dims divided by the number of reduced elements"

    def out_dtypes(self, in_dtypes, attrs):
        return ["float"]

    def reduce(self, x, dims, keepdim, ctx):
        x = as_float(x, ctx)
        n = 1
        for d in dims:
            n *= x.shape[d]
        return fin(np.sum(x, axis=dims, keepdims=keepdim) / ctx.const(n), ctx)


@register
class Amax(Reduction):
    name = "amax"
    needs_nonempty = True
    doc = "maximum over dims"

    def reduce(self, x, dims, keepdim, ctx):
        return fin(np.max(x, axis=dims, keepdims=keepdim), ctx, "int" if is_int(x) else "float")


@register
class Amin(Reduction):
    name = "amin"
    needs_nonempty = True
    doc = "minimum over dims"

    def reduce(self, x, dims, keepdim, ctx):
        return fin(np.min(x, axis=dims, keepdims=keepdim), ctx, "int" if is_int(x) else "float")


@register
class Topk(OpSpec):
    name = "topk"
    category = "reduce"
    arity = (1, 1)
    attrs = {"k": Attr("dim"), "dim": Attr("int", False, -1)}
    doc = ("the k largest entries along dim, in descending order (ties: lower index first); "
           "outputs (values, int indices)")

    def n_outputs(self, attrs):
        return 2

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        if len(s) == 0:
            raise ShapeError("topk: input 0 is rank 0; topk needs rank >= 1")
        d = norm_dim(attrs["dim"], len(s), "topk dim")
        k = attrs["k"]
        if not 0 <= k <= s[d]:
            raise ShapeError(f"topk: k={k} must be between 0 and input 0's dim {d} "
                             f"(size {s[d]}) of shape {list(s)}")
        out = s[:d] + (k,) + s[d + 1:]
        return [out, out]

    def out_dtypes(self, in_dtypes, attrs):
        return [in_dtypes[0] if in_dtypes else "float", "int"]

    def deps(self, shapes, attrs):
        s = tuple(shapes[0])
        d = norm_dim(attrs["dim"], len(s), "topk dim")
        return [InputDep(tuple(AxisDep("all") if i == d else AxisDep("affine", ((i, 1),), 0)
                               for i in range(len(s))))]

    def eval(self, xs, attrs, ctx):
        x = xs[0]
        self.infer([x.shape], attrs)
        d = norm_dim(attrs["dim"], x.ndim, "topk dim")
        k = attrs["k"]
        order = np.argsort(-x, axis=d, kind="stable")
        idx = np.take(order, np.arange(k), axis=d).astype(np.int64)
        vals = np.take_along_axis(x, idx, axis=d)
        return [fin(vals, ctx, "int" if is_int(x) else "float"), idx]
