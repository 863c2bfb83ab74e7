"""Certificates with exact constants outside 64 bits (H25): they are written ``{"$bigint": "<decimal>"}`` and replay.

``scale_common_factor`` keeps the ratio of two factors as exact integer constants: a product of decimal scales
(``0.7071067811865476`` twice, as SDPA at head dim 2 gives) has 31-digit ones, which the certificate reader's 64-bit
guard (shared with the plan reader) refused as plain JSON integers."""
from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from tvcert.certificate.emit import build_certificate, dump_certificate
from tvcert.certificate.format import MAX_BIGINT_DIGITS, decode_bigints, encode_bigints
from tvcert.cli import main
from tvcert.engine.verify import verify
from tvcert.plan import load_plan

C = 0.7071067811865476  # 1/sqrt(2) to double precision: its exact square has a 31-digit numerator
_INPUTS = [{"name": "x", "shape": ["n"], "dtype": "float"}, {"name": "y", "shape": ["n"], "dtype": "float"}]


def _graph(add_args: list[str]) -> list[dict]:
    return [{"op": "scale", "inputs": ["x"], "attrs": {"value": C}, "name": "a"},
            {"op": "scale", "inputs": ["a"], "attrs": {"value": C}, "name": "b"},
            {"op": "add", "inputs": add_args, "name": "o"}]


PLAN = {"tvcert_plan": 1, "name": "bigint_scale", "dims": {"n": 4, "tp": 2}, "mesh": [["tp", "tp"]],
        "logical": {"inputs": _INPUTS, "nodes": _graph(["b", "y"]), "outputs": ["o"]},
        "parallel": [{"name": "main", "inputs": _INPUTS, "nodes": _graph(["y", "b"]), "outputs": ["o"]}],
        "inputs": {"x": {"local": "x", "placement": {"tp": "Replicate"}},
                   "y": {"local": "y", "placement": {"tp": "Replicate"}}},
        "outputs": {"o": {"local": "o", "placement": {"tp": "Replicate"}}}}


@pytest.fixture(scope="module")
def cert() -> dict:
    res = verify(load_plan(copy.deepcopy(PLAN)), refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    return json.loads(dump_certificate(build_certificate(res)))


def _bigs(c: dict) -> list[dict]:
    """The attrs dicts of the expression rows (top level and size checks) holding a $bigint constant."""
    rows = c["expressions"] + [r for s in c.get("size_checks", []) for r in s["expressions"]]
    return [r[2] for r in rows if isinstance(r[2].get("value"), dict)]


def _check(tmp_path, c: dict, name: str = "c.json"):
    f = tmp_path / name
    f.write_text(json.dumps(c))
    return CliRunner().invoke(main, ["check", str(f), "--solver", "both"])


def test_big_constants_are_written_as_strings_and_replay(cert, tmp_path):
    bigs = _bigs(cert)
    assert bigs and cert["tvcert_certificate"] == 2 and cert["size_checks"], "the plan must need big constants"
    assert all(len(b["value"]["$bigint"]) > 19 for b in bigs)
    assert "scale_common_factor" in cert["manifest"]["rules"]
    r = _check(tmp_path, cert)
    assert r.exit_code == 0 and "VALID" in r.output, r.output


def test_oversized_or_noncanonical_constant_exits_3_naming_the_field(cert, tmp_path):
    for bad, words in [({"$bigint": "9" * 10_000}, f"10000 digits, more than the {MAX_BIGINT_DIGITS}"),
                       ({"$bigint": "12"}, "fits in 64 bits"), ({"$bigint": "0123456789012345678901"}, "leading zeros"),
                       ({"$bigint": "1e30"}, "not a decimal integer"), ({"$bigint": 12}, "alone"),
                       ({"$bigint": "1" * 25, "x": 1}, "alone")]:
        c = copy.deepcopy(cert)
        _bigs(c)[0]["value"] = bad
        r = _check(tmp_path, c)
        assert r.exit_code == 3 and words in r.output and "$.expressions" in r.output, (bad, r.output)
        assert "Traceback" not in r.output
    text = json.dumps(cert).replace(json.dumps(_bigs(cert)[0]["value"]), "9" * 10_000, 1)
    (tmp_path / "lit.json").write_text(text)  # a plain integer literal stays refused by the 64-bit guard
    r = CliRunner().invoke(main, ["check", str(tmp_path / "lit.json")])
    assert r.exit_code == 3 and "64-bit" in r.output and "$.expressions[" in r.output, r.output


def test_forged_constant_is_rejected(cert, tmp_path):
    for which in (0, -1):  # the top-level proof and the second instantiation's (size_checks)
        c = copy.deepcopy(cert)
        v = _bigs(c)[which]["value"]
        v["$bigint"] = str(int(v["$bigint"]) + 1)
        r = _check(tmp_path, c)
        assert r.exit_code == 1 and "INVALID" in r.output and "expression table differs" in r.output, r.output


def test_encoding_round_trips_at_the_64_bit_boundary():
    vals = [2 ** 63 - 1, -(2 ** 63) + 1, 2 ** 63, -(2 ** 63), 10 ** 4095, -(10 ** 4095), 0, True, 1.5, "7"]
    enc = encode_bigints([{"value": v} for v in vals])
    assert [e["value"] for e in enc[:2]] == vals[:2] and enc[2]["value"] == {"$bigint": str(2 ** 63)}
    assert all(isinstance(e["value"], dict) for e in enc[2:6]) and [e["value"] for e in enc[6:]] == vals[6:]
    assert decode_bigints(json.loads(json.dumps(enc)), "e") == [{"value": v} for v in vals]
    with pytest.raises(ValueError, match="reserved key"):
        encode_bigints({"$bigint": "1"})
