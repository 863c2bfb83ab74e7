"""Certificates: every VERIFIED plan yields one the independent checker accepts; tampering is caught."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvcert.certificate.check import Invalid, check_certificate
from tvcert.certificate.emit import build_certificate, dump_certificate
from tvcert.certificate.format import Certificate, certificate_schema
from tvcert.cli import main
from tvcert.engine.verify import verify
from tvcert.generators.plans import llama3_plan
from tvcert.plan import load_plan

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"


def cert_for(plan_obj) -> dict:
    res = verify(load_plan(plan_obj), refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    return json.loads(dump_certificate(build_certificate(res)))


@pytest.fixture(scope="module")
def mlp_cert() -> dict:
    return cert_for(json.loads((EX / "mlp_tp2.json").read_text()))


@pytest.fixture(scope="module")
def zero_cert() -> dict:
    p = llama3_plan("llama3-8b", layers=1, tp=2, dp=2, zero=1)
    p["dims"] = dict(p["run_dims"])
    return cert_for(p)


@pytest.fixture(scope="module")
def smt_cert() -> dict:
    return cert_for(json.loads((EX / "mlp_tp2_rewritten.json").read_text()))


def check(cert: dict, **kw):
    return check_certificate(Certificate.model_validate(cert), **kw)


@pytest.mark.parametrize("solver", [("z3",), ("cvc5",), ("z3", "cvc5")])
def test_example_certificate_is_valid_with_each_solver(mlp_cert, solver):
    res = check(mlp_cert, solvers=solver)
    assert res.steps > 0 and res.outputs == 5


def test_generated_plan_certificate_is_valid_with_both_solvers(zero_cert):
    check(zero_cert, solvers=("z3", "cvc5"))


def test_smt_obligations_are_replayed_with_both_solvers(smt_cert):
    assert smt_cert["obligations"], "(1-h)(1+h) = 1-h^2 needs an SMT obligation"
    res = check(smt_cert, solvers=("z3", "cvc5"))
    assert res.obligations == len(smt_cert["obligations"])


@pytest.mark.parametrize("cfg", [{"tp": 2, "sp": True}, {"cp": 2}, {"tp": 2, "dp": 2, "mb": 2}])
def test_generated_plans_certify(cfg):
    p = llama3_plan("llama3-8b", layers=1, **cfg)
    p["dims"] = dict(p["run_dims"])
    check(cert_for(p))


def test_certificates_are_deterministic():
    p = json.loads((EX / "mlp_tp2.json").read_text())
    a = dump_certificate(build_certificate(verify(load_plan(p), refute=False)))
    b = dump_certificate(build_certificate(verify(load_plan(p), refute=False)))
    assert a == b


def test_cli_emit_and_check(tmp_path):
    cert = tmp_path / "c.json"
    r = CliRunner().invoke(main, ["verify", str(EX / "mlp_tp2.json"), "--emit-cert", str(cert), "-q"])
    assert r.exit_code == 0 and cert.exists(), r.output
    r = CliRunner().invoke(main, ["check", str(cert), "--plan", str(EX / "mlp_tp2.json"), "--solver", "both"])
    assert r.exit_code == 0 and "VALID" in r.output, r.output
    bad = tmp_path / "bad.json"
    r = CliRunner().invoke(main, ["verify", str(EX / "mlp_tp2_no_allreduce.json"), "--emit-cert", str(bad), "-q"])
    assert r.exit_code == 1 and not bad.exists() and "no certificate written" in r.output


def expect_invalid(cert: dict, words: str):
    with pytest.raises(Invalid, match=words):
        check(cert)


def test_tamper_changed_fact(mlp_cert):
    c = copy.deepcopy(mlp_cert)
    i = next(k for k, s in enumerate(c["steps"]) if s["out"][0][1] == ["Shard(1)"])
    c["steps"][i]["out"][0][1] = ["Shard(0)"]
    expect_invalid(c, f"step {i}.*conclude")


def test_tamper_rule_outside_side_condition(mlp_cert):
    # claim the column-parallel matmul was row-parallel: its premises (Shard on the contraction dim) do not hold
    c = copy.deepcopy(mlp_cert)
    i = next(k for k, s in enumerate(c["steps"]) if s["rules"] == ["matmul_col_parallel"])
    c["steps"][i]["rules"] = ["matmul_row_parallel"]
    c["steps"][i]["out"][0][1] = ["Partial(sum)"]
    expect_invalid(c, "applicable rules are \\['matmul_col_parallel'\\]")


def test_tamper_step_removed(mlp_cert):
    c = copy.deepcopy(mlp_cert)
    del c["steps"][2]
    expect_invalid(c, "no fact yet|has no fact")


def test_tamper_step_reordered(mlp_cert):
    c = copy.deepcopy(mlp_cert)
    c["steps"][1], c["steps"][4] = c["steps"][4], c["steps"][1]
    expect_invalid(c, "premise .* has no fact yet")


def test_tamper_obligation_made_trivial(smt_cert):
    c = copy.deepcopy(smt_cert)
    c["obligations"][0]["smt"] = "(set-logic QF_LRA)\n(assert false)\n(check-sat)\n"
    expect_invalid(c, "not proved equal|not one the proof needs")


def test_tamper_unknown_rule(mlp_cert):
    c = copy.deepcopy(mlp_cert)
    c["steps"][0]["rules"] = ["magic_rule"]
    expect_invalid(c, "magic_rule")
    c = copy.deepcopy(mlp_cert)
    c["manifest"]["rules"]["magic_rule"] = {"theorem": "TVCert.X.magic", "digest": "sha256:00"}
    expect_invalid(c, "magic_rule")


def test_tamper_multi_op_pattern():
    c = cert_for(json.loads((EX / "vocab_parallel_embedding.json").read_text()))
    check(c, solvers=("z3", "cvc5"))
    i = next(k for k, s in enumerate(c["steps"]) if s.get("pattern"))
    bad = copy.deepcopy(c)
    bad["steps"][i]["pattern"] = bad["steps"][i]["pattern"][1:]
    expect_invalid(bad, "matches ops")
    bad = copy.deepcopy(c)
    bad["steps"][i]["rules"] = ["ew_binary_replicate"]
    expect_invalid(bad, "multi-op rule|not cited")


@pytest.fixture(scope="module")
def layered_cert() -> dict:
    p = llama3_plan("llama3-8b", layers=3, tp=2, pp=1)
    p["dims"] = dict(p["run_dims"])
    return cert_for(p)


def test_memoized_stages_are_stored_once_and_replayed(layered_cert):
    inst = [s for s in layered_cert["steps"] if s.get("instance_of")]
    # layers 1 and 2, forward and backward, replayed from layer 0's; and equal-shaped AdamW updates
    assert len(inst) >= 4
    assert all(s["out"] == [] and s["rules"] == [] for s in inst)
    res = check(layered_cert, solvers=("z3", "cvc5"))
    assert res.outputs > 0
    assert "stage_repeat" in layered_cert["manifest"]["rules"]


def test_tamper_memoized_stage(layered_cert):
    i = next(k for k, s in enumerate(layered_cert["steps"]) if s.get("instance_of"))
    bad = copy.deepcopy(layered_cert)
    bad["steps"][i]["stage_key"] = "sha256:" + "0" * 64
    expect_invalid(bad, "canonical form")
    bad = copy.deepcopy(layered_cert)
    bad["steps"][i]["stage_end"] -= 1
    expect_invalid(bad, "not a memoizable stage")
    bad = copy.deepcopy(layered_cert)
    j = next(k for k, s in enumerate(bad["steps"]) if s.get("instance_of") and s["op"] != bad["steps"][i]["op"])
    bad["steps"][i]["instance_of"] = bad["steps"][j]["instance_of"]  # the backward template for a forward stage
    expect_invalid(bad, "canonical form|not a memoizable|not been derived")
    bad = copy.deepcopy(layered_cert)
    del bad["steps"][i]
    expect_invalid(bad, "no fact")


def test_tamper_manifest_digest(mlp_cert):
    c = copy.deepcopy(mlp_cert)
    c["manifest"]["digest"] = "sha256:" + "0" * 64
    expect_invalid(c, "manifest digest mismatch")


def test_tamper_rule_statement_digest(mlp_cert):
    c = copy.deepcopy(mlp_cert)
    rid = next(iter(c["manifest"]["rules"]))
    c["manifest"]["rules"][rid]["digest"] = "sha256:" + "1" * 64
    expect_invalid(c, f"rule '{rid}'")


def test_tamper_plan_edited_after_certification(mlp_cert, tmp_path):
    p = json.loads((EX / "mlp_tp2.json").read_text())
    p["dims"]["b"] = 8
    f = tmp_path / "p.json"
    f.write_text(json.dumps(p))
    with pytest.raises(Invalid, match="plan hash mismatch"):
        check(mlp_cert, plan_path=f)
    c = copy.deepcopy(mlp_cert)
    c["plan"]["content"]["dims"]["b"] = 8
    expect_invalid(c, "plan hash mismatch")


def test_tamper_reduction_witness_not_injective(smt_cert):
    c = copy.deepcopy(smt_cert)
    ob = next(o for o in c["obligations"] if len({v for _, v in o["reduction"]["witness"]}) >= 2)
    w = ob["reduction"]["witness"]
    w[1][1] = w[0][1]  # two distinct leaves share one variable
    expect_invalid(c, "witness")


def test_truncated_and_malformed_certificates_exit_3(mlp_cert, tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps(mlp_cert)[:500])
    r = CliRunner().invoke(main, ["check", str(f)])
    assert r.exit_code == 3 and "not valid JSON" in r.output
    f.write_text(json.dumps({"tvcert_certificate": 1, "steps": "x"}))
    r = CliRunner().invoke(main, ["check", str(f)])
    assert r.exit_code == 3 and "$." in r.output and "Traceback" not in r.output
    f.write_text("[]")
    r = CliRunner().invoke(main, ["check", str(f)])
    assert r.exit_code == 3


def _paths(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "content":
                continue
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))
    else:
        yield prefix


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_single_field_mutations_are_rejected(mlp_cert, data):
    # "tool" (the writer's version) is informational, at the top and in each nested size_checks certificate
    paths = [p for p in _paths(mlp_cert) if p[0] != "tool" and not (p[0] == "size_checks" and p[2] == "tool")]
    path = data.draw(st.sampled_from(paths))
    c = copy.deepcopy(mlp_cert)
    node = c
    for k in path[:-1]:
        node = node[k]
    old = node[path[-1]]
    if isinstance(old, bool):
        new = not old
    elif isinstance(old, int):
        new = old + data.draw(st.sampled_from([1, -1, 7]))
    elif isinstance(old, str):
        new = old + data.draw(st.sampled_from(["x", "0", " "]))
    else:
        new = "tampered"
    node[path[-1]] = new
    try:
        cert = Certificate.model_validate(c)
    except Exception:
        return  # rejected as unreadable: fine
    with pytest.raises(Invalid):
        check_certificate(cert)


def test_checker_does_not_import_the_engine():
    code = ("import sys, tvcert.certificate.check as c; "
            "bad = [m for m in sys.modules if m.startswith('tvcert.engine') or m.startswith('torch')]; "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT / "orchestrator"), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == ""


def test_certificate_schema_published():
    s = certificate_schema()
    assert "steps" in s["properties"]
    r = CliRunner().invoke(main, ["schema", "--certificate"])
    assert r.exit_code == 0 and json.loads(r.output)["title"] == "Certificate"
