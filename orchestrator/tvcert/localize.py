"""Where do the parallel and logical programs part?  (Alive2-style localization.)

Given one concrete run, every rank-local tensor of the parallel program is explained, if it
can be, as some logical tensor under some placement (Replicate / Shard(d) / Partial(sum) per
mesh axis).  The first parallel op whose inputs are all explained but whose output is not is
where the plans diverge.  This is evidence for a person, computed from the run; it proves
nothing and is not used to decide verdicts.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from .interp import RunResult, assemble, values_equal
from .plan import Binding, Placement, Plan, fmt_placement

MAX_COMBOS = 400
# The scan's limits are CPU seconds of this process (time.process_time), not wall time: where the blame lands
# must not depend on how loaded the machine is.
SCAN_ON_SECONDS = 20.0  # how long the scan goes on past the first unexplained op
SOFT_SCAN_SECONDS = 90.0  # ... past a first one the prover proved (naming no logical tensor), until one it did not


@dataclass
class Explanation:
    logical: str
    placement: dict[str, Placement]

    def __str__(self) -> str:
        return f"{self.logical} as {fmt_placement(self.placement)}"


@dataclass
class Divergence:
    program: str
    node_path: str
    op: str
    tensor: str
    src: str | None
    inputs: dict[str, str]  # input tensor -> explanation text
    sample: dict[str, list]  # a few rank-local values
    module: str | None = None  # the user's module path (traced plans)
    note: str | None = None  # set when every op is explained and an output is read back wrongly
    factor: str | None = None  # set when the op is where the outputs' common scalar factor starts

    def describe(self) -> str:
        where = f" ({self.src})" if self.src else ""
        mod = f" in module {self.module}" if self.module else ""
        if self.factor:
            return (f"first divergence: op {self.op!r} producing {self.tensor!r} at {self.node_path}{where}{mod} in "
                    f"program {self.program!r}: {self.factor}")
        if self.note:
            return (f"first divergence: output {self.note}; it is produced by op {self.op!r} ({self.tensor!r}) at "
                    f"{self.node_path}{where}{mod}")
        ins = "; ".join(f"{k} = {v}" for k, v in self.inputs.items()) or "no tensor inputs"
        hints = [f"input {k} is still a partial result ({v.split(' as ')[1]}): is a reduction missing before this op?"
                 for k, v in self.inputs.items() if " as " in v and "Partial" in v]
        return (f"first divergence: op {self.op!r} producing {self.tensor!r} at {self.node_path}{where}{mod} "
                f"in program {self.program!r}: its inputs are explained ({ins}), but its result equals no logical "
                f"tensor under any placement" + "".join(f"\n  hint: {h}" for h in hints))


def _candidates(axes: list[str], ndim: int, uniform: set[str], zigzag: bool) -> list[dict[str, Placement]]:
    """Placements to try; on an axis where every rank holds the same value only Replicate is natural.  Zig-zag
    shards only in plans that declare one: more options per axis would push others past MAX_COMBOS."""
    opts = [Placement("R")] + [Placement("S", d) for d in range(ndim)] + [Placement("P", reduce=r) for r in ("sum", "max", "avg")]
    if zigzag:
        opts += [Placement("Z", d) for d in range(ndim)]  # tried last
    no_partial = [o for o in opts if o.kind != "P"]
    per_axis = [no_partial if a in uniform else opts for a in axes]
    combos = []
    for choice in itertools.product(*per_axis):
        combos.append(dict(zip(axes, choice)))
        if len(combos) >= MAX_COMBOS:
            break
    return combos


def explain(plan: Plan, res: RunResult, program: str, tensor: str,
            by_shape: Mapping[tuple, list[tuple[str, np.ndarray]]], zigzag: bool | None = None,
            dtype: str | None = None) -> Explanation | None:
    """``dtype``: the tensor's IR dtype where the caller knows it (an exact run holds ints and bools as Python
    objects, which the array's own dtype does not tell from reals)."""
    mesh = res.mesh
    ranks = mesh.ranks(plan.programs[program].stage)
    locals_ = {r: res.parallel.values[program][r][tensor] for r in ranks}
    first = locals_[ranks[0]]
    if dtype in ("int", "bool") or first.dtype in (np.int64, np.bool_):
        return Explanation("<index tensor>", {})
    axes = plan.program_axes(program)
    dummy = Binding(tensor, program, tensor, {}, [], "")
    from .ops import Ctx

    ctx = Ctx(exact=res.mode != "float64")
    mode = res.mode
    uniform = {a for a in axes if _uniform_along(res, ranks, locals_, a, ctx.exact, mode)}
    zigzag = uses_zigzag(plan) if zigzag is None else zigzag
    for combo in _candidates(axes, first.ndim, uniform, zigzag):
        asm = assemble(dummy, locals_, mesh, ranks[0], ctx, placement=combo)
        if asm.value is None:
            continue
        for name, v in by_shape.get(asm.value.shape, []):
            if values_equal(asm.value, v, ctx.exact, mode):
                return Explanation(name, combo)
    return None


def uses_zigzag(plan: Plan) -> bool:
    return any(p.kind == "Z" for b in (*plan.inputs.values(), *plan.outputs.values()) for p in b.placement.values())


def _uniform_along(res: RunResult, ranks, locals_, axis: str, exact: bool, mode: str | None = None) -> bool:
    mesh = res.mesh
    for r in ranks:
        other = mesh.with_coord(r, axis, 0)
        if other in locals_ and not values_equal(locals_[r], locals_[other], exact, mode):
            return False
    return True


Judge = Callable[[str, int, str], "str | bool | None"]


def first_divergence(plan: Plan, res: RunResult, judge: Judge | None = None) -> Divergence | None:
    """First op whose inputs are explained and whose output is not (or, when every differing output is one
    constant multiple of its logical value, the op where that factor starts: :func:`_factor_start`).

    ``judge(program, node index, tensor)`` may settle a tensor from the prover's side: a string
    (explained, with that text), False (not explained), None (decide numerically).
    """
    by_shape: dict[tuple, list[tuple[str, np.ndarray]]] = {}
    for name, v in res.logical.items():
        if isinstance(v, np.ndarray) and v.dtype != np.int64:
            by_shape.setdefault(v.shape, []).append((name, v))
    known: dict[str, dict[str, str]] = {
        pname: {b.local: f"{name} as {fmt_placement(b.placement)}" for name, b in plan.inputs.items() if b.program == pname}
        for pname in plan.programs}
    sent: dict[tuple[str, int], str] = {}  # (program, send node) -> explanation of the sent tensor
    zigzag = uses_zigzag(plan)
    loop_only = _loop_only_inputs(plan)
    factors = getattr(judge, "factors", {})
    scaled: dict[tuple[str, str], frozenset] = {}  # tensor -> its factors k (it is k x a logical value)
    starts: list[tuple] = []  # (factors, explanation, Divergence): ops with a factor no input carries
    # reading on past a proved first divergence serves only a factor start: when the differing outputs share one
    soft = _output_factor(plan, res) is not None  # factor (else the scan stops there, as it always did)
    div = _scan(plan, res, judge, by_shape, known, sent, zigzag, loop_only, factors, scaled, starts, soft)
    if div is None:  # a placement misread first (the double average's Partial(sum) read as Partial(avg)), then a factor
        return (_output_misread(plan, res, known, other_placement=True) or _factor_start(plan, res, starts, scaled)
                or _output_misread(plan, res, known))
    return _factor_start(plan, res, starts, scaled) or _output_misread(plan, res, known, every=True) or div


def _scan(plan, res, judge, by_shape, known, sent, zigzag, loop_only, factors, scaled, starts,
          soft: bool = False) -> Divergence | None:
    """The first op whose inputs are explained and whose output is not.  The scan goes on past it (its outputs
    unexplained, so everything computed from them too; for at most SCAN_ON_SECONDS) so that an output explained
    independently of it can still be read (see :func:`_output_misread`'s ``every``)."""
    # a value the prover proved but whose expression names no logical tensor (judge False: torchtitan's loss-parallel
    # backward spells its softmax and token weights its own way) is the first divergence when nothing better is
    # found, but the scan reads on through it: a scalar factor starting later, on exact inputs, is still a start
    # (FSDP's division left on, after the loss's backward).  A value nothing proves ends that (``hard``).
    first, deadline, hard = None, None, not soft
    for pname, i in res.parallel.executed:  # execution order: pipeline stages interleave at recv
        if deadline is not None and time.process_time() > deadline:
            break
        g = plan.programs[pname]
        n = g.nodes[i]
        kn = known[pname]
        if n.op == "send":
            if n.inputs[0] in kn:
                sent[(pname, i)] = kn[n.inputs[0]]
            continue
        if not n.outputs:
            continue
        if n.spec.category == "source":
            for o in n.outputs:
                kn[o] = "a constant"
            continue
        if any(x not in kn for x in n.inputs) or (n.op == "recv" and plan.p2p.get((pname, i)) not in sent):
            # a recv is explained only by its own send (the loader's pairing, plan.pair_messages)
            for o in n.outputs:
                kn.pop(o, None)
            continue
        dtypes = _out_dtypes(n)
        if _elementwise_index(n, dtypes, kn):
            for o in n.outputs:
                kn[o] = "an index / mask tensor computed elementwise from explained values"
            continue
        if _masked_constant(n, kn, g):
            for o in n.outputs:
                kn[o] = "a value computed elementwise from constants and index / mask tensors"
            continue
        for o in n.outputs:
            verdict = judge(pname, i, o) if judge else None
            ex = verdict if isinstance(verdict, str) else (None if verdict is False else
                                                          explain(plan, res, pname, o, by_shape, zigzag, dtypes.get(o)))
            if ex is None and (pname, o) in loop_only:
                # an auxiliary value (e.g. a row sum a ring backward needs) is judged with the loop that reads it
                kn[o] = "an input of a ring loop (judged with the loop)"
                continue
            if ex is None:
                if first is None:
                    first = Divergence(pname, n.path, n.op, o, n.src, {x: kn[x] for x in n.inputs},
                                       _sample(res, g, pname, o), _module(n))
                    deadline = time.process_time() + (SCAN_ON_SECONDS if hard else SOFT_SCAN_SECONDS)
                if verdict is False and not hard:  # proved, no logical tensor: read on (see above)
                    kn[o] = "a proved value that names no logical tensor"
                    continue
                if not hard:
                    deadline = min(deadline, time.process_time() + SCAN_ON_SECONDS)
                hard = True
                kn.pop(o, None)
                continue
            kn[o] = str(ex)
            ks = factors.get((pname, i, o))
            if ks:
                held = frozenset().union(*[scaled.get((pname, x), frozenset()) for x in n.inputs])
                # a factor starting after the first unexplained op is not its cause, unless that op was proved (no
                # logical tensor named) and this one's inputs are exact (a later rescaling of a scaled value is not)
                if ks - held and (first is None or not (hard or held)):
                    starts.append((ks - held, kn[o], Divergence(pname, n.path, n.op, o, n.src,
                                                                {x: kn[x] for x in n.inputs},
                                                                _sample(res, g, pname, o), _module(n))))
                scaled[(pname, o)] = ks
    return first


def _elementwise_index(n, dtypes: Mapping[str, str], kn: Mapping[str, str]) -> bool:
    """An int / bool result (a comparison, a mask) of an elementwise op on explained, non-partial values: on every
    rank it is that op of the rank's part of logical values, whether or not the logical program spells it
    (torchtitan's loss-parallel ignore mask ``labels != -100``, which its single-device loss never computes)."""
    if n.spec.category != "elementwise":
        return False
    if not (getattr(n.spec, "result", None) in ("int", "bool") or
            (n.outputs and all(dtypes.get(o) in ("int", "bool") for o in n.outputs))):
        return False
    return not any("Partial" in kn[x] for x in n.inputs)


def _masked_constant(n, kn: Mapping[str, str], g) -> bool:
    """An elementwise op reading only constants and index / mask tensors (torchtitan's loss-parallel per-token weight
    ``where(labels != -100, 1 / N, 0)``, which its single-device loss never spells): no value of the data enters it,
    so it is no divergence of the data's computation; a wrong constant shows where it scales a value (the factor's
    start, :func:`_factor_start`)."""
    if n.spec.category != "elementwise" or not n.inputs:
        return False
    made = g.producer_index()

    def index_typed(x: str) -> bool:  # an int / bool tensor (a mask, also as a multi-op rule's intermediate)
        return x in made and _out_dtypes(made[x][1]).get(x) in ("int", "bool")
    return all(kn[x] == "a constant" or kn[x].startswith("an index / mask tensor") or index_typed(x) or
               kn[x].startswith("a value computed elementwise from constants") for x in n.inputs)


def _sample(res: RunResult, g, pname: str, o: str) -> dict:
    return {str(list(r)): _short(res.parallel.values[pname][r][o]) for r in res.mesh.ranks(g.stage)[:4]}


def _factor_start(plan: Plan, res: RunResult, starts: list[tuple], scaled: Mapping) -> Divergence | None:
    """When every output that differs is one constant multiple k of its logical value, the op where a value first
    became k x a logical value (its inputs exact) is where the plans part: a loss divided by the wrong count is
    explained as "a scalar multiple" (correct code scales intermediates too, e.g. DDP's local mean its average
    undoes), so the first unexplained op is only a later consequence.  The factor must reach a differing output
    through values that all carry it (a row-parallel bias divided by tp, summed back whole, is no start).  Blame
    only; the verdict is the run's."""
    if not starts:
        return None
    k = _output_factor(plan, res)
    if k is None:
        return None
    for ks, ex, d in starts:
        f = next((f for f in ks if abs(float(f) - k) <= 1e-9 * abs(k)), None)
        if f is not None and _reaches_output(plan, res, d.program, d.tensor, f, scaled):
            d.factor = (f"its result is {ex}, no input carries the factor {f}, and every output that differs is "
                        f"the same {f} x its logical value: a scalar factor no later op undoes starts here")
            return d
    return None


def _reaches_output(plan: Plan, res: RunResult, program: str, tensor: str, f, scaled: Mapping) -> bool:
    """Does ``tensor`` reach a differing output through values each carrying the factor ``f`` (within its
    program, and across a send to its paired recv)?"""
    want = {(b.program, b.local) for o in res.outputs if not o.equal for b in [plan.outputs.get(o.name)] if b}
    readers: dict[tuple[str, str], list] = {}
    for pname, g in plan.programs.items():
        for i, n in enumerate(g.nodes):
            for x in n.inputs:
                readers.setdefault((pname, x), []).append((pname, i, n))
    recv_of = {snd: rcv for rcv, snd in plan.p2p.items()}
    todo, seen = [(program, tensor)], {(program, tensor)}
    while todo:
        t = todo.pop()
        if t in want:
            return True
        for pname, i, n in readers.get(t, []):
            outs = [(pname, o) for o in n.outputs]
            if n.op == "send" and (pname, i) in recv_of:
                rp, ri = recv_of[(pname, i)]
                outs = [(rp, o) for o in plan.programs[rp].nodes[ri].outputs]
            for y in outs:
                if y not in seen and f in scaled.get(y, ()):
                    seen.add(y)
                    todo.append(y)
    return False


def _output_factor(plan: Plan, res: RunResult) -> float | None:
    """The common ratio k (!= 1) of every differing output to its logical value, read back by its placement, or
    None (some output differs otherwise, or by another ratio)."""
    from .interp import apply_layout
    from .ops import Ctx

    ctx = Ctx(exact=res.mode != "float64")
    ks = []
    for o in res.outputs:
        if o.equal:
            continue
        b = plan.outputs.get(o.name)
        if b is None or o.name not in res.logical:
            return None
        ranks = res.mesh.ranks(plan.programs[b.program].stage)
        try:
            want = np.asarray(apply_layout(b, res.logical[o.name], res.dims, ctx), dtype=float)
            asm = assemble(b, {r: res.parallel.values[b.program][r][b.local] for r in ranks}, res.mesh, ranks[0], ctx)
            got = None if asm.value is None else np.asarray(asm.value, dtype=float)
        except (TypeError, ValueError, ArithmeticError):
            return None
        if got is None or got.shape != want.shape:
            return None
        nz = np.abs(want) > 1e-12 * max(1.0, float(np.max(np.abs(want))))
        if not nz.any() or not np.allclose(got[~nz], 0.0, atol=1e-9 * max(1.0, float(np.max(np.abs(got))))):
            return None
        r = got[nz] / want[nz]
        if not np.allclose(r, r.flat[0], rtol=1e-7, atol=0):
            return None
        ks.append(float(r.flat[0]))
    if not ks or any(abs(k - ks[0]) > 1e-7 * abs(ks[0]) for k in ks) or abs(ks[0] - 1) < 1e-7:
        return None
    return ks[0]


def _out_dtypes(n) -> dict[str, str]:
    """The IR dtype of each output, from shape inference (``meta['shape@...']``; dtypes are the same at every
    instantiation)."""
    meta = getattr(n, "meta", None) or {}
    types = next((v for k, v in meta.items() if k.startswith("shape") and isinstance(v, list)), ())
    return {o: t[1] for o, t in zip(n.outputs, types)}


def _module(n) -> str | None:
    return (getattr(n, "meta", None) or {}).get("module")


def _output_misread(plan: Plan, res: RunResult, known: Mapping[str, Mapping[str, str]],
                    every: bool = False, other_placement: bool = False) -> Divergence | None:
    """Every op is explained, yet an output differs: its tensor is a logical tensor under another placement
    than the plan declares (a gradient still Partial where Replicate is declared: a missing reduction).  The
    op that produced it is named.  ``every`` (some op was not explained): only when every output that differs is
    explained as a pending partial result, computed without the unexplained op (Megatron's layer-norm gradients
    left unsummed, while its flat all-gather buffer matches no logical tensor).  ``other_placement``: only an
    output whose explanation names another placement than the declared one."""
    if every and not all(o.equal or _pending(plan, known, o.name) for o in res.outputs):
        return None
    for o in res.outputs:
        b = plan.outputs.get(o.name)
        if o.equal or b is None or b.local not in known.get(b.program, {}):
            continue
        g = plan.programs[b.program]
        i = next((k for k in range(len(g.nodes) - 1, -1, -1) if b.local in g.nodes[k].outputs), None)
        if i is None:
            continue
        n = g.nodes[i]
        got = known[b.program][b.local]
        if other_placement and not _other_placement(got, b):
            continue
        hint = " (is a reduction missing before it?)" if " as " in got and "Partial" in got.split(" as ")[1] else ""
        declared = fmt_placement(b.placement) if b.placement else "Replicate on every mesh axis"
        note = f"{o.name} is {got}, but the plan declares {declared}{hint}"
        ranks = res.mesh.ranks(g.stage)
        sample = {str(list(r)): _short(res.parallel.values[b.program][r][b.local]) for r in ranks[:4]}
        return Divergence(b.program, n.path, n.op, b.local, n.src, {b.local: got}, sample, _module(n), note)
    return None


def _other_placement(got: str, b: Binding) -> bool:
    """Does the explanation ``got`` ("<expr> as {axis: placement, ...} (proved...)") name another placement than
    ``b`` declares (an axis left out of either reads Replicate)?"""
    if " as {" not in got:
        return False
    text = got.rsplit(" as {", 1)[1].split("}", 1)[0]
    held = dict(kv.split(": ", 1) for kv in text.split(", ") if ": " in kv)
    axes = set(held) | set(b.placement)
    return any(held.get(a, "Replicate") != (str(b.placement[a]) if a in b.placement else "Replicate") for a in axes)


def _pending(plan: Plan, known: Mapping[str, Mapping[str, str]], name: str) -> bool:
    b = plan.outputs.get(name)
    got = None if b is None else known.get(b.program, {}).get(b.local)
    return got is not None and " as " in got and "Partial" in got.split(" as ")[1] and not any(
        p.kind == "P" for p in b.placement.values())


def _loop_only_inputs(plan: Plan) -> set[tuple[str, str]]:
    """(program, tensor) used only to compute ring_loop inputs (not a program output, not sent)."""
    out: set[tuple[str, str]] = set()
    for pname, g in plan.programs.items():
        readers: dict[str, list] = {}
        for n in g.nodes:
            for x in n.inputs:
                readers.setdefault(x, []).append(n)
        for x in g.outputs:
            readers.setdefault(x, []).append(None)
        for n in reversed(g.nodes):  # readers come later, so they are settled first
            for o in n.outputs:
                rs = readers.get(o, [])
                if rs and all(r is not None and (r.op == "ring_loop" or
                                                 (r.outputs and all((pname, y) in out for y in r.outputs)))
                              for r in rs):
                    out.add((pname, o))
    return out


def _short(v: np.ndarray, k: int = 6) -> list:
    flat = list(v.flat)[:k]
    return [float(x) if not isinstance(x, (int, np.integer)) else int(x) for x in flat]
