"""The certificate format (shared by the writer and the checker): schema and small helpers."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from ..plan import Placement, parse_placement

CERT_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PlanRef(_Strict):
    name: str
    digest: str = Field(description="sha256 of the canonical plan JSON")
    content: dict[str, Any] = Field(description="the plan itself, so the certificate replays alone")


class RuleRef(_Strict):
    theorem: str
    digest: str


class ManifestRef(_Strict):
    digest: str = Field(description="sha256 of proofs/manifest.json")
    rules: dict[str, RuleRef] = Field(description="every rule id the proof uses -> its theorem and statement digest")


class Stage(_Strict):
    id: str
    program: str
    hash: str
    instance_of: Optional[str] = None


class Step(_Strict):
    program: str
    node: int = Field(ge=0)
    op: str
    rules: list[str]
    out: list[tuple[int, list[str]]] = Field(description="[expression id, per-axis placement] per output")
    peer: Optional[tuple[str, int]] = None
    pattern: Optional[list[int]] = Field(None, description="multi-op rules: the ops the premises span")
    instance_of: Optional[tuple[str, int]] = Field(None, description="a memoized stage [node, stage_end) replayed from "
                                                                     "the template stage starting at [program, node]")
    stage_end: Optional[int] = None
    stage_key: Optional[str] = None


class Reduction(_Strict):
    theorem: str
    kind: str
    dependency_map: str
    argument_map: str
    witness: list[tuple[int, str]] = Field(description="leaf expression -> SMT variable (injective up to proved equality)")


class Obligation(_Strict):
    lhs: int
    rhs: int
    answer: str
    smt: str
    reduction: Reduction


class OutputMatch(_Strict):
    name: str
    program: str
    local: str
    expr: int
    placement: list[str]


class Certificate(_Strict):
    tvcert_certificate: StrictInt = Field(description="certificate format version")
    tool: str
    plan: PlanRef
    manifest: ManifestRef
    stages: list[Stage]
    expressions: list[tuple[int, str, dict[str, Any], list[int]]]
    steps: list[Step]
    obligations: list[Obligation]
    outputs: list[OutputMatch]
    size_checks: list["Certificate"] = Field(
        default_factory=list, description="a proof that counts elements (kernel/sizes.py) is redone at a second "
                                          "instantiation of the dims: that proof's certificate, checked the same way")


Certificate.model_rebuild()


def certificate_schema() -> dict:
    s = Certificate.model_json_schema()
    if "$ref" in s:  # recursive (size_checks): the top level is the Certificate definition itself
        s = {**s["$defs"][s.pop("$ref").rsplit("/", 1)[-1]], "$defs": s["$defs"]}
    s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return s


def stage_table(raw: dict) -> list[dict]:
    """One stage per program, with the hash of its canonical text (memoized layers would point at an instance)."""
    import hashlib
    import json

    out = []
    for prog in raw.get("parallel", []):
        body = json.dumps(prog, sort_keys=True, separators=(",", ":"))
        name = prog.get("name", "main")
        out.append({"id": name, "program": name, "hash": "sha256:" + hashlib.sha256(body.encode()).hexdigest(),
                    "instance_of": None})
    return out


def placement_texts(pl) -> list[str]:
    return [str(p) for p in pl]


def parse_placements(texts: list[str]) -> tuple[Placement, ...]:
    return tuple(parse_placement(t) for t in texts)


def manifest_path() -> Path:
    return Path(__file__).resolve().parents[3] / "proofs" / "manifest.json"


def rule_digests(manifest: dict, used: list[str]) -> dict[str, dict[str, str]]:
    table = {**manifest.get("theorems", {}), **manifest.get("rules", {})}
    out = {}
    for r in used:
        if r not in table:
            raise ValueError(f"rule {r!r} is not in the proof manifest: it has no proved theorem")
        out[r] = {"theorem": table[r]["theorem"], "digest": table[r]["digest"]}
    return out
