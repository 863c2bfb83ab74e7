"""Front ends that turn user code into plans: :mod:`.trace` (PyTorch, fake process group)."""
from __future__ import annotations

__all__ = ["trace_plan", "TraceError"]


def __getattr__(name):  # lazy: importing tvcert must not import torch
    if name in __all__:
        from . import trace

        return getattr(trace, name)
    raise AttributeError(name)
