"""DTensor ``loss_parallel()`` with its backward inside the context (examples/torch/realcode/loss_parallel_dtensor.py,
issue 15 §3): with a sum reduction it is VERIFIED (the vocab-parallel loss patterns read DTensor's spelling, whose
ids carry a trailing unit dim); with the default mean DTensor divides by the count of labels that are not
ignore_index (-100), which is the token count since labels lie in [0, V) (int_range_count): VERIFIED; the loss divided
by tp is REFUTED (confirmed by the interpreter)."""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tvcert.engine.verify import used_rules, verify  # noqa: E402
from tvcert.interp import run_plan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

EX = Path(__file__).resolve().parents[1] / "examples" / "torch" / "realcode" / "loss_parallel_dtensor.py"


def _spec():
    spec = importlib.util.spec_from_file_location("loss_parallel_dtensor", EX)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_loss_parallel_with_backward_inside_traces_and_is_never_refuted():
    raw = _spec().tvcert_trace()
    ops = [n["op"] for n in raw["parallel"][0]["nodes"]]
    assert ops.count("all_reduce") >= 3  # DTensor's max, sum-exp and target-pick all_reduces over tp
    assert set(raw["outputs"]) == {"loss", "grad_emb__weight", "grad_out__weight"}
    plan = load_plan(raw)
    assert run_plan(plan).equal and run_plan(plan, seed=1).equal
    res = verify(plan)  # DTensor's divisor sum(labels != -100) is the token count: labels lie in [0, V)
    assert res.verdict == "VERIFIED", res.reasons
    assert "int_range_count" in used_rules(res)


@pytest.fixture(scope="module")
def summed():
    return _spec().tvcert_trace(reduction="sum")


def test_loss_parallel_sum_reduction_verifies_through_the_dtensor_spelling(summed):
    res = verify(load_plan(copy.deepcopy(summed)))
    assert res.verdict == "VERIFIED", res.reasons
    used = {r for s in res.prop.steps for r in s.rules}
    assert {"vocab_parallel_nll_loss", "vocab_parallel_nll_backward", "vocab_parallel_log_softmax"} <= used


def test_backward_safe_target_built_from_other_ids_is_not_verified(summed):
    """The backward's where(l[:, None] != ig, l[:, None], 0) rebuilt from the token ids (same shape, int) while its
    gradient filter still tests the labels: wrong, and the matcher must see that the two labels differ."""
    d = copy.deepcopy(summed)
    nodes = d["parallel"][0]["nodes"]
    sq = next(n for n in nodes if n["op"] == "squeeze" and n["inputs"][0].startswith("where"))
    w = next(n for n in nodes if (n.get("name") or n["outputs"][0]) == sq["inputs"][0])
    ne = next(n for n in nodes if (n.get("name") or n["outputs"][0]) == w["inputs"][0])
    nodes[:0] = [{"op": "reshape", "name": "ids_flat", "inputs": ["ids"], "attrs": {"shape": [6]}},
                 {"op": "unsqueeze", "name": "ids_unit", "inputs": ["ids_flat"], "attrs": {"dim": 1}}]
    w["inputs"][1] = ne["inputs"][0] = "ids_unit"
    plan = load_plan(d)
    assert not run_plan(plan).equal
    assert verify(plan).verdict == "REFUTED"


def test_loss_parallel_loss_divided_by_tp_is_refuted():
    plan = load_plan(_spec().tvcert_trace(bug="loss_div_tp"))
    assert not run_plan(plan).equal
    res = verify(plan)
    assert res.verdict == "REFUTED"
    assert "loss" in [o["name"] for o in res.counterexample["outputs"] if not o["equal"]]
