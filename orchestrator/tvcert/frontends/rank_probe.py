"""Each rank of a real job is its own process; the tracer runs every rank in one (or a few worker) processes.

So a program whose trace reads Python state an earlier rank's trace left behind (a call counter used as the block
index, a cache filled with another rank's values) is traced as something no real rank runs: the sequential trace of
a program that picks its block by ``CALLS[0]`` instead of its rank reads blocks 0, 1, ... and was VERIFIED, while
in the real job every rank reads block 0 (red team round 3).  The probe traces the last rank once more in a child
forked before any rank was traced (the state every real rank starts from, after the logical model's trace) and the
tracer compares its program with the last rank's program in the real loop: any difference is UNKNOWN naming the
first op that differs.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import sys
import time
from typing import Any, Callable, Optional

_HDR = struct.Struct(">Q")


class Probe:
    """A forked child tracing ``rank`` from the state at fork time; :meth:`result` waits for it."""

    def __init__(self, fn: Callable[[int], Any], rank: int):
        self.rank = rank
        sys.stdout.flush()
        sys.stderr.flush()
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            try:
                os.close(rfd)
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                from . import trace

                trace.progress_hook = None
                try:
                    res: tuple = ("ok", fn(rank))
                except BaseException as exc:  # noqa: BLE001 - reported to the parent
                    res = ("err", f"{type(exc).__name__}: {exc}")
                try:
                    data = pickle.dumps(res, protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as exc:  # noqa: BLE001
                    data = pickle.dumps(("err", f"result does not pickle: {exc}"))
                view = memoryview(_HDR.pack(len(data)) + data)
                while view:
                    view = view[os.write(wfd, view):]
            finally:
                os._exit(0)
        os.close(wfd)
        self.pid, self.fd = pid, rfd

    def result(self, timeout: float) -> tuple[str, Any]:
        """("ok", fn(rank)) or ("err", message); ("err", ...) as well when the child gives no result within
        ``timeout`` seconds (a child deadlocked after the fork must not hang the trace)."""
        buf = b""
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                    return ("err", f"the probe process gave no result within {timeout:.0f} s")
                chunk = os.read(self.fd, 1 << 20)
                if not chunk:
                    break
                buf += chunk
        finally:
            self.close()
        if len(buf) < _HDR.size:
            return ("err", "the probe process ended without a result")
        (n,) = _HDR.unpack_from(buf)
        return pickle.loads(buf[_HDR.size:_HDR.size + n])

    def close(self) -> None:
        if self.pid > 0:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            os.close(self.fd)
            self.pid = -1


def start(fn: Callable[[int], Any], world: int) -> Optional[Probe]:
    """The probe of the last rank, or None when there is nothing to compare (one rank) or no fork."""
    if world < 2 or not hasattr(os, "fork"):
        return None
    return Probe(fn, world - 1)


def first_difference(a: list[dict], b: list[dict]) -> Optional[str]:
    """The first op of program ``a`` that program ``b`` does not have identically, as 'op at src', or None."""
    for i, (m, n) in enumerate(zip(a, b)):
        if {k: v for k, v in m.items() if k != "src"} != {k: v for k, v in n.items() if k != "src"}:
            if (m.get("op"), m.get("inputs")) == (n.get("op"), n.get("inputs")):
                am, an = m.get("attrs") or {}, n.get("attrs") or {}
                ks = sorted(k for k in set(am) | set(an) if am.get(k) != an.get(k))
                return (f"op {i}, {m.get('op')} at {m.get('src')}: {', '.join(f'{k}={am.get(k)!r}' for k in ks)} "
                        f"here, {', '.join(f'{k}={an.get(k)!r}' for k in ks)} in a fresh process")
            return f"op {i}: {m.get('op')} at {m.get('src')} here, {n.get('op')} at {n.get('src')} in a fresh process"
    if len(a) != len(b):
        i = min(len(a), len(b))
        p = a if len(a) > len(b) else b
        return f"op {i}: {p[i].get('op')} at {p[i].get('src')} traced only once"
    return None
