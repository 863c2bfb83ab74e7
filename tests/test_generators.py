"""Generated Llama-3 training plans: correct ones verify, every injected bug is refuted and localized."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tvcert.cli import main
from tvcert.engine.verify import verify
from tvcert.generators.mutations import MUTATIONS, mutate
from tvcert.generators.plans import llama3_plan
from tvcert.interp import run_plan
from tvcert.plan import load_plan

from mutation_check import assert_refuted_and_localized

CONFIGS = {
    "single": {},
    "tp": {"tp": 2},
    "tp_sp": {"tp": 2, "sp": True},
    "cp": {"cp": 2},
    "dp": {"dp": 2},
    "tp_dp_microbatches": {"tp": 2, "dp": 2, "mb": 2},
    "tp_dp_zero1": {"tp": 2, "dp": 2, "zero": 1},
    "cp_tp_sp": {"cp": 2, "tp": 2, "sp": True},
    "pp": {"pp": 2, "layers": 2},
    "pp_tp_dp_microbatches": {"pp": 2, "layers": 2, "tp": 2, "dp": 2, "mb": 2},
    "pp3_cp_sp_zero": {"pp": 3, "layers": 3, "cp": 2, "tp": 2, "sp": True, "dp": 2, "zero": 1},
    "tied": {"tie_embeddings": True},
    "tied_tp_dp_zero1": {"tie_embeddings": True, "tp": 2, "dp": 2, "zero": 1},
    "tied_tp_sp_dp_microbatches": {"tie_embeddings": True, "tp": 2, "sp": True, "dp": 2, "mb": 2},
    "tied_pp_tp_dp_zero1": {"tie_embeddings": True, "pp": 2, "layers": 2, "tp": 2, "dp": 2, "zero": 1},
    "tied_pp3_cp_sp_mb": {"tie_embeddings": True, "pp": 3, "layers": 3, "cp": 2, "tp": 2, "sp": True, "mb": 2},
    "masked_embedding": {"masked_embedding": True},
    "masked_embedding_tp_dp_zero1": {"masked_embedding": True, "tp": 2, "dp": 2, "zero": 1},
    "masked_embedding_cp_tp_sp_mb": {"masked_embedding": True, "cp": 2, "tp": 2, "sp": True, "mb": 2},
    "masked_embedding_tied_pp_tp_dp_zero1": {"masked_embedding": True, "tie_embeddings": True, "pp": 2, "layers": 2,
                                             "tp": 2, "dp": 2, "zero": 1},
}


def small(plan: dict) -> dict:
    """Verify at the run dims too, so the same instance is proved and executed."""
    plan["dims"] = dict(plan["run_dims"])
    return plan


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_generated_plan_runs_equal_and_verifies(name):
    cfg = {"layers": 1, **CONFIGS[name]}
    plan = load_plan(small(llama3_plan("llama3-8b", **cfg)))
    assert run_plan(plan).equal
    res = verify(plan, refute=False)
    assert res.verdict == "VERIFIED", res.reasons


def test_full_size_plan_verifies_without_unrolling():
    res = verify(load_plan(llama3_plan("llama3-8b", layers=2, tp=8, dp=4, mb=4, sp=True)), refute=False)
    assert res.verdict == "VERIFIED", res.reasons


@pytest.mark.parametrize("axis", ["tp", "dp", "cp", "mb"])  # pp: one program per stage, each the same size
def test_plan_size_does_not_grow_with_parallel_degree(axis):
    def count(deg):
        p = llama3_plan("llama3-8b", layers=1, **{axis: deg})
        return sum(len(g["nodes"]) for g in p["parallel"]), len(json.dumps(p["parallel"]))

    n2, _ = count(2)
    n8, _ = count(8)
    assert n2 == n8


@pytest.mark.parametrize("mut", MUTATIONS, ids=lambda m: m.name)
def test_every_mutation_is_refuted_and_localized(mut):
    cfg = {"layers": 1, **mut.config}
    cfg["mb"] = cfg.pop("microbatches", 1)
    good = small(llama3_plan("llama3-8b", **cfg))
    bad, role = mutate(good, mut.name)
    assert_refuted_and_localized(good, bad, role)


@pytest.mark.parametrize("pp", [1, 2])
def test_tied_embeddings_share_one_table(pp):
    """Tied: no lm_head parameter; the head reads the embedding table (sent to the last stage under pp) and the
    table's gradient adds the head's contribution before the gradient sync (ZeRO's reduce_scatter)."""
    p = llama3_plan("llama3-8b", layers=pp, pp=pp, tp=2, dp=2, zero=1, tie_embeddings=True)
    assert "lm_head" not in p["inputs"] and "lm_head_out" not in p["outputs"] and "embedding_out" in p["outputs"]
    assert "lm_head" not in {t["name"] for t in p["logical"]["inputs"]}
    stage0 = p["parallel"][0]["nodes"]
    srcs = [n["src"] for n in stage0]
    assert srcs.index("embed.bwd.tied_grad_sum") < srcs.index("optim.embedding.grad_reduce_scatter")
    tags = {n["attrs"]["tag"] for g in p["parallel"] for n in g["nodes"] if n["op"] == "send"}
    assert ({"tied_weight", "tied_grad"} <= tags) == (pp > 1)
    untied = llama3_plan("llama3-8b", layers=pp, pp=pp, tp=2, dp=2, zero=1)
    assert "lm_head" in untied["inputs"] and not any("tied" in n["src"] for g in untied["parallel"] for n in g["nodes"])
    res = verify(load_plan(llama3_plan("llama3-8b", layers=2 * pp, pp=pp, tp=8, dp=4, mb=4, zero=1, tie_embeddings=True)),
                 refute=False)
    assert res.verdict == "VERIFIED", res.reasons


def test_masked_embedding_is_the_megatron_lookup():
    """--masked-embedding: the forward is embedding(W_local, ids - rank*B) with out-of-block tokens zeroed,
    proved by the vocab_parallel_embedding pattern; the logical forward is embedding(W, ids)."""
    p = llama3_plan("llama3-8b", layers=2, tp=8, dp=4, mb=4, sp=True, zero=1, masked_embedding=True)
    assert any(n["op"] == "embedding" for n in p["logical"]["nodes"])
    assert not any(n["src"] == "embed.one_hot" for n in p["parallel"][0]["nodes"])
    res = verify(load_plan(p), refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    assert any("vocab_parallel_embedding" in s.rules for s in res.prop.steps)


def test_at_least_25_mutation_kinds():
    assert len(MUTATIONS) >= 25


def test_plan_and_mutate_cli(tmp_path):
    r = CliRunner().invoke(main, ["plan", "llama3-8b", "--tp", "2", "--layers", "1", "-o", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["mutate", str(tmp_path / "p.json"), "--bug", "ce_local_max", "-o", str(tmp_path / "b.json")])
    assert r.exit_code == 0, r.output
    assert "ce_local_max" in json.loads((tmp_path / "b.json").read_text())["name"]
    r = CliRunner().invoke(main, ["plan", "llama3-8b", "--tie-embeddings", "--pp", "2", "--layers", "2", "--dp", "2",
                                  "--zero", "1", "-o", str(tmp_path / "t.json")])
    assert r.exit_code == 0 and "tied embeddings" in r.output, r.output
    r = CliRunner().invoke(main, ["mutate", str(tmp_path / "t.json"), "--bug", "zero_reduce_scatter_before_tied_sync",
                                  "-o", str(tmp_path / "tb.json")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["plan", "deepseek-v3-16b", "--tie-embeddings", "-o", str(tmp_path / "x.json")])
    assert r.exit_code == 3 and "--tie-embeddings applies to the llama family" in r.output
    r = CliRunner().invoke(main, ["plan", "llama3-8b", "--masked-embedding", "--tp", "2", "--layers", "1",
                                  "-o", str(tmp_path / "m.json")])
    assert r.exit_code == 0 and "masked vocab-parallel lookup" in r.output, r.output
    r = CliRunner().invoke(main, ["mutate", "--list"])
    assert "--tie-embeddings" in r.output
    r = CliRunner().invoke(main, ["plan", "llama3-9b", "-o", str(tmp_path / "x.json")])
    assert r.exit_code == 3 and "unknown model" in r.output
    r = CliRunner().invoke(main, ["plan", "llama3-8b", "--sp", "-o", str(tmp_path / "x.json")])
    assert r.exit_code == 3 and "--sp needs --tp" in r.output
    r = CliRunner().invoke(main, ["mutate", str(tmp_path / "p.json"), "--bug", "nope", "-o", str(tmp_path / "b.json")])
    assert r.exit_code == 3 and "unknown mutation" in r.output


def _structure(X, e, memo, table):
    """A canonical number for an expression's structure, shared across expression tables."""
    if e not in memo:
        x = X[e]
        memo[e] = table.setdefault((x.op, x.attrs, tuple(_structure(X, a, memo, table) for a in x.args)), len(table))
    return memo[e]


@pytest.mark.parametrize("cfg", [{"tp": 2, "layers": 3}, {"tp": 2, "dp": 2, "zero": 1, "layers": 3},
                                 {"pp": 2, "tp": 2, "sp": True, "layers": 4}, {"cp": 2, "dp": 2, "mb": 2, "layers": 3}])
def test_memoized_stages_give_exactly_the_facts_of_full_derivation(cfg, monkeypatch):
    """Replaying a repeated layer from its template must conclude, op by op, what deriving it would."""
    import tvcert.engine.propagate as P
    from tvcert.deep import deep
    from tvcert.kernel.expr import Exprs
    from tvcert.kernel.setup import logical_exprs

    plan = load_plan(small(llama3_plan("llama3-8b", **cfg)))

    table: dict = {}

    @deep
    def derive_all():
        X = Exprs()
        prop = P.propagate(plan, X, logical_exprs(plan, X))
        cache: dict = {}
        return ({(p, t): (_structure(X, f.expr, cache, table), f.pl) for p, fs in prop.facts.items()
                 for t, f in fs.items()}, prop.stages, prop.distinct_stages)

    runs = {}
    for memo in (True, False):
        monkeypatch.setattr(P, "MEMOIZE", memo)
        runs[memo] = derive_all()
    assert runs[True][0] == runs[False][0]
    assert runs[True][1] > runs[True][2] > 0  # some stages were replayed


@pytest.mark.parametrize("edit", ["drop_allreduce", "softmax_dim"])
def test_bug_in_a_repeated_layer_is_not_hidden_by_memoization(edit):
    """A bug in layer 2 only: its stage no longer has layer 0's canonical form, so it is derived, not
    replayed, and the plan is refuted."""
    from tvcert.generators.mutations import _bypass, _set

    bad = small(llama3_plan("llama3-8b", layers=3, tp=2))
    if edit == "drop_allreduce":
        _bypass(bad, r"^layer2\.o_proj\.all_reduce$")
    else:
        _set(bad, r"^layer2\.softmax$", dim=-2)
    res = verify(load_plan(bad))
    assert res.verdict == "REFUTED", res.reasons
    replayed = {s.node for s in res.prop.steps if s.instance_of}
    layer2 = {i for i, n in enumerate(load_plan(bad).programs["spmd"].nodes) if n.layer == "layer2"}
    assert not (replayed & layer2)
