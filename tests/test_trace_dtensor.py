"""`tvcert trace` on DTensor `parallelize_module` code (ColwiseParallel / RowwiseParallel)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from tvcert.cli import main  # noqa: E402
from tvcert.engine.verify import verify  # noqa: E402
from tvcert.frontends.trace import TraceError  # noqa: E402
from tvcert.interp import run_plan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

EX = Path(__file__).resolve().parents[1] / "examples" / "torch"
sys.path.insert(0, str(EX))

import dtensor_llama_block as blk  # noqa: E402


def verified(res) -> bool:
    return res.verdict == "VERIFIED" and not res.reasons


def test_llama_block_colwise_rowwise_verifies():
    raw = blk.tvcert_trace()
    plan = load_plan(raw)
    # placements were read from the DTensor parameters
    assert raw["inputs"]["attn__wq__weight"]["placement"] == {"tp": "Shard(0)"}
    assert raw["inputs"]["attn__wo__weight"]["placement"] == {"tp": "Shard(1)"}
    assert raw["inputs"]["attn_norm__weight"]["placement"] == {}  # a plain (replicated) parameter
    assert run_plan(plan).equal
    res = verify(plan)
    assert verified(res), res.reasons


def test_colwise_rowwise_swap_does_not_verify():
    with pytest.raises(TraceError) as ei:
        blk.tvcert_trace(swap=True)
    assert ei.value.kind == "crash" and ei.value.src.startswith("dtensor_llama_block.py:")


def test_cli_trace_verify(tmp_path):
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["trace", str(EX / "megatron_mlp.py"), "-o", str(out), "--verify", "--json"])
    res = json.loads(r.output[r.output.index("{"):])
    assert r.exit_code == 0, r.output
    assert res["verdict"] == "VERIFIED"
    assert json.loads(out.read_text())["name"] == "megatron_mlp"
    r = CliRunner().invoke(main, ["trace", str(EX / "megatron_mlp.py"), "--set", "bug=no_allreduce", "--verify"])
    assert r.exit_code == 1, r.output
    assert "REFUTED" in r.output
    r = CliRunner().invoke(main, ["trace", str(EX / "dtensor_llama_block.py"), "--set", "swap=true", "--verify"])
    assert r.exit_code == 1 and "dtensor_llama_block.py:" in r.output, r.output


def test_llama_block_sequence_parallel_verifies():
    raw = blk.tvcert_trace(sp=True)
    ops = {n["op"] for n in raw["parallel"][0]["nodes"]}
    # funcol's all-gather / reduce-scatter along the sequence dim are folded back into dim-1 collectives
    assert {"all_gather", "reduce_scatter"} <= ops
    assert all(n["attrs"]["dim"] == 1 for n in raw["parallel"][0]["nodes"] if n["op"] in ("all_gather", "reduce_scatter"))
    plan = load_plan(raw)
    assert run_plan(plan).equal
    res = verify(plan)
    assert res.verdict == "VERIFIED", res.reasons


def test_gradient_hook_outside_the_graph_is_not_verified():
    """A post-accumulate-grad hook (how HF reduces Qwen3 q_norm/k_norm grads) is never fired by
    autograd.grad: the trace must refuse rather than read back unsynchronised gradients."""
    from torch.distributed.tensor.parallel import parallelize_module

    from tvcert.frontends.dtensor import trace_module_plan

    def parallelize(m, mesh):
        parallelize_module(m, mesh, blk.tp_plan())
        m.attn_norm.weight.register_post_accumulate_grad_hook(lambda p: None)

    with pytest.raises(TraceError) as ei:
        trace_module_plan(blk.make_block, parallelize, blk.loss_fn,
                          data={"x": {"shape": [blk.B, blk.S, blk.H]}, "target": {"shape": [blk.B, blk.S, blk.H]}},
                          mesh={"tp": 2})
    assert ei.value.kind == "unsupported" and "attn_norm.weight" in str(ei.value)


def test_cli_verify_torch_in_one_step(tmp_path):
    """`tvcert verify --torch SPEC` traces and verifies, with the verify command's certificate and exit codes."""
    cert = tmp_path / "mlp.cert.json"
    r = CliRunner().invoke(main, ["verify", "--torch", str(EX / "megatron_mlp.py"), "--emit-cert", str(cert), "-q"])
    assert r.exit_code == 0 and "VERIFIED" in r.output, r.output
    assert CliRunner().invoke(main, ["check", str(cert)]).exit_code == 0
    r = CliRunner().invoke(main, ["verify", "--torch", str(EX / "megatron_mlp.py"), "--set", "bug=no_allreduce", "-q"])
    assert r.exit_code == 1 and "REFUTED" in r.output, r.output
    r = CliRunner().invoke(main, ["verify", "--torch", str(EX / "dtensor_llama_block.py"), "--set", "swap=true"])
    assert r.exit_code == 1 and "dtensor_llama_block.py:" in r.output, r.output
    r = CliRunner().invoke(main, ["verify", str(EX / "megatron_mlp.py"), "--torch", str(EX / "megatron_mlp.py")])
    assert r.exit_code == 3 and "exactly one of" in r.output  # a usage error is bad input (exit 3, cli.py)


# ------------------------------------------------ PyTorch's DTensor test Transformer, its own parallelize
@pytest.mark.parametrize("tp,sp", [(2, False), (4, True)])
def test_pytorch_dtensor_test_transformer_verifies(tp, sp):
    pytest.importorskip("expecttest")  # torch.testing._internal imports it
    import dtensor_transformer as dtt

    raw = dtt.tvcert_trace(tp=tp, sp=sp)
    assert raw["inputs"]["tok_embeddings__weight"]["placement"] == {"tp": "Shard(0)"}  # vocab-parallel, tied
    res = verify(load_plan(raw))
    assert verified(res), res.reasons


def test_pytorch_dtensor_test_transformer_missing_sequence_parallel_is_refuted():
    pytest.importorskip("expecttest")
    import dtensor_transformer as dtt

    res = verify(load_plan(dtt.tvcert_trace(sp=True, bug="no_sequence_parallel")))
    assert res.verdict == "REFUTED"
    bad = {o["name"] for o in res.counterexample["outputs"] if not o["equal"]}
    assert bad == {"grad_layers__0__ffn_norm__weight", "grad_layers__0__ffn_norm__bias"}


def test_adamw_step_with_sharded_state_verifies_and_a_partial_norm_gradient_is_refuted():
    """One torch.optim.AdamW step after the backward on both sides: parameters after the step and exp_avg /
    exp_avg_sq (sharded like their parameter) are outputs; the missing-SequenceParallel bug shows in all three."""
    pytest.importorskip("expecttest")
    import dtensor_transformer as dtt

    raw = dtt.tvcert_trace(sp=True, optimizer="adamw")
    assert raw["outputs"]["exp_avg.tok_embeddings__weight"]["placement"] == {"tp": "Shard(0)"}
    assert "grad_tok_embeddings__weight" not in raw["outputs"]
    res = verify(load_plan(raw))
    assert verified(res), res.reasons
    res = verify(load_plan(dtt.tvcert_trace(sp=True, optimizer="adamw", bug="no_sequence_parallel")))
    assert res.verdict == "REFUTED"
    bad = {o["name"] for o in res.counterexample["outputs"] if not o["equal"]}
    assert {"new.layers__0__ffn_norm__weight", "exp_avg.layers__0__ffn_norm__weight",
            "exp_avg_sq.layers__0__ffn_norm__weight"} <= bad
    assert all("ffn_norm" in b for b in bad)


def test_dtensor_parameters_on_the_tp_sub_mesh_of_a_dp_x_tp_mesh():
    """parallelize_module on mesh["tp"] of a 2-D mesh: placements are read per axis of the sub-mesh.  Replicated
    data: VERIFIED; each dp rank on its own batch half with no gradient all_reduce over dp: REFUTED."""
    from torch.distributed.tensor.parallel import parallelize_module

    from tvcert.frontends.dtensor import trace_module_plan

    def run(dp_shard: bool):
        seq = {"shape": [blk.B, blk.S, blk.H], **({"placement": {"dp": "Shard(0)"}} if dp_shard else {})}
        return verify(load_plan(trace_module_plan(
            blk.make_block, lambda m, mesh: parallelize_module(m, mesh["tp"], blk.tp_plan()), blk.loss_fn,
            data={"x": seq, "target": dict(seq)}, mesh={"dp": 2, "tp": 2},
            **({"output_placements": {"loss": {"dp": "Partial(sum)"}}} if dp_shard else {}))))

    assert verified(run(False))
    assert run(True).verdict == "REFUTED"
