"""Reference interpreter: runs the logical graph and the parallel program on every rank.

This is the oracle for counterexamples and soundness testing, not a proof.  Logical inputs
are distributed to ranks by their placements, every rank runs its program with collectives
and send/recv simulated, and outputs are reassembled by their placements and compared with
the logical outputs.  Two number modes: float64, and exact (Fractions, with nonlinear
functions replaced by a fixed pseudo-random table so equality is decidable).
"""
from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable, Mapping

import numpy as np

from .graph import Graph, Node, loop_body
from .ops import REGISTRY, Ctx, resolve_attrs
from .ops.collectives import axes_of
from .plan import Binding, Placement, Plan
from .shapes import dim_value

Rank = tuple[int, ...]  # coordinates on every mesh axis, in mesh order
MAX_ELEMENTS = 5_000_000


class RunError(RuntimeError):
    """The plan cannot be executed (deadlock, too large, out-of-range index ...)."""


# ------------------------------------------------------------------ numbers
def random_value(shape: tuple[int, ...], dtype: str, rng: np.random.Generator, ctx: Ctx, hi: int | None = None) -> np.ndarray:
    """Inputs chosen to defeat coincidences: distinct magnitudes and mixed signs."""
    if dtype == "int":
        return rng.integers(0, max(hi or 1, 1), size=shape, dtype=np.int64)
    if ctx.exact:
        num = rng.integers(-40, 41, size=shape)
        den = rng.choice([1, 2, 3, 5, 7, 11], size=shape)
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(*shape):
            n = int(num[idx]) or 1
            out[idx] = Fraction(n, int(den[idx]))
        return out
    return rng.standard_normal(shape) * rng.choice([0.5, 1.0, 2.0], size=shape)


def values_equal(a: np.ndarray, b: np.ndarray, exact: bool) -> bool:
    if a.shape != b.shape:
        return False
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
    spec = REGISTRY[n.op]
    ra = resolve_attrs(spec, n.attrs, env_dims)
    try:
        outs = spec.eval([env_values[x] for x in n.inputs], ra, ctx)
        return [v if isinstance(v, np.ndarray) else np.array(v, dtype=object if ctx.exact else np.float64)
                for v in outs]
    except (ValueError, IndexError, ZeroDivisionError, ArithmeticError) as exc:
        raise RunError(f"{n.path} ({n.op} -> {n.name}): {exc}") from None


def run_graph(g: Graph, inputs: Mapping[str, np.ndarray], dims: Mapping[str, int], ctx: Ctx) -> dict[str, np.ndarray]:
    vals = dict(inputs)
    for n in g.nodes:
        for o, v in zip(n.outputs, eval_node(n, vals, dims, ctx)):
            vals[o] = v
    return vals


def apply_layout(b: Binding, v: np.ndarray, dims: Mapping[str, int], ctx: Ctx) -> np.ndarray:
    for op, attrs in b.layout:
        spec = REGISTRY[op]
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
    # Partial inputs: split deterministically per (tensor, axis) so all ranks agree
    seed = zlib.crc32(f"{b.logical}|{axis}".encode())
    srng = np.random.default_rng(seed)
    parts = [random_value(v.shape, "float", srng, ctx) for _ in range(p)]
    if pl.reduce == "max":
        # every rank holds at most v, rank (element-dependent) 0 holds v exactly
        return v if c == 0 else np.asarray(v - abs(parts[c]) - ctx.const(1), dtype=v.dtype)
    if pl.reduce == "avg":
        v = v * ctx.const(p)
    rest = parts[0] * ctx.const(0)
    for i in range(1, p):
        rest = rest + parts[i]
    return np.asarray(v - rest if c == 0 else parts[c], dtype=object if ctx.exact else np.float64)


@dataclass
class Assembly:
    value: np.ndarray | None
    problem: str | None = None  # e.g. replicas disagree


def assemble(b: Binding, locals_: Mapping[Rank, np.ndarray], mesh: Mesh, base: Rank, ctx: Ctx,
             placement: Mapping[str, Placement] | None = None) -> Assembly:
    """Rebuild the logical (laid-out) value from rank-local tensors by the placement."""
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
            for c, s in enumerate(subs[1:], 1):
                if not values_equal(subs[0], s, ctx.exact):
                    return Assembly(None, f"Replicate on axis {a!r}, but coordinates 0 and {c} hold different values")
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
    mailbox: dict[tuple[str, Rank, Rank], np.ndarray] = {}
    executed: list[tuple[str, int]] = []
    while True:
        progressed = False
        for p, g in progs.items():
            while pc[p] < len(g.nodes):
                n = g.nodes[pc[p]]
                if not _step(n, p, ranks[p], vals[p], envs[p], mesh, mailbox, ctx):
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
            for q, o in zip(grp, outs):
                vals[q][n.outputs[0]] = o
                done.add(q)
        return True
    if n.op == "send":
        for r in ranks:
            ra = resolve_attrs(spec, n.attrs, envs[r])
            dst = _peer(mesh, r, ra["axis"], ra["to"], n)
            mailbox[(ra["tag"], r, dst)] = vals[r][n.inputs[0]]
        return True
    if n.op == "recv":
        got = {}
        for r in ranks:
            ra = resolve_attrs(spec, n.attrs, envs[r])
            src = _peer(mesh, r, ra["axis"], ra["src"], n)
            key = (ra["tag"], src, r)
            if key not in mailbox:
                return False
            got[r] = key
        for r, key in got.items():
            vals[r][n.outputs[0]] = mailbox.pop(key)
        return True
    for r in ranks:
        for o, v in zip(n.outputs, eval_node(n, vals[r], envs[r], ctx)):
            vals[r][o] = v
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
        hi = dim_value(t.range, dims) if t.range is not None else 2
        out[t.name] = random_value(shape, dtype, rng, ctx, hi)
    return out


def run_plan(plan: Plan, dims: Mapping[str, int] | None = None, seed: int = 0, exact: bool = False,
             inputs: Mapping[str, np.ndarray] | None = None, no_tables: bool = False) -> RunResult:
    """``no_tables`` (exact mode): raise :class:`tvcert.ops.base.TablesNeeded` at the first nonlinear
    function rather than replacing it by a table (a run whose difference could not count anyway)."""
    dims = dict(plan.run_dims if dims is None else dims)
    if dims == plan.run_dims and "run_dims" not in plan.checked:
        from .plan import PlanError, check_shapes

        try:
            check_shapes(plan, dims, "run_dims")
        except PlanError as exc:
            raise RunError(f"the plan is ill-shaped at its run dims: {exc}") from None
        plan.checked.add("run_dims")
    ctx = Ctx(exact=exact, seed=seed, no_tables=no_tables)
    mesh = plan_mesh(plan, dims)
    if inputs is None:
        inputs = make_inputs(plan, dims, seed, ctx)
    logical = run_graph(plan.logical, inputs, dims, ctx)
    rng = np.random.default_rng(seed + 1)
    local_inputs: dict[str, dict[Rank, dict[str, np.ndarray]]] = {p: {} for p in plan.programs}
    for p, g in plan.programs.items():
        for r in mesh.ranks(g.stage):
            local_inputs[p][r] = {}
    for name, b in plan.inputs.items():
        v = apply_layout(b, inputs[name], dims, ctx)
        for r, piece in distribute(b, v, mesh, mesh.ranks(plan.programs[b.program].stage), rng, ctx).items():
            local_inputs[b.program][r][b.local] = piece
    par = run_parallel(plan, local_inputs, dims, mesh, ctx)
    diffs = []
    for name in plan.logical.outputs:
        b = plan.outputs[name]
        want = apply_layout(b, logical[name], dims, ctx)
        prog_ranks = mesh.ranks(plan.programs[b.program].stage)
        asm = assemble(b, {r: par.values[b.program][r][b.local] for r in prog_ranks}, mesh, prog_ranks[0], ctx)
        if asm.value is None:
            diffs.append(OutputDiff(name, False, float("inf"), asm.problem))
        elif asm.value.shape != want.shape:
            diffs.append(OutputDiff(name, False, float("inf"), f"shape {list(asm.value.shape)} vs logical {list(want.shape)}"))
        else:
            diffs.append(OutputDiff(name, values_equal(asm.value, want, exact), max_diff(asm.value, want)))
    return RunResult(dims, "exact" if exact else "float64", seed, diffs, logical, par, dict(inputs), mesh)
