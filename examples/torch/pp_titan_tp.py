"""torchtitan Llama 3 debug under PP 2 x TP 2 + SP (examples/torchtitan/llama3_debug_pp2_tp2.toml), with the
pipeline bugs as monkey-patches of torchtitan, for `tvcert trace`:

    tvcert trace examples/torch/pp_titan_tp.py --verify                            # VERIFIED
    tvcert trace examples/torch/pp_titan_tp.py --set schedule=GPipe --verify       # VERIFIED
    tvcert trace examples/torch/pp_titan_tp.py --set bug=wrong_peer --verify       # REFUTED at the send
    tvcert trace examples/torch/pp_titan_tp.py --set bug=no_loss_scale --verify    # REFUTED at the loss's div

The job is traced as ``tvcert trace --torchtitan llama3-debug --config`` traces it (torchtitan's ``pipeline_llm``,
``Module.parallelize`` on each model part, ``CrossEntropyLoss`` normalised by ``global_valid_tokens``); torchtitan
itself is not edited, the bugs are patched in here for the duration of the trace:

* ``wrong_peer``: the pipeline process groups built by hand with an off-by-one in the rank arithmetic, pairing tp
  rank t of stage 0 with tp rank t + 1 of stage 1 (``[t, tp + (t + 1) % tp]`` instead of ``[t, tp + t]``).  Under
  sequence parallelism each tp rank holds its own sequence chunk, so stage 1 computes on the other rank's chunk.
* ``no_loss_scale``: the loss normalised by the micro-batch's own token count (a per-micro-batch mean) instead of
  the step's ``global_valid_tokens``: the schedule sums the micro-batch losses and accumulates their gradients, so
  loss and gradients are ``n_microbatches`` times the model's (what ``rescale_accumulated_loss`` exists to undo).
"""
from __future__ import annotations

import contextlib
import tomllib
from pathlib import Path

JOB = Path(__file__).resolve().parents[1] / "torchtitan" / "llama3_debug_pp2_tp2.toml"
BUGS = ("", "wrong_peer", "no_loss_scale")


@contextlib.contextmanager
def _wrong_peer_groups():
    """torchtitan's ``_pipeline_module_split`` given a pp mesh whose group is the hand-built (wrong) one."""
    import torch.distributed as dist
    import torchtitan.distributed.pipeline_parallel as ttpp

    orig = ttpp._pipeline_module_split

    class PPMesh:
        def __init__(self, mesh, group):
            self.mesh, self.group = mesh, group

        def get_group(self, *_):
            return self.group

        def get_local_rank(self, *a):
            return self.mesh.get_local_rank(*a)

        def size(self, *a):
            return self.mesh.size(*a)

    def split(whole_model, pp_mesh, *args, **kwargs):
        tp = dist.get_world_size() // pp_mesh.size()
        mine = None
        for t in range(tp):  # every rank creates every group, in the same order
            # tp rank t of stage 0 with tp rank t + 1 of stage 1, instead of [t, tp + t]
            g = dist.new_group([t, tp + (t + 1) % tp])  # BUG wrong_peer: an off-by-one in the rank arithmetic
            if dist.get_rank() in dist.get_process_group_ranks(g):
                mine = g
        return orig(whole_model, PPMesh(pp_mesh, mine), *args, **kwargs)

    ttpp._pipeline_module_split = split
    try:
        yield
    finally:
        ttpp._pipeline_module_split = orig


@contextlib.contextmanager
def _per_microbatch_mean():
    """torchtitan's ``CrossEntropyLoss`` dividing by the micro-batch's tokens, ignoring ``global_valid_tokens``."""
    from torchtitan.components.loss import CrossEntropyLoss

    orig = CrossEntropyLoss.__call__

    def call(self, pred, labels, global_valid_tokens=None, **kwargs):
        loss = self.fn(pred, labels, global_vocab_size=self.global_vocab_size)
        return loss / labels.numel(), {}  # BUG no_loss_scale: the micro-batch's mean, not over global_valid_tokens

    CrossEntropyLoss.__call__ = call
    try:
        yield
    finally:
        CrossEntropyLoss.__call__ = orig


def tvcert_trace(bug: str = "", schedule: str = "1F1B", layers: int = 2, sp: bool = True):
    import tempfile

    from tvcert.frontends.titan_config import load_job
    from tvcert.frontends.torchtitan import trace_titan_job

    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r} (one of {BUGS})")
    doc = tomllib.loads(JOB.read_text())
    text = JOB.read_text().replace('pipeline_parallel_schedule = "1F1B"',
                                   f'pipeline_parallel_schedule = "{schedule}"')
    if not sp:
        text = text.replace("enable_sequence_parallel = true", "enable_sequence_parallel = false")
    assert doc["parallelism"]["pipeline_parallel_schedule"] == "1F1B"
    with tempfile.NamedTemporaryFile("w", suffix=".toml", prefix="pp_titan_tp_") as f:
        f.write(text)
        f.flush()
        job = load_job(f.name, "llama3-debug")
        patches = {"wrong_peer": _wrong_peer_groups, "no_loss_scale": _per_microbatch_mean}
        with patches.get(bug, contextlib.nullcontext)():
            return trace_titan_job(job, layers=layers, name=f"pp_titan_tp{'_' + bug if bug else ''}")
