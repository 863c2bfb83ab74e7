"""Backward ops carry the source line and module of the forward op they differentiate.

A traced backward op has no user frame of its own (autograd runs it from C++, or from the line that called
``loss.backward()``), so a bug in a gradient would be pinned to no line, or to the backward call.  Autograd
links the two: every autograd node has a sequence number, and the fx node of a forward op records the number of
the autograd node it created (``node.meta["seq_nr"]``).  While the backward runs inside the trace, a pre-hook on
every autograd node marks the ops it emits with that node's number (in ``meta["custom"]``, which the tracer
copies onto each node); after tracing, :func:`copy_forward_origins` gives each marked op the stack trace and
module path of the first forward op with the same number.  Ops with a user frame of their own (a custom
``autograd.Function.backward``, a gradient hook) keep it.  Metadata only: no verdict reads it.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator

KEY = "tvcert_grad_of"  # the sequence number of the autograd node whose backward emitted the op
_FRONTEND_DIR = os.path.dirname(os.path.abspath(__file__))


def _nodes(roots) -> Iterator[Any]:
    seen, todo = set(), [r for r in roots if r is not None]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        yield n
        todo.extend(f for f, _ in n.next_functions if f is not None)


def _call_site() -> tuple[str, int] | None:
    """(basename, line) of the innermost frame outside torch and tvcert's front ends: the backward call."""
    import torch

    skip = (os.path.dirname(os.path.abspath(torch.__file__)), _FRONTEND_DIR)
    f = sys._getframe(2)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if not path.startswith(skip):
            return os.path.basename(path), f.f_lineno
        f = f.f_back
    return None


@contextlib.contextmanager
def backward_origins(sites: set):
    """While tracing: every ``torch.autograd.grad`` / ``backward`` marks its ops with their autograd node's
    sequence number; the lines that called them are added to ``sites``."""
    import torch
    import torch.fx.traceback as fxtb

    def mark(seq: int):
        def pre(*_):
            old = fxtb.current_meta.get("custom")
            stack.append(old)
            fxtb.current_meta["custom"] = {**(old or {}), KEY: seq}

        def post(*_):
            old = stack.pop() if stack else None
            if old is None:
                fxtb.current_meta.pop("custom", None)
            else:
                fxtb.current_meta["custom"] = old
        return pre, post

    stack: list = []

    def wrap(fn, key: str):
        def run(*a, **k):
            tensors = a[0] if a else k.get(key, ())  # grad(outputs=...), backward(tensors=...) by keyword too
            ts = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
            handles = []
            for n in _nodes([t.grad_fn for t in ts if isinstance(t, torch.Tensor)]):
                pre, post = mark(n._sequence_nr())
                handles += [n.register_prehook(pre), n.register_hook(post)]
            site = _call_site()
            if site:
                sites.add(site)
            try:
                return fn(*a, **k)
            finally:
                for h in handles:
                    h.remove()
        return run

    saved = (torch.autograd.grad, torch.autograd.backward)
    torch.autograd.grad, torch.autograd.backward = wrap(saved[0], "outputs"), wrap(saved[1], "tensors")
    try:
        yield
    finally:
        torch.autograd.grad, torch.autograd.backward = saved


def copy_forward_origins(gm, sites: set, src_of) -> None:
    """Give each backward op without a user frame of its own (none, or only the backward call's line) the
    stack trace and module path of its forward op."""
    fwd: dict[int, Any] = {}
    for n in gm.graph.nodes:
        c = n.meta.get("custom")
        if (not isinstance(c, dict) or KEY not in c) and n.meta.get("stack_trace") and n.meta.get("seq_nr") is not None:
            fwd.setdefault(n.meta["seq_nr"], n)
    names = {f"{b}:{line}" for b, line in sites}
    for n in gm.graph.nodes:
        c = n.meta.get("custom")
        if not isinstance(c, dict) or KEY not in c or c.get("tvcert_hook"):
            continue
        f = fwd.get(c[KEY])
        own = src_of(n)
        if f is None or (own is not None and own not in names):
            continue
        n.meta["stack_trace"] = f.meta["stack_trace"]
        if f.meta.get("nn_module_stack"):
            n.meta["nn_module_stack"] = f.meta["nn_module_stack"]
