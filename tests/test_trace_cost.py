"""Tracing cost (issue 16): each rank traced in its own fresh process (frontends/rank_workers.py); two at a time give
exactly the plan -- or exactly the error -- of one at a time, also when one rank (rank 5 of a dp 2 x tp 4 mesh) runs
a different program; the source locations read off the live frames name the user's lines."""
from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "torch"))
from megatron_mlp import CopyToTP, ReduceFromTP  # noqa: E402 (Megatron's f and g)

from tvcert.engine.verify import verify  # noqa: E402
from tvcert.frontends import trace as T  # noqa: E402
from tvcert.frontends.trace import TraceError, trace_plan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

B, H, F = 2, 4, 8
MESH = {"dp": 2, "tp": 4}
INPUTS = {"x": {"shape": [B * 2, H], "placement": {"dp": "Shard(0)"}},
          "w1": {"shape": [H, F], "placement": {"tp": "Shard(1)"}, "param": True},
          "w2": {"shape": [F, H], "placement": {"tp": "Shard(0)"}, "param": True}}


def logical(x, w1, w2):
    return (torch.tanh(x @ w1) @ w2).pow(2).sum()


_SEEN: list = []  # the ranks traced in this process (each rank's own process: its rank alone)


def mlp(ctx, x, w1, w2, bug=None):
    _SEEN.append(ctx.rank)
    g = ctx.group("tp")
    h = CopyToTP.apply(x, g) @ w1  # LINE_MATMUL
    if bug == "extra_op" and ctx.rank == 5:
        h = h * 1.0
    scale = 2.0 if bug == "scale" and ctx.rank == 5 else 1.0
    y = ReduceFromTP.apply(torch.tanh(h) @ w2, g) * scale
    if bug == "crash" and ctx.rank in (5, 6):
        raise ValueError(f"rank {ctx.rank} fails")
    if bug == "print":
        print(f"hello from rank {ctx.rank}")
    if bug == "exit" and ctx.rank == 3:
        import os

        os._exit(0)
    return y.pow(2).sum()


def dp_sum(ctx, grads):
    return {p: funcol.all_reduce(gr, "sum", ctx.group("dp")) for p, gr in grads.items()}


def traced(jobs, bug=None):
    old = T.rank_jobs
    T.rank_jobs = jobs
    stats = {}
    old_hook, T.stats_hook = T.stats_hook, stats.update
    try:
        plan = trace_plan(logical, lambda ctx, **kw: mlp(ctx, bug=bug, **kw), inputs=INPUTS, mesh=MESH,
                          grad_sync=dp_sum, output_placements={"loss": {"dp": "Partial(sum)"}})
        return plan, stats
    finally:
        T.rank_jobs = old
        T.stats_hook = old_hook


@pytest.fixture(scope="module")
def sequential():
    return traced(1)


def test_workers_give_the_sequential_plan(sequential):
    from tvcert.frontends.rank_workers import channel

    plan1, st1 = sequential
    got: list = []
    ticks: list = []
    old, T.progress_hook = T.progress_hook, ticks.append
    try:
        with channel(lambda: list(_SEEN), got.append):
            plan2, st2 = traced(2)
    finally:
        T.progress_hook = old
    assert got == [[r] for r in range(8)] and _SEEN == []  # a fresh process per rank, none traced here
    # each rank's own progress, relayed from its process as it says it, and the ranks taken
    assert all(any(t.startswith(f"tracing rank {r}/8 ") for t in ticks) for r in range(1, 9)), ticks
    assert "traced 8/8 ranks" in ticks, ticks
    assert (st1["world"], st1["traced_ranks"], st1["jobs"]) == (8, 8, 1)
    assert (st2["world"], st2["traced_ranks"], st2["jobs"]) == (8, 8, 2)
    assert st2["rank_trace_s"] > 0 and st2["rank_setup_s"] >= 0  # measured in the workers, summed here
    assert json.dumps(plan1, sort_keys=True) == json.dumps(plan2, sort_keys=True)
    assert verify(load_plan(plan2)).verdict == "VERIFIED"


def test_source_lines_are_the_users(sequential):
    plan, _ = sequential
    line = next(i for i, text in enumerate(inspect.getsource(inspect.getmodule(mlp)).splitlines(), 1)
                if "# LINE_MATMUL" in text)
    mms = [n for n in plan["parallel"][0]["nodes"] if n["op"] == "matmul"]
    assert mms and mms[0].get("src") == f"test_trace_cost.py:{line}"
    nodes = plan["parallel"][0]["nodes"]
    assert all(n.get("src", "").startswith("test_trace_cost.py:") for n in nodes if n["op"] in ("matmul", "tanh"))
    assert all(n.get("src", "").startswith(("megatron_mlp.py:", "test_trace_cost.py:"))  # f / g, the dp sync
               for n in nodes if n["op"] == "all_reduce")


@pytest.mark.parametrize("bug", ["extra_op", "scale", "crash"])
def test_rank_5_differs_and_is_never_verified(bug):
    """Rank 5 alone runs another program: the same error from the workers as from the sequential loop, naming
    rank 5 (coordinates dp 1, tp 1) -- never a plan that verifies."""
    errs = []
    for jobs in (1, 3):
        with pytest.raises(TraceError) as ei:
            traced(jobs, bug)
        errs.append((str(ei.value), ei.value.kind, ei.value.op, ei.value.src))
    assert errs[0] == errs[1]
    msg, kind = errs[0][:2]
    assert kind == ("crash" if bug == "crash" else "spmd")
    assert "(1, 1)" in msg or "rank 5" in msg


def test_worker_output_reaches_the_parent(capfd):
    traced(2, "print")
    out = capfd.readouterr().out
    assert all(f"hello from rank {r}" in out for r in range(8))


def test_a_rank_that_ends_its_worker_is_bad_input():
    """A rank's ``os._exit`` ends its own process only."""
    with pytest.raises(TraceError) as ei:
        traced(2, "exit")
    assert ei.value.kind == "input" and "rank 3 exited with status 0" in str(ei.value)


def test_bad_jobs_setting_is_bad_input(monkeypatch):
    monkeypatch.setenv("TVCERT_TRACE_JOBS", "many")
    with pytest.raises(TraceError) as ei:
        traced(None)
    assert ei.value.kind == "input" and "TVCERT_TRACE_JOBS" in str(ei.value)


SPEC = '''
import torch
import torch.distributed._functional_collectives as funcol


def tvcert_trace():
    def logical(x, w):
        return (x @ w).pow(2).sum()

    def parallel(ctx, x, w):
        return (x @ w).pow(2).sum()

    return dict(logical=logical, parallel=parallel, mesh={"dp": 4}, output_placements={"loss": {"dp": "Partial(sum)"}},
                inputs={"x": {"shape": [8, 4], "placement": {"dp": "Shard(0)"}}, "w": {"shape": [4, 4], "param": True}},
                grad_sync=lambda ctx, g: {p: funcol.all_reduce(t, "sum", ctx.group("dp")) for p, t in g.items()})
'''


def test_cli_jobs(tmp_path):
    from click.testing import CliRunner

    from tvcert.cli import main

    spec = tmp_path / "dp_spec.py"
    spec.write_text(SPEC)
    r = CliRunner().invoke(main, ["trace", str(spec), "--jobs", "2", "--verify", "-q"])
    assert r.exit_code == 0, r.output
    assert "VERIFIED" in r.output
    r = CliRunner().invoke(main, ["trace", str(spec), "--jobs", "0", "--verify", "-q"])
    assert r.exit_code == 3


# ---------------------------------------------------------------- a layer that differs (layer 3 of 4)
DEPTH = 4
LAYER_INPUTS = {"x": {"shape": [B, H]},
                **{f"w{i}_{k}": {"shape": [H, F] if k == "a" else [F, H],
                                 "placement": {"tp": "Shard(1)" if k == "a" else "Shard(0)"}, "param": True}
                   for i in range(DEPTH) for k in "ab"}}


def deep_logical(x, **w):
    for i in range(DEPTH):
        x = x + torch.tanh(x @ w[f"w{i}_a"]) @ w[f"w{i}_b"]
    return x.pow(2).sum()


def deep_tp(ctx, x, bad_layer=None, **w):
    g = ctx.group("tp")
    for i in range(DEPTH):
        y = torch.tanh(CopyToTP.apply(x, g) @ w[f"w{i}_a"]) @ w[f"w{i}_b"]
        x = x + (y if i == bad_layer else ReduceFromTP.apply(y, g))  # layer 3 forgets its row-parallel all_reduce
    return x.pow(2).sum()


def test_layer_3_that_differs_is_refuted():
    """Four identical-looking layers, layer 3 without its all_reduce: REFUTED (the interpreter confirms it), with
    workers as without -- what any shortcut over repeated layers would have to keep."""
    from tvcert.interp import run_plan

    ok = trace_plan(deep_logical, deep_tp, inputs=LAYER_INPUTS, mesh={"tp": 2})
    assert verify(load_plan(ok)).verdict == "VERIFIED"
    for jobs in (1, 2):
        T.rank_jobs = jobs
        try:
            bad = trace_plan(deep_logical, lambda ctx, **kw: deep_tp(ctx, bad_layer=3, **kw), inputs=LAYER_INPUTS,
                             mesh={"tp": 2})
        finally:
            T.rank_jobs = None
        plan = load_plan(bad)
        res = verify(plan)
        assert res.verdict == "REFUTED"
        assert not run_plan(plan, seed=0).equal


class _Block(torch.nn.Module):
    def __init__(self, bad: bool):
        super().__init__()
        self.bad = bad  # a per-layer attribute: layer 3 alone forgets its row-parallel all_reduce

    def forward(self, x, g, wa, wb):
        y = torch.tanh(CopyToTP.apply(x, g) @ wa) @ wb
        return x + (y if self.bad else ReduceFromTP.apply(y, g))


class _Deep(torch.nn.Module):
    def __init__(self, bad_layer=None):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block(i == bad_layer) for i in range(DEPTH))

    def forward(self, ctx, x, **w):
        for i, blk in enumerate(self.layers):
            x = blk(x, ctx.group("tp"), w[f"w{i}_a"], w[f"w{i}_b"])
        return x.pow(2).sum()


def test_layer_labels_let_the_engine_reuse_a_layer_and_keep_a_differing_one():
    """Ops inside ``layers.N`` carry the label ``layers.N``: the engine derives a repeated layer once and replays
    it (kernel/memo.py compares the whole canonical form); layer 3 whose module attribute drops its all_reduce is
    still REFUTED, interpreter-confirmed, and the verdicts are those of the plan without labels."""
    from tvcert.interp import run_plan

    def verdicts(plan):
        bare = json.loads(json.dumps(plan))
        for n in bare["parallel"][0]["nodes"]:
            n.pop("layer", None)
        return verify(load_plan(plan)), verify(load_plan(bare)).verdict

    ok = trace_plan(deep_logical, _Deep(), inputs=LAYER_INPUTS, mesh={"tp": 2})
    labels = [n.get("layer") for n in ok["parallel"][0]["nodes"]]
    assert {f"layers.{i}" for i in range(DEPTH)} <= set(labels)
    res, bare = verdicts(ok)
    assert (res.verdict, bare) == ("VERIFIED", "VERIFIED")
    assert res.stats["distinct_stages"] < res.stats["stages"]
    bad = trace_plan(deep_logical, _Deep(bad_layer=3), inputs=LAYER_INPUTS, mesh={"tp": 2})
    res, bare = verdicts(bad)
    assert (res.verdict, bare) == ("REFUTED", "REFUTED")
    assert not run_plan(load_plan(bad), seed=0).equal
