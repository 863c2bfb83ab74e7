"""Fused tensors sharded per part (issue 15 §3, kernel/interleave.py): a fused ``w_qkv`` / gate-up weight whose
rank holds its block of each part, declared as the interleave layout on the trace input.

Kernel: the split of such a shard into its parts is Shard of the logical parts, the parts' concat is Shard of the
interleave of their concat, and ``interleave_commutes`` reads a weight gradient through the matmuls; near misses
(no interleave, another axis size, a Partial or the dim sharded again elsewhere, unequal chunks) are refused.  The
generators hold on every rank and catch broken variants.  Whole programs (examples/torch/realcode/fused_qkv.py):
correct ones VERIFIED, bugs REFUTED by the interpreter and confirmed by torch on real tensors, and a wrong plan
(the fused weight declared plain Shard(0), or its interleave over (tp, 3) instead of (3, tp)) never VERIFIED.
"""
from __future__ import annotations

import importlib.util
import zlib
from pathlib import Path

import numpy as np
import pytest

from tvcert.conform.core import OpCase, P, R, S, TIn, conclude, run_case
from tvcert.conform.gens import Draw
from tvcert.conform.gens_interleave import INTERLEAVE_EQ_GENERATORS, INTERLEAVE_GENERATORS
from tvcert.kernel import interleave as il
from tvcert.kernel.equality import Prover
from tvcert.kernel.expr import Exprs
from tvcert.kernel.rules import RuleFailure

ROOT = Path(__file__).resolve().parents[1]


def _split(k, p, n, pl, sizes, parts=None, layout_kp=None, chunks=None):
    kk, pp = (k, p) if layout_kp in (None, "plain") else layout_kp
    lay = (lambda X, e: il.build(X, e, 0, kk, pp)) if layout_kp != "plain" else None
    c = chunks or k
    local = k * n
    return OpCase("split", {"dim": 0, "sizes": parts or [local // c] * c},
                  [TIn((k * p * n, 3), tuple(pl), layout=lay)], tuple(sizes), dict(sizes))


def test_split_of_an_interleaved_shard_is_the_parts():
    case = _split(3, 2, 2, [S(0)], {"tp": 2})
    X, _, _, _, d = conclude(case)
    assert not isinstance(d, RuleFailure), d
    assert d.rules == [il.SPLIT_RULE] and [X[f.expr].shape for f in d.facts] == [(4, 3)] * 3
    assert all(X[f.expr].op == "split" and X[X[f.expr].args[0]].op == "input" for f in d.facts)
    two_axes = _split(2, 3, 1, [R, S(0)], {"dp": 2, "tp": 3})  # another axis replicated
    for c in (case, two_axes):
        for seed in range(3):
            assert run_case(c, seed).status == "ok"


@pytest.mark.parametrize("kw,why", [
    ({"parts": [1, 3, 2]}, "not the 3 parts"),
    ({"chunks": 2, "parts": [3, 3]}, "not the 3 parts"),
])
def test_split_near_misses_are_refused(kw, why):
    res = run_case(_split(3, 2, 2, [S(0)], {"tp": 2}, **kw), 0)
    assert res.status == "refused" and why in res.detail, res.detail


@pytest.mark.parametrize("kw", [
    {"layout_kp": "plain"},  # plain Shard(0): rank r holds rows r*3N/p.. of [Q; K; V]
    {"layout_kp": (2, 3)},  # the interleave over (tp, 3): p = 3 is not the axis size 2
])
def test_split_of_no_fused_shard_is_not_the_parts(kw):
    """No interleave over the axis: not the fused parts; the rank's equal chunks are read as micro-batches of its
    shard (kernel/microbatch.py, a true fact on every rank), which are not the logical parts."""
    case = _split(3, 2, 2, [S(0)], {"tp": 2}, **kw)
    X, _, _, _, d = conclude(case)
    assert il.SPLIT_RULE not in d.rules and d.rules == ["slice_shard_microbatch"]
    assert run_case(case, 0).status == "ok"


@pytest.mark.parametrize("pl,parts", [([P("sum"), S(0)], None), ([S(0), S(0)], [1, 1, 1])])
def test_split_refuses_other_axes_on_the_fused_dim(pl, parts):
    res = run_case(_split(3, 2, 2, pl, {"dp": 2, "tp": 2}, parts=parts), 0)
    assert res.status == "refused", res.detail


def test_a_sliced_part_and_its_padded_gradient():
    """q = y[..., :n] on the rank (Phi-3's spelling) is Shard of the logical part; its slice_backward pad back to
    the k parts is Shard of the interleave of the logical pad; near misses refused."""
    part = OpCase("slice", {"dim": 0, "start": 4, "end": 6, "step": 1},
                  [TIn((12, 3), (S(0),), layout=lambda X, e: il.build(X, e, 0, 3, 2))], ("tp",), {"tp": 2})
    X, _, _, _, d = conclude(part)
    assert d.rules == [il.SPLIT_RULE] and X[d.facts[0].expr].attr_dict()["start"] == 8
    pad = OpCase("pad", {"pads": [2, 0, 0, 0], "value": 0}, [TIn((4, 3), (S(0),))], ("tp",), {"tp": 2})
    X, _, _, _, d = conclude(pad)
    assert d.rules == [il.CONCAT_RULE] and il.match(X, d.facts[0].expr).k == 2
    for c in (part, pad):
        assert all(run_case(c, s).status == "ok" for s in range(3))
    across = OpCase("slice", {"dim": 0, "start": 1, "end": 3, "step": 1}, part.ins, ("tp",), {"tp": 2})
    for bad in (across, OpCase("pad", {"pads": [1, 0, 0, 0], "value": 0}, pad.ins, ("tp",), {"tp": 2}),
                OpCase("pad", {"pads": [2, 0, 0, 0], "value": 1}, pad.ins, ("tp",), {"tp": 2})):
        assert run_case(bad, 0).status == "refused"


def test_concat_of_part_shards_and_its_near_misses():
    ok = OpCase("concat", {"dim": 1}, [TIn((2, 4), (S(1),)) for _ in range(3)], ("tp",), {"tp": 2})
    X, _, _, _, d = conclude(ok)
    assert d.rules == [il.CONCAT_RULE] and il.match(X, d.facts[0].expr).k == 3
    assert all(run_case(ok, s).status == "ok" for s in range(3))
    gqa = OpCase("concat", {"dim": 1}, [TIn((2, 8), (S(1),)), TIn((2, 4), (S(1),))], ("tp",), {"tp": 2})
    mixed = OpCase("concat", {"dim": 1}, [TIn((2, 4), (S(1),)), TIn((2, 4), (R,))], ("tp",), {"tp": 2})
    assert run_case(mixed, 0).status == "refused"
    assert run_case(gqa, 0).status == "ok"  # parts of different sizes: concat_grouped_shard (kernel/concat_groups.py)
    assert conclude(gqa)[4].rules == ["concat_grouped_shard"]


def test_prover_reads_the_interleave_through_the_matmuls():
    """x @ interleave(W).t() is interleave(x @ W.t()) on its columns; the weight gradient dY.t() @ x with dY
    interleaved is interleave(G) on its rows; another (k, p) is not proved."""
    X = Exprs()
    x, w = X.leaf("x", (5, 4), "float"), X.leaf("w", (12, 4), "float")
    wt = X.mk("permute", {"dims": (1, 0)}, [il.build(X, w, 0, 3, 2)])
    y = X.mk("matmul", {}, [x, wt])
    plain = X.mk("matmul", {}, [x, X.mk("permute", {"dims": (1, 0)}, [w])])
    pv = Prover(X)
    assert pv.equal(y, il.build(X, plain, 1, 3, 2)) and il.EQ_RULE in pv.used
    assert not Prover(X).equal(y, il.build(X, plain, 1, 2, 3))
    g = X.mk("matmul", {}, [X.mk("permute", {"dims": (1, 0)}, [y]), x])  # [12, 4], rows interleaved
    gp = X.mk("matmul", {}, [X.mk("permute", {"dims": (1, 0)}, [plain]), x])
    assert Prover(X).equal(g, il.build(X, gp, 0, 3, 2))


def _draw(rule, n):
    return [Draw(np.random.default_rng([i, zlib.crc32(rule.encode())])) for i in range(n)]


def test_generators_hold_and_catch_broken_kernels(monkeypatch):
    split, concat = INTERLEAVE_GENERATORS[il.SPLIT_RULE], INTERLEAVE_GENERATORS[il.CONCAT_RULE]
    eq = INTERLEAVE_EQ_GENERATORS[il.EQ_RULE]

    def statuses(gen, rule):
        out = []
        for i, dr in enumerate(_draw(rule, 300)):
            try:
                out.append(run_case(gen(dr), i).status)
            except ValueError:
                out.append("skip")
        return out

    s, c = statuses(split, il.SPLIT_RULE), statuses(concat, il.CONCAT_RULE)
    e = [eq(dr, i)[0].status for i, dr in enumerate(_draw(il.EQ_RULE, 300))]
    for got in (s, c, e):
        assert "DISAGREE" not in got and "crash" not in got and got.count("ok") > 80
    # (a plain shard's equal chunks are micro-batches, kernel/microbatch.py: not refused, "other")
    assert s.count("refused") > 15 and c.count("refused") > 30 and e.count("refused") > 30
    # broken: the concat's interleave over (p, k) instead of (k, p)
    build = il.build
    monkeypatch.setattr(il, "build", lambda X, e, d, k, p: build(X, e, d, p, k))
    cases = [concat(dr) for dr in _draw(il.CONCAT_RULE, 300)]
    monkeypatch.setattr(il, "build", build)
    monkeypatch.setitem(il.derive_concat.__globals__, "build", lambda X, e, d, k, p: build(X, e, d, p, k))
    assert sum(run_case(cs, i).status == "DISAGREE" for i, cs in enumerate(cases)) > 50
    monkeypatch.setitem(il.derive_concat.__globals__, "build", build)
    # broken: the matcher reading [k, p, n] as [p, k, n] (the rank count taken from the wrong factor)
    match = il.match
    monkeypatch.setitem(il.pull.__globals__, "match", lambda X, x: None if match(X, x) is None else
                        il.Inter(match(X, x).core, match(X, x).dim, match(X, x).p, match(X, x).k, match(X, x).n))
    assert "DISAGREE" in statuses(split, il.SPLIT_RULE)


def _fused():
    path = ROOT / "examples" / "torch" / "realcode" / "fused_qkv.py"
    spec = importlib.util.spec_from_file_location("fused_qkv", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _torch_differs(mod, part, bug, tp):
    """The logical block against the ranks' blocks summed (the all_reduce), on real float64 tensors."""
    import torch

    g = torch.Generator().manual_seed(0)
    k, n = (3, mod.NH * mod.HD) if part == "qkv" else (2, mod.FF)
    x = torch.randn(mod.B, mod.S, mod.H, generator=g, dtype=torch.float64)
    w, wo = torch.randn(k * n, mod.H, generator=g, dtype=torch.float64), torch.randn(mod.H, n, generator=g,
                                                                                       dtype=torch.float64)
    block = mod.attention if part == "qkv" else mod.swiglu
    kw = {"swap_parts": {"order": "kqv"} if part == "qkv" else {"order": "ug"}, "head_major": {"head_major": True}}
    laid = w.reshape(k, tp, n // tp, mod.H).transpose(0, 1).reshape(k * n, mod.H)
    rows = laid if bug != "plain_shard" else w
    y = sum(block(x, rows.chunk(tp)[r], wo.chunk(tp, dim=1)[r], **kw.get(bug, {})) for r in range(tp))
    return float((y - block(x, w, wo)).abs().max())


@pytest.fixture(scope="module")
def fused():
    pytest.importorskip("torch")
    return _fused()


@pytest.mark.parametrize("kw,expected", [
    ({}, "VERIFIED"), ({"part": "gate_up", "tp": 4}, "VERIFIED"),
    ({"part": "gate_up", "bug": "swap_parts"}, "REFUTED"),
    ({"part": "gate_up", "bug": "plain_shard"}, "REFUTED"),  # the wrong plan: rank r's rows of [Wg; Wu]
])
def test_fused_programs(fused, kw, expected):
    from tvcert.engine.verify import verify
    from tvcert.frontends.trace import trace_plan
    from tvcert.plan import load_plan

    res = verify(load_plan(trace_plan(**fused.tvcert_trace(**kw))))
    assert res.verdict == expected, res.reasons[:3]
    if expected == "VERIFIED":  # the split reads the interleave through the matmul: that step cites its theorem
        assert {"split_interleaved_shard", "interleave_commutes"} <= {r for s in res.prop.steps for r in s.rules}
    diff = _torch_differs(fused, kw.get("part", "qkv"), kw.get("bug", ""), kw.get("tp", 2))
    assert (diff < 1e-9) == (expected == "VERIFIED"), diff


def test_torch_confirms_the_attention_bugs(fused):
    assert _torch_differs(fused, "qkv", "", 2) < 1e-9 and _torch_differs(fused, "qkv", "", 4) < 1e-9
    for bug in ("swap_parts", "head_major", "plain_shard"):
        assert _torch_differs(fused, "qkv", bug, 2) > 1e-3, bug


def test_interleave_over_the_wrong_factors_never_verifies(fused):
    """The plan's layout written [tp, 3, ..] instead of [3, tp, ..]: the rank's rows are not its Q, K, V blocks
    (an interleave over (2, 3) at tp = 2): never VERIFIED."""
    from tvcert.engine.verify import verify
    from tvcert.frontends.trace import trace_plan
    from tvcert.plan import load_plan

    spec = fused.tvcert_trace(part="qkv")
    n = fused.NH * fused.HD
    spec["inputs"]["w_fused"]["layout"][0] = {"op": "reshape", "attrs": {"shape": [2, 3, n // 2, fused.H]}}
    res = verify(load_plan(trace_plan(**spec)))
    assert res.verdict != "VERIFIED", res.reasons[:2]
