"""Rank-reversed blocks (kernel/reversed_blocks.py, issue 15 §2) and the rank-dependent pad of uneven shards.

Rank r slicing block p-1-r of a replicated tensor is Shard of the block-reversed tensor (the index equation of
Rules/ReversedBlocks.v checked on every position); the slice rule's near misses are refused; the equality step
pulls the reversal through row-wise ops and a doubly reversed contraction, and refuses a flip over the wrong dim or
a contraction reversed on one side only; the generators hold; realcode/layout_reversed.py is VERIFIED and its bugs
REFUTED at the line that holds them.  realcode/uneven_pad_gather.py (uneven shards padded before a gather) has no
SPMD form yet: neither it nor its bug may be VERIFIED.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tvcert.conform.core import OpCase, R, S, TIn, run_case
from tvcert.conform.runner import run_rule
from tvcert.kernel import reversed_blocks as rb
from tvcert.kernel.equality import Prover
from tvcert.kernel.expr import Exprs
from tvcert.ops import REGISTRY, Ctx

ROOT = Path(__file__).resolve().parents[1]
REALCODE = ROOT / "examples" / "torch" / "realcode"


def _eval(X: Exprs, e: int, vals: dict) -> np.ndarray:
    x = X[e]
    if x.op == "input":
        return vals[e]
    return np.asarray(REGISTRY[x.op].eval([_eval(X, a, vals) for a in x.args], x.attr_dict(), Ctx())[0])


@pytest.mark.parametrize("p,n,rest", [(2, 3, (2,)), (3, 1, ()), (4, 2, (3, 1))])
def test_the_spelling_is_the_index_equation(p, n, rest):
    X = Exprs()
    x = X.leaf("x", (p * n, *rest), "float")
    e = rb.build(X, x, 0, p)
    assert rb.match(X, e) == (x, 0, p)
    v = np.random.default_rng(0).normal(size=(p * n, *rest))
    got = _eval(X, e, {x: v})
    for q in range(p):
        for t in range(n):
            assert np.array_equal(got[q * n + t], v[(p - 1 - q) * n + t])  # rev_blocks (q*b + t) = E ((p-1-q)*b + t)
    assert np.array_equal(_eval(X, rb.build(X, e, 0, p), {x: v}), v)  # an involution


def _slice_case(start, end, pl=(R,), axes=("tp",), sizes=None, shape=(6, 2)):
    return OpCase("slice", {"dim": 0, "start": start, "end": end}, [TIn(shape, pl)], axes, sizes or {"tp": 3})


def test_reversed_slice_rule_and_near_misses():
    got = run_case(_slice_case("(2-rank.tp)*2", "(3-rank.tp)*2"), 0)
    assert got.status == "ok" and rb.SLICE_RULE in got.rules, got
    for case in (_slice_case("(2-rank.tp)*1", "(2-rank.tp)*1+1"),  # block size off (a size-6 dim over 3 ranks is 2)
                 _slice_case("(2-rank.tp)*2", "(3-rank.tp)*2-1"),  # one row short
                 _slice_case("(1-rank.dp)*2", "(2-rank.dp)*2", (R, R), ("tp", "dp"), {"tp": 3, "dp": 2}),
                 _slice_case("(2-rank.tp)*2", "(3-rank.tp)*2", (R, S(0)), ("tp", "dp"), {"tp": 3, "dp": 2},
                             (12, 2))):  # the dim sharded again on another axis
        res = run_case(case, 0)
        assert res.status in ("refused", "skip") or rb.SLICE_RULE not in res.rules, (case.describe(), res)
        assert res.status != "DISAGREE"


def _rowwise(X, t, w):
    return X.mk("tanh", {}, [X.mk("matmul", {}, [t, w])])


def test_equality_step_and_near_misses():
    X = Exprs()
    p, n = 3, 2
    x, w, g = X.leaf("x", (p * n, 4), "float"), X.leaf("w", (4, 5), "float"), X.leaf("g", (p * n, 5), "float")
    y = _rowwise(X, rb.build(X, x, 0, p), w)
    stack = X.mk("reshape", {"shape": (p, n, 5)}, [y])
    back = X.mk("reshape", {"shape": (p * n, 5)}, [X.mk("flip", {"dims": (0,)}, [stack])])
    wrong = X.mk("reshape", {"shape": (p * n, 5)}, [X.mk("flip", {"dims": (1,)}, [stack])])
    pv = Prover(X)
    assert pv.equal(back, _rowwise(X, x, w)) and rb.EQ_RULE in pv.used
    assert not Prover(X).equal(wrong, _rowwise(X, x, w))
    assert not Prover(X).equal(X.mk("reshape", {"shape": (p * n, 5)}, [stack]), _rowwise(X, x, w))  # no flip
    xt = X.mk("permute", {"dims": (1, 0)}, [rb.build(X, x, 0, p)])
    plain = X.mk("matmul", {}, [X.mk("permute", {"dims": (1, 0)}, [x]), g])
    assert Prover(X).equal(X.mk("matmul", {}, [xt, rb.build(X, g, 0, p)]), plain)  # x^T g, both reversed
    assert not Prover(X).equal(X.mk("matmul", {}, [xt, g]), plain)  # reversed on one side only
    assert not Prover(X).equal(X.mk("matmul", {}, [xt, rb.build(X, g, 0, 2)]), plain)  # another block count


@pytest.mark.parametrize("rule", [rb.SLICE_RULE, rb.EQ_RULE])
def test_generators_hold(rule):
    st = run_rule(rule, 60, seed=3)
    assert st.counts["DISAGREE"] == 0 and st.counts["crash"] == 0, st.counts
    assert st.counts["hit"] > 10 and st.counts["refused"] > 3, st.counts


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REALCODE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def reversed_mod():
    return _load("layout_reversed")


def _verify(mod, **kw):
    from tvcert.engine.verify import verify
    from tvcert.frontends.trace import trace_plan
    from tvcert.plan import load_plan

    return verify(load_plan(trace_plan(**mod.tvcert_trace(**kw))))


@pytest.mark.parametrize("bug,line", [("", None), ("no_flip", 58), ("flip_inner", 58), ("overlap", 56)])
def test_layout_reversed(reversed_mod, bug, line):
    res = _verify(reversed_mod, bug=bug)
    if not bug:
        assert res.verdict == "VERIFIED", res.reasons[:3]
        used = {r for s in res.prop.steps for r in s.rules}
        assert rb.SLICE_RULE in used
        return
    assert res.verdict == "REFUTED", res.reasons[:3]
    div = res.counterexample["first_divergence"]
    assert f"layout_reversed.py:{line}" in str(div["src"]), div["text"]


def test_uneven_pad_is_not_verified():
    from tvcert.frontends.trace import TraceError, trace_plan

    mod = _load("uneven_pad_gather")
    for bug in ("", "keep_pad", "pad_before", "width_off"):
        with pytest.raises(TraceError, match="different programs|rank-independent shapes"):
            trace_plan(**mod.tvcert_trace(bug=bug))
