"""torch's causal ring attention VERIFIED (tvcert.kernel.ring_causal, Coq RingMasked): the ranks' programs differ
(``_is_causal_behavior``: the diagonal block masked, past blocks in full, future blocks skipped, the load balancer's
half blocks), are merged into one in which every rank runs its own (tvcert.frontends.mpmd), and the rule follows
every rank's own copy.  Near misses are not VERIFIED and are REFUTED by the interpreter; a kernel that stops checking
the mask's diagonal would verify one, and the conformance check catches it.  One trace per configuration
(module-scoped, and cached for the conformance generator's samples); the larger sweep is bench/cp_ring.py."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "torch"))

from tvcert.engine.verify import used_rules, verify  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402


def _trace(cp, lb, bug=""):
    """cp_attention.py traced through the conformance generator's cache (its causal samples reuse these traces)."""
    from tvcert.conform.gens_ring_merge import trace_example

    return trace_example({"cp": cp, "lb": lb}, bug, causal=True)


@pytest.fixture(scope="module")
def contiguous():
    return _trace(cp=2, lb=False)


@pytest.fixture(scope="module")
def balanced():
    return _trace(cp=2, lb=True)


@pytest.fixture(scope="module")
def shifted():
    """The block kernel's causal mask one key off its diagonal (tril(1): every query sees the next key)."""
    return _trace(cp=2, lb=False, bug="mask_diagonal_shifted")


@pytest.mark.parametrize("which", ["contiguous", "balanced"])
def test_causal_ring_verified(which, request):
    """cp 2, contiguous blocks (rank 0 skips block 1) and head-tail chunks (rank 0 attends its tail chunk to rank 1's
    block, rank 1 all its queries to rank 0's head chunk): forward and backward VERIFIED by the masked merge."""
    plan = request.getfixturevalue(which)
    res = verify(load_plan(plan))
    assert res.verdict == "VERIFIED", res.reasons
    assert {"ring_masked_merge", "ring_masked_merge_backward"} <= used_rules(res)
    assert "2 classes over ['cp']" in plan["description"]


@pytest.mark.parametrize("bug", ["future_block_attended", "mask_diagonal_shifted"])
def test_causal_near_misses_refuted(bug, shifted):
    """A future block attended in full instead of skipped (torch's behaviour patched), the block kernel's mask one key
    off its diagonal: no rule applies (the chunk pairs are not the causal mask's), REFUTED by the interpreter."""
    plan = shifted if bug == "mask_diagonal_shifted" else _trace(cp=2, lb=False, bug=bug)
    res = verify(load_plan(plan))
    assert res.verdict == "REFUTED", res.reasons


def test_broken_kernel_caught_by_conformance(monkeypatch, shifted):
    """A kernel that accepts a causal mask on any diagonal (ring_causal._tril not checking ``diagonal``) VERIFIES the
    shifted mask; the conformance check (float64 interpreter on every rank) reports the disagreement."""
    from tvcert.conform.plans import _check_plan
    from tvcert.kernel import ring_causal

    plan = shifted

    def lax(self, t, c, rows, cols, block):  # any tril of the block, its diagonal unchecked
        n = self.node(t, c)
        n = self.node(n.inputs[0], c) if n is not None and n.op == "cast" else n
        if n is None or n.op != "tril" or len(rows) != len(cols):
            raise ring_causal.CausalMismatch("not a tril mask")

    monkeypatch.setattr(ring_causal._Walk, "_tril", lax)
    assert verify(load_plan(plan), refute=False).verdict == "VERIFIED"
    assert _check_plan(plan, "ring_masked_merge", use_float=True).status == "DISAGREE"
