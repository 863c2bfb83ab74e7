"""REFUTED must not come from the rounding of float literals: 1/sqrt(8) once against sqrt(1/sqrt(8)) twice differ
by ~1e-17 relative in exact arithmetic, which the literals' float64 rounding explains (engine/verify.CONFIRM_RTOL)."""
import math

import pytest

from tvcert.engine import verify as V
from tvcert.plan import load_plan

A = 1 / math.sqrt(8)
R = math.sqrt(A)


def _plan(second: float) -> dict:
    return {"tvcert_plan": 1, "name": "literals", "dims": {"b": 4, "h": 8, "tp": 2}, "mesh": {"tp": "tp"},
            "logical": {"inputs": [{"name": "x", "shape": ["b", "h"], "dtype": "float"}],
                        "nodes": [{"name": "y", "op": "scale", "inputs": ["x"], "attrs": {"value": A}}],
                        "outputs": ["y"]},
            "parallel": [{"name": "tp", "inputs": [{"name": "x", "shape": ["b", "h"], "dtype": "float"}],
                          "nodes": [{"name": "y1", "op": "scale", "inputs": ["x"], "attrs": {"value": R}},
                                    {"name": "y", "op": "scale", "inputs": ["y1"], "attrs": {"value": second}}],
                          "outputs": ["y"]}],
            "inputs": {"x": {"local": "x", "placement": {"tp": "Replicate"}}},
            "outputs": {"y": {"local": "y", "placement": {"tp": "Replicate"}}}}


def _verdict(second: float):
    return V.verify(load_plan(_plan(second)))


def test_literal_rounding_is_not_a_counterexample():
    res = _verdict(R)
    assert res.verdict == "UNKNOWN", res.reasons
    assert any("rounding of the plan's float64 literals" in r for r in res.reasons), res.reasons


def test_without_the_threshold_the_same_plan_would_be_refuted(monkeypatch):
    monkeypatch.setattr(V, "CONFIRM_RTOL", 0.0)
    assert _verdict(R).verdict == "REFUTED"


@pytest.mark.parametrize("factor", [1.001, 1 + 1e-6])
def test_a_real_difference_is_still_refuted(factor):
    res = _verdict(R * factor)
    assert res.verdict == "REFUTED", res.reasons
