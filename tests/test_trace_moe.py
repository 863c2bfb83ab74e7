"""MoE routing under fake tensors: UNKNOWN with the exact reason (op and line), never a verdict on one routing.

Before: a parallel program reading split sizes from token counts (``bincount``, ``.tolist()``) was REFUTED as a
"crash" of the parallel program, and a logical model doing so was bad input; the code is fine, fake tensors just
have no values (tvcert.frontends.moe)."""
from __future__ import annotations

import json
import textwrap

import pytest

torch = pytest.importorskip("torch")

import torch.distributed._functional_collectives as ft_c  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from tvcert.cli import main  # noqa: E402
from tvcert.frontends.trace import TraceError, trace_plan  # noqa: E402

T, H, E = 8, 4, 2
INPUTS = {"x": {"shape": [T, H], "placement": {"ep": "Shard(0)"}}, "wr": {"shape": [H, E]},
          "w": {"shape": [E, H, H], "placement": {"ep": "Shard(0)"}, "param": True}}


def dense_moe(x, wr, w):
    """Top-1 routing computed densely (a mask per expert): no value is read, so it traces."""
    idx = (x @ wr).argmax(-1)
    out = torch.zeros_like(x)
    for e in range(E):
        out = out + (idx == e).unsqueeze(-1).to(x.dtype) * (x @ w[e])
    return out.sum()


def a2a_moe(counts: str):
    """Expert parallelism as real MoE code writes it: tokens sorted by expert, all_to_all with split sizes
    from the token counts, the expert, all_to_all back, un-permute."""
    def parallel(ctx, x, wr, w):
        idx = (x @ wr).argmax(-1)
        order = idx.argsort()
        if counts == "bincount":
            splits = torch.bincount(idx, minlength=E).tolist()
        else:
            splits = [int((idx == e).sum().item()) for e in range(E)]
        recv = ft_c.all_to_all_single(x[order], None, splits, ctx.group("ep"))
        back = ft_c.all_to_all_single(recv @ w[0], splits, None, ctx.group("ep"))
        return torch.empty_like(back).index_copy(0, order, back).sum()
    return parallel


@pytest.mark.parametrize("counts, op", [("bincount", "aten.bincount"), ("item", "_local_scalar_dense")])
def test_split_sizes_from_token_counts_unknown(counts, op):
    with pytest.raises(TraceError) as ei:
        trace_plan(dense_moe, a2a_moe(counts), inputs=INPUTS, mesh={"ep": 2})
    e = ei.value
    assert e.kind == "unsupported" and op in e.op, (e.kind, e.op, str(e))  # UNKNOWN, not a crash (REFUTED)
    assert str(e).startswith("data-dependent routing: rank 0") and "one concrete routing" in str(e), str(e)
    assert e.src and e.src.startswith("test_trace_moe.py:"), e.src


def test_logical_model_reading_values_unknown_not_bad_input():
    """The logical model itself routes with ``nonzero`` (Mixtral's eager experts loop): UNKNOWN, not bad input."""
    def logical(x, wr, w):
        idx = (x @ wr).argmax(-1)
        out = torch.zeros_like(x)
        for e in range(E):
            rows = (idx == e).nonzero().squeeze(-1)
            out = out.index_add(0, rows, x[rows] @ w[e])
        return out.sum()

    with pytest.raises(TraceError) as ei:
        trace_plan(logical, a2a_moe("bincount"), inputs=INPUTS, mesh={"ep": 2})
    assert ei.value.kind == "unsupported" and "the logical model" in str(ei.value), str(ei.value)
    assert "nonzero" in ei.value.op, ei.value.op


def test_cli_exit_code_unknown(tmp_path):
    """Through ``tvcert trace``: exit 2 (UNKNOWN), where it was exit 1 (REFUTED) before."""
    spec = tmp_path / "moe_spec.py"
    spec.write_text(textwrap.dedent('''
        import torch
        import torch.distributed._functional_collectives as ft_c

        def logical(x, w):
            return (x @ w).sum()

        def parallel(ctx, x, w):
            splits = torch.bincount((x[:, 0] > 0).long(), minlength=2).tolist()
            y = ft_c.all_to_all_single(x, None, splits, ctx.group("ep"))
            return (ft_c.all_to_all_single(y, splits, None, ctx.group("ep")) @ w).sum()

        def tvcert_trace():
            return dict(logical=logical, parallel=parallel, mesh={"ep": 2},
                        inputs={"x": {"shape": [4, 2], "placement": {"ep": "Shard(0)"}},
                                "w": {"shape": [2, 2], "param": True}})
    '''))
    r = CliRunner().invoke(main, ["trace", str(spec), "--verify", "--json", "-q"])
    assert r.exit_code == 2, r.output
    out = json.loads(r.output[r.output.index("{"):])
    assert out["verdict"] == "UNKNOWN" and out["src"] == "moe_spec.py:9", out


def test_hf_mixtral_grouped_experts_unknown_routing():
    """Hugging Face Mixtral (tiny config, default grouped_mm experts, bf16 as grouped_mm needs): UNKNOWN at the
    per-expert token count (histc in transformers' moe.py) with the routing reason."""
    pytest.importorskip("transformers")
    from tvcert.frontends.hf import trace_hf

    with pytest.raises(TraceError) as ei:
        trace_hf("mixtral", 1, dtype="bfloat16")
    e = ei.value
    assert e.kind == "unsupported" and e.op.startswith("aten.histc"), (e.op, str(e))
    assert "data-dependent routing" in str(e) and e.src and e.src.startswith("moe.py:"), str(e)


def test_hf_mixtral_eager_experts_unknown_not_bad_input():
    """Mixtral's eager experts loop (``expert_mask.sum(...).nonzero()``, then ``torch.where`` per expert): the logical
    model reads values; UNKNOWN at that line (it was bad input, exit 3, before)."""
    pytest.importorskip("transformers")
    from tvcert.frontends.hf import trace_hf

    with pytest.raises(TraceError) as ei:
        trace_hf("mixtral", 1, config={"experts_implementation": "eager"})
    e = ei.value
    assert e.kind == "unsupported" and "nonzero" in e.op, (e.op, str(e))
    assert str(e).startswith("data-dependent routing: the logical model") and e.src.startswith("modeling_mixtral.py:")
