"""Writing certificates from a VERIFIED result (untrusted side: it only records)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .. import __version__
from ..engine.verify import VERIFIED, Result
from ..plan import plan_digest
from .format import CERT_VERSION, encode_bigints, manifest_path, placement_texts, rule_digests, stage_table


def build_certificate(res: Result, manifest: Path | None = None) -> dict[str, Any]:
    if res.verdict != VERIFIED:
        raise ValueError("certificates are only written for VERIFIED results")
    plan = res.plan
    mpath = manifest or manifest_path()
    mtext = mpath.read_bytes()
    manifest_json = json.loads(mtext)
    used = sorted({r for s in res.prop.steps for r in s.rules} | _equality_rules(res))
    steps = []
    for s in res.prop.steps:
        op = plan.programs[s.program].nodes[s.node].op
        if s.instance_of is not None:  # a memoized stage: one row for the whole stage, no per-op facts
            last = steps[-1] if steps else None
            if last and last.get("instance_of") and last["program"] == s.program and last["node"] == s.stage_start:
                last["stage_end"] = s.node + 1  # the same stage: one row
                continue
            steps.append({"program": s.program, "node": s.node, "op": op, "rules": [], "out": [],
                          "instance_of": list(s.instance_of), "stage_end": s.node + 1, "stage_key": s.stage_key})
            continue
        row = {"program": s.program, "node": s.node, "op": op,
               "rules": s.rules, "out": [[f.expr, placement_texts(f.pl)] for f in s.facts]}
        if s.peer:
            row["peer"] = s.peer
        if s.pattern:
            row["pattern"] = s.pattern
        steps.append(row)
    outputs = []
    for m in res.matches:
        b = plan.outputs[m.name]
        f = res.prop.facts[b.program][b.local]
        outputs.append({"name": m.name, "program": b.program, "local": b.local, "expr": f.expr,
                        "placement": placement_texts(f.pl)})
    obligations = [{"lhs": o.lhs, "rhs": o.rhs, "answer": o.answer, "smt": o.smt,
                    "reduction": {"theorem": "shape_reduction_corrected", "kind": "elementwise",
                                  "dependency_map": "broadcast identity on both sides",
                                  "argument_map": "identity on leaves",
                                  "witness": [[leaf, v] for leaf, v in o.leaf_vars]}}
                   for o in res.prover.obligations]
    cert = {
        "tvcert_certificate": CERT_VERSION,
        "tool": f"tvcert {__version__}",
        "plan": {"name": plan.name, "digest": plan_digest(plan.raw), "content": plan.raw},
        "manifest": {"digest": "sha256:" + hashlib.sha256(mtext).hexdigest(),
                     "rules": rule_digests(manifest_json, used)},
        "stages": stage_table(plan.raw),
        "expressions": encode_bigints(res.exprs.export()),  # exact constants may exceed 64 bits
        "steps": steps,
        "obligations": obligations,
        "outputs": outputs,
    }
    if res.size_results:  # the same plan proved at the second instantiation of its dims (engine/sizes.py)
        cert["size_checks"] = [build_certificate(r, manifest) for r in res.size_results]
    return cert


def _equality_rules(res: Result) -> set[str]:
    extra = {"stage_repeat"} if any(s.instance_of is not None for s in res.prop.steps) else set()
    return set(res.prover.used) | extra


def dump_certificate(cert: dict) -> str:
    """Deterministic bytes (sorted keys), compact separators: a 405B-layer certificate is tens of MB."""
    return json.dumps(cert, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n"
