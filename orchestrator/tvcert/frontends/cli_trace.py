"""`tvcert trace SPEC -o PLAN.json [--verify]`: PyTorch code -> plan (-> verdict).

``tvcert trace --torchtitan llama3-debug --tp 4 --sp -o plan.json`` traces a torchtitan model with
torchtitan's own parallelization instead (:mod:`tvcert.frontends.torchtitan`), and
``tvcert trace --hf qwen3 --tp 2 --verify`` a tiny Hugging Face model with its own ``base_model_tp_plan``
(:mod:`tvcert.frontends.hf`; ``--set`` gives :func:`~tvcert.frontends.hf.hf_spec`'s arguments, e.g.
``--set tp_plan='{"model.layers.*.mlp": "all_reduce"}'``).

SPEC is ``path/to/file.py`` or ``path/to/file.py:function``; the function (default
``tvcert_trace``) returns the keyword arguments of :func:`tvcert.frontends.trace.trace_plan`
(or a plan dict already traced).  ``--set key=value`` passes arguments to that function
(values parsed as JSON when they parse, else kept as strings).

Exit codes follow ``tvcert verify``: 0 VERIFIED (or traced, without --verify), 1 REFUTED,
2 UNKNOWN -- including code that could not be traced because an op has no IR conversion or the
ranks do not form one SPMD program; the message names the op and its source line --, 3 bad input:
among them a spec that is missing, fails to import (syntax error, missing package, an exception),
has no such function, gets a ``--set`` key its function does not take, or calls ``sys.exit`` -- one
line naming the file (and line) and the problem, never a traceback.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import click


class SpecError(Exception):
    """The spec file itself is unusable (missing, fails to import, wrong --set key, calls sys.exit ...): exit 3
    with this one line, which names the file and the problem."""


def _spec_frame(exc: BaseException, path: Path) -> str:
    """``file.py:line`` of the innermost frame of ``exc`` inside the spec file (or the file name)."""
    import traceback

    where = path.name
    target = str(path.resolve())
    if isinstance(exc, SyntaxError) and exc.filename and Path(exc.filename).resolve() == path.resolve():
        return f"{path.name}:{exc.lineno}"
    for fr in traceback.extract_tb(exc.__traceback__):
        if str(Path(fr.filename).resolve()) == target:
            where = f"{path.name}:{fr.lineno}"
    return where


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}" if text else type(exc).__name__


def load_spec(spec: str, args: dict) -> dict:
    """Import the spec file and call its function with the --set arguments.  Raises :class:`SpecError` (never a
    traceback, never a verdict) when the file is missing, fails to import (syntax error, missing package,
    an exception), defines no such function, the --set keys do not match its parameters, or it calls
    sys.exit; a :class:`~tvcert.frontends.trace.TraceError` from tracing passes through.

    The spec's directory is put on ``sys.path`` while it is imported and called (sibling modules import), and
    taken off afterwards by identity, so entries the spec adds itself stay."""
    import inspect

    from .trace import TraceError

    path, _, fn = spec.partition(":") if not (len(spec) > 1 and spec[1] == ":") else (spec, "", "")
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{path}: no such file")
    if p.suffix != ".py":
        raise SpecError(f"{path}: not a Python file (.py)")
    entry = "".join(list(str(p.resolve().parent)))  # a str object of our own, removed by identity
    sys.path.insert(0, entry)
    name = fn or "tvcert_trace"
    try:
        try:
            mod_spec = importlib.util.spec_from_file_location(p.stem, p)
            mod = importlib.util.module_from_spec(mod_spec)
            sys.modules[p.stem] = mod
            mod_spec.loader.exec_module(mod)  # type: ignore[union-attr]
        except SystemExit as exc:
            raise SpecError(f"{_spec_frame(exc, p)}: the spec calls sys.exit({exc.code!r}) while it is imported") \
                from None
        except SyntaxError as exc:
            raise SpecError(f"{_spec_frame(exc, p)}: syntax error: {exc.msg}") from None
        except ImportError as exc:
            missing = f" (is the package {exc.name!r} installed?)" if getattr(exc, "name", None) else ""
            raise SpecError(f"{_spec_frame(exc, p)}: cannot import: {_one_line(exc)}{missing}") from None
        except Exception as exc:  # noqa: BLE001 - any failure of the user's module is bad input
            raise SpecError(f"{_spec_frame(exc, p)}: the spec fails while it is imported: {_one_line(exc)}") from None
        f = getattr(mod, name, None)
        if f is None:
            raise SpecError(f"{path} defines no {name}()")
        if not callable(f):
            if args:
                raise SpecError(f"{path}: {name} is not a function, so --set {', '.join(sorted(args))} cannot apply")
            try:
                return dict(f)
            except (TypeError, ValueError):
                raise SpecError(f"{path}: {name} is neither a function nor a dict") from None
        try:
            sig = inspect.signature(f)
        except (TypeError, ValueError):
            sig = None
        if sig is not None:
            try:
                sig.bind(**args)
            except TypeError:
                accepted = [q.name for q in sig.parameters.values()
                            if q.kind in (q.POSITIONAL_OR_KEYWORD, q.KEYWORD_ONLY)]
                bad = [k for k in args if k not in accepted] or sorted(args)
                raise SpecError(f"{path}: --set {', '.join(bad)}: {name}() takes "
                                f"{', '.join(accepted) if accepted else 'no arguments'}") from None
        try:
            out = f(**args)
        except TraceError:
            raise
        except SystemExit as exc:
            raise SpecError(f"{_spec_frame(exc, p)}: the spec calls sys.exit({exc.code!r}) in {name}()") from None
        except ImportError as exc:
            missing = f" (is the package {exc.name!r} installed?)" if getattr(exc, "name", None) else ""
            raise SpecError(f"{_spec_frame(exc, p)}: {name}() cannot import: {_one_line(exc)}{missing}") from None
        except Exception as exc:  # noqa: BLE001
            raise SpecError(f"{_spec_frame(exc, p)}: {name}() fails: {_one_line(exc)}") from None
        if not isinstance(out, dict):
            raise SpecError(f"{path}: {name}() returned {type(out).__name__}, expected a dict of trace_plan arguments "
                            f"or a plan")
        return out
    finally:
        for i, e in enumerate(sys.path):
            if e is entry:
                del sys.path[i]
                break


def _parse_set(items) -> dict:
    out = {}
    for it in items:
        k, eq, v = it.partition("=")
        if not eq or not k:
            raise SpecError(f"--set {it!r} is not KEY=VALUE")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


TORCHTITAN_MODELS = ("llama3-debug", "deepseek-v3-debug", "qwen3-debug")  # torchtitan.MODELS (no import here)


@click.command("trace")
@click.argument("spec", required=False)
@click.option("-o", "--output", "out_path", type=click.Path(dir_okay=False), help="write the plan JSON here")
@click.option("--verify", "do_verify", is_flag=True, help="verify the traced plan (exit code as `tvcert verify`)")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="argument of the spec function")
@click.option("--json", "as_json", is_flag=True, help="machine-readable result on stdout")
@click.option("--report", "report_path", metavar="REPORT.html", type=click.Path(dir_okay=False),
              help="with --verify: write a readable HTML report")
@click.option("-q", "--quiet", is_flag=True, help="no progress on stderr")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="trace the ranks in this many worker processes at once (default: TVCERT_TRACE_JOBS, else 1); "
                   "every rank is traced either way")
@click.option("--torchtitan", "titan", type=click.Choice(TORCHTITAN_MODELS),
              help="instead of SPEC: a torchtitan model with torchtitan's own parallelization (needs torchtitan==0.3.0)")
@click.option("--hf", "hf", metavar="MODEL",
              help="instead of SPEC: a tiny Hugging Face model (llama, qwen2, qwen3, mistral, gemma2, phi3, a config or "
                   "model class) with its own tp_plan, random weights, no download")
@click.option("--config", "titan_config", metavar="JOB.toml", type=click.Path(dir_okay=False),
              help="--torchtitan: a torchtitan job config (its [parallelism] degrees, [training] batch / seq_len, "
                   "[activation_checkpoint] mode) instead of --tp/--sp/--ep")
@click.option("--tp", type=int, default=4, show_default=True, help="--torchtitan / --hf: tensor-parallel degree")
@click.option("--ep", type=int, default=1, show_default=True, help="--torchtitan: expert-parallel degree (on the tp ranks)")
@click.option("--sp/--no-sp", default=False, show_default=True, help="--torchtitan: sequence parallelism")
@click.option("--layers", type=int, default=2, show_default=True, help="--torchtitan: transformer layers")
@click.option("--no-mesh-context", is_flag=True,
              help="--torchtitan: run the model without the SPMD mesh context (no collectives; a negative)")
@click.option("--replicated-vocab", is_flag=True,
              help="--torchtitan: replicated embedding + gathered-logits loss instead of torchtitan's "
                   "vocab-parallel embedding and loss-parallel cross-entropy")
def trace(spec: str | None, out_path: str | None, do_verify: bool, sets: tuple, as_json: bool, report_path: str | None,
          quiet: bool, titan: str | None, tp: int, ep: int, sp: bool, layers: int, no_mesh_context: bool,
          replicated_vocab: bool, hf: str | None = None, titan_config: str | None = None, jobs: int | None = None) -> None:
    """Trace PyTorch parallel code on a fake process group into a plan; with --verify, verify it.

    SPEC is a Python file (see the module docstring), or use --torchtitan MODEL or --hf MODEL."""
    if [spec, titan, hf].count(None) != 2:
        raise click.UsageError("give exactly one of SPEC, --torchtitan MODEL or --hf MODEL")
    if report_path and not do_verify:
        raise click.UsageError("--report needs --verify (the report is of the verification)")
    if titan_config is not None:
        _check_titan_config_options(titan)
    from ..cli import check_outputs

    check_outputs({"SPEC": spec}, {"-o": out_path, "--report": report_path}, as_json)
    from ..plan import PlanError, load_plan
    from ..progress import Progress

    progress = Progress(quiet or as_json)
    progress.__enter__()
    click.get_current_context().call_on_close(progress.stop)  # also when a trace error exits early

    def say(obj: dict, text: str, code: int):
        progress.stop()
        click.echo(json.dumps(obj, indent=2) if as_json else text)
        sys.exit(code)

    titan_kw = {"tp": tp, "ep": ep, "sp": sp, "mesh_context": not no_mesh_context,
                "vocab_parallel": not replicated_vocab, "layers": layers}
    if titan_config is not None:
        titan_kw = {"config": titan_config, "mesh_context": not no_mesh_context,
                    "vocab_parallel": not replicated_vocab, "layers": layers}
    from . import trace as _trace_mod

    if jobs is not None:
        _trace_mod.rank_jobs = jobs
    plan_dict = traced_dict(spec, sets, as_json, titan, titan_kw, progress=progress, hf=hf, tp=tp)
    if out_path:
        from ..cli import write_atomic

        write_atomic(out_path, json.dumps(plan_dict, indent=1))
    n_par = sum(len(p["nodes"]) for p in plan_dict["parallel"])
    summary = (f"traced {plan_dict['name']}: {len(plan_dict['logical']['nodes'])} logical ops, {n_par} parallel ops "
               + (f"(one SPMD program over mesh {plan_dict['dims']})" if len(plan_dict["parallel"]) == 1 else
                  f"({len(plan_dict['parallel'])} programs, one per pipeline stage, over mesh {plan_dict['dims']})")
               + (f" -> {out_path}" if out_path else ""))
    if not do_verify:
        say({"traced": plan_dict["name"], "output": out_path} if out_path else plan_dict, summary
            if out_path else json.dumps(plan_dict, indent=1), 0)
    try:
        plan = load_plan(plan_dict)
    except PlanError as exc:
        say({"verdict": "BAD_INPUT", "reason": str(exc)}, f"error: traced plan is invalid: {exc}", 3)
    from ..engine.report import render_text, result_json
    from ..engine.verify import verify

    progress(f"verifying {plan.name!r}: {n_par} parallel ops")
    try:
        res = verify(plan, progress=progress)
    except (AttributeError, TypeError) as exc:
        # the reference interpreter's exact mode mishandles 0-d collectives / Partial scalars
        # (a bare Fraction instead of a 0-d array); keep the proof attempt, drop the search
        res = verify(plan, refute=False, progress=progress)
        res.reasons.append(f"counterexample search aborted: reference interpreter error {type(exc).__name__}: {exc}")
    hints = grad_hints(plan_dict, res)
    if report_path:
        from ..cli import write_atomic
        from ..engine.report import render_html

        progress(f"writing the report {report_path}")
        try:
            write_atomic(report_path, render_html(res, hints=hints, title_note=f"traced from {spec or titan or hf}"))
        except OSError as exc:
            say({"verdict": "BAD_INPUT", "reason": f"--report {report_path}: cannot write the report: {exc}"},
                f"error: --report {report_path}: cannot write the report: {exc.strerror or exc}", 3)
    progress.stop()
    if as_json:
        out = result_json(res)
        out["trace"] = summary
        if report_path:
            out["report"] = report_path
        click.echo(json.dumps(out, indent=2, default=str))
    else:
        if not quiet:
            click.echo(summary, err=True)
        click.echo(render_text(res))
        for h in hints:
            click.echo(h)
        if report_path:
            click.echo(f"report written to {report_path}")
    sys.exit(res.exit_code)


def _check_titan_config_options(titan: str | None) -> None:
    """``--config`` is torchtitan's job config: it needs --torchtitan and sets the degrees itself."""
    ctx = click.get_current_context()
    if titan is None:
        raise click.UsageError("--config JOB.toml needs --torchtitan MODEL")
    given = [f"--{p}" for p in ("tp", "ep", "sp") if ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE]
    if given:
        raise click.UsageError(f"{', '.join(given)} with --config: set the degrees in the job config's [parallelism]")


def exit_trace_error(exc, as_json: bool):
    """Report a failed trace and exit.  A crash (the parallel program raises at trace time: a shape or
    sharding-propagation error no input avoids, with no code of ours between the user's call and the error)
    cannot compute the logical function: REFUTED, the error is the witness (exit 1); an op with no conversion
    or a failure inside our own models of ops: UNKNOWN (2); bad input: 3."""
    code = {"input": 3, "crash": 1}.get(exc.kind, 2)
    verdict = {3: "BAD_INPUT", 1: "REFUTED", 2: "UNKNOWN"}[code]
    obj = {"verdict": verdict, "reason": str(exc), "kind": exc.kind, "op": exc.op, "src": exc.src}
    click.echo(json.dumps(obj, indent=2) if as_json else
               (f"{verdict}: {exc}" if code == 1 else f"{verdict}: cannot trace: {exc}"))
    sys.exit(code)


def traced_dict(spec: str | None, sets: tuple, as_json: bool, titan: str | None = None,
                titan_kw: dict | None = None, progress=None, hf: str | None = None, tp: int = 2) -> dict:
    """The plan dict of a traced spec (or torchtitan model), or exit as ``tvcert trace`` does.  ``progress``
    (a :class:`tvcert.progress.Progress`) is told each rank and layer traced."""
    from . import trace as _trace_mod

    old_hook = _trace_mod.progress_hook
    if progress is not None:
        _trace_mod.progress_hook = progress.tick
    try:
        if spec is not None and os.environ.get("TVCERT_SPEC_INPROCESS") != "1" and hasattr(os, "fork"):
            return _traced_in_child(spec, sets, as_json, progress)
        return _traced_dict(spec, sets, as_json, titan, titan_kw, hf, tp)
    finally:
        _trace_mod.progress_hook = old_hook


SPEC_SECONDS = float(os.environ.get("TVCERT_SPEC_SECONDS", 300))  # wall clock of importing and tracing one spec
SPEC_MEMORY = int(os.environ.get("TVCERT_SPEC_MEMORY_MB", 4096)) * 1024 * 1024  # address space it may add


def _vm_size() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _traced_in_child(spec: str, sets: tuple, as_json: bool, progress=None) -> dict:
    """Import and trace the spec in a forked child with a time and memory budget: a spec that calls
    os._exit, loops, allocates without bound or crashes the interpreter is bad input (exit 3), never a hang.
    The child's output is passed back and printed here (so it also reaches a test runner's streams)."""
    import io
    import pickle
    import resource
    import select
    import signal
    import time

    from . import trace as _trace_mod

    rfd, wfd = os.pipe()
    prfd, pwfd = os.pipe()  # the child's progress lines (ranks, layers), shown here as they happen
    pid = os.fork()
    if pid == 0:  # child
        os.close(rfd)
        os.close(prfd)

        def _relay(text: str) -> None:
            try:
                os.write(pwfd, (text.replace("\n", " ")[:500] + "\n").encode("utf-8", "replace"))
            except OSError:
                pass

        _trace_mod.progress_hook = _relay if progress is not None else None
        out, err = io.StringIO(), io.StringIO()
        code, result = 4, None
        try:
            try:
                resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + SPEC_MEMORY, resource.RLIM_INFINITY))
            except (ValueError, OSError):
                pass
            old_out, old_err = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = out, err
            try:
                result = _traced_dict(spec, sets, as_json)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 3
            except MemoryError:
                err.write(f"error: {spec}: the spec ran out of its memory budget ({SPEC_MEMORY >> 20} MB)\n")
                code = 3
            except BaseException as exc:  # noqa: BLE001 - reported by the parent as tvcert's own failure
                err.write(f"tvcert: internal error while tracing {spec}: {type(exc).__name__}: {str(exc)[:500]}\n")
                code = 4
            finally:
                sys.stdout, sys.stderr = old_out, old_err
            try:
                payload = pickle.dumps((code, out.getvalue(), err.getvalue(), result))
            except Exception as exc:  # noqa: BLE001
                payload = pickle.dumps((4, out.getvalue(), f"tvcert: internal error: the traced plan cannot be passed "
                                                           f"back: {type(exc).__name__}: {exc}\n", None))
            view = memoryview(payload)
            while view:
                n = os.write(wfd, view[:1 << 20])
                view = view[n:]
        finally:
            os._exit(0)
    os.close(wfd)
    os.close(pwfd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + SPEC_SECONDS
    timed_out = False
    pbuf, popen = b"", True
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([rfd] + ([prfd] if popen else []), [], [], min(left, 1.0))
            if popen and prfd in ready:
                b = os.read(prfd, 1 << 16)
                if not b:
                    popen = False
                pbuf += b
                *lines, pbuf = pbuf.split(b"\n")
                for line in lines:
                    if progress is not None and line:
                        progress.tick(line.decode("utf-8", "replace"))
            if rfd in ready:
                b = os.read(rfd, 1 << 20)
                if not b:
                    break
                chunks.append(b)
    finally:
        os.close(rfd)
        os.close(prfd)
        if timed_out:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, status = os.waitpid(pid, 0)

    def bad(msg: str):
        click.echo(json.dumps({"verdict": "BAD_INPUT", "reason": msg}) if as_json else f"error: {msg}", err=not as_json)
        sys.exit(3)

    if timed_out:
        bad(f"{spec}: the spec did not finish importing and tracing within its time budget of {SPEC_SECONDS:g} s "
            f"(TVCERT_SPEC_SECONDS)")
    try:
        code, out, err, result = pickle.loads(b"".join(chunks))
    except Exception:  # noqa: BLE001 - the child died before it could answer
        why = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exited with status {os.WEXITSTATUS(status)} before tracing finished")
        bad(f"{spec}: the spec process {why} (a spec that exits the interpreter, crashes it, or exceeds its "
            f"memory budget of {SPEC_MEMORY >> 20} MB)")
    if out:
        click.echo(out, nl=False)
    if err:
        click.echo(err, nl=False, err=True)
    if code != 0:
        sys.exit(code)
    return result


def _traced_dict(spec: str | None, sets: tuple, as_json: bool, titan: str | None = None,
                 titan_kw: dict | None = None, hf: str | None = None, tp: int = 2) -> dict:
    try:
        import torch  # noqa: F401
    except ImportError:
        click.echo("error: tracing needs PyTorch (pip install torch==2.13.0)", err=True)
        sys.exit(3)
    from ..cli import _cut
    from .trace import TraceError, trace_plan

    err: Exception | None = None
    try:
        if hf is not None:
            from .hf import trace_hf

            return trace_hf(hf, tp, **_hf_args(_parse_set(sets)))
        if titan is not None:
            from .torchtitan import MODELS, trace_titan

            kw = dict(titan_kw or {})
            if "config" in kw:
                from .titan_config import load_job
                from .torchtitan import trace_titan_job

                return trace_titan_job(load_job(kw.pop("config"), titan), **kw)
            return trace_titan(MODELS[titan](layers=kw.pop("layers", 2)), **kw)
        kw = load_spec(spec, _parse_set(sets))
        if "tvcert_plan" in kw:
            return kw
        import inspect

        bad = sorted(set(kw) - set(inspect.signature(trace_plan).parameters))
        if bad:
            raise SpecError(f"{spec}: the spec returns unknown trace_plan arguments {bad}")
        return trace_plan(**kw)
    except TraceError as exc:
        err = exc
    except SpecError as exc:
        err = exc
    except SystemExit as exc:  # user code run by trace_plan (the logical or parallel function) called sys.exit
        err = SpecError(f"{spec}: the traced code calls sys.exit({exc.code!r})")
    if isinstance(err, TraceError):
        exit_trace_error(err, as_json)
    if as_json:
        click.echo(json.dumps({"verdict": "BAD_INPUT", "reason": _cut(str(err))}))
    else:
        click.echo(_cut(f"error: {err}"), err=True)
    sys.exit(3)


def _hf_args(args: dict) -> dict:
    """``--set`` keys of ``--hf``: :func:`tvcert.frontends.hf.hf_spec`'s keyword arguments (else bad input)."""
    import inspect

    from .hf import hf_spec

    ok = [q.name for q in inspect.signature(hf_spec).parameters.values() if q.kind == q.KEYWORD_ONLY]
    bad = sorted(set(args) - set(ok))
    if bad:
        raise SpecError(f"--set {', '.join(bad)}: --hf takes {', '.join(ok)}")
    return args


def traced_plan(spec: str | None, sets: tuple, as_json: bool, progress=None, hf: str | None = None, tp: int = 2):
    """``tvcert verify --torch SPEC``: the loaded plan of a traced spec, or exit as ``tvcert trace`` does
    (a trace-time crash of the parallel program is REFUTED, an untraceable op UNKNOWN, bad input 3)."""
    from ..plan import PlanError, load_plan

    plan_dict = traced_dict(spec, sets, as_json, progress=progress, hf=hf, tp=tp)
    try:
        return load_plan(plan_dict)
    except PlanError as exc:
        click.echo(json.dumps({"verdict": "BAD_INPUT", "reason": str(exc)}) if as_json else
                   f"error: traced plan is invalid: {exc}")
        sys.exit(3)


def grad_hints(plan_dict: dict, res) -> list[str]:
    """For gradients that differ only at the read-back (no op diverged), point at the parameter's uses."""
    ce = res.counterexample or {}
    if not ce or ce.get("first_divergence"):
        return []
    out = []
    for o in ce.get("outputs", []):
        name = o["name"]
        if o["equal"] or not name.startswith("grad_"):
            continue
        p = name[5:]
        uses = sorted({n["src"] for n in plan_dict["logical"]["nodes"] if p in n["inputs"] and n.get("src")})
        pl = plan_dict["outputs"][name]["placement"] or "Replicate"
        out.append(f"hint: gradient {name} is read back as {pl} but its local values differ (a partial sum?): "
                   f"the parameter {p} is used at {', '.join(uses) or '?'}; is a gradient all_reduce missing "
                   f"(a sync outside autograd must be passed as grad_sync)?")
    return out
