"""Front-end coverage: how many traced PyTorch programs reach a verdict, and which ops block the rest.

    .venv/bin/python bench/frontend_coverage.py [--quick]     (writes nothing; bench/frontend_coverage.md records a run)

Three parts:

1. **Programs**: every ``examples/torch`` spec with its correct and buggy variants (``--set`` arguments), and
   the end-to-end programs of tests/test_aten_coverage.py, traced and verified.  Each has an expected verdict
   (correct -> VERIFIED, injected bug -> REFUTED); the table shows what was reached.  A trace-time crash of
   the parallel program counts as REFUTED (as the CLI reports it).
2. **Probes**: stock code the front end did not trace before issue 15 -- Hugging Face Llama with its default
   SDPA attention and a normal call (no hand-made 4-D mask).
3. **Ops**: the issue's measured blocker ops, each in a one-op program: converted or UNKNOWN with the reason.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# --src DIR: measure another copy of the orchestrator package (e.g. an older commit's, from `git archive`)
_SRC = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else str(ROOT / "orchestrator")
sys.path.insert(0, _SRC)
sys.path.insert(0, str(ROOT / "examples" / "torch"))

PROGRAMS = [  # (module, kwargs, expected)
    ("megatron_mlp", {}, "VERIFIED"),
    ("megatron_mlp", {"bug": "no_allreduce"}, "REFUTED"),
    ("megatron_block", {}, "VERIFIED"),
    ("megatron_block", {"bug": "no_allreduce"}, "REFUTED"),
    ("megatron_block", {"bug": "no_copy"}, "REFUTED"),
    ("megatron_block", {"sp": True}, "VERIFIED"),
    ("megatron_block", {"sp": True, "bug": "no_norm_grad_sync"}, "REFUTED"),
    # megatron-core 0.16.1's own modules (examples/torch/mcore_*.py, tvcert.frontends.megatron_core)
    ("mcore_mlp", {}, "VERIFIED"),
    ("mcore_mlp", {"sp": True}, "VERIFIED"),
    ("mcore_mlp", {"sp": True, "bug": "no_finalize"}, "REFUTED"),
    ("mcore_vocab", {"head": "embedding"}, "VERIFIED"),
    ("mcore_vocab", {"head": "embedding", "bug": "off_by_one"}, "REFUTED"),
    ("mcore_vocab", {}, "VERIFIED"),  # the flattened target-logit pick (cross_entropy.py:59): kernel/vocab_pick.py
    ("mcore_vocab", {"bug": "ce_wrong_rank"}, "REFUTED"),
    ("mcore_vocab", {"bug": "ce_no_allreduce"}, "REFUTED"),
    ("mcore_layer", {}, "VERIFIED"),  # micro-batch 1
    ("mcore_layer", {"sp": True}, "VERIFIED"),
    ("mcore_layer", {"sp": True, "bug": "ln_not_marked"}, "REFUTED"),
    ("mcore_layer", {"sp": True, "bug": "no_finalize"}, "REFUTED"),
    ("mcore_layer", {"b": 2}, "VERIFIED"),  # batch x heads merge (dot_product_attention.py:184) interleaved
    ("mcore_layer", {"b": 2, "sp": True}, "VERIFIED"),
    ("mcore_layer", {"tp": 4}, "VERIFIED"),  # one head per rank: the merge's unit dims (layout_map_equal)
    ("mcore_layer", {"tp": 4, "sp": True}, "VERIFIED"),
    ("mcore_layer", {"tp": 4, "sp": True, "bug": "no_finalize"}, "REFUTED"),
    ("mcore_layer", {"tp": 4, "b": 2}, "VERIFIED"),  # both merges of [sq, b, 1, hn]: KCtx.reshape_into decides
    ("mcore_layer", {"tp": 4, "b": 2, "sp": True}, "VERIFIED"),
    ("mcore_layer", {"tp": 4, "b": 2, "sp": True, "bug": "ln_not_marked"}, "REFUTED"),
    ("dtensor_llama_block", {}, "VERIFIED"),
    ("dtensor_llama_block", {"sp": True}, "VERIFIED"),
    ("dtensor_llama_block", {"swap": True}, "REFUTED"),
    ("dtensor_transformer", {}, "VERIFIED"),
    ("dtensor_transformer", {"tp": 4}, "VERIFIED"),
    ("dtensor_transformer", {"sp": True}, "VERIFIED"),
    ("dtensor_transformer", {"sp": True, "tp": 4}, "VERIFIED"),
    ("dtensor_transformer", {"sp": True, "bug": "no_sequence_parallel"}, "REFUTED"),
    ("hf_llama_tp", {}, "VERIFIED"),
    ("hf_llama_tp", {"tp_plan": {"model.layers.*.mlp.down_proj": "colwise"}}, "REFUTED"),
    ("hf_llama_tp", {"vocab_parallel": True}, "VERIFIED"),
    ("tp_ln_gelu_mlp", {}, "VERIFIED"),
    ("tp_ln_gelu_mlp", {"approximate": "tanh", "dtype": "float64"}, "VERIFIED"),
    ("tp_ln_gelu_mlp", {"dtype": "bfloat16", "tp": 4}, "VERIFIED"),
    ("tp_ln_gelu_mlp", {"checkpoint": "nonreentrant"}, "VERIFIED"),
    ("tp_ln_gelu_mlp", {"checkpoint": "reentrant"}, "VERIFIED"),
    ("tp_ln_gelu_mlp", {"bug": "no_allreduce"}, "REFUTED"),
    ("tp_ln_gelu_mlp", {"bug": "no_allreduce", "checkpoint": "reentrant"}, "REFUTED"),
    ("tp_ln_gelu_mlp", {"bug": "bias_every_rank"}, "REFUTED"),
    ("tp_ln_gelu_mlp", {"bug": "no_input_grad_reduce"}, "REFUTED"),
    ("dtensor_ln_gelu_mlp", {}, "VERIFIED"),
    ("dtensor_ln_gelu_mlp", {"sp": True}, "VERIFIED"),
    ("dtensor_ln_gelu_mlp", {"sp": True, "tp": 4, "approximate": "tanh"}, "VERIFIED"),
    ("dtensor_ln_gelu_mlp", {"sp": True, "bug": "no_sequence_parallel"}, "REFUTED"),
    ("tp_attention_sdpa", {}, "VERIFIED"),
    ("tp_attention_sdpa", {"attn": "manual"}, "VERIFIED"),
    ("tp_attention_sdpa", {"tp": 4, "dtype": "float64"}, "VERIFIED"),
    ("tp_attention_sdpa", {"bug": "no_allreduce"}, "REFUTED"),
    ("tp_attention_sdpa", {"bug": "not_causal"}, "REFUTED"),
    ("tp_attention_sdpa", {"attn": "manual", "bug": "not_causal"}, "REFUTED"),
    ("tp_attention_sdpa", {"bug": "local_scale"}, "REFUTED"),
    # torch's own ring attention (examples/torch/cp_attention.py): UNKNOWN today, the ranks run different programs
    ("cp_attention", {"cp": 2, "lb": False}, "VERIFIED"),
    ("cp_attention", {"cp": 2}, "VERIFIED"),
    ("cp_attention", {"cp": 4}, "VERIFIED"),
    ("cp_attention", {"cp": 2, "bug": "lb_order"}, "REFUTED"),
    ("cp_attention", {"cp": 2, "lb": False, "tp": 2}, "VERIFIED"),
    # the rank-uniform configuration (non-causal, contiguous, all-to-all rotater): UNKNOWN, bugs REFUTED
    ("cp_attention", {"cp": 2, "lb": False, "causal": False, "rotate": "alltoall"}, "VERIFIED"),
    ("cp_attention", {"cp": 2, "lb": False, "causal": False, "rotate": "alltoall", "bug": "lse_not_updated"}, "REFUTED"),
    ("cp_attention", {"cp": 2, "lb": False, "causal": False, "rotate": "alltoall", "bug": "plain_average"}, "REFUTED"),
    ("cp_attention", {"cp": 3, "lb": False, "causal": False, "rotate": "alltoall", "bug": "dkv_backwards"}, "REFUTED"),
    ("cp_attention", {"cp": 2, "lb": False, "causal": False, "rotate": "alltoall", "rope": True}, "VERIFIED"),
    ("cp_attention", {"cp": 2, "lb": False, "causal": False, "rotate": "alltoall", "bug": "positions_not_offset"},
     "REFUTED"),
    # mean losses and DDP's averaged gradients (examples/torch/realcode/norm_ddp.py)
    ("realcode.norm_ddp", {}, "VERIFIED"),
    ("realcode.norm_ddp", {"loss": "sum_div"}, "VERIFIED"),
    ("realcode.norm_ddp", {"loss": "means"}, "VERIFIED"),
    ("realcode.norm_ddp", {"loss": "global"}, "VERIFIED"),
    ("realcode.norm_ddp", {"dp": 4}, "VERIFIED"),
    ("realcode.norm_ddp", {"bug": "sum_grads"}, "REFUTED"),
    ("realcode.norm_ddp", {"bug": "avg_twice"}, "REFUTED"),
    ("realcode.norm_ddp", {"bug": "off_by_one"}, "REFUTED"),
    ("realcode.norm_ddp", {"loss": "global", "bug": "global_avg"}, "REFUTED"),
    # a transformer-like block under DDP: factors differ where paths meet (examples/torch/realcode/norm_ddp_block.py)
    ("realcode.norm_ddp_block", {}, "VERIFIED"),
    ("realcode.norm_ddp_block", {"dp": 4}, "VERIFIED"),
    ("realcode.norm_ddp_block", {"bug": "avg_twice"}, "REFUTED"),
    ("realcode.norm_ddp_block", {"bug": "no_residual_scale"}, "REFUTED"),
    # token-count normalisation across dp (examples/torch/realcode/norm_tokens.py)
    ("realcode.norm_tokens", {}, "VERIFIED"),
    ("realcode.norm_tokens", {"dp": 4}, "VERIFIED"),
    ("realcode.norm_tokens", {"bug": "local_count"}, "REFUTED"),
    ("realcode.norm_tokens", {"bug": "avg_grads"}, "REFUTED"),
    ("realcode.norm_tokens", {"bug": "no_count_reduce"}, "REFUTED"),
    ("realcode.norm_tokens", {"count_by": "gather"}, "VERIFIED"),
    ("realcode.norm_tokens", {"count_by": "gather", "bug": "gather_mean"}, "REFUTED"),
    # the global count over -100-padded labels, 1/n carried into the gradients (realcode/norm_padded_tokens.py)
    ("realcode.norm_padded_tokens", {}, "VERIFIED"),
    ("realcode.norm_padded_tokens", {"sync": "avg"}, "VERIFIED"),  # DDP: loss * dp, gradients averaged
    ("realcode.norm_padded_tokens", {"sync": "avg", "dp": 4}, "VERIFIED"),
    ("realcode.norm_padded_tokens", {"bug": "local_count"}, "REFUTED"),
    ("realcode.norm_padded_tokens", {"bug": "no_count_reduce"}, "REFUTED"),
    ("realcode.norm_padded_tokens", {"sync": "avg", "bug": "avg_grads"}, "REFUTED"),
    # tokens sharded over dp x cp, gradients averaged over both (examples/torch/realcode/norm_dp_cp.py)
    ("realcode.norm_dp_cp", {}, "VERIFIED"),
    ("realcode.norm_dp_cp", {"order": "cp_dp"}, "VERIFIED"),
    ("realcode.norm_dp_cp", {"sync": "sum_div"}, "VERIFIED"),
    ("realcode.norm_dp_cp", {"dp": 2, "cp": 2}, "VERIFIED"),
    ("realcode.norm_dp_cp", {"bug": "dp_only"}, "REFUTED"),
    ("realcode.norm_dp_cp", {"bug": "div_dp"}, "REFUTED"),
    ("realcode.norm_dp_cp", {"bug": "avg_then_sum"}, "REFUTED"),
    # reduce_scatter of a replicated gradient (examples/torch/realcode/norm_rs_replicate.py)
    ("realcode.norm_rs_replicate", {}, "VERIFIED"),
    ("realcode.norm_rs_replicate", {"how": "sum_div"}, "VERIFIED"),
    ("realcode.norm_rs_replicate", {"dp": 4}, "VERIFIED"),
    ("realcode.norm_rs_replicate", {"bug": "sum"}, "REFUTED"),
    ("realcode.norm_rs_replicate", {"bug": "div_twice"}, "REFUTED"),
    # DTensor TP block with a mean loss (examples/torch/realcode/norm_dtensor_mean.py)
    ("realcode.norm_dtensor_mean", {}, "VERIFIED"),
    ("realcode.norm_dtensor_mean", {"loss": "mean"}, "VERIFIED"),
    ("realcode.norm_dtensor_mean", {"loss": "sum_div"}, "VERIFIED"),
    ("realcode.norm_dtensor_mean", {"sp": True, "loss": "global_div"}, "VERIFIED"),
    ("realcode.norm_dtensor_mean", {"sp": True, "loss": "global_div", "tp": 4}, "VERIFIED"),
    ("realcode.norm_dtensor_mean", {"sp": True}, "REFUTED"),
    ("realcode.norm_dtensor_mean", {"sp": True, "loss": "global_div", "bug": "no_sequence_parallel"}, "REFUTED"),
    ("realcode.norm_dtensor_mean", {"sp": True, "bug": "sum_as_mean"}, "REFUTED"),
    # DTensor loss_parallel() with the backward inside the context (examples/torch/realcode/loss_parallel_dtensor.py)
    ("realcode.loss_parallel_dtensor", {"reduction": "sum"}, "VERIFIED"),
    ("realcode.loss_parallel_dtensor", {"reduction": "sum", "tp": 4}, "VERIFIED"),
    ("realcode.loss_parallel_dtensor", {}, "VERIFIED"),  # the count of labels != ignore_index (int_range_count)
    ("realcode.loss_parallel_dtensor", {"tp": 4}, "VERIFIED"),
    ("realcode.loss_parallel_dtensor", {"bug": "loss_div_tp"}, "REFUTED"),
    # the same over -100-padded labels: the patterns' masked form, 1 / count as a 0-d factor (realcode/loss_parallel_padded.py)
    ("realcode.loss_parallel_padded", {}, "VERIFIED"),
    ("realcode.loss_parallel_padded", {"tp": 4}, "VERIFIED"),
    ("realcode.loss_parallel_padded", {"reduction": "sum"}, "VERIFIED"),
    ("realcode.loss_parallel_padded", {"bug": "loss_div_tp"}, "REFUTED"),
    ("realcode.loss_parallel_padded", {"bug": "ignore_minus_one"}, "REFUTED"),
    # layout rules on real code (examples/torch/realcode/layout_*.py): one head / one sample per rank, rank-sliced
    # blocks and their slice_backward pads, shards gathered as a stack
    ("realcode.layout_heads", {}, "VERIFIED"),
    ("realcode.layout_heads", {"tp": 4, "nkv": 4}, "VERIFIED"),
    ("realcode.layout_heads", {"bug": "seq_first"}, "REFUTED"),
    ("realcode.layout_heads", {"bug": "kv_block_reversed"}, "REFUTED"),
    ("realcode.layout_heads", {"tp": 4, "nkv": 4, "bug": "kv_block_reversed"}, "REFUTED"),
    ("realcode.layout_heads", {"bug": "no_allreduce"}, "REFUTED"),
    ("realcode.layout_microbatch", {}, "VERIFIED"),
    ("realcode.layout_microbatch", {"dp": 3}, "VERIFIED"),
    ("realcode.layout_microbatch", {"bug": "view_for_t"}, "REFUTED"),
    ("realcode.layout_microbatch", {"bug": "no_grad_allreduce"}, "REFUTED"),
    ("realcode.layout_gather_stack", {}, "VERIFIED"),
    ("realcode.layout_gather_stack", {"tp": 4}, "VERIFIED"),
    ("realcode.layout_gather_stack", {"bug": "stack_inner"}, "REFUTED"),
    ("realcode.layout_gather_stack", {"bug": "reversed"}, "REFUTED"),
    # cumsum over a sequence sharded across ranks: local cumsum + the carried offset (realcode/cumsum_sp.py, block_prefix_sum)
    ("realcode.cumsum_sp", {}, "VERIFIED"),
    ("realcode.cumsum_sp", {"variant": "where", "sp": 3}, "VERIFIED"),
    ("realcode.cumsum_sp", {"variant": "matmul", "sp": 4}, "VERIFIED"),
    ("realcode.cumsum_sp", {"variant": "gcumsum", "sp": 3}, "VERIFIED"),  # cumsum(tots)[r] - tots[r]
    ("realcode.cumsum_sp", {"variant": "lastrow", "sp": 3}, "VERIFIED"),  # the carry is y[-1:] of the local scan
    ("realcode.cumsum_sp", {"variant": "exclusive", "block": 5}, "VERIFIED"),
    ("realcode.cumsum_sp", {"variant": "reverse"}, "VERIFIED"),  # flip(cumsum(flip(x))): the later ranks' totals
    ("realcode.cumsum_sp", {"variant": "dim1"}, "VERIFIED"),
    ("realcode.cumsum_sp", {"variant": "flat", "sp": 4, "block": 1}, "VERIFIED"),
    ("realcode.cumsum_sp", {"bug": "self"}, "REFUTED"),
    ("realcode.cumsum_sp", {"bug": "after", "sp": 3}, "REFUTED"),
    ("realcode.cumsum_sp", {"variant": "dim1", "bug": "global_rank"}, "REFUTED"),
    ("realcode.cumsum_sp", {"bug": "no_offset"}, "REFUTED"),
    ("realcode.cumsum_sp", {"variant": "gcumsum", "sp": 4, "bug": "self"}, "REFUTED"),
    ("realcode.cumsum_sp", {"variant": "reverse", "sp": 3, "bug": "after"}, "REFUTED"),
    ("realcode.cumsum_sp", {"variant": "lastrow", "bug": "self"}, "REFUTED"),
    # a training step through the sharded scan: backward to the input and to a weight before it (realcode/cumsum_sp_grad.py)
    ("realcode.cumsum_sp_grad", {}, "VERIFIED"),  # autograd: the gradient offset via reduce_scatter (..._scattered)
    ("realcode.cumsum_sp_grad", {"sp": 3, "dp": 2}, "VERIFIED"),
    ("realcode.cumsum_sp_grad", {"grad": "custom"}, "VERIFIED"),  # a hand-written backward (block_suffix_sum)
    ("realcode.cumsum_sp_grad", {"grad": "custom", "bug": "bwd_after"}, "REFUTED"),
    ("realcode.cumsum_sp_grad", {"grad": "custom", "bug": "bwd_no_offset", "sp": 3}, "REFUTED"),
    ("realcode.cumsum_sp_grad", {"grad": "custom", "bug": "global_rank"}, "REFUTED"),
    ("realcode.cumsum_sp_grad", {"bug": "global_rank"}, "REFUTED"),
    ("realcode.cumsum_sp_grad", {"bug": "no_grad_sync"}, "REFUTED"),
    ("realcode.cumsum_sp_grad", {"grad": "reverse", "sp": 3}, "VERIFIED"),  # block_prefix_sum_scattered, flip pairs
    ("realcode.cumsum_sp_grad", {"grad": "reverse", "bug": "fwd_self"}, "REFUTED"),
    # fused w_qkv / gate-up weights, the rank's block of each part (examples/torch/realcode/fused_qkv.py)
    ("realcode.fused_qkv", {}, "VERIFIED"),
    ("realcode.fused_qkv", {"tp": 4}, "VERIFIED"),
    ("realcode.fused_qkv", {"part": "gate_up"}, "VERIFIED"),
    ("realcode.fused_qkv", {"part": "gate_up", "tp": 4}, "VERIFIED"),
    ("realcode.fused_qkv", {"bug": "swap_parts"}, "REFUTED"),
    ("realcode.fused_qkv", {"bug": "head_major"}, "REFUTED"),
    ("realcode.fused_qkv", {"bug": "plain_shard"}, "REFUTED"),
    ("realcode.fused_qkv", {"bug": "no_allreduce"}, "REFUTED"),
    ("realcode.fused_qkv", {"part": "gate_up", "bug": "swap_parts"}, "REFUTED"),
    ("realcode.fused_qkv", {"slices": True}, "VERIFIED"),  # Phi-3's qkv[..., :n] slices and their backward pads
    ("realcode.fused_qkv", {"slices": True, "bug": "swap_parts"}, "REFUTED"),
    # GQA: parts of different sizes, concat_groups layout (realcode/fused_qkv_gqa.py), and Phi-3's slices of it
    ("realcode.fused_qkv_gqa", {}, "VERIFIED"),
    ("realcode.fused_qkv_gqa", {"tp": 4, "nh": 8, "nkv": 4}, "VERIFIED"),
    ("realcode.fused_qkv_gqa", {"bug": "qk_boundary"}, "REFUTED"),
    ("realcode.fused_qkv_gqa", {"bug": "kv_swap"}, "REFUTED"),
    ("realcode.fused_qkv_gqa", {"bug": "plain_shard"}, "REFUTED"),
    ("realcode.fused_qkv_gqa", {"bug": "plan_boundary"}, "REFUTED"),
    ("realcode.fused_qkv_gqa_slices", {}, "VERIFIED"),
    ("realcode.fused_qkv_gqa_slices", {"tp": 4, "nh": 8, "nkv": 4}, "VERIFIED"),
    ("realcode.fused_qkv_gqa_slices", {"bug": "kv_swap"}, "REFUTED"),
    ("realcode.fused_qkv_gqa_slices", {"bug": "plan_boundary"}, "REFUTED"),
    # rank-reversed blocks (realcode/layout_reversed.py): kernel/reversed_blocks.py
    ("realcode.layout_reversed", {}, "VERIFIED"),
    ("realcode.layout_reversed", {"bug": "no_flip"}, "REFUTED"),
    ("realcode.layout_reversed", {"bug": "own_block"}, "REFUTED"),
    ("realcode.layout_reversed", {"bug": "no_grad_sum"}, "REFUTED"),
    ("realcode.layout_reversed", {"bug": "flip_inner"}, "REFUTED"),
    ("realcode.layout_reversed", {"bug": "overlap"}, "REFUTED"),
    ("realcode.layout_reversed", {"tp": 4}, "VERIFIED"),
    # uneven shards padded by a rank-dependent pad before an all_gather (realcode/uneven_pad_gather.py)
    ("realcode.uneven_pad_gather", {}, "VERIFIED"),
    ("realcode.uneven_pad_gather", {"tp": 4, "T": 6}, "VERIFIED"),
    ("realcode.uneven_pad_gather", {"bug": "keep_pad"}, "REFUTED"),
    ("realcode.uneven_pad_gather", {"bug": "pad_before"}, "REFUTED"),
    ("realcode.uneven_pad_gather", {"bug": "width_off"}, "REFUTED"),
    # DDP's own reducer hooks and torchtitan's SimpleFSDP (examples/torch/ddp_mlp.py, fsdp_mlp.py)
    ("ddp_mlp", {}, "VERIFIED"),
    ("ddp_mlp", {"sharded": True}, "VERIFIED"),
    ("ddp_mlp", {"bug": "loss_div_world"}, "REFUTED"),
    ("ddp_mlp", {"bug": "sum_loss"}, "REFUTED"),
    ("ddp_mlp", {"bug": "same_shard"}, "REFUTED"),
    ("fsdp_mlp", {}, "VERIFIED"),
    ("fsdp_mlp", {"mode": "hybrid_shard"}, "VERIFIED"),
    ("fsdp_mlp", {"mode": "fsdp_tp"}, "VERIFIED"),
    ("fsdp_mlp", {"bug": "local_mean"}, "REFUTED"),
    ("fsdp_mlp", {"mode": "hybrid_shard", "bug": "local_mean"}, "REFUTED"),
    ("fsdp_mlp", {"mode": "fsdp_tp", "bug": "local_mean"}, "REFUTED"),
    ("fsdp_mlp", {"mode": "hybrid_shard", "bug": "replica_same_batch"}, "REFUTED"),
    ("fsdp_mlp", {"optimizer": "sgd_momentum"}, "VERIFIED"),
    ("fsdp_mlp", {"optimizer": "adamw"}, "VERIFIED"),
    ("fsdp_titan_llama3", {}, "VERIFIED"),
    ("fsdp_titan_llama3", {"mode": "hybrid_shard"}, "VERIFIED"),
    ("fsdp_titan_llama3", {"bug": "local_mean"}, "REFUTED"),
    ("ddp_titan_llama3", {}, "VERIFIED"),
    ("ddp_titan_llama3", {"bug": "loss_div_world"}, "REFUTED"),
    ("ddp_titan_llama3", {"bug": "off_by_one"}, "REFUTED"),
    ("ddp_titan_llama3", {"dp": 4}, "VERIFIED"),
    ("ddp_titan_llama3", {"layers": 2}, "VERIFIED"),
    # torch.distributed.pipelining (examples/torch/pp_*.py, tvcert.frontends.pipelining)
    ("pp_mlp", {}, "VERIFIED"),
    ("pp_mlp", {"schedule": "gpipe"}, "VERIFIED"),
    ("pp_mlp", {"bug": "no_scale"}, "REFUTED"),
    ("pp_mlp", {"bug": "wrong_layers"}, "REFUTED"),
    ("pp_mlp", {"bug": "no_accumulate"}, "REFUTED"),
    ("pp_tp_mlp", {}, "VERIFIED"),
    ("pp_tp_mlp", {"schedule": "gpipe"}, "VERIFIED"),
    ("pp_tp_mlp", {"bug": "no_scale"}, "REFUTED"),
    ("pp_dp_mlp", {}, "VERIFIED"),
    ("pp_dp_mlp", {"microbatches": 2}, "VERIFIED"),  # UNKNOWN today: micro-batches of a dp shard (slice of Shard(0))
    ("pp_dp_mlp", {"bug": "wrong_peer"}, "REFUTED"),
]


# issue 15 §2 / §3 classes of the real-code corpus (examples/torch/realcode/ and the stock-code specs that exercise
# them): the bench prints the fraction of each class's rows reaching the expected verdict
CLASSES = {
    "reshape of one head / sample / row per rank": ("realcode.layout_heads", "realcode.layout_microbatch",
                                                    "mcore_layer"),
    "pad whose pads depend on the rank": ("realcode.uneven_pad_gather",),
    "output facts spelled differently (sum/n vs mean, mean of means)": ("realcode.norm_ddp", "realcode.norm_dtensor_mean",
                                                                         "realcode.norm_ddp_block"),
    "reduce_scatter of a Replicate input": ("realcode.norm_rs_replicate",),
    "all_gather along another dim / of partial statistics": ("realcode.layout_gather_stack", "realcode.norm_tokens"),
    "all_reduce(avg) over several axes": ("realcode.norm_dp_cp",),
    "prefix scan with a carried offset": ("realcode.cumsum_sp", "realcode.cumsum_sp_grad"),
    "rank-reversed blocks": ("realcode.layout_reversed",),
    "mean losses, DDP's averaged gradients, token counts": ("realcode.norm_padded_tokens", "ddp_mlp"),
    "fused / interleaved layouts (§3)": ("realcode.fused_qkv", "realcode.fused_qkv_gqa", "realcode.fused_qkv_gqa_slices"),
    "loss_parallel() (§3)": ("realcode.loss_parallel_dtensor", "realcode.loss_parallel_padded"),
}


def class_summary(rows) -> list[str]:
    out = []
    for name, mods in CLASSES.items():
        got = [(v, want) for m, _, want, v in rows if m in mods]
        if got:
            dec = sum(v in ("VERIFIED", "REFUTED") for v, _ in got)
            ok = sum(v == want for v, want in got)
            out.append(f"| {name} | {len(got)} | {dec} | {ok} |")
    return out


HF_MODELS = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "phi3")
HF_BUGS = {  # (label, tp_plan override, models): realistic plan bugs, each expected REFUTED
    "doubled all_reduce": ({"model.layers.*.mlp": "all_reduce"}, HF_MODELS),
    "rowwise layer as colwise": ({"model.layers.*.mlp.down_proj": "colwise"}, HF_MODELS),
    "fused qkv colwise without gather": ({"model.layers.*.self_attn.qkv_proj": "colwise"}, ("phi3",)),
    "q_norm gradient all_reduce missing": ({"model.layers.*.self_attn.q_norm": "replicate"}, ("qwen3",)),
}


def hf_rows():
    """``tvcert verify --hf MODEL --tp N`` (tvcert.frontends.hf): each model at tp 2 and 4, then each bug at tp 2."""
    rows = [(m, tp, "-", None, "VERIFIED") for m in HF_MODELS for tp in (2, 4)]
    rows += [(m, 2, label, plan, "REFUTED") for label, (plan, models) in HF_BUGS.items() for m in models]
    return rows


def run_hf(model: str, tp: int, plan):
    """(verdict, where: the first divergence's op, line and module or the differing outputs, seconds)."""
    import re

    from tvcert.engine.verify import verify
    from tvcert.frontends.hf import trace_hf
    from tvcert.frontends.trace import TraceError
    from tvcert.plan import load_plan

    t = time.time()
    try:
        raw = trace_hf(model, tp, **({"tp_plan": plan} if plan else {}))
    except TraceError as exc:
        verdict = {"crash": "REFUTED (trace-time crash)", "input": "BAD_INPUT"}.get(exc.kind, "UNKNOWN")
        return verdict, f"{exc.op or exc.kind}: {str(exc)[:200]}", time.time() - t
    res = verify(load_plan(raw))
    why = res.reasons[0][:200] if res.reasons and res.verdict == "UNKNOWN" else ""
    ce = res.counterexample or {}
    fd = ce.get("first_divergence")
    if res.verdict == "REFUTED" and fd:
        m = re.search(r"nodes\[(\d+)\]", fd.get("node", ""))
        prog = next((p for p in raw["parallel"] if p["name"] == fd.get("program")), raw["parallel"][0])  # a stage's
        node = prog["nodes"][int(m.group(1))] if m else {}
        ins = {n.get("name") or (n.get("outputs") or [None])[0]: n for n in prog["nodes"]}
        feeders = sorted({ins[i]["module"] for i in node.get("inputs", []) if i in ins and ins[i].get("module")
                          and ins[i].get("module") != node.get("module")})
        why = (f"first divergence: {fd.get('op')} at {fd.get('src')} in module {node.get('module')}"
               + (f" (fed by {', '.join(feeders)})" if feeders else ""))
    elif res.verdict == "REFUTED":
        why = "outputs differ: " + ", ".join(o["name"] for o in ce.get("outputs", []) if not o["equal"])
    return res.verdict, why, time.time() - t


TITAN_JOBS = [  # (examples/torchtitan job config, trace_titan_job kwargs, expected): `tvcert trace --torchtitan --config`
    ("llama3_debug_tp2", {}, "VERIFIED"),
    ("llama3_debug_tp2", {"mesh_context": False}, "REFUTED"),
    ("llama3_debug_fsdp2", {}, "VERIFIED"),
    ("llama3_debug_hsdp", {}, "VERIFIED"),
    ("llama3_debug_fsdp2_tp2", {}, "VERIFIED"),
    ("llama3_debug_hsdp_tp2", {}, "VERIFIED"),
    ("llama3_debug_pp2", {}, "VERIFIED"),  # torchtitan's pipeline_llm, 1F1B (tvcert.frontends.pipelining)
]


def run_titan_job(job: str, kw: dict):
    """(verdict, reason, trace seconds, verify seconds) of a job config at 1 layer."""
    from tvcert.engine.verify import verify
    from tvcert.frontends.titan_config import load_job
    from tvcert.frontends.torchtitan import trace_titan_job
    from tvcert.frontends.trace import TraceError
    from tvcert.plan import load_plan

    t = time.time()
    try:
        raw = trace_titan_job(load_job(str(ROOT / "examples" / "torchtitan" / f"{job}.toml"), "llama3-debug"),
                              layers=1, **kw)
    except TraceError as exc:
        verdict = {"crash": "REFUTED", "input": "BAD_INPUT"}.get(exc.kind, "UNKNOWN")
        return verdict, f"{exc.op or exc.kind}: {str(exc)[:160]}", time.time() - t, 0.0
    t1 = time.time()
    res = verify(load_plan(raw))
    why = "" if res.verdict != "UNKNOWN" else (res.reasons[0][:160] if res.reasons else "")
    return res.verdict, why, t1 - t, time.time() - t1


def run_spec(mod_name: str, kw: dict):
    """(verdict, blocking op or first reason, seconds)."""
    import importlib

    from tvcert.engine.verify import verify
    from tvcert.frontends.trace import TraceError, trace_plan
    from tvcert.plan import load_plan

    t = time.time()
    mod = importlib.import_module(mod_name)
    try:
        spec = mod.tvcert_trace(**kw)
        raw = spec if "tvcert_plan" in spec else trace_plan(**spec)
    except TraceError as exc:
        verdict = {"crash": "REFUTED", "input": "BAD_INPUT"}.get(exc.kind, "UNKNOWN")
        return verdict, f"{exc.op or exc.kind}: {str(exc)[:160]}", time.time() - t
    except Exception as exc:  # noqa: BLE001 - an older front end may fail otherwise
        return "ERROR", f"{type(exc).__name__}: {str(exc)[:160]}", time.time() - t
    res = verify(load_plan(raw))
    why = "" if res.verdict != "UNKNOWN" else (res.reasons[0][:160] if res.reasons else "")
    return res.verdict, why, time.time() - t


def hf_default_attention(tp: int = 2, bug: bool = False):
    """Hugging Face Llama as shipped: default (SDPA) attention, called with input ids only.  ``bug``: the
    attention's o_proj entry "colwise" instead of "rowwise" (traces; the shapes still fit at NH = 4)."""
    import hf_llama_tp as hf
    import torch

    from tvcert.frontends.dtensor import trace_module_plan

    def make():
        from transformers import LlamaForCausalLM

        cfg = hf.config()
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        return LlamaForCausalLM(cfg).float()

    plan = {"model.embed_tokens": "replicate"}
    if bug:
        plan["model.layers.*.self_attn.o_proj"] = "colwise"
    return trace_module_plan(make, lambda m, mesh: hf.parallelize(m, mesh, plan), hf.loss_fn,
                             data={"input_ids": {"shape": [hf.B, hf.S], "dtype": "int", "range": hf.V},
                                   "labels": {"shape": [hf.B, hf.S], "dtype": "int", "range": hf.V}},
                             mesh={"tp": tp}, name="hf_llama_sdpa")


def run_probe(fn):
    from tvcert.engine.verify import verify
    from tvcert.frontends.trace import TraceError
    from tvcert.plan import load_plan

    t = time.time()
    try:
        raw = fn()
    except TraceError as exc:
        verdict = {"crash": "REFUTED (trace-time crash)", "input": "BAD_INPUT"}.get(exc.kind, "UNKNOWN")
        return verdict, f"{exc.op or exc.kind}: {str(exc)[:200]}", time.time() - t
    except Exception as exc:  # noqa: BLE001 - a probe of third-party code
        return "ERROR", f"{type(exc).__name__}: {str(exc)[:200]}", time.time() - t
    res = verify(load_plan(raw))
    return res.verdict, (res.reasons[0][:200] if res.reasons and res.verdict == "UNKNOWN" else ""), time.time() - t


def op_probes():
    """name -> (fn(x, *ints), float input shape, int inputs {shape, range}); index tensors are int inputs (a
    literal torch.tensor([...]) of distinct values would be a baked constant, refused for another reason)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    aten = torch.ops.aten
    sdpa = F.scaled_dot_product_attention
    q = (1, 2, 4, 8)
    return {
        "native_layer_norm (+ backward)": (lambda x: F.layer_norm(x, (8,)).sum(), (2, 8), []),
        "gelu_backward (exact)": (lambda x: F.gelu(x).sum(), (2, 8), []),
        "gelu_backward (tanh)": (lambda x: F.gelu(x, approximate="tanh").sum(), (2, 8), []),
        "sdpa (math, causal, + backward)": (lambda x: sdpa(x, x, x, is_causal=True).sum(), q, []),
        "sdpa (bool mask, + backward)": (lambda x, m: sdpa(x, x, x, attn_mask=m.bool()).sum(), q, [((4, 4), 2)]),
        "_scaled_dot_product_flash_attention_for_cpu (+ backward)":
            (lambda x: aten._scaled_dot_product_flash_attention_for_cpu(x, x, x, is_causal=True)[0].sum(), q, []),
        "_scaled_dot_product_efficient_attention (+ backward)":
            (lambda x: aten._scaled_dot_product_efficient_attention(x, x, x, None, False)[0].sum(), q, []),
        "_scaled_dot_product_flash_attention (CUDA kernel)":
            (lambda x: aten._scaled_dot_product_flash_attention(x, x, x)[0].sum(), q, []),
        "cumsum": (lambda x: x.cumsum(1).sum(), (2, 8), []),
        "max.dim / min.dim": (lambda x: x.max(1).values.sum() + x.min(1)[0].sum(), (2, 8), []),
        "stack / unbind": (lambda x: torch.stack(x.unbind(0), 1).sum(), (2, 8), []),
        "index.Tensor": (lambda x, i: x[:, i].sum(), (2, 8), [((3,), 8)]),
        "scatter (number)": (lambda x, i: x.scatter(1, i, 1.0).sum(), (2, 8), [((2, 3), 8)]),
        "scatter_add": (lambda x, i: x.scatter_add(1, i, x[:, :3]).sum(), (2, 8), [((2, 3), 8)]),
        "scatter (tensor, index longer than 1 on the dim)": (lambda x, i: x.scatter(1, i, x[:, :3]).sum(), (2, 8),
                                                             [((2, 3), 8)]),
        "index_put (accumulate)": (lambda x, i: x.index_put((i,), x[i] * 2, accumulate=True).sum(), (2, 8),
                                   [((3,), 2)]),
        "embedding_dense_backward (padding_idx)": (lambda w, i: F.embedding(i, w, padding_idx=2).sum(), (4, 8),
                                                   [((3,), 4)]),
        "masked_fill -inf + softmax": (lambda x, m: x.masked_fill(m.bool(), float("-inf")).softmax(-1).sum(), (2, 8),
                                       [((2, 8), 2)]),
        "activation checkpoint": (lambda x: checkpoint(torch.tanh, x, use_reentrant=False).sum(), (2, 8), []),
        "sort (+ backward)": (lambda x: x.sort(1).values.sum(), (2, 8), []),
        "reentrant activation checkpoint": (lambda x: checkpoint(torch.tanh, x, use_reentrant=True).sum(), (2, 8), []),
        "dropout (training)": (lambda x: F.dropout(x, 0.1).sum(), (2, 8), []),
    }


def run_op(fn, shape, ints):
    from tvcert.frontends.trace import TraceError, _convert, _parse_inputs, _trace_joint

    spec = {"x": {"shape": list(shape), "param": True}}
    for k, (sh, rng) in enumerate(ints):
        spec[f"i{k}"] = {"shape": list(sh), "dtype": "int", "range": rng}
    names = list(spec)
    specs = _parse_inputs(spec, {})
    try:
        gm, _ = _trace_joint(lambda **kw: fn(*[kw[n] for n in names]), specs, [s.shape for s in specs])
        _convert(gm, names)
    except TraceError as exc:
        return "UNKNOWN", str(exc)[:220]
    except Exception as exc:  # noqa: BLE001
        return "TRACE FAILS", f"{type(exc).__name__}: {str(exc)[:200]}"
    return "converted", ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the Hugging Face probe")
    ap.add_argument("--only", help="only the program rows of these comma-separated modules (and no probes / ops)")
    ap.add_argument("--src", help="the orchestrator directory to import tvcert from (default: this tree's)")
    ap.add_argument("--hf", action="store_true", help="only the `--hf` model table")
    ap.add_argument("--titan", action="store_true", help="only the torchtitan job-config table")
    args = ap.parse_args()
    import logging

    logging.disable(logging.WARNING)
    if args.titan:
        print("## torchtitan job configs (`tvcert trace --torchtitan llama3-debug --config JOB.toml --layers 1`)\n")
        print("| config | options | expected | verdict | trace s | verify s | reason |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for job, kw, want in TITAN_JOBS:
            v, why, tt, tv = run_titan_job(job, kw)
            opts = " ".join(f"{k}={v_}" for k, v_ in kw.items()) or "-"
            print(f"| {job} | {opts} | {want} | {v} | {tt:.1f} | {tv:.2f} | {why.replace('|', '/')} |", flush=True)
        return
    if args.hf:
        print("## Hugging Face models (`tvcert verify --hf MODEL --tp N`)\n")
        print("| model | tp | bug (--set tp_plan) | expected | verdict | s | reason / first divergence |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        n_ok = n = 0
        for m, tp, label, plan, want in hf_rows():
            v, why, dt = run_hf(m, tp, plan)
            n, n_ok = n + 1, n_ok + (v.split()[0] == want)
            bug = f"{label}: `{plan}`" if plan else "-"
            print(f"| {m} | {tp} | {bug} | {want} | {v} | {dt:.1f} | {why.replace('|', '/')} |", flush=True)
        print(f"\n{n_ok} of {n} reach the expected verdict.")
        return
    rows = []
    print("## Programs\n")
    print("| program | --set | expected | verdict | s | blocking op / reason |")
    print("| --- | --- | --- | --- | --- | --- |")
    only = set(args.only.split(",")) if args.only else None
    for mod, kw, want in PROGRAMS:
        if only and mod not in only:
            continue
        v, why, dt = run_spec(mod, kw)
        rows.append((mod, kw, want, v))
        sets = " ".join(f"{k}={v_}" for k, v_ in kw.items()) or "-"
        print(f"| {mod} | {sets} | {want} | {v} | {dt:.1f} | {why.replace('|', '/')} |", flush=True)
    got = Counter(v for *_, v in rows)
    decided = got["VERIFIED"] + got["REFUTED"]
    right = sum(1 for *_, want, v in rows if v == want)
    print(f"\n{decided} of {len(rows)} programs reach a verdict (VERIFIED {got['VERIFIED']}, REFUTED {got['REFUTED']}, "
          f"UNKNOWN {got['UNKNOWN']}); {right} of {len(rows)} reach the expected one.")
    wrong = [(m, kw, w, v) for m, kw, w, v in rows if v != w]
    for m, kw, w, v in wrong:
        print(f"  not as expected: {m} {kw}: {v} (expected {w})")
    print("\n## By class (issue 15 §2 / §3)\n")
    print("| class | rows | reach a verdict | reach the expected one |")
    print("| --- | --- | --- | --- |")
    print("\n".join(class_summary(rows)), flush=True)
    if only:
        return
    if not args.quick:
        print("\n## Probes\n")
        print("| probe | verdict | s | blocking op / reason |")
        print("| --- | --- | --- | --- |")
        for label, fn in (("Hugging Face Llama, default SDPA attention, normal call, tp=2", hf_default_attention),
                          ("the same with o_proj colwise (a plan bug)", lambda: hf_default_attention(bug=True)),
                          ("the same at tp=4", lambda: hf_default_attention(tp=4))):
            v, why, dt = run_probe(fn)
            print(f"| {label} | {v} | {dt:.1f} | {why.replace('|', '/')} |", flush=True)
    print("\n## Ops (one-op programs, loss and gradient)\n")
    print("| op | result | reason |")
    print("| --- | --- | --- |")
    res = Counter()
    for name, (fn, shape, ints) in op_probes().items():
        r, why = run_op(fn, shape, ints)
        res[r] += 1
        print(f"| {name} | {r} | {why.replace('|', '/')} |", flush=True)
    print(f"\n{res['converted']} of {sum(res.values())} op probes convert.")


if __name__ == "__main__":
    main()
