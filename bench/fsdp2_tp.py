"""FSDP2 over TP's DTensor parameters (H28): each configuration traced, verified, and for a bug confirmed by the
interpreter.  Prints per case: verdict, trace and verify seconds, parallel op count, the first divergence's
source line.  Figures, not asserts (the test suite keeps one trace per configuration it needs).

    python bench/fsdp2_tp.py            # the MLP (tp 2 x dp 2, tp 2 x rep 2 x dp 2) and torchtitan Llama 3 debug (tp 2 x fsdp 2, 1 layer)
    python bench/fsdp2_tp.py mlp        # the MLP cases only
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "torch"))

MLP = [{"mode": "fsdp_tp"}, {"mode": "fsdp_tp", "optimizer": "adamw"},
       {"mode": "fsdp_tp", "bug": "double_avg"}, {"mode": "fsdp_tp", "bug": "left_out"},
       {"mode": "hsdp_tp"}, {"mode": "hsdp_tp", "bug": "wrong_mesh_dim"}]
TITAN = [{"mode": "fsdp_tp"}, {"mode": "fsdp_tp", "optimizer": "adamw"}, {"mode": "fsdp_tp", "bug": "local_mean"}]


def run(label: str, trace) -> None:
    from tvcert.engine.verify import verify
    from tvcert.interp import run_plan
    from tvcert.plan import load_plan

    t0 = time.perf_counter()
    raw = trace()
    t1 = time.perf_counter()
    plan = load_plan(raw)
    res = verify(plan)
    t2 = time.perf_counter()
    div = (res.counterexample or {}).get("first_divergence") or {}
    confirmed = "" if res.verdict != "REFUTED" else f", interpreter differs: {not run_plan(plan).equal}"
    ops = sum(len(p["nodes"]) for p in raw["parallel"])
    print(f"{label:42s} {res.verdict:9s} trace {t1 - t0:6.1f} s  verify {t2 - t1:5.1f} s  {ops:4d} ops"
          f"{'  at ' + str(div.get('src')) + ' (' + str(div.get('op')) + ')' if div else ''}{confirmed}", flush=True)


def main(which: str = "all") -> None:
    import fsdp2_mlp
    import fsdp2_titan_llama3

    if which in ("all", "mlp"):
        for kw in MLP:
            run("mlp " + " ".join(f"{k}={v}" for k, v in kw.items()), lambda: fsdp2_mlp.tvcert_trace(**kw))
    if which in ("all", "titan"):
        for kw in TITAN:
            run("titan llama3 " + " ".join(f"{k}={v}" for k, v in kw.items()),
                lambda: fsdp2_titan_llama3.tvcert_trace(**kw))


if __name__ == "__main__":
    main(*sys.argv[1:])
