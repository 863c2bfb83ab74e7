"""Whole-plan conformance for torch's unrolled ring attention (``ring_sigmoid_merge`` and its backward).

Plans traced from ``examples/torch/cp_attention.py`` (torch's own ``_templated_ring_attention`` and backward) with a
random cp (2 all-gather rotater, 2 / 3 / 4 all-to-all), sometimes TP x CP, and now and then one of the example's
bugs put into torch's merger (``lse_not_updated``: the backward reads the first block's lse as the row's;
``plain_average``: blocks averaged without their weights) -- near misses the rules must not verify.  The causal ring
(``ring_masked_merge`` and its backward, per-rank programs merged) the same way, with its own near misses.  A VERIFIED
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


def trace_example(cfg: dict, bug: str, causal: bool = False) -> dict:
    """The traced plan of cp_attention.py with ``bug`` (cached): non-causal without load balancing, or causal
    (``cfg`` may set ``lb``)."""
    key = json.dumps([cfg, bug, causal], sort_keys=True)
    if key not in _CACHE:
        path = str(EXAMPLES / "torch")
        if path not in sys.path:
            sys.path.insert(0, path)
        try:
            ex = importlib.import_module("cp_attention")
            kw = {"lb": False, **cfg}
            _CACHE[key] = ex.tvcert_trace(causal=causal, bug=bug, **kw)
        except ImportError as exc:  # torch not installed
            raise _Skip(f"torch unavailable: {exc}")
    d = copy.deepcopy(_CACHE[key])
    d["name"] = "llama-" + d["name"]  # float64 oracle (exp / log have no exact rational values)
    return d


def b_unrolled_ring(dr):
    cfg, bug = dict(dr.pick(CONFIGS)), dr.pick(BUGS)
    return trace_example(cfg, bug), f"cp_attention non-causal {cfg}{' +bug ' + bug if bug else ''}"


# torch's causal ring (ring_masked_merge): contiguous blocks or the head-tail load balancer, with TP; near misses:
# the last rank's diagonal block unmasked, a future block attended instead of skipped, the kernel's mask one key off
# its diagonal, the load balancer's ring on contiguous data (chunks never put in head-tail order)
CAUSAL_CONFIGS = [{"cp": 2, "lb": False}, {"cp": 2, "lb": True}, {"cp": 2, "lb": False, "tp": 2}]
CAUSAL_BUGS = ["", "", "last_rank_unmasked", "future_block_attended", "mask_diagonal_shifted", "lb_order"]


def b_causal_ring(dr):
    cfg, bug = dict(dr.pick(CAUSAL_CONFIGS)), dr.pick(CAUSAL_BUGS)
    if bug in ("lb_order", "future_block_attended"):
        cfg["lb"] = bug == "lb_order"  # the load-balanced ring skips no block
    return trace_example(cfg, bug, causal=True), f"cp_attention causal {cfg}{' +bug ' + bug if bug else ''}"
