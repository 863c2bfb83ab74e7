"""Ring attention (context parallelism): the ring_loop construct, ppermute, and the certified
online-softmax pattern; correct rings verify, broken ones are refuted at the loop, and a
correct ring outside the proved schedule is UNKNOWN, never REFUTED or VERIFIED."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from tvcert.certificate.check import Invalid, check_certificate
from tvcert.certificate.emit import build_certificate
from tvcert.certificate.format import Certificate
from tvcert.cli import main
from tvcert.engine.verify import verify
from tvcert.generators.plans import llama3_plan
from tvcert.interp import run_plan
from tvcert.plan import PlanError, load_plan

EX = Path(__file__).resolve().parents[1] / "examples"
BUGS = ["no_max_correction", "positions_not_passed", "acc_starts_at_one"]


def ring(bug: str | None = None):
    return load_plan(EX / f"ring_attention_cp2{'_' + bug if bug else ''}.json")


def raw(bug: str | None = None) -> dict:
    return json.loads((EX / f"ring_attention_cp2{'_' + bug if bug else ''}.json").read_text())


def test_interpreter_runs_the_ring_and_matches_softmax_attention():
    r = run_plan(ring(), seed=3)
    assert r.equal
    o = r.logical["o"]
    q, k, v = (r.inputs[x] for x in "qkv")
    s = q @ np.swapaxes(k, -1, -2) * 0.5
    s = np.where(np.triu(np.ones((8, 8)), 1) > 0, -1e9, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    assert np.allclose(o, (p / p.sum(-1, keepdims=True)) @ v)


def test_correct_ring_verifies_with_a_replayable_certificate():
    res = verify(ring())
    assert res.verdict == "VERIFIED", res.reasons
    step = next(s for s in res.prop.steps if s.pattern)
    assert step.rules == ["ring_attention_online_softmax"]
    cert = Certificate.model_validate(build_certificate(res))
    assert check_certificate(cert).steps == len(res.prop.steps)


@pytest.mark.parametrize("bug", BUGS)
def test_broken_ring_is_refuted_at_the_loop(bug):
    res = verify(ring(bug))
    assert res.verdict == "REFUTED", res.reasons
    cx = res.counterexample
    assert cx["first_divergence"]["op"] == "ring_loop"
    assert not run_plan(ring(bug), dims=cx["dims"], seed=cx["seed"]).equal
    assert any(s["op"] == "div" and "ring_attention_online_softmax" in s["reason"] for s in cx["engine_stuck_at"])


def test_unproved_schedule_is_unknown_not_refuted():
    """shift -1 is a correct ring, but not the proved schedule; float64 agrees, and exact mode is not tried
    (its function tables for exp could differ where the real exp agrees)."""
    res = verify(ring("shift_backwards"))
    assert res.verdict == "UNKNOWN"
    assert any("shift=1" in r for r in res.reasons)
    assert any("no exact-mode run: the plan uses exp" in r for r in res.reasons)


def test_loop_body_errors_name_the_field():
    bad = raw()
    loop = bad["parallel"][0]["nodes"][6]
    loop["attrs"]["body"]["outputs"] = loop["attrs"]["body"]["outputs"][:5]
    with pytest.raises(PlanError, match=r"nodes\[6\]\.attrs\.body\.outputs.*5 values for 6 carried"):
        load_plan(bad)
    bad = raw()
    bad["parallel"][0]["nodes"][6]["attrs"]["body"]["nodes"][0]["attrs"]["dims"] = [0, 1, 2, 3]  # k not transposed
    with pytest.raises(PlanError, match=r"attrs\.body\.nodes\[1\]"):
        load_plan(bad)
    bad = raw()
    bad["parallel"][0]["nodes"][6]["attrs"]["body"]["nodes"].append(
        {"name": "r", "op": "slice", "inputs": ["q"], "attrs": {"dim": 2, "start": "rank.cp", "end": "rank.cp+1"}})
    with pytest.raises(PlanError, match="cannot depend on rank"):
        load_plan(bad)
    bad = raw()
    bad["logical"]["nodes"].append({"name": "z", "op": "ppermute", "inputs": ["o"], "attrs": {"axis": "cp", "shift": 1}})
    with pytest.raises(PlanError, match="logical .* cannot contain 'ppermute'"):
        load_plan(bad)


BAD_LOOPS = {
    "body_missing": (lambda lp: lp["attrs"].pop("body"), r"nodes\[6\]\.attrs: op 'ring_loop' needs attribute 'body'"),
    "body_not_object": (lambda lp: lp["attrs"].__setitem__("body", 5), r"nodes\[6\]\.attrs\.body: "),
    "carry_too_big": (lambda lp: lp["attrs"].__setitem__("carry", 99), r"attrs\.carry: carry must be between 1 and"),
    "unknown_axis": (lambda lp: lp["attrs"].__setitem__("axis", "zz"), r"attrs\.axis: ring_loop over axis 'zz'"),
    "nested_loop": (lambda lp: lp["attrs"]["body"]["nodes"].append({"outputs": ["z"], "op": "ring_loop", "inputs": ["q"],
                                                                     "attrs": {"axis": "cp", "carry": 1, "body": {}}}),
                    r"body\.nodes\[22\]\.op: a loop body cannot contain 'ring_loop'"),
    "send_in_body": (lambda lp: lp["attrs"]["body"]["nodes"].append({"op": "send", "inputs": ["q"],
                                                                      "attrs": {"axis": "cp", "to": 0, "tag": "x"}}),
                     r"cannot contain 'send'"),
}


@pytest.mark.parametrize("case", sorted(BAD_LOOPS))
def test_malformed_loops_exit_3_naming_the_field(case, tmp_path):
    bad = raw()
    edit, pattern = BAD_LOOPS[case]
    edit(bad["parallel"][0]["nodes"][6])
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(bad))
    r = CliRunner().invoke(main, ["verify", str(f)])
    assert r.exit_code == 3, r.output
    assert "Traceback" not in r.output
    import re

    assert re.search(pattern, r.output), r.output


def test_cli_exit_codes():
    r = CliRunner().invoke(main, ["verify", str(EX / "ring_attention_cp2.json"), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["verdict"] == "VERIFIED"
    r = CliRunner().invoke(main, ["verify", str(EX / "ring_attention_cp2_no_max_correction.json")])
    assert r.exit_code == 1
    r = CliRunner().invoke(main, ["verify", str(EX / "ring_attention_cp2_shift_backwards.json")])
    assert r.exit_code == 2


@pytest.mark.parametrize("cfg", [{"cp": 2}, {"cp": 2, "tp": 2, "sp": True, "dp": 2},
                                 {"cp": 2, "pp": 2, "layers": 2, "mb": 2, "dp": 2, "zero": 1}],
                         ids=["cp", "cp_tp_sp_dp", "cp_pp_mb_dp_zero"])
def test_generated_ring_plans_run_equal_and_verify(cfg):
    p = llama3_plan("llama3-8b", **{"layers": 1, **cfg}, cp_style="ring")
    p["dims"] = dict(p["run_dims"])
    plan = load_plan(p)
    assert run_plan(plan).equal
    res = verify(plan, refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    layers = cfg.get("layers", 1)
    assert sum(1 for s in res.prop.steps if "ring_attention_online_softmax" in s.rules) == layers
    assert sum(1 for s in res.prop.steps if "ring_attention_backward" in s.rules) == layers
    assert not any(n.op == "all_gather" and n.attrs["axis"] == "cp" for g in plan.programs.values() for n in g.nodes)


@pytest.mark.parametrize("cfg", [{"cp": 2, "tp": 2}, {"cp": 2, "tp": 2, "sp": True, "dp": 2, "ep": 2}],
                         ids=["cp_tp", "cp_tp_sp_dp_ep"])
def test_generated_deepseek_ring_plans_run_equal_and_verify(cfg):
    """MLA: two score terms (no-rope and rope parts), the rope key shared by all heads."""
    from tvcert.generators.deepseek import deepseek_plan

    p = deepseek_plan("deepseek-v3-671b", layers=2, **cfg, cp_style="ring")
    p["dims"] = dict(p["run_dims"])
    plan = load_plan(p)
    assert run_plan(plan).equal
    res = verify(plan, refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    assert sum(1 for s in res.prop.steps if "ring_attention_backward" in s.rules) == 2


def test_ring_plan_size_does_not_grow_with_cp():
    def size(cp):
        p = llama3_plan("llama3-8b", layers=1, cp=cp, cp_style="ring")
        nodes = [n for g in p["parallel"] for n in g["nodes"]]
        return len(nodes), sum(len(n["attrs"]["body"]["nodes"]) for n in nodes if n["op"] == "ring_loop")

    assert size(2) == size(8)


def test_ring_verifies_at_full_llama3_405b_size():
    res = verify(load_plan(llama3_plan("llama3-405b", layers=2, cp=16, tp=8, sp=True, dp=4, cp_style="ring")),
                 refute=False)
    assert res.verdict == "VERIFIED", res.reasons


def test_ring_loop_round_trips_through_the_certificate_checker_tamper():
    res = verify(ring())
    bad = copy.deepcopy(build_certificate(res))
    row = next(s for s in bad["steps"] if s.get("pattern"))
    row["pattern"] = row["pattern"][:-1]
    with pytest.raises(Invalid, match="ring_attention_online_softmax matches ops"):
        check_certificate(Certificate.model_validate(bad))


# ------------------------------------------------------------------ soundness: random edits of ring bodies
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st
from soundness_check import assert_not_wrongly_verified  # noqa: E402
from tvcert.fuzz.ring import edit_body as _edit_body  # noqa: E402


def _never_wrongly_verified(plan_raw: dict, loops: list[int], seed: int, edits: int) -> None:
    import random

    rng = random.Random(seed)
    bad = copy.deepcopy(plan_raw)
    prog = bad["parallel"][0]["nodes"]
    what = [_edit_body(prog[loops[rng.randrange(len(loops))]]["attrs"]["body"], rng) for _ in range(edits)]
    assert_not_wrongly_verified(bad, what)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 10**9), st.integers(1, 3))
def test_edited_forward_ring_is_never_wrongly_verified(seed, edits):
    _never_wrongly_verified(raw(), [6], seed, edits)


_GEN = None


def _generated() -> tuple[dict, list[int]]:
    global _GEN
    if _GEN is None:
        p = llama3_plan("llama3-8b", layers=1, cp=2, cp_style="ring")
        p["dims"] = dict(p["run_dims"])
        _GEN = p, [i for i, n in enumerate(p["parallel"][0]["nodes"]) if n["op"] == "ring_loop"]
    return _GEN


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 10**9), st.integers(1, 2))
def test_edited_training_ring_is_never_wrongly_verified(seed, edits):
    p, loops = _generated()
    _never_wrongly_verified(p, loops, seed, edits)
