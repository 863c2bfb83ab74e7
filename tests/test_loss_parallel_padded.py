"""DTensor's loss_parallel() over -100-padded labels (examples/torch/realcode/loss_parallel_padded.py).

DTensor masks the ignored rows; with labels whose range admits the ignore index the vocab-parallel loss patterns
conclude the masked form the logical graph has (kernel/patterns.py), so the default mean over padded labels
verifies (was UNKNOWN: ``sum(neg(..))`` against ``sum(where(keep, ..))``), and the ignore index the parallel code
tests is the one the conclusion uses.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tvcert.engine.verify import verify  # noqa: E402
from tvcert.interp import run_plan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _plan(**kw):
    sys.path.insert(0, str(ROOT / "examples" / "torch" / "realcode"))
    try:
        return load_plan(importlib.import_module("loss_parallel_padded").tvcert_trace(**kw))
    finally:
        sys.path.pop(0)


CASES = [({}, "VERIFIED"), ({"reduction": "sum", "tp": 4}, "VERIFIED"), ({"bug": "loss_div_tp"}, "REFUTED"),
         ({"bug": "ignore_minus_one", "reduction": "sum"}, "REFUTED")]


@pytest.mark.parametrize("kw,want", CASES, ids=[str(k) for k, _ in CASES])
def test_padded_loss_parallel(kw, want):
    plan = _plan(**kw)
    assert [t.range for t in plan.logical.inputs if t.name == "labels"] == [[-100, 8]]
    runs = [run_plan(plan, seed=s).equal for s in range(3)]
    assert all(runs) if want == "VERIFIED" else not any(runs)  # torch's numbers, padded draws
    res = verify(plan)
    assert res.verdict == want, res.reasons[:3]
    if want == "VERIFIED":
        assert {"vocab_parallel_nll_loss", "vocab_parallel_nll_backward"} <= {r for s in res.prop.steps for r in s.rules}
    else:
        assert res.counterexample


def test_the_conclusion_uses_the_parallel_ignore_index(monkeypatch):
    """A matcher that wrote the logical -100 whatever index the parallel code tests would verify a program that
    ignores -1 on data padded with -100."""
    from tvcert.kernel import patterns

    orig = patterns._safe_target
    monkeypatch.setattr(patterns, "_safe_target", lambda kc, lf, ig: orig(kc, lf, -100))
    plan = _plan(bug="ignore_minus_one", reduction="sum")
    assert verify(plan, refute=False).verdict == "VERIFIED"  # the broken matcher's false proof
    assert not run_plan(plan, seed=0).equal
