"""The locator on traced real code (issue 15 §4): backward ops carry their forward op's source line and module
(tvcert.frontends.grad_origin), and a REFUTED whose every op is explained names the output that is read back
under the wrong placement and the op (line, module) that produced it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402

from tvcert.engine.verify import verify  # noqa: E402
from tvcert.frontends.trace import trace_plan  # noqa: E402
from tvcert.interp import run_plan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "torch"))

import tp_ln_gelu_mlp as mlp  # noqa: E402


def _by_name(raw):
    return {n.get("name") or n["outputs"][0]: n for n in raw["parallel"][0]["nodes"]}


def test_backward_ops_carry_the_forward_line_and_custom_backward_keeps_its_own():
    raw = trace_plan(**mlp.tvcert_trace())
    nodes = _by_name(raw)
    # the gradients of W1 / b1 come from the backward of `F.gelu(h @ w1 + b1)` (line 48), the LayerNorm
    # parameters' from `F.layer_norm` (line 46): no backward op was pinned to a line before
    assert nodes["grad_w1"]["src"] == nodes["grad_b1"]["src"] == "tp_ln_gelu_mlp.py:48"
    assert nodes["grad_ln_w"]["src"] == nodes["grad_ln_b"]["src"] == "tp_ln_gelu_mlp.py:46"
    # Megatron's f: its backward's all_reduce has a user frame of its own (megatron_mlp.py), which it keeps
    assert [n["src"] for n in nodes.values() if n["op"] == "all_reduce"][-1].startswith("megatron_mlp.py:")


def _program_backward(ctx, x, w1, w2):
    """Runs loss.backward() itself: the backward ops' lines are the forward ops', not the backward call's."""
    h = torch.tanh(x @ w1)
    y = funcol.all_reduce(h @ w2, "sum", ctx.group("tp"))
    loss = y.pow(2).sum()
    loss.backward()
    return loss.detach()


def _logical(x, w1, w2):
    return (torch.tanh(x @ w1) @ w2).pow(2).sum()


INPUTS = {"x": {"shape": [2, 4]},
          "w1": {"shape": [4, 8], "placement": {"tp": "Shard(1)"}, "param": True},
          "w2": {"shape": [8, 4], "placement": {"tp": "Shard(0)"}, "param": True}}


def test_a_backward_run_by_the_program_is_pinned_to_the_forward_lines():
    import inspect

    raw = trace_plan(_logical, _program_backward, inputs=INPUTS, mesh={"tp": 2})
    first = inspect.getsourcelines(_program_backward)[1]
    lines = {f"test_realcode_locator.py:{first + k}" for k in (2, 3, 4)}  # h, y, loss
    nodes = _by_name(raw)
    assert nodes["grad_w1"]["src"] in lines and nodes["grad_w2"]["src"] in lines
    at_call = [n["op"] for n in nodes.values() if n.get("src") == f"test_realcode_locator.py:{first + 5}"]
    assert at_call == ["const"]  # only the seed gradient (ones) belongs to the backward() call itself


def test_a_missing_input_gradient_reduction_names_the_partial_output_and_its_line():
    """Megatron's f without its backward all_reduce: every op is explained (the LayerNorm gradients are
    Partial(sum) over tp), and the plan reads them back as Replicate.  The locator names the output, the
    placement it holds and the op that produced it, at the LayerNorm's line."""
    plan = load_plan(trace_plan(**mlp.tvcert_trace(bug="no_input_grad_reduce")))
    assert not run_plan(plan).equal
    res = verify(plan)
    assert res.verdict == "REFUTED"
    fd = res.counterexample["first_divergence"]
    assert fd["src"] == "tp_ln_gelu_mlp.py:46" and fd["tensor"] in ("grad_ln_w", "grad_ln_b", "grad_x")
    assert "Partial(sum)" in fd["text"] and "reduction missing" in fd["text"]


def _keyword_grad(ctx, x, w1, w2):
    """torch.autograd.grad called with keywords (outputs=, inputs=), as some training loops do."""
    loss = (torch.tanh(x @ w1) @ w2).pow(2).sum()
    g1, g2 = torch.autograd.grad(outputs=loss, inputs=[w1, w2])
    return loss.detach(), {"w1": g1, "w2": g2}


def test_keyword_autograd_grad_still_traces():
    raw = trace_plan(_logical, _keyword_grad, inputs=INPUTS, mesh={"tp": 1})
    assert set(raw["outputs"]) == {"loss", "grad_w1", "grad_w2"}


def _logical_mean(x, w):
    return (x @ w).pow(2).sum() / x.shape[0]


def _local_count(ctx, x, w):
    """Each rank divides its partial sum by its own row count, not the batch's: loss and gradient are dp x the
    model's, so every op is "explained" as a scalar multiple of a logical value."""
    part = (x @ w).pow(2).sum()
    local = part / x.shape[0]  # BUG: the rank's own row count
    (g,) = torch.autograd.grad(local, [w])
    return funcol.all_reduce(local, "sum", ctx.group("dp")), {"w": funcol.all_reduce(g, "sum", ctx.group("dp"))}


def test_a_loss_over_the_local_count_is_blamed_where_its_factor_starts():
    """Every differing output is 2 x its logical value: the first divergence is the div by the local count (the op
    where a value first becomes 2 x a logical one), not a later op; a correct mean over the global count VERIFIES."""
    import inspect

    inputs = {"x": {"shape": [4, 3], "placement": {"dp": "Shard(0)"}}, "w": {"shape": [3, 2], "param": True}}
    plan = load_plan(trace_plan(_logical_mean, _local_count, inputs=inputs, mesh={"dp": 2}))
    assert not run_plan(plan).equal
    res = verify(plan)
    assert res.verdict == "REFUTED"
    fd = res.counterexample["first_divergence"]
    src, first = inspect.getsourcelines(_local_count)
    bug = next(k for k, t in enumerate(src) if "# BUG" in t)
    assert (fd["op"], fd["src"]) == ("div", f"test_realcode_locator.py:{first + bug}"), fd["text"]
    assert "2 x its logical value" in fd["text"]
