"""The Coq judge as the CLI uses it: emit, write (temp file + rename), coqc, verdict text."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .coq import check_text, coqc_available
from .emit import NotCovered, emit, probe_rules, probe_uncovered

COQ_CHECKED = "VERIFIED (Coq-checked)"
PY_CHECKED = "VERIFIED (Python-checked)"


@dataclass
class Judgement:
    status: str                 # "coq-checked" | "outside" | "rejected" | "unavailable"
    message: str
    uncovered: list[str] = field(default_factory=list)
    seconds: float = 0.0
    file: str | None = None

    @property
    def coq_checked(self) -> bool:
        return self.status == "coq-checked"

    def as_json(self) -> dict:
        return {"status": self.status, "message": self.message, "uncovered": self.uncovered,
                "coqc_seconds": round(self.seconds, 2), "file": self.file}


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _summary(items, shown: int = 8) -> str:
    """The uncovered steps grouped by op and reason (first node named), in the order the emitter met them
    (plan inputs, the logical graph, then the program): the first blocker comes first."""
    groups: dict[tuple[str, str], list] = {}
    for u in items:
        groups.setdefault((u.op, u.why), []).append(u)
    rows = list(groups.items())
    out = [f"{op} x{len(us)} ({why}; first {us[0].where}:{us[0].node})" if len(us) > 1 else str(us[0])
           for (op, why), us in rows[:shown]]
    return "; ".join(out) + (f"; ... {len(rows) - shown} more kinds" if len(rows) > shown else "")


def _rules_note(plan) -> str:
    """How far the fact search gets over the steps that have a Coq term, and the first steps it cannot derive."""
    k, n, missing = probe_rules(plan)
    if not missing:
        return ""
    return f"; rules: {k} of {n} program nodes get a fact, no rule yet for: {_summary(missing, 4)}"


def judge(plan, out_path: str | Path | None = None) -> Judgement:
    """Emit the plan's Coq theorem (to ``out_path`` if given) and have coqc check it.

    Raises OSError when ``out_path`` cannot be written (the CLI reports it as bad input)."""
    try:
        text, _, _ = emit(plan)
    except NotCovered as exc:
        items = [str(u) for u in exc.items]
        cov = f" ({exc.coverage})" if exc.coverage else ""
        seen = {(u.op, u.why) for u in exc.items}
        behind = [u for u in probe_uncovered(plan) if (u.op, u.why) not in seen]
        more = f"; behind them: {_summary(behind)}" if behind else ""
        return Judgement("outside", f"{PY_CHECKED}: {len(items)} step(s) outside the Coq fragment, no Coq theorem "
                                    "emitted: " + _summary(exc.items) + cov + more + _rules_note(plan), items)
    if not coqc_available():
        if out_path is not None:
            _write_atomic(Path(out_path), text)
        return Judgement("unavailable", f"{PY_CHECKED}: coqc not found, the emitted theorem was not checked"
                         + (f" (written to {out_path})" if out_path else ""), [], 0.0,
                         str(out_path) if out_path else None)
    r = check_text(text)
    if not r.ok:
        return Judgement("rejected", f"Coq did NOT accept the emitted theorem (no file written): {r.message}", [],
                         r.seconds)
    if out_path is not None:
        _write_atomic(Path(out_path), text)
    where = f"; theorem plan_verified written to {out_path}" if out_path else ""
    return Judgement("coq-checked", f"{COQ_CHECKED}: {r.message}, coqc {r.seconds:.1f} s{where}", [], r.seconds,
                     str(out_path) if out_path else None)


def verify_judgement(verdict: str, plan, out_path) -> Judgement:
    """``tvcert verify --emit-coq``: only a VERIFIED plan gets a Coq file."""
    if verdict != "VERIFIED":
        return Judgement("not-verified", f"no Coq file written: the verdict is {verdict}, not VERIFIED")
    return judge(plan, out_path)


def check_judgement(cert, plan_path) -> Judgement:
    """``tvcert check --coq``: the certificate's plan (or --plan) judged by Coq."""
    from ..plan import load_plan

    plan = load_plan(plan_path if plan_path else cert.plan.content, check_run_dims=False)
    return judge(plan)
