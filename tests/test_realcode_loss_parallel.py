"""DTensor ``loss_parallel()`` with its backward inside the context (examples/torch/realcode/loss_parallel_dtensor.py,
issue 15 §3): with a sum reduction it is VERIFIED (the vocab-parallel loss patterns read DTensor's spelling, whose
ids carry a trailing unit dim); with the default mean the engine does not know that no label equals
ignore_index (-100), which DTensor divides by the count of, so it is UNKNOWN -- never REFUTED; the loss divided by
tp is REFUTED (confirmed by the interpreter)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tvcert.engine.verify import verify  # noqa: E402
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
    res = verify(plan)
    assert res.verdict in ("VERIFIED", "UNKNOWN"), res.reasons
    assert res.verdict == "VERIFIED" or "output 'loss'" in res.reasons[0]


def test_loss_parallel_sum_reduction_verifies_through_the_dtensor_spelling():
    res = verify(load_plan(_spec().tvcert_trace(reduction="sum")))
    assert res.verdict == "VERIFIED", res.reasons
    used = {r for s in res.prop.steps for r in s.rules}
    assert {"vocab_parallel_nll_loss", "vocab_parallel_nll_backward", "vocab_parallel_log_softmax"} <= used


def test_loss_parallel_loss_divided_by_tp_is_refuted():
    plan = load_plan(_spec().tvcert_trace(bug="loss_div_tp"))
    assert not run_plan(plan).equal
    res = verify(plan)
    assert res.verdict == "REFUTED"
    assert "loss" in [o["name"] for o in res.counterexample["outputs"] if not o["equal"]]
