"""Issue 13, classes 2, 3 and 8: rank dependence read exactly, at every nesting level, and ring starts.

Each class is tested on variants, not only on the file that exposed it, and every negative case comes with a
positive control (the correct plan of the same shape VERIFIES), so a test cannot pass by refusing everything.
Where the variant is a real bug, the interpreter is asked to confirm that it differs."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tvcert.engine.verify import verify
from tvcert.interp import RunError, run_plan
from tvcert.plan import PlanError, load_plan
from tvcert.shapes import affine_in_rank, rank_axes_in

HERE = Path(__file__).resolve().parent
EX = HERE.parent / "examples"
CASES = HERE / "soundness_cases"


def _load(name: str, where: Path = EX) -> dict:
    return json.loads((where / name).read_text())


def _verdict(raw: dict) -> str:
    try:
        plan = load_plan(copy.deepcopy(raw))
    except PlanError:
        return "REJECTED"
    return verify(plan, refute=False).verdict


def _differs(raw: dict, seeds: int = 4) -> bool:
    """The interpreter shows the plan wrong: its outputs differ, or a rank's op cannot run (an index out of
    the rank's rows), on some seed."""
    plan = load_plan(copy.deepcopy(raw))
    for s in range(seeds):
        try:
            if not run_plan(plan, seed=s).equal:
                return True
        except RunError:
            return True
    return False


def _node(raw: dict, name: str) -> dict:
    return next(n for g in raw["parallel"] for n in g["nodes"] if n["name"] == name)


# ------------------------------------------------------------------ the exact affinity test itself
def test_rank_axes_are_found_at_every_nesting_level():
    assert rank_axes_in([["rank.tp"]]) == {"tp"}
    assert rank_axes_in([[[0, "2*rank.dp+1"]], 3]) == {"dp"}
    assert rank_axes_in({"a": [{"b": "rank.cp"}]}) == {"cp"}
    assert rank_axes_in("rank.tp)(") == {"tp"}  # not even a dim expression: still counted
    assert rank_axes_in([[0, 1.5], "v/tp"]) == frozenset()


@pytest.mark.parametrize("expr", ["(rank.dp*tp+rank.tp)*B", "rank.tp*B+rank.dp", "rank.tp*rank.dp",
                                  "(rank.tp+rank.dp)*B", "rank.tp*B*(1+rank.dp)"])
def test_affinity_in_one_axis_refuses_other_axes(expr):
    env = {"B": 4, "tp": 2, "rank.tp": 0, "rank.dp": 0}
    assert affine_in_rank(expr, env, "tp") is None


def test_affinity_reads_base_and_stride():
    assert affine_in_rank("rank.tp*B+3", {"B": 4, "tp": 2}, "tp") == (3, 4)


# ------------------------------------------------------------------ class 2: offsets over every mesh axis
GLOBAL = "(rank.dp*tp+rank.tp)*(v/tp)"


def _vocab_plan(offset: str, lo: str | None = None, hi: str | None = None, mesh_order=("dp", "tp")) -> dict:
    raw = _load("vocab_offset_uses_global_rank.json", CASES)
    _node(raw, "lo")["attrs"]["value"] = lo or offset
    _node(raw, "hi")["attrs"]["value"] = hi or f"({lo or offset})+v/tp"
    _node(raw, "lo_off")["attrs"]["value"] = offset
    raw["mesh"] = [[a, a] for a in mesh_order]
    return raw


@pytest.mark.parametrize("order", [("dp", "tp"), ("tp", "dp")])
def test_vocab_offset_of_the_tp_rank_verifies(order):
    assert _verdict(_vocab_plan("rank.tp*(v/tp)", mesh_order=order)) == "VERIFIED"


@pytest.mark.parametrize("order", [("dp", "tp"), ("tp", "dp")])
@pytest.mark.parametrize("offset, lo", [
    (GLOBAL, None),                                   # the reviewed plan: global rank everywhere
    ("rank.tp*(v/tp)+rank.dp*(v/tp)", None),          # tp rank plus a dp term
    ("(rank.tp+rank.dp)*(v/tp)", None),
    ("rank.tp*(v/tp)", GLOBAL),                       # only the mask bounds use the global rank
    (GLOBAL, "rank.tp*(v/tp)"),                       # only the offset does
])
def test_vocab_offset_depending_on_another_axis_is_not_verified(offset, lo, order):
    raw = _vocab_plan(offset, lo, mesh_order=order)
    assert _verdict(raw) != "VERIFIED"
    assert _differs(raw)


def test_the_reviewed_global_rank_plan_is_refuted():
    plan = load_plan(_load("vocab_offset_uses_global_rank.json", CASES))
    assert verify(plan).verdict == "REFUTED"


def _slice_plan(start: str, end: str) -> dict:
    return {
        "tvcert_plan": 1, "name": "slice_block", "dims": {"n": 8, "h": 3, "tp": 2, "dp": 2},
        "mesh": [["dp", "dp"], ["tp", "tp"]],
        "logical": {"inputs": [{"name": "x", "shape": ["n", "h"], "dtype": "float"}],
                    "nodes": [{"name": "y", "op": "neg", "inputs": ["x"]}], "outputs": ["y"]},
        "parallel": [{"name": "main", "inputs": [{"name": "x", "shape": ["n", "h"], "dtype": "float"}],
                      "nodes": [{"name": "xs", "op": "slice", "inputs": ["x"],
                                 "attrs": {"dim": 0, "start": start, "end": end}},
                                {"name": "y", "op": "neg", "inputs": ["xs"]}],
                      "outputs": ["y"]}],
        "inputs": {"x": {"local": "x"}},
        "outputs": {"y": {"local": "y", "placement": {"tp": "Shard(0)"}}},
    }


def test_slice_of_the_tp_block_verifies():
    assert _verdict(_slice_plan("rank.tp*(n/tp)", "(rank.tp+1)*(n/tp)")) == "VERIFIED"


@pytest.mark.parametrize("start, end", [
    ("rank.dp*(n/tp)", "(rank.dp+1)*(n/tp)"),
    ("(rank.tp+rank.dp)*(n/(2*tp))", "(rank.tp+rank.dp)*(n/(2*tp))+n/tp"),
    ("rank.tp*(n/tp)*(1-rank.dp)", "rank.tp*(n/tp)*(1-rank.dp)+n/tp"),
])
def test_slice_block_depending_on_another_axis_is_not_verified(start, end):
    raw = _slice_plan(start, end)
    assert _verdict(raw) != "VERIFIED"
    assert _differs(raw)


# ------------------------------------------------------------------ class 2: unit dims in the right place
def test_target_logit_pick_verifies():
    assert _verdict(_load("vocab_parallel_target_logit.json")) == "VERIFIED"


def test_gather_index_with_a_leading_unit_dim_is_not_verified():
    raw = _load("vocab_parallel_target_logit.json")
    _node(raw, "idx")["op"] = "reshape"
    _node(raw, "idx")["attrs"] = {"shape": [1, "n"]}
    verdict = _verdict(raw)
    assert verdict != "VERIFIED"
    if verdict != "REJECTED":
        assert _differs(raw)


def test_output_mask_with_a_leading_unit_dim_is_not_verified():
    raw = _vocab_plan("rank.tp*(v/tp)")
    raw["dims"]["h"] = raw["dims"]["n"]  # [n, h] * [1, n] broadcasts: the mask now runs along the hidden dim
    raw["run_dims"] = {"n": 4, "v": 8, "h": 4, "tp": 2, "dp": 2}
    _node(raw, "outside3")["attrs"]["dim"] = 0
    verdict = _verdict(raw)
    assert verdict != "VERIFIED"
    if verdict != "REJECTED":
        assert _differs(raw)


# ------------------------------------------------------------------ class 3: nested literals
def _nested_plan(value) -> dict:
    raw = _load("rank_in_nested_literal.json", CASES)
    _node(raw, "c")["attrs"]["value"] = value
    return raw


def test_rank_free_nested_literal_verifies():
    raw = _load("rank_in_nested_literal.json", CASES)
    _node(raw, "c")["attrs"]["value"] = [[0]]
    assert _verdict(raw) == "VERIFIED"


@pytest.mark.parametrize("value", [[["rank.tp"]], [[["rank.tp"]]], [["2*rank.tp-1"]], [["rank.tp*h"]]])
def test_rank_in_a_nested_literal_is_not_verified(value):
    raw = _nested_plan(value)
    if isinstance(value[0][0], list):  # a deeper literal needs a deeper logical constant of the same shape
        c = next(n for n in raw["logical"]["nodes"] if n["name"] == "c")
        c["attrs"]["value"] = [[[0]]]
    assert _verdict(raw) != "VERIFIED"
    if _verdict(raw) != "REJECTED":
        assert _differs(raw)


def test_the_reviewed_nested_literal_plan_is_refuted():
    plan = load_plan(_load("rank_in_nested_literal.json", CASES))
    assert verify(plan).verdict == "REFUTED"


# ------------------------------------------------------------------ class 8: where the running max starts
def test_ring_starting_below_every_score_verifies():
    assert _verdict(_load("ring_attention_cp2.json")) == "VERIFIED"


@pytest.mark.parametrize("value", [1e4, 0, -1e8, "rank.cp"])
def test_ring_max_starting_above_some_score_is_not_verified(value):
    """Over the reals any start is right, but a start above the scores gives exp underflow and 0/0 on real
    floats (+1e4), or sits above the masked scores (-1e8 > the -1e9 fill), or differs between ranks."""
    raw = _load("ring_attention_cp2.json")
    _node(raw, "m0")["attrs"]["value"] = value
    assert _verdict(raw) != "VERIFIED"


@pytest.mark.parametrize("name", ["l0", "acc0"])
def test_ring_state_starting_at_a_rank_dependent_value_is_not_verified(name):
    """Wrong over the reals (rank 1 starts its sum at 1), though only by exp(-1e30 - m'), which floats round to
    0: the interpreter cannot show it, so the rule must refuse it on its own."""
    raw = _load("ring_attention_cp2.json")
    _node(raw, name)["attrs"]["value"] = "rank.cp"
    assert _verdict(raw) != "VERIFIED"


def test_ring_body_op_with_a_rank_dependent_attribute_is_not_verified():
    raw = _load("ring_attention_cp2.json")
    loop = next(n for g in raw["parallel"] for n in g["nodes"] if n["op"] == "ring_loop")
    sc = next(n for n in loop["attrs"]["body"]["nodes"] if n["op"] == "scale")
    sc["attrs"]["value"] = f"{sc['attrs']['value']}*(1+rank.cp)" if isinstance(sc["attrs"]["value"], str) \
        else "1+rank.cp"
    assert _verdict(raw) != "VERIFIED"
