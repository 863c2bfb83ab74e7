"""Reference interpreter: runs the logical graph and the parallel program on every rank.

This is the oracle for counterexamples and soundness testing, not a proof.  Logical inputs
are distributed to ranks by their placements, every rank runs its program with collectives
and send/recv simulated, and outputs are reassembled by their placements and compared with
the logical outputs.  Two number modes: float64, and exact (Fractions, with nonlinear
functions replaced by a fixed pseudo-random table so equality is decidable).
"""
from __future__ import annotations

import itertools
import os
import zlib
from dataclasses import dataclass, field
from decimal import Decimal, DivisionByZero, InvalidOperation, Overflow, getcontext, localcontext
from fractions import Fraction
from typing import Iterable, Mapping

import numpy as np

from . import budget
from .errors import InternalError
from .graph import Graph, Node, int_bounds, loop_body
from .ops import REGISTRY, Ctx, resolve_attrs
from .ops.base import TablesNeeded
from .ops.collectives import axes_of
from .kernel.concat_groups import layout_spec
from .plan import Binding, Placement, Plan
from .shapes import dim_value

Rank = tuple[int, ...]  # coordinates on every mesh axis, in mesh order
MAX_ELEMENTS = 5_000_000

# Budget of one run (checked before it starts, from the shapes at its dims): tensor elements held at once (the
# logical graph's and every rank's), and arithmetic work (an element of each op's output, times the contracted
# size for matmul / einsum).  Exact and decimal runs compute with Python numbers, so their budget is smaller.
# TVCERT_RUN_ELEMENTS / TVCERT_RUN_WORK set the float64 budget (exact / decimal: half the elements, and
# TVCERT_EXACT_MAX_WORK work, 1.5e7 by default).
RUN_MAX_ELEMENTS = int(os.environ.get("TVCERT_RUN_ELEMENTS", 20_000_000))
RUN_MAX_WORK = int(os.environ.get("TVCERT_RUN_WORK", 2_000_000_000))
EXACT_DIVISOR = 2
EXACT_MAX_WORK = int(float(os.environ.get("TVCERT_EXACT_MAX_WORK", 15_000_000)))


class RunError(RuntimeError):
    """The plan cannot be executed (deadlock, too large, out-of-range index ...).

    ``side`` says which graph failed ("logical" or "parallel", None when neither ran) and ``domain`` whether
    the failure is a value outside an op's domain (a division by zero, log of a non-positive number ...)."""

    side: str | None = None
    domain: bool = False


class BudgetExceeded(RunError):
    """The run would exceed (or has exceeded) its element, work or time budget: no result, never a verdict.
    ``kind``: "size" (found before the run, from its shapes) or "time" / "memory" (during it)."""

    def __init__(self, msg: str, kind: str = "size"):
        super().__init__(msg)
        self.kind = kind


def _check_time(where: str) -> None:
    budget.check(where)  # the enclosing search's work budget (and its wall-clock hang guard): tvcert/budget.py


def _charge(n: Node, ins, outs, ctx: Ctx) -> None:
    """Spend one op's work units (budget.op_units: deterministic, from its op count and element counts)."""
    if not budget._open:
        return
    elems = sum(getattr(v, "size", 1) for v in ins) + sum(getattr(v, "size", 1) for v in outs)
    if n.op == "matmul" and ins and getattr(ins[0], "ndim", 0):
        elems = max(elems, sum(getattr(v, "size", 1) for v in outs) * max(ins[0].shape[-1], 1))
    mode = getattr(ctx, "mode", None) or ("exact" if ctx.exact else "float64")
    budget.charge(budget.op_units(int(elems), mode))


def run_cost(plan: Plan, dims: Mapping[str, int]) -> tuple[int, int]:
    """(tensor elements, work) of one run at ``dims``: every tensor of the logical graph and of every program
    on each of its ranks (all are held until the comparison), and the arithmetic of every op."""
    from .graph import GraphError
    from .ops.linalg import parse_equation

    mesh = plan.mesh(dims)

    def cost(g: Graph, env: Mapping[str, int]) -> tuple[int, int]:
        try:
            types = g.infer(env, mesh, key="shape@budget")
        except GraphError as exc:
            raise RunError(f"the plan is ill-shaped at these dims: {exc.path}: {exc.msg}") from None
        elems = sum(_numel(sh) for sh, _ in types.values())
        work = 0
        for n in g.nodes:
            ins = [types[x][0] for x in n.inputs if x in types]
            out = sum(_numel(types[o][0]) for o in n.outputs if o in types)
            w = out + sum(_numel(sh) for sh in ins)
            try:
                if n.op == "matmul" and ins and ins[0]:
                    w = out * max(ins[0][-1], 1)
                elif n.op == "einsum":
                    _, _, sizes = parse_equation(n.attrs.get("equation"), ins)
                    w = _numel(tuple(sizes.values()))
            except Exception:  # noqa: BLE001 - the estimate only; infer has accepted the op
                pass
            work += w
        return elems, work

    elems, work = cost(plan.logical, dims)
    for pname, g in plan.programs.items():
        env = dict(dims)
        for a in plan.program_axes(pname):
            env[f"rank.{a}"] = 0
        env.update({f"rank.{a}": c for a, c in g.stage.items()})
        e, w = cost(g, env)
        nranks = 1
        for a, sz in mesh.items():
            if a not in g.stage:
                nranks *= sz
        elems += e * nranks
        work += w * nranks
    return elems, work


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def check_budget(plan: Plan, dims: Mapping[str, int], mode: str) -> None:
    """Raise :class:`BudgetExceeded` when a run at ``dims`` in ``mode`` would exceed its budget."""
    elems, work = run_cost(plan, dims)
    max_e = RUN_MAX_ELEMENTS if mode == "float64" else RUN_MAX_ELEMENTS // EXACT_DIVISOR
    max_w = RUN_MAX_WORK if mode == "float64" else EXACT_MAX_WORK
    shown = ", ".join(f"{k}={v}" for k, v in dims.items())
    if elems > max_e:
        raise BudgetExceeded(f"a {mode} run at {shown[:300]} would hold {elems:.3g} tensor elements (logical graph and "
                             f"every rank), over the budget of {max_e:.3g}; give smaller run_dims (or --dims)")
    if work > max_w:
        raise BudgetExceeded(f"a {mode} run at {shown[:300]} would take {work:.3g} arithmetic operations, over the "
                             f"budget of {max_w:.3g}; give smaller run_dims (or --dims)")


# ------------------------------------------------------------------ numbers
def random_value(shape: tuple[int, ...], dtype: str, rng: np.random.Generator, ctx: Ctx, hi: int | None = None,
                 lo: int = 0) -> np.ndarray:
    """Inputs chosen to defeat coincidences: distinct magnitudes and mixed signs.  An int range [lo, hi) with
    lo < 0 < hi (labels padded with lo = ignore_index) draws only the values torch accepts as labels: lo for a
    random share (20-60%, at least one element) and [0, hi) for the rest (at least one)."""
    if dtype == "int":
        hi = max(hi or 1, lo + 1)
        if lo < 0 < hi:
            v = rng.integers(0, hi, size=shape, dtype=np.int64)
            pad = rng.random(size=shape) < rng.uniform(0.2, 0.6)
            if pad.size >= 2:
                flat = pad.reshape(-1)
                i, j = rng.choice(pad.size, 2, replace=False)
                flat[i], flat[j] = True, False
            return np.where(pad, np.int64(lo), v)
        return rng.integers(lo, hi, size=shape, dtype=np.int64)
    if isinstance(ctx, DecimalCtx):
        return ctx.asarray(rng.standard_normal(shape) * rng.choice([0.5, 1.0, 2.0], size=shape))
    if ctx.exact:
        num = rng.integers(-40, 41, size=shape)
        den = rng.choice([1, 2, 3, 5, 7, 11], size=shape)
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(*shape):
            n = int(num[idx]) or 1
            out[idx] = Fraction(n, int(den[idx]))
        return out
    return rng.standard_normal(shape) * rng.choice([0.5, 1.0, 2.0], size=shape)


# ------------------------------------------------------------------ 60-digit decimal arithmetic
DIGITS = 60  # working precision of the decimal mode
DECIMAL_RTOL = Decimal("1e-30")  # its comparison tolerance: 30 digits of headroom over its own rounding
_PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899862803")


class DecimalCtx(Ctx):
    """Real arithmetic carried to DIGITS significant digits (``decimal.Decimal`` object arrays).

    It decides whether a float64 difference is rounding: nonlinear functions are computed, not tabled, so
    identities such as exp(a+b) = exp(a)exp(b) hold to ~DIGITS digits, and a cancellation that costs float64
    its last digits leaves DIGITS - 16 here.  Outside an op's domain the value is NaN or an infinity, as in
    float64 (x/0, log of x <= 0, sqrt of x < 0): the run mirrors the float64 one it checks, digit for digit
    but 44 more of them.  Values must only be combined with each other and with ints (``const`` converts
    literals); run it inside ``decimal_context()``.
    """

    mode = "decimal"

    def __init__(self, seed: int = 0):
        super().__init__(exact=True, seed=seed, no_tables=False)

    def const(self, v):
        if isinstance(v, Decimal):
            return v
        if isinstance(v, Fraction):
            return Decimal(v.numerator) / Decimal(v.denominator)
        if isinstance(v, (float, np.floating)):
            return Decimal(str(float(v)))  # a literal is the decimal it is written as
        return Decimal(int(v))

    def zeros(self, shape):
        out = np.empty(shape, dtype=object)
        out.fill(Decimal(0))
        return out

    def full(self, shape, v):
        out = np.empty(shape, dtype=object)
        out.fill(self.const(v))
        return out

    def asarray(self, x):
        a = np.asarray(x, dtype=object)
        return np.vectorize(self.const, otypes=[object])(a) if a.size else a

    def fn(self, name, x):
        f = _DECIMAL_FNS.get(name)
        if f is None:
            raise ValueError(f"no decimal semantics for function {name!r}")
        return np.vectorize(lambda v: +f(self.const(v)), otypes=[object])(x)


def _d_exp(x: Decimal) -> Decimal:
    return x.exp()


def decimal_context():
    """DIGITS digits; invalid operations give NaN and divisions by zero infinities (IEEE's non-values)."""
    return localcontext(prec=DIGITS, traps=[c for c in getcontext().traps
                                            if c not in (InvalidOperation, DivisionByZero, Overflow)
                                            and getcontext().traps[c]])


def _d_ln(x: Decimal) -> Decimal:
    return x.ln()


def _d_sqrt(x: Decimal) -> Decimal:
    return x.sqrt()


def _d_rsqrt(x: Decimal) -> Decimal:
    return 1 / x.sqrt()


def _d_tanh(x: Decimal) -> Decimal:
    if x.is_nan():
        return x
    if abs(x) > 80:
        return Decimal(1 if x > 0 else -1)
    e = (2 * x).exp()
    return (e - 1) / (e + 1)


def _d_sigmoid(x: Decimal) -> Decimal:
    return 1 / (1 + (-x).exp())


def _d_series(terms) -> Decimal:
    total = Decimal(0)
    for t in terms:
        if t == 0 or abs(t) < abs(total) * Decimal(10) ** (-(DIGITS + 20)):
            break
        total += t
    return total


def _d_sincos(x: Decimal, cos: bool) -> Decimal:
    if not x.is_finite():
        return Decimal("NaN")
    with localcontext() as c:
        c.prec = DIGITS + 20 + max(0, x.adjusted())
        two_pi = 2 * _PI
        x = x - two_pi * (x / two_pi).to_integral_value()

        def terms():
            t = Decimal(1) if cos else x
            n = 0 if cos else 1
            while True:
                yield t
                t = -t * x * x / ((n + 1) * (n + 2))
                n += 2
        r = _d_series(terms())
    return +r


def _d_erf(x: Decimal) -> Decimal:
    if x.is_nan():
        return x
    if abs(x) > 27:  # 1 - erf(27) < 1e-300
        return Decimal(1 if x > 0 else -1)
    with localcontext() as c:
        c.prec = DIGITS + 20 + int(x * x / Decimal("2.3")) + 1

        def terms():  # erf(x) = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1))
            t, n = x, 0
            while True:
                yield t / (2 * n + 1)
                n += 1
                t = -t * x * x / n
        r = 2 / _PI.sqrt() * _d_series(terms())
    return +r


_DECIMAL_FNS = {"exp": _d_exp, "log": _d_ln, "sqrt": _d_sqrt, "rsqrt": _d_rsqrt, "tanh": _d_tanh,
                "sigmoid": _d_sigmoid, "erf": _d_erf, "sin": lambda x: _d_sincos(x, False),
                "cos": lambda x: _d_sincos(x, True)}


def values_equal(a: np.ndarray, b: np.ndarray, exact: bool, mode: str | None = None) -> bool:
    """Equal as results of one mode: exactly (exact, int), within DECIMAL_RTOL (decimal), or within
    float64 rounding elementwise (float64)."""
    if a.shape != b.shape:
        return False
    if mode == "decimal" and a.dtype == object and b.dtype == object:
        return all(_decimal_eq(Decimal(x), Decimal(y)) for x, y in zip(a.flat, b.flat))
    if exact or a.dtype == np.int64 or b.dtype == np.int64:
        return bool(np.all(a == b))
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    na, nb = np.isnan(a), np.isnan(b)
    if not np.array_equal(na, nb):
        return False
    fin = np.isfinite(a) & np.isfinite(b)
    if not np.array_equal(a[~fin & ~na], b[~fin & ~nb]):  # infinities must match exactly
        return False
    a, b = a[fin], b[fin]
    # elementwise: large constants (masks of -1e9) must not loosen the comparison elsewhere
    return bool(np.all(np.abs(a - b) <= 1e-7 * (1.0 + np.abs(a) + np.abs(b))))


def _decimal_eq(x: Decimal, y: Decimal) -> bool:
    if x.is_nan() or y.is_nan():
        return x.is_nan() and y.is_nan()
    if x.is_infinite() or y.is_infinite():
        return x == y
    return x == y or abs(x - y) <= DECIMAL_RTOL * (1 + abs(x) + abs(y))


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / (1 + |a| + |b|) elementwise (inf where one side is not a finite number and they differ)."""
    if a.shape != b.shape:
        return float("inf")
    worst = 0.0
    for x, y in zip(np.asarray(a, dtype=object).flat, np.asarray(b, dtype=object).flat):
        try:
            fx, fy = float(x), float(y)
        except (TypeError, ValueError, OverflowError):
            return float("inf")
        if not (np.isfinite(fx) and np.isfinite(fy)):
            if fx != fy and not (np.isnan(fx) and np.isnan(fy)):
                return float("inf")
            continue
        if x != y:
            worst = max(worst, float(abs(x - y)) / (1.0 + abs(fx) + abs(fy)))
    return worst


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    diff = np.asarray(a - b, dtype=object if object in (a.dtype, b.dtype) else np.float64).reshape(-1)
    d = np.abs(np.array([float(x) for x in diff], dtype=np.float64))
    return float(np.max(d))


# ------------------------------------------------------------------ graph execution
def eval_node(n: Node, env_values: Mapping[str, np.ndarray], env_dims: Mapping[str, int], ctx: Ctx) -> list[np.ndarray]:
    _check_time(f"{n.path} ({n.op})")
    spec = REGISTRY[n.op]
    ra = resolve_attrs(spec, n.attrs, env_dims)
    try:
        ins = [env_values[x] for x in n.inputs]
        outs = [v if isinstance(v, np.ndarray) else np.array(v, dtype=object if ctx.exact else np.float64)
                for v in spec.eval(ins, ra, ctx)]
        _charge(n, ins, outs, ctx)
        return outs
    except TablesNeeded:
        raise
    except MemoryError:
        raise BudgetExceeded(f"{n.path} ({n.op}): out of memory", "memory") from None
    except (ValueError, IndexError, ZeroDivisionError, ArithmeticError) as exc:
        err = RunError(f"{n.path} ({n.op} -> {n.name}): {exc}")
        err.domain = isinstance(exc, ArithmeticError) or any(
            w in str(exc) for w in ("division by zero", "outside its domain", "is zero in exact mode"))
        raise err from None
    except Exception as exc:  # not a property of the plan: tvcert's own failure, reported with the op
        raise InternalError(f"{n.path} ({n.op!r}, interpreter)", exc) from exc


def run_graph(g: Graph, inputs: Mapping[str, np.ndarray], dims: Mapping[str, int], ctx: Ctx) -> dict[str, np.ndarray]:
    vals = dict(inputs)
    for n in g.nodes:
        for o, v in zip(n.outputs, eval_node(n, vals, dims, ctx)):
            vals[o] = v
    return vals


def apply_layout(b: Binding, v: np.ndarray, dims: Mapping[str, int], ctx: Ctx) -> np.ndarray:
    for op, attrs in b.layout:
        spec = layout_spec(op)
        v = spec.eval([v], resolve_attrs(spec, attrs, dims), ctx)[0]
    return v


# ------------------------------------------------------------------ mesh helpers
@dataclass
class Mesh:
    axes: list[str]
    sizes: dict[str, int]

    def ranks(self, fixed: Mapping[str, int] | None = None) -> list[Rank]:
        fixed = fixed or {}
        ranges = [[fixed[a]] if a in fixed else range(self.sizes[a]) for a in self.axes]
        return [tuple(r) for r in itertools.product(*ranges)]

    def env(self, rank: Rank, dims: Mapping[str, int]) -> dict[str, int]:
        e = dict(dims)
        for a, c in zip(self.axes, rank):
            e[f"rank.{a}"] = c
        return e

    def with_coord(self, rank: Rank, axis: str, c: int) -> Rank:
        i = self.axes.index(axis)
        return rank[:i] + (c,) + rank[i + 1:]

    def group(self, rank: Rank, axes: Iterable[str]) -> list[Rank]:
        """Ranks sharing ``rank``'s coordinates off ``axes``, in coordinate order on ``axes``."""
        axes = [a for a in self.axes if a in set(axes)]
        fixed = {a: c for a, c in zip(self.axes, rank) if a not in axes}
        return self.ranks(fixed)


def plan_mesh(plan: Plan, dims: Mapping[str, int]) -> Mesh:
    sizes = plan.mesh(dims)
    total = 1
    for s in sizes.values():
        total *= s
    if total > 4096:
        raise RunError(f"the mesh has {total} ranks at these dims; give smaller run_dims (or --dims) to execute it")
    return Mesh(list(plan.mesh_spec), sizes)


# ------------------------------------------------------------------ distribute / assemble
def distribute(b: Binding, value: np.ndarray, mesh: Mesh, ranks: list[Rank], rng: np.random.Generator, ctx: Ctx) -> dict[Rank, np.ndarray]:
    """Split a (laid-out) logical value into each rank's local tensor, axis by axis in mesh order."""
    pieces: dict[Rank, np.ndarray] = {}
    for r in ranks:
        v = value
        for a in mesh.axes:
            if a not in b.placement:
                continue
            v = _local_piece(b.placement[a], v, r[mesh.axes.index(a)], mesh.sizes[a], a, b, rng, ctx)
        pieces[r] = v
    return pieces


def _local_piece(pl: Placement, v, c, p, axis, b, rng, ctx):
    if pl.kind == "R":
        return v
    if pl.kind == "S":
        return np.split(v, p, axis=pl.dim % v.ndim)[c]
    if pl.kind == "Z":
        chunks = np.split(v, 2 * p, axis=pl.dim % v.ndim)
        return np.concatenate([chunks[c], chunks[2 * p - 1 - c]], axis=pl.dim % v.ndim)
    # Partial inputs: split at random, deterministically per (tensor, axis, seed) so that ranks which must agree
    # (replicas on the other axes) get the same piece.  Which coordinate holds the remainder (sum) or the value
    # itself (max) is drawn per element, so no plan can read a partial input correctly from a fixed coordinate.
    seed = zlib.crc32(f"{b.logical}|{axis}|{ctx.seed}".encode())
    srng = np.random.default_rng(seed)
    holder = srng.integers(0, p, size=v.shape)
    size = ctx.const((1, 0.1, 3)[ctx.seed % 3])  # small and large summands alike: a bug may show only for one
    parts = [np.asarray(random_value(v.shape, "float", srng, ctx) * size, dtype=object if ctx.exact else np.float64)
             for _ in range(p)]
    mine = np.asarray(holder == c, dtype=bool)
    kind = object if ctx.exact else np.float64
    if pl.reduce == "max":
        # the holder has the value, every other coordinate a strictly smaller random value: the maximum is v
        gap = np.asarray(abs(parts[c]) + ctx.const(1) if ctx.exact else np.abs(parts[c]) + 1.0, dtype=kind)
        return np.asarray(np.where(mine, v, v - gap), dtype=kind)
    if pl.reduce == "avg":
        v = v * ctx.const(p)
    total = parts[0]
    for i in range(1, p):
        total = total + parts[i]
    # random summands everywhere; the holder's summand also carries v - (sum of all summands)
    return np.asarray(np.where(mine, parts[c] + (v - total), parts[c]), dtype=kind)


@dataclass
class Assembly:
    value: np.ndarray | None
    problem: str | None = None  # e.g. replicas disagree
    replicas: int = 0  # when copies of a Replicate axis disagree: how many there are (to measure each)


def assemble(b: Binding, locals_: Mapping[Rank, np.ndarray], mesh: Mesh, base: Rank, ctx: Ctx,
             placement: Mapping[str, Placement] | None = None, replica: int | None = None) -> Assembly:
    """Rebuild the logical (laid-out) value from rank-local tensors by the placement.  ``replica``: on a Replicate
    axis take that coordinate's copy (the last one past the axis size) without comparing the copies -- only to
    measure how far each copy is from the logical value once they disagree (never a verdict)."""
    placement = b.placement if placement is None else placement
    axes = [a for a in mesh.axes if a in placement]

    def rec(k: int, rank: Rank) -> Assembly:
        if k == len(axes):
            return Assembly(locals_[rank])
        a = axes[k]
        subs = []
        for c in range(mesh.sizes[a]):
            s = rec(k + 1, mesh.with_coord(rank, a, c))
            if s.value is None:
                return s
            subs.append(s.value)
        pl = placement[a]
        if pl.kind == "R":
            if replica is not None:
                return Assembly(subs[min(replica, len(subs) - 1)])
            for c, s in enumerate(subs[1:], 1):
                if not values_equal(subs[0], s, ctx.exact, getattr(ctx, "mode", None)):
                    between = (f"max |diff| {max_diff(subs[0], s):.3g} between them" if s.shape == subs[0].shape else
                               f"shapes {list(subs[0].shape)} and {list(s.shape)}")
                    return Assembly(None, f"Replicate on axis {a!r}, but coordinates 0 and {c} hold different values "
                                          f"({between})", replicas=len(subs))
            return Assembly(subs[0])
        if pl.kind == "S":
            if any(s.shape != subs[0].shape for s in subs):
                return Assembly(None, f"Shard on axis {a!r}, but ranks hold different shapes")
            if not -subs[0].ndim <= pl.dim < subs[0].ndim:
                return Assembly(None, f"Shard({pl.dim}) on a tensor of rank {subs[0].ndim}")
            return Assembly(np.concatenate(subs, axis=pl.dim % subs[0].ndim))
        if pl.kind == "Z":
            if any(s.shape != subs[0].shape for s in subs):
                return Assembly(None, f"ZigzagShard on axis {a!r}, but ranks hold different shapes")
            if not -subs[0].ndim <= pl.dim < subs[0].ndim or subs[0].shape[pl.dim] % 2:
                return Assembly(None, f"ZigzagShard({pl.dim}) of local shape {list(subs[0].shape)}: no two equal chunks")
            d = pl.dim % subs[0].ndim
            halves = [np.split(s, 2, axis=d) for s in subs]
            p = len(subs)
            return Assembly(np.concatenate([halves[c][0] for c in range(p)] + [halves[p - 1 - c][1] for c in range(p)],
                                           axis=d))
        if any(s.shape != subs[0].shape for s in subs):
            return Assembly(None, f"Partial on axis {a!r}, but ranks hold different shapes")
        if pl.reduce == "max":
            return Assembly(np.asarray(np.maximum.reduce(subs), dtype=subs[0].dtype))
        tot = subs[0]
        for s in subs[1:]:
            tot = tot + s
        if pl.reduce == "avg":
            tot = tot / ctx.const(len(subs))
        return Assembly(np.asarray(tot, dtype=subs[0].dtype if subs[0].dtype == object else None))

    return rec(0, base)


# ------------------------------------------------------------------ parallel execution
@dataclass
class ParallelRun:
    values: dict[str, dict[Rank, dict[str, np.ndarray]]]  # program -> rank -> tensor -> value
    executed: list[tuple[str, int]] = field(default_factory=list)  # (program, node index) in execution order


def run_parallel(plan: Plan, local_inputs: Mapping[str, Mapping[Rank, Mapping[str, np.ndarray]]],
                 dims: Mapping[str, int], mesh: Mesh, ctx: Ctx) -> ParallelRun:
    """Execute every program on its ranks; programs interleave at recv until messages arrive."""
    progs = plan.programs
    ranks = {p: mesh.ranks(g.stage) for p, g in progs.items()}
    vals = {p: {r: dict(local_inputs[p][r]) for r in ranks[p]} for p in progs}
    envs = {p: {r: mesh.env(r, dims) for r in ranks[p]} for p in progs}
    pc = {p: 0 for p in progs}
    mailbox: dict[tuple[str, int, Rank], tuple[Rank, np.ndarray]] = {}  # (program, send node, to) -> (from, value)
    executed: list[tuple[str, int]] = []
    while True:
        progressed = False
        for p, g in progs.items():
            while pc[p] < len(g.nodes):
                n = g.nodes[pc[p]]
                if n.op in ("send", "recv"):
                    ok = _p2p(plan, p, pc[p], n, ranks[p], vals[p], envs[p], mesh, mailbox)
                else:
                    ok = _step(n, p, ranks[p], vals[p], envs[p], mesh, mailbox, ctx)
                if not ok:
                    break
                executed.append((p, pc[p]))
                pc[p] += 1
                progressed = True
        if all(pc[p] == len(g.nodes) for p, g in progs.items()):
            break
        if not progressed:
            waiting = [f"{p} at {progs[p].nodes[pc[p]].path} (recv tag {progs[p].nodes[pc[p]].attrs.get('tag')!r})"
                       for p in progs if pc[p] < len(progs[p].nodes)]
            raise RunError("deadlock: no program can proceed; waiting: " + "; ".join(waiting))
    return ParallelRun(vals, executed)


def _step(n: Node, prog: str, ranks: list[Rank], vals, envs, mesh: Mesh, mailbox, ctx: Ctx) -> bool:
    spec = REGISTRY[n.op]
    if n.op == "ring_loop":
        _run_loop(n, prog, ranks, vals, envs, mesh, mailbox, ctx)
        return True
    if spec.category == "collective":
        _check_time(f"{n.path} ({n.op})")
        ra = resolve_attrs(spec, n.attrs, envs[ranks[0]])
        axes = axes_of(ra)
        done: set[Rank] = set()
        for r in ranks:
            if r in done:
                continue
            grp = mesh.group(r, axes)
            try:
                outs = spec.simulate([vals[q][n.inputs[0]] for q in grp], ra, ctx)
            except (ValueError, IndexError) as exc:
                raise RunError(f"{n.path} ({n.op}): {exc}") from None
            except Exception as exc:
                raise InternalError(f"{n.path} ({n.op!r}, interpreter)", exc) from exc
            for q, o in zip(grp, outs):
                vals[q][n.outputs[0]] = o
                done.add(q)
            _charge(n, [vals[q][n.inputs[0]] for q in grp], outs, ctx)
        return True
    if n.op in ("send", "recv"):
        raise RunError(f"{n.path}: {n.op} runs only at the top level of a program (the loader rejects it in a loop body)")
    for r in ranks:
        for o, v in zip(n.outputs, eval_node(n, vals[r], envs[r], ctx)):
            vals[r][o] = v
    return True


def _p2p(plan: Plan, prog: str, i: int, n: Node, ranks: list[Rank], vals, envs, mesh: Mesh, mailbox) -> bool:
    """send / recv with the loader's pairing (plan.pair_messages, the one the engine and the checker use): a
    recv takes, on every rank, what its paired send sent to that rank; False while that send has not run."""
    spec = REGISTRY[n.op]
    if n.op == "send":
        for r in ranks:
            ra = resolve_attrs(spec, n.attrs, envs[r])
            mailbox[(prog, i, _peer(mesh, r, ra["axis"], ra["to"], n))] = (r, vals[r][n.inputs[0]])
        return True
    sp, si = plan.p2p[(prog, i)]
    keys = [(sp, si, r) for r in ranks]
    if any(k not in mailbox for k in keys):
        return False
    for r, k in zip(ranks, keys):
        ra = resolve_attrs(spec, n.attrs, envs[r])
        src, v = mailbox.pop(k)
        if src != _peer(mesh, r, ra["axis"], ra["src"], n):
            raise RunError(f"{n.path}: rank {list(r)} receives from rank {list(src)}, not from its declared source")
        vals[r][n.outputs[0]] = v
    return True


def _run_loop(n: Node, prog: str, ranks: list[Rank], vals, envs, mesh: Mesh, mailbox, ctx: Ctx) -> None:
    """size(axis) steps of the body on every rank in lock step; the carried values thread through."""
    body = loop_body(n)
    ra = resolve_attrs(REGISTRY[n.op], n.attrs, envs[ranks[0]])
    k = ra["carry"]
    names = body.input_names()
    state = {r: {b: vals[r][x] for b, x in zip(names, n.inputs)} for r in ranks}
    for _ in range(mesh.sizes[ra["axis"]]):
        for bn in body.nodes:
            _step(bn, prog, ranks, state, envs, mesh, mailbox, ctx)
        for r in ranks:
            new = [state[r][o] for o in body.outputs]
            state[r] = {b: state[r][b] for b in names[k:]} | dict(zip(names[:k], new))
    for r in ranks:
        for o, b in zip(n.outputs, names[:k]):
            vals[r][o] = state[r][b]


def _peer(mesh: Mesh, r: Rank, axis: str, c: int, n: Node) -> Rank:
    if not 0 <= c < mesh.sizes[axis]:
        raise RunError(f"{n.path} ({n.op}): peer coordinate {c} is outside axis {axis!r} of size {mesh.sizes[axis]}")
    return mesh.with_coord(r, axis, c)


# ------------------------------------------------------------------ the whole comparison
@dataclass
class OutputDiff:
    name: str
    equal: bool
    max_diff: float
    problem: str | None = None
    rel_diff: float = float("inf")  # max |a - b| / (1 + |a| + |b|): how far from rounding a difference is


@dataclass
class RunResult:
    dims: dict[str, int]
    mode: str
    seed: int
    outputs: list[OutputDiff]
    logical: dict[str, np.ndarray]
    parallel: ParallelRun
    inputs: dict[str, np.ndarray]
    mesh: Mesh

    @property
    def equal(self) -> bool:
        return all(o.equal for o in self.outputs)


def make_inputs(plan: Plan, dims: Mapping[str, int], seed: int, ctx: Ctx) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    types = plan.logical.infer(dims, plan.mesh(dims), key="shape@run")
    out = {}
    total = 0
    for t in plan.logical.inputs:
        shape, dtype = types[t.name]
        total += int(np.prod(shape, dtype=np.float64))
        if total > MAX_ELEMENTS:
            raise RunError(f"inputs exceed {MAX_ELEMENTS} elements at these dims; give smaller run_dims (or --dims)")
        lo, hi = int_bounds(t, dims, f"{t.name}.range") if t.range is not None else (0, 2)
        out[t.name] = random_value(shape, dtype, rng, ctx, hi, lo)
    return out


def run_plan(plan: Plan, dims: Mapping[str, int] | None = None, seed: int = 0, exact: bool = False,
             inputs: Mapping[str, np.ndarray] | None = None, no_tables: bool = False,
             decimal: bool = False) -> RunResult:
    """``no_tables`` (exact mode): raise :class:`tvcert.ops.base.TablesNeeded` at the first nonlinear
    function rather than replacing it by a table (a run whose difference could not count anyway).
    ``decimal``: run in :class:`DecimalCtx` (DIGITS significant digits, functions computed); float
    ``inputs`` (e.g. a float64 run's) are read as the decimals they print as."""
    dims = dict(plan.run_dims if dims is None else dims)
    if dims == plan.run_dims and "run_dims" not in plan.checked:
        from .plan import PlanError, check_shapes

        try:
            check_shapes(plan, dims, "run_dims")
        except PlanError as exc:
            raise RunError(f"the plan is ill-shaped at its run dims: {exc}") from None
        plan.checked.add("run_dims")
    if decimal:
        with decimal_context():
            ctx = DecimalCtx(seed=seed)
            if inputs is not None:
                inputs = {k: v if v.dtype == np.int64 else ctx.asarray(v) for k, v in inputs.items()}
            return _run(plan, dims, seed, ctx, inputs, "decimal")
    ctx = Ctx(exact=exact, seed=seed, no_tables=no_tables)
    return _run(plan, dims, seed, ctx, inputs, "exact" if exact else "float64")


def _run(plan: Plan, dims: dict[str, int], seed: int, ctx: Ctx, inputs, mode: str) -> RunResult:
    mesh = plan_mesh(plan, dims)
    check_budget(plan, dims, mode)
    if inputs is None:
        inputs = make_inputs(plan, dims, seed, ctx)
    try:
        logical = run_graph(plan.logical, inputs, dims, ctx)
    except RunError as exc:
        exc.side = "logical"
        raise
    rng = np.random.default_rng(seed + 1)
    local_inputs: dict[str, dict[Rank, dict[str, np.ndarray]]] = {p: {} for p in plan.programs}
    for p, g in plan.programs.items():
        for r in mesh.ranks(g.stage):
            local_inputs[p][r] = {}
    for name, b in plan.inputs.items():
        v = apply_layout(b, inputs[name], dims, ctx)
        for r, piece in distribute(b, v, mesh, mesh.ranks(plan.programs[b.program].stage), rng, ctx).items():
            local_inputs[b.program][r][b.local] = piece
    try:
        par = run_parallel(plan, local_inputs, dims, mesh, ctx)
    except RunError as exc:
        exc.side = "parallel"
        raise
    diffs = []
    for name in plan.logical.outputs:
        b = plan.outputs[name]
        _check_reads_all(b, logical[name].shape, dims)
        want = apply_layout(b, logical[name], dims, ctx)
        prog_ranks = mesh.ranks(plan.programs[b.program].stage)
        asm = assemble(b, {r: par.values[b.program][r][b.local] for r in prog_ranks}, mesh, prog_ranks[0], ctx)
        if asm.value is None:
            diffs.append(OutputDiff(name, False, _replica_diff(b, par, prog_ranks, mesh, ctx, want, asm), asm.problem))
        elif asm.value.shape != want.shape:
            diffs.append(OutputDiff(name, False, float("inf"), f"shape {list(asm.value.shape)} vs logical {list(want.shape)}"))
        else:
            eq = values_equal(asm.value, want, ctx.exact, mode)
            diffs.append(OutputDiff(name, eq, max_diff(asm.value, want), rel_diff=0.0 if eq else rel_diff(asm.value, want)))
    return RunResult(dims, mode, seed, diffs, logical, par, dict(inputs), mesh)


def _replica_diff(b: Binding, par, prog_ranks, mesh: Mesh, ctx: Ctx, want: np.ndarray, asm) -> float:
    """The figure shown for an output whose replicated copies disagree: the largest max |diff| of a copy from the
    logical value (inf when no copy has its shape).  Only the printed figure: the output stays unequal, its
    rel_diff infinite, as before."""
    worst = float("-inf")
    for c in range(asm.replicas):
        got = assemble(b, {r: par.values[b.program][r][b.local] for r in prog_ranks}, mesh, prog_ranks[0], ctx,
                       replica=c)
        if got.value is None or got.value.shape != want.shape:
            return float("inf")
        worst = max(worst, max_diff(got.value, want))
    return worst if asm.replicas else float("inf")


def _check_reads_all(b: Binding, shape: tuple[int, ...], dims: Mapping[str, int]) -> None:
    """The comparison is of whole logical tensors: the output layout must carry every element of the logical
    output into the compared value (the loader rejects lossy layouts; this checks it at the run dims)."""
    if not b.layout:
        return
    n = int(np.prod(shape, dtype=np.int64))
    tags = apply_layout(b, np.arange(1, n + 1, dtype=np.int64).reshape(shape), dims, Ctx())
    seen = np.unique(np.asarray(tags, dtype=np.int64))
    if np.count_nonzero((seen >= 1) & (seen <= n)) != n:
        raise RunError(f"{b.path}.layout: the output layout reads back only part of logical {b.logical!r}, "
                       f"so comparing through it would not compare the whole tensor")


# ------------------------------------------------------------------ confirming one output's cone
def output_cone(plan: Plan, names: list[str]) -> Plan | None:
    """The plan restricted to the logical outputs ``names``: the logical graph and every program keep only the ops
    those outputs read, transitively -- across stages through the loader's send / recv pairing (a kept recv keeps its
    send and what the send reads; a message is kept whole, both ends, so the programs still pair and, a subset of an
    order that ran, cannot deadlock) -- every input kept.  Each kept op computes what it computes in the whole plan
    (the IR is SSA; a ring loop reads only its inputs), so a difference of these outputs in a run of the cone is the
    whole plan's.  None for an unknown output."""
    import dataclasses

    if not names or any(n not in plan.outputs for n in names):
        return None

    def cut(g: Graph, outs: list[str]) -> Graph:
        need, kept = set(outs), []
        for n in reversed(g.nodes):
            if any(o in need for o in n.outputs):
                kept.append(n)
                need.update(n.inputs)
        return Graph(g.name, list(g.inputs), kept[::-1], list(outs), g.path, dict(g.stage))

    outs = {p: [plan.outputs[n].local for n in names if plan.outputs[n].program == p] for p in plan.programs}
    need = {p: set(o) for p, o in outs.items()}
    keep: dict[str, set[int]] = {p: set() for p in plan.programs}
    changed = True
    while changed:  # a kept recv keeps its send in another program, whose cone grows: to a fixed point
        changed = False
        for p, g in plan.programs.items():
            for i in range(len(g.nodes) - 1, -1, -1):
                n = g.nodes[i]
                if i in keep[p] or not any(o in need[p] for o in n.outputs):
                    continue
                keep[p].add(i)
                need[p].update(n.inputs)
                changed = True
                if n.op == "recv":
                    sp, si = plan.p2p[(p, i)]
                    if si not in keep[sp]:
                        keep[sp].add(si)
                        need[sp].update(plan.programs[sp].nodes[si].inputs)
    index = {p: {i: j for j, i in enumerate(sorted(keep[p]))} for p in plan.programs}
    programs = {p: Graph(g.name, list(g.inputs), [g.nodes[i] for i in sorted(keep[p])], outs[p], g.path,
                         dict(g.stage)) for p, g in plan.programs.items()}
    p2p = {(p, index[p][i]): (sp, index[sp][si]) for (p, i), (sp, si) in plan.p2p.items() if i in keep[p]}
    return dataclasses.replace(plan, logical=cut(plan.logical, list(names)), programs=programs,
                               outputs={n: plan.outputs[n] for n in names}, checked=set(plan.checked), p2p=p2p)


def cheapest_cone(plan: Plan, run: RunResult, min_rel: float) -> tuple[Plan, str] | None:
    """(the cone of the differing output of ``run`` whose run costs least, its name): the outputs that differ by
    more than ``min_rel`` relative (what a confirming run must show), each output's cone's arithmetic work at the
    run's dims (:func:`run_cost`).  None when no output qualifies."""
    best = None
    for o in run.outputs:
        if o.equal or not o.rel_diff > min_rel:
            continue
        cone = output_cone(plan, [o.name])
        if cone is None:
            return None
        work = run_cost(cone, run.dims)[1]
        if best is None or work < best[0]:
            best = (work, cone, o.name)
    return None if best is None else (best[1], best[2])
