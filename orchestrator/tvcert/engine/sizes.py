"""A proof that counts elements must not rest on a coincidence of sizes.

The engine proves a plan at its declared ``dims`` with concrete shapes.  Most rules are uniform in the
sizes, but a few steps turn sizes into numbers: ``reduction_normal_form`` reads a mean as ``sum / n`` with
``n`` counted at ``dims``, and ``scale_common_factor`` compares such factors.  Two counts can then agree at
``dims`` only (a mean over d0 elements vs an average over d0 ranks when each rank holds one element), and
the same plan, shape-polymorphic as the format promises, is wrong at other sizes.

So when a VERIFIED proof used one of those steps, the same plan is verified again at a second
instantiation: its own ``run_dims`` when they differ from ``dims``, otherwise every non-mesh dim doubled
(then tripled).  If it does not verify there, the verdict is UNKNOWN with that reason.  When no second
instantiation loads (dims tied by relations the scaling breaks, or literal shapes with no dims at all), the
claim stays what the certificate states: correct at the declared dims; ``stats["size_check"]`` says which.
"""
from __future__ import annotations

import copy
import re
from typing import Callable

SIZE_COUNTING = ("reduction_normal_form", "scale_common_factor")


def _mesh_dim_names(raw: dict) -> set[str]:
    mesh = raw.get("mesh") or []
    items = mesh.items() if isinstance(mesh, dict) else [tuple(m) for m in mesh if isinstance(m, (list, tuple))]
    names: set[str] = set()
    for entry in items:
        for part in entry:
            names |= set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", str(part)))
    return names


def second_instantiations(raw: dict) -> list[dict]:
    """Candidate dims for the second verification, in order of preference."""
    dims = raw.get("dims") or {}
    if not isinstance(dims, dict) or not dims:
        return []
    out = []
    run = raw.get("run_dims")
    if isinstance(run, dict) and run and run != dims:
        out.append(dict(run))
    fixed = _mesh_dim_names(raw)
    for k in (2, 3):
        alt = {d: (v * k if d not in fixed and isinstance(v, int) else v) for d, v in dims.items()}
        if alt != dims:
            out.append(alt)
    return out


def check_other_sizes(res, verify_again: Callable) -> None:
    """Downgrade ``res`` (VERIFIED) to UNKNOWN when its size-counting proof fails at a second instantiation."""
    from ..plan import PlanError, load_plan

    used = sorted(set(SIZE_COUNTING) & res.used_rules_cache)
    if not used:
        return
    raw = res.plan.raw
    for alt in second_instantiations(raw):
        other = copy.deepcopy(raw)
        other["dims"] = alt
        other.pop("run_dims", None)
        try:
            plan2 = load_plan(other, check_run_dims=False)
        except PlanError:
            continue
        res2 = verify_again(plan2)
        res.stats["size_check"] = {"rules": used, "dims": alt, "verdict": res2.verdict}
        if res2.verdict != "VERIFIED":
            why = res2.reasons[0] if res2.reasons else "no proof"
            res.verdict = "UNKNOWN"
            res.reasons.append(f"the proof holds at the declared dims but counts elements ({', '.join(used)}); at dims "
                               f"{alt} the same plan does not verify ({why}), so it rests on a coincidence of sizes")
        return
    res.stats["size_check"] = {"rules": used, "dims": None,
                               "note": "no second instantiation of the dims loads: proved at the declared dims only"}
