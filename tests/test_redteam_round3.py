"""Red team round 3 (H17): real PyTorch programs through the torch front end.

Each class here was a false VERIFIED on main: a conversion dropped or misread an argument or a dtype rule, so a
parallel program computing other numbers than the logical one (checked in eager float64 below) traced to the same
IR.  Per class: the conversion now equals torch (or is UNKNOWN naming the op), and an end-to-end plan whose two
sides differ only there is not VERIFIED, with its correct control still VERIFIED.

* ``div(rounding_mode=...)``: the mode was swallowed (true division).  Now trunc / floor exactly.
* bitwise ``&`` / ``|`` / ``~`` on integers were the logical ops (6 & 3 = 2, not 1).  Now UNKNOWN (bools: logical).
* bools: the IR has no bool type, so ``ids.bool()`` was the ids, ``float.bool()`` truncated (bool(0.5) is True),
  ``bool + bool`` was 2 (torch: or), ``masked_fill`` of a bool tensor with 5 held 5.  Every bool result is now
  0 / 1 (``!= 0`` unless its producer guarantees it).
* a python number written into an integer or bool tensor (``masked_fill``, ``full``, ``scatter``, ``pad``,
  ``index_put``, ``copy_``) kept its float value; torch converts it (toward zero; != 0).
* casts into 8 / 16-bit integers wrap around in torch: UNKNOWN.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from tvcert.engine.verify import verify  # noqa: E402
from tvcert.interp import run_plan  # noqa: E402
from tvcert.frontends.trace import TraceError, trace_plan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "torch"))
from test_aten_coverage import ir_run, torch_run  # noqa: E402

D = torch.float64
_g = torch.Generator().manual_seed(3)
X, W = (torch.randn(4, 6, dtype=D, generator=_g) for _ in range(2))
IDS = torch.randint(0, 7, (4, 6), generator=_g)


# (name, program(x, w, ids) -> loss): each reads an argument or dtype rule the converter used to get wrong
PROGRAMS = {
    "div_floor": lambda x, w, ids: (x * torch.div(w, 0.3, rounding_mode="floor")).sum(),
    "div_trunc": lambda x, w, ids: (x * torch.div(w * 3, w.abs() + 0.5, rounding_mode="trunc")).sum(),
    "int_floordiv": lambda x, w, ids: (x * (ids // 3)).sum(),
    "int_floordiv_neg": lambda x, w, ids: (x * torch.div(ids - 3, 2, rounding_mode="floor")).sum(),
    "int_to_bool": lambda x, w, ids: (x * ids.bool()).sum(),
    "float_to_bool": lambda x, w, ids: (x * (w * 0.3).bool()).sum(),
    "bool_add": lambda x, w, ids: (x * ((w > 0) + (w > 0.5))).sum(),
    "bool_masked_fill_5": lambda x, w, ids: (x * (w > 0).masked_fill(w < -1, 5)).sum(),
    "int_masked_fill_float": lambda x, w, ids: (x * ids.masked_fill(ids > 3, 2.7)).sum(),
    "int_masked_fill_neg": lambda x, w, ids: (x * ids.masked_fill(ids > 3, -2.7)).sum(),
    "int_full_like_bool": lambda x, w, ids: (x * torch.full_like(ids, 2, dtype=torch.bool)).sum(),
    "int_scatter_float": lambda x, w, ids: (x * ids.scatter(1, ids[:, :1] * 0, 2.7)).sum(),
    "int_pad_float": lambda x, w, ids: (x * F.pad(ids[:, 1:], (1, 0), value=2.7)).sum(),
    "copy_float_into_bool": lambda x, w, ids: (x * torch.zeros(4, 6, dtype=torch.bool).copy_(w * 0.3)).sum(),
}
UNKNOWN = {  # no exact conversion: must be UNKNOWN naming the op
    "bitand_int": (lambda x, w, ids: (x * ((ids & 2) != 0)).sum(), "aten.bitwise_and"),
    "bitor_int": (lambda x, w, ids: (x * (ids | 1)).sum(), "aten.bitwise_or"),
    "bitnot_int": (lambda x, w, ids: (x * ~ids).sum(), "aten.bitwise_not"),
    "to_uint8": (lambda x, w, ids: (x * (w * 300).to(torch.uint8)).sum(), "aten._to_copy"),
    "to_int8": (lambda x, w, ids: (x * (ids * 40).to(torch.int8)).sum(), "aten._to_copy"),
    "index_put_float_into_int": (lambda x, w, ids: (x * (ids * 1).index_put_((ids > 3,), (w * 3).sum())).sum(),
                                 "aten.index_put"),
}
ARGS = dict(x=X, w=W, ids=IDS)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_conversion_equals_torch(name):
    got, _ = ir_run(PROGRAMS[name], ARGS, ("x",))
    want = torch_run(PROGRAMS[name], ARGS, ("x",))
    for a, b in zip(got, want):
        assert np.allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), atol=1e-9), name


@pytest.mark.parametrize("name", sorted(UNKNOWN))
def test_no_exact_conversion_is_unknown(name):
    fn, op = UNKNOWN[name]
    with pytest.raises(TraceError) as ei:
        ir_run(fn, ARGS, ("x",))
    assert ei.value.kind == "unsupported" and op in str(ei.value), str(ei.value)


def test_bitwise_on_bools_is_still_logical():
    fn = lambda x, w, ids: (x * ((w > 0) & (ids > 2) | ~(w > 1))).sum()  # noqa: E731
    got, _ = ir_run(fn, ARGS, ("x",))
    assert np.allclose(got[0], torch_run(fn, ARGS, ("x",))[0])


# ---------------------------------------------------------------- end to end: the two sides differ only there
INPUTS = {"x": {"shape": [4, 6], "dtype": "float64", "param": True}, "w": {"shape": [4, 6], "dtype": "float64"},
          "ids": {"shape": [4, 6], "dtype": "int", "range": 7}}
PAIRS = {  # logical, wrong parallel (as it was converted before)
    "div_floor": (lambda x, w, ids: (x * torch.div(w, 0.3)).sum(), PROGRAMS["div_floor"]),
    "int_to_bool": (lambda x, w, ids: (x * ids).sum(), PROGRAMS["int_to_bool"]),
    "bool_add": (lambda x, w, ids: (x * ((w > 0).long() + (w > 0.5).long())).sum(), PROGRAMS["bool_add"]),
    "int_masked_fill_float": (lambda x, w, ids: (x * torch.where(ids > 3, 2.7, ids.double())).sum(),
                              PROGRAMS["int_masked_fill_float"]),
    "bitand_int": (lambda x, w, ids: (x * ((ids & 1) != 0)).sum(), UNKNOWN["bitand_int"][0]),
}


def _verdict(logical, parallel):
    try:
        return verify(load_plan(trace_plan(logical, lambda ctx, **k: parallel(**k), inputs=INPUTS,
                                           mesh={"tp": 2}))).verdict
    except TraceError as e:
        assert e.kind == "unsupported", str(e)
        return "UNKNOWN"


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_wrong_program_is_not_verified(name):
    logical, parallel = PAIRS[name]
    a, b = torch_run(logical, ARGS, ("x",)), torch_run(parallel, ARGS, ("x",))
    assert max(np.abs(u - v).max() for u, v in zip(a, b)) > 0.1  # torch itself differs
    assert _verdict(logical, parallel) != "VERIFIED"


def test_correct_control_verifies():
    assert _verdict(PROGRAMS["bool_add"], PROGRAMS["bool_add"]) == "VERIFIED"
    assert _verdict(PROGRAMS["div_floor"], PROGRAMS["div_floor"]) == "VERIFIED"


# ---------------------------------------------------------------- state left by tracing other ranks
# Every rank of a real job is its own process.  The tracer ran the ranks one after another in one process, so a
# program picking its block by a call counter (not its rank) was traced as reading blocks 0, 1 and VERIFIED, while
# in the real job every rank reads block 0.  Now each rank is traced in its own fresh process
# (frontends/rank_workers.py): every rank reads block 0, as in the real job, and the plan is REFUTED.
from megatron_mlp import ReduceFromTP  # noqa: E402

_CALLS = [0]
_CACHE: dict = {}
SHARDED = {"x": {"shape": [3, 4], "dtype": "float64"},
           "w": {"shape": [4, 5], "dtype": "float64", "param": True, "placement": {"tp": "Shard(0)"}}}


def _logical(x, w):
    return ((x @ w) ** 2).sum()


def _by_counter(ctx, x, w):
    i = _CALLS[0]  # how often this ran in this process: 0 on every rank of a real job
    _CALLS[0] += 1
    return (ReduceFromTP.apply(x[:, 2 * i:2 * i + 2] @ w, ctx.group("tp")) ** 2).sum()


def _by_rank_with_cache(ctx, x, w):
    s = _CACHE.setdefault("scale", 1.0)  # rank-independent process state: harmless
    i = ctx.coords["tp"]
    return (ReduceFromTP.apply(x[:, 2 * i:2 * i + 2] @ (w * s), ctx.group("tp")) ** 2).sum()


def test_rank_reading_state_left_by_other_ranks_is_unknown(monkeypatch):
    x = torch.randn(3, 4, dtype=D, generator=_g)
    w = torch.randn(4, 5, dtype=D, generator=_g)
    real_job = sum(x[:, :2] @ w[2 * r:2 * r + 2] for r in range(2))  # every rank's counter starts at 0
    assert ((real_job ** 2).sum() - _logical(x, w)).abs() > 0.1
    for jobs in ("1", "2"):  # one rank process at a time, and two
        monkeypatch.setenv("TVCERT_TRACE_JOBS", jobs)
        _CALLS[0] = 0
        plan = load_plan(trace_plan(_logical, _by_counter, inputs=SHARDED, mesh={"tp": 2}))
        assert verify(plan).verdict == "REFUTED", jobs  # every rank reads block 0, as in the real job
        assert not run_plan(plan, seed=0).equal
    _CACHE.clear()
    assert verify(load_plan(trace_plan(_logical, _by_rank_with_cache, inputs=SHARDED,
                                       mesh={"tp": 2}))).verdict == "VERIFIED"


# ---------------------------------------------------------------- pipelines: the micro-batch reference
# trace_pipeline_plan's reference is the combine ("mean" / "sum") of the micro-batch losses.  combine="sum" with
# a loss that is a mean per micro-batch (scale_grads=False, the step summing the losses) trains with n_mb times the
# single-device gradient and was VERIFIED against that sum.  Now the reference is tested against the full-batch
# model (float64, random weights and inputs) first: a mismatch is UNKNOWN.
def _pp_plan(per_microbatch_mean: bool):
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from pp_mlp import MLP, B, H, L
    from tvcert.frontends.pipelining import trace_pipeline_plan

    pp, nmb = 2, 4

    def make():
        torch.manual_seed(0)
        return MLP()

    def stage(model, ctx):
        s, k = ctx.coord("pp"), L // pp
        mod = nn.Sequential(*list(model.layers)[s * k:(s + 1) * k])
        x_in = torch.empty(B // nmb, H, device="meta", requires_grad=s > 0)
        out = torch.empty(B // nmb, H, device="meta", requires_grad=True)
        return PipelineStage(mod, s, pp, torch.device("cpu"), input_args=x_in, output_args=out, group=ctx.group("pp"))

    def loss_fn(out, target):  # a mean per micro-batch, or a sum normalised by the whole batch's elements
        return F.mse_loss(out, target) if per_microbatch_mean else F.mse_loss(out, target, reduction="sum") / (B * H)

    def step(sch, ctx, x, target):
        s = ctx.coord("pp")
        last = s == pp - 1
        losses = []
        sch.step(*(x,) if s == 0 else (), target=target if last else None, losses=losses if last else None)
        return torch.stack(losses).sum() if last else None

    spec = {"shape": [B, H]}
    return trace_pipeline_plan(make, stage, lambda st, ctx: Schedule1F1B(st, n_microbatches=nmb, loss_fn=loss_fn,
                                                                        scale_grads=False),
                               loss_fn, data={"x": spec, "target": spec}, mesh={"pp": pp}, step=step, combine="sum")


def test_pipeline_sum_of_microbatch_means_is_not_verified():
    from pp_mlp import MLP, B, H

    torch.manual_seed(0)
    m = MLP().double()
    x, t = torch.randn(B, H, dtype=D, generator=_g), torch.randn(B, H, dtype=D, generator=_g)
    full = F.mse_loss(m(x), t)  # the single-device step; the pipeline's is the sum of the 4 micro-batch means
    assert (sum(F.mse_loss(m(a), b) for a, b in zip(x.chunk(4), t.chunk(4))) - full).abs() > 0.1
    with pytest.raises(TraceError) as ei:
        _pp_plan(per_microbatch_mean=True)
    assert ei.value.kind == "unsupported" and "not the full-batch model" in str(ei.value), str(ei.value)


def test_pipeline_loss_normalised_by_the_whole_batch_verifies():
    assert verify(load_plan(_pp_plan(per_microbatch_mean=False))).verdict == "VERIFIED"
