"""Shared check of the random-edit soundness tests: an edited plan may be rejected, UNKNOWN or REFUTED, but if
it is VERIFIED it must compute the same thing as its logical graph on every run."""
from __future__ import annotations

from tvcert.engine.verify import verify
from tvcert.interp import run_plan
from tvcert.plan import PlanError, load_plan


def assert_not_wrongly_verified(bad: dict, what: list[str], seeds: int = 3) -> None:
    try:
        plan = load_plan(bad)
    except PlanError:
        return
    if verify(plan, refute=False).verdict != "VERIFIED":
        return
    for s in range(seeds):
        try:
            r = run_plan(plan, seed=s)
        except Exception as exc:  # noqa: BLE001  (a VERIFIED plan the interpreter cannot run is a finding too)
            raise AssertionError(f"VERIFIED but not runnable after {what}: {exc}") from None
        assert r.equal, f"VERIFIED but different after {what}"
