"""A mean loss divided by a count of labels that are not ignore_index (kernel/int_range.py, issue 15 §2):
DTensor's ``loss_parallel()`` with the default mean divides by ``sum(labels != -100)``; an int input lies in its
declared range [0, R), so that count is the token count.  Folds, their near misses (a constant inside the range,
an undeclared range), the generator and broken variants it catches.  The whole program
(examples/torch/realcode/loss_parallel_dtensor.py, the default mean: VERIFIED) is in test_realcode_loss_parallel.py.
"""
from __future__ import annotations

import zlib
from fractions import Fraction

import numpy as np
import pytest

from tvcert.conform.gens import Draw
from tvcert.conform.gens_int_range import gen_int_range
from tvcert.kernel import int_range as ir
from tvcert.kernel.expr import Exprs


def _count(op, c, flip=False, view=True):
    X = Exprs()
    x = X.leaf("labels", (2, 3), "int")
    if view:
        x = X.mk("reshape", {"shape": (6,)}, [x])
    k = X.mk("const", {"value": c, "shape": (), "dtype": "int"}, [])
    cmp = X.mk(op, {}, [k, x] if flip else [x, k])
    return X, X.mk("cast", {"dtype": "float"}, [X.mk("sum", {"dims": tuple(range(len(X[cmp].shape))),
                                                            "keepdim": False}, [cmp])])


@pytest.mark.parametrize("op,c,flip,want", [
    ("ne", -100, False, 6), ("ne", 8, False, 6), ("eq", -100, False, 0), ("lt", 8, False, 6), ("ge", 0, False, 6),
    ("gt", -1, True, 0),  # -1 > x never
    ("le", 7, False, 6), ("lt", 0, False, 0),
])
def test_decided_counts(op, c, flip, want):
    X, e = _count(op, c, flip)
    assert ir.const_value(X, e, {"labels": 8}) == Fraction(want)


@pytest.mark.parametrize("op,c,ranges", [("ne", 0, {"labels": 8}), ("ne", 7, {"labels": 8}), ("lt", 7, {"labels": 8}),
                                         ("ne", -100, {}), ("ne", -100, {"ids": 8})])
def test_undecided_counts_are_not_folded(op, c, ranges):
    X, e = _count(op, c)
    assert ir.const_value(X, e, ranges) is None


def test_generator_holds_and_catches_broken_folds(monkeypatch):
    def run(n=120):
        out = [gen_int_range(Draw(np.random.default_rng([i, zlib.crc32(ir.RULE.encode())])), i)[0].status
               for i in range(n)]
        return out
    got = run()
    assert "DISAGREE" not in got and "crash" not in got and got.count("ok") > 15 and got.count("refused") > 30
    decide = ir._decide
    monkeypatch.setitem(ir.const_value.__globals__, "_decide",
                        lambda op, lo, hi, c, fl: int(op == "ne") if op in ("eq", "ne") else decide(op, lo, hi, c, fl))
    assert "DISAGREE" in run()
    monkeypatch.setitem(ir.const_value.__globals__, "_decide", decide)
    interval = ir.interval
    monkeypatch.setitem(ir.const_value.__globals__, "interval", lambda X, i, r, depth=12: (
        lambda v: None if v is None else (v[0] + 1, v[1]))(interval(X, i, r, depth)))
    assert "DISAGREE" in run()
