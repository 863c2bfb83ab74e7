"""torchtitan models with torchtitan's own parallelization, traced and verified (issue 7).

Pinned: torchtitan==0.3.0 (``--no-deps``, plus spmd_types==0.2.3 and tyro==1.0.17: see the Makefile),
torch==2.13.0 CPU.  torchtitan's default ``spmd_types`` backend; see ``tvcert.frontends.torchtitan``
for what is torchtitan's and what the loader substitutes (causal SDPA with a finite mask, no FSDP).
"""
from __future__ import annotations

import copy
import json

import pytest

pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from tvcert.certificate.check import check_certificate  # noqa: E402
from tvcert.certificate.emit import build_certificate, dump_certificate  # noqa: E402
from tvcert.certificate.format import Certificate  # noqa: E402
from tvcert.cli import main  # noqa: E402
from tvcert.engine.verify import verify  # noqa: E402
from tvcert.frontends.torchtitan import deepseek_v3_debug, llama3_debug, trace_titan  # noqa: E402
from tvcert.frontends.trace import TraceError  # noqa: E402
from tvcert.interp import run_plan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

PARAMS = {"tok_embeddings__weight", "layers__0__attention__qkv_linear__wqkv__weight", "lm_head__weight",
          "layers__1__feed_forward__w2__weight", "layers__1__ffn_norm__weight", "norm__weight"}


@pytest.fixture(scope="module")
def llama_tp_sp():
    """torchtitan's Llama 3 debug model (2 layers), torchtitan's TP=4 + SP plan, unchanged."""
    return trace_titan(llama3_debug(layers=2), tp=4, sp=True)


def test_llama3_tp4_sp_plan_is_torchtitans(llama_tp_sp):
    raw = llama_tp_sp
    ins = raw["inputs"]
    assert PARAMS <= set(ins)
    assert ins["layers__0__attention__qkv_linear__wqkv__weight"]["placement"] == {"tp": "Shard(0)"}
    assert ins["layers__0__attention__wo__weight"]["placement"] == {"tp": "Shard(1)"}
    assert ins["layers__1__feed_forward__w2__weight"]["placement"] == {"tp": "Shard(1)"}
    assert ins["tok_embeddings__weight"]["placement"] == {"tp": "Shard(0)"}  # vocab-parallel embedding
    assert ins["lm_head__weight"]["placement"] == {"tp": "Shard(0)"}
    assert ins["layers__0__attention_norm__weight"]["placement"] == {}
    ops = [n["op"] for n in raw["parallel"][0]["nodes"]]
    # SP: all-gather before attention / FFN, reduce-scatter after wo / w2 (forward and backward)
    assert ops.count("all_gather") >= 8 and ops.count("reduce_scatter") >= 8
    assert "all_reduce" in ops  # loss-parallel cross-entropy (max, sum-exp, target logit)


LOSS_PARALLEL = {"vocab_parallel_log_softmax", "vocab_parallel_nll_loss", "vocab_parallel_nll_backward",
                 "vocab_parallel_embedding_clamped", "vocab_parallel_embedding_clamped_backward"}


def test_llama3_tp4_sp_torchtitan_plan_verifies_with_loss_parallel(llama_tp_sp):
    """torchtitan's plan unchanged, loss parallel included: VERIFIED.  The vocab-parallel embedding
    (``ids.clamp(...)``, ``out * in_range``) and its backward, and ``_LossParallelCrossEntropy`` (vocab-parallel
    log_softmax with the all-reduced max, the target logit picked at ``t - rank*V/tp`` and masked before the
    squeeze, all-reduced, ignore_index; its backward ``exp(ls) - local one-hot``) are each proved by a multi-op
    rule whose conclusion is the logical log_softmax / nll_loss form.  The certificate checks."""
    plan = load_plan(llama_tp_sp)
    assert run_plan(plan).equal
    res = verify(plan, refute=False)
    assert res.verdict == "VERIFIED" and not res.reasons, res.reasons
    assert LOSS_PARALLEL <= {r for s in res.prop.steps if s.pattern for r in s.rules}
    assert not res.prop.open_failures()
    check_certificate(Certificate.model_validate(json.loads(dump_certificate(build_certificate(res)))))


def _nodes(raw):
    return raw["parallel"][0]["nodes"]


def _node(raw, name):
    return next(n for n in _nodes(raw) if n.get("name") == name)


def _local_max_in_one_use(raw):
    """ls = (x - local amax) - log(sum exp(x - all-reduced max)): the local max in one of the two uses."""
    i = next(k for k, n in enumerate(_nodes(raw)) if n.get("name") == "sub_2")
    _nodes(raw).insert(i, {"op": "sub", "name": "sub_1_local", "inputs": ["view_33", "amax"]})
    _node(raw, "sub_2")["inputs"][0] = "sub_1_local"


def _mirrored_block(raw):
    """The target's block mask and offset of the mirrored rank (indices in range, the wrong shard)."""
    for name, v in (("lt_1_c", "(3-rank.tp)*32"), ("ge_1_c", "(3-rank.tp)*32+32"), ("sub_3", "(3-rank.tp)*-32")):
        _node(raw, name)["attrs"]["value"] = v


def _offset_one_block_off(raw):
    _node(raw, "sub_3")["attrs"]["value"] = "rank.tp*-32+32"


def _no_target_all_reduce(raw):
    _nodes(raw).remove(_node(raw, "all_reduce_2"))
    _node(raw, "squeeze")["inputs"][0] = "index_put__1"


def _no_pick_mask(raw):
    _node(raw, "all_reduce_2")["inputs"][0] = "gather"


def _sum_exp_all_reduce_avg(raw):
    _node(raw, "all_reduce_1")["attrs"]["reduce"] = "avg"


def _backward_one_hot_unmasked(raw):
    _node(raw, "index_put__3_v")["inputs"][0] = "_to_copy_1"  # float(out) instead of float(out) - 1


def _embedding_backward_unmasked(raw):
    _node(raw, "grad_tok_embeddings__weight")["inputs"][0] = "cat_11"  # no in-block mask on the gradient


def _embedding_backward_mirrored_clamp(raw):
    """The backward scatters at clamp(ids - (tp-1-rank)*32, 0, 31): the mirrored rank's rows."""
    i = next(k for k, n in enumerate(_nodes(raw)) if n.get("name") == "grad_tok_embeddings__weight")
    _nodes(raw)[i:i] = [{"op": "add_scalar", "name": "sub_m", "inputs": ["tokens"], "attrs": {"value": "(3-rank.tp)*-32"}},
                        {"op": "maximum", "name": "cmax_m", "inputs": ["sub_m", "clamp_c"]},
                        {"op": "minimum", "name": "cmin_m", "inputs": ["cmax_m", "clamp_c_1"]}]
    _node(raw, "grad_tok_embeddings__weight")["inputs"][1] = "cmin_m"


def _ignore_index_in_vocab(raw):
    for n in _nodes(raw):
        if n["op"] == "const" and n.get("attrs", {}).get("value") == -100:
            n["attrs"]["value"] = 5


# mutation -> the verdict: REFUTED where the reference interpreter shows a difference; an offset one block off
# reads outside the local shard (gather index out of range), which the interpreter cannot run: UNKNOWN.
VOCAB_END_MUTATIONS = {
    _local_max_in_one_use: "REFUTED",
    _mirrored_block: "REFUTED",
    _offset_one_block_off: "UNKNOWN",
    _no_target_all_reduce: "REFUTED",
    _no_pick_mask: "REFUTED",
    _sum_exp_all_reduce_avg: "REFUTED",
    _backward_one_hot_unmasked: "REFUTED",
    _embedding_backward_unmasked: "REFUTED",
    _embedding_backward_mirrored_clamp: "REFUTED",
}


@pytest.mark.parametrize("mutate", list(VOCAB_END_MUTATIONS), ids=lambda f: f.__name__.strip("_"))
def test_llama3_tp4_sp_vocab_parallel_mutations_are_not_verified(llama_tp_sp, mutate):
    raw = copy.deepcopy(llama_tp_sp)
    mutate(raw)
    res = verify(load_plan(raw))
    assert res.verdict == VOCAB_END_MUTATIONS[mutate], res.reasons


def test_llama3_tp4_sp_ignore_index_inside_the_vocabulary_is_not_verified(llama_tp_sp):
    """ignore_index 5 is a class: the logical one_hot(5) row is not zero, so the nll rule must refuse."""
    raw = copy.deepcopy(llama_tp_sp)
    _ignore_index_in_vocab(raw)
    res = verify(load_plan(raw))
    assert res.verdict != "VERIFIED"
    assert not {"vocab_parallel_nll_loss", "vocab_parallel_nll_backward"} & {r for s in res.prop.steps for r in s.rules}


@pytest.mark.parametrize("sp", [True, False])
def test_llama3_tp4_verifies_with_replicated_vocab_ends(sp):
    """Every transformer layer with torchtitan's TP (+ SP) plan (fused QKV colwise, wo / w2 rowwise with
    reduce-scatter or all-reduce, SP norms, complex RoPE, causal attention on head shards), with the
    embedding replicated and the loss on all-gathered logits: VERIFIED."""
    raw = trace_titan(llama3_debug(layers=2), tp=4, sp=sp, vocab_parallel=False)
    assert raw["inputs"]["tok_embeddings__weight"]["placement"] == {}
    assert raw["inputs"]["layers__0__attention__wo__weight"]["placement"] == {"tp": "Shard(1)"}
    plan = load_plan(raw)
    assert run_plan(plan).equal
    res = verify(plan)
    assert res.verdict == "VERIFIED" and not res.reasons, res.reasons


def test_llama3_without_mesh_context_is_refuted():
    """The same model run without the SPMD mesh context: spmd_types' redistributions return their input,
    no collective happens in the model and every rank computes on its local shards."""
    raw = trace_titan(llama3_debug(layers=2), tp=4, sp=True, mesh_context=False)
    ops = {n["op"] for n in raw["parallel"][0]["nodes"]}
    assert not {"all_gather", "reduce_scatter"} & ops
    res = verify(load_plan(raw))
    assert res.verdict == "REFUTED", res.reasons
    ce = res.counterexample
    assert ce and ce["mode"] == "float64" and ce["inputs"]
    assert any(not o["equal"] for o in ce["outputs"])
    assert ce.get("first_divergence")


def test_deepseek_v3_ep_is_unknown():
    """DeepSeek-V3 debug model (1 dense + 1 MoE layer, 8 experts top-3, 2 shared), EP=4 on the TP=4 ranks:
    UNKNOWN.  The MoE router's ``scatter_`` and ``sort.stable`` / ``index.Tensor`` / ``cumsum`` now convert
    (issue 15); the logical graph then stops at an in-place ``add_`` on a tensor that may be aliased (the
    converter refuses in-place writes it cannot prove unaliased), and still needs ``floor_divide``,
    ``_grouped_mm`` with data-dependent group offsets and torchtitan's ``deterministic_scatter_add``; the parallel
    ranks cannot even be traced on fake tensors, since the all-to-all split sizes are read from token
    counts (``input_splits.tolist()`` in token_dispatcher.py: DataDependentOutputException)."""
    with pytest.raises(TraceError) as ei:
        trace_titan(deepseek_v3_debug(layers=2), tp=4, ep=4, sp=True)
    assert ei.value.kind == "unsupported"  # the CLI reports UNKNOWN (exit code 2)
    assert ei.value.op == "aten.add_.Tensor" and "aliased" in str(ei.value), str(ei.value)


def test_cli_trace_torchtitan(tmp_path):
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["trace", "--torchtitan", "llama3-debug", "--tp", "4", "--sp", "--replicated-vocab",
                                  "-o", str(out), "--verify", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["verdict"] == "VERIFIED"
    assert json.loads(out.read_text())["dims"] == {"tp": 4}
    r = CliRunner().invoke(main, ["trace", "--torchtitan", "deepseek-v3-debug", "--tp", "4", "--ep", "4", "--sp"])
    assert r.exit_code == 2 and "UNKNOWN" in r.output and "aten.add_" in r.output, r.output


def test_llama3_logical_graph_matches_eager_torch(llama_tp_sp):
    """The converted logical graph (complex RoPE on real views, SDPA's math backend, RMSNorm's in-place
    eps) evaluated by the reference interpreter equals eager torch on the same weights and tokens."""
    import types

    import numpy as np
    import torch
    from torchtitan.models.common.attention import ScaledDotProductAttention

    from tvcert.frontends.torchtitan import _causal_sdpa_forward, _safe
    from tvcert.interp import make_inputs, run_graph
    from tvcert.ops.base import Ctx

    plan = load_plan(llama_tp_sp)
    ctx = Ctx(exact=False, seed=0)
    inp = make_inputs(plan, plan.run_dims, 0, ctx)
    model = llama3_debug(layers=2).config(1, False).build().double()  # real tensors on CPU
    for mod in model.modules():
        if isinstance(mod, ScaledDotProductAttention):
            mod.forward = types.MethodType(_causal_sdpa_forward, mod)
    state = {}
    for n, b in model.named_buffers():  # the real RoPE cache, not random numbers
        inp[_safe(n)] = torch.view_as_real(b).double().numpy()
        state[n] = b
    pnames = [n for n, _ in model.named_parameters()]
    for n in pnames:
        state[n] = torch.tensor(inp[_safe(n)], requires_grad=True)
    vals = run_graph(plan.logical, inp, plan.run_dims, ctx)
    pred = torch.func.functional_call(model, state, (torch.tensor(inp["tokens"]),))
    loss = torch.nn.functional.cross_entropy(pred.flatten(0, 1), torch.tensor(inp["labels"]).flatten(0, 1),
                                             reduction="sum")
    grads = torch.autograd.grad(loss, [state[n] for n in pnames])
    # torchtitan's RoPE computes in float32 (query.float()), the rest in float64
    assert abs(float(vals["loss"]) - loss.item()) <= 1e-6 * abs(loss.item())
    for n, g in zip(pnames, grads):
        g = g.numpy()
        assert np.max(np.abs(vals[f"grad_{_safe(n)}"] - g)) <= 1e-4 * np.max(np.abs(g)), n


# ====================================================================== a torchtitan job config (issue 16)
JOBS = "examples/torchtitan"


def _job_plan(path, **kw):
    from tvcert.frontends.titan_config import load_job
    from tvcert.frontends.torchtitan import trace_titan_job

    return trace_titan_job(load_job(path, "llama3-debug"), layers=1, **kw)


@pytest.mark.parametrize("job, mesh", [("tp2", {"tp": 2}), ("fsdp2", {"fsdp": 2}),
                                       ("hsdp", {"dp_replicate": 2, "fsdp": 2}), ("fsdp2_tp2", {"tp": 2, "fsdp": 2})])
def test_job_config_verifies(job, mesh):
    """Each shipped job config, traced as torchtitan parallelizes it (TP on spmd_types; FSDP / HSDP / FSDP + TP
    through graph_trainer's apply_simple_fsdp with the job's ParallelDims), VERIFIED; the interpreter agrees."""
    raw = _job_plan(f"{JOBS}/llama3_debug_{job}.toml")
    assert raw["dims"] == mesh
    wqkv = raw["inputs"]["layers__0__attention__qkv_linear__wqkv__weight"]["placement"]
    # TP's column shard, FSDP's dim-0 shard (nested inside TP's), HSDP's replicas
    assert wqkv == {a: "Replicate" if a == "dp_replicate" else "Shard(0)" for a in mesh}
    if "fsdp" in mesh:
        ops = [n["op"] for p in raw["parallel"] for n in p["nodes"]]
        assert "all_gather" in ops and "reduce_scatter" in ops  # SimpleFSDP's parameter gather, gradient scatter
    plan = load_plan(raw)
    assert run_plan(plan).equal
    res = verify(plan, refute=False)
    assert res.verdict == "VERIFIED" and not res.reasons, res.reasons


def test_job_config_cli_without_mesh_context_is_refuted():
    """The TP job with the model run outside torchtitan's SPMD mesh context (no collectives): REFUTED."""
    r = CliRunner().invoke(main, ["trace", "--torchtitan", "llama3-debug", "--config", f"{JOBS}/llama3_debug_tp2.toml",
                                  "--layers", "1", "--no-mesh-context", "--verify", "--json"])
    assert r.exit_code == 1, r.output
    assert json.loads(r.output)["verdict"] == "REFUTED"


def _write(tmp_path, text, name="job.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


BASE = '[model]\nname = "llama3"\nflavor = "debugmodel"\n[training]\nlocal_batch_size = 2\nseq_len = 8\n'


@pytest.mark.parametrize("text, code, needle", [
    (BASE + "[parallelism]\ntensor_parallel_degre = 2\n", 3, "parallelism.tensor_parallel_degre"),
    (BASE + "[job]\ndump_folder = 'x'\n", 3, "'job'"),
    (BASE + "[activation_checkpoint]\nmode = 'sometimes'\n", 3, "activation_checkpoint.mode"),
    (BASE.replace('"debugmodel"', '"8B"'), 3, "model.flavor"),
    (BASE.replace('"llama3"', '"deepseek_v3"'), 3, "--torchtitan llama3-debug"),
    (BASE.replace("seq_len = 8", "seq_len = 2048"), 3, "training.seq_len"),
    ("[parallelism\n", 3, "not TOML"),
    (BASE + "[activation_checkpoint]\nmode = 'none'\n", 3, "every parallelism degree is 1"),
    (BASE + "[parallelism]\npipeline_parallel_degree = 2\n", 2, "pipeline_parallel_degree = 2"),
    (BASE + "[parallelism]\ncontext_parallel_degree = 2\n", 2, "context_parallel_degree = 2"),
    (BASE + "[parallelism]\ntensor_parallel_degree = 2\nenable_async_tensor_parallel = true\n", 3,
     "Async TP requires"),  # torchtitan's own CompileConfig check (0.1/0.2 kept the key under [parallelism])
    (BASE + "[parallelism]\ntensor_parallel_degree = 2\n[compile]\nenable = true\nenable_async_tensor_parallel = true\n"
     "[activation_checkpoint]\nmode = 'none'\n", 2, "enable_async_tensor_parallel"),
    (BASE + "[parallelism]\ntensor_parallel_degree = 2\n", 2, "selective"),  # torchtitan's default AC policy
    (BASE + "[parallelism]\ntensor_parallel_degree = 2\nspmd_backend = 'full_dtensor'\n", 2, "spmd_backend"),
    (BASE + "[parallelism]\ndata_parallel_shard_degree = 2\n[activation_checkpoint]\nmode = 'full'\n", 2,
     "activation_checkpoint.mode = 'full' with data parallelism"),
])
def test_job_config_bad_or_unsupported(tmp_path, text, code, needle):
    """A key torchtitan does not know, a model / size the trace does not cover, bad TOML: bad input (3) naming it;
    a degree or policy the trace does not cover (pp, cp, async TP, selective AC): UNKNOWN (2) naming the field.
    Never a traceback, never a verdict."""
    r = CliRunner().invoke(main, ["trace", "--torchtitan", "llama3-debug", "--config", _write(tmp_path, text),
                                  "--verify", "--json"])
    assert r.exit_code == code, r.output
    out = json.loads(r.output)
    assert out["verdict"] == {3: "BAD_INPUT", 2: "UNKNOWN"}[code] and needle in out["reason"], out


def test_job_config_options(tmp_path):
    """--config needs --torchtitan and sets the degrees: --tp with it is a usage error; a missing file is bad input."""
    job = f"{JOBS}/llama3_debug_tp2.toml"
    r = CliRunner().invoke(main, ["trace", "--torchtitan", "llama3-debug", "--config", job, "--tp", "4"])
    assert r.exit_code == 3 and "--tp with --config" in r.output
    r = CliRunner().invoke(main, ["trace", "--config", job, "--hf", "llama"])
    assert r.exit_code == 3 and "needs --torchtitan" in r.output
    r = CliRunner().invoke(main, ["trace", "--torchtitan", "llama3-debug", "--config", str(tmp_path / "no.toml"),
                                  "--json"])
    assert r.exit_code == 3 and "cannot read" in json.loads(r.output)["reason"]


def test_job_config_fsdp_tp_without_the_plan_order_world_is_refuted(monkeypatch):
    """FSDP + TP needs torchtitan's world listed in the plan's rank order (tp nested outside fsdp); with
    torchtitan's own numbering the plan misdescribes which ranks hold which blocks: REFUTED, not VERIFIED."""
    import contextlib

    import tvcert.frontends.torchtitan as tt

    monkeypatch.setattr(tt, "_plan_order_world", lambda *a: contextlib.nullcontext())
    res = verify(load_plan(_job_plan(f"{JOBS}/llama3_debug_fsdp2_tp2.toml")))
    assert res.verdict == "REFUTED"
