"""Collectives and point-to-point ops.

A collective names the mesh axis (or axes, flattened in mesh order) it runs over.  Its shape
inference needs the group size, which the graph passes in the resolved attribute ``_p``.
The interpreter evaluates it with ``simulate`` on the inputs of every rank of one group,
ordered by coordinate along the axis; ``eval`` is not used.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .base import Attr, Ctx, OpSpec, ShapeError, norm_dim, register

AXIS = Attr("axes")  # a mesh axis name or a list of names


def axes_of(attrs: Mapping[str, Any]) -> tuple[str, ...]:
    a = attrs["axis"]
    return (a,) if isinstance(a, str) else tuple(a)


class Collective(OpSpec):
    category = "collective"

    def simulate(self, xs: Sequence[np.ndarray], attrs: Mapping[str, Any], ctx: Ctx) -> list[np.ndarray]:
        raise NotImplementedError


def _reduce(xs: Sequence[np.ndarray], how: str, ctx: Ctx) -> np.ndarray:
    if how == "max":
        out = np.maximum.reduce(list(xs)) if len(xs) > 1 else xs[0].copy()
    else:
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        if how == "avg":
            out = out / ctx.const(len(xs))
    # 0-d object arrays decay to scalars under arithmetic: keep an array
    return np.asarray(out, dtype=xs[0].dtype if xs[0].dtype == object else None)


@register
class AllReduce(Collective):
    name = "all_reduce"
    attrs = {"axis": AXIS, "reduce": Attr("str", False, "sum", ("sum", "avg", "max"))}
    doc = "every rank gets the sum / mean / max of the group's tensors"

    def infer(self, shapes, attrs):
        return [shapes[0]]

    def simulate(self, xs, attrs, ctx):
        r = _reduce(xs, attrs["reduce"], ctx)
        return [r.copy() for _ in xs]


@register
class AllGather(Collective):
    name = "all_gather"
    attrs = {"axis": AXIS, "dim": Attr("int")}
    doc = "concatenate the group's tensors along dim, in coordinate order"

    def infer(self, shapes, attrs):
        s = shapes[0]
        if not s:
            raise ShapeError("all_gather: the input is a scalar (rank 0); it needs a dim to concatenate along")
        d = norm_dim(attrs["dim"], len(s))
        return [s[:d] + (s[d] * attrs["_p"],) + s[d + 1:]]

    def simulate(self, xs, attrs, ctx):
        d = norm_dim(attrs["dim"], xs[0].ndim)
        r = np.concatenate(list(xs), axis=d)
        return [r.copy() for _ in xs]


@register
class ReduceScatter(Collective):
    name = "reduce_scatter"
    attrs = {"axis": AXIS, "dim": Attr("int"), "reduce": Attr("str", False, "sum", ("sum", "avg", "max"))}
    doc = "reduce the group's tensors, rank i keeps block i along dim"

    def infer(self, shapes, attrs):
        s = shapes[0]
        if not s:
            raise ShapeError("reduce_scatter: the input is a scalar (rank 0); it needs a dim to scatter along")
        d = norm_dim(attrs["dim"], len(s))
        if s[d] % attrs["_p"]:
            raise ShapeError(f"reduce_scatter: dim {d} of size {s[d]} is not divisible by group size {attrs['_p']}")
        return [s[:d] + (s[d] // attrs["_p"],) + s[d + 1:]]

    def simulate(self, xs, attrs, ctx):
        d = norm_dim(attrs["dim"], xs[0].ndim)
        r = _reduce(xs, attrs["reduce"], ctx)
        return [b.copy() for b in np.split(r, len(xs), axis=d)]


@register
class AllToAll(Collective):
    name = "all_to_all"
    attrs = {"axis": AXIS, "split_dim": Attr("int"), "concat_dim": Attr("int")}
    doc = "rank i sends block j (along split_dim) to rank j, which concatenates along concat_dim"

    def infer(self, shapes, attrs):
        s = list(shapes[0])
        p = attrs["_p"]
        sd = norm_dim(attrs["split_dim"], len(s))
        cd = norm_dim(attrs["concat_dim"], len(s))
        if s[sd] % p:
            raise ShapeError(f"all_to_all: split dim {sd} of size {s[sd]} is not divisible by group size {p}")
        s[sd] //= p
        s[cd] *= p
        return [tuple(s)]

    def simulate(self, xs, attrs, ctx):
        sd = norm_dim(attrs["split_dim"], xs[0].ndim)
        cd = norm_dim(attrs["concat_dim"], xs[0].ndim)
        blocks = [np.split(x, len(xs), axis=sd) for x in xs]
        return [np.concatenate([blocks[i][j] for i in range(len(xs))], axis=cd) for j in range(len(xs))]


@register
class PPermute(Collective):
    name = "ppermute"
    attrs = {"axis": Attr("str"), "shift": Attr("int")}
    doc = "ring shift: rank i receives the tensor of rank (i - shift) mod p (collective_permute)"

    def infer(self, shapes, attrs):
        return [shapes[0]]

    def simulate(self, xs, attrs, ctx):
        p = len(xs)
        return [xs[(i - attrs["shift"]) % p].copy() for i in range(p)]


@register
class Broadcast(Collective):
    name = "broadcast"
    attrs = {"axis": AXIS, "root": Attr("int", False, 0)}
    doc = "every rank gets the tensor of the root rank"

    def infer(self, shapes, attrs):
        if not 0 <= attrs["root"] < attrs["_p"]:
            raise ShapeError(f"broadcast: root {attrs['root']} is not in a group of size {attrs['_p']}")
        return [shapes[0]]

    def simulate(self, xs, attrs, ctx):
        return [xs[attrs["root"]].copy() for _ in xs]


@register
class Send(OpSpec):
    name = "send"
    category = "p2p"
    arity = (1, 1)
    attrs = {"axis": Attr("str"), "to": Attr("dim"), "tag": Attr("str")}
    doc = "send this tensor to the rank whose coordinate on axis is `to` (other coordinates equal)"

    def n_outputs(self, attrs):
        return 0

    def infer(self, shapes, attrs):
        return []


@register
class Recv(OpSpec):
    name = "recv"
    category = "p2p"
    arity = (0, 0)
    attrs = {"axis": Attr("str"), "src": Attr("dim"), "tag": Attr("str"), "shape": Attr("dims"),
             "dtype": Attr("str", False, "float", ("float", "int"))}
    doc = "receive the tensor sent with the same tag by the rank whose coordinate on axis is `src`"

    def infer(self, shapes, attrs):
        return [tuple(attrs["shape"])]

    def out_dtypes(self, in_dtypes, attrs):
        return [attrs["dtype"]]
