"""The converter's -inf masked softmax in float64 (H24): torchtitan's Llama 3 debug model with its own causal SDPA
(``is_causal=True``: the CPU flash kernel's decomposition, a -inf mask through the converter's extended-real
``_safe_softmax``), under DDP.  Prints the logical loss in float64 and in 60 digits on the same random inputs, the
worst relative difference over every logical output, and the verdict.  Figures, not asserts.

    python bench/masked_softmax_float64.py            # dp 2, 1 layer, seed 0
    python bench/masked_softmax_float64.py 4          # seed 4 (2 layers exceed the 60-digit run's work budget)
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "torch"))


def main(seed: int = 0, layers: int = 1) -> None:
    import ddp_titan_llama3 as ex
    import tvcert.frontends.torchtitan as titan
    from tvcert.engine.verify import verify
    from tvcert.interp import run_plan
    from tvcert.plan import load_plan

    def native_build(cfg):  # torchtitan's own attention forward, not the finite-mask one _build installs
        import torch

        with torch.device("meta"):
            return cfg.build()

    titan._build = native_build
    t = time.perf_counter()
    plan = load_plan(ex.tvcert_trace(layers=layers))
    print(f"traced in {time.perf_counter() - t:.1f} s: {len(plan.logical.nodes)} logical ops")
    f = run_plan(plan, seed=seed)
    d = run_plan(plan, seed=seed, inputs=f.inputs, decimal=True)
    loss = plan.logical.outputs[0]
    print(f"logical loss: float64 {float(f.logical[loss])!r}, 60 digits {float(d.logical[loss])!r}")
    worst = 0.0
    for o in plan.logical.outputs:
        a = np.asarray(f.logical[o], dtype=np.float64)
        b = np.asarray(d.logical[o].astype(float), dtype=np.float64)
        worst = max(worst, float(np.max(np.abs(a - b) / (1 + np.abs(a) + np.abs(b)))))
    print(f"worst |float64 - 60 digits| / (1 + |a| + |b|), {len(plan.logical.outputs)} logical outputs: {worst:.3g}")
    t = time.perf_counter()
    print(f"verdict {verify(plan).verdict} in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
