"""The fused attention kernels' backward is traced as the recomputed math form only when it is given its
forward's own out and logsumexp (issue 15, soundness).

The real kernel computes its backward from the out and logsumexp it is handed (P = exp(S - lse),
D = rowsum(dO * out)); the tracer recomputes P from q and k, which is the same function only for the forward's own
outputs on the same q, k, v, mask, scale and causal flag.  A custom ``torch.autograd.Function`` calling
``_scaled_dot_product_flash_attention_for_cpu_backward`` with a wrong logsumexp or a scaled out really computes other
gradients (checked in eager float64 below), so its TP plan must not be VERIFIED: UNKNOWN naming the op and the line.
The same Function passing the saved outputs still verifies, and so does the normal SDPA TP attention example.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from tvcert.engine.verify import verify  # noqa: E402
from tvcert.frontends.trace import TraceError, _parse_inputs, _trace_joint, trace_plan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "torch"))
import tp_attention_sdpa as att  # noqa: E402
from megatron_mlp import CopyToTP, ReduceFromTP  # noqa: E402

aten = torch.ops.aten
BWD = "aten._scaled_dot_product_flash_attention_for_cpu_backward"


def flash(bug: str):
    """Causal attention as a custom Function over the fused CPU kernel; ``bug`` tampers with what its backward
    hands the kernel (``wrong_lse``: 0.5 for logsumexp, ``scaled_out``: 2 * out)."""
    class Flash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, do):
            q, k, v, out, lse = ctx.saved_tensors
            if bug == "wrong_lse":  # a fresh tensor (arithmetic on the forward's, uninitialised in the trace, is
                lse = torch.full(lse.shape, 0.5, dtype=lse.dtype)  # UNKNOWN anyway)
            if bug == "scaled_out":
                out = out * 2.0
            return aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, out, lse, 0.0, True)  # BWD

    return Flash


_SRC = Path(__file__).read_text().splitlines()
BWD_LINE = f"{Path(__file__).name}:{next(i for i, t in enumerate(_SRC, 1) if t.endswith('# BWD'))}"  # the user's line


def plan(bug: str = ""):
    """The logical model with the correct Function, the TP program (heads split) with ``flash(bug)``."""
    Flash = flash(bug)

    def logical(x, wq, wk, wv, wo, target):
        b, s, _ = x.shape
        q, k, v = (att.heads(x @ w, b, s) for w in (wq, wk, wv))
        o = flash("").apply(q, k, v).transpose(1, 2).reshape(b, s, -1)
        return ((o @ wo - target) ** 2).sum()

    def parallel(ctx, x, wq, wk, wv, wo, target):
        tp = ctx.group("tp")
        b, s, _ = x.shape
        xi = CopyToTP.apply(x, tp)
        q, k, v = (att.heads(xi @ w, b, s) for w in (wq, wk, wv))
        o = Flash.apply(q, k, v).transpose(1, 2).reshape(b, s, -1)
        return ((ReduceFromTP.apply(o @ wo, tp) - target) ** 2).sum()

    return dict(logical=logical, parallel=parallel, inputs=att.inputs(), mesh={"tp": 2},
                name=f"tp_attention_flash_function{'_' + bug if bug else ''}")


def test_tampered_backward_really_differs_in_torch():
    """The bugs are real: the Function's gradients differ from F.sdpa's (so a VERIFIED would be false)."""
    g = torch.Generator().manual_seed(0)
    q, k, v, R = (torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=g) for _ in range(4))

    def grads(f):
        ts = [t.clone().requires_grad_(True) for t in (q, k, v)]
        (f(*ts) * R).sum().backward()
        return [t.grad for t in ts]

    ref = grads(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True))
    for t, r in zip(grads(flash("").apply), ref):
        assert torch.allclose(t, r, atol=1e-10)
    for bug in ("wrong_lse", "scaled_out"):
        assert max((t - r).abs().max().item() for t, r in zip(grads(flash(bug).apply), ref)) > 1e-3, bug


def test_custom_function_with_its_forwards_outputs_verifies():
    assert verify(load_plan(trace_plan(**plan()))).verdict == "VERIFIED"


@pytest.mark.parametrize("bug,what", [("wrong_lse", "its logsumexp differs"), ("scaled_out", "its out is not")])
def test_custom_function_with_foreign_out_or_logsumexp_is_unknown(bug, what):
    with pytest.raises(TraceError) as ei:
        trace_plan(**plan(bug))
    e = ei.value
    assert e.kind == "unsupported" and e.op == BWD and e.src == BWD_LINE, (e.kind, e.op, e.src)
    assert what in str(e) and BWD in str(e) and BWD_LINE in str(e), str(e)


def joint_error(fn, shapes):
    """The TraceError of tracing fn's loss and gradients (q, k, v are parameters)."""
    spec = {n: {"shape": list(s), "dtype": "float64", "param": n in "qkv"} for n, s in shapes.items()}
    specs = _parse_inputs(spec, {})
    with pytest.raises(TraceError) as ei:
        _trace_joint(fn, specs, [s.shape for s in specs])
    assert ei.value.kind == "unsupported"
    return str(ei.value)


SH = dict(q=(2, 2, 4, 8), k=(2, 2, 4, 8), v=(2, 2, 4, 8), R=(2, 2, 4, 8))


def test_direct_backward_calls_are_checked():
    """A program computing its own gradients with the backward kernels: an out written in place through a view
    (same fx node, bumped version) or through ``.data`` (same node and version, a write into its storage), another
    query, the memory-efficient and CUDA flash backwards with a foreign
    logsumexp: each UNKNOWN naming its op."""
    def inplace(q, k, v, R):
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
        out[0].mul_(2.0)  # through a view: out's own fx node is unchanged
        return out.sum(), {p: gr for p, gr in zip("qkv", aten._scaled_dot_product_flash_attention_for_cpu_backward(
            R, q, k, v, out, lse, 0.0, False))}

    assert "its out is not" in joint_error(inplace, SH)

    def through_data(q, k, v, R):  # .data has its own version counter: seen as a write into out's storage
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
        out.data.mul_(2.0)
        return q.sum(), {p: gr for p, gr in zip("qkv", aten._scaled_dot_product_flash_attention_for_cpu_backward(
            R, q, k, v, out, lse, 0.0, False))}

    assert "its out is written in place after its forward (aten.mul_.Tensor" in joint_error(through_data, SH)

    def other_q(q, k, v, R):
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
        return out.sum(), {p: gr for p, gr in zip("qkv", aten._scaled_dot_product_flash_attention_for_cpu_backward(
            R, q * 2.0, k, v, out, lse, 0.0, False))}

    assert "its query differs" in joint_error(other_q, SH)

    def efficient(q, k, v, R):
        out, lse, seed, off = aten._scaled_dot_product_efficient_attention(q, k, v, None, True)
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            R, q, k, v, None, out, torch.zeros_like(lse), seed, off, 0.0, [True, True, True, False])
        return out.sum(), dict(q=dq, k=dk, v=dv)

    msg = joint_error(efficient, SH)
    assert "aten._scaled_dot_product_efficient_attention_backward" in msg and "its logsumexp differs" in msg

    def cuda_flash(q, k, v, R):
        out, lse, cq, ck, mq, mk, seed, off, _ = aten._scaled_dot_product_flash_attention(q, k, v)
        dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
            R, q, k, v, out, lse * 0.5, cq, ck, mq, mk, 0.0, False, seed, off)
        return out.sum(), dict(q=dq, k=dk, v=dv)

    msg = joint_error(cuda_flash, SH)
    assert "aten._scaled_dot_product_flash_attention_backward" in msg and "its logsumexp differs" in msg


def test_sdpa_tp_attention_example_still_verified():
    assert verify(load_plan(trace_plan(**att.tvcert_trace()))).verdict == "VERIFIED"
