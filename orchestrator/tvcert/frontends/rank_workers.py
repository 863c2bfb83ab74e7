"""Every rank traced once, in a fresh process forked from the state before the logical trace (issue 16, soundness).

Each rank of a real job is its own process and never runs the logical model.  A program whose trace reads Python
state that another rank's trace left behind (a call counter used as the block index) or that the logical model's
trace left behind (a global the logical function sets) would be traced as something no real rank runs (red team
rounds 3 and 4: both were VERIFIED).  So :func:`start` forks a *zygote* before the logical trace; once the tracer
has what a rank's trace needs from it (:meth:`Ranks.release`: the logical outputs' names), the zygote forks one
child per rank from its own untouched state, up to ``jobs`` at a time, each tracing its rank once and exiting.
The tracer consumes the results in rank order (:meth:`Ranks.results`), so the first failing rank and its error,
the ranks' stdout / stderr and the progress read as in a sequential loop; progress ticks are relayed as they happen.

What a child's trace leaves in its own process does not reach the tracer by itself: a front end that needs it (the
ring-attention calls ``context_parallel`` names in an error) registers a channel with :func:`channel`, whose value
each child sends back with its result and the tracer merges in rank order.
"""
from __future__ import annotations

import contextlib
import gc
import io
import os
import pickle
import select
import shutil
import signal
import struct
import sys
import tempfile
from typing import Any, Callable, Iterator

_HDR = struct.Struct(">I")
_TICK_BYTES = 2000  # a message on the shared pipe stays under PIPE_BUF (4096 bytes): written atomically

# (get, put): get() runs in a rank's process after its trace, put(value) in the tracer, in rank order
CHANNELS: list[tuple[Callable[[], Any], Callable[[Any], None]]] = []


@contextlib.contextmanager
def channel(get: Callable[[], Any], put: Callable[[Any], None]):
    """While the block runs, every rank's process sends ``get()`` back and the tracer calls ``put`` with it."""
    item = (get, put)
    CHANNELS.append(item)
    try:
        yield
    finally:
        CHANNELS.remove(item)


def default_jobs() -> int:
    """``TVCERT_TRACE_JOBS`` (an int >= 1; ``0`` or ``auto``: the CPUs free), else the CPUs free: those this process
    may use less the load beyond this process (the 1-minute load average), at least 1."""
    v = os.environ.get("TVCERT_TRACE_JOBS", "").strip()
    if v and v not in ("0", "auto"):
        try:
            n = int(v)
        except ValueError:
            raise ValueError(f"TVCERT_TRACE_JOBS={v!r} is not a number of worker processes") from None
        if n < 0:
            raise ValueError(f"TVCERT_TRACE_JOBS={v!r} must be >= 0")
        return max(1, n)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    try:
        busy = max(0.0, os.getloadavg()[0] - 1.0)  # this process is one of the running ones
    except OSError:  # pragma: no cover
        busy = 0.0
    return max(1, cpus - int(busy + 0.5))


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: close() still kills the zygote and the ranks it started
        pass


def _send(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    os.write(fd, _HDR.pack(len(data)) + data)  # small: one atomic write on a pipe shared by several writers


def _short(text: Any) -> str:
    return str(text).encode("utf-8", "replace")[:_TICK_BYTES].decode("utf-8", "ignore")


def _exc_payload(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - an exception whose state does not pickle
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class Ranks:
    """``fn(r)`` for every rank r of ``world``, each in its own grandchild of a zygote forked now; the zygote waits
    for :meth:`release`, whose payload each grandchild hands to ``prepare`` before ``fn``."""

    def __init__(self, fn: Callable[[int], Any], world: int, jobs: int, prepare: Callable[[Any], None],
                 tick_attr: tuple):
        self.world, self.jobs, self.tick_attr = world, max(1, min(jobs, world)), tick_attr
        self.dir = tempfile.mkdtemp(prefix="tvcert_ranks_")
        self.pids: dict[int, int] = {}  # rank -> pid of its process (killed by close)
        self.ended: dict[int, int] = {}  # rank -> wait status of its process
        self._buf = b""
        sys.stdout.flush()
        sys.stderr.flush()
        cmd_r, cmd_w = os.pipe()
        msg_r, msg_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the zygote
            try:
                os.close(cmd_w)
                os.close(msg_r)
                _die_with_parent()
                payload = _read_payload(cmd_r)
                if payload is not None:
                    self._zygote(fn, prepare, payload[0], msg_w)
            finally:
                os._exit(0)
        os.close(cmd_r)
        os.close(msg_w)
        self.pid, self.cmd, self.msg = pid, cmd_w, msg_r

    # ------------------------------------------------------------------ in the zygote and the ranks' processes
    def _zygote(self, fn, prepare, payload, msg_w: int) -> None:  # pragma: no cover - runs in the zygote
        # Every object the ranks inherit leaves the cyclic collector: a collection in a rank's process would scan
        # the whole inherited heap, writing to (copying) every page of it (a fresh rank spent ~0.5 of its 1.3 CPU s
        # in the collector); a rank's own allocations are not collected either (see _rank).
        gc.freeze()
        running: dict[int, int] = {}  # pid -> rank
        nxt, failed = 0, False
        while running or (nxt < self.world and not failed):
            while len(running) < self.jobs and nxt < self.world and not failed:
                g = os.fork()
                if g == 0:
                    self._rank(fn, prepare, payload, nxt, msg_w)
                running[g] = nxt
                _send(msg_w, ("start", nxt, g))
                nxt += 1
            g, status = os.waitpid(-1, 0)
            r = running.pop(g, None)
            if r is None:
                continue
            # a failed rank: no later rank is started (the tracer stops at the first failure in rank order)
            failed = failed or status != 0 or not os.path.exists(self._path(r))
            _send(msg_w, ("end", r, status))

    def _rank(self, fn, prepare, payload, r: int, msg_w: int) -> None:  # pragma: no cover - a rank's process
        code = 1
        try:
            _die_with_parent()
            # one trace, then the process exits: no cyclic collection (memory returns at exit; reference counting
            # still frees what is not in a cycle).  The program's meaning does not depend on when unreachable cycles
            # are collected, which differs from process to process anyway.
            gc.disable()
            mod, attr = self.tick_attr
            if getattr(mod, attr, None) is not None:
                setattr(mod, attr, lambda text: _send(msg_w, ("tick", r, _short(text))))
            out, err = io.StringIO(), io.StringIO()
            old = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = out, err
            try:
                prepare(payload)
                res: tuple = ("ok", fn(r))
            except BaseException as exc:  # noqa: BLE001 - raised in the tracer, in rank order
                res = ("err", _exc_payload(exc))
            finally:
                sys.stdout, sys.stderr = old
            chans = [get() for get, _ in CHANNELS]
            try:
                data = pickle.dumps((*res, chans, out.getvalue(), err.getvalue()), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # noqa: BLE001 - a result that does not pickle: tvcert's own failure (exit 4)
                res = ("err", RuntimeError(f"rank {r}'s trace cannot be passed back from its process: "
                                           f"{type(exc).__name__}: {exc}"))
                data = pickle.dumps((*res, chans, out.getvalue(), err.getvalue()))
            path = self._path(r)
            with open(path + ".tmp", "wb") as f:
                f.write(data)
            os.replace(path + ".tmp", path)
            code = 0 if res[0] == "ok" else 1
        finally:
            os._exit(code)

    def _path(self, r: int) -> str:
        return os.path.join(self.dir, f"{r}.pkl")

    # ------------------------------------------------------------------ in the tracer
    def release(self, payload: Any) -> None:
        """Start tracing the ranks, each given ``payload``."""
        data = pickle.dumps((payload,), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            view = memoryview(struct.pack(">Q", len(data)) + data)
            while view:
                view = view[os.write(self.cmd, view):]
        finally:
            os.close(self.cmd)
            self.cmd = -1

    def _pump(self) -> bool:
        """Read the messages available (waiting for one); False at end of file (no process left to write)."""
        select.select([self.msg], [], [])
        chunk = os.read(self.msg, 1 << 16)
        if not chunk:
            return False
        self._buf += chunk
        while len(self._buf) >= _HDR.size:
            (n,) = _HDR.unpack_from(self._buf)
            if len(self._buf) < _HDR.size + n:
                break
            kind, r, val = pickle.loads(self._buf[_HDR.size:_HDR.size + n])
            self._buf = self._buf[_HDR.size + n:]
            if kind == "start":
                self.pids[r] = val
            elif kind == "end":
                self.ended[r] = val
                self.pids.pop(r, None)
            else:
                mod, attr = self.tick_attr
                hook = getattr(mod, attr, None)
                if hook is not None:
                    hook(val)  # as a rank traced here would say it ("tracing rank 3/8 ...", its layers)
        return True

    def results(self) -> Iterator[tuple[int, Any]]:
        """``(r, fn(r))`` for r = 0 .. world-1 in order; the exception of the first failing rank is raised in its
        place, after its stdout / stderr and those of the ranks before it are written here."""
        from .trace import TraceError

        for r in range(self.world):
            while r not in self.ended:
                if not self._pump():
                    raise TraceError(f"the process tracing the ranks ended before rank {r} was traced", "internal")
            status = self.ended.pop(r)
            try:
                with open(self._path(r), "rb") as f:
                    kind, val, chans, out, err = pickle.load(f)
            except OSError:
                why = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                       else f"exited with status {os.WEXITSTATUS(status)}")
                # the traced code ended its process: bad input, as it would be in one process
                raise TraceError(f"the process tracing rank {r} {why} before it finished (the traced code exits "
                                 f"the interpreter, crashes it, or exceeds its memory)", "input") from None
            if out:
                sys.stdout.write(out)
            if err:
                sys.stderr.write(err)
            for (_, put), v in zip(CHANNELS, chans):
                put(v)
            if kind == "err":
                raise val
            yield r, val

    def close(self) -> None:
        for pid in [*self.pids.values(), self.pid]:
            if pid > 0:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.pid > 0:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
        for fd in (self.cmd, self.msg):
            if fd >= 0:
                os.close(fd)
        self.pid = self.cmd = self.msg = -1
        self.pids.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def start(fn: Callable[[int], Any], world: int, jobs: int, prepare: Callable[[Any], None], tick_attr: tuple) -> Ranks:
    """The ranks' processes, their zygote forked now (before anything a real rank does not run).  ``tick_attr`` =
    (module, name) of the progress hook a rank's process relays to the tracer's."""
    if not hasattr(os, "fork"):  # pragma: no cover - a rank traced in this process could read another's state
        from .trace import TraceError

        raise TraceError("tracing needs os.fork (each rank in a fresh process)", "unsupported")
    return Ranks(fn, world, jobs, prepare, tick_attr)


def _read_payload(fd: int) -> Any:  # pragma: no cover - runs in the zygote
    """The released payload (a 1-tuple), or None at end of file (the tracer stopped before releasing)."""
    buf = b""
    while len(buf) < 8 or len(buf) < 8 + struct.unpack_from(">Q", buf)[0]:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return None
        buf += chunk
    (n,) = struct.unpack_from(">Q", buf)
    return pickle.loads(buf[8:8 + n])
