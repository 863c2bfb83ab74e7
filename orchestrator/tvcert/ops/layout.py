"""Layout ops (reshape, permute, slice, concat, split, pad, expand, ...) and the sources
``const`` and ``iota``.

Strictness (deliberate, to catch plan mistakes): ``slice`` bounds must satisfy
0 <= start <= end <= size (no clamping, no negative bounds); ``squeeze`` dims must have size 1
(an empty list squeezes nothing); ``pad`` needs exactly one (before, after) pair per dim, all
non-negative.
"""
from __future__ import annotations

import numpy as np

from .base import Attr, AxisDep, InputDep, OpSpec, ShapeError, identity_dep, norm_dim, register
from .elementwise import check_arity, fin, is_int


def _nd(d, rank, op, what="dim"):
    try:
        return norm_dim(d, rank, what)
    except ShapeError:
        raise ShapeError(f"{op}: {what} {d} is out of range for input 0 of rank {rank}") from None


def _like(x, v, ctx):
    return fin(v, ctx, "int" if is_int(x) else "float")


def _aff(out_dim, coef=1, const=0):
    return AxisDep("affine", ((out_dim, coef),), const)


def _prefix_suffix_dep(ins, outs) -> InputDep:
    """Row-major reshape: dims in a common prefix/suffix map one-to-one, the rest "other"."""
    p = 0
    while p < len(ins) and p < len(outs) and ins[p] == outs[p]:
        p += 1
    q = 0
    while (q < len(ins) - p and q < len(outs) - p and ins[len(ins) - 1 - q] == outs[len(outs) - 1 - q]):
        q += 1
    axes = []
    for i in range(len(ins)):
        if i < p:
            axes.append(_aff(i))
        elif i >= len(ins) - q:
            axes.append(_aff(len(outs) - (len(ins) - i)))
        else:
            axes.append(AxisDep("other"))
    return InputDep(tuple(axes))


class Layout(OpSpec):
    category = "layout"
    arity = (1, 1)
    linear = True

    def linear_in(self, attrs):
        # every layout op reads its input through an index map, with zeros at masked positions (triu / tril):
        # OpFlags.reindex_linear / masked_reindex_linear and their instances (reshape_op_linear, ...)
        return (0,)


# ---------------------------------------------------------------- reshape / view / flatten


@register
class Reshape(Layout):
    name = "reshape"
    attrs = {"shape": Attr("dims")}
    doc = "row-major reshape; one entry of shape may be -1 (inferred)"

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        want = list(attrs["shape"])
        total = int(np.prod(s, dtype=object)) if s else 1
        if sum(1 for v in want if v == -1) > 1:
            raise ShapeError(f"{self.name}: shape {want} has more than one -1")
        for v in want:
            if v < -1:
                raise ShapeError(f"{self.name}: shape {want} has a negative size {v}")
        known = 1
        for v in want:
            if v != -1:
                known *= v
        if -1 in want:
            if known == 0 or total % known:
                raise ShapeError(f"{self.name}: input 0 has shape {list(s)} ({total} elements), "
                                 f"which cannot be viewed as {want}")
            want[want.index(-1)] = total // known
        elif known != total:
            raise ShapeError(f"{self.name}: input 0 has shape {list(s)} ({total} elements) but "
                             f"shape {want} has {known} elements")
        return [tuple(want)]

    def eval(self, xs, attrs, ctx):
        out = self.infer([xs[0].shape], attrs)[0]
        return [_like(xs[0], xs[0].reshape(out).copy(), ctx)]

    def deps(self, shapes, attrs):
        return [_prefix_suffix_dep(tuple(shapes[0]), self.infer(shapes, attrs)[0])]


@register
class View(Reshape):
    name = "view"
    doc = "same as reshape"


@register
class Flatten(Layout):
    name = "flatten"
    attrs = {"start": Attr("int", False, 0), "end": Attr("int", False, -1)}
    doc = "merge dims start..end (inclusive) into one; a rank-0 input becomes [1]"

    def _range(self, s, attrs):
        r = max(len(s), 1)
        a = _nd(attrs["start"], r, self.name, "start")
        b = _nd(attrs["end"], r, self.name, "end")
        if a > b:
            raise ShapeError(f"flatten: start {attrs['start']} comes after end {attrs['end']} "
                             f"for input 0 of rank {len(s)}")
        return a, b

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        a, b = self._range(s, attrs)
        if not s:
            return [(1,)]
        n = 1
        for v in s[a:b + 1]:
            n *= v
        return [s[:a] + (n,) + s[b + 1:]]

    def eval(self, xs, attrs, ctx):
        out = self.infer([xs[0].shape], attrs)[0]
        return [_like(xs[0], xs[0].reshape(out).copy(), ctx)]

    def deps(self, shapes, attrs):
        return [_prefix_suffix_dep(tuple(shapes[0]), self.infer(shapes, attrs)[0])]


# ---------------------------------------------------------------- permutations


@register
class Permute(Layout):
    name = "permute"
    attrs = {"dims": Attr("ints")}
    doc = "output dim j is input dim dims[j]"

    def _perm(self, s, attrs):
        r = len(s)
        dims = attrs["dims"]
        if len(dims) != r:
            raise ShapeError(f"permute: dims {list(dims)} has {len(dims)} entries but input 0 "
                             f"has rank {r} (shape {list(s)})")
        p = tuple(_nd(d, r, self.name) for d in dims)
        if sorted(p) != list(range(r)):
            raise ShapeError(f"permute: dims {list(dims)} is not a permutation of 0..{r - 1}")
        return p

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        return [tuple(s[d] for d in self._perm(s, attrs))]

    def eval(self, xs, attrs, ctx):
        p = self._perm(xs[0].shape, attrs)
        return [_like(xs[0], np.transpose(xs[0], p).copy(), ctx)]

    def deps(self, shapes, attrs):
        p = self._perm(tuple(shapes[0]), attrs)
        return [InputDep(tuple(_aff(p.index(i)) for i in range(len(p))))]


@register
class Flip(Layout):
    name = "flip"
    attrs = {"dims": Attr("ints")}
    doc = "reverse the order of the entries along each of dims (torch.flip)"

    def _dims(self, s, attrs):
        dims = [_nd(d, len(s), self.name) for d in attrs["dims"]]
        if len(set(dims)) != len(dims):
            raise ShapeError(f"flip: dims {list(attrs['dims'])} repeats a dim")
        return dims

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        self._dims(s, attrs)
        return [s]

    def eval(self, xs, attrs, ctx):
        dims = self._dims(xs[0].shape, attrs)
        return [_like(xs[0], np.flip(xs[0], axis=tuple(dims)).copy() if dims else xs[0].copy(), ctx)]

    def deps(self, shapes, attrs):
        s = tuple(shapes[0])
        dims = self._dims(s, attrs)
        return [InputDep(tuple(_aff(i, -1, s[i] - 1) if i in dims else _aff(i) for i in range(len(s))))]


@register
class Transpose(Layout):
    name = "transpose"
    attrs = {"dim0": Attr("int"), "dim1": Attr("int")}
    doc = "swap dims dim0 and dim1"

    def _perm(self, s, attrs):
        r = len(s)
        a = _nd(attrs["dim0"], r, self.name, "dim0")
        b = _nd(attrs["dim1"], r, self.name, "dim1")
        p = list(range(r))
        if r:
            p[a], p[b] = p[b], p[a]
        return tuple(p)

    infer = Permute.infer
    eval = Permute.eval
    deps = Permute.deps


# ---------------------------------------------------------------- slicing / joining


@register
class Slice(Layout):
    name = "slice"
    attrs = {"dim": Attr("int"), "start": Attr("dim"), "end": Attr("dim"),
             "step": Attr("int", False, 1)}
    doc = "x[start:end:step] along dim; needs 0 <= start <= end <= size and step >= 1"

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        if not s:
            raise ShapeError("slice: input 0 is rank 0")
        d = _nd(attrs["dim"], len(s), self.name)
        a, b, st = attrs["start"], attrs["end"], attrs["step"]
        if st < 1:
            raise ShapeError(f"slice: step must be >= 1, got {st}")
        if not 0 <= a <= b <= s[d]:
            raise ShapeError(f"slice: bounds start={a}, end={b} must satisfy 0 <= start <= end <= "
                             f"{s[d]} (input 0's dim {d}, shape {list(s)})")
        return [s[:d] + (-(-(b - a) // st),) + s[d + 1:]]

    def eval(self, xs, attrs, ctx):
        x = xs[0]
        self.infer([x.shape], attrs)
        d = _nd(attrs["dim"], x.ndim, self.name)
        idx = [slice(None)] * x.ndim
        idx[d] = slice(attrs["start"], attrs["end"], attrs["step"])
        return [_like(x, x[tuple(idx)].copy(), ctx)]

    def deps(self, shapes, attrs):
        s = tuple(shapes[0])
        d = _nd(attrs["dim"], len(s), self.name)
        return [InputDep(tuple(_aff(i, attrs["step"], attrs["start"]) if i == d else _aff(i)
                               for i in range(len(s))))]


@register
class Concat(Layout):
    name = "concat"
    arity = (1, None)
    attrs = {"dim": Attr("int")}
    doc = "concatenate along dim; the other dims must agree"

    def linear_in(self, attrs):
        return ()  # additive jointly in all operands (OpFlags.concat_linear), not in one with the others fixed

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s0 = tuple(shapes[0])
        if not s0:
            raise ShapeError("concat: input 0 is rank 0")
        d = _nd(attrs["dim"], len(s0), self.name)
        total = 0
        for i, s in enumerate(shapes):
            s = tuple(s)
            if len(s) != len(s0):
                raise ShapeError(f"concat: input {i} has shape {list(s)} (rank {len(s)}) but "
                                 f"input 0 has rank {len(s0)}")
            for j in range(len(s0)):
                if j != d and s[j] != s0[j]:
                    raise ShapeError(f"concat: input {i} has shape {list(s)} but its dim {j} must "
                                     f"equal {s0[j]} (input 0's dim {j})")
            total += s[d]
        return [s0[:d] + (total,) + s0[d + 1:]]

    def out_dtypes(self, in_dtypes, attrs):
        return ["int" if all(t == "int" for t in in_dtypes) else "float"]

    def eval(self, xs, attrs, ctx):
        self.infer([x.shape for x in xs], attrs)
        d = _nd(attrs["dim"], xs[0].ndim, self.name)
        if all(is_int(x) for x in xs):
            return [fin(np.concatenate(xs, axis=d), ctx, "int")]
        from .elementwise import as_float
        return [fin(np.concatenate([as_float(x, ctx) for x in xs], axis=d), ctx)]

    def deps(self, shapes, attrs):
        d = _nd(attrs["dim"], len(shapes[0]), self.name)
        out, off = [], 0
        for s in shapes:
            out.append(InputDep(tuple(_aff(i, 1, -off) if i == d else _aff(i)
                                      for i in range(len(s)))))
            off += s[d]
        return out


@register
class Split(Layout):
    name = "split"
    attrs = {"dim": Attr("int"), "sizes": Attr("dims")}
    doc = "split along dim into pieces of the given sizes (which must sum to the dim)"

    def n_outputs(self, attrs):
        sizes = attrs.get("sizes")
        return len(sizes) if isinstance(sizes, (list, tuple)) else 1

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        if not s:
            raise ShapeError("split: input 0 is rank 0")
        d = _nd(attrs["dim"], len(s), self.name)
        sizes = attrs["sizes"]
        if not sizes:
            raise ShapeError("split: sizes is empty")
        if any(v < 0 for v in sizes):
            raise ShapeError(f"split: sizes {list(sizes)} has a negative entry")
        if sum(sizes) != s[d]:
            raise ShapeError(f"split: sizes {list(sizes)} sum to {sum(sizes)} but input 0's dim "
                             f"{d} has size {s[d]} (shape {list(s)})")
        return [s[:d] + (v,) + s[d + 1:] for v in sizes]

    def out_dtypes(self, in_dtypes, attrs):
        return [in_dtypes[0]] * self.n_outputs(attrs)

    def eval(self, xs, attrs, ctx):
        x = xs[0]
        self.infer([x.shape], attrs)
        d = _nd(attrs["dim"], x.ndim, self.name)
        out, off = [], 0
        for v in attrs["sizes"]:
            idx = [slice(None)] * x.ndim
            idx[d] = slice(off, off + v)
            out.append(_like(x, x[tuple(idx)].copy(), ctx))
            off += v
        return out

    def deps(self, shapes, attrs):
        """Dependency map for output 0 (whose offset is 0)."""
        return [InputDep(tuple(_aff(i) for i in range(len(shapes[0]))))]

    def deps_for(self, shapes, attrs, k: int) -> list[InputDep]:
        """Dependency map for output k: in_idx[dim] = out_idx[dim] + offset_k."""
        d = _nd(attrs["dim"], len(shapes[0]), self.name)
        off = sum(attrs["sizes"][:k])
        return [InputDep(tuple(_aff(i, 1, off) if i == d else _aff(i)
                               for i in range(len(shapes[0]))))]


@register
class Pad(Layout):
    name = "pad"
    attrs = {"pads": Attr("dims"), "value": Attr("num", False, 0)}
    doc = "constant padding; pads = [before0, after0, before1, after1, ...], one pair per dim"
    linear = False  # affine, not additive, when value != 0

    def linear_in(self, attrs):
        # OpFlags.pad_zero_linear; a nonzero value sends 0 to a nonzero tensor (OpFlags.pad_nonzero_not_additive)
        return (0,) if attrs.get("value", 0) == 0 else ()

    def _pairs(self, s, attrs):
        p = attrs["pads"]
        if len(p) != 2 * len(s):
            raise ShapeError(f"pad: pads {list(p)} has {len(p)} entries but input 0 of shape "
                             f"{list(s)} needs {2 * len(s)} (one before/after pair per dim)")
        if any(v < 0 for v in p):
            raise ShapeError(f"pad: pads {list(p)} has a negative entry")
        return [(p[2 * i], p[2 * i + 1]) for i in range(len(s))]

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        return [tuple(n + a + b for n, (a, b) in zip(s, self._pairs(s, attrs)))]

    def eval(self, xs, attrs, ctx):
        x = xs[0]
        pairs = self._pairs(x.shape, attrs)
        out_shape = self.infer([x.shape], attrs)[0]
        v = attrs["value"]
        if is_int(x) and isinstance(v, int):
            out = np.full(out_shape, v, dtype=np.int64)
        else:
            from .elementwise import as_float
            x = as_float(x, ctx)
            out = ctx.full(out_shape, v)
        out[tuple(slice(a, a + n) for n, (a, _) in zip(x.shape, pairs))] = x
        return [_like(out, out, ctx)]

    def out_dtypes(self, in_dtypes, attrs):
        return ["int" if in_dtypes[0] == "int" and isinstance(attrs["value"], int) else "float"]

    def deps(self, shapes, attrs):
        s = tuple(shapes[0])
        pairs = self._pairs(s, attrs)
        return [InputDep(tuple(_aff(i, 1, -pairs[i][0]) for i in range(len(s))))]


# ---------------------------------------------------------------- broadcasting / rank


@register
class Expand(Layout):
    name = "expand"
    attrs = {"shape": Attr("dims")}
    doc = "torch.expand: size-1 dims broadcast, -1 keeps a dim, new leading dims may be added"

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        want = list(attrs["shape"])
        if len(want) < len(s):
            raise ShapeError(f"expand: shape {want} has fewer dims than input 0 of shape {list(s)}")
        off = len(want) - len(s)
        out = []
        for j, v in enumerate(want):
            if j < off:
                if v < 0:
                    raise ShapeError(f"expand: new leading dim {j} of shape {want} cannot be {v}")
                out.append(v)
                continue
            n = s[j - off]
            if v == -1:
                out.append(n)
            elif v < 0:
                raise ShapeError(f"expand: shape {want} has a negative size {v}")
            elif n == v or n == 1:
                out.append(v)
            else:
                raise ShapeError(f"expand: input 0 has shape {list(s)}; its dim {j - off} has size "
                                 f"{n}, which cannot be expanded to {v} (only size-1 dims expand)")
        return [tuple(out)]

    def eval(self, xs, attrs, ctx):
        out = self.infer([xs[0].shape], attrs)[0]
        return [_like(xs[0], np.broadcast_to(xs[0], out).copy(), ctx)]

    def deps(self, shapes, attrs):
        return [identity_dep(tuple(shapes[0]), self.infer(shapes, attrs)[0])]


@register
class Squeeze(Layout):
    name = "squeeze"
    attrs = {"dims": Attr("ints")}
    doc = "remove the listed dims, each of which must have size 1"

    def _dims(self, s, attrs):
        out = set()
        for d in attrs["dims"]:
            nd = _nd(d, len(s), self.name)
            if not s:
                raise ShapeError("squeeze: input 0 is rank 0")
            if s[nd] != 1:
                raise ShapeError(f"squeeze: input 0 has shape {list(s)}; its dim {d} has size "
                                 f"{s[nd]}, not 1")
            out.add(nd)
        return out

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        ds = self._dims(s, attrs)
        return [tuple(n for i, n in enumerate(s) if i not in ds)]

    def eval(self, xs, attrs, ctx):
        out = self.infer([xs[0].shape], attrs)[0]
        return [_like(xs[0], xs[0].reshape(out).copy(), ctx)]

    def deps(self, shapes, attrs):
        s = tuple(shapes[0])
        ds = self._dims(s, attrs)
        axes, k = [], 0
        for i in range(len(s)):
            if i in ds:
                axes.append(AxisDep("affine", (), 0))
            else:
                axes.append(_aff(k))
                k += 1
        return [InputDep(tuple(axes))]


@register
class Unsqueeze(Layout):
    name = "unsqueeze"
    attrs = {"dim": Attr("int")}
    doc = "insert a size-1 dim at position dim (of the output)"

    def _dim(self, s, attrs):
        r = len(s) + 1
        d = attrs["dim"]
        if not -r <= d < r:
            raise ShapeError(f"unsqueeze: dim {d} is out of range for input 0 of rank {len(s)} "
                             f"(allowed {-r}..{r - 1})")
        return d % r

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        d = self._dim(s, attrs)
        return [s[:d] + (1,) + s[d:]]

    def eval(self, xs, attrs, ctx):
        out = self.infer([xs[0].shape], attrs)[0]
        return [_like(xs[0], xs[0].reshape(out).copy(), ctx)]

    def deps(self, shapes, attrs):
        s = tuple(shapes[0])
        d = self._dim(s, attrs)
        return [InputDep(tuple(_aff(i if i < d else i + 1) for i in range(len(s))))]


class _Tri(Layout):
    attrs = {"diagonal": Attr("int", False, 0)}

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        s = tuple(shapes[0])
        if len(s) < 2:
            raise ShapeError(f"{self.name}: input 0 has shape {list(s)}; needs rank >= 2")
        return [s]

    def eval(self, xs, attrs, ctx):
        x = xs[0]
        self.infer([x.shape], attrs)
        n, m = x.shape[-2:]
        i = np.arange(n)[:, None]
        j = np.arange(m)[None, :]
        keep = self.keep(j - i, attrs["diagonal"])
        zero = np.int64(0) if is_int(x) else ctx.const(0)
        return [_like(x, np.where(keep, x, zero), ctx)]

    def deps(self, shapes, attrs):
        s = tuple(shapes[0])
        return [identity_dep(s, s)]


@register
class Triu(_Tri):
    name = "triu"
    doc = "keep elements with col - row >= diagonal (last two dims), zero the rest"

    @staticmethod
    def keep(d, k):
        return d >= k


@register
class Tril(_Tri):
    name = "tril"
    doc = "keep elements with col - row <= diagonal (last two dims), zero the rest"

    @staticmethod
    def keep(d, k):
        return d <= k


# ---------------------------------------------------------------- sources


def _literal_shape(v) -> tuple[int, ...]:
    """Shape of a nested-list literal; raises ShapeError if it is ragged."""
    if not isinstance(v, list):
        return ()
    subs = [_literal_shape(x) for x in v]
    if any(s != subs[0] for s in subs[1:]) or any(isinstance(x, list) != isinstance(v[0], list)
                                                  for x in v):
        raise ShapeError("const: value is a ragged nested list (rows of different shapes)")
    return (len(v),) + (subs[0] if subs else ())


def _flat(v):
    if isinstance(v, list):
        for x in v:
            yield from _flat(x)
    else:
        yield v


@register
class Const(OpSpec):
    name = "const"
    category = "source"
    arity = (0, 0)
    attrs = {"value": Attr("tensor"), "shape": Attr("dims", False, None),
             "dtype": Attr("str", False, "float", ("float", "int"))}
    doc = ("a tensor of the given shape filled with value (a number or dim expression), or a "
           "tensor literal (nested list; shape, if given, must equal the literal's shape)")

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        v = attrs["value"]
        shape = attrs["shape"]
        if isinstance(v, list):
            lit = _literal_shape(v)
            if shape is not None and tuple(shape) != lit:
                raise ShapeError(f"const: value is a literal of shape {list(lit)} but shape is "
                                 f"{list(shape)}")
            shape = lit
        shape = tuple(shape) if shape is not None else ()
        if any(n < 0 for n in shape):
            raise ShapeError(f"const: shape {list(shape)} has a negative size")
        if attrs["dtype"] == "int":
            for x in _flat(v):
                if not isinstance(x, int):
                    raise ShapeError(f"const: value {x!r} is not an integer but dtype is int")
        return [shape]

    def out_dtypes(self, in_dtypes, attrs):
        return [attrs["dtype"]]

    def eval(self, xs, attrs, ctx):
        shape = self.infer([], attrs)[0]
        v = attrs["value"]
        if attrs["dtype"] == "int":
            return [np.array(v, dtype=np.int64).reshape(shape) if isinstance(v, list)
                    else np.full(shape, v, dtype=np.int64)]
        if isinstance(v, list):
            return [fin(ctx.asarray(v).reshape(shape), ctx)]
        return [fin(ctx.full(shape, v), ctx)]

    def deps(self, shapes, attrs):
        return []


@register
class Iota(OpSpec):
    name = "iota"
    category = "source"
    arity = (0, 0)
    attrs = {"size": Attr("dim"), "start": Attr("dim", False, 0), "step": Attr("dim", False, 1),
             "dtype": Attr("str", False, "int", ("float", "int"))}
    doc = "1-D tensor [start, start+step, ..., start+(size-1)*step]"

    def infer(self, shapes, attrs):
        check_arity(self, shapes)
        if attrs["size"] < 0:
            raise ShapeError(f"iota: size {attrs['size']} is negative")
        return [(attrs["size"],)]

    def out_dtypes(self, in_dtypes, attrs):
        return [attrs["dtype"]]

    def eval(self, xs, attrs, ctx):
        self.infer([], attrs)
        v = attrs["start"] + attrs["step"] * np.arange(attrs["size"], dtype=np.int64)
        if attrs["dtype"] == "int":
            return [v.astype(np.int64)]
        return [fin(ctx.asarray(v.tolist()) if ctx.exact else v.astype(np.float64), ctx)]

    def deps(self, shapes, attrs):
        return []
