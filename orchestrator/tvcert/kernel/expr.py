"""Hash-consed logical expressions.

Every tensor of the logical graph, and every logical value a parallel tensor is a piece of,
is an expression over the logical inputs: ``(op, attrs, args)``.  Interning makes "the
parallel side computed the same thing" an integer comparison.  Shapes are checked on
construction with the op's own shape inference, so an ill-formed expression cannot exist.

Layout ops are canonicalized on construction (transpose -> permute; view / flatten / squeeze /
unsqueeze -> reshape to the inferred shape; a constant's shape and dtype spelled out, an expand of a
fill is the fill): these are
definitional equalities (the same function), not rewrites.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..ops import REGISTRY

Shape = tuple[int, ...]
RESHAPE_LIKE = {"reshape", "view", "flatten", "squeeze", "unsqueeze"}


class ExprError(ValueError):
    """An expression would be ill-formed (its op's shape inference failed)."""


@dataclass(frozen=True)
class Expr:
    op: str
    attrs: str  # canonical JSON of the (logical) attributes
    args: tuple[int, ...]
    shape: Shape
    dtype: str

    def attr_dict(self) -> dict:
        return json.loads(self.attrs)


def canon_attrs(attrs: Mapping[str, Any]) -> str:
    def norm(v):
        if isinstance(v, tuple):
            return [norm(x) for x in v]
        if isinstance(v, list):
            return [norm(x) for x in v]
        if isinstance(v, float) and v.is_integer():
            return int(v)
        return v

    return json.dumps({k: norm(v) for k, v in attrs.items() if not k.startswith("_")}, sort_keys=True,
                      separators=(",", ":"))


DIM_ATTR_OPS = {"concat", "slice", "split", "softmax", "log_softmax", "softmax_backward", "log_softmax_backward",
                "topk", "gather", "index_select", "scatter_add", "index_add"}
REDUCE_OPS = {"sum", "mean", "amax", "amin"}


def canon_dims(op: str, attrs: dict, in_shapes: Sequence[Shape]) -> dict:
    """Spell dim attributes one way (non-negative, sorted) so equal ops intern equal."""
    if not in_shapes:
        return attrs
    n = len(in_shapes[0])
    out = dict(attrs)
    if op in DIM_ATTR_OPS and isinstance(out.get("dim"), int) and n:
        out["dim"] = out["dim"] % n
    elif op in REDUCE_OPS and "dims" in out and n:
        out["dims"] = tuple(sorted({d % n for d in out["dims"]}))
        out["keepdim"] = bool(out.get("keepdim", False))
    elif op == "permute" and n:
        out["dims"] = tuple(d % n for d in out["dims"])
    elif op == "flip" and n:
        out["dims"] = tuple(sorted({d % n for d in out["dims"]}))
    elif op == "einsum":
        out["equation"] = out["equation"].replace(" ", "")
    return out


class Exprs:
    """The expression table: ``mk`` returns the id of an interned expression."""

    def __init__(self) -> None:
        self.nodes: list[Expr] = []
        self._index: dict[tuple, int] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i: int) -> Expr:
        return self.nodes[i]

    def _intern(self, e: Expr) -> int:
        key = (e.op, e.attrs, e.args)
        got = self._index.get(key)
        if got is not None:
            return got
        self.nodes.append(e)
        self._index[key] = len(self.nodes) - 1
        return len(self.nodes) - 1

    def mark(self) -> int:
        return len(self.nodes)

    def rollback(self, mark: int) -> None:
        """Forget expressions made after ``mark`` (a failed rule attempt leaves no trace)."""
        for e in self.nodes[mark:]:
            self._index.pop((e.op, e.attrs, e.args), None)
        del self.nodes[mark:]

    def leaf(self, name: str, shape: Shape, dtype: str) -> int:
        return self._intern(Expr("input", canon_attrs({"name": name}), (), tuple(shape), dtype))

    def mk(self, op: str, attrs: Mapping[str, Any], args: Sequence[int]) -> int:
        """Intern ``op(args)`` with resolved attrs, inferring its shape (raises ExprError)."""
        spec = REGISTRY[op]
        shapes = [self.nodes[a].shape for a in args]
        dtypes = [self.nodes[a].dtype for a in args]
        attrs = dict(attrs)
        try:
            out_shapes = spec.infer(shapes, attrs)
            out_dtypes = spec.out_dtypes(dtypes, attrs)
        except (ValueError, KeyError, IndexError) as exc:
            raise ExprError(f"{op} on {[list(s) for s in shapes]}: {exc}") from None
        if len(out_shapes) != 1:
            raise ExprError(f"{op} has {len(out_shapes)} outputs; use mk_multi")
        return self._mk_one(op, attrs, args, shapes, out_shapes[0], out_dtypes[0])

    def mk_multi(self, op: str, attrs: Mapping[str, Any], args: Sequence[int]) -> list[int]:
        """Multi-output ops (split, topk): output i is ``getitem(op(args), i)``."""
        spec = REGISTRY[op]
        shapes = [self.nodes[a].shape for a in args]
        dtypes = [self.nodes[a].dtype for a in args]
        try:
            out_shapes = spec.infer(shapes, dict(attrs))
            out_dtypes = spec.out_dtypes(dtypes, dict(attrs))
        except (ValueError, KeyError, IndexError) as exc:
            raise ExprError(f"{op} on {[list(s) for s in shapes]}: {exc}") from None
        base = canon_attrs(canon_dims(op, dict(attrs), shapes))
        return [self._intern(Expr(op, canon_attrs({"attrs": json.loads(base), "output": i}), tuple(args),
                                  tuple(s), dt)) for i, (s, dt) in enumerate(zip(out_shapes, out_dtypes))]

    def _mk_one(self, op, attrs, args, in_shapes, out_shape, out_dtype) -> int:
        attrs = canon_dims(op, attrs, in_shapes)
        if op in RESHAPE_LIKE:
            if tuple(out_shape) == tuple(in_shapes[0]):
                return args[0]
            op, attrs = "reshape", {"shape": tuple(out_shape)}
        elif op == "transpose":
            n = len(in_shapes[0])
            perm = list(range(n))
            d0, d1 = attrs["dim0"] % n, attrs["dim1"] % n
            perm[d0], perm[d1] = perm[d1], perm[d0]
            op, attrs = "permute", {"dims": tuple(perm)}
        if op == "expand":  # -1 entries spelled out: expand is determined by its output shape
            if tuple(out_shape) == tuple(in_shapes[0]):
                return args[0]
            attrs = {"shape": tuple(out_shape)}
            src = self.nodes[args[0]]
            v = src.attr_dict().get("value") if src.op == "const" else None
            if isinstance(v, (int, float)) and not isinstance(v, bool):  # a broadcast fill is a fill
                op, attrs = "const", {**src.attr_dict(), "shape": tuple(out_shape)}
        if op == "permute" and tuple(attrs["dims"]) == tuple(range(len(in_shapes[0]))):
            return args[0]
        if op == "const":  # shape and dtype spelled out: ``shape=None`` of a scalar is shape ``()``
            attrs = {**attrs, "shape": tuple(out_shape), "dtype": attrs.get("dtype", "float")}
        if op == "cast" and in_shapes and attrs.get("dtype", "float") == self.nodes[args[0]].dtype:
            return args[0]  # cast to the same type is the identity
        return self._intern(Expr(op, canon_attrs(attrs), tuple(args), tuple(out_shape), out_dtype))

    # ------------------------------------------------------------ printing / export
    def show(self, i: int, depth: int = 3) -> str:
        e = self.nodes[i]
        if e.op == "input":
            return json.loads(e.attrs)["name"]
        if depth == 0:
            return f"#{i}"
        a = json.loads(e.attrs)
        astr = "" if not a else "[" + ",".join(f"{k}={v}" for k, v in a.items()) + "]"
        return f"{e.op}{astr}(" + ", ".join(self.show(x, depth - 1) for x in e.args) + ")"

    def export(self, ids: Sequence[int] | None = None) -> list[list]:
        """Serialize (all, or the closure of ``ids``) as [id, op, attrs, args] rows in id order."""
        keep = set(range(len(self.nodes))) if ids is None else self.closure(ids)
        return [[i, e.op, json.loads(e.attrs), list(e.args)] for i, e in enumerate(self.nodes) if i in keep]

    def closure(self, ids: Sequence[int]) -> set[int]:
        seen: set[int] = set()
        stack = list(ids)
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            stack.extend(self.nodes[i].args)
        return seen
