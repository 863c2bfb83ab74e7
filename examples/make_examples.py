"""Regenerate the bundled example plans (python examples/make_examples.py).

The JSON files are committed; this script is how they were written, so a change to one
example is a reviewed change here.
"""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent


def n(name, op, *inputs, src=None, **attrs):
    d = {"name": name, "op": op, "inputs": list(inputs)}
    if attrs:
        d["attrs"] = attrs
    if src:
        d["src"] = src
    return d


def t(name, shape, dtype="float", **kw):
    return {"name": name, "shape": shape, "dtype": dtype, **kw}


def write(name, plan):
    (HERE / f"{name}.json").write_text(json.dumps(plan, indent=1) + "\n")


# ----------------------------------------------------------------- Megatron TP MLP
def mlp_logical():
    return {
        "inputs": [t("x", ["b", "h"]), t("w1", ["h", "f"]), t("b1", ["f"]), t("w2", ["f", "h"]),
                   t("b2", ["h"]), t("target", ["b", "h"])],
        "nodes": [
            n("a", "matmul", "x", "w1", src="mlp.py:10"),
            n("a1", "add", "a", "b1", src="mlp.py:10"),
            n("hid", "tanh", "a1", src="mlp.py:11"),
            n("o", "matmul", "hid", "w2", src="mlp.py:12"),
            n("y", "add", "o", "b2", src="mlp.py:12"),
            n("diff", "sub", "y", "target", src="mlp.py:15"),
            n("sq", "square", "diff", src="mlp.py:15"),
            n("ssum", "sum", "sq", dims=[0, 1], src="mlp.py:15"),
            n("loss", "scale", "ssum", value=0.5, src="mlp.py:15"),
            # backward (dloss/dy = diff)
            n("hT", "transpose", "hid", dim0=0, dim1=1),
            n("gw2", "matmul", "hT", "diff"),
            n("gb2", "sum", "diff", dims=[0]),
            n("w2T", "transpose", "w2", dim0=0, dim1=1),
            n("dh", "matmul", "diff", "w2T"),
            n("hsq", "square", "hid"),
            n("one", "const", value=1),
            n("dtanh", "sub", "one", "hsq"),
            n("da", "mul", "dh", "dtanh"),
            n("xT", "transpose", "x", dim0=0, dim1=1),
            n("gw1", "matmul", "xT", "da"),
            n("gb1", "sum", "da", dims=[0]),
        ],
        "outputs": ["loss", "gw1", "gb1", "gw2", "gb2"],
    }


def mlp_parallel(bug=None):
    nodes = [
        n("a", "matmul", "x", "w1", src="mlp_tp.py:20"),
        n("a1", "add", "a", "b1", src="mlp_tp.py:20"),
        n("hid", "tanh", "a1", src="mlp_tp.py:21"),
        n("o_part", "matmul", "hid", "w2", src="mlp_tp.py:22"),
    ]
    if bug == "no_allreduce":
        nodes.append(n("y", "add", "o_part", "b2", src="mlp_tp.py:23"))
    elif bug == "bias_before_allreduce":
        nodes += [n("o_b", "add", "o_part", "b2", src="mlp_tp.py:23"),
                  n("y", "all_reduce", "o_b", axis="tp", reduce="sum", src="mlp_tp.py:24")]
    else:
        nodes += [n("o", "all_reduce", "o_part", axis="tp", reduce="sum", src="mlp_tp.py:23"),
                  n("y", "add", "o", "b2", src="mlp_tp.py:24")]
    nodes += [
        n("diff", "sub", "y", "target", src="mlp_tp.py:27"),
        n("sq", "square", "diff", src="mlp_tp.py:27"),
        n("ssum", "sum", "sq", dims=[0, 1], src="mlp_tp.py:27"),
        n("loss", "scale", "ssum", value=0.5, src="mlp_tp.py:27"),
        n("hT", "transpose", "hid", dim0=0, dim1=1),
        n("gw2", "matmul", "hT", "diff"),
        n("gb2", "sum", "diff", dims=[0]),
        n("w2T", "transpose", "w2", dim0=0, dim1=1),
        n("dh", "matmul", "diff", "w2T"),
    ]
    if bug == "rewritten":  # 1 - h^2 written as (1 - h)(1 + h): equal over the reals, proved by SMT
        nodes += [n("one", "const", value=1), n("omh", "sub", "one", "hid", src="mlp_tp.py:40"),
                  n("oph", "add", "one", "hid", src="mlp_tp.py:40"), n("dtanh", "mul", "omh", "oph", src="mlp_tp.py:40")]
    else:
        nodes += [n("hsq", "square", "hid"), n("one", "const", value=1), n("dtanh", "sub", "one", "hsq")]
    nodes += [
        n("da", "mul", "dh", "dtanh"),
        n("xT", "transpose", "x", dim0=0, dim1=1),
        n("gw1", "matmul", "xT", "da"),
        n("gb1", "sum", "da", dims=[0]),
    ]
    return {
        "name": "tp",
        "inputs": [t("x", ["b", "h"]), t("w1", ["h", "f/tp"]), t("b1", ["f/tp"]), t("w2", ["f/tp", "h"]),
                   t("b2", ["h"]), t("target", ["b", "h"])],
        "nodes": nodes,
        "outputs": ["loss", "gw1", "gb1", "gw2", "gb2"],
    }


def mlp_plan(name, desc, bug=None):
    R, S0, S1 = "Replicate", "Shard(0)", "Shard(1)"
    return {
        "tvcert_plan": 1,
        "name": name,
        "description": desc,
        "dims": {"b": 4, "h": 8, "f": 16, "tp": 2},
        "mesh": {"tp": "tp"},
        "logical": mlp_logical(),
        "parallel": [mlp_parallel(bug)],
        "inputs": {
            "x": {"local": "x", "placement": {"tp": R}},
            "w1": {"local": "w1", "placement": {"tp": S1}},
            "b1": {"local": "b1", "placement": {"tp": S0}},
            "w2": {"local": "w2", "placement": {"tp": S0}},
            "b2": {"local": "b2", "placement": {"tp": R}},
            "target": {"local": "target", "placement": {"tp": R}},
        },
        "outputs": {
            "loss": {"local": "loss", "placement": {"tp": R}},
            "gw1": {"local": "gw1", "placement": {"tp": S1}},
            "gb1": {"local": "gb1", "placement": {"tp": S0}},
            "gw2": {"local": "gw2", "placement": {"tp": S0}},
            "gb2": {"local": "gb2", "placement": {"tp": R}},
        },
    }


# ----------------------------------------------------------------- TrainVerify C.12 pair
def c12_plan():
    return {
        "tvcert_plan": 1,
        "name": "trainverify_c12",
        "description": "TrainVerify Theorem C.12 counterexample: f(x)=[[1,1],[1,1]]x (logical) vs "
                       "g(x)=[[1,1],[2,0]]x (parallel, one output row per rank). They agree at index 0 "
                       "for every x and differ at index 1.",
        "dims": {"n": 2, "tp": 2},
        "mesh": {"tp": "tp"},
        "logical": {
            "inputs": [t("x", ["n"])],
            "nodes": [n("A", "const", value=[[1, 1], [1, 1]], shape=["n", "n"]),
                      n("y", "matmul", "A", "x", src="f.py:1")],
            "outputs": ["y"],
        },
        "parallel": [{
            "name": "rows",
            "inputs": [t("x", ["n"])],
            "nodes": [n("B", "const", value=[[1, 1], [2, 0]], shape=["n", "n"], src="g.py:1"),
                      n("Brow", "slice", "B", dim=0, start="rank.tp*(n/tp)", end="(rank.tp+1)*(n/tp)", src="g.py:2"),
                      n("y", "matmul", "Brow", "x", src="g.py:3")],
            "outputs": ["y"],
        }],
        "inputs": {"x": {"local": "x", "placement": {"tp": "Replicate"}}},
        "outputs": {"y": {"local": "y", "placement": {"tp": "Shard(0)"}}},
    }


# ----------------------------------------------------------------- reshape/transpose swap
def heads_plan(bug):
    par_nodes = (
        [n("xt", "transpose", "x", dim0=1, dim1=2, src="attn_tp.py:30"),
         n("xh", "reshape", "xt", shape=["b", "nh", "s", "hd"], src="attn_tp.py:31")]
        if bug else
        [n("xr", "reshape", "x", shape=["b", "s", "nh", "hd"], src="attn_tp.py:30"),
         n("xh", "transpose", "xr", dim0=1, dim1=2, src="attn_tp.py:31")])
    par_nodes.append(n("mine", "slice", "xh", dim=1, start="rank.tp*(nh/tp)", end="(rank.tp+1)*(nh/tp)", src="attn_tp.py:32"))
    return {
        "tvcert_plan": 1,
        "name": "heads_swap" if bug else "heads_ok",
        "description": ("Split [b, s, hidden] into heads [b, heads, s, head_dim], each tp rank keeping its heads. "
                        + ("BUG: the parallel side transposes before reshaping, without the compensating transpose."
                           if bug else "Correct: reshape, then transpose, then take this rank's heads.")),
        "dims": {"b": 2, "s": 3, "nh": 4, "hd": 2, "tp": 2},
        "mesh": {"tp": "tp"},
        "logical": {
            "inputs": [t("x", ["b", "s", "nh*hd"])],
            "nodes": [n("xr", "reshape", "x", shape=["b", "s", "nh", "hd"], src="attn.py:30"),
                      n("xh", "transpose", "xr", dim0=1, dim1=2, src="attn.py:31")],
            "outputs": ["xh"],
        },
        "parallel": [{"name": "tp", "inputs": [t("x", ["b", "s", "nh*hd"])], "nodes": par_nodes, "outputs": ["mine"]}],
        "inputs": {"x": {"local": "x", "placement": {"tp": "Replicate"}}},
        "outputs": {"xh": {"local": "mine", "placement": {"tp": "Shard(1)"}}},
    }


# ----------------------------------------------------------------- vocab-parallel embedding (Megatron)
def vocab_embedding_plan(bug=None):
    hi = "rank.tp*(v/tp)+v/tp" + ("-1" if bug == "short_block" else "")
    nodes = [
        n("lo", "const", value="rank.tp*(v/tp)", dtype="int", src="vocab_parallel.py:10"),
        n("hi", "const", value=hi, dtype="int", src="vocab_parallel.py:11"),
        n("below", "lt", "ids", "lo", src="vocab_parallel.py:12"),
        n("above", "ge", "ids", "hi", src="vocab_parallel.py:12"),
        n("outside", "logical_or", "below", "above", src="vocab_parallel.py:12"),
        n("lo_off", "const", value="rank.tp*(v/tp)", dtype="int", src="vocab_parallel.py:13"),
        n("shifted", "sub", "ids", "lo_off", src="vocab_parallel.py:13"),
        n("lid", "masked_fill", "shifted", "outside", value=0, src="vocab_parallel.py:14"),
        n("rows", "embedding", "w", "lid", src="vocab_parallel.py:15"),
        n("outside3", "unsqueeze", "outside", dim=-1, src="vocab_parallel.py:16"),
    ]
    if bug == "no_output_mask":
        nodes.append(n("masked", "cast", "rows", src="vocab_parallel.py:16"))
    else:
        nodes.append(n("masked", "masked_fill", "rows", "outside3", value=0, src="vocab_parallel.py:16"))
    nodes.append(n("y", "all_reduce", "masked", axis="tp", reduce="sum", src="vocab_parallel.py:17"))
    return embedding_plan("vocab_parallel_embedding" + (f"_{bug}" if bug else ""),
                          "Megatron vocab-parallel embedding over tp=2: each rank looks up ids - rank*V/tp in its rows, "
                          "zeroes tokens outside its block, all_reduce sums. "
                          + {None: "Correct.", "short_block": "BUG: the block mask drops the last row of every rank's "
                                                              "block.",
                             "no_output_mask": "BUG: rows of tokens outside the block are not zeroed."}[bug], nodes)


def embedding_plan(name, description, nodes):
    """A vocab-parallel embedding over tp=2: logical embedding(w, ids); the table sharded by vocab rows."""
    return {
        "tvcert_plan": 1,
        "name": name,
        "description": description,
        "dims": {"n": 16, "v": 8, "h": 3, "tp": 2},
        "mesh": [["tp", "tp"]],
        "logical": {"inputs": [t("ids", ["n"], "int", range="v"), t("w", ["v", "h"])],
                    "nodes": [n("y", "embedding", "w", "ids", src="model.py:5")], "outputs": ["y"]},
        "parallel": [{"name": "tp", "inputs": [t("ids", ["n"], "int", range="v"), t("w", ["v/tp", "h"])],
                      "nodes": nodes, "outputs": ["y"]}],
        "inputs": {"ids": {"local": "ids"}, "w": {"local": "w", "placement": {"tp": "Shard(0)"}}},
        "outputs": {"y": {"local": "y", "placement": {"tp": "Replicate"}}},
    }


def clamped_embedding_plan(bug=None):
    """torchtitan's vocab-parallel embedding: clamp the shifted ids into the block, multiply rows by the mask."""
    nodes = [
        n("lo", "const", value="rank.tp*(v/tp)", dtype="int", src="embedding.py:30"),
        n("hi", "const", value="rank.tp*(v/tp)+v/tp", dtype="int", src="embedding.py:31"),
        n("ge_lo", "ge", "ids", "lo", src="embedding.py:32"),
        n("lt_hi", "lt", "ids", "hi", src="embedding.py:32"),
        n("inside", "logical_and", "ge_lo", "lt_hi", src="embedding.py:32"),
        n("shifted", "add_scalar", "ids", value="(tp-1-rank.tp)*-(v/tp)" if bug == "mirrored_shift" else "rank.tp*-(v/tp)",
          src="embedding.py:33"),
        n("zero", "const", value=0, dtype="int", src="embedding.py:34"),
        n("top", "const", value="v/tp-1", dtype="int", src="embedding.py:34"),
        n("clamp_lo", "maximum", "shifted", "zero", src="embedding.py:34"),
        n("lid", "minimum", "clamp_lo", "top", src="embedding.py:34"),
        n("rows", "embedding", "w", "lid", src="embedding.py:35"),
        n("inside2", "unsqueeze", "inside", dim=-1, src="embedding.py:36"),
        n("insidef", "cast", "inside2", dtype="float", src="embedding.py:36"),
    ]
    if bug == "no_row_mask":
        nodes.append(n("masked", "cast", "rows", src="embedding.py:36"))
    else:
        nodes.append(n("masked", "mul", "rows", "insidef", src="embedding.py:36"))
    nodes.append(n("y", "all_reduce", "masked", axis="tp", reduce="sum", src="embedding.py:37"))
    return embedding_plan(
        "vocab_parallel_embedding_clamped" + (f"_{bug}" if bug else ""),
        "torchtitan's vocab-parallel embedding over tp=2: each rank looks up clamp(ids - rank*V/tp, 0, V/tp - 1) in "
        "its rows and multiplies by the in-block mask; all_reduce sums. "
        + {None: "Correct.",
           "no_row_mask": "BUG: rows are not multiplied by the in-block mask (clamped out-of-block tokens read an "
                          "edge row).",
           "mirrored_shift": "BUG: the ids are shifted by the mirrored rank's offset, so in-block tokens read the "
                             "wrong (clamped) row."}[bug], nodes)


# ----------------------------------------------------------------- vocab-parallel target logit (Megatron CE)
def target_logit_plan(bug=None):
    nodes = [
        n("lo", "const", value="rank.tp*(v/tp)", dtype="int", src="cross_entropy.py:20"),
        n("hi", "const", value="rank.tp*(v/tp)+v/tp", dtype="int", src="cross_entropy.py:21"),
        n("below", "lt", "t", "lo", src="cross_entropy.py:22"),
        n("above", "ge", "t", "hi", src="cross_entropy.py:22"),
        n("outside", "logical_or", "below", "above", src="cross_entropy.py:22"),
        n("shifted", "sub", "t", "lo", src="cross_entropy.py:23"),
        n("lt_", "masked_fill", "shifted", "outside", value=0, src="cross_entropy.py:24"),
        n("idx", "unsqueeze", "lt_", dim=1, src="cross_entropy.py:27"),
        n("picked2", "gather", "logits", "idx", dim=1, src="cross_entropy.py:27"),
        n("picked", "reshape", "picked2", shape=["n"], src="cross_entropy.py:28"),
        n("masked", "masked_fill", "picked", "outside" if bug != "wrong_mask" else "below", value=0,
          src="cross_entropy.py:29"),
        n("y", "all_reduce", "masked", axis="tp", reduce="sum", src="cross_entropy.py:30"),
    ]
    return {
        "tvcert_plan": 1,
        "name": "vocab_parallel_target_logit" + (f"_{bug}" if bug else ""),
        "description": "Megatron vocab-parallel cross-entropy's target logit over tp=2: each rank picks logits[i, "
                       "t_i - rank*V/tp] from its vocab block, zeroes targets outside it, all_reduce sums. "
                       + ("Correct." if bug is None else "BUG: only targets below the block are zeroed."),
        "dims": {"n": 16, "v": 8, "tp": 2},
        "mesh": [["tp", "tp"]],
        "logical": {"inputs": [t("logits", ["n", "v"]), t("t", ["n"], "int", range="v")],
                    "nodes": [n("ti", "unsqueeze", "t", dim=1), n("g", "gather", "logits", "ti", dim=1),
                              n("y", "reshape", "g", shape=["n"], src="model.py:9")], "outputs": ["y"]},
        "parallel": [{"name": "tp", "inputs": [t("logits", ["n", "v/tp"]), t("t", ["n"], "int", range="v")],
                      "nodes": nodes, "outputs": ["y"]}],
        "inputs": {"logits": {"local": "logits", "placement": {"tp": "Shard(1)"}}, "t": {"local": "t"}},
        "outputs": {"y": {"local": "y", "placement": {"tp": "Replicate"}}},
    }


# ----------------------------------------------------------------- loss parallel (torchtitan's vocab-parallel CE)
def loss_parallel_plan(bug=None):
    """torchtitan's _LossParallelCrossEntropy (sum reduction, ignore_index=-100) on Shard(1) logits, forward and
    backward, against the logical log_softmax + nll_loss graph (as the ATen converter writes it)."""
    shift_max = "m_local" if bug == "local_max" else "m"
    nodes = [
        n("m_local", "amax", "logits", dims=[1], keepdim=True, src="loss.py:10"),
        n("m", "all_reduce", "m_local", axis="tp", reduce="max", src="loss.py:11"),
        n("z", "sub", "logits", shift_max, src="loss.py:12"),
        n("ez", "exp", "z", src="loss.py:13"),
        n("se_local", "sum", "ez", dims=[1], keepdim=True, src="loss.py:13"),
        n("se", "all_reduce", "se_local", axis="tp", reduce="sum", src="loss.py:14"),
        n("lse", "log", "se", src="loss.py:15"),
        n("ls", "sub", "z", "lse", src="loss.py:15"),
        n("ig", "const", value=-100, dtype="int", src="loss.py:20"),
        n("keep", "ne", "t", "ig", src="loss.py:20"),
        n("zero_i", "const", value=0, dtype="int", src="loss.py:21"),
        n("safe_t", "where", "keep", "t", "zero_i", src="loss.py:21"),
        n("lo", "const", value="rank.tp*(v/tp)", dtype="int", src="loss.py:22"),
        n("hi", "const", value="rank.tp*(v/tp)+v/tp", dtype="int", src="loss.py:23"),
        n("below", "lt", "safe_t", "lo", src="loss.py:24"),
        n("above", "ge", "safe_t", "hi", src="loss.py:24"),
        n("outside", "logical_or", "below", "above", src="loss.py:24"),
        n("shifted", "sub", "safe_t", "lo", src="loss.py:25"),
        n("zero_l", "const", value=0, dtype="int", src="loss.py:26"),
        n("lid", "where", "outside", "zero_l", "shifted", src="loss.py:26"),
        n("idx", "unsqueeze", "lid", dim=1, src="loss.py:27"),
        n("picked", "gather", "ls", "idx", dim=-1, src="loss.py:27"),
        n("outside2", "unsqueeze", "outside", dim=1, src="loss.py:28"),
        n("zero_f", "const", value=0, src="loss.py:28"),
        n("masked", "where", "outside2", "zero_f", "picked", src="loss.py:28"),
    ]
    if bug == "no_target_all_reduce":
        nodes.append(n("target", "squeeze", "masked", dims=[1], src="loss.py:30"))
    else:
        nodes += [n("target_sum", "all_reduce", "masked", axis="tp", reduce="sum", src="loss.py:29"),
                  n("target", "squeeze", "target_sum", dims=[1], src="loss.py:30")]
    nodes += [
        n("nll", "neg", "target", src="loss.py:31"),
        n("zero_f2", "const", value=0, src="loss.py:32"),
        n("tok_loss", "where", "keep", "nll", "zero_f2", src="loss.py:32"),
        n("loss", "sum", "tok_loss", dims=[0], src="loss.py:33"),
        # backward: (exp(ls) - local one-hot) * where(keep, g, 0)
        n("g", "const", value=1, src="loss.py:40"),
        n("outside_f", "cast", "outside", dtype="float", src="loss.py:41"),
        n("minus_in", "add_scalar", "outside_f", value=-1.0, src="loss.py:41"),
        n("minus_in2", "unsqueeze", "minus_in", dim=1, src="loss.py:41"),
        n("oh", "one_hot", "lid", num_classes="v/tp", src="loss.py:42"),
        n("zero_f3", "const", value=0, src="loss.py:42"),
        n("neg_oh", "where", "oh", "minus_in2", "zero_f3", src="loss.py:42"),
        n("probs", "exp", "ls", src="loss.py:43"),
        n("dls", "add", "neg_oh", "probs", src="loss.py:43"),
        n("keep2", "unsqueeze", "keep", dim=1, src="loss.py:44"),
        n("zero_f4", "const", value=0, src="loss.py:44"),
        n("gk", "where", "keep2", "g", "zero_f4", src="loss.py:44"),
        n("dx", "mul", "dls", "gk", src="loss.py:45"),
    ]
    return {
        "tvcert_plan": 1,
        "name": "vocab_parallel_loss" + (f"_{bug}" if bug else ""),
        "description": "torchtitan's loss parallel over tp=2 (vocab-parallel log_softmax with the all-reduced max and "
                       "sum of exps; the target logit picked at t - rank*V/tp, masked, all-reduced, ignore_index=-100; "
                       "backward exp(ls) minus the local one-hot), forward and backward. "
                       + {None: "Correct.",
                          "local_max": "BUG: the logits are shifted by the rank's local max, not the all-reduced max.",
                          "no_target_all_reduce": "BUG: the picked target logit is not all-reduced, so each rank "
                                                  "keeps only the targets in its own block."}[bug],
        "dims": {"n": 16, "v": 8, "tp": 2},
        "mesh": [["tp", "tp"]],
        "logical": {"inputs": [t("logits", ["n", "v"]), t("t", ["n"], "int", range="v")],
                    "nodes": [n("ls", "log_softmax", "logits", dim=1, src="model.py:9"),
                              n("oh", "one_hot", "t", num_classes="v", src="model.py:10"),
                              n("picked", "mul", "ls", "oh", src="model.py:10"),
                              n("row", "sum", "picked", dims=[1], src="model.py:10"),
                              n("nll", "neg", "row", src="model.py:10"),
                              n("loss", "sum", "nll", dims=[0], src="model.py:10"),
                              n("g", "const", value=1, src="model.py:12"),
                              n("oh_b", "one_hot", "t", num_classes="v", src="model.py:12"),
                              n("noh", "neg", "oh_b", src="model.py:12"),
                              n("dnll", "mul", "noh", "g", src="model.py:12"),
                              n("dx", "log_softmax_backward", "dnll", "ls", dim=1, src="model.py:13")],
                    "outputs": ["loss", "dx"]},
        "parallel": [{"name": "tp", "inputs": [t("logits", ["n", "v/tp"]), t("t", ["n"], "int", range="v")],
                      "nodes": nodes, "outputs": ["loss", "dx"]}],
        "inputs": {"logits": {"local": "logits", "placement": {"tp": "Shard(1)"}}, "t": {"local": "t"}},
        "outputs": {"loss": {"local": "loss", "placement": {"tp": "Replicate"}},
                    "dx": {"local": "dx", "placement": {"tp": "Shard(1)"}}},
    }


def ring_attention_plan(bug=None):
    """Ring attention over cp=2 (causal), hand-written; see kernel/ring.py for the protocol."""
    c = 0.5
    shp, lshp, rows = ["b", "nh", "s", "hd"], ["b", "nh", "s/cp", "hd"], ["b", "nh", "s/cp", 1]
    logical = [
        n("kt", "permute", "k", dims=[0, 1, 3, 2]),
        n("s0", "matmul", "q", "kt"), n("s1", "scale", "s0", value=c),
        n("iota", "iota", size="s"), n("pos", "cast", "iota", dtype="float"),
        n("cols", "unsqueeze", "pos", dim=0), n("rows", "unsqueeze", "pos", dim=1),
        n("mask", "gt", "cols", "rows"),
        n("s2", "masked_fill", "s1", "mask", value=-1e9),
        n("p", "softmax", "s2", dim=-1), n("o", "matmul", "p", "v", src="attention.py:12"),
    ]
    acc_merge_in = "acc" if bug == "no_max_correction" else "acc_r"
    l_merge_in = "l" if bug == "no_max_correction" else "l_r"
    body = [
        n("kt", "permute", "k", dims=[0, 1, 3, 2], src="ring.py:20"),
        n("s0", "matmul", "q", "kt", src="ring.py:20"), n("s1", "scale", "s0", value=c, src="ring.py:20"),
        n("cols", "unsqueeze", "kpos", dim=0, src="ring.py:21"), n("rows", "unsqueeze", "qpos", dim=1, src="ring.py:21"),
        n("mask", "gt", "cols", "rows", src="ring.py:21"),
        n("s2", "masked_fill", "s1", "mask", value=-1e9, src="ring.py:22"),
        n("bmax", "amax", "s2", dims=[-1], keepdim=True, src="ring.py:23"),
        n("m2", "maximum", "m", "bmax", src="ring.py:23"),
        n("dm", "sub", "m", "m2", src="ring.py:24"), n("corr", "exp", "dm", src="ring.py:24"),
        n("ds", "sub", "s2", "m2", src="ring.py:25"), n("e", "exp", "ds", src="ring.py:25"),
        n("l_r", "mul", "l", "corr", src="ring.py:26"), n("l_b", "sum", "e", dims=[-1], keepdim=True, src="ring.py:26"),
        n("l2", "add", l_merge_in, "l_b", src="ring.py:26"),
        n("acc_r", "mul", "acc", "corr", src="ring.py:27"), n("acc_b", "matmul", "e", "v", src="ring.py:27"),
        n("acc2", "add", acc_merge_in, "acc_b", src="ring.py:27"),
        n("k2", "ppermute", "k", axis="cp", shift=-1 if bug == "shift_backwards" else 1, src="ring.py:28"),
        n("v2", "ppermute", "v", axis="cp", shift=-1 if bug == "shift_backwards" else 1, src="ring.py:28"),
        n("kpos2", "ppermute", "kpos", axis="cp", shift=-1 if bug == "shift_backwards" else 1, src="ring.py:28"),
    ]
    outs = ["m2", "l2", "acc2", "k2", "v2", "kpos" if bug == "positions_not_passed" else "kpos2"]
    nodes = [
        n("iota", "iota", size="s", src="ring.py:10"),
        n("blk", "slice", "iota", dim=0, start="rank.cp*(s/cp)", end="(rank.cp+1)*(s/cp)", src="ring.py:10"),
        n("qpos", "cast", "blk", dtype="float", src="ring.py:10"),
        n("m0", "const", value=0 if bug == "acc_starts_at_one" else -1e30, shape=rows, src="ring.py:14"),
        n("l0", "const", value=1 if bug == "acc_starts_at_one" else 0, shape=rows, src="ring.py:15"),
        n("acc0", "const", value=1 if bug == "acc_starts_at_one" else 0, shape=lshp, src="ring.py:16"),
        {"outputs": ["m", "l", "acc", "k_", "v_", "kpos_"], "op": "ring_loop",
         "inputs": ["m0", "l0", "acc0", "k", "v", "qpos", "q", "qpos"],
         "attrs": {"axis": "cp", "carry": 6,
                   "body": {"inputs": ["m", "l", "acc", "k", "v", "kpos", "q", "qpos"], "nodes": body, "outputs": outs}},
         "src": "ring.py:18"},
        n("o", "div", "acc", "l", src="ring.py:30"),
    ]
    what = {None: "Correct.",
            "no_max_correction": "BUG: blocks are merged without the max correction exp(m - m').",
            "positions_not_passed": "BUG: K and V travel the ring but the key positions do not (wrong causal mask).",
            "acc_starts_at_one": "BUG: the running max, sum and accumulator start at 0, 1, 1 instead of -1e30, 0, 0.",
            "shift_backwards": "Correct, but blocks travel the other way (shift -1): not the proved schedule, so "
                               "UNKNOWN (the interpreter finds no difference)."}[bug]
    return {
        "tvcert_plan": 1,
        "name": "ring_attention_cp2" + (f"_{bug}" if bug else ""),
        "description": "Causal ring attention over cp=2: each rank keeps its query block; K, V and key positions "
                       "travel the ring (ppermute), each block is merged with the online-softmax update, and the "
                       "result is normalized at the end. " + what,
        "dims": {"b": 1, "nh": 2, "s": 8, "hd": 2, "cp": 2},
        "mesh": [["cp", "cp"]],
        "logical": {"inputs": [t(x, shp) for x in "qkv"], "nodes": logical, "outputs": ["o"]},
        "parallel": [{"name": "cp", "inputs": [t(x, lshp) for x in "qkv"], "nodes": nodes, "outputs": ["o"]}],
        "inputs": {x: {"local": x, "placement": {"cp": "Shard(2)"}} for x in "qkv"},
        "outputs": {"o": {"local": "o", "placement": {"cp": "Shard(2)"}}},
    }


if __name__ == "__main__":
    write("mlp_tp2", mlp_plan("mlp_tp2", "Two-layer MLP, Megatron tensor parallel over tp=2 (column- then "
                                          "row-parallel linear, all_reduce), forward and backward. Correct."))
    write("mlp_tp2_no_allreduce", mlp_plan("mlp_tp2_no_allreduce", "BUG: the all_reduce after the row-parallel "
                                                                   "linear is missing.", "no_allreduce"))
    write("mlp_tp2_bias_before_allreduce", mlp_plan("mlp_tp2_bias_before_allreduce",
                                                    "BUG: the row-parallel bias is added on every rank before the "
                                                    "all_reduce, so the output carries tp*bias.", "bias_before_allreduce"))
    write("mlp_tp2_rewritten", mlp_plan("mlp_tp2_rewritten", "Correct: as mlp_tp2, but the parallel backward writes "
                                                             "tanh' = 1 - h^2 as (1 - h)(1 + h); an SMT obligation "
                                                             "proves the two equal.", "rewritten"))
    write("trainverify_c12", c12_plan())
    write("heads_reshape_transpose_swap", heads_plan(True))
    write("heads_ok", heads_plan(False))
    write("vocab_parallel_embedding", vocab_embedding_plan())
    write("vocab_parallel_embedding_short_block_bug", vocab_embedding_plan("short_block"))
    write("vocab_parallel_embedding_unmasked_bug", vocab_embedding_plan("no_output_mask"))
    write("vocab_parallel_embedding_clamped", clamped_embedding_plan())
    write("vocab_parallel_embedding_clamped_no_row_mask", clamped_embedding_plan("no_row_mask"))
    write("vocab_parallel_embedding_clamped_mirrored_shift", clamped_embedding_plan("mirrored_shift"))
    write("vocab_parallel_target_logit", target_logit_plan())
    write("vocab_parallel_target_logit_mask_bug", target_logit_plan("wrong_mask"))
    write("vocab_parallel_loss", loss_parallel_plan())
    write("vocab_parallel_loss_local_max", loss_parallel_plan("local_max"))
    write("vocab_parallel_loss_no_target_all_reduce", loss_parallel_plan("no_target_all_reduce"))
    write("ring_attention_cp2", ring_attention_plan())
    for bug in ("no_max_correction", "positions_not_passed", "acc_starts_at_one", "shift_backwards"):
        write(f"ring_attention_cp2_{bug}", ring_attention_plan(bug))
