"""torchtitan Qwen3 debug under TP 2 + SP (examples/torchtitan/qwen3_debug_tp2.toml), correct and with a wrong
sharding declaration, for `tvcert trace`:

    tvcert trace examples/torch/tp_titan_qwen3.py --verify                                  # VERIFIED
    tvcert trace examples/torch/tp_titan_qwen3.py --set bug=w2_output_replicate --verify    # REFUTED

The job is traced as ``tvcert trace --torchtitan qwen3-debug --config`` traces it (tvcert.frontends.torchtitan:
torchtitan's ``set_qwen3_sharding_config`` and ``Module.parallelize`` on the ``spmd_types`` backend).

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

    sc = cfg.layers[0].feed_forward.w2.sharding_config
    out = sc.out_src_shardings
    types_ = dict(out.axis_types)
    types_[MeshAxisName.TP] = spmd.R  # BUG w2_output_replicate: torchtitan declares P (a pending sum)
    cfg.layers[0].feed_forward.w2.sharding_config = dataclasses.replace(
        sc, out_src_shardings=dataclasses.replace(out, axis_types=types_))
    return cfg


BUGS = {"w2_output_replicate": _w2_output_replicate}


def tvcert_trace(bug: str = "", layers: int = 1):
    from tvcert.frontends.titan_config import load_job
    from tvcert.frontends.torchtitan import qwen3_debug, trace_titan

    if bug and bug not in BUGS:
        raise ValueError(f"bug must be one of {sorted(BUGS)}")
    job = load_job(str(JOBS / "qwen3_debug_tp2.toml"), "qwen3-debug")
    model = qwen3_debug(layers=layers)
    if bug:
        base = model.config

        def config(tp=1, sp=False, vocab_parallel=True, ep=1):
            cfg = base(tp, sp, vocab_parallel, ep)
            return BUGS[bug](cfg) if tp > 1 else cfg  # the logical model (tp = 1) is torchtitan's

        model.config = config
    p = job.parallelism
    return trace_titan(model, tp=p.tensor_parallel_degree, sp=p.enable_sequence_parallel,
                       batch=job.training.local_batch_size, seq=job.training.seq_len,
                       name=f"tp_titan_qwen3{'_' + bug if bug else ''}")
