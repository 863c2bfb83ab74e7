"""Red team round 6 (H48, session 10): wrong plans that came out VERIFIED, each shown wrong by the interpreter.

* int64 wraps, the solver's reals do not (kernel/smt.py, kernel/equality.py, kernel/index_domain.py).  Int
  tensors are int64 in the interpreter (and on the hardware): ``x * 2**62`` is ``-2**63`` at x = 2.
  ``ge(x * 2**62, 0)`` over x in [0, 4) was VERIFIED against ``ge(x, 0)`` by an SMT obligation over the reals;
  ``x * 2**62 / 2**62`` against ``x / 1`` and ``cast(x * 2**62)`` against ``2**62 * cast(x)`` by
  ``scale_commutes_linear`` (a factor pulled out of an int tensor holds only modulo 2**64, which a division or a
  cast tells apart); ``x / sum(const int 3 * 2**61 of shape [4])`` against ``x / 2**50 / 2**13 / 3`` by
  ``int_range_count`` folding the sum to 3 * 2**63 (it is -2**63); an embedding at ``cast(ids * 2**62 / 2**62)`` loaded although the logical lookup is at -2.
  Now an obligation is sent only when every int add / sub / mul / ... of its regions is bounded inside int64 by
  the leaves' declared ranges, no factor leaves an int tensor, an int constant folded past int64 is no
  constant, and an index domain past int64 is unbounded
  (exit 3 naming the input).  all_reduce(avg) over tp 4 of a replicated int x in [0, 2**62) was VERIFIED as x
  (allreduce_avg_replicate; the sum 4x wraps): an int mean is now no rule (kernel/rules.py).  ``cast(sum(x))``
  of a sharded x in [0, 2**62) computed as the all_reduce of the local sums cast to float was VERIFIED
  (partial_linear_map through the cast; the logical int sum wraps, the float sum of the pieces does not): a float
  conclusion Partial on an axis where an int operand is not Replicate now needs the operand bounded inside int64
  (rules._int_pieces_to_float, int_range.abs_bound; the same plan over x in [0, 8) VERIFIED).
  ``cast(all_reduce(sum))`` over tp 4 of a replicated int x in [0, 2**62) was VERIFIED against ``4 * cast(x)``:
  allreduce_sum_replicate (and reduce_scatter_replicate) wrote p * E with a float p, so the int64 product that
  wraps was a real one; p now has E's dtype (over x in [0, 8) still VERIFIED).  Controls: ``x * 2**60`` (inside int64) and ``x / 2`` still VERIFIED.
* run_dims with another mesh size (kernel/sizes.py): ``2 * x`` against ``all_reduce(sum)`` of a replicated x over
  tp, declared tp = 2 (right there) and run_dims tp = 4, was VERIFIED while ``tvcert run`` (at run_dims) showed the
  sides differ: the second instantiation kept the declared mesh sizes.  Now a mesh dim run_dims sizes otherwise is
  a reason to re-prove, and every candidate instantiation takes run_dims' mesh sizes (engine and checker alike);
  ``tp * x`` VERIFIED, its certificate re-proved at tp = 4.
* zigzag_from_index_block (kernel/zigzag_index.py, this session's H46): the balancer index was evaluated in
  float64, so ``cast(float(P) - 1e-17)`` read as the head-tail permutation P although over the reals (the exact
  run) it is P - 1 below every nonzero entry: VERIFIED, the exact run differs.  Now evaluated exactly (no function
  tables: a nonlinear function in the index is refused); P itself still VERIFIED.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tvcert.engine.verify import used_rules, verify
from tvcert.interp import RunError, run_plan
from tvcert.plan import PlanError, load_plan

DATA = Path(__file__).resolve().parent / "data" / "redteam_s10"


def _load(name: str):
    return load_plan(json.loads((DATA / f"{name}.json").read_text()))


def _wrong(name: str) -> None:
    plan = _load(name)
    assert not all(run_plan(plan, exact=True, seed=s).equal for s in (0, 1))  # the interpreter: the sides differ
    res = verify(plan)
    assert res.verdict != "VERIFIED", name


def _control(name: str) -> set[str]:
    plan = _load(name)
    assert run_plan(plan, exact=True).equal
    res = verify(plan)
    assert res.verdict == "VERIFIED", res.reasons
    return used_rules(res)


# ------------------------------------------------------------------ int64 wraps
@pytest.mark.parametrize("name", ["int64_wrap_smt", "int64_wrap_factor_div", "int64_wrap_factor_cast", "int64_wrap_count",
                                  "int_allreduce_avg", "int_partial_cast", "int_allreduce_sum_replicate"])
def test_int64_wrap_not_verified(name):
    _wrong(name)


def test_int64_wrap_smt_reason():
    res = verify(_load("int64_wrap_smt"))
    assert any("int64" in str(r) for r in res.reasons), res.reasons


@pytest.mark.parametrize("name", ["int64_wrap_smt_ok", "int_div_ok"])
def test_int64_controls_verified(name):
    assert "elementwise_smt" in _control(name)


def test_int_partial_cast_control_verified():
    assert "partial_linear_map" in _control("int_partial_cast_ok")


def test_int_allreduce_sum_replicate_control_verified():
    assert "allreduce_sum_replicate" in _control("int_allreduce_sum_replicate_ok")


def test_int64_wrap_index_refused():
    raw = json.loads((DATA / "int64_wrap_index.json").read_text())
    with pytest.raises(PlanError, match="'ids'"):
        load_plan(raw)
    raw["logical"]["inputs"][0]["range"] = 2  # ids in [0, 2): ids * 2**62 stays inside int64, the lookup is defined
    raw["parallel"][0]["inputs"][0]["range"] = 2
    plan = load_plan(raw)
    assert run_plan(plan).equal


def test_int64_wrap_index_undefined(monkeypatch):
    """What the loader refuses: the logical lookup is at -2 for ids = 2 (int64 wraps)."""
    import tvcert.plan as P

    monkeypatch.setattr(P, "check_index_domains", lambda *a, **k: None)
    plan = load_plan(json.loads((DATA / "int64_wrap_index.json").read_text()))
    with pytest.raises(RunError, match="out of range"):
        run_plan(plan, seed=0)


# ------------------------------------------------------------------ run_dims with another mesh size
def test_mesh_run_dims_not_verified():
    """2 * x against all_reduce(sum) of a replicated x over tp: declared tp = 2 (right there), run_dims tp = 4
    (``tvcert run`` differs).  Was VERIFIED (the second instantiation kept the declared mesh)."""
    _wrong("mesh_run_dims")
    res = verify(_load("mesh_run_dims"))
    assert any("run_dims size the mesh" in str(r) for r in res.reasons), res.reasons


def test_mesh_run_dims_control_verified():
    res_rules = _control("mesh_run_dims_ok")
    assert "allreduce_sum_replicate" in res_rules


def test_mesh_run_dims_certificate():
    """The checker picks the same second instantiation (at run_dims' mesh) and replays its certificate."""
    from tvcert.certificate.check import check_certificate
    from tvcert.certificate.emit import build_certificate, dump_certificate
    from tvcert.certificate.format import Certificate

    res = verify(_load("mesh_run_dims_ok"), refute=False)
    got = check_certificate(Certificate.model_validate(json.loads(dump_certificate(build_certificate(res)))))
    assert got.size_check and "re-proved at dims" in got.size_check and "'tp': 4" in got.size_check


# ------------------------------------------------------------------ zigzag_from_index_block's index, exactly
def test_zigzag_index_float_rounding_not_verified():
    """The index cast(float(P) - 1e-17) is P in float64 but P - 1 over the reals: was VERIFIED (the pattern
    evaluated the index in float64), the exact run differs."""
    _wrong("zigzag_index_float_rounding")


def test_zigzag_index_control_verified():
    assert "zigzag_from_index_block" in _control("zigzag_index_ok")


def test_int64_wrap_certificate_of_the_old_kernel_rejected(monkeypatch):
    """A certificate made by a kernel without the int64 bound (VERIFIED) is refused by the checker: it re-derives
    the obligation and meets the bound."""
    from tvcert.certificate.check import Invalid, check_certificate
    from tvcert.certificate.emit import build_certificate, dump_certificate
    from tvcert.certificate.format import Certificate
    from tvcert.kernel import equality

    with monkeypatch.context() as m:
        m.setattr(equality, "int_overflow", lambda *a, **k: None)
        res = verify(_load("int64_wrap_smt"), refute=False)
        assert res.verdict == "VERIFIED"
        cert = json.loads(dump_certificate(build_certificate(res)))
    with pytest.raises(Invalid, match="int64"):
        check_certificate(Certificate.model_validate(cert))
