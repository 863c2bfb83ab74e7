"""Functionalization of a traced joint program (PyTorch's own pass, as AOTAutograd runs it).

Why: code that writes into views and shared buffers -- Megatron's classic in-place collectives into
``torch.empty`` / global-memory-buffer views, ``_flatten_dense_tensors`` + ``buf.copy_(synced)`` on a
gradient's ``.data`` -- cannot be converted op by op from a plain ``make_fx`` graph: a write through one
alias is invisible to reads through another, and the converter refuses it.  Run under
``FunctionalTensorMode`` every mutation becomes an out-of-place op (``copy``, ``slice_scatter``, ...) and
every later read of any alias reads the new value, exactly; what remains is a pure graph.

:func:`functionalized` wraps the joint function :mod:`.trace` hands to ``make_fx`` (set
``trace.joint_transform = functionalized`` while tracing).  Writes into the traced function's inputs
(parameters, data) are refused: the plan has no way to return them.
"""
from __future__ import annotations

from typing import Any, Callable


def functionalized(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run on functional wrappers of its tensor arguments, its outputs unwrapped (a tuple)."""
    def run(*args):
        import torch
        from torch._functorch._aot_autograd.functional_utils import from_fun, to_fun
        from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

        from .trace import TraceError

        with FunctionalTensorMode():
            fargs = [to_fun(a) for a in args]
            outs = fn(*fargs)
            flat = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            for i, fa in enumerate(fargs):
                if isinstance(fa, FunctionalTensor):
                    torch._sync(fa)
                    if torch._functionalize_has_data_mutation(fa.elem):
                        raise TraceError(f"the traced program writes into its input {i} in place; the plan cannot "
                                         f"return an input's new value", "unsupported", "in-place write to an input")
            for o in flat:
                if isinstance(o, FunctionalTensor):
                    torch._sync(o)
        return tuple(from_fun(o) for o in flat)

    return run
