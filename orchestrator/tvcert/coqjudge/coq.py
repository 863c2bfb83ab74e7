"""Run coqc on an emitted plan file and check ``Print Assumptions plan_verified``.

The axioms allowed are proofkit's :data:`~tvcert.proofkit.ALLOWED_AXIOMS`, resolved to fully
qualified names with ``Locate`` exactly as proofkit does for the rule theorems.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import proofkit


@dataclass
class CoqResult:
    ok: bool
    message: str
    seconds: float = 0.0
    axioms: list[str] = field(default_factory=list)


def rules_root() -> Path:
    return proofkit._default_root()


def coqc_available() -> bool:
    return shutil.which("coqc") is not None


def build_rules(root: Path | None = None) -> None:
    """Build Rules/ (IR included) with proofkit's build (raises proofkit.ProofError)."""
    proofkit.build(root or rules_root())


def check_text(text: str, root: Path | None = None, timeout: int = 1800) -> CoqResult:
    """coqc the emitted text (as module TVCertPlan in a temp dir) and check its assumptions."""
    root = Path(root or rules_root())
    if not coqc_available():
        return CoqResult(False, "coqc not found on PATH")
    try:
        build_rules(root)
    except proofkit.ProofError as exc:
        return CoqResult(False, f"Rules/ does not build: {exc}")
    body = text.rstrip() + "\n\nPrint Assumptions plan_verified.\n"
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tvcert_coq_") as td:
        f = Path(td) / "TVCertPlan.v"
        f.write_text(body)
        try:
            p = subprocess.run(["coqc", "-q", "-w", proofkit.COQ_WARNINGS, "-Q",
                                str(proofkit._rules_dir(root).resolve()), proofkit.LOGICAL_ROOT, str(f)],
                               cwd=td, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return CoqResult(False, f"coqc timed out after {timeout}s", time.monotonic() - t0)
    secs = time.monotonic() - t0
    out = p.stdout + p.stderr
    if p.returncode != 0:
        err = out[out.find("Error"):] if "Error" in out else out
        return CoqResult(False, "coqc rejected the file: " + " ".join(err.split())[:1500], secs)
    i = out.find("Axioms:")
    if "Closed under the global context" in out and i < 0:
        return CoqResult(True, "coqc accepted plan_verified (closed under the global context)", secs)
    if i < 0:
        return CoqResult(False, "unexpected Print Assumptions output: " + out[:500], secs)
    names, unsafe = proofkit._parse_assumptions(out[i:])
    if unsafe:
        return CoqResult(False, "unsafe assumptions: " + ", ".join(unsafe), secs)
    try:
        fq = proofkit.resolve_names(root, sorted(set(names)))
    except proofkit.ProofError as exc:
        return CoqResult(False, str(exc), secs)
    bad = [fq[n] for n in names if fq[n] not in proofkit.ALLOWED_AXIOMS]
    if bad:
        return CoqResult(False, "plan_verified rests on axioms outside the allowlist: " + ", ".join(bad), secs,
                         [fq[n] for n in names])
    return CoqResult(True, "coqc accepted plan_verified; axioms: " + (", ".join(fq[n] for n in names) or "none"),
                     secs, [fq[n] for n in names])


def check_file(path: str | Path, root: Path | None = None) -> CoqResult:
    return check_text(Path(path).read_text(), root)
