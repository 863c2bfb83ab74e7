"""Load-balanced ("zig-zag") context parallelism: ZigzagShard(d), rank r holding chunks r and 2p-1-r.

Correct zig-zag plans (hand-written and generated, Llama and DeepSeek, with ring attention over the
zig-zag blocks) verify with replayable certificates; every rule that relies on contiguous blocks
refuses a zig-zag operand, and plans that use one wrongly are refuted by the interpreter.
"""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from click.testing import CliRunner
from mutation_check import assert_refuted_and_localized
from tvcert.certificate.check import Invalid, check_certificate
from tvcert.certificate.emit import build_certificate
from tvcert.certificate.format import Certificate
from tvcert.cli import main
from tvcert.engine.verify import verify
from tvcert.generators.mutations import RING_MUTATIONS, mutate
from tvcert.generators.plans import llama3_plan
from tvcert.interp import Ctx, assemble, distribute, run_plan
from tvcert.plan import Binding, load_plan, parse_placement


# ------------------------------------------------------------------ the placement
def test_placement_text_round_trips_and_bad_dims_are_named():
    z = parse_placement("ZigzagShard(1)")
    assert (z.kind, z.dim, str(z)) == ("Z", 1, "ZigzagShard(1)")
    with pytest.raises(ValueError, match="ZigzagShard needs an integer dim"):
        parse_placement("ZigzagShard(x)")


@pytest.mark.parametrize("p", [2, 3])
def test_rank_r_holds_chunks_r_and_mirror_and_assembly_inverts_it(p):
    from tvcert.interp import Mesh

    mesh = Mesh(["cp"], {"cp": p})
    ranks = mesh.ranks({})
    b = Binding("x", "spmd", "x", {"cp": parse_placement("ZigzagShard(0)")}, [], "$.inputs.x")
    v = np.arange(2 * p * 3, dtype=np.float64).reshape(2 * p, 3)  # chunk k = row k
    ctx = Ctx(exact=False)
    pieces = distribute(b, v, mesh, ranks, np.random.default_rng(0), ctx)
    for r in ranks:
        assert pieces[r][:, 0].tolist() == [3.0 * r[0], 3.0 * (2 * p - 1 - r[0])]
    assert np.array_equal(assemble(b, pieces, mesh, ranks[0], ctx).value, v)


# ------------------------------------------------------------------ small hand-written plans
def _plan(parallel_nodes: list[dict], out_placement: dict, x_shape=("s", "h"), name="zz") -> dict:
    """Logical: y = sum(tanh(x), dim 0).  Parallel over cp=2 with x zig-zag sharded on dim 0."""
    return {
        "tvcert_plan": 1, "name": name, "dims": {"s": 8, "h": 3, "cp": 2}, "mesh": {"cp": "cp"},
        "logical": {"inputs": [{"name": "x", "shape": list(x_shape), "dtype": "float"},
                               {"name": "w", "shape": list(x_shape), "dtype": "float"}],
                    "nodes": [{"name": "t", "op": "tanh", "inputs": ["x"]},
                              {"name": "y", "op": "sum", "inputs": ["t"], "attrs": {"dims": [0]}}],
                    "outputs": ["y", "t"]},
        "parallel": [{"name": "spmd", "inputs": [{"name": "xl", "shape": ["s/cp", "h"], "dtype": "float"},
                                                 {"name": "wl", "shape": ["s/cp", "h"], "dtype": "float"}],
                      "nodes": parallel_nodes, "outputs": ["yr", "tl"]}],
        "inputs": {"x": {"local": "xl", "placement": {"cp": "ZigzagShard(0)"}},
                   "w": {"local": "wl", "placement": {"cp": "Shard(0)"}}},
        "outputs": {"y": {"local": "yr", "placement": {}}, "t": {"local": "tl", "placement": out_placement}},
    }


GOOD = [{"name": "tl", "op": "tanh", "inputs": ["xl"]},
        {"name": "yl", "op": "sum", "inputs": ["tl"], "attrs": {"dims": [0]}},
        {"name": "yr", "op": "all_reduce", "inputs": ["yl"], "attrs": {"axis": "cp", "reduce": "sum"}}]


def test_small_zigzag_plan_verifies_with_a_replayable_certificate():
    res = verify(load_plan(_plan(GOOD, {"cp": "ZigzagShard(0)"})))
    assert res.verdict == "VERIFIED", res.reasons
    used = [r for s in res.prop.steps for r in s.rules]
    assert "zigzag_ew_unary" in used and "zigzag_reduce_sum" in used
    cert = build_certificate(res)
    assert check_certificate(Certificate.model_validate(cert)).steps == len(res.prop.steps)
    bad = copy.deepcopy(cert)  # claiming a contiguous shard where the rules derived a zig-zag one
    row = next(s for s in bad["steps"] if "zigzag_ew_unary" in s["rules"])
    row["out"] = [[t, [q.replace("ZigzagShard", "Shard") for q in pl]] for t, pl in row["out"]]
    with pytest.raises(Invalid):
        check_certificate(Certificate.model_validate(bad))


def test_reading_a_zigzag_result_as_a_contiguous_shard_is_refuted():
    res = verify(load_plan(_plan(GOOD, {"cp": "Shard(0)"})))
    assert res.verdict == "REFUTED", res.reasons


@pytest.mark.parametrize("nodes,why", [
    # all_gather of zig-zag chunks yields the rows out of order
    ([{"name": "tg", "op": "all_gather", "inputs": ["xl"], "attrs": {"axis": "cp", "dim": 0}},
      {"name": "tt", "op": "tanh", "inputs": ["tg"]},
      {"name": "tl", "op": "slice", "inputs": ["tt"], "attrs": {"dim": 0, "start": "rank.cp*(s/cp)",
                                                               "end": "(rank.cp+1)*(s/cp)"}},
      {"name": "yl", "op": "sum", "inputs": ["tt"], "attrs": {"dims": [0]}},
      {"name": "yr", "op": "scale", "inputs": ["yl"], "attrs": {"value": 1}}], "all_gather"),
    # a zig-zag operand combined with a contiguous shard of another tensor
    ([{"name": "xw", "op": "add", "inputs": ["xl", "wl"]},
      {"name": "xs", "op": "sub", "inputs": ["xw", "wl"]},
      {"name": "tl", "op": "tanh", "inputs": ["xs"]},
      {"name": "yl", "op": "sum", "inputs": ["tl"], "attrs": {"dims": [0]}},
      {"name": "yr", "op": "all_reduce", "inputs": ["yl"], "attrs": {"axis": "cp", "reduce": "sum"}}], "mixes"),
], ids=["all_gather_of_zigzag", "zigzag_plus_block_shard"])
def test_contiguous_block_rules_refuse_zigzag_operands(nodes, why):
    res = verify(load_plan(_plan(nodes, {"cp": "ZigzagShard(0)"})), refute=False)
    assert res.verdict != "VERIFIED"
    assert any(why in r for r in res.reasons), res.reasons


def test_all_gather_of_zigzag_read_as_contiguous_is_refuted():
    nodes = [{"name": "tg", "op": "all_gather", "inputs": ["xl"], "attrs": {"axis": "cp", "dim": 0}},
             {"name": "tt", "op": "tanh", "inputs": ["tg"]},
             {"name": "tl", "op": "slice", "inputs": ["tt"], "attrs": {"dim": 0, "start": "rank.cp*(s/cp)",
                                                                      "end": "(rank.cp+1)*(s/cp)"}},
             {"name": "yl", "op": "sum", "inputs": ["tt"], "attrs": {"dims": [0]}},
             {"name": "yr", "op": "scale", "inputs": ["yl"], "attrs": {"value": 1}}]
    res = verify(load_plan(_plan(nodes, {"cp": "Shard(0)"})))
    assert res.verdict == "REFUTED", res.reasons  # rank 0 holds rows 0..3 of the gathered (permuted) rows


def test_indivisible_zigzag_input_exits_3_naming_the_field(tmp_path):
    p = _plan(GOOD, {"cp": "ZigzagShard(0)"})
    p["dims"]["s"] = 6  # 6 rows cannot make 2 x 2 chunks
    f = tmp_path / "p.json"
    f.write_text(json.dumps(p))
    r = CliRunner().invoke(main, ["verify", str(f)])
    assert r.exit_code == 3, r.output
    assert "inputs.x.placement.cp" in r.output and "not divisible by 2 x mesh axis 'cp'" in r.output


# ------------------------------------------------------------------ generated training steps
def _small(p: dict) -> dict:
    p["dims"] = dict(p["run_dims"])
    return p


@pytest.mark.parametrize("cfg", [{"cp": 2}, {"cp": 2, "tp": 2, "sp": True, "dp": 2, "zero": 1},
                                 {"cp": 2, "pp": 2, "layers": 2, "mb": 2},
                                 {"cp": 2, "tp": 2, "sp": True, "masked_embedding": True}],
                         ids=["cp", "cp_tp_sp_dp_zero1", "cp_pp_mb", "cp_tp_sp_masked_embedding"])
def test_generated_llama_zigzag_plans_run_equal_and_verify(cfg):
    raw = _small(llama3_plan("llama3-8b", **{"layers": 1, **cfg}, cp_style="zigzag"))
    assert raw["inputs"]["tokens"]["placement"]["cp"] == "ZigzagShard(1)"
    plan = load_plan(raw)
    assert run_plan(plan).equal
    res = verify(plan, refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    used = {r for s in res.prop.steps for r in s.rules}
    assert {"ring_attention_zigzag", "zigzag_from_slices", "ring_attention_online_softmax",
            "ring_attention_backward"} <= used


@pytest.mark.parametrize("style", ["zigzag", "allgather-zigzag"])
@pytest.mark.parametrize("cfg", [{"cp": 2, "tp": 2}, {"cp": 2, "tp": 2, "sp": True, "dp": 2, "ep": 2}],
                         ids=["cp_tp", "cp_tp_sp_dp_ep"])
def test_generated_deepseek_zigzag_plans_run_equal_and_verify(cfg, style):
    from tvcert.generators.deepseek import deepseek_plan

    plan = load_plan(_small(deepseek_plan("deepseek-v3-671b", layers=2, **cfg, cp_style=style)))
    assert run_plan(plan).equal
    res = verify(plan, refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    want = "ring_attention_zigzag" if style == "zigzag" else "zigzag_reduce_scatter"
    assert any(want in s.rules for s in res.prop.steps)


@pytest.mark.parametrize("cfg", [{"cp": 2}, {"cp": 2, "tp": 2, "sp": True, "dp": 2, "zero": 1},
                                 {"cp": 2, "pp": 2, "layers": 2, "mb": 2}],
                         ids=["cp", "cp_tp_sp_dp_zero1", "cp_pp_mb"])
def test_llama3_allgather_cp_over_zigzag_chunks_verifies(cfg):
    """Llama 3's own context parallelism: K and V all-gathered over load-balanced chunks and put back in natural
    order; their gradients paired chunk r with chunk 2p-1-r and reduce-scattered."""
    raw = _small(llama3_plan("llama3-8b", **{"layers": 1, **cfg}, cp_style="allgather-zigzag"))
    plan = load_plan(raw)
    assert run_plan(plan).equal
    res = verify(plan, refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    used = [r for s in res.prop.steps for r in s.rules]
    layers = cfg.get("layers", 1)
    assert used.count("zigzag_all_gather") == 2 * layers and used.count("zigzag_reduce_scatter") == 2 * layers
    assert "ring_attention_online_softmax" not in used


def test_allgather_zigzag_plan_size_does_not_grow_with_cp():
    def size(cp):
        return sum(len(g["nodes"]) for g in llama3_plan("llama3-8b", layers=1, cp=cp,
                                                        cp_style="allgather-zigzag")["parallel"])

    assert size(2) == size(8)


def test_zigzag_verifies_at_full_llama3_405b_size():
    res = verify(load_plan(llama3_plan("llama3-405b", layers=2, cp=16, tp=8, sp=True, dp=4, cp_style="zigzag")),
                 refute=False)
    assert res.verdict == "VERIFIED", res.reasons


@pytest.mark.parametrize("mut", [m for m in RING_MUTATIONS if "positions_not_offset" not in m.name],
                         ids=lambda m: m.name)
def test_ring_bugs_are_refuted_over_zigzag_blocks_too(mut):
    cfg = {"layers": 1, **mut.config, "cp_style": "zigzag"}
    good = _small(llama3_plan("llama3-8b", **cfg))
    bad, role = mutate(good, mut.name)
    assert_refuted_and_localized(good, bad, role)


def _edit_chain(raw: dict, role: str, edit) -> dict:
    bad = copy.deepcopy(raw)
    n = next(n for g in bad["parallel"] for n in g["nodes"] if n.get("src") == role)
    edit(n)
    return bad


@pytest.mark.parametrize("role,edit", [
    ("layer0.cp_k_all_gather.second_in_order", lambda n: n["attrs"].update(dims=[3])),  # rows flipped, not ranks
    ("layer0.cp_v_all_gather.natural_chunks", lambda n: n["inputs"].reverse()),  # tails first
    ("layer0.cp_k_all_gather.second", lambda n: n["attrs"].update(start=0, end=1)),  # the first chunks twice
    ("layer0.bwd.cp_dk_reduce_scatter.by_rank", lambda n: n.update(op="permute", attrs={"dims": [0, 1, 2, 3, 4, 5]})),
    ("layer0.bwd.cp_dv_reduce_scatter.second_reversed", lambda n: n["attrs"].update(dims=[2])),
], ids=["flip_rows", "tails_first", "first_chunks_twice", "halves_not_swapped", "flip_halves"])
def test_broken_allgather_reorder_is_never_verified(role, edit):
    good = _small(llama3_plan("llama3-8b", layers=1, cp=2, cp_style="allgather-zigzag"))
    plan = load_plan(_edit_chain(good, role, edit))
    res = verify(plan)
    assert res.verdict == "REFUTED", res.reasons
    assert not run_plan(plan, seed=res.counterexample["seed"]).equal


# ------------------------------------------------------------------ soundness: random edits of the reorder chains
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st

_AG = None


def _ag_plan() -> dict:
    global _AG
    if _AG is None:
        _AG = _small(llama3_plan("llama3-8b", layers=1, cp=2, cp_style="allgather-zigzag"))
    return _AG


def _edit_reorder(n: dict, names: list[str], rng) -> str:
    a = n.setdefault("attrs", {})
    kinds = ["reroute"] + (["swap"] if len(n["inputs"]) >= 2 else []) + (["slice"] if n["op"] == "slice" else []) \
        + (["flip"] if n["op"] == "flip" else []) + (["dim"] if "dim" in a else [])
    kind = rng.choice(kinds)
    if kind == "swap":
        n["inputs"].reverse()
    elif kind == "reroute":
        n["inputs"][rng.randrange(len(n["inputs"]))] = rng.choice(names)
    elif kind == "slice":
        k = rng.choice([0, 1])
        a["start"], a["end"] = k, k + 1
    elif kind == "flip":
        a["dims"] = [rng.choice([0, 1, 2, 3, 4, 5])]
    else:
        a["dim"] = rng.choice([1, 2, 3])
    return f"{n['src']}:{kind}"


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 10**9), st.integers(1, 2))
def test_edited_zigzag_reorders_are_never_wrongly_verified(seed, edits):
    import random

    from soundness_check import assert_not_wrongly_verified

    rng = random.Random(seed)
    bad = copy.deepcopy(_ag_plan())
    nodes = bad["parallel"][0]["nodes"]
    chain = [n for n in nodes if any(k in (n.get("src") or "") for k in ("all_gather.", "reduce_scatter."))]
    names = [n["name"] for n in chain]
    what = [_edit_reorder(rng.choice(chain), names, rng) for _ in range(edits)]
    assert_not_wrongly_verified(bad, what, seeds=2)


@pytest.mark.parametrize("rows,ok", [(2, True), (4, False)])
def test_reshape_of_zigzag_inside_an_outer_shard_uses_the_axis_own_rows(rows, ok):
    """tp (outer) shards 16 rows into blocks of 8; cp zig-zags each block in chunks of 2.  Splitting groups of 2
    rows off keeps the zig-zag order (rank 0 holds groups 0 and 3 of 4); groups of 4 do not (rank 0's rows 0, 1,
    6, 7 are no group).  Reading the chunk size from the full 16 rows (chunks of 4) would accept both."""
    from test_rules import Env

    from tvcert.kernel.rules import RuleFailure, S

    e = Env(("tp", "cp"), {"tp": 2, "cp": 2}, {"n": 16, "tp": 2, "cp": 2})
    x = e.t([16, 3], S(0), parse_placement("ZigzagShard(0)"))
    if ok:
        assert "zigzag_reshape" in e.apply("reshape", [x], shape=[f"n/tp/cp/{rows}", rows, 3]).rules
    else:
        with pytest.raises(RuleFailure, match="does not fill whole rows"):
            e.apply("reshape", [x], shape=[f"n/tp/cp/{rows}", rows, 3])


@pytest.mark.parametrize("model", ["llama3-8b", "deepseek-v3-16b"])
def test_plan_cli_refuses_a_sequence_that_does_not_split_into_2cp_chunks(model, tmp_path):
    r = CliRunner().invoke(main, ["plan", model, "--layers", "1", "--cp", "2", "--cp-style", "zigzag", "--dims", "s=6",
                                  "-o", str(tmp_path / "p.json")])
    assert r.exit_code == 3 and "s=6 is not divisible by 2*cp=4" in r.output, r.output
    assert not (tmp_path / "p.json").exists()
