"""Issue 13, classes 4 and 5: stage replay rebuilds expressions from the template's ops (never substitutes by
hash), and send / recv have one pairing (the loader's) in the engine, the checker and the interpreter."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tvcert.certificate.check import Invalid, check_certificate
from tvcert.certificate.emit import build_certificate, dump_certificate
from tvcert.certificate.format import Certificate, manifest_path, rule_digests, stage_table
from tvcert.cli import main
from tvcert.engine.verify import verify
from tvcert.generators.plans import generate_plan, llama3_plan
from tvcert.interp import run_plan
from tvcert.kernel.expr import Exprs
from tvcert.kernel.memo import canonical_key, derive_template, replay, stages
from tvcert.plan import PlanError, load_plan, plan_digest

REG = Path(__file__).resolve().parent / "regressions"


def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def cert_of(plan: dict) -> dict:
    res = verify(load_plan(plan), refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    return json.loads(dump_certificate(build_certificate(res)))


def check(cert: dict):
    return check_certificate(Certificate.model_validate(cert))


def restamp(cert: dict, plan: dict | None = None) -> dict:
    """A forgery made consistent with today's manifest (and, if given, a plan): only its proof is wrong."""
    c = copy.deepcopy(cert)
    if plan is not None:
        c["plan"] = {"name": plan["name"], "digest": plan_digest(plan), "content": plan}
        c["stages"] = stage_table(plan)
    mbytes = manifest_path().read_bytes()
    import hashlib
    c["manifest"] = {"digest": "sha256:" + hashlib.sha256(mbytes).hexdigest(),
                     "rules": rule_digests(json.loads(mbytes), sorted(c["manifest"]["rules"]))}
    return c


# ====================================================================== class 4: stage replay
def _alias_plan(order: str = "xe", twist: str = "exp", extra: bool = False) -> dict:
    """Two stages of one canonical form.  In the first, the op result c1 = exp(x) is hash-equal to the boundary
    input e = exp(x); in the second the same op computes twist(w) while the boundary input is g = neg(w).
    ``order`` puts the aliased boundary input first or second; ``extra`` hides the alias one op deeper."""
    def stage(lab, src, other, res):
        ops = [{"op": "exp", "inputs": [src], "name": f"c{lab}", "layer": f"L{lab}"}]
        first = f"c{lab}"
        if extra:
            ops = [{"op": "neg", "inputs": [src], "name": f"d{lab}", "layer": f"L{lab}"},
                   {"op": "neg", "inputs": [f"d{lab}"], "name": f"c{lab}", "layer": f"L{lab}"}]
        pair = [first, other] if order == "xe" else [other, first]
        ops.append({"op": "add", "inputs": pair, "name": res, "layer": f"L{lab}"})
        return ops

    par = [{"op": "exp" if not extra else "neg", "inputs": ["x"], "name": "e0"}]
    if extra:
        par = [{"op": "neg", "inputs": ["x"], "name": "e1"}, {"op": "neg", "inputs": ["e1"], "name": "e0"}]
    par += [{"op": "neg", "inputs": ["w"], "name": "g"}]
    par += stage(1, "x", "e0", "z1") + stage(2, "w", "g", "z2")
    logical = [{"op": "exp", "inputs": ["x"], "name": "ex"}, {"op": "neg", "inputs": ["w"], "name": "o"}]
    if extra:
        logical = [{"op": "neg", "inputs": ["x"], "name": "ex1"}, {"op": "neg", "inputs": ["ex1"], "name": "ex"},
                   {"op": "neg", "inputs": ["w"], "name": "o"}]
    return {"tvcert_plan": 1, "name": f"alias_{order}_{extra}", "dims": {"b": 4, "h": 8, "tp": 2},
            "run_dims": {"b": 2, "h": 4, "tp": 2}, "mesh": [["tp", "tp"]],
            "logical": {"inputs": [{"name": "x", "shape": ["b", "h"]}, {"name": "w", "shape": ["b", "h"]}],
                        "nodes": logical, "outputs": ["o", "ex"]},
            "parallel": [{"name": "main", "inputs": [{"name": "x", "shape": ["b", "h"]}, {"name": "w", "shape": ["b", "h"]}],
                          "nodes": par, "outputs": ["c2", "e0"]}],
            "inputs": {"x": {"local": "x"}, "w": {"local": "w"}},
            "outputs": {"o": {"local": "c2"}, "ex": {"local": "e0"}}}


def test_shared_memo_alias_plan_is_refuted():
    plan = load_plan(json.loads((REG / "issue13_memo_replay_aliases_boundary.json").read_text()))
    assert not run_plan(plan).equal
    res = verify(plan)
    assert res.verdict == "REFUTED", res.reasons
    assert cli("verify", REG / "issue13_memo_replay_aliases_boundary.json").exit_code == 1


@pytest.mark.parametrize("order", ["xe", "ex"])
@pytest.mark.parametrize("extra", [False, True])
def test_internal_result_aliasing_a_boundary_is_not_replaced_on_replay(order, extra):
    raw = _alias_plan(order, extra=extra)
    plan = load_plan(raw)
    assert not run_plan(plan).equal
    res = verify(plan)
    assert res.verdict == "REFUTED", res.reasons
    # the second stage was replayed from the first (so this exercises replay, not op-by-op derivation) ...
    replayed = {s.node for s in res.prop.steps if s.instance_of is not None}
    second = {i for i, n in enumerate(plan.programs["main"].nodes) if n.layer == "L2"}
    assert replayed == second
    # ... and its result is the instance's own exp(w) (or neg(neg(w))), not the boundary's neg(w)
    c2 = res.prop.facts["main"]["c2"].expr
    w = res.prop.facts["main"]["w"].expr
    assert c2 != res.prop.facts["main"]["g"].expr
    X = res.exprs
    chain = [X[c2].op] + ([X[X[c2].args[0]].op] if extra else [])
    assert chain == (["neg", "neg"] if extra else ["exp"])
    assert (X[X[c2].args[0]].args[0] if extra else X[c2].args[0]) == w


def test_replay_equals_op_by_op_derivation_for_an_aliasing_stage():
    """The replayed facts are exactly those the op-by-op derivation of the copy concludes."""
    import tvcert.engine.propagate as P
    from tvcert.kernel.setup import logical_exprs

    plan = load_plan(_alias_plan())
    got = {}
    for memo in (True, False):
        old = P.MEMOIZE
        P.MEMOIZE = memo
        try:
            X = Exprs()
            prop = P.propagate(plan, X, logical_exprs(plan, X))
        finally:
            P.MEMOIZE = old
        got[memo] = {t: (X.show(f.expr, 10), f.pl) for t, f in prop.facts["main"].items()}
    assert got[True] == got[False]


def test_template_is_derived_over_slots_and_leaves_the_table_unchanged():
    plan = load_plan(_alias_plan())
    res = verify(plan, refute=False)
    X = res.exprs
    g = plan.programs["main"]
    (s1, e1, _), (s2, e2, _) = stages(g)
    before = len(X)
    t = derive_template(plan, "main", s1, e1, res.prop.facts["main"], X)
    assert len(X) == before
    assert t.key == canonical_key(plan, "main", s2, e2, res.prop.facts["main"], X)
    # c1 = exp(slot 0): a recipe node built from the slot, not the slot of the boundary input e = exp(x)
    (c1, _), = t.out[0]
    assert t.recipe[c1][0] == "exp" and t.recipe[t.recipe[c1][2][0]] == ["slot", 0]
    fs = replay(t, X, [res.prop.facts["main"][b].expr for b in ("w", "g")])
    assert X[fs[0][0].expr].op == "exp"
    with pytest.raises(ValueError, match="share"):
        replay(t, X, [res.prop.facts["main"]["w"].expr] * 2)


def test_correct_aliasing_stages_verify_with_replay_and_their_certificate_checks():
    """Positive control: the same shape of plan where the copy really computes what is declared."""
    raw = _alias_plan()
    raw["logical"]["nodes"][1] = {"op": "exp", "inputs": ["w"], "name": "o"}
    plan = load_plan(raw)
    assert run_plan(plan).equal
    res = verify(plan, refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    assert any(s.instance_of for s in res.prop.steps)
    check(cert_of(raw))


def test_certificate_of_the_old_replay_is_rejected():
    """The certificate the engine at 78317b9 wrote for the shared plan (its replay put the boundary's -w where
    the copy computes exp(w)), made consistent with today's manifest: the checker's own replay rebuilds exp(w)
    and rejects it."""
    old = json.loads((REG / "issue13_memo_replay_aliases_boundary.cert.json").read_text())
    forged = restamp(old)
    plan = load_plan(forged["plan"]["content"])
    res = verify(plan, refute=False)
    (row,) = [r for r in forged["steps"] if r.get("instance_of")]
    row["stage_key"] = canonical_key(plan, "main", row["node"], row["stage_end"], res.prop.facts["main"], res.exprs)
    with pytest.raises(Invalid, match="output 'o'|expression"):
        check(forged)
    assert cli("check", REG / "issue13_memo_replay_aliases_boundary.cert.json").exit_code == 1


def test_checker_refuses_a_template_stage_with_pattern_steps():
    """layer1.bwd claimed as a copy of layer2.bwd (same canonical form, every op has a step, but some of those
    steps are multi-op patterns): the engine never replays such a stage and the checker must refuse it.  The
    checker at 78317b9 accepted exactly this certificate."""
    raw = llama3_plan("llama3-8b", layers=3, cp=2, cp_style="allgather-zigzag")
    raw["dims"] = dict(raw["run_dims"])
    plan = load_plan(raw)
    res = verify(plan, refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    spans = {lab: (s, e) for s, e, lab in stages(plan.programs["spmd"])}
    (ts, te), (s, e) = spans["layer2.bwd"], spans["layer1.bwd"]
    assert any(st.pattern and ts <= st.node < te for st in res.prop.steps)
    key = canonical_key(plan, "spmd", s, e, res.prop.facts["spmd"], res.exprs)
    assert key == canonical_key(plan, "spmd", ts, te, res.prop.facts["spmd"], res.exprs)
    cert = json.loads(dump_certificate(build_certificate(res)))
    check(cert)
    rows = [r for r in cert["steps"] if not (r["program"] == "spmd" and s <= r["node"] < e)]
    at = next(k for k, r in enumerate(cert["steps"]) if r["program"] == "spmd" and s <= r["node"] < e)
    rows.insert(at, {"program": "spmd", "node": s, "op": plan.programs["spmd"].nodes[s].op, "rules": [], "out": [],
                     "instance_of": ["spmd", ts], "stage_end": e, "stage_key": key})
    cert["steps"] = rows
    with pytest.raises(Invalid, match="multi-op pattern"):
        check(cert)


# ====================================================================== class 5: send / recv
def _p2p_plan(s0_nodes, s1_nodes, out="o1", logical_in=("x", "y"), logical=None) -> dict:
    logical = logical or [{"name": "o1", "op": "neg", "inputs": ["x"]}]
    return {"tvcert_plan": 1, "name": "p2p", "dims": {"n": 4, "pp": 2}, "mesh": [["pp", "pp"]],
            "logical": {"inputs": [{"name": x, "shape": ["n"]} for x in logical_in], "nodes": logical, "outputs": ["o1"]},
            "parallel": [{"name": "s0", "stage": {"pp": 0}, "inputs": [{"name": x, "shape": ["n"]} for x in logical_in],
                          "nodes": s0_nodes, "outputs": []},
                         {"name": "s1", "stage": {"pp": 1}, "inputs": [], "nodes": s1_nodes, "outputs": [out]}],
            "inputs": {x: {"program": "s0", "local": x} for x in logical_in},
            "outputs": {"o1": {"program": "s1", "local": out}}}


def send(x, tag="t", to=1):
    return {"op": "send", "inputs": [x], "attrs": {"axis": "pp", "to": to, "tag": tag}}


def recv(name, tag="t", src=0, shape=("n",)):
    return {"name": name, "op": "recv", "inputs": [], "attrs": {"axis": "pp", "src": src, "tag": tag, "shape": list(shape)}}


NEG = {"name": "o1", "op": "neg", "inputs": ["r1"]}


def expect_reject(raw, path: str, words: str = ""):
    with pytest.raises(PlanError) as exc:
        load_plan(raw)
    assert exc.value.path == path, str(exc.value)
    assert words in str(exc.value)


def test_shared_duplicate_tag_plan_and_its_certificate_are_rejected():
    r = cli("verify", REG / "issue13_p2p_duplicate_tag.plan.json")
    assert r.exit_code == 3 and "parallel[0].nodes[1].attrs.tag" in r.output
    assert cli("run", REG / "issue13_p2p_duplicate_tag.plan.json").exit_code == 3
    r = cli("check", REG / "issue13_p2p_duplicate_tag.cert.json")
    assert r.exit_code == 3 and "parallel[0].nodes[1].attrs.tag" in r.output and "VALID" not in r.output


@pytest.mark.parametrize("name,s0,s1,path,words", [
    ("two sends, one tag", [send("x"), send("y")], [recv("r1"), NEG], "$.parallel[0].nodes[1].attrs.tag", "already sends"),
    ("three sends, one tag", [send("x"), send("y"), send("x")], [recv("r1"), NEG], "$.parallel[0].nodes[1].attrs.tag",
     "already sends"),
    ("two recvs, one send", [send("x"), send("y", "u")], [recv("r1"), recv("r2"), recv("r3", "u"), NEG],
     "$.parallel[1].nodes[1].attrs.tag", "already recvs"),
    ("recv before the second send", [send("y"), send("x")], [recv("r1"), NEG], "$.parallel[0].nodes[1].attrs.tag",
     "already sends"),
    ("recv with no send", [send("x")], [recv("r1"), recv("r2", "u"), NEG], "$.parallel[1].nodes[1].attrs.tag", "no send"),
    ("send with no recv", [send("x"), send("y", "u")], [recv("r1"), NEG], "$.parallel[0].nodes[1].attrs.tag", "no recv"),
    ("recv from the wrong stage", [send("x")], [recv("r1", src=1), NEG], "$.parallel[1].nodes[0].attrs.tag", "no send"),
    ("rank-dependent destination", [send("x", to="rank.pp+1")], [recv("r1"), NEG], "$.parallel[0].nodes[0].attrs.to",
     "depends on the rank"),
    ("destination off the mesh", [send("x", to=2)], [recv("r1"), NEG], "$.parallel[0].nodes[0].attrs.to", "outside"),
    ("recv shape differs from the sent tensor", [send("x"), send("y", "u")],
     [recv("r1"), recv("r2", "u", shape=("n/2",)), NEG], "$.parallel[1].nodes[1].attrs.shape", "local shape [4]"),
])
def test_sends_and_recvs_must_pair_one_to_one(name, s0, s1, path, words, tmp_path):
    raw = _p2p_plan(s0, s1)
    expect_reject(raw, path, words)
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(raw))
    for cmd in ("verify", "run"):
        r = cli(cmd, p)
        assert r.exit_code == 3 and path.lstrip("$.") in r.output, r.output


def test_deadlock_is_rejected():
    s0 = [recv("q", "back", src=1), send("x")]
    s1 = [recv("r1"), send("r1", "back", to=0), NEG]
    expect_reject(_p2p_plan(s0, s1), "$.parallel[0].nodes[0].attrs.tag", "deadlock")


def test_unpinned_program_cannot_send():
    raw = _p2p_plan([send("x")], [recv("r1"), NEG])
    del raw["parallel"][0]["stage"]
    expect_reject(raw, "$.parallel[0].nodes[0].attrs.axis", "not pinned")


def test_pairing_is_by_tag_not_by_order_everywhere():
    """Two messages received in the opposite order of sending: the engine, the interpreter and the checker take
    each recv's own send (one pairing, plan.p2p)."""
    s0 = [send("x", "a"), send("y", "b")]
    s1 = [recv("rb", "b"), recv("r1", "a"), NEG]
    raw = _p2p_plan(s0, s1)
    plan = load_plan(raw)
    assert plan.p2p == {("s1", 0): ("s0", 1), ("s1", 1): ("s0", 0)}
    assert run_plan(plan).equal
    cert = cert_of(raw)
    peers = {r["node"]: r["peer"] for r in cert["steps"] if r["op"] == "recv"}
    assert peers == {0: ["s0", 1], 1: ["s0", 0]}
    check(cert)
    # the same plan computing neg(y) instead: refuted by the engine and the interpreter alike
    bad = _p2p_plan(s0, [recv("r1", "b"), recv("ra", "a"), NEG])
    assert not run_plan(load_plan(bad)).equal
    assert verify(load_plan(bad)).verdict == "REFUTED"


def test_certificate_whose_pairing_differs_from_the_plan_is_rejected():
    s0 = [send("x", "a"), send("y", "b")]
    good = _p2p_plan(s0, [recv("r1", "a"), recv("r2", "b"), NEG])
    cert = cert_of(good)
    forged = copy.deepcopy(cert)
    step = next(r for r in forged["steps"] if r["op"] == "recv" and r["node"] == 0)
    step["peer"] = ["s0", 1]  # claims r1 receives y
    with pytest.raises(Invalid, match="pairs this recv with"):
        check(forged)
    # and the forgery that would make a wrong plan look right: o1 = neg(y) declared, r1 receives x
    wrong = _p2p_plan(s0, [recv("r1", "a"), recv("r2", "b"), NEG],
                      logical=[{"name": "o1", "op": "neg", "inputs": ["y"]}])
    assert verify(load_plan(wrong)).verdict == "REFUTED"
    shared = json.loads((REG / "issue13_p2p_duplicate_tag.cert.json").read_text())
    f2 = restamp(shared, wrong)
    f2["steps"] = [{"node": 0, "op": "recv", "out": [[1, []]], "peer": ["s0", 1], "program": "s1",
                    "rules": ["send_recv_preserves"]},
                   {"node": 1, "op": "recv", "out": [[0, []]], "peer": ["s0", 0], "program": "s1",
                    "rules": ["send_recv_preserves"]},
                   {"node": 2, "op": "neg", "out": [[2, []]], "program": "s1", "rules": []}]
    f2["expressions"] = [[0, "input", {"name": "x"}, []], [1, "input", {"name": "y"}, []], [2, "neg", {}, [1]]]
    with pytest.raises(Invalid, match="pairs this recv with"):
        check(f2)


# ====================================================================== correct plans keep verifying
@pytest.mark.parametrize("model,cfg", [
    ("llama3-8b", {"layers": 2, "tp": 2, "dp": 2}),
    ("llama3-8b", {"layers": 2, "pp": 2, "microbatches": 2}),
    ("deepseek-v3-16b", {"layers": 2, "tp": 2, "ep": 2}),
])
def test_generated_plans_with_stages_verify_and_their_certificates_check(model, cfg):
    opts = dict(cfg)
    if "microbatches" in opts:
        opts["mb"] = opts.pop("microbatches")
    raw = generate_plan(model, **opts)
    res = verify(load_plan(raw), refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    assert any(s.instance_of for s in res.prop.steps)  # stages were replayed
    check(json.loads(dump_certificate(build_certificate(res))))


# ====================================================================== the fuzzer's two new moves
@pytest.mark.parametrize("family", ["stage_alias", "p2p"])
def test_fuzz_families_stage_alias_and_shared_tags(family):
    """fuzz/gen.py gen_stage_alias (stages whose internal results alias a boundary, with the mutations that
    declare the boundary's value or move the alias into the copy) and gen_p2p (messages received out of order,
    sends sharing a tag, duplicated messages, swapped recv tags): no false VERIFIED or REFUTED, equal pairs
    are proved, and every plan whose sends share a tag is refused by the loader."""
    import random

    from tvcert.fuzz.gen import gen_p2p, gen_stage_alias
    from tvcert.fuzz.runner import evaluate

    gen = {"stage_alias": gen_stage_alias, "p2p": gen_p2p}[family]
    seen = set()
    for i in range(24):
        pair = gen(random.Random(f"test/{family}/{i}"), f"{family}_{i}")
        o = evaluate(pair, i)
        seen.add(pair.mutation)
        if pair.mutation in ("send_shared_tag", "send_extra_copy"):
            assert o.status == "invalid" and "attrs.tag" in o.detail, (i, o.status, o.detail)
            continue
        assert o.status == "ok", (i, o.status, o.detail)
        if not pair.perturbed:
            assert o.oracle_equal and o.verdict == "VERIFIED", (i, o.verdict)
            assert o.cert == "ok", o.cert
        else:
            assert o.oracle_equal is False and o.verdict == "REFUTED", (i, pair.mutation, o.verdict)
    assert len(seen) >= 3  # unperturbed and at least two mutations were drawn


def test_fuzz_stream_draws_the_new_families():
    from tvcert.fuzz.gen import generate

    fams = {generate(5, i).family for i in range(200)}
    assert {"stage_alias", "p2p"} <= fams


def test_first_divergence_explains_a_recv_by_its_own_send():
    """localize pairs messages as the loader does (plan.p2p): stage s2 receives tag "t" from s0 (x) and from s1
    (y, forwarded); computing neg of the one from s1 is the divergence, whichever send ran last.  (The old
    (tag, receiving program) key gave the same answer here, since a recv's value is explained numerically; this
    pins the behaviour with two same-tag messages into one stage.)"""
    from tvcert.localize import first_divergence
    for order in ("x_last", "y_last"):
        fwd = [send("y", "u", to=1), send("x", "t", to=2)]
        s0 = fwd if order == "y_last" else fwd[::-1]
        raw = {"tvcert_plan": 1, "name": "p2p3", "dims": {"n": 4, "pp": 3}, "mesh": [["pp", "pp"]],
               "logical": {"inputs": [{"name": x, "shape": ["n"]} for x in ("x", "y")],
                           "nodes": [{"name": "o1", "op": "neg", "inputs": ["x"]}], "outputs": ["o1"]},
               "parallel": [
                   {"name": "s0", "stage": {"pp": 0}, "inputs": [{"name": x, "shape": ["n"]} for x in ("x", "y")],
                    "nodes": s0, "outputs": []},
                   {"name": "s1", "stage": {"pp": 1}, "inputs": [], "outputs": [],
                    "nodes": [recv("ry", "u", src=0), send("ry", "t", to=2)]},
                   {"name": "s2", "stage": {"pp": 2}, "inputs": [], "outputs": ["o1"],
                    "nodes": [recv("rx", "t", src=0), recv("r1", "t", src=1), NEG]}],
               "inputs": {x: {"program": "s0", "local": x} for x in ("x", "y")},
               "outputs": {"o1": {"program": "s2", "local": "o1"}}}
        plan = load_plan(raw)
        res = run_plan(plan)
        assert not res.equal
        div = first_divergence(plan, res)
        assert div is not None and div.program == "s2" and div.op == "neg", (order, div)
