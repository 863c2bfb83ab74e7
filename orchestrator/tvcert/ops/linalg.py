"""Linear algebra: matmul (torch.matmul semantics) and einsum.

Both are bilinear (linear in each input separately, the others fixed); ``linear`` is False
because they are not additive in all inputs jointly.
"""
from __future__ import annotations

import numpy as np

from .base import Attr, AxisDep, InputDep, OpSpec, ShapeError, register
from .elementwise import as_float, check_arity, fin, is_int


def _mm_plan(a, b):
    """Return (out_shape, a2, b2, drop_m, drop_n, batch) for torch.matmul shapes."""
    a, b = tuple(a), tuple(b)
    if len(a) == 0 or len(b) == 0:
        which = 0 if len(a) == 0 else 1
        raise ShapeError(f"input {which} of matmul is a scalar (rank 0); matmul needs rank >= 1")
    drop_m = len(a) == 1
    drop_n = len(b) == 1
    a2 = (1,) + a if drop_m else a
    b2 = b + (1,) if drop_n else b
    if a2[-1] != b2[-2]:
        raise ShapeError(
            f"input 1 has shape {list(b)} but matmul needs its dim "
            f"{-1 if drop_n else -2} to equal {a[-1]} (input 0's dim -1)")
    ba, bb = a2[:-2], b2[:-2]
    n = max(len(ba), len(bb))
    pa = (1,) * (n - len(ba)) + ba
    pb = (1,) * (n - len(bb)) + bb
    batch = []
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x != y and x != 1 and y != 1:
            raise ShapeError(
                f"matmul batch dims do not broadcast: input 0 has shape {list(a)}, "
                f"input 1 has shape {list(b)} (batch dim {i}: {x} vs {y})")
        batch.append(max(x, y) if min(x, y) != 0 else 0)
    out = tuple(batch) + (() if drop_m else (a2[-2],)) + (() if drop_n else (b2[-1],))
    return out, drop_m, drop_n, tuple(batch)


@register
class Matmul(OpSpec):
    name = "matmul"
    category = "linalg"
    arity = (2, 2)
    linear = False  # bilinear: linear in each input separately

    def linear_in(self, attrs):
        return (0, 1)  # OpFlags.matmul_linear_l / matmul_linear_r, matmul_homogeneous
    doc = ("torch.matmul: [..., M, K] @ [..., K, N] -> [broadcast(...), M, N]; a rank-1 left "
           "operand gets a 1 prepended (then removed), a rank-1 right operand a 1 appended")

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        return [_mm_plan(shapes[0], shapes[1])[0]]

    def out_dtypes(self, in_dtypes, attrs):
        return ["int" if all(d == "int" for d in in_dtypes) else "float"]

    def eval(self, xs, attrs, ctx):
        a, b = xs
        if is_int(a) and is_int(b):
            return [fin(np.matmul(a, b), ctx, "int")]
        a, b = as_float(a, ctx), as_float(b, ctx)
        return [fin(np.matmul(a, b), ctx)]

    def deps(self, shapes, attrs):
        a, b = tuple(shapes[0]), tuple(shapes[1])
        out, drop_m, drop_n, batch = _mm_plan(a, b)
        nb = len(batch)
        m_pos = None if drop_m else nb
        n_pos = None if drop_n else nb + (0 if drop_m else 1)

        def batch_axes(bshape):
            axes = []
            off = nb - len(bshape)
            for i, s in enumerate(bshape):
                o = off + i
                if s == 1 and batch[o] != 1:
                    axes.append(AxisDep("affine", (), 0))
                else:
                    axes.append(AxisDep("affine", ((o, 1),), 0))
            return axes

        # input 0
        if drop_m:
            da = [AxisDep("all")]
        else:
            da = batch_axes(a[:-2]) + [AxisDep("affine", ((m_pos, 1),), 0), AxisDep("all")]
        if drop_n:
            db = [AxisDep("all")]
        else:
            db = batch_axes(b[:-2]) + [AxisDep("all"), AxisDep("affine", ((n_pos, 1),), 0)]
        return [InputDep(tuple(da)), InputDep(tuple(db))]


def parse_equation(eq: str, shapes):
    """Validate an einsum equation against input shapes.

    Returns (input letter strings, output letters, size of each letter)."""
    if not isinstance(eq, str) or not eq:
        raise ShapeError("einsum equation is empty")
    s = eq.replace(" ", "")
    if "." in s:
        raise ShapeError(f"einsum equation {eq!r}: ellipsis is not supported")
    if s.count("->") > 1:
        raise ShapeError(f"einsum equation {eq!r} has more than one '->'")
    if "->" in s:
        lhs, rhs = s.split("->")
    else:
        lhs, rhs = s, None
    terms = lhs.split(",")
    for t in terms + ([rhs] if rhs is not None else []):
        for c in t:
            if not (c.isascii() and c.isalpha()):
                raise ShapeError(f"einsum equation {eq!r}: {c!r} is not a letter")
    if len(terms) != len(shapes):
        raise ShapeError(f"einsum equation {eq!r} names {len(terms)} operands but "
                         f"{len(shapes)} inputs were given")
    sizes: dict[str, int] = {}
    first: dict[str, tuple[int, int]] = {}
    for i, (t, sh) in enumerate(zip(terms, shapes)):
        if len(t) != len(sh):
            raise ShapeError(f"input {i} has shape {list(sh)} (rank {len(sh)}) but einsum term "
                             f"{t!r} needs rank {len(t)}")
        for j, (c, n) in enumerate(zip(t, sh)):
            if c in sizes and sizes[c] != n:
                pi, pj = first[c]
                raise ShapeError(f"input {i} has shape {list(sh)}: einsum letter {c!r} is size "
                                 f"{n} at its dim {j} but size {sizes[c]} at input {pi}'s dim {pj}")
            if c not in sizes:
                sizes[c] = n
                first[c] = (i, j)
    if rhs is None:
        counts: dict[str, int] = {}
        for t in terms:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        rhs = "".join(sorted(c for c, k in counts.items() if k == 1))
    for c in rhs:
        if c not in sizes:
            raise ShapeError(f"einsum equation {eq!r}: output letter {c!r} is not in any input")
    if len(set(rhs)) != len(rhs):
        raise ShapeError(f"einsum equation {eq!r}: output repeats a letter")
    return terms, rhs, sizes


@register
class Einsum(OpSpec):
    name = "einsum"
    category = "linalg"
    arity = (1, None)
    linear = False  # multilinear: linear in each input separately
    attrs = {"equation": Attr("str")}

    def linear_in(self, attrs):
        # every operand occurs once in each product of the sum (OpFlags.einsum_linear, einsum_multi_homogeneous)
        eq = attrs["equation"].replace(" ", "")
        return tuple(range(len(eq.split("->")[0].split(","))))
    doc = ("einsum with an explicit or implicit output ('bsh,hf->bsf'); no ellipsis; sizes of a "
           "letter must agree exactly (no broadcasting)")

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        terms, rhs, sizes = parse_equation(attrs["equation"], shapes)
        return [tuple(sizes[c] for c in rhs)]

    def out_dtypes(self, in_dtypes, attrs):
        return ["int" if all(d == "int" for d in in_dtypes) else "float"]

    def eval(self, xs, attrs, ctx):
        terms, rhs, _ = parse_equation(attrs["equation"], [x.shape for x in xs])
        eq = ",".join(terms) + "->" + rhs
        if all(is_int(x) for x in xs):
            return [fin(np.einsum(eq, *xs), ctx, "int")]
        xs = [as_float(x, ctx) for x in xs]
        if ctx.exact:
            return [fin(np.einsum(eq, *xs), ctx)]
        return [fin(np.einsum(eq, *xs, optimize=len(xs) > 2), ctx)]

    def deps(self, shapes, attrs):
        terms, rhs, _ = parse_equation(attrs["equation"], shapes)
        out = []
        for t in terms:
            axes = []
            for c in t:
                if c in rhs:
                    axes.append(AxisDep("affine", ((rhs.index(c), 1),), 0))
                else:
                    axes.append(AxisDep("all"))
            out.append(InputDep(tuple(axes)))
        return out
