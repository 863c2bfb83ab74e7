"""cumsum over a sequence sharded across ranks, as real code computes it (examples/torch/realcode/cumsum_sp.py, issue
15 §2): each rank's local cumsum plus the carried offset from an all_gather of the per-rank totals is VERIFIED
through ``block_prefix_sum`` (kernel/prefix_scan.py, Rules/PrefixScan.v) in every spelling of the offset (a masked
sum, a where, a triangular row times the totals, a cumsum of the gathered totals: ``block_prefix_sum_scanned``), at
sp 2 / 3 / 4 and odd blocks, and the reversed scan ``flip(cumsum(flip(x)))`` carrying the later ranks' totals
(``block_suffix_sum``), and the totals read off each rank's own scan (``scan_last_row_total``); the offset from the
ranks up to its own, from the ranks after it, from the global rank on a 2-D mesh, or missing, is REFUTED and
confirmed by the interpreter.  One trace per case, shared by its assertions."""
from __future__ import annotations

import copy
import importlib.util
import json
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tvcert.certificate.check import check_certificate  # noqa: E402
from tvcert.certificate.emit import build_certificate, dump_certificate  # noqa: E402
from tvcert.certificate.format import Certificate  # noqa: E402
from tvcert.conform.gens import Draw  # noqa: E402
from tvcert.conform.gens_prefix_scan import gen_prefix_scan  # noqa: E402
from tvcert.engine.verify import used_rules, verify  # noqa: E402
from tvcert.frontends.trace import trace_plan  # noqa: E402
from tvcert.interp import run_plan  # noqa: E402
from tvcert.kernel import prefix_scan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

EX = Path(__file__).resolve().parents[1] / "examples" / "torch" / "realcode" / "cumsum_sp.py"
_TRACES: dict[tuple, dict] = {}


@pytest.fixture(scope="module")
def spec():
    s = importlib.util.spec_from_file_location("cumsum_sp", EX)
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


def _traced(spec, variant, bug="", sp=2, block=3) -> dict:
    key = (variant, bug, sp, block)
    if key not in _TRACES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # funcol.all_gather_tensor's deprecation
            _TRACES[key] = trace_plan(**spec.tvcert_trace(variant=variant, bug=bug, sp=sp, block=block))
    return copy.deepcopy(_TRACES[key])


@pytest.mark.parametrize("variant,sp,block", [("masked", 2, 3), ("where", 3, 1), ("matmul", 4, 3), ("gcumsum", 3, 3),
                                              ("lastrow", 3, 1), ("exclusive", 3, 5), ("reverse", 2, 3), ("dim1", 2, 3),
                                              ("flat", 4, 1)])
def test_carried_offset_scan_verifies(spec, variant, sp, block):
    assert spec.torch_check(variant, "", sp, block)
    plan = load_plan(_traced(spec, variant, sp=sp, block=block))
    res = verify(plan)
    assert res.verdict == "VERIFIED", res.reasons
    want = {"gcumsum": "block_prefix_sum_scanned", "reverse": "block_suffix_sum",
            "lastrow": "scan_last_row_total"}.get(variant, "block_prefix_sum")
    assert want in used_rules(res)
    # the independent checker replays the pattern its step cites
    check_certificate(Certificate.model_validate(json.loads(dump_certificate(build_certificate(res)))))
    assert run_plan(plan).equal


@pytest.mark.parametrize("variant,bug,sp", [("masked", "self", 2), ("where", "after", 3), ("dim1", "global_rank", 2),
                                            ("matmul", "no_offset", 4), ("gcumsum", "self", 4),
                                            ("reverse", "after", 3)])
def test_wrong_offset_is_refuted(spec, variant, bug, sp):
    assert not spec.torch_check(variant, bug, sp)
    plan = load_plan(_traced(spec, variant, bug, sp))
    assert not run_plan(plan).equal
    res = verify(plan)
    assert res.verdict == "REFUTED", res.reasons
    assert {"loss", "grad_w"} & {o["name"] for o in res.counterexample["outputs"] if not o["equal"]}


def test_coefficient_row_is_checked_on_every_rank(spec):
    """Rank 0's row (no offset at all) taken by every rank: right on rank 0 only."""
    d = _traced(spec, "masked")
    nodes = d["parallel"][0]["nodes"]
    rk = next(n for n in nodes if n["op"] == "const" and n.get("attrs", {}).get("value") == "rank.sp")
    rk["attrs"]["value"] = 0
    plan = load_plan(d)
    assert not run_plan(plan).equal
    assert verify(plan).verdict == "REFUTED"


def _draws(n):
    import numpy as np

    out = []
    for i in range(n):
        res, desc = gen_prefix_scan(Draw(np.random.default_rng([i, 7])), i)
        out.append((res.status, desc))
    return out


def test_generator_agrees_and_catches_a_kernel_without_the_row_check(monkeypatch):
    got = _draws(60)
    assert not [x for x in got if x[0] in ("DISAGREE", "crash")], got
    assert sum(s == "ok" and "near" not in dsc for s, dsc in got) > 20
    assert sum(s == "refused" and "near" in dsc for s, dsc in got) > 5
    monkeypatch.setattr(prefix_scan, "_check_prefix_row", lambda *a, **k: None)
    assert any(s == "DISAGREE" for s, _ in _draws(60))


# ------------------------------------------------------------------ a training step through the sharded scan
GRAD_EX = EX.with_name("cumsum_sp_grad.py")


@pytest.fixture(scope="module")
def grad_spec():
    s = importlib.util.spec_from_file_location("cumsum_sp_grad", GRAD_EX)
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


def _grad_plan(grad_spec, grad, bug="", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return load_plan(trace_plan(**grad_spec.tvcert_trace(grad=grad, bug=bug, **kw)))


@pytest.mark.parametrize("grad,kw,rule", [("autograd", {}, "block_suffix_sum_scattered"),
                                          ("custom", {"sp": 3, "dp": 2}, "block_suffix_sum"),
                                          ("reverse", {"sp": 3}, "block_prefix_sum_scattered")])
def test_scan_training_step_verifies(grad_spec, grad, kw, rule):
    """The loss backward to the sharded input and to the weight before the scan: autograd's backward carries the
    gradient offset through a reduce_scatter (block_suffix_sum_scattered), a hand-written one through an all_gather
    of the gradient totals (block_suffix_sum); through a reversed scan, autograd's backward is a cumsum inside two
    pairs of flips (block_prefix_sum_scattered, scan_flip_pairs)."""
    assert grad_spec.torch_check(grad, "", kw.get("sp", 2))
    plan = _grad_plan(grad_spec, grad, **kw)
    res = verify(plan)
    assert res.verdict == "VERIFIED", res.reasons
    assert {"block_suffix_sum" if grad == "reverse" else "block_prefix_sum", rule} <= used_rules(res)
    assert (grad == "reverse") == ("scan_flip_pairs" in used_rules(res))
    check_certificate(Certificate.model_validate(json.loads(dump_certificate(build_certificate(res)))))


@pytest.mark.parametrize("grad,bug,wrong", [("custom", "bwd_after", {"grad_inp", "grad_w0"}),
                                            ("autograd", "global_rank", {"loss", "grad_inp"}),
                                            ("reverse", "fwd_self", {"loss", "grad_inp"})])
def test_scan_training_step_bugs_are_refuted(grad_spec, grad, bug, wrong):
    """The backward's offset from the forward's side, the global rank on a dp x sp mesh, the reversed scan's offset
    with the rank's own total: REFUTED, the differing outputs the ones the bug touches (the backward's offset missing
    and the weight's gradient not reduced: bench/frontend_coverage.py's rows)."""
    assert not grad_spec.torch_check(grad, bug)
    plan = _grad_plan(grad_spec, grad, bug)
    res = verify(plan)
    assert res.verdict == "REFUTED", res.reasons
    assert wrong <= {o["name"] for o in res.counterexample["outputs"] if not o["equal"]}
