"""torchtitan Qwen3 debug from its job tomls (examples/torchtitan/qwen3_debug_*.toml), correct and with a wrong
sharding declaration, for `tvcert trace`:

    tvcert trace examples/torch/tp_titan_qwen3.py --verify                                  # TP 2 + SP: VERIFIED
    tvcert trace examples/torch/tp_titan_qwen3.py --set bug=w2_output_replicate --verify    # REFUTED
    tvcert trace examples/torch/tp_titan_qwen3.py --set job=fsdp2_tp2 --set bug=w2_output_replicate --verify

The job is traced as ``tvcert trace --torchtitan qwen3-debug --config`` traces it (tvcert.frontends.torchtitan:
torchtitan's ``set_qwen3_sharding_config`` and ``Module.parallelize``; with data parallelism through SimpleFSDP).

* ``w2_output_replicate``: layer 0's rowwise FFN ``w2`` declares its output Replicate on tp instead of torchtitan's
  Partial (``out_src_shardings``), so the redistribution to the sequence-parallel activation is a local slice of
  each rank's partial sum instead of a reduce-scatter: the classic missing reduction after a rowwise linear.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

JOBS = Path(__file__).resolve().parents[1] / "torchtitan"


def _w2_output_replicate(cfg):
    import spmd_types as spmd
    from torchtitan.distributed.parallel_dims import MeshAxisName

    w2 = cfg.layers[0].feed_forward.w2
    out = w2.sharding_config.out_src_shardings
    types_ = dict(out.axis_types)
    types_[MeshAxisName.TP] = spmd.R  # BUG w2_output_replicate: torchtitan declares P (a pending sum)
    w2.sharding_config = dataclasses.replace(w2.sharding_config,
                                             out_src_shardings=dataclasses.replace(out, axis_types=types_))
    return cfg


BUGS = {"w2_output_replicate": _w2_output_replicate}


def tvcert_trace(bug: str = "", layers: int = 1, job: str = "tp2"):
    from tvcert.frontends.titan_config import load_job
    from tvcert.frontends.torchtitan import qwen3_debug, trace_titan_job

    if bug and bug not in BUGS:
        raise ValueError(f"bug must be one of {sorted(BUGS)}")
    spec = load_job(str(JOBS / f"qwen3_debug_{job}.toml"), "qwen3-debug")
    model = qwen3_debug(layers=layers)
    if bug:
        base = model.config

        def config(tp=1, sp=False, vocab_parallel=True, ep=1):
            cfg = base(tp, sp, vocab_parallel, ep)
            return BUGS[bug](cfg) if tp > 1 else cfg  # the logical model (tp = 1) is torchtitan's

        model.config = config
    return trace_titan_job(spec, model=model, name=f"tp_titan_qwen3_{job}{'_' + bug if bug else ''}")
