"""Index domains: every value a declared int range admits must index inside the tables the logical graph reads.

The logical graph is the specification, and torch refuses an index outside the indexed dim (embedding, gather,
index_select, one_hot, cross-entropy's target, embedding_backward, scatter_add / index_add).  A plan whose
declared range admits such a value claims equality on inputs where the logical side has no value: a
vocab-parallel embedding over ids in [-100, v) (each rank masks the ids outside its block, so -100 gives zeros)
was VERIFIED.  The loader (``plan.check_shapes``, at every instantiation it checks) computes, for each index
operand of the logical graph, the values it can hold -- a union of intervals: an input in [lo, hi) holds lo and
[0, hi) when lo < 0 < hi (the padded labels the interpreter draws, ``interp.random_value``), else [lo, hi);
shape-only ops keep values; ``where`` / ``masked_fill`` arms are recomputed (through elementwise ops) under their condition when it compares a
tensor with a constant (cross-entropy's ``where(t != -100, t, 0)``, wrapped negative indices ``where(i < 0, i + n,
i)``); +, -, *, abs, relu, square, min / max by interval arithmetic, a cast to int of x / c by truncation; casts,
concat, pad and constants keep or join values -- and refuses the plan (exit 3, naming the input) when a value
leaves [0, size), or when a declared input reaches the index through ops it cannot bound (``cast(float(ids))`` and
``ids / -1`` were ways around it): no proof that the logical graph is defined on the declared range.  An int input
with no declared range holds any integer, so an index it reaches is refused too (a rangeless vocab-parallel
embedding VERIFIED, the logical lookup of -100 undefined); so is one a float input reaches (``cast(x, int)``;
topk's indices hold [0, size) of their dim, not the size of the table they index).  An index no input reaches
(constants, iota) is the same on every input and is not checked here.
"""
from __future__ import annotations

from typing import Mapping, Optional

from ..ops import REGISTRY, AttrError, resolve_attrs

Dom = tuple  # sorted, disjoint closed intervals ((lo, hi), ...); None = unknown
MAX_PIECES = 8
UNDER_DEPTH = 6  # ops between a where's condition and its arms recomputed under the condition
SAME_VALUES = {"reshape", "view", "permute", "transpose", "expand", "slice", "flatten", "squeeze", "unsqueeze",
               "flip", "split", "amax", "amin"}
COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
BOOLS = COMPARE | {"logical_and", "logical_or", "logical_not"}
FLIP = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le", "eq": "eq", "ne": "ne"}
NEGATE = {"lt": "ge", "ge": "lt", "le": "gt", "gt": "le", "eq": "ne", "ne": "eq"}


class IndexDomainError(ValueError):
    """An index operand of the logical graph can hold a value outside the indexed dim; ``path`` locates the op."""

    def __init__(self, path: str, msg: str):
        super().__init__(f"{path}: {msg}")
        self.path = path
        self.msg = msg


def _norm(pieces) -> Optional[Dom]:
    ps = sorted((int(a), int(b)) for a, b in pieces if a <= b)
    out: list[list[int]] = []
    for a, b in ps:
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    if len(out) > MAX_PIECES:
        out = [[out[0][0], max(b for _, b in out)]]
    return tuple(map(tuple, out))  # () when no value is possible (an arm its condition rules out), not unknown


def _union(*ds) -> Optional[Dom]:
    if any(d is None for d in ds):
        return None
    return _norm([p for d in ds for p in d])


def _pairwise(a: Dom, b: Dom, f) -> Optional[Dom]:
    return _int64([f(x, y) for x in a for y in b])


def _int64(pieces) -> Optional[Dom]:
    """Arithmetic's values, or None (unbounded) past int64: an int tensor wraps there (ids * 2**62 at ids = 2 is
    -2**63), so the interval bound no longer holds."""
    if any(not -(1 << 63) <= v < (1 << 63) for p in pieces for v in p):
        return None
    return _norm(pieces)


def _mul(x, y):
    c = [x[0] * y[0], x[0] * y[1], x[1] * y[0], x[1] * y[1]]
    return (min(c), max(c))


UNARY = {"neg": lambda a, b: (-b, -a), "abs": lambda a, b: (0 if a <= 0 <= b else min(abs(a), abs(b)), max(abs(a), abs(b))),
         "relu": lambda a, b: (max(a, 0), max(b, 0)),
         "square": lambda a, b: (0 if a <= 0 <= b else min(a * a, b * b), max(a * a, b * b))}
BINARY = {"add": lambda x, y: (x[0] + y[0], x[1] + y[1]), "sub": lambda x, y: (x[0] - y[1], x[1] - y[0]),
          "mul": _mul, "maximum": lambda x, y: (max(x[0], y[0]), max(x[1], y[1])),
          "minimum": lambda x, y: (min(x[0], y[0]), min(x[1], y[1]))}


def _refine(d: Optional[Dom], op: str, c: int) -> Optional[Dom]:
    """The values of ``d`` for which ``x op c`` holds."""
    if not d:
        return d
    big = max(abs(c), max(abs(b) for p in d for b in p)) + 1
    keep = {"lt": [(-big, c - 1)], "le": [(-big, c)], "gt": [(c + 1, big)], "ge": [(c, big)], "eq": [(c, c)],
            "ne": [(-big, c - 1), (c + 1, big)]}[op]
    return _norm([(max(a, u), min(b, v)) for a, b in d for u, v in keep])


def _int_value(v) -> Optional[int]:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _leaves(v):
    if isinstance(v, (list, tuple)):
        for x in v:
            yield from _leaves(x)
    else:
        yield v


def _trunc(a: int, c: int) -> int:
    q = abs(a) // abs(c)
    return q if (a >= 0) == (c > 0) else -q


def input_domain(lo: int, hi: int) -> Dom:
    """The values a declared int range [lo, hi) stands for (what the interpreter draws)."""
    return ((lo, lo), (0, hi - 1)) if lo < 0 < hi else ((lo, hi - 1),)


class _Domains:
    def __init__(self, graph, ranges: Mapping[str, tuple[int, int]], env, types):
        self.env, self.types = env, types
        self.prod = graph.producers()
        self.dom: dict[str, Optional[Dom]] = {}
        self.cval: dict[str, int] = {}  # scalar constants of any dtype with an integer value
        self._attrs: dict[int, dict] = {}  # node id -> resolved attributes (arms are recomputed under conditions)
        self.quot: dict[str, tuple] = {}  # x / c with c a nonzero integer constant: (x's values, c)
        self.src: dict[str, frozenset] = {}
        self.undeclared = set()  # int inputs with no declared range: any integer (the loader bounds nothing)
        for t in graph.inputs:  # every input is a source: cast(x) or topk(x)'s indices of a float x index too
            self.src[t.name] = frozenset([t.name])
            if t.dtype == "int":
                if t.name in ranges:
                    self.dom[t.name] = input_domain(*ranges[t.name])
                else:
                    self.undeclared.add(t.name)

    def attrs(self, n) -> dict:
        got = self._attrs.get(id(n))
        if got is None:
            try:
                got = resolve_attrs(REGISTRY[n.op], n.attrs, self.env)
            except (AttrError, ValueError, TypeError):
                got = {}
            self._attrs[id(n)] = got
        return got

    def const_of(self, name: str) -> Optional[int]:
        if name in self.cval:
            return self.cval[name]
        d = self.dom.get(name)
        return d[0][0] if d and len(d) == 1 and d[0][0] == d[0][1] else None

    def comparison(self, cond: str):
        """(x, op, c) when ``cond`` is ``x op c`` / ``c op x`` with c a constant, else None."""
        n = self.prod.get(cond)
        if n is not None and n.op == "logical_not" and n.inputs:
            cmp = self.comparison(n.inputs[0])
            return cmp and (cmp[0], NEGATE[cmp[1]], cmp[2])
        if n is None or n.op not in COMPARE or len(n.inputs) != 2:
            return None
        a, b = n.inputs
        for u, v in ((a, b), (b, a)):  # a 0 / 1 mask compared with 0 (bool(mask), mask != 0)
            p = self.prod.get(u)
            if p is not None and p.op in COMPARE and self.const_of(v) == 0 and n.op in ("ne", "eq"):
                cmp = self.comparison(u)
                return cmp and (cmp if n.op == "ne" else (cmp[0], NEGATE[cmp[1]], cmp[2]))
        if self.const_of(b) is not None:
            return a, n.op, self.const_of(b)
        if self.const_of(a) is not None:
            return b, FLIP[n.op], self.const_of(a)
        return None

    def arm(self, cond: str, x: str, holds: bool) -> Optional[Dom]:
        """The values of ``x`` where ``cond`` holds (``holds``) or not: when cond compares a tensor t with a constant,
        t's values are refined and x is recomputed from them (``where(i < 0, i + size, i)``, negative indices
        wrapped, holds only [0, size) for i in [-size, size))."""
        cmp = self.comparison(cond)
        if cmp is None:
            return self.dom.get(x)
        assume = (cmp[0], cmp[1] if holds else NEGATE[cmp[1]], cmp[2])
        if _refine(self.dom.get(cmp[0]), assume[1], assume[2]) == ():  # the condition never holds: no value read
            return ()
        return self.under(x, assume, UNDER_DEPTH)

    def under(self, x: str, assume, depth: int) -> Optional[Dom]:
        """The values of ``x`` where ``t op c`` holds (``assume`` = (t, op, c)), recomputed up to ``depth`` ops."""
        t, op, c = assume
        if x == t:
            return _refine(self.dom.get(t), op, c)
        n = self.prod.get(x)
        if n is None or depth <= 0 or x not in self.dom or REGISTRY[n.op].category != "elementwise":
            # only an elementwise op reads t at the index the condition does: through a flip, an amax, a slice or
            # an unsqueeze the arm's values come from other elements of t than the one the condition tested
            # (where(ids < 0, flip(ids) + 8, flip(ids)) was passed as [0, 8) and can be -8 or 15)
            return self.dom.get(x)
        return self.step(n, lambda i: self.under(i, assume, depth - 1))

    def step(self, n, dom_of=None) -> Optional[Dom]:
        op, ins, at = n.op, n.inputs, self.attrs(n)
        ds = [(dom_of or self.dom.get)(i) for i in ins]
        if op == "const":  # (a float constant too: a domain is a set of integer values, whatever the dtype)
            vals = [_int_value(v) for v in _leaves(at.get("value"))]
            if not vals or None in vals:
                return None
            return _norm([(v, v) for v in vals] if len(vals) <= 64 else [(min(vals), max(vals))])
        if op == "iota" and at.get("dtype", "int") == "int" and at.get("size"):
            a, b = at["start"], at["start"] + (at["size"] - 1) * at["step"]
            return _norm([(min(a, b), max(a, b))])
        if op == "cast" and at.get("dtype") == "int" and ins[0] in self.quot:  # trunc(x / c), monotone in x
            d, c = self.quot[ins[0]]
            return _norm([(min(_trunc(a, c), _trunc(b, c)), max(_trunc(a, c), _trunc(b, c))) for a, b in d])
        if op in SAME_VALUES or op == "cast":  # integer values survive a cast either way (float64: |v| < 2^53)
            return ds[0] if ds[0] is None or all(abs(b) < 2 ** 53 for p in ds[0] for b in p) else None
        if op in BOOLS:
            return ((0, 1),)
        if op == "concat":
            return _union(*ds)
        if op == "pad":
            v = _int_value(at.get("value", 0))
            return None if v is None else _union(ds[0], ((v, v),))
        if op in UNARY and ds and ds[0] is not None:
            return _int64([UNARY[op](a, b) for a, b in ds[0]])
        if op in ("add_scalar", "scale"):
            v = _int_value(at.get("value"))
            if v is None or ds[0] is None:
                return None
            return _pairwise(ds[0], ((v, v),), BINARY["add" if op == "add_scalar" else "mul"])
        if op in BINARY and len(ds) == 2 and None not in ds:
            return _pairwise(ds[0], ds[1], BINARY[op])
        if op == "where" and len(ins) == 3:
            return _union(self.arm(ins[0], ins[1], True), self.arm(ins[0], ins[2], False))
        if op == "masked_fill" and len(ins) == 2:
            v = _int_value(at.get("value"))
            return None if v is None else _union(self.arm(ins[1], ins[0], False), ((v, v),))
        return None


def _indexed(n, at, types) -> list[tuple[str, int, str]]:
    """(index operand, size it must stay below, what) for each index an op reads."""
    if not at and REGISTRY[n.op].attrs:
        return []
    shape = lambda k: tuple(types[n.inputs[k]][0])  # noqa: E731
    if n.op == "embedding":
        return [(n.inputs[1], shape(0)[0], "the rows of its weight")]
    if n.op in ("gather", "index_select", "scatter_add", "index_add") and len(shape(0)) > 0:
        d = at["dim"] % len(shape(0))
        return [(n.inputs[1], shape(0)[d], f"dim {d} of its input 0")]
    if n.op == "embedding_backward":
        return [(n.inputs[1], at["num_weights"], "num_weights")]
    if n.op == "one_hot":
        return [(n.inputs[0], at["num_classes"], "num_classes")]
    if n.op == "cross_entropy":
        return [(n.inputs[1], shape(0)[-1], "the class dim of its logits")]
    if n.op == "cross_entropy_backward":
        return [(n.inputs[2], shape(1)[-1], "the class dim of its logits")]
    return []


def check_index_domains(graph, ranges: Mapping[str, tuple[int, int]], env, types) -> None:
    """IndexDomainError when an index operand of ``graph`` that a declared int input reaches can hold a value outside
    [0, size) for some input in its declared range ``ranges`` (name -> [lo, hi)), or when its values cannot be
    bounded (computed by ops this analysis does not read: no proof that the logical graph is defined there);
    ``types``: the graph's inferred (shape, dtype) at ``env``."""
    D = _Domains(graph, ranges, env, types)
    for n in graph.nodes:
        at = D.attrs(n)
        if n.op == "const" and _int_value(at.get("value")) is not None:
            D.cval[n.outputs[0]] = _int_value(at.get("value"))
        if n.op == "div" and len(n.inputs) == 2 and D.dom.get(n.inputs[0]) and D.const_of(n.inputs[1]):
            D.quot[n.outputs[0]] = (D.dom[n.inputs[0]], D.const_of(n.inputs[1]))
        for ix, size, what in _indexed(n, at, types):
            names = ", ".join(map(repr, sorted(D.src.get(ix, ()))))
            if not names:  # an index of constants only is the same on every input: not a range's fault
                continue
            d = D.dom.get(ix)
            free = sorted(D.src.get(ix, frozenset()) & D.undeclared)
            if d is None and free:  # (a rangeless mask that only selects, where(m != 0, ids, 0), leaves d bounded)
                raise IndexDomainError(n.path, f"int input {free[0]!r} declares no range, but {n.op} indexes {what} "
                                               f"(size {size}) with {ix!r}, computed from it: no proof that the logical "
                                               f"graph has a value on every input (declare its range)")
            if d is None:
                raise IndexDomainError(n.path, f"input {names}: {n.op} indexes {what} (size {size}) with {ix!r}, "
                                               f"computed from it by ops whose values tvcert does not bound: no proof "
                                               f"that the logical graph has a value on every input in the declared "
                                               f"range (clamp, or mask with where(i op c, ...))")
            bad = [v for v in (d[0][0], d[-1][1]) if not 0 <= v < size] if d else []
            if bad:
                raise IndexDomainError(n.path, f"input {names}: its declared range admits inputs for which {ix!r} "
                                               f"is {bad[0]}, but {n.op} indexes {what} (size {size}) with it: the "
                                               f"logical graph has no value there (declare a range inside the table)")
        d = D.step(n)
        reach = frozenset().union(*(D.src.get(i, frozenset()) for i in n.inputs))
        for o in n.outputs[:1] if n.op != "split" else n.outputs:
            if reach:
                D.src[o] = reach
            if d is not None:
                D.dom[o] = d
        if n.op == "topk" and len(n.outputs) == 2 and n.inputs[0] in types:  # indices along dim: [0, size)
            shp = tuple(types[n.inputs[0]][0])
            if reach:
                D.src[n.outputs[1]] = reach
            if shp and at:
                D.dom[n.outputs[1]] = _norm([(0, shp[at.get("dim", -1) % len(shp)] - 1)])
