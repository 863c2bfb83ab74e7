"""Generators for the rules of kernel/reductions.py and kernel/broadcast.py.

* ``reduction_normal_form``: a float tensor reduced two ways -- ``mean`` over a dim set against nested means
  in any order, ``sum / count``, sums of sums with or without ``keepdim``, scalar factors inside and outside,
  broadcasts of broadcasts of a scalar -- and near misses that must not be proved: a count off by one, a sum
  where a mean was meant, a mean divided by the count again (p against p^2), another dim set, keepdim
  mixed.  Every pair the prover calls equal is evaluated (eqgen._check_pair).
* ``replicate_broadcast_as_shard``: a pointwise op of a sharded operand (random mesh, nested shards, other
  axes sharding other dims) and a replicated operand at the local size, built as a broadcast (expand of a
  scalar or of a size-1 dim, constant fills, unit reshapes, pointwise ops of those) or as a near miss (a leaf,
  an iota, a literal tensor, a reduction: not constant along the dim).  The kernel's conclusion is checked
  on every rank: the op run on each rank's pieces, reassembled by the concluded placement, against the
  concluded logical expression.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from ..kernel.expr import ExprError, Exprs
from ..kernel.reductions import scaled
from ..kernel.rules import Fact, KCtx, RuleFailure, derive, fmt_pl, local_shape
from ..ops import REGISTRY, Ctx
from ..plan import Placement
from .core import Mismatch, OpCase, Result, TIn, _close, distribute, eval_expr, rand_values, reassemble, safe_run
from .gens import Draw

R = Placement("R")


# ------------------------------------------------------------------ reduction_normal_form
def _const(X, v):
    return X.mk("const", {"value": v, "shape": (), "dtype": "float"}, [])


def _nested(X, dr: Draw, x, dims, op, keepdim):
    """``op`` over ``dims`` of x as a chain of single- or multi-dim reductions in a random order."""
    dims = list(dims)
    order = list(dr.rng.permutation(dims)) if dims else []
    cur, removed = x, []
    while order:
        k = dr.int(1, len(order))
        grp, order = order[:k], order[k:]
        if keepdim:
            at = tuple(int(d) for d in grp)
        else:  # dims of the current (reduced) tensor
            at = tuple(int(d) - sum(1 for r in removed if r < d) for d in grp)
            removed += grp
        cur = X.mk(op, {"dims": at, "keepdim": keepdim}, [cur])
    return cur


def _count(shape, dims):
    n = 1
    for d in dims:
        n *= shape[d]
    return n


def gen_reduction(dr: Draw, seed: int):
    from .eqgen import _check_pair  # eqgen registers this module's generators: imported at use

    X = Exprs()
    shape = tuple(dr.int(1, 4) for _ in range(dr.int(1, 3)))
    x = X.leaf("x", shape, "float")
    if dr.coin(0.2):
        x = X.mk(dr.pick(["tanh", "exp", "square"]), {}, [x])
    rank = len(shape)
    dims = sorted({dr.int(0, rank - 1) for _ in range(dr.int(1, rank))})
    keep = dr.coin(0.3)
    n = _count(shape, dims)
    try:
        kind = dr.pick(["mean_vs_sum", "mean_vs_means", "sum_vs_sums", "scalar_inside", "broadcast"])
        if kind == "broadcast":
            s = X.leaf("s", (), "float")
            tgt = tuple(dr.int(1, 3) for _ in range(dr.int(1, 3)))
            mid = X.mk("expand", {"shape": tgt[-1:]}, [s])
            a = X.mk("expand", {"shape": tgt}, [X.mk("reshape", {"shape": (1,) * (len(tgt) - 1) + tgt[-1:]}, [mid])])
            b = X.mk("expand", {"shape": tgt}, [s if dr.coin(0.8) else X.mk("neg", {}, [s])])
        else:
            if kind == "mean_vs_sum":
                a = X.mk("mean", {"dims": tuple(dims), "keepdim": keep}, [x])
                b = X.mk("div", {}, [_nested(X, dr, x, dims, "sum", keep), _const(X, n)])
            elif kind == "mean_vs_means":
                a = X.mk("mean", {"dims": tuple(dims), "keepdim": keep}, [x])
                b = _nested(X, dr, x, dims, "mean", keep)
            elif kind == "sum_vs_sums":
                a = X.mk("sum", {"dims": tuple(dims), "keepdim": keep}, [x])
                b = _nested(X, dr, x, dims, "sum", keep)
            else:
                c = dr.pick([2, 3, 0.5, -1])
                a = X.mk("scale", {"value": c}, [X.mk("mean", {"dims": tuple(dims), "keepdim": keep}, [x])])
                b = X.mk("div", {}, [_nested(X, dr, X.mk("scale", {"value": c}, [x]), dims, "sum", keep), _const(X, n)])
            u = dr.rng.random()
            if u < 0.12:  # off-by-one count
                b = X.mk("div", {}, [_nested(X, dr, x, dims, "sum", keep), _const(X, n + 1)])
            elif u < 0.22:  # sum where a mean was meant
                b = _nested(X, dr, x, dims, "sum", keep)
                a = X.mk("mean", {"dims": tuple(dims), "keepdim": keep}, [x])
            elif u < 0.3:  # divided by the count twice
                b = X.mk("div", {}, [X.mk("mean", {"dims": tuple(dims), "keepdim": keep}, [x]), _const(X, n)])
                a = X.mk("mean", {"dims": tuple(dims), "keepdim": keep}, [x])
            elif u < 0.37 and rank >= 2:  # another dim set of the same size
                other = [d for d in range(rank) if d not in dims] or [0]
                b = X.mk("mean", {"dims": tuple(other), "keepdim": keep}, [x])
            elif u < 0.42 and rank >= 2 and len(dims) >= 2:  # keepdim on one stage only
                inner = X.mk("sum", {"dims": (dims[0],), "keepdim": True}, [x])
                b = X.mk("sum", {"dims": tuple(dims[1:]), "keepdim": False}, [inner])
                a = X.mk("sum", {"dims": tuple(dims), "keepdim": False}, [x])
    except ExprError as exc:
        return Result("skip", detail=str(exc)), ""
    if dr.coin():
        a, b = b, a
    return _check_pair(X, a, b, seed), f"{X.show(a, 6)} vs {X.show(b, 6)}"


# ------------------------------------------------------------------ scale_common_factor
_FACTORS = [Fraction(-1, 16), Fraction(1, 1024), Fraction(1, 2), Fraction(2), Fraction(3), Fraction(-1),
            Fraction(1, 32), Fraction(5, 7)]


def _times(X, dr: Draw, c: Fraction, e):
    """``c * e`` in one of the spellings real code uses (``div`` by a count, ``mul`` by a constant, ``scale``);
    a float constant only when ``c`` is a binary fraction (exactly representable)."""
    if c == 1 and dr.coin():
        return e
    u = dr.rng.random()
    binary = c.denominator & (c.denominator - 1) == 0
    if u < 0.4 or not binary:
        return scaled(X, c, e)
    if u < 0.7:
        return X.mk("mul", {}, [e, _const(X, float(c))] if dr.coin() else [_const(X, float(c)), e])
    return X.mk("scale", {"value": float(c)}, [e])


def gen_common_factor(dr: Draw, seed: int):
    """``op(c1 A1, c2 A2, ..)`` against ``k * op((c1/k) A1, (c2/k) A2, ..)`` (a local-count factor moved out of
    the op and a global factor put back), both under a random linear op, or a near miss: one ratio off by
    one, squared (p vs p^2), negated, or operands swapped."""
    from .eqgen import _check_pair

    X = Exprs()
    op = dr.pick(["add", "sub", "concat"])
    rows, cols = dr.int(1, 3), dr.int(1, 3)
    n = 2 if op != "concat" else dr.int(2, 3)
    dim = dr.int(0, 1)
    shapes = [(rows, cols) if op != "concat" else
              ((dr.int(1, 3), cols) if dim == 0 else (rows, dr.int(1, 3))) for _ in range(n)]
    xs = [X.leaf(f"a{k}", sh, "float") for k, sh in enumerate(shapes)]
    if dr.coin(0.3):
        xs = [X.mk("tanh", {}, [x]) for x in xs]
    cs = [dr.pick(_FACTORS) for _ in range(n)]
    if dr.coin(0.1):
        cs[0] = Fraction(0)  # a zero first factor: no common factor is taken out
    k = dr.pick(_FACTORS)
    ds = [c / k for c in cs]
    u = dr.rng.random()
    j = dr.int(1, n - 1)
    if u < 0.12:
        ds[j] = (cs[j] + 1) / k  # off by one
    elif u < 0.22:
        ds[j] = cs[j] * cs[j] / k  # p against p^2
    elif u < 0.3:
        ds[j] = -cs[j] / k
    at = {"dim": dim} if op == "concat" else {}
    a = X.mk(op, at, [_times(X, dr, c, x) for c, x in zip(cs, xs)])
    b_args = [_times(X, dr, d, x) for d, x in zip(ds, xs)]
    if 0.3 <= u < 0.36 and op != "add" and shapes[0] == shapes[j]:
        b_args[0], b_args[j] = b_args[j], b_args[0]  # operands swapped
    b = _times(X, dr, k, X.mk(op, at, b_args))
    sh = X[a].shape
    if dr.coin(0.5):  # under a linear op, as in a backward
        w = X.leaf("w", (sh[1], 2), "float")
        a, b = X.mk("matmul", {}, [a, w]), X.mk("matmul", {}, [b, w])
    elif dr.coin(0.4):
        a, b = X.mk("sum", {"dims": (0,), "keepdim": False}, [a]), X.mk("sum", {"dims": (0,), "keepdim": False}, [b])
    if dr.coin():
        a, b = b, a
    desc = f"{X.show(a, 6)} vs {X.show(b, 6)}"
    res = _check_pair(X, a, b, seed)
    if res.status in ("ok", "refused"):  # the normal form itself must mean what it says: a = c * core
        for e in (a, b):
            bad = _check_norm(X, e, seed)
            if bad is not None:
                return bad, desc
    return res, desc


def _check_norm(X: Exprs, e: int, seed: int) -> Result | None:
    """A DISAGREE result when ``Prover.norm(e) = (c, core)`` but ``e`` differs from ``c * core`` (exact run)."""
    from ..kernel.equality import Prover

    c, core = Prover(X).norm(e)
    rng = np.random.default_rng(seed)
    vals = {i: rand_values(x.shape, x.dtype, rng, True) for i, x in enumerate(X.nodes) if x.op == "input"}
    ctx = Ctx(exact=True, seed=seed)
    try:
        ve, vc = eval_expr(X, e, vals, ctx), eval_expr(X, scaled(X, c, core), vals, ctx)
    except (ValueError, ZeroDivisionError, ArithmeticError):
        return None
    if _close(np.asarray(ve), np.asarray(vc), True):
        return None
    return Result("DISAGREE", ["scale_common_factor"], f"norm: {X.show(e, 5)} is not {c} * {X.show(core, 5)}")


# ------------------------------------------------------------------ replicate_broadcast_as_shard
def _bcast(X: Exprs, dr: Draw, shape: tuple, j: int, depth: int = 2):
    """A replicated expression of ``shape`` constant along j (or, 25%, a near miss that is not)."""
    u = dr.rng.random()
    if depth == 0 or u < 0.35:
        src = list(shape)
        src[j] = 1
        if dr.coin(0.4):
            z = X.mk("const", {"value": dr.pick([1, 2, -0.5]), "shape": (), "dtype": "float"}, [])
        elif dr.coin(0.5):
            z = X.leaf(f"z{len(X)}", tuple(src), "float")
        else:
            z = X.leaf(f"z{len(X)}", tuple(src[j + 1:]), "float")  # missing leading dims
        return X.mk("expand", {"shape": shape}, [z])
    if u < 0.45:
        return X.mk("const", {"value": dr.pick([1, 3]), "shape": shape, "dtype": "float"}, [])
    if u < 0.55:  # unit reshape of a widenable operand
        inner = _bcast(X, dr, shape, j, depth - 1)
        return X.mk("reshape", {"shape": shape}, [X.mk("reshape", {"shape": (1,) + shape}, [inner])])
    if u < 0.8:
        op = dr.pick(["div", "mul", "add", "sub"])
        c = X.mk("const", {"value": dr.pick([2, 3, 12]), "shape": (), "dtype": "float"}, [])
        return X.mk(op, {}, [_bcast(X, dr, shape, j, depth - 1), c])
    miss = dr.pick(["leaf", "iota", "literal", "sum"])  # not constant along j
    if miss == "leaf":
        return X.leaf(f"m{len(X)}", shape, "float")
    if miss == "iota":
        io = X.mk("iota", {"size": shape[j], "dtype": "float"}, [])
        unit = tuple(shape[j] if d == j else 1 for d in range(len(shape)))
        return X.mk("expand", {"shape": shape}, [X.mk("reshape", {"shape": unit}, [io])])
    if miss == "literal":
        vals = np.arange(int(np.prod(shape)), dtype=float).reshape(shape).tolist()
        return X.mk("const", {"value": vals, "shape": shape, "dtype": "float"}, [])
    big = X.leaf(f"m{len(X)}", shape + (2,), "float")
    return X.mk("sum", {"dims": (len(shape),), "keepdim": False}, [big])


def gen_broadcast(dr: Draw, seed: int):
    axes, sizes = dr.mesh(max_axes=3, max_ranks=16)
    rank = dr.int(1, 3)
    j = dr.int(0, rank - 1)
    pl = [R] * len(axes)
    on_j = [i for i in range(len(axes)) if dr.coin(0.6)] or [0]
    for i in range(len(axes)):
        if i in on_j:
            pl[i] = Placement("S", j)
        elif rank > 1 and dr.coin(0.3):
            pl[i] = Placement("S", dr.pick([d for d in range(rank) if d != j]))
    shape = [dr.int(1, 3) for _ in range(rank)]
    for i, p in enumerate(pl):
        if p.kind == "S":
            shape[p.dim] *= sizes[axes[i]]
    shape = tuple(shape)
    X = Exprs()
    kc = KCtx(X, tuple(axes), dict(sizes), dict(sizes))
    x = X.leaf("x", shape, "float")
    loc = local_shape(shape, kc.axes, pl, kc.sizes)
    if loc is None:
        return Result("skip", detail="not divisible"), ""
    rshape = list(loc)
    for i, p in enumerate(pl):  # other sharded dims: the replicated operand is broadcast (size 1) there
        if p.kind == "S" and p.dim != j:
            rshape[p.dim] = 1
    lead = dr.coin(0.2)
    try:
        y = _bcast(X, dr, tuple(rshape), j)
        if lead:  # one more leading dim on the replicated side: the output gets it too
            y = X.mk("expand", {"shape": (2,) + tuple(rshape)}, [y])
    except ExprError as exc:
        return Result("skip", detail=str(exc)), ""
    op = dr.pick(["mul", "add", "sub", "div", "maximum"])
    facts = [Fact(x, tuple(pl)), Fact(y, tuple([R] * len(axes)))]
    if dr.coin():
        facts.reverse()
    lin = [local_shape(X[f.expr].shape, kc.axes, f.pl, kc.sizes) for f in facts]
    try:
        out_local = REGISTRY[op].infer(lin, {})
    except ValueError as exc:
        return Result("skip", detail=str(exc)), ""
    desc = f"{op}({', '.join(X.show(f.expr, 4) + ' ' + fmt_pl(axes, f.pl) for f in facts)}) mesh {sizes}"
    try:
        d = derive(kc, op, {}, {}, facts, out_local)
    except RuleFailure as exc:
        return Result("refused", detail=str(exc)), desc
    try:
        return _check_broadcast(X, kc, facts, op, d, seed), desc
    except (ValueError, ZeroDivisionError, ArithmeticError) as exc:  # outside exact semantics (a zero divisor)
        return Result("skip", list(d.rules), f"eval: {exc}"), desc


def _check_broadcast(X, kc, facts, op, d, seed) -> Result:
    rng = np.random.default_rng(seed)
    ctx = Ctx(exact=True, seed=seed)
    leaves = {i: rand_values(e.shape, e.dtype, rng, True) for i, e in enumerate(X.nodes) if e.op == "input"}
    memo: dict = {}
    locals_ = []
    for f in facts:
        v = eval_expr(X, f.expr, leaves, ctx, memo)
        locals_.append(distribute(v, kc.axes, kc.sizes, f.pl, rng, True))
    outs = {r: REGISTRY[op].eval([loc[r] for loc in locals_], {}, ctx)[0] for r in locals_[0]}
    f = d.facts[0]
    want = eval_expr(X, f.expr, leaves, ctx, memo)
    try:
        got = reassemble(outs, kc.axes, kc.sizes, f.pl, True, ctx)
    except (Mismatch, ValueError) as exc:
        return Result("DISAGREE", list(d.rules), f"{exc}; concluded {X.show(f.expr, 4)} as {fmt_pl(kc.axes, f.pl)}")
    if not _close(np.asarray(got), np.asarray(want), True):
        return Result("DISAGREE", list(d.rules), f"reassembled by {fmt_pl(kc.axes, f.pl)} differs from the concluded "
                                                 f"{X.show(f.expr, 4)}")
    return Result("ok", list(d.rules))


# ------------------------------------------------------------------ collectives (kernel/rules.py, CollectivesReal.v)
def gen_rs_replicate(dr: Draw, seed: int):
    """reduce_scatter of a tensor replicated on its axis; other axes R, S (other dims, or the same dim on an
    outer axis), and near misses: Partial elsewhere, the dim sharded on an inner axis, max."""
    axes, sizes = dr.mesh(max_axes=3, max_ranks=16)
    ai = dr.int(0, len(axes) - 1)
    rank = dr.int(1, 3)
    d = dr.int(0, rank - 1)
    pl = []
    for j in range(len(axes)):
        u = dr.rng.random()
        if j == ai:
            pl.append(R if dr.coin(0.9) else Placement("P", reduce="sum"))
        elif u < 0.5:
            pl.append(R)
        elif u < 0.75 and rank > 1:
            pl.append(Placement("S", dr.pick([k for k in range(rank) if k != d])))
        elif u < 0.9:
            pl.append(Placement("S", d))  # nested when outer; refused when inner
        else:
            pl.append(Placement("P", reduce=dr.pick(["sum", "avg"])))
    shape = [dr.int(1, 2) for _ in range(rank)]
    for j, q in enumerate(pl):
        if q.kind == "S":
            shape[q.dim] *= sizes[axes[j]]
    shape[d] *= sizes[axes[ai]] * dr.pick([1, 1, 2])
    red = dr.pick(["sum", "sum", "avg", "max"])
    attrs = {"axis": axes[ai], "dim": d - rank if dr.coin(0.3) else d, "reduce": red}
    case = OpCase("reduce_scatter", attrs, [TIn(tuple(shape), tuple(pl))], tuple(axes), dict(sizes))
    return safe_run(case, seed), case.describe()


def gen_ar_avg_axes(dr: Draw, seed: int):
    """all_reduce(avg) over two or three axes of Partial(sum) on each; near misses: one of them P(avg) or R,
    Partial on an axis outside the group, sum instead of avg."""
    axes, sizes = dr.mesh(max_axes=3, min_axes=2, max_ranks=24)
    k = dr.int(2, len(axes))
    group = sorted(int(v) for v in dr.rng.permutation(len(axes))[:k])
    pl = []
    for j in range(len(axes)):
        if j in group:
            u = dr.rng.random()
            pl.append(Placement("P", reduce="sum") if u < 0.85 else R if u < 0.93 else Placement("P", reduce="avg"))
        else:
            pl.append(dr.pick([R, R, Placement("S", 0), Placement("P", reduce="sum")]))
    shape = [dr.int(1, 3), dr.int(1, 3)]
    for j, q in enumerate(pl):
        if q.kind == "S":
            shape[0] *= sizes[axes[j]]
    names = [axes[j] for j in group]
    if dr.coin(0.3):
        names.reverse()  # the op flattens in mesh order whatever the list order
    red = "avg" if dr.coin(0.9) else "sum"
    case = OpCase("all_reduce", {"axis": names, "reduce": red}, [TIn(tuple(shape), tuple(pl))], tuple(axes), dict(sizes))
    return safe_run(case, seed), case.describe()


def gen_ar_mixed(dr: Draw, seed: int):
    """all_reduce(sum | avg) over two axes each Replicate, Partial(sum) or Partial(avg), or over three
    Replicate axes; near misses: Partial(max) in the group, a Partial outside it, three axes mixed, max."""
    axes, sizes = dr.mesh(max_axes=3, min_axes=2, max_ranks=24)
    k = 3 if len(axes) == 3 and dr.coin(0.3) else 2
    group = sorted(int(v) for v in dr.rng.permutation(len(axes))[:k])
    kinds = [R, Placement("P", reduce="sum"), Placement("P", reduce="avg")]
    pl = []
    for j in range(len(axes)):
        if j in group:
            u = dr.rng.random()
            pl.append(R if k == 3 and u < 0.8 else dr.pick(kinds) if u < 0.93 else Placement("P", reduce="max"))
        else:
            pl.append(dr.pick([R, R, Placement("S", 0), Placement("P", reduce="sum")]))
    shape = [dr.int(1, 3), dr.int(1, 3)]
    for j, q in enumerate(pl):
        if q.kind == "S":
            shape[0] *= sizes[axes[j]]
    names = [axes[j] for j in group]
    if dr.coin(0.3):
        names.reverse()
    red = dr.pick(["sum", "avg", "sum", "avg", "max"])
    case = OpCase("all_reduce", {"axis": names, "reduce": red}, [TIn(tuple(shape), tuple(pl))], tuple(axes), dict(sizes))
    return safe_run(case, seed), case.describe()


# ------------------------------------------------------------------ partial_sum_as_avg (output matching)
def gen_partial_read(dr: Draw, seed: int):
    """A fact under random placements re-read with some Partial(sum) axes as Partial(avg) and back (and near
    misses: Partial(max), Replicate or Shard against Partial): the ranks' pieces, reassembled by the declared
    placements, must be the re-read expression."""
    from ..kernel.partial_read import RULE, read_as

    axes, sizes = dr.mesh(max_axes=3, max_ranks=16)
    kinds = [Placement("P", reduce="sum"), Placement("P", reduce="avg"), R, Placement("S", 0)]
    pl = [dr.pick(kinds) for _ in axes]
    want = []
    for q in pl:
        if q.kind == "P" and dr.coin(0.6):
            want.append(Placement("P", reduce="avg" if q.reduce == "sum" else "sum"))
        elif dr.coin(0.1):
            want.append(dr.pick([Placement("P", reduce="max"), R, Placement("P", reduce="sum")]))
        else:
            want.append(q)
    shape = [dr.int(1, 3), dr.int(1, 2)]
    for a, q in zip(axes, pl):
        if q.kind == "S":
            shape[0] *= sizes[a]
    X = Exprs()
    x = X.leaf("x", tuple(shape), "float")
    desc = f"{fmt_pl(axes, pl)} read as {fmt_pl(axes, want)}"
    e = read_as(X, axes, sizes, x, pl, want)
    if e is None:
        return Result("refused", detail="not a sum/avg re-reading"), desc
    rng = np.random.default_rng(seed)
    ctx = Ctx(exact=True, seed=seed)
    v = rand_values(tuple(shape), "float", rng, True)
    try:
        got = reassemble(distribute(v, axes, sizes, pl, rng, True), axes, sizes, want, True, ctx)
    except Mismatch as exc:
        return Result("DISAGREE", [RULE], str(exc)), desc
    if not _close(np.asarray(got), np.asarray(eval_expr(X, e, {x: v}, ctx)), True):
        return Result("DISAGREE", [RULE], f"re-read as {X.show(e, 4)}, but the pieces reassemble differently"), desc
    return Result("ok", [RULE] if e != x else []), desc


# ------------------------------------------------------------------ allgather_partial_sum (a multi-op pattern)
def gen_gather_sum(dr: Draw, seed: int):
    """A plan: x sharded on dim 0 over axis a (and maybe dim 1 over an outer / inner axis b), local sums over
    dims including 0 (a Partial(sum) over a), all_gather over a along a dim, then a sum.  Near misses: the sum
    misses the gathered dim, x replicated over a (the gathered pieces are copies: p times the sum), a mean
    instead of the final sum, the gather over the other axis.  Checked by the interpreter when VERIFIED."""
    from .plans import _check_plan

    two = dr.coin(0.5)
    axes = ["a", "b"] if two else ["a"]
    if two and dr.coin():
        axes.reverse()
    sizes = {"a": dr.pick([2, 3, 4]), "b": dr.pick([2, 3])}
    n0, n1 = sizes["a"] * dr.int(1, 2), dr.int(1, 3) * (sizes["b"] if two else 1)
    xa = "Replicate" if dr.coin(0.1) else "Shard(0)"
    xb = dr.pick(["Replicate", "Shard(1)"]) if two else None
    inner_dims = [0] if dr.coin(0.5) else [0, 1]
    g = dr.int(0, 1)
    u = dr.rng.random()
    outer_dims = [g] if u < 0.45 else [0, 1] if u < 0.85 else [1 - g]  # the last: misses the gathered dim
    keep = dr.coin(0.3)
    final = "mean" if dr.coin(0.08) else "sum"
    gaxis = "b" if two and dr.coin(0.08) else "a"
    dims = {"n0": n0, "n1": n1, **{k: sizes[k] for k in axes}}
    local = ["n0/a" if xa != "Replicate" else "n0", "n1/b" if xb == "Shard(1)" else "n1"]
    par = [
        {"name": "s", "op": "sum", "inputs": ["x"], "attrs": {"dims": inner_dims, "keepdim": True}},
        {"name": "g", "op": "all_gather", "inputs": ["s"], "attrs": {"axis": gaxis, "dim": g}},
        {"name": "y", "op": final, "inputs": ["g"], "attrs": {"dims": outer_dims, "keepdim": keep}},
    ]
    lg = [
        {"name": "s", "op": "sum", "inputs": ["x"], "attrs": {"dims": inner_dims, "keepdim": True}},
        {"name": "y", "op": "sum", "inputs": ["s"], "attrs": {"dims": outer_dims, "keepdim": keep}},
    ]
    out_pl = {"a": "Replicate"}
    if two:  # b: a shard of a summed dim is Partial(sum), of a kept dim stays a shard
        summed = 1 in inner_dims or 1 in outer_dims
        out_pl["b"] = "Replicate" if xb == "Replicate" else "Partial(sum)" if summed else "Shard(1)" if keep else \
            f"Shard({1 - sum(1 for d in outer_dims if d < 1)})"
    d = {"tvcert_plan": 1, "name": "gather_sum", "dims": dims, "mesh": {k: k for k in axes},
         "logical": {"inputs": [{"name": "x", "shape": ["n0", "n1"], "dtype": "float"}], "nodes": lg, "outputs": ["y"]},
         "parallel": [{"name": "p", "inputs": [{"name": "x", "shape": local, "dtype": "float"}], "nodes": par,
                       "outputs": ["y"]}],
         "inputs": {"x": {"local": "x", "placement": {"a": xa, **({"b": xb} if two else {})}}},
         "outputs": {"y": {"local": "y", "placement": out_pl}}}
    desc = f"x {xa}/{xb} sum{inner_dims} gather({gaxis}, {g}) {final}{outer_dims} keep={keep} mesh {dims}"
    return _check_plan(d, RULE_GATHER), desc


RULE_GATHER = "allgather_partial_sum"


def gen_ar_avg_nested(dr: Draw, seed: int):
    """all_reduce(avg) over one axis of Partial(sum) while other axes hold Partial(sum) / Partial(avg) (near
    misses: Partial(max) there, inner or outer; Shard / Replicate mixed in)."""
    axes, sizes = dr.mesh(max_axes=3, min_axes=2, max_ranks=24)
    ai = dr.int(0, len(axes) - 1)
    pl = []
    for j in range(len(axes)):
        if j == ai:
            pl.append(Placement("P", reduce="sum"))
        else:
            u = dr.rng.random()
            pl.append(Placement("P", reduce="sum") if u < 0.45 else Placement("P", reduce="avg") if u < 0.75 else
                      Placement("P", reduce="max") if u < 0.85 else dr.pick([R, Placement("S", 0)]))
    shape = [dr.int(1, 3), dr.int(1, 2)]
    for j, q in enumerate(pl):
        if q.kind == "S":
            shape[0] *= sizes[axes[j]]
    case = OpCase("all_reduce", {"axis": axes[ai], "reduce": "avg"}, [TIn(tuple(shape), tuple(pl))], tuple(axes),
                  dict(sizes))
    return safe_run(case, seed), case.describe()


NORM_GENERATORS = {
    "allreduce_avg_partial_sum_nested": gen_ar_avg_nested,
    "allgather_partial_sum": gen_gather_sum,
    "partial_sum_as_avg": gen_partial_read,
    "reduction_normal_form": gen_reduction,
    "scale_common_factor": gen_common_factor,
    "allreduce_mixed_axes": gen_ar_mixed,
    "replicate_broadcast_as_shard": gen_broadcast,
    "reduce_scatter_replicate": gen_rs_replicate,
    "allreduce_avg_partial_sum_axes": gen_ar_avg_axes,
}
