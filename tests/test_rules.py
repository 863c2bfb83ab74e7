"""Every kernel rule: applied when its premises and side conditions hold, refused when they do not.

Each case builds facts over a one-axis mesh (tp=2, or two axes where nesting matters), asks
the kernel for a conclusion, and checks the rule id used.  The negative twin breaks exactly
one premise or side condition; the kernel must then refuse (RuleFailure) or use another rule.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tvcert.kernel.equality import Prover
from tvcert.kernel.expr import Exprs
from tvcert.kernel import concat_groups as cg
from tvcert.kernel import interleave as il
from tvcert.kernel.rules import RULES, Fact, KCtx, P, R, RuleFailure, S, derive, local_shape
from tvcert.kernel.zigzag import Z
from tvcert.ops import REGISTRY

ROOT = Path(__file__).resolve().parents[1]


class Env:
    def __init__(self, axes=("tp",), sizes=None, dims=None):
        self.X = Exprs()
        self.kc = KCtx(self.X, tuple(axes), sizes or {a: 2 for a in axes}, dims or {"n": 8, "tp": 2})
        self.k = 0

    def t(self, shape, *pl, dtype="float"):
        self.k += 1
        return Fact(self.X.leaf(f"x{self.k}", tuple(shape), dtype), tuple(pl))

    def const(self, value, shape=()):
        return Fact(self.X.mk("const", {"value": value, "shape": tuple(shape), "dtype": "float"}, []),
                    tuple(R for _ in self.kc.axes))

    def apply(self, op, facts, raw=None, **attrs):
        spec = REGISTRY[op]
        from tvcert.ops import resolve_attrs

        raw = dict(attrs if raw is None else raw)
        env = dict(self.kc.dims, **{f"rank.{a}": 0 for a in self.kc.axes})
        ra = resolve_attrs(spec, raw, env)
        if spec.category == "collective":
            ra["_p"] = 2
        local_in = [local_shape(self.X[f.expr].shape, self.kc.axes, f.pl, self.kc.sizes) for f in facts]
        out = spec.infer(local_in, ra)
        return derive(self.kc, op, ra, raw, facts, out)


def rules_of(fn):
    return fn().rules


# (rule id) -> (positive builder, negative builder); each builder returns a Derivation or raises RuleFailure
def case_table():
    c = {}

    def add(rule, pos, neg):
        c[rule] = (pos, neg)

    add("replicate_any", lambda e: e.apply("sum", [e.t([4, 4], R)], dims=[0]),
        lambda e: e.apply("amin", [e.t([4, 4], S(0))], dims=[0]))
    add("ew_unary_replicate", lambda e: e.apply("exp", [e.t([4], R)]),
        lambda e: e.apply("exp", [e.t([4], P())]))
    add("ew_unary_shard", lambda e: e.apply("tanh", [e.t([4, 4], S(1))]),
        lambda e: e.apply("tanh", [e.t([4, 4], P())]))
    add("ew_binary_replicate", lambda e: e.apply("mul", [e.t([4], R), e.t([4], R)]),
        lambda e: e.apply("mul", [e.t([4], P()), e.t([4], P())]))
    add("ew_binary_shard", lambda e: e.apply("add", [e.t([4, 4], S(0)), e.t([4, 4], S(0))]),
        lambda e: e.apply("add", [e.t([4, 4], S(0)), e.t([2, 8], S(1))]))
    add("ew_binary_shard_broadcast", lambda e: e.apply("add", [e.t([4, 4], S(0)), e.t([1, 4], R)]),
        lambda e: e.apply("add", [e.t([4, 4], S(0)), e.t([2, 4], R)]))  # replicated operand not broadcast on dim 0
    add("partial_neg", lambda e: e.apply("neg", [e.t([4], P())]), lambda e: e.apply("neg", [e.t([4], P("max"))]))
    add("partial_scale", lambda e: e.apply("mul", [e.t([4], P()), e.t([4], R)]),
        lambda e: e.apply("mul", [e.t([4], P()), e.t([4], P())]))
    add("partial_div", lambda e: e.apply("div", [e.t([4], P()), e.t([4], R)]),
        lambda e: e.apply("div", [e.t([4], R), e.t([4], P())]))
    add("partial_add", lambda e: e.apply("add", [e.t([4], P()), e.t([4], P())]),
        lambda e: e.apply("add", [e.t([4], P()), e.t([4], P("avg"))]))
    add("partial_sub", lambda e: e.apply("sub", [e.t([4], P()), e.t([4], P())]),
        lambda e: e.apply("sub", [e.t([4], P()), e.t([8], S(0))]))
    add("partial_linear_map", lambda e: e.apply("reshape", [e.t([4, 4], P())], shape=[16]),
        lambda e: e.apply("exp", [e.t([4, 4], P())]))
    add("partial_plus_replicate_not_partial", lambda e: e.apply("add", [e.t([4], P()), e.t([4], R)]),
        lambda e: e.apply("add", [e.t([4], P("avg")), e.t([4], R)]))
    add("partial_avg_div_p_to_sum", lambda e: e.apply("div", [e.t([4], P("avg")), e.const(2)]),
        lambda e: e.apply("div", [e.t([4], P("avg")), e.const(3)]))
    add("matmul_replicate", lambda e: e.apply("matmul", [e.t([4, 4], R), e.t([4, 4], R)]),
        lambda e: e.apply("matmul", [e.t([4, 4], R), e.t([8, 4], S(0))]))
    add("matmul_col_parallel", lambda e: e.apply("matmul", [e.t([4, 4], R), e.t([4, 6], S(1))]),
        lambda e: e.apply("matmul", [e.t([4, 8], S(1)), e.t([4, 6], S(1))]))
    add("matmul_row_parallel", lambda e: e.apply("matmul", [e.t([4, 4], S(1)), e.t([4, 6], S(0))]),
        lambda e: e.apply("matmul", [e.t([4, 8], S(1)), e.t([4, 6], R)]))
    add("matmul_batch_shard", lambda e: e.apply("matmul", [e.t([4, 4], S(0)), e.t([4, 6], R)]),
        lambda e: e.apply("matmul", [e.t([2, 4, 4], S(0)), e.t([2, 4, 6], R)]))  # batch sharded, other not broadcast
    add("matmul_partial_lhs", lambda e: e.apply("matmul", [e.t([4, 4], P()), e.t([4, 6], R)]),
        lambda e: e.apply("matmul", [e.t([4, 4], P("max")), e.t([4, 6], R)]))
    add("matmul_partial_rhs", lambda e: e.apply("matmul", [e.t([4, 4], R), e.t([4, 6], P())]),
        lambda e: e.apply("matmul", [e.t([4, 4], P()), e.t([4, 6], P())]))
    add("einsum_shard_free_index", lambda e: e.apply("einsum", [e.t([4, 4], S(0)), e.t([4, 6], R)], equation="ij,jk->ik"),
        lambda e: e.apply("einsum", [e.t([4, 4], S(0)), e.t([4, 6], S(1))], equation="ij,jk->ik"))
    add("einsum_shard_contracted_index",
        lambda e: e.apply("einsum", [e.t([4, 4], S(1)), e.t([4, 6], S(0))], equation="ij,jk->ik"),
        lambda e: e.apply("einsum", [e.t([4, 8], S(1)), e.t([4, 6], R)], equation="ij,jk->ik"))
    add("einsum_partial_operand", lambda e: e.apply("einsum", [e.t([4, 4], P()), e.t([4, 6], R)], equation="ij,jk->ik"),
        lambda e: e.apply("einsum", [e.t([4, 4], P()), e.t([4, 6], P())], equation="ij,jk->ik"))
    add("allreduce_sum_partial", lambda e: e.apply("all_reduce", [e.t([4], P())], axis="tp"),
        lambda e: e.apply("all_reduce", [e.t([4], P("max"))], axis="tp"))
    add("allreduce_avg_partial_avg", lambda e: e.apply("all_reduce", [e.t([4], P("avg"))], axis="tp", reduce="avg"),
        lambda e: e.apply("all_reduce", [e.t([4], P("max"))], axis="tp", reduce="avg"))
    add("allreduce_avg_partial_sum", lambda e: e.apply("all_reduce", [e.t([4], P())], axis="tp", reduce="avg"),
        lambda e: e.apply("all_reduce", [e.t([4], S(0))], axis="tp", reduce="avg"))
    add("allreduce_max_partial_max", lambda e: e.apply("all_reduce", [e.t([4], P("max"))], axis="tp", reduce="max"),
        lambda e: e.apply("all_reduce", [e.t([4], P())], axis="tp", reduce="max"))
    add("allreduce_sum_replicate", lambda e: e.apply("all_reduce", [e.t([4], R)], axis="tp"),
        lambda e: e.apply("all_reduce", [e.t([4], S(0))], axis="tp"))
    add("allreduce_avg_replicate", lambda e: e.apply("all_reduce", [e.t([4], R)], axis="tp", reduce="avg"),
        lambda e: e.apply("all_reduce", [e.t([8], S(0))], axis="tp", reduce="avg"))
    add("allreduce_max_replicate", lambda e: e.apply("all_reduce", [e.t([4], R)], axis="tp", reduce="max"),
        lambda e: e.apply("all_reduce", [e.t([8], S(0))], axis="tp", reduce="max"))
    add("allgather_shard", lambda e: e.apply("all_gather", [e.t([4, 4], S(1))], axis="tp", dim=1),
        lambda e: e.apply("all_gather", [e.t([4, 4], S(0))], axis="tp", dim=1))
    add("reduce_scatter_partial", lambda e: e.apply("reduce_scatter", [e.t([4, 4], P())], axis="tp", dim=0),
        lambda e: e.apply("reduce_scatter", [e.t([4, 4], R)], axis="tp", dim=0))
    add("reduce_scatter_avg_partial_sum", lambda e: e.apply("reduce_scatter", [e.t([4, 4], P())], axis="tp", dim=0,
                                                            reduce="avg"),
        lambda e: e.apply("reduce_scatter", [e.t([4, 4], P("avg"))], axis="tp", dim=0, reduce="avg"))
    add("reduce_scatter_avg_nested", None, None)  # two axes: test_reduce_scatter_avg_inside_an_outer_shard
    add("all_to_all_reshard", lambda e: e.apply("all_to_all", [e.t([4, 4], S(1))], axis="tp", split_dim=0, concat_dim=1),
        lambda e: e.apply("all_to_all", [e.t([4, 4], S(0))], axis="tp", split_dim=0, concat_dim=1))
    add("broadcast_replicate", lambda e: e.apply("broadcast", [e.t([4], R)], axis="tp"),
        lambda e: e.apply("broadcast", [e.t([4], P())], axis="tp"))
    add("reduce_sum_sharded_dim", lambda e: e.apply("sum", [e.t([4, 4], S(1))], dims=[1]),
        lambda e: e.apply("sum", [e.t([4, 4], P("max"))], dims=[1]))
    add("reduce_mean_sharded_dim", lambda e: e.apply("mean", [e.t([4, 4], S(1))], dims=[1]),
        lambda e: e.apply("mean", [e.t([4, 4], P("max"))], dims=[1]))
    add("reduce_max_sharded_dim", lambda e: e.apply("amax", [e.t([4, 4], S(1))], dims=[1]),
        lambda e: e.apply("amax", [e.t([4, 4], P())], dims=[1]))
    add("reduce_other_dim", lambda e: e.apply("sum", [e.t([4, 4], S(0))], dims=[1]),
        lambda e: e.apply("amin", [e.t([4, 4], S(1))], dims=[1]))
    add("softmax_other_dim", lambda e: e.apply("softmax", [e.t([4, 4], S(0))], dim=1),
        lambda e: e.apply("softmax", [e.t([4, 4], S(1))], dim=1))
    add("rowwise_shard", lambda e: e.apply("cross_entropy", [e.t([4, 6], S(0)), e.t([4], S(0), dtype="int")],
                                           reduction="none"),
        lambda e: e.apply("cross_entropy", [e.t([4, 6], S(1)), e.t([4], R, dtype="int")], reduction="none"))
    add("permute_shard", lambda e: e.apply("permute", [e.t([2, 4, 6], S(2))], dims=[2, 0, 1]),
        lambda e: e.apply("permute", [e.t([2, 4, 6], P("max"))], dims=[2, 0, 1]))
    add("reshape_shard_block", lambda e: e.apply("reshape", [e.t([4, 6], S(0))], shape=["2/tp", 2, 6]),
        lambda e: e.apply("reshape", [e.t([4, 6], S(1))], shape=[12]))  # shard not leading its group
    add("pad_block_to_partial", lambda e: e.apply("pad", [e.t([8, 2], S(0))], pads=["rank.tp*4", "(1-rank.tp)*4", 0, 0]),
        lambda e: e.apply("pad", [e.t([8, 2], S(0))], pads=["(1-rank.tp)*4", "rank.tp*4", 0, 0]))  # rank-reversed
    add("allgather_other_dim", lambda e: e.apply("all_gather", [e.t([1, 8], S(1))], axis="tp", dim=0),
        lambda e: e.apply("all_gather", [e.t([1, 8], P())], axis="tp", dim=0))
    add("slice_other_dim", lambda e: e.apply("slice", [e.t([4, 6], S(0))], dim=1, start=0, end=3),
        lambda e: e.apply("slice", [e.t([4, 6], S(0))], dim=0, start=0, end=1))
    add("slice_block_to_shard", lambda e: e.apply("slice", [e.t([8, 2], R)], dim=0, start="rank.tp*(n/2)",
                                                  end="(rank.tp+1)*(n/2)"),
        lambda e: e.apply("slice", [e.t([8, 2], R)], dim=0, start="(1-rank.tp)*(n/2)", end="(2-rank.tp)*(n/2)"))
    add("concat_other_dim", lambda e: e.apply("concat", [e.t([4, 2], S(0)), e.t([4, 2], S(0))], dim=1),
        lambda e: e.apply("concat", [e.t([4, 2], S(0)), e.t([4, 2], S(0))], dim=0))
    add("allreduce_nested_axes", None, None)
    add("send_recv_preserves", None, None)
    add("vocab_parallel_embedding", None, None)  # multi-op pattern: examples/vocab_parallel_embedding*.json
    add("ring_attention_online_softmax", None, None)  # multi-op pattern: tests/test_ring.py
    add("vocab_parallel_embedding_clamped", None, None)  # multi-op pattern: examples/vocab_parallel_embedding_clamped*
    add("vocab_parallel_embedding_backward", None, None)  # multi-op pattern: masked_embedding mutations, generators
    add("vocab_parallel_embedding_clamped_backward", None, None)  # multi-op pattern: torchtitan trace + mutations
    add("vocab_parallel_log_softmax", None, None)  # multi-op pattern: examples/vocab_parallel_loss*, torchtitan
    add("vocab_parallel_nll_loss", None, None)  # multi-op pattern: examples/vocab_parallel_loss*, torchtitan
    add("vocab_parallel_nll_backward", None, None)  # multi-op pattern: tests/test_trace_torchtitan.py mutations
    add("ring_attention_backward", None, None)  # multi-op pattern: tests/test_ring.py, ring mutations
    # load-balanced (zig-zag) shards: the Shard rule read on the zig-zag axis, accepted only with a zig-zag theorem
    add("zigzag_ew_unary", lambda e: e.apply("tanh", [e.t([4, 4], Z(1))]),
        lambda e: e.apply("amin", [e.t([4, 4], Z(0))], dims=[0]))
    add("zigzag_ew_binary", lambda e: e.apply("add", [e.t([4, 4], Z(0)), e.t([4, 4], Z(0))]),
        lambda e: e.apply("add", [e.t([4, 4], Z(0)), e.t([4, 4], S(0))]))  # zig-zag mixed with a block shard
    add("zigzag_ew_binary_broadcast", lambda e: e.apply("add", [e.t([4, 4], Z(0)), e.t([1, 4], R)]),
        lambda e: e.apply("add", [e.t([4, 4], Z(0)), e.t([2, 4], R)]))  # replicated operand not broadcast on dim 0
    add("zigzag_rowwise", lambda e: e.apply("softmax", [e.t([4, 4], Z(0))], dim=1),
        lambda e: e.apply("softmax", [e.t([4, 4], Z(0))], dim=0))
    add("zigzag_rowwise2", lambda e: e.apply("concat", [e.t([4, 2], Z(0)), e.t([4, 2], Z(0))], dim=1),
        lambda e: e.apply("concat", [e.t([4, 2], Z(0)), e.t([4, 2], Z(0))], dim=0))
    add("zigzag_reduce_sum", lambda e: e.apply("sum", [e.t([4, 4], Z(0))], dims=[0]),
        lambda e: e.apply("all_gather", [e.t([4, 4], Z(0))], axis="tp", dim=0))  # chunks not contiguous
    add("zigzag_reduce_max", lambda e: e.apply("amax", [e.t([4, 4], Z(0))], dims=[0]),
        lambda e: e.apply("amin", [e.t([4, 4], Z(0))], dims=[0]))
    add("zigzag_reduce_mean", lambda e: e.apply("mean", [e.t([4, 4], Z(0))], dims=[0]),
        lambda e: e.apply("all_reduce", [e.t([4, 4], Z(0))], axis="tp", reduce="sum"))
    add("zigzag_reshape", lambda e: e.apply("reshape", [e.t([4, 4], Z(0))], shape=[8]),  # merge: chunk 1 row -> 4
        lambda e: e.apply("reshape", [e.t([8, 3], Z(0))], shape=["n/4/tp", 4, 3]))  # splits 4 rows off 2-row chunks
    add("zigzag_contraction", lambda e: e.apply("matmul", [e.t([4, 4], Z(1)), e.t([4, 4], Z(0))]),
        lambda e: e.apply("matmul", [e.t([4, 4], Z(1)), e.t([4, 4], S(0))]))
    add("zigzag_from_slices", None, None)  # multi-op pattern: tests/test_zigzag.py, zig-zag mutations
    add("ring_attention_zigzag", None, None)  # with the ring patterns: tests/test_zigzag.py
    add("zigzag_all_gather", None, None)  # multi-op pattern: tests/test_zigzag.py, ag_zigzag mutations
    add("zigzag_reduce_scatter", None, None)  # multi-op pattern: tests/test_zigzag.py, ag_zigzag mutations
    add("stage_repeat", None, None)  # memoized stages: tests/test_generators.py, tests/test_certificate.py
    for rule in ("congruence", "scale_commutes_linear", "layout_commutes_pointwise", "elementwise_smt"):
        add(rule, None, None)
    # equality step / a replicated operand built as a broadcast (not a leaf): tests/test_rules_norm_real.py
    add("reduction_normal_form", None, None)
    add("allreduce_mixed_axes", None, None)  # multi-axis collective: test_rules_norm_real.py, conform gen_ar_mixed
    add("scale_common_factor", None, None)  # equality step: tests/test_rules_norm_real.py, conform gen_common_factor
    add("replicate_broadcast_as_shard", None, None)
    add("reduce_scatter_replicate", None, None)  # collectives of replicated / multi-axis inputs: test_rules_norm_real.py
    add("allreduce_avg_partial_sum_axes", None, None)
    add("partial_sum_as_avg", None, None)  # output matching: test_rules_norm_real.py
    add("allgather_partial_sum", None, None)  # multi-op pattern: test_rules_norm_real.py, conform gen_gather_sum
    add("allreduce_avg_partial_sum_nested", None, None)  # test_rules_norm_real.py
    add("slice_concat_operand", None, None)  # equality step: test_trace_mcore.py, conform gen_slice_concat
    # fused tensors sharded per part (kernel/interleave.py; tests/test_frontend_interleave.py, conform gens_interleave)
    add("split_interleaved_shard", lambda e: e.apply(
        "split", [Fact(il.build(e.X, e.X.leaf("w", (8, 2), "float"), 0, 2, 2), (S(0),))], dim=0, sizes=[2, 2]),
        lambda e: e.apply("split", [e.t([8, 2], S(0))], dim=0, sizes=[2, 2]))  # a plain shard: rows of both parts
    add("concat_interleaved_shard", lambda e: e.apply("concat", [e.t([4, 2], S(0)), e.t([4, 2], S(0))], dim=0),
        lambda e: e.apply("concat", [e.t([4, 2], S(0)), e.t([8, 2], S(0))], dim=0))  # parts of different sizes
    add("interleave_commutes", None, None)  # equality step: tests/test_frontend_interleave.py
    # micro-batches of a data-parallel shard (kernel/microbatch.py; tests/test_trace_pipelining.py, conform)
    add("slice_shard_microbatch", lambda e: e.apply("split", [e.t([8, 2], S(0))], dim=0, sizes=[2, 2]),
        lambda e: e.apply("split", [e.t([8, 2], S(0))], dim=0, sizes=[3, 1]))  # unequal parts
    # the same, parts of different sizes (kernel/concat_groups.py; tests/test_frontend_concat_groups.py)
    add("split_grouped_shard", lambda e: e.apply("split", [Fact(cg.build_expr(
        e.X, e.X.leaf("w", (8, 2), "float"), {"dim": 0, "sizes": [4, 2, 2], "groups": 2}), (S(0),))],
        dim=0, sizes=[2, 1, 1]), lambda e: e.apply("split", [e.t([8, 2], S(0))], dim=0, sizes=[2, 1, 1]))
    add("concat_grouped_shard", lambda e: e.apply("concat", [e.t([4, 2], S(0)), e.t([8, 2], S(0))], dim=0),
        lambda e: e.apply("concat", [e.t([4, 2], S(0)), e.t([8, 2], R)], dim=0))  # placed differently
    add("concat_groups_commutes", None, None)  # equality step: tests/test_frontend_concat_groups.py
    add("merge_interleaved_shard", None, None)  # Megatron's batch x heads merge: test_trace_mcore.py, conform
    add("split_interleaved_reshape", None, None)  # its inverse view: test_trace_mcore.py, conform
    add("int_range_count", None, None)  # equality step: tests/test_frontend_int_range.py
    add("scalar_factor_commutes", None, None)  # equality step: tests/test_scalar_factor.py, conform gen_scalar_factor
    add("layout_map_equal", None, None)  # equality step: tests/test_layout_map.py, conform gen_layout_map
    # rank-reversed blocks (kernel/reversed_blocks.py; tests/test_reversed_pad.py, conform gens_reversed_blocks)
    add("slice_reversed_block_to_shard", lambda e: e.apply("slice", [e.t([8, 2], R)], dim=0, start="(1-rank.tp)*(n/2)",
                                                           end="(2-rank.tp)*(n/2)"),
        lambda e: e.apply("slice", [e.t([8, 2], R)], dim=0, start="(1-rank.tp)*3", end="(1-rank.tp)*3+3"))
    add("reversed_blocks_commute", None, None)  # equality step: tests/test_reversed_pad.py
    # multi-op patterns over torch's unrolled ring (traced plans): tests/test_trace_cp.py, conform gens_ring_merge
    add("ring_sigmoid_merge", None, None)
    add("ring_sigmoid_merge_backward", None, None)
    # torch's causal / load-balanced ring, followed per cp coordinate: tests/test_cp_causal.py, gens_ring_merge
    add("ring_masked_merge", None, None)
    add("ring_masked_merge_backward", None, None)
    # torch's head-tail load balancer's index (multi-op pattern): tests/test_trace_cp.py, conform gens_cp_index
    add("zigzag_from_index_block", None, None)
    add("iota_rank_block", None, None)  # a rank's iota positions (pattern): tests/test_trace_cp.py, gens_cp_index
    # cumsum over a sharded dim with a carried offset (multi-op patterns): tests/test_prefix_scan.py, gens_prefix_scan
    for rule in ("block_prefix_sum", "block_prefix_sum_scanned", "block_suffix_sum", "scan_last_row_total",
                 "block_suffix_sum_scattered", "block_prefix_sum_scattered", "scan_flip_pairs"):
        add(rule, None, None)
    # Megatron's target-logit pick and its backward (multi-op patterns): tests/test_trace_mcore.py, test_vocab_pick.py
    for rule in ("vocab_parallel_target_logit", "vocab_parallel_target_logit_backward"):
        add(rule, None, None)
    return c


CASES = case_table()


def test_every_rule_has_a_case():
    assert set(CASES) == set(RULES)


@pytest.mark.parametrize("rule", sorted(r for r, (p, _) in CASES.items() if p is not None))
def test_rule_applies_when_its_conditions_hold(rule):
    d = CASES[rule][0](Env())
    assert rule in d.rules


@pytest.mark.parametrize("rule", sorted(r for r, (_, n) in CASES.items() if n is not None))
def test_rule_refused_when_a_condition_fails(rule):
    try:
        d = CASES[rule][1](Env())
    except RuleFailure:
        return
    assert rule not in d.rules, f"{rule} applied although its side condition fails: {d.rules}"


def test_allreduce_nested_axes():
    e = Env(("dp", "tp"))
    d = e.apply("all_reduce", [e.t([4], P(), P())], axis=["dp", "tp"])
    assert d.rules == ["allreduce_sum_partial", "allreduce_nested_axes"] and d.facts[0].pl == (R, R)
    d = e.apply("all_reduce", [e.t([4], P(), R)], axis=["dp", "tp"])  # p_tp * E (factor: test_rules_norm_real.py)
    assert d.rules == ["allreduce_mixed_axes"] and d.facts[0].pl == (R, R)
    with pytest.raises(RuleFailure):
        e.apply("all_reduce", [e.t([4], P("max"), R)], axis=["dp", "tp"])


def test_nested_gather_order():
    e = Env(("dp", "tp"))
    # dim 0 sharded on both axes, tp innermost: gathering the outer axis alone is refused
    with pytest.raises(RuleFailure, match="inner axis"):
        e.apply("all_gather", [e.t([8, 2], S(0), S(0))], axis="dp", dim=0)
    d = e.apply("all_gather", [e.t([8, 2], S(0), S(0))], axis="tp", dim=0)
    assert d.facts[0].pl == (S(0), R)


def test_reduce_scatter_avg_inside_an_outer_shard():
    """FSDP2 over TP's Shard(0): the dp reduce-scatter(avg) splits each of tp's blocks (tp outer)."""
    e = Env(("tp", "dp"))
    d = e.apply("reduce_scatter", [e.t([8, 2], S(0), P())], axis="dp", dim=0, reduce="avg")
    assert d.rules == ["reduce_scatter_avg_partial_sum", "reduce_scatter_avg_nested"]
    assert d.facts[0].pl == (S(0), S(0))
    d = e.apply("reduce_scatter", [e.t([8, 2], S(1), P())], axis="dp", dim=0, reduce="avg")  # another dim
    assert d.rules == ["reduce_scatter_avg_partial_sum"]
    with pytest.raises(RuleFailure):  # Partial(avg) on the outer axis instead of a shard
        e.apply("reduce_scatter", [e.t([8, 2], P("avg"), P())], axis="dp", dim=0, reduce="avg")
    e = Env(("dp", "tp"))  # tp inner: the scatter over dp would cut across tp's blocks
    with pytest.raises(RuleFailure, match="inner axis"):
        e.apply("reduce_scatter", [e.t([8, 2], P(), S(0))], axis="dp", dim=0, reduce="avg")


def test_all_to_all_inside_an_outer_shard():
    e = Env(("dp", "ep"))
    # concat dim 0 sharded on dp (outer) and ep (inner): the all_to_all over ep regroups inside dp's block
    d = e.apply("all_to_all", [e.t([8, 4], S(0), S(0))], axis="ep", split_dim=1, concat_dim=0)
    assert d.facts[0].pl == (S(0), S(1))
    e = Env(("ep", "dp"))  # ep outer: its all_to_all would mix dp's blocks
    with pytest.raises(RuleFailure):
        e.apply("all_to_all", [e.t([8, 4], S(0), S(0))], axis="ep", split_dim=1, concat_dim=0)


def test_conclusions_are_checked_against_local_shapes():
    e = Env()
    x = e.t([4, 4], S(1))
    with pytest.raises(RuleFailure, match="local shape"):
        derive(e.kc, "exp", {}, {}, [x], [(4, 4)])  # a wrong local shape is never accepted


def test_rank_dependent_constant_is_refused():
    e = Env()
    with pytest.raises(RuleFailure, match="depends on the rank"):
        e.apply("const", [], value="rank.tp", shape=[])


def test_equality_rules():
    X = Exprs()
    a = X.leaf("a", (4,), "float")
    b = X.leaf("b", (4,), "float")
    pr = Prover(X)
    # congruence
    assert pr.equal(X.mk("exp", {}, [a]), X.mk("exp", {}, [a]))
    # scalar factors across a linear op
    two = X.mk("const", {"value": 2, "shape": (), "dtype": "float"}, [])
    lhs = X.mk("sum", {"dims": (0,), "keepdim": False}, [X.mk("mul", {}, [a, two])])
    rhs = X.mk("mul", {}, [X.mk("sum", {"dims": (0,), "keepdim": False}, [a]), two])
    assert pr.equal(lhs, rhs) and "scale_commutes_linear" in pr.used
    # SMT over an elementwise region: (a-b)(a+b) = a^2 - b^2, and not a^2 + b^2
    f = X.mk("mul", {}, [X.mk("sub", {}, [a, b]), X.mk("add", {}, [a, b])])
    g = X.mk("sub", {}, [X.mk("square", {}, [a]), X.mk("square", {}, [b])])
    h = X.mk("add", {}, [X.mk("square", {}, [a]), X.mk("square", {}, [b])])
    assert pr.equal(f, g) and "elementwise_smt" in pr.used
    assert not pr.equal(f, h)
    # layout through pointwise: reshape(a + b) = reshape(a) + reshape(b)
    r = lambda t: X.mk("reshape", {"shape": (2, 2)}, [t])
    assert pr.equal(r(X.mk("add", {}, [a, b])), X.mk("add", {}, [r(a), r(b)]))
    assert "layout_commutes_pointwise" in pr.used


def test_trainverify_c12_is_never_proved_equal():
    """f(x)=[[1,1],[1,1]]x vs g(x)=[[1,1],[2,0]]x agree at index 0 only: the prover must not equate them."""
    X = Exprs()
    x = X.leaf("x", (2,), "float")
    A = X.mk("const", {"value": [[1, 1], [1, 1]], "shape": (2, 2), "dtype": "float"}, [])
    B = X.mk("const", {"value": [[1, 1], [2, 0]], "shape": (2, 2), "dtype": "float"}, [])
    assert not Prover(X).equal(X.mk("matmul", {}, [A, x]), X.mk("matmul", {}, [B, x]))
    # and the pointwise family f(x)=[x0,x0] vs g(x)=[x0,x1]
    x0 = X.mk("slice", {"dim": 0, "start": 0, "end": 1, "step": 1}, [x])
    f = X.mk("concat", {"dim": 0}, [x0, x0])
    assert not Prover(X).equal(f, x)


def test_engine_rules_match_the_proof_manifest():
    manifest = json.loads((ROOT / "proofs" / "manifest.json").read_text())
    assert set(manifest["rules"]) == set(RULES)


@pytest.mark.parametrize("order,equal", [(["dp", "ep"], True), (["ep", "dp"], False)])
def test_nested_all_to_all_agrees_with_the_interpreter(order, equal):
    """The nested all_to_all rule, checked end to end against the reference interpreter."""
    from tvcert.engine.verify import verify
    from tvcert.interp import run_plan
    from tvcert.plan import load_plan

    p = {"tvcert_plan": 1, "name": "a2a_nested", "dims": {"n": 8, "m": 4, "dp": 2, "ep": 2},
         "mesh": [[a, a] for a in order],
         "logical": {"inputs": [{"name": "x", "shape": ["n", "m"]}],
                     "nodes": [{"name": "y", "op": "neg", "inputs": ["x"]}], "outputs": ["y"]},
         "parallel": [{"name": "p", "inputs": [{"name": "x", "shape": ["n/dp/ep", "m"]}], "nodes": [
             {"name": "z", "op": "all_to_all", "inputs": ["x"], "attrs": {"axis": "ep", "split_dim": 1, "concat_dim": 0}},
             {"name": "y", "op": "neg", "inputs": ["z"]}], "outputs": ["y"]}],
         "inputs": {"x": {"local": "x", "placement": {"dp": "Shard(0)", "ep": "Shard(0)"}}},
         "outputs": {"y": {"local": "y", "placement": {"dp": "Shard(0)", "ep": "Shard(1)"}}}}
    plan = load_plan(p)
    assert run_plan(plan).equal is equal
    assert verify(plan).verdict == ("VERIFIED" if equal else "REFUTED")


@pytest.mark.parametrize("op,attrs", [("permute", {"dims": [1, 0]}), ("reshape", {"shape": [16]}),
                                      ("transpose", {"dim0": 0, "dim1": 1})])
def test_layout_of_partial_max_is_refused(op, attrs):
    """Only additive maps are covered on Partial; Partial(max) must never turn into anything else."""
    e = Env()
    with pytest.raises(RuleFailure):
        e.apply(op, [e.t([4, 4], P("max"))], **attrs)


def test_flip_keeps_a_shard_only_on_dims_it_does_not_reverse():
    """flip along the sharded dim reverses the global order, which no local flip gives: refused."""
    e = Env()
    assert e.apply("flip", [e.t([4, 4], S(0))], dims=[1]).rules == ["rowwise_shard"]
    assert e.apply("flip", [e.t([4, 4], P())], dims=[0]).rules == ["partial_linear_map"]
    with pytest.raises(RuleFailure, match="does not act independently"):
        e.apply("flip", [e.t([4, 4], S(0))], dims=[0])
