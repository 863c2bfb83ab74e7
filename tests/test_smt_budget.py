"""The prover's total solver-time budget (kernel/equality.py, TVCERT_SMT_TOTAL_SECONDS): past it an elementwise
obligation is not proved -- False, "not proved", never "proved different" -- and the reason says so.  It bounds the
wrong plans whose every failing comparison is another solver call (Gemma 2 with a doubled all_reduce: 565 s of
verify before, 79 s wall with the 60 s default)."""
from __future__ import annotations

import tvcert.kernel.equality as eq
from tvcert.kernel.equality import Prover
from tvcert.kernel.expr import Exprs


def _identity(X):
    a, b = X.leaf("a", (4,), "float"), X.leaf("b", (4,), "float")
    f = X.mk("mul", {}, [X.mk("sub", {}, [a, b]), X.mk("add", {}, [a, b])])
    g = X.mk("sub", {}, [X.mk("square", {}, [a]), X.mk("square", {}, [b])])
    return f, g


def test_within_the_budget_the_identity_is_proved_and_the_time_counted():
    X = Exprs()
    f, g = _identity(X)
    pr = Prover(X)
    assert pr.equal(f, g) and "elementwise_smt" in pr.used
    assert 0 < pr.smt_seconds < pr.smt_budget


def test_past_the_budget_nothing_more_is_proved_and_the_reason_says_why():
    X = Exprs()
    f, g = _identity(X)
    pr = Prover(X, smt_budget=0.0)
    assert not pr.equal(f, g) and "elementwise_smt" not in pr.used
    assert any("SMT time budget spent" in m for m in pr.failures)


def test_the_default_comes_from_the_module_setting(monkeypatch):
    monkeypatch.setattr(eq, "SMT_TOTAL_SECONDS", 0.0)
    X = Exprs()
    f, g = _identity(X)
    assert Prover(X).smt_budget == 0.0 and not Prover(X).equal(f, g)
