"""0-d factors through homogeneous ops (kernel/scalar_factor.py, equality step ``scalar_factor_commutes``).

DDP / torchtitan divide the loss by the global count of real tokens, ``n = all_reduce(sum(labels != -100))``:
autograd carries ``1/n`` (and DDP's p) into the gradients through where, log_softmax_backward and matmul, while
the logical graph divides at another op.  Before this step the loss verified and the gradients were UNKNOWN.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from tvcert.conform.gens import Draw
from tvcert.conform.gens_scalar_factor import gen_scalar_factor
from tvcert.kernel import equality, scalar_factor
from tvcert.kernel.equality import Prover
from tvcert.kernel.expr import Exprs
from tvcert.ops import REGISTRY

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ real code: realcode/norm_padded_tokens.py
def _plan(**kw):
    pytest.importorskip("torch")
    from tvcert.frontends.trace import trace_plan
    from tvcert.plan import load_plan

    sys.path.insert(0, str(ROOT / "examples" / "torch" / "realcode"))
    try:
        spec = importlib.import_module("norm_padded_tokens").tvcert_trace(**kw)
    finally:
        sys.path.pop(0)
    return load_plan(trace_plan(**spec))


CASES = [({}, "VERIFIED"), ({"sync": "avg"}, "VERIFIED"), ({"bug": "local_count"}, "REFUTED"),
         ({"bug": "no_count_reduce"}, "REFUTED"), ({"sync": "avg", "bug": "avg_grads"}, "REFUTED")]


@pytest.mark.parametrize("kw,want", CASES, ids=[str(k) for k, _ in CASES])
def test_padded_global_token_count(kw, want):
    from tvcert.engine.verify import verify
    from tvcert.interp import run_plan

    plan = _plan(**kw)
    (labels,) = [t for t in plan.logical.inputs if t.name == "labels"]
    assert labels.range == [-100, 5]  # padded witnesses are drawn
    runs = [run_plan(plan, seed=s).equal for s in range(3)]  # torch's numbers, independent of the prover
    assert all(runs) if want == "VERIFIED" else not any(runs)
    res = verify(plan)
    assert res.verdict == want, res.reasons[:3]
    if want == "VERIFIED" and kw.get("sync") == "avg":
        assert "scalar_factor_commutes" in res.prover.used  # p / n in the seed against 1 / n in the logical graph
        import json

        from tvcert.certificate.check import check_certificate
        from tvcert.certificate.emit import build_certificate, dump_certificate
        from tvcert.certificate.format import Certificate

        cert = json.loads(dump_certificate(build_certificate(res)))  # the checker replays the step
        assert "scalar_factor_commutes" in cert["manifest"]["rules"]
        assert check_certificate(Certificate.model_validate(cert)).outputs == 2
    if want == "REFUTED":
        assert res.counterexample


# ------------------------------------------------------------------ the step on expressions
def _ddp_pair(X: Exprs, p=2, q=2, row_factor=False):
    """DDP's gradient (seed q / n in a where, all-reduce averaged by p) and the logical one (divided by n)."""
    lab = X.leaf("labels", (4,), "int")
    ne = X.mk("ne", {}, [lab, X.mk("const", {"value": -100, "shape": (), "dtype": "int"}, [])])
    keep = X.mk("reshape", {"shape": (4, 1)}, [ne])
    n = X.mk("sum", {"dims": (0,), "keepdim": False}, [ne])
    one, zero = (X.mk("const", {"value": v, "shape": (), "dtype": "float"}, []) for v in (1, 0))
    a, lsm = X.leaf("a", (4, 3), "float"), X.mk("log_softmax", {"dim": 1}, [X.leaf("z", (4, 3), "float")])
    seed = X.mk("div", {}, [X.mk("scale", {"value": q}, [one]), n])
    if row_factor:  # a value per row (a per-rank count would be one): not a factor
        seed = X.mk("div", {}, [seed, X.leaf("r", (4, 1), "float")])
    grad = lambda t: X.mk("sum", {"dims": (0,), "keepdim": False}, [X.mk("log_softmax_backward", {"dim": 1}, [t, lsm])])
    par = X.mk("div", {}, [grad(X.mk("mul", {}, [a, X.mk("where", {}, [keep, seed, zero])])),
                           X.mk("const", {"value": p, "shape": (), "dtype": "float"}, [])])
    log = grad(X.mk("div", {}, [X.mk("mul", {}, [a, X.mk("where", {}, [keep, one, zero])]), n]))
    return par, log


def test_ddp_gradient_chain():
    X = Exprs()
    par, log = _ddp_pair(X)
    pv = Prover(X)
    assert pv.equal(par, log) and "scalar_factor_commutes" in pv.used
    for kw in ({"q": 4}, {"p": 4}, {"row_factor": True}):
        X = Exprs()
        par, log = _ddp_pair(X, **kw)
        assert not Prover(X).equal(par, log), kw


def test_near_misses_are_not_proved():
    X = Exprs()
    x, s, m = X.leaf("x", (2, 3), "float"), X.leaf("s", (), "float"), X.leaf("m", (2, 3), "int")
    mul = lambda t: X.mk("mul", {}, [t, s])
    one = X.mk("const", {"value": 1, "shape": (), "dtype": "float"}, [])
    zero = X.mk("const", {"value": 0, "shape": (), "dtype": "float"}, [])
    pv = Prover(X)
    sm = lambda t: X.mk("softmax", {"dim": 1}, [t])
    assert not pv.equal(sm(mul(x)), mul(sm(x)))  # softmax is not homogeneous
    assert not pv.equal(X.mk("where", {}, [m, mul(x), one]), mul(X.mk("where", {}, [m, x, one])))  # else 1
    assert pv.equal(X.mk("where", {}, [m, mul(x), zero]), mul(X.mk("where", {}, [m, x, zero])))
    t = X.leaf("t", (), "float")
    # x / (s / t) is x t / s where s, t != 0, but the left side also needs t != 0: not proved
    assert not pv.equal(X.mk("div", {}, [x, X.mk("div", {}, [s, t])]), X.mk("mul", {}, [X.mk("div", {}, [x, s]), t]))
    # a divisor is never cancelled: (x s) / s is x only where s != 0
    assert not pv.equal(X.mk("div", {}, [mul(x), s]), x)


def _statuses(n=300):
    return [gen_scalar_factor(Draw(np.random.default_rng([i, 31])), i)[0] for i in range(n)]


def test_generator_holds_and_catches_broken_kernels(monkeypatch):
    rs = _statuses()
    assert {r.status for r in rs} <= {"ok", "refused", "skip"}, [r.detail for r in rs if r.status == "DISAGREE"][:2]
    assert sum(r.status == "ok" and "scalar_factor_commutes" in r.rules for r in rs) > 100
    assert sum(r.status == "refused" for r in rs) > 80  # near misses

    class Homogeneous:  # every op homogeneous in its first operand (pad / masked_fill with a nonzero value too)
        def __getitem__(self, op):
            return type("Spec", (), {"homogeneous_in": lambda self, attrs: (0,)})()

    with monkeypatch.context() as mp:  # and moved across any op (softmax, exp, amax, ...)
        mp.setattr(scalar_factor, "REGISTRY", Homogeneous())
        mp.setattr(equality, "LINEAR_FIRST", set(REGISTRY))
        assert sum(r.status == "DISAGREE" for r in _statuses(200)) > 5
    with monkeypatch.context() as mp:  # any constant else branch
        mp.setattr(scalar_factor, "zero_branch", lambda X, z: scalar_factor.scalar_const(X, z) is not None)
        assert sum(r.status == "DISAGREE" for r in _statuses(200)) > 1
    loose = scalar_factor.ScalarFactors._operand

    def per_row(self, j):  # a broadcast operand of mul / div (one value per row) taken for a factor
        if self.X[j].op == "input" and self.X[j].dtype == "float" and 1 in self.X[j].shape:
            return (scalar_factor.ONE, (j,), (), self.one)
        return loose(self, j)

    with monkeypatch.context() as mp:
        mp.setattr(scalar_factor.ScalarFactors, "_operand", per_row)
        assert sum(r.status == "DISAGREE" for r in _statuses(200)) > 1
