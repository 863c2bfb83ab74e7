"""PyTorch's context-parallel ring attention, entered where ``context_parallel()``'s dispatch enters it.

``context_parallel()`` monkey-patches ``F.scaled_dot_product_attention`` so that q / k / v become DTensors
sharded on the sequence, and DTensor's ``_sdpa_handler`` sends the fused flash / memory-efficient kernels (and
their backwards) to ``_templated_ring_attention`` / ``_templated_ring_attention_backward``.  On CPU the SDPA
dispatcher picks the CPU flash kernel, which that handler refuses, so :func:`ring_sdpa` calls the two
templated functions directly under torch's own ``_cp_options``, with the flash kernel's semantics per block
(:func:`flash_block`, :func:`flash_block_backward`): the ring reads the kernel's logsumexp and hands its
backward the *merged* output and logsumexp, so both must be the kernel's, not a local softmax.
"""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def _options(load_balance: bool, rotate: str):
    from torch.distributed.tensor.experimental._context_parallel import _attention as A

    saved = (A._cp_options.enable_load_balance, A._cp_options.rotate_method)
    A._cp_options.enable_load_balance = load_balance
    A._cp_options.rotate_method = {"allgather": A._RotateMethod.ALL_GATHER, "alltoall": A._RotateMethod.ALL_TO_ALL}[rotate]
    try:
        yield A
    finally:
        A._cp_options.enable_load_balance, A._cp_options.rotate_method = saved


def _scores(q, k, is_causal, scale):
    """(scores, keep mask or None, sqrt(scale)).  Masked scores are filled with their row's smallest score (finite,
    no larger than any kept score), so a row's max over the filled scores is its max over the kept ones: the
    exponentials below never overflow or underflow to an all-zero row (a -inf fill made the converter's masked
    softmax 0 / 0 in float64 when the kept scores were far below the masked ones)."""
    import math

    import torch

    c = (1.0 / math.sqrt(q.shape[-1])) if scale is None else float(scale)
    # q and k each scaled by sqrt(c), as torch's SDPA decomposition (the logical side) does: the same literal on both
    # sides (0.7071067811865476 squared is not 0.5 in the plan's decimal semantics)
    r = math.sqrt(c)
    s = torch.matmul(q * r, (k * r).transpose(-2, -1))
    if not is_causal:
        return s, None, r
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()  # the kernel's mask: top-left aligned
    return torch.where(keep, s, s.amin(-1, keepdim=True)), keep.to(s.dtype), r


def flash_block(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """``aten._scaled_dot_product_flash_attention`` over the reals: out = softmax(S) V and logsumexp(S) per row
    over the kept scores (the two outputs the ring reads; the rest are unused there)."""
    import torch

    if dropout_p != 0.0 or return_debug_mask:
        raise RuntimeError("tvcert: ring attention is traced without dropout or debug mask")
    s, keep, _ = _scores(query, key, is_causal, scale)
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m) if keep is None else torch.exp(s - m) * keep
    z = e.sum(-1, keepdim=True)
    return torch.matmul(e / z, value), (m + torch.log(z)).squeeze(-1)


def flash_block_backward(grad_out, query, key, value, out, logsumexp, *_, is_causal=False, scale=None, **__):
    """``aten._scaled_dot_product_flash_attention_backward`` over the reals, from the given (merged) output and
    logsumexp as the kernel computes it: P = exp(S - lse) (0 where masked), D = rowsum(dO * out),
    dS = P (dO V^T - D)."""
    import torch

    s, keep, r = _scores(query, key, is_causal, scale)
    p = torch.exp(s - logsumexp.unsqueeze(-1))
    if keep is not None:
        p = p * keep
    d = (grad_out * out).sum(-1, keepdim=True)
    ds = p * (torch.matmul(grad_out, value.transpose(-2, -1)) - d)
    return (torch.matmul(ds, key * r) * r, torch.matmul(ds.transpose(-2, -1), query * r) * r,
            torch.matmul(p.transpose(-2, -1), grad_out))


_CALLS: dict[str, tuple] = {}  # file:line of the ring_sdpa calls traced -> (load_balance, rotate, causal, cp)


def _torch_line(fn, needle: str) -> str:
    """``_attention.py:N`` of the first line of torch's ``fn`` containing ``needle``."""
    import inspect
    import os

    lines, start = inspect.getsourcelines(fn)
    n = next((start + i for i, t in enumerate(lines) if needle in t), start)
    return f"{os.path.basename(inspect.getsourcefile(fn))}:{n}"


def why_not_spmd(load_balance: bool, rotate: str, is_causal: bool = True, cp: int | None = None) -> str:
    """Why torch's ring attention has no SPMD form on ``cp`` ranks: the program each rank runs depends on its rank."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as A

    parts = []
    if is_causal:
        how = ("with load balancing, KV block i > 0 is attended as all queries against its first chunk (i <= rank) "
               "or the second query chunk against the whole block (i > rank)") if load_balance else \
            "without load balancing, KV block i > 0 is attended in full (i <= rank) or skipped (i > rank)"
        parts.append(f"at {_torch_line(A._templated_ring_attention, '_is_causal_behavior(')} (_is_causal_behavior and "
                     f"the branches after it) {how}, in forward and backward "
                     f"({_torch_line(A._templated_ring_attention_backward, '_is_causal_behavior(')})")
    if rotate == "allgather" and (cp is None or cp > 2):  # at cp 2 the block offsets are affine in the rank
        parts.append(f"the all-gather rotater picks KV block (rank - i) mod cp at "
                     f"{_torch_line(A._AllGatherRotater.next_buffer, '.chunk(')}, an offset that wraps around the ring "
                     f"(not affine in the rank)")
    return ("torch's ring attention runs a different program on each cp rank: " + "; ".join(parts) +
            "; tvcert's ring-attention rules match one program for every rank (kernel/ring.py: a ring_loop over cp "
            "passing K / V with ppermute; kernel/ring_merge.py: torch's unrolled ring, every block unmasked, on one "
            "schedule), so there is no verdict")


def ring_sdpa(q, k, v, group, *, is_causal: bool = True, load_balance: bool = True, rotate: str = "allgather",
              scale=None, src: str | None = None):
    """Ring attention of local q / k / v ([b, h, s_local, d]) over the cp process group, as torch runs it
    (``src``: the user's line, default the caller's)."""
    import sys

    import torch

    fr = sys._getframe(1)
    _CALLS[src or f"{fr.f_code.co_filename.rsplit('/', 1)[-1]}:{fr.f_lineno}"] = (
        load_balance, rotate, is_causal, torch.distributed.get_world_size(group))

    class Ring(torch.autograd.Function):
        @staticmethod
        def forward(fctx, q, k, v):
            with _options(load_balance, rotate) as A:
                out, lse, *_ = A._templated_ring_attention(group, 2, flash_block,
                                                            q, k, v, is_causal=is_causal, dropout_p=0.0, scale=scale)
            fctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(fctx, dout):
            q, k, v, out, lse = fctx.saved_tensors
            e = torch.empty((), dtype=torch.int64)
            with _options(load_balance, rotate) as A:
                dq, dk, dv, *_ = A._templated_ring_attention_backward(
                    group, 2, flash_block_backward, grad_out=dout,
                    grad_out_name="grad_out", query=q, key=k, value=v, out=out, logsumexp=lse, is_causal=is_causal,
                    cum_seq_q=None, cum_seq_k=None, max_q=q.shape[2], max_k=k.shape[2], dropout_p=0.0,
                    philox_seed=e, philox_offset=e, scale=scale)
            return dq, dk, dv

    return Ring.apply(q, k, v)


def _user_src() -> str:
    """file:line of the innermost caller outside torch and tvcert (the user's SDPA call)."""
    import os
    import sys

    import torch

    skip = (os.path.dirname(os.path.abspath(torch.__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    f = sys._getframe(1)
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(skip):
        f = f.f_back
    return f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno}" if f is not None else "?"


@contextlib.contextmanager
def dtensor_ring():
    """``F.scaled_dot_product_attention`` of q / k / v DTensors sharded ``Shard(2)`` (the sequence) on a 1-D mesh --
    what ``context_parallel()``'s patched SDPA and torchtitan's ``apply_cp_to_forward`` pass it -- runs torch's ring
    under the options ``context_parallel()`` set (load balance, rotater), as its DTensor dispatch (``_sdpa_handler``
    -> ``_scaled_dot_product_ring_flash_attention``) does for the CUDA kernels it maps; the CPU kernel it does not
    map, so on CPU the call would fall through to SDPA's composite on DTensors and fail."""
    import torch
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.experimental._context_parallel import _attention as A
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention
    rotate = {A._RotateMethod.ALL_GATHER: "allgather", A._RotateMethod.ALL_TO_ALL: "alltoall"}

    def ring(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        qkv = (query, key, value)
        if not all(isinstance(t, DTensor) and t.placements == (Shard(2),) and t.device_mesh == query.device_mesh
                   for t in qkv):
            return None
        if attn_mask is not None or dropout_p != 0.0 or enable_gqa:
            raise RuntimeError("tvcert: context-parallel SDPA is traced without a mask, dropout or GQA")
        mesh = query.device_mesh
        out = ring_sdpa(*(t.to_local() for t in qkv), mesh.get_group(), is_causal=bool(is_causal),
                        load_balance=A._cp_options.enable_load_balance, rotate=rotate[A._cp_options.rotate_method],
                        scale=scale, src=_user_src())
        return DTensor.from_local(out, mesh, [Shard(2)], run_check=False)

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is sdpa:
                out = ring(*args, **(kwargs or {}))
                if out is not None:
                    return out
            return func(*args, **(kwargs or {}))

    with Mode():
        yield


@contextlib.contextmanager
def functional_trace():
    """Trace with functionalization: the ring's gradient buffers are views written in place
    (``grad_key += ...`` on a reshape of the received buffer), which only a functional graph converts."""
    from . import trace
    from .functional import functionalized

    old = trace.joint_transform
    trace.joint_transform = functionalized
    try:
        yield
    finally:
        trace.joint_transform = old


def trace_cp(**kw) -> dict:
    """:func:`tvcert.frontends.trace.trace_plan` for code calling :func:`ring_sdpa`.  Ranks that run different
    programs (causal attention) are merged into one in which every rank runs its own (:mod:`.mpmd`); ranks that
    cannot be merged are UNKNOWN naming the torch lines that make them differ (for that call's options)."""
    from . import trace
    from .mpmd import per_rank_programs
    from .rank_workers import channel
    from .trace import TraceError, trace_plan

    _CALLS.clear()  # where ring_sdpa was called, sent back from every rank's process (rank_workers.channel)
    # context_parallel()'s buffer sharding runs in its __enter__: located at the user's `with` line, not contextlib's
    trace.SKIP_FRAME_DIRS.append(contextlib.__file__)
    try:
        with functional_trace(), per_rank_programs(), dtensor_ring(), channel(lambda: dict(_CALLS), _CALLS.update):
            return trace_plan(**kw)
    except TraceError as exc:
        if exc.kind != "spmd" or exc.src not in _CALLS:
            raise
        raise TraceError(f"{exc}: {why_not_spmd(*_CALLS[exc.src])}", "spmd", exc.op, exc.src) from None
    finally:
        trace.SKIP_FRAME_DIRS.remove(contextlib.__file__)
