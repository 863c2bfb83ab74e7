"""Checking one kernel conclusion against the reference semantics of the op, on every rank.

A single-op instance (:class:`OpCase`) is a mesh (axes in nesting order, sizes), logical input tensors with a
placement per axis, an op and its attributes as written (they may depend on ``rank.<axis>``).  :func:`run_case`

1. asks the kernel (:func:`tvcert.kernel.rules.derive`, exactly as the engine calls it) for the output facts;
2. draws logical input values (exact rationals, or float64) and distributes them to every rank by their
   placements (nested, outermost axis first; a Partial is split into random pieces, unevenly);
3. runs the op on every rank with the op's own ``eval`` (attributes resolved with that rank's coordinates;
   collectives through ``simulate`` over each group, as the interpreter does);
4. evaluates the concluded logical expression on the logical inputs with the same ops' ``eval``;
5. reassembles the local results by the concluded placement, innermost axis first (Shard: concatenate the
   blocks; ZigzagShard: put the 2p chunks back; Replicate: every rank must hold the same tensor; Partial:
   sum / mean / max over the ranks) and compares with 4.

A disagreement means the kernel concluded a fact that is false on this instance: a soundness bug.

The reassembly is the semantics of nested placements of :mod:`tvcert.kernel.rules` (``local_shape``): axis k's
placement acts on the piece the outer axes left.
"""
from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Mapping, Sequence

import numpy as np

from ..ops import REGISTRY, Ctx, concrete_attrs, resolve_attrs
from ..ops.base import TablesNeeded
from ..ops.collectives import axes_of
from ..plan import Placement
from ..kernel.expr import Exprs
from ..kernel.rules import Fact, KCtx, RuleFailure, derive, fmt_pl, local_shape

R = Placement("R")


def S(d: int) -> Placement:
    return Placement("S", d)


def Z(d: int) -> Placement:
    return Placement("Z", d)


def P(r: str = "sum") -> Placement:
    return Placement("P", reduce=r)


# ------------------------------------------------------------------ instances
@dataclass
class TIn:
    """One logical input: a leaf tensor, or a constant (``const`` = its value, replicated everywhere)."""

    shape: tuple[int, ...]
    pl: tuple[Placement, ...]
    dtype: str = "float"
    hi: int = 4  # int tensors: values in [0, hi)
    const: Any = None  # a scalar: the input is the logical expression const(value), shape ()
    values: Any = None  # fixed logical values (np array), else random
    # (X, leaf) -> expression: the input is this expression of the leaf (e.g. a fused tensor's interleave),
    # distributed by ``pl`` as evaluated on the leaf's values
    layout: Any = None


@dataclass
class OpCase:
    op: str
    attrs: dict
    ins: list[TIn]
    axes: tuple[str, ...]
    sizes: dict[str, int]
    dims: dict[str, int] = field(default_factory=dict)
    note: str = ""
    hints: tuple = ()  # (input, output) shapes of logical reshapes (KCtx.hints): a choice the kernel may make
    groupings: tuple = ()  # (sizes, groups) of declared concat_groups layouts (KCtx.groupings): likewise

    def describe(self) -> str:
        ins = ", ".join(
            (f"const({t.const})" if t.const is not None else f"{t.dtype}{list(t.shape)}") + " " + fmt_pl(self.axes, t.pl)
            for t in self.ins)
        mesh = ", ".join(f"{a}={self.sizes[a]}" for a in self.axes)
        hints = f" hints={[[list(a), list(b)] for a, b in self.hints]}" if self.hints else ""
        return f"{self.op}({ins}) attrs={json.dumps(self.attrs)} mesh[{mesh}] dims={self.dims}{hints}"


@dataclass
class Result:
    status: str  # "ok" (concluded and holds) | "refused" (RuleFailure) | "skip" (not executable) | "DISAGREE"
    rules: list[str] = field(default_factory=list)
    detail: str = ""


class Skip(Exception):
    """The instance cannot be checked (not well-formed, or outside exact semantics)."""


# ------------------------------------------------------------------ numbers
def rand_values(shape, dtype: str, rng: np.random.Generator, exact: bool, hi: int = 4) -> np.ndarray:
    if dtype == "int":
        return rng.integers(0, max(hi, 1), size=shape, dtype=np.int64)
    if exact:
        num = rng.integers(-30, 31, size=shape)
        den = rng.choice([1, 2, 3, 5, 7], size=shape)
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(*shape):
            out[idx] = Fraction(int(num[idx]) or 1, int(den[idx]))
        return out
    return rng.standard_normal(shape) * rng.choice([0.5, 1.0, 2.0], size=shape)


def _close(a: np.ndarray, b: np.ndarray, exact: bool) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if exact or (a.dtype.kind in "iub" and b.dtype.kind in "iub"):
        return bool(np.all(a == b))
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    fin = np.isfinite(a) & np.isfinite(b)
    if not np.array_equal(a[~fin & ~np.isnan(a)], b[~fin & ~np.isnan(b)]):
        return False
    return bool(np.all(np.abs(a[fin] - b[fin]) <= 1e-7 * (1.0 + np.abs(a[fin]) + np.abs(b[fin]))))


# ------------------------------------------------------------------ placements <-> rank pieces
def zz_index(n: int, p: int, r: int) -> list[int]:
    """The logical rows rank r holds under ZigzagShard on an axis of size p (chunks r and 2p-1-r of 2p)."""
    c = n // (2 * p)
    return list(range(r * c, (r + 1) * c)) + list(range((2 * p - 1 - r) * c, (2 * p - r) * c))


def _split_partial(v: np.ndarray, n: int, how: str, rng: np.random.Generator, exact: bool) -> list[np.ndarray]:
    if n == 1:
        return [v.copy()] if how != "avg" else [v.copy()]
    if how == "max":
        owner = rng.integers(0, n, size=v.shape)
        out = []
        for c in range(n):
            gap = rand_values(v.shape, "int" if v.dtype.kind in "iub" else "float", rng, exact, hi=5)
            gap = np.abs(gap) + (1 if v.dtype.kind in "iub" else Fraction(1) if exact else 1.0)
            piece = np.where(owner == c, v, v - gap)
            out.append(np.asarray(piece, dtype=v.dtype))
        return out
    kind = "int" if v.dtype.kind in "iub" else "float"
    pieces = [np.asarray(rand_values(v.shape, kind, rng, exact, hi=7) * (3 if kind == "float" else 1), dtype=v.dtype)
              for _ in range(n - 1)]
    total = v * n if how == "avg" else v
    last = total - sum(pieces[1:], pieces[0])
    return pieces + [np.asarray(last, dtype=v.dtype)]


def distribute(v: np.ndarray, axes: Sequence[str], sizes: Mapping[str, int], pl: Sequence[Placement],
               rng: np.random.Generator, exact: bool) -> dict[tuple[int, ...], np.ndarray]:
    """Each rank's piece, axis by axis (outermost first); Partial pieces are random and independent for each
    coordinate of the outer axes that are not Replicate.  Replicate means what DTensor means: the ranks along
    that axis hold the same tensor, so the pieces below a Replicate axis are drawn once and copied."""
    import itertools

    one = {a: (1 if p.kind == "R" else sizes[a]) for a, p in zip(axes, pl)}
    base = _distribute(v, axes, one, pl, rng, exact)
    out = {}
    for r in itertools.product(*[range(sizes[a]) for a in axes]):
        key = tuple(0 if p.kind == "R" else c for c, p in zip(r, pl))
        out[tuple(r)] = base[key].copy()
    return out


def _distribute(v, axes, sizes, pl, rng, exact):
    pieces: dict[tuple[int, ...], np.ndarray] = {(): v}
    for a, p in zip(axes, pl):
        n = sizes[a]
        new = {}
        for pre, val in pieces.items():
            if p.kind == "R":
                parts = [val.copy() for _ in range(n)]
            elif p.kind == "S":
                if val.shape[p.dim] % n:
                    raise Skip("not divisible")
                parts = np.split(val, n, axis=p.dim)
            elif p.kind == "Z":
                if val.shape[p.dim] % (2 * n):
                    raise Skip("not divisible")
                parts = [np.take(val, zz_index(val.shape[p.dim], n, c), axis=p.dim) for c in range(n)]
            else:
                parts = _split_partial(val, n, p.reduce, rng, exact)
            for c, part in enumerate(parts):
                new[pre + (c,)] = np.array(part, copy=True)
        pieces = new
    return pieces


class Mismatch(Exception):
    pass


def reassemble(local: Mapping[tuple[int, ...], np.ndarray], axes: Sequence[str], sizes: Mapping[str, int],
               pl: Sequence[Placement], exact: bool, ctx: Ctx) -> np.ndarray:
    cur = dict(local)
    for k in range(len(axes) - 1, -1, -1):
        p, n = pl[k], sizes[axes[k]]
        groups: dict[tuple[int, ...], list] = {}
        for rank, v in cur.items():
            groups.setdefault(rank[:k], []).append((rank[k], v))
        new = {}
        for pre, items in groups.items():
            vals = [v for _, v in sorted(items, key=lambda t: t[0])]
            if p.kind == "R":
                for c, v in enumerate(vals[1:], 1):
                    if not _close(vals[0], v, exact):
                        raise Mismatch(f"axis {axes[k]!r} is concluded Replicate but ranks {pre + (0,)} and "
                                       f"{pre + (c,)} hold different tensors")
                new[pre] = vals[0]
            elif p.kind == "S":
                new[pre] = np.concatenate(vals, axis=p.dim)
            elif p.kind == "Z":
                cat = np.concatenate(vals, axis=p.dim)
                m = cat.shape[p.dim]
                order = [i for r in range(n) for i in zz_index(m, n, r)]
                out = np.empty_like(cat)
                idx = [slice(None)] * cat.ndim
                for pos, row in enumerate(order):
                    idx[p.dim] = row
                    src = [slice(None)] * cat.ndim
                    src[p.dim] = pos
                    out[tuple(idx)] = cat[tuple(src)]
                new[pre] = out
            elif p.reduce == "max":
                new[pre] = np.asarray(np.maximum.reduce(vals), dtype=vals[0].dtype) if n > 1 else vals[0]
            else:
                obj = any(v.dtype == object for v in vals)
                tot = vals[0]
                for v in vals[1:]:
                    tot = np.asarray(tot + v, dtype=object if obj else None)
                if p.reduce == "avg":
                    tot = np.asarray(tot / (Fraction(n) if obj else n), dtype=object if obj else None)
                new[pre] = np.asarray(tot, dtype=object if obj else None)
        cur = new
    return cur[()]


# ------------------------------------------------------------------ evaluating expressions
def eval_expr(X: Exprs, root: int, leaves: Mapping[int, np.ndarray], ctx: Ctx,
              memo: dict[int, np.ndarray] | None = None) -> np.ndarray:
    memo = {} if memo is None else memo

    def ev(i: int) -> np.ndarray:
        if i in memo:
            return memo[i]
        e = X[i]
        if e.op == "input":
            v = leaves[i]
        else:
            at = e.attr_dict()
            args = [ev(a) for a in e.args]
            if set(at) == {"attrs", "output"}:  # output k of a multi-output op
                outs = REGISTRY[e.op].eval(args, concrete_attrs(e.op, at["attrs"]), ctx)
                v = outs[at["output"]]
            else:
                v = REGISTRY[e.op].eval(args, concrete_attrs(e.op, at), ctx)[0]
            v = v if isinstance(v, np.ndarray) else np.asarray(v, dtype=object if ctx.exact else np.float64)
        memo[i] = v
        return v

    return ev(root)


# ------------------------------------------------------------------ one instance
def _env(dims: Mapping[str, int], axes: Sequence[str], rank: Sequence[int] | None) -> dict[str, int]:
    env = dict(dims)
    for j, a in enumerate(axes):
        env[f"rank.{a}"] = 0 if rank is None else rank[j]
    return env


def _ranks(axes, sizes) -> list[tuple[int, ...]]:
    import itertools

    return [tuple(r) for r in itertools.product(*[range(sizes[a]) for a in axes])]


def build_facts(case: OpCase, X: Exprs) -> list[Fact]:
    facts = []
    for k, t in enumerate(case.ins):
        if t.const is not None:
            e = X.mk("const", {"value": t.const, "shape": (), "dtype": "float"}, [])
        else:
            e = X.leaf(f"x{k}", tuple(t.shape), t.dtype)
            if t.layout is not None:
                e = t.layout(X, e)
        facts.append(Fact(e, tuple(t.pl)))
    return facts


def conclude(case: OpCase):
    """(X, kc, facts, ra, derivation or RuleFailure)."""
    X = Exprs()
    dims = dict(case.dims)
    for a in case.axes:
        dims.setdefault(a, case.sizes[a])
    kc = KCtx(X, tuple(case.axes), dict(case.sizes), dims, frozenset((tuple(a), tuple(b)) for a, b in case.hints),
              groupings=frozenset((tuple(s), g) for s, g in case.groupings))
    facts = build_facts(case, X)
    spec = REGISTRY[case.op]
    try:
        ra = resolve_attrs(spec, case.attrs, _env(dims, case.axes, None))
    except ValueError as exc:
        raise Skip(f"attrs: {exc}")
    if spec.category == "collective":
        p = 1
        for a in axes_of(ra):
            if a not in case.sizes:
                raise Skip("axis not in mesh")
            p *= case.sizes[a]
        ra["_p"] = p
    local_in = []
    for f in facts:
        ls = local_shape(X[f.expr].shape, kc.axes, f.pl, kc.sizes)
        if ls is None:
            raise Skip("input not divisible by its placement")
        local_in.append(ls)
    try:
        local_out = spec.infer(local_in, ra)
    except (ValueError, KeyError, IndexError) as exc:
        raise Skip(f"local shapes: {exc}")
    try:
        d = derive(kc, case.op, ra, case.attrs, facts, local_out)
    except RuleFailure as exc:
        return X, kc, facts, ra, exc
    return X, kc, facts, ra, d


def run_case(case: OpCase, seed: int, exact: bool = True) -> Result:
    try:
        X, kc, facts, ra, d = conclude(case)
    except Skip as exc:
        return Result("skip", detail=str(exc))
    if isinstance(d, RuleFailure):
        return Result("refused", detail=str(d))
    rng = np.random.default_rng(seed)
    ctx = Ctx(exact=exact, seed=seed)
    try:
        return _check(case, X, kc, facts, d, rng, ctx, exact)
    except (Skip, TablesNeeded) as exc:
        return Result("skip", list(d.rules), f"not executable: {exc}")
    except (ValueError, ZeroDivisionError, ArithmeticError, IndexError) as exc:
        return Result("skip", list(d.rules), f"eval: {type(exc).__name__}: {exc}")


def _check(case, X, kc, facts, d, rng, ctx, exact) -> Result:
    spec = REGISTRY[case.op]
    axes, sizes = kc.axes, kc.sizes
    logical: list[np.ndarray] = []
    locals_: list[dict] = []
    leaves: dict[int, np.ndarray] = {}
    for t, f in zip(case.ins, facts):
        if t.const is not None:
            v = ctx.full((), t.const)
        elif t.values is not None:
            v = np.asarray(t.values)
            if t.dtype == "float":
                v = ctx.asarray(v.tolist()) if exact else np.asarray(v, dtype=np.float64)
        else:
            v = rand_values(t.shape, t.dtype, rng, exact, t.hi)
        if X[f.expr].op == "input":
            leaves[f.expr] = v
        elif t.layout is not None:  # the leaf holds v; the ranks hold pieces of its laid-out value
            leaves[X.leaf(f"x{len(logical)}", tuple(t.shape), t.dtype)] = v
            v = eval_expr(X, f.expr, leaves, ctx, {})
        logical.append(v)
        locals_.append(distribute(v, axes, sizes, f.pl, rng, exact))
    ranks = _ranks(axes, sizes)
    outs: dict[tuple[int, ...], list[np.ndarray]] = {}
    if spec.category == "collective":
        ra0 = resolve_attrs(spec, case.attrs, _env(kc.dims, axes, None))
        over = set(axes_of(ra0))
        ra0["_p"] = int(np.prod([sizes[a] for a in over]))
        groups: dict[tuple, list] = {}
        for r in ranks:
            key = tuple(c for a, c in zip(axes, r) if a not in over)
            groups.setdefault(key, []).append(r)
        for key, members in groups.items():
            members.sort(key=lambda r: tuple(c for a, c in zip(axes, r) if a in over))
            res = spec.simulate([locals_[0][r] for r in members], ra0, ctx)
            for r, o in zip(members, res):
                outs[r] = [o if isinstance(o, np.ndarray) else np.asarray(o)]
    else:
        for r in ranks:
            ra_r = resolve_attrs(spec, case.attrs, _env(kc.dims, axes, r))
            vals = spec.eval([loc[r] for loc in locals_], ra_r, ctx)
            outs[r] = [v if isinstance(v, np.ndarray) else np.asarray(v, dtype=object if exact else np.float64)
                       for v in vals]
    memo: dict[int, np.ndarray] = {}
    for k, f in enumerate(d.facts):
        want = eval_expr(X, f.expr, leaves, ctx, memo)
        try:
            got = reassemble({r: o[k] for r, o in outs.items()}, axes, sizes, f.pl, exact, ctx)
        except Mismatch as exc:
            return Result("DISAGREE", list(d.rules), f"output {k}: {exc}; concluded {X.show(f.expr, 4)} as "
                                                     f"{fmt_pl(axes, f.pl)}")
        except ValueError as exc:  # blocks that do not concatenate: the local shapes contradict the placement
            return Result("DISAGREE", list(d.rules), f"output {k}: local results do not reassemble under "
                                                     f"{fmt_pl(axes, f.pl)}: {exc}")
        if not _close(got, want, exact):
            diff = ""
            try:
                diff = f" (max |diff| {float(np.max(np.abs(np.asarray(got - want, dtype=np.float64)))):.3g})"
            except Exception:
                pass
            return Result("DISAGREE", list(d.rules),
                          f"output {k}: the ranks' results reassembled by {fmt_pl(axes, f.pl)} differ from the "
                          f"concluded {X.show(f.expr, 4)}{diff}")
    return Result("ok", list(d.rules))


def safe_run(case: OpCase, seed: int, exact: bool = True) -> Result:
    """run_case, with harness crashes reported (never hidden) as status 'crash'."""
    try:
        return run_case(case, seed, exact)
    except Exception as exc:  # pragma: no cover - a harness or kernel crash is reported, not swallowed
        return Result("crash", detail=f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}")
