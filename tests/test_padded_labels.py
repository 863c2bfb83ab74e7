"""Padded labels (-100) are in the domain tvcert proves over (H23).

Real training labels are padded with cross-entropy's ignore index.  An int input with no declared range used to
get [0, C) from its one-hot, the ignore mask was dropped and ``sum(labels != -100)`` folded to the token count, so
data parallelism where each rank divides by its own count of real tokens (the classic token-counting bug: on
padded data its loss and gradients differ from single-device) was VERIFIED.  Now the inferred range is
[-100, C), the mask is kept, the count is not a constant: the bug is REFUTED at a padded witness, the global-count
version still verifies; a declared range R (no padding) still folds the count as before.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from tvcert.engine.verify import verify  # noqa: E402
from tvcert.frontends.dataparallel import trace_ddp_plan  # noqa: E402
from tvcert.frontends.trace import TraceError, trace_plan  # noqa: E402
from tvcert.interp import make_inputs, run_plan  # noqa: E402
from tvcert.ops import Ctx  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "torch"))
from megatron_mlp import ReduceFromTP  # noqa: E402

B, C, DP = 8, 3, 2
D = torch.float64


# ------------------------------------------------------------- DDP: per-rank mean vs the global token count
def _make():
    torch.manual_seed(0)
    return nn.Linear(4, C).double()


def _rows(ctx, x, labels):  # the rank's rows, and the global count of real tokens (what a correct loop all-reduces)
    b, r = B // DP, ctx.coord("dp")
    return {"x": x[r * b:(r + 1) * b], "labels": labels[r * b:(r + 1) * b], "n": (labels != -100).sum()}


def _single(out, x, labels, n=None):
    return F.cross_entropy(out, labels)


def _local_mean(out, x, labels, n):  # BUG: each rank's mean over its own real tokens
    return F.cross_entropy(out, labels)


def _global_count(out, x, labels, n):
    return F.cross_entropy(out, labels, reduction="sum") / n.to(out.dtype) * DP  # DDP averages over DP ranks


def _ddp(rank_loss, **labels):
    return load_plan(trace_ddp_plan(_make, lambda m, ctx: DDP(m, process_group=ctx.group("dp")), _single,
                                    data={"x": {"shape": [B, 4], "dtype": "float64"},
                                          "labels": {"shape": [B], "dtype": "int", **labels}},
                                    mesh={"dp": DP}, batch=_rows, rank_loss_fn=rank_loss))


@pytest.fixture(scope="module")
def ddp_local():
    plan = _ddp(_local_mean)
    return plan, verify(plan)


def test_inferred_label_range_admits_the_padding(ddp_local):
    plan, _ = ddp_local
    (labels,) = [t for t in plan.logical.inputs if t.name == "labels"]
    assert labels.range == [-100, C]
    drawn = make_inputs(plan, plan.run_dims, 0, Ctx())["labels"]
    assert (drawn == -100).any() and set(drawn[drawn != -100].tolist()) <= set(range(C))  # torch's valid labels


def test_torch_itself_differs_on_padded_labels():
    g = torch.Generator().manual_seed(1)
    out = torch.randn(B, C, dtype=D, generator=g)
    labels = torch.tensor([0, -100, -100, -100, 1, 2, 0, 1])  # rank 0: 1 real token, rank 1: 4
    single = F.cross_entropy(out, labels)
    per_rank = (F.cross_entropy(out[:4], labels[:4]) + F.cross_entropy(out[4:], labels[4:])) / 2
    assert abs(float(single - per_rank)) > 0.1


def test_ddp_local_mean_over_padded_labels_is_refuted(ddp_local):
    plan, res = ddp_local
    assert res.verdict == "REFUTED", res.reasons
    ce = res.counterexample
    assert ce["first_divergence"]["src"].endswith(f":{_local_mean.__code__.co_firstlineno + 1}")  # the BUG line
    lab = np.asarray(ce["inputs"]["labels"]["values"])  # padded, another count of real tokens on each rank
    assert set(lab.tolist()) <= {-100, *range(C)} and (lab[:B // DP] != -100).sum() != (lab[B // DP:] != -100).sum()
    # the interpreter confirms on padded draws (some seed gives the ranks different counts)
    assert any(not run_plan(plan, seed=s).equal for s in range(4))


def test_ddp_global_count_is_not_refuted():
    plan = _ddp(_global_count)
    assert all(run_plan(plan, seed=s).equal for s in range(3))
    res = verify(plan)
    assert res.verdict == "VERIFIED", res.reasons  # 2 / n carried into the gradients (scalar_factor_commutes)
    assert "scalar_factor_commutes" in res.prover.used


# ------------------------------------------------------------- the loss alone: the pair, and an explicit mask
INPUTS = {"logits": {"shape": [B, C], "dtype": "float64", "placement": {"dp": "Shard(0)"}},
          "labels": {"shape": [B], "dtype": "int", "placement": {"dp": "Shard(0)"}}}


def _ce_parts(logits, labels):  # (summed loss, count of real tokens), torch's ignore mask
    mask = labels != -100
    return F.cross_entropy(logits, labels, reduction="sum"), mask.sum().to(D)


def _masked_parts(logits, labels):  # the same written with an explicit mask
    mask = labels != -100
    nll = F.cross_entropy(logits, torch.where(mask, labels, 0), reduction="none")
    return (nll * mask).sum(), mask.sum().to(D)


def _logical(parts):
    return lambda logits, labels: (lambda s, n: s / n)(*parts(logits, labels))


def _per_rank_mean(parts):  # BUG: each rank divides by its own count
    return lambda ctx, logits, labels: ReduceFromTP.apply(_logical(parts)(logits, labels), ctx.group("dp")) / DP


def _global(parts):
    def par(ctx, logits, labels):
        s, n = parts(logits, labels)
        return ReduceFromTP.apply(s, ctx.group("dp")) / ReduceFromTP.apply(n, ctx.group("dp"))
    return par


def _verdict(logical, parallel, inputs=INPUTS):
    plan = load_plan(trace_plan(logical, parallel, inputs=inputs, mesh={"dp": DP},
                                output_placements={"loss": {"dp": "Replicate"}}))
    return plan, verify(plan)


@pytest.mark.parametrize("parts", [_ce_parts, _masked_parts], ids=["cross_entropy", "explicit_mask"])
def test_loss_per_rank_mean_refuted_global_count_verified(parts):
    plan, res = _verdict(_logical(parts), _per_rank_mean(parts))
    assert plan.logical.inputs[1].range == [-100, C]
    assert res.verdict == "REFUTED", res.reasons
    _, res = _verdict(_logical(parts), _global(parts))
    assert res.verdict == "VERIFIED", res.reasons


def test_declared_range_without_padding_still_verifies():
    """A declared range R says the labels are never padded: the per-rank mean is then the global mean (equal
    shards, every token counted); cross-entropy's ignore mask is dropped as before (an explicit count folds:
    int_range_count, tests/test_realcode_loss_parallel.py)."""
    plan = _ddp(_local_mean, range=C)
    assert plan.logical.inputs[-1].range == C
    res = verify(plan)
    assert res.verdict == "VERIFIED", res.reasons
    assert not any(n.op == "ne" for n in plan.logical.nodes)


@pytest.mark.parametrize("bad", [[3, 3], [0.5, 3], [-1], 0, "x", [True, 3]])
def test_bad_range_is_bad_input(bad):
    with pytest.raises(TraceError) as e:
        trace_plan(_logical(_ce_parts), _global(_ce_parts), inputs={**INPUTS, "labels": {**INPUTS["labels"], "range": bad}}, mesh={"dp": DP})
    assert e.value.kind == "input" and "'labels'" in str(e.value)


@pytest.mark.parametrize("bad", [[3, 3], [5, 2], [1, 2, 3], "nosuchdim"])
def test_bad_plan_range_exits_3_naming_the_input(tmp_path, bad):
    import json

    from click.testing import CliRunner

    from tvcert.cli import main

    raw = json.loads((Path(__file__).resolve().parents[1] / "examples" / "vocab_parallel_embedding.json").read_text())
    (ids,) = [t for t in raw["logical"]["inputs"] if t["name"] == "ids"]
    ids["range"] = bad
    (tmp_path / "p.json").write_text(json.dumps(raw))
    r = CliRunner().invoke(main, ["verify", str(tmp_path / "p.json")])
    assert r.exit_code == 3 and "'ids'" in r.output, r.output


@pytest.mark.parametrize("op,c,flipped,lo", [("ne", -100, False, -100), ("eq", -1, True, -1), ("ge", 0, False, -1),
                                             ("lt", 0, False, -1), ("gt", 0, False, None), ("le", -1, False, -1),
                                             ("gt", 0, True, -1), ("ne", 5, False, None), ("lt", -0.5, False, -2),
                                             ("ne", -0.5, False, None)])
def test_low_bound_a_comparison_needs(op, c, flipped, lo):
    """lo makes ``x op c`` undecided on [lo, hi): ``labels >= 0`` means negatives occur (lo = -1)."""
    from tvcert.frontends.trace import _low_needed

    assert _low_needed(op, c, flipped) == lo
