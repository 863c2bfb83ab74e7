"""reduce_scatter(avg) of a Partial(sum) (FSDP2's gradient reduce-scatter, rule reduce_scatter_avg_partial_sum):
the correct reading verifies, and every near miss -- a sum where avg was meant, a Replicate or Partial(avg) input, a
Partial(sum) on the other axis read as Replicate -- is not VERIFIED (the interpreter refutes it)."""
import pytest

from tvcert.engine.verify import verify
from tvcert.plan import load_plan


def _plan(reduce="avg", pl_in=None, pl_out=None, scale=0.5, mesh=("dp",)):
    pl_in = pl_in or {a: "Partial(sum)" for a in mesh}
    pl_out = pl_out or {"dp": "Shard(0)", **{a: "Partial(sum)" for a in mesh if a != "dp"}}
    dims = {"n": 6, "h": 3, "dp": 2, "rep": 3}
    return {"tvcert_plan": 1, "name": "rs_avg", "dims": {k: dims[k] for k in ("n", "h", *mesh)},
            "mesh": {a: a for a in mesh},
            "logical": {"inputs": [{"name": "x", "shape": ["n", "h"], "dtype": "float"}],
                        "nodes": [{"name": "y", "op": "scale", "inputs": ["x"], "attrs": {"value": scale}}],
                        "outputs": ["y"]},
            "parallel": [{"name": "p", "inputs": [{"name": "x", "shape": ["n", "h"], "dtype": "float"}],
                          "nodes": [{"name": "y", "op": "reduce_scatter", "inputs": ["x"],
                                     "attrs": {"axis": "dp", "dim": 0, "reduce": reduce}}],
                          "outputs": ["y"]}],
            "inputs": {"x": {"local": "x", "placement": pl_in}},
            "outputs": {"y": {"local": "y", "placement": pl_out}}}


def _verdict(**kw):
    res = verify(load_plan(_plan(**kw)))
    return res.verdict, res


@pytest.mark.parametrize("mesh", [("dp",), ("rep", "dp"), ("dp", "rep")])
def test_average_of_partial_sums_verifies(mesh):
    verdict, res = _verdict(mesh=mesh)
    assert verdict == "VERIFIED", res.reasons
    assert "reduce_scatter_avg_partial_sum" in {r for s in res.prop.steps for r in s.rules}


@pytest.mark.parametrize("kw", [
    {"reduce": "sum"},                                                        # a sum where the average was meant
    {"scale": 1.0},                                                           # the average read as the sum
    {"pl_in": {"dp": "Replicate"}},                                           # every rank already held E
    {"mesh": ("rep", "dp"), "pl_out": {"rep": "Replicate", "dp": "Shard(0)"}},  # the other axis's partial sum dropped
    {"mesh": ("rep", "dp"), "scale": 1 / 6},                                  # averaged over both axes
], ids=["sum", "unscaled", "replicate_input", "other_axis_dropped", "avg_both_axes"])
def test_near_misses_are_refuted(kw):
    verdict, res = _verdict(**kw)
    assert verdict == "REFUTED", res.reasons


def test_partial_avg_input_has_no_rule():
    verdict, res = _verdict(pl_in={"dp": "Partial(avg)"}, scale=0.25)  # avg of avgs: E/4, still no rule
    assert verdict != "VERIFIED"
