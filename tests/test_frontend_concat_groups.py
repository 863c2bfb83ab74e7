"""The ``concat_groups`` layout (kernel/concat_groups.py, issue 15 §3): a fused GQA ``w_qkv`` whose Q, K, V row
counts differ, rank r holding its heads of each part.

The macro's value is the index equation on every position (against :func:`source_index`, and the interleave when
the parts are equal); bad attributes are a plan error; whole programs (examples/torch/realcode/fused_qkv_gqa.py):
the correct one is never REFUTED and torch agrees with it, wrong splits and wrong layouts are REFUTED and torch
confirms each difference on real tensors.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tvcert.kernel import concat_groups as cg
from tvcert.kernel import interleave as il
from tvcert.kernel.expr import Exprs
from tvcert.ops import Ctx
from tvcert.ops.base import ShapeError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("sizes,groups", [([8, 4, 4], 2), ([6, 3, 3], 3), ([4, 4, 4], 2), ([2, 6], 2), ([5], 1)])
def test_the_macro_is_the_index_equation(sizes, groups):
    n = sum(sizes)
    x = np.arange(n * 3, dtype=np.float64).reshape(n, 3)
    got = cg.SPEC.eval([x], {"dim": 0, "sizes": sizes, "groups": groups}, Ctx())[0]
    want = x[[cg.source_index(sizes, groups, j) for j in range(n)]]
    assert np.array_equal(got, want)
    per = [s // groups for s in sizes]  # rank g's block holds block g of each part, in part order
    for g in range(groups):
        block = got[g * sum(per):(g + 1) * sum(per)]
        off = 0
        for i, s in enumerate(sizes):
            start = sum(sizes[:i]) + g * per[i]
            assert np.array_equal(block[off:off + per[i]], x[start:start + per[i]])
            off += per[i]
    on_dim1 = cg.SPEC.eval([x.T.copy()], {"dim": -1, "sizes": sizes, "groups": groups}, Ctx())[0]
    assert np.array_equal(on_dim1, got.T)


def test_equal_parts_are_the_interleave_and_the_kernel_spelling_agrees():
    X = Exprs()
    w = X.leaf("w", (12, 2), "float")
    e = cg.build_expr(X, w, {"dim": 0, "sizes": [4, 4, 4], "groups": 2})
    assert X[e].shape == (12, 2) and X[e].op == "reshape"
    x = np.arange(24, dtype=np.float64).reshape(12, 2)
    laid = x.reshape(3, 2, 2, 2).transpose(1, 0, 2, 3).reshape(12, 2)  # interleave(E, 0, k=3, p=2)
    assert np.array_equal(cg.SPEC.eval([x], {"dim": 0, "sizes": [4, 4, 4], "groups": 2}, Ctx())[0], laid)
    assert il.match(X, e) is None  # not the interleave's spelling: no interleave rule reads it


@pytest.mark.parametrize("attrs,why", [
    ({"dim": 0, "sizes": [8, 4, 3], "groups": 2}, "multiples"),
    ({"dim": 0, "sizes": [8, 4, 2], "groups": 2}, "sum to"),
    ({"dim": 2, "sizes": [8, 4, 4], "groups": 2}, "out of range"),
    ({"dim": 0, "sizes": [8, 4, 4], "groups": 0}, "multiples"),
])
def test_bad_attributes_are_refused(attrs, why):
    with pytest.raises(ShapeError, match=why):
        cg.SPEC.infer([(16, 8)], attrs)


def _example():
    path = ROOT / "examples" / "torch" / "realcode" / "fused_qkv_gqa.py"
    spec = importlib.util.spec_from_file_location("fused_qkv_gqa", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gqa():
    pytest.importorskip("torch")
    return _example()


def _torch_differs(mod, bug, tp=2):
    """The logical block against the ranks' blocks summed (the all_reduce), on real float64 tensors, each rank's
    fused rows cut from the weight as the plan's layout says."""
    import torch

    g = torch.Generator().manual_seed(0)
    q, c = mod.NH * mod.HD, mod.NKV * mod.HD
    x = torch.randn(mod.B, mod.S, mod.H, generator=g, dtype=torch.float64)
    w = torch.randn(q + 2 * c, mod.H, generator=g, dtype=torch.float64)
    wo = torch.randn(mod.H, q, generator=g, dtype=torch.float64)
    sizes = [(mod.NH + 1) * mod.HD, (mod.NKV - 1) * mod.HD, c] if bug == "plan_boundary" else [q, c, c]
    laid = w if bug == "plain_shard" else w[[cg.source_index(sizes, tp, j) for j in range(w.shape[0])]]
    code_bug = bug if bug in ("qk_boundary", "kv_swap") else ""
    y = sum(mod.attention(x, laid.chunk(tp)[r], wo.chunk(tp, dim=1)[r], mod.NH // tp, mod.NKV // tp, code_bug)
            for r in range(tp))
    return float((y - mod.attention(x, w, wo, mod.NH, mod.NKV)).abs().max())


@pytest.mark.parametrize("bug", ["", "qk_boundary", "kv_swap", "plain_shard", "plan_boundary"])
def test_gqa_programs(gqa, bug):
    from tvcert.engine.verify import verify
    from tvcert.frontends.trace import trace_plan
    from tvcert.plan import load_plan

    res = verify(load_plan(trace_plan(**gqa.tvcert_trace(bug=bug))))
    diff = _torch_differs(gqa, bug)
    if bug:
        assert res.verdict == "REFUTED" and diff > 1e-3, (res.verdict, diff, res.reasons[:2])
    else:  # no rule reads the grouped layout yet: sound UNKNOWN at the split, never REFUTED
        assert res.verdict != "REFUTED" and diff < 1e-9, (res.verdict, diff, res.reasons[:2])
        assert res.verdict == "VERIFIED" or any("split" in r for r in res.reasons), res.reasons[:2]
