"""The certificate format (shared by the writer and the checker): schema and small helpers."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from ..plan import Placement, parse_placement

CERT_VERSION = 2  # 2: integers outside 64 bits in the expression table are written {"$bigint": "digits"}
SUPPORTED_VERSIONS = (1, 2)  # a version-1 certificate is a version-2 one without $bigint entries
BIGINT = "$bigint"
MAX_BIGINT_DIGITS = 4096  # exact constants of scale products (kernel/reductions.py::scaled) are a few dozen digits
_INT64 = 2 ** 63


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
    expressions: list[tuple[int, str, dict[str, Any], list[int]]] = Field(
        description=f'[id, op, attrs, args] rows; an integer outside 64 bits is written {{"{BIGINT}": "<decimal>"}}')
    steps: list[Step]
    obligations: list[Obligation]
    outputs: list[OutputMatch]
    size_checks: list["Certificate"] = Field(
        default_factory=list, description="a proof that counts elements (kernel/sizes.py) is redone at a second "
                                          "instantiation of the dims: that proof's certificate, checked the same way")

    @field_validator("expressions", mode="before")
    @classmethod
    def _bigints(cls, v):
        return decode_bigints(v, "expressions")


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


def encode_bigints(v: Any) -> Any:
    """``v`` with every integer outside (-2^63, 2^63) written ``{"$bigint": "<decimal>"}``: certificates are read
    with the plan reader's 64-bit guard (plan.py::parse_json_text), but exact constants (``c2 / c1`` of
    ``scale_common_factor``, a product of decimal scales) need more digits."""
    if isinstance(v, dict):
        if BIGINT in v:
            raise ValueError(f"an attribute dict has the reserved key {BIGINT!r}: it cannot be written unambiguously")
        return {k: encode_bigints(x) for k, x in v.items()}
    if isinstance(v, list):
        return [encode_bigints(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool) and not -_INT64 < v < _INT64:
        return {BIGINT: str(v)}
    return v


def decode_bigints(v: Any, path: str) -> Any:
    """The inverse of :func:`encode_bigints`; ``ValueError("<json path>: why")`` for an entry that is not the
    canonical spelling of an integer outside 64 bits with at most MAX_BIGINT_DIGITS digits."""
    if isinstance(v, list):
        return [decode_bigints(x, f"{path}[{i}]") for i, x in enumerate(v)]
    if not isinstance(v, dict):
        return v
    if BIGINT not in v:
        return {k: decode_bigints(x, f"{path}.{k}") for k, x in v.items()}
    s = v[BIGINT]
    where = f"{path}.{BIGINT}"
    if len(v) != 1 or not isinstance(s, str):
        raise ValueError(f"{where}: a big integer is written {{\"{BIGINT}\": \"<decimal digits>\"}} alone")
    digits = s[1:] if s.startswith("-") else s
    if len(digits) > MAX_BIGINT_DIGITS:
        raise ValueError(f"{where}: the integer has {len(digits)} digits, more than the {MAX_BIGINT_DIGITS} allowed")
    if not (digits.isascii() and digits.isdigit()) or digits[0] == "0":
        raise ValueError(f"{where}: {s[:40]!r} is not a decimal integer without leading zeros")
    n = int(s)
    if -_INT64 < n < _INT64:
        raise ValueError(f"{where}: {s} fits in 64 bits: it is written as a plain JSON integer")
    return n
