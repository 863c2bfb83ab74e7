"""Run deeply recursive work (expression DAGs of 100-layer models) on a thread with a big stack.

The kernel's functions recurse along expression depth, which for a full training step is tens
of thousands of ops; CPython's default stack and recursion limit are far smaller.
"""
from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")
STACK_BYTES = 1 << 30
RECURSION_LIMIT = 2_000_000


def deep(fn: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        if getattr(_local, "inside", False):
            return fn(*args, **kwargs)
        box: dict[str, Any] = {}

        def target() -> None:
            _local.inside = True
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as exc:  # re-raised in the caller's thread
                box["error"] = exc

        old_limit = sys.getrecursionlimit()
        old_stack = threading.stack_size()
        sys.setrecursionlimit(max(old_limit, RECURSION_LIMIT))
        threading.stack_size(STACK_BYTES)
        try:
            t = threading.Thread(target=target, name="tvcert-deep")
            t.start()
        finally:
            threading.stack_size(old_stack)
        t.join()
        sys.setrecursionlimit(old_limit)
        if "error" in box:
            raise box["error"]
        return box["value"]

    return run


_local = threading.local()
