"""Pairs found by ``tvcert.fuzz``, one test per file under ``tests/regressions/``.

* ``false_verified_*.json`` (written by the fuzzer on a soundness bug): the exact oracle shows
  the pair unequal, so the verifier must never say VERIFIED, nor match every output.
* ``known_*.json``: non-soundness bugs the fuzzer found (interpreter crash, certificate
  round trip); xfail while open, so a fix shows up as XPASS (then drop the mark).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tvcert.engine.verify import VERIFIED, verify
from tvcert.fuzz.oracle import oracle
from tvcert.interp import run_plan
from tvcert.plan import load_plan

REG = Path(__file__).resolve().parent / "regressions"
FALSE_VERIFIED = sorted(REG.glob("false_verified_*.json"))


@pytest.mark.parametrize("path", FALSE_VERIFIED, ids=lambda p: p.stem)
def test_false_verified_regression(path):
    plan = load_plan(json.loads(path.read_text()))
    assert oracle(plan).equal is False
    res = verify(plan, refute=True)
    assert res.verdict != VERIFIED
    assert not (all(m.ok for m in res.matches) and res.prop.blocked is None)


def test_known_interp_scalar_partial_avg_2d_mesh():
    """Was: interp.assemble turned a 0-d Partial(avg) result into a bare Fraction (fixed in 29e114b)."""
    plan = load_plan(json.loads((REG / "known_interp_scalar_partial_avg_2d_mesh.json").read_text()))
    assert run_plan(plan, exact=True).equal


def test_known_cert_roundtrip_unused_failing_op():
    """Was: expressions made by a failed rule on an unused op leaked into the certificate's
    table, so a VERIFIED plan's own certificate was rejected (0.8% of VERIFIED fuzz pairs in
    the first 100k run; fixed by the certificate work of 2026-11-30)."""
    from tvcert.certificate.check import Certificate, check_certificate
    from tvcert.certificate.emit import build_certificate

    plan = load_plan(json.loads((REG / "known_cert_roundtrip_unused_failing_op.json").read_text()))
    res = verify(plan, refute=False)
    assert res.verdict == VERIFIED
    check_certificate(Certificate.model_validate(json.loads(json.dumps(build_certificate(res)))))


@pytest.mark.parametrize("command", ["verify", "run"])
def test_known_hostile_collective_axis_number(command):
    """Was a TypeError in axes_of; the 'axes' attribute kind now rejects it with exit 3."""
    from click.testing import CliRunner

    from tvcert.cli import main

    r = CliRunner().invoke(main, [command, str(REG / "known_hostile_collective_axis_number.json")])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code == 3


ORACLE_MISSES = sorted(REG.glob("oracle_miss_*.json"))


@pytest.mark.parametrize("path", ORACLE_MISSES, ids=lambda p: p.stem)
def test_oracle_miss_regression(path):
    """Unequal pairs the first oracle missed (they showed up as false REFUTED): the thorough
    oracle must find the difference, and the verifier must keep refuting them."""
    plan = load_plan(json.loads(path.read_text()))
    assert oracle(plan, thorough=5).equal is False
    assert verify(plan, refute=True).verdict == "REFUTED"
