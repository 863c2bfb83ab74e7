"""Context parallelism through torch's own ring attention (examples/torch/cp_attention.py, or with ``"example":
"cp_context_parallel"`` torch's public ``context_parallel()``): trace and verify seconds, ops in the merged per-rank
program, verdict, per configuration.  Figures, not asserts.

    python bench/cp_ring.py                 # the default sweep (non-causal and causal VERIFIED, cp 2 / 4 / 8, x tp 2, bugs)
    python bench/cp_ring.py '{"cp": 4, "tp": 2, "rope": true}' '{"example": "cp_context_parallel", "cp": 4}'
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "torch"))

SWEEP = [{"cp": 2, "lb": False, "causal": False}, {"cp": 4, "lb": False, "causal": False, "rotate": "alltoall"},
         {"cp": 2, "tp": 2, "lb": False, "causal": False},
         {"cp": 2, "lb": False, "causal": False, "bug": "plain_average"},
         {"cp": 2, "lb": False}, {"cp": 4, "lb": False}, {"cp": 2, "tp": 2, "lb": False}, {"cp": 2}, {"cp": 4},
         {"cp": 2, "tp": 2}, {"cp": 4, "tp": 2}, {"cp": 8, "lb": False}, {"cp": 2, "lb": False, "bug": "future_block_attended"},
         {"cp": 2, "lb": False, "bug": "mask_diagonal_shifted"}, {"cp": 4, "bug": "last_rank_unmasked"},
         {"cp": 2, "rope": True}, {"cp": 4, "rope": True}, {"cp": 2, "tp": 2, "rope": True},
         {"cp": 4, "tp": 2, "rope": True}, {"cp": 2, "tp": 2, "bug": "positions_not_offset"},
         {"cp": 4, "bug": "positions_not_offset"}, {"cp": 4, "bug": "lb_order"},
         {"cp": 4, "lb": False, "bug": "lse_not_updated"},
         {"cp": 4, "lb": False, "rotate": "alltoall", "bug": "dkv_backwards"},
         {"example": "cp_context_parallel", "cp": 2, "tp": 2},
         {"example": "cp_context_parallel", "cp": 2, "tp": 2, "bug": "positions_not_offset"}]


def one(kw: dict) -> str:
    import importlib

    from tvcert.engine.verify import verify
    from tvcert.plan import load_plan

    args = dict(kw)
    example = importlib.import_module(args.pop("example", "cp_attention"))
    t0 = time.perf_counter()
    plan = example.tvcert_trace(**args)
    t1 = time.perf_counter()
    res = verify(load_plan(plan))
    t2 = time.perf_counter()
    where = ""
    if res.verdict == "REFUTED":
        fd = res.counterexample.get("first_divergence") or {}
        where = f" at {fd.get('op')} {fd.get('src')}"
    return (f"{json.dumps(kw):60s} {len(plan['parallel'][0]['nodes']):5d} ops  trace {t1 - t0:5.1f} s  "
            f"verify {t2 - t1:4.1f} s  {res.verdict}{where}")


if __name__ == "__main__":
    for kw in ([json.loads(a) for a in sys.argv[1:]] or SWEEP):
        print(one(kw), flush=True)
