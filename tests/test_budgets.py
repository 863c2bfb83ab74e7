"""Budgets that decide verdicts are work, not wall time (tvcert/budget.py, engine/verify.REFUTE_WORK, z3's rlimit):
a loaded or slow machine must not turn a REFUTED into UNKNOWN; wall clocks are only hang guards, and an UNKNOWN names
the limit that was hit.  And a confirmation's "max |diff|" is a real figure when replicated copies disagree."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tvcert import interp
from tvcert.engine import verify as V
from tvcert.plan import load_plan

EX = Path(__file__).resolve().parent.parent / "examples"
WRONG = EX / "mlp_tp2_no_allreduce.json"  # REFUTED in a fraction of a second


def test_tiny_work_budget_is_unknown_naming_it(monkeypatch):
    monkeypatch.setattr(V, "REFUTE_WORK", 100)
    res = V.verify(load_plan(WRONG))
    assert res.verdict == "UNKNOWN"
    why = [x for x in res.reasons if "past its budget" in x]
    assert why and "work budget" in why[0] and "TVCERT_REFUTE_WORK" in why[0], res.reasons


def test_wall_clock_guard_is_named(monkeypatch):
    monkeypatch.setattr(V, "REFUTE_SECONDS", 0.0)
    res = V.verify(load_plan(WRONG))
    assert res.verdict == "UNKNOWN"
    assert any("wall-clock" in x and "TVCERT_REFUTE_SECONDS" in x for x in res.reasons), res.reasons


def test_a_slow_clock_does_not_change_the_verdict(monkeypatch):
    """A machine 100x slower (each clock read 0.5 s later than the last): the old 30 s wall budget ran out after
    60 ops; the work budget does not see it, and the hang guard (REFUTE_SECONDS) is far."""
    t = [time.monotonic()]

    def slow() -> float:
        t[0] += 0.5
        return t[0]

    monkeypatch.setattr(time, "monotonic", slow)
    res = V.verify(load_plan(WRONG))
    assert res.verdict == "REFUTED", res.reasons


def test_work_spent_is_deterministic_under_a_real_slowdown(monkeypatch):
    """The same plan spends the same work units whether or not every op is slowed down (sleeps, as under load)."""
    fast = V.verify(load_plan(WRONG))
    eval_node = interp.eval_node

    def sleepy(*a, **k):
        time.sleep(0.0005)
        return eval_node(*a, **k)

    monkeypatch.setattr(interp, "eval_node", sleepy)
    slow = V.verify(load_plan(WRONG))
    assert fast.verdict == slow.verdict == "REFUTED"
    assert fast.stats["refute_work_units"] == slow.stats["refute_work_units"] > 0


def test_env_overrides():
    env = dict(os.environ, TVCERT_REFUTE_WORK="123", TVCERT_REFUTE_SECONDS="45", TVCERT_EXACT_MAX_WORK="4e7",
               TVCERT_SMT_RLIMIT="1000", TVCERT_SMT_TIMEOUT_MS="7000")
    code = ("from tvcert.engine import verify as V; from tvcert import interp as I; "
            "from tvcert.kernel import smt as S; "
            "print(V.REFUTE_WORK, V.REFUTE_SECONDS, I.EXACT_MAX_WORK, S.SMT_RLIMIT, S.SMT_TIMEOUT_MS)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["123.0", "45.0", "40000000", "1000", "7000"]


def _pigeonhole(n: int) -> str:
    """n pigeons in n - 1 holes (unsat): enough z3 work (~1e5 rlimit units at n = 9) to be cut by a small rlimit."""
    p = [[f"p{i}_{j}" for j in range(n - 1)] for i in range(n)]
    lines = ["(set-logic QF_UF)"] + [f"(declare-const {v} Bool)" for row in p for v in row]
    lines += [f"(assert (or {' '.join(row)}))" for row in p]
    lines += [f"(assert (not (and {p[i][j]} {p[k][j]})))"
              for j in range(n - 1) for i in range(n) for k in range(i + 1, n)]
    return "\n".join(lines + ["(check-sat)"])


def test_z3_resource_limit_decides_not_the_clock(monkeypatch):
    from tvcert.kernel import smt

    text = _pigeonhole(8)
    assert smt.solve_z3(text) == "unsat"
    monkeypatch.setattr(smt, "SMT_RLIMIT", 500)
    assert smt.solve_z3(text) == "unknown"  # deterministic: the same at any load
    assert smt.SMT_TIMEOUT_MS >= 60_000  # the wall clock is a hang guard only


def test_replicated_copies_that_disagree_show_a_real_figure():
    """mlp_tp2_no_allreduce's loss: the two tp ranks hold different partial losses for a Replicate output; the 60-digit
    confirmation printed "max |diff| inf" (no assembled value); now the worst copy's distance, and the copies' own."""
    res = V.verify(load_plan(WRONG))
    assert res.verdict == "REFUTED"
    loss = next(o for o in res.counterexample["outputs"] if o["name"] == "loss")
    assert not loss["equal"] and math.isfinite(loss["max_diff"]) and loss["max_diff"] > 1e-3
    assert "between them" in loss["problem"]
    assert "max |diff| inf" not in res.counterexample["confirmed"]


def test_replica_figure_is_only_a_figure():
    """The disagreeing output stays unequal with an infinite rel_diff (what decides materiality), as before."""
    p = load_plan(WRONG)
    run = interp.run_plan(p, seed=0)
    loss = next(o for o in run.outputs if o.name == "loss")
    assert not loss.equal and loss.rel_diff == float("inf") and math.isfinite(loss.max_diff)
