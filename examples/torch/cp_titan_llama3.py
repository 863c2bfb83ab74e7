"""torchtitan Llama 3 debug under TP 2 x CP 2 (examples/torchtitan/llama3_debug_tp2_cp2.toml), correct and with the
classic context-parallel bug, for `tvcert trace`:

    tvcert trace examples/torch/cp_titan_llama3.py --verify                               # VERIFIED
    tvcert trace examples/torch/cp_titan_llama3.py --set bug=positions_not_offset --verify  # REFUTED at the RoPE read
    tvcert trace examples/torch/cp_titan_llama3.py --set sp=true --verify                 # TP + SP x CP: VERIFIED

The job is traced as ``tvcert trace --torchtitan llama3-debug --config`` traces it (tvcert.frontends.titan_cp:
torchtitan's ``apply_cp_to_forward`` and ``Module.parallelize`` on the ``partial_dtensor`` backend, the batch as
``prepare_context_parallel_input`` leaves it on each rank).

* ``positions_not_offset``: the training step calls the model without the sharded ``positions`` (as a trainer that
  forgets to forward ``extra_kwargs["positions"]`` does), so torchtitan's RoPE reads its cache at the prefix
  ``cache[0:seq/cp]`` on every cp rank: each rank rotates its head and tail chunks as if they began the sequence.
  The first divergence is that read (``_reshape_for_broadcast``, module ``layers.0.attention.rope``).
"""
from __future__ import annotations

from pathlib import Path

JOBS = Path(__file__).resolve().parents[1] / "torchtitan"


def tvcert_trace(bug: str = "", layers: int = 1, sp: bool = False):
    from tvcert.frontends.titan_config import load_job
    from tvcert.frontends.torchtitan import trace_titan_job

    job = load_job(str(JOBS / ("llama3_debug_tp2_sp_cp2.toml" if sp else "llama3_debug_tp2_cp2.toml")), "llama3-debug")
    return trace_titan_job(job, layers=layers, name=f"cp_titan_llama3{'_' + bug if bug else ''}", bug=bug)
