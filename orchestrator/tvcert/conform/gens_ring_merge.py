"""Whole-plan conformance for torch's unrolled ring attention (``ring_sigmoid_merge`` and its backward).

Plans traced from ``examples/torch/cp_attention.py`` (torch's own ``_templated_ring_attention`` and backward) with a
random cp (2 all-gather rotater, 2 / 3 / 4 all-to-all), sometimes TP x CP, and now and then one of the example's
bugs put into torch's merger (``lse_not_updated``: the backward reads the first block's lse as the row's;
``plain_average``: blocks averaged without their weights) -- near misses the rules must not verify.  A VERIFIED
plan must agree with the float64 interpreter on every rank.  Traces are cached per configuration (a few seconds
each)."""
from __future__ import annotations

import copy
import importlib
import json
import sys

from .plans import EXAMPLES, _Skip

CONFIGS = [{"cp": 2}, {"cp": 2, "tp": 2}, {"cp": 2, "rotate": "alltoall"}, {"cp": 3, "rotate": "alltoall"},
           {"cp": 4, "rotate": "alltoall"}]
BUGS = ["", "", "lse_not_updated", "plain_average"]
_CACHE: dict[str, dict] = {}


def trace_example(cfg: dict, bug: str) -> dict:
    """The traced plan of cp_attention.py, non-causal without load balancing, with ``bug`` (cached)."""
    key = json.dumps([cfg, bug], sort_keys=True)
    if key not in _CACHE:
        path = str(EXAMPLES / "torch")
        if path not in sys.path:
            sys.path.insert(0, path)
        try:
            ex = importlib.import_module("cp_attention")
            _CACHE[key] = ex.tvcert_trace(lb=False, causal=False, bug=bug, **cfg)
        except ImportError as exc:  # torch not installed
            raise _Skip(f"torch unavailable: {exc}")
    d = copy.deepcopy(_CACHE[key])
    d["name"] = "llama-" + d["name"]  # float64 oracle (exp / log have no exact rational values)
    return d


def b_unrolled_ring(dr):
    cfg, bug = dict(dr.pick(CONFIGS)), dr.pick(BUGS)
    return trace_example(cfg, bug), f"cp_attention non-causal {cfg}{' +bug ' + bug if bug else ''}"
