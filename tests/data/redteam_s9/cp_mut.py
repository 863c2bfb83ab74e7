"""Near misses of torch's causal ring attention (examples/torch/cp_attention.py, mutated; red team session 9).

``bug`` (beside cp_attention's own):
``lse_sign`` (the merged log-sum-exp updated with the wrong sign: lse + logsigmoid(lse - lse_b)),
``merged_twice`` (the second block a rank attends merged into its output twice: a key chunk attended twice),
``kv_swapped`` (load-balanced: K and V's head / tail chunks swapped on every rank, Q's not: the chunk order differs
between Q and K/V; ``kv_swapped_last``: on the last cp rank only), ``global_rank`` (cp x tp: ``_is_causal_behavior`` given the global rank, not the cp coordinate),
``partial_head`` (load-balanced: a partial merge updates the head query chunk instead of the tail).
Run it (``python cp_mut.py``) to trace every case into ``plans/``.
"""
from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
_s = importlib.util.spec_from_file_location("cp_attention", ROOT / "examples" / "torch" / "cp_attention.py")
CP = importlib.util.module_from_spec(_s)
_s.loader.exec_module(CP)

BUGS = ("lse_sign", "merged_twice", "kv_swapped", "kv_swapped_last", "global_rank", "partial_head")


@contextlib.contextmanager
def mutated(bug: str, tp: int):
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental._context_parallel import _attention as A

    saved = []

    def patch(obj, name, fn):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, fn)

    if bug in ("lse_sign", "partial_head"):
        def merge_one(self, block_out, block_lse, partial):
            if len(block_lse.shape) < len(block_out.shape):
                block_lse = block_lse.unsqueeze(dim=-1)
                self._should_lse_squeeze = True
            if self._lse is None:
                self._lse, self._out = block_lse, block_out
                return
            idx = 0 if bug == "partial_head" else 1
            lse = self._lse.chunk(2, dim=self._seq_dim)[idx] if partial else self._lse
            out = self._out.chunk(2, dim=self._seq_dim)[idx] if partial else self._out
            out = out - F.sigmoid(block_lse - lse) * (out - block_out)
            lse = lse + F.logsigmoid(lse - block_lse) if bug == "lse_sign" else lse - F.logsigmoid(lse - block_lse)
            if partial:
                self._lse = A._partial_update(self._lse, lse, dim=self._seq_dim, n_chunks=2, idx=idx, add=False)
                self._out = A._partial_update(self._out, out, dim=self._seq_dim, n_chunks=2, idx=idx, add=False)
            else:
                self._lse, self._out = lse, out
        patch(A._SDPAMerger, "_merge_one", merge_one)
    elif bug == "merged_twice":
        orig_step = A._SDPAMerger.step

        def step(self, out, lse, partial):
            self._n = getattr(self, "_n", 0) + 1
            orig_step(self, out, lse, partial)
            if self._n == 2:
                orig_step(self, out, lse, partial)
        patch(A._SDPAMerger, "step", step)
    elif bug == "global_rank":
        import torch.distributed as dist
        orig = A._is_causal_behavior

        def behavior(rank, world_size, i, is_causal):
            return orig(rank=dist.get_rank(), world_size=world_size, i=i, is_causal=is_causal)
        patch(A, "_is_causal_behavior", behavior)
    try:
        yield
    finally:
        for obj, name, fn in reversed(saved):
            setattr(obj, name, fn)


def tvcert_trace(cp: int = 2, lb: bool = True, bug: str = "", seq: int = 0, tp: int = 1):
    if bug in ("kv_swapped", "kv_swapped_last"):
        orig = CP.make_parallel

        def make_parallel(lb_, causal, rotate, with_rope, bug_):
            from tvcert.frontends.context_parallel import ring_sdpa

            def parallel(ctx, x, wq, wk, wv, target, cos=None, sin=None):
                import torch

                q, k, v = CP.heads(x @ wq), CP.heads(x @ wk), CP.heads(x @ wv)
                h = k.shape[2] // 2
                if bug == "kv_swapped_last" and ctx.coord("cp") != ctx.size("cp") - 1:
                    h = 0  # only the last cp rank swaps
                k = torch.cat([k[:, :, h:], k[:, :, :h]], 2)
                v = torch.cat([v[:, :, h:], v[:, :, :h]], 2)
                o = ring_sdpa(q, k, v, ctx.group("cp"), is_causal=True, load_balance=lb_, rotate=rotate)
                return ((o - target) ** 2).sum()
            return parallel
        CP.make_parallel = make_parallel
        try:
            return CP.tvcert_trace(cp=cp, lb=lb, seq=seq, tp=tp)
        finally:
            CP.make_parallel = orig
    with mutated(bug, tp):
        return CP.tvcert_trace(cp=cp, lb=lb, bug="" if bug in BUGS else bug, seq=seq, tp=tp)


CASES = {  # name: (kwargs, wrong?)
    "lse_sign_cp3": (dict(cp=3, lb=False, bug="lse_sign"), True),
    "lse_sign_lb2": (dict(cp=2, lb=True, bug="lse_sign"), True),
    "merged_twice_cp2": (dict(cp=2, lb=True, bug="merged_twice"), True),
    "kv_swapped_lb2": (dict(cp=2, lb=True, bug="kv_swapped"), True),
    "kv_swapped_last_lb3": (dict(cp=3, lb=True, bug="kv_swapped_last"), True),
    "global_rank_tp2": (dict(cp=2, lb=False, bug="global_rank", tp=2), True),
    "partial_head_lb2": (dict(cp=2, lb=True, bug="partial_head"), True),
    "ok_cp3_lb_seq6": (dict(cp=3, lb=True, seq=6), False),
    "ok_cp3_seq9": (dict(cp=3, lb=False, seq=9), False),
}

if __name__ == "__main__":
    import json
    import warnings

    from tvcert.frontends.trace import trace_plan  # noqa: F401  (the environment)

    out = Path(__file__).with_name("plans")
    out.mkdir(exist_ok=True)
    for name in sys.argv[1:] or CASES:
        kw, _ = CASES[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = tvcert_trace(**kw)
        (out / f"{name}.json").write_text(json.dumps(plan))
        print("traced", name, flush=True)
