"""A refutation whose 60-digit confirming run of the whole plan is over its work budget is confirmed on the cone of
the cheapest differing output (interp.output_cone / cheapest_cone, engine/verify._confirm): still REFUTED, never
on float64 alone; a plan with no cone (several programs) or no differing output stays UNKNOWN past the budget."""
from __future__ import annotations

import pytest

from tvcert import interp
from tvcert.engine.verify import verify
from tvcert.plan import load_plan


def _plan(bug: bool) -> dict:
    """tp 2: h = tanh(x) (Shard(0)); big = h @ w (a costly, correct output); y = 3 h, wrong (2 h) with ``bug``."""
    n, m = 8, 64
    dec = [{"name": "x", "shape": [n, m], "dtype": "float"}, {"name": "w", "shape": [m, m], "dtype": "float"}]
    return {
        "tvcert_plan": 1, "name": "cone", "dims": {}, "mesh": {"tp": 2},
        "logical": {"inputs": dec, "nodes": [
            {"name": "h", "op": "tanh", "inputs": ["x"]},
            {"name": "big", "op": "matmul", "inputs": ["h", "w"]},
            {"name": "y", "op": "scale", "inputs": ["h"], "attrs": {"value": 3}}], "outputs": ["big", "y"]},
        "parallel": [{"name": "par", "inputs": [{"name": "x", "shape": [n // 2, m], "dtype": "float"},
                                                {"name": "w", "shape": [m, m], "dtype": "float"}],
                      "nodes": [{"name": "h", "op": "tanh", "inputs": ["x"]},
                                {"name": "big", "op": "matmul", "inputs": ["h", "w"]},
                                {"name": "y", "op": "scale", "inputs": ["h"], "attrs": {"value": 2 if bug else 3}}],
                      "outputs": ["big", "y"]}],
        "inputs": {"x": {"local": "x", "placement": {"tp": "Shard(0)"}},
                   "w": {"local": "w", "placement": {"tp": "Replicate"}}},
        "outputs": {"big": {"local": "big", "placement": {"tp": "Shard(0)"}},
                    "y": {"local": "y", "placement": {"tp": "Shard(0)"}}},
    }


def test_the_cone_keeps_only_what_the_output_reads():
    plan = load_plan(_plan(True))
    cone = interp.output_cone(plan, ["y"])
    assert [n.op for n in cone.logical.nodes] == ["tanh", "scale"] and cone.logical.outputs == ["y"]
    assert [n.op for n in cone.programs["par"].nodes] == ["tanh", "scale"] and list(cone.outputs) == ["y"]
    dims = plan.run_dims
    assert interp.run_cost(cone, dims)[1] < interp.run_cost(plan, dims)[1] / 10
    run = interp.run_plan(plan, seed=0)
    got = interp.cheapest_cone(plan, run, 1e-9)
    assert got is not None and got[1] == "y"


def test_over_budget_refutation_confirmed_on_the_cone(monkeypatch):
    plan = load_plan(_plan(True))
    whole, part = interp.run_cost(plan, plan.run_dims)[1], interp.run_cost(interp.output_cone(plan, ["y"]),
                                                                            plan.run_dims)[1]
    monkeypatch.setattr(interp, "EXACT_MAX_WORK", (whole + part) // 2)  # the whole decimal run is over, the cone not
    res = verify(plan, size_check=False)
    assert res.verdict == "REFUTED", res.reasons
    assert "the ops output 'y' reads" in res.counterexample["confirmed"]
    monkeypatch.setattr(interp, "EXACT_MAX_WORK", part // 2)  # the cone is over too: no verdict from float64 alone
    res = verify(plan, size_check=False)
    assert res.verdict == "UNKNOWN" and any("budget" in r for r in res.reasons), res.reasons


@pytest.mark.parametrize("bug", [False])
def test_a_correct_plan_is_not_refuted_through_a_cone(bug, monkeypatch):
    plan = load_plan(_plan(bug))
    monkeypatch.setattr(interp, "EXACT_MAX_WORK", 1)
    assert verify(plan, size_check=False).verdict != "REFUTED"
