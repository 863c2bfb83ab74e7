"""FSDP2 ``fully_shard`` traced from torch's own FSDPParamGroup code (issue 16), and the partly written buffers
it needs (frontends/buffers.py).

Buffers: each conversion is run on the reference interpreter against PyTorch's own CPU kernels (FSDP2's
``all_gather_copy_in``, ``split_with_sizes_copy``, ``chunk_cat``, ``as_strided`` windows, writes into slices of
``torch.empty``); reading an element no write reached is UNKNOWN, also after FSDP2's free.  FSDP2: one MLP
traced per configuration (module-scoped), VERIFIED (FSDP, HSDP, FSDP2 x TP, an AdamW step on the shards), its bugs
REFUTED at the op and line, and what the trace cannot see UNKNOWN naming the parameter.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed.fsdp  # noqa: E402,F401  (registers torch.ops.fsdp)

from tvcert.engine.verify import verify  # noqa: E402
from tvcert.frontends import trace  # noqa: E402
from tvcert.frontends.functional import functionalized  # noqa: E402
from tvcert.frontends.trace import TraceError, _convert, _parse_inputs, _trace_joint  # noqa: E402
from tvcert.ops import Ctx, get_op, resolve_attrs  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

EX = Path(__file__).resolve().parents[1] / "examples" / "torch"
sys.path.insert(0, str(EX))
fsdp = torch.ops.fsdp


def ir_run(fn, inputs):
    """Trace ``fn(**inputs) -> {name: tensor}`` functionalized, convert it, run the IR in float64."""
    specs = _parse_inputs({k: {"shape": list(v.shape), "dtype": "float64"} for k, v in inputs.items()}, {})
    old, trace.joint_transform = trace.joint_transform, functionalized
    try:
        gm, names = _trace_joint(fn, specs, [s.shape for s in specs])
    finally:
        trace.joint_transform = old
    nodes, outs = _convert(gm, [s.name for s in specs])
    env = {k: v.numpy().astype(np.float64) for k, v in inputs.items()}
    for nd in nodes:
        sp = get_op(nd.op)
        for o, r in zip(nd.outputs, sp.eval([env[i] for i in nd.inputs], resolve_attrs(sp, nd.attrs, {}), Ctx())):
            env[o] = np.asarray(r)
    return {n: env[o] for n, o in zip(names, outs)}


def same(fn, inputs):
    got, want = ir_run(fn, inputs), {k: v.detach().numpy() for k, v in fn(**inputs).items()}
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape and np.allclose(got[k], want[k]), k


def refused(fn, inputs, why="uninitialised"):
    with pytest.raises(TraceError) as ei:
        ir_run(fn, inputs)
    assert ei.value.kind == "unsupported" and why in str(ei.value), str(ei.value)


D = torch.float64
XS = {"a": torch.randn(3, 2, dtype=D), "b": torch.randn(4, dtype=D)}


def _copy_in(a, b, rank):  # FSDP2's all-gather copy-in: this rank's slice of a 2-rank flat buffer
    buf = torch.empty(20, dtype=D)
    return fsdp.all_gather_copy_in([a.reshape(-1), b], buf, [6, 4], 10, rank)


def test_all_gather_copy_in_written_slice_reads_and_unwritten_is_refused():
    def inp(a, b):
        shard, out = _copy_in(a, b, 1)
        return {"shard": shard * 2, "part": out[10:16].reshape(3, 2) + 1, "w": out.as_strided([2, 2], [2, 1], 16)}
    same(inp, XS)
    refused(lambda a, b: {"y": _copy_in(a, b, 1)[1][9:12] + 0}, XS)  # element 9: never written
    refused(lambda a, b: {"y": _copy_in(a, b, 0)[1] * 1}, XS)


def test_writes_into_empty_in_parts_then_full_read():
    def parts(a, b):
        buf = torch.empty(2, 5, dtype=D)
        buf[:, :2] = a[:2].t()
        buf[:1, 2:] = b[:3].view(1, 3)
        buf[1:, 2:] = b[1:].view(1, 3)
        return {"y": buf.exp()}
    same(parts, XS)

    def gap(a, b):
        buf = torch.empty(2, 5, dtype=D)
        buf[:, :2] = a[:2].t()
        buf[:1, 2:] = b[:3].view(1, 3)
        return {"y": buf[:, 1:].sum(1)}  # row 1, cols 2..4: never written
    refused(gap, XS)

    def read_written_rows(a, b):
        buf = torch.empty(3, 4, dtype=D)
        buf[1:2] = b.view(1, 4)
        return {"y": buf[1:2] * 3}
    same(read_written_rows, XS)


def test_split_with_sizes_copy_and_chunk_cat_as_their_kernels():
    def copy_out(a, b):
        ag = torch.cat([a.reshape(-1)[:3], b[:2], a.reshape(-1)[3:], b[2:]]).view(2, -1)  # 2 ranks x (3 + 2)
        w, v = torch.empty(6, dtype=D), torch.empty(4, dtype=D)
        fsdp.split_with_sizes_copy(ag, [3, 2], dim=1, out=[w.view(2, -1), v.view(2, -1)])
        return {"w": w.as_strided([3, 2], [2, 1], 0) + 0, "v": v * 1}
    same(copy_out, XS)

    def pack(a, b):
        out = torch.empty(12, dtype=D)
        fsdp.chunk_cat([a, b], dim=0, num_chunks=2, out=out.view(2, -1))
        return {"y": out * 1}
    a = torch.randn(4, 2, dtype=D)
    same(pack, {"a": a, "b": XS["b"]})


def test_freed_buffer_is_uninitialised():
    from tvcert.frontends.fsdp2 import fsdp2_tracing
    import torch.distributed.fsdp._fully_shard._fsdp_param as FP

    def use_after_free(a, b):
        buf = torch.empty(6, dtype=D)
        buf.copy_(a.reshape(-1))
        FP.free_storage(buf)
        return {"y": buf * 1}
    with fsdp2_tracing():
        refused(use_after_free, XS)

    def reuse_after_regather(a, b):
        buf = torch.empty(6, dtype=D)
        buf.copy_(a.reshape(-1))
        FP.free_storage(buf)
        FP.alloc_storage(buf)
        buf.copy_(a.reshape(-1) * 2)
        return {"y": buf * 1}
    with fsdp2_tracing():
        got = ir_run(reuse_after_regather, XS)
    assert np.allclose(got["y"], XS["a"].reshape(-1).numpy() * 2)


def test_as_strided_outside_a_contiguous_window_is_refused():
    refused(lambda a, b: {"y": a.as_strided([2, 2], [1, 2], 0) + 0}, XS, "as_strided")
    refused(lambda a, b: {"y": b.as_strided([3], [1], 2) + 0}, XS, "as_strided")
    same(lambda a, b: {"y": b.as_strided([3], [1], 1) + 0}, XS)


# ---------------------------------------------------------------- FSDP2 end to end (one trace per configuration)
CASES = {
    "fsdp": {}, "hsdp": {"mode": "hybrid_shard"}, "adamw": {"optimizer": "adamw"},
    "double_avg": {"bug": "double_avg"}, "wrong_mesh_dim": {"mode": "hybrid_shard", "bug": "wrong_mesh_dim"},
    "left_out": {"bug": "left_out"},
    # FSDP2 over TP's DTensor parameters (tp 2 x dp 2), with the optimizer step on the dp x tp shards
    # (its double_avg: bench/fsdp2_tp.py, the same line as double_avg's)
    "tp_adamw": {"mode": "fsdp_tp", "optimizer": "adamw"}, "tp_left_out": {"mode": "fsdp_tp", "bug": "left_out"},
}


@pytest.fixture(scope="module")
def plans():
    import fsdp2_mlp
    return {k: fsdp2_mlp.tvcert_trace(**kw) for k, kw in CASES.items()}


@pytest.mark.parametrize("case", ["fsdp", "hsdp", "adamw", "tp_adamw"])
def test_fully_shard_verified(plans, case):
    res = verify(load_plan(plans[case]))
    assert res.verdict == "VERIFIED", res.reasons
    ops = [n["op"] for n in plans[case]["parallel"][0]["nodes"]]
    assert "all_gather" in ops and "reduce_scatter" in ops  # FSDP2's own collectives, per parameter
    if case == "hsdp":
        assert "all_reduce" in ops
    if case == "tp_adamw":  # FSDP2's _StridedShard of TP's rows: Shard(0) on tp outside dp; dp reduce-scatters
        ins = plans[case]["inputs"]
        assert ins["up__weight"]["placement"] == {"tp": "Shard(0)", "dp": "Shard(0)"}
        assert ins["down__weight"]["placement"] == {"dp": "Shard(0)", "tp": "Shard(1)"}
        assert {n["attrs"]["axis"] for n in plans[case]["parallel"][0]["nodes"]
                if n["op"] in ("all_gather", "reduce_scatter")} == {"dp"}
        assert "reduce_scatter_avg_nested" in {r for s in res.prop.steps for r in s.rules}


def line_of(marker: str) -> str:
    path = EX / "fsdp2_mlp.py"
    for i, text in enumerate(path.read_text().splitlines(), 1):
        if marker in text:
            return f"{path.name}:{i}"
    raise AssertionError(marker)


@pytest.mark.parametrize("case,marker,names", [
    ("double_avg", "BUG double_avg", "output loss"),           # the loss line: averaged again by FSDP2
    ("wrong_mesh_dim", None, "grad_up__weight"),                # still a partial sum over the replicate dim
    ("left_out", "g / world", "grad_down__weight"),             # the hook's division, never summed
    ("tp_left_out", "g / world", "grad_down__weight")])         # TP's Shard(1) gradient never reduced over dp
def test_fully_shard_bugs_refuted(plans, case, marker, names):
    from tvcert.interp import run_plan

    plan = load_plan(plans[case])
    res = verify(plan)
    assert res.verdict == "REFUTED", res.reasons
    assert not run_plan(plan).equal
    div = res.counterexample["first_divergence"]
    assert names in div["text"]
    if marker:
        assert div["src"] == line_of(marker)
    else:
        assert "Partial(sum)" in div["text"] and "rep: Replicate" in div["text"]


def _probe_unknown(make, shard, mesh, batch=4):
    from tvcert.frontends.fsdp2 import trace_fully_shard_plan

    spec = {"shape": [batch, 4], "placement": {"dp": "Shard(0)"}}
    with pytest.raises(TraceError) as ei:
        trace_fully_shard_plan(make, shard, lambda out, x, t: ((out - t) ** 2).mean(), data={"x": spec, "t": spec},
                               mesh=mesh)
    assert ei.value.kind == "unsupported", str(ei.value)
    return str(ei.value)


def test_fully_shard_what_the_trace_cannot_see_is_unknown_naming_the_parameter():
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import fsdp2_mlp

    def uneven():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 4))

    msg = _probe_unknown(uneven, lambda m, ctx: fully_shard(m, mesh=ctx.device_mesh["dp"]), {"dp": 2})
    assert "'0.weight'" in msg and "unevenly" in msg and "keep [2, 1]" in msg
    from torch.distributed.tensor import Shard  # on dim 1 FSDP2 itself refuses: UNKNOWN, not an internal error
    msg = _probe_unknown(uneven, lambda m, ctx: fully_shard(m, mesh=ctx.device_mesh["dp"],
                                                            shard_placement_fn=lambda p: Shard(p.ndim - 1)), {"dp": 2})
    assert "uneven sharding on dim 1" in msg

    def fsdp_tp(m, ctx):  # FSDP2 over TP's DTensor parameters, on a mesh listing dp before tp
        parallelize_module(m, ctx.device_mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        return fully_shard(m, mesh=ctx.device_mesh["dp"])
    # FSDP2's _StridedShard splits TP's blocks of up's rows; a plan nesting dp outside tp cannot say so
    msg = _probe_unknown(fsdp2_mlp.MLP, fsdp_tp, {"dp": 2, "tp": 2}, batch=8)
    assert "'up.weight'" in msg and "_StridedShard" in msg

    def fsdp_on_tp(m, ctx):  # reduce-scatter over the tp dim: FSDP2 itself refuses TP's mesh as its dp mesh
        parallelize_module(m, ctx.device_mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        return fully_shard(m, mesh=ctx.device_mesh["tp"])
    msg = _probe_unknown(fsdp2_mlp.MLP, fsdp_on_tp, {"tp": 2, "dp": 2}, batch=8)
    assert "overlapping meshes" in msg and "FSDP2 at _fsdp_param.py" in msg


def test_titan_llama3_under_fully_shard_verified():
    """torchtitan's Llama 3 debug model, 1 layer, sharded by torchtitan's own apply_fsdp_to_decoder (its divide
    factor 1: summed gradients, loss over the global token count)."""
    import fsdp2_titan_llama3

    raw = fsdp2_titan_llama3.tvcert_trace()
    res = verify(load_plan(raw))
    assert res.verdict == "VERIFIED", res.reasons
    nodes = raw["parallel"][0]["nodes"]
    rs = [n for n in nodes if n["op"] == "reduce_scatter"]
    assert len(rs) == len(raw["logical"]["inputs"]) - 3 and all(n["attrs"]["reduce"] == "sum" for n in rs)
    assert raw["outputs"]["loss"]["placement"] == {"dp": "Partial(sum)"}


def test_titan_job_fsdp2_tp_verified():
    """torchtitan's own parallelize_llama on its DTensor backend (TP + SP, then FSDP2 over TP's DTensors) from the
    job config, 1 layer: VERIFIED; FSDP2 gathers and sums (divide factor 1) over fsdp only, inside TP's blocks.
    (Its local_mean bug and an AdamW step: bench/fsdp2_tp.py.)"""
    from tvcert.frontends.titan_config import load_job
    from tvcert.frontends.torchtitan import trace_titan_job

    job = load_job(str(EX.parent / "torchtitan" / "llama3_debug_fsdp2_tp2_dtensor.toml"))
    raw = trace_titan_job(job, layers=1)
    res = verify(load_plan(raw))
    assert res.verdict == "VERIFIED", res.reasons
    assert raw["inputs"]["tok_embeddings__weight"]["placement"] == {"tp": "Shard(0)", "fsdp": "Shard(0)"}
    assert raw["outputs"]["loss"]["placement"] == {"fsdp": "Partial(sum)"}
    rs = [n for n in raw["parallel"][0]["nodes"] if n["op"] == "reduce_scatter" and n["attrs"]["axis"] == "fsdp"]
    params = [o for o in raw["outputs"] if o.startswith("grad_")]
    assert len(rs) == len(params) and all(n["attrs"]["reduce"] == "sum" for n in rs)  # one per parameter


def test_titan_job_fsdp2_dtensor_what_is_not_traced(tmp_path):
    """On the DTensor backend: activation checkpointing with FSDP2 is UNKNOWN naming the field; full_dtensor too."""
    from tvcert.frontends.titan_config import load_job
    from tvcert.frontends.torchtitan import trace_titan_job

    base = (EX.parent / "torchtitan" / "llama3_debug_fsdp2_tp2_dtensor.toml").read_text()
    for text, field in [(base.replace('mode = "none"', 'mode = "full"'), "activation_checkpoint"),
                        (base.replace('"partial_dtensor"', '"full_dtensor"'), "spmd_backend")]:
        p = tmp_path / "job.toml"
        p.write_text(text)
        with pytest.raises(TraceError) as ei:
            trace_titan_job(load_job(str(p)), layers=1)
        assert ei.value.kind == "unsupported" and ei.value.op == field, str(ei.value)
