"""torchtitan TP + PP figures (H29, issue 16): Llama 3 debug on pp 2 x tp 2 (+ SP) from the job config, every schedule
and the pipeline bugs of examples/torch/pp_titan_tp.py, at 2 layers.  Prints, per case: trace seconds, parallel ops,
verdict, verify seconds, whether the interpreter agrees, and the first divergence of a REFUTED plan.

    TVCERT_REFUTE_SECONDS=900 python bench/titan_pp_tp.py [--layers 2] [--only 1F1B,wrong_peer,...]

The counterexample search has a 30 s wall-clock budget (engine/verify.REFUTE_SECONDS): on the loaded shared machine
the 60-digit confirming run of these ~1 250-op plans passes it and a wrong plan is UNKNOWN ("no counterexample
search past its budget"), hence the variable.  Seen (2 layers, load 8-12): 1F1B / GPipe / Interleaved1F1B VERIFIED
(trace 40-75 s, verify 1-1.4 s); wrong_peer REFUTED at the ppermute, pp_titan_tp.py's new_group line (verify 48 s);
wrong_peer without SP UNKNOWN, the interpreter agreeing (every tp rank holds the same activation: harmless, but
the engine has no rule for the shift); no_loss_scale REFUTED, blamed at the cross-entropy's ne (pp_titan_tp.py:76:
the scaled loss is explained as a scalar multiple of the logical one), verify 92 s; swapped_layers REFUTED at a mul
of stage 0 (no source line: torchtitan's frames are skipped as torch's), verify 97 s.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "torch"))

CASES = {  # name -> (pp_titan_tp.tvcert_trace kwargs, or a job config)
    "1F1B": {},
    "GPipe": {"schedule": "GPipe"},
    "Interleaved1F1B": {"job": "llama3_debug_pp2_tp2_interleaved.toml"},
    "1F1B no SP": {"sp": False},
    "wrong_peer": {"bug": "wrong_peer"},
    "wrong_peer no SP": {"bug": "wrong_peer", "sp": False},
    "no_loss_scale": {"bug": "no_loss_scale"},
    "swapped_layers": {"job": "llama3_debug_pp2_tp2_swapped_layers.toml"},
}


def trace(case: dict, layers: int) -> dict:
    import pp_titan_tp

    if "job" in case:
        from tvcert.frontends.titan_config import load_job
        from tvcert.frontends.torchtitan import trace_titan_job

        return trace_titan_job(load_job(str(ROOT / "examples" / "torchtitan" / case["job"]), "llama3-debug"),
                               layers=layers)
    return pp_titan_tp.tvcert_trace(layers=layers, **case)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    from tvcert.engine.verify import verify
    from tvcert.interp import run_plan
    from tvcert.plan import load_plan

    only = [x for x in a.only.split(",") if x]
    for name, case in CASES.items():
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        raw = trace(case, a.layers)
        t_trace = time.perf_counter() - t0
        plan = load_plan(raw)
        equal = run_plan(plan).equal
        t0 = time.perf_counter()
        res = verify(plan)
        t_verify = time.perf_counter() - t0
        ops = sum(len(p["nodes"]) for p in raw["parallel"])
        print(f"{name:18s} layers={a.layers} trace {t_trace:5.1f} s  {ops:5d} parallel ops  {res.verdict:8s} "
              f"verify {t_verify:5.1f} s  interpreter {'agrees' if equal else 'differs'}", flush=True)
        if res.counterexample and res.counterexample.get("first_divergence"):
            d = res.counterexample["first_divergence"]
            print(f"{'':18s} first divergence: {d['op']} in {d['program']} at {d['src']}", flush=True)


if __name__ == "__main__":
    main()
