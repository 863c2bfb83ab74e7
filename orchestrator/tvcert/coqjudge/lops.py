"""Layout / reduction / row-wise ops as ``JLayout.lop`` terms (``Rules/IR/LayoutOps.v``).

``lop_of`` maps an IR op with resolved attrs to a tuple (constructor name, attributes), ``coq_lop``
prints it (trusted printer), ``lop_shape`` mirrors ``LayoutOps.lop_shape`` (the emitter compares it
with the IR's shapes; the emitted file proves the same equalities in Coq) and ``lrule`` mirrors
``LayoutRule.lrule`` for the untrusted fact search (Coq re-checks every fact).
"""
from __future__ import annotations

from ..ops import REGISTRY
from ..ops.base import norm_dim
from .terms import _nat, _num, _rat, _seq

RED = {"sum": "RdSum", "mean": "RdMean", "amax": "RdMax", "amin": "RdMin"}
LOPS = ("Reshape", "Permute", "Unsqueeze", "Squeeze", "Expand", "Slice", "Concat", "Reduce", "Minimum",
        "Maximum", "AddScalar", "CastF", "Softmax", "LogSoftmax", "SoftmaxBwd", "LogSoftmaxBwd", "Einsum",
        "Where", "MaskedFill", "Iota", "Cmp", "OneHot")
CMPS = {"eq": "CEq", "ne": "CNe", "lt": "CLt", "le": "CLe", "gt": "CGt", "ge": "CGe"}
# ops that read their one input through an index map (LayoutSound.reindex_op)
REINDEX = ("Reshape", "Permute", "Unsqueeze", "Squeeze", "Expand", "Slice", "CastF")


def fn_id(fns: list[str], name: str) -> int:
    if name not in fns:
        fns.append(name)
    return fns.index(name)


def lop_of(op: str, ra: dict, shapes: list[tuple[int, ...]], fns: list[str]) -> tuple:
    """The ``JLayout.lop`` of an IR op on operands of ``shapes`` (raises ValueError if not denoted)."""
    s0 = tuple(shapes[0]) if shapes else ()
    r = len(s0)
    spec = REGISTRY[op]
    if op in ("reshape", "view", "flatten"):
        return ("Reshape", tuple(spec.infer([s0], ra)[0]))
    if op == "permute":
        return ("Permute", tuple(norm_dim(d, r) for d in ra["dims"]))
    if op == "unsqueeze":
        return ("Unsqueeze", ra["dim"] % (r + 1))
    if op == "squeeze":
        return ("Squeeze", tuple(sorted({norm_dim(d, r) for d in ra["dims"]})))
    if op == "expand":
        return ("Expand", tuple(spec.infer([s0], ra)[0]))
    if op == "slice":
        if ra.get("step", 1) != 1:
            raise ValueError("slice with step != 1 is not denoted")
        return ("Slice", norm_dim(ra["dim"], r), ra["start"], ra["end"])
    if op == "concat":
        return ("Concat", norm_dim(ra["dim"], r))
    if op in RED:
        return ("Reduce", RED[op], tuple(sorted({norm_dim(d, r) for d in ra["dims"]})), bool(ra.get("keepdim")))
    if op in ("minimum", "maximum"):
        return (op.capitalize(),)
    if op in ("add_scalar", "masked_fill"):
        c = _num(ra["value"])
        if c is None:
            raise ValueError(f"{op} value {ra['value']!r} is not a rational literal")
        return ("AddScalar" if op == "add_scalar" else "MaskedFill", c)
    if op == "cast":
        if ra.get("dtype", "float") != "float":
            raise ValueError("cast to int is not denoted")
        return ("CastF",)
    if op == "where":
        return ("Where",)
    if op == "iota":
        if ra.get("start", 0) < 0 or ra.get("step", 1) < 0:
            raise ValueError("iota with a negative start or step is not denoted")
        return ("Iota", ra["size"], ra.get("start", 0), ra.get("step", 1))
    if op in CMPS:
        return ("Cmp", CMPS[op])
    if op == "one_hot":
        return ("OneHot", ra["num_classes"])
    if op in ("softmax", "log_softmax", "softmax_backward", "log_softmax_backward"):
        d = norm_dim(ra["dim"], r)
        ex = fn_id(fns, "exp")
        return {"softmax": ("Softmax", d, ex), "log_softmax": ("LogSoftmax", d, ex, fn_id(fns, "log")),
                "softmax_backward": ("SoftmaxBwd", d), "log_softmax_backward": ("LogSoftmaxBwd", d, ex)}[op]
    if op == "einsum":
        from ..ops.linalg import parse_equation

        terms, rhs, _ = parse_equation(ra["equation"], shapes)
        num = {c: k for k, c in enumerate(sorted(set("".join(terms))))}
        return ("Einsum", tuple(tuple(num[c] for c in t) for t in terms), tuple(num[c] for c in rhs))
    raise ValueError(f"{op} has no denotation in Rules/IR/LayoutOps.v")


def coq_lop(t: tuple) -> str:
    k = t[0]
    if k in ("Minimum", "Maximum", "CastF", "Where"):
        return k
    if k in ("AddScalar", "MaskedFill"):
        return f"({k} {_rat(t[1])})"
    if k in ("Reshape", "Permute", "Squeeze", "Expand"):
        return f"({k} {_seq(t[1])})"
    if k == "Reduce":
        return f"(Reduce {t[1]} {_seq(t[2])} {'true' if t[3] else 'false'})"
    if k == "Einsum":
        return f"(Einsum {_seq([_seq(x) for x in t[1]])} {_seq(t[2])})"
    if k == "Cmp":
        return f"(Cmp {t[1]})"
    return "(" + " ".join([t[0], *map(_nat, t[1:])]) + ")"   # Unsqueeze / Slice / Concat / Softmax family: numbers


def _bshape(a, b):
    ra, rb = list(reversed(a)), list(reversed(b))
    out = [rb[i] if i >= len(ra) else ra[i] if i >= len(rb) else (rb[i] if ra[i] == 1 else ra[i])
           for i in range(max(len(ra), len(rb)))]
    return tuple(reversed(out))


def lop_shape(t: tuple, ss: list) -> tuple[int, ...]:
    """Mirror of ``LayoutOps.lop_shape``."""
    k = t[0]
    s0 = list(ss[0]) if ss else []
    if k in ("Reshape", "Expand"):
        return tuple(t[1])
    if k == "Permute":
        return tuple(s0[d] if d < len(s0) else 0 for d in t[1])
    if k == "Unsqueeze":
        return tuple(s0[:t[1]] + [1] + s0[t[1]:])
    if k == "Squeeze":
        return tuple(x for j, x in enumerate(s0) if j not in t[1])
    if k == "Slice":
        s0[t[1]] = max(0, t[3] - t[2])
        return tuple(s0)
    if k == "Concat":
        s0[t[1]] = sum(s[t[1]] for s in ss)
        return tuple(s0)
    if k == "Reduce":
        for e in sorted(t[2], reverse=True):
            if t[3]:
                s0[e] = 1
            else:
                del s0[e]
        return tuple(s0)
    if k in ("Minimum", "Maximum", "MaskedFill", "Cmp"):
        return _bshape(ss[0], ss[1])
    if k == "Iota":
        return (t[1],)
    if k == "OneHot":
        return tuple(s0) + (t[1],)
    if k == "Where":
        return _bshape(_bshape(ss[0], ss[1]), ss[2])
    if k == "Einsum":
        size = {}
        for term, s in zip(t[1], ss):
            for l, n in zip(term, s):
                size.setdefault(l, n)
        return tuple(size[l] for l in t[2])
    return tuple(s0)


def _bin_shard(so, s, a, d: int) -> bool:
    """Mirror of ``Check.bin_shard``: operand of shape s of a broadcasting op with output so sharded on d
    (each operand dim the output's or 1; replicated where it lacks dim d or has size 1 there)."""
    off = len(so) - len(s)
    if off < 0 or any(x != so[off + k] and x != 1 for k, x in enumerate(s)):
        return False
    if a.kind == "R":
        return d < off or s[d - off] == 1
    return a.kind == "S" and off <= d and a.dim == d - off and s[a.dim] == so[d]


def _shard_ok(p, s, d) -> bool:
    return d < len(s) and (s[d] // p) * p == s[d]


def _rowwise_ok(s, d, e) -> bool:
    return d < len(s) and s[d] > 0 and e != d


def _lsize(ts, ss, l: int) -> int:
    """Mirror of ``LayoutOps.lsize``: the letter's size in the first operand holding it (0 if none)."""
    k = next((k for k, t in enumerate(ts) if l in t), None)
    return 0 if k is None else ss[k][ts[k].index(l)]


def _einsum(t: tuple, ss: list, pls: list, Pl) -> object | None:
    """Mirror of ``LayoutRule``'s einsum lines: the letter l of the first sharded operand, held on its own
    dim by every operand with l (the others replicated), shards the output on l's dim when l is an output
    letter (``ein_free_ok``) and makes it a Partial(sum) when l is contracted (``ein_contr_ok``)."""
    ts, out = t[1], t[2]
    sh = [(k, x.dim) for k, x in enumerate(pls) if x.kind == "S"]
    if not sh or len(ts) != len(ss) or sh[0][1] >= len(ts[sh[0][0]]):
        return None
    l = ts[sh[0][0]][sh[0][1]]
    if any(len(set(x)) != len(x) for x in ts) or (l in out and len(set(out)) != len(out)):
        return None
    if any(len(x) != len(s) or any(s[j] != _lsize(ts, ss, x[j]) for j in range(len(x))) for x, s in zip(ts, ss)):
        return None
    if list(pls) != [Pl("S", x.index(l)) if l in x else Pl("R") for x in ts]:
        return None
    return Pl("S", out.index(l)) if l in out else Pl("P", reduce="sum")


def _prod(s) -> int:
    out = 1
    for x in s:
        out *= x
    return out


def _reshape_shard(s0, s1, d: int, p: int, Pl) -> object | None:
    """Mirror of ``LayoutRule.resh_ok``: a dim e of the target with as many elements before it as before d
    (a size > 1 first; the rank's local reshape names the local shape, ``relocal``)."""
    if not _shard_ok(p, s0, d) or _prod(s0) != _prod(s1):
        return None
    es = [e for e in range(len(s1)) if _shard_ok(p, s1, e) and _prod(s1[:e]) == _prod(s0[:d])]
    es.sort(key=lambda e: s1[e] == 1)
    return Pl("S", es[0]) if es else None


def relocal(t: tuple, s) -> tuple:
    """Mirror of ``MeshCheck.relocal``: the op a rank runs for logical op t when it holds the result with
    local shape s (a reshape / expand names its target shape)."""
    return (t[0], tuple(s)) if t[0] in ("Reshape", "Expand") else t


def op_key(t: tuple) -> tuple:
    """An op without the attribute ``relocal`` replaces (how the search matches a local op to a logical one)."""
    return t[:1] if t[0] in ("Reshape", "Expand") else t


def lrule(t: tuple, ss: list, pls: list, p: int, Pl) -> object | None:
    """Mirror of ``LayoutRule.lrule``: the result placement it accepts (``Pl``), or None.

    Called only when some operand is not Replicate."""
    k = t[0]
    s0 = tuple(ss[0]) if ss else ()
    if k == "Concat":
        d = pls[0].dim if pls and pls[0].kind == "S" else None
        e = t[1]
        if d is None or any(x != Pl("S", d) for x in pls) or e == d or e >= len(s0) or not _shard_ok(p, s0, d):
            return None
        if any(len(s) != len(s0) or any(s[j] != s0[j] for j in range(len(s0)) if j != e) for s in ss):
            return None
        return Pl("S", d)
    if k in ("Minimum", "Maximum", "MaskedFill", "Cmp"):
        so = lop_shape(t, ss)
        for x, s in zip(pls, ss):
            if len(pls) == 2 and x.kind == "S":
                d = x.dim + len(so) - len(s)
                if _bin_shard(so, ss[0], pls[0], d) and _bin_shard(so, ss[1], pls[1], d):
                    return Pl("S", d)
        return None
    if k == "Einsum":
        return _einsum(t, ss, pls, Pl)
    if len(pls) == 1 and pls[0].kind == "S":
        d = pls[0].dim
        if k == "Permute":
            ds = t[1]
            return Pl("S", ds.index(d)) if sorted(ds) == list(range(len(s0))) and len(ds) == len(s0) else None
        if k == "Unsqueeze":
            return Pl("S", d if d < t[1] else d + 1) if t[1] <= len(s0) else None
        if k == "Slice":
            e, a, b = t[1:]
            return Pl("S", d) if e < len(s0) and a <= b <= s0[e] and d != e else None
        if k in ("Softmax", "LogSoftmax"):
            return Pl("S", d) if _rowwise_ok(s0, t[1], d) else None
        if k == "Reduce" and len(t[2]) == 1:
            e, keep = t[2][0], t[3]
            if e == d:
                return {"RdSum": Pl("P", reduce="sum"), "RdMean": Pl("P", reduce="avg") if p > 0 else None,
                        "RdMax": Pl("P", reduce="max") if s0[d] // p > 0 else None}.get(t[1])
            if e < len(s0) and s0[e] > 0:
                return Pl("S", d if keep or e > d else d - 1)
            return None
        if k in ("AddScalar", "CastF"):
            return Pl("S", d)
        if k == "OneHot":
            return Pl("S", d) if d < len(s0) else None
        if k == "Reshape":   # LayoutRule.lrule_loc: resh_ok (the rank runs the reshape to its local shape)
            return _reshape_shard(s0, tuple(t[1]), d, p, Pl)
        if k == "Expand":    # LayoutRule.lrule_loc: expand_ok
            s1, off = tuple(t[1]), len(t[1]) - len(s0)
            ok = off >= 0 and d < len(s0) and s0[d] != 1 and all(x == 1 or s1[off + j] == x for j, x in enumerate(s0))
            return Pl("S", off + d) if ok else None
        return None
    if len(pls) == 1 and pls[0].kind == "P":
        return pls[0] if k in REINDEX and pls[0].reduce in ("sum", "avg") else None
    if len(pls) == 2 and k in ("SoftmaxBwd", "LogSoftmaxBwd") and pls[0].kind == "S" and pls[0] == pls[1]:
        d = pls[0].dim
        return Pl("S", d) if _rowwise_ok(s0, t[1], d) and tuple(ss[1]) == s0 else None
    return None
