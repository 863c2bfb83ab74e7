"""Context parallelism traced from torch's own ring attention (tvcert.frontends.context_parallel).

With causal attention torch's ``_templated_ring_attention`` runs a different program on each cp rank; the trace merges
the per-rank programs into one in which every rank runs its own (tvcert.frontends.mpmd), which the interpreter runs
(non-causal rings VERIFIED by kernel/ring_merge, causal ones by kernel/ring_causal: tests/test_cp_causal.py); bugs are REFUTED (RoPE positions not offset, a stale merged
logsumexp), also in the rank-uniform configuration (non-causal, contiguous, all-to-all rotater).  The per-block kernel
semantics the trace uses are the CPU flash kernels' (float64, also with a merged out / logsumexp in the backward);
``funcol.permute_tensor`` converts to ``ppermute``, run by the interpreter as PyTorch defines it."""
from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "torch"))

import torch.distributed._functional_collectives as ft_c  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from tvcert.cli import main  # noqa: E402
from tvcert.frontends.context_parallel import flash_block, flash_block_backward, why_not_spmd  # noqa: E402
from tvcert.frontends.trace import TraceError, trace_plan  # noqa: E402
from tvcert.interp import run_plan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

aten = torch.ops.aten
SPEC = str(ROOT / "examples" / "torch" / "cp_attention.py")


@pytest.fixture(scope="module")
def cp2_tp2_causal():
    """TP + CP on a cp 2 x tp 2 mesh through torch's public ``context_parallel()`` (examples/torch/
    cp_context_parallel.py): tokens, targets and RoPE positions sharded in place by torch's head-tail load balancer,
    causal SDPA on sequence-sharded DTensors, heads column-parallel; the cp ranks run different programs, merged into
    one in which every rank runs its own."""
    import cp_context_parallel

    return cp_context_parallel.tvcert_trace(cp=2, tp=2)


def test_causal_ranks_differ_each_runs_its_own_program(cp2_tp2_causal):
    """The cp ranks' programs differ (``_is_causal_behavior``); the tp ranks of one cp coordinate are one program:
    two classes, picked by the cp coordinate; the interpreter runs each rank's own program and agrees with SDPA (to
    60 digits)."""
    plan = cp2_tp2_causal
    assert "2 classes over ['cp']" in plan["description"], plan["description"]
    nodes = plan["parallel"][0]["nodes"]
    picked = {n["name"] for n in nodes if n["op"] == "squeeze" and n["name"].startswith("mpmd_sel")}
    assert len(picked) >= 2  # each rank's own class's tensors picked (collectives, and the ops the classes share after)
    pl = load_plan(plan)
    assert run_plan(pl, seed=1).equal
    dec = run_plan(pl, seed=0, decimal=True)
    assert dec.equal and max(o.max_diff for o in dec.outputs) < 1e-40, dec.outputs
    from tvcert.engine.verify import verify

    res = verify(pl)
    # the load balancer's index read (zigzag_from_index_block) and its in-place buffer writes, read back as written
    assert res.verdict == "VERIFIED", res.reasons
    from tvcert.engine.verify import used_rules

    assert "zigzag_from_index_block" in used_rules(res)


def test_causal_tp_cp_positions_not_offset_refuted():
    """TP + CP through ``context_parallel()``: RoPE positions made inside the context as arange(local length)
    instead of the sharded position buffer: REFUTED, confirmed in 60-digit arithmetic."""
    import cp_context_parallel
    from tvcert.engine.verify import verify

    res = verify(load_plan(cp_context_parallel.tvcert_trace(cp=2, tp=2, bug="positions_not_offset")))
    assert res.verdict == "REFUTED", res.reasons
    assert "60-digit" in res.counterexample["confirmed"], res.counterexample
    assert {o["name"] for o in res.counterexample["outputs"] if not o["equal"]} >= {"loss", "grad_wq"}
    div = res.counterexample["first_divergence"]  # the RoPE cache read at the local positions, not the balancer
    assert div["op"] == "index_select" and div["src"] == "cp_attention.py:64", div


def test_why_not_spmd_lines_are_torch_source():
    """The lines named are the ones in the installed torch that make the ranks differ."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as A

    src = inspect.getsourcefile(A._templated_ring_attention)
    lines = Path(src).read_text().splitlines()
    text = why_not_spmd(True, "allgather", True, 4)
    import re

    got = [int(n) for n in re.findall(r"_attention\.py:(\d+)", text)]
    assert len(got) == 3, text
    assert "_is_causal_behavior(" in lines[got[0] - 1] and "_is_causal_behavior(" in lines[got[1] - 1]
    assert ".chunk(" in lines[got[2] - 1]
    assert "all-gather rotater" not in why_not_spmd(False, "alltoall")
    noncausal = why_not_spmd(False, "allgather", False, 4)  # every block attended in full: only the rotater differs
    assert "_is_causal_behavior" not in noncausal and "all-gather rotater" in noncausal, noncausal
    assert "all-gather rotater" not in why_not_spmd(True, "allgather", True, 2)  # block offsets affine at cp 2


# Non-causal attention without load balancing on the all-to-all rotater: the one configuration in which torch's ring
# is the same program on every rank.  The interpreter runs it; bugs put into torch's ring are REFUTED.
UNIFORM = {"cp": 2, "lb": False, "causal": False, "rotate": "alltoall"}


@pytest.fixture(scope="module")
def uniform_ring():
    import cp_attention

    return cp_attention.tvcert_trace(**UNIFORM)


def test_uniform_ring_traces_one_program_interpreter_agrees(uniform_ring):
    ops = [n["op"] for n in uniform_ring["parallel"][0]["nodes"]]
    assert ops.count("ppermute") >= 3 and "all_to_all" not in ops, ops  # K/V and dK/dV passed with permute_tensor
    for seed in (0, 1):
        assert run_plan(load_plan(uniform_ring), seed=seed).equal
    from tvcert.engine.verify import verify

    from tvcert.engine.verify import used_rules

    res = verify(load_plan(uniform_ring))
    assert res.verdict == "VERIFIED", res.reasons  # the packed K/V blocks and the sigmoid merge (kernel/ring_merge)
    assert {"ring_sigmoid_merge", "ring_sigmoid_merge_backward"} <= used_rules(res)


@pytest.mark.parametrize("which", [0, -1])
def test_unrolled_ring_block_twice_or_grads_not_home_refuted(uniform_ring, which):
    """Near misses of the unrolled-ring rules, edited into the traced plan: the first K / V ppermute with shift 0
    (each rank attends its own block twice, another never) or the last dK / dV ppermute with shift 0 (the
    gradients never come home): not VERIFIED, REFUTED by the interpreter."""
    import copy

    from tvcert.engine.verify import verify

    d = copy.deepcopy(uniform_ring)
    perms = [n for n in d["parallel"][0]["nodes"] if n["op"] == "ppermute"]
    perms[which]["attrs"]["shift"] = 0
    res = verify(load_plan(d))
    assert res.verdict == "REFUTED", res.reasons


def test_tp_cp_unrolled_ring_verified_broken_kernel_caught():
    """TP + CP (cp 2 x tp 2, all-gather rotater, non-causal): VERIFIED.  The merged lse left at the first block's
    (``lse_not_updated``) is refused by the kernel; with the kernel's whole-row premise of the recomputed
    probabilities dropped it would be VERIFIED, and the conformance check shows the interpreter disagrees."""
    from tvcert.conform.gens_ring_merge import trace_example
    from tvcert.conform.plans import _check_plan
    from tvcert.kernel.ring_merge import _Walk

    assert _check_plan(trace_example({"cp": 2, "tp": 2}, ""), None, use_float=True).status == "ok"
    bad = trace_example({"cp": 2, "tp": 2}, "lse_not_updated")
    assert _check_plan(bad, None, use_float=True).status == "refused"
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(_Walk, "whole_row", lambda self, lv, sc: lv.eS == sc.e)
        assert _check_plan(bad, None, use_float=True).status == "DISAGREE"
    finally:
        mp.undo()


def test_positions_not_offset_refuted_at_the_rope():
    """RoPE positions arange(local length) on every cp rank instead of the rank's block: REFUTED, first divergence
    in the rotary embedding's cache read."""
    import cp_attention
    from tvcert.engine.verify import verify

    res = verify(load_plan(cp_attention.tvcert_trace(**UNIFORM, bug="positions_not_offset")))
    assert res.verdict == "REFUTED", res.reasons
    fd = res.counterexample["first_divergence"]
    line = inspect.getsourcelines(cp_attention.rope)
    assert fd["src"] == f"cp_attention.py:{line[1] + len(line[0]) - 1}", fd  # rope's `cos[pos]` / `sin[pos]` line


def test_cli_ring_with_stale_logsumexp_refuted():
    """torch's merger with the log-sum-exp left at the first block's (the backward reads it): REFUTED through the
    CLI (exit 1), confirmed in 60-digit arithmetic."""
    sets = [a for k, v in UNIFORM.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    r = CliRunner().invoke(main, ["trace", SPEC, *sets, "--set", "bug=lse_not_updated", "--verify", "--json", "-q"])
    assert r.exit_code == 1, r.output
    out = json.loads(r.output[r.output.index("{"):])
    ce = out["counterexample"]
    assert out["verdict"] == "REFUTED" and "60-digit" in ce["confirmed"], out
    assert {o["name"] for o in ce["outputs"] if not o["equal"]} >= {"grad_wk", "grad_wv"}, ce["outputs"]


@pytest.mark.parametrize("causal", [False, True])
def test_flash_block_semantics_match_cpu_kernels(causal):
    """The per-block kernel the trace uses = the CPU flash kernels on float64: out and logsumexp; the backward from
    a foreign (merged) out and logsumexp, as the ring calls it."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 4, 3, dtype=torch.float64, generator=g) for _ in range(3))
    out, lse = flash_block(q, k, v, is_causal=causal)
    ref = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    assert torch.allclose(out, ref[0], atol=1e-12) and torch.allclose(lse, ref[1], atol=1e-12)
    do = torch.randn(out.shape, dtype=torch.float64, generator=g)
    merged_out = torch.randn(out.shape, dtype=torch.float64, generator=g)
    merged_lse = lse + torch.rand(lse.shape, dtype=torch.float64, generator=g)
    mine = flash_block_backward(do, q, k, v, merged_out, merged_lse, is_causal=causal)
    kern = aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, merged_out, merged_lse, 0.0, causal)
    for a, b in zip(mine, kern):
        assert torch.allclose(a, b, atol=1e-12)
    # a local-softmax backward (ignoring the merged out / lse) would be a different function
    same = flash_block_backward(do, q, k, v, out, lse, is_causal=causal)
    assert not torch.allclose(same[0], mine[0], atol=1e-6)


def _permute_plan(p: int, dst_shift: int, expect_shift: int):
    """Rank i sends its block to rank i + dst_shift (``funcol.permute_tensor``); the logical output is the blocks
    rolled by ``expect_shift``."""
    def logical(x):
        return {"loss": x.sum(), "y": (2 * x).roll(expect_shift * 2, 0)}

    def parallel(ctx, x):
        y = ft_c.permute_tensor(2 * x, [(i + dst_shift) % p for i in range(p)], ctx.group("cp"))
        return {"loss": x.sum(), "y": y}

    return trace_plan(logical, parallel, mesh={"cp": p},
                      inputs={"x": {"shape": [2 * p], "dtype": "float64", "placement": {"cp": "Shard(0)"}}},
                      output_placements={"loss": {"cp": "Partial(sum)"}, "y": {"cp": "Shard(0)"}})


@pytest.mark.parametrize("p", [2, 3, 4])
def test_permute_tensor_is_ppermute(p):
    plan = _permute_plan(p, 1, 1)
    pp = [n for n in plan["parallel"][0]["nodes"] if n["op"] == "ppermute"]
    assert len(pp) == 1 and pp[0]["attrs"] == {"axis": "cp", "shift": 1}, pp
    assert run_plan(load_plan(plan)).equal
    if p > 2:  # the other direction is a different program: the interpreter sees it
        assert not run_plan(load_plan(_permute_plan(p, p - 1, 1))).equal


def test_permute_tensor_not_a_shift_is_unknown():
    """Pairs swapped on 4 ranks ([1, 0, 3, 2]) is no ring shift: no conversion."""
    def logical(x):
        return {"loss": x.sum(), "y": 2 * x}

    def parallel(ctx, x):
        return {"loss": x.sum(), "y": ft_c.permute_tensor(2 * x, [1, 0, 3, 2], ctx.group("cp"))}

    with pytest.raises(TraceError) as ei:
        trace_plan(logical, parallel, mesh={"cp": 4},
                   inputs={"x": {"shape": [8], "dtype": "float64", "placement": {"cp": "Shard(0)"}}},
                   output_placements={"loss": {"cp": "Partial(sum)"}, "y": {"cp": "Shard(0)"}})
    assert ei.value.kind == "unsupported" and "uneven splits" in str(ei.value), ei.value


def _branch_plan(rank1):
    """cp 2: rank 0 doubles its block, rank 1 runs ``rank1``; then the blocks swap (``permute_tensor``)."""
    from tvcert.frontends.mpmd import per_rank_programs

    def logical(x):
        return {"loss": x.sum(), "y": (2 * x).roll(2, 0)}

    def parallel(ctx, x):
        y = 2 * x if ctx.coord("cp") == 0 else rank1(x, ctx)
        return {"loss": x.sum(), "y": ft_c.permute_tensor(y, [1, 0], ctx.group("cp"))}

    with per_rank_programs():
        return trace_plan(logical, parallel, mesh={"cp": 2},
                          inputs={"x": {"shape": [4], "dtype": "float64", "placement": {"cp": "Shard(0)"}}},
                          output_placements={"loss": {"cp": "Partial(sum)"}, "y": {"cp": "Shard(0)"}})


def test_merged_ranks_each_run_their_own_program():
    """Per-rank programs merged (tvcert.frontends.mpmd): the collective's input on each rank is its own program's.
    Rank 1 computing x + x (= 2x) agrees; x + x + x is REFUTED; rank 0's 2x standing for both would verify it."""
    from tvcert.engine.verify import verify

    good = _branch_plan(lambda x, ctx: x + x)
    assert "2 classes over ['cp']" in good["description"], good["description"]
    assert run_plan(load_plan(good)).equal
    res = verify(load_plan(_branch_plan(lambda x, ctx: x + x + x)))
    assert res.verdict == "REFUTED", res.reasons
    assert [o["name"] for o in res.counterexample["outputs"] if not o["equal"]] == ["y"], res.counterexample


def test_ranks_with_different_collectives_not_merged():
    """A rank whose collectives differ (an all_reduce where the others run none) has no merged form: UNKNOWN."""
    with pytest.raises(TraceError) as ei:
        _branch_plan(lambda x, ctx: ft_c.all_reduce(x, "sum", ctx.group("cp")))
    assert ei.value.kind == "spmd" and "collectives differ" in str(ei.value), ei.value


def test_causal_mask_dropped_on_the_last_rank_only_refuted():
    """``_is_causal_behavior`` patched so that only the last cp rank attends its own block unmasked: rank 0's program
    is right, so this is seen only because every rank's own program is run (REFUTED, 60-digit confirmed)."""
    import cp_attention
    from tvcert.engine.verify import verify

    res = verify(load_plan(cp_attention.tvcert_trace(cp=2, bug="last_rank_unmasked")))
    assert res.verdict == "REFUTED", res.reasons
    assert "60-digit" in res.counterexample["confirmed"], res.counterexample


def _ignored_gather_plan(take: int):
    """cp 2: every rank all-gathers 2x; rank 0 ignores the result (its program has no use for it), rank 1 keeps
    block ``take`` of it.  The logical output is [x0, 2 x0]."""
    from tvcert.frontends.mpmd import per_rank_programs

    def logical(x):
        return {"loss": x.sum(), "y": torch.cat([x[:2], 2 * x[:2]])}

    def parallel(ctx, x):
        g = ft_c.all_gather_single(2 * x, 0, ctx.group("cp"))
        y = x if ctx.coord("cp") == 0 else g[2 * take:2 * take + 2]
        return {"loss": x.sum(), "y": y}

    with per_rank_programs():
        return trace_plan(logical, parallel, mesh={"cp": 2},
                          inputs={"x": {"shape": [4], "dtype": "float64", "placement": {"cp": "Shard(0)"}}},
                          output_placements={"loss": {"cp": "Partial(sum)"}, "y": {"cp": "Shard(0)"}})


def test_collective_a_rank_ignores_is_kept():
    """Rank 0 ignores its all_gather's result, yet still sends its block: the collective stays in the merged program
    (rank 1 reads rank 0's data through it), and reading the wrong block is REFUTED."""
    from tvcert.engine.verify import verify

    good = _ignored_gather_plan(0)
    assert [n["op"] for n in good["parallel"][0]["nodes"]].count("all_gather") == 1, good["parallel"][0]["nodes"]
    assert run_plan(load_plan(good)).equal
    assert verify(load_plan(_ignored_gather_plan(1))).verdict == "REFUTED"


# ---------------------------------------------------------------- torchtitan's CP job route (H46)
def test_titan_cp_ops_convert_as_torch_computes():
    """What torchtitan's CP forward adds to the op set: RoPE's position bound (``torch._assert_async`` of
    ``torch.all(pos <= max)``: no value), ``all`` / ``any`` over dims, and the complex RoPE cache read at a 1-D
    position index (``cache[positions.squeeze(0)]``); converted, they compute what PyTorch computes (loss and
    gradient in float64)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_aten_coverage import check

    def fn(x, w, pos):
        cache = torch.view_as_complex(x)  # a buffer, as torchtitan's RoPE cache: no gradient
        torch._assert_async(torch.all(pos <= 7), "position_ids exceed max")
        rows = torch.view_as_real(cache[pos]) * w
        p2 = pos.view(2, 3)
        every = torch.all(p2 >= 2, dim=1).to(x.dtype)
        some = torch.any(p2 > 5, dim=1, keepdim=True).to(x.dtype)
        return (rows ** 2).sum() + (rows[:2, 0, 0] * every).sum() + 3 * some.sum() + every.sum()

    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, 2, dtype=torch.float64, generator=g)
    w = torch.randn(4, 2, dtype=torch.float64, generator=g)
    ops = check(fn, {"x": x, "w": w, "pos": torch.tensor([6, 1, 1, 7, 0, 3])}, params=("w",))
    assert {"index_select", "amin", "amax"} <= ops, ops


@pytest.mark.parametrize("edit, field", [
    ('spmd_backend = "partial_dtensor"', 'spmd_backend = "spmd_types"'),
    ("local_batch_size = 1", "local_batch_size = 2"),
    ('context_parallel_load_balancer = "headtail"', 'context_parallel_load_balancer = "ptrr"'),
    ('mode = "none"', 'mode = "full"'),
    ("data_parallel_shard_degree = 1", "data_parallel_shard_degree = 2"),
])
def test_titan_cp_job_outside_the_route_unknown_naming_the_field(tmp_path, edit, field):
    """A CP job the route does not trace (another backend, a per-batch positions gather, the PTRR balancer,
    checkpointing, data parallelism) is UNKNOWN naming ``context_parallel_degree`` and the field, never traced."""
    from tvcert.frontends.titan_config import check_supported, load_job

    text = (ROOT / "examples" / "torchtitan" / "llama3_debug_tp2_cp2.toml").read_text()
    assert edit in text
    p = tmp_path / "job.toml"
    p.write_text(text.replace(edit, field))
    with pytest.raises(TraceError) as ei:
        check_supported(load_job(str(p), "llama3-debug"))
    assert ei.value.kind == "unsupported" and "context_parallel_degree = 2" in str(ei.value), str(ei.value)
    assert field.split(" = ")[0].split("_degree")[0] in str(ei.value) or "mode" in field, str(ei.value)


def test_head_tail_index_block_rule_and_near_misses():
    """``zigzag_from_index_block`` on the balancer's index built as torch builds it (conform/gens_cp_index.py):
    every correct instance VERIFIED with the rule (and the interpreter agreeing on every rank); the tail chunks in
    contiguous order, an index one chunk off, rank r keeping block p-1-r, or the claim Shard(0): never VERIFIED."""
    import zlib

    import numpy as np
    from tvcert.conform.gens import Draw
    from tvcert.conform.gens_cp_index import b_cp_index
    from tvcert.conform.plans import _check_plan

    seen = set()
    for s in range(24):
        d, desc = b_cp_index(Draw(np.random.default_rng([s, zlib.crc32(b"h46")])))
        r = _check_plan(d, "zigzag_from_index_block")
        if "near miss" in desc:
            assert r.status == "refused", (desc, r.status, r.detail)
            seen.add(desc.split("near miss ")[1])
        else:
            assert r.status == "ok" and "zigzag_from_index_block" in r.rules, (desc, r.status, r.detail)
            seen.add("ok")
    assert len(seen) >= 4, seen


def _iota_positions_plan(bug: str = ""):
    """cp 2: each rank reads a table at its positions written ``arange(r*n, (r+1)*n)`` (``bug``: ``arange(0, n)``)."""
    def logical(x, cos):
        pos = torch.arange(x.shape[0])
        return {"loss": (x * cos[pos]).sum(), "y": x * cos[pos]}

    def parallel(ctx, x, cos):
        n, r = x.shape[0], ctx.coord("cp")
        pos = torch.arange(0, n) if bug else torch.arange(r * n, (r + 1) * n)
        return {"loss": (x * cos[pos]).sum(), "y": x * cos[pos]}

    return trace_plan(logical, parallel, mesh={"cp": 2},
                      inputs={"x": {"shape": [8, 4], "dtype": "float64", "placement": {"cp": "Shard(0)"}},
                              "cos": {"shape": [16, 4], "dtype": "float64"}},
                      output_placements={"loss": {"cp": "Partial(sum)"}, "y": {"cp": "Shard(0)"}})


def test_positions_written_as_a_rank_offset_iota():
    """Positions ``arange(r*n, (r+1)*n)`` are Shard(0) of the sequence's iota (``iota_rank_block``): VERIFIED;
    ``arange(0, n)`` on every rank REFUTED at the table read; the rule's near misses (conform/gens_cp_index.py
    ``b_iota_block``: the stride one off, another axis' or the global rank, the claim on another axis) never
    VERIFIED, its instances always."""
    import zlib

    import numpy as np
    from tvcert.conform.gens import Draw
    from tvcert.conform.gens_cp_index import b_iota_block
    from tvcert.conform.plans import _check_plan
    from tvcert.engine.verify import used_rules, verify

    res = verify(load_plan(_iota_positions_plan()))
    assert res.verdict == "VERIFIED" and "iota_rank_block" in used_rules(res), res.reasons
    bad = verify(load_plan(_iota_positions_plan("not_offset")))
    assert bad.verdict == "REFUTED" and bad.counterexample["first_divergence"]["op"] == "index_select"
    for s in range(16):
        d, desc = b_iota_block(Draw(np.random.default_rng([s, zlib.crc32(b"h46 iota")])))
        r = _check_plan(d, "iota_rank_block")
        if "near miss" in desc:  # refused, or not a loadable plan (the claim on dp gives another local shape)
            assert r.status in ("refused", "skip"), (desc, r.status, r.detail)
        else:
            assert r.status == "ok" and "iota_rank_block" in r.rules, (desc, r.status, r.detail)


def _gather_view_plan(batch: int):
    """tp 2: DTensor's all-gather of Shard(1) for a batch of 1 -- all_gather along 0, then a view merging the pieces
    into dim 1 (sequence parallelism under CP, torchtitan's default).  With ``batch`` 2 the same view is not a
    concatenation along dim 1 (the pieces interleave with the batch), and claiming the logical tensor must fail."""
    def logical(x):
        return {"y": 2 * x}

    def parallel(ctx, x):
        g = ft_c.all_gather_tensor(x, 0, ctx.group("tp"))
        return {"y": 2 * g.view(x.shape[0], 2 * x.shape[1], x.shape[2])}

    return trace_plan(logical, parallel, mesh={"tp": 2},
                      inputs={"x": {"shape": [batch, 8, 4], "dtype": "float64", "placement": {"tp": "Shard(1)"}}},
                      output_placements={"y": {"tp": "Replicate"}})


def test_all_gather_then_view_of_unit_leading_dims_is_the_gather_along_the_dim():
    """Batch 1: the view of the stacked pieces is their concatenation along dim 1, converted to all_gather(dim=1)
    (one collective) and VERIFIED; batch 2: not rewritten, and the interpreter differs (the pieces' rows interleave)."""
    from tvcert.engine.verify import verify

    one = _gather_view_plan(1)
    ags = [n for n in one["parallel"][0]["nodes"] if n["op"] == "all_gather"]
    assert [n["attrs"]["dim"] for n in ags] == [1], ags
    assert verify(load_plan(one)).verdict == "VERIFIED"
    two = _gather_view_plan(2)
    assert [n["attrs"]["dim"] for n in two["parallel"][0]["nodes"] if n["op"] == "all_gather"] == [0]
    assert not run_plan(load_plan(two)).equal  # the claim is false; the engine's REFUTED is its 60-digit run of this
