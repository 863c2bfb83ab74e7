"""`tvcert trace` on hand-written Megatron-style tensor / sequence parallel code (fake process group)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tvcert.engine.verify import verify  # noqa: E402
from tvcert.frontends.trace import TraceError, trace_plan  # noqa: E402
from tvcert.interp import run_plan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

EX = Path(__file__).resolve().parents[1] / "examples" / "torch"
sys.path.insert(0, str(EX))

import megatron_mlp  # noqa: E402


def verified(res) -> bool:
    return res.verdict == "VERIFIED" and not res.reasons


def _plan(spec):
    return load_plan(trace_plan(**spec))


def test_mlp_tp2_verifies_and_runs_equal():
    plan = _plan(megatron_mlp.tvcert_trace())
    assert run_plan(plan).equal
    assert run_plan(plan, exact=True).equal
    res = verify(plan)
    assert verified(res), res.reasons
    # collectives came out of the trace with their mesh axis
    ops = [n.op for n in plan.programs["spmd"].nodes]
    assert ops.count("all_reduce") == 1  # forward g (x is not a parameter: its backward f is dead)
    assert all(n.attrs["axis"] == "tp" for n in plan.programs["spmd"].nodes if n.op == "all_reduce")


def test_mlp_without_allreduce_is_refuted_at_its_line():
    plan = _plan(megatron_mlp.tvcert_trace("no_allreduce"))
    res = verify(plan)
    assert res.verdict == "REFUTED"
    src = res.counterexample["first_divergence"]["src"]
    lines = (EX / "megatron_mlp.py").read_text().splitlines()
    line = int(src.split(":")[1])
    assert src.startswith("megatron_mlp.py:") and "BUG" in lines[line - 1], src


def test_sources_recorded_for_forward_ops():
    plan = _plan(megatron_mlp.tvcert_trace())
    srcs = [n.src for n in plan.logical.nodes if n.op == "matmul" and n.src]
    assert any(s.startswith("megatron_mlp.py:") for s in srcs)


def test_unconverted_op_is_a_clear_error():
    import torch

    def logical(x):
        return torch.special.erfinv(x).sum()

    def par(ctx, x):
        return torch.special.erfinv(x).sum()

    with pytest.raises(TraceError) as ei:
        trace_plan(logical, par, inputs={"x": {"shape": [4]}}, mesh={"tp": 2})
    assert ei.value.kind == "unsupported" and "erfinv" in str(ei.value) and "test_trace_megatron.py:" in str(ei.value)


def test_bad_mapping_is_rejected():
    with pytest.raises(TraceError) as ei:
        trace_plan(megatron_mlp.mlp, megatron_mlp.mlp_tp,
                   inputs={**megatron_mlp.INPUTS, "w1": {"shape": [8, 16], "placement": {"pp": "Shard(1)"}}},
                   mesh={"tp": 2})
    assert ei.value.kind == "input" and "pp" in str(ei.value)


import megatron_block  # noqa: E402


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp_sp"])
def test_attention_block_verifies(sp):
    plan = _plan(megatron_block.tvcert_trace(sp))
    assert run_plan(plan).equal
    res = verify(plan)
    assert verified(res), res.reasons
    ops = {n.op for n in plan.programs["spmd"].nodes}
    if sp:
        assert {"all_gather", "reduce_scatter", "all_reduce"} <= ops


@pytest.mark.parametrize("sp,bug", [(False, "no_allreduce"), (False, "no_copy"), (True, "no_norm_grad_sync")])
def test_attention_block_bugs_are_refuted(sp, bug):
    plan = _plan(megatron_block.tvcert_trace(sp, bug))
    res = verify(plan)
    assert res.verdict == "REFUTED", res.reasons
    if bug == "no_allreduce":
        src = res.counterexample["first_divergence"]["src"]
        assert src.startswith("megatron_block.py:"), src
    else:
        # the divergence is only at the read-back: the gradient is a partial sum read as replicated
        bad = [o["name"] for o in res.counterexample["outputs"] if not o["equal"]]
        assert "grad_norm_w" in bad
