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
equal sizes it is the interleave.  Three rules read the spelling (``Rules/ConcatGroups.v``):

* ``split_grouped_shard``: splitting the rank's local dim d into the parts' local sizes ``sizes[i] / p`` gives
  Shard(d) of ``split(E, sizes)[i]``;
* ``concat_grouped_shard``: concatenating Shard(d) operands of different sizes along d (the split's backward)
  is Shard(d) of ``concat_groups(concat(E_1..E_k), d, sizes, p)``;
* ``concat_groups_commutes`` (an equality step and the premise of the split): the layout is a reindexing of one
  dim, pulled through the ops that read it index by index (:func:`.interleave.pull`'s steps).

Side conditions, checked at every use: exactly one mesh axis shards dim d and its size is the layout's
``groups``; every other axis is Replicate or shards another dim; the split's sizes are the parts' local sizes in
order.  Anything else is a RuleFailure (UNKNOWN) or, for a split, the interleave rules' path.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

from ..ops import REGISTRY, resolve_attrs
from ..ops.base import Attr, ShapeError

NAME = "concat_groups"
SPLIT_RULE = "split_grouped_shard"
CONCAT_RULE = "concat_grouped_shard"
EQ_RULE = "concat_groups_commutes"
STATEMENTS = {
    SPLIT_RULE: "part i of rank r's block of concat_groups(E, d, sizes, p) is block r of part i of E: splitting a "
                "Shard(d) of the grouped layout (read as one by concat_groups_commutes) into the parts' local sizes "
                "gives Shard(d) of E's parts",
    CONCAT_RULE: "Shard(d) operands of different sizes concatenated along d are Shard(d) of the grouped layout of "
                 "their logical concatenation",
    EQ_RULE: "the grouped layout is a reindexing of one dim and commutes with ops reading it index by index "
             "(matmul row / column, permute, a reshape keeping it whole, pointwise ops)",
}


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


class Grouped(NamedTuple):
    core: int  # E
    dim: int  # d
    sizes: tuple[int, ...]  # the logical parts' sizes
    groups: int  # p


def match(X, e: int) -> Grouped | None:
    """``e`` read as ``concat_groups(E, d, sizes, groups)`` (exactly :func:`build_expr`'s spelling), or None."""
    x = X[e]
    if x.op != "reshape" or X[x.args[0]].op != "concat":
        return None
    c = X[x.args[0]]
    d = c.attr_dict()["dim"] - 1
    blocks = [X[b] for b in c.args]
    if d < 0 or any(b.op != "reshape" for b in blocks):
        return None
    parts = [X[b.args[0]] for b in blocks]
    if any(q.op != "split" for q in parts) or len({b.args[0] for b in blocks}) != len(blocks):
        return None
    if len({q.args for q in parts}) != 1:
        return None
    core = parts[0].args[0]
    s = list(X[core].shape)
    outs = [q.attr_dict() for q in parts]
    inner = outs[0]["attrs"]
    if any(o["attrs"] != inner for o in outs) or [o["output"] for o in outs] != list(range(len(outs))):
        return None
    sizes = tuple(inner["sizes"])
    if inner["dim"] != d or d >= len(s) or len(sizes) != len(outs) or tuple(x.shape) != tuple(s):
        return None
    g = c.shape[d]
    if g < 1 or any(n % g for n in sizes):
        return None
    if any(list(b.shape) != s[:d] + [g, n // g] + s[d + 1:] for b, n in zip(blocks, sizes)):
        return None
    try:
        if build_expr(X, core, {"dim": d, "sizes": list(sizes), "groups": g}) != e:  # the exact spelling only
            return None
    except (ValueError, KeyError):  # ExprError, ShapeError
        return None
    return Grouped(core, d, sizes, g)


def find(X, e: int, d: int, p: int):
    """:func:`.interleave.pull`'s base case for the grouped layout along ``d`` over ``p`` groups."""
    m = match(X, e)
    return (m.core, ("groups", m.sizes)) if m is not None and m.dim == d and m.groups == p else None


def _pull(X, e: int, d: int, p: int):
    from .interleave import pull
    got = pull(X, e, d, p, find=find)
    return None if got is None else (got[0], got[1][1])


def _cites(X, e: int, d: int, p: int) -> list[str]:
    return [] if find(X, e, d, p) is not None else [EQ_RULE]


def grouped_equal(X, a: int, b: int, equal) -> bool:
    """``concat_groups_commutes`` as an equality step: ``b`` is concat_groups(G, d, sizes, p) and ``a`` pulls to
    concat_groups(Y, d, sizes, p) with ``equal(Y, G)`` (the layout is a bijection of dim d)."""
    m = match(X, b)
    if m is None:
        return False
    got = _pull(X, a, m.dim, m.groups)
    return got is not None and got[1] == m.sizes and got[0] != a and equal(got[0], m.core)


def derive_split(kc, ra, f, dim: int, failure):
    """Facts of ``split(dim, sizes)`` of Shard(dim) of the grouped layout (rule ``split_grouped_shard``), or None
    when the input is not that layout over the sharding axis (the interleave rules' path)."""
    from .interleave import _axis
    from .rules import Derivation, Fact

    X = kc.exprs
    try:
        ai = _axis(kc, f, dim, failure, SPLIT_RULE)
    except failure:  # not one Shard of the dim: the interleave path refuses it with its own message
        return None
    p = kc.sizes[kc.axes[ai]]
    got = _pull(X, f.expr, dim, p)
    if got is None:
        return None
    core, sizes = got
    local = [n // p for n in sizes]
    if list(ra["sizes"]) != local:
        raise failure(f"{SPLIT_RULE}: the split sizes {list(ra['sizes'])} are not the parts {local} a rank holds")
    outs = X.mk_multi("split", {"dim": dim, "sizes": tuple(sizes)}, [core])
    rules = ["replicate_any" if q.kind == "R" else "slice_other_dim" for q in f.pl]
    rules[ai] = SPLIT_RULE
    return Derivation([Fact(o, f.pl) for o in outs], rules + _cites(X, f.expr, dim, p))


def derive_slice(kc, ra, f, dim: int, failure):
    """Fact of ``slice(dim, o_i, o_i + n_i)`` of Shard(dim) of the grouped layout, part i of the rank's block
    (Phi-3's ``qkv[..., :a]`` on a GQA w_qkv): Shard(dim) of the logical part i, rule ``split_grouped_shard`` (its
    conclusion is stated per part, at the rank's offset ``off ns i``).  None when the input is not that layout over
    the sharding axis (the interleave path's refusal and message)."""
    from .interleave import _axis
    from .rules import Derivation, Fact

    X = kc.exprs
    try:
        ai = _axis(kc, f, dim, failure, SPLIT_RULE)
    except failure:
        return None
    p = kc.sizes[kc.axes[ai]]
    got = _pull(X, f.expr, dim, p)
    if got is None:
        return None
    core, sizes = got
    local = [n // p for n in sizes]
    offs = [sum(local[:i]) for i in range(len(local))]
    st, en, step = ra["start"], ra["end"], ra["step"]
    i = offs.index(st) if st in offs else None
    if step != 1 or i is None or en != st + local[i]:
        raise failure(f"{SPLIT_RULE}: slice [{st}:{en}:{step}] is not one of the parts {local} a rank holds")
    out = X.mk("slice", {"dim": dim, "start": p * st, "end": p * en, "step": 1}, [core])
    rules = ["replicate_any" if q.kind == "R" else "slice_other_dim" for q in f.pl]
    rules[ai] = SPLIT_RULE
    return Derivation([Fact(out, f.pl)], rules + _cites(X, f.expr, dim, p))


def derive_pad(kc, ra, f, failure):
    """Fact of a zero pad of a Shard(d) operand, on dim d only, that puts the rank's part i back at its offset
    among the parts of a ``concat_groups`` layout the plan declares (``KCtx.groupings``; autograd's slice_backward
    of a sliced-out part): Shard(d) of that layout of the logical pad by (p * before, p * after), rule
    ``concat_grouped_shard`` with the other parts zero.  None when no declared layout has a part there (then the
    interleave path's equal-parts reading); a choice between true facts, the pad being the same logical value."""
    from .expr import ExprError
    from .interleave import _axis
    from .rules import Derivation, Fact

    X = kc.exprs
    shape = X[f.expr].shape
    pads, value = list(ra["pads"]), ra.get("value", 0)
    padded = [d for d in range(len(shape)) if pads[2 * d] or pads[2 * d + 1]]
    if len(padded) != 1 or value != 0 or not kc.groupings:
        return None
    d = padded[0]
    try:
        ai = _axis(kc, f, d, failure, CONCAT_RULE)
    except failure:
        return None
    p = kc.sizes[kc.axes[ai]]
    n, before, after = shape[d] // p, pads[2 * d], pads[2 * d + 1]
    for sizes, groups in sorted(kc.groupings):
        local = [m // p for m in sizes]
        offs = [sum(local[:i]) for i in range(len(local))]
        if groups != p or any(m % p for m in sizes) or before not in offs or before + n + after != sum(local):
            continue
        if local[offs.index(before)] != n:
            continue
        lp = [0] * len(pads)
        lp[2 * d], lp[2 * d + 1] = p * before, p * after
        try:
            expr = build_expr(X, X.mk("pad", {"pads": tuple(lp), "value": 0}, [f.expr]),
                              {"dim": d, "sizes": list(sizes), "groups": p})
        except (ExprError, ShapeError):
            continue
        rules = ["replicate_any" if q.kind == "R" else "concat_other_dim" for q in f.pl]
        rules[ai] = CONCAT_RULE
        return Derivation([Fact(expr, f.pl)], rules)
    return None


def derive_concat(kc, facts, dim: int, failure):
    """Fact of ``concat(dim)`` of Shard(dim) operands of different sizes (rule ``concat_grouped_shard``)."""
    from .expr import ExprError
    from .interleave import _axis
    from .rules import Derivation, Fact

    X = kc.exprs
    if len({f.pl for f in facts}) != 1:
        raise failure(f"{CONCAT_RULE}: operands placed differently")
    ai = _axis(kc, facts[0], dim, failure, CONCAT_RULE)
    p = kc.sizes[kc.axes[ai]]
    sizes = [X[f.expr].shape[dim] for f in facts]
    try:
        cat = X.mk("concat", {"dim": dim}, [f.expr for f in facts])
        expr = build_expr(X, cat, {"dim": dim, "sizes": sizes, "groups": p})
    except (ExprError, ShapeError) as exc:
        raise failure(f"{CONCAT_RULE}: {exc}") from None
    rules = ["replicate_any" if q.kind == "R" else "concat_other_dim" for q in facts[0].pl]
    rules[ai] = CONCAT_RULE
    return Derivation([Fact(expr, facts[0].pl)], rules)


__all__ = ["NAME", "SPEC", "build_expr", "derive_concat", "derive_pad", "derive_slice", "derive_split", "expand",
           "find", "grouped_equal", "layout_spec", "match", "source_index"]
