"""Red team round 5 (H34): what sessions 7-8 added, plans and traced code.

Each class below was a false VERIFIED on main (or a hole the brief named); per class a wrong case (the two sides
differ, or the logical side has no value, shown by torch / the interpreter) is not VERIFIED and a correct control
of the same shape still loads / verifies.

* index domains refined under a where's condition through ops that move elements (kernel/index_domain.py): the
  condition ``ids < 0`` tests element j of ids, but ``flip(ids)[j]`` or ``amax(ids)`` reads other elements, so
  ``where(ids < 0, flip(ids) + 8, flip(ids))`` over ids in [-8, v) was bounded as [0, v) and a vocab-parallel
  embedding of it VERIFIED although the logical lookup is -8 or 15 (the interpreter and torch refuse it).  Now an
  arm is recomputed under its condition through elementwise ops only: exit 3 naming the input.
* indices the range check never looked at: an int input declaring no range (any integer; the interpreter drew only
  0), ``cast(x, int)`` of a float input, topk's indices over a dim longer than the table they index.  Each
  vocab-parallel lookup of them VERIFIED, the logical lookup undefined (-100, -2, 11).  Now every input is a
  source of the analysis (a float one unbounded), topk's indices hold [0, size of their dim): exit 3.
* (a check, no fix needed) a pipeline stage whose module reads Python state another stage's layers leave behind
  (block 2 scales by 2 only if block 1 ran in its process: in the logical model it did, on the real pp rank 1 it
  did not): not VERIFIED (the stage is traced from a fresh state; REFUTED at stage 1's next matmul).
* the pipeline reference check (frontends/pipelining.py ``_check_reference_is_full_batch``) draws int inputs from
  [0, hi) only: a cross-entropy averaged per micro-batch over its real tokens, on -100-padded labels, is the mean
  of micro-batch means, not the full batch's token mean (torch: 1.289 vs 1.398), yet the step VERIFIED against the
  micro-batch reference.  Not fixed here (pipelining.py is another helper's file): the test fails until the check
  draws padded labels as the interpreter does.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from tvcert.engine.verify import verify
from tvcert.interp import RunError, run_plan
from tvcert.plan import IndexRangePlanError, load_plan

ROOT = Path(__file__).resolve().parents[1]
VPE = json.loads((ROOT / "examples" / "vocab_parallel_embedding.json").read_text())


def _n(name, op, *inputs, **attrs):
    return {"name": name, "op": op, "inputs": list(inputs), **({"attrs": attrs} if attrs else {})}


def _c(name, v):
    return {"name": name, "op": "const", "attrs": {"value": v, "dtype": "int"}}


# ------------------------------------------------------------- index domains: a where's arm through ops that move elements
def _vpe_of(pre, range_=(-8, "v")):
    """The vocab-parallel embedding example looking up ``s`` (computed from ids by ``pre``) on both sides."""
    raw = copy.deepcopy(VPE)
    for g in [raw["logical"], *raw["parallel"]]:
        for t in g["inputs"]:
            if t["name"] == "ids":
                t["range"] = list(range_)
    raw["logical"]["nodes"] = copy.deepcopy(pre) + [_n("y", "embedding", "w", "s")]
    par = raw["parallel"][0]
    for n in par["nodes"]:
        n["inputs"] = ["s" if i == "ids" else i for i in n["inputs"]]
    par["nodes"] = copy.deepcopy(pre) + par["nodes"]
    return raw


def _wrap(moved):
    """where(ids < 0, m + 8, m) with m = ``moved`` of ids (the arm reads m, the condition reads ids)."""
    return [_c("z", 0), _n("k", "lt", "ids", "z"), *moved, _n("u", "add_scalar", "m", value=8),
            _n("s", "where", "k", "u", "m")]


MOVED = {  # the arm's values come from other elements of ids than the one the condition tested
    "flip": _wrap([_n("m", "flip", "ids", dims=[0])]),
    "amax": _wrap([_n("m", "amax", "ids", dims=[0])]),
    "roll_by_slices": _wrap([_n("a", "slice", "ids", dim=0, start=1, end="n", step=1),
                             _n("b", "slice", "ids", dim=0, start=0, end=1, step=1),
                             _n("m", "concat", "a", "b", dim=0)]),
    "unsqueeze_broadcast": [_c("z", 0), _n("k", "lt", "ids", "z"), _n("m", "unsqueeze", "ids", dim=1),
                            _n("u", "add_scalar", "m", value=8), _n("s", "where", "k", "u", "m")],
}


@pytest.mark.parametrize("name", sorted(MOVED))
def test_where_arm_through_an_element_moving_op_is_bad_input(name):
    raw = _vpe_of(MOVED[name])
    raw["dims"]["n"] = 4  # the broadcast case looks up an [n, n] index: keep it small
    with pytest.raises(IndexRangePlanError, match="input 'ids'"):
        load_plan(copy.deepcopy(raw))
    for g in [raw["logical"], *raw["parallel"]]:  # the same graphs over ids in [0, v) load
        g["inputs"][0]["range"] = "v"
    if name != "unsqueeze_broadcast":  # (8 + m is out of the table there for any id)
        load_plan(raw)


def test_where_arm_through_flip_has_no_logical_value_and_the_elementwise_control_verifies():
    torch = pytest.importorskip("torch")
    ids = torch.tensor([-3, 5, 1, 7])
    f = ids.flip(0)
    s = torch.where(ids < 0, f + 8, f)  # [15, 1, 5, -3]
    with pytest.raises(IndexError):
        torch.nn.functional.embedding(s, torch.zeros(8, 3, dtype=torch.float64))
    good = _vpe_of(_wrap([_n("m", "scale", "ids", value=1)]))  # the arm reads the tested element: [0, 8)
    good["dims"]["n"] = 4
    plan = load_plan(good)
    assert verify(plan).verdict == "VERIFIED"
    raw = _vpe_of(MOVED["flip"], range_=(-8, "v"))
    for g in [raw["logical"], *raw["parallel"]]:
        g["inputs"][0]["range"] = "v"
    raw["dims"]["n"] = 4
    with pytest.raises(RunError, match="out of range"):  # the interpreter agrees with torch on the padded ids
        run_plan(load_plan(raw), inputs={"ids": ids.numpy(), "w": np.zeros((8, 3))})


# ------------------------------------------------------------- indices from a rangeless int input, a float input, topk
def _vpe_from(extra, pre, ix):
    """The vocab-parallel embedding example looking up ``ix``, computed by ``pre`` from an extra input on both sides."""
    raw = copy.deepcopy(VPE)
    if extra is None:
        for g in [raw["logical"], *raw["parallel"]]:
            g["inputs"][0].pop("range")
    else:
        for g in [raw["logical"], *raw["parallel"]]:
            g["inputs"].append(copy.deepcopy(extra))
        raw["inputs"][extra["name"]] = {"local": extra["name"]}
    raw["dims"]["m"] = 12
    raw["logical"]["nodes"] = copy.deepcopy(pre) + [_n("y", "embedding", "w", ix)]
    par = raw["parallel"][0]
    for n in par["nodes"]:
        n["inputs"] = [ix if i == "ids" else i for i in n["inputs"]]
    par["nodes"] = copy.deepcopy(pre) + par["nodes"]
    return raw


UNCHECKED = {  # (extra input, nodes, index, a value the logical index takes, its message)
    "rangeless_ids": (None, [], "ids", -100, "int input 'ids' declares no range"),
    "cast_of_a_float": ({"name": "x", "shape": ["n"]}, [_n("s", "cast", "x", dtype="int")], "s", -2, "input 'x'"),
    "topk_over_a_longer_dim": ({"name": "x", "shape": ["n", "m"]},
                               [{"outputs": ["tv", "ti"], "op": "topk", "inputs": ["x"], "attrs": {"k": 1, "dim": 1}},
                                _n("s", "reshape", "ti", shape=["n"])], "s", 11, "input 'x'.* is 11"),
}


@pytest.mark.parametrize("name", sorted(UNCHECKED))
def test_index_of_an_unchecked_source_is_bad_input(name):
    extra, pre, ix, bad, msg = UNCHECKED[name]
    raw = _vpe_from(extra, pre, ix)
    with pytest.raises(IndexRangePlanError, match=msg):
        load_plan(copy.deepcopy(raw))
    torch = pytest.importorskip("torch")
    with pytest.raises(IndexError):  # torch has no value for the logical lookup there
        torch.nn.functional.embedding(torch.tensor([bad]), torch.zeros(8, 3, dtype=torch.float64))


def test_a_rangeless_mask_that_only_selects_loads():
    # where(m != 0, ids, 0) with m an int input of no declared range: m picks, its values never reach the table
    raw = _vpe_from({"name": "m", "shape": ["n"], "dtype": "int"},
                    [_c("z", 0), _n("k", "ne", "m", "z"), _n("s", "where", "k", "ids", "z")], "s")
    load_plan(raw)
    raw["logical"]["nodes"][2] = _n("s", "where", "k", "m", "z")  # the mask itself as the index: refused
    with pytest.raises(IndexRangePlanError, match="int input 'm' declares no range"):
        load_plan(raw)


def test_topk_indices_inside_the_table_verify():
    # the control: topk over a dim of the table's size (MoE routing's expert indices) loads and verifies
    raw = _vpe_from({"name": "x", "shape": ["n", "v"]},
                    [{"outputs": ["tv", "ti"], "op": "topk", "inputs": ["x"], "attrs": {"k": 1, "dim": 1}},
                     _n("s", "reshape", "ti", shape=["n"])], "s")
    assert verify(load_plan(raw)).verdict == "VERIFIED"


def test_certificate_of_an_unchecked_index_is_not_accepted(tmp_path, monkeypatch):
    """The certificates old main wrote for these plans (forged here by loading with the check switched off) are
    refused by ``tvcert check``: it loads the plan with the same check (exit 3)."""
    from click.testing import CliRunner

    import tvcert.plan as P
    from tvcert.certificate.emit import build_certificate, dump_certificate
    from tvcert.cli import main

    plans = {"flip": _vpe_of(MOVED["flip"]), "cast": _vpe_from(*UNCHECKED["cast_of_a_float"][:3])}
    for name, raw in plans.items():
        with monkeypatch.context() as m:
            m.setattr(P, "check_index_domains", lambda *a, **k: None)
            res = verify(load_plan(copy.deepcopy(raw)))
            assert res.verdict == "VERIFIED", res.reasons  # what main said before
            cert = dump_certificate(build_certificate(res))
        (tmp_path / f"{name}.json").write_text(json.dumps(raw))
        (tmp_path / f"{name}.cert.json").write_text(cert)
        r = CliRunner().invoke(main, ["check", str(tmp_path / f"{name}.cert.json"), "--plan", str(tmp_path / f"{name}.json")])
        assert r.exit_code == 3 and ("no value there" in r.output or "does not bound" in r.output), r.output


# ------------------------------------------------------------- a pipeline stage reading state another stage leaves
_SEEN: set = set()


def test_pipeline_stage_reading_another_stages_state_is_not_verified():
    torch = pytest.importorskip("torch")
    nn, F = torch.nn, torch.nn.functional
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from tvcert.frontends.pipelining import trace_pipeline_plan
    from tvcert.frontends.trace import TraceError

    class Blk(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.i, self.lin = i, nn.Linear(4, 4)

        def forward(self, x):
            _SEEN.add(self.i)  # block 2 on the real pp rank 1 never sees block 1 run: it scales by 1, not 2
            return torch.tanh(self.lin(x)) * (2.0 if self.i - 1 in _SEEN else 1.0)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(*[Blk(i) for i in range(4)])

        def forward(self, x):
            return self.layers(x)

    def make():
        torch.manual_seed(0)
        return Model()

    def stage(model, ctx):
        s = ctx.coord("pp")
        mod = nn.Sequential(*[model.layers[i] for i in (2 * s, 2 * s + 1)])
        return PipelineStage(mod, s, 2, torch.device("cpu"), group=ctx.group("pp"),
                             input_args=torch.empty(4, 4, device="meta", requires_grad=s > 0),
                             output_args=torch.empty(4, 4, device="meta", requires_grad=True))

    mse = lambda o, t: F.mse_loss(o, t)  # noqa: E731
    m, x = make(), torch.randn(8, 4)
    _SEEN.clear()
    logical = m(x)
    _SEEN.clear()  # the real job: rank 0 runs blocks 0, 1; rank 1 (its own process) blocks 2, 3
    h = m.layers[1](m.layers[0](x))
    _SEEN.clear()
    assert (m.layers[3](m.layers[2](h)) - logical).abs().max() > 0.1
    _SEEN.clear()
    try:
        raw = trace_pipeline_plan(make, stage, lambda st, ctx: Schedule1F1B(st, n_microbatches=2, loss_fn=mse), mse,
                                  data={"x": {"shape": [8, 4]}, "target": {"shape": [8, 4]}}, mesh={"pp": 2})
    except TraceError as e:  # UNKNOWN (a rank probe naming the state) is as good
        assert e.kind == "unsupported", str(e)
        return
    res = verify(load_plan(raw))
    assert res.verdict != "VERIFIED", "a pipeline stage reading another stage's Python state was VERIFIED"



# ------------------------------------------------------------- the pipeline reference on padded labels
def test_pipeline_mean_of_micro_batch_means_on_padded_labels_is_not_verified():
    torch = pytest.importorskip("torch")
    nn, F = torch.nn, torch.nn.functional
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from tvcert.frontends.pipelining import trace_pipeline_plan
    from tvcert.frontends.trace import TraceError

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))

        def forward(self, x):
            return self.layers(x)

    def make():
        torch.manual_seed(0)
        return Model()

    def stage(model, ctx):
        s = ctx.coord("pp")
        return PipelineStage(nn.Sequential(model.layers[s]), s, 2, torch.device("cpu"), group=ctx.group("pp"),
                             input_args=torch.empty(4, 4, device="meta", requires_grad=s > 0),
                             output_args=torch.empty(4, 4, device="meta", requires_grad=True))

    ce = lambda o, t: F.cross_entropy(o, t)  # noqa: E731 - the mean over the micro-batch's real tokens
    m, x = make().double(), torch.randn(8, 4, dtype=torch.float64)
    t = torch.tensor([1, -100, -100, -100, 2, 0, 3, 1])  # padded as Hugging Face's collators pad
    full = F.cross_entropy(m(x), t)
    assert abs(full - (ce(m(x[:4]), t[:4]) + ce(m(x[4:]), t[4:])) / 2) > 0.05  # the pipeline's loss is not the model's
    try:
        raw = trace_pipeline_plan(make, stage, lambda st, ctx: Schedule1F1B(st, n_microbatches=2, loss_fn=ce), ce,
                                  data={"x": {"shape": [8, 4]}, "target": {"shape": [8], "dtype": "int",
                                                                           "range": [-100, 4]}}, mesh={"pp": 2})
    except TraceError as e:  # the reference check refusing it (UNKNOWN) is the expected outcome
        assert e.kind == "unsupported", str(e)
        return
    assert verify(load_plan(raw)).verdict != "VERIFIED", \
        "a pipeline averaging per micro-batch over padded labels was VERIFIED against the full-batch model"
