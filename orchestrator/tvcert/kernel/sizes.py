"""Which second instantiation of a plan's dims a size-counting proof is re-checked at (engine and checker).

``reduction_normal_form`` and ``scale_common_factor`` turn sizes into numbers counted at the declared ``dims``,
so two counts can agree there only (a mean over d0 elements vs an average over d0 ranks).  A proof that used
one is therefore redone at a second instantiation, chosen here from the plan alone so that the engine
(``engine/sizes.py``) and the certificate checker pick the same one, and so that the plan's author does not
choose it (``run_dims`` could keep the coincidence: d0 = 8 on 4 x 2 ranks is the same accident as 4 on 2 x 2):

1. every non-mesh dim multiplied by its own prime (2, 3, 5, ... in name order): no linear or multiplicative
   relation between dims survives that the loader does not enforce;
2. else every non-mesh dim doubled, then tripled (dims tied by a reshape keep their ratios);
3. else the plan's ``run_dims`` when they differ from ``dims`` (the author's choice: weakest, last).

Mesh sizes stay: the plan is a plan for its mesh.  The first candidate that loads decides.
"""
from __future__ import annotations

import copy
import re

SIZE_COUNTING = ("reduction_normal_form", "scale_common_factor")
PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97)


def mesh_dim_names(raw: dict) -> set[str]:
    mesh = raw.get("mesh") or []
    items = mesh.items() if isinstance(mesh, dict) else [tuple(m) for m in mesh if isinstance(m, (list, tuple))]
    names: set[str] = set()
    for entry in items:
        for part in entry:
            names |= set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", str(part)))
    return names


def candidates(raw: dict) -> list[dict]:
    """Candidate dims for the second verification, in order of preference (see the module docstring)."""
    dims = raw.get("dims") or {}
    if not isinstance(dims, dict) or not dims:
        return []
    fixed = mesh_dim_names(raw)
    free = sorted(d for d, v in dims.items() if d not in fixed and isinstance(v, int))
    out = []
    if len(free) <= len(PRIMES):
        out.append({d: (v * PRIMES[free.index(d)] if d in free else v) for d, v in dims.items()})
    for k in (2, 3):
        out.append({d: (v * k if d in free else v) for d, v in dims.items()})
    run = raw.get("run_dims")
    if isinstance(run, dict) and run:
        out.append({**dims, **run})
    seen, uniq = [], []
    for alt in out:
        if alt != dims and alt not in seen:
            seen.append(alt)
            uniq.append(alt)
    return uniq


def second_instantiation(raw: dict):
    """``(dims, raw, plan)`` of the first candidate that loads, or None (the claim is then at ``dims`` only)."""
    from ..plan import PlanError, load_plan

    for alt in candidates(raw):
        other = copy.deepcopy(raw)
        other["dims"] = alt
        other.pop("run_dims", None)
        try:
            return alt, other, load_plan(copy.deepcopy(other), check_run_dims=False)
        except PlanError:
            continue
    return None
