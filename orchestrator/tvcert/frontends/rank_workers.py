"""Trace the ranks of a mesh in forked worker processes (issue 16: tracing cost over the mesh).

Every rank is still traced -- nothing is inferred about a rank that was not run -- but up to ``jobs`` ranks at
a time, each in a child forked from the tracing process after the logical model is traced (so the user's
functions, closures and imported frameworks need no pickling).  Worker ``i`` traces ranks ``i, i + jobs, ...``
in order and stops at its first failure; the parent consumes the results in rank order, so the first failing
rank and its error are the ones the sequential loop reports.  A child's progress ticks, stdout and stderr are
relayed to the parent.

What a worker cannot give back: side effects of the traced code on the tracing process's own state (a front end
that collects notes in a global while ranks are traced sees none of them) -- so workers are used only when asked
for (``TVCERT_TRACE_JOBS`` / ``tvcert trace --jobs``); the default is the sequential loop.
"""
from __future__ import annotations

import io
import os
import pickle
import select
import signal
import struct
import sys
from typing import Any, Callable, Iterator, Sequence

_HDR = struct.Struct(">Q")


def default_jobs() -> int:
    """``TVCERT_TRACE_JOBS`` (an int >= 1; ``0`` or ``auto``: the CPUs this process may use), else 1."""
    v = os.environ.get("TVCERT_TRACE_JOBS", "").strip()
    if not v:
        return 1
    if v in ("0", "auto"):
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # pragma: no cover - not Linux
            return max(1, os.cpu_count() or 1)
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"TVCERT_TRACE_JOBS={v!r} is not a number of worker processes") from None
    if n < 0:
        raise ValueError(f"TVCERT_TRACE_JOBS={v!r} must be >= 0")
    return max(1, n)


def _send(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HDR.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _exc_payload(exc: BaseException) -> Any:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - an exception whose state does not pickle
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _child(fd: int, fn: Callable[[int], Any], ranks: Sequence[int], tick_attr, worker: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the parent
    except Exception:  # noqa: BLE001 - not Linux: the parent still kills its workers when it stops
        pass
    mod, attr = tick_attr
    if getattr(mod, attr, None) is not None:
        # prefixed: the parent's bar counts the ranks it has received, not what a worker has started
        setattr(mod, attr, lambda text: _send(fd, ("tick", None, f"[worker {worker + 1}] {text}", "", "")))
    for r in ranks:
        out, err = io.StringIO(), io.StringIO()
        old = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        try:
            res = ("ok", r, fn(r))
        except BaseException as exc:  # noqa: BLE001 - passed to the parent, raised there in rank order
            res = ("err", r, _exc_payload(exc))
        finally:
            sys.stdout, sys.stderr = old
        try:
            _send(fd, (*res, out.getvalue(), err.getvalue()))
        except Exception as exc:  # noqa: BLE001 - a result that does not pickle: tvcert's own failure (exit 4)
            res = ("err", r, RuntimeError(f"rank {r}'s trace cannot be passed back from its worker process: "
                                          f"{type(exc).__name__}: {exc}"))
            _send(fd, (*res, out.getvalue(), err.getvalue()))
        if res[0] == "err":
            return


def map_ranks(fn: Callable[[int], Any], world: int, jobs: int, tick_attr: tuple) -> Iterator[tuple[int, Any]]:
    """``(r, fn(r))`` for r = 0 .. world-1 in order, computed by up to ``jobs`` forked workers; the exception of the
    first failing rank is raised in its place.  ``tick_attr`` = (module, name) of the progress hook a child relays
    to the parent's (``tvcert.frontends.trace.progress_hook``)."""
    jobs = max(1, min(jobs, world))
    if jobs == 1 or not hasattr(os, "fork"):
        for r in range(world):
            yield r, fn(r)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    workers: dict[int, int] = {}  # read fd -> pid
    owner: dict[int, int] = {}  # rank -> read fd
    try:
        for i in range(jobs):
            rfd, wfd = os.pipe()
            mine = list(range(i, world, jobs))
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child
                code = 0
                try:
                    os.close(rfd)
                    for other in workers:
                        os.close(other)
                    _child(wfd, fn, mine, tick_attr, i)
                except BaseException:  # noqa: BLE001
                    code = 4
                finally:
                    os._exit(code)
            os.close(wfd)
            workers[rfd] = pid
            for r in mine:
                owner[r] = rfd
        bufs = {fd: b"" for fd in workers}
        done: dict[int, tuple] = {}
        live = set(workers)
        mod, attr = tick_attr
        for r in range(world):
            while r not in done:
                fd = owner[r]
                if fd not in live:
                    pid = workers[fd]
                    _, status = os.waitpid(pid, 0)
                    workers[fd] = -1
                    why = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                           else f"exited with status {os.WEXITSTATUS(status)}")
                    from .trace import TraceError  # the traced code ended its process: bad input, as in one process

                    raise TraceError(f"the worker process tracing rank {r} {why} before it finished (the traced code "
                                     f"exits the interpreter, crashes it, or exceeds its memory)", "input")
                ready, _, _ = select.select(sorted(live), [], [])
                for f in ready:
                    chunk = os.read(f, 1 << 20)
                    if not chunk:
                        live.discard(f)
                        continue
                    bufs[f] += chunk
                    while len(bufs[f]) >= _HDR.size:
                        (n,) = _HDR.unpack_from(bufs[f])
                        if len(bufs[f]) < _HDR.size + n:
                            break
                        kind, rr, payload, out, err = pickle.loads(bufs[f][_HDR.size:_HDR.size + n])
                        bufs[f] = bufs[f][_HDR.size + n:]
                        if kind == "tick":
                            hook = getattr(mod, attr, None)
                            if hook is not None:
                                hook(payload)
                        else:
                            done[rr] = (kind, payload, out, err)
            kind, payload, out, err = done.pop(r)
            if out:
                sys.stdout.write(out)
            if err:
                sys.stderr.write(err)
            if kind == "err":
                raise payload
            yield r, payload
    finally:
        for fd, pid in workers.items():
            if pid > 0:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
            os.close(fd)
