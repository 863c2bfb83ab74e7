"""The oracle: does the parallel program compute the logical outputs?  Decided by execution.

The reference interpreter runs in exact arithmetic (Fractions; nonlinear functions replaced by
pseudo-random function tables, so distinct uninterpreted functions are discriminated) at the
plan's run dims over several seeds, and at a second instantiation of the dims when the pair
has one.  Inputs come from :func:`tvcert.interp.random_value`: distinct magnitudes, mixed
signs, no zeros, Partial inputs split unevenly across ranks.  A float64 run is a second
opinion only: the exact runs decide.

``equal`` is ``False`` when any exact run shows a difference (a *proof* of inequality),
``True`` when none does (evidence, not proof, of equality), ``None`` when the plan cannot be
executed at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from fractions import Fraction

import numpy as np

from ..interp import RunError, make_inputs, run_plan
from ..ops import Ctx
from ..plan import Plan


@dataclass
class Verdict:
    equal: Optional[bool]
    runs: int = 0
    witness: Optional[dict] = None  # dims/seed/mode of the first differing run
    float_disagrees: bool = False  # float64 differed where exact did not (or vice versa)
    notes: list = field(default_factory=list)
    crash: Optional[str] = None  # the interpreter itself raised an unexpected exception


def _exact_inputs(plan: Plan, seed: int, small: bool, from_float: Mapping[str, np.ndarray] | None = None) -> dict:
    """Exact logical inputs: small-magnitude fractions (values in (-3, 3), where x*x < x and
    shifted clamps are exercised), or an exact (binary-fraction) copy of float64 inputs."""
    if from_float is not None:
        out = {}
        for k, v in from_float.items():
            if v.dtype == np.int64:
                out[k] = v
                continue
            a = np.empty(v.shape, dtype=object)
            for idx in np.ndindex(*v.shape):
                a[idx] = Fraction(float(v[idx]))
            out[k] = a
        return out
    ctx = Ctx(exact=True, seed=seed)
    base = make_inputs(plan, plan.run_dims, seed, ctx)
    rng = np.random.default_rng(seed + 1000)
    out = {}
    for k, v in base.items():
        if v.dtype != object:
            out[k] = v
            continue
        a = np.empty(v.shape, dtype=object)
        for idx in np.ndindex(*v.shape):
            a[idx] = Fraction(int(rng.integers(-23, 24)) or 1, int(rng.choice([8, 9, 10])))
        out[k] = a
    return out


def _loads_at(plan: Plan, dims: Mapping[str, int]) -> bool:
    """Whether the plan is well-formed at ``dims`` (shapes, bindings): a run where it is not compares nothing the
    plan claims (the interpreter checks op shapes, not the bindings' declared local shapes)."""
    import copy

    from ..plan import PlanError, load_plan

    raw = copy.deepcopy(plan.raw)
    raw["dims"] = {**raw.get("dims", {}), **dict(dims)}
    raw.pop("run_dims", None)
    try:
        load_plan(raw, check_run_dims=False)
    except PlanError:
        return False
    return True


def uses_loops(plan: Plan) -> bool:
    return any(n.op == "ring_loop" for g in plan.programs.values() for n in g.nodes)


def float_oracle(plan: Plan, seeds, alt_dims: Mapping[str, int] | None = None) -> Verdict:
    """float64 over several seeds, for ring plans: their correctness rests on exp(a+b) = exp(a)exp(b),
    which exact mode's function tables do not have.  A difference beyond float64's tolerance (or a
    NaN / inf mismatch) counts as unequal; agreement on every seed as equal (evidence, not proof)."""
    return _runs(plan, alt_dims, seeds, exact=False)


def _runs(plan: Plan, alt_dims: Mapping[str, int] | None, seeds, exact: bool) -> Verdict:
    """Run at the run dims over ``seeds`` (and once at ``alt_dims``); the first difference decides."""
    v = Verdict(None)
    mode = "exact" if exact else "float64"
    attempts = [(None, s) for s in seeds]
    if alt_dims and dict(alt_dims) != dict(plan.run_dims):
        if _loads_at(plan, alt_dims):
            attempts.append((dict(alt_dims), 7))
        else:  # e.g. a literal standing for a dim (fuzz/mutate.py literal_for_dim): no such instance of the plan
            v.notes.append(f"the plan does not load at {dict(alt_dims)}: no run there")
    for dims, seed in attempts:
        try:
            r = run_plan(plan, dims=dims, seed=seed, exact=exact)
        except RunError as exc:
            v.notes.append(f"{mode} run at {dims or 'run_dims'} failed: {exc}")
            continue
        except (ValueError, ArithmeticError, IndexError) as exc:
            v.notes.append(f"{mode} run at {dims or 'run_dims'} raised {type(exc).__name__}: {exc}")
            continue
        except Exception as exc:  # an interpreter crash: recorded, reported, never hidden
            v.crash = f"{type(exc).__name__}: {exc}"
            v.notes.append(f"{mode} run at {dims or 'run_dims'} crashed: {v.crash}")
            continue
        v.runs += 1
        if not r.equal:
            v.equal = False
            v.witness = {"dims": r.dims, "seed": seed, "mode": mode,
                         "outputs": [(o.name, o.equal, o.problem) for o in r.outputs]}
            return v
    if v.runs:
        v.equal = True
    return v


def oracle(plan: Plan, alt_dims: Mapping[str, int] | None = None, seeds=(0, 1, 2), use_float: bool = True,
           thorough: int = 0) -> Verdict:
    """Ring plans (``ring_loop``) go to :func:`float_oracle` with 3 + 3*thorough seeds.

    ``thorough=k`` adds k more seeds of exact runs (default and small-magnitude inputs) and k
    float64 runs; a float64 run that differs is replayed exactly on the same inputs.  A float64
    difference that is large (relative 1e-3, or replicas disagreeing) but that no exact run
    confirms leaves the verdict ``None`` (uncertain): exact mode splits Partial inputs with its
    own large-magnitude pieces, so some float witnesses cannot be replayed exactly."""
    if uses_loops(plan):
        return float_oracle(plan, tuple(seeds) + tuple(range(10, 10 + 3 * thorough)), alt_dims)
    if thorough:
        v = oracle(plan, alt_dims, seeds, use_float=False)
        if v.equal is not True:
            return v
        for seed in range(3, 3 + thorough):
            for small in (False, True):
                try:
                    inputs = _exact_inputs(plan, seed, small) if small else None
                    r = run_plan(plan, seed=seed, exact=True, inputs=inputs)
                except Exception as exc:
                    v.notes.append(f"thorough exact run failed: {type(exc).__name__}: {exc}")
                    continue
                v.runs += 1
                if not r.equal:
                    v.equal = False
                    v.witness = {"dims": r.dims, "seed": seed, "mode": "exact-small" if small else "exact",
                                 "outputs": [(o.name, o.equal, o.problem) for o in r.outputs]}
                    return v
        strong = False
        for seed in range(thorough):
            try:
                rf = run_plan(plan, seed=seed, exact=False)
            except Exception:
                continue
            if rf.equal:
                continue
            v.float_disagrees = True
            scale = max([1.0] + [float(np.max(np.abs(np.asarray(x, dtype=np.float64)), initial=0.0))
                                 for x in rf.logical.values() if getattr(x, "dtype", None) == np.float64])
            if any(o.max_diff > 1e-3 * scale for o in rf.outputs):
                strong = True
            try:
                r = run_plan(plan, seed=seed, exact=True, inputs=_exact_inputs(plan, seed, False, rf.inputs))
            except Exception as exc:
                v.notes.append(f"exact replay of the float64 witness failed: {type(exc).__name__}: {exc}")
                continue
            v.runs += 1
            if not r.equal:
                v.equal = False
                v.witness = {"dims": r.dims, "seed": seed, "mode": "exact replay of float64 inputs",
                             "outputs": [(o.name, o.equal, o.problem) for o in r.outputs]}
                return v
        if strong:
            v.equal = None
            v.notes.append("float64 shows a large difference that no exact run confirms: uncertain")
        return v
    v = _runs(plan, alt_dims, seeds, exact=True)
    if use_float and v.equal is not None:
        try:
            rf = run_plan(plan, seed=0, exact=False)
            if rf.equal != v.equal:
                v.float_disagrees = True
        except Exception:  # float64 is only a second opinion
            pass
    return v
