"""Whole-plan conformance for the multi-op rules (patterns concluded over several ops, stage replay, send/recv).

Each generator builds a small plan that exercises the rule -- a Llama-3 training step from
:mod:`tvcert.generators` with random degrees (tp, cp, dp, pp, micro-batches; sizes 1..4, not only powers of two)
and random small model dims, a ring-attention plan (:func:`tvcert.fuzz.ring.ring_plan`) with a random cp, an
outer axis and zig-zag chunks, or a bundled vocab-parallel example with random dims -- sometimes with a known
bug injected (:mod:`tvcert.generators.mutations`).  The plan runs at the dims it is verified at.  The check:
if the engine says VERIFIED, the reference interpreter (:func:`tvcert.fuzz.oracle.oracle`: exact rationals over
several seeds, float64 for ring loops) must find every output equal on every rank.  A VERIFIED plan that the
interpreter shows different is a disagreement.
"""
from __future__ import annotations

import copy
import json
from math import lcm
from pathlib import Path
from typing import Callable

from .core import Result
from .gens import Draw

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _check_plan(d: dict, rule: str | None, use_float: bool = False) -> Result:
    from ..engine.verify import used_rules, verify
    from ..fuzz.oracle import float_oracle, oracle
    from ..plan import PlanError, load_plan

    try:
        plan = load_plan(copy.deepcopy(d))
    except PlanError as exc:
        return Result("skip", detail=f"plan rejected: {str(exc)[:200]}")
    try:
        res = verify(plan, refute=False)
    except Exception as exc:
        import traceback

        return Result("crash", detail=f"verify: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")
    if res.verdict != "VERIFIED":
        return Result("refused", detail="; ".join(res.reasons)[:300])
    rules = sorted(used_rules(res))
    # whole training steps (AdamW's sqrt, many layers) outgrow exact rationals: float64 there, exact elsewhere
    o = float_oracle(plan, (0, 1, 2)) if use_float else oracle(plan, seeds=(0, 1))
    if o.crash:
        return Result("crash", rules, f"interpreter: {o.crash}")
    if o.equal is None:
        return Result("skip", rules, "; ".join(o.notes)[:300])
    if o.equal is False:
        return Result("DISAGREE", rules, f"VERIFIED but the interpreter differs: {o.witness}")
    return Result("ok", rules)


def _small_llama_dims(dr: Draw, tp: int, cp: int, dp: int, mb: int, zigzag: bool) -> dict:
    nkv = tp * dr.int(1, 2)
    nh = nkv * dr.int(1, 2)
    hd = 2
    s = cp * (2 if zigzag else 1) * dr.int(1, 2)
    return {"b": dp * mb * dr.int(1, 2), "s": s, "h": lcm(4, tp) * dr.int(1, 2), "nh": nh, "nkv": nkv, "hd": hd,
            "f": tp * dr.int(1, 3), "v": tp * dr.int(1, 3)}


def _llama(dr: Draw, **fixed) -> tuple[dict, str]:
    from ..generators.plans import GenError, generate_plan

    opts = dict(tp=dr.pick([1, 2, 2, 3, 4]), dp=dr.pick([1, 1, 2, 3]), layers=dr.int(1, 3))
    opts.update(fixed)
    if dr.coin(0.3) and "pp" not in fixed:
        opts["mb"] = dr.pick([1, 2, 3])
    zig = opts.get("cp_style", "") in ("zigzag", "allgather-zigzag")
    dims = _small_llama_dims(dr, opts.get("tp", 1), opts.get("cp", 1), opts.get("dp", 1), opts.get("mb", 1), zig)
    try:
        d = generate_plan("llama3-8b", dims=dims, **opts)
    except (GenError, ValueError) as exc:
        raise _Skip(str(exc))
    d["run_dims"] = dict(d["dims"])  # run at the verified sizes
    return d, json.dumps(opts)


class _Skip(Exception):
    pass


def _maybe_mutate(dr: Draw, d: dict, names: list[str], p: float = 0.3) -> tuple[dict, str]:
    from ..generators.mutations import MutationError, mutate

    if not names or not dr.coin(p):
        return d, ""
    name = dr.pick(names)
    try:
        m, _ = mutate(d, name)
    except (MutationError, KeyError, IndexError, ValueError):
        return d, ""
    return m, f" +bug {name}"


def plan_gen(build: Callable[[Draw], tuple[dict, str]], rule: str):
    def g(dr: Draw, seed: int):
        try:
            d, desc = build(dr)
        except _Skip as exc:
            return Result("skip", detail=str(exc)), ""
        return _check_plan(d, rule, use_float=d.get("name", "").startswith("llama")), desc
    return g


TP_BUGS = ["wrong_vocab_block", "wrong_chunk_order_ce", "masked_embedding_rows_not_zeroed",
           "masked_embedding_grad_not_masked", "ce_local_max", "ce_sumexp_not_reduced", "missing_allreduce_o_proj"]
RING_BUGS = ["ring_merge_no_max_correction", "ring_positions_not_passed", "ring_stale_reference",
             "ring_rope_positions_not_offset", "ring_bwd_dk_not_passed", "ring_bwd_unnormalized_probs"]
ZIG_BUGS = ["zigzag_tail_chunk_shifted", "zigzag_positions_contiguous", "ag_zigzag_gathered_tails_not_flipped",
            "ag_zigzag_grad_chunks_not_paired"]


def b_masked(dr: Draw):
    d, desc = _llama(dr, tp=dr.pick([2, 3, 4]), masked_embedding=True, tie_embeddings=dr.coin(0.2))
    d, bug = _maybe_mutate(dr, d, TP_BUGS)
    return d, desc + bug


def b_ring(dr: Draw):
    d, desc = _llama(dr, cp=dr.pick([2, 3]), cp_style=dr.pick(["ring", "ring", "zigzag"]), tp=dr.pick([1, 2]))
    d, bug = _maybe_mutate(dr, d, RING_BUGS + ZIG_BUGS)
    return d, desc + bug


def b_ring_small(dr: Draw):
    from ..fuzz.ring import ring_plan

    cp = dr.pick([2, 3, 4])
    zig = dr.coin(0.4)
    causal = zig or dr.coin(0.7)
    dims = {"b": dr.int(1, 2), "nh": dr.int(1, 2), "s": cp * (2 if zig else 1) * dr.int(1, 2), "hd": dr.int(1, 3)}
    outer = None
    if dr.coin(0.3):
        outer = (dr.pick(["tp", "dp"]), dr.pick([0, 1]))
        dims["b" if outer[1] == 0 else "nh"] = 2 * dr.int(1, 2)
    d = ring_plan("ring", cp, dims, causal, dr.pick([0.5, 1.0, 0.35]), outer, zigzag=zig)
    d["run_dims"] = dict(d["dims"])
    return d, f"ring cp={cp} zigzag={zig} causal={causal} outer={outer} dims={dims}"


def b_zigzag_ag(dr: Draw):
    d, desc = _llama(dr, cp=dr.pick([2, 3]), cp_style="allgather-zigzag", tp=dr.pick([1, 2]))
    d, bug = _maybe_mutate(dr, d, ZIG_BUGS)
    return d, desc + bug


def b_pp(dr: Draw):
    pp = 3 if dr.coin(0.1) else 2  # a pp=3 plan that does not verify takes ~50 s to give up: rare
    d, desc = _llama(dr, pp=pp, layers=pp, tp=dr.pick([1, 2]), dp=dr.pick([1, 2]), mb=dr.pick([1, 2]))
    d, bug = _maybe_mutate(dr, d, ["pp_send_wrong_tensor"] + (["pp_grad_wrong_source"] if pp == 3 else []), 0.15)
    return d, desc + bug


def b_layers(dr: Draw):
    d, desc = _llama(dr, layers=dr.int(2, 4), sp=dr.coin(0.3))
    d, bug = _maybe_mutate(dr, d, ["missing_allreduce_w2", "grad_div_tp", "rope_backward_swapped"], 0.2)
    return d, desc + bug


def b_example(names: list[str], dimsfn: Callable[[Draw, dict], dict]):
    def b(dr: Draw):
        name = dr.pick(names)
        d = json.loads((EXAMPLES / name).read_text())
        d["dims"] = dimsfn(dr, dict(d["dims"]))
        d.pop("run_dims", None)
        extra = ""
        if dr.coin(0.5):
            extra = _other_axis(dr, d)
        if dr.coin(0.4):
            extra += _edit_example(dr, d)
        return d, f"{name} dims={d['dims']}{extra}"
    return b


def _edit_example(dr: Draw, d: dict) -> str:
    """A near miss of the multi-op patterns: a block offset off by one or mirrored, a mask with its unit dim
    somewhere else, an index reshaped to [1, n], a fill value that is not 0, or one of the fuzzer's random edits
    (swap / reroute an input, change an op or a value)."""
    import random

    nodes = d["parallel"][0]["nodes"]
    kind = dr.pick(["offset", "unsqueeze", "fill", "random", "random"])
    if kind == "offset":
        forms = ["{e}+1", "({e})-1", "(tp-1-rank.tp)*(v/tp)", "(rank.tp+1)*(v/tp)", "rank.tp*(v/tp+1)"]
        cands = [n for n in nodes if isinstance(n.get("attrs", {}).get("value"), str) and "rank." in n["attrs"]["value"]]
        if cands:
            n = dr.pick(cands)
            n["attrs"]["value"] = dr.pick(forms).format(e=n["attrs"]["value"])
            return f" +edit offset {n['name']}={n['attrs']['value']}"
    if kind == "unsqueeze":
        cands = [n for n in nodes if n["op"] == "unsqueeze"]
        if cands:
            n = dr.pick(cands)
            n["attrs"]["dim"] = dr.pick([0, -2, 1])
            return f" +edit unsqueeze {n['name']} dim={n['attrs']['dim']}"
    if kind == "fill":
        cands = [n for n in nodes if n["op"] in ("masked_fill", "clamp", "where") and "value" in n.get("attrs", {})]
        if cands:
            n = dr.pick(cands)
            n["attrs"]["value"] = dr.pick([1, -1, 0.5])
            return f" +edit fill {n['name']}={n['attrs']['value']}"
    from ..fuzz.ring import edit_body

    prog = d["parallel"][0]
    body = {"inputs": [i["name"] for i in prog["inputs"]], "nodes": prog["nodes"], "outputs": prog["outputs"]}
    try:
        what = edit_body(body, random.Random(int(dr.rng.integers(1 << 30))))
    except (IndexError, ValueError):
        return ""
    prog["outputs"] = body["outputs"]
    return f" +edit {what}"


def _rewrite_strings(obj, fn):
    if isinstance(obj, dict):
        return {k: _rewrite_strings(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rewrite_strings(v, fn) for v in obj]
    if isinstance(obj, str) and "rank." in obj:
        return fn(obj)
    return obj


def _other_axis(dr: Draw, d: dict) -> str:
    """Add a mesh axis the example does not use (every tensor replicated on it), outside or inside the tp
    axis; sometimes rewrite the tp rank offsets over both axes (the global rank, or the sum of the
    coordinates): then the block a rank reads is wrong unless the other axis has size 1."""
    ax = "dp"
    size = dr.pick([2, 3])
    mesh = d["mesh"]
    if isinstance(mesh, dict):
        mesh = [[k, v] for k, v in mesh.items()]
    mesh = [[ax, ax]] + mesh if dr.coin() else mesh + [[ax, ax]]
    d["mesh"] = mesh
    d["dims"][ax] = size
    how = dr.pick(["keep", "keep", "global", "sum", "other"])
    if how == "global":
        fn = lambda t: t.replace("rank.tp", "(rank.dp*tp+rank.tp)")
    elif how == "sum":
        fn = lambda t: t.replace("rank.tp", "(rank.tp+rank.dp)")
    elif how == "other":
        fn = lambda t: t.replace("rank.tp", "rank.dp")
    else:
        fn = None
    if fn is not None:
        d["parallel"] = _rewrite_strings(d["parallel"], fn)
    return f" +axis {ax}={size} at {'outer' if mesh[0][0] == ax else 'inner'}, rank offsets: {how}"


def _vp_dims(dr: Draw, dims: dict) -> dict:
    tp = dr.pick([2, 3, 4, 5])
    out = dict(dims)
    out["tp"] = tp
    for k in ("v", "vocab", "V"):
        if k in out:
            out[k] = tp * dr.int(1, 3)
    for k in ("n", "t", "s", "b", "h", "hidden"):
        if k in out:
            out[k] = dr.int(1, 4) * (2 if k in ("h", "hidden") else 1)
    return out


VP = ["vocab_parallel_embedding.json", "vocab_parallel_embedding_unmasked_bug.json",
      "vocab_parallel_embedding_short_block_bug.json", "vocab_parallel_target_logit.json",
      "vocab_parallel_target_logit_mask_bug.json"]
VPC = ["vocab_parallel_embedding_clamped.json", "vocab_parallel_embedding_clamped_mirrored_shift.json",
       "vocab_parallel_embedding_clamped_no_row_mask.json"]
LOSS = ["vocab_parallel_loss.json", "vocab_parallel_loss_local_max.json", "vocab_parallel_loss_no_target_all_reduce.json"]


_TITAN: dict = {}


def b_titan(dr: Draw):
    """torchtitan's Llama 3 debug model (1 layer) under its own TP plan with loss parallel, traced once per tp
    degree and cached (tracing takes ~40 s); half the time with a random edit of the parallel program.  Its
    shapes are concrete, so it runs in float64."""
    tp = dr.pick([2, 2, 4])
    if tp not in _TITAN:
        try:
            from ..frontends.torchtitan import llama3_debug, trace_titan
        except ImportError as exc:  # torch / torchtitan not installed
            raise _Skip(f"torchtitan unavailable: {exc}")
        _TITAN[tp] = trace_titan(llama3_debug(layers=1), tp=tp, sp=False)
    d = copy.deepcopy(_TITAN[tp])
    d["name"] = "llama-titan"  # float64 oracle
    extra = _edit_example(dr, d) if dr.coin(0.5) else ""
    return d, f"torchtitan llama3 debug tp={tp}{extra}"


def _mix(*bs):
    def b(dr: Draw):
        return dr.pick(list(bs))(dr)
    return b


def _dtensor_loss(dr: Draw):
    from .gens_dtensor_loss import b_dtensor_loss  # DTensor's loss_parallel spelling (traced; torch needed)

    return b_dtensor_loss(dr)


def _cp_loss(dr: Draw):
    from .gens_cp_loss import b_cp_loss  # the same on zig-zag (context-parallel) token rows

    return b_cp_loss(dr)


def _cp_index(dr: Draw):
    from .gens_cp_index import b_cp_index  # torch's head-tail load balancer's index read

    return b_cp_index(dr)


def _iota_block(dr: Draw):
    from .gens_cp_index import b_iota_block  # a rank's positions written as an iota

    return b_iota_block(dr)


def _unrolled_ring(dr: Draw):
    from .gens_ring_merge import b_unrolled_ring  # torch's own ring attention (traced; torch needed)

    return b_unrolled_ring(dr)


def _causal_ring(dr: Draw):
    from .gens_ring_merge import b_causal_ring  # torch's causal ring attention (traced; torch needed)

    return b_causal_ring(dr)


PLAN_RULES: dict[str, Callable] = {
    "send_recv_preserves": plan_gen(b_pp, "send_recv_preserves"),
    "stage_repeat": plan_gen(b_layers, "stage_repeat"),
    "vocab_parallel_embedding": plan_gen(_mix(b_masked, b_example(VP, _vp_dims)), "vocab_parallel_embedding"),
    "vocab_parallel_embedding_backward": plan_gen(b_masked, "vocab_parallel_embedding_backward"),
    "vocab_parallel_embedding_clamped": plan_gen(_mix(b_example(VPC, _vp_dims), b_example(VPC, _vp_dims), b_titan),
                                                 "vocab_parallel_embedding_clamped"),
    "vocab_parallel_embedding_clamped_backward": plan_gen(b_titan, "vocab_parallel_embedding_clamped_backward"),
    "vocab_parallel_log_softmax": plan_gen(_mix(b_example(LOSS, _vp_dims), _cp_loss), "vocab_parallel_log_softmax"),
    "vocab_parallel_nll_loss": plan_gen(_mix(b_example(LOSS, _vp_dims), _dtensor_loss, _cp_loss),
                                        "vocab_parallel_nll_loss"),
    "vocab_parallel_nll_backward": plan_gen(_mix(b_example(LOSS, _vp_dims), b_titan, _dtensor_loss, _cp_loss),
                                            "vocab_parallel_nll_backward"),
    "ring_attention_online_softmax": plan_gen(_mix(b_ring_small, b_ring), "ring_attention_online_softmax"),
    "ring_attention_backward": plan_gen(b_ring, "ring_attention_backward"),
    "ring_attention_zigzag": plan_gen(_mix(b_ring_small, b_ring), "ring_attention_zigzag"),
    "ring_sigmoid_merge": plan_gen(_unrolled_ring, "ring_sigmoid_merge"),
    "ring_sigmoid_merge_backward": plan_gen(_unrolled_ring, "ring_sigmoid_merge_backward"),
    "ring_masked_merge": plan_gen(_causal_ring, "ring_masked_merge"),
    "ring_masked_merge_backward": plan_gen(_causal_ring, "ring_masked_merge_backward"),
    "zigzag_from_slices": plan_gen(_mix(b_ring_small, b_zigzag_ag), "zigzag_from_slices"),
    "zigzag_from_index_block": plan_gen(_cp_index, "zigzag_from_index_block"),
    "iota_rank_block": plan_gen(_iota_block, "iota_rank_block"),
    "zigzag_all_gather": plan_gen(b_zigzag_ag, "zigzag_all_gather"),
    "zigzag_reduce_scatter": plan_gen(b_zigzag_ag, "zigzag_reduce_scatter"),
}

from .gens_prefix_scan import PREFIX_SCAN_GENERATORS  # noqa: E402  (cumsum with a carried offset, hand-built plans)

PLAN_RULES.update(PREFIX_SCAN_GENERATORS)

from .gens_vocab_pick import VOCAB_PICK_GENERATORS  # noqa: E402  (Megatron's target-logit pick, hand-built plans)

PLAN_RULES.update(VOCAB_PICK_GENERATORS)
