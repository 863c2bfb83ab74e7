"""Hugging Face transformers tiny Llama with its built-in tensor-parallel plan, traced and verified.

Pinned: transformers==5.24.0 with torch==2.13.0 (CPU, fake process group)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tvcert.engine.verify import verify  # noqa: E402
from tvcert.interp import run_plan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

EX = Path(__file__).resolve().parents[1] / "examples" / "torch"
sys.path.insert(0, str(EX))

import hf_llama_tp as hf  # noqa: E402


def test_hf_llama_builtin_tp_plan_verifies():
    raw = hf.tvcert_trace()
    assert raw["inputs"]["model__layers__0__self_attn__q_proj__weight"]["placement"] == {"tp": "Shard(0)"}
    assert raw["inputs"]["model__layers__0__mlp__down_proj__weight"]["placement"] == {"tp": "Shard(1)"}
    assert raw["inputs"]["lm_head__weight"]["placement"] == {"tp": "Shard(0)"}  # colwise_gather_output
    ops = {n["op"] for n in raw["parallel"][0]["nodes"]}
    assert {"all_reduce", "all_gather"} <= ops
    plan = load_plan(raw)
    assert run_plan(plan).equal
    res = verify(plan)
    assert res.verdict == "VERIFIED" and not res.reasons, res.reasons


def test_hf_llama_vocab_parallel_embedding_verifies():
    """transformers' own `embed_tokens: embedding_rowwise` (DTensor MaskPartial): rank-dependent shard
    offsets, recognized as the vocab_parallel_embedding pattern (masked local lookup + all_reduce)."""
    raw = hf.tvcert_trace(vocab_parallel=True)
    assert "rank.tp*16" in raw["description"]
    plan = load_plan(raw)
    assert run_plan(plan).equal
    res = verify(plan)
    assert res.verdict == "VERIFIED", res.reasons
    assert any(s.rules == ["vocab_parallel_embedding"] for s in res.prop.steps)


# ---------------------------------------------------------------- tvcert verify --hf (tvcert.frontends.hf)
def _verdict(raw):
    plan = load_plan(raw)
    res = verify(plan)
    if res.verdict == "REFUTED":  # confirmed by the interpreter on the counterexample's inputs
        assert res.counterexample and not all(o["equal"] for o in res.counterexample["outputs"])
    return res


def test_hf_qwen3_lazy_grad_allreduce_hook_verifies_and_its_absence_is_refuted():
    """Qwen3's q_norm / k_norm are `replicated_with_grad_allreduce`: the hook is registered at the first forward
    and fired by the traced backward; with the entry replaced by `replicate` the norm gradients are partial."""
    from tvcert.frontends.hf import trace_hf

    res = _verdict(trace_hf("qwen3", 2))
    assert res.verdict == "VERIFIED" and not res.reasons, res.reasons
    res = _verdict(trace_hf("qwen3", 2, tp_plan={"model.layers.*.self_attn.q_norm": "replicate"}))
    assert res.verdict == "REFUTED"
    assert [o["name"] for o in res.counterexample["outputs"] if not o["equal"]] == \
        ["grad_model__layers__0__self_attn__q_norm__weight"]
    fd = res.counterexample["first_divergence"]  # every op explained: the output read back as Replicate is named
    assert fd["src"].startswith("modeling_qwen3.py:") and "in module model.layers.0.self_attn.q_norm" in fd["text"]
    assert "Partial(sum)" in fd["text"]


def test_hf_phi3_fused_qkv_colwise_is_refuted_at_the_split():
    """Phi-3's fused qkv_proj as plain colwise (no gather): it runs, but each rank splits its shard of the fused
    output at the global q/k/v offsets."""
    from tvcert.frontends.hf import trace_hf

    res = _verdict(trace_hf("phi3", 2, tp_plan={"model.layers.*.self_attn.qkv_proj": "colwise"}))
    assert res.verdict == "REFUTED"
    assert res.counterexample["first_divergence"]["src"].startswith("modeling_phi3.py:")


def test_hf_cli_bad_input_exits_3():
    from click.testing import CliRunner

    from tvcert.cli import main

    for args in (["--hf", "nosuch"], ["--hf", "llama", "--set", "bogus=1"],
                 ["--hf", "llama", "--set", 'tp_plan={"model.nothing": "colwise"}'],
                 ["--hf", "llama", "--set", 'tp_plan={"model.layers.*.mlp": "no_such_style"}']):
        r = CliRunner().invoke(main, ["verify", *args, "-q"])
        assert r.exit_code == 3, (args, r.output)
        assert "Traceback" not in r.output


def test_hf_rowwise_layer_as_colwise_crash_names_the_module():
    """down_proj as colwise: DTensor's sharding propagation fails at trace time (REFUTED with the error as the
    witness); the message names the module that failed."""
    from tvcert.frontends.hf import trace_hf
    from tvcert.frontends.trace import TraceError

    with pytest.raises(TraceError) as ei:
        trace_hf("llama", 2, tp_plan={"model.layers.*.mlp.down_proj": "colwise"})
    assert ei.value.kind == "crash" and "in module model.layers.0.mlp.down_proj" in str(ei.value)


def test_hf_cli_model_class_with_config_override_gqa_one_kv_head_per_rank():
    from click.testing import CliRunner

    from tvcert.cli import main

    r = CliRunner().invoke(main, ["verify", "--hf", "LlamaForCausalLM", "--tp", "2", "-q", "--json",
                                  "--set", 'config={"num_key_value_heads": 2}'])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["verdict"] == "VERIFIED"
