"""Each rank of a real job is its own process; the tracer runs every rank in one (or a few worker) processes.

So a program whose trace reads Python state an earlier rank's trace left behind (a call counter used as the block
index, a cache filled with another rank's values) is traced as something no real rank runs: the sequential trace of
a program that picks its block by ``CALLS[0]`` instead of its rank reads blocks 0, 1, ... and was VERIFIED, while
in the real job every rank reads block 0 (red team round 3).  A real rank also never runs the logical model, so
state that trace leaves behind (a global the logical function sets and the parallel one reads) must not reach it
either, and the state may matter on a middle rank only (red team round 4: both were VERIFIED while only the last
rank was re-traced, after the logical trace).

So every rank is traced once more from the state before the logical trace: :class:`Probes` forks a *zygote* then,
which waits; once the logical trace gave what a rank's conversion needs, it forks one child per rank from its own
untouched state, one at a time beside the real loop (one extra process tracing, whatever the mesh size), each
writing its program to a file; the tracer compares every rank's program with its program in the real loop: any
difference is UNKNOWN naming the rank and the first op that differs.
"""
from __future__ import annotations

import os
import pickle
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
from typing import Any, Callable, Optional

_HDR = struct.Struct(">Q")
_RANK = struct.Struct(">q")


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: close() still kills the zygote
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Probes:
    """Every rank of ``world`` traced by ``fn(rank)`` in a grandchild of a zygote forked now; the zygote waits for
    :meth:`release`, whose payload each grandchild hands to ``prepare`` before tracing."""

    def __init__(self, fn: Callable[[int], Any], world: int, prepare: Callable[[Any], None]):
        self.world, self.dir = world, tempfile.mkdtemp(prefix="tvcert_probe_")
        sys.stdout.flush()
        sys.stderr.flush()
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the zygote
            try:
                os.close(cmd_w)
                os.close(res_r)
                _die_with_parent()
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                payload = _read_msg(cmd_r)
                if payload is not None:
                    for r in range(world):
                        g = os.fork()
                        if g == 0:
                            self._grandchild(fn, prepare, payload, r)
                        os.waitpid(g, 0)
                        _write_all(res_w, _RANK.pack(r))
            finally:
                os._exit(0)
        os.close(cmd_r)
        os.close(res_w)
        self.pid, self.cmd, self.res = pid, cmd_w, res_r

    def _grandchild(self, fn, prepare, payload, r: int) -> None:  # pragma: no cover - runs in the grandchild
        try:
            _die_with_parent()
            from . import trace

            trace.progress_hook = None
            try:
                prepare(payload)
                res: tuple = ("ok", fn(r))
            except BaseException as exc:  # noqa: BLE001 - reported to the tracer
                res = ("err", f"{type(exc).__name__}: {exc}")
            try:
                data = pickle.dumps(res, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # noqa: BLE001
                data = pickle.dumps(("err", f"result does not pickle: {exc}"))
            path = os.path.join(self.dir, f"{r}.pkl")
            with open(path + ".tmp", "wb") as f:
                f.write(data)
            os.replace(path + ".tmp", path)
        finally:
            os._exit(0)

    def release(self, payload: Any) -> None:
        """Start tracing the ranks, each given ``payload``."""
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            _write_all(self.cmd, _HDR.pack(len(data)) + data)
        finally:
            os.close(self.cmd)
            self.cmd = -1

    def results(self, timeout: float):
        """(rank, ("ok", fn(rank)) or ("err", message)) for every rank in order; ("err", ...) for the ranks not
        done within ``timeout`` seconds (a child deadlocked after the fork must not hang the trace)."""
        deadline = time.monotonic() + timeout
        buf = b""
        for r in range(self.world):
            while len(buf) < _RANK.size:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.res], [], [], left)[0]:
                    yield r, ("err", f"the probe process gave no result within {timeout:.0f} s")
                    break
                chunk = os.read(self.res, 1 << 16)
                if not chunk:
                    yield r, ("err", "the probe process ended without a result")
                    break
                buf += chunk
            else:
                (got,) = _RANK.unpack_from(buf)
                buf = buf[_RANK.size:]
                try:
                    with open(os.path.join(self.dir, f"{got}.pkl"), "rb") as f:
                        yield r, pickle.load(f)
                except OSError:
                    yield r, ("err", "the probe process ended without a result")
                continue
            return

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
            for fd in (self.cmd, self.res):
                if fd >= 0:
                    os.close(fd)
            self.pid = self.cmd = self.res = -1
            shutil.rmtree(self.dir, ignore_errors=True)


def start(fn: Callable[[int], Any], world: int, prepare: Callable[[Any], None]) -> Optional[Probes]:
    """The probes of every rank, or None when there is nothing to compare (one rank) or no fork."""
    if world < 2 or not hasattr(os, "fork"):
        return None
    return Probes(fn, world, prepare)


def _read_msg(fd: int) -> Any:
    """One length-prefixed pickle from ``fd``, or None at end of file."""
    buf = b""
    while len(buf) < _HDR.size or len(buf) < _HDR.size + _HDR.unpack_from(buf)[0]:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return None
        buf += chunk
    (n,) = _HDR.unpack_from(buf)
    return pickle.loads(buf[_HDR.size:_HDR.size + n])


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
