"""Indexing ops: gather, index_select, embedding(+backward), scatter_add, index_add.

Index inputs are int tensors.  Out-of-range indices raise :class:`IndexRangeError` (a
ValueError) in ``eval``; negative indices are out of range (no wrap-around).
The ops are linear in their float (data) inputs for fixed indices.
"""
from __future__ import annotations

import numpy as np

from .base import Attr, AxisDep, InputDep, OpSpec, ShapeError, norm_dim, register
from .elementwise import as_float, check_arity, fin, is_int, need_int


class IndexRangeError(ValueError):
    """An index tensor holds a value outside the indexed dim."""


def check_range(op: str, idx: np.ndarray, size: int, what: str) -> None:
    if idx.size == 0:
        return
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= size:
        bad = lo if lo < 0 else hi
        raise IndexRangeError(f"{op}: index {bad} is out of range for {what} of size {size} "
                              f"(valid 0..{size - 1})")


def _nd(d, rank, op, which=0):
    try:
        return norm_dim(d, rank, "dim")
    except ShapeError:
        raise ShapeError(f"{op}: dim {d} is out of range for input {which} of rank {rank}") from None


def _aff(k):
    return AxisDep("affine", ((k, 1),), 0)


class Indexing(OpSpec):
    category = "index"
    linear = True  # jointly in the data inputs, for fixed indices

    def linear_in(self, attrs):
        # gather / index_select / embedding read the data input through an index map fixed by the index input
        # (OpFlags.gather_linear), embedding_backward sums masked rows of its gradient (OpFlags.embedding_backward_linear)
        return (0,)


@register
class Gather(Indexing):
    name = "gather"
    arity = (2, 2)
    attrs = {"dim": Attr("int")}
    doc = "torch.gather: out[i][j][k] = x[index[i][j][k]][j][k] (dim 0); out has index's shape"

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        x, ix = tuple(shapes[0]), tuple(shapes[1])
        if len(x) != len(ix):
            raise ShapeError(f"gather: input 1 (index) has shape {list(ix)} (rank {len(ix)}) but "
                             f"input 0 has rank {len(x)}; they must match")
        d = _nd(attrs["dim"], len(x), self.name)
        for j in range(len(x)):
            if j != d and ix[j] > x[j]:
                raise ShapeError(f"gather: input 1 (index) has shape {list(ix)}; its dim {j} "
                                 f"must be <= {x[j]} (input 0's dim {j})")
        return [ix]

    def out_dtypes(self, in_dtypes, attrs):
        need_int(self.name, 1, in_dtypes)
        return [in_dtypes[0]]

    def eval(self, xs, attrs, ctx):
        x, ix = xs
        self.infer([x.shape, ix.shape], attrs)
        d = _nd(attrs["dim"], x.ndim, self.name)
        if x.ndim == 0:
            return [x.copy()]
        check_range(self.name, ix, x.shape[d], f"dim {d} of input 0")
        sub = x[tuple(slice(0, n) if j != d else slice(None) for j, n in enumerate(ix.shape))]
        out = np.take_along_axis(sub, ix.astype(np.int64), axis=d)
        return [fin(out, ctx, "int" if is_int(x) else "float")]

    def deps(self, shapes, attrs):
        x, ix = tuple(shapes[0]), tuple(shapes[1])
        d = _nd(attrs["dim"], len(x), self.name)
        return [InputDep(tuple(AxisDep("data") if j == d else _aff(j) for j in range(len(x)))),
                InputDep(tuple(_aff(j) for j in range(len(ix))))]


@register
class IndexSelect(Indexing):
    name = "index_select"
    arity = (2, 2)
    attrs = {"dim": Attr("int")}
    doc = "select entries index[0..n) of x along dim (index 1-D int)"

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        x, ix = tuple(shapes[0]), tuple(shapes[1])
        if len(ix) != 1:
            raise ShapeError(f"index_select: input 1 (index) has shape {list(ix)}; it must be 1-D")
        if not x:
            raise ShapeError("index_select: input 0 is rank 0")
        d = _nd(attrs["dim"], len(x), self.name)
        return [x[:d] + (ix[0],) + x[d + 1:]]

    def out_dtypes(self, in_dtypes, attrs):
        need_int(self.name, 1, in_dtypes)
        return [in_dtypes[0]]

    def eval(self, xs, attrs, ctx):
        x, ix = xs
        self.infer([x.shape, ix.shape], attrs)
        d = _nd(attrs["dim"], x.ndim, self.name)
        check_range(self.name, ix, x.shape[d], f"dim {d} of input 0")
        return [fin(np.take(x, ix.astype(np.int64), axis=d), ctx, "int" if is_int(x) else "float")]

    def deps(self, shapes, attrs):
        x = tuple(shapes[0])
        d = _nd(attrs["dim"], len(x), self.name)
        return [InputDep(tuple(AxisDep("data") if j == d else _aff(j) for j in range(len(x)))),
                InputDep((_aff(d),))]


@register
class Embedding(Indexing):
    name = "embedding"
    arity = (2, 2)
    doc = "weight [V, H], ids [...] -> weight[ids] of shape [..., H]"

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        w, ids = tuple(shapes[0]), tuple(shapes[1])
        if len(w) != 2:
            raise ShapeError(f"embedding: input 0 (weight) has shape {list(w)}; it must be [V, H]")
        return [ids + (w[1],)]

    def out_dtypes(self, in_dtypes, attrs):
        need_int(self.name, 1, in_dtypes)
        return [in_dtypes[0]]

    def eval(self, xs, attrs, ctx):
        w, ids = xs
        self.infer([w.shape, ids.shape], attrs)
        check_range(self.name, ids, w.shape[0], "the rows of input 0 (weight)")
        return [fin(w[ids.astype(np.int64)], ctx, "int" if is_int(w) else "float")]

    def deps(self, shapes, attrs):
        ids = tuple(shapes[1])
        r = len(ids)
        return [InputDep((AxisDep("data"), _aff(r))),
                InputDep(tuple(_aff(j) for j in range(r)))]


@register
class EmbeddingBackward(Indexing):
    name = "embedding_backward"
    arity = (2, 2)
    attrs = {"num_weights": Attr("dim")}
    doc = "grad [..., H], ids [...] -> [num_weights, H]; row v = sum of grad rows with ids == v"

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        g, ids = tuple(shapes[0]), tuple(shapes[1])
        if len(g) != len(ids) + 1 or g[:-1] != ids:
            raise ShapeError(f"embedding_backward: input 0 (grad) has shape {list(g)} but must be "
                             f"input 1 (ids)'s shape {list(ids)} plus a trailing H dim")
        if attrs["num_weights"] < 0:
            raise ShapeError(f"embedding_backward: num_weights {attrs['num_weights']} is negative")
        return [(attrs["num_weights"], g[-1])]

    def out_dtypes(self, in_dtypes, attrs):
        need_int(self.name, 1, in_dtypes)
        return [in_dtypes[0]]

    def eval(self, xs, attrs, ctx):
        g, ids = xs
        shape = self.infer([g.shape, ids.shape], attrs)[0]
        check_range(self.name, ids, shape[0], "num_weights")
        if is_int(g):
            out = np.zeros(shape, dtype=np.int64)
        else:
            out = ctx.zeros(shape)
        np.add.at(out, ids.reshape(-1).astype(np.int64), g.reshape(-1, shape[1]))
        return [fin(out, ctx, "int" if is_int(g) else "float")]

    def deps(self, shapes, attrs):
        ids = tuple(shapes[1])
        return [InputDep(tuple(AxisDep("all") for _ in ids) + (_aff(1),)),
                InputDep(tuple(AxisDep("all") for _ in ids))]


@register
class ScatterAdd(Indexing):
    name = "scatter_add"

    def linear_in(self, attrs):
        return ()  # x + scatter(src) is additive jointly in (x, src), affine in either alone

    arity = (3, 3)
    attrs = {"dim": Attr("int")}
    doc = ("torch.scatter_add: out = x; out[index[i][j][k]][j][k] += src[i][j][k] (dim 0); "
           "index.size(d) <= src.size(d) for all d and <= x.size(d) for d != dim")

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        x, ix, src = (tuple(s) for s in shapes)
        if not (len(x) == len(ix) == len(src)):
            raise ShapeError(f"scatter_add: input 0 {list(x)}, input 1 (index) {list(ix)} and "
                             f"input 2 (src) {list(src)} must have the same rank")
        d = _nd(attrs["dim"], len(x), self.name)
        for j in range(len(x)):
            if ix[j] > src[j]:
                raise ShapeError(f"scatter_add: input 1 (index) has shape {list(ix)}; its dim {j} "
                                 f"must be <= {src[j]} (input 2's dim {j})")
            if j != d and ix[j] > x[j]:
                raise ShapeError(f"scatter_add: input 1 (index) has shape {list(ix)}; its dim {j} "
                                 f"must be <= {x[j]} (input 0's dim {j})")
        return [x]

    def out_dtypes(self, in_dtypes, attrs):
        need_int(self.name, 1, in_dtypes)
        return ["int" if in_dtypes[0] == "int" and in_dtypes[2] == "int" else "float"]

    def eval(self, xs, attrs, ctx):
        x, ix, src = xs
        self.infer([x.shape, ix.shape, src.shape], attrs)
        if x.ndim == 0:
            return [fin(x + src, ctx, "int" if is_int(x) and is_int(src) else "float")]
        d = _nd(attrs["dim"], x.ndim, self.name)
        check_range(self.name, ix, x.shape[d], f"dim {d} of input 0")
        as_int = is_int(x) and is_int(src)
        if not as_int:
            x, src = as_float(x, ctx), as_float(src, ctx)
        out = x.copy()
        grid = list(np.indices(ix.shape, sparse=True))
        grid[d] = ix.astype(np.int64)
        sub = src[tuple(slice(0, n) for n in ix.shape)]
        np.add.at(out, tuple(grid), sub)
        return [fin(out, ctx, "int" if as_int else "float")]

    def deps(self, shapes, attrs):
        x, ix, src = (tuple(s) for s in shapes)
        return [InputDep(tuple(_aff(j) for j in range(len(x)))),
                InputDep(tuple(AxisDep("all") for _ in ix)),
                InputDep(tuple(AxisDep("all") for _ in src))]


@register
class IndexAdd(Indexing):
    name = "index_add"

    def linear_in(self, attrs):
        return ()  # x + scatter(src) is additive jointly in (x, src), affine in either alone

    arity = (3, 3)
    attrs = {"dim": Attr("int")}
    doc = "out = x; out[..., index[i], ...] += src[..., i, ...] along dim (index 1-D)"

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        x, ix, src = (tuple(s) for s in shapes)
        if len(ix) != 1:
            raise ShapeError(f"index_add: input 1 (index) has shape {list(ix)}; it must be 1-D")
        if not x:
            raise ShapeError("index_add: input 0 is rank 0")
        d = _nd(attrs["dim"], len(x), self.name)
        want = x[:d] + (ix[0],) + x[d + 1:]
        if src != want:
            raise ShapeError(f"index_add: input 2 (src) has shape {list(src)} but must be "
                             f"{list(want)} (input 0's shape with dim {d} = len(index))")
        return [x]

    out_dtypes = ScatterAdd.out_dtypes

    def eval(self, xs, attrs, ctx):
        x, ix, src = xs
        self.infer([x.shape, ix.shape, src.shape], attrs)
        d = _nd(attrs["dim"], x.ndim, self.name)
        check_range(self.name, ix, x.shape[d], f"dim {d} of input 0")
        as_int = is_int(x) and is_int(src)
        if not as_int:
            x, src = as_float(x, ctx), as_float(src, ctx)
        out = x.copy()
        np.add.at(out, (slice(None),) * d + (ix.astype(np.int64),), src)
        return [fin(out, ctx, "int" if as_int else "float")]

    def deps(self, shapes, attrs):
        x, ix, src = (tuple(s) for s in shapes)
        d = _nd(attrs["dim"], len(x), self.name)
        return [InputDep(tuple(_aff(j) for j in range(len(x)))),
                InputDep((AxisDep("all"),)),
                InputDep(tuple(AxisDep("all") if j == d else _aff(j) for j in range(len(src))))]
