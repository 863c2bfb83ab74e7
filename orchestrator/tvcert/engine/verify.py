"""Verdicts: VERIFIED (with the proof), REFUTED (with a confirmed counterexample), UNKNOWN (why).

The proof attempt is relation propagation plus output matching.  When it fails, the reference
interpreter looks for a counterexample at the plan's small run dims, in float64 and in exact
arithmetic, over a few seeds; only an interpreter-confirmed difference is a refutation.
"""
from __future__ import annotations

import json
import os
import time
import resource
from dataclasses import dataclass, field
from typing import Any, Callable

from ..deep import deep
from ..budget import work_budget
from ..interp import DECIMAL_RTOL, DIGITS, BudgetExceeded, RunError, cheapest_cone, run_plan
from ..kernel.equality import Prover
from ..kernel.int_range import input_ranges
from ..ops.base import TablesNeeded
from ..kernel.expr import Exprs
from ..kernel.partial_read import RULE as PARTIAL_READ, read_as
from ..kernel.reversed_blocks import explained as reversed_explained
from ..kernel.rules import fmt_pl
from ..kernel.setup import logical_exprs, output_targets
from ..kernel.smt import is_region_op, solve_z3
from ..localize import first_divergence
from ..plan import Plan
from .propagate import Propagation, propagate
from .sizes import check_other_sizes

VERIFIED, REFUTED, UNKNOWN = "VERIFIED", "REFUTED", "UNKNOWN"


@dataclass
class OutputMatch:
    name: str
    ok: bool
    problem: str | None = None
    local: str = ""
    program: str = ""


@dataclass
class Result:
    verdict: str
    plan: Plan
    exprs: Exprs
    lexpr: dict[str, int]
    prop: Propagation
    matches: list[OutputMatch]
    prover: Prover
    reasons: list[str] = field(default_factory=list)
    counterexample: dict[str, Any] | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    used_rules_cache: set = field(default_factory=set, repr=False)
    size_results: list = field(default_factory=list, repr=False)  # the second instantiation's proof (engine/sizes.py)

    @property
    def exit_code(self) -> int:
        return {VERIFIED: 0, REFUTED: 1, UNKNOWN: 2}[self.verdict]


@deep
def verify(plan: Plan, refute: bool = True, seeds: int = 3, solve: Callable[[str], str] = solve_z3,
           progress: Callable[[str], None] | None = None, size_check: bool = True) -> Result:
    say = progress or (lambda s: None)
    t0 = time.perf_counter()
    exprs = Exprs()
    lexpr = logical_exprs(plan, exprs)
    say(f"logical graph: {len(plan.logical.nodes)} ops")
    prop = propagate(plan, exprs, lexpr)
    say(f"propagation: {len(prop.steps)} steps, {len(prop.failures)} ops without a rule")
    targets = output_targets(plan, exprs, lexpr)
    prover = Prover(exprs, solve=solve, ranges=input_ranges(plan))
    t_smt = time.perf_counter()
    matches = [_match(plan, prop, prover, exprs, name, targets[name]) for name in plan.logical.outputs]
    t_smt = time.perf_counter() - t_smt
    verdict = VERIFIED if all(m.ok for m in matches) and prop.blocked is None else UNKNOWN
    res = Result(verdict, plan, exprs, lexpr, prop, matches, prover)
    if verdict == VERIFIED:
        unproved = _unproved_rules(res)
        if unproved:
            res.verdict = UNKNOWN
            res.reasons.append(f"the proof uses rules with no proved theorem in proofs/manifest.json: {unproved}")
            return _finish(res, t0)
        res.used_rules_cache = used_rules(res)
        if size_check:  # the second verification itself is not re-checked (it would recurse until dims overflow)
            check_other_sizes(res, lambda p2: verify(p2, refute=False, seeds=seeds, solve=solve, size_check=False))
        verdict = res.verdict
    if verdict != VERIFIED:
        res.reasons = res.reasons + _reasons(res)  # (a size-check downgrade has put its reason first)
        if refute:
            say("no proof; searching for a counterexample with the reference interpreter")
            prover.explain_domain = False  # the localizer's many candidate comparisons need no diagnosis
            _refute(res, seeds)
    return _finish(res, t0, t_smt)


def used_rules(res: Result) -> set[str]:
    extra = {"stage_repeat"} if any(s.instance_of is not None for s in res.prop.steps) else set()
    return {r for s in res.prop.steps for r in s.rules} | set(res.prover.used) | extra


def _unproved_rules(res: Result) -> list[str]:
    from ..certificate.format import manifest_path

    try:
        manifest = json.loads(manifest_path().read_text())
    except (OSError, ValueError):
        return sorted(used_rules(res))
    known = set(manifest.get("rules", {})) | set(manifest.get("theorems", {}))
    return sorted(used_rules(res) - known)


def _finish(res: Result, t0: float, t_smt: float = 0.0) -> Result:
    plan, prop, exprs, prover = res.plan, res.prop, res.exprs, res.prover
    kept = {k: res.stats[k] for k in ("size_check", "refute_work_units") if k in res.stats}
    res.stats = {**kept,
        "wall_seconds": round(time.perf_counter() - t0, 4),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "programs": len(plan.programs),
        "parallel_ops": sum(len(g.nodes) for g in plan.programs.values()),
        "logical_ops": len(plan.logical.nodes),
        "programs_or_pipeline_stages": len(plan.programs),
        "stages": prop.stages,
        "distinct_stages": prop.distinct_stages,
        "rules_applied": len(prop.steps),
        "expressions": len(exprs),
        "obligations": len(prover.obligations),
        "equality_seconds": round(t_smt, 4),
    }
    return res


def _match(plan, prop: Propagation, prover: Prover, exprs: Exprs, name: str, target) -> OutputMatch:
    b = plan.outputs[name]
    axes = plan.program_axes(b.program)
    f = prop.facts[b.program].get(b.local)
    m = OutputMatch(name, False, local=b.local, program=b.program)
    if f is None:
        m.problem = f"local tensor {b.local!r} has no fact (an op before it has no applicable rule)"
        return m
    e = read_as(exprs, axes, plan.mesh(), f.expr, f.pl, target.pl)  # Partial(sum) E as Partial(avg) E/p (kernel/partial_read.py)
    if e is None:
        m.problem = (f"{b.local!r} holds {exprs.show(f.expr)} as {fmt_pl(axes, f.pl)}, but the plan reads it back as "
                     f"{fmt_pl(axes, target.pl)}")
    elif not prover.equal(e, target.expr):
        m.problem = (f"{b.local!r} holds {exprs.show(e)}{'' if e == f.expr else ' (read as ' + fmt_pl(axes, target.pl) + ')'}"
                     f", which is not proved equal to the logical {exprs.show(target.expr)}")
    else:
        if e != f.expr:
            prover.used.add(PARTIAL_READ)
        m.ok = True
    return m


def _reasons(res: Result) -> list[str]:
    out = []
    for f in res.prop.open_failures():
        mod = (res.plan.programs[f.program].nodes[f.node].meta or {}).get("module")  # the user's module path
        where = f" ({f.src}{', in module ' + mod if mod else ''})" if f.src or mod else ""
        ins = "; ".join(f.inputs) if f.inputs else "no tensor inputs with facts"
        out.append(f"no rule for {f.op!r} at {f.path}{where} in program {f.program!r}: {f.reason} [inputs: {ins}]")
    if res.prop.blocked:
        out.append(res.prop.blocked)
    for m in res.matches:
        if not m.ok:
            out.append(f"output {m.name!r}: {m.problem}")
    out += [f"solver: {x}" for x in res.prover.failures]
    return out


# The search's budget is work, not time, so that a verdict does not depend on the machine's load: REFUTE_WORK
# interpreter work units (tvcert/budget.py: deterministic per plan, about a microsecond of CPU each on an idle machine);
# REFUTE_SECONDS of wall time is only a hang guard.  TVCERT_REFUTE_WORK / TVCERT_REFUTE_SECONDS set them.
REFUTE_WORK = float(os.environ.get("TVCERT_REFUTE_WORK", 5e7))
REFUTE_SECONDS = float(os.environ.get("TVCERT_REFUTE_SECONDS", 900))


def _refute(res: Result, seeds: int) -> None:
    """The counterexample search within its budget (interp.check_budget: elements and work of each run, and
    REFUTE_WORK units for the whole search, REFUTE_SECONDS wall as a hang guard); past it the verdict stays UNKNOWN,
    with the reason naming the limit that was hit."""
    try:
        with work_budget(REFUTE_WORK, REFUTE_SECONDS) as b:
            try:
                _search(res, seeds)
            finally:
                res.stats["refute_work_units"] = b.spent
    except BudgetExceeded as exc:
        res.reasons.append(f"no counterexample search past its budget: {exc}")


def _search(res: Result, seeds: int) -> None:
    """Search for a counterexample; only a difference rounding cannot explain refutes.

    An exact run (rationals, no function tables) is decisive.  A float64 difference counts only once it is
    confirmed: by the exact run of the same seed where the ops allow it, otherwise by re-running the same
    inputs with DIGITS-digit decimal arithmetic (functions computed), which must still differ by more than
    its tolerance; a float64 difference that the confirming run does not show is rounding (UNKNOWN with the
    reason).  When float64 differs, a confirming run in which the parallel program leaves its ops' domain (a
    division by zero ...) where the logical graph does not is a counterexample as well: the plan is undefined
    where the model is not.
    """
    plan = res.plan
    for seed in range(seeds):
        try:
            run = run_plan(plan, seed=seed)
        except BudgetExceeded:
            raise
        except RunError as exc:
            res.reasons.append(f"interpreter could not run the plan (float64): {exc}")
            break
        if run.equal:
            continue
        confirmed, note = _confirm(plan, run)
        if confirmed is None:
            res.reasons.append(note)
            continue
        _refuted(res, confirmed, note)
        return
    try:
        run = run_plan(plan, seed=0, exact=True, no_tables=True)
    except TablesNeeded as exc:
        res.reasons.append(f"no exact-mode run: the plan uses {exc}, whose exact semantics would be an uninterpreted "
                           f"table, so a difference there would not be a counterexample; no float64 difference "
                           f"confirmed on {seeds} seeds")
        return
    except BudgetExceeded as exc:
        if exc.kind != "size":
            raise
        res.reasons.append(f"no exact-mode run: {exc}; no float64 difference confirmed on {seeds} seeds")
        return
    except RunError as exc:  # a division by zero where float64 saw no difference (e.g. in a masked branch) is not a
        # counterexample on its own; the prover requires every divisor nonzero anyway, so this stays UNKNOWN
        res.reasons.append(f"interpreter could not run the plan (exact): {exc}")
        return
    if not run.equal:
        small = _material(run)
        if small is None:
            _refuted(res, run, "exact rational arithmetic: no rounding")
            return
        res.reasons.append(f"exact run of seed 0: {small}; not counted as a counterexample")
        return
    res.reasons.append(f"the interpreter found no confirmed difference at run dims {plan.run_dims} over {seeds} "
                       f"float64 seeds and one exact run")


# A confirming run (exact or DIGITS-digit) counts only where its difference exceeds this, relative: the plan's float
# literals are float64 roundings of the numbers the code meant (a scale 1/sqrt(d) once vs sqrt(1/sqrt(d)) on q and
# on k differ by ~1e-16 relative), and any run reads them as written; conditioning up to 1e7 keeps such a literal's
# effect under 1e-9, while a bug changes outputs at the size of the values.
CONFIRM_RTOL = 1e-9


def _material(run) -> str | None:
    """None when some output of ``run`` differs by more than CONFIRM_RTOL relative, else why it does not count."""
    worst = max((o.rel_diff for o in run.outputs if not o.equal), default=0.0)
    if worst > CONFIRM_RTOL:
        return None
    return (f"the {run.mode} run differs by at most {worst:.3g} relative, within what the rounding of the plan's "
            f"float64 literals can explain (a difference counts above {CONFIRM_RTOL:g})")


def _confirm(plan: Plan, run):
    """(confirming run or the float64 run, note) when the float64 difference of ``run`` is real, else (None, why).

    First the exact run of the same seed (its own rational inputs) where the ops allow one: a difference there
    is decisive.  Otherwise, or when it shows none (its inputs are not the float64 run's), the float64 run's own
    inputs are re-run in DIGITS-digit decimal arithmetic: a difference there is confirmed, none is rounding."""
    diff = max(o.max_diff for o in run.outputs if not o.equal)
    what = f"float64 seed {run.seed} differs (max |diff| {diff:.3g})"
    exact_note = ""
    try:
        ex = run_plan(plan, seed=run.seed, exact=True, no_tables=True)
        small = None if ex.equal else _material(ex)
        if not ex.equal and small is None:
            return ex, f"exact rational arithmetic (seed {run.seed}): no rounding"
        exact_note = "; the exact run of that seed is equal too" if ex.equal else f"; {small}"
    except TablesNeeded:
        pass
    except BudgetExceeded as exc:
        if exc.kind != "size":
            raise
        exact_note = f"; no exact run of that seed ({exc})"
    except RunError as exc:
        if exc.domain and exc.side == "parallel":
            return run, (f"the exact run of seed {run.seed} leaves an op's domain in the parallel program where the "
                         f"logical graph is defined ({exc})")
        exact_note = f"; the exact run of that seed failed ({exc})"
    cone = ""
    try:
        try:
            dec = run_plan(plan, seed=run.seed, inputs=run.inputs, decimal=True)
        except BudgetExceeded as exc:  # the whole plan is too large: the cheapest differing output's cone (interp)
            got = cheapest_cone(plan, run, CONFIRM_RTOL) if exc.kind == "size" else None
            if got is None:
                raise
            dec = run_plan(got[0], seed=run.seed, inputs=run.inputs, decimal=True)
            cone = f" (the ops output {got[1]!r} reads: the whole plan's run is over its budget, {exc})"
    except BudgetExceeded:
        raise
    except RunError as exc:
        if exc.domain and exc.side == "parallel":
            return run, (f"on the same inputs in {DIGITS}-digit arithmetic the parallel program leaves an op's domain "
                         f"where the logical graph is defined ({exc})")
        return None, (f"{what}, but the {DIGITS}-digit run to confirm it failed: {exc}{exact_note}; not counted as a "
                      f"counterexample")
    if dec.equal:
        return None, (f"{what}, but on the same inputs {DIGITS}-digit decimal arithmetic says equal (within "
                      f"{DECIMAL_RTOL} relative){exact_note}: float64 rounding, not a counterexample")
    small = _material(dec)
    if small is not None:
        return None, f"{what}, but on the same inputs {small}{exact_note}; not counted as a counterexample"
    ddiff = max(o.max_diff for o in dec.outputs if not o.equal)
    return run, (f"confirmed on the same inputs with {DIGITS}-digit decimal arithmetic (functions computed, not "
                 f"tabled){cone}: outputs {[o.name for o in dec.outputs if not o.equal]} still differ (max |diff| "
                 f"{ddiff:.3g})")


def _refuted(res: Result, run, note: str) -> None:
    plan = res.plan
    res.verdict = REFUTED
    div = first_divergence(plan, run, _judge(res))
    res.counterexample = {
        "dims": run.dims,
        "mode": run.mode,
        "seed": run.seed,
        "confirmed": note,
        "inputs": {k: _small(v) for k, v in run.inputs.items()},
        "outputs": [{"name": o.name, "equal": o.equal, "max_diff": o.max_diff, "problem": o.problem}
                    for o in run.outputs],
        "first_divergence": None if div is None else {
            "program": div.program, "node": div.node_path, "op": div.op, "tensor": div.tensor, "src": div.src,
            "module": div.module, "inputs": div.inputs, "sample": div.sample, "text": div.describe()},
        "engine_stuck_at": _stuck(res),
    }


def _stuck(res: Result) -> list[dict]:
    return [{"program": f.program, "node": f.path, "op": f.op, "src": f.src, "reason": f.reason}
            for f in res.prop.open_failures()[:3]]


def _judge(res: Result):
    """Settle a tensor by its proved fact.

    Fine when the fact's expression is a logical tensor (up to layout ops, proved equality, a
    scalar factor, or a layout applied uniformly to a pointwise expression); not fine
    otherwise; no fact -> let the interpreter decide.  Candidates are pre-filtered by the set
    of logical inputs they read, which keeps the prover calls few.
    """
    X, prover = res.exprs, res.prover
    logical = set(res.lexpr.values())
    leaves: dict[int, frozenset] = {}

    def leafset(e: int) -> frozenset:
        got = leaves.get(e)
        if got is None:
            x = X[e]
            got = frozenset([e]) if x.op == "input" else frozenset().union(*[leafset(a) for a in x.args])
            leaves[e] = got
        return got

    approved = set()  # layout op sequences the plan itself declares (ZeRO flattening etc.), and their prefixes
    for b in list(res.plan.inputs.values()) + list(res.plan.outputs.values()):
        ops = tuple("reshape" if op in ("view", "flatten", "squeeze", "unsqueeze") else
                    "permute" if op == "transpose" else op for op, _ in b.layout)
        for k in range(1, len(ops) + 1):
            approved.add(ops[:k])

    def layout_core(e: int) -> tuple[int, tuple]:
        chain = []
        while X[e].op in ("reshape", "permute"):
            chain.append(X[e].op)
            e = X[e].args[0]
        return e, tuple(reversed(chain))

    index: dict[tuple, list[int]] = {}
    for e in logical:
        index.setdefault((X[e].shape, leafset(e)), []).append(e)
    memo: dict[int, bool] = {}
    scaled: dict[int, dict] = {}  # expr -> {factor k: logical expr l}: the expr is k x l (for each candidate l)
    lname = {e: n for n, e in res.lexpr.items()}

    def grounded(e: int) -> bool:
        if e in memo:
            return memo[e]
        memo[e] = False
        x = X[e]
        cands = index.get((x.shape, leafset(e)), [])
        ok = e in logical
        if not ok and x.op in ("reshape", "permute"):
            core, chain = layout_core(e)
            ok = chain in approved and grounded(core)
            if ok and core in scaled:
                scaled[e] = scaled[core]
        if not ok and x.op == "reshape":  # a proved reshape of an explained value (FSDP2's flat buffers)
            ok = grounded(x.args[0])
            if ok and x.args[0] in scaled:
                scaled[e] = scaled[x.args[0]]
        if not ok:
            ok = any(prover.equal(e, l) for l in cands)
        if not ok:  # a scalar multiple of a logical value (the factor kept: the localizer follows it to its start)
            c, core = prover.norm(e)
            same = [(cl, l) for l in (cands if core != e else ()) for cl, lcore in [prover.norm(l)]
                    if lcore == core or prover.equal(lcore, core)]
            ok = bool(same)
            if same and all(cl != c for cl, _ in same):  # else a candidate of factor 1 explains it
                scaled[e] = {c / cl: l for cl, l in reversed(same) if cl}
        if not ok:  # a layout applied uniformly to a pointwise expression of logical values
            pulled, sig = prover._pull(e) if is_region_op(X, e) else (e, ())
            ok = bool(sig) and pulled != e and tuple(op for op, *_ in sig) in approved and grounded(pulled)
        memo[e] = ok
        return ok

    steps = {(s.program, s.node) for s in res.prop.steps}
    concluding = {(s.program, s.node) for s in res.prop.steps if s.pattern}
    inside = res.prop.pattern_nodes()

    producers: dict[str, dict] = {}

    def judge(program: str, node: int, tensor: str):
        # an op inside a proved multi-op rule is explained by it, even when a single-op rule also gave it a fact
        # that names no logical tensor (e.g. a partial sum split into chunks before a zig-zag reduce_scatter)
        if (program, node) in inside and (program, node) not in concluding:
            return "an intermediate of a proved multi-op rule"
        f = res.prop.facts[program].get(tensor)
        if (program, node) not in steps or f is None:
            return None
        shown = fmt_pl(res.plan.program_axes(program), f.pl)
        x = X[f.expr]
        # a proved chunk of an explained partial sum (before a reduce_scatter: zig-zag's paired halves) is explained;
        # a slice of a Shard / Replicate value stays a candidate (a rank reading the wrong rows is a slice)
        if grounded(f.expr) or (x.op == "slice" and "Partial" in shown and grounded(x.args[0])):
            if f.expr in scaled:
                judge.factors[(program, node, tensor)] = frozenset(scaled[f.expr])
                return (f"{X.show(f.expr, 1)} as {shown} (proved; " + ", ".join(
                    f"{k} x logical {lname.get(l, X.show(l, 1))}" for k, l in scaled[f.expr].items()) + ")")
            return f"{X.show(f.expr, 1)} as {shown} (proved)"
        if reversed_explained(X, f.expr, f.pl, res.plan.program_axes(program), res.plan.mesh(), grounded):
            return f"{X.show(f.expr, 1)} as {shown} (proved; blocks in rank-reversed order)"
        # the caller asks only when every input is explained: an op whose proved value is an input's own expression
        # under another placement (a collective) is explained, and so is a proved permute of an explained input's
        # partial sum (sequence parallelism's relayout before its reduce_scatter)
        # (a constant is "explained" as a constant, not as a logical tensor: a slice of a wrong literal stays a candidate)
        g = res.plan.programs[program]
        made = producers.get(program) or producers.setdefault(program, g.producers())
        ins = [res.prop.facts[program].get(i) for i in g.nodes[node].inputs
               if i not in made or made[i].spec.category != "source"]
        if any(fi is not None and (fi.expr == f.expr or (x.op == "permute" and "Partial" in shown and
                                                         fi.expr == x.args[0])) for fi in ins):
            return f"{X.show(f.expr, 1)} as {shown} (proved)"
        return False

    judge.factors = {}  # (program, node, tensor) -> the scalar factors of a value explained as a multiple
    return judge


def _small(v, k: int = 16) -> dict:
    import numpy as np

    flat = list(v.flat)
    vals = [int(x) if isinstance(x, (int, np.integer)) else float(x) if isinstance(x, (float, np.floating)) else str(x)
            for x in flat[:k]]
    return {"shape": list(v.shape), "values": vals, "truncated": len(flat) > k}
