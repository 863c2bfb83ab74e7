"""Data-dependent values under fake tensors (MoE routing): UNKNOWN with the exact reason, never a verdict.

Tracing runs on fake tensors, which have shapes but no values.  MoE code reads values to route tokens:
``tolist()`` / ``item()`` of per-expert token counts (the split sizes of an all_to_all), ``nonzero`` /
``torch.where`` / ``bincount`` / boolean indexing (which experts got tokens, how many).  PyTorch refuses
those on fake tensors (``DataDependentOutputException``, ``DynamicOutputShapeException``,
``GuardOnDataDependentSymNode``).  Such a failure says nothing about the program: the same code runs on
real tensors.  It is therefore neither a crash of the parallel program (REFUTED) nor bad input, and
tracing one concrete routing instead would prove that routing only.  :func:`data_dependent` turns it into
an UNKNOWN naming the op, the source line and why.
"""
from __future__ import annotations

import os
import traceback
from typing import Optional

from .trace import TraceError

# ops that give a Python number from a tensor: split sizes, counts
_SCALAR_OPS = ("_local_scalar_dense", "item", "tolist")


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _kind(exc: BaseException) -> Optional[tuple[str, str]]:
    """(what, op) for a fake-tensor data-dependence error anywhere in the exception chain, else None."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    for e in _chain(exc):
        if isinstance(e, DataDependentOutputException):
            return "value", str(e.func)
        if isinstance(e, DynamicOutputShapeException):
            return "shape", str(e.func)
        if isinstance(e, GuardOnDataDependentSymNode):
            return "guard", "a branch on a tensor value"
        text = str(e)  # DTensor's sharding propagation re-raises as a plain RuntimeError with the text
        for name, what in (("DataDependentOutputException", "value"), ("DynamicOutputShapeException", "shape")):
            if name in text:
                tail = text.split(name, 1)[1].lstrip(": ").split()
                return what, (tail[0] if tail else "an op")
    return None


def framework_src(exc: BaseException) -> Optional[str]:
    """``file.py:line`` of the innermost frame outside torch and tvcert: the model or framework code (a
    torchtitan or transformers file counts) that read the value."""
    import torch

    skip = (os.path.dirname(os.path.abspath(torch.__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    best = None
    for e in _chain(exc):
        for fr in traceback.extract_tb(e.__traceback__):
            f = os.path.abspath(fr.filename)
            if not f.startswith(skip):
                best = f"{os.path.basename(f)}:{fr.lineno}"
        if best:
            return best
    return best


def data_dependent(exc: BaseException, where: str) -> Optional[TraceError]:
    """The UNKNOWN for a trace that stopped because the code reads tensor values, or None."""
    got = _kind(exc)
    if got is None:
        return None
    what, op = got
    src = framework_src(exc)
    why = {"value": "reads a Python number from a tensor (e.g. all_to_all split sizes from token counts)",
           "shape": "has an output shape that depends on tensor values (e.g. the tokens routed to each expert)",
           "guard": "branches on a tensor value (e.g. whether an expert received tokens)"}[what]
    if any(s in op for s in _SCALAR_OPS):
        op = f"{op} (.item() / .tolist())"
    return TraceError(f"data-dependent routing: {where}{' at ' + src if src else ''}, {op} {why}; fake tensors "
                      f"have no values, and a trace of one concrete routing would prove that routing only, so no "
                      f"verdict holds for all routings", "unsupported", op, src)
