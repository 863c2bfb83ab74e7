"""Generated DeepSeek-V2/V3 training plans (MLA, MoE, expert parallelism): correct ones verify, MoE bugs are refuted."""
from __future__ import annotations

import json

import pytest

from tvcert.engine.verify import verify
from tvcert.generators.deepseek import DEEPSEEK, deepseek_plan
from tvcert.generators.mutations import MOE_MUTATIONS, mutate
from tvcert.interp import Ctx, make_inputs, run_plan
from tvcert.plan import load_plan

from mutation_check import assert_refuted_and_localized

CONFIGS = {
    "single": ("deepseek-v3-671b", {}),
    "tp": ("deepseek-v3-671b", {"tp": 2}),
    "ep": ("deepseek-v3-671b", {"ep": 2}),
    "tp_ep": ("deepseek-v3-236b", {"tp": 2, "ep": 2}),
    "dp_ep": ("deepseek-v3-671b", {"dp": 2, "ep": 2}),
    "sp": ("deepseek-v3-16b", {"tp": 2, "sp": True}),
    "sp_ep": ("deepseek-v3-671b", {"tp": 2, "sp": True, "ep": 2}),
    "cp_ep": ("deepseek-v3-16b", {"cp": 2, "ep": 2}),
    "tp_dp_mb_ep": ("deepseek-v3-236b", {"tp": 2, "dp": 2, "mb": 2, "ep": 2}),
    "tp_dp_ep_zero1": ("deepseek-v3-671b", {"tp": 2, "dp": 2, "ep": 2, "zero": 1}),
    "pp_tp_ep": ("deepseek-v3-671b", {"pp": 2, "tp": 2, "ep": 2}),
    "pp_dp_mb_ep_zero1": ("deepseek-v3-16b", {"pp": 2, "dp": 2, "mb": 2, "ep": 2, "zero": 1}),
    "dp_cp_sp_ep_zero1": ("deepseek-v3-671b", {"dp": 2, "cp": 2, "tp": 2, "sp": True, "ep": 2, "zero": 1}),
}


def small(plan: dict) -> dict:
    """Verify at the run dims too, so the same instance is proved and executed."""
    plan["dims"] = dict(plan["run_dims"])
    return plan


def run_equal(plan) -> bool:
    """Run at the run dims with AdamW second moments drawn non-negative (random negatives make sqrt NaN, and
    the interpreter compares non-finite outputs bit-exactly)."""
    inputs = make_inputs(plan, plan.run_dims, 0, Ctx(exact=False, seed=0))
    inputs = {k: (abs(v) if k.endswith(".exp_avg_sq") else v) for k, v in inputs.items()}
    return run_plan(plan, inputs=inputs).equal


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_generated_plan_runs_equal_and_verifies(name):
    model, cfg = CONFIGS[name]
    raw = deepseek_plan(model, layers=2, **cfg)  # one dense layer, one MoE layer
    assert any(n["src"] == "layer1.combine" for g in raw["parallel"] for n in g["nodes"])
    plan = load_plan(small(raw))
    assert run_equal(plan)
    res = verify(plan, refute=False)
    assert res.verdict == "VERIFIED", res.reasons


def test_model_cards():
    v3 = DEEPSEEK["deepseek-v3-671b"]
    assert (v3["h"], v3["layers"], v3["dense_layers"], v3["ne"], v3["nsh"], v3["k"], v3["mf"], v3["v"]) == \
        (7168, 61, 3, 256, 1, 8, 2048, 129280)
    assert (v3["qr"], v3["kvr"], v3["dn"], v3["dr"], v3["dv"], v3["nh"]) == (1536, 512, 128, 64, 128, 128)
    assert DEEPSEEK["deepseek-v3-16b"]["qr"] == 0  # V2-Lite: no q low-rank projection
    p = deepseek_plan("deepseek-v3-16b", layers=1)
    assert not any(n["src"].endswith("q_a_proj") for n in p["parallel"][0]["nodes"])


def test_full_size_plan_verifies_without_unrolling():
    p = deepseek_plan("deepseek-v3-671b", layers=4, dp=32, tp=8, ep=8, mb=16)
    assert p["dims"]["ne"] == 256 and p["dims"]["h"] == 7168
    res = verify(load_plan(p), refute=False)
    assert res.verdict == "VERIFIED", res.reasons


@pytest.mark.parametrize("cfg", [{}, {"dp": 2}], ids=["direct", "dp"])
def test_plan_size_does_not_grow_with_ep(cfg):
    def count(deg):
        p = deepseek_plan("deepseek-v3-671b", layers=2, ep=deg, **cfg)
        return sum(len(g["nodes"]) for g in p["parallel"])

    assert count(2) == count(8) == count(64)


@pytest.mark.parametrize("mut", MOE_MUTATIONS, ids=lambda m: m.name)
def test_every_moe_mutation_is_refuted_and_localized(mut):
    cfg = dict(mut.config)
    good = small(deepseek_plan(cfg.pop("model"), layers=1, **cfg))
    bad, role = mutate(good, mut.name)
    assert_refuted_and_localized(good, bad, role)


def test_zero_shards_expert_optimizer_state():
    """ZeRO-1 covers expert parameters: each local expert's flattened weights are sharded over dp (the expert
    data-parallel group), gradients reduce-scattered over dp only; dense parameters keep the flat layout."""
    p = deepseek_plan("deepseek-v3-671b", layers=2, dp=2, ep=2, tp=2, zero=1)
    st = p["inputs"]["layer1.experts.w2.exp_avg_sq"]
    assert st["placement"] == {"ep": "Shard(0)", "dp": "Shard(1)"}
    assert st["layout"] == [{"op": "reshape", "attrs": {"shape": ["ne", -1]}}]
    assert p["outputs"]["layer1.experts.w2.exp_avg_sq_out"]["placement"] == st["placement"]
    assert p["inputs"]["layer1.wo.exp_avg"]["placement"] == {"dp": "Shard(0)", "tp": "Shard(0)"}
    rs = [n for n in p["parallel"][0]["nodes"] if n["src"].endswith("experts.w1.grad_reduce_scatter")]
    assert len(rs) == 1 and rs[0]["attrs"]["axis"] == "dp" and rs[0]["attrs"]["dim"] == 1
    big = deepseek_plan("deepseek-v3-671b", layers=4, dp=32, tp=8, ep=8, mb=16, zero=1)
    res = verify(load_plan(big), refute=False)
    assert res.verdict == "VERIFIED", res.reasons


def test_bad_options_are_refused():
    from tvcert.generators.plans import GenError

    with pytest.raises(GenError, match="not divisible"):
        deepseek_plan("deepseek-v3-671b", layers=1, ep=3)
    with pytest.raises(GenError, match="h\\*mf=.* not divisible by dp"):
        deepseek_plan("deepseek-v3-671b", layers=1, dp=3, ep=2, zero=1, dims={"h": 4, "mf": 2})
    with pytest.raises(GenError, match="unknown model"):
        deepseek_plan("deepseek-v3-7b")


def test_plan_and_mutate_cli(tmp_path):
    from click.testing import CliRunner

    from tvcert.cli import main

    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["plan", "deepseek-v3-671b", "--layers", "2", "--tp", "2", "--ep", "2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["dims"]["ep"] == 2
    r = CliRunner().invoke(main, ["mutate", str(out), "--bug", "moe_combine_dispatch_weights", "-o", str(tmp_path / "b.json")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["plan", "llama3-8b", "--ep", "2", "-o", str(tmp_path / "x.json")])
    assert r.exit_code == 3 and "--ep applies to MoE models" in r.output
