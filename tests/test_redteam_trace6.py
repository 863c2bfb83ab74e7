"""Red team round 6b (H49): buggy PyTorch programs that came out VERIFIED through ``tvcert trace --verify``.

Each class below was a false VERIFIED on main: torch itself (a real gloo group of 2 CPU processes,
``tests/data/redteam_s10_trace/gloo_run.py``) computes another loss than the single-device model, yet the traced
plan verified, because the trace or the converter did not see what torch did.  Now each is UNKNOWN naming the
reason; the correct control of the same program still VERIFIES.

* ``y.data = all_reduce(y.data)``: make_fx records no op for a ``.data`` assignment, so reads of ``y`` after it
  were converted with the old values (a second reduction invisible).  Now refused while tracing
  (``trace._data_assignment_refused``).
* ``torch.sum(x, 1, out=buf[:, :1])``: an ``out=`` variant writes into a view whose base is read later; the
  reduction's converter swallowed ``out`` (and other ops crashed on it).  Now every out= overload is UNKNOWN.
* ``where(isnan(sqrt(b)), 0, b)``: ``isnan`` / ``isinf`` / ``isfinite`` were the constant 0 / 1 whatever their
  argument; torch computes NaN / inf outside an op's domain.  Now UNKNOWN when a producer may give NaN / inf.
* ``ids.int() * 4096``: int32 arithmetic wraps around past 2**31; the IR's integers do not.  Now UNKNOWN, and so
  is a cast into int32 of an int64 value not known to fit (``(ids * 4096).int()``; a declared range, 0 / 1 values
  and their moves are known).
* orders torch leaves unspecified (``tests/data/redteam_s10_trace/sort_order.py``, eager torch): an unstable
  ``torch.sort`` whose indices are read (CPU: equal keys reordered from 32 elements on) and ``topk(sorted=False)``
  (unsorted from k = 8 on) were read as the stable / sorted order.  Now UNKNOWN.
* a program refusing ``torch.autograd.grad`` (reentrant activation checkpointing) was traced again with
  ``loss.backward()`` in the same process (``tests/data/redteam_s10_trace/first_call.py``): a forward reading a
  call counter was traced as its second call, a bug of the first call (what a real rank runs) VERIFIED.  Now the
  second trace's forward must record the ops the first recorded, else UNKNOWN.
* a collective in ``parallel_setup`` (``tests/data/redteam_s10_trace/setup_broadcast.py``: a vocab start
  ``dist.broadcast`` from rank 0, so every real rank looks up rank 0's rows): on the fake process group it moved no
  data, each traced rank kept its own start and the plan VERIFIED (``broadcast_object_list`` crashed, exit 4).  Now
  UNKNOWN naming the call (``trace._setup_collectives_refused``).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tvcert.engine.verify import verify  # noqa: E402
from tvcert.frontends.trace import TraceError, trace_plan  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "redteam_s10_trace"


def _module(name: str):
    sp = importlib.util.spec_from_file_location(f"redteam_s10_{name}", DATA / f"{name}.py")
    mod = importlib.util.module_from_spec(sp)
    sp.loader.exec_module(mod)
    return mod


MLP = _module("mlp_writes")
WHY = {  # bug -> what the UNKNOWN names
    "data_resync": ".data is assigned",
    "out_view": "out= variant",
    "nan_guard": "NaN or inf",
    "int32_offset": "torch.int32",
    "int32_cast": "into torch.int32 of a value not known to fit",
}


def _verdict(spec: dict) -> tuple[str, str]:
    try:
        res = verify(load_plan(trace_plan(**spec)))
    except TraceError as e:
        assert e.kind == "unsupported", str(e)
        return "UNKNOWN", str(e)
    return res.verdict, " ".join(map(str, res.reasons))


def test_the_bugs_change_torch_s_loss_on_a_gloo_group():
    """One gloo group of 2 forked processes runs every wrong program here that needs a real group, and the controls."""
    sys.path.insert(0, str(DATA))
    try:
        from gloo_run import run_gloo
    finally:
        sys.path.remove(str(DATA))
    cases = [("mlp_writes.py", b) for b in ["", *WHY]] + [("setup_broadcast.py", b) for b in ["", "broadcast_tensor"]] \
        + [("first_call.py", b) for b in ["", "first_call"]] + [("oov_embedding.py", b) for b in ["", "forgot_unk"]]
    got = run_gloo([(DATA / f, b) for f, b in cases])
    for f, bug in cases:
        par, ref = got[f"{f}:{bug}"]
        if bug:
            assert abs(par - ref) > 0.1 * abs(ref), (f, bug, par, ref)
        else:  # the control computes the logical loss
            assert abs(par - ref) < 1e-9 * abs(ref), (f, par, ref)


@pytest.mark.parametrize("bug", sorted(WHY))
def test_wrong_program_is_unknown_naming_why(bug):
    verdict, why = _verdict(MLP.tvcert_trace(bug))
    assert verdict == "UNKNOWN" and WHY[bug] in why, (verdict, why)


def test_correct_control_verifies():
    assert _verdict(MLP.tvcert_trace(""))[0] == "VERIFIED"


# ---------------------------------------------------------------- orders torch leaves unspecified
SORT = _module("sort_order")
SORT_WHY = {"unstable_sort": "without stable=True", "topk_unsorted": "sorted=False"}


@pytest.mark.parametrize("bug", sorted(SORT_WHY))
def test_unspecified_order_is_unknown(bug):
    par, ref = SORT.torch_losses(bug)
    assert abs(par - ref) > 0.1  # eager torch: another loss than the logical model's
    verdict, why = _verdict(SORT.tvcert_trace(bug))
    assert verdict == "UNKNOWN" and SORT_WHY[bug] in why, (verdict, why)


def test_stable_sort_and_sorted_topk_verify():
    par, ref = SORT.torch_losses("")
    assert par == ref
    assert _verdict(SORT.tvcert_trace(""))[0] == "VERIFIED"


# ---------------------------------------------------------------- collectives a rank's setup runs on the fake group
SETUP = _module("setup_broadcast")
SETUP_WHY = {"broadcast_tensor": "torch.distributed.broadcast at", "broadcast_start": "broadcast_object_list"}


@pytest.mark.parametrize("bug", sorted(SETUP_WHY))
def test_collective_in_parallel_setup_is_unknown(bug):
    verdict, why = _verdict(SETUP.tvcert_trace(bug))
    assert verdict == "UNKNOWN" and SETUP_WHY[bug] in why, (verdict, why)


def test_setup_without_collectives_verifies():
    assert _verdict(SETUP.tvcert_trace(""))[0] == "VERIFIED"


# ---------------------------------------------------------------- the second trace of a reentrant-checkpoint program
FIRST = _module("first_call")


def test_forward_differing_on_the_second_trace_is_unknown():
    verdict, why = _verdict(FIRST.tvcert_trace("first_call"))
    assert verdict == "UNKNOWN" and "recorded other ops the second time" in why, (verdict, why)


def test_reentrant_checkpoint_control_verifies():
    assert _verdict(FIRST.tvcert_trace(""))[0] == "VERIFIED"


# ---------------------------------------------------------------- an int range inferred through a where arm
OOV = _module("oov_embedding")


def _oov_declared(bug: str) -> dict:
    spec = OOV.tvcert_trace(bug)
    spec["inputs"] = {**spec["inputs"], "ids": {**spec["inputs"]["ids"], "range": OOV.GLOO_INT_HIGH}}
    return spec


def test_out_of_vocabulary_ids_bound_no_inferred_range():
    """``ids`` (no declared range) reaches the table only through ``where(ids < V, ids, 0)``: every id >= 0 is defined,
    so no range is inferred from it (it was [0, V), exactly excluding the ids where the rank program that forgets
    the UNK mapping differs on gloo, above).  Not VERIFIED: the trace asks for the range, naming the where."""
    for bug in ("", "forgot_unk"):
        with pytest.raises(TraceError, match="only through a where") as e:
            trace_plan(**OOV.tvcert_trace(bug))
        assert e.value.kind == "input"


def test_out_of_vocabulary_ids_forgotten_is_refuted_over_a_declared_range():
    """Declared [0, 2V) (gloo_run.py's draw): the forgotten UNK mapping is REFUTED, the red team's control VERIFIES."""
    assert _verdict(_oov_declared("forgot_unk"))[0] == "REFUTED"
    assert _verdict(_oov_declared(""))[0] == "VERIFIED"


def test_ignore_index_where_still_bounds_the_labels():
    """Cross-entropy's ``where(labels != -100, labels, 0)`` redirects one constant the range then holds: [-100, C)."""
    import torch.nn.functional as F

    def ce(ctx=None, *, x, labels):
        return F.cross_entropy(x.reshape(-1, 5), labels.reshape(-1), ignore_index=-100)

    plan = trace_plan(lambda x, labels: ce(x=x, labels=labels), lambda ctx, x, labels: ce(x=x, labels=labels),
                      inputs={"x": {"shape": [2, 3, 5]}, "labels": {"shape": [2, 3], "dtype": "int"}}, mesh={"dp": 1})
    assert [i.get("range") for i in plan["logical"]["inputs"]] == [None, [-100, 5]]


# ---------------------------------------------------------------- setup collectives by any name (H52)
BOUND = _module("setup_bound")
BOUND_BUGS = ["funcol", "import_bound", "pg_method"]


def test_setup_collectives_by_any_name_change_torch_s_loss_on_a_gloo_group():
    sys.path.insert(0, str(DATA))
    try:
        from gloo_run import run_gloo
    finally:
        sys.path.remove(str(DATA))
    got = run_gloo([(DATA / "setup_bound.py", b) for b in ["", *BOUND_BUGS]])
    par, ref = got["setup_bound.py:"]
    assert abs(par - ref) < 1e-9 * abs(ref), (par, ref)
    for bug in BOUND_BUGS:
        par, ref = got[f"setup_bound.py:{bug}"]
        assert abs(par - ref) > 0.1 * abs(ref), (bug, par, ref)


@pytest.mark.parametrize("bug", BOUND_BUGS)
def test_setup_collective_bound_at_import_or_through_the_group_is_unknown(bug):
    """Were VERIFIED while the refusal patched torch.distributed's module attributes; now refused at the dispatcher."""
    verdict, why = _verdict(BOUND.tvcert_trace(bug))
    assert verdict == "UNKNOWN" and "parallel_setup runs torch.distributed." in why and "broadcast" in why, (verdict, why)


def test_setup_bound_control_verifies():
    assert _verdict(BOUND.tvcert_trace(""))[0] == "VERIFIED"
