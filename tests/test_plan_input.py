"""Bad plan input: a clear error naming the JSON path and the problem, exit code 3, no traceback."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tvcert.cli import main
from tvcert.plan import PlanError, json_schema, load_plan

EX = Path(__file__).resolve().parents[1] / "examples"


def base() -> dict:
    return json.loads((EX / "mlp_tp2.json").read_text())


def run_cli(tmp_path, plan_obj_or_text, *args):
    p = tmp_path / "plan.json"
    p.write_text(plan_obj_or_text if isinstance(plan_obj_or_text, str) else json.dumps(plan_obj_or_text))
    return CliRunner().invoke(main, ["run", str(p), *args])


def lnode(plan, name):
    return next(n for n in plan["logical"]["nodes"] if n["name"] == name)


def pnode(plan, name):
    return next(n for n in plan["parallel"][0]["nodes"] if n.get("name") == name)


def mutate(fn):
    p = base()
    fn(p)
    return p


CASES = {
    "rank_in_input_shape": (lambda p: p["parallel"][0]["inputs"][1].update(shape=["h", "f/tp + rank.tp*(tp-1-rank.tp)"]),
                            "$.parallel[0].inputs[1].shape", "mentions a rank coordinate"),
    "rank_in_input_shape_disguised": (lambda p: p["parallel"][0]["inputs"][1].update(shape=["h", "f/tp + (rank).tp*0"]),
                                      "$.parallel[0].inputs[1].shape", "mentions a rank coordinate"),
    "unknown_op": (lambda p: lnode(p, "hid").update(op="tanhh"), "$.logical.nodes[2].op", "unknown op 'tanhh'"),
    "unknown_attr": (lambda p: lnode(p, "ssum")["attrs"].update(axis=1), "$.logical.nodes[7].attrs",
                     "unknown attribute 'axis'"),
    "wrong_attr_type": (lambda p: lnode(p, "ssum")["attrs"].update(dims="0"), "$.logical.nodes[7].attrs",
                        "must be a list of integers"),
    "wrong_arity": (lambda p: lnode(p, "a")["inputs"].append("b1"), "$.logical.nodes[0].inputs", "takes 2 inputs, got 3"),
    "shape_mismatch": (lambda p: lnode(p, "o").update(inputs=["hid", "w1"]), "$.logical.nodes[3]", "matmul"),
    "cycle": (lambda p: lnode(p, "a").update(inputs=["x", "gw1"]), "$.logical.nodes[0].inputs[1]",
              "a cycle: gw1 -> "),
    "out_of_order": (lambda p: p["logical"]["nodes"].insert(0, p["logical"]["nodes"].pop(1)), "$.logical.nodes[0].inputs[0]",
                     "nodes out of order"),
    "undefined_tensor": (lambda p: lnode(p, "a").update(inputs=["x", "nope"]), "$.logical.nodes[0].inputs[1]",
                         "undefined tensor 'nope'"),
    "doubly_defined": (lambda p: lnode(p, "a1").update(name="a"), "$.logical.nodes[1]", "defined twice"),
    "not_divisible_local_shape": (lambda p: p["dims"].update(f=15), "$.parallel[0].inputs[1].shape[1]", "not divisible"),
    "not_divisible_placement": (lambda p: (p["dims"].update(tp=3), [t.update(shape=[d.replace("f/tp", "f//tp") for d in t["shape"]])
                                                                     for t in p["parallel"][0]["inputs"]]),
                                "$.inputs.w1.placement.tp", "not divisible by mesh axis 'tp'"),
    "negative_size": (lambda p: p["dims"].update(h=-8), "$.dims.h", "positive"),
    "absurd_size": (lambda p: p["dims"].update(b=10**30), "$.dims", ""),
    "collective_axis": (lambda p: pnode(p, "o")["attrs"].update(axis="dp"), "$.parallel[0].nodes[4].attrs.axis",
                        "mesh does not have"),
    "placement_syntax": (lambda p: p["inputs"]["w1"]["placement"].update(tp="Shard(x)"), "$.inputs.w1.placement.tp",
                         "Shard needs an integer dim"),
    "placement_axis": (lambda p: p["inputs"]["w1"]["placement"].update(pp="Replicate"), "$.inputs.w1.placement.pp",
                       "not a mesh axis"),
    "wrong_local_shape": (lambda p: p["inputs"]["w1"]["placement"].update(tp="Shard(0)"), "$.inputs.w1.local",
                          "has shape"),
    "missing_field": (lambda p: p.pop("mesh"), "$.mesh", "Field required"),
    "extra_field": (lambda p: p.update(meshh={}), "$.meshh", "Extra inputs"),
    "bad_version": (lambda p: p.update(tvcert_plan=2), "$.tvcert_plan", "not supported"),
    "bool_version": (lambda p: p.update(tvcert_plan=True), "$.tvcert_plan", "not supported"),
    "float_dim": (lambda p: p["dims"].update(b=4.0), "$.dims.b", "integer"),
    "collective_axis_not_a_name": (lambda p: pnode(p, "o")["attrs"].update(axis=3), "$.parallel[0].nodes[4].attrs",
                                   "mesh axis name"),
    "unbound_output": (lambda p: p["outputs"].pop("gw1"), "$.outputs", "'gw1' has no placement"),
    "dim_expr_syntax": (lambda p: p["parallel"][0]["inputs"][1].update(shape=["h", "f/"]), "$.parallel[0].inputs[1].shape[1]",
                        "cannot parse"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_plan_is_rejected_with_path(case, tmp_path):
    fn, path, words = CASES[case]
    r = run_cli(tmp_path, mutate(fn))
    assert r.exit_code == 3, r.output
    assert "Traceback" not in r.output
    assert path in r.output, r.output
    assert words in r.output, r.output


def test_malformed_json(tmp_path):
    r = run_cli(tmp_path, '{"tvcert_plan": 1, "name": ')
    assert r.exit_code == 3
    assert "malformed JSON at line 1" in r.output


def test_not_an_object(tmp_path):
    r = run_cli(tmp_path, "[1, 2]")
    assert r.exit_code == 3 and "must be a JSON object" in r.output


def test_deep_nesting_is_a_clear_error(tmp_path):
    r = run_cli(tmp_path, "[" * 100000 + "]" * 100000)
    assert r.exit_code == 3 and "Traceback" not in r.output


def test_deeply_nested_tensor_literal_is_a_clear_error(tmp_path):
    """Found by hostile fuzzing: a const value nested ~900 deep overflowed the attribute resolver."""
    plan = json.loads((Path(__file__).resolve().parents[1] / "examples" / "mlp_tp2.json").read_text())
    plan["parallel"][0]["nodes"].insert(0, {"name": "cst", "op": "const", "attrs": {"value": "@@"}})
    r = run_cli(tmp_path, json.dumps(plan).replace('"@@"', "[" * 900 + "1" + "]" * 900))
    assert r.exit_code == 3 and "Traceback" not in r.output
    assert "$.parallel[0].nodes[0].attrs" in r.output and "nested more than" in r.output


def test_missing_file(tmp_path):
    r = CliRunner().invoke(main, ["run", str(tmp_path / "nope.json")])
    assert r.exit_code == 3 and "cannot read" in r.output


def test_huge_declared_sizes_are_not_allocated():
    # 2^40 x 2^40 tensors load fine (nothing is allocated from declared sizes) ...
    p = base()
    p["dims"].update(b=2**40, h=2**40, f=2**40)
    p["run_dims"] = {"b": 4, "h": 8, "f": 16}
    plan = load_plan(p)
    assert plan.dims["h"] == 2**40


def test_running_at_huge_dims_is_refused(tmp_path):
    p = base()
    p["dims"].update(b=2**20, h=2**20)
    r = run_cli(tmp_path, p)
    assert r.exit_code == 3 and "smaller run_dims" in r.output


def test_schema_is_published():
    s = json_schema()
    assert s["properties"]["tvcert_plan"]
    r = CliRunner().invoke(main, ["schema"])
    assert r.exit_code == 0 and json.loads(r.output)["title"] == "PlanSpec"


def test_examples_validate_against_schema():
    jsonschema = pytest.importorskip("jsonschema")
    s = json_schema()
    for f in EX.glob("*.json"):
        jsonschema.validate(json.loads(f.read_text()), s)


def test_rank_dependent_shape_is_rejected():
    p = base()
    p["parallel"][0]["nodes"].insert(0, {"name": "xs", "op": "slice", "inputs": ["x"],
                                         "attrs": {"dim": 0, "start": 0, "end": "1+rank.tp"}})
    with pytest.raises(PlanError, match="differs between ranks"):
        load_plan(p)
