"""NN ops: softmax, log_softmax and their backwards, cross_entropy(+backward), one_hot.

Formulas (exact mode evaluates them literally, with ``ctx.fn`` tables for exp/log):

* m = amax(x, dim, keepdim); e = exp(x - m); s = sum(e, dim, keepdim)
* softmax(x) = e / s                      (rows sum to exactly 1 in exact mode)
* log_softmax(x) = (x - m) - log(s)
* softmax_backward(g, out) = out * (g - sum(g * out, dim, keepdim))
* log_softmax_backward(g, out) = g - exp(out) * sum(g, dim, keepdim)
* cross_entropy(logits, t) = lse - logits[t], lse = m + log(s) over the last dim
  (reduction none / sum / mean over all target elements)
* cross_entropy_backward(g, logits, t) = (softmax(logits) - one_hot(t)) * g  (/ N for mean)
"""
from __future__ import annotations

import numpy as np

from .base import Attr, AxisDep, InputDep, OpSpec, ShapeError, norm_dim, register
from .elementwise import as_float, check_arity, fin, need_int
from .indexing import check_range


def _nd(d, shape, op):
    if not shape:
        raise ShapeError(f"{op}: input 0 is rank 0; needs rank >= 1")
    try:
        return norm_dim(d, len(shape), "dim")
    except ShapeError:
        raise ShapeError(f"{op}: dim {d} is out of range for input 0 of shape {list(shape)}") \
            from None


def _aff(k):
    return AxisDep("affine", ((k, 1),), 0)


def _stats(x, d, ctx):
    """(x - m, e, s) of the max-shifted softmax along axis d (keepdims)."""
    m = np.max(x, axis=d, keepdims=True)
    z = x - m
    e = ctx.fn("exp", z)
    s = np.sum(e, axis=d, keepdims=True)
    return m, z, e, s


def _softmax(x, d, ctx):
    _, _, e, s = _stats(x, d, ctx)
    try:
        return e / s
    except ZeroDivisionError:
        raise ValueError("softmax: exp-sum is zero in exact mode") from None


class NN(OpSpec):
    category = "nn"

    def out_dtypes(self, in_dtypes, attrs):
        return ["float"] * self.n_outputs(attrs)


class _SoftmaxLike(NN):
    arity = (1, 1)
    attrs = {"dim": Attr("int")}

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        d = _nd(attrs["dim"], s, self.name)
        if s[d] == 0:
            raise ShapeError(f"{self.name}: input 0 has shape {list(s)}; dim {d} is empty")
        return [s]

    def deps(self, shapes, attrs):
        s = tuple(shapes[0])
        d = _nd(attrs["dim"], s, self.name)
        return [InputDep(tuple(AxisDep("all") if i == d else _aff(i) for i in range(len(s))))]


@register
class Softmax(_SoftmaxLike):
    name = "softmax"
    doc = "exp(x - m) / sum(exp(x - m)), m = amax over dim"

    def eval(self, xs, attrs, ctx):
        x = as_float(xs[0], ctx)
        self.infer([x.shape], attrs)
        return [fin(_softmax(x, _nd(attrs["dim"], x.shape, self.name), ctx), ctx)]


@register
class LogSoftmax(_SoftmaxLike):
    name = "log_softmax"
    doc = "(x - m) - log(sum(exp(x - m))), m = amax over dim"

    def eval(self, xs, attrs, ctx):
        x = as_float(xs[0], ctx)
        self.infer([x.shape], attrs)
        _, z, _, s = _stats(x, _nd(attrs["dim"], x.shape, self.name), ctx)
        return [fin(z - ctx.fn("log", s), ctx)]


class _SoftmaxBwd(NN):
    arity = (2, 2)
    attrs = {"dim": Attr("int")}

    def linear_in(self, attrs):
        # linear in grad_out for a fixed out (OpFlags.softmax_backward_linear, log_softmax_backward_linear);
        # not in out
        return (0,)

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        g, o = tuple(shapes[0]), tuple(shapes[1])
        if g != o:
            raise ShapeError(f"{self.name}: input 1 (out) has shape {list(o)} but must equal "
                             f"input 0 (grad_out)'s shape {list(g)}")
        _nd(attrs["dim"], g, self.name)
        return [g]

    def deps(self, shapes, attrs):
        s = tuple(shapes[0])
        d = _nd(attrs["dim"], s, self.name)
        dep = InputDep(tuple(AxisDep("all") if i == d else _aff(i) for i in range(len(s))))
        return [dep, dep]


@register
class SoftmaxBackward(_SoftmaxBwd):
    name = "softmax_backward"
    doc = "out * (g - sum(g * out, dim, keepdim))"

    def eval(self, xs, attrs, ctx):
        g, o = (as_float(x, ctx) for x in xs)
        self.infer([g.shape, o.shape], attrs)
        d = _nd(attrs["dim"], g.shape, self.name)
        return [fin(o * (g - np.sum(g * o, axis=d, keepdims=True)), ctx)]


@register
class LogSoftmaxBackward(_SoftmaxBwd):
    name = "log_softmax_backward"
    doc = "g - exp(out) * sum(g, dim, keepdim)"

    def eval(self, xs, attrs, ctx):
        g, o = (as_float(x, ctx) for x in xs)
        self.infer([g.shape, o.shape], attrs)
        d = _nd(attrs["dim"], g.shape, self.name)
        return [fin(g - ctx.fn("exp", o) * np.sum(g, axis=d, keepdims=True), ctx)]


REDUCTION = Attr("str", False, "mean", ("mean", "sum", "none"))


def _ce_shapes(op, logits, target):
    if len(logits) == 0:
        raise ShapeError(f"{op}: logits has rank 0; needs [..., C]")
    if tuple(target) != tuple(logits[:-1]):
        raise ShapeError(f"{op}: target has shape {list(target)} but must equal the logits' "
                         f"shape {list(logits)} without its last (class) dim")
    if logits[-1] == 0:
        raise ShapeError(f"{op}: logits has shape {list(logits)}; the class dim is empty")


@register
class CrossEntropy(NN):
    name = "cross_entropy"
    arity = (2, 2)
    attrs = {"reduction": REDUCTION}
    doc = "logsumexp(logits) - logits[target] over the last dim; reduction mean|sum|none"

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        lg, t = tuple(shapes[0]), tuple(shapes[1])
        _ce_shapes(self.name, lg, t)
        if attrs["reduction"] == "none":
            return [t]
        if attrs["reduction"] == "mean" and int(np.prod(t, dtype=object)) == 0:
            raise ShapeError(f"{self.name}: mean over an empty target of shape {list(t)}")
        return [()]

    def out_dtypes(self, in_dtypes, attrs):
        need_int(self.name, 1, in_dtypes)
        return ["float"]

    def eval(self, xs, attrs, ctx):
        lg, t = xs
        lg = as_float(lg, ctx)
        self.infer([lg.shape, t.shape], attrs)
        check_range(self.name, t, lg.shape[-1], "the class dim of input 0 (logits)")
        m, _, _, s = _stats(lg, -1, ctx)
        lse = (m + ctx.fn("log", s))[..., 0]
        picked = np.take_along_axis(lg, t.astype(np.int64)[..., None], axis=-1)[..., 0]
        loss = lse - picked
        red = attrs["reduction"]
        if red == "none":
            return [fin(loss, ctx)]
        total = np.sum(loss) if loss.size else ctx.const(0)
        if red == "sum":
            return [fin(total, ctx)]
        return [fin(total / ctx.const(loss.size), ctx)]

    def deps(self, shapes, attrs):
        t = tuple(shapes[1])
        if attrs["reduction"] != "none":
            return super().deps(shapes, attrs)
        r = len(t)
        return [InputDep(tuple(_aff(i) for i in range(r)) + (AxisDep("all"),)),
                InputDep(tuple(_aff(i) for i in range(r)))]


@register
class CrossEntropyBackward(NN):
    name = "cross_entropy_backward"
    arity = (3, 3)
    attrs = {"reduction": REDUCTION}
    doc = "(softmax(logits) - one_hot(target)) * grad_out (/ N for mean)"

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        g, lg, t = (tuple(s) for s in shapes)
        _ce_shapes(self.name, lg, t)
        want = t if attrs["reduction"] == "none" else ()
        if g != want:
            raise ShapeError(f"{self.name}: input 0 (grad_out) has shape {list(g)} but reduction "
                             f"{attrs['reduction']!r} needs {list(want)}")
        return [lg]

    def out_dtypes(self, in_dtypes, attrs):
        need_int(self.name, 2, in_dtypes)
        return ["float"]

    def eval(self, xs, attrs, ctx):
        g, lg, t = xs
        g, lg = as_float(g, ctx), as_float(lg, ctx)
        self.infer([g.shape, lg.shape, t.shape], attrs)
        C = lg.shape[-1]
        check_range(self.name, t, C, "the class dim of input 1 (logits)")
        p = _softmax(lg, -1, ctx)
        oh = (t.astype(np.int64)[..., None] == np.arange(C)).astype(np.int64)
        d = p - as_float(oh, ctx)
        red = attrs["reduction"]
        if red == "none":
            out = d * g[..., None]
        else:
            out = d * g[()]
            if red == "mean":
                out = out / ctx.const(t.size)
        return [fin(out, ctx)]

    def deps(self, shapes, attrs):
        g, lg, t = (tuple(s) for s in shapes)
        r = len(t)
        lg_dep = InputDep(tuple(_aff(i) for i in range(r)) + (AxisDep("all"),))
        t_dep = InputDep(tuple(_aff(i) for i in range(r)))
        g_dep = t_dep if attrs["reduction"] == "none" else InputDep(())
        return [g_dep, lg_dep, t_dep]


@register
class OneHot(NN):
    name = "one_hot"
    arity = (1, 1)
    attrs = {"num_classes": Attr("dim")}
    doc = "int [...] -> float [..., num_classes] with 1 at the index, 0 elsewhere"

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        if attrs["num_classes"] < 0:
            raise ShapeError(f"one_hot: num_classes {attrs['num_classes']} is negative")
        return [tuple(shapes[0]) + (attrs["num_classes"],)]

    def out_dtypes(self, in_dtypes, attrs):
        need_int(self.name, 0, in_dtypes)
        return ["float"]

    def eval(self, xs, attrs, ctx):
        x = xs[0]
        C = attrs["num_classes"]
        check_range(self.name, x, C, "num_classes")
        oh = (x.astype(np.int64)[..., None] == np.arange(C)).astype(np.int64)
        return [fin(as_float(oh, ctx), ctx)]

    def deps(self, shapes, attrs):
        s = tuple(shapes[0])
        return [InputDep(tuple(_aff(i) for i in range(len(s))))]



