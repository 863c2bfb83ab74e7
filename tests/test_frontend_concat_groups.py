"""The ``concat_groups`` layout (kernel/concat_groups.py, issue 15 §3): a fused GQA ``w_qkv`` whose Q, K, V row
counts differ, rank r holding its heads of each part.

The macro's value is the index equation on every position (against :func:`source_index`, and the interleave when
the parts are equal); bad attributes are a plan error; the kernel's split / concat / equality step and their near
misses; the generators hold and catch broken kernels; whole programs (examples/torch/realcode/fused_qkv_gqa.py):
the correct one VERIFIED through the three rules and torch agrees with it, wrong splits and wrong layouts REFUTED
and torch confirms each difference on real tensors.
"""
from __future__ import annotations

import importlib.util
import zlib
from pathlib import Path

import numpy as np
import pytest

from tvcert.conform.core import OpCase, P, R, S, TIn, conclude, run_case
from tvcert.conform.gens import Draw
from tvcert.conform.gens_concat_groups import CONCAT_GROUPS_EQ_GENERATORS, CONCAT_GROUPS_GENERATORS
from tvcert.kernel import concat_groups as cg
from tvcert.kernel import interleave as il
from tvcert.kernel.equality import Prover
from tvcert.kernel.expr import Exprs
from tvcert.kernel.rules import RuleFailure
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


def _lay(sizes, groups, dim=0):
    return lambda X, e: cg.build_expr(X, e, {"dim": dim, "sizes": sizes, "groups": groups})


def _split(local, pl=(S(0),), mesh=None, sizes=(8, 4, 4), groups=2):
    mesh = mesh or {"tp": 2}
    return OpCase("split", {"dim": 0, "sizes": list(local)}, [TIn((sum(sizes), 3), tuple(pl), layout=_lay(list(sizes),
                  groups))], tuple(mesh), dict(mesh))


def test_split_of_a_grouped_shard_is_the_parts_and_near_misses_are_refused():
    X, _, _, _, d = conclude(_split([4, 2, 2]))
    assert not isinstance(d, RuleFailure), d
    assert d.rules == [cg.SPLIT_RULE] and [X[f.expr].shape for f in d.facts] == [(8, 3), (4, 3), (4, 3)]
    assert all(run_case(_split([4, 2, 2]), s).status == "ok" for s in range(3))
    assert run_case(_split([2, 4, 2], mesh={"dp": 2, "tp": 2}, pl=(R, S(0))), 0).status == "refused"
    for bad in (_split([2, 2, 4]), _split([3, 3, 2]),  # another order, the q / k boundary off by a row
                _split([4, 2, 2], groups=1),  # the layout over one group (a plain shard of [Wq; Wk; Wv])
                _split([2, 1, 1], mesh={"dp": 2, "tp": 2}, pl=(S(0), S(0))),  # the fused dim sharded twice
                _split([4, 2, 2], mesh={"dp": 2, "tp": 2}, pl=(P("sum"), S(0)))):
        assert run_case(bad, 0).status == "refused", bad


def test_concat_of_unequal_part_shards_and_its_near_misses():
    ok = OpCase("concat", {"dim": 1}, [TIn((2, 8), (S(1),)), TIn((2, 4), (S(1),)), TIn((2, 4), (S(1),))],
                ("tp",), {"tp": 2})
    X, _, _, _, d = conclude(ok)
    assert d.rules == [cg.CONCAT_RULE] and cg.match(X, d.facts[0].expr).sizes == (8, 4, 4)
    assert all(run_case(ok, s).status == "ok" for s in range(3))
    mixed = OpCase("concat", {"dim": 1}, [TIn((2, 8), (S(1),)), TIn((2, 4), (R,))], ("tp",), {"tp": 2})
    assert run_case(mixed, 0).status == "refused"


def test_prover_reads_the_grouped_layout_through_the_matmuls():
    X = Exprs()
    x, w = X.leaf("x", (5, 4), "float"), X.leaf("w", (16, 4), "float")
    lay = _lay([8, 4, 4], 2)
    y = X.mk("matmul", {}, [x, X.mk("permute", {"dims": (1, 0)}, [lay(X, w)])])
    plain = X.mk("matmul", {}, [x, X.mk("permute", {"dims": (1, 0)}, [w])])
    pv = Prover(X)
    assert pv.equal(y, cg.build_expr(X, plain, {"dim": 1, "sizes": [8, 4, 4], "groups": 2})) and cg.EQ_RULE in pv.used
    for sizes, groups in (([4, 8, 4], 2), ([8, 4, 4], 1), ([8, 4, 4], 4)):
        assert not Prover(X).equal(y, cg.build_expr(X, plain, {"dim": 1, "sizes": sizes, "groups": groups}))


def _statuses(gen, rule, n=200, eq=False):
    out = []
    for i in range(n):
        dr = Draw(np.random.default_rng([i, zlib.crc32(rule.encode())]))
        try:
            out.append(gen(dr, i)[0].status if eq else run_case(gen(dr), i).status)
        except ValueError:
            out.append("skip")
    return out


def test_generators_hold_and_catch_broken_kernels(monkeypatch):
    gens = {**CONCAT_GROUPS_GENERATORS, **CONCAT_GROUPS_EQ_GENERATORS}
    for rule, gen in gens.items():
        got = _statuses(gen, rule, eq=rule == cg.EQ_RULE)
        assert "DISAGREE" not in got and "crash" not in got and got.count("ok") > 60, (rule, got.count("ok"))
        assert got.count("refused") > 20, rule
    build = cg.build_expr  # broken: the concat's layout over one group (the parts' plain concat)
    monkeypatch.setitem(cg.derive_concat.__globals__, "build_expr",
                        lambda X, e, a: build(X, e, {**a, "groups": 1}))
    assert "DISAGREE" in _statuses(CONCAT_GROUPS_GENERATORS[cg.CONCAT_RULE], cg.CONCAT_RULE, 60)
    monkeypatch.setitem(cg.derive_concat.__globals__, "build_expr", build)
    match, find = cg.match, cg.find  # broken: the base case not checking the group count against the axis size
    monkeypatch.setitem(cg.find.__globals__, "find", lambda X, e, d, p: None if match(X, e) is None or
                        match(X, e).dim != d else (match(X, e).core, ("groups", match(X, e).sizes)))
    assert "DISAGREE" in _statuses(CONCAT_GROUPS_GENERATORS[cg.SPLIT_RULE], cg.SPLIT_RULE, 200)
    monkeypatch.setitem(find.__globals__, "find", find)
    split = cg.derive_split  # broken: the first two parts' facts swapped (k before q)

    def swapped(*a):
        d = split(*a)
        if d is not None and len(d.facts) > 1:
            d.facts[0], d.facts[1] = d.facts[1], d.facts[0]
        return d
    from tvcert.kernel import rules

    monkeypatch.setitem(rules._slice.__globals__, "derive_grouped_split", swapped)
    assert "DISAGREE" in _statuses(CONCAT_GROUPS_GENERATORS[cg.SPLIT_RULE], cg.SPLIT_RULE, 60)
    monkeypatch.setitem(rules._slice.__globals__, "derive_grouped_split", split)
    sl, pad = cg.derive_slice, cg.derive_pad

    def next_part(kc, ra, f, dim, failure):  # broken: the logical part one rank block later
        d = sl(kc, ra, f, dim, failure)
        if d is not None:
            x = kc.exprs[d.facts[0].expr]
            a = x.attr_dict()
            core = kc.exprs[x.args[0]]
            if a["end"] + (a["end"] - a["start"]) <= core.shape[dim]:
                a = {**a, "start": a["end"], "end": 2 * a["end"] - a["start"]}
                d.facts[0] = d.facts[0].__class__(kc.exprs.mk("slice", a, list(x.args)), d.facts[0].pl)
        return d

    def mirrored(kc, ra, f, failure):  # broken: the part padded from the other end
        pads = list(ra["pads"])
        for k in range(0, len(pads), 2):
            pads[k], pads[k + 1] = pads[k + 1], pads[k]
        return pad(kc, {**ra, "pads": pads}, f, failure)
    monkeypatch.setitem(rules._slice.__globals__, "derive_grouped_slice", next_part)
    assert "DISAGREE" in _statuses(CONCAT_GROUPS_GENERATORS[cg.SPLIT_RULE], cg.SPLIT_RULE, 120)
    monkeypatch.setitem(rules._rowwise.__globals__, "derive_grouped_pad", mirrored)
    assert "DISAGREE" in _statuses(CONCAT_GROUPS_GENERATORS[cg.CONCAT_RULE], cg.CONCAT_RULE, 120)


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


@pytest.mark.parametrize("bug", ["", "kv_swap"])
def test_gqa_sliced_parts(gqa, bug):
    """Phi-3's spelling (``qkv[..., :a]`` ..., realcode/fused_qkv_gqa_slices.py): the rank's slices are the logical
    parts, their slice_backward pads the declared layout of the logical pads; k / v swapped REFUTED, torch
    confirming."""
    from tvcert.engine.verify import verify
    from tvcert.frontends.trace import trace_plan
    from tvcert.plan import load_plan

    path = ROOT / "examples" / "torch" / "realcode" / "fused_qkv_gqa_slices.py"
    spec = importlib.util.spec_from_file_location("fused_qkv_gqa_slices", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = verify(load_plan(trace_plan(**mod.tvcert_trace(bug=bug))))
    gqa.attention, orig = mod.attention, gqa.attention  # _torch_differs on the sliced spelling
    try:
        diff = _torch_differs(gqa, bug)
    finally:
        gqa.attention = orig
    if bug:
        assert res.verdict == "REFUTED" and diff > 1e-3, (res.verdict, diff, res.reasons[:2])
    else:
        assert res.verdict == "VERIFIED" and diff < 1e-9, (res.verdict, diff, res.reasons[:2])
        steps = [(s.rules, res.plan.programs[s.program].nodes[s.node].op) for s in res.prop.steps]
        assert {op for r, op in steps if cg.SPLIT_RULE in r} == {"slice"}
        assert {op for r, op in steps if cg.CONCAT_RULE in r} == {"pad"}


@pytest.mark.parametrize("bug", ["", "qk_boundary", "kv_swap", "plain_shard", "plan_boundary"])
def test_gqa_programs(gqa, bug):
    from tvcert.engine.verify import verify
    from tvcert.frontends.trace import trace_plan
    from tvcert.plan import load_plan

    res = verify(load_plan(trace_plan(**gqa.tvcert_trace(bug=bug))))
    diff = _torch_differs(gqa, bug)
    if bug:
        assert res.verdict == "REFUTED" and diff > 1e-3, (res.verdict, diff, res.reasons[:2])
    else:
        assert res.verdict == "VERIFIED" and diff < 1e-9, (res.verdict, diff, res.reasons[:2])
        assert {cg.SPLIT_RULE, cg.CONCAT_RULE, cg.EQ_RULE} <= {r for s in res.prop.steps for r in s.rules}
