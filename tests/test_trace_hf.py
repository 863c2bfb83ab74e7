"""Hugging Face transformers tiny Llama with its built-in tensor-parallel plan, traced and verified.

Pinned: transformers==5.24.0 with torch==2.13.0 (CPU, fake process group)."""
from __future__ import annotations

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
