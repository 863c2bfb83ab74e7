"""Tests of the proof-kernel checker (orchestrator/tvcert/proofkit.py).

The real kernel must check clean; on temporary copies of Rules/ the checker must
reject a user Axiom, an Admitted proof, a spoofed axiom name (a user module that
declares its own ``Classical_Prop.classic``: only the Locate resolution catches
that it is not the standard axiom) and a manifest statement that Coq has not
proved.  Tests needing Coq are skipped only when ``coqc`` is not installed.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tvcert import proofkit

ROOT = Path(__file__).resolve().parents[1]
needs_coq = pytest.mark.skipif(
    shutil.which("coqc") is None or shutil.which("coq_makefile") is None,
    reason="coqc/coq_makefile not installed (CI installs coq + libcoq-mathcomp-*)",
)


def test_strip_comments_and_grep_patterns(tmp_path):
    text = 'Lemma a : True. (* Admitted (* nested Axiom *) *) Proof. exact I. Qed.\n'
    assert "Admitted" not in proofkit._strip_comments(text)
    (tmp_path / "Rules").mkdir()
    (tmp_path / "Rules" / "A.v").write_text(text + "Lemma b : False.\nAdmitted.\n")
    probs = proofkit.forbidden_constructs(tmp_path)
    assert len(probs) == 1 and "Admitted" in probs[0] and "A.v:3" in probs[0]


def test_manifest_is_deterministic_and_covers_tables():
    m = json.loads((ROOT / "proofs" / "manifest.json").read_text())
    assert set(m["rules"]) == set(proofkit.RULES)
    assert set(m["theorems"]) == set(proofkit.THEOREMS)
    assert proofkit.dump_manifest(m) == (ROOT / "proofs" / "manifest.json").read_text()
    for e in list(m["rules"].values()) + list(m["theorems"].values()):
        assert e["digest"] == proofkit.digest(e["statement"])


def test_manifest_rules_are_exactly_the_engine_rules():
    """Every rule the engine applies has a theorem, and the manifest binds no rule it does not apply."""
    from tvcert.kernel.rules import RULES as ENGINE_RULES

    m = json.loads((ROOT / "proofs" / "manifest.json").read_text())
    assert set(proofkit.RULES) == set(ENGINE_RULES)
    assert set(m["rules"]) == set(ENGINE_RULES)
    assert not set(proofkit.RULES) & set(proofkit.THEOREMS)


@pytest.fixture(scope="module")
def built_root():
    if shutil.which("coqc") is None or shutil.which("coq_makefile") is None:
        pytest.skip("coqc/coq_makefile not installed (CI installs coq + libcoq-mathcomp-*)")
    proofkit.build(ROOT)
    return ROOT


def _add_file(root: Path, name: str, text: str) -> None:
    (root / "Rules" / f"{name}.v").write_text(text)
    proj = root / "Rules" / "_CoqProject"
    proj.write_text(proj.read_text().rstrip("\n") + f"\n{name}.v\n")


_BAD_FILES = {
    "Bad": "Axiom cheat : False.\n"
           "Theorem uses_cheat : 1 = 2. Proof. exfalso; exact cheat. Qed.\n",
    "Spoof": "Module Classical_Prop.\n"
             "Axiom classic : forall P : Prop, P \\/ ~ P.\n"
             "End Classical_Prop.\n"
             "Theorem spoof_em : forall P : Prop, P \\/ ~ P.\n"
             "Proof. exact Classical_Prop.classic. Qed.\n",
    "RealsOk": "From Coq Require Import Reals Classical.\n"
               "Theorem real_em : (forall x : R, x + 0 = x)%R /\\ (forall P : Prop, P \\/ ~ P).\n"
               "Proof. split; [intros; ring | exact classic]. Qed.\n",
}
_ADDED_THEOREMS = {"uses_cheat": "TVCert.Bad.uses_cheat", "spoof_em": "TVCert.Spoof.spoof_em",
                   "real_em": "TVCert.RealsOk.real_em"}
_STAGE_PROOF = "Proof. by move=> h1 h2 X x r; apply: h2; apply: h1. Qed."


@pytest.fixture(scope="module")
def defective(built_root, tmp_path_factory):
    """One copy of Rules/ (with its compiled .vo files) and the manifest carrying every defect the checker must
    name -- a user Axiom, an Admitted proof, a spoofed axiom name, a statement Coq has not proved, a tampered
    digest -- plus one sound theorem on the standard real axioms; checked once (each check loads the whole
    kernel), each test reads its own defect from the one report.  The defects are independent: each names its
    own entry."""
    root = tmp_path_factory.mktemp("defective")
    shutil.copytree(built_root / "Rules", root / "Rules",
                    ignore=shutil.ignore_patterns("Makefile.coq*", ".Makefile.coq.d", ".build.lock"))
    (root / "proofs").mkdir()
    for name, text in _BAD_FILES.items():
        _add_file(root, name, text)
    stage = root / "Rules" / "Stage.v"
    src = stage.read_text()
    assert _STAGE_PROOF in src
    stage.write_text(src.replace(_STAGE_PROOF, "Proof. Admitted."))
    proofkit.build(root)
    m = json.loads((built_root / "proofs" / "manifest.json").read_text())
    sts = proofkit.printed_statements(root, list(_ADDED_THEOREMS.values()))
    for key, thm in _ADDED_THEOREMS.items():
        m["theorems"][key] = {"theorem": thm, "statement": sts[thm], "digest": proofkit.digest(sts[thm])}
    e = m["rules"]["partial_add"]
    assert "E1 x + E2 x" in e["statement"]
    e["statement"] = e["statement"].replace("E1 x + E2 x", "E1 x - E2 x")
    e["digest"] = proofkit.digest(e["statement"])      # digest consistent, statement false
    m["rules"]["partial_neg"]["digest"] = "sha256:" + "0" * 64  # tampered digest
    del m["rules"]["partial_div"]                                # a rule the engine applies, unbound
    mp = root / "proofs" / "manifest.json"
    mp.write_text(proofkit.dump_manifest(m))
    rep = proofkit.check(root, mp)
    return rep, "\n".join(rep.problems)


@needs_coq
def test_real_kernel_checks_clean(built_root):
    # coqchk over the same .vo files is `make test`'s first step (proofkit check --coqchk); repeating its
    # ~2 minutes here would add nothing.  This is the manifest, Admitted and axiom check, in-process.
    rep = proofkit.check(built_root, built_root / "proofs" / "manifest.json")
    assert rep.ok, rep.format()
    assert len(rep.entries) == len(proofkit.RULES) + len(proofkit.THEOREMS)
    for e in rep.entries:
        assert set(e.axioms) <= proofkit.ALLOWED_AXIOMS


@needs_coq
def test_generated_manifest_matches_checked_in(built_root):
    gen = proofkit.generate_manifest(built_root)
    assert proofkit.dump_manifest(gen) == (built_root / "proofs" / "manifest.json").read_text()


@needs_coq
def test_rejects_user_axiom(defective):
    rep, text = defective
    assert not rep.ok
    assert "forbidden construct 'Axiom'" in text
    assert "relies on axiom TVCert.Bad.cheat" in text
    assert not [e for e in rep.entries if e.key == "uses_cheat"][0].ok


@needs_coq
def test_rejects_admitted(defective):
    rep, text = defective
    assert "forbidden construct 'Admitted'" in text
    assert "theorem 'stage_compose'" in text and "relies on axiom TVCert.Stage.stage_compose" in text
    assert not [e for e in rep.entries if e.key == "stage_compose"][0].ok


@needs_coq
def test_rejects_spoofed_axiom(defective):
    rep, _ = defective
    spoof = [p for p in rep.problems if "spoof_em" in p and "relies on axiom" in p]
    assert spoof, rep.format()
    # printed as a suffix that looks like the standard axiom; Locate exposes it
    assert "TVCert.Spoof.Classical_Prop.classic" in spoof[0]
    assert "(printed as " in spoof[0] and "classic)" in spoof[0]
    entry = [e for e in rep.entries if e.key == "spoof_em"][0]
    assert entry.axioms == ["TVCert.Spoof.Classical_Prop.classic"]


@needs_coq
def test_accepts_standard_real_axioms(defective):
    rep, _ = defective
    entry = [e for e in rep.entries if e.key == "real_em"][0]
    assert entry.ok, rep.format()
    assert "Coq.Logic.Classical_Prop.classic" in entry.axioms
    assert "Coq.Reals.ClassicalDedekindReals.sig_forall_dec" in entry.axioms
    assert set(entry.axioms) <= proofkit.ALLOWED_AXIOMS
    # the only problem naming it is the entry unknown to the proofkit tables
    assert [p for p in rep.problems if "real_em" in p] == [
        "manifest theorems has unknown entry 'real_em' (not in proofkit tables)"]


@needs_coq
def test_rejects_statement_mismatch(defective):
    rep, text = defective
    assert "rule 'partial_add' (TVCert.Partial.partial_add): statement not proved as pinned" in text
    assert "rule 'partial_neg' (TVCert.Partial.partial_neg): digest does not match" in text
    # the other entries were still checked
    assert [e for e in rep.entries if e.key == "partial_sub"][0].ok


@needs_coq
def test_rejects_a_missing_rule_entry(defective):
    _, text = defective
    assert "manifest rules lacks 'partial_div'" in text


@needs_coq
def test_cli_check_exit_codes(built_root, tmp_path, capsys):
    # exit 0 on the real kernel is `make test`'s first step (python -m tvcert.proofkit check --coqchk)
    missing = tmp_path / "no-manifest.json"
    assert proofkit.main(["check", "--root", str(built_root), "--manifest", str(missing)]) == 1
    assert f"cannot read manifest {missing}" in capsys.readouterr().err
