"""Command line: ``tvcert verify | check | run | proofs | schema``.

Exit codes follow the verdict: 0 verified / equal / valid, 1 refuted / differ / invalid,
2 unknown, 3 bad input, 4 internal error (tvcert failed; never a verdict).  Human output goes to stdout, progress to stderr, ``--json`` prints
one JSON object for machines.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

EXIT_OK, EXIT_DIFF, EXIT_UNKNOWN, EXIT_BAD = 0, 1, 2, 3
EXIT_INTERNAL = 4  # tvcert itself failed: never a verdict (tvcert.errors)


class _Main(click.Group):
    """The command group; an exception nothing anticipated is tvcert's own failure: it is printed with the op
    where it happened and exits EXIT_INTERNAL, never 0 or 1 (which scripts read as verified / refuted)."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:  # a usage error is bad input (3), not UNKNOWN (click's 2)
            exc.exit_code = EXIT_BAD
            raise

    def invoke(self, ctx: click.Context):
        from .errors import InternalError

        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            exc.exit_code = EXIT_BAD
            raise
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except WriteError as exc:  # an output path that cannot be written: bad input, naming it
            _fail_bad(str(exc), "--json" in [*getattr(ctx, "_protected_args", ()), *ctx.args])
        except BrokenPipeError:  # the reader of stdout went away: nothing more to say, and no verdict was read
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except OSError:
                pass
            sys.exit(EXIT_INTERNAL)
        except KeyboardInterrupt:
            click.echo("tvcert: interrupted", err=True)
            sys.exit(130)
        except MemoryError:
            click.echo(f"tvcert: out of memory (no verdict; exit {EXIT_INTERNAL})", err=True)
            sys.exit(EXIT_INTERNAL)
        except Exception as exc:  # noqa: BLE001 - the point is to catch everything
            import traceback

            if isinstance(exc, InternalError):
                where, cause = exc.where, exc.exc
            else:
                tb = traceback.extract_tb(exc.__traceback__)[-1]
                where, cause = f"{Path(tb.filename).name}:{tb.lineno} ({tb.name})", exc
            msg = _cut(f"internal error at {where}: {type(cause).__name__}: {cause}")
            if ctx.meta.get("tvcert.debug") or os.environ.get("TVCERT_DEBUG"):
                traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            if "--json" in [*getattr(ctx, "_protected_args", ()), *ctx.args]:
                click.echo(json.dumps({"error": msg, "internal": True}))
            click.echo(f"tvcert: {msg}\n(this is a bug in tvcert, not a verdict about the plan; exit {EXIT_INTERNAL})",
                       err=True)
            sys.exit(EXIT_INTERNAL)


MAX_MESSAGE_CHARS = 900  # a message never echoes a huge bad value: it is cut, and lone surrogates escaped


def _cut(msg: str, n: int = MAX_MESSAGE_CHARS) -> str:
    if len(msg) > n:
        msg = msg[:n] + f"... ({len(msg) - n} more characters)"
    return msg.encode("utf-8", "backslashreplace").decode("utf-8")


def _fail_bad(msg: str, as_json: bool = False) -> None:
    msg = _cut(msg)
    if as_json:
        click.echo(json.dumps({"error": msg}))
    else:
        click.echo(f"error: {msg}", err=True)
    sys.exit(EXIT_BAD)


def _parse_dims(text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    if not text:
        return out
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise click.BadParameter(f"{part!r} is not NAME=VALUE", param_hint="--dims")
        k, v = part.split("=", 1)
        try:
            out[k.strip()] = int(v)
        except ValueError:
            raise click.BadParameter(f"{_cut(v, 60)!r} is not an integer", param_hint="--dims") from None
        if not 0 < out[k.strip()] < 2 ** 62:
            raise click.BadParameter(f"{_cut(k.strip(), 60)}={out[k.strip()]}: a size must be a positive integer "
                                     f"below 2^62", param_hint="--dims")
    return out


def _load(path: str, as_json: bool, check_run_dims: bool = True):
    from .plan import PlanError, load_plan

    try:
        return load_plan(path, check_run_dims=check_run_dims)
    except PlanError as exc:
        _fail_bad(f"{path}: {exc}", as_json)


TMP_TAG = ".tvcert-tmp."  # temp files are named .<target>.tvcert-tmp.<pid>.<random>; a later write removes stale ones


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def check_outputs(inputs: dict[str, str | None], outputs: dict[str, str | None], as_json: bool = False) -> None:
    """No output path may be an input path (``verify p.json --emit-cert p.json`` would replace the plan), nor
    another output path; exit 3 naming both options."""
    ins = [(k, v) for k, v in inputs.items() if v and v != "-"]
    outs = [(k, v) for k, v in outputs.items() if v]
    for i, (ko, vo) in enumerate(outs):
        for ki, vi in ins:
            if _same_file(vo, vi):
                _fail_bad(f"{ko} {vo} is the {ki} {vi}: tvcert never writes over its input (give another path)", as_json)
        for ko2, vo2 in outs[i + 1:]:
            if _same_file(vo, vo2):
                _fail_bad(f"{ko} and {ko2} are the same path {vo}", as_json)
        why = _unwritable(vo)
        if why:
            _fail_bad(f"{ko} {vo}: {why}", as_json)


def _unwritable(path: str) -> str | None:
    """Why ``path`` cannot be written (before any work is done), or None: a probe file is created beside it."""
    import tempfile

    p = Path(path)
    if p.exists() and not p.is_file():
        return "exists and is not a regular file"
    d = p.parent
    while not d.exists():
        d = d.parent
    if not d.is_dir():
        return f"{d} is not a directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{p.name}{TMP_TAG}{os.getpid()}.", dir=d)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write in {d}: {exc.strerror or exc}"
    return None


def _clean_stale(parent: Path, name: str) -> None:
    """Remove temp files of ``name`` left by a tvcert that was killed (SIGKILL gives no chance to clean up)."""
    try:
        for q in parent.glob(f".{name}{TMP_TAG}*"):
            try:
                pid = int(q.name[len(f".{name}{TMP_TAG}"):].split(".", 1)[0])
            except ValueError:
                continue
            if pid == os.getpid():
                continue
            try:
                os.kill(pid, 0)
                continue  # its writer still runs
            except ProcessLookupError:
                q.unlink(missing_ok=True)
            except PermissionError:
                continue
    except OSError:
        pass


class WriteError(OSError):
    pass


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write to a temp file beside ``path`` and rename, so nothing is ever half-written.

    The temp file is removed when the write fails or is interrupted (SIGINT / SIGTERM / SIGHUP while writing);
    after a SIGKILL, the next write to the same path removes it (its name carries the dead writer's pid).
    A path that cannot be written (under a file, in /proc, no permission) raises :class:`WriteError`."""
    import signal
    import tempfile
    import threading

    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists() and not p.is_file():
            raise WriteError(f"{p} exists and is not a regular file")
        _clean_stale(p.parent, p.name)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}{TMP_TAG}{os.getpid()}.", dir=p.parent)
    except WriteError:
        raise
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    old = {}

    def on_signal(signum, frame):
        Path(tmp).unlink(missing_ok=True)
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                old[sig] = signal.signal(sig, on_signal)
            except (ValueError, OSError):
                pass
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make a report or plan unreadable to others
        os.replace(tmp, p)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tvcert")
@click.option("--debug", is_flag=True, help="print the traceback of an internal error (also TVCERT_DEBUG=1)")
@click.pass_context
def main(ctx: click.Context, debug: bool = False) -> None:
    """tvcert: prove that a parallel training plan computes what its logical model computes.

    \b
    Typical use:
      tvcert verify plan.json --emit-cert plan.cert.json   # prove it, write a certificate
      tvcert check plan.cert.json --plan plan.json          # replay the certificate offline
      tvcert run plan.json                                  # execute both sides at small sizes
      tvcert proofs                                         # recheck the Coq rule kernel

    Exit codes: 0 verified/equal/valid, 1 refuted/differ/invalid, 2 unknown, 3 bad input,
    4 internal error (a bug in tvcert, never a verdict).  Usage errors are bad input (3).
    Plans and certificates must be regular files (or - for stdin) of at most 256 MB.
    """
    ctx.meta["tvcert.debug"] = debug
    for stream in (sys.stdout, sys.stderr):  # no name, however odd, makes printing fail
        if hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass


@main.command()
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))
@click.option("--dims", "dims_text", metavar="NAME=V,...", help="override run dims, e.g. hidden=8,seq=4")
@click.option("--seed", default=0, show_default=True, help="seed for the random inputs")
@click.option("--exact", is_flag=True, help="exact rational arithmetic with function tables instead of float64")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def run(plan_path: str, dims_text: str | None, seed: int, exact: bool, as_json: bool) -> None:
    """Execute the logical graph and the parallel program on random inputs and compare.

    Runs at the plan's run_dims (override with --dims), distributes the logical inputs by their
    placements, simulates every rank and collective, reassembles the outputs and reports the
    largest difference per output and the first rank-local tensor that no longer matches the
    logical computation. This is testing, not proof: use `tvcert verify` for a proof.
    Budget: a run holding more than 2e7 tensor elements (the logical graph's and every rank's) or taking
    more than 2e9 arithmetic operations (--exact: 1e7 / 1.5e7) at these dims is refused (exit 3) before it
    starts; give smaller --dims.
    Exit 0 if every output matches, 1 if one differs, 3 on bad input.
    """
    from .interp import RunError, run_plan
    from .localize import first_divergence
    from .plan import PlanError, check_shapes

    plan = _load(plan_path, as_json)
    try:
        dims = dict(plan.run_dims)
        over = _parse_dims(dims_text)
        for k in over:
            if k not in plan.dims:
                raise PlanError("--dims", f"{k!r} is not one of the plan's dims ({', '.join(plan.dims)})")
        dims.update(over)
        if over:
            check_shapes(plan, dims, "--dims")
        res = run_plan(plan, dims, seed=seed, exact=exact)
    except PlanError as exc:
        _fail_bad(str(exc), as_json)
    except RunError as exc:
        _fail_bad(f"cannot execute the plan: {exc}", as_json)
    div = None if res.equal else first_divergence(plan, res)
    if as_json:
        click.echo(json.dumps({
            "plan": plan.name, "equal": res.equal, "mode": res.mode, "seed": seed, "dims": res.dims,
            "outputs": [{"name": o.name, "equal": o.equal, "max_diff": o.max_diff, "problem": o.problem} for o in res.outputs],
            "first_divergence": None if div is None else {
                "program": div.program, "node": div.node_path, "op": div.op, "tensor": div.tensor, "src": div.src,
                "inputs": div.inputs, "sample": div.sample},
        }, indent=2))
    else:
        click.echo(f"plan {plan.name}: ran at {', '.join(f'{k}={v}' for k, v in res.dims.items())} ({res.mode}, seed {seed})")
        for o in res.outputs:
            status = "equal" if o.equal else "DIFFERS"
            extra = f" ({o.problem})" if o.problem else ""
            click.echo(f"  {o.name:24s} {status:8s} max |diff| = {o.max_diff:.3g}{extra}")
        if div is not None:
            click.echo(div.describe())
            for r, vals in div.sample.items():
                click.echo(f"    rank {r}: {vals}")
        click.echo("outputs equal" if res.equal else "outputs DIFFER")
    sys.exit(EXIT_OK if res.equal else EXIT_DIFF)


@main.command()
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False), required=False)
@click.option("--torch", "torch_spec", metavar="SPEC.py", type=click.Path(dir_okay=False),
              help="instead of PLAN.json: trace this PyTorch spec (see `tvcert trace`) and verify it in one step")
@click.option("--hf", "hf_model", metavar="MODEL",
              help="instead of PLAN.json: a tiny Hugging Face model (llama, qwen2, qwen3, mistral, gemma2, phi3, a config "
                   "or model class) with its own tp_plan, random weights (see `tvcert trace --hf`)")
@click.option("--tp", type=int, default=2, show_default=True, help="with --hf: tensor-parallel degree")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="with --torch: argument of the spec function; with --hf: tp_plan, config, dtype, batch, seq, seed")
@click.option("--emit-cert", "cert_path", metavar="CERT.json", type=click.Path(dir_okay=False),
              help="write a certificate when the verdict is VERIFIED")
@click.option("--emit-coq", "coq_path", metavar="OUT.v", type=click.Path(dir_okay=False),
              help="when VERIFIED: write the plan as a Coq theorem (Rules/IR) and have coqc check it")
@click.option("--report", "report_path", metavar="REPORT.html", type=click.Path(dir_okay=False),
              help="write a readable HTML report")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (verdict, reasons, stats)")
@click.option("--no-refute", is_flag=True, help="do not search for a counterexample when no proof is found")
@click.option("-q", "--quiet", is_flag=True, help="no progress on stderr")
def verify(plan_path: str | None, torch_spec: str | None, sets: tuple, cert_path: str | None, report_path: str | None,
           as_json: bool, no_refute: bool, quiet: bool, coq_path: str | None = None, hf_model: str | None = None,
           tp: int = 2) -> None:
    """Prove that the parallel program computes the logical graph, or refute it.

    \b
    VERIFIED  every logical output is proved to be read back correctly (exit 0);
              with --emit-cert the proof is written for `tvcert check`.
    REFUTED   the reference interpreter confirms a concrete counterexample; the report
              names the first op where the plans part (exit 1).
    UNKNOWN   no proof and no counterexample; the reasons say which op, which
              placements and which rule premise failed (exit 2).
    Bad input exits 3 with the JSON path of the problem.

    \b
    Budgets (past one: UNKNOWN with the reason, never a hang):
      counterexample search  at the plan's run_dims only; each run at most 2e7 tensor
                             elements and 2e9 operations (exact / decimal runs 1e7 and
                             1.5e7, TVCERT_EXACT_MAX_WORK); the whole search 5e7
                             interpreter work units (TVCERT_REFUTE_WORK: counted per op
                             and element, the same at any machine load), 900 s wall
                             as a hang guard only (TVCERT_REFUTE_SECONDS)
      SMT                    per obligation z3 rlimit 2e7 (TVCERT_SMT_RLIMIT), 300 s
                             wall as a hang guard (TVCERT_SMT_TIMEOUT_MS), 1 GB, 8 MB
                             of text; 60 s of solver CPU per run
                             (TVCERT_SMT_TOTAL_SECONDS)
    """
    from .engine.report import render_html, render_text, result_json
    from .engine.verify import verify as run_verify

    if [plan_path, torch_spec, hf_model].count(None) != 2:
        raise click.UsageError("give exactly one of PLAN.json, --torch SPEC.py or --hf MODEL")
    check_outputs({"PLAN.json": plan_path, "--torch": torch_spec},
                  {"--emit-cert": cert_path, "--report": report_path, "--emit-coq": coq_path}, as_json)
    from .progress import Progress

    progress = Progress(quiet or as_json)
    with progress:
        if torch_spec is not None or hf_model is not None:
            from .frontends.cli_trace import traced_plan

            plan = traced_plan(torch_spec, sets, as_json, progress=progress, hf=hf_model, tp=tp)
        else:
            progress.tick(f"loading {plan_path}")
            plan = _load(plan_path, as_json, check_run_dims=False)
        progress(f"verifying {plan.name!r}: {sum(len(g.nodes) for g in plan.programs.values())} parallel ops in "
                 f"{len(plan.programs)} program(s)")
        res = run_verify(plan, refute=not no_refute, progress=progress)
        if report_path:
            progress(f"writing the report {report_path}")
            page = render_html(res, cert_path=cert_path if res.verdict == "VERIFIED" else None,
                               title_note=f"traced from {torch_spec or hf_model}" if torch_spec or hf_model else None)
            try:
                write_atomic(report_path, page)
            except OSError as exc:
                progress.stop()
                _fail_bad(f"--report {report_path}: cannot write the report: {exc.strerror or exc}", as_json)
    cert_note = None
    if cert_path:
        if res.verdict == "VERIFIED":
            from .certificate.emit import build_certificate, dump_certificate

            try:
                write_atomic(cert_path, dump_certificate(build_certificate(res)))
            except WriteError as exc:
                _fail_bad(f"--emit-cert {cert_path}: {exc}", as_json)
            cert_note = f"certificate written to {cert_path}"
        else:
            cert_note = f"no certificate written: the verdict is {res.verdict}, not VERIFIED"
    coq_j = None
    if coq_path:
        from .coqjudge.judge import verify_judgement

        try:
            coq_j = verify_judgement(res.verdict, plan, coq_path)
        except OSError as exc:
            _fail_bad(f"{coq_path}: cannot write the Coq file: {exc}", as_json)
    if as_json:
        out = result_json(res)
        out["certificate"] = cert_note
        if coq_j is not None:
            out["coq"] = coq_j.as_json()
        if report_path:
            out["report"] = report_path
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(render_text(res))
        if cert_note:
            click.echo(cert_note)
        if coq_j is not None:
            click.echo(coq_j.message)
        if report_path:
            click.echo(f"report written to {report_path}")
    sys.exit(EXIT_UNKNOWN if coq_j is not None and coq_j.status == "rejected" else res.exit_code)


@main.command()
@click.argument("cert_path", metavar="CERT.json", type=click.Path(dir_okay=False))
@click.option("--plan", "plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False),
              help="the plan to check against (default: the copy inside the certificate)")
@click.option("--manifest", "manifest_path", type=click.Path(dir_okay=False),
              help="proof manifest (default: proofs/manifest.json of this installation)")
@click.option("--solver", type=click.Choice(["z3", "cvc5", "both"]), default="z3", show_default=True,
              help="solver(s) that re-check every SMT obligation")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--coq", "coq", is_flag=True, help="also have Coq judge the plan (Rules/IR checker, coqc, Print Assumptions)")
def check(cert_path: str, plan_path: str | None, manifest_path: str | None, solver: str, as_json: bool,
          coq: bool = False) -> None:
    """Replay a certificate offline, without the search engine.

    Re-reads the plan and checks its hash, checks every cited rule against the proof
    manifest, re-derives every step (premises present, side conditions true, conclusion
    exactly what the rule gives), re-generates and re-solves every SMT obligation, and checks
    that every logical output is read back as declared.  Needs no network and no torch.
    Exit 0 valid, 1 invalid (the first failing check is printed), 3 unreadable input.
    """
    from .certificate.check import Invalid, Unreadable, check_certificate, read_certificate

    solvers = ("z3", "cvc5") if solver == "both" else (solver,)
    try:
        cert = read_certificate(cert_path)
        res = check_certificate(cert, plan_path, manifest_path, solvers)
    except Unreadable as exc:
        _fail_bad(str(exc), as_json)
    except Invalid as exc:
        if as_json:
            click.echo(json.dumps({"valid": False, "reason": _cut(str(exc))}))
        else:
            click.echo(_cut(f"INVALID certificate {cert_path}: {exc}"))
        sys.exit(EXIT_DIFF)
    coq_j = None
    if coq:
        from .coqjudge.judge import check_judgement
        from .plan import PlanError

        try:
            coq_j = check_judgement(cert, plan_path)
        except PlanError as exc:
            _fail_bad(f"{plan_path or cert_path}: {exc}", as_json)
    if as_json:
        click.echo(json.dumps({"valid": True, "plan": cert.plan.name, "steps": res.steps,
                               "obligations": res.obligations, "outputs": res.outputs, "solvers": res.solvers,
                               **({"size_check": res.size_check} if res.size_check else {}),
                               **({"coq": coq_j.as_json()} if coq_j is not None else {})}))
    else:
        click.echo(f"VALID certificate for plan {cert.plan.name!r}: {res.steps} steps replayed, "
                   f"{res.obligations} obligations re-solved with {'+'.join(res.solvers)}, {res.outputs} outputs matched")
        if res.size_check:
            click.echo(f"  sizes: {res.size_check}")
        if coq_j is not None:
            click.echo(coq_j.message)
    sys.exit(EXIT_UNKNOWN if coq_j is not None and coq_j.status == "rejected" else EXIT_OK)


@main.command()
@click.option("--certificate", is_flag=True, help="print the certificate's schema instead of the plan's")
def schema(certificate: bool) -> None:
    """Print the JSON Schema of plan.json (or, with --certificate, of certificates)."""
    if certificate:
        from .certificate.format import certificate_schema

        click.echo(json.dumps(certificate_schema(), indent=2, sort_keys=True))
        return
    from .plan import json_schema

    click.echo(json.dumps(json_schema(), indent=2, sort_keys=True))


@main.command()
@click.option("--coqchk", is_flag=True, help="also run coqchk over the compiled kernel (slower)")
@click.option("--root", default=None, type=click.Path(file_okay=False), help="repository root holding Rules/ and proofs/")
def proofs(coqchk: bool, root: str | None) -> None:
    """Rebuild and recheck the Coq rule kernel, then print the manifest.

    Builds Rules/ with coqc, checks that every manifest theorem exists with its pinned
    statement, that no proof is Admitted, and that every theorem rests only on the standard
    real-number axioms.  Exit 0 when all holds, 1 otherwise.
    """
    from . import proofkit

    r = Path(root) if root else proofkit._default_root()
    argv = ["check", "--root", str(r)] + (["--coqchk"] if coqchk else [])
    rc = proofkit.main(argv)
    if rc == 0:
        proofkit.main(["table", "--root", str(r)])
    sys.exit(rc)


def _register_extensions() -> None:
    """Commands that live in their own modules (front ends, generators, fuzzing)."""
    import importlib

    for mod, names in (("tvcert.frontends.cli_trace", ("trace",)), ("tvcert.generators.cli_plan", ("plan", "mutate")),
                       ("tvcert.fuzz.cli_fuzz", ("fuzz",))):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("tvcert"):
                continue
            raise
        for n in names:
            if hasattr(m, n):
                main.add_command(getattr(m, n))


_register_extensions()

if __name__ == "__main__":  # pragma: no cover
    main()
