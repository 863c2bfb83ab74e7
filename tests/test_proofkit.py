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


@pytest.fixture
def copy_root(built_root, tmp_path):
    """A copy of Rules/ (with its compiled .vo files) and the manifest."""
    shutil.copytree(built_root / "Rules", tmp_path / "Rules",
                    ignore=shutil.ignore_patterns("Makefile.coq*", ".Makefile.coq.d"))
    (tmp_path / "proofs").mkdir()
    shutil.copy2(built_root / "proofs" / "manifest.json", tmp_path / "proofs" / "manifest.json")
    return tmp_path


def _add_file(root: Path, name: str, text: str) -> None:
    (root / "Rules" / f"{name}.v").write_text(text)
    proj = root / "Rules" / "_CoqProject"
    proj.write_text(proj.read_text().rstrip("\n") + f"\n{name}.v\n")


def _add_manifest_theorem(root: Path, key: str, thm: str) -> Path:
    mp = root / "proofs" / "manifest.json"
    m = json.loads(mp.read_text())
    proofkit.build(root)
    st = proofkit.printed_statements(root, [thm])[thm]
    m["theorems"][key] = {"theorem": thm, "statement": st, "digest": proofkit.digest(st)}
    mp.write_text(proofkit.dump_manifest(m))
    return mp


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
def test_rejects_user_axiom(copy_root):
    _add_file(copy_root, "Bad", "Axiom cheat : False.\n"
              "Theorem uses_cheat : 1 = 2. Proof. exfalso; exact cheat. Qed.\n")
    mp = _add_manifest_theorem(copy_root, "uses_cheat", "TVCert.Bad.uses_cheat")
    rep = proofkit.check(copy_root, mp)
    assert not rep.ok
    text = "\n".join(rep.problems)
    assert "forbidden construct 'Axiom'" in text
    assert "relies on axiom TVCert.Bad.cheat" in text


@needs_coq
def test_rejects_admitted(copy_root):
    stage = copy_root / "Rules" / "Stage.v"
    src = stage.read_text()
    proof = "Proof. by move=> h1 h2 X x r; apply: h2; apply: h1. Qed."
    assert proof in src
    stage.write_text(src.replace(proof, "Proof. Admitted."))
    rep = proofkit.check(copy_root, copy_root / "proofs" / "manifest.json")
    assert not rep.ok
    text = "\n".join(rep.problems)
    assert "forbidden construct 'Admitted'" in text
    assert "theorem 'stage_compose'" in text and "relies on axiom TVCert.Stage.stage_compose" in text


@needs_coq
def test_rejects_spoofed_axiom(copy_root):
    _add_file(copy_root, "Spoof",
              "Module Classical_Prop.\n"
              "Axiom classic : forall P : Prop, P \\/ ~ P.\n"
              "End Classical_Prop.\n"
              "Theorem spoof_em : forall P : Prop, P \\/ ~ P.\n"
              "Proof. exact Classical_Prop.classic. Qed.\n")
    mp = _add_manifest_theorem(copy_root, "spoof_em", "TVCert.Spoof.spoof_em")
    rep = proofkit.check(copy_root, mp)
    assert not rep.ok
    spoof = [p for p in rep.problems if "spoof_em" in p and "relies on axiom" in p]
    assert spoof, rep.format()
    # printed as a suffix that looks like the standard axiom; Locate exposes it
    assert "TVCert.Spoof.Classical_Prop.classic" in spoof[0]
    assert "(printed as " in spoof[0] and "classic)" in spoof[0]
    entry = [e for e in rep.entries if e.key == "spoof_em"][0]
    assert entry.axioms == ["TVCert.Spoof.Classical_Prop.classic"]


@needs_coq
def test_accepts_standard_real_axioms(copy_root):
    _add_file(copy_root, "RealsOk",
              "From Coq Require Import Reals Classical.\n"
              "Theorem real_em : (forall x : R, x + 0 = x)%R /\\ (forall P : Prop, P \\/ ~ P).\n"
              "Proof. split; [intros; ring | exact classic]. Qed.\n")
    mp = _add_manifest_theorem(copy_root, "real_em", "TVCert.RealsOk.real_em")
    rep = proofkit.check(copy_root, mp)
    entry = [e for e in rep.entries if e.key == "real_em"][0]
    assert entry.ok, rep.format()
    assert "Coq.Logic.Classical_Prop.classic" in entry.axioms
    assert "Coq.Reals.ClassicalDedekindReals.sig_forall_dec" in entry.axioms
    assert set(entry.axioms) <= proofkit.ALLOWED_AXIOMS
    # the only problem is the entry unknown to the proofkit tables
    assert rep.problems == ["manifest theorems has unknown entry 'real_em' (not in proofkit tables)"]


@needs_coq
def test_rejects_statement_mismatch(copy_root):
    mp = copy_root / "proofs" / "manifest.json"
    m = json.loads(mp.read_text())
    e = m["rules"]["partial_add"]
    assert "E1 x + E2 x" in e["statement"]
    e["statement"] = e["statement"].replace("E1 x + E2 x", "E1 x - E2 x")
    e["digest"] = proofkit.digest(e["statement"])      # digest consistent, statement false
    m["rules"]["partial_neg"]["digest"] = "sha256:" + "0" * 64  # tampered digest
    mp.write_text(proofkit.dump_manifest(m))
    rep = proofkit.check(copy_root, mp)
    assert not rep.ok
    text = "\n".join(rep.problems)
    assert "rule 'partial_add' (TVCert.Partial.partial_add): statement not proved as pinned" in text
    assert "rule 'partial_neg' (TVCert.Partial.partial_neg): digest does not match" in text
    # the other entries were still checked
    assert [e for e in rep.entries if e.key == "partial_sub"][0].ok


@needs_coq
def test_cli_check_exit_codes(copy_root, capsys):
    assert proofkit.main(["check", "--root", str(copy_root)]) == 0
    mp = copy_root / "proofs" / "manifest.json"
    m = json.loads(mp.read_text())
    del m["rules"]["partial_neg"]
    mp.write_text(proofkit.dump_manifest(m))
    assert proofkit.main(["check", "--root", str(copy_root)]) == 1
    assert "manifest rules lacks 'partial_neg'" in capsys.readouterr().err
