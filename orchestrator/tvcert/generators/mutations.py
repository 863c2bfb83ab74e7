"""Bug injection: named mutations of generated plans, each a silent parallelization bug.

A mutation finds parallel nodes by the role in their ``src`` and edits them.  Every mutation
keeps the plan well-formed (same shapes), so the bug is silent: only the values change.
``expect`` says which node the first divergence should be reported at.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Callable


class MutationError(ValueError):
    """The mutation does not apply to this plan (the op it breaks is not there)."""


@dataclass(frozen=True)
class Mutation:
    name: str
    doc: str
    config: dict[str, Any]  # generator options under which the mutated op exists
    apply: Callable[[dict], str]  # edits the plan in place, returns the src role of the node to blame
    expect: str = "mutated"  # "mutated" | "consumer": where the first divergence shows


def _nodes(plan: dict) -> list[dict]:
    return [n for prog in plan["parallel"] for n in prog["nodes"]]


def _find(plan: dict, pattern: str, nth: int = 0) -> dict:
    hits = [n for n in _nodes(plan) if re.search(pattern, n.get("src") or "")]
    if len(hits) <= nth:
        raise MutationError(f"no parallel op whose source role matches {pattern!r}")
    return hits[nth]


def _bypass(plan: dict, pattern: str) -> str:
    """Remove a node; its consumers read its (first) input instead."""
    n = _find(plan, pattern)
    src, dst = n["inputs"][0], n["name"]
    for prog in plan["parallel"]:
        if n in prog["nodes"]:
            prog["nodes"].remove(n)
            for m in prog["nodes"]:
                m["inputs"] = [src if x == dst else x for x in m.get("inputs", [])]
            prog["outputs"] = [src if x == dst else x for x in prog["outputs"]]
    return n["src"]


def _set(plan: dict, pattern: str, **attrs) -> str:
    n = _find(plan, pattern)
    n.setdefault("attrs", {}).update(attrs)
    return n["src"]


def _swap_inputs(plan: dict, pattern: str, i: int = 0, j: int = 1) -> str:
    n = _find(plan, pattern)
    n["inputs"][i], n["inputs"][j] = n["inputs"][j], n["inputs"][i]
    return n["src"]


def _reroute(plan: dict, pattern: str, index: int, other: str) -> str:
    n = _find(plan, pattern)
    n["inputs"][index] = _find(plan, other)["name"]
    return n["src"]


def _insert_after(plan: dict, pattern: str, op: str, role: str, extra_inputs: list[dict] | None = None,
                  **attrs) -> str:
    """Insert ``op(x, *extra)`` after the matched node; consumers read the new tensor."""
    n = _find(plan, pattern)
    new_name = n["name"] + "__mut"
    for prog in plan["parallel"]:
        if n in prog["nodes"]:
            k = prog["nodes"].index(n)
            extra_names = []
            for e in extra_inputs or []:
                prog["nodes"].insert(k + 1, e)
                k += 1
                extra_names.append(e["name"])
            node = {"name": new_name, "op": op, "inputs": [n["name"], *extra_names], "src": n["src"] + "." + role}
            if attrs:
                node["attrs"] = attrs
            for m in prog["nodes"][k + 1:]:
                m["inputs"] = [new_name if x == n["name"] else x for x in m.get("inputs", [])]
            prog["nodes"].insert(k + 1, node)
            prog["outputs"] = [new_name if x == n["name"] else x for x in prog["outputs"]]
            return node["src"]
    raise MutationError("node not found")


def _scale_after(plan: dict, pattern: str, factor_expr: str) -> str:
    n = _find(plan, pattern)
    c = {"name": n["name"] + "__factor", "op": "const", "attrs": {"value": factor_expr}, "src": n["src"] + ".factor"}
    return _insert_after(plan, pattern, "mul", "scaled", [c])


def _replace_op(plan: dict, pattern: str, op: str, attrs: dict) -> str:
    n = _find(plan, pattern)
    n["op"], n["attrs"] = op, dict(attrs)
    return n["src"]


def _const_value(plan: dict, pattern: str, value) -> str:
    return _set(plan, pattern, value=value)


TP = {"tp": 2}
SP = {"tp": 2, "sp": True}
CP = {"cp": 2}
DP = {"dp": 2}
MB = {"dp": 2, "microbatches": 2}
ZERO = {"tp": 2, "dp": 2, "zero": 1}
PP = {"pp": 2, "layers": 2}
PP3 = {"pp": 3, "layers": 3}
TP_MASKED = {"tp": 2, "masked_embedding": True}
PP_TIED = {"pp": 2, "layers": 2, "tie_embeddings": True}
PP_TIED_ZERO = {"pp": 2, "layers": 2, "tie_embeddings": True, "dp": 2, "zero": 1}

MUTATIONS: list[Mutation] = [
    Mutation("missing_allreduce_o_proj", "the all_reduce after the attention output projection is missing (data flow intact)",
             TP, lambda p: _bypass(p, r"layer0\.o_proj\.all_reduce$"), "consumer"),
    Mutation("missing_allreduce_broken_flow", "the residual add reads the attention input instead of the all-reduced output",
             TP, lambda p: _reroute(p, r"layer0\.attn_residual$", 1, r"layer0\.o_proj$")),
    Mutation("missing_allreduce_w2", "the all_reduce after the MLP down projection is missing", TP,
             lambda p: _bypass(p, r"layer0\.w2_proj\.all_reduce$"), "consumer"),
    Mutation("allreduce_max_instead_of_sum", "the MLP all_reduce uses max instead of sum", TP,
             lambda p: _set(p, r"layer0\.w2_proj\.all_reduce$", reduce="max")),
    Mutation("missing_backward_allreduce", "the input-gradient all_reduce of the attention block is missing", TP,
             lambda p: _bypass(p, r"layer0\.bwd\.attn_dx\.all_reduce$"), "consumer"),
    Mutation("wrong_input_backward", "the w3 gradient path multiplies by the pre-activation instead of silu(a)", TP,
             lambda p: _reroute(p, r"layer0\.bwd\.swiglu_dw3$", 1, r"layer0\.w1_proj$")),
    Mutation("rope_backward_swapped", "RoPE backward concatenates the halves in the wrong order", TP,
             lambda p: _swap_inputs(p, r"layer0\.bwd\.q_rope\.bwd\.rot_t$")),
    Mutation("loss_times_cp", "the loss is averaged over the local tokens of a context-parallel rank (scaled by cp)", CP,
             lambda p: _const_value(p, r"loss\.count$", "b*s/cp")),
    Mutation("grad_div_tp", "one weight gradient is divided by tp", TP,
             lambda p: _insert_after(p, r"layer0\.bwd\.w1_dw$", "div", "div_tp",
                                     [{"name": "tp__mut", "op": "const", "attrs": {"value": "tp"}, "src": "tp_count"}])),
    Mutation("average_instead_of_sum", "a gradient all_reduce over dp averages partial sums of an already-averaged loss",
             DP, lambda p: _set(p, r"layer0\.wq\.grad_all_reduce$", reduce="avg"), "consumer"),
    Mutation("microbatch_not_accumulated", "one gradient is not summed over micro-batches", MB,
             lambda p: _set(p, r"layer0\.wk\.grad_all_reduce$", axis="dp")),
    Mutation("accumulation_overwrites", "gradient accumulation keeps one micro-batch instead of adding them", MB,
             lambda p: _replace_op(p, r"layer0\.wv\.grad_all_reduce$", "broadcast", {"axis": "mb", "root": 0})),
    Mutation("wrong_vocab_block", "the embedding reads the vocab block of the mirrored rank", TP,
             lambda p: _set(p, r"embed\.vocab_block$", start="(tp-1-rank.tp)*(v/tp)", end="(tp-rank.tp)*(v/tp)")),
    Mutation("wrong_chunk_order_ce", "cross-entropy picks target logits from the mirrored vocab block", TP,
             lambda p: _set(p, r"head\.ce\.vocab_block$", start="(tp-1-rank.tp)*(v/tp)", end="(tp-rank.tp)*(v/tp)")),
    Mutation("sp_norm_grad_not_reduced", "sequence-parallel norm-weight gradients are not all-reduced over tp", SP,
             lambda p: _bypass(p, r"layer0\.attn_norm\.grad_all_reduce$"), "consumer"),
    Mutation("rope_positions_not_offset", "RoPE positions are not offset by the cp rank", CP,
             lambda p: _set(p, r"rope\.cp_positions$", start=0, end="s/cp")),
    Mutation("causal_mask_not_offset", "causal-mask rows ignore the cp rank's position block", CP,
             lambda p: _insert_positions_unoffset(p)),
    Mutation("clip_norm_local_only", "the gradient norm for clipping is computed from local shards only", TP,
             lambda p: _bypass(p, r"grad_norm\.all_reduce$"), "consumer"),
    Mutation("clip_norm_replicated_overcounted", "replicated parameters are counted on every tp rank in the norm", TP,
             lambda p: _bypass(p, r"layer0\.attn_norm\.sumsq_dedup$"), "consumer"),
    Mutation("ce_local_max", "vocab-parallel cross-entropy uses the local max (no all_reduce(max))", TP,
             lambda p: _bypass(p, r"head\.ce\.max$"), "consumer"),
    Mutation("ce_sumexp_not_reduced", "vocab-parallel cross-entropy forgets to all_reduce the sum of exponentials", TP,
             lambda p: _bypass(p, r"head\.ce\.sumexp$"), "consumer"),
    Mutation("loss_times_dp", "the loss count ignores data parallelism (loss x dp)", DP,
             lambda p: _const_value(p, r"loss\.count$", "b*s/dp")),
    Mutation("zero_grad_not_scattered", "ZeRO: the gradient shard is the rank's block of the un-reduced gradient", ZERO,
             lambda p: _replace_op(p, r"layer0\.w2\.grad_reduce_scatter$", "slice",
                                   {"dim": 0, "start": "rank.dp*(((f/tp)*(h))/dp)", "end": "(rank.dp+1)*(((f/tp)*(h))/dp)"})),
    Mutation("zero_param_shard_wrong_rank", "ZeRO: a rank updates the parameter shard of its neighbour", ZERO,
             lambda p: _set(p, r"layer0\.w2\.param_shard$", start="((rank.dp+1)%dp)*(((f/tp)*(h))/dp)",
                            end="((rank.dp+1)%dp+1)*(((f/tp)*(h))/dp)")),
    Mutation("lr_scaled_by_tp", "the learning rate of one sharded weight is multiplied by tp", TP,
             lambda p: _scale_after(p, r"optim\.layer0\.wo\.lr$", "tp")),
    Mutation("softmax_wrong_dim", "attention softmax over the query dim instead of the key dim", TP,
             lambda p: _set(p, r"layer0\.softmax$", dim=-2)),
    Mutation("k_rope_skipped_offset_sign", "RoPE rotation uses +x2 instead of -x2 for keys", TP,
             lambda p: _bypass(p, r"layer0\.k_rope\.neg$"), "consumer"),
    Mutation("pp_send_wrong_tensor", "pipeline stage 0 sends its layer input instead of its output to stage 1", PP,
             lambda p: _pp_send_layer_input(p), "consumer"),
    Mutation("pp_grad_wrong_source", "stage 1 forwards the gradient it received instead of its own input gradient", PP3,
             lambda p: _pp_skip_stage(p), "consumer"),
    Mutation("bias_row_parallel_every_rank", "a replicated term is added on every rank before the row-parallel all_reduce",
             TP, lambda p: _insert_after(p, r"layer0\.o_proj$", "add", "bias_on_every_rank",
                                         [{"name": "bias__mut", "op": "const", "attrs": {"value": 1}, "src": "bias"}])),
    Mutation("masked_embedding_rows_not_zeroed", "masked vocab-parallel lookup: rows of tokens outside the rank's "
             "vocab block are not zeroed (every rank adds its row 0 for them)", TP_MASKED,
             lambda p: _bypass(p, r"^embed\.mask_rows$"), "consumer"),
    Mutation("masked_embedding_grad_not_masked", "masked vocab-parallel embedding backward: the gradient of tokens "
             "outside the rank's vocab block is not zeroed (it lands on local row 0)", {**TP_MASKED, "dp": 2},
             lambda p: _bypass(p, r"^embed\.bwd\.mask_grad$"), "consumer"),
    Mutation("tied_grad_not_synced", "tied embeddings under pp: the LM head's gradient contribution from the last "
             "stage is dropped (only the lookup gradient updates the table)", PP_TIED,
             lambda p: _bypass(p, r"^embed\.bwd\.tied_grad_sum$"), "consumer"),
    Mutation("zero_reduce_scatter_before_tied_sync", "tied embeddings under pp + ZeRO: stage 0 reduce-scatters its own "
             "contribution first, then adds its dp block of the head's contribution, which never gets reduced over dp",
             PP_TIED_ZERO, lambda p: _tied_sum_after_reduce_scatter(p)),
]


def _pp_send_layer_input(p: dict) -> str:
    send = _find(p, r"pipeline\.act1\.send$")
    send["inputs"] = [_find(p, r"layer0\.attn_norm\.sq$")["inputs"][0]]
    return send["src"]


def _pp_skip_stage(p: dict) -> str:
    """Stage 1 forwards the gradient it received instead of its own input gradient (a wrong send source)."""
    send = _find(p, r"pipeline\.grad0\.send$")
    recv = _find(p, r"pipeline\.grad1\.recv$")
    send["inputs"] = [recv["name"]]
    return send["src"]


def _tied_sum_after_reduce_scatter(p: dict) -> str:
    """Move the cross-stage tied-gradient sum after stage 0's ZeRO reduce_scatter: the received head contribution
    (Partial over dp) is flattened and the rank's dp block of it is added to the reduce-scattered lookup gradient."""
    tsum = _find(p, r"^embed\.bwd\.tied_grad_sum$")
    lookup, head = tsum["inputs"]
    _bypass(p, r"^embed\.bwd\.tied_grad_sum$")
    rs = _find(p, r"^optim\.embedding\.grad_reduce_scatter$")
    for prog in p["parallel"]:
        if rs in prog["nodes"]:
            decl = next(t for t in prog["inputs"] if t["name"] == "embedding")
            numel = "*".join(f"({x})" for x in decl["shape"])
            k = prog["nodes"].index(rs)
            base, src = rs["name"], rs["src"]
            flat = {"name": base + "__head_flat", "op": "reshape", "inputs": [head], "attrs": {"shape": [-1]},
                    "src": src + ".tied_head_flatten"}
            blk = {"name": base + "__head_block", "op": "slice", "inputs": [flat["name"]],
                   "attrs": {"dim": 0, "start": f"rank.dp*(({numel})/dp)", "end": f"(rank.dp+1)*(({numel})/dp)"},
                   "src": src + ".tied_head_block"}
            add = {"name": base + "__mut", "op": "add", "inputs": [base, blk["name"]], "src": src + ".tied_sum_after"}
            for m in prog["nodes"][k + 1:]:
                m["inputs"] = [add["name"] if x == base else x for x in m.get("inputs", [])]
            prog["nodes"][k + 1:k + 1] = [flat, blk, add]
            return add["src"]
    raise MutationError("node not found")


def _insert_positions_unoffset(p: dict) -> str:
    """mask rows read positions 0..S-1 on every cp rank (RoPE keeps its offset)."""
    it = _find(p, r"rope\.cp_positions$")
    for prog in p["parallel"]:
        if it in prog["nodes"]:
            k = prog["nodes"].index(it)
            sl = {"name": "mask_pos__mut", "op": "slice", "inputs": [it["inputs"][0]], "attrs": {"dim": 0, "start": 0,
                  "end": "s/cp"}, "src": "mask.rows_unoffset"}
            cast = {"name": "mask_posf__mut", "op": "cast", "inputs": ["mask_pos__mut"], "attrs": {"dtype": "float"},
                    "src": "mask.rows_unoffset_cast"}
            prog["nodes"][k + 1:k + 1] = [sl, cast]
    rows = _find(p, r"mask\.rows$")
    rows["inputs"] = ["mask_posf__mut"]
    return rows["src"]


# ---------------------------------------------------------------------- ring attention (cp with --cp-style ring)
CP_RING = {"cp": 2, "cp_style": "ring"}
CP_RING_TP = {"cp": 2, "cp_style": "ring", "tp": 2}


def _ring_body(p: dict, pattern: str = r"layer0\.ring$") -> tuple[dict, dict]:
    loop = _find(p, pattern)
    return loop, loop["attrs"]["body"]


def _body_node(body: dict, role: str) -> dict:
    for n in body["nodes"]:
        if n.get("src") == role:
            return n
    raise MutationError(f"the ring body has no op with role {role!r}")


def _ring_no_max_correction(p: dict) -> str:
    """The running sum and accumulator are added to without the exp(m - m') rescale."""
    loop, body = _ring_body(p)
    _body_node(body, "ring.acc_merge")["inputs"][0] = "acc"
    _body_node(body, "ring.l_merge")["inputs"][0] = "l"
    return loop["src"]


def _ring_carry_stays(p: dict, carried: str) -> str:
    """The carried tensor ``carried`` is handed to the next step unchanged instead of passed on the ring."""
    loop, body = _ring_body(p)
    body["outputs"][body["inputs"].index(carried)] = carried
    return loop["src"]


def _ring_positions_not_passed(p: dict) -> str:
    """K and V travel the ring but the key positions stay: the causal mask compares the wrong blocks."""
    return _ring_carry_stays(p, "kpos")


def _ring_stale_reference(p: dict) -> str:
    """The new block is exponentiated against the old reference m instead of the new one m'."""
    loop, body = _ring_body(p)
    _body_node(body, "ring.shift")["inputs"][1] = "m"
    return loop["src"]


def _ring_bwd_dk_not_passed(p: dict) -> str:
    """The dK accumulator stays on its rank instead of travelling with its K block."""
    loop, body = _ring_body(p, r"layer0\.bwd\.ring\.bwd$")
    k = body["inputs"].index("dk0")
    body["outputs"][k] = _body_node(body, "ring.bwd.dk0_acc")["name"]
    return loop["src"]


def _ring_bwd_unnormalized(p: dict) -> str:
    """The recomputed probabilities are exp(s - m) without dividing by the forward's sum l."""
    loop, body = _ring_body(p, r"layer0\.bwd\.ring\.bwd$")
    prob = _body_node(body, "ring.bwd.prob")
    prob.update(op="scale", inputs=prob["inputs"][:1], attrs={"value": 1})  # P = exp(s - m)
    return loop["src"]


RING_MUTATIONS: list[Mutation] = [
    Mutation("ring_merge_no_max_correction", "ring attention merges blocks without the max correction exp(m - m')",
             CP_RING, _ring_no_max_correction),
    Mutation("ring_positions_not_passed", "ring attention passes K and V but not their positions (wrong causal mask)",
             CP_RING, _ring_positions_not_passed),
    Mutation("ring_stale_reference", "ring attention exponentiates a block against the previous running max",
             CP_RING_TP, _ring_stale_reference),
    Mutation("ring_rope_positions_not_offset", "RoPE (and ring-mask) positions are not offset by the cp rank",
             CP_RING, lambda p: _set(p, r"rope\.cp_positions$", start=0, end="s/cp")),
    Mutation("ring_bwd_dk_not_passed", "ring backward: the dK accumulator does not travel with its K block",
             CP_RING, _ring_bwd_dk_not_passed),
    Mutation("ring_bwd_unnormalized_probs", "ring backward: probabilities recomputed without the forward's sum l",
             CP_RING_TP, _ring_bwd_unnormalized),
]
MUTATIONS += RING_MUTATIONS

def _zigzag_positions_contiguous(p: dict) -> str:
    """The two position chunks are the rank's contiguous block (chunks 2r and 2r+1) instead of r and 2p-1-r."""
    c = "(s/(2*cp))"
    role = _set(p, r"rope\.cp_positions\.head$", start=f"2*rank.cp*{c}", end=f"(2*rank.cp+1)*{c}")
    _set(p, r"rope\.cp_positions\.tail$", start=f"(2*rank.cp+1)*{c}", end=f"(2*rank.cp+2)*{c}")
    return role


CP_ZIGZAG = {"cp": 2, "cp_style": "zigzag"}
CP_ZIGZAG_SP = {"cp": 2, "cp_style": "zigzag", "tp": 2, "sp": True}
ZIGZAG_MUTATIONS: list[Mutation] = [
    Mutation("zigzag_tail_chunk_shifted", "load-balanced CP: rank r's second position chunk is p+r instead of 2p-1-r "
             "(positions no longer match the tokens the rank holds)", CP_ZIGZAG,
             lambda p: _set(p, r"rope\.cp_positions\.tail$", start="(cp+rank.cp)*(s/(2*cp))",
                            end="(cp+rank.cp+1)*(s/(2*cp))")),
    Mutation("zigzag_positions_contiguous", "load-balanced CP: tokens are in zig-zag chunks but the RoPE and mask "
             "positions are the rank's contiguous block", CP_ZIGZAG_SP,
             lambda p: _zigzag_positions_contiguous(p)),
]
CP_AG_ZIGZAG = {"cp": 2, "cp_style": "allgather-zigzag"}
ZIGZAG_MUTATIONS += [
    Mutation("ag_zigzag_gathered_tails_not_flipped", "all-gather CP over load-balanced chunks: the gathered second "
             "chunks are not put back in reverse rank order (K rows out of order)", CP_AG_ZIGZAG,
             lambda p: (_bypass(p, r"layer0\.cp_k_all_gather\.second_in_order$"), "layer0.cp_k_all_gather")[1]),
    # (both blamed on the op that starts the broken block -- the all_gather, the split of the partial rows: their
    # chunk-ordered results are no logical tensor under any placement, and without the intact reorder the block
    # is not the proved pattern that explains them)
    Mutation("ag_zigzag_grad_chunks_not_paired", "all-gather CP over load-balanced chunks: the dV rows are "
             "reduce-scattered without pairing chunk r with chunk 2p-1-r", CP_AG_ZIGZAG,
             lambda p: (_bypass(p, r"layer0\.bwd\.cp_dv_reduce_scatter\.second_reversed$"),
                        "layer0.bwd.cp_dv_reduce_scatter.halves")[1]),
]
MUTATIONS += ZIGZAG_MUTATIONS

BY_NAME = {m.name: m for m in MUTATIONS}


def mutate(plan: dict, name: str) -> tuple[dict, str]:
    """Return (mutated copy, src role of the node the bug should be blamed on)."""
    if name not in BY_NAME:
        raise MutationError(f"unknown mutation {name!r}; known: {', '.join(sorted(BY_NAME))}")
    out = copy.deepcopy(plan)
    role = BY_NAME[name].apply(out)
    out["name"] = f"{plan.get('name', 'plan')}+{name}"
    out["description"] = f"{plan.get('description', '')} BUG ({name}): {BY_NAME[name].doc}"
    return out, role


# ---------------------------------------------------------------------- DeepSeek MoE / expert parallelism
# Kept in their own list (the Llama suite runs every entry of MUTATIONS on a Llama plan); each config
# names the model it applies to.  Generate with tvcert.generators.deepseek.deepseek_plan(**config).
DS_EP = {"model": "deepseek-v3-671b", "ep": 2}
DS_DP_EP = {"model": "deepseek-v3-671b", "dp": 2, "ep": 2}
DS_DP_EP_ZERO = {"model": "deepseek-v3-671b", "dp": 2, "ep": 2, "zero": 1}


def _combine_dispatch_order(p: dict) -> str:
    """After the combine all_to_all, experts come back in dispatch (rank-interleaved) order, not expert order."""
    n = _find(p, r"layer\d+\.combine\.all_to_all$")
    for prog in p["parallel"]:
        if n in prog["nodes"]:
            k = prog["nodes"].index(n)
            base = n["name"]
            r1 = {"name": base + "__split", "op": "reshape", "inputs": [base],
                  "attrs": {"shape": ["ep", "ne/ep", "b/ep", "s", "h"]}, "src": n["src"] + ".dispatch_order_split"}
            pm = {"name": base + "__perm", "op": "permute", "inputs": [r1["name"]], "attrs": {"dims": [1, 0, 2, 3, 4]},
                  "src": n["src"] + ".dispatch_order"}
            r2 = {"name": base + "__mut", "op": "reshape", "inputs": [pm["name"]],
                  "attrs": {"shape": ["ne", "b/ep", "s", "h"]}, "src": n["src"] + ".dispatch_order_merge"}
            for m in prog["nodes"][k + 1:]:
                m["inputs"] = [r2["name"] if x == base else x for x in m.get("inputs", [])]
            prog["nodes"][k + 1:k + 1] = [r1, pm, r2]
            return r2["src"]
    raise MutationError("node not found")


DS_CP_RING = {"model": "deepseek-v3-671b", "cp": 2, "cp_style": "ring", "tp": 2}


def _mla_ring_rope_key_stays(p: dict) -> str:
    """MLA ring attention: the no-rope keys and values travel, the shared rope key stays on its rank."""
    return _ring_carry_stays(p, "k1")


def _mla_ring_bwd_rope_grad_not_summed(p: dict) -> str:
    """MLA ring backward: the shared rope key's gradient keeps head 0's term instead of summing the heads."""
    loop, body = _ring_body(p, r"layer0\.bwd\.ring\.bwd$")
    n = _body_node(body, "ring.bwd.dk1_sum_heads")
    n.update(op="slice", attrs={"dim": 1, "start": 0, "end": 1})
    return loop["src"]


MOE_MUTATIONS: list[Mutation] = [
    Mutation("mla_ring_rope_key_stays", "MLA ring attention passes the no-rope keys and values but not the shared rope "
             "key", DS_CP_RING, _mla_ring_rope_key_stays),
    Mutation("mla_ring_bwd_rope_grad_one_head", "MLA ring backward: the shared rope key's gradient takes one head's "
             "term instead of the sum over heads", DS_CP_RING, _mla_ring_bwd_rope_grad_not_summed),
    Mutation("expert_grad_wrong_group_size", "expert gradients are divided by ep, as if averaged over the ep group",
             DS_EP, lambda p: _insert_after(p, r"layer\d+\.bwd\.experts\.w1_dw$", "div", "div_ep",
                                            [{"name": "ep__mut", "op": "const", "attrs": {"value": "ep"},
                                              "src": "ep_count"}])),
    Mutation("expert_grad_avg_over_dp", "expert gradients are averaged (not summed) over dp", DS_DP_EP,
             lambda p: _set(p, r"layer\d+\.experts\.w2\.grad_all_reduce$", reduce="avg"), "consumer"),
    Mutation("expert_grad_reduced_over_ep", "ep-sharded expert gradients are also all-reduced over ep (experts mixed)",
             DS_DP_EP, lambda p: _set(p, r"layer\d+\.experts\.w3\.grad_all_reduce$", axis=["dp", "ep"]), "consumer"),
    Mutation("moe_combine_dispatch_order", "MoE combine reads the expert outputs in dispatch order (rank-interleaved)",
             DS_EP, _combine_dispatch_order, "consumer"),
    Mutation("moe_missing_all_to_all_back", "the combine all_to_all is missing: local expert outputs are reinterpreted "
             "as the token block", DS_EP,
             lambda p: _replace_op(p, r"layer\d+\.combine\.all_to_all$", "reshape", {"shape": ["ne", "b/ep", "s", "h"]})),
    Mutation("moe_combine_dispatch_weights", "MoE combine weights expert outputs by the 0/1 dispatch mask, not the gate",
             DS_EP, lambda p: _reroute(p, r"layer\d+\.combine$", 1, r"layer\d+\.gate\.mask$")),
    Mutation("moe_gate_not_normalized", "top-k gate weights are not normalized in the forward (backward still is)",
             DS_EP, lambda p: _bypass(p, r"layer\d+\.gate\.normalize$"), "consumer"),
    Mutation("moe_gate_grad_not_normalized", "the gate backward skips the normalization's Jacobian", DS_EP,
             lambda p: _bypass(p, r"layer\d+\.bwd\.gate\.bwd\.normalize$"), "consumer"),
    Mutation("expert_grad_wrong_group", "ZeRO: expert gradients are reduce-scattered over the expert-parallel group "
             "(ep) instead of their expert-data-parallel group (dp)", DS_DP_EP_ZERO,
             lambda p: _set(p, r"layer\d+\.experts\.w1\.grad_reduce_scatter$", axis="ep")),
    Mutation("router_grad_not_reduced", "the router weight gradient is not all-reduced over ep (a data axis for it)",
             DS_EP, lambda p: _bypass(p, r"layer\d+\.router\.grad_all_reduce$"), "consumer"),
]
BY_NAME.update({m.name: m for m in MOE_MUTATIONS})
