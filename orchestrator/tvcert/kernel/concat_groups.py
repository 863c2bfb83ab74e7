"""The ``concat_groups`` binding layout: a fused tensor whose parts have different sizes (a GQA ``w_qkv``, issue 15 §3).

Tensor-parallel code for grouped-query attention holds, on rank r of p, the rows ``[Wq_r; Wk_r; Wv_r]`` of the
fused weight ``[Wq; Wk; Wv]``, where Wq has more rows than Wk and Wv.  The interleave layout (kernel/interleave.py,
a reshape / transpose / reshape chain) needs equal parts, and no chain of one-input layout ops reorders parts of
different sizes.  ``concat_groups(dim, sizes, groups)`` keeps "one local tensor, one logical input": dim ``dim`` of
the logical tensor is cut into parts of ``sizes`` (each a multiple of ``groups``), and the result holds, for each
group g in order, block g of every part in part order::

    concat_groups(E)[g*N + off_i + t] = E[groups*off_i + g*n_i + t]     (n_i = sizes[i] / groups, N = sum n_i,
                                                                          off_i = n_0 + .. + n_{i-1}, t < n_i)

so its plain Shard(dim) over an axis of size ``groups`` is rank r's block of each part.  It is a macro over
registered ops (split, reshape to [.., groups, n_i, ..], concat along the new dim, reshape back), so the
interpreter evaluates and the kernel's input facts spell it with ops whose semantics are already defined; with
equal sizes it is the interleave.  No kernel rule reads the spelling yet: a program over such an input is
VERIFIED only through rules that hold for any expression, else UNKNOWN, and a wrong program is REFUTED by the
interpreter.  ``Rules/ConcatGroups.v`` proves the index equation and the split / concat facts a rule would use.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from ..ops import REGISTRY, resolve_attrs
from ..ops.base import Attr, ShapeError

NAME = "concat_groups"


class ConcatGroupsSpec:
    """Duck-types the part of an OpSpec a binding layout step uses: ``attrs``, ``infer`` and ``eval``."""
    name = NAME
    attrs = {"dim": Attr("int"), "sizes": Attr("dims"), "groups": Attr("dim")}
    doc = "per group g, block g of each part of dim `dim` cut into `sizes` (a fused GQA w_qkv on rank g)"

    def check(self, shape: Sequence[int], attrs: Mapping[str, Any]) -> tuple[int, list[int], int]:
        nd = len(shape)
        d, sizes, g = attrs["dim"], [int(s) for s in attrs["sizes"]], int(attrs["groups"])
        if not -nd <= d < nd:
            raise ShapeError(f"{NAME}: dim {d} out of range for shape {list(shape)}")
        d %= nd
        if g < 1 or not sizes or any(s <= 0 or s % g for s in sizes):
            raise ShapeError(f"{NAME}: sizes {sizes} must be positive multiples of groups={g}")
        if sum(sizes) != shape[d]:
            raise ShapeError(f"{NAME}: sizes {sizes} sum to {sum(sizes)}, not dim {d} of size {shape[d]}")
        return d, sizes, g

    def infer(self, shapes, attrs):
        self.check(shapes[0], attrs)
        return [tuple(shapes[0])]

    def eval(self, xs, attrs, ctx):
        def apply(op, raw, args):
            spec = REGISTRY[op]
            return spec.eval(args, resolve_attrs(spec, raw, {}), ctx)
        return [expand(self, xs[0].shape, attrs, xs[0], apply)]


SPEC = ConcatGroupsSpec()


def expand(spec: ConcatGroupsSpec, shape: Sequence[int], attrs: Mapping[str, Any], x,
           apply: Callable[[str, dict, list], list]):
    """The macro: ``apply(op, attrs, args) -> outputs`` on registered ops (numpy values or expressions)."""
    d, sizes, g = spec.check(shape, attrs)
    s = list(shape)
    parts = apply("split", {"dim": d, "sizes": sizes}, [x])
    blocks = [apply("reshape", {"shape": s[:d] + [g, n // g] + s[d + 1:]}, [part])[0] for n, part in zip(sizes, parts)]
    cat = apply("concat", {"dim": d + 1}, blocks)[0]
    return apply("reshape", {"shape": s}, [cat])[0]


def layout_spec(op: str):
    """The spec of a binding layout step: a registered op, or this macro."""
    return SPEC if op == NAME else REGISTRY[op]


def build_expr(X, e: int, attrs: Mapping[str, Any]) -> int:
    """``concat_groups(e)`` spelled in the kernel's expression table (attrs resolved)."""
    def apply(op, raw, args):
        if op == "split":
            return X.mk_multi(op, {"dim": raw["dim"], "sizes": tuple(raw["sizes"])}, args)
        if op == "reshape":
            return [X.mk(op, {"shape": tuple(raw["shape"])}, args)]
        return [X.mk(op, raw, args)]
    return expand(SPEC, X[e].shape, attrs, e, apply)


def source_index(sizes: Sequence[int], groups: int, j: int) -> int:
    """The logical position concat_groups' position ``j`` reads (the index equation above; tests and
    ``Rules/ConcatGroups.v`` state it)."""
    per = [n // groups for n in sizes]
    g, u = divmod(j, sum(per))
    off = 0
    for n in per:
        if u < n:
            return groups * off + g * n + u
        u, off = u - n, off + n
    raise IndexError(j)


__all__ = ["NAME", "SPEC", "build_expr", "expand", "layout_spec", "source_index"]
