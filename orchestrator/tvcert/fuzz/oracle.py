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

from ..interp import RunError, run_plan
from ..plan import Plan


@dataclass
class Verdict:
    equal: Optional[bool]
    runs: int = 0
    witness: Optional[dict] = None  # dims/seed/mode of the first differing run
    float_disagrees: bool = False  # float64 differed where exact did not (or vice versa)
    notes: list = field(default_factory=list)
    crash: Optional[str] = None  # the interpreter itself raised an unexpected exception


def oracle(plan: Plan, alt_dims: Mapping[str, int] | None = None, seeds=(0, 1, 2), use_float: bool = True) -> Verdict:
    v = Verdict(None)
    attempts = [(None, s) for s in seeds]
    if alt_dims and dict(alt_dims) != dict(plan.run_dims):
        attempts.append((dict(alt_dims), 7))
    any_ok = False
    for dims, seed in attempts:
        try:
            r = run_plan(plan, dims=dims, seed=seed, exact=True)
        except RunError as exc:
            v.notes.append(f"exact run at {dims or 'run_dims'} failed: {exc}")
            continue
        except (ValueError, ArithmeticError, IndexError) as exc:
            v.notes.append(f"exact run at {dims or 'run_dims'} raised {type(exc).__name__}: {exc}")
            continue
        except Exception as exc:  # an interpreter crash: recorded, reported, never hidden
            v.crash = f"{type(exc).__name__}: {exc}"
            v.notes.append(f"exact run at {dims or 'run_dims'} crashed: {v.crash}")
            continue
        any_ok = True
        v.runs += 1
        if not r.equal:
            v.equal = False
            v.witness = {"dims": r.dims, "seed": seed, "mode": "exact",
                         "outputs": [(o.name, o.equal, o.problem) for o in r.outputs]}
            break
    if v.equal is None and any_ok:
        v.equal = True
    if use_float and v.equal is not None:
        try:
            rf = run_plan(plan, seed=0, exact=False)
            if rf.equal != v.equal:
                v.float_disagrees = True
        except Exception:  # float64 is only a second opinion
            pass
    return v
