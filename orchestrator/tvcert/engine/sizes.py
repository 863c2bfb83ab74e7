"""A proof that counts elements must not rest on a coincidence of sizes.

The engine proves a plan at its declared ``dims`` with concrete shapes.  Most rules are uniform in the
sizes, but a few steps turn sizes into numbers: ``reduction_normal_form`` reads a mean as ``sum / n`` with
``n`` counted at ``dims``, and ``scale_common_factor`` compares such factors.  Two counts can then agree at
``dims`` only (a mean over d0 elements vs an average over d0 ranks when each rank holds one element), and
the same plan, shape-polymorphic as the format promises, is wrong at other sizes.

So when a VERIFIED proof used one of those steps, or attributes resolved at ``dims`` coincide there
(``kernel/sizes.py:coincidences``: ``scale(x, "n")`` against ``scale(x, 4)``), the same plan is verified again (once: that second
verification does not recurse) at the second instantiation ``kernel/sizes.py`` picks from the plan; the
checker picks the same one and replays the certificate of that verification, which the first certificate
carries.  If the plan does not verify there, the verdict is UNKNOWN with that reason.  When no second
instantiation loads (dims tied by relations the scaling breaks, or literal shapes with no dims at all), the
claim stays what the certificate states: correct at the declared dims; ``stats["size_check"]`` says which.
"""
from __future__ import annotations

from typing import Callable

from ..kernel.sizes import second_instantiation, size_reasons


def check_other_sizes(res, verify_again: Callable) -> None:
    """Downgrade ``res`` (VERIFIED) to UNKNOWN when its size-counting proof fails at the second instantiation;
    keep the second result (``res.size_results``) so that its certificate travels with the first."""
    used = size_reasons(res.plan.raw, res.used_rules_cache)
    if not used:
        return
    second = second_instantiation(res.plan.raw, probe=res.plan)
    if second is None:
        res.stats["size_check"] = {"rules": used, "dims": None,
                                   "note": "no second instantiation of the dims loads: proved at the declared dims only"}
        return
    alt, _, plan2 = second
    res2 = verify_again(plan2)
    res.stats["size_check"] = {"rules": used, "dims": alt, "verdict": res2.verdict}
    if res2.verdict != "VERIFIED":
        why = res2.reasons[0] if res2.reasons else "no proof"
        res.verdict = "UNKNOWN"
        res.reasons.append(f"the proof holds at the declared dims but rests on sizes ({'; '.join(used)}); at dims "
                           f"{alt} the same plan does not verify ({why}), so it rests on a coincidence of sizes")
        return
    res.size_results = [res2]
